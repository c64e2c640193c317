"""The key layout and the scripts of :class:`~a2a_secure.store.redis.RedisStore` on Redis Cluster.

On one Redis (and Sentinel) every check-and-update is one script over several keys. A
cluster runs a script only when all its keys hash to one slot, and one hash tag for every
key (``{a2a}:``) would put the whole state on one node. Here every script touches ONE slot
(one key, or for a client DID's claim and rate window a few keys under the DID's tag), and
keys carry their own hash tag, so the state spreads over the cluster:

=====================  ==========================================  ===========================
key                    holds                                       slot of
=====================  ==========================================  ===========================
``P{s:<sid>}``         session hash: record, expiry, last          the session
                       sequence, request hash, stored answer
                       (and, while a counted request runs, the
                       previous ones: ``pl``/``ph``/``py``)
``P{d:<did>}:r:A|…``   rate window of a client DID at agent ``A``  the DID (``_k_did_tag``)
``P{d:<did>}:i:A|id``  claim of an ``intent_id`` at agent ``A``    the DID
``P{d:<did>}:ia:A``    the DID's claims at ``A``, by expiry        the DID
``P{d:<did>}:rv``      the DID's revocation entries                the DID
``P{p:<nonce_b>}:A``   pending handshake hash of agent ``A``       the handshake
``P{ps:<source>}``     per-source bound: sorted set of nonces      the source address
                       scored by their ``expires_at``
``P{pa:<i>}``          global pending bound, shard ``i``           one of ≤ 16 fixed tags
``P{sa:<i>}``          session bound, shard ``i``                  one of ≤ 16 fixed tags
``P{ix:<i>}``          the store's bound of claims, shard ``i``    one of ≤ 16 fixed tags
=====================  ==========================================  ===========================

(``P`` is the prefix, ``A`` the agent: the server DID, so that agents sharing a prefix never
find each other's pending handshakes, rate windows or claims.) A bound is a sorted set of
reservations (member = the entry's id, score = its ``expires_at``): a script drops the
members with ``score <= now``, counts, and adds. A reservation therefore lapses at the
entry's own expiry, which is how any count that leaks in a failure below is reclaimed, with
no sweeper: a leaked pending reservation within 60 s, a leaked session reservation at the
session's would-be ``expires_at``, a leaked claim reservation at the claim's, a leaked rate
count at the end of its window. A global bound of ``L`` is split over ``n = clamp(L // 1000,
1, 16)`` shards holding ``L // n`` (+1 for the first ``L % n``): the shares add up to ``L``,
so the bound is never exceeded; an entry goes to the shard picked by CRC-32 of its id (and
the shard is recorded in the entry, for its release). With ``n > 1`` a shard can fill while
the total is below ``L`` (at ``L = 100 000``, ``n = 16``, the first refusal comes at about
98 % of ``L``); below 2000 there is one shard and the bound is exact.

Operations that span several slots are several single-slot scripts; their order, and what
a failure between them leaves, is the design:

**Intent (§6.1 steps 7-8): session slot + DID slot, ONE round trip.** The rate limit is per
client DID across all of its sessions (PROTOCOL.md §6.1 step 8), so the window cannot live
in the session's slot (a DID with k sessions would get k times its limit). Both scripts go
in one pipeline (to two nodes in parallel when the slots are on two nodes): ``BEGIN`` on the
session (the sequence check; on NEW it consumes the sequence and keeps the previous
``l``/``h``/``y`` as ``pl``/``ph``/``py``) and ``RATE`` on the DID (count, and add one when
under the limit). Then:

* NEW and counted: run the intent (the common case: one round trip).
* NEW and over the limit: ``UNBEGIN`` restores the previous sequence, hash and answer (a
  second round trip, only when refusing), so that a rate-limited request consumes nothing.
  If another request of the session was accepted in between, the restore does nothing and
  the refused sequence stays consumed: the client moves to a higher one, as it must anyway.
* not NEW (replay, in progress, stale, gone) and counted: ``UNRATE`` gives the count back.
* ``BEGIN`` failed (node down, timeout), ``RATE`` counted: 503, ``UNRATE`` tried. If the
  node of ``BEGIN`` ran it before failing (a timeout), the sequence is consumed without an
  answer: retries see it in progress and get 503, and the client moves on; the intent has
  not run.
* ``BEGIN`` NEW, ``RATE`` failed: the limit cannot be checked, so fail closed: 503 and
  ``UNBEGIN`` tried.
* a compensation (``UNBEGIN``, ``UNRATE``) that fails leaves a count that lapses at the end
  of its window, or a consumed sequence (as above). Every failure errs towards refusing:
  never a second run of an intent, never more than the limit.

**Intent with an ``intent_id`` (§12.5): the same round trip.** The claim of (client DID,
intent_id) lives in the DID's slot, so ``RATE`` is replaced by ``CLAIM`` (redis_claims.py),
one script that counts the rate AND claims, every check before any write: over the limit,
or no claim yet and the DID at its bound (FULL), writes nothing. A ``RESERVE`` of a place in
the store's bound of claims goes in the same pipeline, named by the claim (a request that
finds the claim already made finds its place taken by it, answer 2); a place reserved for
a request that does not run is released, and one that leaks lapses with the claim. A claim made NEW records an
owner token, 16 random bytes drawn for this request; ``UNCLAIM`` deletes a claim only when
it has that token, the same intent hash and no answer. Then, for the session's answer and
the claim's (the revocation read as for any intent: a revoked session undoes every write
below and ends):

=====================  =======================  ============================================
session (``BEGIN``)    DID (``CLAIM``)          outcome
=====================  =======================  ============================================
NEW                    NEW                      run (the common case: one round trip)
NEW                    DONE, RUNNING, LOST,     as on one Redis: the sequence stays consumed,
                       CONFLICT                 the rate counted, the server answers from
                                                the claim
NEW                    over the limit           ``UNBEGIN``: RATE_LIMITED, no claim
NEW                    FULL                     ``UNBEGIN``: RATE_LIMITED with the FULL claim,
                                                nothing consumed or counted
NEW                    NEW, the store's bound   ``UNBEGIN``, ``UNCLAIM``, ``UNRATE``: RATE_LIMITED
                       full (``RESERVE`` 0)     with a TOTAL_FULL claim, nothing consumed
NEW                    NEW, ``RESERVE`` failed  503; ``UNBEGIN``, ``UNCLAIM``, ``UNRATE``
not NEW (replay, in    anything                 the session's answer; ``UNCLAIM`` if the
progress, stale,                                claim was made NEW, ``UNRATE`` if counted
gone)
failed                 NEW / counted            503; ``UNCLAIM``, ``UNRATE``
NEW                    failed                   503; ``UNBEGIN``, ``UNCLAIM`` (the count, if
                                                any, lapses with its window)
NEW, not confirmed by  anything                 503; ``UNBEGIN``, ``UNCLAIM``, ``UNRATE``
``wait_replicas``
=====================  =======================  ============================================

Why a claim made NEW is given back whenever this request does not run (its session side
unknown included), rather than left to lapse: the claim is only a promise that this request
runs the intent, and only this request can decide to run it, after reading both answers.
When it decides not to, no run ever used the claim, so deleting it cannot let the intent
run twice; and the owner token, unique to the request, makes sure the delete can only hit
that claim, never one that a byte-identical retry (the same session and sequence) or
another request made after it and is running. Left in place, the claim would tell every
resend "still running" until its bound and then "outcome unknown" for the whole retention
window, about an intent that never ran. If ``UNCLAIM`` fails (or reaches Redis before the
``CLAIM`` whose reply was lost), the claim stays RUNNING and lapses to LOST: the safe side.

The one visible effect of the give-back: a request B of the same DID and id, on another
session, that saw the claim RUNNING in between and waits for its answer, finds it gone
(UNKNOWN) and is answered 504 -32049 "outcome unknown", as for any claim gone while waited
for (PROTOCOL.md §12.5). The intent has not run; B's sequence is consumed with that answer,
and the client's resend (a new sequence, the same id) makes a fresh claim and runs it once.

While a counted-and-refunded request is in flight, a concurrent request of the same DID at
the edge of its limit may be refused: the limit is never exceeded, it may bite early.

**HELLO (add_pending): three slots in one round trip.** ``RESERVE`` on the source's set,
``RESERVE`` on the pending shard, ``ADD_PENDING`` on the handshake. All must succeed; when
one refuses (a bound is full, the nonce is taken) the others' effects are undone before the
answer (a second round trip, only when refusing). If a script fails, the ones that ran are
undone as far as possible, and whatever is left lapses with the handshake's 60 s.

**ACCEPT_POLICY (open_session): in order, because the pending handshake must survive a
full server.** (1) ``RESERVE`` on the session shard: full → FULL, the pending untouched.
(2) ``TAKE_PENDING``: live and proven → deleted and ours (exactly one opener wins); else
the reservation is released → HANDSHAKE_GONE. (3) ``OPEN`` the session hash, with the
pending's two reservations released in the same round trip. If (3) fails, the handshake is
consumed without a session: the client's retry gets -32041 and it starts again; the
session reservation is released if it can be, else it lapses at the session's
``expires_at``.

**Expiry and close.** A script that finds its entry expired deletes it; its reservation has
already lapsed (its score is the expiry). ``close_session`` deletes the hash and then
releases the session's reservation (recorded shard ``b``); if the release fails, the
reservation lapses at ``expires_at``.
"""

from __future__ import annotations

import zlib

__all__ = [
    "ADD_PENDING",
    "BEGIN",
    "CLOSE_SESSION",
    "FINISH",
    "GET_PENDING",
    "GET_SESSION",
    "MARK_PROVEN",
    "MAX_SHARDS",
    "OPEN",
    "RATE",
    "RELEASE",
    "RESERVE",
    "TAKE_PENDING",
    "UNBEGIN",
    "UNRATE",
    "shard_limit",
    "shard_of",
    "shards_for",
]

MAX_SHARDS = 16
_PER_SHARD = 1000


def shards_for(limit: int) -> int:
    """How many shards a global bound of ``limit`` is split over (1 below 2000: exact).

    A caller's :class:`~a2a_secure.store.base.Share` of a bound is split as the whole bound
    is, so that every caller's entries land in the same shards.
    """
    whole = getattr(limit, "whole", limit)
    return max(1, min(MAX_SHARDS, whole // _PER_SHARD))


def shard_of(member: str, shards: int) -> int:
    """The shard of an entry id."""
    return zlib.crc32(member.encode()) % shards


def shard_limit(limit: int, shards: int, index: int) -> int:
    """Shard ``index``'s share of ``limit``: the shares add up to ``limit`` exactly."""
    return limit // shards + (1 if index < limit % shards else 0)


# Conventions as in redis_keys.py: ``now`` is ARGV, checks come before the first write, and no
# script stops half-way. Each script here has exactly one key (the claim scripts of a DID,
# in redis_claims.py, have the DID's keys).

# KEYS: bound zset.  ARGV: now, limit, member, score (expires_at), ttl_ms
# 1 reserved, 0 full, 2 the member is already there (a live entry holds it: not counted again)
RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 2 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
local ttl = tonumber(ARGV[5])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

# KEYS: bound zset.  ARGV: member
RELEASE = """
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# KEYS: pending hash.  ARGV: now, data, expires_at, ttl_ms, source, shard
ADD_PENDING = """
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'e', ARGV[3], 's', ARGV[5], 'b', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS: pending hash.  ARGV: now.  {data, kid} or nil (an expired entry is deleted)
GET_PENDING = """
local v = redis.call('HMGET', KEYS[1], 'e', 'd', 'k')
if not v[1] then return false end
if tonumber(v[1]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
return {v[2], v[3]}
"""

# KEYS: pending hash.  ARGV: kid, now
MARK_PROVEN = """
local v = redis.call('HMGET', KEYS[1], 'e', 'k')
if not v[1] then return 0 end
if tonumber(v[1]) <= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
  return 0
end
if v[2] then return 0 end
redis.call('HSET', KEYS[1], 'k', ARGV[1])
return 1
"""

# KEYS: pending hash.  ARGV: now.  {source, shard} when it was live and proven (now deleted)
TAKE_PENDING = """
local v = redis.call('HMGET', KEYS[1], 'e', 'k', 's', 'b')
if not v[1] then return false end
if tonumber(v[1]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
if not v[2] then return false end
redis.call('DEL', KEYS[1])
return {v[3] or '', v[4] or '0'}
"""

# KEYS: session hash.  ARGV: record, expires_at, ttl_ms, shard
OPEN = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'r', ARGV[1], 'e', ARGV[2], 'l', '0', 'b', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: session hash.  ARGV: now.  The record, or nil (an expired session is deleted)
GET_SESSION = """
local v = redis.call('HMGET', KEYS[1], 'r', 'e')
if not v[1] then return false end
if tonumber(v[2]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
return v[1]
"""

# KEYS: session hash.  ARGV: now, sequence, request_hash, keep ('1': keep the previous
# state so that UNBEGIN can restore it)
# {kind, last[, reply or previous last]}: 0 GONE, 1 NEW, 2 REPLAY, 3 IN_PROGRESS, 4 STALE
BEGIN = """
local v = redis.call('HMGET', KEYS[1], 'e', 'l', 'h')
if not v[1] then return {0, '0'} end
if tonumber(v[1]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
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
redis.call('HDEL', KEYS[1], 'ph', 'py')
if ARGV[4] == '1' then
  local y = redis.call('HGET', KEYS[1], 'y')
  redis.call('HSET', KEYS[1], 'pl', v[2])
  if v[3] then redis.call('HSET', KEYS[1], 'ph', v[3]) end
  if y then redis.call('HSET', KEYS[1], 'py', y) end
else
  redis.call('HDEL', KEYS[1], 'pl')
end
redis.call('HSET', KEYS[1], 'l', ARGV[2], 'h', ARGV[3])
redis.call('HDEL', KEYS[1], 'y')
return {1, ARGV[2], v[2]}
"""

# KEYS: session hash.  ARGV: sequence, request_hash.  1 restored, 0 nothing to restore
UNBEGIN = """
local v = redis.call('HMGET', KEYS[1], 'l', 'h', 'y', 'pl', 'ph', 'py')
if not v[1] or v[1] ~= ARGV[1] or v[2] ~= ARGV[2] or v[3] or not v[4] then return 0 end
redis.call('HSET', KEYS[1], 'l', v[4])
if v[5] then redis.call('HSET', KEYS[1], 'h', v[5]) else redis.call('HDEL', KEYS[1], 'h') end
if v[6] then redis.call('HSET', KEYS[1], 'y', v[6]) end
redis.call('HDEL', KEYS[1], 'pl', 'ph', 'py')
return 1
"""

# KEYS: rate counter.  ARGV: limit, ttl_ms.  1 counted, 0 over the limit
RATE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
if count == 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# KEYS: rate counter.  A count given back; a window that has ended is left alone (DECR on a
# missing key would create it without a TTL).
UNRATE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count > 0 then redis.call('DECR', KEYS[1]) end
return 1
"""

# KEYS: session hash.  ARGV: sequence, reply
FINISH = """
local l = redis.call('HGET', KEYS[1], 'l')
if l and tonumber(l) == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'y', ARGV[2])
  redis.call('HDEL', KEYS[1], 'pl', 'ph', 'py')
  return 1
end
return 0
"""

# KEYS: session hash.  The session's bound shard (to release its reservation), or nil
CLOSE_SESSION = """
local b = redis.call('HGET', KEYS[1], 'b')
redis.call('DEL', KEYS[1])
return b
"""
