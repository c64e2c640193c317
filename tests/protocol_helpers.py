"""Shared pieces for the in-memory protocol tests (server and client state machines).

Everything is deterministic: a mutable fake clock, a counter-based random source, real
Ed25519 keys derived from fixed seeds. Nothing here mocks cryptography: forged messages
are built by signing with a real (wrong) key, a wrong ``typ`` or a wrong ``kid``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.errors import InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, Reply, ServerLimits
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.store.memory import MemoryStore

T0 = 1_763_700_000
SERVER_CARD = {"name": "test-server", "did": "placeholder", "protocol": "a2a-secure/1.0"}


class FakeClock:
    """A clock the test moves by hand (Unix seconds)."""

    def __init__(self, t: float = T0) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    @contextmanager
    def shifted(self, seconds: float) -> Iterator[None]:
        """Run a block with the clock ``seconds`` away, then move it back."""
        self.t += seconds
        try:
            yield
        finally:
            self.t -= seconds


class FakeRandom:
    """Deterministic, never-repeating, never-all-zero bytes (SHA-256 in counter mode)."""

    def __init__(self, seed: bytes = b"a2a-secure-tests") -> None:
        self.seed = seed
        self.counter = 0

    def __call__(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            self.counter += 1
            out += hashlib.sha256(self.seed + self.counter.to_bytes(8, "big")).digest()
        return out[:n]


def identity(name: str) -> Identity:
    """A fixed identity per name (seeded from the name, so runs are reproducible)."""
    return Identity.from_seed(hashlib.sha256(b"seed:" + name.encode()).digest(), name)


class Handlers:
    """A dispatcher whose handlers count their executions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []  # (goal, session_id, sequence)
        self.dispatcher = IntentDispatcher()
        self.dispatcher.add("echo", self._echo)
        self.dispatcher.add("translate", self._echo)
        self.dispatcher.add("boom", self._boom)
        self.dispatcher.add("reject", self._reject)
        self.dispatcher.add("hang", self._hang)

    def count(self, goal: str | None = None) -> int:
        return sum(1 for g, _, _ in self.calls if goal is None or g == goal)

    async def _echo(self, inputs: Any, ctx: IntentContext) -> Any:
        self.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        return {"echo": inputs, "caller": ctx.caller_did, "sequence": ctx.sequence}

    async def _boom(self, inputs: Any, ctx: IntentContext) -> Any:
        self.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        raise RuntimeError("SECRET-db-password=hunter2 in /srv/app/handler.py line 42")

    async def _reject(self, inputs: Any, ctx: IntentContext) -> Any:
        self.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        raise InvalidParams("inputs.x must be a string")

    async def _hang(self, inputs: Any, ctx: IntentContext) -> Any:
        import asyncio

        self.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        await asyncio.Event().wait()  # never set: only the server's timeout ends it
        return None  # pragma: no cover


@dataclass
class World:
    """One server and the pieces around it, all in memory."""

    server_id: Identity
    client_id: Identity
    clock: FakeClock
    rand: FakeRandom
    store: MemoryStore
    handlers: Handlers
    server: ServerProtocol
    audit: list[dict[str, Any]] = field(default_factory=list)

    def handshake(self, client: Identity | None = None, *, server_did: str | None = None) -> ClientHandshake:
        return ClientHandshake(
            client or self.client_id,
            resolve_did_key(server_did or self.server_id.did),
            clock=self.clock,
            random_bytes=self.rand,
        )

    async def call(self, method: str, params: Any, *, source: str = "") -> Reply:
        return await self.server.handle(method, copy.deepcopy(params), source=source)

    async def open_session(
        self, client: Identity | None = None, *, source: str = ""
    ) -> tuple[ClientSession, ClientHandshake]:
        hs = self.handshake(client)
        r = await self.call("hello", hs.hello(), source=source)
        assert r.error is None, r.error
        r = await self.call("proof", hs.receive_challenge(r.result))
        assert r.error is None, r.error
        r = await self.call("accept_policy", hs.receive_policy(r.result))
        assert r.error is None, r.error
        return hs.receive_session(r.result), hs

    async def intent(self, sess: ClientSession, goal: str = "echo", **inputs: Any) -> Any:
        req = sess.prepare_intent({"goal": goal, "inputs": inputs})
        r = await self.call("intent", req.params)
        assert r.error is None, r.error
        return sess.verify_result(req, r.result)


def make_world(
    policy: Policy | None = None,
    *,
    limits: ServerLimits | None = None,
    client: str = "client",
    resolver: DIDResolver | None = None,
) -> World:
    clock = FakeClock()
    rand = FakeRandom()
    store = MemoryStore()
    handlers = Handlers()
    server_id = identity("server")
    audit: list[dict[str, Any]] = []
    server = ServerProtocol(
        server_id,
        policy or Policy(),
        store=store,
        resolver=resolver or DIDResolver(clock=clock),
        dispatcher=handlers.dispatcher,
        manifest_hash=encoding.hash_of({**SERVER_CARD, "did": server_id.did}),
        limits=limits,
        clock=clock,
        random_bytes=rand,
        audit=lambda **rec: audit.append(rec),
    )
    return World(server_id, identity(client), clock, rand, store, handlers, server, audit)


# -- forging ------------------------------------------------------------------------------------
def sign_raw(
    payload: Mapping[str, Any],
    signer: Identity,
    *,
    typ: str,
    kid: str | None = None,
    extra_header: Mapping[str, Any] | None = None,
) -> str:
    """A compact JWS over ``payload`` signed by ``signer`` with any ``typ``, ``kid`` and header."""
    hdr = {"alg": "EdDSA", "typ": typ, "kid": kid or signer.kid, **(extra_header or {})}
    header = encoding.b64u_encode(encoding.dumps(hdr))
    body = encoding.b64u_encode(encoding.dumps(dict(payload)))
    signing_input = f"{header}.{body}"
    return f"{signing_input}.{encoding.b64u_encode(signer.sign(signing_input.encode('ascii')))}"


def payload_of(token: str) -> dict[str, Any]:
    """The (unverified) payload of a token."""
    return jws_decode_unverified(token)[1]


def header_of(token: str) -> dict[str, Any]:
    return jws_decode_unverified(token)[0]


def resign(
    token: str,
    signer: Identity,
    *,
    typ: str | None = None,
    kid: str | None = None,
    extra_header: Mapping[str, Any] | None = None,
    **changes: Any,
) -> str:
    """Re-sign ``token``'s payload with ``changes`` applied (a value of DROP removes it)."""
    header = header_of(token)
    payload = payload_of(token)
    for name, value in changes.items():
        if value is DROP:
            payload.pop(name, None)
        else:
            payload[name] = value
    return sign_raw(
        payload, signer, typ=typ or header["typ"], kid=kid or header["kid"], extra_header=extra_header
    )


def flip_signature(token: str) -> str:
    """``token`` with one signature bit changed (still canonical base64url)."""
    head, body, sig = token.split(".")
    i = len(sig) // 2
    sig = sig[:i] + ("A" if sig[i] != "A" else "B") + sig[i + 1 :]
    return f"{head}.{body}.{sig}"


class _Drop:
    """The value that removes a member (a stable repr: test ids must be the same in every
    process, so that pytest-xdist's workers collect the same tests)."""

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()


def forge_request(
    sess: ClientSession,
    intent: Mapping[str, Any],
    *,
    sequence: int | None = None,
    timestamp: int | None = None,
    signer: Identity | None = None,
    typ: str = m.Typ.REQUEST,
    kid: str | None = None,
    payload_changes: Mapping[str, Any] | None = None,
    params_changes: Mapping[str, Any] | None = None,
) -> PreparedRequest:
    """A request the honest client would refuse to build (blocked goal, old sequence, ...).

    Does not move ``sess.last_sequence`` unless ``sequence`` is None (then the next one).
    """
    if sequence is None:
        sess.last_sequence += 1
        sequence = sess.last_sequence
    ts = int(sess._clock()) if timestamp is None else timestamp
    body = dict(intent)
    payload: dict[str, Any] = {
        "session_id": sess.session_id,
        "session_commitment": sess.session_commitment,
        "sequence": sequence,
        "timestamp": ts,
        "intent": body,
    }
    for name, value in (payload_changes or {}).items():
        if value is DROP:
            payload.pop(name, None)
        else:
            payload[name] = value
    token = sign_raw(payload, signer or sess.identity, typ=typ, kid=kid)
    params: dict[str, Any] = {
        "session_id": sess.session_id,
        "session_commitment": sess.session_commitment,
        "sequence": sequence,
        "intent": body,
        "request_jws": token,
    }
    for name, value in (params_changes or {}).items():
        if value is DROP:
            params.pop(name, None)
        else:
            params[name] = value
    return PreparedRequest("intent", params, sequence, m.request_hash(token), ts, body.get("goal"))


def with_token(req: PreparedRequest, token: str) -> PreparedRequest:
    """``req`` with another ``request_jws`` (and the matching request hash)."""
    params = dict(req.params)
    params["request_jws"] = token
    return dataclasses.replace(req, params=params, request_hash=m.request_hash(token))


class Flow:
    """One honest handshake driven step by step, keeping every message it sent or received.

    ``start`` sends HELLO and prepares PROOF; ``prove`` sends PROOF and prepares ACCEPT;
    ``accept`` sends ACCEPT and checks SESSION. A test sends its forgeries in between.
    """

    def __init__(self, w: World, client: Identity | None = None, *, source: str = "") -> None:
        self.w = w
        self.client = client or w.client_id
        self.hs = w.handshake(self.client)
        self.source = source
        self.hello: dict[str, Any] = {}
        self.challenge: dict[str, Any] = {}
        self.proof: dict[str, Any] = {}
        self.policy: dict[str, Any] = {}
        self.accept_msg: dict[str, Any] = {}
        self.session_msg: dict[str, Any] = {}
        self.session: ClientSession | None = None

    async def start(self) -> Flow:
        self.hello = self.hs.hello()
        r = await self.w.call("hello", self.hello, source=self.source)
        assert r.error is None, r.error
        self.challenge = r.result
        self.proof = self.hs.receive_challenge(copy.deepcopy(r.result))
        return self

    async def prove(self) -> Flow:
        r = await self.w.call("proof", self.proof)
        assert r.error is None, r.error
        self.policy = r.result
        self.accept_msg = self.hs.receive_policy(copy.deepcopy(r.result))
        return self

    async def accept(self) -> ClientSession:
        r = await self.w.call("accept_policy", self.accept_msg)
        assert r.error is None, r.error
        self.session_msg = r.result
        self.session = self.hs.receive_session(copy.deepcopy(r.result))
        return self.session

    async def complete(self) -> ClientSession:
        if not self.hello:
            await self.start()
        if not self.policy:
            await self.prove()
        return await self.accept()


# -- state snapshots ------------------------------------------------------------------------------
def snapshot(store: MemoryStore) -> dict[str, Any]:
    """Everything a MemoryStore holds, in a comparable form."""
    return {
        "counts": store.counts(),
        "pending": dict(store._pending),
        "by_source": dict(store._pending_by_source),
        "sessions": dict(store._sessions),
        "seq": {sid: (st.last, st.request_hash, st.reply) for sid, st in store._seq.items()},
        "rates": dict(store._rates),
    }


def error_code(reply: Reply) -> int | None:
    return None if reply.error is None else int(reply.error["code"])


def is_signed_error(reply: Reply) -> bool:
    data = (reply.error or {}).get("data")
    return isinstance(data, dict) and "response_jws" in data


async def expect_error(
    send: Callable[[], Awaitable[Reply]], code: int, status: int, store: MemoryStore | None = None
) -> Reply:
    """Send, check the exact code and HTTP status and, with ``store``, that nothing changed."""
    before = snapshot(store) if store is not None else None
    reply = await send()
    assert reply.error is not None, f"expected {code}, got result {reply.result!r}"
    assert reply.error["code"] == code, reply.error
    assert reply.http_status == status, (reply.http_status, reply.error)
    assert reply.result is None
    if store is not None:
        assert snapshot(store) == before, "a rejected request changed the store"
    return reply


__all__ = [
    "DROP",
    "T0",
    "FakeClock",
    "Flow",
    "FakeRandom",
    "Handlers",
    "World",
    "error_code",
    "expect_error",
    "flip_signature",
    "forge_request",
    "header_of",
    "identity",
    "is_signed_error",
    "make_world",
    "payload_of",
    "resign",
    "sign_raw",
    "snapshot",
    "with_token",
]
