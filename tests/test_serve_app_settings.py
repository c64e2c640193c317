"""``a2a-secure serve --app`` serves the app's own server object, every setting as it was built.

The walk below introspects ``AgentServer.__init__``: every parameter must have an example
here, so a setting added later is covered by construction (the test fails until it is).
Each is set alone on an app, served through the worker factory ``app_from_env`` (what every
``serve`` worker runs), and checked on the server that answers. The last tests drive the real
command: an app that reserves a goal to a principal, serves tools, metrics and log lines, as
``a2a-secure serve --app`` from the app's own folder.
"""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import one_line_error, run_cli, serve_cli

from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.identity.rotation import KeyRing, RetiredKey
from a2a_secure.policy import Policy
from a2a_secure.protocol.approval import ApprovalSettings
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import ENV, app_from_env
from a2a_secure.server.settings import SETTINGS
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import FileRevocations

SERVER = Identity.from_seed(bytes(range(50, 82)), "built")
PERSON = Identity.from_seed(bytes(range(51, 83)), "person")
CALLER = Identity.from_seed(bytes(range(52, 84)), "caller")


def _hook(**_record: Any) -> None:
    """An audit hook."""


def _clock() -> float:
    return 1_900_000_000.0


def _monotonic() -> float:
    return time.monotonic() + 5


def _route_paths(server: AgentServer) -> set[str]:
    return {getattr(route, "path", "") for route in server.router().routes}


def _examples(tmp: Path) -> dict[str, tuple[Any, Callable[[AgentServer, Any], bool]]]:
    """Per constructor parameter: a value other than its default, and how the served server shows it."""
    ring = KeyRing(SERVER, retired=(RetiredKey(Identity.from_seed(bytes(range(53, 85)), "old"), 1, 2),))
    return {
        "identity": (SERVER, lambda s, v: s.card["did"] == v.did),
        "policy": (Policy.build(allowed=["echo"], rate_limit=7), lambda s, v: s.protocol.policy == v),
        "name": ("named", lambda s, v: s.card["name"] == v),
        "description": ("described", lambda s, v: s.card["description"] == v),
        "version": ("9.9.9", lambda s, v: s.card["version"] == v),
        "url": ("https://agent.example", lambda s, v: s.card["url"] == v),
        "store": (MemoryStore(), lambda s, v: s.protocol.store is v),
        "resolver": (DIDResolver(), lambda s, v: s.resolver is v),
        "audit": (_hook, lambda s, v: s._audit is v),
        "limits": (ServerLimits(max_pending_total=77), lambda s, v: s.limits == v),
        "max_body": (1234, lambda s, v: s.max_body == v),
        "clock": (_clock, lambda s, v: s._clock is v),
        "monotonic": (_monotonic, lambda s, v: s._monotonic is v),
        "key_ring": (ring, lambda s, v: s.key_ring is v),
        "revocations": ((FileRevocations(tmp / "deny.json"),), lambda s, v: v[0] in s.revocations),
        "priority_rights": (PriorityRights.from_dict({"default": 2}), lambda s, v: s.priority_rights == v),
        "approvers": ((PERSON.did,), lambda s, v: set(s._approvers) == set(v)),
        "approval": (ApprovalSettings(ttl=60), lambda s, v: s.approvals.settings == v),
        "serve_tools": (True, lambda s, v: s.has("tool.list") and s.has("tool.execute")),
        "metrics": (True, lambda s, v: s.metrics is not None and "/metrics" in _route_paths(s)),
        "log_requests": (True, lambda s, v: s._observer.log_requests is True),
        "require_sealed": (True, lambda s, v: s.limits.require_sealed is v and s.limits.sealed_intents),
        "delegation": (
            {"pay": [PERSON.did]},
            lambda s, v: (
                "delegation" in s.card["a2a_secure_extensions"]
                and s.protocol is not None
                and dict(s.delegation.required_principals) == {"pay": frozenset(v["pay"])}
            ),
        ),
    }


PARAMETERS = [p for p in inspect.signature(AgentServer.__init__).parameters if p != "self"]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "built.key"
    SERVER.save(path)
    return path


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[AgentServer], str]]:
    """Make ``server`` importable as an app; returns its ``module:attr``."""
    names: list[str] = []

    def put(server: AgentServer) -> str:
        name = f"settings_app_{len(names)}"
        module = types.ModuleType(name)
        module.server = server  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
        names.append(name)
        return f"{name}:server"

    yield put


def test_every_constructor_setting_has_an_example_and_a_rule() -> None:
    assert sorted(_examples(Path("."))) == sorted(PARAMETERS), "a new setting needs an example here"
    assert sorted(SETTINGS) == sorted(PARAMETERS), "a new AgentServer setting needs its entry in SETTINGS"


@pytest.mark.parametrize("name", PARAMETERS)
def test_serve_app_honours_the_setting(
    name: str, tmp_path: Path, key_file: Path, install: Callable[[AgentServer], str]
) -> None:
    value, shows = _examples(tmp_path)[name]
    built = AgentServer(SERVER) if name == "identity" else AgentServer(SERVER, **{name: value})
    built.add_handler("echo", lambda inputs: inputs)
    spec = install(built)
    served = app_from_env({ENV["key_file"]: str(key_file), ENV["app"]: spec}).state.agent_server
    assert served is built  # the app's own object, not a copy of some of its fields
    assert shows(served, value), f"serve --app dropped the app's {name}"


def test_the_command_line_adds_what_the_app_left_unset(
    tmp_path: Path, key_file: Path, install: Callable[[AgentServer], str]
) -> None:
    built = AgentServer(SERVER)
    built.add_handler("echo", lambda inputs: inputs)
    spec = install(built)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowed_intents": ["echo"], "delegation": {"echo": [PERSON.did]}}))
    env = {
        ENV["key_file"]: str(key_file),
        ENV["app"]: spec,
        ENV["policy"]: str(policy),
        ENV["metrics"]: "1",
        ENV["log_format"]: "json",
        ENV["url"]: "https://given.example",
    }
    served = app_from_env(env).state.agent_server
    examples = _examples(tmp_path)
    assert served is built
    assert served.protocol.policy.allowed_intents == ("echo",)
    assert examples["delegation"][1](served, {"pay": [PERSON.did]}) is False  # it is the file's
    assert dict(served.delegation.required_principals) == {"echo": frozenset({PERSON.did})}
    assert examples["metrics"][1](served, True) and examples["log_requests"][1](served, True)
    assert served.card["url"] == "https://given.example"


@pytest.mark.parametrize(
    ("setting", "value", "env", "flag"),
    [
        ("policy", Policy.build(allowed=["echo"]), {"policy": '{"allowed_intents": ["x"]}'}, "--policy"),
        ("delegation", {"pay": [PERSON.did]}, {"policy": '{"delegation": {}}'}, "--policy"),
        ("url", "https://agent.example", {"url": "https://other.example"}, "--url"),
        ("limits", ServerLimits(max_pending_total=5), {"policy": '{"max_queued_intents": 9}'}, "--policy"),
    ],
)
def test_a_setting_given_in_both_places_differently_refuses_to_start(
    tmp_path: Path,
    key_file: Path,
    install: Callable[[AgentServer], str],
    setting: str,
    value: Any,
    env: dict[str, str],
    flag: str,
) -> None:
    spec = install(AgentServer(SERVER, **{setting: value}))
    environ = {ENV["key_file"]: str(key_file), ENV["app"]: spec}
    if "policy" in env:
        (tmp_path / "policy.json").write_text(env["policy"])
        environ[ENV["policy"]] = str(tmp_path / "policy.json")
    if "url" in env:
        environ[ENV["url"]] = env["url"]
    with pytest.raises(ValueError, match="built with its own") as refused:
        app_from_env(environ)
    assert f"the command line gives another ({flag}): give it in one place only" in str(refused.value)


APP = """
from a2a_secure import A2AAgent
from a2a_secure.identity.keys import Identity

agent = A2AAgent(
    "built",
    Identity.from_seed(bytes(range(50, 82)), "built"),
    delegation={{"pay": [{person!r}]}},
    serve_tools=True,
)
agent.server.metrics  # an A2AAgent builds its server on first use


@agent.intent("pay")
def pay(inputs):
    return {{"paid": inputs}}
"""


def test_serve_app_from_its_folder_keeps_delegation_tools_metrics_and_logs(
    tmp_path: Path, key_file: Path
) -> None:
    app_dir = tmp_path / "myapp"
    app_dir.mkdir()
    (app_dir / "payagent.py").write_text(textwrap.dedent(APP.format(person=PERSON.did)))
    caller_key = tmp_path / "caller.key"
    CALLER.save(caller_key)
    args = ["--key-file", str(key_file), "--app", "payagent:agent", "--metrics", "--log-format", "json"]
    # No PYTHONPATH=.: the current folder is --app-dir's default.
    with serve_cli(tmp_path, *args, cwd=app_dir) as served:
        card = httpx.get(served.url + "/.well-known/agent-card.json").json()
        assert "delegation" in card["a2a_secure_extensions"]
        assert {"pay", "tool.execute", "tool.list"} <= set(card["intents"])
        call = ["call", "--key-file", str(caller_key), "--to", SERVER.did, "--endpoint", served.url]
        refused = one_line_error(run_cli(*call, "--goal", "pay", "--inputs", '{"eur": 5}'))
        assert "runs only on behalf of a principal" in refused  # not run with no principal
        # Nor through tool.execute naming it (the goal inside the goal).
        inner = json.dumps({"name": "pay", "arguments": {"eur": 5}})
        done = run_cli(*call, "--goal", "tool.execute", "--inputs", inner)
        assert "paid" not in done.stdout
        assert httpx.get(served.url + "/metrics").status_code == 200
        output = served.output()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(line.get("caller_did") == CALLER.did for line in lines), output
    # What serve says at start: the DID, the card, a ready call line.
    assert f"a2a-secure: serving {SERVER.did}" in output
    assert f"a2a-secure: card {served.url}/.well-known/agent-card.json" in output
    assert f"a2a-secure call --key-file YOUR.key --to {SERVER.did} --endpoint {served.url} --goal" in output


def test_app_dir_and_one_line_import_errors(tmp_path: Path, key_file: Path) -> None:
    app_dir = tmp_path / "elsewhere"
    app_dir.mkdir()
    (app_dir / "payagent.py").write_text(textwrap.dedent(APP.format(person=PERSON.did)))
    (app_dir / "broken.py").write_text("import not_installed_anywhere\n")
    serve = ["serve", "--key-file", str(key_file), "--port", "1"]
    missing = one_line_error(run_cli(*serve, "--app", "payagent:agent", cwd=tmp_path))
    assert missing == (
        f"--app 'payagent:agent': no module named 'payagent' in {tmp_path}"
        " (run from its folder, or give --app-dir)"
    )
    attr = one_line_error(run_cli(*serve, "--app", "payagent:agnt", "--app-dir", str(app_dir)))
    assert attr == "--app 'payagent:agnt': payagent has no attribute 'agnt'"
    inner = one_line_error(run_cli(*serve, "--app", "broken:agent", "--app-dir", str(app_dir)))
    assert inner == "--app 'broken:agent': importing broken failed: No module named 'not_installed_anywhere'"
    shape = one_line_error(run_cli(*serve, "--app", "payagent", "--app-dir", str(app_dir)))
    assert shape == "--app 'payagent' must be 'module:attribute' (e.g. myagent:agent)"
    with serve_cli(
        tmp_path, "--key-file", str(key_file), "--app", "payagent:agent", "--app-dir", str(app_dir)
    ) as s:
        assert s.proc.poll() is None


def test_what_only_the_workers_open_is_refused_before_anything_starts(tmp_path: Path, key_file: Path) -> None:
    # The store and the audit log are opened by the workers only: an app that has its own is
    # refused by serve itself, in one line naming the flag, not by each worker after start.
    (tmp_path / "audited.py").write_text(
        "from a2a_secure.identity.keys import Identity\n"
        "from a2a_secure.server.app import AgentServer\n"
        "server = AgentServer(Identity.from_seed(bytes(range(50, 82)), 'built'), audit=lambda **r: None)\n"
    )
    serve = ["serve", "--key-file", str(key_file), "--app", "audited:server", "--app-dir", str(tmp_path)]
    refused = one_line_error(run_cli(*serve, "--audit-log", str(tmp_path / "audit.jsonl")))
    assert refused == (
        "app 'audited:server' was built with its own audit, and the command line gives another"
        " (--audit-log): give it in one place only"
    )
    assert not (tmp_path / "audit.jsonl").exists()
