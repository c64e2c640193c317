"""Session lifetimes on the monotonic clock (PROTOCOL.md §5.6 ``expires_at``, ATTACKS.md G12).

A session opened by this process ends ``session_timeout`` seconds later on the monotonic
clock as well as at its wall-clock ``expires_at``: a wall clock stepping back must not
lengthen a session. Other workers sharing a store check the wall-clock ``expires_at`` of
§5.6; with Redis, the session key's TTL (Redis's clock) ends the session for them as well.

State: session id → monotonic deadline, for the sessions this process opened, and the same
deadlines in a heap (earliest on top) from which the past ones are popped as each session
is noted: amortised O(log n) per session, however many are held, so that a full server
answers a handshake as fast as an empty one. The handshake responder adds to it (§5.6);
the intent processor and the stream pump read it; a close (§6.3) removes from it.
"""

from __future__ import annotations

import heapq

from a2a_secure.protocol.server.common import MonoClock, ServerConfig
from a2a_secure.system import MonoSeconds

__all__ = ["SessionDeadlines"]

# The heap is rebuilt from the live deadlines when it holds more than twice as many plus this.
_HEAP_SLACK = 1024


class SessionDeadlines:
    """The monotonic deadline of each session this process opened."""

    def __init__(self, config: ServerConfig, monotonic: MonoClock) -> None:
        self._config = config
        self._monotonic = monotonic
        self._deadlines: dict[str, MonoSeconds] = {}
        self._by_deadline: list[tuple[MonoSeconds, str]] = []

    def note(self, session_id: str, lifetime: int) -> None:
        """``session_id`` was opened now and lives ``lifetime`` seconds."""
        now = self._monotonic()
        heap = self._by_deadline
        while heap and heap[0][0] <= now:
            deadline, sid = heapq.heappop(heap)
            if self._deadlines.get(sid) == deadline:
                del self._deadlines[sid]
        if len(heap) > 2 * len(self._deadlines) + _HEAP_SLACK:  # closed sessions' leftovers
            heap = self._by_deadline = [(d, sid) for sid, d in self._deadlines.items()]
            heapq.heapify(heap)
        deadline = MonoSeconds(now + lifetime)
        self._deadlines[session_id] = deadline
        heapq.heappush(heap, (deadline, session_id))

    def past(self, session_id: str) -> bool:
        """Whether ``session_id`` has outlived its monotonic deadline (and forget it then)."""
        deadline = self._deadlines.get(session_id)
        if deadline is None or self._monotonic() < deadline:
            return False
        del self._deadlines[session_id]
        return True

    def forget(self, session_id: str) -> None:
        """``session_id`` was closed."""
        self._deadlines.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._deadlines)
