"""Reading a reply off the wire: bounded bodies, JSON-RPC envelopes and the event stream (§6.4).

Pure parsing over an async iterator of byte chunks, shared by every call the client makes:
a whole reply is read with a bound (a hostile server must not exhaust the client's memory),
a streamed reply is split into events at LF only and each event's envelope is checked
before its signature is (:meth:`~a2a_secure.protocol.client_session.ClientSession.verify_event`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.jsonrpc import JSONRPC_VERSION

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_REPLY_BYTES",
    "event_result",
    "jsonrpc_error",
    "read_capped",
    "reply_too_large",
    "sse_events",
]

MAX_EVENT_BYTES = 1024 * 1024
# A reply carries the result twice (in ``result`` and inside ``response_jws``): a 1 MiB result
# makes a reply of about 2.4 MiB.
MAX_REPLY_BYTES = 4 * 1024 * 1024


def reply_too_large() -> A2AError:
    return AuthenticationFailed("reply too large")


async def read_capped(body: AsyncIterator[bytes], limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise reply_too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def jsonrpc_error(raw: bytes, rid: int) -> Any:
    try:
        obj = encoding.loads(raw)
    except A2AError:
        raise AuthenticationFailed("reply is not JSON") from None
    if not isinstance(obj, dict) or obj.get("jsonrpc") != JSONRPC_VERSION or obj.get("id") not in (rid, None):
        raise AuthenticationFailed("reply is not a JSON-RPC response to this request")
    if "error" not in obj:
        raise AuthenticationFailed("a streamed request was answered with a plain result")
    return obj["error"]


def event_result(data: bytes, rid: int) -> Any:
    try:
        obj = encoding.loads(data)
    except A2AError:
        raise AuthenticationFailed("event data is not JSON") from None
    if (
        not isinstance(obj, dict)
        or obj.keys() != {"jsonrpc", "id", "result"}
        or obj["jsonrpc"] != JSONRPC_VERSION
        or obj["id"] != rid
    ):
        raise AuthenticationFailed("event is not a JSON-RPC result for this request")
    return obj["result"]


async def _sse_lines(body: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream, split at LF only (§6.4).

    Not ``resp.aiter_lines()``: it also splits at U+2028, U+2029, U+0085 and the other
    ``str.splitlines`` separators, which a JSON string in an event may hold unescaped. A line
    longer than an event is refused while it is still being read.
    """
    buf = bytearray()
    async for chunk in body:
        scan = len(buf)
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", scan)) >= 0:
            yield _utf8(bytes(buf[start:end]))
            start = scan = end + 1
        del buf[:start]
        if len(buf) > MAX_EVENT_BYTES + 16:
            raise AuthenticationFailed("event larger than 1 MiB")
    if buf:
        yield _utf8(bytes(buf))


def _utf8(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("event stream is not UTF-8") from None


async def sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, bytes]]:
    """Events framed as ``id: N`` LF ``data: JSON`` LF LF; comment lines are skipped (§6.4)."""
    event_id: str | None = None
    data: bytes | None = None
    async for line in _sse_lines(body):
        if len(line) > MAX_EVENT_BYTES + 16:
            raise AuthenticationFailed("event larger than 1 MiB")
        if line == "":
            if event_id is None and data is None:
                continue
            if event_id is None or data is None:
                raise AuthenticationFailed("event without id or data")
            yield event_id, data
            event_id, data = None, None
        elif line.startswith(":"):
            continue
        elif line.startswith("id: ") and event_id is None and data is None:
            event_id = line[4:]
        elif line.startswith("data: ") and event_id is not None and data is None:
            data = line[6:].encode()
        else:
            raise AuthenticationFailed("unexpected line in the event stream")
    if event_id is not None or data is not None:
        raise AuthenticationFailed("stream ended inside an event")
