"""Shared pieces of the wire-conformance tests (test_streaming.py, test_conformance.py).

The server is the §11 test agent (``echo`` and the streaming ``count``) registered by
``register_test_agent`` on an ``AgentServer`` with a fake clock, plus a few extra streaming
goals a test needs (a first event that comes late, hundreds of events, big events, events fed
by the test itself). Everything runs under real uvicorn (``serve_app``) and is read with raw
httpx, so a test sees the exact bytes an independent implementation would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from a2a_secure.errors import InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server import test_agent
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app
from tests.http_helpers import JSON, AuditLog, envelope, raw_handshake

__all__ = [
    "JSON",
    "MIB",
    "AuditLog",
    "Frame",
    "Shared",
    "Stack",
    "agent_server",
    "envelope",
    "error_of",
    "identity",
    "open_stack",
    "parse_sse",
    "serve_shared",
    "serve_stack",
    "wait_for",
]

MIB = 1024 * 1024


def identity(name: str) -> Identity:
    """A fixed identity per name."""
    return Identity.from_seed(hashlib.sha256(b"conformance:" + name.encode()).digest(), name[:128])


def agent_server(
    *,
    clock: FakeClock,
    policy: Policy | None = None,
    limits: ServerLimits | None = None,
    audit: Any = None,
    calls: Counter[str] | None = None,
    feed: asyncio.Queue[Any] | None = None,
    server_identity: Identity | None = None,
    resolver: DIDResolver | None = None,
) -> AgentServer:
    """The §11 test agent on an ``AgentServer`` (with ``clock``), plus the extra test goals.

    ``calls`` counts handler runs (``count``, ``echo``, ...) and ``count-items`` the items
    ``count`` yielded, so a test can see that a retry did not run a handler again.
    """
    calls = calls if calls is not None else Counter()
    server = AgentServer(
        server_identity or identity("server"),
        policy or Policy(),
        name="conformance-agent",
        description="a2a-secure test agent (PROTOCOL.md §11)",
        url="http://127.0.0.1",
        store=MemoryStore(),
        resolver=resolver,
        limits=limits,
        audit=audit,
        clock=clock,
        monotonic=clock.monotonic,  # durations (audit records) move with the fake clock
    )
    test_agent.register_test_agent(server)  # exactly the §11 handlers ...

    async def echo(inputs: Any, ctx: IntentContext) -> Any:  # ... wrapped to be counted
        calls["echo"] += 1
        return await test_agent.echo(inputs)

    async def count(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        calls["count"] += 1
        async for item in test_agent.count(inputs):
            calls["count-items"] += 1
            yield item

    async def sleepy(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        # The first event comes after before_ms; "fail" rejects the inputs at that point.
        calls["sleepy"] += 1
        await asyncio.sleep(inputs.get("before_ms", 0) / 1000)
        if inputs.get("fail"):
            raise InvalidParams("sleepy was told to fail")
        for i in range(inputs.get("n", 1)):
            if i:
                await asyncio.sleep(inputs.get("delay_ms", 0) / 1000)
            yield {"i": i}

    async def many(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        calls["many"] += 1
        for i in range(inputs["n"]):
            yield {"i": i}

    async def sizes(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        calls["sizes"] += 1
        for i, size in enumerate(inputs["sizes"]):
            yield {"i": i, "pad": "x" * size}

    async def fed(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        # Yields what the test puts in ``feed``; None ends the stream, an exception is raised.
        calls["fed"] += 1
        assert feed is not None
        while (item := await feed.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    server.add("echo", echo)
    for goal, handler in (
        ("count", count),
        ("sleepy", sleepy),
        ("many", many),
        ("sizes", sizes),
        ("fed", fed),
    ):
        server.add_stream(goal, handler)
    return server


@dataclass
class Stack:
    """A running test agent, a raw httpx client and one session opened over the wire."""

    server: AgentServer
    url: str
    http: httpx.AsyncClient
    client: Identity
    session: ClientSession
    clock: FakeClock
    audit: AuditLog
    calls: Counter[str]
    feed: asyncio.Queue[Any]
    _ids: int = field(default=100)

    @property
    def store(self) -> MemoryStore:
        assert isinstance(self.server.store, MemoryStore)
        return self.server.store

    def rid(self) -> int:
        self._ids += 1
        return self._ids

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(
            self.url + path, content=body, headers=JSON if headers is None else headers
        )

    async def call(self, path: str, method: str, params: Any, rid: Any = None) -> httpx.Response:
        return await self.post(path, envelope(method, params, self.rid() if rid is None else rid))

    async def send(self, req: PreparedRequest, rid: Any = None) -> httpx.Response:
        """Send a prepared intent or close (the whole answer is read)."""
        return await self.call("/a2a/intent", req.method, req.params, rid)

    def prepare(
        self,
        goal: str,
        inputs: dict[str, Any] | None = None,
        *,
        stream: bool | None = None,
        session: ClientSession | None = None,
        **constraints: Any,
    ) -> PreparedRequest:
        intent: dict[str, Any] = {"goal": goal, "inputs": inputs or {}}
        if stream is not None:
            constraints["stream"] = stream
        if constraints:
            intent["constraints"] = constraints
        return (session or self.session).prepare_intent(intent)

    async def new_session(self, client: Identity | None = None) -> ClientSession:
        return await raw_handshake(
            self.http, self.url, client or self.client, self.server.identity.did, clock=self.clock
        )


@dataclass
class Shared:
    """A running test agent and what a test needs around it (no session yet)."""

    server: AgentServer
    url: str
    http: httpx.AsyncClient
    clock: FakeClock
    audit: AuditLog
    calls: Counter[str]
    feed: asyncio.Queue[Any]


@contextlib.asynccontextmanager
async def serve_shared(
    *,
    policy: Policy | None = None,
    limits: ServerLimits | None = None,
    audit: Any = None,
    clock: FakeClock | None = None,
    resolver: DIDResolver | None = None,
) -> AsyncIterator[Shared]:
    """Serve the test agent under uvicorn with a raw httpx client; close both at the end."""
    clock = clock or FakeClock()
    calls: Counter[str] = Counter()
    feed: asyncio.Queue[Any] = asyncio.Queue()
    log = audit if audit is not None else AuditLog()
    server = agent_server(
        clock=clock, policy=policy, limits=limits, audit=log, calls=calls, feed=feed, resolver=resolver
    )
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        yield Shared(server, url, http, clock, log, calls, feed)


async def open_stack(shared: Shared, client: Identity | None = None) -> Stack:
    """A new session on ``shared`` for ``client`` (a new DID unless given); counters reset."""
    shared.calls.clear()
    if isinstance(shared.audit, AuditLog):
        shared.audit.clear()
    assert shared.feed.empty()
    client = client or Identity.generate("client")
    session = await raw_handshake(
        shared.http, shared.url, client, shared.server.identity.did, clock=shared.clock
    )
    return Stack(
        shared.server,
        shared.url,
        shared.http,
        client,
        session,
        shared.clock,
        shared.audit,
        shared.calls,
        shared.feed,
    )


@contextlib.asynccontextmanager
async def serve_stack(
    *,
    policy: Policy | None = None,
    limits: ServerLimits | None = None,
    client: Identity | None = None,
    audit: Any = None,
    clock: FakeClock | None = None,
) -> AsyncIterator[Stack]:
    """Serve the test agent; open one session for ``client``; close everything at the end."""
    async with serve_shared(policy=policy, limits=limits, audit=audit, clock=clock) as shared:
        yield await open_stack(shared, client or identity("client"))


# -- reading answers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One event of an event stream exactly as received."""

    id: bytes  # the text after "id: "
    data: bytes  # the text after "data: "
    raw: bytes  # the whole block, "id: ...\ndata: ...\n\n"

    @property
    def message(self) -> dict[str, Any]:
        obj = encoding.loads(self.data)
        assert isinstance(obj, dict)
        return obj

    @property
    def result(self) -> dict[str, Any]:
        result = self.message["result"]
        assert isinstance(result, dict)
        return result

    @property
    def result_bytes(self) -> bytes:
        """The bytes of the data line from the ``result`` member on (the id is before it)."""
        i = self.data.index(b',"result":')
        return self.data[i:]


def parse_sse(body: bytes, *, comments: list[bytes] | None = None) -> list[Frame]:
    """Split an event stream, asserting the exact framing of §6.4.

    Every block is ``id: <decimal>`` LF ``data: <JSON>`` LF LF, or a comment block (lines
    starting with ``:``, collected in ``comments``); nothing else, and nothing left over.
    """
    assert body.endswith(b"\n\n") or body == b"", body[-200:]
    frames: list[Frame] = []
    for block in body.split(b"\n\n")[:-1]:
        lines = block.split(b"\n")
        if all(line.startswith(b":") for line in lines):
            if comments is not None:
                comments.extend(lines)
            continue
        assert len(lines) == 2, block[:200]
        id_line, data_line = lines
        assert id_line.startswith(b"id: ") and data_line.startswith(b"data: "), block[:200]
        event_id = id_line[4:]
        assert event_id.isdigit() and (event_id == b"0" or not event_id.startswith(b"0")), event_id
        frames.append(Frame(event_id, data_line[6:], block + b"\n\n"))
    return frames


def error_of(resp: httpx.Response, status: int, code: int, rid: Any) -> dict[str, Any]:
    """The JSON-RPC error of ``resp`` after checking status, id, code and the error's members."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].split(";")[0] == "application/json"
    body = encoding.loads(resp.content)
    assert body.keys() == {"jsonrpc", "id", "error"}, body
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == rid and type(body["id"]) is type(rid), (body["id"], rid)
    error = body["error"]
    assert error["code"] == code, error
    assert error.keys() <= {"code", "message", "data"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error  # type: ignore[no-any-return]


async def wait_for(predicate: Any, seconds: float = 5.0) -> None:
    """Poll ``predicate()`` until it is true (for work that ends after the answer was sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)
