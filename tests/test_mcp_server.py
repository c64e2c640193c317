"""``a2a-secure mcp`` driven by the official MCP SDK client over stdio, against real agents.

The MCP server is a subprocess (``python -m a2a_secure mcp``); the agents are real
``AgentServer``s under uvicorn on 127.0.0.1 in this process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from a2a_secure import cli
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_verify
from a2a_secure.testing import serve_app
from tests.http_helpers import identity
from tests.test_llm_tools import ECHO_SCHEMA, _server

pytest.importorskip("mcp")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[1]


@contextlib.asynccontextmanager
async def mcp_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    """Two agents on loopback, a registry with them and an impostor, and an MCP client session."""
    alpha, beta = _server("alpha"), _server("beta")
    async with serve_app(alpha.app()) as alpha_url, serve_app(beta.app()) as beta_url:
        registry = {
            "agents": {
                "alpha": {"did": alpha.identity.did, "endpoint": alpha_url, "capabilities": []},
                "beta": {"did": beta.identity.did, "endpoint": beta_url, "capabilities": ["echo"]},
                # Registered under alpha's DID, but its endpoint is beta's: it proves beta's key.
                "impostor": {"did": alpha.identity.did, "endpoint": beta_url, "capabilities": ["echo"]},
            }
        }
        (tmp_path / "registry.json").write_bytes(encoding.dumps(registry))
        identity("orchestrator").save(tmp_path / "me.key")
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "a2a_secure", "mcp", "--key-file", str(tmp_path / "me.key"),
                  "--registry", str(tmp_path / "registry.json")],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                yield session


async def test_mcp_server_lists_calls_and_refuses_over_stdio(tmp_path: Path) -> None:
    async with mcp_session(tmp_path) as session:
        listed = await session.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert "alpha__echo" in tools and "beta__echo" in tools and "alpha__count" in tools
        assert not any(name.startswith("impostor") for name in tools)
        assert tools["alpha__echo"].input_schema == ECHO_SCHEMA
        assert tools["alpha__echo"].description == "alpha: Echo the inputs back, signed."

        result = await session.call_tool("alpha__echo", {"text": "hi"})
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["result"] == {"echo": {"text": "hi"}}
        assert result.meta is not None
        token = result.meta["a2a-secure/response_jws"]
        alpha = identity("alpha")
        payload = jws_verify(token, alpha.public_key, typ="a2a-response+jws", kid=alpha.kid)
        assert payload["result"] == {"echo": {"text": "hi"}}

        refused = await session.call_tool("impostor__echo", {"text": "x"})
        assert refused.is_error
        text = refused.content[0].text  # type: ignore[union-attr]
        assert text.startswith("impostor refused:") and text.endswith("(-32040)")

        unknown = await session.call_tool("nobody__echo", {})
        assert unknown.is_error
        assert unknown.content[0].text == "unknown tool 'nobody__echo'"  # type: ignore[union-attr]

        # The server is still serving after the refusals.
        again = await session.call_tool("beta__echo", {"text": "after"})
        assert not again.is_error
        assert again.structured_content is not None
        assert again.structured_content["result"] == {"echo": {"text": "after"}}


async def test_mcp_streamed_intent_reports_progress(tmp_path: Path) -> None:
    progress: list[tuple[float, Any]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with mcp_session(tmp_path) as session:
        result = await session.call_tool("alpha__count", {"n": 3}, progress_callback=on_progress)
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["result"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [value for value, _message in progress] == [1.0, 2.0, 3.0]


async def test_mcp_approval_result_is_marked_not_run(tmp_path: Path) -> None:
    async with mcp_session(tmp_path) as session:
        result = await session.call_tool("alpha__delete", {"path": "report.pdf"})
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["status"] == "needs_approval"
    assert result.structured_content["executed"] is False
    assert result.structured_content["action_id"] == "act-7"
    assert result.content[0].text.startswith("NOT RUN:")  # type: ignore[union-attr]


# -- packaging ----------------------------------------------------------------------------------


def test_core_install_does_not_pull_mcp() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.split(">")[0].split("[")[0].strip() == "mcp" for dep in project["dependencies"])
    assert project["optional-dependencies"]["mcp"] == ["mcp>=2.3,<3"]
    assert "a2a-secure[mcp]" in project["optional-dependencies"]["dev"]


def test_importing_the_package_and_cli_does_not_import_mcp() -> None:
    code = (
        "import sys, a2a_secure, a2a_secure.cli, a2a_secure.agent, a2a_secure.tools\n"
        "a2a_secure.cli.build_parser()\n"
        "assert not any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules), 'mcp imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_missing_mcp_extra_is_a_clear_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # None in sys.modules makes an import fail, as when the extra is not installed.
    for name in [m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types")] + ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "a2a_secure.mcp_server", raising=False)
    code = cli.main(["mcp", "--key-file", str(tmp_path / "k"), "--registry", str(tmp_path / "r")])
    assert code == 2
    assert "pip install 'a2a-secure[mcp]'" in capsys.readouterr().err


def test_the_http_transport_binds_loopback_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(
        ["mcp", "--key-file", str(tmp_path / "k"), "--registry", str(tmp_path / "r"),
         "--transport", "http", "--host", "0.0.0.0"]
    )  # fmt: skip
    assert code == 2
    assert "loopback" in capsys.readouterr().err
