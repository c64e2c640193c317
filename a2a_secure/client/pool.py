"""A small HTTP/1.1 client for ``A2AClient``'s JSON-RPC calls: asyncio and h11, nothing else.

Every handshake step and every intent is one POST of a JSON body whose reply is read whole,
with a bound (``post``); a streamed intent is a POST whose reply is read as it comes
(``stream``). httpx's transport spends about 330 µs of CPU on such a call here (anyio cancel
scopes, httpcore's pool bookkeeping, the httpx models), more than checking the reply's
signature; this pool does the same exchange in about a third of that. The wire format is
h11's, the parser httpcore itself uses, so framing (Content-Length, chunked, keep-alive,
``Connection: close``, a reply cut short) is handled by the same code as before.

Failures raise the exception classes httpx raises (``httpx.ConnectError``,
``httpx.ReadTimeout``, ``httpx.RemoteProtocolError``, ...), chained to their cause (a TLS
certificate error stays reachable through ``__cause__``), so callers treat both alike.

Differences from httpx, on purpose:

* a whole exchange (sending the request and reading the entire reply) has one deadline,
  ``timeout``: a server that drips its reply a byte at a time cannot hold the caller longer
  (httpx applies the timeout to each read). A stream has that deadline up to the end of the
  reply's head, then ``timeout`` for each read (a stream may rightly last longer);
* a request that fails on a kept-alive connection before any byte of a reply arrived (the
  server closed the idle connection as the request went out) is sent once more on a new
  connection; every request this client sends may be resent byte for byte (PROTOCOL.md §6.1);
* no proxies, cookies, redirects or compression (``Accept-Encoding: identity``; an encoded
  reply is refused): ``A2AClient`` takes an ``httpx.AsyncClient`` for those.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx

from a2a_secure.client.connection import ClosedEarly, Connection, Head, Origin, failure, post_head
from a2a_secure.client.http11 import FastHead
from a2a_secure.client.pinning import DialPlan, open_connection
from a2a_secure.client.turns import Turns
from a2a_secure.system import mono_now

__all__ = ["ConnectionPool", "StreamReply"]

_JSON = b"application/json"
_EVENTS_OR_JSON = b"text/event-stream, application/json"


class StreamReply:
    """A reply being read as it comes: its head, then :meth:`chunks` of its body."""

    def __init__(self, conn: Connection, head: Head | FastHead, timeout: float) -> None:
        self.status = head.status
        self.content_type = head.content_type
        self.retry_after = head.retry_after
        self.complete = False  # the whole body was read
        self._conn = conn
        self._timeout = timeout

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; each read waits at most ``timeout``."""
        conn = self._conn
        while not self.complete:
            conn.arm(self._timeout)
            try:
                chunk = await conn.body_chunk()
            except BaseException as exc:
                raise failure(conn, exc)  # noqa: B904 - chained as failure says
            finally:
                conn.disarm()
            if chunk is None:
                self.complete = True
            elif chunk:
                yield chunk


class ConnectionPool:
    """Kept-alive connections per origin; ``post`` sends one body and returns the reply.

    ``max_connections`` bounds the requests in flight; at most ``max_idle`` connections per
    origin are kept, each for at most ``keepalive_expiry`` seconds of idleness (below
    uvicorn's default 5 s, so a connection is rarely reused just as the server drops it).
    ``plan``: the names to dial by a checked address (:class:`~a2a_secure.client.pinning.DialPlan`).
    """

    def __init__(
        self,
        *,
        verify: Any = True,
        timeout: float = 30.0,
        max_connections: int = 16,
        max_idle: int = 8,
        keepalive_expiry: float = 4.0,
        plan: DialPlan | None = None,
    ) -> None:
        self._plan = plan  # names dialled by a checked address (client/pinning.py)
        self.timeout = timeout
        self.keepalive_expiry = keepalive_expiry
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._max_idle = max_idle
        self._max_connections = max_connections
        self._slots = Turns(max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[bool, str, int], list[Connection]] = {}
        self._origins: dict[str, Origin] = {}
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            # The same trust as httpx given the same ``verify`` (certifi's roots by default).
            ctx = httpx.create_ssl_context(verify=self._verify)
            if not isinstance(self._verify, ssl.SSLContext):  # never alter a caller's context
                ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        return self._ssl

    def _origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            if len(self._origins) >= 256:
                self._origins.clear()
            origin = self._origins[url] = Origin(url)
        return origin

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        limit: int,
        too_large: Callable[[], Exception],
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> tuple[int, bytes, str | None]:
        """POST ``body`` to ``url``; (HTTP status, reply body, Retry-After header).

        A reply body over ``limit`` bytes raises ``too_large()`` (and the connection is
        dropped). Transport failures raise ``httpx.TransportError`` subclasses. ``headers``
        are sent after the pool's own (Host, Content-Type, Accept-Encoding, Accept) and
        before Content-Length; a malformed one is refused (``httpx.LocalProtocolError``),
        nothing sent.
        """
        origin = self._enter(url)
        if not self._slots.take_now():
            await self._wait_slot()
        try:
            conn, head, content = await self._begin(origin, body, _JSON, headers, (limit, too_large))
            self._put_idle(origin, conn)
            return head.status, content, head.retry_after
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def stream(
        self, url: str, body: bytes, *, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> AsyncIterator[StreamReply]:
        """POST ``body`` and hand over the reply once its head is in (``Accept`` names event
        streams and JSON). The connection is kept only if the body was read to its end."""
        origin = self._enter(url)
        if not self._slots.take_now():
            await self._wait_slot()
        try:
            conn, head, _ = await self._begin(origin, body, _EVENTS_OR_JSON, headers, None)
            reply = StreamReply(conn, head, self.timeout)
            try:
                yield reply
            finally:
                if reply.complete:
                    self._put_idle(origin, conn)
                else:
                    conn.close()
        finally:
            self._slots.release()

    async def _begin(
        self,
        origin: Origin,
        body: bytes,
        accept: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        whole: tuple[int, Callable[[], Exception]] | None,
    ) -> tuple[Connection, Head | FastHead, bytes]:
        """Send the request and read the reply's head within ``timeout``, and its body too
        when ``whole`` = (limit, too_large) is given; (connection, head, body or b"")."""
        for attempt in (1, 2):
            conn = self._take_idle(origin) or await self._connect(origin)
            conn.arm(self.timeout)  # sending and reading the head (and the body when whole)
            try:
                written = None
                if whole is not None:
                    written = origin.post_head if not headers else post_head(origin, headers)
                if whole is not None and written is not None:
                    conn.send_fast(b"%sContent-Length: %d\r\n\r\n%s" % (written, len(body), body), whole[0])
                    while (fast := conn.read_fast(*whole)) is False:
                        await conn.more()
                    if fast is not True:  # the common reply, read whole
                        return conn, fast[0], fast[1]
                else:
                    conn.send(origin, body, accept, headers)
                head = await conn.head()
                return conn, head, b"" if whole is None else await conn.read_all(*whole)
            except BaseException as exc:
                failed = failure(conn, exc, may_resend=True)
                if not isinstance(failed, ClosedEarly):
                    raise failed  # noqa: B904 - chained as failure() says
                if conn.reused and attempt == 1:
                    continue  # a stale kept-alive connection: once more on a new one
                raise httpx.RemoteProtocolError(str(failed)) from failed.cause
            finally:
                conn.disarm()
        raise AssertionError("unreachable")  # pragma: no cover

    def _enter(self, url: str) -> Origin:
        """Check the pool is open and on this loop; the origin of ``url``."""
        if self._closed:
            raise httpx.ConnectError("the client is closed")
        if asyncio.get_running_loop() is not self._loop:
            self._rebind()
        return self._origin(url)

    async def _wait_slot(self) -> None:
        """Wait for a request slot, at most ``timeout`` (``httpx.PoolTimeout``)."""
        try:
            async with asyncio.timeout(self.timeout):
                await self._slots.take()
        except TimeoutError:
            raise httpx.PoolTimeout("no connection free within the timeout") from None

    def _rebind(self) -> None:
        """First use, or use from another event loop than before (successive ``asyncio.run``):
        connections and waiters belong to their loop, so start afresh on this one."""
        self._loop = asyncio.get_running_loop()
        self._drop_idle()
        self._slots = Turns(self._max_connections)

    def _take_idle(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin.key)
        now = mono_now()
        while idle:
            conn = idle.pop()
            if conn.reusable() and now - conn.idle_since < self.keepalive_expiry:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _put_idle(self, origin: Origin, conn: Connection) -> None:
        idle = self._idle.setdefault(origin.key, [])
        if self._closed or not conn.reusable() or len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = mono_now()
        idle.append(conn)

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl_context() if origin.tls else None
        # A host with several addresses: try the next one after 250 ms rather than after the
        # whole timeout (RFC 8305, as httpx's anyio backend does). uvloop has no such option.
        extra: dict[str, Any] = (
            {"happy_eyeballs_delay": 0.25} if isinstance(loop, asyncio.BaseEventLoop) else {}
        )
        try:
            async with asyncio.timeout(self.timeout):
                conn = await open_connection(
                    loop, lambda: Connection(loop), origin.host, origin.port, tls, self._plan, **extra
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("connection not established within the timeout") from None
        except (OSError, ssl.SSLError) as exc:  # ssl.SSLCertVerificationError stays the cause
            raise httpx.ConnectError(f"cannot connect: {exc}") from exc
        return conn

    async def aclose(self) -> None:
        """Close every kept-alive connection; later calls fail."""
        self._closed = True
        self._drop_idle()

    def _drop_idle(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                with contextlib.suppress(RuntimeError):  # its loop may be closed
                    conn.close()
        self._idle.clear()
