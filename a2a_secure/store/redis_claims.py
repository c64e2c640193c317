"""The scripts of :class:`~a2a_secure.store.redis.RedisStore` for intent ids (store/intents.py).

A claim is one hash: ``h`` the intent hash (32 raw bytes), ``u`` running_until, ``e``
expires_at, ``y`` the answer once the run reported it, ``o`` the owner token of the request
that made it and ``s`` whether its handler started (``0`` from the claim, ``1`` once
:data:`START_INTENT` recorded the start; absent in a claim made before starts were recorded,
which counts as started). The DID's claims sit in a sorted set scored by expires_at (the
per-DID bound, exact as the session bound is). A claim is LOST when ``u <= now``, it started
and it has no answer; one that never started is taken over by the next request with the
same intent (a new owner, ``u`` and ``e``), which runs it.

A claim belongs to an agent (the server DID, ``<agent>``; several agents may share a
prefix). On one Redis the claim key is ``i:<agent>|<did>:<intent_id>`` and the set
``ia:<agent>|<did>``, the store's bound of claims the set ``ix`` (member: 16 bytes of the
claim key's SHA-256, score: its expires_at), and the claim is made inside the guarded begin
script (``_BEGIN_INTENT`` in redis_intents.py). On a spread cluster both keys carry the DID's hash
tag (``{d:<did>}:i:<agent>|<intent_id>``, ``{d:<did>}:ia:<agent>``), next to its rate
window, and the store's bound is sharded as the session bound (``{ix:<i>}``, a ``RESERVE``
in the same round trip): :data:`CLAIM` counts the rate and makes the claim in one script on
the DID's slot, pipelined with the session's ``BEGIN``; :data:`UNCLAIM` is its
compensation. The decision table is in :mod:`a2a_secure.store.redis_cluster`.
"""

from __future__ import annotations

from a2a_secure.store.intents import ClaimKind

__all__ = [
    "CLAIM",
    "CLAIM_KINDS",
    "FINISH_INTENT",
    "GET_CLAIM",
    "RENEW_INTENT",
    "SEEN_CLAIM",
    "START_INTENT",
    "UNCLAIM",
]

# Conventions as in redis_keys.py: ``now`` is ARGV, checks come before the first write (deleting
# an expired claim is the forgetting every read does), and no script stops half-way.

# The claim's state for a request with intent hash ``hash``: {kind[, answer]}, kind as in
# CLAIM_KINDS; an expired claim is deleted and reads as none (-1); 6: the same intent, its
# handler not started (a waiter sees it running, a new request takes it over).
SEEN_CLAIM = """
local function seen_claim(key, all, now, iid, hash)
  local c = redis.call('HMGET', key, 'h', 'u', 'e', 'y', 's')
  if not c[1] then return {-1} end
  if tonumber(c[3]) <= now then
    redis.call('DEL', key)
    redis.call('ZREM', all, iid)
    return {-1}
  end
  if c[1] ~= hash then return {4} end
  if c[4] then return {1, c[4]} end
  if c[5] == '0' then return {6} end
  if tonumber(c[2]) <= now then return {3} end
  return {2}
end
"""

# KEYS: claim hash, the DID's claim zset.  ARGV: now, intent_id, intent hash
GET_CLAIM = (
    SEEN_CLAIM
    + """
return seen_claim(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], ARGV[3])
"""
)

# KEYS: claim hash.  ARGV: intent hash, answer
FINISH_INTENT = """
local c = redis.call('HMGET', KEYS[1], 'h', 'y')
if c[1] and c[1] == ARGV[1] and not c[2] then
  redis.call('HSET', KEYS[1], 'y', ARGV[2])
  return 1
end
return 0
"""

# The start of the owner's handler (ARGV[3] '0', ARGV[4] '1'), or its give-back when the
# replicas did not confirm it ('1', '0'): only by the owner, of an unanswered claim in that
# state. KEYS: claim hash.  ARGV: intent hash, owner, from, to.  1 done, 0 not (taken over).
START_INTENT = """
local c = redis.call('HMGET', KEYS[1], 'h', 'o', 's', 'y')
if c[1] == ARGV[1] and c[2] == ARGV[2] and c[3] == ARGV[3] and not c[4] then
  redis.call('HSET', KEYS[1], 's', ARGV[4])
  return 1
end
return 0
"""

# A stream that goes on moves its lease: only the owner, of an unanswered claim.
# KEYS: claim hash.  ARGV: intent hash, owner, running_until.
RENEW_INTENT = """
local c = redis.call('HMGET', KEYS[1], 'h', 'o', 'y')
if c[1] == ARGV[1] and c[2] == ARGV[2] and not c[3] then
  redis.call('HSET', KEYS[1], 'u', ARGV[3])
  return 1
end
return 0
"""

# Spread cluster, the DID's slot: the rate count and the claim of a request with an
# intent_id, all checks before the first write (over the limit or FULL: nothing written).
# KEYS: claim hash, the DID's claim zset, rate counter (the claim hash when not counted)
# ARGV: now, rate limit ('' = not counted), rate ttl_ms, intent_id, intent hash,
#       running_until, expires_at, claim ttl_ms, max claims per DID, owner token
# Returns {5} over the rate limit, {7, earliest expiry of the DID's claims} at the bound,
# else (counted) the claim: {0} NEW (made now, or taken over as never started, owned by
# ARGV[10]) or seen_claim's answer.
CLAIM = (
    SEEN_CLAIM
    + """
local now = tonumber(ARGV[1])
local count = 0
if ARGV[2] ~= '' then
  count = tonumber(redis.call('GET', KEYS[3]) or '0')
  if count >= tonumber(ARGV[2]) then return {5} end
end
local c = seen_claim(KEYS[1], KEYS[2], now, ARGV[4], ARGV[5])
if c[1] == -1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[9]) then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {7, first[2]}
  end
end
if ARGV[2] ~= '' then
  redis.call('INCR', KEYS[3])
  if count == 0 then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
end
if c[1] ~= -1 and c[1] ~= 6 then return c end
local ttl = tonumber(ARGV[8])
redis.call('HSET', KEYS[1], 'h', ARGV[5], 'u', ARGV[6], 'e', ARGV[7], 'o', ARGV[10], 's', '0')
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[4])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return {0}
"""
)

# Spread cluster: a claim given back by the request that made it and did not run it. Only
# that request's claim goes (the owner token is random per request), and only while it has
# no answer. KEYS: claim hash, the DID's claim zset.  ARGV: intent_id, intent hash, owner.
# 1 deleted, 0 left alone.
UNCLAIM = """
local c = redis.call('HMGET', KEYS[1], 'h', 'o', 'y')
if c[1] ~= ARGV[2] or c[2] ~= ARGV[3] or c[3] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

CLAIM_KINDS = {
    -1: ClaimKind.UNKNOWN,
    0: ClaimKind.NEW,
    1: ClaimKind.DONE,
    2: ClaimKind.RUNNING,
    3: ClaimKind.LOST,
    4: ClaimKind.CONFLICT,
    6: ClaimKind.RUNNING,  # not started: seen so by a waiter (a begin takes it over)
}
