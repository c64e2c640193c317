"""Exactly once across sessions: the server side of the ``intent_id`` extension.

PROTOCOL.md §6.1 runs a request at most once per (session, sequence). A client that loses
its session (an expiry, a server restart, or an on-path attacker forging the unsigned
-32043) and sends the same intent again on a new session would run it twice: nothing ties
the two requests together. With the extension (PROTOCOL.md §12.5) the client puts
a random ``intent_id`` inside the signed intent; the server remembers (caller DID,
intent_id) with the hash of the intent and its answer for ``ServerLimits.intent_id_retention``
seconds, in the shared store, whatever happens to the session. The claim is this agent's
(the server DID the session was opened with): another agent sharing the store neither
finds it nor counts it against its own per-DID bound.

After §6.1 steps 1-8 (the sequence consumed and the rate counted as for any request), a
request with an ``intent_id`` claims (DID, intent_id) in the same atomic store step
(:meth:`~a2a_secure.store.intents.IntentStore.begin_intent`):

====================  ==================================================================
claim                 answer (signed under the NEW session, for the NEW request)
====================  ==================================================================
new                   the start is recorded (:meth:`ExactlyOnce.start`), then the intent
                      runs; its answer is kept with the claim BEFORE it is sent
not started, same     (a claim whose handler never started: its worker died or paused
intent                between the claim and the start, or the replicas did not confirm it)
                      taken over by this request, which runs it as a new one; the first
                      owner's start then fails and it does not run (it waits for this
                      run's answer instead)
done, same intent     the first run's answer, signed again now; the handler does not run
running, same intent  wait for the first run's answer up to ``replay_wait_seconds``, then
                      503 -32048 "still running" with Retry-After (never a second run); a
                      byte-identical retry of that request waits again
lost, same intent     504 -32049 "outcome unknown": the first run started and never
                      reported (its worker died, or the server stopped, mid-run) within
                      the claim's lease (the handler timeout plus
                      ``ServerLimits.claim_lease_margin``); the intent is not run again
another intent        409 -32044 "intent_id already used for a different intent"
DID bound reached     503 -32048, nothing consumed (as a rate-limited request)
store bound reached   503 -32048, nothing consumed (``max_intent_ids_total``)
====================  ==================================================================

Every such answer is also stored as the answer to the new (session, sequence), so a
byte-identical retry of the resend is answered as §6.1 step 7 says. Requests without an
``intent_id`` never reach this module.

The claim is made only for an intent that passes steps 9 and 10 (the session's policy, the
caller's priority rights, a handler that serves it as asked; pure checks, made by the
caller of :meth:`ExactlyOnce.prepare`): a refused intent does not use up its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from a2a_secure.delegation import DELEGATION
from a2a_secure.errors import (
    A2AError,
    IntentTimeout,
    InvalidParams,
    SequenceError,
    Unavailable,
    error_for_code,
)
from a2a_secure.identity import encoding
from a2a_secure.protocol.capacity import OWN, SHARED, full
from a2a_secure.protocol.intent_id import INTENT_ID, ids_full_message, store_full_message
from a2a_secure.protocol.priority import EXTENSION as PRIORITY
from a2a_secure.protocol.sealing import SEALED
from a2a_secure.runtime.signing import finish_events, may_pend
from a2a_secure.store.base import Begin, SessionRecord, StoredReply
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest, IntentStore, supports_intent_ids

if TYPE_CHECKING:
    from a2a_secure.protocol.models import Intent
    from a2a_secure.protocol.server.auditing import AuditFields
    from a2a_secure.protocol.server.common import Clock, Reply, ServerConfig, ServerLimits
    from a2a_secure.protocol.server.events import EventSigner
    from a2a_secure.protocol.server.replies import SignedReplies
    from a2a_secure.runtime.replay import Replayer

__all__ = ["STILL_RUNNING", "ExactlyOnce", "server_extensions"]

STILL_RUNNING: Final = "an earlier request with this intent_id is still running"


def server_extensions(limits: ServerLimits, store: object, *, delegation: bool = False) -> list[str]:
    """The extensions a server with ``limits`` and ``store`` serves, for its agent card.

    The one place the card's ``a2a_secure_extensions`` list comes from. ``delegation``: the
    server accepts delegation chains (§12.6, configured by ``ServerConfig.delegation``).
    """
    out: set[str] = {PRIORITY}  # every server of this version reads and schedules it (§12.3)
    if limits.intent_id_retention > 0 and supports_intent_ids(store):
        out.add(INTENT_ID)
    if limits.sealed_intents:
        out.add(SEALED)
    if delegation:
        out.add(DELEGATION)
    return sorted(out)


@dataclass(slots=True)
class Pending:
    """A request with an ``intent_id``, from its claim to its answer."""

    client_did: str
    intent_id: str
    intent_hash: str
    running_until: int
    claim: Claim | None = None
    agent: str = ""  # the server DID the claim belongs to (the session's)
    # This request's token: only it may record the start of the claim it made.
    owner: bytes = b""
    # The longest the run may take (a stream: its session's end), and when a stream next
    # moves its lease on (wall clock, as running_until).
    keep_until: int = 0
    renew_at: float = 0.0
    claimed_at: float = 0.0  # wall clock, when the claim was prepared
    # Sealed intents (protocol/sealed_claims.py): the answer as the claim keeps it (sealed under
    # the intent's answer key), and back, sealed for this request's session.
    to_claim: Callable[[StoredReply], StoredReply] | None = None
    from_claim: Callable[[StoredReply, int, str], StoredReply] | None = None


def _is_still_running(stored: StoredReply | None) -> bool:
    err = stored.error if stored is not None else None
    # A handler could raise this very error too: re-reading the claim then gives the same
    # answer (the claim holds it), so taking it for the marker is harmless.
    return err is not None and err.get("code") == Unavailable.code and err.get("message") == STILL_RUNNING


def _compact(stored: StoredReply) -> StoredReply:
    """``stored`` as a claim keeps it: events without their signatures (signed again on use)."""
    if stored.events is None:
        return stored
    events = tuple({k: v for k, v in ev.items() if k != "response_jws"} for ev in stored.events)
    return replace(stored, events=events)


class ExactlyOnce:
    """The ``intent_id`` decisions of one server (see the module docstring).

    State: the claims this process made whose run has not reported yet (``running``);
    everything else lives in the store of the :class:`ServerConfig`.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        replies: SignedReplies,
        replayer: Replayer,
        events: EventSigner,
        clock: Clock,
    ) -> None:
        self._config = config
        self._replies = replies
        self._replayer = replayer
        self._events = events
        self._clock = clock
        # Claims made here whose run has not reported yet, by (session id, sequence).
        self.running: dict[tuple[str, int], Pending] = {}
        # Writes to the store tried again in the background (_retry_later).
        self._later: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        """Whether this server serves the extension (read at each use: the store may change)."""
        return INTENT_ID in server_extensions(self._config.limits, self._config.store)

    @property
    def _store(self) -> IntentStore:
        return self._config.store  # type: ignore[return-value]  # checked by server_extensions

    def check(self, intent: Intent) -> None:
        """Step 1 for a server without the extension: ``intent_id`` is an unknown member."""
        if not self.enabled:
            raise InvalidParams(f"intent: unexpected member {INTENT_ID!r}")

    def prepare(
        self,
        session: SessionRecord,
        intent: Intent,
        intent_obj: Mapping[str, Any],
        wants_stream: bool,
        now: float,
    ) -> Pending:
        """The claim this request will make; only for an intent that passed steps 9 and 10.

        ``intent_obj`` is the intent as signed (step 5 compared it with the payload's).
        """
        assert intent.intent_id is not None
        # Past the longest a run can take, a started claim still RUNNING is LOST. The margin
        # covers the answer's way to the store and clock differences between workers. A
        # stream's run is bounded by its session (checked at each event) and the timeout
        # between two events: its lease is one handler timeout, moved on as events come
        # (renew), and the claim is kept at least as long as the session could run it.
        limits = self._config.limits
        lease = limits.max_handler_timeout_ms / 1000
        running_until = math.ceil(now + lease) + limits.claim_lease_margin
        end = max(now, session.expires_at) if wants_stream else now
        keep_until = math.ceil(end + lease) + limits.claim_lease_margin
        return Pending(
            session.client_did,
            intent.intent_id,
            encoding.hash_of(intent_obj),
            running_until,
            agent=session.server_did,
            owner=secrets.token_bytes(16),
            keep_until=keep_until,
            renew_at=now + limits.claim_lease_margin / 2,
            claimed_at=now,
        )

    async def begin(
        self,
        pending: Pending,
        session: SessionRecord,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        now: float,
    ) -> Begin:
        """§6.1 steps 7-8 and the claim, in one store step; FULL raises (nothing consumed)."""
        limits = self._config.limits
        expires_at = max(
            int(now) + limits.intent_id_retention,
            max(pending.running_until, pending.keep_until) + limits.claim_lease_margin,
        )
        begin, claim = await self._store.begin_intent(
            session.session_id,
            session.client_did,
            sequence,
            request_hash,
            rate_limit=rate_limit,
            rate_period=session.policy.rate_period,
            now=now,
            claim=ClaimRequest(
                pending.intent_id,
                pending.intent_hash,
                pending.running_until,
                expires_at,
                limits.max_intent_ids_per_did,
                self._config.limit_for(limits.max_intent_ids_total, session.client_did),
                pending.owner,
            ),
            agent=pending.agent,
        )
        if claim is not None and claim.kind is ClaimKind.FULL:
            message = ids_full_message(limits.max_intent_ids_per_did)
            raise full(message, retry_after=claim.retry_after, pool=OWN)
        if claim is not None and claim.kind is ClaimKind.TOTAL_FULL:
            message = store_full_message(limits.max_intent_ids_total)
            raise full(message, retry_after=claim.retry_after, pool=SHARED)
        pending.claim = claim
        if claim is not None and claim.kind is ClaimKind.NEW:
            self.running[(session.session_id, sequence)] = pending
        return begin

    async def start(
        self, pending: Pending, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply | None:
        """Record that the handler of a NEW claim starts: None, run it; else the answer.

        Called by every path that runs an intent with an ``intent_id`` (unary and streamed)
        right before its handler. The start is what tells "never ran" (a resend takes the
        claim over) from "outcome unknown". When another request took the claim over in
        between, this one waits for that run's answer as a resend would; when the store
        cannot record the start, 503 (the claim stays unstarted: a resend runs it).
        """
        try:
            started = await self._store.start_intent(
                pending.client_did,
                pending.intent_id,
                pending.intent_hash,
                pending.owner,
                agent=pending.agent,
            )
        except Unavailable as exc:
            self.running.pop((session_id, sequence), None)
            # The start may have reached the store with its reply lost: give it back when the
            # store is back, so that a resend takes the claim over instead of waiting for
            # its lease to end ("outcome unknown") on an intent that never ran.
            self._retry_later(
                pending,
                functools.partial(
                    self._store.start_intent,
                    pending.client_did,
                    pending.intent_id,
                    pending.intent_hash,
                    pending.owner,
                    started=False,
                    agent=pending.agent,
                ),
            )
            return await self._error(exc, session_id, sequence, req_hash)
        if started:
            return None
        self.running.pop((session_id, sequence), None)
        return await self._settle(pending, Claim(ClaimKind.RUNNING), session_id, sequence, req_hash, audit)

    async def renew(self, session_id: str, sequence: int, now: float) -> None:
        """A stream goes on: move its claim's lease past ``now`` (at most every half margin).

        A lease the store cannot move lapses: resends are then told "outcome unknown" while
        the stream still runs, never run it again.
        """
        pending = self.running.get((session_id, sequence))
        if pending is None or now < pending.renew_at:
            return
        limits = self._config.limits
        pending.renew_at = now + limits.claim_lease_margin / 2
        running_until = math.ceil(now + limits.max_handler_timeout_ms / 1000) + limits.claim_lease_margin
        with contextlib.suppress(Unavailable):
            await self._store.renew_intent(
                pending.client_did,
                pending.intent_id,
                pending.intent_hash,
                pending.owner,
                running_until,
                agent=pending.agent,
            )

    def is_resumable(self, stored: StoredReply | None) -> bool:
        """Whether a byte-identical retry finds the "still running" answer of a resend."""
        return _is_still_running(stored)

    async def answer(
        self, pending: Pending, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply:
        """The answer to a request whose claim was not NEW (it does not run the intent)."""
        claim = pending.claim
        assert claim is not None
        return await self._settle(pending, claim, session_id, sequence, req_hash, audit)

    async def resume(
        self, pending: Pending, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply:
        """A byte-identical retry of a resend that was answered "still running"."""
        claim = await self._store.get_claim(
            pending.client_did, pending.intent_id, pending.intent_hash, self._clock(), agent=pending.agent
        )
        return await self._settle(pending, claim, session_id, sequence, req_hash, audit)

    async def finish(self, session_id: str, sequence: int, stored: StoredReply) -> None:
        """Keep the answer of a run this process claimed (a no-op for any other request)."""
        pending = self.running.pop((session_id, sequence), None)
        if pending is None:
            return
        # Kept before the answer is sent (finish_intent waits for the store): a worker that
        # dies after sending leaves the answer for the resends. The intent ran: its answer
        # goes out even if the store cannot keep it now; this process tries again until the
        # claim's lease ends (a resend meanwhile waits, or is told "still running"). Past it,
        # or if this process dies first, the claim is LOST: a resend is told "outcome
        # unknown", never re-run.
        try:
            if pending.to_claim is not None:
                stored = pending.to_claim(stored)
        except Exception:  # (sealing it for the claim failed: nothing to keep)
            return
        keep = functools.partial(
            self._store.finish_intent,
            pending.client_did,
            pending.intent_id,
            pending.intent_hash,
            _compact(stored),
            agent=pending.agent,
        )
        try:
            await keep()
        except Exception:
            self._retry_later(pending, keep)

    def _retry_later(self, pending: Pending, attempt: Callable[[], Awaitable[object]]) -> None:
        """Call ``attempt`` again in the background until it succeeds, for as long as the
        claim's lease is (what it writes is conditional on the claim: late is harmless).

        The length of the lease, not its end: timed by the loop's monotonic clock, so that a
        step of the wall clock neither ends the retries at once nor prolongs them.
        """
        lease = max(1.0, pending.running_until - pending.claimed_at)
        task = asyncio.ensure_future(self._again(asyncio.get_running_loop().time() + lease, attempt))
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _again(self, until: float, attempt: Callable[[], Awaitable[object]]) -> None:
        delay = 0.05
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)
            try:
                await attempt()
            except Exception:  # noqa: S112 - the store is still away: later
                continue
            return

    # -- answers ------------------------------------------------------------------------------------
    async def _settle(
        self,
        pending: Pending,
        claim: Claim,
        session_id: str,
        sequence: int,
        req_hash: str,
        audit: AuditFields,
    ) -> Reply:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.limits.replay_wait_seconds
        delay = 0.01
        while claim.kind is ClaimKind.RUNNING:
            if loop.time() >= deadline:
                return await self._error(
                    Unavailable(STILL_RUNNING, retry_after=1), session_id, sequence, req_hash
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.1)
            claim = await self._store.get_claim(
                pending.client_did, pending.intent_id, pending.intent_hash, self._clock(), agent=pending.agent
            )
        if claim.kind is ClaimKind.DONE and claim.reply is not None:
            answer = claim.reply
            # §12.6: an answer kept under an answer key is sealed again for this request.
            sealed = pending.from_claim is not None
            if pending.from_claim is not None:
                answer = pending.from_claim(answer, sequence, req_hash)
            return await self._replay(answer, session_id, sequence, req_hash, audit, sealed=sealed)
        if claim.kind is ClaimKind.CONFLICT:
            exc: A2AError = SequenceError("intent_id already used for a different intent")
        else:  # LOST, or UNKNOWN: the claim is gone (its retention ended, or the store lost it)
            exc = IntentTimeout("outcome unknown: the first run of this intent_id did not report an answer")
        return await self._error(exc, session_id, sequence, req_hash)

    async def _keep(self, session_id: str, sequence: int, stored: StoredReply | None) -> None:
        if stored is not None:
            with contextlib.suppress(Exception):
                await self._config.store.finish_request(session_id, sequence, stored)

    async def _error(self, exc: A2AError, session_id: str, sequence: int, req_hash: str) -> Reply:
        reply = self._replies.error(exc, session_id, sequence, req_hash, int(self._clock()))
        await self._keep(session_id, sequence, reply.stored)
        return reply

    async def _replay(
        self,
        answer: StoredReply,
        session_id: str,
        sequence: int,
        req_hash: str,
        audit: AuditFields,
        *,
        sealed: bool,
    ) -> Reply:
        """The first run's answer, signed now for this session and request (and kept for it)."""
        if answer.events is None:
            stored = replace(answer, signed_at=int(self._clock()))
        else:
            events = tuple(self._resign(ev, session_id, sequence, req_hash, sealed) for ev in answer.events)
            if may_pend(self._config):  # kept signed: a remote key's signatures, awaited at once
                await finish_events(events)
            stored = StoredReply(200, events=events, truncated=answer.truncated)
        await self._keep(session_id, sequence, stored)
        return await self._replayer.answer(session_id, sequence, req_hash, stored, audit, sealed=sealed)

    def _resign(
        self, event: Mapping[str, Any], session_id: str, sequence: int, req_hash: str, sealed: bool
    ) -> dict[str, Any]:
        error = None
        if event.get("status") == "error":
            error = error_for_code(event["error"]["code"], event["error"]["message"])
        return self._events.event(
            session_id,
            sequence,
            req_hash,
            event["index"],
            event["final"],
            result=event.get("result"),
            error=error,
            sealed=sealed,
        )
