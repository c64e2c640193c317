"""Prometheus metrics of an agent server (``prometheus_client``, the ``metrics`` extra).

One :class:`ServerMetrics` per ``AgentServer(metrics=True)``, in a registry of its own (so
that several agents in one process do not collide), served at ``/metrics`` in the text
format. Under ``a2a-secure serve --workers N`` the serve command sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start: every worker then writes its values
to files there and ``/metrics``, whichever worker answers, sums them
(``prometheus_client.multiprocess``); gauges are summed over the live workers.

Label values are bounded: a goal is its own name only when this server serves it, else
``other``; error codes, outcomes, steps and reasons come from fixed sets. No DID, session
id or input ever becomes a label.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

__all__ = ["MULTIPROC_ENV", "ServerMetrics", "mark_process_dead", "multiprocess_dir"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Seconds. Intents and handlers run from well under a millisecond (an in-memory echo) to
# the 30 s handler ceiling of PROTOCOL.md §9.
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_HANDSHAKE_STEPS = frozenset(("hello", "proof", "accept_policy"))


def multiprocess_dir() -> str | None:
    """The multiprocess directory in force in this process, if any."""
    return os.environ.get(MULTIPROC_ENV) or None


def mark_process_dead(pid: int) -> None:
    """Drop the live gauges of a worker that exits (no-op outside multiprocess mode)."""
    path = multiprocess_dir()
    if path is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


class ServerMetrics:
    """The counters, histograms and gauges of one agent server."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # (method, goal, outcome, code, replay, reason) -> the label children it counts in;
        # bounded: every member comes from a fixed or server-defined set.
        self._series: dict[tuple[Any, ...], tuple[Any, Any, tuple[Any, ...]]] = {}
        self.handshake_steps = Counter(
            "a2a_secure_handshake_steps",
            "Handshake steps answered, by step, outcome and JSON-RPC error code ('none' on success)",
            ["step", "outcome", "code"],
            registry=r,
        )
        self.intents = Counter(
            "a2a_secure_intents",
            "Intents answered, by goal ('other' for goals this server does not serve), outcome and code",
            ["goal", "outcome", "code"],
            registry=r,
        )
        self.closes = Counter("a2a_secure_closes", "Session closes answered", ["outcome", "code"], registry=r)
        self.refusals = Counter(
            "a2a_secure_refusals",
            "Requests refused for a reason operators act on: rate_limited, store_unavailable (503), "
            "revoked, capacity, failure_budget, in_progress",
            ["reason"],
            registry=r,
        )
        self.replays = Counter(
            "a2a_secure_replays",
            "Retries answered with the stored answer of their sequence (or intent_id)",
            ["goal"],
            registry=r,
        )
        self.rejects = Counter(
            "a2a_secure_rejected_requests",
            "Requests refused before the protocol saw them (body, content type, envelope)",
            ["code"],
            registry=r,
        )
        self.approvals = Counter(
            "a2a_secure_approvals",
            "Human-approval events: created, approved, rejected, executed, failed, refused",
            ["outcome"],
            registry=r,
        )
        self.intent_seconds = Histogram(
            "a2a_secure_intent_duration_seconds",
            "Time from receiving an intent to its answer (a stream: to its final event)",
            ["goal"],
            buckets=_LATENCY,
            registry=r,
        )
        self.handler_seconds = Histogram(
            "a2a_secure_handler_duration_seconds",
            "Time spent in intent handlers",
            ["goal"],
            buckets=_LATENCY,
            registry=r,
        )
        self.handshake_seconds = Histogram(
            "a2a_secure_handshake_step_duration_seconds",
            "Time to answer a handshake step",
            ["step"],
            buckets=_LATENCY,
            registry=r,
        )
        self.open_sessions = Gauge(
            "a2a_secure_open_sessions",
            "Sessions opened by this agent and not yet closed or expired (summed over workers)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "a2a_secure_intents_queued",
            "Intents waiting in the priority queue (summed over workers)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.running = Gauge(
            "a2a_secure_intents_running",
            "Intent handlers running under the priority queue (summed over workers)",
            registry=r,
            multiprocess_mode="livesum",
        )

    def request(self, fields: dict[str, Any], goal_label: str) -> None:
        """Count one answered request (see :class:`~a2a_secure.telemetry.ServerObserver`)."""
        method = fields["method"]
        code = fields["code"]
        key = (method, goal_label, fields["outcome"], code, fields["replay"], fields["reason"])
        series = self._series.get(key)
        if series is None:  # labels() takes a lock and builds a tuple: once per combination
            series = self._series[key] = self._children(key)
        counter, histogram, extra = series
        counter.inc()
        if histogram is not None:
            histogram.observe(fields["duration_s"])
        for child in extra:
            child.inc()

    def _children(self, key: tuple[Any, ...]) -> tuple[Any, Any, tuple[Any, ...]]:
        method, goal, outcome, code, replay, reason = key
        code_label = str(code) if code is not None else "none"
        extra = [self.refusals.labels(reason)] if reason is not None else []
        if method in _HANDSHAKE_STEPS:
            return (
                self.handshake_steps.labels(method, outcome, code_label),
                self.handshake_seconds.labels(method),
                tuple(extra),
            )
        if method == "intent":
            if replay:
                extra.append(self.replays.labels(goal))
            return (
                self.intents.labels(goal, outcome, code_label),
                self.intent_seconds.labels(goal),
                tuple(extra),
            )
        if method == "close":
            return self.closes.labels(outcome, code_label), None, tuple(extra)
        return self.rejects.labels(code_label), None, tuple(extra)

    def render(self) -> tuple[bytes, str]:
        """The exposition of these metrics (of every worker in multiprocess mode)."""
        path = multiprocess_dir()
        if path is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
        return generate_latest(merged), CONTENT_TYPE_LATEST
