"""Shared pieces for the HTTP tests: a real ``AgentServer`` under uvicorn, raw wire access.

Nothing here mocks the protocol or the cryptography. ``serve_env`` starts a real server on
127.0.0.1 (``a2a_secure.testing.serve_app``) with counting handlers and an audit list, and
opens a session over raw httpx with the core ``ClientHandshake``, so a test can send
honest or broken bytes and look at exactly what comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from a2a_secure.errors import InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

JSON = {"Content-Type": "application/json"}
SECRET = "SECRET-db-password=hunter2"


def identity(name: str) -> Identity:
    """A fixed identity per name (seeded from the name, so runs are reproducible)."""
    return Identity.from_seed(hashlib.sha256(b"http-tests:" + name.encode()).digest(), name)


def envelope(method: str, params: Any, rid: Any = 1) -> bytes:
    """A JSON-RPC request body."""
    return encoding.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": rid})


class Rebinding:
    """A resolver whose answer for a name changes after the first question (DNS rebinding)."""

    def __init__(self, first: list[str], then: list[str]) -> None:
        self.answers = [first, then]
        self.asked = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        answer = self.answers[min(self.asked, 1)]
        self.asked += 1
        return answer


@contextlib.contextmanager
def system_dns(answers: dict[str, list[str]]) -> Iterator[None]:
    """The running loop's ``getaddrinfo`` (what a dial by name asks) answers these names so."""
    loop = asyncio.get_running_loop()
    original = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            return await original(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (addr, int(port)))
            for addr in answers[name]
        ]

    loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]
    try:
        yield
    finally:
        del loop.getaddrinfo  # type: ignore[method-assign]


class AuditLog(list[dict[str, Any]]):
    """An audit hook that keeps every record."""

    def __call__(self, **record: Any) -> None:
        self.append(record)

    def tally(self, event: str, status: str | None = "success") -> int:
        """How many ``event`` records (with ``status``, unless None) were written."""
        return sum(1 for r in self if r["event"] == event and (status is None or r["status"] == status))


def build_server(
    server_identity: Identity | None = None,
    *,
    policy: Policy | None = None,
    limits: ServerLimits | None = None,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
    calls: Counter[str] | None = None,
    audit: AuditLog | None = None,
) -> AgentServer:
    """An ``AgentServer`` with the test handlers; ``calls`` counts handler executions."""
    calls = calls if calls is not None else Counter()
    server = AgentServer(
        server_identity or identity("server"),
        policy or Policy(),
        name="test-server",
        description="HTTP test agent",
        url="http://127.0.0.1",
        store=store if store is not None else MemoryStore(),
        limits=limits,
        audit=audit,
        clock=clock,
    )

    @server.intent("echo")
    def echo(inputs: dict[str, Any]) -> dict[str, Any]:  # sync: runs in a worker thread
        calls["echo"] += 1
        return {"echo": inputs}

    @server.intent("whoami")
    async def whoami(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        calls["whoami"] += 1
        return {"caller": ctx.caller_did, "sequence": ctx.sequence, "agent_id": ctx.client_agent_id}

    @server.intent("slow")
    async def slow(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["slow"] += 1
        await asyncio.sleep(inputs.get("seconds", 1.0))
        return {"slept": inputs.get("seconds", 1.0)}

    @server.intent("boom")
    async def boom(inputs: dict[str, Any]) -> Any:
        calls["boom"] += 1
        raise RuntimeError(f"{SECRET} in /srv/app/handler.py line 42")

    @server.intent("reject")
    def reject(inputs: dict[str, Any]) -> Any:
        calls["reject"] += 1
        raise InvalidParams("inputs.x must be a string")

    @server.intent("blocked")
    def blocked(inputs: dict[str, Any]) -> Any:  # pragma: no cover - the policy forbids it
        calls["blocked"] += 1
        return {}

    server.calls = calls  # type: ignore[attr-defined]
    return server


async def raw_handshake(
    http: httpx.AsyncClient,
    url: str,
    client: Identity,
    server_did: str,
    *,
    clock: Callable[[], float] = time.time,
) -> ClientSession:
    """The four handshake steps over raw HTTP with the core state machine."""
    hs = ClientHandshake(client, resolve_did_key(server_did), clock=clock)
    msg = hs.hello()
    for method in ("hello", "proof", "accept_policy"):
        resp = await http.post(url + "/a2a/handshake", content=envelope(method, msg), headers=JSON)
        assert resp.status_code == 200, resp.text
        result = resp.json()["result"]
        if method == "hello":
            msg = hs.receive_challenge(result)
        elif method == "proof":
            msg = hs.receive_policy(result)
        else:
            return hs.receive_session(result)
    raise AssertionError("unreachable")


@dataclass
class Env:
    """A running server, an HTTP client and one session opened over the raw wire."""

    server: AgentServer
    url: str
    http: httpx.AsyncClient
    client: Identity
    session: ClientSession
    audit: AuditLog
    calls: Counter[str]
    clock: Callable[[], float]
    _ids: int = field(default=1000)

    @property
    def store(self) -> MemoryStore:
        assert isinstance(self.server.store, MemoryStore)
        return self.server.store

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def post(self, path: str, body: bytes, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(
            self.url + path, content=body, headers=JSON if headers is None else headers
        )

    async def call(self, path: str, method: str, params: Any, rid: Any = None) -> httpx.Response:
        return await self.post(path, envelope(method, params, self.next_id() if rid is None else rid))

    async def send(self, req: PreparedRequest, rid: Any = None, params: Any = None) -> httpx.Response:
        """Send a prepared intent/close (or ``params`` standing in for its params)."""
        return await self.call("/a2a/intent", req.method, req.params if params is None else params, rid)

    def prepare(self, goal: str = "echo", **inputs: Any) -> PreparedRequest:
        return self.session.prepare_intent({"goal": goal, "inputs": inputs})

    async def honest(self, goal: str = "echo", **inputs: Any) -> Any:
        """An honest request on the session, with the next sequence: it must succeed."""
        req = self.prepare(goal, **inputs)
        resp = await self.send(req)
        assert resp.status_code == 200, resp.text
        return self.session.verify_result(req, resp.json()["result"])


async def open_env(
    server: AgentServer,
    url: str,
    http: httpx.AsyncClient,
    *,
    client: Identity | None = None,
    clock: Callable[[], float] = time.time,
) -> Env:
    """An ``Env`` on a running ``build_server`` server: a new session for ``client``."""
    client = client or identity("client")
    session = await raw_handshake(http, url, client, server.identity.did, clock=clock)
    audit = server._audit  # the AuditLog given to build_server
    assert isinstance(audit, AuditLog)
    return Env(server, url, http, client, session, audit, server.calls, clock)  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def serve_env(
    *,
    policy: Policy | None = None,
    limits: ServerLimits | None = None,
    clock: Callable[[], float] = time.time,
    client: Identity | None = None,
    **serve_options: Any,
) -> AsyncIterator[Env]:
    """Start a server, open one session with ``client`` over raw httpx; close all at the end."""
    server = build_server(policy=policy, limits=limits, clock=clock, audit=AuditLog())
    async with serve_app(server.app(), **serve_options) as url, httpx.AsyncClient(timeout=10) as http:
        yield await open_env(server, url, http, client=client, clock=clock)


async def read_body(receive: Callable[[], Any]) -> bytes:
    """The whole body of an ASGI request."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


def replaying(body: bytes) -> Callable[[], Any]:
    """An ASGI ``receive`` that gives ``body`` once (a body already read), then a disconnect."""
    given = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return given.pop() if given else {"type": "http.disconnect"}

    return receive
