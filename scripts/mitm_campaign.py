#!/usr/bin/env python3
"""A long man-in-the-middle campaign against a real server and two real clients.

Runs ``--runs`` seeded runs of ``tests/mitm_helpers.py`` (the harness that
``tests/test_mitm.py`` runs 40 times in CI): two honest ``A2AClient``s talk to an
``AgentServer`` through an attacker that drops, duplicates, delays, reorders, replays
(recorded traffic of earlier runs too), reflects, edits bodies and headers and forges
errors. After every run it checks the invariants (session agreement, only signed intents
run, at most once per session and sequence, every returned value is the server's output
for that very request; no foreign exception, no stuck call, a clean request works after
the run) and prints the mutation counts, the client outcomes and every violation.

    python scripts/mitm_campaign.py --runs 200 --seed 1 [--ops 5] [--details] [--stop]

Exactly once (docs/PROTOCOL.md §12.5): ``--exactly-once`` uses the mutation table
aimed at it (forged -32043 after the request ran, a dropped reply whose retry gets a forged
-32043, duplicates, losses), clients with ``exactly_once=True``, and checks besides that
each intent_id ran at most once and that every value returned for it is that run's.
``--in-process`` runs both hops through ``httpx.ASGITransport`` (no sockets) and
``--runs-per-handshake N`` keeps the clients' sessions for N runs, so that 10 000 runs take
minutes; ``--store redis`` (``--redis-url``) adds server restarts mid-request:

    python scripts/mitm_campaign.py --exactly-once --in-process --runs 10000 --runs-per-handshake 5
    python scripts/mitm_campaign.py --exactly-once --in-process --store redis --runs 2000

Sealed intents (docs/PROTOCOL.md §12.6): ``--sealed`` makes the server declare them and the
clients require them (``sealed=True``), and adds the mutations aimed at them (sealed inputs,
results, events and error data flipped, truncated, stripped, replaced by plaintext or moved
from other sequences, sessions, clients and directions; ``seal_key`` swapped or removed in the
signed ACCEPT_POLICY and SESSION; the agent card stripped of ``sealed``); the handler must
get exactly the inputs the client sealed:

    python scripts/mitm_campaign.py --sealed --in-process --runs 1000 --runs-per-handshake 5

Exits 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mitm_helpers import EXACTLY_ONCE_MUTATIONS, MUTATIONS, run_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="number of runs (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="campaign seed (default 1)")
    parser.add_argument("--ops", type=int, default=5, help="operations per client and run (default 5)")
    parser.add_argument("--details", action="store_true", help="also print every mutation sub-kind")
    parser.add_argument("--stop", action="store_true", help="stop at the first run with a violation")
    parser.add_argument("--exactly-once", action="store_true", help="the campaign aimed at intent_id")
    parser.add_argument("--in-process", action="store_true", help="no sockets (httpx.ASGITransport)")
    parser.add_argument("--runs-per-handshake", type=int, default=1, help="runs per client session")
    parser.add_argument("--store", choices=("memory", "redis"), default="memory", help="the server's store")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="Redis for --store redis")
    parser.add_argument("--check-every", type=int, default=0, help="check invariants every n runs")
    parser.add_argument("--sealed", action="store_true", help="sealed intents and their mutations")
    args = parser.parse_args()
    check_every = args.check_every or (20 if args.in_process else 1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    report = asyncio.run(
        run_campaign(
            args.seed,
            args.runs,
            ops_per_client=args.ops,
            stop_on_violation=args.stop,
            in_process=args.in_process,
            runs_per_handshake=args.runs_per_handshake,
            store=args.store,
            redis_url=args.redis_url,
            exactly_once=True if args.exactly_once else None,
            check_every=check_every,
            mutations=EXACTLY_ONCE_MUTATIONS if args.exactly_once else MUTATIONS,
            sealed=True if args.sealed else None,
        )
    )
    print(report.summary(details=args.details))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
