"""A shared store on Redis, so that several server processes serve one agent.

Every :class:`~a2a_secure.store.base.Store` method is ONE round trip and atomic: a Lua
script run with ``EVALSHA`` (registered with redis-py's ``register_script``, re-loaded by
redis-py on ``NOSCRIPT`` after a Redis restart). Semantics are those of
:class:`~a2a_secure.store.memory.MemoryStore`:

* **Logical time is the ``now`` argument.** Every expiry decision compares the stored
  ``expires_at`` with ``now``; Redis TTLs (``expires_at - now`` plus one second of slack)
  only reclaim memory, so a wall clock that differs from ``now`` never changes an answer.
* **Expired is gone for good.** A call that finds an entry expired deletes it, as
  ``MemoryStore`` forgets it, so a caller whose clock is behind does not revive it.
* **Bounds never evict a live entry.** Pending handshakes sit in sorted sets scored by
  ``expires_at`` (one per source, one global); sessions in one sorted set. A script first
  drops members with ``score <= now`` and then counts, so a bound is exact and an expired
  entry stops counting as soon as it expires, without a sweeper.
* **A session is one hash** ``s:<session_id>``: ``r`` its compact record, ``e`` its
  ``expires_at``, ``l`` the last accepted sequence, ``h`` that request's hash (32 raw
  bytes), ``y`` the stored reply once the request finished. About 0.6 KiB in Redis.
* **Rate counters** are fixed windows per (agent, client DID, period):
  ``r:<agent>|<did>:<period>:<window start>``, checked before the increment, expiring with
  the window.
* **Agents sharing a prefix.** A key of a pending handshake (``p:<nonce_b>:<agent>``), a
  rate window or an ``intent_id`` claim names its agent (the server DID), so that another
  agent never finds it; a session is found by its random id and its record names the agent,
  which the engine checks. Capacity bounds (``ps:``, ``pa``, ``sa``, ``ix``) and the deny
  list (``rv:``) are the store's. The table is in SECURITY.md ("Agents sharing one store").

**Failures.** Any Redis error (connection refused or reset, timeout, loading, OOM, read-only
replica, a script error) raises :class:`~a2a_secure.errors.Unavailable` (-32048, HTTP 503,
``Retry-After: 1``), and so does any other exception raised inside redis-py (while a
cluster fails over, its cluster client can fail with an ``AttributeError``, or on uvloop a
``RuntimeError``, on a connection it closed under the call): the outcome of that call is
unknown, as after a lost connection, and it is logged at ERROR by type and place. An
exception of this module's own code is a bug and goes up as one. A script either runs
whole or not at all, so there is never a half-written state. After a connection error the
pool's idle connections are dropped too, and redis-py connects afresh on the next call: the
store works again as soon as Redis is back, without a restart (scripts are re-loaded on
``NOSCRIPT``). The client is built WITHOUT command retries on purpose: re-sending a script
after a timeout whose first attempt did run would, for ``begin_request``, turn a new
request into a retry of itself. The one ambiguous case left is a timeout on a
``begin_request`` that did run: its sequence is then consumed without an answer, its
retries get 503 until the engine's replay wait ends, and the client must move on to a new
sequence; the intent itself never runs twice.

**Round trips per intent.** ``get_session`` is served from a small per-process cache of the
session records (they never change once opened); ``begin_request``'s script re-checks that
the session still exists, so a close or an expiry seen by another worker still wins (the
answer is then a signed -32043 instead of an unsigned one). ``session_cache_ttl=0`` turns
the cache off. ``finish_request`` does not wait for Redis: the answer is queued and sent in
one pipeline with this process's next command (by SHA; a command refused with NOSCRIPT did
not run and is sent again alone), or on its own after ``finish_linger`` (20 ms) when no
command comes first. An intent therefore costs one round trip (``begin_request``, carrying
the answer to the request before it), two on a worker's first request of a session or
after a pause. Until its answer is sent, a retry that reaches another worker finds the
request still running and waits (§6.1 step 7); a worker that dies in those milliseconds
loses the answer, as a failed ``finish_request`` did before. ``finish_linger=None`` stores
every answer before ``finish_request`` returns.

**Cluster and Sentinel.** ``redis+cluster://host:port[,host:port…]`` (or a
``redis.asyncio.cluster.RedisCluster`` client) spreads the state over the cluster: every
script touches one slot, each key carries the hash tag of its session, client DID, pending
handshake or source address, and the global bounds are sharded; the layout, the order of
the scripts of an operation that spans slots, and what a failure between them leaves are
in :mod:`a2a_secure.store.redis_cluster`. An intent is still one round trip (its session's
script and its DID's rate window, with the claim of its ``intent_id`` if it has one, go in
one pipeline, to two nodes in parallel when needed).
A prefix with its own hash tag (``"{a2a}:"``) keeps the older layout: every key in that one
slot. ``redis+sentinel://host:port[,host:port…]/service`` follows the primary that Sentinel
names. The URL forms are in :mod:`a2a_secure.store.redis_connect`. A cluster that is down
or failing over (``CLUSTERDOWN``, a primary unreachable, ``TRYAGAIN`` past redis-py's own
retries) is an outage like any other: 503 with ``Retry-After``; the slot map is read again
in the background so that the promoted replica is used as soon as it takes over.

**Replication.** Redis replicates asynchronously: a write the primary acknowledged can be
lost when it fails before its replicas have it (a consumed sequence, a stored answer).
``wait_replicas=N`` sends ``WAIT N wait_timeout_ms`` on the same connection, in the same
round trip, after each ``begin_request`` and each stored answer: a request whose sequence
the replicas did not confirm is refused with 503 before its intent runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from a2a_secure.errors import Unavailable, log_unexpected
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.store import redis_claims as rcl
from a2a_secure.store import redis_cluster as rc
from a2a_secure.store.actions import Decision, DecisionKind, PendingAction
from a2a_secure.store.base import (
    Begin,
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    StoredReply,
)
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest
from a2a_secure.store.redis_connect import Deployment, client_from_url, close_client
from a2a_secure.store.revocation import DID_FIELD, Revocation

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.commands.core import AsyncScript

__all__ = ["RedisStore"]

_log = logging.getLogger("a2a_secure.store.redis")

# The Retry-After of a new intent_id refused because the store holds its bound of claims, on
# a spread cluster (where the reservation does not tell when the earliest one lapses).
_TOTAL_FULL_RETRY = 60

# Redis TTLs only reclaim memory; the slack keeps a key alive a little past its logical
# expiry so that a worker whose clock is slightly behind still finds it.
_TTL_SLACK_MS = 1000

# -- scripts ----------------------------------------------------------------------------------
# Conventions: ``now`` is ARGV, never Redis' TIME. Every check comes before the first
# write, and no script stops half-way: Redis refuses a script for OOM only at its first
# write (once a script has written, its later writes are allowed), and the scripts have no
# error path after a write.

_EXTEND = """
local function extend(key, ttl)
  local cur = redis.call('PTTL', key)
  if cur < ttl then redis.call('PEXPIRE', key, ttl) end
end
"""

_DROP_PENDING = """
local function drop_pending(key, all, nonce, prefix, source)
  redis.call('DEL', key)
  redis.call('ZREM', all, nonce)
  redis.call('ZREM', prefix .. 'ps:' .. (source or ''), nonce)
end
"""

# The pending handshake as {expires_at, source, data, kid}, or nil when there is none or it
# has expired (then it is dropped at once).
_LIVE_PENDING = (
    _DROP_PENDING
    + """
local function live_pending(key, all, now, nonce, prefix)
  local v = redis.call('HMGET', key, 'e', 's', 'd', 'k')
  if not v[1] then return nil end
  if tonumber(v[1]) <= tonumber(now) then
    drop_pending(key, all, nonce, prefix, v[2])
    return nil
  end
  return v
end
"""
)

# KEYS: pending hash, per-source zset, global zset
# ARGV: now, max_per_source, max_total, data, expires_at, ttl_ms, source, nonce_b, prefix
_ADD_PENDING = (
    _EXTEND
    + _DROP_PENDING
    + """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2])
   or redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then
  return 0
end
local old = redis.call('HMGET', KEYS[1], 'e', 's')
if old[1] then
  if tonumber(old[1]) > now then return 0 end
  drop_pending(KEYS[1], KEYS[3], ARGV[8], ARGV[9], old[2])
end
local ttl = tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'd', ARGV[4], 'e', ARGV[5], 's', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[8])
extend(KEYS[2], ttl)
extend(KEYS[3], ttl)
return 1
"""
)

# An expired entry found by any call is deleted at once (as MemoryStore forgets it): it
# stays gone even for a caller whose clock is behind.

# KEYS: pending hash, global zset.  ARGV: now, nonce_b, prefix.  Returns {data, kid} or nil.
_GET_PENDING = (
    _LIVE_PENDING
    + """
local v = live_pending(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
if not v then return false end
return {v[3], v[4]}
"""
)

# KEYS: pending hash, global zset.  ARGV: kid, now, nonce_b, prefix
_MARK_PROVEN = (
    _LIVE_PENDING
    + """
local v = live_pending(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4])
if not v or v[4] then return 0 end
redis.call('HSET', KEYS[1], 'k', ARGV[1])
return 1
"""
)

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

# Runs first in the same script as _BEGIN_REQUEST (a2a_secure.store.revocation): the last
# key is the client DID's revocation hash ("*" = the whole DID, else key ids), ARGV[7] the
# client DID. Nothing revoked costs one EXISTS; a revoked session is forgotten at once.
_REVOCATION_GUARD = """
local rvk = KEYS[#KEYS]
if redis.call('EXISTS', rvk) == 1 then
  local hit = redis.call('HEXISTS', rvk, '*') == 1
  if not hit then
    local r = redis.call('HGET', KEYS[1], 'r')
    if r then
      local kid = cjson.decode(r)[4]
      local did = ARGV[7]
      if kid == 0 then kid = did .. '#' .. string.match(did, '[^:]*$')
      elseif type(kid) == 'string' then kid = did .. kid
      else kid = kid[1] end
      hit = redis.call('HEXISTS', rvk, kid) == 1
    end
  end
  if hit then
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], ARGV[6])
    return {6, '0'}
  end
end
"""

# The revocation entries of one DID, in one key (its slot on a cluster). The index of all
# targets (for --list) is another key, written after: it never decides a check.
# KEYS: the DID's revocation hash.  ARGV: field, entry JSON
_ADD_REVOCATION = """
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
"""

# KEYS: the DID's revocation hash.  ARGV: field
_REMOVE_REVOCATION = """
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

# On a cluster the session and the DID's entries are in two slots: the fields of the DID's
# entries are read in the same round trip as the session's script.  KEYS: the DID's hash.
_REVOKED_FIELDS = """
return redis.call('HKEYS', KEYS[1])
"""


class _NotReplicated(Exception):
    """The replicas did not acknowledge a write within ``wait_timeout_ms``."""

    def __init__(self, replicas: int) -> None:
        super().__init__(f"WAIT: fewer than {replicas} replica(s) acknowledged in time")


def _redis_errors() -> tuple[type[Exception], ...]:
    try:
        from redis.exceptions import RedisClusterException, RedisError  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the store cannot be built without redis
        return (OSError,)
    # SlotNotCoveredError (the slot map has a hole while a cluster fails over) is a
    # RedisClusterException, not a RedisError.
    return (RedisError, RedisClusterException, OSError)


_ERRORS = _redis_errors()


def _client_dir() -> str:
    try:
        import redis  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the store cannot be built without redis
        return "\0"
    return os.path.dirname(os.path.abspath(redis.__file__)) + os.sep


_CLIENT_DIR = _client_dir()


def _store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the store (503), rather than a bug of this module.

    A Redis error is one; so is any exception raised inside redis-py itself. Its cluster
    client is not free of races while a cluster fails over: when a node answers
    ``CLUSTERDOWN`` it closes every connection (after a timeout, a node's idle ones),
    including one another call has just taken and is about to write on; that call then
    fails with an ``AttributeError`` (no writer any more) or, on uvloop, a ``RuntimeError``
    (the transport is closed), not a ``ConnectionError``. Whatever its type, the outcome
    of that call is unknown, exactly as after a lost connection. An exception that never
    went through redis-py is this module's own bug, and goes up as one.
    """
    if isinstance(exc, _ERRORS):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_CLIENT_DIR):
            return True
        tb = tb.tb_next
    return False


# (script, keys, args): one script call.
_Call = tuple["AsyncScript", list[Any], list[Any]]

# -- actions waiting for approval (store/actions.py) --------------------------------------------
# An action is one hash: ``d`` its record as created (JSON), ``st`` its state, ``e`` its
# expires_at, ``k`` its keep_until, ``h`` its action_hash, ``c`` its caller DID, ``by``/``at``
# who decided it and when. Its id is in two sorted sets scored by expires_at while it is
# pending (one per caller DID, one global): they are the bounds.

# KEYS: action hash, caller zset, global zset
# ARGV: now, max_per_caller, max_total, record, expires_at, keep_until, ttl_ms, action_id,
#       action_hash, caller_did.  Returns 1 stored, 0 a bound is reached, 2 the id exists.
_ADD_ACTION = (
    _EXTEND
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2])
   or redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
local ttl = tonumber(ARGV[7])
redis.call('HSET', KEYS[1], 'd', ARGV[4], 'st', 'pending', 'e', ARGV[5], 'k', ARGV[6],
           'h', ARGV[9], 'c', ARGV[10])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[8])
extend(KEYS[2], ttl)
extend(KEYS[3], ttl)
return 1
"""
)

# KEYS: action hash.  ARGV: now.  Returns {record, state, decided_by, decided_at} or nil.
_GET_ACTION = """
local v = redis.call('HMGET', KEYS[1], 'd', 'k', 'st', 'by', 'at')
if not v[1] then return false end
if tonumber(v[2]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
return {v[1], v[3], v[4] or '', v[5] or ''}
"""

# KEYS: action hash, caller zset, global zset
# ARGV: now, action_hash, new state, decided_by, action_id, caller_did
# Returns {kind[, record, state, decided_by, decided_at]}:
# 0 UNKNOWN, 1 DECIDED, 2 EXPIRED, 3 ALREADY, 4 MISMATCH (nothing written)
_DECIDE_ACTION = """
local v = redis.call('HMGET', KEYS[1], 'd', 'k', 'st', 'e', 'h', 'c', 'by', 'at')
if not v[1] or tonumber(v[2]) <= tonumber(ARGV[1]) or v[6] ~= ARGV[6] then return {0} end
if v[3] ~= 'pending' then return {3, v[1], v[3], v[7] or '', v[8] or ''} end
if v[5] ~= ARGV[2] then return {4, v[1], v[3], '', ''} end
local at = tostring(math.floor(tonumber(ARGV[1])))
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[5])
if tonumber(v[4]) <= tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'st', 'expired', 'at', at)
  return {2, v[1], 'expired', '', at}
end
redis.call('HSET', KEYS[1], 'st', ARGV[3], 'by', ARGV[4], 'at', at)
return {1, v[1], ARGV[3], ARGV[4], at}
"""

_DECISIONS = {
    0: DecisionKind.UNKNOWN,
    1: DecisionKind.DECIDED,
    2: DecisionKind.EXPIRED,
    3: DecisionKind.ALREADY,
    4: DecisionKind.MISMATCH,
}


def _action_from(record: bytes, state: bytes, by: bytes, at: bytes) -> PendingAction:
    """A stored action from its creation record and the members a decision wrote."""
    data = encoding.loads(record)
    data["state"] = state.decode()
    data["decided_by"] = by.decode() or None
    data["decided_at"] = int(at) if at else None
    return PendingAction.from_dict(data)


# -- intent ids (store/intents.py) --------------------------------------------------------------
# The claim layout and the scripts shared with the spread cluster are in redis_claims.py.

# The guarded _BEGIN_REQUEST and, when it would answer NEW, the claim, as one script. Every
# check (the claim's and the per-DID bound's included) comes before begin_writes, the first
# write, so a FULL claim consumes nothing, as a rate-limited request does.
# KEYS: session hash, session zset, rate counter (or the session hash when not counted),
#       claim hash, the DID's claim zset (at this agent), the store's claim zset, the DID's
#       revocation hash
# ARGV: 1-6 as _BEGIN_REQUEST, 7 client DID (_REVOCATION_GUARD), 8 intent_id, 9 intent hash,
#       10 running_until, 11 expires_at, 12 claim ttl_ms, 13 max claims per DID, 14 max
#       claims in the store ('' = no bound), 15 the claim's member in the store's zset
# Returns _BEGIN_REQUEST's answer (or the guard's) when not NEW; {1, last, claim kind[,
# answer]} when NEW; {7, last, earliest expiry of the DID's claims} when the DID's bound is
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
if c[1] ~= -1 then
  if c[2] then return {1, ARGV[2], c[1], c[2]} end
  return {1, ARGV[2], c[1]}
end
local ttl = tonumber(ARGV[12])
redis.call('HSET', KEYS[4], 'h', ARGV[9], 'u', ARGV[10], 'e', ARGV[11])
redis.call('PEXPIRE', KEYS[4], ttl)
redis.call('ZADD', KEYS[5], ARGV[11], ARGV[8])
extend(KEYS[5], ttl)
redis.call('ZADD', KEYS[6], ARGV[11], ARGV[15])
extend(KEYS[6], ttl)
return {1, ARGV[2], 0}
"""
)

_KINDS = {
    0: BeginKind.GONE,
    1: BeginKind.NEW,
    2: BeginKind.REPLAY,
    3: BeginKind.IN_PROGRESS,
    4: BeginKind.STALE,
    5: BeginKind.RATE_LIMITED,
    6: BeginKind.REVOKED,
}


# -- compact encodings --------------------------------------------------------------------------
_HASH_PREFIX = "sha256:"


def _pack_hash(value: str) -> str:
    # "sha256:<hex>" loses its constant prefix; anything else is kept, marked with "!".
    return value[len(_HASH_PREFIX) :] if value.startswith(_HASH_PREFIX) else "!" + value


def _unpack_hash(value: str) -> str:
    return value[1:] if value.startswith("!") else _HASH_PREFIX + value


def _request_hash_bytes(value: str) -> bytes:
    """The request hash as stored: 32 raw bytes for ``sha256:<hex>``, else its UTF-8."""
    hexpart = value[len(_HASH_PREFIX) :]
    if value.startswith(_HASH_PREFIX) and len(hexpart) == 64:
        try:
            return bytes.fromhex(hexpart)
        except ValueError:
            pass
    return b"!" + value.encode()


def _pack_kid(kid: str, did: str) -> Any:
    # did:key's kid is "<did>#<method-specific id>": stored as 0; "<did>#x" as "#x".
    if kid == f"{did}#{did.rsplit(':', 1)[-1]}":
        return 0
    if kid.startswith(did + "#"):
        return kid[len(did) :]
    return [kid]


def _unpack_kid(value: Any, did: str) -> str:
    if value == 0:
        return f"{did}#{did.rsplit(':', 1)[-1]}"
    if isinstance(value, str):
        return did + value
    return str(value[0])


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


def _num(now: float) -> str:
    """A number for a script argument (exact for integers, round-trip for floats)."""
    return str(int(now)) if float(now).is_integer() else repr(float(now))


def _ttl_ms(expires_at: float, now: float) -> int:
    return max(1, math.ceil((expires_at - now) * 1000)) + _TTL_SLACK_MS


def _has_hash_tag(prefix: str) -> bool:
    """Whether keys under ``prefix`` all hash to one slot (a ``{…}`` tag in the prefix)."""
    start = prefix.find("{")
    return start >= 0 and prefix.find("}", start + 2) > start


def _import_redis() -> Any:
    try:
        import redis.asyncio as redis_asyncio  # noqa: PLC0415 - optional extra
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("RedisStore needs the redis extra: pip install 'a2a-secure[redis]'") from exc
    return redis_asyncio


class RedisStore:
    """:class:`~a2a_secure.store.base.Store` on Redis, shared by every worker of one agent.

    ``url`` is one Redis (``redis://``, ``rediss://``, ``unix://``), a Redis Cluster
    (``redis+cluster://host:port[,host:port…]``) or a primary behind Sentinel
    (``redis+sentinel://host:port[,host:port…]/service``); the forms are in
    :mod:`a2a_secure.store.redis_connect`. ``prefix`` starts every key, so several agents
    can share one Redis. ``socket_timeout`` bounds connecting and each command (seconds):
    past it the call answers 503. ``client`` is a ready ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster`` (bytes replies, ideally without command retries,
    see the module documentation); the store does not close a client it was given.

    ``wait_replicas`` (0 = off) and ``wait_timeout_ms``: after each ``begin_request`` and
    each stored answer, ``WAIT`` for that many replicas in the same round trip; a new
    request the replicas did not confirm in time is refused (503) before its intent runs.
    It costs the replication delay on every intent, and up to ``wait_timeout_ms`` when a
    replica lags or is down.

    ``session_cache_ttl`` (seconds, 0 = off) and ``session_cache_size`` bound the
    per-process cache of session records used by :meth:`get_session`.

    ``finish_linger`` (seconds): :meth:`finish_request` does not wait for Redis. The answer
    goes in the same round trip as this process's next command (so an intent costs one
    round trip), or on its own after ``finish_linger`` if no command comes first. Until
    then, a retry that reaches another worker finds the request still running and waits
    for the answer (§6.1 step 7). ``None`` stores each answer before ``finish_request``
    returns, in a round trip of its own.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "a2a:",
        socket_timeout: float = 1.0,
        client: Redis | RedisCluster | None = None,
        session_cache_ttl: float = 30.0,
        session_cache_size: int = 10_000,
        finish_linger: float | None = 0.02,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
    ) -> None:
        _import_redis()
        if any(type(v) is not int or v < 0 for v in (wait_replicas, wait_timeout_ms)):
            # A float or a bool would reach WAIT and fail every intent (503) at run time.
            raise ValueError("wait_replicas and wait_timeout_ms must be integers, not negative")
        if client is None:
            client, deployment = client_from_url(url, socket_timeout=socket_timeout)
            self._owns_client = True
        else:
            from redis.asyncio.cluster import RedisCluster as _Cluster  # noqa: PLC0415

            deployment = Deployment.CLUSTER if isinstance(client, _Cluster) else Deployment.SINGLE
            self._owns_client = False
        self.deployment = deployment
        self._cluster = deployment is Deployment.CLUSTER
        # On a cluster, every key carries its own hash tag (redis_cluster.py), unless the
        # prefix has one: then the older layout (every key in that one slot) is kept.
        self._spread = self._cluster and not _has_hash_tag(prefix)
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms
        self.prefix = prefix
        self._r: Any = client
        self._add_pending = client.register_script(_ADD_PENDING)
        self._get_pending = client.register_script(_GET_PENDING)
        self._get_session = client.register_script(_GET_SESSION)
        self._mark_proven = client.register_script(_MARK_PROVEN)
        self._open_session = client.register_script(_OPEN_SESSION)
        self._begin_request = client.register_script(_BEGIN_REQUEST)
        self._begin_request_guarded = client.register_script(_REVOCATION_GUARD + _BEGIN_REQUEST)
        self._add_revocation = client.register_script(_ADD_REVOCATION)
        self._remove_revocation = client.register_script(_REMOVE_REVOCATION)
        self._c_revoked = client.register_script(_REVOKED_FIELDS)
        self._finish_request = client.register_script(_FINISH_REQUEST)
        self._close_session = client.register_script(_CLOSE_SESSION)
        self._begin_intent = client.register_script(_BEGIN_INTENT)
        self._get_claim = client.register_script(rcl.GET_CLAIM)
        self._finish_intent = client.register_script(rcl.FINISH_INTENT)
        self._add_action = client.register_script(_ADD_ACTION)
        self._get_action = client.register_script(_GET_ACTION)
        self._decide_action = client.register_script(_DECIDE_ACTION)
        self._c_reserve = client.register_script(rc.RESERVE)
        self._c_release = client.register_script(rc.RELEASE)
        self._c_add_pending = client.register_script(rc.ADD_PENDING)
        self._c_get_pending = client.register_script(rc.GET_PENDING)
        self._c_mark_proven = client.register_script(rc.MARK_PROVEN)
        self._c_take_pending = client.register_script(rc.TAKE_PENDING)
        self._c_open = client.register_script(rc.OPEN)
        self._c_get_session = client.register_script(rc.GET_SESSION)
        self._c_begin = client.register_script(rc.BEGIN)
        self._c_unbegin = client.register_script(rc.UNBEGIN)
        self._c_rate = client.register_script(rc.RATE)
        self._c_unrate = client.register_script(rc.UNRATE)
        self._c_finish = client.register_script(rc.FINISH)
        self._c_close_session = client.register_script(rc.CLOSE_SESSION)
        self._c_claim = client.register_script(rcl.CLAIM)
        self._c_unclaim = client.register_script(rcl.UNCLAIM)
        self._scripts_in_use = (
            [
                self._c_reserve,
                self._c_release,
                self._c_add_pending,
                self._c_get_pending,
                self._c_mark_proven,
                self._c_take_pending,
                self._c_open,
                self._c_get_session,
                self._c_begin,
                self._c_unbegin,
                self._c_rate,
                self._c_unrate,
                self._c_finish,
                self._c_close_session,
                self._c_revoked,
                self._c_claim,
                self._c_unclaim,
            ]
            if self._spread
            else [
                self._add_pending,
                self._get_pending,
                self._get_session,
                self._mark_proven,
                self._open_session,
                self._begin_request,
                self._begin_request_guarded,
                self._finish_request,
                self._close_session,
                self._begin_intent,
            ]
        ) + [
            self._add_action,
            self._get_action,
            self._decide_action,
            self._add_revocation,
            self._remove_revocation,
            self._get_claim,
            self._finish_intent,
        ]
        self._loaded = False
        self._loading: asyncio.Future[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._last_refresh = -math.inf
        self._cache_ttl = session_cache_ttl
        self._cache_size = session_cache_size
        self._cache: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()
        self._last_logged = -math.inf
        self._unexpected_logged: dict[str, float] = {}
        # Answers not yet sent to Redis: key -> (the script that stores it, its arguments);
        # a session's answer (sequence, reply JSON) or an intent_id's (intent hash, JSON).
        self._finish_linger = finish_linger
        self._unsent: dict[str, tuple[AsyncScript, list[Any]]] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        # Answers on their way to Redis: session key -> done when their round trip ends. A
        # command about that session waits for it (it would overtake them on another
        # connection of the pool, and miss the answer this process has already given).
        self._sending: dict[str, asyncio.Future[None]] = {}
        self.round_trips = 0  # network round trips to Redis (tests and metrics)
        self.commands = 0  # commands sent to Redis, several per round trip when pipelined

    @property
    def client(self) -> Redis | RedisCluster:
        """The redis-py client in use (a ``RedisCluster`` on a cluster)."""
        client: Redis | RedisCluster = self._r
        return client

    # -- keys ------------------------------------------------------------------------------------
    # On a cluster (the spread layout) every key has the hash tag of what it belongs to; the
    # single-Redis names are unchanged. See redis_cluster.py for the table.
    # Several agents may share one prefix: a key of a pending handshake, a rate window or an
    # intent id names its agent (the server DID, ``agent``), after a '|' that no DID holds,
    # so that another agent never finds it (SECURITY.md, "Agents sharing one store").
    def _k_pending(self, agent: str, nonce_b: str) -> str:
        # nonce_b is base64url (no ':'), so the agent after it cannot change where it ends.
        if self._spread:
            return f"{self.prefix}{{p:{nonce_b}}}:{agent}"
        return f"{self.prefix}p:{nonce_b}:{agent}"

    def _k_source(self, source: str) -> str:
        return f"{self.prefix}{{ps:{source}}}" if self._spread else f"{self.prefix}ps:{source}"

    def _k_pending_all(self) -> str:
        return f"{self.prefix}pa"

    def _k_pending_shard(self, index: int) -> str:
        return f"{self.prefix}{{pa:{index}}}"

    def _k_session(self, session_id: str) -> str:
        return f"{self.prefix}{{s:{session_id}}}" if self._spread else f"{self.prefix}s:{session_id}"

    def _k_session_tag(self, session_id: str) -> str:
        """The start of keys that belong to a session: on a cluster, in the session's slot."""
        return f"{self.prefix}{{s:{session_id}}}:" if self._spread else f"{self.prefix}s:{session_id}:"

    def _k_sessions(self) -> str:
        return f"{self.prefix}sa"

    def _k_session_shard(self, index: int) -> str:
        return f"{self.prefix}{{sa:{index}}}"

    def _k_did_tag(self, did: str) -> str:
        """The start of keys that belong to a client DID: on a cluster, in the DID's slot.

        A script over several of a DID's keys (its rate window, remembered intent ids,
        a revocation entry) stays in one slot when every key is built on this.
        """
        return f"{self.prefix}{{d:{did}}}:" if self._spread else f"{self.prefix}d:{did}:"

    def _k_rate(self, agent: str, client_did: str, period: int, start: int) -> str:
        if self._spread:
            return f"{self._k_did_tag(client_did)}r:{agent}|{period}:{start}"
        return f"{self.prefix}r:{agent}|{client_did}:{period}:{start}"

    def _k_revoked(self, did: str) -> str:
        # The one place a DID's revocation key is named: in the DID's slot on a cluster.
        if self._spread:
            return f"{self._k_did_tag(did)}rv"
        return f"{self.prefix}rv:{did}"

    def _k_revocations(self) -> str:
        return f"{self.prefix}rva"

    # The keys of actions waiting for approval: built here only, so a cluster layout can give
    # them hash tags of their own.
    # Creating or deciding an action touches the action, its caller's bound and the global
    # bound in one script. An approver names only the action id, so on a cluster the three
    # share one fixed tag: every action lives in one slot. Actions move at the pace of the
    # people who approve them, so that slot is never the bottleneck sessions would make it.
    def _k_action_tag(self) -> str:
        return f"{self.prefix}{{act}}:" if self._spread else self.prefix

    def _k_action(self, action_id: str) -> str:
        return f"{self._k_action_tag()}act:{action_id}"

    def _k_actions_of(self, caller_did: str) -> str:
        return f"{self._k_action_tag()}actc:{caller_did}"

    def _k_actions(self) -> str:
        return f"{self._k_action_tag()}acta"

    def _action_keys(self, action_id: str, caller_did: str) -> list[str]:
        return [self._k_action(action_id), self._k_actions_of(caller_did), self._k_actions()]

    def _k_intent(self, agent: str, client_did: str, intent_id: str) -> str:
        # A claim and its DID's bound: in the DID's slot on a cluster, with its rate window.
        if self._spread:
            return f"{self._k_did_tag(client_did)}i:{agent}|{intent_id}"
        return f"{self.prefix}i:{agent}|{client_did}:{intent_id}"

    def _k_intents(self, agent: str, client_did: str) -> str:
        if self._spread:
            return f"{self._k_did_tag(client_did)}ia:{agent}"
        return f"{self.prefix}ia:{agent}|{client_did}"

    def _k_intents_all(self) -> str:
        """The store's bound on claims (every agent, every DID): one Redis."""
        return f"{self.prefix}ix"

    def _k_intents_shard(self, index: int) -> str:
        """The store's bound on claims, shard ``index`` (spread cluster)."""
        return f"{self.prefix}{{ix:{index}}}"

    @staticmethod
    def _claim_member(claim_key: str) -> bytes:
        """A claim's member in the store's bound: 16 bytes naming its key."""
        return hashlib.sha256(claim_key.encode()).digest()[:16]

    # -- the one place that talks to Redis ----------------------------------------------------------
    async def _unavailable(self, exc: Exception) -> Unavailable:
        from redis.exceptions import ClusterError, SlotNotCoveredError  # noqa: PLC0415
        from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415
        from redis.exceptions import TimeoutError as RedisTimeoutError  # noqa: PLC0415

        # Neither a Redis error nor the replicas' silence, so raised inside redis-py (see
        # _store_failure): its client's state is in doubt as after a lost connection, and
        # it is logged as a bug.
        unexpected = not isinstance(exc, _ERRORS) and not isinstance(exc, _NotReplicated)
        if self._cluster:
            if unexpected or isinstance(
                exc, RedisConnectionError | RedisTimeoutError | OSError | ClusterError | SlotNotCoveredError
            ):
                # A node is unreachable or the cluster is failing over: read the slot map
                # again (in the background), so that the promoted replica is used as soon
                # as it takes over. (ClusterDownError is a ClusterError.)
                self._refresh_slots()
        elif unexpected or isinstance(exc, RedisConnectionError | OSError):
            # The idle connections were most likely cut too (Redis restarted, network
            # change, Sentinel failover): drop them, so that the next call connects afresh
            # instead of failing once per stale pooled connection.
            with contextlib.suppress(Exception):
                await self._r.connection_pool.disconnect(inuse_connections=False)
        now = time.monotonic()
        if unexpected:
            self._log_unexpected(exc, now)
        elif now - self._last_logged >= 10.0:
            self._last_logged = now
            _log.warning("shared store unavailable: %s: %s", type(exc).__name__, str(exc)[:200])
        return Unavailable("shared store unavailable", retry_after=1)

    def _log_unexpected(self, exc: BaseException, now: float) -> None:
        """Log (ERROR) a failure of redis-py that is no Redis error: once a kind and place per 10 s.

        By type and ``file:line in function`` only: its text may quote a command's arguments.
        """
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        place = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        kind = f"{type(exc).__qualname__} {place}"
        if now - self._unexpected_logged.get(kind, -math.inf) < 10.0:
            return
        if len(self._unexpected_logged) >= 64:
            self._unexpected_logged.clear()
        self._unexpected_logged[kind] = now
        log_unexpected(_log, "shared store call failed inside redis-py (taken as an outage)", exc)

    @contextlib.asynccontextmanager
    async def _outage(self) -> AsyncIterator[None]:
        """Around a direct client call: a failure of the store (see ``_store_failure``) raises
        :class:`Unavailable`; anything else, a bug here, goes up as it is."""
        try:
            yield
        except Exception as exc:
            if not _store_failure(exc):
                raise
            raise await self._unavailable(exc) from exc

    def _refresh_slots(self) -> None:
        """Read the cluster's slot map again, at most every 200 ms, one read at a time."""
        now = time.monotonic()
        if (self._refresh is not None and not self._refresh.done()) or now - self._last_refresh < 0.2:
            return
        self._last_refresh = now
        self._refresh = asyncio.ensure_future(self._read_slots())

    async def _read_slots(self) -> None:
        # Failures are expected while the cluster fails over; the next error tries again.
        with contextlib.suppress(Exception):
            await self._r.nodes_manager.initialize()

    async def _script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script (with the unsent answers): its reply; any failure is Unavailable."""
        out, _ = await self._run([(script, list(keys), list(args))])
        return out[0]

    async def _run(
        self, calls: list[_Call], *, strict: bool = True, wait: bool = False
    ) -> tuple[list[Any], bool]:
        """Run ``calls`` in one round trip, with the unsent answers: (their replies, confirmed).

        ``strict``: a failed call raises Unavailable; otherwise its exception is its reply.
        ``wait``: with ``wait_replicas``, ``WAIT`` follows the calls on each connection, and
        ``confirmed`` says whether the replicas acknowledged (always True without it).
        """
        if self._sending:
            await self._after_sending([k for _, keys, _ in calls for k in keys])
        if not self._loaded:
            try:
                await self._load_scripts()
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                if strict:
                    raise await self._unavailable(exc) from exc
                return [exc] * len(calls), not (wait and self._wait_replicas)
        if not self._unsent and len(calls) == 1 and not (wait and self._wait_replicas):
            from redis.exceptions import NoScriptError  # noqa: PLC0415 - optional extra

            script, keys, args = calls[0]
            self.round_trips += 1
            self.commands += 1
            try:
                try:
                    return [await self._r.evalsha(script.sha, len(keys), *keys, *args)], True
                except NoScriptError:  # it did not run: load every script, send it again
                    await self._load_scripts()
                    self.round_trips += 1
                    self.commands += 1
                    return [await self._r.evalsha(script.sha, len(keys), *keys, *args)], True
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                if strict:
                    raise await self._unavailable(exc) from exc
                return [exc], True
        return await self._pipelined(calls, strict=strict, wait=wait)

    async def _load_scripts(self) -> None:
        """Load every script this layout uses (on every primary of a cluster).

        Loading them all at once, whenever one is missing, means that the scripts of one
        pipeline are either all known or all unknown (a restart, a promoted replica, a
        SCRIPT FLUSH forget them all): when they are all refused, they are sent again in
        the same order, so an answer is never stored after the command behind it ran.
        (Not counted in ``round_trips``: once per process and after each such event.)
        """
        self._loaded = False
        loading = self._loading
        if loading is None or loading.done() or loading.get_loop() is not asyncio.get_running_loop():
            loading = self._loading = asyncio.ensure_future(self._load_all())
        await asyncio.shield(loading)  # one load at a time, shared by every caller

    async def _load_all(self) -> None:
        if self._cluster:  # SCRIPT LOAD goes to every primary
            for script in self._scripts_in_use:
                await self._r.script_load(script.script)
        else:
            pipe = self._r.pipeline(transaction=False)
            for script in self._scripts_in_use:
                pipe.script_load(script.script)
            await pipe.execute()
        self._loaded = True

    async def _pipelined(self, calls: list[_Call], *, strict: bool, wait: bool) -> tuple[list[Any], bool]:
        """The unsent answers, then ``calls``, in one round trip; ``calls``' replies.

        The scripts are called by their SHA. A command refused with NOSCRIPT (Redis restarted,
        its script cache was flushed, or a replica was promoted) did not run: its script is
        loaded and those commands are sent again; the commands that did run are not repeated.
        """
        if self._sending:
            await self._after_sending([k for _, keys, _ in calls for k in keys])
        unsent, self._unsent = self._unsent, {}
        if self._flush_timer is not None:  # nothing left for it to send
            self._flush_timer.cancel()
            self._flush_timer = None
        if not unsent:
            return await self._send(calls, unsent, strict=strict, wait=wait)
        sent = asyncio.get_running_loop().create_future()
        for key in unsent:
            self._sending[key] = sent
        try:
            return await self._send(calls, unsent, strict=strict, wait=wait)
        finally:
            for key in unsent:
                if self._sending.get(key) is sent:
                    del self._sending[key]
            sent.set_result(None)

    async def _after_sending(self, keys: Sequence[str]) -> None:
        """Wait until the answers being sent for any of ``keys`` have reached Redis."""
        for key in keys:
            sent = self._sending.get(key)
            if sent is not None:
                await asyncio.wait((sent,))  # not cancelled with its waiter

    async def _send(
        self,
        calls: list[_Call],
        unsent: dict[str, tuple[AsyncScript, list[Any]]],
        *,
        strict: bool,
        wait: bool,
    ) -> tuple[list[Any], bool]:
        answers: list[_Call] = [(script, [key], args) for key, (script, args) in unsent.items()]
        waiting = bool(self._wait_replicas) and (wait or bool(answers))
        out, confirmed = await self._execute(answers + calls, waiting)
        # The answers that failed are lost (logged), as a failed finish_request loses its own;
        # they must not fail the calls, which did run: their outcome stands.
        lost = [r for r in out[: len(answers)] if isinstance(r, Exception)]
        if not calls:
            if lost:
                raise await self._unavailable(lost[0])
        elif lost:
            _log.warning("%d stored answer(s) lost: %s", len(lost), str(lost[0])[:200])
        if answers and not confirmed:
            _log.warning(
                "%d stored answer(s) not confirmed by %d replica(s)", len(answers), self._wait_replicas
            )
        mine = out[len(answers) :]
        if strict:
            for reply in mine:
                if isinstance(reply, Exception):
                    raise await self._unavailable(reply)
        return mine, confirmed

    async def _execute(
        self, calls: list[_Call], waiting: bool, *, reload: bool = True
    ) -> tuple[list[Any], bool]:
        """``calls`` in one pipeline (and the WAIT commands): replies or exceptions, and confirmed."""

        if not calls:
            return [], True
        from redis.exceptions import NoScriptError  # noqa: PLC0415 - optional extra

        try:
            pipe = self._r.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            waits = await self._add_waits(pipe, calls) if waiting else 0
            self.round_trips += 1
            self.commands += len(calls) + waits
            replies = list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            if not _store_failure(exc):
                raise
            # Nothing is known of any call (some may have run): each one failed.
            return [exc] * len(calls), not waiting
        out, acks = replies[: len(calls)], replies[len(calls) :]
        confirmed = all(isinstance(n, int) and n >= self._wait_replicas for n in acks)
        missing = [i for i, reply in enumerate(out) if isinstance(reply, NoScriptError)]
        if missing and reload:
            try:
                await self._load_scripts()
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                for i in missing:
                    out[i] = exc
                return out, confirmed
            again, confirmed_again = await self._execute([calls[i] for i in missing], waiting, reload=False)
            for i, reply in zip(missing, again, strict=True):
                out[i] = reply
            confirmed = confirmed and confirmed_again
        return out, confirmed

    async def _add_waits(self, pipe: Any, calls: list[_Call]) -> int:
        """Queue ``WAIT`` behind the calls on each connection the pipeline uses; how many."""
        command = ("WAIT", self._wait_replicas, self._wait_timeout_ms)
        if not self._cluster:
            pipe.execute_command(*command)
            return 1
        # One connection per node: WAIT covers the writes sent before it on that connection.
        await self._r.initialize()
        nodes = {}
        for _, keys, _ in calls:
            node = self._r.get_node_from_key(keys[0])
            nodes[node.name] = node
        for node in nodes.values():
            pipe.execute_command(*command, target_nodes=node)
        return len(nodes)

    async def _quietly(self, calls: list[_Call]) -> list[Any]:
        """Compensations: run ``calls``; a failure is logged, its effect lapses by its TTL."""
        out, _ = await self._run(calls, strict=False)
        failed = [r for r in out if isinstance(r, Exception)]
        if failed:
            await self._unavailable(failed[0])  # logs, and reads the slot map again
        return out

    async def flush(self) -> None:
        """Send the answers :meth:`finish_request` has not sent yet (one round trip)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._unsent:
            await self._pipelined([], strict=True, wait=False)

    def _flush_later(self) -> None:
        self._flush_timer = None
        task = asyncio.ensure_future(self._flush_quietly())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush_quietly(self) -> None:
        # In the background nobody waits for the answer: a failure is logged (by
        # _unavailable) and the answers are lost, as a failed finish_request loses its own.
        with contextlib.suppress(Unavailable):
            await self.flush()

    # -- pending handshakes ---------------------------------------------------------------------
    async def add_pending(
        self, pending: PendingHandshake, *, max_per_source: int, max_total: int, now: float
    ) -> bool:
        """See :meth:`Store.add_pending`."""
        data = pending.to_dict()
        data["proven_kid"] = None
        if self._spread:
            return await self._spread_add_pending(
                pending, encoding.dumps(data), max_per_source, max_total, now
            )
        added = await self._script(
            self._add_pending,
            [
                self._k_pending(pending.server_did, pending.nonce_b),
                self._k_source(pending.source),
                self._k_pending_all(),
            ],
            [
                _num(now),
                max_per_source,
                max_total,
                encoding.dumps(data),
                pending.expires_at,
                _ttl_ms(pending.expires_at, now),
                pending.source,
                pending.nonce_b,
                self.prefix,
            ],
        )
        return bool(added)

    async def get_pending(self, nonce_b: str, now: float, *, agent: str = "") -> PendingHandshake | None:
        """See :meth:`Store.get_pending`."""
        if self._spread:
            out = await self._script(self._c_get_pending, [self._k_pending(agent, nonce_b)], [_num(now)])
        else:
            out = await self._script(
                self._get_pending,
                [self._k_pending(agent, nonce_b), self._k_pending_all()],
                [_num(now), nonce_b, self.prefix],
            )
        if not out:
            return None
        data, kid = out
        pending = PendingHandshake.from_dict(encoding.loads(data))
        return pending if kid is None else pending.proven(kid.decode())

    async def mark_proven(self, nonce_b: str, kid: str, now: float, *, agent: str = "") -> bool:
        """See :meth:`Store.mark_proven`."""
        pkey = self._k_pending(agent, nonce_b)
        if self._spread:
            return bool(await self._script(self._c_mark_proven, [pkey], [kid, _num(now)]))
        added = await self._script(
            self._mark_proven,
            [pkey, self._k_pending_all()],
            [kid, _num(now), nonce_b, self.prefix],
        )
        return bool(added)

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

    async def _spread_add_pending(
        self, pending: PendingHandshake, data: bytes, max_per_source: int, max_total: int, now: float
    ) -> bool:
        # Three slots in one round trip; on a refusal the others are undone (redis_cluster.py).
        nonce = pending.nonce_b
        shards = rc.shards_for(max_total)
        shard = rc.shard_of(nonce, shards)
        ttl = _ttl_ms(pending.expires_at, now)
        total = rc.shard_limit(max_total, shards, shard)
        calls: list[_Call] = [
            (
                self._c_reserve,
                [self._k_source(pending.source)],
                [_num(now), max_per_source, nonce, pending.expires_at, ttl],
            ),
            (
                self._c_reserve,
                [self._k_pending_shard(shard)],
                [_num(now), total, nonce, pending.expires_at, ttl],
            ),
            (
                self._c_add_pending,
                [self._k_pending(pending.server_did, nonce)],
                [_num(now), data, pending.expires_at, ttl, pending.source, str(shard)],
            ),
        ]
        out, _ = await self._run(calls, strict=False)
        if all(reply == 1 for reply in out):
            return True
        undo: list[_Call] = []
        for (_, keys, _), reply in zip(calls[:2], out[:2], strict=True):
            if reply == 1:  # a reservation this call made (2: a live entry's, left alone)
                undo.append((self._c_release, keys, [nonce]))
        if out[2] == 1:
            undo.append((self._c_close_session, [self._k_pending(pending.server_did, nonce)], []))  # DEL
        if undo:
            await self._quietly(undo)
        failed = [reply for reply in out if isinstance(reply, Exception)]
        if failed:
            raise await self._unavailable(failed[0])
        return False

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
    def _cache_put(self, session: SessionRecord) -> None:
        if self._cache_ttl <= 0 or self._cache_size <= 0:
            return
        self._cache[session.session_id] = (time.monotonic() + self._cache_ttl, session)
        self._cache.move_to_end(session.session_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _cache_get(self, session_id: str) -> SessionRecord | None:
        hit = self._cache.get(session_id)
        if hit is None:
            return None
        if hit[0] <= time.monotonic():
            del self._cache[session_id]
            return None
        return hit[1]

    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        """See :meth:`Store.get_session` (the per-process cache, else one script).

        A record from the cache may belong to a session that another worker closed a moment
        ago: :meth:`begin_request` is the authoritative check and answers GONE for it.
        """
        cached = self._cache_get(session_id)
        if cached is not None:
            if not cached.expired(now):
                return cached
            self._cache.pop(session_id, None)  # and let the script forget it in Redis
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
            owner = secrets.token_bytes(16)
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
            self._cache.pop(session_id, None)
            return Begin(BeginKind.GONE), None
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(seq_out[2]))), None
        return Begin(kind, last), None

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """See :meth:`Store.finish_request`; sent with the next command (``finish_linger``)."""
        self._unsent[self._k_session(session_id)] = (
            self._c_finish if self._spread else self._finish_request,
            [str(sequence), encoding.dumps(reply.to_dict())],
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
            # The claim stays running: a resend is answered "outcome unknown" once it lapses,
            # never run again.
            raise await self._unavailable(exc) from None
        if begin.kind is not BeginKind.NEW:
            return begin, None
        return begin, self._claim_from(out[2:])

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
            self._cache.pop(session_id, None)
            return Begin(kind)
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(out[2])))
        if kind is BeginKind.RATE_LIMITED:
            return Begin(kind, last, retry_after=max(1, start + rate_period - t))
        return Begin(kind, last)

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
        """See :meth:`IntentStore.finish_intent`; sent with the next command, as :meth:`finish_request`."""
        self._unsent[self._k_intent(agent, client_did, intent_id)] = (
            self._finish_intent,
            [_request_hash_bytes(intent_hash), encoding.dumps(reply.to_dict())],
        )
        await self._linger()

    async def close_session(self, session_id: str) -> None:
        """See :meth:`Store.close_session`."""
        self._cache.pop(session_id, None)
        if not self._spread:
            await self._script(
                self._close_session, [self._k_session(session_id), self._k_sessions()], [session_id]
            )
            return
        shard = await self._script(self._c_close_session, [self._k_session(session_id)], [])
        if shard is not None:
            # If this fails, the reservation lapses at the session's expiry.
            await self._quietly([(self._c_release, [self._k_session_shard(int(shard))], [session_id])])

    async def aclose(self) -> None:
        """Send the answers not yet sent, then close the pool (if the store built its client)."""
        with contextlib.suppress(Unavailable):
            await self.flush()
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        self._cache.clear()
        if self._refresh is not None:
            with contextlib.suppress(BaseException):
                await self._refresh
        if self._owns_client:
            await close_client(self._r, self.deployment)

    # -- actions waiting for approval (store/actions.py) ----------------------------------------
    async def add_action(
        self, action: PendingAction, *, max_per_caller: int, max_total: int, now: float
    ) -> bool:
        """See :meth:`ActionStore.add_action` (one script)."""
        record = action.to_dict()
        for member in ("state", "decided_by", "decided_at"):  # kept as hash fields
            del record[member]
        code = await self._script(
            self._add_action,
            self._action_keys(action.action_id, action.caller_did),
            [
                _num(now),
                max_per_caller,
                max_total,
                encoding.dumps(record),
                action.expires_at,
                action.keep_until,
                _ttl_ms(action.keep_until, now),
                action.action_id,
                action.action_hash,
                action.caller_did,
            ],
        )
        return bool(code == 1)

    async def get_action(self, action_id: str, now: float) -> PendingAction | None:
        """See :meth:`ActionStore.get_action` (one script)."""
        out = await self._script(self._get_action, [self._k_action(action_id)], [_num(now)])
        if not out:
            return None
        return _action_from(*out)

    async def decide_action(
        self,
        action_id: str,
        *,
        caller_did: str,
        action_hash: str,
        approve: bool,
        decided_by: str,
        now: float,
    ) -> Decision:
        """See :meth:`ActionStore.decide_action`: the pending → decided step in one script."""
        out = await self._script(
            self._decide_action,
            self._action_keys(action_id, caller_did),
            [
                _num(now),
                action_hash,
                "approved" if approve else "rejected",
                decided_by,
                action_id,
                caller_did,
            ],
        )
        kind = _DECISIONS[int(out[0])]
        if kind is DecisionKind.UNKNOWN:
            return Decision(kind)
        return Decision(kind, _action_from(*out[1:5]))

    # -- revocations (a2a_secure.store.revocation.RevocationStore) -------------------------------
    async def add_revocation(self, entry: Revocation) -> bool:
        """See :meth:`RevocationStore.add_revocation` (the entry, then the listing index)."""
        data = encoding.dumps(entry.to_dict())
        added = await self._script(self._add_revocation, [self._k_revoked(entry.did)], [entry.field, data])
        if added:
            async with self._outage():  # the entry is in force; only --list would miss it
                await self._r.sadd(self._k_revocations(), entry.target)
        return bool(added)

    async def remove_revocation(self, target: str) -> bool:
        """See :meth:`RevocationStore.remove_revocation` (the entry, then the listing index)."""
        probe = Revocation(target)
        removed = await self._script(self._remove_revocation, [self._k_revoked(probe.did)], [probe.field])
        async with self._outage():
            await self._r.srem(self._k_revocations(), target)
        return bool(removed)

    async def find_revocation(self, did: str, kids: Sequence[str]) -> Revocation | None:
        """See :meth:`RevocationStore.find_revocation` (one HMGET)."""
        async with self._outage():
            values = await self._r.hmget(self._k_revoked(did), [DID_FIELD, *kids])
        for value in values:
            if value is not None:
                return Revocation.from_dict(encoding.loads(value))
        return None

    async def list_revocations(self) -> list[Revocation]:
        """See :meth:`RevocationStore.list_revocations`."""
        out: list[Revocation] = []
        async with self._outage():
            targets = await self._r.smembers(self._k_revocations())
            for raw in sorted(targets):
                probe = Revocation(raw.decode() if isinstance(raw, bytes) else raw)
                value = await self._r.hget(self._k_revoked(probe.did), probe.field)
                if value is not None:
                    out.append(Revocation.from_dict(encoding.loads(value)))
        return out

    async def _revoked_fields(self, fields: Any, session_id: str, now: float) -> bool:
        """Whether the DID's entry ``fields`` (HKEYS) revoke the session ``session_id``."""
        if not fields:
            return False
        names = {f.decode() if isinstance(f, bytes) else str(f) for f in fields}
        if DID_FIELD in names:
            return True
        session = self._cache_get(session_id) or await self.get_session(session_id, now)
        return session is not None and session.client_kid in names

    # -- introspection (tests, metrics) ---------------------------------------------------------
    async def counts(self, now: float | None = None) -> dict[str, int]:
        """Live pending handshakes and sessions (members of the sorted sets not yet expired)."""
        t = _num(time.time() if now is None else now)
        if self._spread:
            pending_keys = [self._k_pending_shard(i) for i in range(rc.MAX_SHARDS)]
            session_keys = [self._k_session_shard(i) for i in range(rc.MAX_SHARDS)]
        else:
            pending_keys, session_keys = [self._k_pending_all()], [self._k_sessions()]
        async with self._outage():
            pipe = self._r.pipeline(transaction=False)
            for key in (*pending_keys, *session_keys):
                pipe.zcount(key, f"({t}", "+inf")
            out = [int(n) for n in await pipe.execute()]
        return {"pending": sum(out[: len(pending_keys)]), "sessions": sum(out[len(pending_keys) :])}
