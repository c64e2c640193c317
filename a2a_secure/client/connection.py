"""One connection of the client's HTTP/1.1 pool (:mod:`a2a_secure.client.pool`) and its reading.

:class:`Connection` is the asyncio protocol of one TCP (or TLS) connection: the event loop
reads into a buffer of its own and hands it the bytes; a reply is read without h11 when its
head is the common shape (:mod:`a2a_secure.client.http11`), else by h11. An exchange's
deadline is one timer per connection, moved from request to request. :class:`Origin` holds
the parts of each request to one URL that never change. Failures are mapped to httpx's
exceptions by :func:`failure`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

import h11
import httpx

from a2a_secure.client.http11 import FastHead, parse_head, request_head

__all__ = ["MAX_HEAD_BYTES", "ClosedEarly", "Connection", "Head", "Origin", "failure", "post_head"]

# What a reply's head may take (status line and headers); h11's own default is 16 KiB.
MAX_HEAD_BYTES = 64 * 1024


class Origin:
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


class Head:
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


# What one read of the socket takes at most: asyncio's own reads allocate 256 KiB for each.
_READ_SIZE = 64 * 1024


class Connection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection and its h11 state; the event loop feeds it bytes.

    The loop reads into one buffer of the connection's own (a read of the plain protocol
    allocates a 256 KiB object each time, which the allocator may map and unmap from the
    kernel on every reply). A waiting reader awaits a future set right where the bytes
    come in; the exchange's deadline is one timer per connection, moved rather than made
    anew for each request (:meth:`arm`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._loop = loop
        self._eof = False
        self._exchanging = False  # a request is out and its reply not yet read whole
        self._paused = False  # reading paused until the reader asks for more
        self._received = 0  # bytes received since the current request went out
        self._lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._read = memoryview(bytearray(_READ_SIZE))
        # The deadline of the current exchange (loop time; None: none) and its timer.
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        # A request written and its reply read without h11 (client/http11.py): the reply's
        # bytes gather here until its head and body are in, or are handed to h11.
        self._fast = False
        self._buf = bytearray()
        self._fast_head: FastHead | None = None  # the reply's head, once read
        self._body_at = 0  # where its body begins in the buffer
        self._limit = 0  # the most its body may hold
        self._h11_used = False  # h11 wrote a request or read a reply on this connection

    # -- protocol callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have write/abort.
        self.transport = cast("asyncio.Transport", transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read

    def buffer_updated(self, nbytes: int) -> None:
        if not self._exchanging:
            # Nothing is due on an idle connection: whatever comes is not kept (a server
            # could otherwise fill this process's memory through a kept-alive connection).
            self.close()
            return
        if not self._eof:
            self._received += nbytes
            if self._fast:
                self._buf += self._read[:nbytes]
                if self._waiter is not None and not self._answer_in():
                    return  # the rest of the reply is due: its reader waits on, reading goes on
            else:
                self.h11.receive_data(bytes(self._read[:nbytes]))
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

    def _answer_in(self) -> bool:
        """Whether :meth:`read_fast` has its answer: the reply whole, a head it refuses or
        does not take, or one too large (said as soon as the head is in)."""
        head = self._fast_head
        if head is None:
            buf = self._buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return len(buf) > MAX_HEAD_BYTES
            head = parse_head(bytes(buf[:end]))
            if head is None:
                return True
            self._fast_head = head
            self._body_at = end + 4
        return (
            len(self._buf) >= self._body_at + head.length
            or head.length > self._limit
            or head.content_encoding not in (b"", b"identity")
        )

    def _wake(self) -> bool:
        """Wake the reader waiting for bytes, if one is; whether one was."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._waiter = None
            waiter.set_result(None)
            return True
        return False

    # -- the deadline ----------------------------------------------------------------------
    def arm(self, seconds: float) -> None:
        """From now on, a wait for bytes past ``seconds`` from now raises ``TimeoutError``.

        The timer is not cancelled when the exchange ends in time: the next exchange moves
        the deadline, and the timer, when it fires early, waits again for the new one.
        """
        deadline = self._loop.time() + seconds
        self._deadline = deadline
        self._expired = False
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def disarm(self) -> None:
        """No deadline until the next :meth:`arm`."""
        self._deadline = None

    def _on_timer(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.closed:
            return
        if deadline > self._loop.time():
            self._timer = self._loop.call_at(deadline, self._on_timer)
            return
        self._expired = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._waiter = None
            waiter.set_exception(TimeoutError())

    def _wait(self) -> asyncio.Future[None]:
        """A future the loop sets when it hands this connection bytes (or their end)."""
        if self._expired:
            raise TimeoutError
        self._resume()
        waiter = self._waiter = self._loop.create_future()
        return waiter

    # -- use -------------------------------------------------------------------------------
    def reusable(self) -> bool:
        """Idle, open, and nothing received since the last reply (no EOF, no stray bytes)."""
        if self.closed or self._fast or self._eof:
            return False
        if not self._h11_used:  # only replies read without h11 (whose stray bytes close it)
            return True
        h = self.h11
        return h.our_state is h11.IDLE and h.their_state is h11.IDLE and h.trailing_data == (b"", False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def send(
        self, origin: Origin, body: bytes, accept: bytes, more_headers: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """Write one POST request whole (the loop sends it as the socket allows)."""
        assert self.transport is not None
        self._h11_used = True
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
            raise ClosedEarly(self._lost)
        self._received = 0
        self._exchanging = True
        self.transport.write(data)

    def send_fast(self, data: bytes, limit: int) -> None:
        """Write a request the pool wrote itself; its reply, whose body may hold at most
        ``limit`` bytes, is read by :meth:`read_fast`."""
        assert self.transport is not None
        if self.closed:  # lost between connecting (or being kept) and now: nothing was sent
            raise ClosedEarly(self._lost)
        self._received = 0
        self._exchanging = True
        self._fast = True
        self._fast_head = None
        self._limit = limit
        self.transport.write(data)

    def more(self) -> asyncio.Future[None]:
        """A future to await for more bytes of a reply read by :meth:`read_fast`."""
        if self._eof:
            if not self._received:
                raise ClosedEarly(self._lost)
            raise h11.RemoteProtocolError("reply cut short")
        return self._wait()

    def read_fast(self, limit: int, too_large: Callable[[], Exception]) -> tuple[FastHead, bytes] | bool:
        """The reply to :meth:`send_fast`, head and whole body, once it is all in; False
        until then (await :meth:`more` and ask again); True when its head is not the common
        shape (then h11 has it, and :meth:`head` and :meth:`read_all` read it)."""
        buf = self._buf
        head = self._fast_head
        if head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise h11.RemoteProtocolError("reply head larger than 64 KiB")
                return False
            head = parse_head(bytes(buf[:end]))
            if head is None:
                self._to_h11()
                return True
            self._fast_head = head
            self._body_at = end + 4
        if head.content_encoding not in (b"", b"identity"):
            raise httpx.DecodingError("reply has a content-encoding that was not asked for")
        if head.length > limit:
            raise too_large()
        start = self._body_at
        need = start + head.length
        if len(buf) < need:
            return False
        body = bytes(buf[start:need])
        stray = len(buf) > need
        buf.clear()
        self._fast_head = None
        self._fast = self._exchanging = False
        self._resume()  # idle: an EOF or stray bytes must be seen (and drop the connection)
        if stray or head.close:
            self.close()
        return head, body

    def _to_h11(self) -> None:
        """Hand the reply read so far to h11, as if h11 had written the request."""
        self._h11_used = True
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
                    raise ClosedEarly(self._lost) from None
                raise
            if event is not h11.NEED_DATA:
                if type(event) is h11.ConnectionClosed:  # h11 raises instead while a reply is due
                    raise ClosedEarly(self._lost)
                return event
            # After an EOF h11 never answers NEED_DATA: it raises (reply cut short).
            await self._wait()

    async def head(self) -> Head:
        """Read up to the reply's final head (1xx informational heads are skipped)."""
        while True:
            event = await self._event()
            if type(event) is h11.Response:
                return Head(event)
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


def post_head(origin: Origin, more: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The head of a POST for a JSON reply with ``more`` headers (None: one would not pass)."""
    return request_head(origin.target, [*origin.headers, (b"Accept", b"application/json"), *more])


class ClosedEarly(Exception):
    """The server closed the connection before the start of a reply."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__("server closed the connection without replying")
        self.cause = cause


def failure(conn: Connection, exc: BaseException, *, may_resend: bool = False) -> BaseException:
    """Close ``conn`` after ``exc`` (its state is unknown) and say what to raise: httpx's
    exception for it, chained as the cause demands, or ``exc`` itself.

    ``may_resend``: a close before any reply byte stays ``ClosedEarly``, for the caller to
    send the request again on a new connection; otherwise it too is a protocol error.
    """
    conn.close()  # whatever failed (cancelled, too large, encoded, ...), its state is unknown
    if isinstance(exc, ClosedEarly):
        if may_resend:
            return exc
        return _chained(httpx.RemoteProtocolError(str(exc)), exc.cause)
    if isinstance(exc, TimeoutError):
        return _chained(httpx.ReadTimeout("no complete reply within the timeout"), None)
    if isinstance(exc, h11.LocalProtocolError):  # a header the caller gave
        return _chained(httpx.LocalProtocolError(f"request refused: {exc}"), exc)
    if isinstance(exc, h11.ProtocolError):
        return _chained(httpx.RemoteProtocolError(f"malformed reply: {exc}"), exc)
    return exc


def _chained(exc: BaseException, cause: BaseException | None) -> BaseException:
    """``exc`` as ``raise exc from cause`` leaves it."""
    exc.__cause__ = cause
    exc.__suppress_context__ = True
    return exc
