"""The client: ``A2AClient``, which calls agents over DID-authenticated sessions.

A thin adapter. Every call (a request, a stream, an intent on a given session, and through
them the A2A secure transport's calls and the MCP bridge's tool calls) is one
:class:`~a2a_secure.protocol.client_attempt.Call` of the sans-I/O core, driven by one loop
(:meth:`A2AClient._ready`): the machine says what to do next (open a session, look up the
server's card, send this intent on this session) and what an answer leads to (send again,
open a new session, raise); this module only does the I/O it is told. Around it:

* :mod:`a2a_secure.client.transport`: one exchange and its byte-identical retries, streams
  and their resumption;
* :mod:`a2a_secure.client.handshake`: the handshake driver and card discovery;
* :mod:`a2a_secure.client.framing`: bounded replies and the event stream's framing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from a2a_secure import system
from a2a_secure.client.endpoint import check_endpoint
from a2a_secure.client.extensions import learn_card
from a2a_secure.client.handshake import Handshaker, Peer
from a2a_secure.client.pinning import DialPlan, PlanTransport
from a2a_secure.client.pool import ConnectionPool
from a2a_secure.client.transport import RetryPolicy, Transport
from a2a_secure.delegation import Chain
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity.addresses import AddressPolicy, Reach
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import Policy
from a2a_secure.protocol.client_attempt import HANDSHAKE, Call, CallOptions, Resend, Send
from a2a_secure.protocol.client_decisions import send_close
from a2a_secure.protocol.client_session import ClientSession, IntentResult, PreparedRequest, StreamEvent
from a2a_secure.protocol.priority import with_priority
from a2a_secure.protocol.server import AuditHook
from a2a_secure.telemetry import tracing

__all__ = ["A2AClient", "RetryPolicy", "check_endpoint"]

_log = logging.getLogger("a2a_secure.client")

MAX_TIMEOUT = 30.0


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
        dial: DialPlan | None = None,
    ) -> None:
        """``addresses``: where this client may connect when the address comes from a
        document, a registry file or a card (a did:web service endpoint, an A2A card's
        interface URL): public hosts over https only unless the policy opts in to more
        (``a2a_secure.identity.addresses``). An endpoint passed to a method is the caller's
        own choice and only needs https (plain http to loopback). An endpoint taken from a
        document goes through :meth:`accept_endpoint`, and the client's own pool then dials
        only an address of its host that the same rule allows (``dial``: the
        :class:`~a2a_secure.client.pinning.DialPlan` holding those names, with its resolver).

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
        with the same ``verify`` and ``timeout``, for other requests (an agent card, say),
        which dials a name taken with :meth:`accept_endpoint` at a checked address too.
        """
        self.identity = identity
        self.resend_on_unknown_session = resend_on_unknown_session
        self.exactly_once = exactly_once
        self.sealed = sealed
        self.resolver = resolver or DIDResolver()
        self.addresses = addresses or AddressPolicy()
        self.dial = dial or DialPlan()
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
            transport=PlanTransport(self.dial, transport, verify),
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
        )
        # With its own client, every protocol call goes through its own pool.
        pool = ConnectionPool(verify=verify, timeout=timeout, plan=self.dial) if http is None else None
        self._transport = Transport(self.http, pool, retry or RetryPolicy())
        self.manifest_hash = manifest_hash
        self.accept_policy = accept_policy
        self._audit = audit
        self._clock = clock
        self._wall = system.wall_clock_of(clock)  # the same clock, typed as wall seconds
        self._peers: dict[str, Peer] = {}
        # Cards the caller vouched for (trust_card) before this client knew the server.
        self._trusted: dict[str, frozenset[str]] = {}
        self._handshaker = Handshaker(
            identity, self.resolver, self._transport, self.http, clock, self._record
        )

    def accept_endpoint(self, url: object, *, what: str, origin: Reach | None) -> str:
        """``url`` (without its trailing slash) if a document from ``origin`` may point this
        client there under :attr:`addresses`, else ``InvalidParams``
        (:func:`~a2a_secure.identity.addresses.check_address`). A host name accepted here
        is dialled by the client's own pool only at an address its DNS answer gives and the
        same rule allows, resolved once per connection (not through a caller's ``http``)."""
        return self.dial.accept(url, what=what, origin=origin, policy=self.addresses)

    @property
    def retry(self) -> RetryPolicy:
        """How failed exchanges are tried again (:class:`RetryPolicy`)."""
        return self._transport.retry

    @retry.setter
    def retry(self, value: RetryPolicy) -> None:
        self._transport.retry = value

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
        await self._transport.aclose()
        if self._own_http:
            await self.http.aclose()

    # -- audit ---------------------------------------------------------------------------------
    def _record(
        self,
        event: str,
        started: float,
        peer: Peer,
        *,
        error: A2AError | None = None,
        goal: str | None = None,
        sequence: int | None = None,
        verified: bool = True,
    ) -> None:
        if self._audit is None and tracing.tracer() is None:  # nobody to tell (the common case)
            return
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

    # -- peers and sessions ----------------------------------------------------------------------
    def _peer(self, did: str, endpoint: str | None) -> Peer:
        peer = self._peers.get(did)
        if peer is None:
            if endpoint is None:
                raise InvalidParams(f"no endpoint known for {did}")
            peer = Peer(did, endpoint)
            if did in self._trusted:
                peer.card_verified(self._trusted.pop(did))
            self._peers[did] = peer
        elif endpoint is not None:
            peer.endpoint = check_endpoint(endpoint)
        return peer

    def _call(self, peer: Peer, intent: Mapping[str, Any], **kw: Any) -> Call:
        """One call of the attempt machine, with this client's settings as they are now."""
        options = CallOptions(self.exactly_once, self.resend_on_unknown_session, self.sealed)
        return Call(peer, intent, client_did=self.identity.did, server_did=peer.did, options=options, **kw)

    async def _handshake(self, peer: Peer) -> ClientSession:
        return await self._handshaker.open(
            peer,
            sealed=self.sealed,
            exactly_once=self.exactly_once,
            manifest_hash=self.manifest_hash,
            accept=self.accept_policy,
        )

    async def handshake(self, server_did: str, endpoint: str | None = None) -> ClientSession:
        """Run the handshake with ``server_did`` at ``endpoint`` and keep the session."""
        peer = self._peer(server_did, endpoint)
        async with peer.lock:
            return await self._handshake(peer)

    async def session_for(self, server_did: str, endpoint: str | None = None) -> ClientSession:
        """The open session with ``server_did``, handshaking if there is none, it expired, or
        it is not sealed while a verified card of that server declares ``sealed``."""
        peer = self._peer(server_did, endpoint)
        async with peer.lock:
            return await self._session(peer)

    async def _session(self, peer: Peer) -> ClientSession:
        # The attempt machine's session rule, for a caller that only wants the session.
        call = self._call(peer, {})
        while (step := call.session_step(self._wall())) is HANDSHAKE:
            await self._handshake(peer)
        return step

    def trust_card(self, server_did: str, card: Any) -> frozenset[str]:
        """Take ``card`` as ``server_did``'s own: a card the caller verified (an A2A card
        whose signature it checked against the DID, or one that hashes to the manifest hash
        a session's CHALLENGE signed). Its extensions are known under its hash from now on;
        if it declares ``sealed`` (and this client does not say ``sealed=False``), every
        session used with that server from now on is sealed: an unsealed one is replaced by
        a new handshake, which refuses to go on unsealed (PROTOCOL.md §12.6)."""
        extensions = learn_card(card)
        peer = self._peers.get(server_did)
        if peer is not None:
            peer.card_verified(extensions)
        else:
            self._trusted[server_did] = extensions
        return extensions

    # -- the one loop --------------------------------------------------------------------------------
    async def _ready(self, peer: Peer, call: Call, step: Any = None) -> Send:
        """Run the machine until it says what to send: sessions opened, cards looked up
        (``step``: the machine's first step, when the caller already asked for it)."""
        while True:
            if step is None:
                step = call.next(self._wall(), system.mono_now())
            if isinstance(step, Send):
                return step
            if step is HANDSHAKE:
                await self._handshake(peer)
            else:  # LearnCard
                call.learnt(
                    await self._handshaker.card_extensions(
                        peer, step.session.server_manifest_hash, retry_failed=True
                    )
                )
            step = None

    def _resent(self, peer: Peer, why: Resend, trace: tracing.ClientTrace | None = None) -> None:
        if why is Resend.IDS_FULL:
            _log.warning(
                "%s keeps no more intent_ids for this client's DID: intents go without one for %.0f s",
                peer.did[:128],
                max(0.0, peer.ids_full_until - system.mono_now()),
            )
        attrs = {"a2a_secure.reason": why.value}
        if trace is not None:
            trace.event("a2a_secure.resend", attrs)
        else:
            tracing.event("a2a_secure.resend", attrs)

    # -- intents ---------------------------------------------------------------------------------
    async def request(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        *,
        endpoint: str | None = None,
        priority: int | None = None,
        intent_id: str | None = None,
        on_behalf_of: Chain | None = None,
        session_check: Callable[[ClientSession], None] | None = None,
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
        must declare the extension. ``session_check``: as for :meth:`stream_events`.
        """
        span = tracing.client_span("intent", server_did, intent.get("goal"))
        args = (server_did, intent, endpoint, priority, intent_id, on_behalf_of, session_check)
        if span is tracing.NOOP:  # no tracing SDK: nothing to enter
            return await self._run(*self._intent_call(*args))
        with span:
            return await self._run(*self._intent_call(*args))

    def _intent_call(
        self,
        server_did: str,
        intent: Mapping[str, Any],
        endpoint: str | None,
        priority: int | None,
        intent_id: str | None,
        on_behalf_of: Chain | None,
        session_check: Callable[[ClientSession], None] | None,
    ) -> tuple[Peer, Call]:
        """The peer of a :meth:`request` and its call of the attempt machine."""
        peer = self._peer(server_did, endpoint)
        call = self._call(
            peer,
            with_priority(intent, priority),
            intent_id=intent_id,
            chain=on_behalf_of,
            check=session_check,
        )
        return peer, call

    async def _run(self, peer: Peer, call: Call) -> IntentResult:
        """The call's attempts, one at a time on the peer's session: sign, send, verify."""
        async with peer.lock:
            while True:
                step = call.next(self._wall(), system.mono_now())
                if type(step) is not Send:
                    step = await self._ready(peer, call, step)
                session = step.session
                try:
                    req = session.prepare_intent(step.intent)
                    if req.pending is not None:  # a remote key: its signature is awaited
                        req = await _signed(req)
                except A2AError as exc:
                    self._resent(peer, call.failed(exc, mono=system.mono_now()))
                    continue
                started = self._clock()
                try:
                    _s, result, error, _ra = await self._transport.call(
                        peer.endpoint + "/a2a/intent", "intent", req.params, session=session, req=req
                    )
                    if error is not None:
                        raise session.error_from_reply(req, error)
                    # The common answer comes verified from its bytes; any other is checked here.
                    verified = result if type(result) is IntentResult else session.verify_result(req, result)
                except A2AError as exc:
                    self._record("intent", started, peer, error=exc, goal=req.goal, sequence=req.sequence)
                    self._resent(peer, call.failed(exc, mono=system.mono_now()))
                    continue
                self._record("intent", started, peer, goal=req.goal, sequence=req.sequence)
                return verified

    async def send_intent(
        self, session: ClientSession, intent: Mapping[str, Any], *, on_behalf_of: Chain | None = None
    ) -> IntentResult:
        """Send ``intent`` on an explicit ``session`` (under ``on_behalf_of``, see :meth:`request`).

        Only on that session: no new one is opened (-32043 is raised) and this client names
        no ``intent_id`` of its own; a delegated intent goes on the open session only, and a
        session that is not sealed is refused when a verified card of the server declares
        ``sealed``.
        """
        peer = self._peers.get(session.server_did)
        if peer is None:
            raise InvalidParams("unknown session")
        call = self._call(peer, intent, chain=on_behalf_of, pinned=session)
        with tracing.client_span("intent", session.server_did, intent.get("goal")):
            return await self._run(peer, call)

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
        call = self._call(
            peer, body_intent, streamed=True, intent_id=intent_id, chain=on_behalf_of, check=session_check
        )
        # Not the current span: a generator's context is its consumer's between items.
        trace = tracing.start_client_span("intent", server_did, intent.get("goal"))
        failure: BaseException | None = None
        attempts = self._stream_attempts(peer, call, trace)
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
        self, peer: Peer, call: Call, trace: tracing.ClientTrace | None
    ) -> AsyncGenerator[StreamEvent, None]:
        async with peer.lock:
            while True:
                step = await self._ready(peer, call)
                session = step.session
                req = session.prepare_intent(step.intent)
                if req.pending is not None:
                    req = await _signed(req)
                started = self._clock()
                yielded = False
                try:
                    async for item in self._transport.events(
                        peer.endpoint + "/a2a/intent", session, req, trace
                    ):
                        yielded = True
                        yield item
                except A2AError as exc:
                    self._record("intent", started, peer, error=exc, goal=req.goal, sequence=req.sequence)
                    self._resent(peer, call.failed(exc, yielded=yielded, mono=system.mono_now()), trace)
                    continue
                self._record("intent", started, peer, goal=req.goal, sequence=req.sequence)
                return

    # -- close -------------------------------------------------------------------------------------
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
            if req.pending is not None:
                req = await _signed(req)
            started = self._clock()
            try:
                _s, result, error, _ra = await self._transport.call(
                    peer.endpoint + "/a2a/intent", "close", req.params, session=session, req=req
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


async def _signed(req: PreparedRequest) -> PreparedRequest:
    """``req`` signed by its remote key (``Identity.sign_async``: the signature is checked)."""
    assert req.pending is not None
    return req.signed(await req.pending.sign())
