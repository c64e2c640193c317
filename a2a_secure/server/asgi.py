"""The HTTP wire of the agent server: raw ASGI for the two protocol endpoints.

What :class:`~a2a_secure.server.app.AgentServer` needs to answer a request without
FastAPI's machinery on the hot path: the direct route to ``/a2a/handshake`` and
``/a2a/intent``, the body read with its size limit enforced while it arrives, the content
type of PROTOCOL.md §4, a JSON-RPC answer as its two ASGI messages, the event stream of
§6.4, and the JSON-RPC answers to paths and methods the app does not serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI
from fastapi.exception_handlers import http_exception_handler
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from a2a_secure.errors import (
    A2AError,
    HTTPMethodNotAllowed,
    InternalError,
    MethodNotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
    log_unexpected,
)
from a2a_secure.protocol.server import Reply
from a2a_secure.protocol.wire import (
    EnvelopeError,
    encode_error,
    encode_result,
    encode_result_json,
    read_request,
)

if TYPE_CHECKING:
    from a2a_secure.runtime.router import ServerProtocol

__all__ = [
    "AgentApp",
    "AsgiEndpoint",
    "content_type_ok",
    "http_error",
    "not_found",
    "receive_body",
    "reply_messages",
    "send_json",
    "send_stream",
    "serve_exchange",
]

_log = logging.getLogger("a2a_secure.server")

# RFC 9110 §8.3.1 and RFC 9110 §5.6.6: media-type = type "/" subtype parameters, where
# parameters = *( OWS ";" OWS [ parameter ] ) and parameter = token "=" ( token / quoted-string ).
_TCHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t !-~\x80-\xff])*"'
_PARAMETER = re.compile(rf"[ \t]*;[ \t]*(?:({_TCHARS})=({_TCHARS}|{_QUOTED}))?")
_ANY_PARAMETER = rf"[ \t]*;[ \t]*(?:{_TCHARS}=(?:{_TCHARS}|{_QUOTED}))?"
_MEDIA_TYPE = re.compile(rf"[ \t]*({_TCHARS})/({_TCHARS})((?:{_ANY_PARAMETER})*)[ \t]*")
_UNQUOTE = re.compile(r"\\(.)")
_JSON_TYPES = frozenset((b"application/json", b"application/json; charset=utf-8"))


class AsgiHandler(Protocol):
    """What serves the protocol endpoints: an :class:`~a2a_secure.server.app.AsgiHandler`."""

    def handle_asgi(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> Awaitable[None]: ...


_HOT_PATHS = {"/a2a/handshake": "handshake", "/a2a/intent": "intent"}
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class AsgiEndpoint:
    """A protocol endpoint as a raw ASGI app (used inside Starlette routing)."""

    def __init__(self, server: AsgiHandler, endpoint: str) -> None:
        self.server = server
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.server.handle_asgi(scope, receive, send, self.endpoint)


class AgentApp(FastAPI):
    """FastAPI with a direct path for the two protocol endpoints."""

    agent_server: AsgiHandler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not self.user_middleware:
            endpoint = _HOT_PATHS.get(scope["path"])
            if endpoint is not None:
                try:
                    await self.agent_server.handle_asgi(scope, receive, send, endpoint)
                except Exception as exc:
                    # handle_asgi answers every protocol failure itself; this is a bug's last
                    # line of defence: no stack trace on the wire (nothing if already started),
                    # and the bug logged by type and place for the operator.
                    log_unexpected(_log, "unanswered failure on a protocol endpoint", exc)
                    with contextlib.suppress(Exception):
                        body = encode_error(None, InternalError().to_error_object())
                        await send_json(send, 500, body)
                return
        await super().__call__(scope, receive, send)


async def receive_body(receive: Receive, limit: int, message: Message | None = None) -> bytes | None:
    """The request body, refused past ``limit`` bytes as it arrives; None on disconnect.

    ``message``: the first message, when the caller has received it already.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if message is None:
            message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                await linger(receive, limit)
                raise PayloadTooLarge()
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = None


async def linger(receive: Receive, budget: int, seconds: float = 1.0) -> None:
    # Discard a bounded amount of what the peer is still sending before the 413: closing a
    # socket with unread data makes the kernel reset it, and a client that overshot the
    # limit a little would then never read the answer (nginx's "lingering close"). The
    # bound keeps a flood from costing more than one more limit's worth, or a second.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while budget > 0:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return
                budget -= len(message.get("body", b""))


async def send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def reply_messages(request_id: Any, reply: Reply, close: bool) -> tuple[Message, Message]:
    """The two ASGI messages of a JSON answer: its start and its body."""
    if reply.error is not None:
        body = encode_error(request_id, reply.error)
    elif reply.result_json is not None:
        body = encode_result_json(request_id, reply.result_json)
    else:
        body = encode_result(request_id, reply.result)
    extra: list[tuple[bytes, bytes]] = []
    if reply.retry_after is not None:
        extra.append((b"retry-after", str(reply.retry_after).encode()))
    if close:
        extra.append((b"connection", b"close"))
    headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(body)), *extra]
    return (
        {"type": "http.response.start", "status": reply.http_status, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


async def send_stream(
    send: Send,
    request_id: Any,
    events: AsyncIterator[Mapping[str, Any]],
    abort: Callable[[int], AsyncIterator[Mapping[str, Any]]] | None = None,
) -> None:
    """Frame events as PROTOCOL.md §6.4 says: ``id: <index>`` LF ``data: <JSON>`` LF LF."""

    def frame(event: Mapping[str, Any]) -> bytes:
        if not event:  # keep-alive
            return b": keep-alive\n\n"
        return b"id: %d\ndata: %s\n\n" % (event["index"], encode_result(request_id, event))

    await send({"type": "http.response.start", "status": 200, "headers": list(_SSE_HEADERS)})
    next_index = 0
    try:
        async for event in events:
            await send({"type": "http.response.body", "body": frame(event), "more_body": True})
            if event:
                next_index = event["index"] + 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        return  # the client went away; the handler runs on (PROTOCOL.md §6.4)
    except asyncio.CancelledError:
        # The HTTP server is shutting down and gave up waiting for this stream: stop the
        # handler, and send the final -32603 event its pump signs (§6.4) before the
        # connection closes, if it comes within a moment.
        if abort is not None:
            rest = abort(next_index)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    async for event in rest:
                        await send({"type": "http.response.body", "body": frame(event), "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        raise
    finally:
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await closer()


def content_type_ok(value: bytes) -> bool:
    """Whether ``value`` is ``application/json``, bare or with ``charset=utf-8`` (PROTOCOL.md §4).

    Read as RFC 9110 says: type, subtype, parameter names and the charset value are
    case-insensitive, a parameter value may be a quoted-string (``charset="utf-8"`` is
    ``charset=utf-8``), whitespace around ``;`` is allowed. Any other parameter, a second
    charset or another charset is refused: the body is read as UTF-8 and nothing else.
    """
    if value in _JSON_TYPES:  # the common forms, without the parse
        return True
    match = _MEDIA_TYPE.fullmatch(value.decode("latin-1"))
    if match is None or match[1].lower() != "application" or match[2].lower() != "json":
        return False
    charsets = 0
    for name, raw in _PARAMETER.findall(match[3]):
        if not name:  # an empty parameter (a stray ";") is allowed by the grammar
            continue
        text = _UNQUOTE.sub(r"\1", raw[1:-1]) if raw.startswith('"') else raw
        if name.lower() != "charset" or text.lower() != "utf-8":
            return False
        charsets += 1
    return charsets <= 1


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """Any path the app does not serve: a JSON-RPC -32601 with HTTP 404, not a framework page."""
    if scope["type"] != "http":
        return
    error = MethodNotFound(f"no such endpoint: {scope['path'][:128]}")
    await send_json(send, error.http_status, encode_error(None, error.to_error_object()))


async def http_error(request: Request, exc: Exception) -> Response:
    """A path served for other HTTP methods: a JSON-RPC -32600 with HTTP 405 and ``Allow``."""
    assert isinstance(exc, HTTPException)
    if exc.status_code != HTTPMethodNotAllowed.http_status:
        return await http_exception_handler(request, exc)
    error = HTTPMethodNotAllowed(f"{request.method[:16]} is not served on {request.url.path[:128]}")
    body = encode_error(None, error.to_error_object())
    return Response(body, status_code=exc.status_code, headers=exc.headers, media_type="application/json")


async def serve_exchange(
    protocol: ServerProtocol, max_body: int, scope: Scope, receive: Receive, send: Send, endpoint: str
) -> None:
    """Serve one POST to ``/a2a/<endpoint>`` as a raw ASGI exchange.

    The two hot endpoints bypass Starlette's Request/Response objects (and, in the app
    from :meth:`app`, the middleware stack and routing): they cost as much as the
    signature work. The Content-Type is checked before the body is read, and the body
    limit is enforced while reading, whatever Content-Length claims (PROTOCOL.md §9).
    """
    close = False
    request_id: Any = None
    try:
        content_type: bytes | None = None
        declared: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"content-length":
                declared = value
        if content_type is None or not content_type_ok(content_type):
            raise UnsupportedMediaType()
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            raise PayloadTooLarge()
        # One message holds a small body: taken here without a coroutine of its own.
        message = await receive()
        body = message.get("body", b"")
        if message["type"] != "http.request" or message.get("more_body", False) or len(body) > max_body:
            body = await receive_body(receive, max_body, message)
        if body is None:
            return  # the client went away
        request_id, method, params = read_request(body, endpoint)
    except A2AError as exc:
        reply = protocol.reject(exc)
        # The body was not read to its end: end the connection, or the HTTP server would
        # go on reading whatever the peer still sends (ATTACKS.md H1).
        close = isinstance(exc, PayloadTooLarge | UnsupportedMediaType)
    except EnvelopeError as exc:
        reply = protocol.reject(exc.error, event=exc.event)
        request_id = exc.request_id
    else:
        client = scope.get("client")
        source = client[0] if client else ""
        pending = protocol.handle_now(method, params, source=source)
        reply = pending if isinstance(pending, Reply) else await pending
    if reply.stream is not None:
        await send_stream(send, request_id, reply.stream, reply.abort)
        return
    start, answer = reply_messages(request_id, reply, close)
    await send(start)
    await send(answer)
