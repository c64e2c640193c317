"""The event-loop side of the priority queue (PROTOCOL.md §12.3): wait for a slot, interrupt, wake.

The :class:`Scheduler` decides who runs, who waits and who is interrupted; the gate does
it on the event loop: a waiting intent awaits a future that the gate resolves when the
scheduler hands it a slot, and an interrupted one has its task cancelled, so that its
handler sees :class:`asyncio.CancelledError` where it awaits. The runner (§6.1 step 11)
and the stream pump (§6.4) pass through it only when ``ServerLimits.max_concurrent_intents``
is set; without a limit there is no queue and the gate is never entered.

State: the :class:`Scheduler` of this agent in this process: the queue and its limit are
per worker process, as the handlers they bound run in the process.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from a2a_secure.protocol.server.common import ServerConfig
from a2a_secure.protocol.server.scheduler import Scheduler, Ticket, TicketState

__all__ = ["IntentGate", "Slot"]


class Slot:
    """A ticket's event-loop side: the task to interrupt, the future that wakes it."""

    __slots__ = ("_wake", "interrupted", "task", "ticket")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.ticket: Ticket | None = None
        self.interrupted = False
        self._wake: asyncio.Future[None] | None = None

    @property
    def holds_slot(self) -> bool:
        """Whether the scheduler has given it a slot (it may run its handler)."""
        return self.ticket is not None and self.ticket.state is not TicketState.QUEUED

    def interrupt(self) -> None:
        """Stop the intent: its task is cancelled wherever it waits."""
        self.interrupted = True
        if self.task is not None:
            self.task.cancel()

    def wake(self) -> None:
        """It was given a slot while it waited."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self) -> None:
        """Return once it holds a slot (at once if it got one on entering)."""
        if not self.holds_slot:
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    def uncancel_interrupt(self) -> None:
        """Take back the cancellation of an interrupt: the task goes on to answer."""
        if self.task is not None:
            self.task.uncancel()


class IntentGate:
    """Admits accepted intents to the handlers of one agent, through its :class:`Scheduler`."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._scheduler = Scheduler()

    @property
    def scheduler(self) -> Scheduler:
        """The queue and slots (for inspection)."""
        return self._scheduler

    @property
    def active(self) -> bool:
        """Whether a concurrency limit is configured (else: no queue, the gate is not used)."""
        return self._config.limits.max_concurrent_intents is not None

    def has_room(self, priority: int) -> bool:
        """Whether an intent of ``priority`` would be admitted now (checked before step 8)."""
        limits = self._config.limits
        limit = limits.max_concurrent_intents
        if limit is None:
            return True
        return self._scheduler.has_room(priority, limit, limits.max_queued_intents)

    def enter(self, priority: int, task: asyncio.Task[Any] | None) -> Slot:
        """Take a slot or a place in the queue for ``task``; interrupt whoever must make room.

        Raises ``Unavailable`` (503) when the queue is full.
        """
        limits = self._config.limits
        slot = Slot(task)
        ticket, victims = self._scheduler.enter(priority, slot, self._limit(), limits.max_queued_intents)
        slot.ticket = ticket
        for victim in victims:
            victim.handle.interrupt()
        return slot

    def leave(self, slot: Slot) -> None:
        """``slot``'s intent is gone: its slot (or place) goes to the head of the queue."""
        if slot.ticket is None:
            return
        for granted in self._scheduler.leave(slot.ticket, self._limit()):
            granted.handle.wake()

    def _limit(self) -> int:
        # A limit removed while intents wait: let them all through.
        limit = self._config.limits.max_concurrent_intents
        return sys.maxsize if limit is None else limit
