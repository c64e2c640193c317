#!/usr/bin/env python3
"""What telemetry costs per intent: tracing off, tracing on, metrics on, side by side.

    python scripts/bench_telemetry.py [--instructions] [--rounds 5]

Each mode runs in a fresh interpreter of this tree (so that nothing one mode imports or
configures leaks into another), the same work as scripts/bench_ab.py:

* ``server``: one signed intent through ``AgentServer.app()`` called as ASGI (no socket),
  the requests signed beforehand: only the server's work;
* ``roundtrip``: ``A2AClient.request`` against that app through httpx's ASGI transport, both
  sides in one process: the client's spans and its ``traceparent`` header count too.

Modes:

* ``off``: OpenTelemetry never imported (an agent without the ``otel`` extra, or that
  never configures it);
* ``api``: ``opentelemetry.trace`` imported, no SDK configured (the no-op provider);
* ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` (its exporter discards
  the batches: the cost measured is the request path's, not a collector's);
* ``metrics``: ``AgentServer(metrics=True)``, no tracing;
* ``all``: ``sdk`` and ``metrics``, and ``log_requests`` (one JSON line per request to a
  handler that drops it after formatting).

By default CPU µs per intent (``time.process_time``), the median and the fastest of
``--rounds`` batches; ``--instructions`` counts instructions instead under callgrind
(valgrind): two runs with different numbers of intents, the difference divided, so start-up
and imports cancel; the same count for the same work, whatever else the machine does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import _asgi_post, intent_body
from bench_ab import INTENT, _asgi_handshake, _server

MODES = ("off", "api", "sdk", "metrics", "all")
KINDS = ("server", "roundtrip")
COUNTS = {"server": (10, 60), "roundtrip": (10, 40)}


# -- child side ------------------------------------------------------------------------------------
def _configure(mode: str) -> dict[str, Any]:
    """Set up ``mode`` in this process; the AgentServer options it needs."""
    if mode in ("api", "sdk", "all"):
        import opentelemetry.trace  # noqa: F401
    if mode in ("sdk", "all"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Discard(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Discard()))
        trace.set_tracer_provider(provider)
    options: dict[str, Any] = {}
    if mode in ("metrics", "all"):
        options["metrics"] = True
    if mode == "all":
        from a2a_secure.telemetry.logs import JsonFormatter

        class Drop(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                self.format(record)

        handler = Drop()
        handler.setFormatter(JsonFormatter())
        events = logging.getLogger("a2a_secure.events")
        events.addHandler(handler)
        events.setLevel(logging.INFO)
        events.propagate = False
        options["log_requests"] = True
    return options


def _build(mode: str, sessions: int) -> Any:
    from a2a_secure.identity.keys import Identity
    from a2a_secure.server.app import AgentServer

    options = _configure(mode)
    plain = _server(Identity.generate("bench-server"), sessions=sessions)
    if not options:
        return plain
    server = AgentServer(plain.identity, plain.policy, store=plain.store, limits=plain.limits, **options)

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    return server


async def _work(mode: str, kind: str, n: int, timed: bool = False) -> list[float]:
    """``n`` intents of ``kind`` (after 10 to warm up); with ``timed``, CPU µs of each batch of 20."""
    import httpx

    from a2a_secure.client.http import A2AClient
    from a2a_secure.identity.keys import Identity

    server = _build(mode, sessions=50)
    app = server.app()
    per: list[float] = []
    if kind == "server":
        client_id = Identity.generate("bench-client")
        resolved = await server.resolver.resolve(server.identity.did)
        session = await _asgi_handshake(app, client_id, resolved)
        bodies = [intent_body(session, i, INTENT) for i in range(n + 10)]
        calls = [lambda b=b: _asgi_post(app, "/a2a/intent", b) for b in bodies]
    else:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
        client = A2AClient(Identity.generate("bench-client"), http=http, exactly_once=False)
        did = server.identity.did
        await client.handshake(did, "http://127.0.0.1")
        calls = [lambda: client.request(did, INTENT) for _ in range(n + 10)]
    for call in calls[:10]:
        await call()
    rest = calls[10:]
    size = 20 if timed else len(rest)
    for start in range(0, len(rest), size):
        t = time.process_time()
        for call in rest[start : start + size]:
            await call()
        per.append((time.process_time() - t) / len(rest[start : start + size]) * 1e6)
    return per


def _callgrind(mode: str, kind: str, n: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, __file__, "--count", mode, kind, str(n)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{mode} {kind} failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def _timed(mode: str, kind: str) -> list[float]:
    out = subprocess.run(
        [sys.executable, __file__, "--time", mode, kind],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} {kind} failed:\n{out.stderr[-2000:]}")
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instructions", action="store_true", help="count instructions (valgrind)")
    p.add_argument("--rounds", type=int, default=5, help="timing: fresh processes per mode (default 5)")
    p.add_argument("--kind", choices=KINDS, action="append", help="only these measurements")
    p.add_argument("--count", nargs=3, metavar=("MODE", "KIND", "N"), help=argparse.SUPPRESS)
    p.add_argument("--time", nargs=2, metavar=("MODE", "KIND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.count:
        asyncio.run(_work(args.count[0], args.count[1], int(args.count[2])))
        return
    if args.time:
        print(json.dumps(asyncio.run(_work(args.time[0], args.time[1], 200, timed=True))))
        return
    kinds = args.kind or list(KINDS)
    table: dict[tuple[str, str], float] = {}
    if args.instructions:
        jobs = [(mode, kind, n) for kind in kinds for mode in MODES for n in COUNTS[kind]]
        print(f"[{time.strftime('%H:%M:%S')}] {len(jobs)} runs under callgrind", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counts = dict(zip(jobs, pool.map(lambda j: _callgrind(*j), jobs), strict=True))
        for kind in kinds:
            low, high = COUNTS[kind]
            for mode in MODES:
                table[(kind, mode)] = (counts[(mode, kind, high)] - counts[(mode, kind, low)]) / (high - low)
        unit = "instructions per intent (callgrind)"
    else:
        samples: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for kind in kinds:
                for mode in MODES:  # interleaved, so that drift hits every mode alike
                    print(f"[{time.strftime('%H:%M:%S')}] round {r + 1} {kind} {mode}", file=sys.stderr)
                    samples.setdefault((kind, mode), []).extend(_timed(mode, kind))
        table = {key: statistics.median(values) for key, values in samples.items()}
        unit = f"CPU µs per intent, median of {args.rounds} processes x 10 batches of 20"
    print(f"{unit}\n")
    print(f"{'measure':12s}" + "".join(f"{mode:>14s}" for mode in MODES))
    for kind in kinds:
        base = table[(kind, "off")]
        row = "".join(f"{table[(kind, mode)]:14.0f}" for mode in MODES)
        print(f"{kind:12s}{row}")
        rel = "".join(f"{(table[(kind, mode)] / base - 1) * 100:+13.1f}%" for mode in MODES)
        print(f"{'  vs off':12s}{rel}")


if __name__ == "__main__":
    main()
