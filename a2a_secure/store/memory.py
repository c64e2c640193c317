"""The embedded in-memory store: one process, no I/O, every method atomic.

Atomicity comes from the event loop: no method awaits before it has finished its
check-and-update. Expired entries are dropped lazily, and an entry still inside its window
is never evicted. Every bound answers in constant time however full it is: each kind of
entry has an expiry index (a heap, earliest expiry on top) from which the entries that
have expired are popped before a bound is checked, amortised O(log n) per entry over its
life, and the counts a bound compares are kept as they change, never summed. A heap entry
whose record has gone meanwhile (closed, decided, made again) is skipped when popped, and
a heap that holds more such leftovers than live entries is rebuilt (amortised O(1)).
Expired sessions also go on a timer (:meth:`MemoryStore.sweep_expired`, run by the server's
sweep): their keys do not wait for a look-up that may never come.

The sections follow the families of keys of the Redis store, one module each there:
pending handshakes (``redis_handshakes.py``), sessions with their sequences, stored answers
and rate windows (``redis_sessions.py``), intent ids (``redis_intents.py``), revocations
(``redis_revocations.py``) and actions waiting for approval (``redis_actions.py``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from a2a_secure.identity import encoding
from a2a_secure.store.base import (
    Added,
    Begin,
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    StoredReply,
)
from a2a_secure.store.expiry import SWEEP_LIMIT, ExpiryIndex, heap_needs_compacting, pop_expired
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest
from a2a_secure.store.memory_actions import MemoryActions
from a2a_secure.store.revocation import DID_FIELD, Revocation

__all__ = ["MemoryStore"]

_RATES_SWEEP_MIN = 1024


@dataclass(slots=True)
class _SeqState:
    last: int = 0
    request_hash: str = ""
    # The stored answer as compact JSON: a retry is rare, every open session keeps one, and
    # bytes take about a third of the memory of the equivalent dicts and strings.
    reply: bytes | None = None


@dataclass(slots=True)
class _ClaimState:
    intent_hash: str
    running_until: int
    expires_at: int
    reply: bytes | None = None  # the answer as compact JSON, once the run reported it
    owner: bytes = b""  # the token of the request that made (or took over) the claim
    started: bool = True  # whether its handler started (store/intents.py)


class MemoryStore(MemoryActions):
    """In-process implementation of :class:`a2a_secure.store.base.Store`.

    Several servers may share one instance: every key space names its agent (the server
    DID) or is safe to share, as on Redis (SECURITY.md, "Agents sharing one store").
    """

    def __init__(self) -> None:
        # (agent, nonce_b) -> handshake: another agent never finds it.
        self._pending: dict[tuple[str, str], PendingHandshake] = {}
        self._pending_by_source: dict[str, int] = {}
        self._pending_by_expiry: list[tuple[int, tuple[str, str]]] = []
        self._sessions: dict[str, SessionRecord] = {}
        self._by_expiry = ExpiryIndex()  # the sweep's order (store/expiry.py)
        self._seq: dict[str, _SeqState] = {}
        # (agent, client DID, period) -> (window start, count): a fixed window per DID at
        # each agent.
        self._rates: dict[tuple[str, str, int], tuple[int, int]] = {}
        self._rates_sweep_at = _RATES_SWEEP_MIN
        # Client DID -> {key id or "*": entry}: the deny list (a2a_secure.store.revocation).
        self._revoked: dict[str, dict[str, Revocation]] = {}
        self._revoked_epoch = 0  # moves at every change of the deny list
        self._init_actions()
        # Intent ids (store/intents.py): (agent, client DID, intent_id) -> claim, per (agent,
        # DID) its ids with their expiry (the per-DID bound), and every claim by expiry (the
        # total bound: the earliest expiry is at the top, so expired claims leave in order).
        self._claims: dict[tuple[str, str, str], _ClaimState] = {}
        self._claims_by_did: dict[tuple[str, str], dict[str, int]] = {}
        self._claims_by_expiry: list[tuple[int, tuple[str, str, str]]] = []

    async def aclose(self) -> None:
        """Nothing to release."""

    # -- pending handshakes ---------------------------------------------------------------
    def _drop_pending(self, key: tuple[str, str]) -> None:
        p = self._pending.pop(key, None)
        if p is not None:
            left = self._pending_by_source.get(p.source, 0) - 1
            if left > 0:
                self._pending_by_source[p.source] = left
            else:
                self._pending_by_source.pop(p.source, None)

    def _sweep_pending(self, now: float) -> None:
        for expires_at, key in pop_expired(self._pending_by_expiry, now):
            p = self._pending.get(key)
            if p is not None and p.expires_at == expires_at:
                self._drop_pending(key)
        if heap_needs_compacting(self._pending_by_expiry, len(self._pending)):
            self._pending_by_expiry = [(p.expires_at, k) for k, p in self._pending.items()]
            heapq.heapify(self._pending_by_expiry)

    async def add_pending(
        self, pending: PendingHandshake, *, max_per_source: int, max_total: int, now: float
    ) -> Added:
        """See :meth:`Store.add_pending`."""
        self._sweep_pending(now)
        if self._pending_by_source.get(pending.source, 0) >= max_per_source:
            return Added.OWN_FULL
        if len(self._pending) >= max_total:
            return Added.TOTAL_FULL
        key = (pending.server_did, pending.nonce_b)
        if key in self._pending:
            return Added.TAKEN
        self._pending[key] = pending
        heapq.heappush(self._pending_by_expiry, (pending.expires_at, key))
        self._pending_by_source[pending.source] = self._pending_by_source.get(pending.source, 0) + 1
        return Added.ADDED

    async def get_pending(self, nonce_b: str, now: float, *, agent: str = "") -> PendingHandshake | None:
        """See :meth:`Store.get_pending`."""
        p = self._pending.get((agent, nonce_b))
        if p is None:
            return None
        if p.expires_at <= now:
            self._drop_pending((agent, nonce_b))
            return None
        return p

    async def mark_proven(self, nonce_b: str, kid: str, now: float, *, agent: str = "") -> bool:
        """See :meth:`Store.mark_proven`."""
        p = await self.get_pending(nonce_b, now, agent=agent)
        if p is None or p.proven_kid is not None:
            return False
        self._pending[(agent, nonce_b)] = p.proven(kid)
        return True

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float, agent: str = ""
    ) -> OpenResult:
        """See :meth:`Store.open_session`."""
        p = await self.get_pending(nonce_b, now, agent=agent)
        if p is None or p.proven_kid is None:
            return OpenResult.HANDSHAKE_GONE
        # The sessions whose expiry has come leave from the top of the index, each once.
        self.sweep_expired(now, limit=len(self._by_expiry))
        if len(self._sessions) >= max_sessions:
            return OpenResult.FULL
        self._drop_pending((agent, nonce_b))
        self._sessions[session.session_id] = session
        self._seq[session.session_id] = _SeqState()
        self._by_expiry.add(session.expires_at, session.session_id)
        self._compact_index()  # closed sessions' entries, when no sweep runs
        return OpenResult.OPENED

    # -- sessions -------------------------------------------------------------------------
    def _forget(self, session_id: str) -> None:
        record = self._sessions.pop(session_id, None)
        self._seq.pop(session_id, None)  # its stored answers, sealed under its keys
        if record is not None:
            record.drop_sealer()

    def sweep_expired(self, now: float, *, limit: int = SWEEP_LIMIT) -> int:
        """Forget up to ``limit`` sessions expired at ``now`` (Unix seconds), earliest first.

        The records, their sealing keys and sealers, and their stored answers go; the cost is
        that of the due sessions (:class:`~a2a_secure.store.expiry.ExpiryIndex`). Returns how
        many were forgotten.
        """
        gone = 0
        for sid in self._by_expiry.due(now, limit):
            record = self._sessions.get(sid)
            if record is not None and record.expired(now):
                self._forget(sid)
                gone += 1
        self._compact_index()
        return gone

    def _compact_index(self) -> None:
        sessions = self._sessions
        self._by_expiry.compact(len(sessions), ((r.expires_at, s) for s, r in sessions.items()))

    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        """See :meth:`Store.get_session`."""
        return self.get_session_now(session_id, now)

    def get_session_now(self, session_id: str, now: float) -> SessionRecord | None:
        """:meth:`get_session` without a coroutine (:func:`a2a_secure.store.base.sync_forms`)."""
        s = self._sessions.get(session_id)
        if s is None:
            return None
        if s.expired(now):
            self._forget(session_id)
            return None
        return s

    async def begin_request(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        agent: str = "",
    ) -> Begin:
        """See :meth:`Store.begin_request`."""
        return self.begin_request_now(
            session_id,
            client_did,
            sequence,
            request_hash,
            rate_limit=rate_limit,
            rate_period=rate_period,
            now=now,
            agent=agent,
        )

    def begin_request_now(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        agent: str = "",
    ) -> Begin:
        """:meth:`begin_request` without a coroutine (:func:`a2a_secure.store.base.sync_forms`)."""
        session = self.get_session_now(session_id, now)
        if session is None:
            return Begin(BeginKind.GONE)
        revoked = self._revoked.get(session.client_did)
        if revoked and (DID_FIELD in revoked or session.client_kid in revoked):
            self._forget(session_id)
            return Begin(BeginKind.REVOKED)
        st = self._seq[session_id]
        if sequence == st.last and st.last > 0 and st.request_hash == request_hash:
            if st.reply is None:
                return Begin(BeginKind.IN_PROGRESS, st.last)
            return Begin(BeginKind.REPLAY, st.last, StoredReply.from_dict(encoding.loads(st.reply)))
        if sequence <= st.last:
            return Begin(BeginKind.STALE, st.last)
        if rate_limit is not None:
            key = (agent, client_did, rate_period)
            t = int(now)
            start, count = self._rates.get(key, (t - t % rate_period, 0))
            if t >= start + rate_period:
                start, count = t - t % rate_period, 0
            if count >= rate_limit:
                return Begin(BeginKind.RATE_LIMITED, st.last, retry_after=max(1, start + rate_period - t))
            self._rates[key] = (start, count + 1)
            if len(self._rates) >= self._rates_sweep_at:
                self._sweep_rates(t)
        st.last, st.request_hash, st.reply = sequence, request_hash, None
        return Begin(BeginKind.NEW, sequence)

    def _sweep_rates(self, t: int) -> None:
        # A window that has ended counts nothing: drop it, so that one entry per DID that
        # ever sent a request does not pile up (ATTACKS.md H6). Amortised O(1) per request.
        for key in [k for k, (start, _) in self._rates.items() if t >= start + k[2]]:
            del self._rates[key]
        self._rates_sweep_at = max(_RATES_SWEEP_MIN, 2 * len(self._rates))

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """See :meth:`Store.finish_request`."""
        self.finish_request_now(session_id, sequence, reply)

    def finish_request_now(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """:meth:`finish_request` without a coroutine (:func:`a2a_secure.store.base.sync_forms`)."""
        st = self._seq.get(session_id)
        if st is not None and st.last == sequence:
            st.reply = reply.to_json()

    async def close_session(self, session_id: str) -> None:
        """See :meth:`Store.close_session`."""
        self._forget(session_id)

    # -- intent ids (store/intents.py) ------------------------------------------------------
    def _drop_claim(self, key: tuple[str, str, str]) -> None:
        self._claims.pop(key, None)
        ids = self._claims_by_did.get(key[:2])
        if ids is not None:
            ids.pop(key[2], None)
            if not ids:
                del self._claims_by_did[key[:2]]

    def _live_claim(self, key: tuple[str, str, str], now: float) -> _ClaimState | None:
        c = self._claims.get(key)
        if c is not None and c.expires_at <= now:
            self._drop_claim(key)
            return None
        return c

    def _expire_claims(self, now: float) -> None:
        # Amortised O(log n) per claim: every claim enters the heap once and leaves it at its
        # expiry; an entry whose claim was made again since (a new expiry) is skipped.
        heap = self._claims_by_expiry
        while heap and heap[0][0] <= now:
            expires_at, key = heapq.heappop(heap)
            c = self._claims.get(key)
            if c is not None and c.expires_at == expires_at:
                self._drop_claim(key)

    @staticmethod
    def _seen(c: _ClaimState, intent_hash: str, now: float) -> Claim:
        if c.intent_hash != intent_hash:
            return Claim(ClaimKind.CONFLICT)
        if c.reply is not None:
            return Claim(ClaimKind.DONE, StoredReply.from_dict(encoding.loads(c.reply)))
        if not c.started:  # nothing ran yet: a waiter waits, a new request takes it over
            return Claim(ClaimKind.RUNNING)
        return Claim(ClaimKind.RUNNING if now < c.running_until else ClaimKind.LOST)

    async def begin_intent(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        claim: ClaimRequest,
        agent: str = "",
    ) -> tuple[Begin, Claim | None]:
        """See :meth:`IntentStore.begin_intent`."""
        st = self._seq.get(session_id)
        saved = (st.last, st.request_hash, st.reply) if st is not None else None
        rate_key = (agent, client_did, rate_period)
        saved_rate = self._rates.get(rate_key)
        # No await below suspends: begin_request, the claim and a roll-back are one step.
        begin = await self.begin_request(
            session_id,
            client_did,
            sequence,
            request_hash,
            rate_limit=rate_limit,
            rate_period=rate_period,
            now=now,
            agent=agent,
        )
        if begin.kind is not BeginKind.NEW:
            return begin, None
        key = (agent, client_did, claim.intent_id)
        c = self._live_claim(key, now)
        if c is not None and (c.started or c.reply is not None or c.intent_hash != claim.intent_hash):
            return begin, self._seen(c, claim.intent_hash, now)
        if c is not None:  # its handler never started: this request takes it over
            c.running_until, c.owner = claim.running_until, claim.owner
            if claim.expires_at > c.expires_at:
                c.expires_at = claim.expires_at
                self._claims_by_did.setdefault(key[:2], {})[claim.intent_id] = claim.expires_at
                heapq.heappush(self._claims_by_expiry, (claim.expires_at, key))
            return begin, Claim(ClaimKind.NEW)
        self._expire_claims(now)
        ids = self._claims_by_did.get(key[:2], {})
        refused: Claim | None = None
        if len(ids) >= claim.max_per_did:
            # The DID's oldest claim (ids keep claim order; the retention is the server's, so
            # the oldest expires first): read in O(1), however many it holds.
            first_own = next(iter(ids.values()))
            refused = Claim(ClaimKind.FULL, retry_after=max(1, math.ceil(first_own - now)))
        elif claim.max_total is not None and len(self._claims) >= claim.max_total:
            first = self._claims_by_expiry[0][0] if self._claims_by_expiry else now + 1
            refused = Claim(ClaimKind.TOTAL_FULL, retry_after=max(1, math.ceil(first - now)))
        if refused is not None:
            # Undo steps 7-8: a refused claim consumes nothing, as a rate-limited request.
            assert st is not None and saved is not None
            st.last, st.request_hash, st.reply = saved
            if saved_rate is None:
                self._rates.pop(rate_key, None)
            else:
                self._rates[rate_key] = saved_rate
            return Begin(BeginKind.RATE_LIMITED, saved[0], retry_after=refused.retry_after), refused
        self._claims[key] = _ClaimState(
            claim.intent_hash, claim.running_until, claim.expires_at, owner=claim.owner, started=False
        )
        self._claims_by_did.setdefault(key[:2], {})[claim.intent_id] = claim.expires_at
        heapq.heappush(self._claims_by_expiry, (claim.expires_at, key))
        return begin, Claim(ClaimKind.NEW)

    async def get_claim(
        self, client_did: str, intent_id: str, intent_hash: str, now: float, *, agent: str = ""
    ) -> Claim:
        """See :meth:`IntentStore.get_claim`."""
        c = self._live_claim((agent, client_did, intent_id), now)
        return Claim(ClaimKind.UNKNOWN) if c is None else self._seen(c, intent_hash, now)

    async def finish_intent(
        self, client_did: str, intent_id: str, intent_hash: str, reply: StoredReply, *, agent: str = ""
    ) -> None:
        """See :meth:`IntentStore.finish_intent`."""
        c = self._claims.get((agent, client_did, intent_id))
        if c is not None and c.intent_hash == intent_hash and c.reply is None:
            c.reply = reply.to_json()

    async def renew_intent(
        self,
        client_did: str,
        intent_id: str,
        intent_hash: str,
        owner: bytes,
        running_until: int,
        *,
        agent: str = "",
    ) -> None:
        """See :meth:`IntentStore.renew_intent`."""
        c = self._claims.get((agent, client_did, intent_id))
        if c is not None and c.intent_hash == intent_hash and c.owner == owner and c.reply is None:
            c.running_until = running_until

    async def start_intent(
        self,
        client_did: str,
        intent_id: str,
        intent_hash: str,
        owner: bytes,
        *,
        started: bool = True,
        agent: str = "",
    ) -> bool:
        """See :meth:`IntentStore.start_intent`."""
        c = self._claims.get((agent, client_did, intent_id))
        if c is None or c.intent_hash != intent_hash or c.owner != owner or c.reply is not None:
            return False
        if c.started is started:
            return False
        c.started = started
        return True

    # -- revocations (a2a_secure.store.revocation.RevocationStore) ------------------------
    async def add_revocation(self, entry: Revocation) -> bool:
        """See :meth:`RevocationStore.add_revocation`."""
        entries = self._revoked.setdefault(entry.did, {})
        if entry.field in entries:
            return False
        entries[entry.field] = entry
        self._revoked_epoch += 1
        return True

    async def remove_revocation(self, target: str) -> bool:
        """See :meth:`RevocationStore.remove_revocation`."""
        probe = Revocation(target)
        entries = self._revoked.get(probe.did, {})
        if entries.pop(probe.field, None) is None:
            return False
        self._revoked_epoch += 1
        if not entries:
            del self._revoked[probe.did]
        return True

    async def revocation_epoch(self) -> int:
        """See :meth:`RedisRevocations.revocation_epoch`: it moves at every change of the list."""
        return self._revoked_epoch

    def revocation_epoch_now(self) -> int:
        """:meth:`revocation_epoch` without a coroutine."""
        return self._revoked_epoch

    async def list_revocations(self) -> list[Revocation]:
        """See :meth:`RevocationStore.list_revocations`."""
        return [e for entries in self._revoked.values() for e in entries.values()]

    async def find_revocation(self, did: str, kids: Sequence[str]) -> Revocation | None:
        """See :meth:`RevocationStore.find_revocation`."""
        entries = self._revoked.get(did)
        if not entries:
            return None
        for name in (DID_FIELD, *kids):
            if name in entries:
                return entries[name]
        return None

    # -- introspection (tests, metrics) ---------------------------------------------------
    def counts(self) -> dict[str, int]:
        """How many pending handshakes, sessions, rate windows and intent id claims are held."""
        return {
            "pending": len(self._pending),
            "sessions": len(self._sessions),
            "rates": len(self._rates),
            "claims": len(self._claims),
        }
