"""The priority queue of one agent's intents (PROTOCOL.md §12.3): who runs, who waits, who stops.

Accepted intents (§6.1 step 11) take a slot to run their handler; with
``ServerLimits.max_concurrent_intents`` slots taken, they wait. The rules, all here:

- At most ``limit`` tickets hold a slot: running ones, and interrupted ones until their
  handler has unwound (a slot is given back only when the handler is gone, so the limit
  bounds the handlers really running).
- A ticket that finds no free slot waits in one queue: higher priority first, first come
  first served within a priority. A freed slot goes to the head of the queue.
- At most ``max_queued`` tickets wait; past that, :class:`Unavailable` (503). A
  priority-5 ticket is admitted past the bound when slots are being freed for it, so a
  queue full of lower priorities cannot keep it out; the queue then holds at most
  ``max_queued + limit``.
- A priority-5 ticket that finds no free slot interrupts running tickets of lower
  priority: the lowest priority first, and within a priority the most recently started
  (it has lost the least work), as many as needed for the slots being freed to cover the
  priority-5 tickets waiting, itself included: one each. Priority 5 never interrupts
  priority 5; with nothing to interrupt, it waits at the head of the queue.

Pure: the caller hands in an opaque ``handle`` per ticket and does the waking and the
interrupting itself (:mod:`a2a_secure.runtime.gate` is its event-loop side). With no limit configured the
runner never calls it: no queue, no cost.

State: the tickets holding slots, and the queue.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from a2a_secure.errors import Unavailable
from a2a_secure.protocol.priority import PREEMPTING_PRIORITY

__all__ = ["Scheduler", "Ticket", "TicketState"]


class TicketState(Enum):
    """Where a ticket is."""

    QUEUED = "queued"
    RUNNING = "running"
    INTERRUPTED = "interrupted"  # told to stop, still holding its slot until it has
    DONE = "done"


@dataclass(eq=False, slots=True)
class Ticket:
    """One intent's place: its priority, its order of arrival and of start, the caller's handle."""

    priority: int
    arrival: int
    handle: Any = field(repr=False)
    state: TicketState = TicketState.QUEUED
    started: int = -1

    @property
    def sort_key(self) -> tuple[int, int]:
        """Queue order: higher priority first, then first come first served."""
        return (-self.priority, self.arrival)


class Scheduler:
    """Slots and the priority queue of one agent in one process."""

    def __init__(self) -> None:
        self._running: set[Ticket] = set()
        self._queue: list[tuple[tuple[int, int], Ticket]] = []  # a heap on sort_key
        self._arrivals = itertools.count()
        self._starts = itertools.count()
        self._waiting_preemptors = 0  # priority-5 tickets in the queue
        self._interrupting = 0  # tickets interrupted and not yet gone

    @property
    def running(self) -> int:
        """How many tickets hold a slot (interrupted ones included)."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """How many tickets wait."""
        return len(self._queue)

    def has_room(self, priority: int, limit: int, max_queued: int) -> bool:
        """Whether a ticket of ``priority`` would be admitted now (a check before committing to it)."""
        if len(self._running) < limit and not self._queue:
            return True
        if len(self._queue) < max_queued:
            return True
        return priority >= PREEMPTING_PRIORITY and self._covered(len(self._victims(priority)))

    def enter(self, priority: int, handle: Any, limit: int, max_queued: int) -> tuple[Ticket, list[Ticket]]:
        """Admit a ticket: running at once, or queued. Also returns the tickets to interrupt now.

        Raises :class:`Unavailable` when the queue is full (and nothing is interrupted then).
        """
        ticket = Ticket(priority, next(self._arrivals), handle)
        if len(self._running) < limit and not self._queue:
            self._start(ticket)
            return ticket, []
        victims = self._victims(priority)
        if len(self._queue) >= max_queued and not (
            priority >= PREEMPTING_PRIORITY and self._covered(len(victims))
        ):
            raise Unavailable("too many intents are waiting to run", retry_after=1)
        for victim in victims:
            victim.state = TicketState.INTERRUPTED
            self._interrupting += 1
        if priority >= PREEMPTING_PRIORITY:
            self._waiting_preemptors += 1
        heapq.heappush(self._queue, (ticket.sort_key, ticket))
        return ticket, victims

    def leave(self, ticket: Ticket, limit: int) -> list[Ticket]:
        """``ticket`` is gone (done, interrupted and unwound, or given up waiting).

        Returns the tickets that now hold a slot and must be woken. Leaving twice is harmless.
        """
        state = ticket.state
        ticket.state = TicketState.DONE
        if state is TicketState.QUEUED:
            self._queue.remove((ticket.sort_key, ticket))
            heapq.heapify(self._queue)
            if ticket.priority >= PREEMPTING_PRIORITY:
                self._waiting_preemptors -= 1
            return []
        if state is TicketState.DONE:
            return []
        self._running.discard(ticket)
        if state is TicketState.INTERRUPTED:
            self._interrupting -= 1
        granted: list[Ticket] = []
        while self._queue and len(self._running) < limit:
            _key, head = heapq.heappop(self._queue)
            if head.priority >= PREEMPTING_PRIORITY:
                self._waiting_preemptors -= 1
            self._start(head)
            granted.append(head)
        return granted

    def _start(self, ticket: Ticket) -> None:
        ticket.state = TicketState.RUNNING
        ticket.started = next(self._starts)
        self._running.add(ticket)

    def _needed(self) -> int:
        # Slots still to free so that each waiting priority-5 ticket, and one more, has one.
        return self._waiting_preemptors + 1 - self._interrupting

    def _covered(self, new_victims: int) -> bool:
        return self._needed() - new_victims <= 0

    def _victims(self, priority: int) -> list[Ticket]:
        """The running tickets a new ticket of ``priority`` would interrupt (none below 5)."""
        if priority < PREEMPTING_PRIORITY:
            return []
        needed = self._needed()
        if needed <= 0:
            return []
        candidates = [
            t for t in self._running if t.state is TicketState.RUNNING and t.priority < PREEMPTING_PRIORITY
        ]
        # Lowest priority first; within a priority, the most recently started.
        candidates.sort(key=lambda t: (t.priority, -t.started))
        return candidates[:needed]
