"""The ``a2a-secure`` command run as a person runs it: a child process, real files, real ports.

* :func:`run_cli`: one command to its end (stdout, stderr, exit code);
* :func:`serve_cli`: ``a2a-secure serve`` on a free port of 127.0.0.1, until ``/health``
  answers; stopped (with the workers it started) on exit.

The child imports this worktree's ``a2a_secure`` (``PYTHONPATH``), whatever the venv's
editable install points to.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis_helpers import free_port
from worker_helpers import stop_group

REPO = Path(__file__).resolve().parents[1]


def cli_env(extra: Mapping[str, str] | None = None, *, drop: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a child ``a2a-secure``: this one, this worktree importable first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_SECURE_") and k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def run_cli(
    *argv: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``a2a-secure ARGV`` to its end, its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "a2a_secure", *argv],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line a failed command printed (fails the test on a traceback or more)."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("a2a-secure: error: "), lines[0]
    return lines[0].removeprefix("a2a-secure: error: ")


@dataclass
class Served:
    """A running ``a2a-secure serve``: its base URL, process and output file."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        """What the server printed so far (stdout and stderr)."""
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serve_cli(
    tmp: Path,
    *argv: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    name: str = "serve",
) -> Iterator[Served]:
    """``a2a-secure serve ARGV --port <free>``, healthy, until the block ends."""
    port = free_port()
    log = tmp / f"{name}-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "a2a_secure", "serve", "--port", str(port), *argv],
            cwd=cwd,
            env=cli_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve exited ({proc.returncode}):\n{served.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(served.url + "/health", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"serve not healthy after 30 s:\n{served.output()}")
            time.sleep(0.05)
        yield served
    finally:
        stop_group(proc)
