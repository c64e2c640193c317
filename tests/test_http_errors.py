"""Every error of PROTOCOL.md §7 over the real HTTP stack, with its exact status and code.

Each test sends raw bytes with httpx to a real uvicorn server and checks the HTTP status,
the JSON-RPC code, that the response ``id`` is the request's (or ``null`` when it could not
be read), whether the error is signed (steps 5-11 of §6.1) and that nothing leaks. After a
rejected request the same session still serves the next honest request and the store holds
what it held before: bad input never changes stored state.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import base58
import httpx
import pytest
import pytest_asyncio

from a2a_secure.errors import SessionUnknown
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import FakeClock, serve_app
from tests.http_helpers import (
    JSON,
    SECRET,
    AuditLog,
    Env,
    build_server,
    envelope,
    identity,
    open_env,
    serve_env,
)

POLICY = Policy.build(blocked=["blocked"])
MIB = 1024 * 1024


# One server for the module (starting and stopping uvicorn is most of a test's time); each
# test gets its own client DID and session on it, and fresh handler counts and audit list.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[tuple[AgentServer, str, httpx.AsyncClient]]:
    server = build_server(policy=POLICY, audit=AuditLog())
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        yield server, url, http


@pytest_asyncio.fixture(loop_scope="module")
async def env(shared: tuple[AgentServer, str, httpx.AsyncClient]) -> Env:
    server, url, http = shared
    server.calls.clear()  # type: ignore[attr-defined]
    e = await open_env(server, url, http, client=Identity.generate("client"))
    e.audit.clear()
    await e.honest()  # this DID's rate window exists from here on: counts() is steady
    return e


def expect_error(resp: httpx.Response, status: int, code: int, rid: Any) -> dict[str, Any]:
    """The JSON-RPC error of ``resp``, after checking status, code, id and shape."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"jsonrpc", "id", "error"}
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == rid and type(body["id"]) is type(rid)
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in resp.text
    return error  # type: ignore[no-any-return]


def is_signed(env: Env, req: PreparedRequest, error: dict[str, Any]) -> bool:
    """Whether ``error`` carries a valid ``response_jws`` over ``req`` (§6.2)."""
    return env.session.error_from_reply(req, error).signed


async def unharmed(env: Env, before: dict[str, int]) -> None:
    """The session still serves its next sequence and the store is as it was."""
    assert env.store.counts() == before
    calls = sum(env.calls.values())
    result = await env.honest(after="reject")
    assert result.result == {"echo": {"after": "reject"}}
    assert result.sequence == env.session.last_sequence
    assert env.store.counts() == before
    assert sum(env.calls.values()) == calls + 1


def x25519_did_key() -> str:
    """A syntactically valid did:key whose multicodec is X25519 (0xec01), not Ed25519."""
    return "did:key:z" + base58.b58encode(b"\xec\x01" + bytes(range(32))).decode()


# -- -32700 parse error ---------------------------------------------------------------------------

DEPTH_33 = b'{"jsonrpc":"2.0","method":"intent","params":' + b"[" * 32 + b"]" * 32 + b',"id":1}'
PARSE_ERRORS = {
    "not-json": b"{this is not json",
    "empty": b"",
    "trailing-data": b'{"jsonrpc":"2.0","method":"intent","params":{},"id":1} {}',
    "duplicate-member": b'{"jsonrpc":"2.0","method":"intent","params":{},"id":1,"id":2}',
    "duplicate-nested": b'{"jsonrpc":"2.0","method":"intent","params":{"a":1,"a":1},"id":1}',
    "nan": b'{"jsonrpc":"2.0","method":"intent","params":{"x":NaN},"id":1}',
    "infinity": b'{"jsonrpc":"2.0","method":"intent","params":{"x":-Infinity},"id":1}',
    "overflow-float": b'{"jsonrpc":"2.0","method":"intent","params":{"x":1e400},"id":1}',
    "depth-33": DEPTH_33,
    "lone-surrogate": b'{"jsonrpc":"2.0","method":"intent","params":{"x":"\\ud800"},"id":1}',
    "lone-low-surrogate-key": b'{"jsonrpc":"2.0","method":"intent","params":{"\\udc00":1},"id":1}',
    "int-2^53": b'{"jsonrpc":"2.0","method":"intent","params":{},"id":9007199254740992}',
    "int-negative-2^53": b'{"jsonrpc":"2.0","method":"intent","params":{"x":-9007199254740992},"id":1}',
    "invalid-utf8": b'{"jsonrpc":"2.0","method":"intent","params":{"x":"\xff"},"id":1}',
    "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","method":"intent","params":{},"id":1}',
}


@pytest.mark.parametrize("body", PARSE_ERRORS.values(), ids=PARSE_ERRORS.keys())
async def test_parse_error_is_400_32700_with_null_id(env: Env, body: bytes) -> None:
    before = env.store.counts()
    for path in ("/a2a/intent", "/a2a/handshake"):
        error = expect_error(await env.post(path, body), 400, -32700, None)
        assert "data" not in error
    await unharmed(env, before)
    assert env.audit[-3]["event"] == "reject" and env.audit[-3]["error_code"] == -32700


async def test_parse_limits_are_exact(env: Env) -> None:
    # Depth 32 and 2^53-1 are still I-JSON: they get past the parser to the next check.
    depth_32 = b'{"jsonrpc":"2.0","method":"intent","params":' + b"[" * 31 + b"]" * 31 + b',"id":7}'
    expect_error(await env.post("/a2a/intent", depth_32), 400, -32602, 7)
    max_int = 2**53 - 1
    body = envelope("intent", [], max_int)
    expect_error(await env.post("/a2a/intent", body), 400, -32602, max_int)
    # A surrogate pair is fine (it is one character).
    pair = b'{"jsonrpc":"2.0","method":"intent","params":{"x":"\\ud83d\\ude00"},"id":8}'
    expect_error(await env.post("/a2a/intent", pair), 400, -32602, 8)


# -- -32600 invalid request -----------------------------------------------------------------------

ENVELOPE_ERRORS: dict[str, tuple[bytes, Any]] = {
    "batch": (b"[" + envelope("intent", {}, 1) + b"]", None),
    "empty-batch": (b"[]", None),
    "not-an-object": (b'"intent"', None),
    "number": (b"42", None),
    "missing-id": (b'{"jsonrpc":"2.0","method":"intent","params":{}}', None),
    "null-id": (envelope("intent", {}, None), None),
    "float-id": (b'{"jsonrpc":"2.0","method":"intent","params":{},"id":1.5}', None),
    "bool-id": (envelope("intent", {}, True), None),
    "object-id": (envelope("intent", {}, {"a": 1}), None),
    "array-id": (envelope("intent", {}, [1]), None),
    "id-129-chars": (envelope("intent", {}, "x" * 129), None),
    "extra-member": (
        encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": {}, "id": "e1", "extra": 1}),
        "e1",
    ),
    "jsonrpc-1.0": (encoding.dumps({"jsonrpc": "1.0", "method": "intent", "params": {}, "id": 3}), 3),
    "jsonrpc-number": (encoding.dumps({"jsonrpc": 2.0, "method": "intent", "params": {}, "id": 4}), 4),
    "jsonrpc-missing": (encoding.dumps({"method": "intent", "params": {}, "id": 5}), 5),
    "method-not-string": (encoding.dumps({"jsonrpc": "2.0", "method": 1, "params": {}, "id": "m"}), "m"),
    "method-missing": (encoding.dumps({"jsonrpc": "2.0", "params": {}, "id": 6}), 6),
}


@pytest.mark.parametrize("case", ENVELOPE_ERRORS.values(), ids=ENVELOPE_ERRORS.keys())
async def test_invalid_request_is_400_32600(env: Env, case: tuple[bytes, Any]) -> None:
    body, rid = case
    before = env.store.counts()
    expect_error(await env.post("/a2a/intent", body), 400, -32600, rid)
    expect_error(await env.post("/a2a/handshake", body), 400, -32600, rid)
    await unharmed(env, before)


@pytest.mark.parametrize("path", ["/a2a/intent", "/a2a/handshake"])
async def test_a_body_without_params_is_400_32602_under_its_id(env: Env, path: str) -> None:
    # PROTOCOL.md §4, last row of the envelope table: the envelope is fine, its params absent.
    before = env.store.counts()
    method = "intent" if path == "/a2a/intent" else "hello"
    body = encoding.dumps({"jsonrpc": "2.0", "method": method, "id": "np"})
    error = expect_error(await env.post(path, body), 400, -32602, "np")
    assert error["message"] == "params must be an object"
    # Earlier rows win: an extra member, or a method of the other endpoint, without params.
    extra = encoding.dumps({"jsonrpc": "2.0", "method": method, "id": "x", "more": 1})
    expect_error(await env.post(path, extra), 400, -32600, "x")
    other = encoding.dumps({"jsonrpc": "2.0", "method": "close" if method == "hello" else "proof", "id": "o"})
    expect_error(await env.post(path, other), 404, -32601, "o")
    await unharmed(env, before)


async def test_ids_are_echoed_exactly(env: Env) -> None:
    # The longest string id, an empty string, zero and a negative integer are all valid ids.
    for rid in ("i" * 128, "", 0, -5, "é☃"):
        expect_error(await env.post("/a2a/intent", envelope("intent", [], rid)), 400, -32602, rid)
    res = await env.honest()
    assert res.status == "success"


async def test_body_over_1_mib_is_413(env: Env) -> None:
    before = env.store.counts()
    body = envelope("intent", {"pad": "x" * MIB})
    assert len(body) > MIB
    error = expect_error(await env.post("/a2a/intent", body), 413, -32600, None)
    assert "large" in error["message"]
    await unharmed(env, before)


async def test_chunked_body_over_limit_without_content_length_is_413(env: Env) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc":"2.0","method":"intent","id":1,"params":{"pad":"'
        for _ in range(17):
            yield b"x" * 65536  # 17 * 64 KiB > 1 MiB, no Content-Length at all
        yield b'"}}'

    before = env.store.counts()
    req = env.http.build_request("POST", env.url + "/a2a/intent", content=chunks(), headers=JSON)
    assert "content-length" not in req.headers
    assert req.headers["transfer-encoding"] == "chunked"
    resp = await env.http.send(req)
    expect_error(resp, 413, -32600, None)
    await unharmed(env, before)


async def test_body_of_exactly_1_mib_is_read(env: Env) -> None:
    # Whitespace padding up to the limit exactly: the body is read and parsed.
    body = envelope("intent", [], 11)
    body = body[:-1] + b" " * (MIB - len(body)) + b"}"
    assert len(body) == MIB
    expect_error(await env.post("/a2a/intent", body), 400, -32602, 11)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/jsonx",
        "application/json; charset=latin-1",
        "text/json",
        "multipart/x",
        'application/json; charset="latin-1"',
        "application/json; charset=utf-8; charset=utf-8",
        "application/json; profile=x",
        'application/json; charset="utf-8',
        "application/json charset=utf-8",
    ],
)
async def test_wrong_or_missing_content_type_is_415(env: Env, content_type: str | None) -> None:
    before = env.store.counts()
    req = env.prepare(will="be refused")
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path in ("/a2a/intent", "/a2a/handshake"):
        resp = await env.post(path, envelope("intent", req.params, 9), headers=headers)
        expect_error(resp, 415, -32600, None)
    assert env.calls["echo"] == 1
    await unharmed(env, before)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "Application/JSON",
        # RFC 9110: a parameter value may be quoted, names are case-insensitive, OWS around ";"
        'application/json; charset="utf-8"',
        'APPLICATION/Json ; Charset="UTF-8"',
        "application/json;",
    ],
)
async def test_json_content_type_variants_are_accepted(env: Env, content_type: str) -> None:
    req = env.prepare(ok=True)
    resp = await env.post(
        "/a2a/intent", envelope("intent", req.params, 10), headers={"Content-Type": content_type}
    )
    assert resp.status_code == 200, resp.text
    assert env.session.verify_result(req, resp.json()["result"]).result == {"echo": {"ok": True}}


# -- -32601 method not found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/a2a/handshake", "frobnicate"),
        ("/a2a/intent", "frobnicate"),
        ("/a2a/handshake", "intent"),
        ("/a2a/handshake", "close"),
        ("/a2a/intent", "hello"),
        ("/a2a/intent", "proof"),
        ("/a2a/intent", "accept_policy"),
        ("/a2a/intent", "Intent"),
    ],
)
async def test_method_unknown_or_on_wrong_endpoint_is_404(env: Env, path: str, method: str) -> None:
    before = env.store.counts()
    req = env.prepare(x=1)  # valid params for "intent": only the endpoint is wrong
    error = expect_error(await env.call(path, method, req.params, rid="m-1"), 404, -32601, "m-1")
    assert "data" not in error
    assert env.calls["echo"] == 1
    await unharmed(env, before)
    assert any(r["event"] == "reject" and r["error_code"] == -32601 for r in env.audit)


@pytest.mark.parametrize(("verb", "path"), [("POST", "/a2a/other"), ("GET", "/nothing"), ("PUT", "/a2a")])
async def test_an_unknown_path_is_a_json_rpc_404(env: Env, verb: str, path: str) -> None:
    before = env.store.counts()
    resp = await env.http.request(verb, env.url + path, content=b"{}", headers=JSON)
    error = expect_error(resp, 404, -32601, None)
    assert error["message"] == f"no such endpoint: {path}"
    await unharmed(env, before)


@pytest.mark.parametrize(
    ("verb", "path", "allow"),
    [
        ("GET", "/a2a/intent", "POST"),
        ("GET", "/a2a/handshake", "POST"),
        ("PUT", "/a2a/intent", "POST"),
        ("POST", "/.well-known/agent-card.json", "GET"),
    ],
)
async def test_a_wrong_http_method_is_a_json_rpc_405(env: Env, verb: str, path: str, allow: str) -> None:
    before = env.store.counts()
    resp = await env.http.request(verb, env.url + path, headers=JSON)
    error = expect_error(resp, 405, -32600, None)
    assert error["message"] == f"{verb} is not served on {path}"
    assert allow in resp.headers["allow"]
    await unharmed(env, before)


async def test_intent_without_handler_is_signed_404(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare("no-such-goal")
    error = expect_error(await env.send(req, rid="g"), 404, -32601, "g")
    assert is_signed(env, req, error)
    await unharmed(env, before)


# -- -32602 invalid params --------------------------------------------------------------------------


def _intent_variants(req: PreparedRequest) -> dict[str, Any]:
    p = req.params
    padded_sid = p["session_id"] + "="
    return {
        "params-array": [],
        "params-string": "x",
        "missing-request-jws": {k: v for k, v in p.items() if k != "request_jws"},
        "extra-type": {**p, "type": "intent"},
        "extra-member": {**p, "note": 1},
        "padded-session-id": {**p, "session_id": padded_sid},
        "short-session-id": {**p, "session_id": "AAAA"},
        "bad-commitment-shape": {**p, "session_commitment": "sha256:ABC"},
        "sequence-zero": {**p, "sequence": 0},
        "sequence-string": {**p, "sequence": "1"},
        "sequence-bool": {**p, "sequence": True},
        "sequence-float": {**p, "sequence": 1.5},
        "jws-two-segments": {**p, "request_jws": "a.b"},
        "jws-not-string": {**p, "request_jws": 5},
        "goal-empty": {**p, "intent": {"goal": "", "inputs": {}}},
        "goal-129": {**p, "intent": {"goal": "g" * 129, "inputs": {}}},
        "inputs-missing": {**p, "intent": {"goal": "echo"}},
        "inputs-array": {**p, "intent": {"goal": "echo", "inputs": []}},
        "intent-extra": {**p, "intent": {**p["intent"], "urgency": 1}},
        "unknown-constraint": {**p, "intent": {**p["intent"], "constraints": {"retries": 1}}},
        "timeout-zero": {**p, "intent": {**p["intent"], "constraints": {"timeout_ms": 0}}},
    }


async def test_invalid_intent_params_are_400_and_unsigned(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare(x=1)
    for name, params in _intent_variants(req).items():
        error = expect_error(await env.send(req, rid=name, params=params), 400, -32602, name)
        assert "response_jws" not in (error.get("data") or {}), name
    assert env.calls["echo"] == 1
    # The untouched request itself is still good: none of the above consumed its sequence.
    resp = await env.send(req)
    assert env.session.verify_result(req, resp.json()["result"]).result == {"echo": {"x": 1}}
    await unharmed(env, before)


async def test_invalid_hello_params_are_400(env: Env) -> None:
    before = env.store.counts()
    hs = ClientHandshake(identity("other"), resolve_did_key(env.server.identity.did))
    hello = hs.hello()
    cases = {
        "array": [],
        "wrong-type": {**hello, "type": "proof"},
        "type-missing": {k: v for k, v in hello.items() if k != "type"},
        "version-number": {**hello, "protocol_version": 1.0},
        "extra": {**hello, "extra": True},
        "agent-id-empty": {**hello, "agent_id": ""},
        "agent-id-129": {**hello, "agent_id": "a" * 129},
        "nonce-short": {**hello, "nonce": encoding.b64u_encode(os.urandom(16))},
        "nonce-zero": {**hello, "nonce": encoding.b64u_encode(bytes(32))},
        "manifest-hash": {**hello, "manifest_hash": "sha256:00"},
        "timestamp-string": {**hello, "timestamp": str(hello["timestamp"])},
        "not-a-did": {**hello, "agent_did": "not-a-did"},
        "public-keys-empty": {**hello, "public_keys": []},
    }
    for name, params in cases.items():
        expect_error(await env.call("/a2a/handshake", "hello", params, rid=name), 400, -32602, name)
    assert env.store.counts() == before  # no pending handshake was opened
    await unharmed(env, before)


async def test_invalid_proof_params_are_400(env: Env) -> None:
    cases = {
        "wrong-type": {"type": "accept_policy", "nonce_b": "A" * 43, "proof_jws": "a.b.c"},
        "padded-nonce": {"type": "proof", "nonce_b": "A" * 43 + "=", "proof_jws": "a.b.c"},
        "not-a-jws": {"type": "proof", "nonce_b": encoding.b64u_encode(os.urandom(32)), "proof_jws": "x"},
        "extra": {"type": "proof", "nonce_b": "A" * 43, "proof_jws": "a.b.c", "more": 1},
    }
    for name, params in cases.items():
        expect_error(await env.call("/a2a/handshake", "proof", params, rid=name), 400, -32602, name)


async def test_handler_rejecting_inputs_is_signed_400(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare("reject", x=1)
    error = expect_error(await env.send(req, rid=1), 400, -32602, 1)
    assert error["message"] == "inputs.x must be a string"
    assert is_signed(env, req, error)
    await unharmed(env, before)


# -- -32040 authentication failed ----------------------------------------------------------------


async def test_wrong_commitment_is_unsigned_401(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare(x=1)
    params = {**req.params, "session_commitment": "sha256:" + "0" * 64}
    error = expect_error(await env.send(req, rid="c", params=params), 401, -32040, "c")
    assert not is_signed(env, req, error)
    assert env.calls["echo"] == 1
    await unharmed(env, before)


async def test_request_signed_by_another_key_is_unsigned_401(env: Env) -> None:
    before = env.store.counts()
    s = env.session
    intruder = ClientSession(
        identity=identity("intruder"),
        server_did=s.server_did,
        server_kid=s.server_kid,
        server_key=s.server_key,
        session_id=s.session_id,
        session_commitment=s.session_commitment,
        policy=s.policy,
        created_at=s.created_at,
        expires_at=s.expires_at,
    )
    intruder.last_sequence = s.last_sequence
    req = intruder.prepare_intent({"goal": "echo", "inputs": {"steal": True}})
    error = expect_error(await env.send(req, rid="k"), 401, -32040, "k")
    assert "response_jws" not in (error.get("data") or {})
    # The client's own key, wrong typ (a close token over the intent payload): also -32040.
    own = env.prepare(x=2)
    _h, payload, _s, _i = jws_decode_unverified(own.params["request_jws"])
    wrong_typ = jws_sign(payload, env.client, m.Typ.CLOSE)
    params = {**own.params, "request_jws": wrong_typ}
    expect_error(await env.send(own, rid="t", params=params), 401, -32040, "t")
    assert env.calls["echo"] == 1
    await unharmed(env, before)


async def test_params_differing_from_signed_payload_is_signed_401(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare(amount=1)
    tampered = copy.deepcopy(req.params)
    tampered["intent"]["inputs"]["amount"] = 1000
    error = expect_error(await env.send(req, rid="p", params=tampered), 401, -32040, "p")
    assert is_signed(env, req, error)
    # Step 5 failed on the params sequence; the same with a bumped params sequence is signed
    # with the params' sequence (§9).
    bumped = {**req.params, "sequence": req.sequence + 5}
    error = expect_error(await env.send(req, rid="q", params=bumped), 401, -32040, "q")
    assert is_signed(env, dataclasses.replace(req, sequence=req.sequence + 5), error)
    assert env.calls["echo"] == 1
    # Nothing was consumed: the original, untampered request is still accepted.
    resp = await env.send(req)
    assert env.session.verify_result(req, resp.json()["result"]).result == {"echo": {"amount": 1}}
    await unharmed(env, before)


async def test_handshake_authentication_failures_are_401(env: Env) -> None:
    before = env.store.counts()
    server_did = env.server.identity.did
    hs = ClientHandshake(identity("alice"), resolve_did_key(server_did))
    hello = hs.hello()
    # public_keys listing a key that is not the DID's: -32040 (key binding).
    other = identity("mallory").public_key_entry()
    bad_keys = {**hello, "public_keys": [{**hello["public_keys"][0], "key": other["key"]}]}
    expect_error(await env.call("/a2a/handshake", "hello", bad_keys, rid=1), 401, -32040, 1)
    assert env.store.counts() == before
    resp = await env.call("/a2a/handshake", "hello", hello)
    proof = hs.receive_challenge(resp.json()["result"])
    # A PROOF signed by another key fails and leaves the pending handshake as it was.
    _h, payload, _s, _i = jws_decode_unverified(proof["proof_jws"])
    forged = {**proof, "proof_jws": jws_sign(payload, identity("mallory"), m.Typ.PROOF)}
    expect_error(await env.call("/a2a/handshake", "proof", forged, rid=2), 401, -32040, 2)
    wrong_typ = {**proof, "proof_jws": jws_sign(payload, identity("alice"), m.Typ.ACCEPT)}
    expect_error(await env.call("/a2a/handshake", "proof", wrong_typ, rid=3), 401, -32040, 3)
    assert env.store.counts() == {**before, "pending": before["pending"] + 1}
    # ... so the honest PROOF still completes the handshake.
    resp = await env.call("/a2a/handshake", "proof", proof)
    assert resp.status_code == 200, resp.text
    accept = hs.receive_policy(resp.json()["result"])
    resp = await env.call("/a2a/handshake", "accept_policy", accept)
    assert resp.status_code == 200, resp.text
    hs.receive_session(resp.json()["result"])
    assert env.store.counts()["sessions"] == before["sessions"] + 1


# -- -32041 handshake unknown ------------------------------------------------------------------------


async def test_unknown_unproven_or_used_handshake_is_401(env: Env) -> None:
    sessions = env.store.counts()["sessions"]
    hs = ClientHandshake(identity("bob"), resolve_did_key(env.server.identity.did))
    resp = await env.call("/a2a/handshake", "hello", hs.hello())
    proof = hs.receive_challenge(resp.json()["result"])
    # accept_policy before proof: the handshake is not proven.
    unproven = {"type": "accept_policy", "nonce_b": proof["nonce_b"], "accept_jws": proof["proof_jws"]}
    expect_error(await env.call("/a2a/handshake", "accept_policy", unproven, rid="u"), 401, -32041, "u")
    # An unknown nonce_b.
    unknown = {**proof, "nonce_b": encoding.b64u_encode(os.urandom(32))}
    expect_error(await env.call("/a2a/handshake", "proof", unknown, rid="n"), 401, -32041, "n")
    resp = await env.call("/a2a/handshake", "proof", proof)
    accept = hs.receive_policy(resp.json()["result"])
    # A replayed PROOF.
    expect_error(await env.call("/a2a/handshake", "proof", proof, rid="r"), 401, -32041, "r")
    resp = await env.call("/a2a/handshake", "accept_policy", accept)
    assert resp.status_code == 200
    # A replayed ACCEPT_POLICY: the pending handshake was consumed.
    expect_error(await env.call("/a2a/handshake", "accept_policy", accept, rid="a"), 401, -32041, "a")
    assert env.store.counts()["sessions"] == sessions + 1


async def test_expired_pending_handshake_is_401() -> None:
    clock = FakeClock()
    async with serve_env(clock=clock) as env:
        hs = ClientHandshake(identity("carol"), resolve_did_key(env.server.identity.did), clock=clock)
        resp = await env.call("/a2a/handshake", "hello", hs.hello())
        proof = hs.receive_challenge(resp.json()["result"])
        clock.advance(61)  # a pending handshake lives 60 s
        expect_error(await env.call("/a2a/handshake", "proof", proof, rid=1), 401, -32041, 1)


# -- -32042 policy ------------------------------------------------------------------------------


async def test_intent_blocked_by_policy_is_signed_403(env: Env) -> None:
    before = env.store.counts()
    agreed = env.session.policy
    env.session.policy = Policy()  # a client that ignores the agreed policy
    try:
        req = env.prepare("blocked")
    finally:
        env.session.policy = agreed
    error = expect_error(await env.send(req, rid="b"), 403, -32042, "b")
    assert is_signed(env, req, error)
    assert env.calls["blocked"] == 0
    await unharmed(env, before)


# -- -32043 session --------------------------------------------------------------------------------


async def test_unknown_and_closed_session_is_401(env: Env) -> None:
    sessions = env.store.counts()["sessions"]
    req = env.prepare(x=1)
    params = {**req.params, "session_id": encoding.b64u_encode(os.urandom(32))}
    error = expect_error(await env.send(req, rid=1, params=params), 401, -32043, 1)
    assert not is_signed(env, req, error)
    await env.honest()
    close = env.session.prepare_close()
    resp = await env.send(close, rid="close")
    assert resp.status_code == 200
    env.session.verify_closed(close, resp.json()["result"])
    assert env.store.counts()["sessions"] == sessions - 1
    # The session is gone: an intent with a newer sequence and the retried close both get -32043.
    env.session.closed = False
    later = env.prepare(x=2)
    expect_error(await env.send(later, rid=2), 401, -32043, 2)
    expect_error(await env.send(close, rid=3), 401, -32043, 3)


async def test_expired_session_is_401() -> None:
    clock = FakeClock()
    async with serve_env(policy=Policy.build(session_timeout=60), clock=clock) as env:
        await env.honest()
        clock.advance(59)
        late = env.prepare(x=1)  # signed one second before the end
        clock.advance(1)  # now == expires_at: expired on both sides
        with pytest.raises(SessionUnknown):
            env.prepare(x=2)
        expect_error(await env.send(late, rid="x"), 401, -32043, "x")
        assert env.calls["echo"] == 1
        assert env.store.counts()["sessions"] == 0


# -- -32044 sequence ---------------------------------------------------------------------------------


async def test_out_of_order_and_replayed_sequence_is_signed_409(env: Env) -> None:
    before = env.store.counts()
    first, second = env.prepare(n=1), env.prepare(n=2)
    resp = await env.send(second)
    assert resp.status_code == 200
    error = expect_error(await env.send(first, rid="old"), 409, -32044, "old")
    assert is_signed(env, first, error)
    assert str(second.sequence) in error["message"]
    # The same sequence again with other bytes (a different request) is a replay: -32044.
    env.session.last_sequence = second.sequence - 1
    other = env.prepare(n=3)
    assert other.sequence == second.sequence and other.params != second.params
    error = expect_error(await env.send(other, rid="dup"), 409, -32044, "dup")
    assert is_signed(env, other, error)
    assert env.calls["echo"] == 2  # the setup request and `second`
    await unharmed(env, before)


# -- -32045 freshness --------------------------------------------------------------------------------


async def test_stale_hello_is_unsigned_401(env: Env) -> None:
    before = env.store.counts()
    for shift in (-301, 301):
        hs = ClientHandshake(
            identity("dave"), resolve_did_key(env.server.identity.did), clock=FakeClock(env.clock() + shift)
        )
        expect_error(await env.call("/a2a/handshake", "hello", hs.hello(), rid=shift), 401, -32045, shift)
    assert env.store.counts() == before
    await unharmed(env, before)


async def test_stale_request_is_signed_401(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    before = env.store.counts()
    monkeypatch.setattr(env.session, "_clock", lambda: env.clock() - 400)
    req = env.prepare(x=1)
    monkeypatch.undo()
    error = expect_error(await env.send(req, rid="s"), 401, -32045, "s")
    assert is_signed(env, req, error)
    assert env.calls["echo"] == 1
    await unharmed(env, before)


# -- -32046 version ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.0", "1.1", "1", ""])
async def test_unsupported_version_is_400_with_supported(env: Env, version: str) -> None:
    before = env.store.counts()
    hs = ClientHandshake(identity("erin"), resolve_did_key(env.server.identity.did))
    hello = {**hs.hello(), "protocol_version": version}
    error = expect_error(await env.call("/a2a/handshake", "hello", hello, rid="v"), 400, -32046, "v")
    assert error["data"] == {"supported": ["1.0"]}
    assert env.store.counts() == before


# -- -32047 DID resolution -------------------------------------------------------------------------


@pytest.mark.parametrize("did", [x25519_did_key(), "did:example:123456", "did:key:z6MkTooShort"])
async def test_unresolvable_did_is_401_32047(env: Env, did: str) -> None:
    before = env.store.counts()
    hs = ClientHandshake(identity("frank"), resolve_did_key(env.server.identity.did))
    hello = {**hs.hello(), "agent_did": did}
    expect_error(await env.call("/a2a/handshake", "hello", hello, rid="d"), 401, -32047, "d")
    assert env.store.counts() == before


# -- -32048 unavailable ------------------------------------------------------------------------------


async def test_rate_limited_is_signed_503_with_retry_after_and_not_consumed() -> None:
    clock = FakeClock(1_763_700_000.0)
    async with serve_env(policy=Policy.build(rate_limit=1, rate_period=60), clock=clock) as env:
        await env.honest()
        before = env.store.counts()
        req = env.prepare(x=1)
        resp = await env.send(req, rid="rl")
        error = expect_error(resp, 503, -32048, "rl")
        assert resp.headers["retry-after"] == "60"
        assert error["data"]["retry_after"] == 60
        exc = env.session.error_from_reply(req, error)
        assert exc.signed and exc.retry_after == 60  # type: ignore[attr-defined]
        assert env.store.counts() == before
        assert env.calls["echo"] == 1
        # Nothing was stored and the sequence not consumed: the very same bytes succeed later.
        clock.advance(60)
        resp = await env.send(req, rid="again")
        assert resp.status_code == 200 and resp.json()["id"] == "again"
        assert env.session.verify_result(req, resp.json()["result"]).result == {"echo": {"x": 1}}
        assert env.calls["echo"] == 2


async def test_pending_handshakes_full_is_503_with_retry_after() -> None:
    async with serve_env(limits=ServerLimits(max_pending_per_source=1)) as env:
        did = env.server.identity.did
        first = ClientHandshake(identity("g1"), resolve_did_key(did))
        assert (await env.call("/a2a/handshake", "hello", first.hello())).status_code == 200
        second = ClientHandshake(identity("g2"), resolve_did_key(did))
        resp = await env.call("/a2a/handshake", "hello", second.hello(), rid="full")
        error = expect_error(resp, 503, -32048, "full")
        assert resp.headers["retry-after"] == str(error["data"]["retry_after"])
        assert env.store.counts()["pending"] == 1
        await env.honest()  # the open session is untouched


async def test_sessions_full_is_503_and_keeps_the_pending_handshake() -> None:
    async with serve_env(limits=ServerLimits(max_sessions=1)) as env:
        hs = ClientHandshake(identity("h1"), resolve_did_key(env.server.identity.did))
        resp = await env.call("/a2a/handshake", "hello", hs.hello())
        resp = await env.call("/a2a/handshake", "proof", hs.receive_challenge(resp.json()["result"]))
        accept = hs.receive_policy(resp.json()["result"])
        resp = await env.call("/a2a/handshake", "accept_policy", accept, rid="s")
        error = expect_error(resp, 503, -32048, "s")
        assert resp.headers["retry-after"] == str(error["data"]["retry_after"])
        assert env.store.counts()["pending"] == 1 and env.store.counts()["sessions"] == 1
        await env.honest()


# -- -32049 timeout and -32603 internal error --------------------------------------------------------


async def test_handler_timeout_is_signed_504_and_stored(env: Env) -> None:
    before = env.store.counts()
    req = env.session.prepare_intent(
        {"goal": "slow", "inputs": {"seconds": 5}, "constraints": {"timeout_ms": 50}}
    )
    error = expect_error(await env.send(req, rid="t1"), 504, -32049, "t1")
    assert is_signed(env, req, error)
    # The byte-identical retry gets the stored answer; the handler does not run again.
    error2 = expect_error(await env.send(req, rid="t2"), 504, -32049, "t2")
    assert error2 == error
    assert env.calls["slow"] == 1
    await unharmed(env, before)


async def test_handler_exception_is_signed_generic_500(env: Env) -> None:
    before = env.store.counts()
    req = env.prepare("boom")
    resp = await env.send(req, rid="i")
    error = expect_error(resp, 500, -32603, "i")
    assert is_signed(env, req, error)
    for leak in (SECRET, "hunter2", "handler.py", "RuntimeError", "line 42", "File "):
        assert leak not in resp.text
    assert error["message"] == "the intent handler failed"
    resp2 = await env.send(req, rid="j")
    assert expect_error(resp2, 500, -32603, "j") == error
    assert env.calls["boom"] == 1
    await unharmed(env, before)


async def test_signed_errors_carry_the_request_sequence(env: Env) -> None:
    # Every signed error verifies only against the request it answers.
    req = env.prepare("boom")
    error = expect_error(await env.send(req, rid="z"), 500, -32603, "z")
    other = env.prepare("echo")
    assert not env.session.error_from_reply(other, error).signed
    assert env.session.error_from_reply(req, error).signed


async def test_many_bad_requests_leave_state_alone(env: Env) -> None:
    # A burst of assorted garbage, concurrently, then the session carries on.
    before = env.store.counts()
    req = env.prepare(x=1)
    bodies = [*PARSE_ERRORS.values(), *(b for b, _ in ENVELOPE_ERRORS.values())]
    bodies += [envelope("intent", p) for p in _intent_variants(req).values()]
    responses = await asyncio.gather(*(env.post("/a2a/intent", b) for b in bodies))
    assert all(r.status_code == 400 for r in responses)
    assert env.calls["echo"] == 1
    resp = await env.send(req)
    assert env.session.verify_result(req, resp.json()["result"]).sequence == req.sequence
    await unharmed(env, before)
