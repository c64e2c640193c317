"""The session sweep: expired sessions leave process memory on a timer, not on a look-up.

A store that holds sessions in this process (:class:`~a2a_secure.store.memory.MemoryStore`,
the local cache of :class:`~a2a_secure.store.redis.RedisStore`) forgets an expired session
when it is next looked up. A sealed session (PROTOCOL.md §12.6) that nobody uses again would
keep its two AEAD keys, the sealer built from them and its stored sealed answers in memory
until then, which may be never: its forward secrecy would hold only against whoever cannot
read the server's memory. The sweep calls the store's ``sweep_expired(now, limit=...)``
every ``ServerLimits.session_sweep_seconds`` (2 s by default; 0 turns it off) for as long as
the application's lifespan runs. A store without that method (a custom one) is not swept.

A tick takes at most ``SWEEP_LIMIT`` sessions (the earliest expired first): one tick never
holds the event loop for long, and the rest go at the next ticks (and on any look-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from a2a_secure.store.expiry import SWEEP_LIMIT

__all__ = ["SessionSweeper"]

_log = logging.getLogger("a2a_secure.server")


class SessionSweeper:
    """Sweeps the current store of a server on a timer (a lifespan context)."""

    def __init__(
        self,
        store: Callable[[], object],
        interval: Callable[[], float],
        clock: Callable[[], float],
        *,
        limit: int = SWEEP_LIMIT,
    ) -> None:
        """``store`` and ``interval`` are read at each tick (a server's store or limits may be
        replaced while it runs); ``clock`` gives Unix seconds, the sessions' own clock."""
        self._store = store
        self._interval = interval
        self._clock = clock
        self._limit = limit

    def tick(self) -> int:
        """One sweep of the current store now; how many sessions it forgot."""
        sweep = getattr(self._store(), "sweep_expired", None)
        if sweep is None:
            return 0
        return int(sweep(self._clock(), limit=self._limit))

    async def _run(self) -> None:
        while (interval := self._interval()) > 0:
            await asyncio.sleep(interval)
            try:
                self.tick()
            except Exception:  # a store's bug must not end the sweep; the next tick tries again
                _log.exception("session sweep failed")

    @contextlib.asynccontextmanager
    async def running(self, _app: Any = None) -> AsyncIterator[None]:
        """Sweep while the context is open (an ASGI lifespan: ``lifespan_context``)."""
        task = asyncio.create_task(self._run()) if self._interval() > 0 else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
