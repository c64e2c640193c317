"""The HTTP adapter of the client side: httpx around ``ClientHandshake``/``ClientSession``.

It resolves the server's DID once per handshake, drives the four-step handshake, sends
signed requests and verifies every answer through the core. A retry re-sends the
byte-identical request, which the server answers from its stored response, so an intent is
never run twice under two sequence numbers. What to retry, when to re-handshake, when to
name an ``intent_id``, which extension members to send: the rules are
:mod:`a2a_secure.protocol.client_decisions`; this module sends, waits and applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import socket
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx

from a2a_secure.client.endpoint import check_endpoint
from a2a_secure.client.extensions import learn_extensions
from a2a_secure.client.pool import ConnectionPool, StreamReply
from a2a_secure.delegation import DELEGATION, Chain
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InternalError,
    InvalidParams,
    PeerUnreachable,
    PolicyViolation,
    SessionUnknown,
    Unavailable,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import AddressPolicy
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.jsonrpc import JSONRPC_VERSION
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import (
    ClientHandshake,
    ClientSession,
    IntentResult,
    PreparedRequest,
    StreamEvent,
)
from a2a_secure.protocol.client_decisions import (
    IdNeed,
    PeerState,
    Retry,
    backoff,
    chain_unknown,
    gives_up,
    ids_full_pause,
    intent_id_need,
    parse_retry_after,
    reply_retry,
    resend_after_session_unknown,
    seal,
    send_close,
    stream_reply_retried,
    transport_failure_retried,
    undeclared,
)
from a2a_secure.protocol.intent_id import INTENT_ID, check_intent_id, new_intent_id
from a2a_secure.protocol.priority import EXTENSION as PRIORITY
from a2a_secure.protocol.priority import with_priority
from a2a_secure.protocol.server import AuditHook
from a2a_secure.protocol.validate import json_equal
from a2a_secure.protocol.wire import encode_request
from a2a_secure.telemetry import tracing

__all__ = ["A2AClient", "RetryPolicy", "check_endpoint"]

_log = logging.getLogger("a2a_secure.client")

MAX_TIMEOUT = 30.0


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


_StreamReply = StreamReply | _HttpxStream
MAX_EVENT_BYTES = 1024 * 1024
# A reply carries the result twice (in ``result`` and inside ``response_jws``): a 1 MiB result
# makes a reply of about 2.4 MiB.
MAX_REPLY_BYTES = 4 * 1024 * 1024


def _reply_too_large() -> A2AError:
    return AuthenticationFailed("reply too large")


async def _read_capped(body: AsyncIterator[bytes], limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise _reply_too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _unreachable_reason(exc: httpx.RequestError) -> str:
    """A short cause for a person to act on; the exception text may hold addresses and errno noise."""
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        return "could not connect"
    return "connection failed"


def _jsonrpc_error(raw: bytes, rid: int) -> Any:
    try:
        obj = encoding.loads(raw)
    except A2AError:
        raise AuthenticationFailed("reply is not JSON") from None
    if not isinstance(obj, dict) or obj.get("jsonrpc") != JSONRPC_VERSION or obj.get("id") not in (rid, None):
        raise AuthenticationFailed("reply is not a JSON-RPC response to this request")
    if "error" not in obj:
        raise AuthenticationFailed("a streamed request was answered with a plain result")
    return obj["error"]


def _event_result(data: bytes, rid: int) -> Any:
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


async def _sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, bytes]]:
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


class _Peer(PeerState):
    """One server: its endpoint and its open session, with a lock keeping sequences ordered;
    what the client knows of it (extensions, chains sent, the intent_id pause) is the core's
    :class:`~a2a_secure.protocol.client_decisions.PeerState`."""

    def __init__(self, did: str, endpoint: str) -> None:
        super().__init__()
        self.did = did
        self.endpoint = endpoint
        self.session: ClientSession | None = None
        self.lock = asyncio.Lock()
        self.key_timer: asyncio.TimerHandle | None = None  # drops a sealed session's keys

    def hold(self, session: ClientSession) -> None:
        """Make ``session`` this peer's, and drop its sealing keys when it expires (§12.6),
        whether or not it is used again: a timer, checked against the session's own clock."""
        self.session = session
        if self.key_timer is not None:
            self.key_timer.cancel()
            self.key_timer = None
        if session.sealed:
            self._keys_timer(session)

    def _keys_timer(self, session: ClientSession) -> None:
        left = session.drop_keys()
        if left is not None:  # not ended yet by its clock: look again then
            loop = asyncio.get_running_loop()
            self.key_timer = loop.call_later(left + 0.05, self._keys_timer, session)
        else:
            self.key_timer = None

    def forget_timer(self) -> None:
        """Cancel the timer (the client is closing; its sessions go with it)."""
        if self.key_timer is not None:
            self.key_timer.cancel()
            self.key_timer = None


class A2AClient:
    """Calls agents: handshakes, signed intents, close. One instance serves many peers."""

    def __init__(
        self,
        identity: Identity,
        *,
        resolver: DIDResolver | None = None,
        http: httpx.AsyncClient | None = None,
        verify: Any = True,
        timeout: float = MAX_TIMEOUT,
        retry: RetryPolicy | None = None,
        manifest_hash: str | None = None,
        accept_policy: Callable[[Policy], bool] | None = None,
        audit: AuditHook | None = None,
        clock: Callable[[], float] = time.time,
        resend_on_unknown_session: bool = True,
        exactly_once: bool | None = None,
        addresses: AddressPolicy | None = None,
        sealed: bool | None = None,
    ) -> None:
        """``addresses``: where this client may connect when the address comes from a
        document, a registry file or a card (a did:web service endpoint, an A2A card's
        interface URL): public hosts over https only unless the policy opts in to more
        (``a2a_secure.identity.addresses``). An endpoint passed to a method is the caller's
        own choice and only needs https (plain http to loopback).

        ``resend_on_unknown_session``: when the server answers -32043 (it no longer knows
        the session: restarted, or closed it), ``request`` opens a new session and sends the
        intent once more. With an ``intent_id`` (below) the server answers that resend with
        the first run's answer, and never runs the intent twice. Without one (a server that
        does not declare the extension), that answer is unsigned by nature, so an attacker on
        the path who let the first request run can forge it and have the intent run a second
        time, under a new session: pass False for intents that must not run twice; the caller
        then gets ``SessionUnknown`` and decides (SECURITY.md).

        ``exactly_once``: whether intents carry an ``intent_id`` (PROTOCOL.md §12.5),
        which the server remembers across sessions so that an intent runs at most once and
        every resend gets that run's answer. None: when the server declares the extension in
        its agent card (fetched once per card and checked against the hash the server signed
        in the handshake); True: always, and an intent to a server that does not declare it
        is refused (-32602) before anything is sent; False: never (unless the caller passes
        an ``intent_id`` itself).

        ``sealed``: whether inputs, results, stream events and error data travel sealed, end
        to end through any proxy (PROTOCOL.md §12.6). None: when the server declares the
        extension in its agent card (checked against the manifest hash its CHALLENGE signed);
        True: always, and a server that does not declare it is refused (-32602) during the
        handshake, before any intent could go out in the clear; False: never.

        ``verify``: ``True`` (certifi's roots), an ``ssl.SSLContext``, or the path of a CA
        bundle file.

        ``http``: an ``httpx.AsyncClient`` to use (proxies, TLS settings, hooks, cookies all
        apply as configured); it stays open when this client closes. Without one, handshakes,
        intents (streamed ones too) and closes go through the client's own HTTP/1.1 pool
        (``client/pool.py``: ``verify`` as httpx takes it, kept-alive connections, no cookie
        jar, redirects, proxies or compression, one ``timeout`` for each whole exchange, or
        for each read once a stream has begun); ``self.http`` is then an httpx client built
        with the same ``verify`` and ``timeout``, for other requests (an agent card, say).
        """
        self.identity = identity
        self.resend_on_unknown_session = resend_on_unknown_session
        self.exactly_once = exactly_once
        self.sealed = sealed
        self.resolver = resolver or DIDResolver()
        self.addresses = addresses or AddressPolicy()
        self._own_http = http is None
        timeout = min(timeout, MAX_TIMEOUT)
        if isinstance(verify, str | os.PathLike):
            # A CA bundle file, as the CLI's --ca-bundle gives: made into a context here, as
            # httpx asks (its str form is deprecated) and as the did:web resolver does.
            verify = ssl.create_default_context(cafile=os.fspath(verify))
        # TCP_NODELAY: httpcore writes headers and body separately, and Nagle's algorithm
        # with delayed ACKs would then add ~40 ms to the first requests on a connection.
        transport = httpx.AsyncHTTPTransport(
            verify=verify,
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        self.http = http or httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout), follow_redirects=False
        )
        # With its own client, every protocol call goes through its own pool (_exchange,
        # _open_stream).
        self._pool = ConnectionPool(verify=verify, timeout=timeout) if http is None else None
        self.retry = retry or RetryPolicy()
        self.manifest_hash = manifest_hash
        self.accept_policy = accept_policy
        self._audit = audit
        self._clock = clock
        self._peers: dict[str, _Peer] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self) -> A2AClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, *, close_sessions: bool = True) -> None:
        """Close open sessions (best effort) and the HTTP client."""
        if close_sessions:
            for peer in list(self._peers.values()):
                if send_close(peer.session):
                    with contextlib.suppress(A2AError, httpx.HTTPError):
                        await self.close_session(peer.did)
        for peer in self._peers.values():
            peer.forget_timer()
        if self._pool is not None:
            await self._pool.aclose()
        if self._own_http:
            await self.http.aclose()

    # -- audit ---------------------------------------------------------------------------------
    def _record(
        self,
        event: str,
        started: float,
        peer: _Peer,
        *,
        error: A2AError | None = None,
        goal: str | None = None,
        sequence: int | None = None,
        verified: bool = True,
    ) -> None:
        session = peer.session
        tracing.client_step(
            event, error, goal=goal, sequence=sequence, session_id=session.session_id if session else None
        )
        if self._audit is None:
            return
        self._audit(
            event=event,
            role="client",
            session_id=session.session_id if session is not None else None,
            client_did=self.identity.did,
            server_did=peer.did,
            intent_goal=goal,
            sequence=sequence,
            status="error" if error is not None else "success",
            duration_ms=round((self._clock() - started) * 1000, 3),
            error_code=error.code if error is not None else None,
            verified=verified if error is None else bool(error.signed),
        )

    # -- transport -----------------------------------------------------------------------------
    async def _post(self, url: str, body: bytes, rid: int) -> tuple[int, Any, Any, float | None]:
        """One JSON-RPC call; returns (HTTP status, result, error, Retry-After)."""
        status, content, retry_header = await self._exchange(url, body)
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

    async def _exchange(self, url: str, body: bytes) -> tuple[int, bytes, str | None]:
        """POST ``body``; (HTTP status, reply body, Retry-After header).

        The reply is read with a bound: a hostile server must not exhaust the client's memory.
        """
        trace = tracing.trace_headers()  # traceparent/tracestate of the current span, if any
        if self._pool is None:
            headers = {**_POST_HEADERS, **{k.decode(): v.decode() for k, v in trace}}
            async with self.http.stream("POST", url, content=body, headers=headers) as resp:
                content = await _read_capped(resp.aiter_bytes(), MAX_REPLY_BYTES)
            return resp.status_code, content, resp.headers.get("retry-after")
        # Without a given httpx client the call goes through the client's own small HTTP/1.1
        # pool (client/pool.py): the httpx layers (URL merging, cookie jar, auth and redirect
        # flows, hooks, anyio) do nothing for these calls and cost more than the signature
        # check of the reply. It raises the same httpx exceptions.
        return await self._pool.post(
            url, body, limit=MAX_REPLY_BYTES, too_large=_reply_too_large, headers=trace
        )

    @contextlib.asynccontextmanager
    async def _open_stream(
        self, url: str, body: bytes, trace: Sequence[tuple[bytes, bytes]] = ()
    ) -> AsyncIterator[_StreamReply]:
        """POST a streamed request; the reply as it comes, through the pool or the given client."""
        if self._pool is not None:
            async with self._pool.stream(url, body, headers=trace) as reply:
                yield reply
            return
        headers = {**_STREAM_HEADERS, **{k.decode(): v.decode() for k, v in trace}}
        async with self.http.stream("POST", url, content=body, headers=headers) as resp:
            yield _HttpxStream(resp)

    @staticmethod
    def _plain_error(error: Any) -> A2AError:
        from a2a_secure.errors import error_for_code  # noqa: PLC0415 - keeps the import list short

        if (
            isinstance(error, dict)
            and type(error.get("code")) is int
            and isinstance(error.get("message"), str)
        ):
            data = error.get("data") if isinstance(error.get("data"), dict) else None
            return error_for_code(error["code"], error["message"][:512], data)
        return AuthenticationFailed("malformed error reply")

    # -- handshake -----------------------------------------------------------------------------
    def _peer(self, did: str, endpoint: str | None) -> _Peer:
        peer = self._peers.get(did)
        if peer is None:
            if endpoint is None:
                raise InvalidParams(f"no endpoint known for {did}")
            peer = _Peer(did, check_endpoint(endpoint))
            self._peers[did] = peer
        elif endpoint is not None:
            peer.endpoint = check_endpoint(endpoint)
        return peer

    async def handshake(self, server_did: str, endpoint: str | None = None) -> ClientSession:
        """Run the handshake with ``server_did`` at ``endpoint`` and keep the session."""
        peer = self._peer(server_did, endpoint)
        async with peer.lock:
            return await self._handshake(peer)

    async def _handshake(self, peer: _Peer) -> ClientSession:
        with tracing.client_span("handshake", peer.did):  # the steps are its events (_record)
            return await self._run_handshake(peer)

    async def _run_handshake(self, peer: _Peer) -> ClientSession:
        resolved = await self.resolver.resolve(peer.did)
        hs = ClientHandshake(self.identity, resolved, manifest_hash=self.manifest_hash, clock=self._clock)
        url = peer.endpoint + "/a2a/handshake"
        msg = hs.hello()
        steps = (
            ("hello", hs.receive_challenge),
            ("proof", lambda r: hs.receive_policy(r, accept=self.accept_policy)),
            ("accept_policy", None),
        )
        session: ClientSession | None = None
        for method, nxt in steps:
            started = self._clock()
            try:
                _status, result, error, _ra = await self._with_retries(url, method, msg, signed=False)
                if error is not None:
                    refused = self._plain_error(error)
                    if method == "accept_policy":  # §12.6: a server's own refusal is signed
                        refused.signed = hs.refusal_is_signed(error, msg)
                    raise refused
                if nxt is not None:
                    msg = nxt(result)
                    if method == "hello" and self.sealed is not False:
                        await self._negotiate_sealing(peer, hs)
                else:
                    session = hs.receive_session(result)
            except A2AError as exc:
                self._record(method, started, peer, error=exc)
                raise
            if session is not None:
                peer.hold(session)
            self._record(method, started, peer, verified=True)
        assert session is not None
        peer.new_session()
        if self.exactly_once is not False:
            peer.extensions = await self._server_extensions(peer, session)
        return session

    async def _negotiate_sealing(self, peer: _Peer, hs: ClientHandshake) -> None:
        """Bring a seal_key to the ACCEPT_POLICY if the server declares sealed intents (§12.6).

        The card is the one whose hash the CHALLENGE just signed; with ``sealed=True`` a
        server without the extension (or whose card cannot be had: stripping it is how an
        attacker would downgrade) ends the handshake here, before any session exists.
        """
        declared = await learn_extensions(
            self.http, peer.endpoint, hs.server_manifest_hash, verified_only=self.sealed is True
        )
        hs.seal = seal(peer.did, self.sealed, declared)

    async def _server_extensions(
        self, peer: _Peer, session: ClientSession, *, verified_only: bool = False
    ) -> frozenset[str]:
        """The extensions ``session``'s server declares (cached per signed manifest hash)."""
        if not session.server_manifest_hash:
            return frozenset()
        return await learn_extensions(
            self.http, peer.endpoint, session.server_manifest_hash, verified_only=verified_only
        )

    async def _with_intent_id(
        self, peer: _Peer, session: ClientSession, intent: Mapping[str, Any], chosen: str | None
    ) -> tuple[Mapping[str, Any], str | None]:
        """``intent`` with the intent_id to send to ``session``'s server, and that id.

        ``chosen`` is the id already given or used (kept across retries and re-handshakes):
        then, or with ``exactly_once=True``, a server that does not declare the extension is
        refused rather than sent the intent without an id.
        """
        need = intent_id_need(
            chosen=chosen, exactly_once=self.exactly_once, paused=peer.ids_paused(time.monotonic())
        )
        if need is IdNeed.NONE:
            return intent, None
        required = need is IdNeed.REQUIRED
        if required and not peer.declares(INTENT_ID):  # a failed look-up is tried again when it matters
            peer.extensions = await self._server_extensions(peer, session, verified_only=True)
        if not peer.declares(INTENT_ID):
            if required:
                raise undeclared(peer.did, INTENT_ID)
            return intent, None
        if chosen is None:
            chosen = new_intent_id(os.urandom)
        return {**intent, INTENT_ID: chosen}, chosen

    def _ids_full(
        self, peer: _Peer, exc: A2AError, *, own_id: bool, attempt: int, yielded: bool = False
    ) -> bool:
        """Whether ``exc`` refused an id this client picked because the DID holds too many
        (:func:`~a2a_secure.protocol.client_decisions.ids_full_pause`): then the intent goes
        again without one, and so do the next ones for the pause. That intent is then not
        remembered across sessions (logged).
        """
        pause = ids_full_pause(
            exc, exactly_once=self.exactly_once, own_id=own_id, attempt=attempt, yielded=yielded
        )
        if pause is None:
            return False
        peer.pause_ids(time.monotonic(), pause)
        _log.warning(
            "%s keeps no more intent_ids for this client's DID: intents go without one for %.0f s",
            peer.did[:128],
            pause,
        )
        return True

    async def _check_priority(self, peer: _Peer, session: ClientSession, intent: Mapping[str, Any]) -> None:
        """Refuse to ask for a priority of a server whose card does not declare it (§12.3).

        Such a server would refuse the unknown member with -32602 only after the request is
        signed and sent; the card (authenticated by the CHALLENGE's manifest_hash) says so
        before anything leaves.
        """
        if not peer.needs_priority_check(intent):
            return
        peer.extensions = await self._server_extensions(peer, session, verified_only=True)
        if not peer.declares(PRIORITY):
            raise undeclared(peer.did, PRIORITY)

    async def _with_delegation(
        self, peer: _Peer, session: ClientSession, intent: Mapping[str, Any], chain: Chain | None
    ) -> Mapping[str, Any]:
        """``intent`` acting under ``chain`` (PROTOCOL.md §12.7): the tokens the first time on
        this session, the chain's hash after that.

        Refused before anything is signed: a server whose card does not declare the
        extension, and a chain that does not let this client's DID do this goal at this
        server now (a chain delegated to someone else, expired, or too narrow).
        """
        if chain is None:
            return intent
        if not peer.declares(DELEGATION):
            peer.extensions = await self._server_extensions(peer, session, verified_only=True)
            if not peer.declares(DELEGATION):
                raise undeclared(peer.did, DELEGATION)
        refused = chain.refusal(
            now=self._clock(),
            client_did=self.identity.did,
            server_did=peer.did,
            goal=str(intent.get("goal", "")),
            priority=intent.get(PRIORITY, 3),
        )
        if refused is not None:
            raise InvalidParams(f"not sent: {refused.message}")
        return {**intent, DELEGATION: peer.delegation_member(chain)}

    async def _attempt(
        self, peer: _Peer, intent: Mapping[str, Any], chosen: str | None, chain: Chain | None = None
    ) -> tuple[ClientSession, Mapping[str, Any], str | None]:
        """One attempt's session, the intent to sign on it and its intent_id.

        A handshake first when there is no session or it expired. The caller holds
        ``peer.lock``; the priority and intent_id checks (see :meth:`_with_intent_id`) run
        against this session's server, before anything is signed.
        """
        if peer.session is None or peer.session.expired():
            await self._handshake(peer)
        session = peer.session
        assert session is not None
        await self._check_priority(peer, session, intent)
        body, chosen = await self._with_intent_id(peer, session, intent, chosen)
        body = await self._with_delegation(peer, session, body, chain)
        return session, body, chosen

    @staticmethod
    def _given_intent_id(intent: Mapping[str, Any], intent_id: str | None) -> str | None:
        given = intent_id if intent_id is not None else intent.get(INTENT_ID)
        if given is not None:
            check_intent_id(given)
            if intent_id is not None and intent.get(INTENT_ID, intent_id) != intent_id:
                raise InvalidParams("intent_id differs from the intent's own intent_id")
        return given

    async def _with_retries(
        self,
        url: str,
        method: str,
        params: Mapping[str, Any],
        *,
        signed: bool,
        session: ClientSession | None = None,
        req: PreparedRequest | None = None,
    ) -> tuple[int, Any, Any, float | None]:
        # One id and one body for all attempts: a retry is the byte-identical request.
        rid = next(self._ids)
        body = encode_request(method, params, rid)
        attempt = 0
        while True:
            attempt += 1
            try:
                status, result, error, retry_after = await self._post(url, body, rid)
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
            verdict = reply_retry(
                status,
                is_error=error is not None,
                retry_after=retry_after,
                max_wait=self.retry.max_wait,
                signed_request=signed and session is not None and req is not None,
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

    # -- intents ---------------------------------------------------------------------------------
    async def session_for(self, server_did: str, endpoint: str | None = None) -> ClientSession:
        """The open session with ``server_did``, handshaking if there is none or it expired."""
        peer = self._peer(server_did, endpoint)
        async with peer.lock:
            if peer.session is None or peer.session.expired():
                await self._handshake(peer)
            assert peer.session is not None
            return peer.session

    async def request(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        *,
        endpoint: str | None = None,
        priority: int | None = None,
        intent_id: str | None = None,
        on_behalf_of: Chain | None = None,
    ) -> IntentResult:
        """Send ``intent`` to ``server_did`` on a (re)used session; return the verified result.

        A session that expired, or that the server no longer knows, is replaced by a new
        handshake once. ``priority`` (1-5, PROTOCOL.md §12.3) asks the server to schedule
        the intent at that priority; it is sent only when it is not the default 3.
        ``intent_id``: the caller's own id for this intent (22-64 base64url
        characters, 128 random bits or more), so that its own retries, across restarts too,
        run the intent at most once; the server must declare the extension (see
        ``exactly_once``). The id used is ``IntentResult.intent_id``. ``on_behalf_of``: a
        delegation chain whose leaf names this client's DID (PROTOCOL.md §12.7); the server
        must declare the extension.
        """
        with tracing.client_span("intent", server_did, intent.get("goal")):
            return await self._request(server_did, intent, endpoint, priority, intent_id, on_behalf_of)

    async def _request(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        endpoint: str | None,
        priority: int | None,
        intent_id: str | None,
        on_behalf_of: Chain | None,
    ) -> IntentResult:
        intent = with_priority(intent, priority)
        peer = self._peer(server_did, endpoint)
        chosen = self._given_intent_id(intent, intent_id)
        own_id = chosen is None  # an id this client picks, not the caller's
        async with peer.lock:
            for attempt in (1, 2):
                session, body, chosen = await self._attempt(peer, intent, chosen, on_behalf_of)
                try:
                    return await self._send(peer, session, body)
                except PolicyViolation as exc:
                    if on_behalf_of is None or not chain_unknown(exc) or attempt == 2:
                        raise
                    # The worker that answered has not seen the chain: send it in full.
                    peer.chain_unknown(on_behalf_of)
                except Unavailable as exc:
                    if not self._ids_full(peer, exc, own_id=own_id, attempt=attempt):
                        raise
                    # Nothing ran: once more without the id, the rest of the body as it was
                    # (its delegation chain, above all: the intent acts for the same person).
                    return await self._send(peer, session, {k: v for k, v in body.items() if k != INTENT_ID})
                except SessionUnknown:
                    peer.session = None
                    if not resend_after_session_unknown(
                        attempt=attempt, enabled=self.resend_on_unknown_session
                    ):
                        raise
                    tracing.event("a2a_secure.resend", {"a2a_secure.reason": "session_unknown"})
        raise SessionUnknown()  # pragma: no cover

    async def send_intent(
        self, session: ClientSession, intent: Mapping[str, Any], *, on_behalf_of: Chain | None = None
    ) -> IntentResult:
        """Send ``intent`` on an explicit ``session`` (under ``on_behalf_of``, see :meth:`request`)."""
        peer = self._peers.get(session.server_did)
        if peer is None:
            raise InvalidParams("unknown session")
        with tracing.client_span("intent", session.server_did, intent.get("goal")):
            async with peer.lock:
                if on_behalf_of is not None and session is peer.session:
                    intent = await self._with_delegation(peer, session, intent, on_behalf_of)
                return await self._send(peer, session, intent)

    async def _send(self, peer: _Peer, session: ClientSession, intent: Mapping[str, Any]) -> IntentResult:
        req = session.prepare_intent(intent)
        started = self._clock()
        try:
            _status, result, error, _ra = await self._with_retries(
                peer.endpoint + "/a2a/intent", "intent", req.params, signed=True, session=session, req=req
            )
            if error is not None:
                raise session.error_from_reply(req, error)
            verified = session.verify_result(req, result)
        except A2AError as exc:
            self._record("intent", started, peer, error=exc, goal=req.goal, sequence=req.sequence)
            raise
        self._record("intent", started, peer, goal=req.goal, sequence=req.sequence)
        return verified

    async def stream(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        *,
        endpoint: str | None = None,
        priority: int | None = None,
        intent_id: str | None = None,
        on_behalf_of: Chain | None = None,
    ) -> AsyncIterator[Any]:
        """Send ``intent`` as a streamed request (§6.4) and yield its verified partial results.

        Every event is checked (signature, index, final rule, nothing after the final one);
        a signed error event is raised; a stream cut short is resumed by re-sending the
        byte-identical request, skipping the replayed events already held. The session is
        held for the whole stream, as a resumable stream requires. ``priority``: as for
        :meth:`request`. With an ``intent_id`` (see :meth:`request`), a stream refused with
        -32043 before its first item is sent again on a new session, where the server
        replays the one run's events. :meth:`stream_events` gives the same stream as
        verified events, with their signed tokens. ``on_behalf_of``: as for :meth:`request`.
        """
        # aclosing: a caller that stops early must release the session lock now, not when
        # the inner generator is collected.
        events = self.stream_events(
            server_did,
            intent,
            endpoint=endpoint,
            priority=priority,
            intent_id=intent_id,
            on_behalf_of=on_behalf_of,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                # The closing ``"final": true, "result": null`` event of a streaming handler
                # carries no partial result.
                if event.result is not None or not event.final:
                    yield event.result

    async def stream_events(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        *,
        endpoint: str | None = None,
        priority: int | None = None,
        intent_id: str | None = None,
        session_check: Callable[[ClientSession], None] | None = None,
        on_behalf_of: Chain | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Like :meth:`stream`, but yield every verified event, the closing one included.

        Each :class:`~a2a_secure.protocol.client.StreamEvent` holds its ``index`` (0, 1, 2,
        … in order, each once: events replayed on a resumed stream are not yielded again),
        ``final``, ``result`` and ``response_jws``, the server's ``a2a-event+jws`` token over
        it, for callers that keep proof. A signed error event is raised, as by :meth:`stream`.
        ``session_check`` is called with each session before the intent is signed on it (a
        session re-opened after -32043 too); what it raises ends the stream, nothing sent.
        """
        body_intent = dict(with_priority(intent, priority))
        body_intent["constraints"] = {**dict(intent.get("constraints") or {}), "stream": True}
        peer = self._peer(server_did, endpoint)
        chosen = self._given_intent_id(intent, intent_id)
        own_id = chosen is None  # an id this client picks, not the caller's
        # Not the current span: a generator's context is its consumer's between items.
        trace = tracing.start_client_span("intent", server_did, intent.get("goal"))
        failure: BaseException | None = None
        attempts = self._stream_attempts(
            peer, body_intent, chosen, own_id, trace, session_check, on_behalf_of
        )
        try:
            async with contextlib.aclosing(attempts):  # releases the session lock now on early exit
                async for item in attempts:
                    yield item
        except GeneratorExit:  # the caller stopped reading: not a failure
            raise
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if trace is not None:
                trace.end(failure)

    async def _stream_attempts(
        self,
        peer: _Peer,
        body_intent: Mapping[str, Any],
        chosen: str | None,
        own_id: bool,
        trace: tracing.ClientTrace | None,
        session_check: Callable[[ClientSession], None] | None,
        on_behalf_of: Chain | None,
    ) -> AsyncGenerator[StreamEvent, None]:
        async with peer.lock:
            for attempt in (1, 2):
                session, body, chosen = await self._attempt(peer, body_intent, chosen, on_behalf_of)
                if session_check is not None:
                    session_check(session)
                req = session.prepare_intent(body)
                started = self._clock()
                yielded = False
                try:
                    async for item in self._stream_events(peer, session, req, trace):
                        yielded = True
                        yield item
                except A2AError as exc:
                    self._record("intent", started, peer, error=exc, goal=req.goal, sequence=req.sequence)
                    if self._ids_full(peer, exc, own_id=own_id, attempt=attempt, yielded=yielded):
                        chosen = None  # nothing ran: once more, without an id (see _ids_full)
                        continue
                    resend = isinstance(exc, SessionUnknown) and resend_after_session_unknown(
                        attempt=attempt,
                        enabled=self.resend_on_unknown_session,
                        streamed=True,
                        yielded=yielded,
                        intent_id=chosen,
                    )
                    if not resend:
                        raise
                    peer.session = None
                    if trace is not None:
                        trace.event("a2a_secure.resend", {"a2a_secure.reason": "session_unknown"})
                    continue
                self._record("intent", started, peer, goal=req.goal, sequence=req.sequence)
                return

    async def _stream_events(
        self,
        peer: _Peer,
        session: ClientSession,
        req: PreparedRequest,
        trace: tracing.ClientTrace | None = None,
    ) -> AsyncIterator[StreamEvent]:
        rid = next(self._ids)
        body = encode_request("intent", req.params, rid)
        url = peer.endpoint + "/a2a/intent"
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
                        raw = await _read_capped(resp.chunks(), MAX_REPLY_BYTES)
                        retry_after = parse_retry_after(resp.retry_after)
                        error = _jsonrpc_error(raw, rid)
                        exc = session.error_from_reply(req, error)
                        if stream_reply_retried(resp.status, signed=exc.signed):
                            raise _Retryable(exc)
                        raise exc
                    async for event_id, data in _sse_events(resp.chunks()):
                        if held and held[-1].get("final") is True:
                            raise AuthenticationFailed("data after the final event")
                        index = len(held)
                        result = _event_result(data, rid)
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

    async def close_session(self, server_did: str) -> None:
        """Close the session with ``server_did`` (authenticated close, §6.3)."""
        with tracing.client_span("close", server_did):
            await self._close_session(server_did)

    async def _close_session(self, server_did: str) -> None:
        peer = self._peers.get(server_did)
        if peer is None or peer.session is None:
            return
        async with peer.lock:
            session = peer.session
            if not send_close(session):
                peer.session = None
                return
            assert session is not None
            req = session.prepare_close()
            started = self._clock()
            try:
                _s, result, error, _ra = await self._with_retries(
                    peer.endpoint + "/a2a/intent", "close", req.params, signed=True, session=session, req=req
                )
                if error is not None:
                    raise session.error_from_reply(req, error)
                session.verify_closed(req, result)
            except A2AError as exc:
                self._record("close", started, peer, error=exc, sequence=req.sequence)
                peer.session = None
                raise
            self._record("close", started, peer, sequence=req.sequence)
            peer.session = None
