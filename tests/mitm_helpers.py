"""An active man-in-the-middle between real ``A2AClient``s and a real ``AgentServer``.

Everything runs on loopback in one event loop: the honest server (``AgentServer`` under
uvicorn, ``serve_app``), the attacker (an ASGI app, also under uvicorn, that forwards every
request to the server with httpx and every answer back) and two honest clients with their
own identities, whose endpoint is the attacker. Between the two hops the attacker applies
seeded random mutations (ATTACKS.md F, G and J3): it drops, duplicates, delays, reorders,
replays (recorded traffic of earlier sessions, of this or the other client), reflects and
edits messages and headers.

Nothing is mocked. Both ends are instrumented instead, to write down what they decided:

* the server's store (a ``MemoryStore`` subclass) records every PROOF it accepted, every
  session it opened with the pending handshake's nonces and policy hash, and every close;
* the server's handlers record every execution (session id, sequence, caller DID, inputs,
  output);
* the client's handshake (a ``ClientHandshake`` subclass put in place of the one
  ``a2a_secure.client.handshake`` uses, calling the real methods) records every PROOF and
  ACCEPT it signed and every session it accepted; each accepted session records every
  request and close it signed;
* the harness records every value ``A2AClient.request``/``stream`` returned.

After every run the invariants are checked over everything recorded since the campaign
began (a request recorded in one run may be replayed into a later one):

(a) the client and the server never both accept with different views of (client DID,
    server DID, nonce_a, nonce_b, policy hash, session id, commitment, policy); the server
    proves and opens only handshakes the client signed;
(b) no intent runs that the client did not sign for that session and sequence, and no
    session is closed that the client did not sign a close for;
(c) no intent runs twice for one session and sequence;
(d) every value the client returns equals the handler's output for that exact request, and
    only for requests the server ran (for streams: the items are that run's items, in order);
(e) with the intent_id extension: each intent_id ran at most once, and a value returned for a
    request with an intent_id is that one run's output (the one run under another session
    when the client re-sent it after a -32043), never another run's.

Two mutations target exactly-once: ``forge_unknown_session`` lets the request run and
answers with an unsigned -32043 (the client re-handshakes and sends the intent again), and
``drop_then_forge_unknown_session`` drops the reply and answers the client's byte-identical
retry with an unsigned -32043. ``server_restart`` swaps the server for a fresh one on the
same store while a request is in flight (the old one's run is cancelled, as when a worker
dies); it is used with a shared store (``store="redis"``).

``Campaign(in_process=True)`` runs both hops through ``httpx.ASGITransport`` (no sockets)
and keeps each client's session for ``runs_per_handshake`` runs: fast enough for 10 000 runs.

Besides, no exception other than ``A2AError`` may leave the client, no call may hang, and
after each run a clean request by each client must succeed (no state was poisoned).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import random
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

import a2a_secure.client.handshake as client_handshake
from a2a_secure.client import extensions as client_extensions
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.protocol.validate import json_equal
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import OpenResult, SessionRecord
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app

# -- what the attacker does ------------------------------------------------------------------

# (name, weight): "pass" forwards untouched so that honest progress keeps happening.
MUTATIONS: tuple[tuple[str, int], ...] = (
    ("pass", 26),
    ("drop_request", 3),
    ("drop_response", 4),
    ("close_connection", 3),
    ("duplicate_sequential", 3),
    ("duplicate_concurrent", 3),
    ("delay_request", 2),
    ("delay_response", 2),
    ("reorder_hold", 3),
    ("reorder_late", 3),
    ("replay_inject", 4),
    ("replay_substitute", 3),
    ("replay_answer", 4),
    ("reflect", 3),
    ("edit_request", 8),
    ("edit_response", 8),
    ("header_content_type", 2),
    ("header_retry_after", 4),
    ("status_flip", 3),
    ("truncate_response", 2),
    ("forge_error", 4),
    ("forge_unknown_session", 4),
    ("drop_then_forge_unknown_session", 3),
)
# Only with a store that survives a restart (RedisStore): see Campaign(store=...).
RESTART_MUTATIONS: tuple[tuple[str, int], ...] = (("server_restart", 2),)
# A campaign aimed at exactly-once: enough honest traffic that a re-handshake and the
# resend get through, and the -32043 forgeries, losses and duplicates that make resends.
EXACTLY_ONCE_MUTATIONS: tuple[tuple[str, int], ...] = (
    ("pass", 60),
    ("forge_unknown_session", 12),
    ("drop_then_forge_unknown_session", 10),
    ("drop_response", 4),
    ("close_connection", 3),
    ("duplicate_sequential", 3),
    ("duplicate_concurrent", 3),
    ("replay_inject", 3),
    ("replay_answer", 2),
    ("reorder_late", 2),
    ("edit_request", 2),
    ("edit_response", 2),
    ("forge_error", 2),
    ("header_retry_after", 2),
)
# Sealed intents (PROTOCOL.md §12.6): added to the table when the campaign is sealed.
SEALED_MUTATIONS: tuple[tuple[str, int], ...] = (
    ("seal_edit_request", 6),
    ("seal_edit_response", 6),
    ("seal_key_edit", 3),
    ("card_strip", 2),
)
MUTATION_NAMES = tuple(name for name, _ in MUTATIONS if name != "pass")

DID_NAMES = frozenset(("agent_did", "server_did", "client_did", "did", "kid"))
NONCE_NAMES = frozenset(("nonce", "nonce_a", "nonce_b"))
TIME_NAMES = frozenset(("timestamp", "created_at", "expires_at"))
FORGED_ERRORS = (
    (-32040, 401),
    (-32041, 401),
    (-32042, 403),
    (-32043, 401),
    (-32044, 409),
    (-32045, 401),
    (-32047, 401),
    (-32048, 503),
    (-32049, 504),
    (-32603, 500),
    (-32602, 400),
    (-32601, 404),
)
RETRY_AFTER_VALUES = (b"0", b"1", b"2", b"3600", b"99999999", b"-1", b"abc", b"1.5", b"", b" 1", b"\xb2")


def fast_transport(**kw: Any) -> httpx.AsyncHTTPTransport:
    """An httpx transport with TCP_NODELAY (as ``A2AClient`` uses), so loopback stays fast."""
    return httpx.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], **kw)


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64u_dec(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _is_jws(value: Any) -> bool:
    if not isinstance(value, str) or value.count(".") != 2 or len(value) < 40:
        return False
    return all(part and all(c.isalnum() or c in "-_" for c in part) for part in value.split("."))


@dataclass
class Wire:
    """One HTTP exchange as the attacker sees it."""

    path: str
    headers: dict[str, bytes]
    body: bytes
    client: str = ""
    verb: str = "POST"

    @property
    def rpc(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def method(self) -> str:
        obj = self.rpc
        return str(obj.get("method")) if isinstance(obj, dict) else "?"


@dataclass
class Answer:
    """An HTTP answer (or ``close``: cut the connection inside the body)."""

    status: int
    headers: dict[str, bytes]
    body: bytes
    close: bool = False

    @property
    def is_sse(self) -> bool:
        return self.headers.get("content-type", b"").startswith(b"text/event-stream")


CLOSE = Answer(200, {}, b"", close=True)


def _json_answer(obj: Any, status: int = 200, **headers: bytes) -> Answer:
    return Answer(status, {"content-type": b"application/json", **headers}, json.dumps(obj).encode())


def _with_id(body: bytes, rid: Any) -> bytes:
    """``body`` with its JSON-RPC id (also inside SSE events) replaced by ``rid``."""
    try:
        obj = json.loads(body)
    except ValueError:
        out = []
        for line in body.split(b"\n"):
            new = line
            if line.startswith(b"data: "):
                with contextlib.suppress(ValueError, TypeError):
                    ev = json.loads(line[6:])
                    ev["id"] = rid
                    new = b"data: " + json.dumps(ev, separators=(",", ":")).encode()
            out.append(new)
        return b"\n".join(out)
    if isinstance(obj, dict):
        obj["id"] = rid
    return json.dumps(obj).encode()


class Mitm:
    """The attacker: an ASGI app that forwards to ``upstream`` and mutates on the way."""

    def __init__(
        self,
        upstream: str,
        *,
        pool_cap: int = 400,
        transport: httpx.AsyncBaseTransport | None = None,
        time_scale: float = 1.0,
        mutations: tuple[tuple[str, int], ...] = MUTATIONS,
    ) -> None:
        self.upstream = upstream
        self.http = httpx.AsyncClient(
            transport=transport or fast_transport(limits=httpx.Limits(max_connections=64)), timeout=20
        )
        self.time_scale = time_scale  # delays and holds are multiplied by it (in-process runs)
        self.mutation_table = mutations
        # Requests (by body) whose next copy is answered with a forged -32043.
        self.forge_next: set[bytes] = set()
        self.restart: Callable[[], Awaitable[None]] | None = None
        self.rng = random.Random(0)
        self.active = False
        self.mutations: Counter[str] = Counter()
        self.details: Counter[str] = Counter()
        self.requests: list[Wire] = []  # recorded requests, for replays
        self.answers: dict[str, list[Answer]] = {}  # recorded answers by RPC method
        self.values: dict[str, list[Any]] = {}  # recorded JSON values by member name
        self.late: list[Wire] = []  # requests held back to deliver after later ones
        self.exchanges = 0
        self._pool_cap = pool_cap
        self._forwarded = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def aclose(self) -> None:
        await self.flush()
        await self.http.aclose()

    # -- recording -----------------------------------------------------------------------------
    def _keep(self, pool: list[Any], item: Any) -> None:
        if len(pool) < self._pool_cap:
            pool.append(item)
        else:
            pool[self.rng.randrange(len(pool))] = item

    def _harvest(self, obj: Any, name: str = "") -> None:
        if isinstance(obj, dict):
            for token_name in ("accept_jws", "session_jws"):  # the signed seal_keys, for swaps
                if _is_jws(obj.get(token_name)):
                    with contextlib.suppress(ValueError, AttributeError):
                        key = json.loads(_b64u_dec(obj[token_name].split(".")[1])).get("seal_key")
                        if isinstance(key, str):
                            self._keep(self.values.setdefault("seal_key", []), key)
            for k, v in obj.items():
                if not isinstance(v, dict | list):
                    self._keep(self.values.setdefault(k, []), v)
                elif k in ("policy", "public_keys", "intent", "result", "error"):
                    self._keep(self.values.setdefault(k, []), json.loads(json.dumps(v)))
                self._harvest(v, k)
        elif isinstance(obj, list):
            for v in obj:
                self._harvest(v, name)

    def _record(self, wire: Wire, answer: Answer) -> None:
        self._keep(self.requests, wire)
        self._keep(self.answers.setdefault(wire.method, []), answer)
        self._harvest(wire.rpc)
        if answer.is_sse:
            for line in answer.body.split(b"\n"):
                if line.startswith(b"data: "):
                    with contextlib.suppress(ValueError):
                        self._harvest(json.loads(line[6:]))
        else:
            with contextlib.suppress(ValueError):
                self._harvest(json.loads(answer.body))

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        wire = Wire(
            scope["path"],
            headers,
            b"".join(chunks),
            headers.get("x-mitm-client", b"").decode(),
            scope.get("method", "POST"),
        )
        answer = await self.exchange(wire)
        if answer.close:
            # Declare more than is sent: uvicorn cuts the connection inside the body.
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"64")]}
            )
            await send({"type": "http.response.body", "body": b"{", "more_body": False})
            return
        hdrs = [(k.encode("latin-1"), v) for k, v in answer.headers.items() if k != "content-length"]
        hdrs.append((b"content-length", str(len(answer.body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": hdrs})
        await send({"type": "http.response.body", "body": answer.body})

    async def forward(self, wire: Wire, *, record: bool = True) -> Answer:
        """Deliver ``wire`` to the honest server; its answer (502 if unreachable)."""
        headers = {"content-type": wire.headers.get("content-type", b"").decode("latin-1")}
        if not headers["content-type"]:
            del headers["content-type"]
        try:
            if wire.verb == "GET":
                resp = await self.http.get(self.upstream + wire.path)
            else:
                resp = await self.http.post(self.upstream + wire.path, content=wire.body, headers=headers)
        except httpx.HTTPError:
            return Answer(502, {"content-type": b"text/plain"}, b"bad gateway")
        keep = {
            k.decode().lower(): v
            for k, v in resp.headers.raw
            if k.decode().lower() in ("content-type", "retry-after")
        }
        answer = Answer(resp.status_code, keep, resp.content)
        if record:
            self._record(wire, answer)
        return answer

    async def exchange(self, wire: Wire) -> Answer:
        self.exchanges += 1
        if wire.body in self.forge_next:
            # The byte-identical retry of a request whose reply was dropped.
            self.forge_next.discard(wire.body)
            self.details["forged_retry:-32043"] += 1
            self._signal()
            return self._forged_unknown_session(wire)
        if not self.active:
            answer = await self.forward(wire)
            self._signal()
            return answer
        table = self.mutation_table
        name = self.rng.choices([n for n, _ in table], [w for _, w in table])[0]
        self.mutations[name] += 1
        try:
            answer = await getattr(self, "_m_" + name)(wire)
        finally:
            self._signal()
        # Deliver a held-back request after this one, now and then.
        if self.late and self.rng.random() < 0.5:
            late = self.late.pop(self.rng.randrange(len(self.late)))
            await self.forward(late)
            self.details["late_delivered"] += 1
        return answer

    def _signal(self) -> None:
        self._forwarded.set()
        self._forwarded = asyncio.Event()

    async def flush(self) -> None:
        """Deliver every request still held back (end of a run)."""
        while self.late:
            await self.forward(self.late.pop(0))
            self.details["late_delivered"] += 1

    # -- mutations ----------------------------------------------------------------------------------
    def _gateway_error(self, wire: Wire) -> Answer:
        kind = self.rng.choice(("text", "json", "empty", "close"))
        self.details[f"gateway:{kind}"] += 1
        if kind == "close":
            return CLOSE
        if kind == "json":
            rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
            error = {"code": -32603, "message": "bad gateway"}
            return _json_answer({"jsonrpc": "2.0", "id": rid, "error": error}, 502)
        return Answer(502, {"content-type": b"text/plain"}, b"" if kind == "empty" else b"Bad Gateway")

    async def _m_pass(self, wire: Wire) -> Answer:
        return await self.forward(wire)

    async def _m_drop_request(self, wire: Wire) -> Answer:
        return self._gateway_error(wire)

    async def _m_drop_response(self, wire: Wire) -> Answer:
        await self.forward(wire)
        return self._gateway_error(wire)

    async def _m_close_connection(self, wire: Wire) -> Answer:
        if self.rng.random() < 0.5:
            await self.forward(wire)
        return CLOSE

    async def _m_duplicate_sequential(self, wire: Wire) -> Answer:
        first = await self.forward(wire)
        second = await self.forward(wire)
        return self.rng.choice((first, second))

    async def _m_duplicate_concurrent(self, wire: Wire) -> Answer:
        first, second = await asyncio.gather(self.forward(wire), self.forward(wire))
        return self.rng.choice((first, second))

    async def _m_delay_request(self, wire: Wire) -> Answer:
        await asyncio.sleep(self.rng.uniform(0, 0.2) * self.time_scale)
        return await self.forward(wire)

    async def _m_delay_response(self, wire: Wire) -> Answer:
        answer = await self.forward(wire)
        await asyncio.sleep(self.rng.uniform(0, 0.2) * self.time_scale)
        return answer

    async def _m_reorder_hold(self, wire: Wire) -> Answer:
        # Hold the request until the next one (of either client) has been delivered.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._forwarded.wait(), 0.15 * self.time_scale)
        return await self.forward(wire)

    async def _m_reorder_late(self, wire: Wire) -> Answer:
        # Not delivered now; delivered after some later request (or at the end of the run).
        self.late.append(wire)
        return self._gateway_error(wire)

    def _recorded(self, wire: Wire) -> Wire | None:
        same = [w for w in self.requests if w.path == wire.path and w.body != wire.body]
        pool = same if same and self.rng.random() < 0.8 else self.requests
        if not pool:
            return None
        pick = self.rng.choice(pool)
        self.details["replay:" + ("same-client" if pick.client == wire.client else "other-client")] += 1
        self.details["replay:" + pick.method] += 1
        return pick

    async def _m_replay_inject(self, wire: Wire) -> Answer:
        old = self._recorded(wire)
        if old is not None:
            await self.forward(old)
        return await self.forward(wire)

    async def _m_replay_substitute(self, wire: Wire) -> Answer:
        # The client's request is swallowed; a recorded one goes instead and its answer,
        # re-labelled with the client's JSON-RPC id, comes back.
        old = self._recorded(wire)
        if old is None:
            return self._gateway_error(wire)
        answer = await self.forward(old)
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        return Answer(answer.status, answer.headers, _with_id(answer.body, rid))

    async def _m_replay_answer(self, wire: Wire) -> Answer:
        if self.rng.random() < 0.5:
            await self.forward(wire)
        same = self.answers.get(wire.method) or []
        pool = same if same and self.rng.random() < 0.8 else [a for v in self.answers.values() for a in v]
        if not pool:
            return self._gateway_error(wire)
        old = self.rng.choice(pool)
        self.details["replay_answer:" + ("same-method" if pool is same else "any")] += 1
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        return Answer(old.status, old.headers, _with_id(old.body, rid))

    async def _m_reflect(self, wire: Wire) -> Answer:
        if self.rng.random() < 0.5:
            await self.forward(wire)
        obj = wire.rpc
        if not isinstance(obj, dict):
            return Answer(200, {"content-type": b"application/json"}, wire.body)
        kind = self.rng.choice(("params-as-result", "body", "params-as-error", "params-as-event"))
        self.details["reflect:" + kind] += 1
        if kind == "body":
            return Answer(200, {"content-type": b"application/json"}, wire.body)
        if kind == "params-as-error":
            error = {"code": -32040, "message": "reflected", "data": {"response_jws": _first_jws(obj)}}
            return _json_answer({"jsonrpc": "2.0", "id": obj.get("id"), "error": error}, 401)
        if kind == "params-as-event":
            data = json.dumps({"jsonrpc": "2.0", "id": obj.get("id"), "result": obj.get("params")})
            return Answer(200, {"content-type": b"text/event-stream"}, f"id: 0\ndata: {data}\n\n".encode())
        return _json_answer({"jsonrpc": "2.0", "id": obj.get("id"), "result": obj.get("params")})

    async def _m_edit_request(self, wire: Wire) -> Answer:
        obj = wire.rpc
        if not isinstance(obj, dict):
            return await self.forward(wire)
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            self.edit_json(obj, "req")
        edited = Wire(wire.path, wire.headers, json.dumps(obj).encode(), wire.client)
        answer = await self.forward(edited)
        if self.rng.random() < 0.35:
            # The edited copy went first; now the original, whose answer the client gets.
            self.details["edit_request:then-original"] += 1
            answer = await self.forward(wire)
        return answer

    async def _m_edit_response(self, wire: Wire) -> Answer:
        answer = await self.forward(wire)
        if answer.is_sse:
            return Answer(answer.status, answer.headers, self.edit_sse(answer.body))
        try:
            obj = json.loads(answer.body)
        except ValueError:
            return answer
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            self.edit_json(obj, "resp")
        return Answer(answer.status, answer.headers, json.dumps(obj).encode())

    async def _m_header_content_type(self, wire: Wire) -> Answer:
        values = (
            b"text/plain",
            b"application/json; charset=latin-1",
            b"",
            b"application/jsonx",
            b"text/json",
        )
        if self.rng.random() < 0.5:
            value = self.rng.choice(values)
            self.details["content_type:request"] += 1
            headers = dict(wire.headers)
            if value:
                headers["content-type"] = value
            else:
                headers.pop("content-type", None)
            return await self.forward(Wire(wire.path, headers, wire.body, wire.client))
        answer = await self.forward(wire)
        self.details["content_type:response"] += 1
        ctype = self.rng.choice((b"text/html", b"text/event-stream", b"application/json", b""))
        return Answer(answer.status, {**answer.headers, "content-type": ctype}, answer.body)

    async def _m_header_retry_after(self, wire: Wire) -> Answer:
        value = self.rng.choice(RETRY_AFTER_VALUES)
        self.details["retry_after:" + value.decode("latin-1")] += 1
        if self.rng.random() < 0.3:
            answer = await self.forward(wire)
            return Answer(answer.status, {**answer.headers, "retry-after": value}, answer.body)
        # A forged "busy" answer, so that the client considers waiting.
        if self.rng.random() < 0.5:
            await self.forward(wire)
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        status = self.rng.choice((500, 502, 503, 504))
        error = {"code": -32048, "message": "busy", "data": {"retry_after": 1}}
        return _json_answer({"jsonrpc": "2.0", "id": rid, "error": error}, status, **{"retry-after": value})

    async def _m_forge_error(self, wire: Wire) -> Answer:
        # An unsigned error in place of the real answer (which the server may have produced).
        if self.rng.random() < 0.6:
            await self.forward(wire)
        code, status = self.rng.choice(FORGED_ERRORS)
        self.details[f"forged:{code}"] += 1
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        return _json_answer(
            {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": "forged"}}, status
        )

    def _forged_unknown_session(self, wire: Wire) -> Answer:
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        error = {"code": -32043, "message": "unknown, expired or closed session"}
        return _json_answer({"jsonrpc": "2.0", "id": rid, "error": error}, 401)

    async def _m_forge_unknown_session(self, wire: Wire) -> Answer:
        # The request runs; the client is told the session is unknown (unsigned, as -32043
        # always is before authentication) and re-sends the intent on a new session.
        if wire.method != "intent":
            return await self.forward(wire)
        await self.forward(wire)
        self.details[f"forge_unknown_session:{wire.method}"] += 1
        return self._forged_unknown_session(wire)

    async def _m_drop_then_forge_unknown_session(self, wire: Wire) -> Answer:
        # The request runs, its reply is lost; the client's byte-identical retry is then
        # answered -32043 without reaching the server.
        if wire.method != "intent":
            return await self.forward(wire)
        await self.forward(wire)
        self.forge_next.add(wire.body)
        self.details[f"drop_then_forge:{wire.method}"] += 1
        if self.rng.random() < 0.5:  # a loss the client retries: a cut connection or a 502
            return CLOSE
        rid = wire.rpc.get("id") if isinstance(wire.rpc, dict) else None
        error = {"code": -32603, "message": "bad gateway"}
        return _json_answer({"jsonrpc": "2.0", "id": rid, "error": error}, 502)

    # -- sealed intents (PROTOCOL.md §12.6) -------------------------------------------------------
    def _sealed_edit(self, value: str, pool_name: str) -> tuple[str, Any]:
        """Another sealed value: a flipped bit, one recorded elsewhere, a plaintext, nothing.

        The recorded ones come from other sequences, sessions and clients, and from the other
        direction (sealed inputs as a result, a result as inputs: reflections).
        """
        rng = self.rng
        names = (pool_name, "sealed", "result")
        pool = [v for n in names for v in self.values.get(n, ()) if isinstance(v, str) and v != value]
        kind = rng.choice(("flip", "swap", "swap", "truncate", "plain", "delete"))
        if kind == "swap" and not pool:
            kind = "flip"
        if kind == "flip":
            raw = bytearray(_b64u_dec(value))
            if raw:
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            return kind, _b64u(bytes(raw))
        if kind == "swap":
            return kind, rng.choice(pool)
        if kind == "truncate":
            return kind, value[: rng.randrange(len(value))] if value else "A"
        if kind == "plain":
            return kind, {"tag": "forged", "text": "plaintext"}
        return kind, None

    async def _m_seal_edit_request(self, wire: Wire) -> Answer:
        # The sealed inputs of an intent moved, altered, stripped or replaced by plaintext.
        rpc = wire.rpc
        intent = rpc.get("params", {}).get("intent") if isinstance(rpc, dict) else None
        if not isinstance(intent, dict) or not isinstance(intent.get("sealed"), str):
            return await self.forward(wire)
        kind, new = self._sealed_edit(intent["sealed"], "sealed")
        if kind == "plain":
            intent["inputs"], intent["sealed"] = new, None
            del intent["sealed"]
        elif new is None:
            del intent["sealed"]
        else:
            intent["sealed"] = new
        self.details[f"seal_edit_request:{kind}"] += 1
        body = json.dumps(rpc).encode()
        return await self.forward(Wire(wire.path, wire.headers, body, wire.client, wire.verb))

    async def _m_seal_edit_response(self, wire: Wire) -> Answer:
        # A sealed result (or an event's, or an error's sealed data) moved or altered.
        answer = await self.forward(wire)
        if answer.is_sse:
            events = answer.body.split(b"\n\n")
            for i, event in enumerate(events):
                if event.startswith(b"id: ") and b'"result":"' in event and self.rng.random() < 0.5:
                    head, _, data = event.partition(b"\ndata: ")
                    with contextlib.suppress(ValueError, AttributeError):
                        obj = json.loads(data)
                        if not isinstance(obj["result"]["result"], str):
                            continue  # the closing null, or an error event: nothing sealed
                        kind, new = self._sealed_edit(obj["result"]["result"], "result")
                        obj["result"]["result"] = new
                        self.details[f"seal_edit_event:{kind}"] += 1
                        events[i] = head + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode()
            return Answer(answer.status, answer.headers, b"\n\n".join(events))
        try:
            obj = json.loads(answer.body)
        except ValueError:
            return answer
        target: Any = None
        if isinstance(obj.get("result"), dict) and isinstance(obj["result"].get("result"), str):
            target, key, pool = obj["result"], "result", "result"
        elif isinstance(obj.get("error"), dict) and isinstance(
            (obj["error"].get("data") or {}).get("sealed"), str
        ):
            target, key, pool = obj["error"]["data"], "sealed", "sealed"
        if target is None:
            return answer
        kind, new = self._sealed_edit(target[key], pool)
        target[key] = new
        self.details[f"seal_edit_response:{kind}"] += 1
        return Answer(answer.status, answer.headers, json.dumps(obj).encode())

    def _payload_with(self, token: str, member: str) -> str:
        # The token with its payload's ``member`` changed; the signature is left as it was.
        head, payload, sig = token.split(".")
        obj = json.loads(_b64u_dec(payload))
        kind = self.rng.choice(("fresh", "swap", "delete", "short"))
        pool = [v for v in self.values.get("seal_key", ()) if v != obj.get(member)]
        if kind == "swap" and not pool:
            kind = "fresh"
        if kind == "delete":
            obj.pop(member, None)
        elif kind == "swap":
            obj[member] = self.rng.choice(pool)
        else:
            obj[member] = _b64u(self.rng.randbytes(31 if kind == "short" else 32))
        self.details[f"seal_key_edit:{kind}"] += 1
        return f"{head}.{_b64u(json.dumps(obj, separators=(',', ':')).encode())}.{sig}"

    async def _m_seal_key_edit(self, wire: Wire) -> Answer:
        # A seal_key swapped, removed or replaced in the signed ACCEPT_POLICY or SESSION.
        rpc = wire.rpc
        params = rpc.get("params") if isinstance(rpc, dict) else None
        if isinstance(params, dict) and _is_jws(params.get("accept_jws")):
            params["accept_jws"] = self._payload_with(params["accept_jws"], "seal_key")
            return await self.forward(Wire(wire.path, wire.headers, json.dumps(rpc).encode(), wire.client))
        answer = await self.forward(wire)
        with contextlib.suppress(ValueError, AttributeError, KeyError, TypeError):
            obj = json.loads(answer.body)
            result = obj["result"]
            if _is_jws(result.get("session_jws")):
                result["session_jws"] = self._payload_with(result["session_jws"], "seal_key")
                return Answer(answer.status, answer.headers, json.dumps(obj).encode())
        return answer

    async def _m_card_strip(self, wire: Wire) -> Answer:
        # The agent card served without "sealed": it no longer hashes to the signed
        # manifest hash (a downgrade attempt).
        answer = await self.forward(wire)
        if wire.verb != "GET":
            return answer
        with contextlib.suppress(ValueError, AttributeError):
            card = json.loads(answer.body)
            card["a2a_secure_extensions"] = [
                x for x in card.get("a2a_secure_extensions", []) if x != "sealed"
            ]
            self.details["card_strip"] += 1
            return Answer(answer.status, answer.headers, json.dumps(card).encode())
        return answer

    async def _m_server_restart(self, wire: Wire) -> Answer:
        # The request reaches a server that is replaced by a fresh one (same key, same
        # store) while it runs: the old one's work is cancelled where it stands.
        task = asyncio.ensure_future(self.forward(wire))
        await asyncio.sleep(self.rng.choice((0, 0.001, 0.005)))
        if self.restart is not None:
            await self.restart()
        if not task.done():
            task.cancel()
            self.details["server_restart:cancelled"] += 1
            with contextlib.suppress(BaseException):
                await task
            return CLOSE
        self.details["server_restart:answered"] += 1
        return task.result()

    async def _m_status_flip(self, wire: Wire) -> Answer:
        answer = await self.forward(wire)
        status = self.rng.choice((200, 400, 401, 409, 500, 502, 503, 504))
        self.details[f"status:{answer.status}->{status}"] += 1
        return Answer(status, answer.headers, answer.body)

    async def _m_truncate_response(self, wire: Wire) -> Answer:
        answer = await self.forward(wire)
        cut = self.rng.randrange(max(1, len(answer.body)))
        return Answer(answer.status, answer.headers, answer.body[:cut])

    # -- editing JSON ----------------------------------------------------------------------------
    def _nodes(self, obj: Any, name: str = "") -> Iterator[tuple[Any, Any, str]]:
        if isinstance(obj, dict):
            for k in list(obj):
                yield obj, k, k
                yield from self._nodes(obj[k], k)
        elif isinstance(obj, list):
            for i in range(len(obj)):
                yield obj, i, name
                yield from self._nodes(obj[i], name)

    def _pool(self, *names: str) -> list[Any]:
        return [v for n in names for v in self.values.get(n, ())]

    def edit_json(self, obj: Any, where: str) -> None:
        """Apply one random edit somewhere inside ``obj`` (in place)."""
        nodes = list(self._nodes(obj))
        if not nodes:
            return
        parent, key, name = self.rng.choice(nodes)
        value = parent[key]
        kind, new = self._edit_value(name, value)
        if kind == "delete":
            del parent[key]
        else:
            parent[key] = new
        self.details[f"edit_{where}:{name or '[]'}:{kind}"] += 1
        if self.rng.random() < 0.05 and isinstance(parent, dict):
            parent["x-extra"] = 1
            self.details[f"edit_{where}:add-member"] += 1

    def _edit_value(self, name: str, value: Any) -> tuple[str, Any]:
        rng = self.rng
        if rng.random() < 0.08:
            return "delete", None
        if rng.random() < 0.06:
            return "type", rng.choice((None, True, 0, "", [], {}, 1.5))
        if _is_jws(value):
            return self._edit_jws(name, value)
        if name in DID_NAMES:
            pool = [v for v in self._pool(*DID_NAMES) if v != value]
            if pool and rng.random() < 0.8:
                return "swap-did", rng.choice(pool)
            return "forge-did", rng.choice(("did:web:evil.example", "did:key:z6Mk" + "a" * 44, f"{value}x"))
        if name in NONCE_NAMES or name == "session_id":
            pool = [v for v in self._pool(*NONCE_NAMES, "session_id") if v != value]
            if pool and rng.random() < 0.7:
                return "swap", rng.choice(pool)
            return "fresh", _b64u(rng.randbytes(32))
        if name.endswith("_hash") or name == "session_commitment":
            pool = [
                v
                for v in self._pool(name, "policy_hash", "manifest_hash", "session_commitment")
                if v != value
            ]
            if pool and rng.random() < 0.6:
                return "swap", rng.choice(pool)
            if isinstance(value, str) and len(value) > 10:
                i = rng.randrange(7, len(value))
                return "flip-hex", value[:i] + ("0" if value[i] != "0" else "1") + value[i + 1 :]
        if name == "policy":
            if isinstance(value, dict) and rng.random() < 0.5:
                p = dict(value)
                member = rng.choice(sorted(p)) if p else "rate_limit"
                p[member] = rng.choice((1, 2, 10**6, ["*"], [], ["echo", "blocked"]))
                return "policy-member", p
            alt = rng.choice(
                (
                    Policy.build(),
                    Policy.build(rate_limit=1),
                    Policy.build(allowed=["echo"], session_timeout=1),
                    Policy.build(blocked=["*"]),
                )
            )
            return "policy-swap", alt.to_dict()
        if name == "sequence" and type(value) is int:
            return "sequence", rng.choice(
                (value + 1, value - 1, 0, value + 1000, 2**53, True, str(value), 1.0 * value)
            )
        if name in TIME_NAMES and type(value) is int:
            return "time", rng.choice(
                (value + 1, value - 1, value + 301, value - 301, value * 1000, -value, str(value))
            )
        if name in ("public_keys",) or name == "key":
            pool = [v for v in self._pool(name) if v != value]
            if pool:
                return "swap-keys", rng.choice(pool)
        if name == "type":
            return "type-name", rng.choice(
                ("hello", "challenge", "proof", "policy", "accept_policy", "session", "closed")
            )
        if name == "protocol_version":
            return "version", rng.choice(("0.9", "2.0", "1.0 ", 1, "1"))
        if name == "status":
            return "status", rng.choice(("success", "error", "ok"))
        if name == "code" and type(value) is int:
            return "code", rng.choice((-32040, -32043, -32044, -32048, -32603, 0))
        if name == "id":
            return "id", rng.choice((value + 1 if type(value) is int else 0, "x", None))
        if name == "method":
            return "method", rng.choice(("hello", "proof", "accept_policy", "intent", "close", "nope"))
        if name == "final":
            return "final", not value if isinstance(value, bool) else True
        if name == "index" and type(value) is int:
            return "index", rng.choice((value + 1, value - 1, 0))
        if isinstance(value, bool):
            return "bool", not value
        if isinstance(value, int):
            return "int", value + rng.choice((1, -1, 1000))
        if isinstance(value, str):
            pool = [v for v in self._pool(name) if v != value]
            if pool and rng.random() < 0.5:
                return "swap", rng.choice(pool)
            return "str", value + rng.choice(("x", " ", "\u00e9")) if value else "x"
        if isinstance(value, dict | list):
            pool = [v for v in self._pool(name) if v != value]
            if pool:
                return "swap-object", json.loads(json.dumps(rng.choice(pool)))
            return "empty", type(value)()
        return "null", None

    def _edit_jws(self, name: str, token: str) -> tuple[str, Any]:
        rng = self.rng
        parts = token.split(".")
        pool = [
            v
            for v in self._pool(
                name,
                "policy_signature",
                "proof_jws",
                "accept_jws",
                "session_jws",
                "request_jws",
                "response_jws",
            )
            if _is_jws(v) and v != token
        ]
        choice = rng.choice(
            ("flip-header", "flip-payload", "flip-signature", "swap", "splice", "strip", "char")
        )
        if choice in ("swap", "splice") and not pool:
            choice = "flip-signature"
        if choice.startswith("flip-"):
            i = {"flip-header": 0, "flip-payload": 1, "flip-signature": 2}[choice]
            raw = bytearray(_b64u_dec(parts[i]))
            if raw:
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            parts[i] = _b64u(bytes(raw))
            return "jws-" + choice, ".".join(parts)
        if choice == "swap":
            return "jws-swap", rng.choice(pool)
        if choice == "splice":
            other = rng.choice(pool).split(".")
            i = rng.randrange(3)
            parts[i] = other[i]
            return f"jws-splice{i}", ".".join(parts)
        if choice == "strip":
            return "jws-strip-signature", parts[0] + "." + parts[1] + "."
        i = rng.randrange(len(token))
        c = "A" if token[i] != "A" else "B"
        return "jws-char", token[:i] + c + token[i + 1 :]

    def edit_sse(self, body: bytes) -> bytes:
        """Drop, duplicate, swap, edit or truncate the events of a streamed answer."""
        events = [e for e in body.split(b"\n\n") if e]
        kind = self.rng.choice(("drop", "duplicate", "swap", "edit", "truncate", "keepalive"))
        self.details["edit_sse:" + kind] += 1
        if kind == "drop" and events:
            del events[self.rng.randrange(len(events))]
        elif kind == "duplicate" and events:
            i = self.rng.randrange(len(events))
            events.insert(i, events[i])
        elif kind == "swap" and len(events) > 1:
            i = self.rng.randrange(len(events) - 1)
            events[i], events[i + 1] = events[i + 1], events[i]
        elif kind == "edit" and events:
            i = self.rng.randrange(len(events))
            lines = events[i].split(b"\n")
            for j, line in enumerate(lines):
                if line.startswith(b"data: "):
                    with contextlib.suppress(ValueError):
                        obj = json.loads(line[6:])
                        self.edit_json(obj, "sse")
                        lines[j] = b"data: " + json.dumps(obj, separators=(",", ":")).encode()
            events[i] = b"\n".join(lines)
        elif kind == "truncate":
            joined = b"".join(e + b"\n\n" for e in events)
            return joined[: self.rng.randrange(max(1, len(joined)))]
        elif kind == "keepalive":
            events.insert(self.rng.randrange(len(events) + 1), b": ping")
        return b"".join(e + b"\n\n" for e in events)


def _first_jws(obj: Any) -> Any:
    if isinstance(obj, dict):
        for v in obj.values():
            found = _first_jws(v)
            if found is not None:
                return found
    if _is_jws(obj):
        return obj
    return None


# -- what both ends decided --------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """One side's view of an established session."""

    client_did: str
    server_did: str
    nonce_a: str
    nonce_b: str
    policy_hash: str
    session_id: str
    session_commitment: str
    policy: dict[str, Any] = field(hash=False)


@dataclass
class Signed:
    """A request a client signed."""

    client_did: str
    session_id: str
    sequence: int
    kind: str  # "intent" or "close"
    intent: dict[str, Any] | None


@dataclass
class Execution:
    """One run of a handler on the server."""

    session_id: str
    sequence: int
    client_did: str
    goal: str
    inputs: Any
    output: Any = None
    outputs: list[Any] = field(default_factory=list)  # a stream's items
    intent_id: str | None = None


@dataclass
class Returned:
    """A value an honest client returned to its caller."""

    client_did: str
    session_id: str
    sequence: int
    value: Any
    stream: bool = False
    complete: bool = True
    intent_id: str | None = None


@dataclass
class Ledger:
    """Everything both ends decided, over a whole campaign."""

    client_proofs: dict[str, tuple[str, str]] = field(default_factory=dict)  # nonce_b -> (DID, nonce_a)
    client_accepts: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    client_sessions: dict[str, View] = field(default_factory=dict)
    signed: dict[tuple[str, int], Signed] = field(default_factory=dict)
    last_prepared: dict[str, PreparedRequest] = field(default_factory=dict)
    last_session: dict[str, str] = field(default_factory=dict)
    server_proven: list[tuple[str, str]] = field(default_factory=list)  # (nonce_b, client DID)
    server_opened: dict[str, View] = field(default_factory=dict)
    server_closed: list[str] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    returned: list[Returned] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    foreign_exceptions: list[str] = field(default_factory=list)
    mislabelled: list[str] = field(default_factory=list)  # a result for another sequence
    stuck: list[str] = field(default_factory=list)
    sanity_failures: list[str] = field(default_factory=list)

    def check(self) -> list[str]:
        """The invariant violations (empty when all hold)."""
        out: list[str] = []
        # (a) agreement on the session.
        for sid, cv in self.client_sessions.items():
            sv = self.server_opened.get(sid)
            if sv is None:
                out.append(f"(a) client accepted session {sid} that the server never opened")
            elif cv != sv or not json_equal(cv.policy, sv.policy):
                out.append(f"(a) views of session {sid} differ: client {cv} server {sv}")
        for sid, sv in self.server_opened.items():
            acc = self.client_accepts.get(sv.nonce_b)
            if acc != (sv.client_did, sv.nonce_a, sv.policy_hash):
                out.append(f"(a) server opened {sid} without that client's ACCEPT ({acc})")
        for nonce_b, did in self.server_proven:
            proof = self.client_proofs.get(nonce_b)
            if proof is None or proof[0] != did:
                out.append(f"(a) server accepted a PROOF for {nonce_b} that {did} never signed")
        # (b), (c) executions.
        runs = Counter((e.session_id, e.sequence) for e in self.executions)
        for key, n in runs.items():
            if n > 1:
                out.append(f"(c) intent {key} ran {n} times")
        by_key = {(e.session_id, e.sequence): e for e in self.executions}
        for e in self.executions:
            s = self.signed.get((e.session_id, e.sequence))
            if (
                s is None
                or s.kind != "intent"
                or s.intent is None
                or s.client_did != e.client_did
                or s.intent["goal"] != e.goal
                or not json_equal(s.intent["inputs"], e.inputs)
            ):
                out.append(f"(b) ran {e.goal} for {(e.session_id, e.sequence)} not signed that way: {s}")
        closes = {s.session_id for s in self.signed.values() if s.kind == "close"}
        for sid in self.server_closed:
            if sid not in closes:
                out.append(f"(b) server closed {sid} without a close signed by its client")
        # (e) intent ids: at most one run each; a value for an id is that run's.
        by_id: dict[str, Execution] = {}
        for e in self.executions:
            if e.intent_id is None:
                continue
            if e.intent_id in by_id:
                out.append(f"(e) intent_id {e.intent_id} ran twice: {by_id[e.intent_id]} and {e}")
            by_id.setdefault(e.intent_id, e)
        # (d) results.
        for r in self.returned:
            if r.intent_id is not None:
                e = by_id.get(r.intent_id)
                if e is None or e.client_did != r.client_did:
                    out.append(f"(e) client returned a value for intent_id {r.intent_id} that never ran")
                    continue
            else:
                e = by_key.get((r.session_id, r.sequence))
            if e is None or e.client_did != r.client_did:
                out.append(f"(d) client returned a value for {(r.session_id, r.sequence)} that never ran")
            elif r.stream:
                items = e.outputs[: len(r.value)] if r.value else []
                if not json_equal(items, r.value) or (r.complete and not json_equal(e.outputs, r.value)):
                    out.append(f"(d) stream items {r.value} differ from the handler's {e.outputs}")
            elif not json_equal(e.output, r.value):
                out.append(f"(d) client returned {r.value!r} where the handler gave {e.output!r}")
        out.extend(f"(d) {x}" for x in self.mislabelled)
        out.extend(f"foreign exception: {x}" for x in self.foreign_exceptions)
        out.extend(f"client call stuck: {x}" for x in self.stuck)
        out.extend(f"sanity: {x}" for x in self.sanity_failures)
        return out

    def logical_duplicates(self) -> int:
        """Intents (by their unique tag) that ran under more than one (session, sequence)."""
        tags = Counter(
            e.inputs.get("tag") for e in self.executions if isinstance(e.inputs, dict) and "tag" in e.inputs
        )
        return sum(1 for n in tags.values() if n > 1)


class RecordingStore(MemoryStore):
    """A ``MemoryStore`` that writes down each PROOF accepted, session opened and close."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    async def mark_proven(self, nonce_b: str, kid: str, now: float, *, agent: str = "") -> bool:
        pending = self._pending.get((agent, nonce_b))
        ok = await super().mark_proven(nonce_b, kid, now, agent=agent)
        if ok and pending is not None:
            self.ledger.server_proven.append((nonce_b, pending.client_did))
        return ok

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float, agent: str = ""
    ) -> OpenResult:
        pending = self._pending.get((agent, nonce_b))  # read before it is consumed (no await between)
        result = await super().open_session(nonce_b, session, max_sessions=max_sessions, now=now, agent=agent)
        if result is OpenResult.OPENED and pending is not None:
            self.ledger.server_opened[session.session_id] = View(
                client_did=session.client_did,
                server_did=session.server_did,
                nonce_a=pending.nonce_a,
                nonce_b=pending.nonce_b,
                policy_hash=pending.policy_hash,
                session_id=session.session_id,
                session_commitment=session.session_commitment,
                policy=session.policy.to_dict(),
            )
        return result

    async def close_session(self, session_id: str) -> None:
        self.ledger.server_closed.append(session_id)
        await super().close_session(session_id)


def recording_handshake(ledger: Ledger) -> type[ClientHandshake]:
    """A ``ClientHandshake`` that records what the client signed and accepted."""

    class RecordingHandshake(ClientHandshake):
        def receive_challenge(self, challenge: Any) -> dict[str, Any]:
            proof = super().receive_challenge(challenge)
            ledger.client_proofs[self.nonce_b] = (self.identity.did, self.nonce_a)
            return proof

        def receive_policy(
            self, msg: Any, *, accept: Callable[[Policy], bool] | None = None
        ) -> dict[str, Any]:
            out = super().receive_policy(msg, accept=accept)
            assert self._challenge is not None
            ledger.client_accepts[self.nonce_b] = (
                self.identity.did,
                self.nonce_a,
                self._challenge.policy_hash,
            )
            return out

        def receive_session(self, msg: Any) -> ClientSession:
            session = super().receive_session(msg)
            assert self._challenge is not None
            ledger.client_sessions[session.session_id] = View(
                client_did=self.identity.did,
                server_did=session.server_did,
                nonce_a=self.nonce_a,
                nonce_b=self.nonce_b,
                policy_hash=self._challenge.policy_hash,
                session_id=session.session_id,
                session_commitment=session.session_commitment,
                policy=session.policy.to_dict(),
            )
            _record_signing(ledger, session)
            return session

    return RecordingHandshake


def _record_signing(ledger: Ledger, session: ClientSession) -> None:
    prepare_intent, prepare_close = session.prepare_intent, session.prepare_close
    did = session.identity.did

    def intent(body: Any) -> PreparedRequest:
        req = prepare_intent(body)
        signed = json.loads(json.dumps(req.params["intent"]))
        if "sealed" in signed:  # what the client sealed is what the handler must get
            signed["inputs"] = json.loads(json.dumps(body["inputs"]))
            del signed["sealed"]
        ledger.signed[(session.session_id, req.sequence)] = Signed(
            did, session.session_id, req.sequence, "intent", signed
        )
        ledger.last_prepared[did], ledger.last_session[did] = req, session.session_id
        return req

    def close() -> PreparedRequest:
        req = prepare_close()
        ledger.signed[(session.session_id, req.sequence)] = Signed(
            did, session.session_id, req.sequence, "close", None
        )
        return req

    session.prepare_intent = intent  # type: ignore[method-assign]
    session.prepare_close = close  # type: ignore[method-assign]


class RecordingRedisStore(RedisStore):
    """A ``RedisStore`` that writes down each PROOF accepted, session opened and close."""

    def __init__(self, ledger: Ledger, url: str, prefix: str) -> None:
        super().__init__(url, prefix=prefix, socket_timeout=2.0)
        self.ledger = ledger

    async def mark_proven(self, nonce_b: str, kid: str, now: float, *, agent: str = "") -> bool:
        pending = await self.get_pending(nonce_b, now, agent=agent)
        ok = await super().mark_proven(nonce_b, kid, now, agent=agent)
        if ok and pending is not None:
            self.ledger.server_proven.append((nonce_b, pending.client_did))
        return ok

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float, agent: str = ""
    ) -> OpenResult:
        pending = await self.get_pending(nonce_b, now, agent=agent)
        result = await super().open_session(nonce_b, session, max_sessions=max_sessions, now=now, agent=agent)
        if result is OpenResult.OPENED and pending is not None:
            self.ledger.server_opened[session.session_id] = View(
                client_did=session.client_did,
                server_did=session.server_did,
                nonce_a=pending.nonce_a,
                nonce_b=pending.nonce_b,
                policy_hash=pending.policy_hash,
                session_id=session.session_id,
                session_commitment=session.session_commitment,
                policy=session.policy.to_dict(),
            )
        return result

    async def close_session(self, session_id: str) -> None:
        self.ledger.server_closed.append(session_id)
        await super().close_session(session_id)


def build_server(
    ledger: Ledger, identity: Identity, store: Any = None, *, sealed: bool = False
) -> AgentServer:
    """The honest server: handlers that write down every execution (``sealed``: §12.6)."""
    server = AgentServer(
        identity,
        Policy.build(blocked=["blocked"], rate_limit=10**7, rate_period=3600),
        name="mitm-target",
        store=store if store is not None else RecordingStore(ledger),
        # The attacker replays HELLOs freely, and two DIDs send every intent of a long
        # campaign with an id: the pending and intent_id bounds are not what is tested here.
        limits=ServerLimits(
            max_pending_per_source=10**6,
            max_pending_total=10**6,
            max_intent_ids_per_did=10**7,
            sealed_intents=sealed,
        ),
    )

    def execution(inputs: Any, ctx: IntentContext) -> Execution:
        e = Execution(
            ctx.session_id,
            ctx.sequence,
            ctx.caller_did,
            ctx.goal,
            json.loads(json.dumps(inputs)),
            intent_id=ctx.intent_id,
        )
        ledger.executions.append(e)
        return e

    @server.intent("echo")
    async def echo(inputs: dict[str, Any], ctx: IntentContext) -> Any:
        e = execution(inputs, ctx)
        e.output = {"echo": inputs, "session": ctx.session_id, "sequence": ctx.sequence}
        return e.output

    @server.intent("fail")
    async def fail(inputs: dict[str, Any], ctx: IntentContext) -> Any:
        execution(inputs, ctx)
        raise InvalidParams("fail always refuses its inputs")

    @server.intent("count")
    async def count(inputs: dict[str, Any], ctx: IntentContext) -> AsyncIterator[Any]:
        e = execution(inputs, ctx)
        for i in range(int(inputs.get("n", 1))):
            item = {"i": i, "tag": inputs.get("tag"), "sequence": ctx.sequence}
            e.outputs.append(item)
            yield item

    return server


def identity_for(name: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"mitm:" + name.encode()).digest(), name)


# -- the campaign ---------------------------------------------------------------------------------


@dataclass
class Report:
    """What a campaign did and found."""

    runs: int = 0
    exchanges: int = 0
    mutations: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    executions: int = 0
    sessions_opened: int = 0
    sessions_accepted: int = 0
    results_returned: int = 0
    logical_duplicates: int = 0
    with_intent_id: int = 0  # executions whose request carried an intent_id
    resent: int = 0  # intent_ids the client signed on more than one session
    resent_answered: int = 0  # ... of which the caller got a value (the one run's)
    violations: list[str] = field(default_factory=list)
    first_failing_run: int | None = None
    seconds: float = 0.0

    def summary(self, *, details: bool = False) -> str:
        lines = [
            f"runs {self.runs}, HTTP exchanges {self.exchanges}, {self.seconds:.1f} s",
            f"sessions: server opened {self.sessions_opened}, clients accepted {self.sessions_accepted}",
            f"intents run {self.executions}, values returned to callers {self.results_returned}",
            f"intents that ran twice (re-sent on a new session after an unsigned -32043, without "
            f"an intent_id): {self.logical_duplicates}; runs with an intent_id: {self.with_intent_id}",
            f"intent_ids re-sent on another session: {self.resent}, of which answered with the one "
            f"run's value: {self.resent_answered}",
            "mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.mutations.items())),
            "client outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            f"invariant violations: {len(self.violations)}"
            + (f" (first after run {self.first_failing_run})" if self.first_failing_run is not None else ""),
        ]
        if details:
            lines.append("details: " + ", ".join(f"{k} {v}" for k, v in sorted(self.details.items())))
        lines.extend("  " + v for v in self.violations[:20])
        return "\n".join(lines)


class Campaign:
    """One honest server, the attacker in front of it, two honest clients; many runs."""

    def __init__(
        self,
        seed: int,
        *,
        ops_per_client: int = 5,
        op_timeout: float = 15.0,
        in_process: bool = False,
        runs_per_handshake: int = 1,
        store: str = "memory",
        redis_url: str = "",
        exactly_once: bool | None = None,
        check_every: int = 1,
        mutations: tuple[tuple[str, int], ...] = MUTATIONS,
        sealed: bool | None = None,
    ) -> None:
        """``store``: "memory", or "redis" (``redis_url``; adds the ``server_restart``
        mutation). ``exactly_once``: the clients' setting. ``check_every``: check the
        invariants after every n-th run (and at the end). ``sealed``: the clients' setting;
        when set, the server declares sealed intents and the sealed mutations join in."""
        self.seed = seed
        self.ops = ops_per_client
        self.op_timeout = op_timeout
        self.in_process = in_process
        self.runs_per_handshake = runs_per_handshake
        self.store_kind = store
        self.redis_url = redis_url
        self.redis_prefix = f"a2a-test:mitm:{seed}:{time.time_ns()}:"
        self.exactly_once = exactly_once
        self.check_every = check_every
        self.sealed = sealed
        self.mutation_table = mutations + (SEALED_MUTATIONS if sealed is not None else ())
        self._app: Any = None
        self._servers: list[AgentServer] = []
        self._kept: dict[str, A2AClient] = {}
        self._kept_runs = 0
        self.ledger = Ledger()
        self.server_identity = identity_for("server")
        self.identities = {"alice": identity_for("alice"), "bob": identity_for("bob")}
        self.mitm: Mitm | None = None
        self.url = ""
        self.report = Report()
        self._stack = contextlib.AsyncExitStack()

    def _new_server(self) -> AgentServer:
        store: Any = None
        if self.store_kind == "redis":
            store = RecordingRedisStore(self.ledger, self.redis_url, self.redis_prefix)
        server = build_server(self.ledger, self.server_identity, store, sealed=self.sealed is not None)
        self._servers.append(server)
        return server

    async def _restart(self) -> None:
        """A fresh server process on the same key and store (the old one is dropped)."""
        self._app = self._new_server().app()

    async def _upstream_app(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)

    async def __aenter__(self) -> Campaign:
        self._app = self._new_server().app()
        # The clients' handshakes write down what they sign (real methods, recorded).
        original = client_handshake.ClientHandshake
        client_handshake.ClientHandshake = recording_handshake(self.ledger)  # type: ignore[misc]
        self._stack.callback(setattr, client_handshake, "ClientHandshake", original)
        self._stack.callback(client_extensions.forget)
        client_extensions.forget()
        mutations = self.mutation_table + (RESTART_MUTATIONS if self.store_kind == "redis" else ())
        if self.in_process:
            # No sockets: both hops are ASGI calls (the host names only satisfy the client's
            # https-or-loopback rule).
            transport = httpx.ASGITransport(app=self._upstream_app, client=("127.0.0.1", 4000))
            self.mitm = Mitm("http://127.0.0.1:1", transport=transport, time_scale=0.05, mutations=mutations)
            self.url = "http://127.0.0.1:2"
        else:
            upstream = await self._stack.enter_async_context(serve_app(self._upstream_app, interface="asgi3"))
            self.mitm = Mitm(upstream, mutations=mutations)
            self.url = await self._stack.enter_async_context(serve_app(self.mitm, log_level="critical"))
        self.mitm.restart = self._restart
        self._stack.push_async_callback(self.mitm.aclose)
        self._stack.push_async_callback(self._close_servers)
        # A clean recorded session per client first: traffic for later replays.
        await self.run(-1, attack=False)
        return self

    async def _close_servers(self) -> None:
        for client in self._kept.values():
            with contextlib.suppress(Exception):
                await client.aclose(close_sessions=False)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.store.aclose()
        if self.store_kind == "redis":
            with contextlib.suppress(Exception):
                import redis_helpers

                redis_helpers.delete_prefix(self.redis_url, self.redis_prefix)

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def _client(self, label: str, ident: Identity) -> A2AClient:
        if self.in_process:
            client = ("127.0.0.1", 4001)
            transport: httpx.AsyncBaseTransport = httpx.ASGITransport(app=self.mitm, client=client)
        else:
            transport = fast_transport()
        http = httpx.AsyncClient(transport=transport, timeout=5, headers={"x-mitm-client": label})
        retry = RetryPolicy(attempts=3, base=0.005, cap=0.02, max_wait=0.5)
        return A2AClient(ident, http=http, retry=retry, exactly_once=self.exactly_once, sealed=self.sealed)

    @contextlib.asynccontextmanager
    async def _clients(self) -> AsyncIterator[dict[str, A2AClient]]:
        if self.runs_per_handshake > 1:
            # Kept across runs (their sessions too): several runs per handshake.
            if not self._kept or self._kept_runs >= self.runs_per_handshake:
                for client in self._kept.values():
                    with contextlib.suppress(Exception):
                        await client.aclose(close_sessions=False)
                    await client.http.aclose()
                self._kept = {label: self._client(label, ident) for label, ident in self.identities.items()}
                self._kept_runs = 0
            self._kept_runs += 1
            yield self._kept
            return
        async with contextlib.AsyncExitStack() as stack:
            clients = {}
            for label, ident in self.identities.items():
                client = self._client(label, ident)
                stack.push_async_callback(client.http.aclose)
                clients[label] = client
            yield clients

    async def _guard(self, what: str, call: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(call, self.op_timeout)
        except A2AError as exc:
            self.ledger.outcomes[f"error {exc.code} {'signed' if exc.signed else 'unsigned'}"] += 1
        except TimeoutError:
            self.ledger.stuck.append(what)
        except Exception as exc:  # the client must never leak anything but an A2AError
            self.ledger.foreign_exceptions.append(f"{what}: {exc!r}"[:300])
        return None

    async def _script(self, run: int, label: str, client: A2AClient, rng: random.Random) -> None:
        did = self.server_identity.did
        me = client.identity.did
        for k in range(self.ops):
            tag = f"{self.seed}/{run}/{label}/{k}"
            op = rng.choices(("echo", "fail", "count", "close", "handshake", "blocked"), (10, 2, 3, 1, 1, 1))[
                0
            ]
            what = f"run {run} {label} {op} {tag}"
            if op == "echo":
                intent = {"goal": "echo", "inputs": {"tag": tag, "text": rng.choice(("hi", "hola", "é☃"))}}
                res = await self._guard(what, client.request(did, intent, endpoint=self.url))
                if res is not None:
                    self._returned(me, res.sequence, res.result)
            elif op == "fail":
                await self._guard(
                    what, client.request(did, {"goal": "fail", "inputs": {"tag": tag}}, endpoint=self.url)
                )
            elif op == "count":
                intent = {"goal": "count", "inputs": {"tag": tag, "n": rng.randint(1, 4)}}
                await self._guard(what, self._stream(client, me, intent))
            elif op == "close":
                await self._guard(what, client.close_session(did))
            elif op == "handshake":
                await self._guard(what, client.handshake(did, endpoint=self.url))
            else:
                await self._guard(
                    what, client.request(did, {"goal": "blocked", "inputs": {}}, endpoint=self.url)
                )

    def _returned(
        self, me: str, sequence: int, value: Any, *, stream: bool = False, complete: bool = True
    ) -> None:
        req = self.ledger.last_prepared[me]
        if req.sequence != sequence:
            self.ledger.mislabelled.append(f"result sequence {sequence} is not the request's {req.sequence}")
        self.ledger.returned.append(
            Returned(
                me,
                self.ledger.last_session[me],
                req.sequence,
                value,
                stream=stream,
                complete=complete,
                intent_id=req.intent_id,
            )
        )
        self.ledger.outcomes["success"] += 1

    async def _stream(self, client: A2AClient, me: str, intent: dict[str, Any]) -> None:
        items: list[Any] = []
        self.ledger.last_prepared.pop(me, None)
        try:
            async with contextlib.aclosing(
                client.stream(self.server_identity.did, intent, endpoint=self.url)
            ) as events:
                async for item in events:
                    items.append(item)
        except BaseException:
            if items:
                self._returned(me, self.ledger.last_prepared[me].sequence, items, stream=True, complete=False)
            raise
        self._returned(me, self.ledger.last_prepared[me].sequence, items, stream=True)

    async def run(self, run: int, *, attack: bool = True) -> list[str]:
        """One run: both clients' scripts under attack, a flush, a clean sanity request each."""
        assert self.mitm is not None
        rng = random.Random(f"{self.seed}:{run}")
        self.mitm.rng = random.Random(f"{self.seed}:{run}:mitm")
        async with self._clients() as clients:
            self.mitm.active = attack
            scripts = [
                self._script(run, label, client, random.Random(f"{self.seed}:{run}:{label}"))
                for label, client in clients.items()
            ]
            await asyncio.gather(*scripts)
            self.mitm.active = False
            await self.mitm.flush()
            # Sanity: with the attacker gone, each client is served at once (nothing poisoned).
            for label, client in clients.items():
                intent = {"goal": "echo", "inputs": {"tag": f"{self.seed}/{run}/{label}/sanity"}}
                try:
                    res = await asyncio.wait_for(
                        client.request(self.server_identity.did, intent, endpoint=self.url), self.op_timeout
                    )
                    self._returned(client.identity.did, res.sequence, res.result)
                except Exception as exc:
                    self.ledger.sanity_failures.append(f"run {run} {label}: {exc!r}")
            # Leave some sessions open, for replays into them in later runs.
            if self.runs_per_handshake == 1:
                for client in clients.values():
                    await self._guard(f"run {run} aclose", client.aclose(close_sessions=rng.random() < 0.5))
        if run >= 0:
            self.report.runs += 1
        if run >= 0 and (run + 1) % self.check_every:
            return []
        return self.ledger.check()

    def finish(self, started: float) -> Report:
        assert self.mitm is not None
        r = self.report
        r.exchanges = self.mitm.exchanges
        r.mutations = Counter(self.mitm.mutations)
        r.details = Counter(self.mitm.details)
        r.outcomes = Counter(self.ledger.outcomes)
        r.executions = len(self.ledger.executions)
        r.sessions_opened = len(self.ledger.server_opened)
        r.sessions_accepted = len(self.ledger.client_sessions)
        r.results_returned = len(self.ledger.returned)
        r.logical_duplicates = self.ledger.logical_duplicates()
        r.with_intent_id = sum(1 for e in self.ledger.executions if e.intent_id is not None)
        sessions_of: dict[str, set[str]] = {}
        for signed in self.ledger.signed.values():
            iid = (signed.intent or {}).get("intent_id")
            if iid is not None:
                sessions_of.setdefault(iid, set()).add(signed.session_id)
        resent = {iid for iid, sids in sessions_of.items() if len(sids) > 1}
        r.resent = len(resent)
        r.resent_answered = len({x.intent_id for x in self.ledger.returned if x.intent_id in resent})
        r.violations = self.ledger.check()
        r.seconds = time.perf_counter() - started
        return r


async def run_campaign(
    seed: int, runs: int, *, ops_per_client: int = 5, stop_on_violation: bool = False, **options: Any
) -> Report:
    """``runs`` seeded runs against one server; invariants checked after every run.

    ``options`` go to :class:`Campaign` (``in_process``, ``runs_per_handshake``, ``store``...).
    """
    started = time.perf_counter()
    async with Campaign(seed, ops_per_client=ops_per_client, **options) as campaign:
        for run in range(runs):
            violations = await campaign.run(run)
            if violations and campaign.report.first_failing_run is None:
                campaign.report.first_failing_run = run
            if violations and stop_on_violation:
                break
        return campaign.finish(started)
