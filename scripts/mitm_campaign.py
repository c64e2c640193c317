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

Exits 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mitm_helpers import run_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="number of runs (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="campaign seed (default 1)")
    parser.add_argument("--ops", type=int, default=5, help="operations per client and run (default 5)")
    parser.add_argument("--details", action="store_true", help="also print every mutation sub-kind")
    parser.add_argument("--stop", action="store_true", help="stop at the first run with a violation")
    args = parser.parse_args()
    report = asyncio.run(
        run_campaign(args.seed, args.runs, ops_per_client=args.ops, stop_on_violation=args.stop)
    )
    print(report.summary(details=args.details))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
