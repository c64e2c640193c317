"""The fault campaign's CI form: ``scripts/chaos.py --quick --seed 7`` finds no violation.

Real processes on loopback: redis-server deployments of the campaign's own (never the
machine's Redis), ``a2a-secure serve --workers 2`` and the campaign's TCP fault proxy; every
fault kind of the campaign is injected at least once (scripts/chaos.py). About 90 s on two
shared cores. Skips without ``redis-server`` (FAILS under ``A2A_SECURE_REQUIRE_REDIS=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from redis_helpers import redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from chaos import KINDS  # noqa: E402


@pytest.mark.chaos
@pytest.mark.timeout(240)  # about 90 s; more on a loaded machine
def test_quick_campaign_injects_every_fault_and_finds_no_violation(tmp_path: Path) -> None:
    redis_server_binary()  # skip (or fail) without redis-server
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--quick", "--seed", "7", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["violations"] == [], proc.stdout
    assert {k: n for k, n in report["faults"].items() if n == 0} == {}, proc.stdout
    assert set(report["faults"]) == set(KINDS)
    assert report["intents"] > 0 and report["answered"] > 0
    assert proc.returncode == 0, proc.stdout + proc.stderr
