"""Telemetry for a person at a terminal: a trace tree and a metrics summary (``demo --trace``).

:class:`SpanCollector` is an OpenTelemetry span processor that keeps every ended span in
memory (the SDK, ``opentelemetry-sdk``, must be installed); :func:`trace_tree` draws them
as one tree per trace, children under their parent in start order, with each span's kind,
duration and the attributes that tell what happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SpanCollector", "metrics_summary", "trace_tree"]

_SHOWN = (
    ("a2a_secure.goal", "goal"),
    ("a2a_secure.sequence", "seq"),
    ("a2a_secure.outcome", ""),
    ("a2a_secure.error_code", "code"),
    ("a2a_secure.stream", "stream"),
    ("a2a_secure.replay", "replay"),
    ("a2a_secure.reason", "reason"),
)


class SpanCollector:
    """A span processor keeping ended spans (``TracerProvider.add_span_processor``)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: Any) -> None:
        """Keep the ended span."""
        self.spans.append(span)

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True

    def _on_ending(self, span: Any) -> None:  # called by newer SDKs
        """Nothing to do before a span ends."""


def _line(span: Any, names: dict[str, str]) -> str:
    kind = str(getattr(span.kind, "name", span.kind)).lower()
    ms = (span.end_time - span.start_time) / 1e6 if span.end_time and span.start_time else 0.0
    attrs = dict(span.attributes or {})
    parts = []
    for key, label in _SHOWN:
        if key in attrs:
            value = attrs[key]
            parts.append(f"{label}={value}" if label else str(value))
    for key in ("a2a_secure.caller_did", "a2a_secure.server_did"):
        if key in attrs:
            who = names.get(attrs[key], str(attrs[key])[:24] + "…")
            parts.append(f"{'from' if key.endswith('caller_did') else 'to'}={who}")
    events = [e.name.removeprefix("a2a_secure.") for e in span.events]
    if events:
        parts.append("events=" + ",".join(events))
    return f"{span.name} [{kind}] {ms:.1f} ms  " + " ".join(parts)


def trace_tree(spans: Sequence[Any], names: dict[str, str] | None = None) -> str:
    """The spans as indented trees, one per trace; ``names`` maps DIDs to short names."""
    names = names or {}
    by_parent: dict[Any, list[Any]] = {}
    ids = {s.context.span_id for s in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        by_parent.setdefault(parent if parent in ids else None, []).append(span)
    for children in by_parent.values():
        children.sort(key=lambda s: s.start_time or 0)
    out: list[str] = []

    def walk(span: Any, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        out.append(prefix + branch + _line(span, names))
        children = by_parent.get(span.context.span_id, [])
        deeper = prefix if root else prefix + ("   " if last else "│  ")
        for i, child in enumerate(children):
            walk(child, deeper, i == len(children) - 1, False)

    for root in by_parent.get(None, []):
        out.append(f"trace {format(root.context.trace_id, '032x')}")
        walk(root, "  ", True, True)
    return "\n".join(out)


def metrics_summary(named: Iterable[tuple[str, Any]]) -> str:
    """Intents by goal and outcome, from each ``(name, ServerMetrics)``."""
    lines = []
    for name, metrics in named:
        counts = []
        for family in metrics.registry.collect():
            if family.name != "a2a_secure_intents":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    labels = sample.labels
                    code = "" if labels["code"] == "none" else f" {labels['code']}"
                    counts.append(f"{labels['goal']} {labels['outcome']}{code}: {int(sample.value)}")
        lines.append(f"  {name:<11} " + ("; ".join(counts) or "no intents"))
    return "\n".join(lines)
