"""Session ids by expiry: the ones that are due, in order, without walking the others.

A store that keeps sessions in process memory (:class:`~a2a_secure.store.memory.MemoryStore`,
the local cache of :class:`~a2a_secure.store.redis.RedisStore`) forgets an expired one on its
next look-up; a session nobody looks up again would keep its record, and a sealed session's
keys with it (PROTOCOL.md §12.6), until the store is full. The sweep
(:mod:`a2a_secure.runtime.sweeper`) asks the store for the due ones every few seconds; each
tick costs O(k log n) for the k sessions due (at most ``limit``), whatever n is open.

Entries are never removed from the heap when a session is closed or replaced: the store checks
each due id against what it holds (a stale one is skipped), and the heap is rebuilt from the
live ids once stale entries outnumber them, so it stays O(n) for n held sessions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["HEAP_SLACK", "SWEEP_LIMIT", "ExpiryIndex", "heap_needs_compacting", "pop_expired"]

SWEEP_LIMIT = 10_000
"""The most ids one tick of the sweep takes: a bound on the time a tick holds the loop."""

_SLACK = 64


class ExpiryIndex:
    """A min-heap of ``(expires_at, session_id)``: Unix seconds, the records' own clock."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, expires_at: float, session_id: str) -> None:
        """Index ``session_id`` as expiring at ``expires_at``."""
        heapq.heappush(self._heap, (expires_at, session_id))

    def due(self, now: float, limit: int = SWEEP_LIMIT) -> list[str]:
        """The ids whose expiry is ``<= now``, earliest first, at most ``limit``, taken out.

        An id may be stale (closed since, or indexed twice): the caller checks its record.
        """
        heap = self._heap
        out: list[str] = []
        while heap and heap[0][0] <= now and len(out) < limit:
            out.append(heapq.heappop(heap)[1])
        return out

    def compact(self, live: int, entries: Iterable[tuple[float, str]]) -> None:
        """Rebuild from ``entries`` (the ``live`` held sessions) once stale ones dominate."""
        if len(self._heap) > 2 * live + _SLACK:
            self._heap = list(entries)
            heapq.heapify(self._heap)


# -- heaps of (expiry, key) in general ------------------------------------------------------
# A heap is rebuilt from its live entries when it holds more than twice as many plus this.
HEAP_SLACK = 1024

_K = TypeVar("_K")


def pop_expired(heap: list[tuple[int, _K]], now: float) -> list[tuple[int, _K]]:
    """The entries of ``heap`` whose expiry is ``<= now``, popped (earliest first)."""
    out: list[tuple[int, _K]] = []
    while heap and heap[0][0] <= now:
        out.append(heapq.heappop(heap))
    return out


def heap_needs_compacting(heap: list[tuple[int, Any]], live: int) -> bool:
    """Whether ``heap`` holds so many leftovers beside ``live`` entries that it is rebuilt."""
    return len(heap) > 2 * live + HEAP_SLACK
