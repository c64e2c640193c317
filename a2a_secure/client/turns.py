"""Turns: at most ``count`` holders at a time, the others served in their order of arrival.

The client's own bounds on what runs at once: the pool's requests in flight and, with a
count of one, the calls on one peer's session (whose sequences must go out in order). It is
asyncio.Semaphore's and asyncio.Lock's behaviour (first come, first served; a waiter that is
cancelled takes nothing), without their cost on every request: their test for a free turn
builds a generator once a waiter has ever been queued, and taking a free one runs two
coroutines. Here a free turn is taken without awaiting anything, and a turn given back is
handed straight to the first waiter still waiting (one handed a turn just as it was
cancelled passes it on).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

__all__ = ["Turns"]


class Turns:
    """At most ``count`` holders at a time; ``async with`` takes and gives back one turn."""

    __slots__ = ("_waiters", "free")

    def __init__(self, count: int = 1) -> None:
        self.free = count
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def locked(self) -> bool:
        """Whether a newcomer would wait."""
        return self.free <= 0 or bool(self._waiters)

    def take_now(self) -> bool:
        """Take a free turn if one is (and nobody waits before), else False."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a turn (a cancelled wait takes none)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a turn as it gave up: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a turn back: to the first waiter still waiting, else to the count."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1

    async def __aenter__(self) -> None:
        if not self.take_now():
            await self.take()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
