"""Sessions, sequences, stored answers and rate windows of :class:`~a2a_secure.store.redis.RedisStore`.

Keys (``P`` the prefix, ``<agent>`` the server DID; names built in
:class:`~a2a_secure.store.redis_keys.RedisKeys`):

* ``P s:<session_id>`` (spread cluster: ``P{s:<session_id>}``): one hash per session,
  ``r`` its compact record (:func:`_pack_session`), ``e`` its ``expires_at``, ``l`` the last
  accepted sequence, ``h`` that request's hash (32 raw bytes), ``y`` the stored answer once
  the request finished (on a cluster, while a counted request runs, also the previous
  ``pl``/``ph``/``py``, and the shard of its reservation). Opened by the ACCEPT_POLICY
  (:meth:`RedisSessions.open_session`, which takes the pending handshake in the same
  script), advanced by every intent (``begin_request``, or ``begin_intent`` in
  :mod:`~a2a_secure.store.redis_intents`), answered by ``finish_request``, deleted by
  ``close_session`` or a revocation. Found by its random id everywhere; its record names
  the agent, which the engine checks.
* ``P sa`` (``P{sa:<i>}``, ≤ 16 shards): the bound on sessions, a sorted set of session
  ids scored by ``expires_at``; the store's.
* ``P r:<agent>|<did>:<period>:<start>`` (``P{d:<did>}:r:<agent>|<period>:<start>``): the
  fixed rate window of a client DID at one agent, a counter checked before the increment,
  written only by the begin scripts (here, and ``RATE`` of
  :mod:`~a2a_secure.store.redis_cluster`).

TTL: a session's ``expires_at`` plus one second (the bound's sorted set as long as its
latest member); a rate window's end plus one second. A process also keeps the records of
the sessions it served in a small cache (``session_cache_ttl``): they never change once
opened, and ``begin_request``'s script re-checks that the session still exists. The
server's sweep (:meth:`RedisSessions.sweep_expired`) drops an entry whose session expired or
whose cache time ended, so a sealed session's keys leave the process with it.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from typing import Any

from a2a_secure.errors import Unavailable
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.store import redis_cluster as rc
from a2a_secure.store.base import Begin, BeginKind, OpenResult, SessionRecord, StoredReply
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest
from a2a_secure.store.redis_cache import RedisSessionCache
from a2a_secure.store.redis_handshakes import _LIVE_PENDING
from a2a_secure.store.redis_keys import (
    _EXTEND,
    _Call,
    _NotReplicated,
    _num,
    _pack_hash,
    _pack_kid,
    _request_hash_bytes,
    _ttl_ms,
    _unpack_hash,
    _unpack_kid,
)

__all__ = ["RedisSessions"]

# The Retry-After of a new intent_id refused because the store holds its bound of claims, on
# a spread cluster (where the reservation does not tell when the earliest one lapses).
_TOTAL_FULL_RETRY = 60

# KEYS: pending hash, session hash, session zset, global pending zset
# ARGV: now, max_sessions, record, expires_at, ttl_ms, nonce_b, session_id, prefix
_OPEN_SESSION = (
    _EXTEND
    + _LIVE_PENDING
    + """
local v = live_pending(KEYS[1], KEYS[4], ARGV[1], ARGV[6], ARGV[8])
if not v or not v[4] then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[2]) then return 2 end
drop_pending(KEYS[1], KEYS[4], ARGV[6], ARGV[8], v[2])
local ttl = tonumber(ARGV[5])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'r', ARGV[3], 'e', ARGV[4], 'l', '0')
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7])
extend(KEYS[3], ttl)
return 1
"""
)

# KEYS: session hash, session zset.  ARGV: now, session_id.  Returns the record or nil.
_GET_SESSION = """
local v = redis.call('HMGET', KEYS[1], 'r', 'e')
if not v[1] then return false end
if tonumber(v[2]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return false
end
return v[1]
"""

# KEYS: session hash, session zset[, rate counter]
# ARGV: now, sequence, request_hash, rate_limit ('' = not counted), rate_ttl_ms, session_id
# Returns {kind, last[, reply]}: 0 GONE, 1 NEW, 2 REPLAY, 3 IN_PROGRESS, 4 STALE, 5 RATE_LIMITED
# begin_checks: every check of a request against its session and rate counter; its answer
# when the request does not run, else false, the rate count read and the session's last
# sequence. begin_writes: what NEW records, after every check of the script has passed.
_BEGIN_STEPS = """
local function begin_checks()
  local v = redis.call('HMGET', KEYS[1], 'e', 'l', 'h')
  if not v[1] then return {0, '0'} end
  if tonumber(v[1]) <= tonumber(ARGV[1]) then
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], ARGV[6])
    return {0, '0'}
  end
  local last = tonumber(v[2])
  local seq = tonumber(ARGV[2])
  if seq == last and last > 0 and v[3] == ARGV[3] then
    local y = redis.call('HGET', KEYS[1], 'y')
    if y then return {2, v[2], y} end
    return {3, v[2]}
  end
  if seq <= last then return {4, v[2]} end
  local count = 0
  if ARGV[4] ~= '' then
    count = tonumber(redis.call('GET', KEYS[3]) or '0')
    if count >= tonumber(ARGV[4]) then return {5, v[2]} end
  end
  return false, count, v[2]
end

local function begin_writes(count)
  if ARGV[4] ~= '' then
    redis.call('INCR', KEYS[3])
    if count == 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
  end
  redis.call('HSET', KEYS[1], 'l', ARGV[2], 'h', ARGV[3])
  redis.call('HDEL', KEYS[1], 'y')
end
"""

_BEGIN_REQUEST = (
    _BEGIN_STEPS
    + """
local answer, count = begin_checks()
if answer then return answer end
begin_writes(count)
return {1, ARGV[2]}
"""
)

# KEYS: session hash.  ARGV: sequence, reply
_FINISH_REQUEST = """
local l = redis.call('HGET', KEYS[1], 'l')
if l and tonumber(l) == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'y', ARGV[2])
  return 1
end
return 0
"""

# KEYS: session hash, session zset.  ARGV: session_id
_CLOSE_SESSION = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

_KINDS = {
    0: BeginKind.GONE,
    1: BeginKind.NEW,
    2: BeginKind.REPLAY,
    3: BeginKind.IN_PROGRESS,
    4: BeginKind.STALE,
    5: BeginKind.RATE_LIMITED,
    6: BeginKind.REVOKED,
}


def _pack_session(s: SessionRecord) -> bytes:
    p = s.policy
    return encoding.dumps(
        [
            _pack_hash(s.session_commitment),
            s.client_did,
            s.server_did,
            _pack_kid(s.client_kid, s.client_did),
            encoding.b64u_encode(s.client_key),
            [
                p.rate_limit,
                p.rate_period,
                list(p.allowed_intents),
                list(p.blocked_intents),
                p.session_timeout,
            ],
            s.created_at,
            s.expires_at,
            s.client_agent_id,
            *([s.server_kid] if s.server_kid or s.seal_keys else []),
            # Sealed intents: the session's AEAD keys sit beside it and expire with its TTL.
            *([encoding.b64u_encode(s.seal_keys)] if s.seal_keys else []),
        ]
    )


def _unpack_session(session_id: str, data: bytes) -> SessionRecord:
    fields = encoding.loads(data)
    commitment, client_did, server_did, kid, key, pol, created, expires, agent_id = fields[:9]
    rest = fields[9:]
    return SessionRecord(
        session_id=session_id,
        session_commitment=_unpack_hash(commitment),
        client_did=client_did,
        server_did=server_did,
        client_kid=_unpack_kid(kid, client_did),
        client_key=encoding.b64u_decode(key),
        policy=Policy(pol[0], pol[1], tuple(pol[2]), tuple(pol[3]), pol[4]),
        created_at=created,
        expires_at=expires,
        client_agent_id=agent_id,
        server_kid=rest[0] if rest else "",
        seal_keys=encoding.b64u_decode(rest[1]) if len(rest) > 1 else b"",
    )


class RedisSessions(RedisSessionCache):
    """The session methods of :class:`~a2a_secure.store.redis.RedisStore` (the hot path)."""

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float, agent: str = ""
    ) -> OpenResult:
        """See :meth:`Store.open_session`."""
        if self._spread:
            return await self._spread_open_session(agent, nonce_b, session, max_sessions, now)
        code = await self._script(
            self._open_session,
            [
                self._k_pending(agent, nonce_b),
                self._k_session(session.session_id),
                self._k_sessions(),
                self._k_pending_all(),
            ],
            [
                _num(now),
                max_sessions,
                _pack_session(session),
                session.expires_at,
                _ttl_ms(session.expires_at, now),
                nonce_b,
                session.session_id,
                self.prefix,
            ],
        )
        if code == 1:
            self._cache_put(session)
            return OpenResult.OPENED
        return OpenResult.FULL if code == 2 else OpenResult.HANDSHAKE_GONE

    async def _spread_open_session(
        self, agent: str, nonce_b: str, session: SessionRecord, max_sessions: int, now: float
    ) -> OpenResult:
        # In order: reserve, take the handshake, open (redis_cluster.py).
        sid = session.session_id
        shards = rc.shards_for(max_sessions)
        shard = rc.shard_of(sid, shards)
        ttl = _ttl_ms(session.expires_at, now)
        shard_key = self._k_session_shard(shard)
        limit = rc.shard_limit(max_sessions, shards, shard)
        reserved = await self._script(
            self._c_reserve, [shard_key], [_num(now), limit, sid, session.expires_at, ttl]
        )
        if reserved == 0:
            return OpenResult.FULL
        release: _Call = (self._c_release, [shard_key], [sid])
        try:
            taken = await self._script(self._c_take_pending, [self._k_pending(agent, nonce_b)], [_num(now)])
        except Unavailable:
            await self._quietly([release])
            raise
        if not taken:
            await self._quietly([release])
            return OpenResult.HANDSHAKE_GONE
        source, pending_shard = (part.decode() for part in taken)
        out, _ = await self._run(
            [
                (
                    self._c_open,
                    [self._k_session(sid)],
                    [_pack_session(session), session.expires_at, ttl, str(shard)],
                ),
                (self._c_release, [self._k_source(source)], [nonce_b]),
                (self._c_release, [self._k_pending_shard(int(pending_shard))], [nonce_b]),
            ],
            strict=False,
        )
        if isinstance(out[0], Exception):
            await self._quietly([release])
            raise await self._unavailable(out[0])
        # A release that failed leaves a reservation that lapses with the handshake (60 s).
        self._cache_put(session)
        return OpenResult.OPENED

    # -- sessions -------------------------------------------------------------------------------
    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        """See :meth:`Store.get_session` (the per-process cache, else one script).

        A record from the cache may belong to a session that another worker closed a moment
        ago: :meth:`begin_request` is the authoritative check and answers GONE for it.
        """
        cached = self._cache_get(session_id)
        if cached is not None:
            if not cached.expired(now):
                return cached
            self._cache_drop(session_id)  # and let the script forget it in Redis
        if self._spread:
            data = await self._script(self._c_get_session, [self._k_session(session_id)], [_num(now)])
        else:
            data = await self._script(
                self._get_session, [self._k_session(session_id), self._k_sessions()], [_num(now), session_id]
            )
        if data is None:
            return None
        session = _unpack_session(session_id, data)
        self._cache_put(session)
        return session

    def _begin_parts(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        agent: str,
    ) -> tuple[list[str], list[Any], int, int]:
        """The KEYS 1-3 and ARGV 1-7 of the guarded begin scripts, the rate window's start, now.

        KEYS: the session hash, the session zset, the rate counter (the session hash again
        when the request is not counted); ARGV: now, sequence, request hash, limit ('' when
        not counted), the counter's ttl_ms, session id, client DID (_REVOCATION_GUARD).
        """
        session_key = self._k_session(session_id)
        keys = [session_key, self._k_sessions(), session_key]
        limit = ""
        rate_ttl = 0
        t = int(now)
        start = t - t % rate_period if rate_limit is not None else 0
        if rate_limit is not None:
            keys[2] = self._k_rate(agent, client_did, rate_period, start)
            limit = str(rate_limit)
            rate_ttl = _ttl_ms(start + rate_period, now)
        args = [
            _num(now),
            str(sequence),
            _request_hash_bytes(request_hash),
            limit,
            rate_ttl,
            session_id,
            client_did,
        ]
        return keys, args, start, t

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
        """See :meth:`Store.begin_request`: §6.1 steps 7 and 8 in one script (one round trip).

        On a cluster, two single-slot scripts in one round trip (redis_cluster.py).
        """
        if self._spread:
            begin, _ = await self._spread_begin(
                session_id, client_did, sequence, request_hash, rate_limit, rate_period, now, agent
            )
            return begin
        keys, args, start, t = self._begin_parts(
            session_id, client_did, sequence, request_hash, rate_limit, rate_period, now, agent
        )
        call: _Call = (self._begin_request_guarded, [*keys, self._k_revoked(client_did)], args)
        (out,), confirmed = await self._run([call], wait=True)
        try:
            return self._begin_from(out, session_id, start, rate_period, t, confirmed)
        except _NotReplicated as exc:
            raise await self._unavailable(exc) from None

    async def _spread_begin(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        agent: str,
        claim: ClaimRequest | None = None,
    ) -> tuple[Begin, Claim | None]:
        # The session's script and the DID's (its rate window, and the claim of an intent_id)
        # in one round trip, then the decision tables of redis_cluster.py.
        skey = self._k_session(session_id)
        hashed = _request_hash_bytes(request_hash)
        counted = rate_limit is not None
        # Keep the previous state when the request may have to be given back.
        keep = "1" if counted or claim is not None or self._wait_replicas else ""
        calls: list[_Call] = [(self._c_begin, [skey], [_num(now), str(sequence), hashed, keep])]
        t = int(now)
        start = t - t % rate_period if counted else 0
        rkey = self._k_rate(agent, client_did, rate_period, start) if counted else ""
        limit, rate_ttl = (str(rate_limit), _ttl_ms(start + rate_period, now)) if counted else ("", 0)
        if claim is not None:
            ikeys = [self._k_intent(agent, client_did, claim.intent_id), self._k_intents(agent, client_did)]
            # Random per request: its UNCLAIM can never delete a claim another request made.
            owner = claim.owner or secrets.token_bytes(16)
            ihash = _request_hash_bytes(claim.intent_hash)
            args = [_num(now), limit, rate_ttl, claim.intent_id, ihash, claim.running_until]
            args += [claim.expires_at, _ttl_ms(claim.expires_at, now), claim.max_per_did, owner]
            calls.append((self._c_claim, [*ikeys, rkey or ikeys[0]], args))
            if claim.max_total is not None:
                # The store's bound on claims, sharded as the session bound: a reservation
                # named by the claim, lapsing with it (2: the claim's own is already there).
                shards = rc.shards_for(claim.max_total)
                shard = rc.shard_of(ikeys[0], shards)
                release: _Call = (
                    self._c_release,
                    [self._k_intents_shard(shard)],
                    [self._claim_member(ikeys[0])],
                )
                total = rc.shard_limit(claim.max_total, shards, shard)
                reserve_args = [_num(now), total, release[2][0], claim.expires_at]
                calls.append((self._c_reserve, release[1], [*reserve_args, _ttl_ms(claim.expires_at, now)]))
        elif counted:
            calls.append((self._c_rate, [rkey], [limit, rate_ttl]))
        calls.append((self._c_revoked, [self._k_revoked(client_did)], []))
        out, confirmed = await self._run(calls, strict=False, wait=True)
        seq_out, revoked_out = out[0], out[-1]
        # What the DID's script did, and the compensations that give it back (``undo``).
        undo: list[_Call] = []
        did_error: Exception | None = None
        over = False
        full: Claim | None = None
        got: Claim | None = None
        if len(calls) >= 3:
            did_out = out[1]
            unrate: _Call = (self._c_unrate, [rkey], [])
            if isinstance(did_out, Exception):
                did_error = did_out
                if claim is not None:  # it may have made the claim: this request will not run
                    undo.append((self._c_unclaim, ikeys, [claim.intent_id, ihash, owner]))
            elif claim is None:
                over = did_out != 1
                undo += [] if over else [unrate]
            elif int(did_out[0]) == 5:
                over = True
            elif int(did_out[0]) == 7:
                retry = max(1, math.ceil(float(did_out[1]) - now))
                full = Claim(ClaimKind.FULL, retry_after=retry)
            else:
                got = self._claim_from(did_out)
                undo += [unrate] if counted else []
                if got.kind is ClaimKind.NEW:
                    undo.append((self._c_unclaim, ikeys, [claim.intent_id, ihash, owner]))
            if len(calls) == 4:  # the store's bound was reserved against
                reserved = out[2]
                undo += [release] if reserved == 1 else []
                if got is not None and got.kind is ClaimKind.NEW:
                    # A new claim needs its place: without it (full, or unknown) it is given
                    # back and nothing runs; an answer from an existing claim adds nothing.
                    if isinstance(reserved, Exception):
                        did_error = reserved
                    elif reserved == 0:
                        full = Claim(ClaimKind.TOTAL_FULL, retry_after=_TOTAL_FULL_RETRY)
        if isinstance(seq_out, Exception):
            if undo:
                await self._quietly(undo)
            raise await self._unavailable(seq_out)
        kind = _KINDS[int(seq_out[0])]
        last = int(seq_out[1])
        if kind is BeginKind.NEW:
            undo.append((self._c_unbegin, [skey], [str(sequence), hashed]))
        if kind is not BeginKind.GONE and (
            isinstance(revoked_out, Exception) or await self._revoked_fields(revoked_out, session_id, now)
        ):
            # A revoked session consumes nothing and ends; an unknown answer fails closed.
            if undo:
                await self._quietly(undo)
            if isinstance(revoked_out, Exception):
                raise await self._unavailable(revoked_out)
            await self.close_session(session_id)
            return Begin(BeginKind.REVOKED), None
        if kind is BeginKind.NEW:
            if did_error is None and not over and full is None and confirmed:
                return Begin(kind, last), got
            # Over the limit or the bound, the DID's side unknown, or not replicated:
            # consume nothing, count nothing, claim nothing.
            await self._quietly(undo)
            if did_error is not None:
                raise await self._unavailable(did_error)
            if not confirmed:
                raise await self._unavailable(_NotReplicated(self._wait_replicas))
            if full is not None:
                return Begin(BeginKind.RATE_LIMITED, int(seq_out[2]), retry_after=full.retry_after), full
            retry = max(1, start + rate_period - t)
            return Begin(BeginKind.RATE_LIMITED, int(seq_out[2]), retry_after=retry), None
        if undo:
            await self._quietly(undo)
        if kind is BeginKind.GONE:
            self._cache_drop(session_id)
            return Begin(BeginKind.GONE), None
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(seq_out[2]))), None
        return Begin(kind, last), None

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """See :meth:`Store.finish_request`; sent with the next command (``finish_linger``)."""
        self._unsent[self._k_session(session_id)] = (
            self._c_finish if self._spread else self._finish_request,
            [str(sequence), reply.to_json()],
        )
        await self._linger()

    async def _linger(self) -> None:
        """Send the queued answers with the next command, or after ``finish_linger``."""
        if self._finish_linger is None:
            await self.flush()
        else:
            loop = asyncio.get_running_loop()
            if self._flush_timer is None or self._flush_loop is not loop:  # none yet, or an old loop's
                self._flush_loop = loop
                self._flush_timer = loop.call_later(self._finish_linger, self._flush_later)

    def _begin_from(
        self, out: Any, session_id: str, start: int, rate_period: int, t: int, confirmed: bool
    ) -> Begin:
        """The decision of a (guarded) begin script's reply."""
        kind = _KINDS[int(out[0])]
        if kind is BeginKind.NEW and not confirmed:
            # The sequence may not survive a failover: the intent must not run (it could
            # run again at the promoted replica). The sequence stays consumed, as after an
            # ambiguous timeout: the client moves to a new one.
            raise _NotReplicated(self._wait_replicas)
        last = int(out[1])
        if kind is BeginKind.GONE or kind is BeginKind.REVOKED:
            self._cache_drop(session_id)
            return Begin(kind)
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(out[2])))
        if kind is BeginKind.RATE_LIMITED:
            return Begin(kind, last, retry_after=max(1, start + rate_period - t))
        return Begin(kind, last)

    async def close_session(self, session_id: str) -> None:
        """See :meth:`Store.close_session`."""
        self._cache_drop(session_id)
        if not self._spread:
            await self._script(
                self._close_session, [self._k_session(session_id), self._k_sessions()], [session_id]
            )
            return
        shard = await self._script(self._c_close_session, [self._k_session(session_id)], [])
        if shard is not None:
            # If this fails, the reservation lapses at the session's expiry.
            await self._quietly([(self._c_release, [self._k_session_shard(int(shard))], [session_id])])
