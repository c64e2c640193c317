"""Shared pieces for the attack catalogue tests (tests/test_attacks.py, tests/test_fuzz.py).

* A tiny pure-Python Ed25519 (RFC 8032 reference arithmetic) used only to *build* hostile
  inputs that libsodium would never produce: signatures with S >= L, forgeries for
  small-order keys that a lax (cofactorless, non-canonical) verifier accepts, Ed25519ph and
  Ed25519ctx signatures. It is checked against the RFC 8032 vectors by the tests.
* ``DocServer``: a minimal HTTPS (or plain) server on 127.0.0.1 serving did:web documents,
  counting connections and hits, so a test can prove that nothing was ever fetched.
* ``Wire``: a real ``AgentServer`` under uvicorn (``serve_app``) with an injected clock, a
  ``MemoryStore`` and an ``Auditor`` with a ``MemoryAuditSink``, plus the tlsfuzzer-style
  conversation helpers: ``sanity()`` (an honest handshake and intents) and ``expect()``
  (send one crafted message, check the exact §7 status and code, that the store is exactly
  what it was, that no handler ran and that the audit log got exactly the rejection's own
  record).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import base58
import httpx
import nacl.signing
from protocol_helpers import snapshot

from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession, IntentResult, PreparedRequest
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app

JSON = {"Content-Type": "application/json"}
MARKER = "MARKER-7f3a9c-do-not-log"

# -- pure-Python Ed25519 (for building hostile inputs only) ----------------------------------------

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, P - 2, P) % P
_SQRT_M1 = pow(2, (P - 1) // 4, P)
Point = tuple[int, int, int, int]
IDENTITY: Point = (0, 1, 1, 0)


def _inv(x: int) -> int:
    return pow(x, P - 2, P)


def point_add(p1: Point, p2: Point) -> Point:
    x1, y1, z1, t1 = p1
    x2, y2, z2, t2 = p2
    a = (y1 - x1) * (y2 - x2) % P
    b = (y1 + x1) * (y2 + x2) % P
    c = 2 * t1 * t2 * _D % P
    d = 2 * z1 * z2 % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def point_mul(s: int, p: Point) -> Point:
    q = IDENTITY
    while s > 0:
        if s & 1:
            q = point_add(q, p)
        p = point_add(p, p)
        s >>= 1
    return q


def point_equal(p1: Point, p2: Point) -> bool:
    x1, y1, z1, _ = p1
    x2, y2, z2, _ = p2
    return (x1 * z2 - x2 * z1) % P == 0 and (y1 * z2 - y2 * z1) % P == 0


def decompress(data: bytes, *, lax: bool = False) -> Point | None:
    """Decode a point; ``lax`` accepts y >= p (non-canonical), as OpenSSL-style decoders do."""
    y = int.from_bytes(data, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    if y >= P:
        if not lax:
            return None
        y -= P
    x2 = (y * y - 1) * _inv(_D * y * y + 1) % P
    if x2 == 0:
        if sign and not lax:
            return None
        x = 0
    else:
        x = pow(x2, (P + 3) // 8, P)
        if (x * x - x2) % P:
            x = x * _SQRT_M1 % P
        if (x * x - x2) % P:
            return None
        if (x & 1) != sign:
            x = P - x
    return (x, y, 1, x * y % P)


def compress(p: Point) -> bytes:
    x, y, z, _ = p
    zi = _inv(z)
    x, y = x * zi % P, y * zi % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


BASE = decompress((4 * _inv(5) % P).to_bytes(32, "little"))
assert BASE is not None


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.sha512(data).digest(), "little")


def dom2(phflag: int, context: bytes) -> bytes:
    """RFC 8032 dom2: the prefix of Ed25519ph and Ed25519ctx."""
    return b"SigEd25519 no Ed25519 collisions" + bytes([phflag, len(context)]) + context


def ref_sign(seed: bytes, message: bytes, *, prefix: bytes = b"") -> bytes:
    """RFC 8032 signing (plain with ``prefix`` empty; ph/ctx with a dom2 prefix)."""
    digest = hashlib.sha512(seed).digest()
    a = int.from_bytes(digest[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    public = compress(point_mul(a, BASE))
    r = _h(prefix + digest[32:] + message) % L
    big_r = compress(point_mul(r, BASE))
    k = _h(prefix + big_r + public + message) % L
    return big_r + ((r + k * a) % L).to_bytes(32, "little")


def sign_ph(seed: bytes, message: bytes, context: bytes = b"") -> bytes:
    """Ed25519ph (RFC 8032 §5.1, phflag 1, message pre-hashed with SHA-512)."""
    return ref_sign(seed, hashlib.sha512(message).digest(), prefix=dom2(1, context))


def sign_ctx(seed: bytes, message: bytes, context: bytes) -> bytes:
    """Ed25519ctx (RFC 8032 §5.1, phflag 0)."""
    return ref_sign(seed, message, prefix=dom2(0, context))


def lax_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """A deliberately lax verifier: non-canonical A and R, small-order A, no S < L check.

    The cofactorless equation [S]B = R + [k]A, the behaviour of lax libraries (ATTACKS.md A3).
    """
    if len(public) != 32 or len(signature) != 64:
        return False
    big_a = decompress(public, lax=True)
    big_r = decompress(signature[:32], lax=True)
    if big_a is None or big_r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    k = _h(signature[:32] + public + message) % L
    return point_equal(point_mul(s, BASE), point_add(big_r, point_mul(k, big_a)))


# Every point of order dividing 8 (the torsion subgroup), canonically encoded, plus the
# non-canonical encodings of such points that RFC 8032 decoding must refuse.
SMALL_ORDER_KEYS: dict[str, bytes] = {
    "identity (order 1)": bytes.fromhex("01" + "00" * 31),
    "y=-1 (order 2)": bytes.fromhex("ec" + "ff" * 30 + "7f"),
    "all-zero y=0 (order 4)": bytes(32),
    "y=0 x-sign (order 4)": bytes(31) + b"\x80",
    "order 8 (a)": bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    "order 8 (b)": bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85"),
    "order 8 (c)": bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
    "order 8 (d)": bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa"),
}
NON_CANONICAL_KEYS: dict[str, bytes] = {
    "y=p+1 (identity)": bytes.fromhex("ee" + "ff" * 30 + "7f"),
    "y=p (zero)": bytes.fromhex("ed" + "ff" * 30 + "7f"),
    "y=1 with x-sign (identity)": bytes.fromhex("01" + "00" * 30 + "80"),
    "y=p-1+p? (y=2^255-1)": bytes.fromhex("ff" * 31 + "7f"),
}
TORSION: list[Point] = [p for p in (decompress(k) for k in SMALL_ORDER_KEYS.values()) if p is not None]


def small_order_forgery(public: bytes, message: bytes) -> bytes | None:
    """A signature (R small-order, S = 0) of ``message`` that ``lax_verify`` accepts, or None."""
    for big_r in TORSION:
        sig = compress(big_r) + bytes(32)
        if lax_verify(public, message, sig):
            return sig
    return None


def malleate(signature: bytes, add: int = L) -> bytes:
    """``signature`` with ``add`` added to S (S + L verifies under a lax verifier)."""
    s = int.from_bytes(signature[32:], "little") + add
    return signature[:32] + s.to_bytes(32, "little")


# -- base64url helpers --------------------------------------------------------------------------

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def non_canonical(segment: str) -> str:
    """The same bytes with non-zero trailing bits (len % 4 must be 2 or 3)."""
    assert len(segment) % 4 in (2, 3), segment
    idx = _ALPHABET.index(segment[-1])
    return segment[:-1] + _ALPHABET[idx ^ 1]


def craft(header: bytes, payload: bytes, signer: Identity | None, *, signature: bytes | None = None) -> str:
    """A compact JWS from raw header and payload bytes, signed by ``signer`` over the input."""
    signing_input = f"{encoding.b64u_encode(header)}.{encoding.b64u_encode(payload)}"
    if signature is None:
        assert signer is not None
        signature = signer.sign(signing_input.encode("ascii"))
    return f"{signing_input}.{encoding.b64u_encode(signature)}"


def raw_json(obj: Any) -> bytes:
    """Compact JSON bytes with no I-JSON checks (so tests can build what the SDK refuses)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def header_json(identity: Identity, typ: str, **overrides: Any) -> bytes:
    """``{"alg":"EdDSA","typ":typ,"kid":identity.kid}`` with ``overrides`` (DROP removes)."""
    header: dict[str, Any] = {"alg": "EdDSA", "typ": typ, "kid": identity.kid}
    for name, value in overrides.items():
        if value is DROP:
            header.pop(name, None)
        else:
            header[name] = value
    return raw_json(header)


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()


def signing_input_of(token: str) -> bytes:
    head, body, _ = token.split(".")
    return f"{head}.{body}".encode("ascii")


def with_signature(token: str, signature: bytes) -> str:
    head, body, _ = token.split(".")
    return f"{head}.{body}.{encoding.b64u_encode(signature)}"


def signature_of(token: str) -> bytes:
    return encoding.b64u_decode(token.split(".")[2])


# -- a controllable DID method and a did:web document server ------------------------------------


class ExampleMethod:
    """A ``did:example`` method plug-in whose documents the test edits; counts resolutions."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, bytes]] = {}
        self.calls: Counter[str] = Counter()

    def add(self, name: str, *fragments: str) -> tuple[str, dict[str, Identity]]:
        """A new did:example DID with one Identity per fragment (all under authentication)."""
        did = f"did:example:{name}"
        idents = {}
        for frag in fragments or ("k1",):
            ident = Identity(nacl.signing.SigningKey.generate(), name[:100], did=did, kid=f"{did}#{frag}")
            idents[frag] = ident
        self.keys[did] = {i.kid: i.public_key for i in idents.values()}
        return did, idents

    async def __call__(self, did: str) -> ResolvedDID:
        self.calls[did] += 1
        keys = self.keys.get(did)
        if keys is None:
            raise DIDResolutionError("unknown did:example")
        return ResolvedDID(did=did, keys=dict(keys))


Route = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def http_send(
    writer: asyncio.StreamWriter,
    body: bytes = b"",
    *,
    status: int = 200,
    headers: Mapping[str, str | None] | None = None,
) -> None:
    hdrs: dict[str, str | None] = {
        "Content-Type": "application/did+json",
        "Content-Length": str(len(body)),
        "Connection": "close",
    }
    hdrs.update(headers or {})
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None)
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


def doc_route(doc: Any, **kw: Any) -> Route:
    async def route(writer: asyncio.StreamWriter) -> None:
        await http_send(writer, encoding.dumps(doc), **kw)

    return route


@dataclass
class DocServer:
    """An HTTP/1.1 server on 127.0.0.1 answering GETs from ``routes`` (path → route)."""

    ssl_context: ssl.SSLContext | None
    routes: dict[str, Route] = field(default_factory=dict)
    hits: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def start(self) -> DocServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def did(self, name: str | None = None, host: str = "agent.test") -> str:
        base = f"did:web:{host}%3A{self.port}"
        return base if name is None else f"{base}:{name}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.decode("latin-1").split("\r\n")[0].split(" ")[1]
            self.hits[target] += 1
            route = self.routes.get(target)
            if route is None:
                await http_send(writer, b"not found", status=404, headers={"Content-Type": "text/plain"})
            else:
                await route(writer)
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass
        except asyncio.CancelledError:  # closing the server: end quietly
            pass
        finally:
            writer.transport.abort()
            self._tasks.discard(task)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


def did_web_identity(did: str, fragment: str = "key-1") -> Identity:
    """A fresh key presented under ``did`` (whose document the test serves)."""
    return Identity(nacl.signing.SigningKey.generate(), "webagent", did=did, kid=f"{did}#{fragment}")


def multikey_doc(did: str, *idents: Identity, auth: bool = True) -> dict[str, Any]:
    """A DID document listing each identity's key (by its kid) under authentication."""
    methods = [
        {"id": i.kid, "type": "Multikey", "controller": did, "publicKeyMultibase": _multibase(i.public_key)}
        for i in idents
    ]
    doc: dict[str, Any] = {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "verificationMethod": methods,
    }
    if auth:
        doc["authentication"] = [i.kid for i in idents]
    return doc


def _multibase(public_key: bytes) -> str:
    return "z" + base58.b58encode(b"\xed\x01" + public_key).decode()


# -- the wire harness ---------------------------------------------------------------------------


def envelope(method: str, params: Any, rid: Any = 1) -> bytes:
    return encoding.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": rid})


ENDPOINT = {"hello": "/a2a/handshake", "proof": "/a2a/handshake", "accept_policy": "/a2a/handshake"}


def path_for(method: str) -> str:
    return ENDPOINT.get(method, "/a2a/intent")


@dataclass
class Wire:
    """A real server on loopback and what a test needs to attack it."""

    server: AgentServer
    url: str
    http: httpx.AsyncClient
    clock: FakeClock
    sink: MemoryAuditSink
    calls: Counter[str]
    example: ExampleMethod
    docs: DocServer | None = None
    _ids: int = 0

    @property
    def store(self) -> MemoryStore:
        assert isinstance(self.server.store, MemoryStore)
        return self.server.store

    @property
    def did(self) -> str:
        return self.server.identity.did

    def state(self) -> dict[str, Any]:
        return snapshot(self.store)

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def post(
        self, path: str, body: bytes, *, headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        return await self.http.post(
            self.url + path, content=body, headers=dict(JSON if headers is None else headers)
        )

    async def rpc(
        self, method: str, params: Any, *, rid: Any = None, path: str | None = None
    ) -> httpx.Response:
        rid = self.next_id() if rid is None else rid
        return await self.post(path or path_for(method), envelope(method, params, rid))

    async def send(self, req: PreparedRequest, params: Any = None) -> httpx.Response:
        return await self.rpc(req.method, req.params if params is None else params)

    def handshake(self, client: Identity, *, resolved: ResolvedDID | None = None) -> ClientHandshake:
        return ClientHandshake(client, resolved or resolve_did_key(self.did), clock=self.clock)

    async def open_session(self, client: Identity | None = None) -> ClientSession:
        flow = WireFlow(self, client)
        return await flow.complete()

    async def intent(self, sess: ClientSession, goal: str = "echo", **inputs: Any) -> IntentResult:
        req = sess.prepare_intent({"goal": goal, "inputs": inputs})
        resp = await self.send(req)
        assert resp.status_code == 200, resp.text
        return sess.verify_result(req, resp.json()["result"])

    async def sanity(self) -> None:
        """An honest conversation: a fresh client completes a handshake and two intents."""
        client = Identity.generate("sanity")
        sess = await self.open_session(client)
        before = self.calls["echo"]
        for i in (1, 2):
            res = await self.intent(sess, text=f"sanity {i}")
            assert res.result == {"echo": {"text": f"sanity {i}"}}
            assert res.sequence == i
        assert self.calls["echo"] == before + 2

    async def expect(
        self,
        send: Awaitable[httpx.Response],
        status: int,
        code: int,
        *,
        event: str | None = None,
        signed: bool | None = None,
        state: bool = True,
        records: int = 1,
    ) -> dict[str, Any]:
        """Send one crafted message; check the §7 answer and that nothing else happened.

        ``state``: the store must be exactly as before (no pending handshake added, proven
        or consumed, no session, no sequence, no rate counter). ``records``: how many audit
        records the request may write (its own rejection record). Returns the error object.
        """
        before = self.state() if state else None
        n_audit = len(self.sink.events)
        calls = Counter(self.calls)
        resp = await send
        assert resp.status_code == status, (resp.status_code, resp.text[:500])
        body = resp.json()
        assert set(body) == {"jsonrpc", "id", "error"}, body
        error = body["error"]
        assert error["code"] == code, error
        message = error["message"]
        assert isinstance(message, str) and len(message) <= 300
        assert "Traceback" not in message and 'File "' not in message
        if status == 503:
            assert resp.headers.get("retry-after", "").isdigit()
        if signed is not None:
            has_sig = isinstance(error.get("data"), dict) and "response_jws" in error["data"]
            assert has_sig is signed, error
        if before is not None:
            assert self.state() == before, "a rejected message changed the server's state"
        assert self.calls == calls, "a rejected message ran a handler"
        new = self.sink.events[n_audit:]
        assert len(new) == records, [e.to_dict() for e in new]
        if records:
            rec = new[-1]
            assert rec.status == "error" and rec.error_code == code, rec
            if event is not None:
                assert rec.event == event, rec
        return dict(error)


class WireFlow:
    """One honest handshake over the wire, step by step, keeping every message."""

    def __init__(
        self, w: Wire, client: Identity | None = None, *, resolved: ResolvedDID | None = None
    ) -> None:
        self.w = w
        self.client = client or Identity.generate("client")
        self.hs = w.handshake(self.client, resolved=resolved)
        self.hello: dict[str, Any] = {}
        self.challenge: dict[str, Any] = {}
        self.proof: dict[str, Any] = {}
        self.policy: dict[str, Any] = {}
        self.accept_msg: dict[str, Any] = {}
        self.session_msg: dict[str, Any] = {}
        self.session: ClientSession | None = None

    async def _ok(self, method: str, params: Any) -> Any:
        resp = await self.w.rpc(method, params)
        assert resp.status_code == 200, resp.text
        return resp.json()["result"]

    async def start(self) -> WireFlow:
        self.hello = self.hs.hello()
        self.challenge = await self._ok("hello", self.hello)
        self.proof = self.hs.receive_challenge(copy.deepcopy(self.challenge))
        return self

    async def prove(self) -> WireFlow:
        self.policy = await self._ok("proof", self.proof)
        self.accept_msg = self.hs.receive_policy(copy.deepcopy(self.policy))
        return self

    async def accept(self) -> ClientSession:
        self.session_msg = await self._ok("accept_policy", self.accept_msg)
        self.session = self.hs.receive_session(copy.deepcopy(self.session_msg))
        return self.session

    async def complete(self) -> ClientSession:
        if not self.hello:
            await self.start()
        if not self.policy:
            await self.prove()
        return await self.accept()


POLICY = Policy.build(blocked=["blocked"], rate_limit=100_000, session_timeout=900)


def build_agent(
    *,
    clock: FakeClock,
    sink: MemoryAuditSink,
    calls: Counter[str],
    resolver: DIDResolver,
    policy: Policy = POLICY,
    limits: ServerLimits | None = None,
    identity: Identity | None = None,
) -> AgentServer:
    """The attack target: counting handlers, an Auditor with a memory sink, a MemoryStore."""
    server = AgentServer(
        identity or Identity.generate("target"),
        policy,
        name="attack-target",
        url="http://127.0.0.1",
        store=MemoryStore(),
        resolver=resolver,
        audit=Auditor([sink], role="server"),
        limits=limits,
        clock=clock,
        monotonic=clock.monotonic,
    )

    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["echo"] += 1
        return {"echo": inputs}

    @server.intent("slow")
    async def slow(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["slow"] += 1
        await asyncio.sleep(0.05)
        return {"slow": inputs}

    @server.intent("blocked")
    async def blocked(inputs: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - policy forbids
        calls["blocked"] += 1
        return {}

    @server.intent("reject")
    async def reject(inputs: dict[str, Any], ctx: IntentContext) -> Any:
        calls["reject"] += 1
        raise InvalidParams("inputs rejected")

    return server


@contextlib.asynccontextmanager
async def start_wire(
    *,
    resolver: DIDResolver | None = None,
    limits: ServerLimits | None = None,
    policy: Policy = POLICY,
    docs: DocServer | None = None,
    clock: FakeClock | None = None,
) -> AsyncIterator[Wire]:
    """A server on 127.0.0.1 with its own clock, sink and handler counts."""
    clock = clock or FakeClock(float(int(time.time())))
    sink = MemoryAuditSink()
    calls: Counter[str] = Counter()
    example = ExampleMethod()
    resolver = resolver or DIDResolver()
    resolver.register("example", example)
    server = build_agent(clock=clock, sink=sink, calls=calls, resolver=resolver, policy=policy, limits=limits)
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=15) as http:
        yield Wire(server, url, http, clock, sink, calls, example, docs)
