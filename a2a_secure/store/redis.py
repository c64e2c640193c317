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
* **Rate counters** are fixed windows per (client DID, period):
  ``r:<did>:<period>:<window start>``, checked before the increment, expiring with the window.

**Failures.** Any Redis error (connection refused or reset, timeout, loading, OOM, read-only
replica, a script error) raises :class:`~a2a_secure.errors.Unavailable` (-32048, HTTP 503,
``Retry-After: 1``). A script either runs whole or not at all, so there is never a
half-written state. After a connection error the pool's idle connections are dropped too,
and redis-py connects afresh on the next call: the store works again as soon as Redis is
back, without a restart (scripts are re-loaded on ``NOSCRIPT``). The client is built
WITHOUT command retries on purpose: re-sending a script after a timeout whose first attempt
did run would, for ``begin_request``, turn a new request into a retry of itself. The one
ambiguous case left is a timeout on a ``begin_request`` that did run: its sequence is then
consumed without an answer, its retries get 503 until the engine's replay wait ends, and the
client must move on to a new sequence; the intent itself never runs twice.

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

**Cluster.** Keys derived inside scripts (a pending handshake's per-source set) are not
declared, so on Redis Cluster give a prefix with a hash tag (``"{a2a}:"``): every key then
lives in one slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from a2a_secure.errors import Unavailable
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.store.base import (
    Begin,
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    StoredReply,
)
from a2a_secure.store.intents import Claim, ClaimKind, ClaimRequest

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = ["RedisStore"]

_log = logging.getLogger("a2a_secure.store.redis")

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
_BEGIN_REQUEST = """
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
if ARGV[4] ~= '' then
  local count = tonumber(redis.call('GET', KEYS[3]) or '0')
  if count >= tonumber(ARGV[4]) then return {5, v[2]} end
  redis.call('INCR', KEYS[3])
  if count == 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
redis.call('HSET', KEYS[1], 'l', ARGV[2], 'h', ARGV[3])
redis.call('HDEL', KEYS[1], 'y')
return {1, ARGV[2]}
"""

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

# -- intent ids (store/intents.py) --------------------------------------------------------------
# A claim is one hash ``i:<did>:<intent_id>``: ``h`` the intent hash (32 raw bytes), ``u``
# running_until, ``e`` expires_at, ``y`` the answer once the run reported it. The DID's
# claims sit in the sorted set ``ia:<did>`` scored by expires_at (the per-DID bound, exact
# as the session bound is). A claim is LOST when ``u <= now`` and it has no answer.

# The claim's state for a request with intent hash ARGV[h]: {kind[, answer]}, kind as in
# _CLAIM_KINDS; an expired claim is deleted and reads as none (-1).
_SEEN_CLAIM = """
local function seen_claim(key, all, now, iid, hash)
  local c = redis.call('HMGET', key, 'h', 'u', 'e', 'y')
  if not c[1] then return {-1} end
  if tonumber(c[3]) <= now then
    redis.call('DEL', key)
    redis.call('ZREM', all, iid)
    return {-1}
  end
  if c[1] ~= hash then return {4} end
  if c[4] then return {1, c[4]} end
  if tonumber(c[2]) <= now then return {3} end
  return {2}
end
"""

# _BEGIN_REQUEST and, when it would answer NEW, the claim, as one script. Every check
# (the claim's and the per-DID bound's included) comes before the first write, so a FULL
# claim consumes nothing, as a rate-limited request does.
# KEYS: session hash, session zset, rate counter (or the session hash when not counted),
#       claim hash, the DID's claim zset
# ARGV: 1-6 as _BEGIN_REQUEST, 7 intent_id, 8 intent hash, 9 running_until, 10 expires_at,
#       11 claim ttl_ms, 12 max claims per DID
# Returns _BEGIN_REQUEST's answer when not NEW; {1, last, claim kind[, answer]} when NEW;
# {6, last, earliest expiry of the DID's claims} when the bound is reached.
_BEGIN_INTENT = (
    _EXTEND
    + _SEEN_CLAIM
    + """
local now = tonumber(ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'e', 'l', 'h')
if not v[1] then return {0, '0'} end
if tonumber(v[1]) <= now then
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
local c = seen_claim(KEYS[4], KEYS[5], now, ARGV[7], ARGV[8])
if c[1] == -1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[12]) then
    local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    return {6, v[2], first[2]}
  end
end
if ARGV[4] ~= '' then
  redis.call('INCR', KEYS[3])
  if count == 0 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
redis.call('HSET', KEYS[1], 'l', ARGV[2], 'h', ARGV[3])
redis.call('HDEL', KEYS[1], 'y')
if c[1] ~= -1 then
  if c[2] then return {1, ARGV[2], c[1], c[2]} end
  return {1, ARGV[2], c[1]}
end
local ttl = tonumber(ARGV[11])
redis.call('HSET', KEYS[4], 'h', ARGV[8], 'u', ARGV[9], 'e', ARGV[10])
redis.call('PEXPIRE', KEYS[4], ttl)
redis.call('ZADD', KEYS[5], ARGV[10], ARGV[7])
extend(KEYS[5], ttl)
return {1, ARGV[2], 0}
"""
)

# KEYS: claim hash, the DID's claim zset.  ARGV: now, intent_id, intent hash
_GET_CLAIM = (
    _SEEN_CLAIM
    + """
return seen_claim(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], ARGV[3])
"""
)

# KEYS: claim hash.  ARGV: intent hash, answer
_FINISH_INTENT = """
local c = redis.call('HMGET', KEYS[1], 'h', 'y')
if c[1] and c[1] == ARGV[1] and not c[2] then
  redis.call('HSET', KEYS[1], 'y', ARGV[2])
  return 1
end
return 0
"""

_CLAIM_KINDS = {
    -1: ClaimKind.UNKNOWN,
    0: ClaimKind.NEW,
    1: ClaimKind.DONE,
    2: ClaimKind.RUNNING,
    3: ClaimKind.LOST,
    4: ClaimKind.CONFLICT,
}

_KINDS = {
    0: BeginKind.GONE,
    1: BeginKind.NEW,
    2: BeginKind.REPLAY,
    3: BeginKind.IN_PROGRESS,
    4: BeginKind.STALE,
    5: BeginKind.RATE_LIMITED,
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
        ]
    )


def _unpack_session(session_id: str, data: bytes) -> SessionRecord:
    commitment, client_did, server_did, kid, key, pol, created, expires, agent_id = encoding.loads(data)
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
    )


def _num(now: float) -> str:
    """A number for a script argument (exact for integers, round-trip for floats)."""
    return str(int(now)) if float(now).is_integer() else repr(float(now))


def _ttl_ms(expires_at: float, now: float) -> int:
    return max(1, math.ceil((expires_at - now) * 1000)) + _TTL_SLACK_MS


def _import_redis() -> Any:
    try:
        import redis.asyncio as redis_asyncio  # noqa: PLC0415 - optional extra
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("RedisStore needs the redis extra: pip install 'a2a-secure[redis]'") from exc
    return redis_asyncio


class RedisStore:
    """:class:`~a2a_secure.store.base.Store` on Redis, shared by every worker of one agent.

    ``url`` is a redis-py URL (``redis://``, ``rediss://``, ``unix://``). ``prefix`` starts
    every key, so several agents can share one Redis. ``socket_timeout`` bounds connecting
    and each command (seconds): past it the call answers 503. ``client`` is a ready
    ``redis.asyncio.Redis`` (bytes replies, ideally without command retries, see the module
    documentation); the store does not close a client it was given.

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
        client: Redis | None = None,
        session_cache_ttl: float = 30.0,
        session_cache_size: int = 10_000,
        finish_linger: float | None = 0.02,
    ) -> None:
        redis_asyncio = _import_redis()
        if client is None:
            from redis.asyncio.retry import Retry  # noqa: PLC0415 - optional extra
            from redis.backoff import NoBackoff  # noqa: PLC0415

            options: dict[str, Any] = {}
            try:  # redis-py >= 7: with maintenance notifications on ("auto"), the pool skips
                # its check of idle connections, and a connection that Redis closed while idle
                # (a restart) fails the next command instead of being replaced.
                from redis.maint_notifications import MaintNotificationsConfig  # noqa: PLC0415

                options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
            except ImportError:  # pragma: no cover - older redis-py
                pass
            client = redis_asyncio.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=False,
                **options,
            )
            self._owns_client = True
        else:
            self._owns_client = False
        self.prefix = prefix
        self._r: Redis = client
        self._add_pending = client.register_script(_ADD_PENDING)
        self._get_pending = client.register_script(_GET_PENDING)
        self._get_session = client.register_script(_GET_SESSION)
        self._mark_proven = client.register_script(_MARK_PROVEN)
        self._open_session = client.register_script(_OPEN_SESSION)
        self._begin_request = client.register_script(_BEGIN_REQUEST)
        self._finish_request = client.register_script(_FINISH_REQUEST)
        self._close_session = client.register_script(_CLOSE_SESSION)
        self._begin_intent = client.register_script(_BEGIN_INTENT)
        self._get_claim = client.register_script(_GET_CLAIM)
        self._finish_intent = client.register_script(_FINISH_INTENT)
        self._cache_ttl = session_cache_ttl
        self._cache_size = session_cache_size
        self._cache: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()
        self._last_logged = -math.inf
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
    def client(self) -> Redis:
        """The redis-py client in use."""
        return self._r

    # -- keys ------------------------------------------------------------------------------------
    def _k_pending(self, nonce_b: str) -> str:
        return f"{self.prefix}p:{nonce_b}"

    def _k_source(self, source: str) -> str:
        return f"{self.prefix}ps:{source}"

    def _k_pending_all(self) -> str:
        return f"{self.prefix}pa"

    def _k_session(self, session_id: str) -> str:
        return f"{self.prefix}s:{session_id}"

    def _k_sessions(self) -> str:
        return f"{self.prefix}sa"

    def _k_rate(self, client_did: str, period: int, start: int) -> str:
        return f"{self.prefix}r:{client_did}:{period}:{start}"

    def _k_intent(self, client_did: str, intent_id: str) -> str:
        return f"{self.prefix}i:{client_did}:{intent_id}"

    def _k_intents(self, client_did: str) -> str:
        return f"{self.prefix}ia:{client_did}"

    # -- the one place that talks to Redis ----------------------------------------------------------
    async def _unavailable(self, exc: Exception) -> Unavailable:
        from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415

        if isinstance(exc, RedisConnectionError | OSError):
            # The idle connections were most likely cut too (Redis restarted, network
            # change): drop them, so that the next call connects afresh instead of failing
            # once per stale pooled connection.
            with contextlib.suppress(Exception):
                await self._r.connection_pool.disconnect(inuse_connections=False)
        now = time.monotonic()
        if now - self._last_logged >= 10.0:
            self._last_logged = now
            _log.warning("shared store unavailable: %s: %s", type(exc).__name__, str(exc)[:200])
        return Unavailable("shared store unavailable", retry_after=1)

    async def _script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        from redis.exceptions import RedisError  # noqa: PLC0415 - optional extra

        if self._sending:
            await self._after_sending(keys)
        if self._unsent:
            return await self._pipelined(script, keys, args)
        self.round_trips += 1
        self.commands += 1
        try:
            return await script(keys=list(keys), args=list(args))
        except (RedisError, OSError) as exc:
            raise await self._unavailable(exc) from exc

    async def _pipelined(self, script: AsyncScript | None, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The unsent answers, then ``script`` (if any), in one round trip; the script's reply.

        The scripts are called by their SHA. A command refused with NOSCRIPT (Redis restarted
        or its script cache was flushed) did not run: that one is sent again after loading
        its script; the commands that did run are not repeated.
        """
        if self._sending:
            await self._after_sending(keys)
        unsent, self._unsent = self._unsent, {}
        if self._flush_timer is not None:  # nothing left for it to send
            self._flush_timer.cancel()
            self._flush_timer = None
        if not unsent:
            return None if script is None else await self._send(script, keys, args, unsent)
        sent = asyncio.get_running_loop().create_future()
        for key in unsent:
            self._sending[key] = sent
        try:
            return await self._send(script, keys, args, unsent)
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
        script: AsyncScript | None,
        keys: Sequence[str],
        args: Sequence[Any],
        unsent: dict[str, tuple[AsyncScript, list[Any]]],
    ) -> Any:
        from redis.exceptions import NoScriptError, RedisError  # noqa: PLC0415 - optional extra

        # (script, its keys, its args)
        calls: list[tuple[AsyncScript, list[Any], list[Any]]] = [
            (sc, [key], args) for key, (sc, args) in unsent.items()
        ]
        if script is not None:
            calls.append((script, list(keys), list(args)))
        pipe = self._r.pipeline(transaction=False)
        for sc, call_keys, call_args in calls:
            pipe.evalsha(sc.sha, len(call_keys), *call_keys, *call_args)
        self.round_trips += 1
        self.commands += len(calls)
        try:
            out = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            raise await self._unavailable(exc) from exc
        for i, (sc, call_keys, call_args) in enumerate(calls):
            if not isinstance(out[i], NoScriptError):
                continue
            self.round_trips += 1
            self.commands += 1
            try:
                out[i] = await sc(keys=call_keys, args=call_args)
            except (RedisError, OSError) as exc:  # decided below, command by command
                out[i] = exc
        if script is None:
            failed = [r for r in out if isinstance(r, Exception)]
            if failed:
                raise await self._unavailable(failed[0])
            return None
        # The answers that failed are lost (logged), as a failed finish_request loses its own;
        # they must not fail the script, which did run: its outcome stands.
        lost = [r for r in out[:-1] if isinstance(r, Exception)]
        if lost:
            _log.warning("%d stored answer(s) lost: %s", len(lost), str(lost[0])[:200])
        if isinstance(out[-1], Exception):
            raise await self._unavailable(out[-1])
        return out[-1]

    async def flush(self) -> None:
        """Send the answers :meth:`finish_request` has not sent yet (one round trip)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._unsent:
            await self._pipelined(None, (), ())

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
        added = await self._script(
            self._add_pending,
            [self._k_pending(pending.nonce_b), self._k_source(pending.source), self._k_pending_all()],
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

    async def get_pending(self, nonce_b: str, now: float) -> PendingHandshake | None:
        """See :meth:`Store.get_pending`."""
        out = await self._script(
            self._get_pending,
            [self._k_pending(nonce_b), self._k_pending_all()],
            [_num(now), nonce_b, self.prefix],
        )
        if not out:
            return None
        data, kid = out
        pending = PendingHandshake.from_dict(encoding.loads(data))
        return pending if kid is None else pending.proven(kid.decode())

    async def mark_proven(self, nonce_b: str, kid: str, now: float) -> bool:
        """See :meth:`Store.mark_proven`."""
        added = await self._script(
            self._mark_proven,
            [self._k_pending(nonce_b), self._k_pending_all()],
            [kid, _num(now), nonce_b, self.prefix],
        )
        return bool(added)

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float
    ) -> OpenResult:
        """See :meth:`Store.open_session`."""
        code = await self._script(
            self._open_session,
            [
                self._k_pending(nonce_b),
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
        data = await self._script(
            self._get_session, [self._k_session(session_id), self._k_sessions()], [_num(now), session_id]
        )
        if data is None:
            return None
        session = _unpack_session(session_id, data)
        self._cache_put(session)
        return session

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
    ) -> Begin:
        """See :meth:`Store.begin_request`: §6.1 steps 7 and 8 in one script."""
        keys = [self._k_session(session_id), self._k_sessions()]
        limit = ""
        rate_ttl = 0
        t = int(now)
        start = t - t % rate_period if rate_limit is not None else 0
        if rate_limit is not None:
            keys.append(self._k_rate(client_did, rate_period, start))
            limit = str(rate_limit)
            rate_ttl = _ttl_ms(start + rate_period, now)
        out = await self._script(
            self._begin_request,
            keys,
            [_num(now), str(sequence), _request_hash_bytes(request_hash), limit, rate_ttl, session_id],
        )
        kind = _KINDS[int(out[0])]
        last = int(out[1])
        if kind is BeginKind.GONE:
            self._cache.pop(session_id, None)
            return Begin(BeginKind.GONE)
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(out[2])))
        if kind is BeginKind.RATE_LIMITED:
            return Begin(kind, last, retry_after=max(1, start + rate_period - t))
        return Begin(kind, last)

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """See :meth:`Store.finish_request`; sent with the next command (``finish_linger``)."""
        self._unsent[self._k_session(session_id)] = (
            self._finish_request,
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
    ) -> tuple[Begin, Claim | None]:
        """See :meth:`IntentStore.begin_intent`: one script, the same round trip as a begin."""
        session_key = self._k_session(session_id)
        keys = [session_key, self._k_sessions(), session_key]
        limit = ""
        rate_ttl = 0
        t = int(now)
        start = t - t % rate_period if rate_limit is not None else 0
        if rate_limit is not None:
            keys[2] = self._k_rate(client_did, rate_period, start)
            limit = str(rate_limit)
            rate_ttl = _ttl_ms(start + rate_period, now)
        keys += [self._k_intent(client_did, claim.intent_id), self._k_intents(client_did)]
        out = await self._script(
            self._begin_intent,
            keys,
            [
                _num(now),
                str(sequence),
                _request_hash_bytes(request_hash),
                limit,
                rate_ttl,
                session_id,
                claim.intent_id,
                _request_hash_bytes(claim.intent_hash),
                claim.running_until,
                claim.expires_at,
                _ttl_ms(claim.expires_at, now),
                claim.max_per_did,
            ],
        )
        code = int(out[0])
        if code == 6:
            retry = max(1, math.ceil(float(out[2]) - now))
            return Begin(BeginKind.RATE_LIMITED, int(out[1]), retry_after=retry), Claim(
                ClaimKind.FULL, retry_after=retry
            )
        if code != 1:
            return self._begin_from(out, session_id, start, rate_period, t), None
        return Begin(BeginKind.NEW, int(out[1])), self._claim_from(out[2:])

    def _begin_from(self, out: Any, session_id: str, start: int, rate_period: int, t: int) -> Begin:
        kind = _KINDS[int(out[0])]
        last = int(out[1])
        if kind is BeginKind.GONE:
            self._cache.pop(session_id, None)
            return Begin(BeginKind.GONE)
        if kind is BeginKind.REPLAY:
            return Begin(kind, last, StoredReply.from_dict(encoding.loads(out[2])))
        if kind is BeginKind.RATE_LIMITED:
            return Begin(kind, last, retry_after=max(1, start + rate_period - t))
        return Begin(kind, last)

    @staticmethod
    def _claim_from(out: Any) -> Claim:
        kind = _CLAIM_KINDS[int(out[0])]
        if kind is ClaimKind.DONE:
            return Claim(kind, StoredReply.from_dict(encoding.loads(out[1])))
        return Claim(kind)

    async def get_claim(self, client_did: str, intent_id: str, intent_hash: str, now: float) -> Claim:
        """See :meth:`IntentStore.get_claim` (one script)."""
        out = await self._script(
            self._get_claim,
            [self._k_intent(client_did, intent_id), self._k_intents(client_did)],
            [_num(now), intent_id, _request_hash_bytes(intent_hash)],
        )
        return self._claim_from(out)

    async def finish_intent(
        self, client_did: str, intent_id: str, intent_hash: str, reply: StoredReply
    ) -> None:
        """See :meth:`IntentStore.finish_intent`; sent with the next command, as :meth:`finish_request`."""
        self._unsent[self._k_intent(client_did, intent_id)] = (
            self._finish_intent,
            [_request_hash_bytes(intent_hash), encoding.dumps(reply.to_dict())],
        )
        await self._linger()

    async def close_session(self, session_id: str) -> None:
        """See :meth:`Store.close_session`."""
        self._cache.pop(session_id, None)
        await self._script(
            self._close_session, [self._k_session(session_id), self._k_sessions()], [session_id]
        )

    async def aclose(self) -> None:
        """Send the answers not yet sent, then close the pool (if the store built its client)."""
        with contextlib.suppress(Unavailable):
            await self.flush()
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        self._cache.clear()
        if self._owns_client:
            await self._r.aclose()

    # -- introspection (tests, metrics) ---------------------------------------------------------
    async def counts(self, now: float | None = None) -> dict[str, int]:
        """Live pending handshakes and sessions (members of the sorted sets not yet expired)."""
        from redis.exceptions import RedisError  # noqa: PLC0415 - optional extra

        t = _num(time.time() if now is None else now)
        try:
            pending = await self._r.zcount(self._k_pending_all(), f"({t}", "+inf")
            sessions = await self._r.zcount(self._k_sessions(), f"({t}", "+inf")
        except (RedisError, OSError) as exc:
            raise await self._unavailable(exc) from exc
        return {"pending": int(pending), "sessions": int(sessions)}
