"""Audit sinks and the :class:`Auditor` facade that the server and the client call.

**Failure policy.** A sink that fails (disk full, permissions, closed file) does not fail the
protocol exchange: :class:`Auditor` logs the failure on the logger ``a2a_secure.audit_errors``
(rate limited), counts it (:attr:`Auditor.failures`) and goes on with the other sinks. An
agent that must not act without an audit trail passes ``fail_closed=True``: then
:meth:`Auditor.record` raises :class:`AuditWriteError` (an ``InternalError``, -32603) after
trying every sink. The default favours availability because a broken log disk would
otherwise turn into a denial of service of every peer, and because the failure stays visible
(counter, error log) rather than silent.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from a2a_secure.audit.records import AuditEvent, EventName, Role, Status
from a2a_secure.errors import InternalError
from a2a_secure.system import mono_now, wall_now

__all__ = ["AuditSink", "AuditWriteError", "Auditor", "LoggingAuditSink", "MemoryAuditSink"]

_errlog = logging.getLogger("a2a_secure.audit_errors")


@runtime_checkable
class AuditSink(Protocol):
    """Where audit records go. ``write`` may raise; :class:`Auditor` handles that."""

    def write(self, event: AuditEvent) -> None: ...

    def close(self) -> None: ...


class MemoryAuditSink:
    """Keeps records in a list (tests, debugging)."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self.closed = False
        self._lock = threading.Lock()

    def write(self, event: AuditEvent) -> None:
        with self._lock:
            self.events.append(event)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records as dictionaries."""
        with self._lock:
            return [e.to_dict() for e in self.events]

    def close(self) -> None:
        self.closed = True


class LoggingAuditSink:
    """Emits each record as one JSON string through :mod:`logging` (no chain, no checkpoints)."""

    def __init__(self, logger_name: str = "a2a_secure.audit", level: int = logging.INFO) -> None:
        self.logger = logging.getLogger(logger_name)
        self.level = level

    def write(self, event: AuditEvent) -> None:
        self.logger.log(self.level, "%s", event.to_json())

    def close(self) -> None:
        return None


class AuditWriteError(InternalError):
    """A sink failed and the auditor is fail-closed (-32603 to the peer)."""

    default_message = "audit log unavailable"


class Auditor:
    """What the server and the client call: builds §8 records and hands them to the sinks.

    ``role`` is the default role of the records; ``clock`` gives their timestamps. See the
    module documentation for ``fail_closed``. ``on_error(sink, exc)``, if given, is called
    for every sink failure (after counting it).
    """

    def __init__(
        self,
        sinks: Iterable[AuditSink] = (),
        *,
        role: Role | None = None,
        clock: Callable[[], float] = wall_now,
        fail_closed: bool = False,
        on_error: Callable[[AuditSink, Exception], None] | None = None,
    ) -> None:
        self.sinks: list[AuditSink] = list(sinks)
        self.role: Role | None = role
        self.clock = clock
        self.fail_closed = fail_closed
        self._on_error = on_error
        self._lock = threading.Lock()
        self._failures = 0
        self._last_failure: str | None = None
        self._last_logged = -math.inf
        self._suppressed = 0

    @property
    def failures(self) -> int:
        """How many sink writes (or closes) failed so far."""
        return self._failures

    @property
    def last_failure(self) -> str | None:
        """A short description of the most recent failure."""
        return self._last_failure

    def record(
        self,
        *,
        event: EventName,
        status: Status,
        verified: bool = False,
        role: Role | None = None,
        session_id: str | None = None,
        client_did: str | None = None,
        server_did: str | None = None,
        intent_goal: str | None = None,
        sequence: int | None = None,
        duration_ms: float | None = None,
        error_code: int | None = None,
        principal: str | None = None,
        delegation: str | None = None,
    ) -> AuditEvent:
        """Build one record (timestamp from the clock) and write it to every sink."""
        chosen = role if role is not None else self.role
        if chosen is None:
            raise ValueError("audit role not given and the auditor has no default role")
        ev = AuditEvent(
            timestamp=self.clock(),
            event=event,
            role=chosen,
            status=status,
            verified=verified,
            session_id=session_id,
            client_did=client_did,
            server_did=server_did,
            intent_goal=intent_goal,
            sequence=sequence,
            duration_ms=duration_ms,
            error_code=error_code,
            principal=principal,
            delegation=delegation,
        )
        self.write(ev)
        return ev

    def write(self, event: AuditEvent) -> None:
        """Hand a ready record to every sink (so an Auditor is itself a sink)."""
        failed: Exception | None = None
        for sink in self.sinks:
            try:
                sink.write(event)
            except Exception as exc:
                self._failed(sink, exc, f"write a {event.event} record")
                failed = failed or exc
        if failed is not None and self.fail_closed:
            raise AuditWriteError() from failed

    def close(self) -> None:
        """Close every sink (closing checkpoints are written here)."""
        failed: Exception | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                self._failed(sink, exc, "close")
                failed = failed or exc
        if failed is not None and self.fail_closed:
            raise AuditWriteError() from failed

    def _failed(self, sink: AuditSink, exc: Exception, what: str) -> None:
        desc = f"audit sink {type(sink).__name__} failed to {what}: {type(exc).__name__}: {exc}"[:300]
        now = mono_now()
        with self._lock:
            self._failures += 1
            self._last_failure = desc
            log_now = now - self._last_logged >= 60.0
            if log_now:
                suppressed, self._suppressed, self._last_logged = self._suppressed, 0, now
            else:
                self._suppressed += 1
        if log_now:
            more = f" ({suppressed} more failures since the last report)" if suppressed else ""
            _errlog.error("%s%s", desc, more)
        if self._on_error is not None:
            try:
                self._on_error(sink, exc)
            except Exception:
                _errlog.exception("audit on_error callback failed")
