"""What the server tells telemetry about each answered request, and who hears it.

The server core gathers a request's audit fields while it processes it (PROTOCOL.md §8,
``AuditFields``); when the answer is ready it hands them and the reply to
:meth:`ServerObserver.observe`, once per request (a stream: at its final event). From them
the observer builds one dictionary of *telemetry fields*, the only thing the span, the
metrics and the log line see: method, goal (when served, else ``other``), sequence,
outcome, error code, HTTP status, duration, the caller's DID, a hash of the session id,
whether the answer was streamed or replayed, and for refusals operators act on a reason
from a fixed set. Inputs, results,
tokens, signatures, nonces and keys are not in the audit fields to begin with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from a2a_secure.system import mono_now
from a2a_secure.telemetry import tracing
from a2a_secure.telemetry.tracing import session_hash

if TYPE_CHECKING:
    from a2a_secure.telemetry.metrics import ServerMetrics

__all__ = ["ServerObserver", "refusal_reason", "session_hash"]

_events = logging.getLogger("a2a_secure.events")
OTHER_GOAL = "other"
# The server's own refusal messages (errors.py and the core) that operators act on; the
# message is the server's, never the caller's, so the set of reasons stays fixed.
_REASONS = (
    ("rate limit", "rate_limited"),
    ("shared store unavailable", "store_unavailable"),
    ("revoked", "revoked"),
    ("failed handshake steps", "failure_budget"),
    ("still running", "in_progress"),
    ("too many", "capacity"),
)
_APPROVAL_OUTCOMES = {
    "action_created": "created",
    "action_approved": "approved",
    "action_rejected": "rejected",
    "action_executed": "executed",
    "action_failed": "failed",
    "action_refused": "refused",
}


def refusal_reason(code: Any, message: Any) -> str | None:
    """The reason label of a refusal with JSON-RPC ``code`` and the server's ``message``."""
    if code not in (-32048, -32040, -32043) or not isinstance(message, str):
        return None
    for needle, reason in _REASONS:
        if needle in message and (code == -32048 or reason == "revoked"):
            return reason
    return None


class ServerObserver:
    """Turns each answered request into span attributes, metrics and a JSON log line.

    ``serves(goal)`` says whether a goal is served (its metric label is then the goal,
    else ``other``); ``session_timeout()`` the seconds an opened session lives;
    ``scheduler()`` the priority queue (``queued``/``running``) or None.
    """

    def __init__(
        self,
        *,
        metrics: ServerMetrics | None,
        log_requests: bool,
        serves: Callable[[str], bool],
        session_timeout: Callable[[], int],
        scheduler: Callable[[], Any] | None = None,
        monotonic: Callable[[], float] = mono_now,
    ) -> None:
        self.metrics = metrics
        self.log_requests = log_requests
        self._serves = serves
        self._session_timeout = session_timeout
        self._scheduler = scheduler
        self._monotonic = monotonic
        # Session hash -> when it expires (monotonic): the open-sessions gauge of this worker.
        self._sessions: dict[str, float] = {}
        self._next_prune = 0.0
        self._gauges: tuple[int, int, int] | None = None  # the values last set

    @property
    def has_sinks(self) -> bool:
        """Whether every answered request has somewhere to go besides a span: metrics, log lines."""
        return self.metrics is not None or self.log_requests

    def observe(self, audit: Any, reply: Any, seconds: float) -> None:
        """One request ended with ``reply`` after ``seconds`` (``audit``: its AuditFields)."""
        traced = tracing.tracer() is not None
        if self.metrics is None and not self.log_requests and not traced:
            return
        fields = self.fields(audit, reply, seconds)
        if traced:
            tracing.annotate_server(fields)
        if self.metrics is not None:
            self._count(fields)
        if self.log_requests:
            level = logging.WARNING if fields["http_status"] >= 500 else logging.INFO
            _events.log(level, fields["method"], extra={"a2a_secure": fields})

    def fields(self, audit: Any, reply: Any, seconds: float) -> dict[str, Any]:
        """The telemetry fields of one request (see the module documentation).

        The goal is the caller's word: it is kept only when this server serves it, else it
        is ``other``, so that nothing a caller typed reaches a span, a label or a log line.
        """
        goal = audit.intent_goal
        if goal is not None and not self._serves(goal):
            goal = OTHER_GOAL
        error = reply.error
        code = error.get("code") if error is not None else None
        fields: dict[str, Any] = {
            "method": audit.event,
            "outcome": "error" if error is not None else "success",
            "code": code if type(code) is int else None,
            "http_status": reply.http_status,
            "duration_s": seconds,
            "duration_ms": round(seconds * 1000, 3),
            "goal": goal,
            "sequence": audit.sequence,
            "caller_did": audit.client_did,
            "session_hash": session_hash(audit.session_id) if audit.session_id else None,
            "verified": audit.verified,
            "stream": audit.deferred,
            "replay": bool(audit.extra.get("replay")),
            "reason": refusal_reason(code, error.get("message")) if error is not None else None,
        }
        return fields

    def _count(self, fields: dict[str, Any]) -> None:
        assert self.metrics is not None
        self.metrics.request(fields, fields["goal"] or OTHER_GOAL)
        method = fields["method"]
        if method in ("accept_policy", "close") and fields["outcome"] == "success" and fields["session_hash"]:
            if method == "accept_policy":
                self._sessions[fields["session_hash"]] = self._monotonic() + self._session_timeout()
            else:
                self._sessions.pop(fields["session_hash"], None)
        self.update_gauges(prune=False)

    def update_gauges(self, *, prune: bool = True) -> None:
        """Set the open-sessions and queue gauges of this worker (each only when it changed).

        Expired sessions are dropped at most once a second (and at each scrape), not at
        every request: the scan is as long as the number of open sessions.
        """
        metrics = self.metrics
        if metrics is None:
            return
        now = self._monotonic()
        if prune or now >= self._next_prune:
            self._next_prune = now + 1.0
            for h in [h for h, until in self._sessions.items() if until <= now]:
                del self._sessions[h]
        scheduler = self._scheduler() if self._scheduler is not None else None
        values = (
            (len(self._sessions), scheduler.queued, scheduler.running)
            if scheduler
            else (len(self._sessions), 0, 0)
        )
        if values != self._gauges:
            self._gauges = values
            metrics.open_sessions.set(values[0])
            metrics.queued.set(values[1])
            metrics.running.set(values[2])

    def action(self, record: dict[str, Any]) -> None:
        """An approval event (the approval engine's audit record)."""
        outcome = _APPROVAL_OUTCOMES.get(record.get("event", ""))
        if outcome is not None and self.metrics is not None:
            self.metrics.approvals.labels(outcome).inc()
        if outcome is not None:
            tracing.event(f"a2a_secure.client.approval.{outcome}", {"a2a_secure.outcome": outcome})

    def timed(self, goal: str, handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``handler`` with its run time observed in the handler histogram."""
        metrics = self.metrics
        if metrics is None:
            return handler
        histogram = metrics.handler_seconds.labels(goal)

        async def run(inputs: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return await handler(inputs, context)
            finally:
                histogram.observe(time.perf_counter() - started)

        return run
