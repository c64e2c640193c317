"""The client's transport: one JSON-RPC exchange, its byte-identical retries, and streams.

Every call the client makes goes on the wire here: a handshake step or an intent is one POST
whose reply is read whole (:meth:`Transport.call`), a streamed intent one whose reply is read
as events and resumed, when cut short, by sending the byte-identical request again
(:meth:`Transport.events`). A retry is always the byte-identical request, which the server
answers from its stored response, so an intent never runs twice under two sequence numbers.
Which failures are retried and for how long to wait are the core's rules
(:mod:`a2a_secure.protocol.client_decisions`); this module applies them and waits.

Without a given ``httpx.AsyncClient`` the exchanges go through the client's own small
HTTP/1.1 pool (:mod:`a2a_secure.client.pool`): the httpx layers (URL merging, cookie jar,
auth and redirect flows, hooks, anyio) do nothing for these calls and cost more than the
signature check of the reply. Both raise the same httpx exceptions, and every transport
failure leaves this module as an :class:`~a2a_secure.errors.A2AError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from a2a_secure.client.framing import (
    MAX_REPLY_BYTES,
    event_result,
    jsonrpc_error,
    read_capped,
    reply_too_large,
    sse_events,
)
from a2a_secure.client.pool import ConnectionPool, StreamReply
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InternalError,
    PeerUnreachable,
    Unavailable,
    error_for_code,
)
from a2a_secure.identity import encoding
from a2a_secure.jsonrpc import JSONRPC_VERSION
from a2a_secure.protocol.client_decisions import (
    Retry,
    backoff,
    gives_up,
    parse_retry_after,
    reply_retry,
    stream_reply_retried,
    transport_failure_retried,
)
from a2a_secure.protocol.client_session import ClientSession, PreparedRequest, StreamEvent
from a2a_secure.protocol.validate import json_equal
from a2a_secure.protocol.wire import encode_request, encode_request_json
from a2a_secure.telemetry import tracing

__all__ = ["RetryPolicy", "Transport"]


def _tls_verify_error(exc: BaseException) -> str | None:
    """The reason a TLS certificate did not verify, if that is what caused ``exc``."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return str(cause.verify_message or "certificate not trusted")[:200]
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class RetryPolicy:
    """Exponential backoff with full jitter, honouring ``Retry-After`` up to ``max_wait``."""

    def __init__(
        self, attempts: int = 3, base: float = 0.1, cap: float = 5.0, max_wait: float = 30.0
    ) -> None:
        self.attempts = attempts
        self.base = base
        self.cap = cap
        self.max_wait = max_wait

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        fraction = random.random()  # noqa: S311 - jitter, not security
        return backoff(attempt, retry_after, base=self.base, cap=self.cap, fraction=fraction)


class _Retryable(Exception):
    """Internal: a stream failure worth resuming with the byte-identical request."""

    def __init__(self, error: A2AError) -> None:
        super().__init__(error.message)
        self.error = error


_POST_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_STREAM_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}


class _HttpxStream:
    """An httpx streamed response seen as the pool's ``StreamReply``."""

    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self.content_type = resp.headers.get("content-type", "")
        self.retry_after = resp.headers.get("retry-after")
        self._resp = resp

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.aiter_bytes()


def _unreachable_reason(exc: httpx.RequestError) -> str:
    """A short cause for a person to act on; the exception text may hold addresses and errno noise."""
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        return "could not connect"
    return "connection failed"


_StreamReply = StreamReply | _HttpxStream


class Transport:
    """Sends the client's JSON-RPC requests and reads their replies (see the module doc).

    ``pool``: the client's own HTTP/1.1 pool, or None to go through ``http``.
    """

    def __init__(self, http: httpx.AsyncClient, pool: ConnectionPool | None, retry: RetryPolicy) -> None:
        self.http = http
        self.pool = pool
        self.retry = retry
        self._ids = itertools.count(1)

    async def aclose(self) -> None:
        """Close the pool (the httpx client is the caller's to close)."""
        if self.pool is not None:
            await self.pool.aclose()

    async def call(
        self,
        url: str,
        method: str,
        params: Mapping[str, Any],
        *,
        session: ClientSession | None = None,
        req: PreparedRequest | None = None,
    ) -> tuple[int, Any, Any, float | None]:
        """Send one JSON-RPC request, retried while the core's rules say so; returns (HTTP
        status, result, error, Retry-After). ``session`` and ``req``: the session a signed
        request ``req`` was signed on (a signed 500/504 is then final, an unsigned one not);
        the result of an intent's common answer then comes verified, as an ``IntentResult``
        (``ClientSession.verified_reply``), any other result as it came."""
        # One id and one body for all attempts: a retry is the byte-identical request.
        rid = next(self._ids)
        signed = session is not None and req is not None
        if req is not None and req.params_json is not None and params is req.params:
            body = encode_request_json(method, req.params_json, rid)
        else:
            body = encode_request(method, params, rid)
        attempt = 0
        while True:
            attempt += 1
            try:
                status, result, error, retry_after = await self._post(
                    url, body, rid, session if signed else None, req
                )
            except httpx.RequestError as exc:
                # Every transport failure becomes an A2AError (never a raw httpx/ssl error).
                # A certificate that does not verify will not verify on a retry either.
                tls = _tls_verify_error(exc)
                if not transport_failure_retried(
                    attempt, self.retry.attempts, certificate_refused=tls is not None
                ):
                    if tls is not None:
                        raise Unavailable(
                            f"TLS certificate verification failed: {tls}", retry_after=1
                        ) from None
                    reason = _unreachable_reason(exc)
                    raise PeerUnreachable(
                        f"{url} did not answer ({reason})", endpoint=url, reason=reason
                    ) from None
                tracing.event(
                    "a2a_secure.retry", {"a2a_secure.attempt": attempt + 1, "error.type": "transport"}
                )
                await asyncio.sleep(self.retry.delay(attempt, None))
                continue
            if error is None:
                return status, result, error, retry_after
            verdict = reply_retry(
                status,
                is_error=True,
                retry_after=retry_after,
                max_wait=self.retry.max_wait,
                signed_request=signed,
            )
            retryable = verdict is Retry.YES
            if verdict is Retry.UNLESS_SIGNED and session is not None and req is not None:
                retryable = not session.error_from_reply(req, error).signed
            if not retryable or gives_up(attempt, self.retry.attempts):
                return status, result, error, retry_after
            tracing.event(
                "a2a_secure.retry", {"a2a_secure.attempt": attempt + 1, "http.response.status_code": status}
            )
            await asyncio.sleep(self.retry.delay(attempt, retry_after))

    async def _post(
        self,
        url: str,
        body: bytes,
        rid: int,
        session: ClientSession | None = None,
        req: PreparedRequest | None = None,
    ) -> tuple[int, Any, Any, float | None]:
        """One JSON-RPC call; returns (HTTP status, result, error, Retry-After)."""
        trace = tracing.trace_headers()  # traceparent/tracestate of the current span, if any
        if self.pool is not None:
            # Without a given httpx client the call goes through the client's own small
            # HTTP/1.1 pool (client/pool.py): the httpx layers (URL merging, cookie jar, auth
            # and redirect flows, hooks, anyio) do nothing for these calls and cost more than
            # the signature check of the reply. It raises the same httpx exceptions.
            status, content, retry_header = await self.pool.post(
                url, body, limit=MAX_REPLY_BYTES, too_large=reply_too_large, headers=trace
            )
        else:
            status, content, retry_header = await self._exchange(url, body, trace)
        if status == 200 and session is not None and req is not None:
            verified = session.verified_reply(req, rid, content)
            if verified is not None:
                return status, verified, None, None
        retry_after = parse_retry_after(retry_header)
        try:
            obj = encoding.loads(content)
        except A2AError:
            raise InternalError(f"HTTP {status} with a body that is not JSON") from None
        if (
            not isinstance(obj, dict)
            or obj.get("jsonrpc") != JSONRPC_VERSION
            or obj.get("id") not in (rid, None)
        ):
            raise AuthenticationFailed("reply is not a JSON-RPC response to this request")
        if "error" in obj:
            return status, None, obj["error"], retry_after
        if status != 200 or "result" not in obj or obj.get("id") != rid:
            raise AuthenticationFailed("malformed JSON-RPC result")
        return status, obj["result"], None, retry_after

    async def _exchange(
        self, url: str, body: bytes, trace: Sequence[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, str | None]:
        """POST ``body`` through the given httpx client; (HTTP status, reply body, Retry-After
        header). The reply is read with a bound: a hostile server must not exhaust the
        client's memory."""
        headers = {**_POST_HEADERS, **{k.decode(): v.decode() for k, v in trace}}
        async with self.http.stream("POST", url, content=body, headers=headers) as resp:
            content = await read_capped(resp.aiter_bytes(), MAX_REPLY_BYTES)
        return resp.status_code, content, resp.headers.get("retry-after")

    @contextlib.asynccontextmanager
    async def _open_stream(
        self, url: str, body: bytes, trace: Sequence[tuple[bytes, bytes]] = ()
    ) -> AsyncIterator[_StreamReply]:
        """POST a streamed request; the reply as it comes, through the pool or the given client."""
        if self.pool is not None:
            async with self.pool.stream(url, body, headers=trace) as reply:
                yield reply
            return
        headers = {**_STREAM_HEADERS, **{k.decode(): v.decode() for k, v in trace}}
        async with self.http.stream("POST", url, content=body, headers=headers) as resp:
            yield _HttpxStream(resp)

    @staticmethod
    @staticmethod
    def plain_error(error: Any) -> A2AError:
        """The SDK error for an unsigned JSON-RPC ``error`` (a handshake step's answer)."""
        if (
            isinstance(error, dict)
            and type(error.get("code")) is int
            and isinstance(error.get("message"), str)
        ):
            data = error.get("data") if isinstance(error.get("data"), dict) else None
            return error_for_code(error["code"], error["message"][:512], data)
        return AuthenticationFailed("malformed error reply")

    async def events(
        self,
        url: str,
        session: ClientSession,
        req: PreparedRequest,
        trace: tracing.ClientTrace | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Send the streamed request ``req`` and yield its verified events (§6.4), resuming a
        stream cut short with the byte-identical request and skipping the events replayed."""
        rid = next(self._ids)
        if req.params_json is not None:
            body = encode_request_json("intent", req.params_json, rid)
        else:
            body = encode_request("intent", req.params, rid)
        held: list[Any] = []  # the raw ``result`` objects of the events received so far
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            replayed = 0  # events of this attempt that replayed ones already held, in order
            held_before = len(held)  # a replay comes first: only these events can be replayed
            try:
                async with self._open_stream(url, body, trace.headers if trace is not None else ()) as resp:
                    ctype = resp.content_type.split(";")[0].strip().lower()
                    if ctype != "text/event-stream":
                        raw = await read_capped(resp.chunks(), MAX_REPLY_BYTES)
                        retry_after = parse_retry_after(resp.retry_after)
                        error = jsonrpc_error(raw, rid)
                        exc = session.error_from_reply(req, error)
                        if stream_reply_retried(resp.status, signed=exc.signed):
                            raise _Retryable(exc)
                        raise exc
                    async for event_id, data in sse_events(resp.chunks()):
                        if held and held[-1].get("final") is True:
                            raise AuthenticationFailed("data after the final event")
                        index = len(held)
                        result = event_result(data, rid)
                        if event_id != str(result.get("index") if isinstance(result, dict) else None):
                            raise AuthenticationFailed("event id does not match its index")
                        got_index = result.get("index") if isinstance(result, dict) else None
                        if type(got_index) is int and got_index < index:
                            # Only a resumed stream replays, from index 0 and in order: each event
                            # is identical to the one held, or a signed final error (the server no
                            # longer has it). Anything else (a duplicate on a first attempt, say)
                            # is a forgery.
                            if attempt == 1 or got_index != replayed or len(held) != held_before:
                                raise AuthenticationFailed(f"event {got_index} duplicated or out of order")
                            replayed += 1
                            if json_equal(result, held[got_index]):
                                continue
                            ev = session.verify_event(req, result, got_index, check_fresh=False)
                            if ev.error is not None and ev.final:
                                raise ev.error
                            raise AuthenticationFailed("a replayed event differs from the one received")
                        ev = session.verify_event(req, result, index)
                        held.append(result)
                        if ev.error is not None:
                            raise ev.error
                        yield ev
                    if not held or held[-1].get("final") is not True:
                        raise _Retryable(AuthenticationFailed("stream ended before its final event"))
                    return
            except httpx.RequestError:
                failure: A2AError = Unavailable("stream interrupted", retry_after=1)
            except _Retryable as wrapped:
                failure = wrapped.error
            if gives_up(attempt, self.retry.attempts, retry_after, self.retry.max_wait):
                raise failure
            if trace is not None:  # resumed with the byte-identical request (§6.4)
                trace.event(
                    "a2a_secure.retry",
                    {"a2a_secure.attempt": attempt + 1, "a2a_secure.events_held": len(held)},
                )
            await asyncio.sleep(self.retry.delay(attempt, retry_after))
