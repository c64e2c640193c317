"""No private key, intent input or result, or token ever reaches a log or an audit record
(ATTACKS.md I3, PROTOCOL.md §8), key files are private, and nothing prints a seed.

The main test runs a whole conversation over a real uvicorn server (handshake, intents whose
inputs and results carry recognisable markers, a failing intent, a rejected one, bad
requests, a close) with every logger at DEBUG (pytest's ``caplog`` and an extra root
handler, uvicorn's own logging routed to the root) and with both agents auditing into a
hash-chained ``JsonlAuditLog`` and a ``LoggingAuditSink``. It then scans every log line and
the bytes of both audit files for the two private keys (base64url seed and raw hex), the
markers and every ``request_jws``/``response_jws`` token seen on the wire.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import pickle
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from attack_helpers import MARKER

from a2a_secure import cli
from a2a_secure.agent import A2AAgent
from a2a_secure.audit import Auditor, JsonlAuditLog, LoggingAuditSink, verify_chain
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InternalError,
    InvalidParams,
    SessionUnknown,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity, KeyFileError
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.protocol.server import IntentDispatcher, ServerLimits
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import app_from_env
from a2a_secure.store.base import PendingHandshake, SessionRecord
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

RESULT_MARKER = "RESULT-4b1d-also-secret"
JWS_RE = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+")


def seed_forms(ident: Identity) -> list[str]:
    """Every textual form of the private key a leak could take."""
    b64 = ident.private_key_b64u()
    raw = encoding.b64u_decode(b64)
    return [b64, raw.hex(), raw.hex().upper(), repr(raw)[2:-1], encoding.b64u_encode(raw + ident.public_key)]


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """Every logger at DEBUG, captured by caplog and by an extra handler on the root."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    saved = {name: logging.getLogger(name).level for name in list(logging.root.manager.loggerDict)}
    saved_root = root.level
    root.addHandler(handler)
    caplog.set_level(logging.DEBUG)
    for name in saved:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_root)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def build_server(identity: Identity, audit: Auditor) -> AgentServer:
    # Sealing (on by default) turned off: the inputs and results cross the wire in the clear,
    # where an HTTP library's debug logging could copy them, which is what is tested here.
    limits = ServerLimits(sealed_intents=False)
    server = AgentServer(
        identity, Policy.build(blocked=["blocked"]), store=MemoryStore(), audit=audit, limits=limits
    )

    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"echo": inputs, "extra": RESULT_MARKER}

    @server.intent("boom")
    async def boom(inputs: dict[str, Any]) -> Any:
        raise RuntimeError(f"handler failed on {inputs!r} {MARKER}")

    @server.intent("reject")
    async def reject(inputs: dict[str, Any]) -> Any:
        raise InvalidParams("inputs rejected")

    return server


async def test_a_whole_conversation_leaks_no_key_input_result_or_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, debug_logs: io.StringIO
) -> None:
    server_id = Identity.generate("secret-server")
    client_id = Identity.generate("secret-client")
    server_log, client_log = tmp_path / "server.jsonl", tmp_path / "client.jsonl"
    server_audit = Auditor(
        [JsonlAuditLog(server_log, server_id, checkpoint_every=5), LoggingAuditSink()], role="server"
    )
    client_audit = Auditor(
        [
            JsonlAuditLog(client_log, client_id, checkpoint_every=5),
            LoggingAuditSink("a2a_secure.audit.client"),
        ],
        role="client",
    )
    wire: list[bytes] = []

    async def on_request(request: httpx.Request) -> None:
        wire.append(request.content)

    async def on_response(response: httpx.Response) -> None:
        wire.append(await response.aread())

    server = build_server(server_id, server_audit)
    # log_config=None: uvicorn's loggers propagate to the root, where the test listens.
    async with (
        serve_app(server.app(), log_config=None, log_level="debug", access_log=True) as url,
        httpx.AsyncClient(event_hooks={"request": [on_request], "response": [on_response]}) as http,
    ):
        client = A2AClient(client_id, http=http, audit=client_audit.record, retry=RetryPolicy(attempts=1))
        did = server_id.did
        result = await client.request(did, {"goal": "echo", "inputs": {"secret": MARKER}}, endpoint=url)
        assert result.result == {"echo": {"secret": MARKER}, "extra": RESULT_MARKER}
        with pytest.raises(InternalError) as boom:
            await client.request(did, {"goal": "boom", "inputs": {"secret": MARKER}})
        assert boom.value.signed and MARKER not in boom.value.message
        with pytest.raises(InvalidParams):
            await client.request(did, {"goal": "reject", "inputs": {"secret": MARKER}})
        # Bad requests: garbage, and a request whose signature was tampered with.
        assert (await http.post(url + "/a2a/intent", content=b"{not json")).status_code == 415
        json_header = {"Content-Type": "application/json"}
        assert (
            await http.post(url + "/a2a/intent", content=b"{not json", headers=json_header)
        ).status_code == 400
        session = await client.session_for(did)
        req = session.prepare_intent({"goal": "echo", "inputs": {"secret": MARKER}})
        head, body, sig = req.params["request_jws"].split(".")
        bad = {**req.params, "request_jws": f"{head}.{body}.{sig[::-1]}"}
        resp = await http.post(
            url + "/a2a/intent",
            content=encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": bad, "id": 1}),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code in (400, 401)
        await client.close_session(did)
        with pytest.raises(A2AError):
            await client.send_intent(session, {"goal": "echo", "inputs": {"secret": MARKER}})
        await client.aclose()
    server_audit.close()
    client_audit.close()

    tokens = {t for raw in wire for t in JWS_RE.findall(raw.decode("utf-8", "replace"))}
    tokens |= {req.params["request_jws"], bad["request_jws"]}
    assert len(tokens) >= 10  # policy, proof, accept, session, requests, responses
    assert any(MARKER in raw.decode() for raw in wire)  # the markers did cross the wire
    logs = "\n".join([debug_logs.getvalue(), caplog.text, *(r.getMessage() for r in caplog.records)])
    audit = server_log.read_bytes().decode() + client_log.read_bytes().decode()
    # The scan has something to scan: audit records went to the logs and the files, and
    # uvicorn's and httpx's debug logging was captured.
    assert '"event":"intent"' in logs and '"role":"client"' in logs and '"role":"server"' in logs
    assert "HTTP Request: POST" in logs and "uvicorn" in logs
    assert audit.count('"event":"intent"') >= 6 and '"event":"checkpoint"' in audit
    assert verify_chain(server_log, public_key=server_id.public_key).ok
    assert verify_chain(client_log, public_key=client_id.public_key).ok

    secrets = [*seed_forms(server_id), *seed_forms(client_id), MARKER, RESULT_MARKER]
    for token in tokens:
        secrets.append(token)
        _header, payload, signature = token.split(".")
        secrets += [payload, signature]  # the header alone names only the public kid
    for secret in secrets:
        assert secret not in logs, f"leaked into the logs: {secret[:40]}"
        assert secret not in audit, f"leaked into the audit log: {secret[:40]}"
    for record in (json.loads(line) for line in audit.splitlines()):
        assert set(record) <= {
            "timestamp",
            "event",
            "role",
            "session_id",
            "client_did",
            "server_did",
            "intent_goal",
            "sequence",
            "status",
            "duration_ms",
            "error_code",
            "verified",
            "prev_hash",
            "checkpoint",
        }


# -- key files -------------------------------------------------------------------------------------

UNSAFE_MODES = [0o640, 0o604, 0o644, 0o660, 0o606, 0o610, 0o601, 0o620, 0o602, 0o700 | 0o077, 0o777]


def test_key_file_is_created_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    ident = Identity.generate("keyfile")
    old = os.umask(0)
    try:
        ident.save(tmp_path / "id.json")
        assert cli.main(["keygen", "--agent-id", "cli", "--out", str(tmp_path / "cli.json")]) == 0
        log = JsonlAuditLog(tmp_path / "audit.jsonl", ident)
        log.close()
    finally:
        os.umask(old)
    for name in ("id.json", "cli.json", "audit.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert Identity.load(tmp_path / "id.json").did == ident.did


@pytest.mark.parametrize("mode", UNSAFE_MODES, ids=oct)
def test_group_or_world_accessible_key_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: int
) -> None:
    ident = Identity.generate("keyfile")
    path = tmp_path / "id.json"
    ident.save(path)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as info:
        Identity.load(path)
    assert "chmod 600" in info.value.message
    for argv in (
        ["did", "show", "--key-file", str(path)],
        ["did", "document", "--key-file", str(path), "--did-web", "did:web:example.com"],
        ["call", "--key-file", str(path), "--to", ident.did, "--endpoint", "https://x.test", "--goal", "g"],
    ):
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert "chmod 600" in err
        for secret in seed_forms(ident):
            assert secret not in out and secret not in err
    with pytest.raises(KeyFileError):
        app_from_env({"A2A_SECURE_KEY_FILE": str(path)})
    for secret in seed_forms(ident):
        assert secret not in info.value.message and secret not in repr(info.value)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_owner_only_key_file_is_accepted(tmp_path: Path, mode: int) -> None:
    ident = Identity.generate("keyfile")
    path = tmp_path / "id.json"
    ident.save(path)
    path.chmod(mode)
    assert Identity.load(path).did == ident.did
    assert cli.main(["did", "show", "--key-file", str(path)]) == 0


def test_key_errors_never_echo_the_key(tmp_path: Path) -> None:
    ident = Identity.generate("keyfile")
    seed = ident.private_key_b64u()
    errors: list[A2AError] = []
    for bad in (seed + "=", seed + "!", seed[:-1], " " + seed + "x", seed + seed):
        try:
            Identity.from_private_key(bad, "x")
        except A2AError as exc:
            errors.append(exc)
    path = tmp_path / "broken.json"
    for content in (
        {"version": 1, "agent_id": "x", "private_key": seed + "A"},
        {"version": 1, "agent_id": "x", "private_key": seed, "did": "did:key:z6MkWrong"},
        {"version": 2, "private_key": seed},
    ):
        path.write_text(json.dumps(content))
        path.chmod(0o600)
        try:
            Identity.load(path)
        except A2AError as exc:
            errors.append(exc)
    assert len(errors) == 8
    for exc in errors:
        text = f"{exc} {exc!r} {exc.to_error_object()}"
        for form in seed_forms(ident):
            assert form not in text and form[:20] not in text


# -- repr and str ------------------------------------------------------------------------------------


async def test_repr_and_str_never_show_the_seed(tmp_path: Path) -> None:
    server_id = Identity.generate("repr-server")
    client_id = Identity.generate("repr-client")
    store = MemoryStore()
    dispatcher = IntentDispatcher()
    protocol = ServerProtocol(
        server_id,
        Policy(),
        store=store,
        resolver=DIDResolver(),
        dispatcher=dispatcher,
        manifest_hash=encoding.hash_of({}),
    )
    hs = ClientHandshake(client_id, resolve_did_key(server_id.did))
    challenge = (await protocol.handle("hello", hs.hello())).result
    policy = (await protocol.handle("proof", hs.receive_challenge(challenge))).result
    pending = next(iter(store._pending.values()))
    session_msg = (await protocol.handle("accept_policy", hs.receive_policy(policy))).result
    session = hs.receive_session(session_msg)
    record = next(iter(store._sessions.values()))
    assert isinstance(pending, PendingHandshake) and isinstance(record, SessionRecord)
    agent = A2AAgent("repr-client", client_id)
    client = A2AClient(client_id)
    audit_log = JsonlAuditLog(tmp_path / "a.jsonl", client_id)
    objects: list[Any] = [
        client_id,
        server_id,
        agent,
        agent.client,
        client,
        session,
        hs,
        record,
        pending,
        protocol,
        AgentServer(server_id),
        audit_log,
        Auditor([audit_log], role="client"),
        KeyFileError("x"),
    ]
    try:
        for obj in objects:
            texts = [repr(obj), str(obj), format(obj, ""), f"{obj!r:>10}"]
            for form in (*seed_forms(client_id), *seed_forms(server_id)):
                for text in texts:
                    assert form not in text, (type(obj).__name__, text[:200])
        # Holding an Identity never makes it serialisable.
        for obj in (client_id, session):
            with pytest.raises(TypeError):
                pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.copy(client_id)
    finally:
        audit_log.close()
        await client.aclose()
        await agent.aclose()


# -- error messages for bad signatures --------------------------------------------------------------


async def test_error_messages_never_echo_the_token() -> None:
    server_id, client_id = Identity.generate("echo-server"), Identity.generate("echo-client")
    server = build_server(server_id, Auditor([], role="server"))
    transport = httpx.ASGITransport(app=server.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

        async def rpc(method: str, params: Any) -> httpx.Response:
            body = encoding.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
            path = "/a2a/intent" if method in ("intent", "close") else "/a2a/handshake"
            return await http.post(path, content=body, headers={"Content-Type": "application/json"})

        hs = ClientHandshake(client_id, resolve_did_key(server_id.did))
        challenge = (await rpc("hello", hs.hello())).json()["result"]
        proof = hs.receive_challenge(challenge)
        tokens: list[tuple[str, dict[str, Any], str]] = []

        def variants(token: str) -> list[str]:
            h, p, s = token.split(".")
            return [
                f"{h}.{p}.{s[::-1]}",
                f"{h}.{p[:-2]}{p[-1]}{p[-2]}.{s}",
                f"{h}.{p}.{s}=",
                f"{h}.{p}",
                f"{p}.{h}.{s}",
            ]

        for bad in variants(proof["proof_jws"]):
            tokens.append((bad, {**proof, "proof_jws": bad}, "proof"))
        for bad, params, method in tokens:
            resp = await rpc(method, params)
            assert resp.status_code in (400, 401)
            text = resp.text
            for part in [bad, *bad.split(".")]:
                if len(part) >= 16:
                    assert part not in text
        policy = (await rpc("proof", proof)).json()["result"]
        session = hs.receive_session((await rpc("accept_policy", hs.receive_policy(policy))).json()["result"])
        req = session.prepare_intent({"goal": "echo", "inputs": {"secret": MARKER}})
        for bad in variants(req.params["request_jws"]):
            resp = await rpc("intent", {**req.params, "request_jws": bad})
            assert resp.status_code in (400, 401)
            assert MARKER not in resp.text
            for part in [bad, *bad.split(".")]:
                if len(part) >= 16:
                    assert part not in resp.text
        with pytest.raises(AuthenticationFailed):
            session.verify_result(
                req, {"status": "success", "sequence": 1, "result": {}, "response_jws": "x.y.z"}
            )
        with pytest.raises(SessionUnknown):
            session.closed = True
            session.prepare_intent({"goal": "echo", "inputs": {}})
