"""Pending handshakes of :class:`~a2a_secure.store.redis.RedisStore` (HELLO to ACCEPT_POLICY).

Keys (``P`` the prefix, ``<agent>`` the server DID; names built in
:class:`~a2a_secure.store.redis_keys.RedisKeys`):

* ``P p:<nonce_b>:<agent>`` (spread cluster: ``P{p:<nonce_b>}:<agent>``): one hash per
  handshake, ``d`` its record, ``e`` its ``expires_at``, ``s`` its source address, ``k`` the
  proven key id; on a cluster also the shard of its global reservation. Written by the HELLO
  (:meth:`RedisHandshakes.add_pending`), marked by the PROOF (``mark_proven``), taken by
  the ACCEPT_POLICY that opens the session (``open_session``,
  :mod:`~a2a_secure.store.redis_sessions`). Found only by the agent that sent the CHALLENGE.
* ``P ps:<source>`` (``P{ps:<source>}``) and ``P pa`` (``P{pa:<i>}``, ≤ 16 shards): the
  bounds per source address and in total, sorted sets of nonces scored by ``expires_at``;
  the store's, shared by every agent of the prefix.

TTL: the handshake's ``expires_at`` (its window, 60 s) plus one second; a bound's sorted set
lives as long as its latest member. Expired entries are dropped by the first script that
finds them, and a bound counts only live members.
"""

from __future__ import annotations

from a2a_secure.identity import encoding
from a2a_secure.store import redis_cluster as rc
from a2a_secure.store.base import Added, PendingHandshake
from a2a_secure.store.redis_keys import _EXTEND, RedisKeys, _Call, _num, _ttl_ms

__all__ = ["RedisHandshakes"]

_ADDED = {1: Added.ADDED, 3: Added.OWN_FULL, 0: Added.TOTAL_FULL, 2: Added.TAKEN}

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
# 1 added, 3 the source's bound is reached, 0 the total's, 2 the nonce is taken
_ADD_PENDING = (
    _EXTEND
    + _DROP_PENDING
    + """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 3 end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then return 0 end
local old = redis.call('HMGET', KEYS[1], 'e', 's')
if old[1] then
  if tonumber(old[1]) > now then return 2 end
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


class RedisHandshakes(RedisKeys):
    """The pending-handshake methods of :class:`~a2a_secure.store.redis.RedisStore`."""

    # -- pending handshakes ---------------------------------------------------------------------
    async def add_pending(
        self, pending: PendingHandshake, *, max_per_source: int, max_total: int, now: float
    ) -> Added:
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
        return _ADDED[int(added)]

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

    async def _spread_add_pending(
        self, pending: PendingHandshake, data: bytes, max_per_source: int, max_total: int, now: float
    ) -> Added:
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
            return Added.ADDED
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
        if out[0] == 0:
            return Added.OWN_FULL
        return Added.TOTAL_FULL if out[1] == 0 else Added.TAKEN
