"""The ``a2a-secure`` command: keygen and did show / document / resolve."""

from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import base58
import pytest

from a2a_secure.cli import main
from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import Identity, b64u_decode, public_key_from_did_key
from a2a_secure.identity.did import did_web_document

REPO = Path(__file__).resolve().parents[1]
SEED = bytes(range(32))
DID_WEB = "did:web:example.com%3A8443:agents:bob"

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_clean_error(err: str) -> None:
    assert err.startswith("a2a-secure: error: ")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.key"
    Identity.from_seed(SEED, "agent-1").save(path)
    return path


# -- keygen -----------------------------------------------------------------------------------


@posix_only
def test_keygen_writes_0600_file_and_prints_did_last(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "new.key"
    code, out, err = run(capsys, "keygen", "--out", str(path), "--agent-id", "alice")
    assert code == 0, err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    did = out.strip().splitlines()[-1]
    ident = Identity.load(path)
    assert did == ident.did
    assert ident.agent_id == "alice"
    assert public_key_from_did_key(did) == ident.public_key
    assert ident.private_key_b64u() not in out + err


def test_keygen_refuses_existing_file_without_force(
    capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    before = key_file.read_bytes()
    code, out, err = run(capsys, "keygen", "--out", str(key_file))
    assert code == 1
    assert out == ""
    _assert_clean_error(err)
    assert "exists" in err
    assert key_file.read_bytes() == before


def test_keygen_force_replaces(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    old_did = Identity.load(key_file).did
    code, out, _ = run(capsys, "keygen", "--out", str(key_file), "--force")
    assert code == 0
    new_did = out.strip().splitlines()[-1]
    assert new_did != old_did
    assert Identity.load(key_file).did == new_did
    assert Identity.load(key_file).agent_id == "a2a-agent"


def test_keygen_without_out_prints_env_line_then_did(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "keygen")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2
    name, _, value = lines[0].partition("=")
    assert name == "A2A_PRIVATE_KEY"
    assert len(b64u_decode(value)) == 32
    assert Identity.from_private_key(value, "x").did == lines[1]


def test_keygen_into_missing_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "keygen", "--out", str(tmp_path / "missing" / "a.key"))
    assert code == 1
    assert out == ""
    _assert_clean_error(err)


def test_keygen_bad_agent_id(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "keygen", "--out", str(tmp_path / "a.key"), "--agent-id", "x" * 129)
    assert code == 1
    _assert_clean_error(err)
    assert not (tmp_path / "a.key").exists()


def _subprocess(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=60,
    )


@posix_only
def test_keygen_as_subprocess(tmp_path: Path) -> None:
    path = tmp_path / "sub.key"
    cmd = [sys.executable, "-m", "a2a_secure", "keygen", "--out", str(path)]
    done = _subprocess(cmd, tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert done.stdout.strip().splitlines()[-1] == Identity.load(path).did

    again = _subprocess(cmd, tmp_path)
    assert again.returncode == 1
    assert again.stdout == ""
    assert "Traceback" not in again.stderr
    assert "exists" in again.stderr

    forced = _subprocess([*cmd, "--force"], tmp_path)
    assert forced.returncode == 0
    assert forced.stdout.strip().splitlines()[-1] == Identity.load(path).did


@posix_only
def test_keygen_script(tmp_path: Path) -> None:
    path = tmp_path / "script.key"
    script = str(REPO / "scripts" / "keygen.sh")
    done = _subprocess(["sh", script, str(path), "--agent-id", "scripted"], tmp_path, PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr
    ident = Identity.load(path)
    assert ident.agent_id == "scripted"
    assert done.stdout.strip().splitlines()[-1] == ident.did
    again = _subprocess(["sh", script, str(path)], tmp_path, PYTHON=sys.executable)
    assert again.returncode == 1
    assert Identity.load(path).did == ident.did


# -- usage --------------------------------------------------------------------------------------


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "keygen" in err


def test_group_without_subcommand_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "did")
    assert code == 2
    assert "document" in err


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "frobnicate")
    assert code == 2
    assert "invalid choice" in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "keygen" in out
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert "a2a-secure" in out


# -- did show -------------------------------------------------------------------------------------


def test_did_show(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    ident = Identity.load(key_file)
    code, out, _ = run(capsys, "did", "show", "--key-file", str(key_file))
    assert code == 0
    shown = json.loads(out)
    assert shown == {
        "agent_id": "agent-1",
        "did": ident.did,
        "kid": ident.kid,
        "public_key_entry": ident.public_key_entry(),
    }
    assert ident.private_key_b64u() not in out


def test_did_show_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "did", "show", "--key-file", str(tmp_path / "none.key"))
    assert code == 1
    assert out == ""
    _assert_clean_error(err)


@posix_only
def test_did_show_refuses_readable_key_file(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    key_file.chmod(0o644)
    code, _, err = run(capsys, "did", "show", "--key-file", str(key_file))
    assert code == 1
    _assert_clean_error(err)
    assert "chmod 600" in err


def test_did_show_requires_key_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "did", "show")
    assert code == 2


# -- did document ---------------------------------------------------------------------------------


def test_did_document_shape(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    ident = Identity.load(key_file)
    code, out, err = run(capsys, "did", "document", "--key-file", str(key_file), "--did-web", DID_WEB)
    assert code == 0
    assert "https://example.com:8443/agents/bob/did.json" in err
    doc = json.loads(out)
    kid = DID_WEB + "#key-1"
    assert doc == {
        "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
        "id": DID_WEB,
        "verificationMethod": [
            {
                "id": kid,
                "type": "Multikey",
                "controller": DID_WEB,
                "publicKeyMultibase": ident.did[len("did:key:") :],
            }
        ],
        "authentication": [kid],
        "assertionMethod": [kid],
    }
    multibase = doc["verificationMethod"][0]["publicKeyMultibase"]
    assert multibase.startswith("z6Mk")
    assert base58.b58decode(multibase[1:]) == b"\xed\x01" + ident.public_key
    assert doc == did_web_document(DID_WEB, ident.public_key)


def test_did_document_parses_with_the_did_web_resolver(
    capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    didweb = pytest.importorskip("a2a_secure.identity.didweb")
    ident = Identity.load(key_file)
    code, out, _ = run(capsys, "did", "document", "--key-file", str(key_file), "--did-web", DID_WEB)
    assert code == 0
    resolved = didweb.parse_did_document(DID_WEB, json.loads(out))
    assert dict(resolved.keys) == {DID_WEB + "#key-1": ident.public_key}


def test_did_document_custom_fragment(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    code, out, _ = run(
        capsys, "did", "document", "--key-file", str(key_file), "--did-web", DID_WEB, "--fragment", "k2"
    )
    assert code == 0
    assert json.loads(out)["authentication"] == [DID_WEB + "#k2"]


@pytest.mark.parametrize(
    "did",
    [
        "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
        "did:web:127.0.0.1",
        "did:web:example.com:..:admin",
        "not a did",
    ],
)
def test_did_document_refuses_non_did_web(
    capsys: pytest.CaptureFixture[str], key_file: Path, did: str
) -> None:
    code, out, err = run(capsys, "did", "document", "--key-file", str(key_file), "--did-web", did)
    assert code == 1
    assert out == ""
    _assert_clean_error(err)


def test_did_web_document_function_checks() -> None:
    pk = Identity.from_seed(SEED, "a").public_key
    with pytest.raises(InvalidParams):
        did_web_document(DID_WEB, pk[:31])
    with pytest.raises(InvalidParams):
        did_web_document(DID_WEB, bytes.fromhex("01" + "00" * 31))  # small-order key
    with pytest.raises(InvalidParams):
        did_web_document(DID_WEB, pk, fragment="")
    with pytest.raises(InvalidParams):
        did_web_document(DID_WEB, pk, fragment="a b")
    with pytest.raises(DIDResolutionError):
        did_web_document("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK", pk)


# -- did resolve ----------------------------------------------------------------------------------


def test_did_resolve_did_key(capsys: pytest.CaptureFixture[str]) -> None:
    ident = Identity.from_seed(SEED, "a")
    code, out, _ = run(capsys, "did", "resolve", ident.did)
    assert code == 0
    assert json.loads(out) == {"did": ident.did, "public_keys": [ident.public_key_entry()]}


@pytest.mark.parametrize(
    "did",
    [
        "did:key:zTjsVPtY",
        "did:key:z6MkeXATEjyXENzBXBxgC5EHk2JE5aqd7qMGGtDpLUH1e2Sj",
        "did:example:123",
        "did:KEY:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b",
        "did:web:127.0.0.1",
        "did:web:localhost",
    ],
)
def test_did_resolve_errors_are_clean(capsys: pytest.CaptureFixture[str], did: str) -> None:
    code, out, err = run(capsys, "did", "resolve", did)
    assert code == 1
    assert out == ""
    _assert_clean_error(err)


class _DidJsonHandler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        if self.path != "/.well-known/did.json":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/did+json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def did_web_server() -> Iterator[tuple[str, Identity]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DidJsonHandler)
    did = f"did:web:localhost%3A{server.server_address[1]}"
    ident = Identity.from_seed(SEED, "web")
    handler_cls = type(
        "Handler", (_DidJsonHandler,), {"body": json.dumps(did_web_document(did, ident.public_key)).encode()}
    )
    server.RequestHandlerClass = handler_cls
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield did, ident
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_did_resolve_did_web_on_loopback_in_dev_mode(
    capsys: pytest.CaptureFixture[str], did_web_server: tuple[str, Identity]
) -> None:
    pytest.importorskip("a2a_secure.identity.didweb")
    did, ident = did_web_server
    code, out, err = run(capsys, "did", "resolve", did, "--allow-loopback-dev")
    assert code == 0, err
    resolved = json.loads(out)
    assert resolved["did"] == did
    assert [(e["kid"], e["key"]) for e in resolved["public_keys"]] == [
        (did + "#key-1", ident.public_key_entry()["key"])
    ]


def test_did_resolve_did_web_loopback_refused_by_default(
    capsys: pytest.CaptureFixture[str], did_web_server: tuple[str, Identity]
) -> None:
    pytest.importorskip("a2a_secure.identity.didweb")
    did, _ = did_web_server
    code, out, err = run(capsys, "did", "resolve", did)
    assert code == 1
    assert out == ""
    _assert_clean_error(err)


def test_audit_verify_command_finds_changed_removed_and_reordered_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from a2a_secure.audit import Auditor, JsonlAuditLog

    ident = Identity.generate("auditor")
    log = tmp_path / "audit.jsonl"
    auditor = Auditor([JsonlAuditLog(log, ident)], role="server")
    for seq in range(1, 7):
        auditor.record(event="intent", status="success", verified=True, session_id="s", sequence=seq)
    auditor.close()
    lines = log.read_bytes().splitlines(keepends=True)
    assert main(["audit", "verify", str(log), "--did", ident.did]) == 0
    assert "chain intact" in capsys.readouterr().out

    def broken(new_lines: list[bytes]) -> str:
        log.write_bytes(b"".join(new_lines))
        assert main(["audit", "verify", str(log), "--did", ident.did]) == 1
        return capsys.readouterr().err

    changed = list(lines)
    changed[2] = changed[2].replace(b'"sequence":3', b'"sequence":9')
    assert "BROKEN at line" in broken(changed)
    assert "BROKEN at line" in broken(lines[:2] + lines[3:])  # a line removed
    assert "BROKEN at line" in broken([*lines[:1], lines[2], lines[1], *lines[3:]])  # reordered


def test_audit_verify_escapes_the_file_name_it_quotes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Anyone who can name a file in a log directory chooses the text: OSC 0 retitles the
    # terminal, U+202E reverses the rest of the line.
    from a2a_secure.audit.verify import audit_verify_main

    missing = tmp_path / "x\x1b]0;owned\x07\u202elog.jsonl"
    assert main(["audit", "verify", str(missing)]) == 2
    assert audit_verify_main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert not any(c in err for c in ("\x1b", "\x07", "\u202e")), repr(err)
    assert err.count("x\\x1b]0;owned\\x07\\u202elog.jsonl: No such file") == 2


def test_demo_runs_the_agents_and_verifies_every_audit_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # README's main command: three example agents and an orchestrator on loopback.
    assert main(["demo", "--keep-logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for step in (
        "HELLO         -> CHALLENGE",
        "PROOF         -> POLICY",
        "ACCEPT_POLICY -> SESSION",
        "CLOSE",
    ):
        assert step in out
    assert "server answered HTTP 401, code -32040" in out  # the tampered request is refused
    assert '"translated_text":"Hola mundo"' in out
    assert out.rstrip().endswith("demo finished: all handshakes, intents and audit chains verified")
    logs = sorted(p.name for p in tmp_path.glob("*.audit.jsonl"))
    names = ("calendar", "orchestrator", "sentiment", "summarizer", "translator")
    assert logs == [f"{n}.audit.jsonl" for n in names]
    # The approval part: the request, its preview, the person's approval, one run, a refusal.
    assert "needs approval: action " in out and "preview: Create 'Design review'" in out
    assert "ran once: " in out and "a second approval is refused: code -32050" in out
    lines = (tmp_path / "calendar.audit.jsonl").read_text().splitlines()
    calendar_events = [json.loads(line)["event"] for line in lines]
    for event in ("action_created", "action_approved", "action_executed", "action_refused"):
        assert calendar_events.count(event) == 1
    for log in tmp_path.glob("*.audit.jsonl"):
        assert b"Hola" not in log.read_bytes()  # no results (or inputs) in an audit record


# -- call with a registry -------------------------------------------------------------------------


def _flat_registry(path: Path, agents: dict[str, Any]) -> Path:
    path.write_text(json.dumps(agents), encoding="utf-8")
    return path


@posix_only
async def test_call_with_a_flat_registry_against_a_real_server(tmp_path: Path, key_file: Path) -> None:
    import asyncio

    from a2a_secure.testing import serve_app
    from tests.http_helpers import build_server

    server = build_server()
    async with serve_app(server.app()) as url:
        registry = _flat_registry(
            tmp_path / "agent_registry.json",
            {
                "echo-agent": {"did": server.identity.did, "endpoint": url, "capabilities": ["echo"]},
                "broken": {"endpoint": url},
            },
        )
        for target in ("echo-agent", "echo-", "echo"):
            proc = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "a2a_secure", "call", "--key-file", str(key_file)],
                *["--registry", str(registry), "--to", target, "--goal", "echo", "--inputs", '{"a": 1}'],
                "--allow-loopback-dev",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert json.loads(out) == {"echo": {"a": 1}}
            # The malformed entry is reported, and did not stop the call.
            assert "skipped registry entry 'broken': member 'did' is missing" in err.decode()
            assert "Traceback" not in err.decode()
    assert server.calls["echo"] == 3  # type: ignore[attr-defined]


def test_call_registry_errors_are_one_clean_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    did_a, did_b = Identity.generate("a").did, Identity.generate("b").did
    registry = _flat_registry(
        tmp_path / "agents.json",
        {
            "translator-de": {"did": did_a, "endpoint": down, "capabilities": ["translate"]},
            "translator-fr": {"did": did_b, "endpoint": down, "capabilities": ["translate"]},
        },
    )
    call = ["call", "--key-file", str(key_file), "--registry", str(registry), "--goal", "translate"]
    call.append("--allow-loopback-dev")
    expected = {
        "xyz": "No agent found matching 'xyz' (known agents: translator-de, translator-fr)",
        "translat": "Ambiguous target 'translat' (matches translator-de, translator-fr): "
        "use a full name or a DID",
        "translator-de": f"agent 'translator-de' did not answer at {down} (could not connect)",
    }
    for target, message in expected.items():
        code, out, err = run(capsys, *call, "--to", target)
        assert (code, out) == (1, "")
        _assert_clean_error(err)
        assert err.strip() == f"a2a-secure: error: {message}"
    unusable = _flat_registry(tmp_path / "unusable.json", {"translator": {"did": "translator"}})
    code, out, err = run(capsys, *call[:3], "--registry", str(unusable), "--goal", "x", "--to", "translator")
    assert (code, out) == (1, "")
    _assert_clean_error(err)
    assert "no usable agent: registry entry 'translator': member 'did' is not usable: not a DID" in err
