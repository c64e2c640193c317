"""Structured logs: one JSON object per line (``a2a-secure serve --log-format json``).

:class:`JsonFormatter` formats any log record as one line of JSON: ``ts``, ``level``,
``logger``, ``event``, and the ``trace_id``/``span_id`` of the span current when it was
logged (when an OpenTelemetry SDK is configured; without one, the trace id of the request's
incoming ``traceparent``). The server writes one record per answered
request on the logger ``a2a_secure.events`` (:data:`EVENTS`) with the request's telemetry
fields: method as ``event``, goal, sequence, outcome, error code, reason, HTTP status,
duration, the caller's DID and the session id as a hash. The same rule as for spans holds:
never inputs, results, tokens, signatures, nonces or keys.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from a2a_secure.telemetry import tracing

__all__ = ["EVENTS", "FIELDS", "JsonFormatter", "log_config"]

EVENTS = "a2a_secure.events"
# The telemetry fields a request's log line may carry (ServerObserver), nothing else.
FIELDS = (
    "goal",
    "sequence",
    "outcome",
    "code",
    "reason",
    "http_status",
    "duration_ms",
    "caller_did",
    "session_hash",
    "verified",
    "stream",
    "replay",
)


def _trace_ids() -> tuple[str, str | None] | None:
    api = sys.modules.get("opentelemetry.trace")
    if api is not None:
        ctx = api.get_current_span().get_span_context()
        if ctx.is_valid:
            return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
    # No span (no SDK): the trace id of the request's own traceparent, so that the lines of
    # several agents on one trace still correlate.
    inherited = tracing.request_trace_id()
    return (inherited, None) if inherited is not None else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line; an exception's traceback stays out (only its type)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "a2a_secure", None)
        if isinstance(fields, dict):
            out["event"] = fields.get("method", record.getMessage())
            out.update({k: fields[k] for k in FIELDS if fields.get(k) is not None})
        else:
            out["event"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            out["exception"] = record.exc_info[0].__name__
        ids = _trace_ids()
        if ids is not None:
            out["trace_id"] = ids[0]
            if ids[1] is not None:
                out["span_id"] = ids[1]
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"), default=str)


def log_config(level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` (uvicorn's ``log_config``) writing JSON lines to stderr."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": ["json"], "level": upper, "propagate": False},
            "a2a_secure": {"handlers": ["json"], "level": upper, "propagate": False},
        },
    }
