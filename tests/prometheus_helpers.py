"""A real Prometheus server for the metrics tests, started by the test itself.

Tests that need it SKIP with a clear reason when the ``prometheus`` binary is missing, and
FAIL instead when ``A2A_SECURE_REQUIRE_PROMETHEUS=1`` (CI sets it after installing the
Debian package), as tests/redis_helpers.py does for Redis. The server never runs as a
service: :class:`Prometheus` runs the binary with a temporary configuration, data
directory and free port, scraping the given targets every second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from redis_helpers import free_port

REQUIRE_ENV = "A2A_SECURE_REQUIRE_PROMETHEUS"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it when ``A2A_SECURE_REQUIRE_PROMETHEUS=1``."""
    if os.environ.get(REQUIRE_ENV, "") == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def prometheus_binary() -> str:
    """The path of ``prometheus``, or skip/fail when it is not installed."""
    found = shutil.which("prometheus")
    if found is None:
        skip_or_fail("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    return found


class Prometheus:
    """``prometheus`` on 127.0.0.1, scraping ``targets`` (host:port) at ``/metrics`` each second."""

    def __init__(self, workdir: Path, targets: Sequence[str]) -> None:
        self.binary = prometheus_binary()
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        listed = ", ".join(f"'{t}'" for t in targets)
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: a2a\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{listed}]\n"
        )
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._args = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]

    def __enter__(self) -> Prometheus:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self._args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited:\n{self.log.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        pytest.fail(f"prometheus not ready after 30 s:\n{self.log.read_text(errors='replace')[-3000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (through the HTTP API)."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        resp.raise_for_status()
        body = resp.json()
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def value(self, promql: str) -> float | None:
        """The single value of ``promql`` now, or None when it has no series."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, expected: float, timeout: float = 30) -> None:
        """Wait until ``promql`` evaluates to ``expected`` (scrapes are each second)."""
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            got = self.value(promql)
            if got == expected:
                return
            time.sleep(0.25)
        pytest.fail(f"{promql} = {got}, expected {expected}")
