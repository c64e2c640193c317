#!/usr/bin/env python3
"""What the priority queue (PROTOCOL.md §12.3) costs a server per intent, with no contention.

    python scripts/bench_priority.py [--rounds 5] [--batches 30] [--size 200]

Server CPU µs per signed intent through ``AgentServer.app()`` called as ASGI (no socket),
as ``scripts/bench_ab.py --only server`` measures it, for three configurations of the same
tree, measured in turn in each round so that the machine's drift hits them alike:

* ``off``: no ``max_concurrent_intents``: no queue (the default);
* ``on``: ``max_concurrent_intents=64``: every intent passes the queue (a slot is always
  free: intents are sent one after another);
* ``on+p5``: the same, the intents carrying ``"priority": 5`` from a caller with the right.

The report gives the minimum and the median over the rounds of each configuration's median
batch, and the overhead of ``on`` and ``on+p5`` against ``off``. The cost of the feature when
unused (``off`` against the tree before it) is ``bench_ab.py OLD NEW --only server``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import _asgi_post, intent_body, open_in_process

INTENT = {"goal": "echo", "domain": "bench", "inputs": {"text": "Hello world", "target_language": "es"}}
CONFIGS = ("off", "on", "on+p5")


async def _setup(config: str, count: int) -> tuple[Any, list[bytes]]:
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.protocol.priority import PriorityRights
    from a2a_secure.protocol.server import ServerLimits
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore

    client_id = Identity.generate("bench-client")
    limit = None if config == "off" else 64
    server = AgentServer(
        Identity.generate("bench-server"),
        Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600),
        store=MemoryStore(),
        limits=ServerLimits(max_concurrent_intents=limit),
        priority_rights=PriorityRights(per_did={client_id.did: 5}),
    )

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    resolved = await server.resolver.resolve(server.identity.did)
    session = await open_in_process(server.protocol, client_id, resolved)
    intent = {**INTENT, "priority": 5} if config == "on+p5" else INTENT
    return server.app(), [intent_body(session, i, intent) for i in range(count)]


async def measure(config: str, batches: int, size: int) -> float:
    """The median batch's server CPU µs per intent for ``config``."""
    app, bodies = await _setup(config, (batches + 1) * size)
    for body in bodies[:size]:  # warm-up
        assert await _asgi_post(app, "/a2a/intent", body) == 200
    per: list[float] = []
    for b in range(1, batches + 1):
        t = time.process_time()
        for body in bodies[b * size : (b + 1) * size]:
            assert await _asgi_post(app, "/a2a/intent", body) == 200
        per.append((time.process_time() - t) / size * 1e6)
    return statistics.median(per)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table; 0."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--size", type=int, default=200)
    args = p.parse_args(argv)
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        # Rotate the order each round, so that no configuration always runs first or last.
        order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
        for config in order:
            results[config].append(asyncio.run(measure(config, args.batches, args.size)))
    base = statistics.median(results["off"])
    print(f"server CPU µs per intent, {args.rounds} rounds of {args.batches} x {args.size} intents")
    print(f"{'config':<8} {'min':>8} {'median':>8} {'vs off':>8}")
    for config in CONFIGS:
        med = statistics.median(results[config])
        print(f"{config:<8} {min(results[config]):8.1f} {med:8.1f} {100 * (med - base) / base:+7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
