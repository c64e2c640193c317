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
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, cast

import h11
import httpx

from a2a_secure.client.http11 import FastHead, parse_head, request_head
from a2a_secure.client.pinning import DialPlan, open_connection
from a2a_secure.system import mono_now

__all__ = ["ConnectionPool", "StreamReply"]

# What a reply's head may take (status line and headers); h11's own default is 16 KiB.
MAX_HEAD_BYTES = 64 * 1024


class _Origin:
    """Where a URL's requests go, and the parts of each request that never change."""

    __slots__ = ("headers", "host", "key", "port", "post_head", "target", "tls")

    def __init__(self, url: str) -> None:
        u = httpx.URL(url)  # the same parsing (IDNA, percent-encoding) as httpx's
        if u.scheme not in ("http", "https") or not u.raw_host:
            raise httpx.UnsupportedProtocol(f"cannot send to {url!r}")
        self.tls = u.scheme == "https"
        self.host = u.raw_host.decode("ascii")
        self.port = u.port or (443 if self.tls else 80)
        self.target = u.raw_path
        self.key = (self.tls, self.host, self.port)
        self.headers = [
            (b"Host", u.netloc),
            (b"Content-Type", b"application/json"),
            # No compressed reply to inflate (so no decompression bomb); one that comes
            # compressed anyway is refused.
            (b"Accept-Encoding", b"identity"),
        ]
        # The head of a POST for a JSON reply, written once (see client/http11.py).
        self.post_head = request_head(self.target, [*self.headers, (b"Accept", b"application/json")])


_JSON = b"application/json"
_EVENTS_OR_JSON = b"text/event-stream, application/json"


class _Head:
    """The head of a reply: its status and the headers the client acts on."""

    __slots__ = ("content_type", "retry_after", "status")

    def __init__(self, event: h11.Response) -> None:
        self.status = event.status_code
        self.retry_after: str | None = None
        self.content_type = ""
        for name, value in event.headers:
            if name == b"retry-after":
                self.retry_after = value.decode("latin-1")
            elif name == b"content-type":
                self.content_type = value.decode("latin-1")
            elif name == b"content-encoding" and value.lower() != b"identity":
                raise httpx.DecodingError("reply has a content-encoding that was not asked for")


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and its h11 state; the event loop feeds it bytes."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._eof = False
        self._exchanging = False  # a request is out and its reply not yet read whole
        self._paused = False  # reading paused until the reader asks for more
        self._received = 0  # bytes received since the current request went out
        self._lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        # A request written and its reply read without h11 (client/http11.py): the reply's
        # bytes gather here until its head and body are in, or are handed to h11.
        self._fast = False
        self._buf = bytearray()

    # -- protocol callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have write/abort.
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        if not self._exchanging:
            # Nothing is due on an idle connection: whatever comes is not kept (a server
            # could otherwise fill this process's memory through a kept-alive connection).
            self.close()
            return
        if not self._eof:
            self._received += len(data)
            if self._fast:
                self._buf += data
            else:
                self.h11.receive_data(data)
        if not self._wake() and not self._paused:
            # Nobody is waiting for these bytes (a stream's reader is busy with the last
            # ones): read no more until it asks, or a fast server would fill this process's
            # memory; the kernel's buffers then hold the server back.
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if not self.closed:
                self.transport.resume_reading()  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        self._end_of_data()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = exc
        self._end_of_data()

    def _end_of_data(self) -> None:
        if not self._eof:
            self._eof = True
            if not self._fast:
                self.h11.receive_data(b"")
        self._wake()

    def _wake(self) -> bool:
        """Wake the reader waiting for bytes, if one is; whether one was."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
            return True
        return False

    # -- use -------------------------------------------------------------------------------
    def reusable(self) -> bool:
        """Idle, open, and nothing received since the last reply (no EOF, no stray bytes)."""
        h = self.h11
        return (
            not self.closed
            and h.our_state is h11.IDLE
            and h.their_state is h11.IDLE
            and h.trailing_data == (b"", False)
            and not self._fast
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()

    def send(
        self, origin: _Origin, body: bytes, accept: bytes, more_headers: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """Write one POST request whole (the loop sends it as the socket allows)."""
        assert self.transport is not None
        h = self.h11
        headers = [
            *origin.headers,
            (b"Accept", accept),
            *more_headers,
            (b"Content-Length", str(len(body)).encode()),
        ]
        data = (
            h.send(h11.Request(method="POST", target=origin.target, headers=headers))
            + h.send(h11.Data(data=body))
            + h.send(h11.EndOfMessage())
        )
        if self.closed:  # lost between connecting (or being kept) and now: nothing was sent
            raise _ClosedEarly(self._lost)
        self._received = 0
        self._exchanging = True
        self.transport.write(data)

    def send_fast(self, data: bytes) -> None:
        """Write a request the pool wrote itself; its reply is read by :meth:`read_fast`."""
        assert self.transport is not None
        if self.closed:  # lost between connecting (or being kept) and now: nothing was sent
            raise _ClosedEarly(self._lost)
        self._received = 0
        self._exchanging = True
        self._fast = True
        self.transport.write(data)

    async def _more(self) -> None:
        """Wait for more bytes of a reply read by :meth:`read_fast`."""
        if self._eof:
            if not self._received:
                raise _ClosedEarly(self._lost)
            raise h11.RemoteProtocolError("reply cut short")
        await self._bytes()

    async def _bytes(self) -> None:
        """Wait until the loop hands this connection bytes (or its end)."""
        self._resume()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def read_fast(
        self, limit: int, too_large: Callable[[], Exception]
    ) -> tuple[FastHead, bytes] | None:
        """The reply to :meth:`send_fast`, head and whole body; None when its head is not the
        common shape (then h11 has it, and :meth:`head` and :meth:`read_all` read it)."""
        buf = self._buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise h11.RemoteProtocolError("reply head larger than 64 KiB")
            await self._more()
        head = parse_head(bytes(buf[:end]))
        if head is None:
            self._to_h11()
            return None
        if head.content_encoding not in (b"", b"identity"):
            raise httpx.DecodingError("reply has a content-encoding that was not asked for")
        if head.length > limit:
            raise too_large()
        need = end + 4 + head.length
        while len(buf) < need:
            await self._more()
        body = bytes(buf[end + 4 : need])
        stray = len(buf) > need
        buf.clear()
        self._fast = self._exchanging = False
        self._resume()  # idle: an EOF or stray bytes must be seen (and drop the connection)
        if stray or head.close:
            self.close()
        return head, body

    def _to_h11(self) -> None:
        """Hand the reply read so far to h11, as if h11 had written the request."""
        h = self.h11
        h.send(h11.Request(method="POST", target=b"/", headers=[(b"Host", b"x"), (b"Content-Length", b"0")]))
        h.send(h11.EndOfMessage())
        self._fast = False
        data = bytes(self._buf)
        self._buf.clear()
        h.receive_data(data)
        if self._eof:
            h.receive_data(b"")

    async def _event(self) -> Any:
        """The reply's next h11 event, waiting for bytes as needed."""
        h = self.h11
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError:
                if self._eof and not self._received:
                    raise _ClosedEarly(self._lost) from None
                raise
            if event is not h11.NEED_DATA:
                if type(event) is h11.ConnectionClosed:  # h11 raises instead while a reply is due
                    raise _ClosedEarly(self._lost)
                return event
            # After an EOF h11 never answers NEED_DATA: it raises (reply cut short).
            await self._bytes()

    async def head(self) -> _Head:
        """Read up to the reply's final head (1xx informational heads are skipped)."""
        while True:
            event = await self._event()
            if type(event) is h11.Response:
                return _Head(event)
            if type(event) is not h11.InformationalResponse:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} before the reply")

    async def body_chunk(self) -> bytes | None:
        """The reply body's next bytes; None at its end (the connection may then be reused)."""
        event = await self._event()
        if type(event) is h11.Data:
            return bytes(event.data)
        if type(event) is not h11.EndOfMessage:  # h11 yields nothing else after a Response
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in the reply body")
        self._exchanging = False
        self._resume()  # idle: an EOF or stray bytes must be seen (and drop the connection)
        h = self.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
        return None

    async def read_all(self, limit: int, too_large: Callable[[], Exception]) -> bytes:
        """The whole reply body; ``too_large()`` is raised past ``limit`` bytes."""
        chunks: list[bytes] = []
        size = 0
        while (chunk := await self.body_chunk()) is not None:
            size += len(chunk)
            if size > limit:
                raise too_large()
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _post_head(origin: _Origin, more: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    return request_head(origin.target, [*origin.headers, (b"Accept", _JSON), *more])


class _ClosedEarly(Exception):
    """The server closed the connection before the start of a reply."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__("server closed the connection without replying")
        self.cause = cause


@contextlib.contextmanager
def _failures(conn: _Connection, *, may_resend: bool = False) -> Iterator[None]:
    """Close ``conn`` on any failure (its state is unknown) and raise httpx's exceptions.

    ``may_resend``: a close before any reply byte stays ``_ClosedEarly``, for the caller to
    send the request again on a new connection; otherwise it too is a protocol error.
    """
    try:
        yield
    except BaseException as exc:
        conn.close()  # whatever failed (cancelled, too large, encoded, ...), its state is unknown
        if isinstance(exc, _ClosedEarly):
            if may_resend:
                raise
            raise httpx.RemoteProtocolError(str(exc)) from exc.cause
        if isinstance(exc, TimeoutError):
            raise httpx.ReadTimeout("no complete reply within the timeout") from None
        if isinstance(exc, h11.LocalProtocolError):  # a header the caller gave
            raise httpx.LocalProtocolError(f"request refused: {exc}") from exc
        if isinstance(exc, h11.ProtocolError):
            raise httpx.RemoteProtocolError(f"malformed reply: {exc}") from exc
        raise


class StreamReply:
    """A reply being read as it comes: its head, then :meth:`chunks` of its body."""

    def __init__(self, conn: _Connection, head: _Head | FastHead, timeout: float) -> None:
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
            with _failures(conn):
                async with asyncio.timeout(self._timeout):
                    chunk = await conn.body_chunk()
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
        self._slots = asyncio.Semaphore(max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[bool, str, int], list[_Connection]] = {}
        self._origins: dict[str, _Origin] = {}
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            # The same trust as httpx given the same ``verify`` (certifi's roots by default).
            ctx = httpx.create_ssl_context(verify=self._verify)
            if not isinstance(self._verify, ssl.SSLContext):  # never alter a caller's context
                ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        return self._ssl

    def _origin(self, url: str) -> _Origin:
        origin = self._origins.get(url)
        if origin is None:
            if len(self._origins) >= 256:
                self._origins.clear()
            origin = self._origins[url] = _Origin(url)
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
        origin = await self._enter(url)
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
        origin = await self._enter(url)
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
        origin: _Origin,
        body: bytes,
        accept: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        whole: tuple[int, Callable[[], Exception]] | None,
    ) -> tuple[_Connection, _Head | FastHead, bytes]:
        """Send the request and read the reply's head within ``timeout``, and its body too
        when ``whole`` = (limit, too_large) is given; (connection, head, body or b"")."""
        for attempt in (1, 2):
            conn = self._take_idle(origin) or await self._connect(origin)
            try:
                with _failures(conn, may_resend=True):
                    async with asyncio.timeout(self.timeout):
                        fast: tuple[FastHead, bytes] | None = None
                        head: _Head | FastHead
                        if whole is not None:
                            written = origin.post_head if not headers else _post_head(origin, headers)
                            if written is not None:
                                conn.send_fast(b"%sContent-Length: %d\r\n\r\n%s" % (written, len(body), body))
                                fast = await conn.read_fast(*whole)
                            else:
                                conn.send(origin, body, accept, headers)
                        else:
                            conn.send(origin, body, accept, headers)
                        if fast is not None:
                            head, content = fast
                        else:
                            head = await conn.head()
                            content = b"" if whole is None else await conn.read_all(*whole)
            except _ClosedEarly as exc:
                if conn.reused and attempt == 1:
                    continue  # a stale kept-alive connection: once more on a new one
                raise httpx.RemoteProtocolError(str(exc)) from exc.cause
            return conn, head, content
        raise AssertionError("unreachable")  # pragma: no cover

    async def _enter(self, url: str) -> _Origin:
        """Check the pool is open and on this loop, and take a slot; the origin of ``url``."""
        if self._closed:
            raise httpx.ConnectError("the client is closed")
        if asyncio.get_running_loop() is not self._loop:
            self._rebind()
        origin = self._origin(url)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no connection free within the timeout") from None
        else:
            await self._slots.acquire()  # free: returns at once
        return origin

    def _rebind(self) -> None:
        """First use, or use from another event loop than before (successive ``asyncio.run``):
        connections and waiters belong to their loop, so start afresh on this one."""
        self._loop = asyncio.get_running_loop()
        self._drop_idle()
        self._slots = asyncio.Semaphore(self._max_connections)

    def _take_idle(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin.key)
        now = mono_now()
        while idle:
            conn = idle.pop()
            if conn.reusable() and now - conn.idle_since < self.keepalive_expiry:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _put_idle(self, origin: _Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin.key, [])
        if self._closed or not conn.reusable() or len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = mono_now()
        idle.append(conn)

    async def _connect(self, origin: _Origin) -> _Connection:
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
                    loop, _Connection, origin.host, origin.port, tls, self._plan, **extra
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
