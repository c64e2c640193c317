"""This process's copy of the session records of :class:`~a2a_secure.store.redis.RedisStore`.

A worker keeps the records of the sessions it served (``session_cache_ttl`` seconds, at most
``session_cache_size``): they never change once opened, and ``begin_request``'s script
re-checks that the session still exists. A sealed session's record holds its two AEAD keys
(PROTOCOL.md §12.6) and the sealer built from them, so the copy must not outlive the session:
the server's sweep (:mod:`a2a_secure.runtime.sweeper`) calls :meth:`sweep_expired` every few
seconds, which drops each entry whose session expired or whose cache time ended, at a cost
bounded by the entries due (:class:`~a2a_secure.store.expiry.ExpiryIndex`).
"""

from __future__ import annotations

from a2a_secure.store.base import SessionRecord
from a2a_secure.store.expiry import SWEEP_LIMIT, ExpiryIndex
from a2a_secure.store.redis_keys import RedisKeys
from a2a_secure.system import mono_now

__all__ = ["RedisSessionCache"]


class RedisSessionCache(RedisKeys):
    """The local session cache of :class:`~a2a_secure.store.redis.RedisStore`."""

    def _cache_put(self, session: SessionRecord) -> None:
        if self._cache_ttl <= 0 or self._cache_size <= 0:
            return
        self._cache[session.session_id] = (mono_now() + self._cache_ttl, session)
        self._cache.move_to_end(session.session_id)
        self._cache_expiry.add(session.expires_at, session.session_id)
        while len(self._cache) > self._cache_size:
            self._cache_drop(next(iter(self._cache)))
        self._compact_index()  # entries put again, or dropped, when no sweep runs

    def _cache_get(self, session_id: str) -> SessionRecord | None:
        hit = self._cache.get(session_id)
        if hit is None:
            return None
        if hit[0] <= mono_now():
            self._cache_drop(session_id)
            return None
        return hit[1]

    def _cache_drop(self, session_id: str) -> None:
        """Forget this process's copy of a session (its record, keys and sealer)."""
        hit = self._cache.pop(session_id, None)
        if hit is not None:
            hit[1].drop_sealer()

    def _cache_clear(self) -> None:
        for _end, record in self._cache.values():
            record.drop_sealer()
        self._cache.clear()
        self._cache_expiry = ExpiryIndex()

    def sweep_expired(self, now: float, *, limit: int = SWEEP_LIMIT) -> int:
        """Drop from this process's cache up to ``limit`` sessions that expired at ``now``
        (Unix seconds) or whose cache entry ended (``session_cache_ttl``, monotonic).

        Redis forgets the session itself by its key's TTL. Each clock is compared only with
        its own: entries end in the cache's order, sessions expire in the index's. Returns
        how many were dropped.
        """
        cache, gone = self._cache, 0
        ended = mono_now()
        while cache and gone < limit:
            sid, (end, _record) = next(iter(cache.items()))
            if end > ended:
                break
            self._cache_drop(sid)
            gone += 1
        for sid in self._cache_expiry.due(now, limit - gone):
            hit = cache.get(sid)
            if hit is not None and hit[1].expired(now):
                self._cache_drop(sid)
                gone += 1
        self._compact_index()
        return gone

    def _compact_index(self) -> None:
        cache = self._cache
        self._cache_expiry.compact(len(cache), ((r.expires_at, s) for s, (_e, r) in cache.items()))
