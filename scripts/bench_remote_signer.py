#!/usr/bin/env python3
"""Throughput of a server whose key is held by a remote signing service.

    python scripts/bench_remote_signer.py [--latency 0.02] [--seconds 3] [--concurrency 1,16,64]

A real ``AgentServer`` under uvicorn on 127.0.0.1 answers small ``echo`` intents from
``A2AClient``s (one session each, sequential on each client, ``--concurrency`` clients at
once, all in this process). Its key is, in turn:

* ``local``: a key file's seed (PyNaCl), signing in place;
* ``remote``: :class:`a2a_secure.testing.LatencyKey`, real Ed25519 signatures awaited after
  ``--latency`` seconds, as a KMS answers: the runtime awaits them, many at once;
* ``blocking``: the same latency in a holder without ``sign_async`` (a client library
  called in place, as every key was before remote holders existed): each answer's
  signature stops the event loop for ``--latency``.

Reported: intents per second and the median and 95th percentile latency of one intent, and
the most signatures the service had in flight at once.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from a2a_secure.client.http import A2AClient
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.server.common import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import LatencyKey, serve_app


class BlockingLatencyKey:
    """The latency of a remote service in a holder the runtime cannot await."""

    def __init__(self, holder: Any, latency: float) -> None:
        self._holder = holder
        self.latency = latency

    @property
    def public_key(self) -> bytes:
        return bytes(self._holder.public_key)

    def sign(self, message: bytes) -> bytes:
        time.sleep(self.latency)
        return bytes(self._holder.sign(message))

    def derive_key(self, info: bytes) -> bytes:
        return bytes(self._holder.derive_key(info))

    def export_seed(self) -> bytes:
        raise TypeError("not exportable")


def server_for(ident: Identity) -> AgentServer:
    server = AgentServer(
        ident,
        Policy(rate_limit=1_000_000),
        name="bench",
        description="remote signer benchmark",
        url="http://127.0.0.1",
        store=MemoryStore(),
        limits=ServerLimits(max_sessions=10_000, max_concurrent_intents=None),
    )

    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"echo": inputs}

    return server


async def run(kind: str, latency: float, concurrency: int, seconds: float) -> dict[str, Any]:
    local = Identity.generate("bench-server")
    holder: Any = local.holder
    service: LatencyKey | None = None
    if kind == "remote":
        service = LatencyKey(local.holder, latency)
        holder = service
    elif kind == "blocking":
        holder = BlockingLatencyKey(local.holder, latency)
    ident = Identity(holder, "bench-server")
    server = server_for(ident)
    latencies: list[float] = []
    async with serve_app(server.app()) as url:
        clients = [A2AClient(Identity.generate(f"c{i}")) for i in range(concurrency)]
        try:
            for c in clients:  # sessions opened before the clock starts
                await c.session_for(ident.did, endpoint=url)
            if service is not None:
                service.most_in_flight = 0
            stop = time.monotonic() + seconds

            async def loop(c: A2AClient) -> None:
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    await c.request(ident.did, {"goal": "echo", "inputs": {"n": 1}}, endpoint=url)
                    latencies.append(time.monotonic() - t0)

            started = time.monotonic()
            await asyncio.gather(*(loop(c) for c in clients))
            took = time.monotonic() - started
        finally:
            for c in clients:
                await c.aclose()
    latencies.sort()
    return {
        "kind": kind,
        "concurrency": concurrency,
        "per_s": len(latencies) / took,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "in_flight": service.most_in_flight if service is not None else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, default=0.02, help="seconds per remote signature")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    ap.add_argument("--concurrency", default="1,16,64", help="clients at once, comma-separated")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    print(f"signing latency {args.latency * 1000:.0f} ms; {args.seconds:.0f} s per run")
    print(f"{'key':<9} {'clients':>7} {'intents/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'in flight':>9}")
    for c in levels:
        for kind in ("local", "remote", "blocking"):
            r = asyncio.run(run(kind, args.latency, c, args.seconds))
            flight = "" if r["in_flight"] is None else str(r["in_flight"])
            print(
                f"{r['kind']:<9} {r['concurrency']:>7} {r['per_s']:>10.1f} {r['p50_ms']:>8.1f}"
                f" {r['p95_ms']:>8.1f} {flight:>9}"
            )


if __name__ == "__main__":
    main()
