"""The server side of the protocol (PROTOCOL.md §5, §6): no sockets, no HTTP.

``ServerProtocol`` takes a method name and its decoded ``params`` and returns the reply to
send, or raises an :class:`A2AError` that the adapter turns into the JSON-RPC error of §7.
State lives behind the :class:`Store` interface, the peer's DID resolution behind a
:class:`DIDResolver`, and time and randomness are parameters, so the whole protocol runs in
memory in tests and behind any transport in production.

Checks run in the order of the specification, cheap before expensive: shapes, then state
look-ups, then signatures, and a did:web fetch only for a HELLO that passed every check
that needs no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    HandshakeUnknown,
    IntentTimeout,
    InternalError,
    InvalidParams,
    MethodNotFound,
    PolicyViolation,
    SequenceError,
    SessionUnknown,
    StaleTimestamp,
    Unavailable,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign, jws_verify
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.exactly_once import ExactlyOnce, Pending
from a2a_secure.protocol.models import (
    AcceptPayload,
    AcceptPolicy,
    ClosePayload,
    CloseRequest,
    Hello,
    Intent,
    IntentRequest,
    Proof,
    ProofPayload,
    PublicKeyEntry,
    RequestPayload,
)
from a2a_secure.protocol.policy import Policy
from a2a_secure.protocol.streaming import MAX_EVENT_BYTES, StreamRecord, result_size
from a2a_secure.protocol.validate import (
    ct_equal,
    is_fresh,
)
from a2a_secure.store.base import BeginKind, OpenResult, PendingHandshake, SessionRecord, Store, StoredReply
from a2a_secure.store.intents import ClaimKind

__all__ = [
    "AuditHook",
    "IntentContext",
    "IntentDispatcher",
    "Reply",
    "ServerLimits",
    "ServerProtocol",
    "parse_intent",
]

HANDSHAKE_METHODS = frozenset(("hello", "proof", "accept_policy"))
INTENT_METHODS = frozenset(("intent", "close"))

AuditHook = Callable[..., object]
Clock = Callable[[], float]
RandomSource = Callable[[int], bytes]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Capacity and timing bounds; the defaults are those of PROTOCOL.md §9."""

    max_pending_per_source: int = 256
    max_pending_total: int = 10_000
    max_sessions: int = 100_000
    max_handler_timeout_ms: int = 30_000
    replay_wait_seconds: float = 5.0
    max_streams_total: int = 1000
    max_streams_per_did: int = 32
    allow_self_handshake: bool = False
    # Failed PROOF / ACCEPT_POLICY steps that cost a signature verification, per source
    # address: a bucket of ``burst`` failures that
    # refills at ``per_second``; when empty, further PROOFs and ACCEPTs from that source get
    # 503 before any signature check (ATTACKS.md H4). Honest clients rarely fail, so the
    # throughput of valid handshakes from one host is not limited.
    failed_handshake_burst: int = 100
    failed_handshake_per_second: float = 50.0
    # The intent_id extension (protocol/exactly_once.py): how long (s) the answer to an
    # intent_id is remembered after its first request (0 = the extension is off), and how
    # many unexpired intent_ids one client DID may hold (then 503, never an eviction).
    intent_id_retention: int = 86_400
    max_intent_ids_per_did: int = 10_000


@dataclass(frozen=True, slots=True)
class IntentContext:
    """What a handler learns about the request besides its inputs (all authenticated)."""

    caller_did: str
    session_id: str
    sequence: int
    goal: str
    domain: str | None
    constraints: Mapping[str, Any]
    client_agent_id: str = ""
    intent_id: str | None = None  # the caller's id for this intent, run at most once


class IntentDispatcher:
    """Maps goals to handlers. Adapters subclass or fill it; the core only calls it."""

    def __init__(self) -> None:
        self._handlers: dict[str, Callable[[Any, IntentContext], Awaitable[Any]]] = {}
        self._streams: dict[str, Callable[[Any, IntentContext], AsyncIterator[Any]]] = {}
        self._always_streamed: set[str] = set()

    def add(self, goal: str, handler: Callable[[Any, IntentContext], Awaitable[Any]]) -> None:
        """Serve ``goal`` with the async ``handler(inputs, context)``."""
        self._streams.pop(goal, None)
        self._always_streamed.discard(goal)
        self._handlers[goal] = handler

    def add_stream(
        self,
        goal: str,
        handler: Callable[[Any, IntentContext], AsyncIterator[Any]],
        *,
        always: bool = False,
    ) -> None:
        """Serve ``goal`` with ``handler(inputs, context)``, an async iterator of partial results.

        ``always``: the goal is always answered as a stream, even without ``stream: true``,
        and ``stream: false`` is -32602 (the A2A goals that stream, PROTOCOL.md §6.4, §10).
        """
        self._handlers.pop(goal, None)
        self._streams[goal] = handler
        if always:
            self._always_streamed.add(goal)
        else:
            self._always_streamed.discard(goal)

    def has(self, goal: str) -> bool:
        """Whether a handler serves ``goal``."""
        return goal in self._handlers or goal in self._streams

    def is_streaming(self, goal: str) -> bool:
        """Whether ``goal`` is served by a streaming handler."""
        return goal in self._streams

    def is_always_streamed(self, goal: str) -> bool:
        """Whether ``goal`` is always answered as a stream (``stream: false`` is refused)."""
        return goal in self._always_streamed

    @property
    def goals(self) -> list[str]:
        """The goals served, sorted."""
        return sorted({*self._handlers, *self._streams})

    @property
    def streaming_goals(self) -> list[str]:
        """The goals served by streaming handlers, sorted."""
        return sorted(self._streams)

    async def run(self, goal: str, inputs: Any, context: IntentContext) -> Any:
        """Run the (non-streaming) handler for ``goal``."""
        return await self._handlers[goal](inputs, context)

    def open_stream(self, goal: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        """The partial results of ``goal``: a streaming handler's, or a plain one's single result."""
        stream = self._streams.get(goal)
        if stream is not None:
            return stream(inputs, context)
        return self._single(goal, inputs, context)

    async def _single(self, goal: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        yield await self.run(goal, inputs, context)


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back: a JSON-RPC ``result`` or ``error`` member and the HTTP status."""

    http_status: int
    result: Any = None
    error: Mapping[str, Any] | None = None
    retry_after: int | None = None
    # A streamed answer (§6.4): the events' JSON-RPC ``result`` objects, in order.
    stream: AsyncIterator[Mapping[str, Any]] | None = None
    # Called by the adapter when the server shuts down in the middle of the stream.
    abort: Callable[[int], AsyncIterator[Mapping[str, Any]]] | None = None
    # What a byte-identical retry needs to give this very answer again (§6.1 step 7).
    stored: StoredReply | None = None

    @property
    def is_error(self) -> bool:
        """True for an error reply."""
        return self.error is not None


@dataclass(slots=True)
class _Audit:
    """Audit fields gathered while a request is processed (PROTOCOL.md §8)."""

    event: str
    started: float
    session_id: str | None = None
    client_did: str | None = None
    intent_goal: str | None = None
    sequence: int | None = None
    verified: bool = False
    deferred: bool = False  # a stream writes its record at its final event
    signature_checked: bool = False  # an Ed25519 verification was spent on this request
    extra: dict[str, Any] = field(default_factory=dict)


def _stale(what: str, ts: int, now: float) -> StaleTimestamp:
    return StaleTimestamp(f"{what} timestamp {ts} is not within 300 s of {int(now)}")


def parse_intent(value: Any) -> dict[str, Any]:
    """Shape of the ``intent`` object of §6.1 (-32602 for any deviation); returns it as given.

    The typed form is :class:`a2a_secure.protocol.models.Intent`.
    """
    Intent.parse(value)
    return value  # type: ignore[no-any-return]


class ServerProtocol:
    """One agent's server side of the handshake and intent protocol."""

    def __init__(
        self,
        identity: Identity,
        policy: Policy,
        *,
        store: Store,
        resolver: DIDResolver,
        dispatcher: IntentDispatcher,
        manifest_hash: str,
        limits: ServerLimits | None = None,
        audit: AuditHook | None = None,
        clock: Clock = time.time,
        random_bytes: RandomSource = os.urandom,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.identity = identity
        self.policy = policy
        self.store = store
        self.resolver = resolver
        self.dispatcher = dispatcher
        self.manifest_hash = manifest_hash
        self.limits = limits or ServerLimits()
        self._audit_hook = audit
        self._clock = clock
        self._monotonic = monotonic
        # Session id -> monotonic deadline, for the sessions this process opened: a wall
        # clock stepping back must not lengthen a session (ATTACKS.md G12). Other workers
        # sharing a store check the wall-clock expires_at of PROTOCOL.md §5.6; with Redis,
        # the session key's TTL (Redis's clock) ends the session for them as well.
        self._deadlines: dict[str, float] = {}
        self._random = random_bytes
        self._public_keys = [identity.public_key_entry()]
        # Live streamed answers by (session, sequence), and how many each DID has open.
        self._streams: dict[tuple[str, int], StreamRecord] = {}
        self._streams_by_did: dict[str, int] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._failures: dict[str, tuple[float, float]] = {}
        self._exactly_once = ExactlyOnce(self)

    # -- entry points ---------------------------------------------------------------------
    async def handle(self, method: str, params: Any, *, source: str = "") -> Reply:
        """Process one JSON-RPC call whose envelope is already valid; never raises."""
        audit = _Audit(event=method, started=self._clock())
        try:
            if method == "hello":
                reply = Reply(200, await self._hello(params, source, audit))
            elif method in ("proof", "accept_policy"):
                self._check_failure_budget(source)
                try:
                    if method == "proof":
                        reply = Reply(200, await self._proof(params, audit))
                    else:
                        reply = Reply(200, await self._accept(params, audit))
                except A2AError:
                    # Only failures that cost an Ed25519 verification spend the budget:
                    # cheap refusals (shape, unknown nonce, wrong kid) are cheap to repeat.
                    if audit.signature_checked:
                        self._spend_failure_budget(source)
                    raise
            elif method in INTENT_METHODS:
                reply = await self._intent_or_close(method, params, audit)
            else:
                raise MethodNotFound(f"unknown method {method[:64]!r}")
        except A2AError as exc:
            reply = self._unsigned_error(exc)
        except Exception:  # a bug must not leak a stack trace or kill the server
            reply = self._unsigned_error(InternalError())
        if not audit.deferred:
            self._audit(audit, reply)
        return reply

    def _bucket(self, source: str) -> float:
        """Refill and return the failure budget of ``source`` (monotonic time)."""
        now = time.monotonic()
        tokens, last = self._failures.get(source, (float(self.limits.failed_handshake_burst), now))
        tokens = min(
            float(self.limits.failed_handshake_burst),
            tokens + (now - last) * self.limits.failed_handshake_per_second,
        )
        self._failures[source] = (tokens, now)
        return tokens

    def _check_failure_budget(self, source: str) -> None:
        if self._bucket(source) < 1.0:
            raise Unavailable("too many failed handshake steps from this address", retry_after=1)

    def _spend_failure_budget(self, source: str) -> None:
        tokens = self._bucket(source)
        self._failures[source] = (tokens - 1.0, time.monotonic())
        if len(self._failures) > 10_000:
            # Bounded: forget the oldest sources (a full bucket is the default anyway).
            for key in list(self._failures)[:1000]:
                del self._failures[key]

    def reject(self, exc: A2AError, *, event: str = "reject") -> Reply:
        """The reply (and audit record) for a request refused before ``handle``."""
        reply = self._unsigned_error(exc)
        self._audit(_Audit(event=event, started=self._clock()), reply)
        return reply

    # -- audit ------------------------------------------------------------------------------
    def _audit(self, a: _Audit, reply: Reply) -> None:
        if self._audit_hook is None:
            return
        code = reply.error.get("code") if reply.error is not None else None
        self._audit_hook(
            event=a.event,
            role="server",
            session_id=a.session_id,
            client_did=a.client_did,
            server_did=self.identity.did,
            intent_goal=a.intent_goal,
            sequence=a.sequence,
            status="error" if reply.is_error else "success",
            duration_ms=round((self._clock() - a.started) * 1000, 3),
            error_code=code,
            verified=a.verified,
        )

    @staticmethod
    def _unsigned_error(exc: A2AError) -> Reply:
        retry = exc.retry_after if isinstance(exc, Unavailable) else None
        return Reply(exc.http_status, error=exc.to_error_object(), retry_after=retry)

    def _now(self) -> tuple[float, int]:
        now = self._clock()
        return now, int(now)

    # -- §5.1 HELLO → §5.2 CHALLENGE ------------------------------------------------------
    async def _hello(self, params: Any, source: str, audit: _Audit) -> dict[str, Any]:
        now, now_i = self._now()

        # §5.1 order, up to the DID syntax: string type and version, version (-32046), other
        # shapes, freshness (-32045), DID syntax. The claimed DID is audited once a string.
        def claimed(did: str) -> None:
            audit.client_did = did[:256]

        hello = Hello.parse(params, now=now, on_agent_did=claimed)
        agent_did = hello.agent_did
        client_manifest = hello.manifest_hash
        if agent_did == self.identity.did and not self.limits.allow_self_handshake:
            raise AuthenticationFailed("refusing a handshake with this agent's own DID")
        resolved: ResolvedDID = await self.resolver.resolve(agent_did)
        client_keys = m.bind_public_keys(PublicKeyEntry.pairs(hello.public_keys), resolved)

        nonce_b = encoding.b64u_encode(self._random(m.NONCE_BYTES))
        hello_hash = encoding.hash_of(params)  # §5: of the params as received
        policy = self.policy
        policy_hash = policy.hash
        payload = {
            "protocol_version": m.PROTOCOL_VERSION,
            "hello_hash": hello_hash,
            "client_did": agent_did,
            "server_did": self.identity.did,
            "nonce_a": hello.nonce,
            "nonce_b": nonce_b,
            "client_manifest_hash": client_manifest,
            "server_manifest_hash": self.manifest_hash,
            "policy_hash": policy_hash,
            "timestamp": now_i,
        }
        policy_signature = jws_sign(payload, self.identity, m.Typ.POLICY)
        challenge = {
            "type": "challenge",
            "protocol_version": m.PROTOCOL_VERSION,
            "nonce_b": nonce_b,
            "server_did": self.identity.did,
            "manifest_hash": self.manifest_hash,
            "public_keys": self._public_keys,
            "policy_hash": policy_hash,
            "policy_signature": policy_signature,
            "timestamp": now_i,
        }
        pending = PendingHandshake(
            nonce_b=nonce_b,
            nonce_a=hello.nonce,
            client_did=agent_did,
            client_agent_id=hello.agent_id,
            client_keys=client_keys,
            client_manifest_hash=client_manifest,
            server_manifest_hash=self.manifest_hash,
            hello_hash=hello_hash,
            challenge_hash=encoding.hash_of(challenge),
            policy=policy,
            policy_hash=policy_hash,
            policy_signature=policy_signature,
            created_at=now_i,
            expires_at=now_i + m.PENDING_LIFETIME,
            source=source,
        )
        added = await self.store.add_pending(
            pending,
            max_per_source=self.limits.max_pending_per_source,
            max_total=self.limits.max_pending_total,
            now=now,
        )
        if not added:
            raise Unavailable("too many pending handshakes", retry_after=5)
        return challenge

    # -- §5.3 PROOF → §5.4 POLICY ---------------------------------------------------------
    async def _pending_for(self, nonce_b: str) -> PendingHandshake:
        pending = await self.store.get_pending(nonce_b, self._clock())
        if pending is None:
            raise HandshakeUnknown("unknown or expired handshake")
        return pending

    async def _proof(self, params: Any, audit: _Audit) -> dict[str, Any]:
        proof = Proof.parse(params)
        header = proof.decoded[0]
        pending = await self._pending_for(proof.nonce_b)
        audit.client_did = pending.client_did
        if pending.proven_kid is not None:
            raise HandshakeUnknown("handshake already proven")
        kid = header.get("kid")
        key = pending.client_keys.get(kid) if isinstance(kid, str) else None
        if key is None or not isinstance(kid, str):
            raise AuthenticationFailed("proof kid is not a key the client's DID resolved to")
        audit.signature_checked = True
        payload = jws_verify(proof.proof_jws, key, typ=m.Typ.PROOF, kid=kid, decoded=proof.decoded)
        ts = ProofPayload.parse(
            payload,
            expected={
                "nonce_a": pending.nonce_a,
                "nonce_b": pending.nonce_b,
                "client_did": pending.client_did,
                "server_did": self.identity.did,
                "client_manifest_hash": pending.client_manifest_hash,
                "server_manifest_hash": pending.server_manifest_hash,
                "challenge_hash": pending.challenge_hash,
            },
        ).timestamp
        now = self._clock()
        if not is_fresh(ts, now):
            raise _stale("proof", ts, now)
        if not await self.store.mark_proven(pending.nonce_b, kid, now):
            raise HandshakeUnknown("handshake already proven or expired")
        audit.verified = True
        return {
            "type": "policy",
            "policy": pending.policy.to_dict(),
            "policy_hash": pending.policy_hash,
            "policy_signature": pending.policy_signature,
        }

    # -- §5.5 ACCEPT_POLICY → §5.6 SESSION ------------------------------------------------
    async def _accept(self, params: Any, audit: _Audit) -> dict[str, Any]:
        accept = AcceptPolicy.parse(params)
        pending = await self._pending_for(accept.nonce_b)
        audit.client_did = pending.client_did
        kid = pending.proven_kid
        if kid is None:
            raise HandshakeUnknown("handshake not proven")
        audit.signature_checked = True
        payload = jws_verify(
            accept.accept_jws, pending.client_keys[kid], typ=m.Typ.ACCEPT, kid=kid, decoded=accept.decoded
        )
        commitment = m.session_commitment(pending.nonce_a, pending.nonce_b, pending.policy_hash)
        ts = AcceptPayload.parse(
            payload,
            expected={
                "policy_hash": pending.policy_hash,
                "session_commitment": commitment,
                "nonce_a": pending.nonce_a,
                "nonce_b": pending.nonce_b,
                "client_did": pending.client_did,
                "server_did": self.identity.did,
            },
        ).timestamp
        now, now_i = self._now()
        if not is_fresh(ts, now):
            raise _stale("accept_policy", ts, now)
        audit.verified = True
        session_id = encoding.b64u_encode(self._random(m.SESSION_ID_BYTES))
        expires_at = now_i + pending.policy.session_timeout
        record = SessionRecord(
            session_id=session_id,
            session_commitment=commitment,
            client_did=pending.client_did,
            server_did=self.identity.did,
            client_kid=kid,
            client_key=pending.client_keys[kid],
            policy=pending.policy,
            created_at=now_i,
            expires_at=expires_at,
            client_agent_id=pending.client_agent_id,
        )
        opened = await self.store.open_session(
            pending.nonce_b, record, max_sessions=self.limits.max_sessions, now=now
        )
        if opened is OpenResult.HANDSHAKE_GONE:
            raise HandshakeUnknown("handshake already used or expired")
        if opened is OpenResult.FULL:
            raise Unavailable("too many open sessions", retry_after=30)
        self._note_deadline(session_id, pending.policy.session_timeout)
        audit.session_id = session_id
        session_payload = {
            "session_id": session_id,
            "session_commitment": commitment,
            "client_did": pending.client_did,
            "server_did": self.identity.did,
            "created_at": now_i,
            "expires_at": expires_at,
        }
        return {
            "type": "session",
            "session_id": session_id,
            "server_did": self.identity.did,
            "client_did": pending.client_did,
            "session_commitment": commitment,
            "created_at": now_i,
            "expires_at": expires_at,
            "public_keys": self._public_keys,
            "session_jws": jws_sign(session_payload, self.identity, m.Typ.SESSION),
        }

    # -- §6.1 / §6.3 intents and close --------------------------------------------------------
    def _signed_error(
        self, exc: A2AError, session_id: str, sequence: int, req_hash: str, now_i: int
    ) -> Reply:
        retry = exc.retry_after if isinstance(exc, Unavailable) else None
        error = {"code": exc.code, "message": exc.message, "data": dict(exc.data or {})}
        return self._error_reply(exc.http_status, error, retry, session_id, sequence, req_hash, now_i)

    def _error_reply(
        self,
        http_status: int,
        error: Mapping[str, Any],
        retry: int | None,
        session_id: str,
        sequence: int,
        req_hash: str,
        now_i: int,
    ) -> Reply:
        """A signed error; ``error`` is code, message and the data besides ``response_jws``."""
        signed = {"code": error["code"], "message": error["message"]}
        payload = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "status": "error",
            "error": signed,
            "timestamp": now_i,
        }
        data: dict[str, Any] = dict(error["data"])
        data["response_jws"] = jws_sign(payload, self.identity, m.Typ.RESPONSE)
        stored = StoredReply(http_status, error=error, signed_at=now_i)
        return Reply(http_status, error={**signed, "data": data}, retry_after=retry, stored=stored)

    def _success_reply(self, session_id: str, sequence: int, req_hash: str, result: Any, now_i: int) -> Reply:
        token = self._signed_result(session_id, sequence, req_hash, result, now_i)
        return Reply(
            200,
            {"status": "success", "sequence": sequence, "result": result, "response_jws": token},
            stored=StoredReply(200, result=result, signed_at=now_i),
        )

    def _from_stored(self, stored: StoredReply, session_id: str, sequence: int, req_hash: str) -> Reply:
        """The answer a byte-identical retry gets (§6.1 step 7)."""
        # A stored 503 (a handler that raised Unavailable) keeps its Retry-After on replay.
        data = stored.error.get("data") if stored.error is not None else None
        retry = data.get("retry_after") if isinstance(data, Mapping) else None
        retry = retry if type(retry) is int else None
        if stored.signed_at is None:  # kept as sent (written by an older version)
            return Reply(stored.http_status, stored.result, stored.error, retry)
        # Kept without its signature: Ed25519 is deterministic, so signing the same payload
        # again gives the same token, and the store holds a fraction of the bytes.
        if stored.error is None:
            return self._success_reply(session_id, sequence, req_hash, stored.result, stored.signed_at)
        return self._error_reply(
            stored.http_status, stored.error, retry, session_id, sequence, req_hash, stored.signed_at
        )

    def _signed_result(self, session_id: str, sequence: int, req_hash: str, result: Any, now_i: int) -> Any:
        payload = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "status": "success",
            "result": result,
            "timestamp": now_i,
        }
        return jws_sign(payload, self.identity, m.Typ.RESPONSE)

    async def _intent_or_close(self, method: str, params: Any, audit: _Audit) -> Reply:
        is_close = method == "close"
        # Step 1: shapes.
        req: IntentRequest | CloseRequest
        req = CloseRequest.parse(params) if is_close else IntentRequest.parse(params)
        session_id = req.session_id
        params_seq = req.sequence
        intent = req.intent
        token = req.request_jws
        if intent is not None:
            audit.intent_goal = intent.goal[:256]
            if intent.intent_id is not None:
                self._exactly_once.check(intent)
        audit.sequence = params_seq
        # Step 2: the session.
        now = self._clock()
        session = await self.store.get_session(session_id, now)
        if session is None or self._past_deadline(session_id):
            raise SessionUnknown("unknown, expired or closed session")
        audit.session_id = session_id
        audit.client_did = session.client_did
        # Step 3: commitment (not a secret, compared in constant time all the same).
        if not ct_equal(req.session_commitment, session.session_commitment):
            raise AuthenticationFailed("session_commitment does not match the session")
        # Step 4: signature with the client key pinned by the handshake.
        typ = m.Typ.CLOSE if is_close else m.Typ.REQUEST
        payload = jws_verify(token, session.client_key, typ=typ, kid=session.client_kid, decoded=req.decoded)
        audit.verified = True
        req_hash = m.request_hash(token)
        now_i = int(now)
        # Step 5: payload exact and equal to params; from here on errors are signed.
        try:
            expected: dict[str, Any] = {
                "session_id": session_id,
                "session_commitment": session.session_commitment,
                "sequence": params_seq,
            }
            signed: RequestPayload | ClosePayload
            if intent is None:
                signed = ClosePayload.parse(payload, expected=expected)
            else:
                expected["intent"] = intent.to_dict()
                signed = RequestPayload.parse(payload, expected=expected)
            sequence, ts = signed.sequence, signed.timestamp
        except A2AError as exc:
            return self._signed_error(exc, session_id, params_seq, req_hash, now_i)
        audit.sequence = sequence
        try:
            # Step 6: freshness.
            if not is_fresh(ts, now):
                raise _stale("request", ts, now)
            wants_stream = intent is not None and self._wants_stream(intent)
            if (
                wants_stream
                and (session_id, sequence) not in self._streams  # a retry of a live stream is no new one
                and not self._stream_capacity(session.client_did)
            ):
                # Checked before the sequence is consumed, so the same request may come back.
                raise Unavailable("too many open streams", retry_after=1)
            # Steps 7-8, one atomic check-and-update (with an intent_id, and its claim).
            once: Pending | None = None
            if intent is not None and intent.intent_id is not None:
                once = self._exactly_once.prepare(session, intent, wants_stream, now)
            if once is None:
                begin = await self.store.begin_request(
                    session_id,
                    session.client_did,
                    sequence,
                    req_hash,
                    rate_limit=None if is_close else session.policy.rate_limit,
                    rate_period=session.policy.rate_period,
                    now=now,
                )
            else:
                begin = await self._exactly_once.begin(
                    once, session, sequence, req_hash, rate_limit=session.policy.rate_limit, now=now
                )
            if begin.kind is BeginKind.GONE:
                raise SessionUnknown("unknown, expired or closed session")
            if begin.kind is BeginKind.STALE:
                raise SequenceError(f"sequence {sequence} is not greater than {begin.last_sequence}")
            if begin.kind is BeginKind.RATE_LIMITED:
                raise Unavailable("rate limit reached", retry_after=begin.retry_after)
            if begin.kind in (BeginKind.REPLAY, BeginKind.IN_PROGRESS):
                if once is not None and self._exactly_once.is_resumable(begin.reply):
                    return await self._exactly_once.resume(once, session_id, sequence, req_hash, audit)
                return await self._replay(session_id, sequence, req_hash, begin.reply, audit)
            if once is not None and once.claim is not None and once.claim.kind is not ClaimKind.NEW:
                return await self._exactly_once.answer(once, session_id, sequence, req_hash, audit)
        except A2AError as exc:
            return self._signed_error(exc, session_id, sequence, req_hash, now_i)
        # The sequence is consumed: whatever happens now is the stored answer.
        try:
            if is_close:
                reply = await self._close(session, sequence, req_hash)
            else:
                assert intent is not None
                reply = await self._run_intent(session, sequence, req_hash, intent, audit)
        except A2AError as exc:
            reply = self._signed_error(exc, session_id, sequence, req_hash, int(self._clock()))
        except Exception:
            reply = self._signed_error(InternalError(), session_id, sequence, req_hash, int(self._clock()))
        if not is_close and reply.stored is not None:  # a stream stores its events itself
            # The intent ran: its answer goes out even if the store cannot keep it (a shared
            # store down). A byte-identical retry then finds no stored answer and gets 503.
            with contextlib.suppress(Exception):
                await self.store.finish_request(session_id, sequence, reply.stored)
            if once is not None:
                await self._exactly_once.finish(session_id, sequence, reply.stored)
        return reply

    def _wants_stream(self, intent: Intent) -> bool:
        flag = intent.stream
        return flag is True or (flag is None and self.dispatcher.is_always_streamed(intent.goal))

    async def _replay(
        self, session_id: str, sequence: int, req_hash: str, stored: StoredReply | None, audit: _Audit
    ) -> Reply:
        # Waiting is measured on the event loop's monotonic clock, not the protocol clock.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.replay_wait_seconds
        while stored is None:
            live = self._streams.get((session_id, sequence))
            # Only once it has its first event: until then the stream may still end as an
            # ordinary JSON error (§6.4), which the retry then gets from the store.
            if live is not None and live.count > 0:
                reader = live.reader(
                    replay=True, overflow_event=self._overflow(session_id, sequence, req_hash)
                )
                audit.deferred = True
                return Reply(200, stream=self._audited(reader, audit), abort=live.abort)
            if loop.time() >= deadline:
                raise Unavailable("the original request is still running", retry_after=1)
            await asyncio.sleep(0.01)
            begin = await self.store.begin_request(
                session_id, "", sequence, req_hash, rate_limit=None, rate_period=1, now=self._clock()
            )
            if begin.kind is BeginKind.REPLAY:
                stored = begin.reply
            elif begin.kind is not BeginKind.IN_PROGRESS:
                raise SequenceError(f"sequence {sequence} is no longer the last accepted")
        if stored.events is not None:
            replayed = self._replay_stored(stored, session_id, sequence, req_hash)
            audit.deferred = True
            return Reply(200, stream=self._audited(replayed, audit))
        return self._from_stored(stored, session_id, sequence, req_hash)

    def _note_deadline(self, session_id: str, lifetime: int) -> None:
        if len(self._deadlines) >= self.limits.max_sessions:
            now = self._monotonic()
            for sid in [k for k, v in self._deadlines.items() if v <= now]:
                del self._deadlines[sid]
        self._deadlines[session_id] = self._monotonic() + lifetime

    def _past_deadline(self, session_id: str) -> bool:
        deadline = self._deadlines.get(session_id)
        if deadline is None or self._monotonic() < deadline:
            return False
        del self._deadlines[session_id]
        return True

    async def _close(self, session: SessionRecord, sequence: int, req_hash: str) -> Reply:
        await self.store.close_session(session.session_id)
        self._deadlines.pop(session.session_id, None)
        result = {"type": "closed", "session_id": session.session_id}
        token = self._signed_result(session.session_id, sequence, req_hash, result, int(self._clock()))
        return Reply(200, {**result, "response_jws": token})

    async def _run_intent(
        self,
        session: SessionRecord,
        sequence: int,
        req_hash: str,
        intent: Intent,
        audit: _Audit,
    ) -> Reply:
        goal = intent.goal
        # Step 9: the policy agreed in the handshake, not today's configuration.
        if not session.policy.allows(goal):
            raise PolicyViolation(f"intent {goal[:64]!r} is not allowed by the session policy")
        # Step 10: a handler.
        if not self.dispatcher.has(goal):
            raise MethodNotFound(f"no handler for intent {goal[:64]!r}")
        # Step 11: run within min(timeout_ms, server maximum).
        constraints = intent.constraints_dict
        timeout_ms = min(
            constraints.get("timeout_ms", self.limits.max_handler_timeout_ms),
            self.limits.max_handler_timeout_ms,
        )
        context = IntentContext(
            caller_did=session.client_did,
            session_id=session.session_id,
            sequence=sequence,
            goal=goal,
            domain=intent.domain,
            constraints=constraints,
            client_agent_id=session.client_agent_id,
            intent_id=intent.intent_id,
        )
        inputs = intent.inputs
        if intent.stream is False and self.dispatcher.is_always_streamed(goal):
            raise InvalidParams(f"intent {goal[:64]!r} is always streamed; stream: false is not allowed")
        if self._wants_stream(intent):
            return await self._start_stream(
                session, sequence, req_hash, goal, inputs, context, timeout_ms, audit
            )
        if self.dispatcher.is_streaming(goal):
            # A streaming goal asked without stream: one result, the array of its partials.
            work: Awaitable[Any] = self._collect(self.dispatcher.open_stream(goal, inputs, context))
        else:
            work = self.dispatcher.run(goal, inputs, context)
        result = await self._call_handler(work, timeout_ms)
        return self._success_reply(session.session_id, sequence, req_hash, result, int(self._clock()))

    @staticmethod
    async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
        return [item async for item in stream]

    @staticmethod
    def _handler_error(exc: BaseException, timeout_ms: int) -> A2AError:
        """The §6.1 step 11 error for what a handler raised (no text of a foreign exception)."""
        if isinstance(exc, TimeoutError):
            return IntentTimeout(f"intent did not finish within {timeout_ms} ms")
        if isinstance(exc, InvalidParams):
            return InvalidParams(exc.message[:200])
        if isinstance(exc, A2AError):
            return exc
        return InternalError("the intent handler failed")

    @staticmethod
    def _check_result(result: Any) -> None:
        # The result sits two containers deep in the reply the client parses (§6.2).
        if encoding.ijson_problem(result, max_depth=encoding.MAX_DEPTH - 2) is not None:
            raise InternalError("the intent handler returned a value that is not I-JSON")

    async def _call_handler(self, work: Awaitable[Any], timeout_ms: int) -> Any:
        # asyncio.timeout runs the handler in this task: no task is created per intent.
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                result = await work
        except Exception as exc:
            raise self._handler_error(exc, timeout_ms) from None
        self._check_result(result)
        return result

    # -- §6.4 streamed answers --------------------------------------------------------------
    def _stream_capacity(self, did: str) -> bool:
        return (
            len(self._streams) < self.limits.max_streams_total
            and self._streams_by_did.get(did, 0) < self.limits.max_streams_per_did
        )

    def _event(
        self,
        session_id: str,
        sequence: int,
        req_hash: str,
        index: int,
        final: bool,
        *,
        result: Any = None,
        error: A2AError | None = None,
    ) -> dict[str, Any]:
        """One signed event's JSON-RPC ``result`` object (typ ``a2a-event+jws``)."""
        payload: dict[str, Any] = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "index": index,
            "final": final,
        }
        if error is not None:
            body: dict[str, Any] = {
                "status": "error",
                "error": {"code": error.code, "message": error.message},
            }
        else:
            body = {"status": "success", "result": result}
        payload.update(body)
        payload["timestamp"] = int(self._clock())
        token = jws_sign(payload, self.identity, m.Typ.EVENT)
        out: dict[str, Any] = {"status": body["status"], "sequence": sequence, "index": index, "final": final}
        out.update({k: v for k, v in body.items() if k != "status"})
        out["response_jws"] = token
        return out

    def _overflow(self, session_id: str, sequence: int, req_hash: str) -> Callable[[int], Mapping[str, Any]]:
        def make(index: int) -> Mapping[str, Any]:
            exc = Unavailable("stream events past the replay bound were not kept", retry_after=1)
            return self._event(session_id, sequence, req_hash, index, True, error=exc)

        return make

    async def _audited(
        self, events: AsyncIterator[Mapping[str, Any]], audit: _Audit
    ) -> AsyncIterator[Mapping[str, Any]]:
        """A replayed stream is one audit record, written at its final event with its status.

        The caller sets ``audit.deferred`` before handing this generator out (its body runs
        only when the adapter starts reading).
        """
        code: int | None = None
        try:
            async for event in events:
                if event.get("final") is True and event.get("status") == "error":
                    code = event["error"]["code"]
                yield event
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()
            self._audit(audit, Reply(200, error={"code": code, "message": ""} if code is not None else None))

    async def _replay_stored(
        self, stored: StoredReply, session_id: str, sequence: int, req_hash: str
    ) -> AsyncIterator[Mapping[str, Any]]:
        events = stored.events or ()
        for ev in events:
            yield ev
        if stored.truncated:
            yield self._overflow(session_id, sequence, req_hash)(len(events))

    async def _start_stream(
        self,
        session: SessionRecord,
        sequence: int,
        req_hash: str,
        goal: str,
        inputs: Any,
        context: IntentContext,
        timeout_ms: int,
        audit: _Audit,
    ) -> Reply:
        rec = StreamRecord(session.session_id, sequence)
        # The request that starts the stream subscribes before the first event exists.
        reader = rec.reader(replay=False)
        first_event: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stream = self.dispatcher.open_stream(goal, inputs, context)
        single = not self.dispatcher.is_streaming(goal)
        key = (session.session_id, sequence)
        self._streams[key] = rec
        did = session.client_did
        self._streams_by_did[did] = self._streams_by_did.get(did, 0) + 1
        pump = asyncio.create_task(
            self._pump(rec, stream, first_event, session, req_hash, timeout_ms, single, audit)
        )
        rec.pump = pump
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        try:
            await asyncio.shield(first_event)
        except A2AError:
            # Failures up to the first event are ordinary signed JSON errors (stored as such).
            await reader.aclose()
            raise
        audit.deferred = True
        return Reply(200, stream=reader, abort=rec.abort)

    async def _pump(
        self,
        rec: StreamRecord,
        stream: AsyncIterator[Any],
        first_event: asyncio.Future[None],
        session: SessionRecord,
        req_hash: str,
        timeout_ms: int,
        single: bool,
        audit: _Audit,
    ) -> None:
        """Run the handler to its end, publishing signed events, whoever is still listening."""
        sid, seq = session.session_id, rec.sequence
        index = 0
        final_error: A2AError | None = None

        def publish(event: dict[str, Any]) -> None:
            payload = event.get("result") if "result" in event else event.get("error")
            rec.publish(event, result_size(payload))
            if not first_event.done():
                first_event.set_result(None)

        try:
            while True:
                try:
                    item = await asyncio.wait_for(anext(stream), timeout_ms / 1000)
                except StopAsyncIteration:
                    if single:
                        raise InternalError("the intent handler produced no result") from None
                    publish(self._event(sid, seq, req_hash, index, True, result=None))
                    break
                self._check_result(item)
                now = self._clock()
                if (
                    session.expired(now)
                    or self._past_deadline(sid)
                    or await self.store.get_session(sid, now) is None
                ):
                    raise SessionUnknown("the session ended during the stream")
                event = self._event(sid, seq, req_hash, index, single, result=item)
                # §6.4: an event is at most 1 MiB (the result travels twice: in the event and
                # base64url-encoded in its signature). A bigger one ends the stream instead.
                if len(encoding.dumps(event)) > MAX_EVENT_BYTES - 256:
                    raise InternalError("a partial result is too large for one event")
                publish(event)
                index += 1
                if single:
                    break
        except asyncio.CancelledError:
            final_error = InternalError("server shutting down")
            if first_event.done():
                publish(self._event(sid, seq, req_hash, index, True, error=final_error))
            else:
                first_event.set_exception(final_error)
            raise
        except Exception as exc:
            final_error = self._handler_error(exc, timeout_ms)
            if first_event.done():
                publish(self._event(sid, seq, req_hash, index, True, error=final_error))
            else:
                first_event.set_exception(final_error)
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
            self._streams.pop((sid, seq), None)
            left = self._streams_by_did.get(session.client_did, 1) - 1
            if left > 0:
                self._streams_by_did[session.client_did] = left
            else:
                self._streams_by_did.pop(session.client_did, None)
        if first_event.done() and first_event.exception() is None:
            stored = StoredReply(200, events=tuple(rec.kept), truncated=rec.overflow)
            with contextlib.suppress(Exception):
                await self.store.finish_request(sid, seq, stored)
            if self._exactly_once.running:
                await self._exactly_once.finish(sid, seq, stored)
            code = final_error.code if final_error is not None else None
            error = {"code": code, "message": ""} if code is not None else None
            self._audit(audit, Reply(200, error=error))


def endpoint_of(method: str) -> Literal["handshake", "intent"] | None:
    """Which endpoint serves ``method`` (PROTOCOL.md §4), or None."""
    if method in HANDSHAKE_METHODS:
        return "handshake"
    if method in INTENT_METHODS:
        return "intent"
    return None
