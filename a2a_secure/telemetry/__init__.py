"""Telemetry for operators: OpenTelemetry traces, Prometheus metrics, JSON log lines.

* :mod:`.tracing`: spans for handshakes and intents on both sides, with the W3C trace
  context (``traceparent``/``tracestate``) carried in HTTP headers. Active only when the
  application configured an OpenTelemetry SDK (``opentelemetry-api`` is the ``otel``
  extra); otherwise each hook costs a dictionary look-up.
* :mod:`.metrics`: the ``/metrics`` endpoint of ``AgentServer(metrics=True)`` and of
  ``a2a-secure serve --metrics`` (``prometheus_client``, the ``metrics`` extra), correct
  under several worker processes.
* :mod:`.logs`: one JSON object per line (``serve --log-format json``).

What any of them may contain is listed in SECURITY.md ("Telemetry"): never inputs,
results, tokens, signatures, nonces or keys; a session id only as a hash.
"""

from __future__ import annotations

from a2a_secure.telemetry.observer import ServerObserver
from a2a_secure.telemetry.tracing import session_hash

__all__ = ["ServerObserver", "session_hash"]
