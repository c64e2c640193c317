"""The examples and the demo as a newcomer runs them.

``examples/host_agents.py`` must leave the committed ``examples/agent_registry.json`` alone
(it writes the registry of the agents it hosts beside their keys), and ``orchestrator.py``
calls them through that registry. ``a2a-secure demo --trace --out DIR`` keeps its
``events.jsonl`` once it has ended, and names the extras it needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import REPO, cli_env, run_cli
from redis_helpers import free_port
from worker_helpers import stop_group

TRACKED = REPO / "examples" / "agent_registry.json"


def three_free_ports() -> int:
    """A base port N such that N, N+1 and N+2 are free (host_agents.py serves on all three)."""
    for _ in range(50):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in (base, base + 1, base + 2):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError("no three consecutive free ports on 127.0.0.1")


def wait_listening(ports: list[int], proc: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    """Wait until each port accepts a connection; fail with the server's log if it stops."""
    deadline = time.monotonic() + seconds
    for port in ports:
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, (
                f"port {port} not listening:\n{log.read_text(errors='replace')}"
            )
            time.sleep(0.05)


def test_host_agents_writes_its_registry_beside_its_keys_not_over_the_committed_one(tmp_path: Path) -> None:
    before = hashlib.sha256(TRACKED.read_bytes()).hexdigest()
    keys = tmp_path / "keys"
    base = three_free_ports()
    log = tmp_path / "host.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "examples" / "host_agents.py"),
                "--port-base",
                str(base),
                "--keys",
                str(keys),
            ],
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "Ctrl-C to stop" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        written = json.loads((keys / "agent_registry.json").read_text())
        assert written["agents"]["translator"]["endpoint"] == f"http://127.0.0.1:{base}"
        wait_listening([base, base + 1, base + 2], proc, log)  # they come up after the file
        asked = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the servers come up after the file is written
            asked = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "examples" / "orchestrator.py"),
                    "--registry",
                    str(keys / "agent_registry.json"),
                ],
                env=cli_env(),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if asked.returncode == 0:
                break
            time.sleep(0.1)
        assert asked is not None and asked.returncode == 0, asked.stderr if asked else ""
        assert "translated:" in asked.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            stop_group(proc)
    assert hashlib.sha256(TRACKED.read_bytes()).hexdigest() == before


def test_demo_trace_keeps_its_event_lines_in_out(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = run_cli("demo", "--trace", "--out", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    events = out / "events.jsonl"
    assert events.is_file() and events.read_text().strip()  # still there after the demo ended
    assert "metrics (Prometheus counters" in done.stdout
    chosen = run_cli("demo", "--trace", timeout=120)  # no --out: a folder it names, kept
    kept = re.search(r"events.jsonl and the audit logs kept in (\S+) \(--out DIR\)", chosen.stderr)
    assert chosen.returncode == 0 and kept is not None, chosen.stderr
    try:
        assert (Path(kept.group(1)) / "events.jsonl").is_file()
    finally:
        shutil.rmtree(kept.group(1), ignore_errors=True)
    help_text = run_cli("demo", "--help").stdout
    assert "a2a-secure[otel,metrics]" in " ".join(help_text.split())
