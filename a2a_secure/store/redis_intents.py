"""``intent_id`` claims of :class:`~a2a_secure.store.redis.RedisStore` (store/intents.py).

Keys (``P`` the prefix, ``<agent>`` the server DID; names built in
:class:`~a2a_secure.store.redis_keys.RedisKeys`):

* ``P i:<agent>|<did>:<intent_id>`` (spread cluster:
  ``P{d:<did>}:i:<agent>|<intent_id>``): one claim, a hash of the intent hash, its
  ``running_until``, ``expires_at`` and answer. Made by the guarded begin of an intent that
  carries an ``intent_id`` (:meth:`RedisIntents.begin_intent`, in the same script as its
  sequence and rate checks), answered by ``finish_intent``.
* ``P ia:<agent>|<did>`` (``P{d:<did>}:ia:<agent>``): the DID's claims at that agent, by
  expiry (the per-DID bound).
* ``P ix`` (``P{ix:<i>}``, ≤ 16 shards): the store's bound on claims, every agent and DID.

TTL: the claim's ``expires_at`` (the retention window, ``ServerLimits.intent_id_retention``,
24 h by default) plus one second; the sorted sets as long as their latest member. The claim
layout and the scripts shared with the spread cluster are in
:mod:`~a2a_secure.store.redis_claims`.
"""

from __future__ import annotations

import math
from typing import Any

from a2a_secure.identity import encoding
from a2a_secure.store import redis_claims as rcl
from a2a_secure.store.base import Begin, BeginKind, StoredReply
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest
from a2a_secure.store.redis_keys import (
    _EXTEND,
    RedisKeys,
    _Call,
    _NotReplicated,
    _num,
    _request_hash_bytes,
    _ttl_ms,
)
from a2a_secure.store.redis_revocations import _REVOCATION_GUARD
from a2a_secure.store.redis_sessions import _BEGIN_STEPS

__all__ = ["RedisIntents"]

# The claim layout and the scripts shared with the spread cluster are in redis_claims.py.

# The guarded _BEGIN_REQUEST and, when it would answer NEW, the claim, as one script. Every
# check (the claim's and the per-DID bound's included) comes before begin_writes, the first
# write, so a FULL claim consumes nothing, as a rate-limited request does.
# KEYS: session hash, session zset, rate counter (or the session hash when not counted),
#       claim hash, the DID's claim zset (at this agent), the store's claim zset, the DID's
#       revocation hash
# ARGV: 1-6 as _BEGIN_REQUEST, 7 client DID (_REVOCATION_GUARD), 8 intent_id, 9 intent hash,
#       10 running_until, 11 expires_at, 12 claim ttl_ms, 13 max claims per DID, 14 max
#       claims in the store ('' = no bound), 15 the claim's member in the store's zset,
#       16 the request's owner token
# Returns _BEGIN_REQUEST's answer (or the guard's) when not NEW; {1, last, claim kind[,
# answer]} when NEW (kind 0 also for a claim taken over as never started); {7, last,
# earliest expiry of the DID's claims} when the DID's bound is
# reached, {8, last, earliest expiry in the store} when the store's is.
_BEGIN_INTENT = (
    _EXTEND
    + rcl.SEEN_CLAIM
    + _REVOCATION_GUARD
    + _BEGIN_STEPS
    + """
local now = tonumber(ARGV[1])
local answer, count, last = begin_checks()
if answer then return answer end
local c = seen_claim(KEYS[4], KEYS[5], now, ARGV[8], ARGV[9])
if c[1] == -1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[13]) then
    local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    return {7, last, first[2]}
  end
  if ARGV[14] ~= '' then
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', ARGV[1])
    if redis.call('ZCARD', KEYS[6]) >= tonumber(ARGV[14]) then
      local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
      return {8, last, first[2] or ARGV[1]}
    end
  end
end
begin_writes(count)
if c[1] ~= -1 and c[1] ~= 6 then
  if c[2] then return {1, ARGV[2], c[1], c[2]} end
  return {1, ARGV[2], c[1]}
end
local ttl = tonumber(ARGV[12])
redis.call('HSET', KEYS[4], 'h', ARGV[9], 'u', ARGV[10], 'e', ARGV[11], 'o', ARGV[16], 's', '0')
redis.call('PEXPIRE', KEYS[4], ttl)
redis.call('ZADD', KEYS[5], ARGV[11], ARGV[8])
extend(KEYS[5], ttl)
redis.call('ZADD', KEYS[6], ARGV[11], ARGV[15])
extend(KEYS[6], ttl)
return {1, ARGV[2], 0}
"""
)


class RedisIntents(RedisKeys):
    """The ``intent_id`` methods of :class:`~a2a_secure.store.redis.RedisStore`."""

    # -- intent ids (store/intents.py) -------------------------------------------------------------
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
        """See :meth:`IntentStore.begin_intent`: one script, the same round trip as a begin.

        The script is the guarded begin (revocations, sequence, rate) and, when it would
        answer NEW, the claim of (client DID, intent_id), with every check before any write.
        On a spread cluster, the session's script and the DID's (rate and claim) in one
        round trip, and compensations when the two disagree (redis_cluster.py).
        """
        if self._spread:
            return await self._spread_begin(
                session_id, client_did, sequence, request_hash, rate_limit, rate_period, now, agent, claim
            )
        keys, args, start, t = self._begin_parts(
            session_id, client_did, sequence, request_hash, rate_limit, rate_period, now, agent
        )
        ikey = self._k_intent(agent, client_did, claim.intent_id)
        keys += [
            ikey,
            self._k_intents(agent, client_did),
            self._k_intents_all(),
            self._k_revoked(client_did),
        ]
        args += [
            claim.intent_id,
            _request_hash_bytes(claim.intent_hash),
            claim.running_until,
            claim.expires_at,
            _ttl_ms(claim.expires_at, now),
            claim.max_per_did,
            "" if claim.max_total is None else claim.max_total,
            self._claim_member(ikey),
            claim.owner,
        ]
        call: _Call = (self._begin_intent, keys, args)
        (out,), confirmed = await self._run([call], wait=True)
        code = int(out[0])
        if code in (7, 8):  # the DID's claims, or the store's, are at their bound: nothing consumed
            retry = max(1, math.ceil(float(out[2]) - now))
            return Begin(BeginKind.RATE_LIMITED, int(out[1]), retry_after=retry), Claim(
                ClaimKind.FULL if code == 7 else ClaimKind.TOTAL_FULL, retry_after=retry
            )
        try:
            begin = self._begin_from(out, session_id, start, rate_period, t, confirmed)
        except _NotReplicated as exc:
            # The claim stays unstarted: the next resend takes it over and runs it.
            raise await self._unavailable(exc) from None
        if begin.kind is not BeginKind.NEW:
            return begin, None
        return begin, self._claim_from(out[2:])

    @staticmethod
    def _claim_from(out: Any) -> Claim:
        kind = rcl.CLAIM_KINDS[int(out[0])]
        if kind is ClaimKind.DONE:
            return Claim(kind, StoredReply.from_dict(encoding.loads(out[1])))
        return Claim(kind)

    async def get_claim(
        self, client_did: str, intent_id: str, intent_hash: str, now: float, *, agent: str = ""
    ) -> Claim:
        """See :meth:`IntentStore.get_claim` (one script)."""
        out = await self._script(
            self._get_claim,
            [self._k_intent(agent, client_did, intent_id), self._k_intents(agent, client_did)],
            [_num(now), intent_id, _request_hash_bytes(intent_hash)],
        )
        return self._claim_from(out)

    async def finish_intent(
        self, client_did: str, intent_id: str, intent_hash: str, reply: StoredReply, *, agent: str = ""
    ) -> None:
        """See :meth:`IntentStore.finish_intent`: stored before it returns (the caller sends
        the answer only then), in one round trip with the answers not yet sent."""
        self._unsent[self._k_intent(agent, client_did, intent_id)] = (
            self._finish_intent,
            [_request_hash_bytes(intent_hash), reply.to_json()],
        )
        await self.flush()

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
        """See :meth:`IntentStore.renew_intent` (one script)."""
        key = self._k_intent(agent, client_did, intent_id)
        await self._script(
            self._renew_intent, [key], [_request_hash_bytes(intent_hash), owner, running_until]
        )

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
        """See :meth:`IntentStore.start_intent` (one script; with ``wait_replicas``, a start
        the replicas did not confirm is given back and refused: a promoted replica without
        it would let a resend run the intent again)."""
        key = self._k_intent(agent, client_did, intent_id)
        ihash = _request_hash_bytes(intent_hash)
        states = ["0", "1"] if started else ["1", "0"]
        call: _Call = (self._start_intent, [key], [ihash, owner, *states])
        (out,), confirmed = await self._run([call], wait=started)
        if int(out) != 1:
            return False
        if not confirmed:
            # The primary holds the start, a replica may not: give it back (the resend runs
            # it), and refuse to run it here.
            await self._quietly([(self._start_intent, [key], [ihash, owner, "1", "0"])])
            raise await self._unavailable(_NotReplicated(self._wait_replicas))
        return True
