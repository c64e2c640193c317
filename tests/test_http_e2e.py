"""End to end over real HTTP: ``A2AClient`` against ``AgentServer`` under uvicorn.

Handshake, intents, close, session reuse, re-handshake after expiry or when the server has
forgotten the session, retries (Retry-After, transport failures, timeouts) that re-send the
byte-identical request and never run a handler twice, and the GET endpoints of §4.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    IntentTimeout,
    InternalError,
    InvalidParams,
    PolicyViolation,
    SessionUnknown,
    Unavailable,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import SessionRecord
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app
from tests.http_helpers import JSON, AuditLog, build_server, envelope, identity, serve_env

FAST = RetryPolicy(attempts=3, base=0.01, cap=0.02, max_wait=5)


class RecordingTransport(httpx.AsyncHTTPTransport):
    """Records every request body; can lose the answer to the first ``drop`` intent calls.

    A dropped call is forwarded to the server first (so the server did run it), its answer
    read and thrown away, and then the client sees a ``ReadError``, as if the connection broke
    on the way back.
    """

    def __init__(self, *, drop: int = 0) -> None:
        super().__init__()
        self.sent: list[tuple[str, bytes]] = []
        self.drop = drop

    def bodies(self, path: str = "/a2a/intent") -> list[bytes]:
        return [body for p, body in self.sent if p == path]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.path, request.content))
        response = await super().handle_async_request(request)
        if self.drop and request.url.path == "/a2a/intent":
            self.drop -= 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection lost after the request was sent", request=request)
        return response


@asynccontextmanager
async def hosted(server: AgentServer) -> AsyncIterator[str]:
    async with serve_app(server.app()) as url:
        yield url


@asynccontextmanager
async def client_with(transport: httpx.AsyncBaseTransport, **kw: Any) -> AsyncIterator[A2AClient]:
    http = httpx.AsyncClient(transport=transport, timeout=kw.pop("timeout", 10))
    try:
        async with A2AClient(identity("client"), http=http, **kw) as client:
            yield client
    finally:
        await http.aclose()


def echo(**inputs: Any) -> dict[str, Any]:
    return {"goal": "echo", "inputs": inputs}


# -- handshake, intents, close, reuse --------------------------------------------------------------


async def test_client_handshake_intents_close_and_session_reuse() -> None:
    audit, client_audit = AuditLog(), AuditLog()
    server = build_server(audit=audit)
    store = server.store
    assert isinstance(store, MemoryStore)
    async with hosted(server) as url:
        async with A2AClient(identity("client"), audit=client_audit) as client:
            did = server.identity.did
            results = [await client.request(did, echo(n=i), endpoint=url) for i in range(5)]
            assert [r.sequence for r in results] == [1, 2, 3, 4, 5]
            assert [r.result for r in results] == [{"echo": {"n": i}} for i in range(5)]
            assert all(r.status == "success" and r["status"] == "success" for r in results)
            # One handshake for all five requests (the endpoint is remembered per DID).
            more = await client.request(did, {"goal": "whoami", "inputs": {}})
            assert more.result == {"caller": client.identity.did, "sequence": 6, "agent_id": "client"}
            assert audit.tally("hello") == audit.tally("proof") == audit.tally("accept_policy") == 1
            assert audit.tally("intent") == 6
            assert store.counts()["sessions"] == 1
            assert server.calls == {"echo": 5, "whoami": 1}  # type: ignore[attr-defined]
            await client.close_session(did)
            assert store.counts()["sessions"] == 0
            assert audit.tally("close") == 1
            # The next request opens a new session.
            again = await client.request(did, echo(after="close"))
            assert again.sequence == 1
            assert audit.tally("hello") == 2
        # Leaving the context closed the open session with an authenticated close.
        assert store.counts()["sessions"] == 0
        assert audit.tally("close") == 2
        assert client.http.is_closed
    events = [(r["event"], r["status"]) for r in client_audit]
    assert events[:3] == [("hello", "success"), ("proof", "success"), ("accept_policy", "success")]
    assert ("close", "success") in events
    assert all(r["role"] == "client" and r["verified"] for r in client_audit)


def cookie_planting(app: Any, seen: list[dict[bytes, bytes]]) -> Any:
    """``app`` that records each request's headers and sets a cookie on every answer."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        seen.append(dict(scope["headers"]))

        async def planting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"set-cookie", b"track=1; Path=/")]}
            await send(message)

        await app(scope, receive, planting)

    return wrapped


async def test_the_clients_own_http_path_sends_exact_headers_and_keeps_no_cookies() -> None:
    # Without a given httpx client, A2AClient sends through its own HTTP/1.1 pool: the
    # requests name the host and JSON, keep the connection, and a cookie a server (or anyone
    # on the path) sets is never sent back: no state rides along with signed calls.
    server = build_server()
    seen: list[dict[bytes, bytes]] = []
    async with serve_app(cookie_planting(server.app(), seen)) as url, A2AClient(identity("client")) as client:
        did = server.identity.did
        results = [await client.request(did, echo(n=i), endpoint=url) for i in range(3)]
        assert [r.result for r in results] == [{"echo": {"n": i}} for i in range(3)]
    assert len(seen) == 3 + 3 + 1  # handshake, intents, close
    host = url.removeprefix("http://").encode()
    for headers in seen:
        assert b"cookie" not in headers
        assert headers[b"host"] == host
        assert headers[b"content-type"] == b"application/json"
        assert headers[b"accept-encoding"] == b"identity"  # nothing to inflate: no compression bomb
        assert int(headers[b"content-length"]) > 0


async def test_explicit_handshake_send_intent_close() -> None:
    server = build_server()
    async with hosted(server) as url, A2AClient(identity("client")) as client:
        session = await client.handshake(server.identity.did, url)
        assert session.server_did == server.identity.did
        assert session.expires_at - session.created_at == 3600
        first = await client.send_intent(session, echo(a=1))
        second = await client.send_intent(session, {"goal": "echo", "inputs": {"b": 2}, "domain": "test"})
        assert (first.sequence, second.sequence) == (1, 2)
        assert second.result == {"echo": {"b": 2}}
        # request() reuses the very session the explicit handshake opened.
        third = await client.request(server.identity.did, echo(c=3))
        assert third.sequence == 3
        await client.close_session(server.identity.did)
        assert session.closed and session.expired()
        with pytest.raises(SessionUnknown):
            await client.send_intent(session, echo(d=4))
        assert server.store.counts()["sessions"] == 0  # type: ignore[attr-defined]


async def test_concurrent_requests_share_one_handshake() -> None:
    audit = AuditLog()
    server = build_server(audit=audit)
    async with hosted(server) as url, A2AClient(identity("client")) as client:
        did = server.identity.did
        results = await asyncio.gather(*(client.request(did, echo(i=i), endpoint=url) for i in range(8)))
        assert sorted(r.sequence for r in results) == list(range(1, 9))
        assert sorted(r.result["echo"]["i"] for r in results) == list(range(8))
        assert audit.tally("hello") == 1


async def test_signed_errors_reach_the_caller_and_are_not_retried() -> None:
    server = build_server(policy=Policy.build(blocked=["blocked"]))
    async with hosted(server) as url, A2AClient(identity("client"), retry=FAST) as client:
        did = server.identity.did
        with pytest.raises(InvalidParams) as rejected:
            await client.request(did, {"goal": "reject", "inputs": {}}, endpoint=url)
        assert rejected.value.signed and rejected.value.message == "inputs.x must be a string"
        with pytest.raises(InternalError) as boom:
            await client.request(did, {"goal": "boom", "inputs": {}})
        assert boom.value.signed and "hunter2" not in boom.value.message
        with pytest.raises(IntentTimeout) as slow:
            await client.request(
                did, {"goal": "slow", "inputs": {"seconds": 5}, "constraints": {"timeout_ms": 50}}
            )
        assert slow.value.signed
        # A signed 500 or 504 is the stored, final answer: no retry ran the handler again.
        assert server.calls == {"reject": 1, "boom": 1, "slow": 1}  # type: ignore[attr-defined]
        # The client checks the agreed policy before sending anything.
        with pytest.raises(PolicyViolation):
            await client.request(did, {"goal": "blocked", "inputs": {}})
        assert (await client.request(did, echo(ok=1))).sequence == 4


async def test_client_refuses_a_policy_it_does_not_accept() -> None:
    server = build_server(policy=Policy.build(rate_limit=10))
    async with hosted(server) as url:
        async with A2AClient(identity("client"), accept_policy=lambda p: p.rate_limit >= 100) as client:
            with pytest.raises(PolicyViolation):
                await client.request(server.identity.did, echo(), endpoint=url)
        assert server.store.counts()["sessions"] == 0  # type: ignore[attr-defined]


async def test_endpoint_serving_another_did_is_refused() -> None:
    server = build_server()
    async with hosted(server) as url, A2AClient(identity("client")) as client:
        with pytest.raises(AuthenticationFailed):
            await client.request(identity("expected-peer").did, echo(), endpoint=url)
        assert server.store.counts()["sessions"] == 0  # type: ignore[attr-defined]


# -- re-handshake ------------------------------------------------------------------------------------


async def test_rehandshake_after_expiry_with_injected_clock() -> None:
    clock = FakeClock()
    audit = AuditLog()
    server = build_server(policy=Policy.build(session_timeout=120), clock=clock, audit=audit)
    async with hosted(server) as url, A2AClient(identity("client"), clock=clock) as client:
        did = server.identity.did
        first = await client.request(did, echo(n=1), endpoint=url)
        session = await client.session_for(did)
        assert session.expires_at == int(clock()) + 120
        clock.advance(119)
        assert (await client.request(did, echo(n=2))).sequence == 2
        assert audit.tally("hello") == 1
        clock.advance(1)  # now == expires_at
        third = await client.request(did, echo(n=3))
        assert third.sequence == 1 and third.result == {"echo": {"n": 3}}
        assert audit.tally("hello") == 2  # exactly one new session
        assert (await client.session_for(did)).session_id != session.session_id
        assert first.sequence == 1
        assert audit.tally("intent", status="error") == 0  # the client never sent on the old one


async def test_rehandshake_once_when_the_server_closed_the_session() -> None:
    audit = AuditLog()
    client_audit = AuditLog()
    server = build_server(audit=audit)
    async with hosted(server) as url, A2AClient(identity("client"), audit=client_audit) as client:
        did = server.identity.did
        await client.request(did, echo(n=1), endpoint=url)
        old = await client.session_for(did)
        await server.store.close_session(old.session_id)  # the server forgot it
        result = await client.request(did, echo(n=2))
        assert result.sequence == 1 and result.result == {"echo": {"n": 2}}
        assert audit.tally("hello") == 2
        assert [r["error_code"] for r in audit if r["status"] == "error"] == [-32043]
        assert [r["error_code"] for r in client_audit if r["status"] == "error"] == [-32043]
        assert server.calls["echo"] == 2  # type: ignore[attr-defined]


async def test_no_resend_on_unknown_session_when_the_caller_forbids_it() -> None:
    # An unsigned -32043 may be forged by someone who let the first request run; a caller
    # whose intents must not run twice turns the resend off and gets the error instead.
    server = build_server(audit=AuditLog())
    async with (
        hosted(server) as url,
        A2AClient(identity("client"), resend_on_unknown_session=False) as client,
    ):
        did = server.identity.did
        await client.request(did, echo(n=1), endpoint=url)
        old = await client.session_for(did)
        await server.store.close_session(old.session_id)
        with pytest.raises(SessionUnknown):
            await client.request(did, echo(n=2))
        assert server.calls["echo"] == 1  # type: ignore[attr-defined]
        # The next request opens a new session.
        assert (await client.request(did, echo(n=3))).result == {"echo": {"n": 3}}


async def test_rehandshake_once_after_server_restart_with_a_new_store() -> None:
    server_id = identity("server")
    first = build_server(server_id)
    async with A2AClient(identity("client")) as client:
        async with hosted(first) as url:
            await client.request(server_id.did, echo(n=1), endpoint=url)
        audit = AuditLog()
        second = build_server(server_id, audit=audit)  # same DID, empty store, new port
        async with hosted(second) as url2:
            result = await client.request(server_id.did, echo(n=2), endpoint=url2)
            assert result.sequence == 1
            assert audit.tally("hello") == 1
            assert audit.tally("intent", status="error") == 1
            await client.aclose()
            assert second.store.counts()["sessions"] == 0  # type: ignore[attr-defined]


class ForgetfulStore(MemoryStore):
    """A store that opens sessions but can never find them again."""

    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        return None


async def test_rehandshake_is_attempted_only_once() -> None:
    audit = AuditLog()
    server = AgentServer(identity("server"), store=ForgetfulStore(), audit=audit)
    server.add_handler("echo", lambda inputs: inputs)
    async with hosted(server) as url, A2AClient(identity("client")) as client:
        with pytest.raises(SessionUnknown) as exc:
            await client.request(server.identity.did, echo(), endpoint=url)
        assert not exc.value.signed
        assert audit.tally("accept_policy") == 2
        assert audit.tally("intent", status="error") == 2


# -- retries ---------------------------------------------------------------------------------------


def aligned_clock() -> Callable[[], float]:
    """Real time, starting exactly at a whole second (so a 1 s rate window starts now)."""
    start, mono = float(int(time.time())), time.monotonic()
    return lambda: start + (time.monotonic() - mono)


async def test_rate_limited_request_is_retried_after_retry_after_byte_identical() -> None:
    audit = AuditLog()
    server = build_server(
        policy=Policy.build(rate_limit=1, rate_period=1), clock=aligned_clock(), audit=audit
    )
    transport = RecordingTransport()
    async with hosted(server) as url, client_with(transport, retry=FAST) as client:
        did = server.identity.did
        await client.request(did, echo(n=1), endpoint=url)
        started = time.monotonic()
        second = await client.request(did, echo(n=2))
        assert time.monotonic() - started >= 0.9  # waited for Retry-After: 1
        assert second.sequence == 2 and second.result == {"echo": {"n": 2}}
        bodies = transport.bodies()
        assert len(bodies) == 3
        assert bodies[1] == bodies[2]  # the retry is the byte-identical request
        assert [r["error_code"] for r in audit if r["event"] == "intent"] == [None, -32048, None]
        assert server.calls["echo"] == 2  # type: ignore[attr-defined]


async def test_retry_after_beyond_max_wait_is_not_retried() -> None:
    clock = FakeClock(1_763_697_600.0)  # a whole hour: the window has 3600 s left
    server = build_server(policy=Policy.build(rate_limit=1, rate_period=3600), clock=clock)
    transport = RecordingTransport()
    async with hosted(server) as url, client_with(transport, retry=FAST, clock=clock) as client:
        await client.request(server.identity.did, echo(n=1), endpoint=url)
        with pytest.raises(Unavailable) as exc:
            await client.request(server.identity.did, echo(n=2))
        assert exc.value.signed and exc.value.retry_after == 3600
        assert len(transport.bodies()) == 2


async def test_byte_identical_request_twice_runs_the_handler_once() -> None:
    async with serve_env() as env:
        req = env.prepare("whoami")
        body_1 = envelope("intent", req.params, "first")
        body_2 = envelope("intent", req.params, "second")
        r1 = await env.post("/a2a/intent", body_1)
        r2 = await env.post("/a2a/intent", body_2)
        r3 = await env.post("/a2a/intent", body_1)
        assert r1.status_code == r2.status_code == r3.status_code == 200
        assert r1.json()["id"] == "first" and r2.json()["id"] == "second"
        assert r1.json()["result"] == r2.json()["result"] == r3.json()["result"]
        assert r1.content == r3.content
        verified = env.session.verify_result(req, r2.json()["result"])
        assert verified.result["sequence"] == req.sequence
        assert env.calls["whoami"] == 1
        assert [r["status"] for r in env.audit if r["event"] == "intent"] == ["success"] * 3


async def test_transport_failure_after_the_server_ran_it_gets_the_stored_answer() -> None:
    server = build_server()
    transport = RecordingTransport(drop=1)
    async with hosted(server) as url, client_with(transport, retry=FAST) as client:
        result = await client.request(server.identity.did, {"goal": "whoami", "inputs": {}}, endpoint=url)
        assert result.sequence == 1 and result.result["sequence"] == 1
        bodies = transport.bodies()
        assert len(bodies) == 2 and bodies[0] == bodies[1]
        assert server.calls["whoami"] == 1  # type: ignore[attr-defined]
        # The session carries on with the next sequence.
        assert (await client.request(server.identity.did, echo())).sequence == 2


async def test_client_timeout_retry_waits_for_the_running_handler() -> None:
    server = build_server()
    transport = RecordingTransport()
    async with hosted(server) as url, client_with(transport, retry=FAST, timeout=0.5) as client:
        intent = {"goal": "slow", "inputs": {"seconds": 0.75}}
        result = await client.request(server.identity.did, intent, endpoint=url)
        assert result.result == {"slept": 0.75}
        bodies = transport.bodies()
        assert len(bodies) == 2 and bodies[0] == bodies[1]
        assert server.calls["slow"] == 1  # type: ignore[attr-defined]


async def test_unreachable_peer_is_unavailable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    transport = RecordingTransport()
    async with client_with(transport, retry=FAST) as client:
        with pytest.raises(Unavailable) as exc:
            await client.request(identity("server").did, echo(), endpoint=f"http://127.0.0.1:{port}")
        assert isinstance(exc.value, A2AError) and exc.value.code == -32048
        assert len(transport.bodies("/a2a/handshake")) == FAST.attempts


JUNK_REPLIES: dict[str, tuple[int, dict[str, str], bytes, type[A2AError]]] = {
    "bad-gzip": (200, {"content-encoding": "gzip"}, b"not gzip at all", Unavailable),
    "html-502": (502, {"content-type": "text/html"}, b"<html>Bad Gateway</html>", InternalError),
    "wrong-id": (200, {}, b'{"jsonrpc":"2.0","id":999,"result":{}}', AuthenticationFailed),
    "array": (200, {}, b"[]", AuthenticationFailed),
    "result-with-error-status": (500, {}, b'{"jsonrpc":"2.0","id":1,"result":{}}', AuthenticationFailed),
    "bad-error-object": (400, {}, b'{"jsonrpc":"2.0","id":null,"error":"nope"}', AuthenticationFailed),
}


@pytest.mark.parametrize("reply", JUNK_REPLIES.values(), ids=JUNK_REPLIES.keys())
async def test_a_misbehaving_peer_never_leaks_a_raw_exception(
    reply: tuple[int, dict[str, str], bytes, type[A2AError]],
) -> None:
    status, headers, body, expected = reply

    async def junk(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        merged = {"content-type": "application/json", **headers}
        raw = [(k.encode(), v.encode()) for k, v in merged.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    async with serve_app(junk) as url, A2AClient(identity("client"), retry=FAST) as client:
        with pytest.raises(expected) as exc:
            await client.request(identity("server").did, echo(), endpoint=url)
        assert not exc.value.signed


# -- GET endpoints ------------------------------------------------------------------------------------


async def test_agent_card_health_and_did_document() -> None:
    server = build_server()
    async with hosted(server) as url, httpx.AsyncClient() as http:
        resp = await http.get(url + "/.well-known/agent-card.json")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
        card = encoding.loads(resp.content)
        assert {"name", "description", "version", "url", "did", "protocol", "endpoints"} <= card.keys()
        assert {"intents", "public_keys"} <= card.keys()
        assert card["protocol"] == "a2a-secure/1.0"
        assert card["did"] == server.identity.did
        assert card["endpoints"] == {"handshake": "/a2a/handshake", "intent": "/a2a/intent"}
        assert card["intents"] == ["blocked", "boom", "echo", "reject", "slow", "whoami"]
        assert card["public_keys"] == [server.identity.public_key_entry()]
        # The CHALLENGE's manifest_hash is hash_of(card).
        hs = ClientHandshake(identity("client"), resolve_did_key(server.identity.did))
        reply = await http.post(url + "/a2a/handshake", content=envelope("hello", hs.hello()), headers=JSON)
        challenge = reply.json()["result"]
        assert challenge["manifest_hash"] == encoding.hash_of(card) == server.manifest_hash
        hs.receive_challenge(challenge)
        health = await http.get(url + "/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "did": server.identity.did}
        did_doc = await http.get(url + "/.well-known/did.json")
        assert did_doc.status_code == 404
        # The protocol endpoints answer POST only.
        assert (await http.get(url + "/a2a/intent")).status_code == 405


async def test_client_session_records_the_server_manifest_hash() -> None:
    server = build_server()
    async with hosted(server) as url, A2AClient(identity("client")) as client:
        session = await client.handshake(server.identity.did, url)
        assert session.server_manifest_hash == encoding.hash_of(server.card)


@pytest.mark.parametrize(
    "intent", [{"goal": "echo"}, {"goal": "", "inputs": {}}, {"goal": "echo", "inputs": 1}]
)
async def test_client_refuses_malformed_intents_before_sending(intent: dict[str, Any]) -> None:
    server = build_server()
    transport = RecordingTransport()
    async with hosted(server) as url, client_with(transport) as client:
        await client.handshake(server.identity.did, url)
        with pytest.raises(InvalidParams):
            await client.request(server.identity.did, intent)
        assert transport.bodies() == []


async def test_plain_http_to_a_remote_host_is_refused() -> None:
    transport = RecordingTransport()
    async with client_with(transport) as client:
        for endpoint in ("http://example.com", "http://10.0.0.1:8000", "ftp://127.0.0.1", "127.0.0.1:80"):
            with pytest.raises(InvalidParams, match="https"):
                await client.request(identity("server").did, echo(), endpoint=endpoint)
        assert transport.sent == []


async def test_client_refuses_a_reply_larger_than_its_bound() -> None:
    # A hostile server answering with an endless body: the client stops reading at its bound
    # and raises an A2AError instead of holding the whole body in memory.
    async def hostile(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        chunk = b" " * 65536
        for _ in range(200):  # up to 12.5 MiB
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"{}"})

    server_did = identity("hostile-server").did
    async with (
        serve_app(hostile) as url,
        A2AClient(identity("client"), retry=RetryPolicy(attempts=1)) as client,
    ):
        with pytest.raises(A2AError, match="too large"):
            await client.handshake(server_did, url)
