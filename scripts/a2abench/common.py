"""What every case shares: addresses, the intent the signed cases send, run sizes, medians."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
SCRIPTS = Path(__file__).resolve().parent.parent
# The entry point: server children and the memory probe are ``bench.py --serve KIND`` and
# ``bench.py --probe-memory N``, so that they import this package as the parent does.
ENTRY = SCRIPTS / "bench.py"
REPLAY_LUA = SCRIPTS / "wrk" / "replay.lua"
CONCURRENCY = 32
WRK_THREADS = 2
JSON_HEADERS = {"Content-Type": "application/json"}
# The intent every signed case sends (the echo handler returns the inputs unchanged).
INTENT: dict[str, Any] = {
    "goal": "echo",
    "domain": "bench",
    "inputs": {"text": "Hello world", "target_language": "es"},
}


@dataclass(frozen=True)
class Settings:
    """How long and how big each case is."""

    rounds: int
    e2e_seconds: float
    wrk_seconds: float
    wrk_sessions: int
    memory_sessions: int
    redis_sessions: int
    round_trip_intents: int
    cluster_sessions: int  # opened on the Redis Cluster before its keys are counted


FULL = Settings(3, 2.0, 4.0, 256, 100_000, 10_000, 300, 100_000)
QUICK = Settings(1, 0.7, 1.0, 128, 30_000, 2_000, 100, 10_000)


def median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


def pct(latencies: Sequence[float], q: float) -> float:
    if not latencies:
        return float("nan")
    s = sorted(latencies)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def _f(value: Any, fmt: str = ".0f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return float(a) / float(b)
