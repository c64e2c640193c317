"""Session lifetimes on the monotonic clock (PROTOCOL.md §5.6 ``expires_at``, ATTACKS.md G12).

A session opened by this process ends ``session_timeout`` seconds later on the monotonic
clock as well as at its wall-clock ``expires_at``: a wall clock stepping back must not
lengthen a session. Other workers sharing a store check the wall-clock ``expires_at`` of
§5.6; with Redis, the session key's TTL (Redis's clock) ends the session for them as well.

State: session id → monotonic deadline, for the sessions this process opened (at most
``ServerLimits.max_sessions``; past deadlines are dropped when it is full). The handshake
responder adds to it (§5.6); the intent processor and the stream pump read it; a close
(§6.3) removes from it.
"""

from __future__ import annotations

from a2a_secure.protocol.server.common import MonoClock, ServerConfig
from a2a_secure.system import MonoSeconds

__all__ = ["SessionDeadlines"]


class SessionDeadlines:
    """The monotonic deadline of each session this process opened."""

    def __init__(self, config: ServerConfig, monotonic: MonoClock) -> None:
        self._config = config
        self._monotonic = monotonic
        self._deadlines: dict[str, MonoSeconds] = {}

    def note(self, session_id: str, lifetime: int) -> None:
        """``session_id`` was opened now and lives ``lifetime`` seconds."""
        if len(self._deadlines) >= self._config.limits.max_sessions:
            now = self._monotonic()
            for sid in [k for k, v in self._deadlines.items() if v <= now]:
                del self._deadlines[sid]
        self._deadlines[session_id] = MonoSeconds(self._monotonic() + lifetime)

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
