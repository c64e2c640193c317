"""``a2a-secure mcp`` driven by the official MCP SDK client over stdio, against real agents.

The MCP server is a subprocess (``python -m a2a_secure mcp``); the agents are real
``AgentServer``s under uvicorn on 127.0.0.1 in this process.
"""

from __future__ import annotations

import asyncio
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
from a2a_secure.errors import AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_verify
from a2a_secure.testing import serve_app
from tests.http_helpers import identity
from tests.redis_helpers import free_port
from tests.test_llm_tools import ECHO_SCHEMA, _nested, _server

pytest.importorskip("mcp")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

ROOT = Path(__file__).resolve().parents[1]


@contextlib.asynccontextmanager
async def registry_agents(tmp_path: Path) -> AsyncIterator[list[str]]:
    """Two agents on loopback and a registry with them and an impostor; the ``mcp`` arguments."""
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
        yield ["-m", "a2a_secure", "mcp", "--key-file", str(tmp_path / "me.key"),
               "--registry", str(tmp_path / "registry.json")]  # fmt: skip


@contextlib.asynccontextmanager
async def mcp_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    """The agents of :func:`registry_agents` and an MCP client session over stdio."""
    async with registry_agents(tmp_path) as args:
        params = StdioServerParameters(
            command=sys.executable, args=args, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
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


async def test_mcp_streamed_result_carries_every_signed_event(tmp_path: Path) -> None:
    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        pass

    async with mcp_session(tmp_path) as session:
        result = await session.call_tool("alpha__count", {"n": 3}, progress_callback=on_progress)
    assert not result.is_error and result.meta is not None
    tokens = result.meta["a2a-secure/event_jws"]
    alpha = identity("alpha")
    events = [jws_verify(token, alpha.public_key, typ="a2a-event+jws", kid=alpha.kid) for token in tokens]
    # Three partial results, then the closing event of a streaming handler (§6.4).
    assert [event["index"] for event in events] == [0, 1, 2, 3]
    assert [event["final"] for event in events] == [False, False, False, True]
    assert [event["result"] for event in events] == [{"i": 0}, {"i": 1}, {"i": 2}, None]
    assert {event["status"] for event in events} == {"success"}
    # One request: the same session, sequence and request hash in every event.
    assert len({(e["session_id"], e["sequence"], e["request_hash"]) for e in events}) == 1
    assert result.meta["a2a-secure/response_jws"] == tokens[-1]
    # A response token is not an event token: the types keep the two apart.
    with pytest.raises(AuthenticationFailed):
        jws_verify(tokens[-1], alpha.public_key, typ="a2a-response+jws", kid=alpha.kid)


async def test_mcp_arguments_no_agent_would_take_are_a_tool_error(tmp_path: Path) -> None:
    async with mcp_session(tmp_path) as session:
        before = await session.call_tool("alpha__echo", {"text": "before"})
        huge = await session.call_tool("alpha__echo", {"text": "x" * 5_000_000})
        deep = await session.call_tool("alpha__echo", {"text": _nested(100)})
        after = await session.call_tool("alpha__echo", {"text": "after"})
    assert huge.is_error
    assert huge.content[0].text == (  # type: ignore[union-attr]
        "tool arguments refused: 5000011 bytes of JSON, more than the 393216 a signed request"
        " can carry (an agent takes request bodies of at most 1 MiB)"
    )
    assert deep.is_error
    assert deep.content[0].text == "tool arguments refused: nested deeper than 29 levels"  # type: ignore[union-attr]
    # The server kept serving, and nothing was signed for the refused calls.
    assert not after.is_error and before.meta is not None and after.meta is not None
    assert after.meta["a2a-secure/sequence"] == before.meta["a2a-secure/sequence"] + 1


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
        "import sys, a2a_secure, a2a_secure.cli, a2a_secure.agent, a2a_secure.llm_tools\n"
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


# -- streamable HTTP ----------------------------------------------------------------------------


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


async def _wait_listening(port: int, proc: asyncio.subprocess.Process, log: Path) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        if proc.returncode is not None:
            pytest.fail(f"a2a-secure mcp exited with {proc.returncode}:\n{_tail(log)}")
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return
    pytest.fail(f"a2a-secure mcp did not listen on {port} within 60 s:\n{_tail(log)}")


async def test_mcp_server_lists_and_calls_over_streamable_http(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "mcp-http.log"
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with registry_agents(tmp_path) as args:
        with log.open("w") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *args, "--transport", "http", "--port", str(port),
                stdout=out, stderr=out, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        try:
            await _wait_listening(port, proc, log)
            async with (
                streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert {"alpha__echo", "alpha__count", "beta__echo"} <= tools.keys()
                assert not any(name.startswith("impostor") for name in tools)
                assert tools["alpha__echo"].input_schema == ECHO_SCHEMA

                result = await session.call_tool("beta__echo", {"text": "over http"})
                refused = await session.call_tool("impostor__echo", {"text": "x"})
                streamed = await session.call_tool("alpha__count", {"n": 2}, progress_callback=on_progress)
                # Over 4 MiB the SDK's HTTP transport refuses the body itself (HTTP 413), which
                # its client reports as an error response; under it, the catalog refuses.
                with pytest.raises(MCPError):
                    await session.call_tool("alpha__echo", {"text": "x" * 5_000_000})
                huge = await session.call_tool("alpha__echo", {"text": "x" * 1_000_000})
                after = await session.call_tool("beta__echo", {"text": "after"})
        finally:
            try:
                if proc.returncode is None:
                    proc.terminate()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 10)
            finally:
                # Also when the wait above timed out or the test was cancelled.
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    assert proc.returncode is not None
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["result"] == {"echo": {"text": "over http"}}
    assert result.meta is not None
    beta = identity("beta")
    payload = jws_verify(
        result.meta["a2a-secure/response_jws"], beta.public_key, typ="a2a-response+jws", kid=beta.kid
    )
    assert payload["result"] == {"echo": {"text": "over http"}}
    assert payload["status"] == "success"
    assert refused.is_error
    assert refused.content[0].text.startswith("impostor refused:")  # type: ignore[union-attr]
    assert progress == [1.0, 2.0]
    assert streamed.structured_content is not None and streamed.meta is not None
    assert streamed.structured_content["result"] == [{"i": 0}, {"i": 1}]
    alpha = identity("alpha")
    events = [
        jws_verify(token, alpha.public_key, typ="a2a-event+jws", kid=alpha.kid)
        for token in streamed.meta["a2a-secure/event_jws"]
    ]
    assert [(e["index"], e["final"]) for e in events] == [(0, False), (1, False), (2, True)]
    assert huge.is_error
    assert huge.content[0].text.startswith("tool arguments refused: 1000011 bytes")  # type: ignore[union-attr]
    assert not after.is_error


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "agents.example.com"])
def test_the_http_transport_binds_loopback_only(
    host: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = cli.main(
        ["mcp", "--key-file", str(tmp_path / "k"), "--registry", str(tmp_path / "r"),
         "--transport", "http", "--host", host]
    )  # fmt: skip
    assert code == 2
    assert "--host must be a loopback address" in capsys.readouterr().err


def test_a_non_loopback_host_makes_the_command_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "a2a_secure", "mcp", "--key-file", str(tmp_path / "k"),
         "--registry", str(tmp_path / "r"), "--transport", "http", "--host", "0.0.0.0"],
        check=False, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "loopback" in proc.stderr and "Traceback" not in proc.stderr
