"""The client's own HTTP/1.1 pool (``a2a_secure.client.pool``) against real sockets.

Each server here is a real asyncio TCP server on 127.0.0.1 that writes raw HTTP bytes, so a
test can answer in ways uvicorn never would (drip-fed, cut short, chunked, compressed,
closing a kept-alive connection) and count the connections the client opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import trustme

from a2a_secure.client.pool import ConnectionPool

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
# (connection number, request number on that connection, request body, writer) -> keep going?
Answer = Callable[[int, int, bytes, Writer], Awaitable[bool]]


class TooLarge(Exception):
    pass


def ok(body: bytes = b'{"ok":true}', *, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def read_request(reader: Reader) -> tuple[dict[bytes, bytes], bytes] | None:
    """One request's headers (lower-case names) and body; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"POST ")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers[b"content-length"]))
    return headers, body


class RawServer:
    """A TCP server answering each request with ``answer``; it records what it saw."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[int, dict[bytes, bytes], bytes]] = []
        self.url = ""

    async def handle(self, reader: Reader, writer: Writer) -> None:
        self.connections += 1
        conn = self.connections
        try:
            n = 0
            while (req := await read_request(reader)) is not None:
                n += 1
                headers, body = req
                self.requests.append((conn, headers, body))
                if not await self.answer(conn, n, body, writer):
                    break
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):  # the client left, or the test ended
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(answer: Answer, ssl_ctx: ssl.SSLContext | None = None) -> AsyncIterator[RawServer]:
    server = RawServer(answer)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=ssl_ctx)
    port = srv.sockets[0].getsockname()[1]
    server.url = f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port}/a2a/intent"
    try:
        yield server
    finally:
        srv.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(srv.wait_closed(), 1)


@contextlib.asynccontextmanager
async def pool(**kwargs: Any) -> AsyncIterator[ConnectionPool]:
    p = ConnectionPool(**{"timeout": 5.0, **kwargs})
    try:
        yield p
    finally:
        await p.aclose()


async def post(
    p: ConnectionPool, url: str, body: bytes = b'{"q":1}', limit: int = 1 << 20
) -> tuple[int, bytes, str | None]:
    return await p.post(url, body, limit=limit, too_large=TooLarge)


async def echo_ok(_conn: int, _n: int, body: bytes, writer: Writer) -> bool:
    writer.write(ok(body))
    return True


async def test_requests_share_one_kept_alive_connection_and_carry_exact_headers() -> None:
    async with raw_server(echo_ok) as server, pool() as p:
        for i in range(5):
            assert await post(p, server.url, b'{"i":%d}' % i) == (200, b'{"i":%d}' % i, None)
    assert server.connections == 1
    _conn, headers, _ = server.requests[0]
    host = server.url.split("/")[2].encode()
    assert headers == {
        b"host": host,
        b"content-type": b"application/json",
        b"accept": b"application/json",
        b"accept-encoding": b"identity",
        b"content-length": b"7",
    }


async def test_the_socket_has_nodelay() -> None:
    # Nagle's algorithm must not hold a small request back waiting for an ACK.
    async with raw_server(echo_ok) as server, pool() as p:
        await post(p, server.url)
        (conn,) = [c for idle in p._idle.values() for c in idle]
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


@pytest.mark.parametrize(
    "reply",
    [
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n',
        b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"a":1}'),
        ok(b'{"a":1}', extra=b"Content-Encoding: identity\r\n"),
    ],
    ids=["chunked", "informational-first", "identity-encoding"],
)
async def test_reply_framings_are_read_whole(reply: bytes) -> None:
    async def answer(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(reply)
        return True

    async with raw_server(answer) as server, pool() as p:
        assert await post(p, server.url) == (200, b'{"a":1}', None)
        assert await post(p, server.url) == (200, b'{"a":1}', None)
    assert server.connections == 1


async def test_retry_after_and_status_come_back() -> None:
    async def busy(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        body = b'{"busy":1}'
        writer.write(
            b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return True

    async with raw_server(busy) as server, pool() as p:
        assert await post(p, server.url) == (503, b'{"busy":1}', "7")


async def test_connection_close_reply_is_not_reused() -> None:
    async def closing(_c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(ok(body, extra=b"Connection: close\r\n"))
        return False

    async with raw_server(closing) as server, pool() as p:
        for _ in range(3):
            assert (await post(p, server.url))[0] == 200
    assert server.connections == 3


async def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def one_each(_c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(ok(body))  # keep-alive promised, then closed at once
        return False

    async with raw_server(one_each) as server, pool() as p:
        assert (await post(p, server.url))[0] == 200
        await asyncio.sleep(0.05)  # the EOF reaches the idle connection
        assert (await post(p, server.url))[0] == 200
    assert server.connections == 2
    assert len(server.requests) == 2  # the stale connection was never written to


async def test_a_request_on_a_stale_connection_is_sent_once_more_on_a_new_one() -> None:
    # The server drops the kept-alive connection as the second request arrives, without a
    # byte of reply: the pool sends it again on a new connection (the bytes are identical).
    async def drop_second(_c: int, n: int, body: bytes, writer: Writer) -> bool:
        if n == 2:
            return False
        writer.write(ok(body))
        return True

    async with raw_server(drop_second) as server, pool() as p:
        assert await post(p, server.url, b'{"n":1}') == (200, b'{"n":1}', None)
        assert await post(p, server.url, b'{"n":2}') == (200, b'{"n":2}', None)
    assert [(c, b) for c, _h, b in server.requests] == [(1, b'{"n":1}'), (1, b'{"n":2}'), (2, b'{"n":2}')]


async def test_a_new_connection_closed_without_a_reply_is_an_error_not_a_resend() -> None:
    async def drop(_c: int, _n: int, _b: bytes, _w: Writer) -> bool:
        return False

    async with raw_server(drop) as server, pool() as p:
        with pytest.raises(httpx.RemoteProtocolError):
            await post(p, server.url)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"cut',
        b"not http at all\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 * 1024),  # a head that never ends
    ],
    ids=["cut-short", "garbage", "two-lengths", "huge-head"],
)
async def test_a_broken_reply_is_a_protocol_error_and_the_connection_is_dropped(reply: bytes) -> None:
    async def broken(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(reply if c == 1 else ok(body))
        return c > 1

    async with raw_server(broken) as server, pool() as p:
        with pytest.raises(httpx.RemoteProtocolError):
            await post(p, server.url)
        assert (await post(p, server.url))[0] == 200
    assert server.connections == 2


async def test_a_compressed_reply_is_refused() -> None:
    async def gzipped(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(ok(b"\x1f\x8b\x08\x00", extra=b"Content-Encoding: gzip\r\n"))
        return True

    async with raw_server(gzipped) as server, pool() as p:
        with pytest.raises(httpx.DecodingError):
            await post(p, server.url)


async def test_a_reply_over_the_limit_raises_the_callers_error_and_drops_the_connection() -> None:
    async def big(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(ok(b"x" * 5000) if c == 1 else ok(body))
        return True

    async with raw_server(big) as server, pool() as p:
        with pytest.raises(TooLarge):
            await post(p, server.url, limit=4096)
        assert (await post(p, server.url, limit=4096))[0] == 200
    assert server.connections == 2


async def never_answers(_c: int, _n: int, _b: bytes, _w: Writer) -> bool:
    await asyncio.sleep(10)
    return False


async def drips(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
    # A byte every 50 ms never trips a per-read timeout of 300 ms; the whole exchange's does.
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        await asyncio.sleep(0.05)
        writer.write(b" ")
        await writer.drain()
    return False


@pytest.mark.parametrize("answer", [never_answers, drips], ids=["silent", "drip-fed"])
async def test_a_reply_not_whole_within_the_timeout_times_out(answer: Answer) -> None:
    async with raw_server(answer) as server, pool(timeout=0.3) as p:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await post(p, server.url)
        assert time.monotonic() - started < 2


async def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with pool() as p:
        with pytest.raises(httpx.ConnectError) as exc:
            await post(p, f"http://127.0.0.1:{port}/a2a/intent")
        assert isinstance(exc.value.__cause__, OSError)


async def test_a_cancelled_request_drops_its_connection() -> None:
    release = asyncio.Event()

    async def slow_first(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        if c == 1:
            await release.wait()
            writer.write(ok(b'{"late":1}'))  # must never be read as the next request's reply
            return True
        writer.write(ok(body))
        return True

    async with raw_server(slow_first) as server, pool() as p:
        task = asyncio.create_task(post(p, server.url, b'{"first":1}'))
        while not server.requests:  # noqa: ASYNC110 - the server records the request as it reads it
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        assert await post(p, server.url, b'{"second":1}') == (200, b'{"second":1}', None)
    assert server.connections == 2


async def test_requests_beyond_the_limit_wait_for_a_free_slot() -> None:
    gate = asyncio.Event()
    running = 0
    peak = 0

    async def gated(_c: int, _n: int, body: bytes, writer: Writer) -> bool:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1
        writer.write(ok(body))
        return True

    async with raw_server(gated) as server, pool(max_connections=2, timeout=5.0) as p:
        tasks = [asyncio.create_task(post(p, server.url, b'{"t":%d}' % i)) for i in range(5)]
        while len(server.requests) < 2:  # noqa: ASYNC110 - the server records requests as they come
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert len(server.requests) == 2  # the other three wait in the pool
        gate.set()
        replies = await asyncio.gather(*tasks)
    assert [r[1] for r in replies] == [b'{"t":%d}' % i for i in range(5)]
    assert peak == 2 and server.connections == 2


async def test_waiting_for_a_slot_times_out_as_a_pool_timeout() -> None:
    async with raw_server(never_answers) as server, pool(max_connections=1, timeout=5.0) as p:
        first = asyncio.create_task(post(p, server.url))  # holds the only slot
        while not server.requests:  # noqa: ASYNC110 - the server records the request as it reads it
            await asyncio.sleep(0.005)
        p.timeout = 0.2
        started = time.monotonic()
        with pytest.raises(httpx.PoolTimeout):
            await post(p, server.url)
        assert 0.15 < time.monotonic() - started < 2
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(server.requests) == 1


async def test_after_aclose_nothing_is_sent() -> None:
    async with raw_server(echo_ok) as server:
        p = ConnectionPool()
        assert (await post(p, server.url))[0] == 200
        await p.aclose()
        with pytest.raises(httpx.ConnectError):
            await post(p, server.url)
    assert len(server.requests) == 1


async def test_idle_connections_expire() -> None:
    async with raw_server(echo_ok) as server, pool(keepalive_expiry=0.05) as p:
        await post(p, server.url)
        await asyncio.sleep(0.1)
        await post(p, server.url)
        await post(p, server.url)
    assert server.connections == 2


async def test_only_http_and_https_urls() -> None:
    async with pool() as p:
        for url in ("ftp://127.0.0.1/x", "http:///nohost"):
            with pytest.raises(httpx.UnsupportedProtocol):
                await post(p, url)


# -- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


async def test_tls_with_a_trusted_certificate(ca: trustme.CA) -> None:
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with raw_server(echo_ok, server_context(ca)) as server, pool(verify=trusting) as p:
        assert await post(p, server.url, b'{"tls":1}') == (200, b'{"tls":1}', None)
        assert await post(p, server.url, b'{"tls":2}') == (200, b'{"tls":2}', None)
    assert server.connections == 1
    assert trusting.verify_mode is ssl.CERT_REQUIRED  # the caller's context was used, not altered


async def test_tls_with_an_untrusted_certificate_is_a_connect_error_caused_by_it(ca: trustme.CA) -> None:
    async with raw_server(echo_ok, server_context(ca)) as server, pool() as p:  # certifi's roots
        with pytest.raises(httpx.ConnectError) as exc:
            await post(p, server.url)
        assert isinstance(exc.value.__cause__, ssl.SSLCertVerificationError)
    assert server.requests == []


def test_the_pool_runs_on_uvloop() -> None:
    # uvloop (which uvicorn[standard] brings, and services often run) has transports of its
    # own classes: the same requests, kept-alive, plain and over TLS.
    uvloop = pytest.importorskip("uvloop")
    ca = trustme.CA()
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    async def main() -> tuple[int, int]:
        async with raw_server(echo_ok) as plain, raw_server(echo_ok, server_context(ca)) as tls:
            async with pool(verify=trusting) as p:
                for url in (plain.url, tls.url) * 3:
                    assert await post(p, url, b'{"uv":1}') == (200, b'{"uv":1}', None)
            return plain.connections, tls.connections

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == (1, 1)


async def test_extra_headers_are_sent_and_malformed_ones_refused() -> None:
    async with raw_server(echo_ok) as server, pool() as p:
        more = [(b"A2A-Version", b"1.0")]
        assert (await p.post(server.url, b"{}", limit=1024, too_large=TooLarge, headers=more))[0] == 200
        assert server.requests[0][1][b"a2a-version"] == b"1.0"
        for bad in ([(b"X", b"a\r\nInjected: 1")], [(b"Bad Name", b"v")]):
            with pytest.raises(httpx.LocalProtocolError):
                await p.post(server.url, b"{}", limit=1024, too_large=TooLarge, headers=bad)
        assert (await post(p, server.url))[0] == 200
    assert len(server.requests) == 2


async def test_bytes_sent_to_an_idle_connection_are_not_kept() -> None:
    # Whatever a server writes to a kept-alive connection between requests is not buffered:
    # the connection is dropped at once, and the next request goes on a new one.
    async def then_flood(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(ok(body))
        if c == 1:
            await writer.drain()
            await asyncio.sleep(0.05)  # the connection is idle in the pool by now
            with contextlib.suppress(ConnectionError):
                for _ in range(64):
                    writer.write(b"x" * 65536)
                    await writer.drain()
        return True

    async with raw_server(then_flood) as server, pool() as p:
        assert (await post(p, server.url))[0] == 200
        await asyncio.sleep(0.2)
        (first,) = [c for idle in p._idle.values() for c in idle]
        assert first.closed and first.h11.trailing_data[0] == b""  # dropped, nothing kept
        assert await post(p, server.url, b'{"after":1}') == (200, b'{"after":1}', None)
    assert server.connections == 2


def test_one_pool_across_successive_event_loops() -> None:
    # asyncio.run twice with the same client: the second loop does not get the first loop's
    # connections (nor its semaphore's waiters).
    p = ConnectionPool(timeout=5.0)

    async def once() -> tuple[int, int]:
        async with raw_server(echo_ok) as server:
            for _ in range(3):
                assert (await post(p, server.url))[0] == 200
            return server.connections, len(server.requests)

    assert asyncio.run(once()) == (1, 3)
    assert asyncio.run(once()) == (1, 3)
    asyncio.run(p.aclose())


async def test_a_host_name_is_resolved_and_named_in_the_host_header() -> None:
    async with raw_server(echo_ok) as server, pool() as p:
        url = server.url.replace("127.0.0.1", "localhost")
        assert await post(p, url, b'{"name":1}') == (200, b'{"name":1}', None)
        assert server.requests[0][1][b"host"] == url.split("/")[2].encode()


# -- streamed replies -----------------------------------------------------------------------------


def chunked_head(ctype: bytes = b"text/event-stream") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % ctype


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_a_stream_is_read_as_it_comes_and_its_connection_kept() -> None:
    go_on = asyncio.Event()

    async def events(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(chunked_head() + chunk(b"id: 0\n"))
        await writer.drain()
        await go_on.wait()  # the second part only once the client has the first
        writer.write(chunk(b"data: {}\n\n") + b"0\r\n\r\n")
        return True

    async with raw_server(events) as server, pool() as p:
        async with p.stream(server.url, b"{}") as reply:
            assert (reply.status, reply.content_type) == (200, "text/event-stream")
            parts = reply.chunks()
            assert await anext(parts) == b"id: 0\n"
            go_on.set()
            assert [c async for c in parts] == [b"data: {}\n\n"]
            assert reply.complete
        assert (await post(p, server.url))[0] == 200
    assert server.connections == 1
    assert server.requests[0][1][b"accept"] == b"text/event-stream, application/json"
    assert server.requests[1][1][b"accept"] == b"application/json"


async def test_a_stream_left_before_its_end_closes_its_connection() -> None:
    async def endless(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        if c > 1:
            writer.write(ok(body))
            return True
        writer.write(chunked_head())
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(chunk(b": keep-alive\n\n"))
                await writer.drain()
                await asyncio.sleep(0.01)
        return False

    async with raw_server(endless) as server, pool() as p:
        async with p.stream(server.url, b"{}") as reply:
            async for _ in reply.chunks():
                break
        assert not reply.complete
        assert (await post(p, server.url, b'{"next":1}')) == (200, b'{"next":1}', None)
    assert server.connections == 2


async def test_a_stream_may_outlast_the_timeout_while_bytes_keep_coming() -> None:
    async def slow_events(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(chunked_head())
        for i in range(8):  # 0.8 s in all, a part every 0.1 s
            await asyncio.sleep(0.1)
            writer.write(chunk(b"part %d\n" % i))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return True

    expected = b"".join(b"part %d\n" % i for i in range(8))
    async with (
        raw_server(slow_events) as server,
        pool(timeout=0.3) as p,
        p.stream(server.url, b"{}") as reply,
    ):
        assert b"".join([c async for c in reply.chunks()]) == expected


async def test_a_stream_that_falls_silent_times_out() -> None:
    async def stalls(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(chunked_head() + chunk(b"first\n"))
        await asyncio.sleep(10)
        return False

    async with raw_server(stalls) as server, pool(timeout=0.3) as p, p.stream(server.url, b"{}") as reply:
        parts = reply.chunks()
        assert await anext(parts) == b"first\n"
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await anext(parts)
        assert time.monotonic() - started < 2


async def test_a_stream_whose_head_never_comes_times_out() -> None:
    async with raw_server(never_answers) as server, pool(timeout=0.3) as p:
        with pytest.raises(httpx.ReadTimeout):
            async with p.stream(server.url, b"{}"):
                pytest.fail("no head came")


async def test_a_json_answer_to_a_streamed_request_is_read_whole() -> None:
    async def refuses(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        body = b'{"jsonrpc":"2.0","id":1,"error":{"code":-32050,"message":"busy"}}'
        writer.write(b"HTTP/1.1 503 x\r\nContent-Type: application/json\r\nRetry-After: 2\r\n")
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async with raw_server(refuses) as server, pool() as p:
        async with p.stream(server.url, b"{}") as reply:
            assert (reply.status, reply.content_type, reply.retry_after) == (503, "application/json", "2")
            assert b"".join([c async for c in reply.chunks()]).endswith(b'"busy"}}')
        assert (await post(p, server.url))[0] == 503
    assert server.connections == 1


async def test_a_compressed_stream_is_refused() -> None:
    async def gzipped(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        return True

    async with raw_server(gzipped) as server, pool() as p:
        with pytest.raises(httpx.DecodingError):
            async with p.stream(server.url, b"{}"):
                pytest.fail("an encoded stream was handed over")


async def test_a_stream_faster_than_its_reader_is_not_buffered() -> None:
    # The server sends 32 MiB as fast as it can while the reader is busy with the first
    # part: reading stops until the reader asks for more, so the bytes wait in the kernel.
    sent = 0

    async def flood(_c: int, _n: int, _b: bytes, writer: Writer) -> bool:
        nonlocal sent
        writer.write(chunked_head())
        part = chunk(b"x" * 65536)
        with contextlib.suppress(ConnectionError):
            for _ in range(512):
                writer.write(part)
                sent += len(part)
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        return False

    async with raw_server(flood) as server, pool() as p:
        async with p.stream(server.url, b"{}") as reply:
            parts = reply.chunks()
            assert len(await anext(parts)) > 0
            await asyncio.sleep(0.3)  # the reader is busy
            held = len(reply._conn.h11.trailing_data[0])
            assert held < 1 << 20, f"{held} bytes held for a busy reader"
            assert sent < 16 << 20  # the server was held back too
            total = sum([len(c) async for c in parts])
            assert reply.complete
        assert total > 30 << 20


def test_a_stream_faster_than_its_reader_is_not_buffered_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test_a_stream_faster_than_its_reader_is_not_buffered())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_server_that_closes_at_once_is_a_protocol_error(loop: str) -> None:
    # Accepted, then closed before the request could go out (or as it did): a clean
    # httpx error on either loop, never a loop-specific RuntimeError.
    factory = pytest.importorskip("uvloop").new_event_loop if loop == "uvloop" else asyncio.new_event_loop

    async def slam(reader: Reader, writer: Writer) -> None:
        writer.transport.abort()

    async def main() -> None:
        srv = await asyncio.start_server(slam, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/a2a/intent"
        try:
            async with pool() as p:
                for _ in range(20):
                    with pytest.raises(httpx.RemoteProtocolError):
                        await post(p, url)
        finally:
            srv.close()

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


# -- the common reply, read without h11 (client/http11.py) ------------------------------------------
@pytest.mark.parametrize(
    ("head", "taken"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2", True),
        (b"HTTP/1.1 503\r\nRetry-After: 7\r\ncontent-length:0", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2", False),
        (b"HTTP/1.1 100 Continue\r\nContent-Length: 2", False),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 0", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", False),
        (b"HTTP/1.1 200 OK\r\nContent-Type: x", False),  # no length
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: a\x01b", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nBad Name: x", False),
    ],
)
def test_only_the_common_reply_head_skips_h11(head: bytes, taken: bool) -> None:
    from a2a_secure.client.http11 import parse_head

    got = parse_head(head)
    assert (got is not None) is taken
    if got is not None:
        assert got.length in (0, 2) and got.status in (200, 503)


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded\r\n\r\n{}",
    ],
    ids=["nul-byte", "folded-line"],
)
async def test_a_head_the_shortcut_does_not_take_is_h11s_to_refuse(reply: bytes) -> None:
    async def odd(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(reply if c == 1 else ok(body))
        return c > 1

    async with raw_server(odd) as server, pool() as p:
        with pytest.raises(httpx.RemoteProtocolError):
            await post(p, server.url)
        assert (await post(p, server.url))[0] == 200
    assert server.connections == 2


async def test_bytes_after_a_whole_reply_drop_the_connection() -> None:
    async def chatty(_c: int, _n: int, body: bytes, writer: Writer) -> bool:
        writer.write(ok(body) + b"HTTP/1.1 200 OK\r\n")
        return True

    async with raw_server(chatty) as server, pool() as p:
        assert await post(p, server.url, b'{"n":1}') == (200, b'{"n":1}', None)
        assert await post(p, server.url, b'{"n":2}') == (200, b'{"n":2}', None)
    assert server.connections == 2


async def test_a_slot_waiter_that_gives_up_passes_its_turn_on() -> None:
    gate = asyncio.Event()

    async def gated(c: int, _n: int, body: bytes, writer: Writer) -> bool:
        if c == 1:
            await gate.wait()
        writer.write(ok(body))
        return True

    async with raw_server(gated) as server, pool(max_connections=1, timeout=5.0) as p:
        first = asyncio.create_task(post(p, server.url, b'{"t":1}'))  # holds the only slot
        while not server.requests:  # noqa: ASYNC110 - the server records the request as it reads it
            await asyncio.sleep(0.005)
        leaving = asyncio.create_task(post(p, server.url, b'{"t":2}'))
        staying = asyncio.create_task(post(p, server.url, b'{"t":3}'))
        await asyncio.sleep(0.02)
        leaving.cancel()  # gives up its place in the queue: the next one gets the slot
        gate.set()
        assert (await first)[1] == b'{"t":1}'
        assert (await staying)[1] == b'{"t":3}'
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert (await post(p, server.url, b'{"t":4}'))[1] == b'{"t":4}'  # no slot was lost
