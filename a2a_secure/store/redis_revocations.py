"""Revocations (the deny list) of :class:`~a2a_secure.store.redis.RedisStore` (store/revocation.py).

Keys (``P`` the prefix; names built in :class:`~a2a_secure.store.redis_keys.RedisKeys`):

* ``P rv:<did>`` (spread cluster: ``P{d:<did>}:rv``): the DID's entries, a hash whose
  fields are ``*`` (the whole DID) or key ids. Written by the operator
  (``a2a-secure revoke``, ``--undo``: :meth:`RedisRevocations.add_revocation`,
  ``remove_revocation``); read by every begin (:data:`_REVOCATION_GUARD`, in the same
  script on one Redis; in the same round trip on a cluster).
* ``P rva``: the index of every target, for ``--list`` only; it never decides a check.
* ``P rve``: the deny list's epoch, a counter that every change of it increments (on one
  Redis in the same script as the entry; on a cluster right after it, and again by a
  rerun). A worker keeps a delegation chain it found clean with the epoch it read before
  looking, and looks again only when the epoch has moved: one GET per later use of a chain,
  however long (:meth:`RedisRevocations.revocation_epoch`).

No TTL: an entry stays until the operator removes it. Both keys are the store's, for every
agent of the prefix; an entry only refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from a2a_secure.identity import encoding
from a2a_secure.store.base import Begin
from a2a_secure.store.redis_keys import RedisKeys, _NotReplicated
from a2a_secure.store.redis_sessions import _BEGIN_REQUEST
from a2a_secure.store.revocation import DID_FIELD, Revocation

__all__ = ["RedisRevocations"]

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

# The guarded begin (the revocation guard, then _BEGIN_REQUEST) with the deny list's epoch
# (redis_revocations.py) read in the same script: its reply, with the epoch put first.
# KEYS: session hash, session zset, rate counter, the epoch, the client DID's revocation hash
_BEGIN_READING_EPOCH = (
    "local function guarded_begin()\n"
    + _REVOCATION_GUARD
    + _BEGIN_REQUEST
    + """
end
local out = guarded_begin()
table.insert(out, 1, redis.call('GET', KEYS[4]) or '0')
return out
"""
)

# The revocation entries of one DID, in one key (its slot on a cluster). The index of all
# targets (for --list) is another key, written after: it never decides a check.
# KEYS: the DID's revocation hash[, the epoch].  ARGV: field, entry JSON.  The epoch moves even
# when the entry was there already: a rerun after a failure half-way moves it then.
_ADD_REVOCATION = """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if KEYS[2] then redis.call('INCR', KEYS[2]) end
return added
"""

# KEYS: the DID's revocation hash[, the epoch].  ARGV: field
_REMOVE_REVOCATION = """
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if KEYS[2] then redis.call('INCR', KEYS[2]) end
return removed
"""

# On a cluster the session and the DID's entries are in two slots: the fields of the DID's
# entries are read in the same round trip as the session's script.  KEYS: the DID's hash.
_REVOKED_FIELDS = """
return redis.call('HKEYS', KEYS[1])
"""


class RedisRevocations(RedisKeys):
    """The revocation methods of :class:`~a2a_secure.store.redis.RedisStore`."""

    # -- revocations (a2a_secure.store.revocation.RevocationStore) -------------------------------
    async def add_revocation(self, entry: Revocation) -> bool:
        """See :meth:`RevocationStore.add_revocation` (the entry, then the listing index)."""
        data = encoding.dumps(entry.to_dict())
        keys = self._revocation_keys(entry.did)
        added = await self._script(self._add_revocation, keys, [entry.field, data])
        await self._move_epoch()
        if added:
            async with self._outage():  # the entry is in force; only --list would miss it
                await self._r.sadd(self._k_revocations(), entry.target)
        return bool(added)

    def _revocation_keys(self, did: str) -> list[str]:
        # On one Redis the epoch moves in the entry's script; a cluster moves it right after.
        return [self._k_revoked(did)] if self._spread else [self._k_revoked(did), self._k_revocation_epoch()]

    async def _move_epoch(self) -> None:
        # After the entry, never before: a worker that read the old epoch and then missed the
        # entry sees the epoch move. Should this fail (503), a rerun of the change moves it.
        if self._spread:
            async with self._outage():
                await self._r.incr(self._k_revocation_epoch())

    async def revocation_epoch(self) -> bytes:
        """The deny list's epoch: it changes whenever an entry is added or removed (one GET)."""
        self.round_trips += 1
        async with self._outage():
            value = await self._r.get(self._k_revocation_epoch())
        return value or b"0"

    async def remove_revocation(self, target: str) -> bool:
        """See :meth:`RevocationStore.remove_revocation` (the entry, then the listing index)."""
        probe = Revocation(target)
        removed = await self._script(self._remove_revocation, self._revocation_keys(probe.did), [probe.field])
        await self._move_epoch()
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

    @property
    def epoch_in_begin(self) -> bool:
        """Whether :meth:`begin_request_reading_epoch` reads the epoch in the begin's own
        script (one Redis, Sentinel); not on a spread cluster, where they are two slots."""
        return not self._spread

    async def begin_request_reading_epoch(
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
    ) -> tuple[Begin, bytes]:
        """:meth:`begin_request`, and the deny list's epoch read in the same script: a kept
        delegation chain is re-checked for revocation without a round trip of its own."""
        if self._spread:
            raise TypeError("a spread cluster reads the epoch on its own (epoch_in_begin)")
        keys, args, start, t = self._begin_parts(
            session_id, client_did, sequence, request_hash, rate_limit, rate_period, now, agent
        )
        keys = [*keys, self._k_revocation_epoch(), self._k_revoked(client_did)]
        (out,), confirmed = await self._run([(self._begin_reading_epoch, keys, args)], wait=True)
        try:
            return self._begin_from(out[1:], session_id, start, rate_period, t, confirmed), out[0]
        except _NotReplicated as exc:
            raise await self._unavailable(exc) from None

    async def _revoked_fields(self, fields: Any, session_id: str, now: float) -> bool:
        """Whether the DID's entry ``fields`` (HKEYS) revoke the session ``session_id``."""
        if not fields:
            return False
        names = {f.decode() if isinstance(f, bytes) else str(f) for f in fields}
        if DID_FIELD in names:
            return True
        session = self._cache_get(session_id) or await self.get_session(session_id, now)
        return session is not None and session.client_kid in names
