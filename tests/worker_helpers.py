"""Server worker processes for the multi-process tests.

Each worker is ``python -m uvicorn --factory a2a_secure.server.run:app_from_env`` on its own
port, configured by environment only (key file, policy file, Redis URL and prefix, the
``A2A_SECURE_APP`` that registers its intents), with ``tests/`` importable so that the app
can be one of the helpers here.

* :func:`serve_workers`: start ``count`` workers sharing one identity and store, wait until
  each answers ``/health`` with that identity's DID, stop them on exit;
* :func:`start_worker`, :func:`wait_healthy`, :func:`stop_worker`: one worker, for tests that
  build their own environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_helpers import free_port

from a2a_secure.identity.keys import Identity

TESTS_DIR = Path(__file__).resolve().parent


def start_worker(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """One worker on 127.0.0.1:``port`` with environment ``env``, its output in ``log``."""
    args = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "a2a_secure.server.run:app_from_env",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, did: str) -> None:
    """Wait up to 30 s for ``url`` to answer ``/health`` as ``did``; fail with the log if not."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server {url} exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        with contextlib.suppress(httpx.HTTPError):
            resp = httpx.get(url + "/health", timeout=1.0)
            if resp.status_code == 200:
                assert resp.json()["did"] == did
                return
        time.sleep(0.05)
    pytest.fail(f"server {url} not healthy after 30 s:\n{log.read_text(errors='replace')}")


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (killed if it has not exited within 5 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the process group ``proc`` leads (``start_new_session=True``): a server and
    the workers it started; killed if it has not exited within 10 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@contextlib.contextmanager
def serve_workers(
    tmp: Path,
    server: Identity,
    policy: Mapping[str, Any],
    *,
    store_url: str,
    prefix: str,
    app: str,
    extra_env: Mapping[str, str] | None = None,
    count: int = 2,
) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    """``count`` workers serving ``server`` on the store at ``store_url``: (URLs, processes).

    The key and ``policy`` files, and the workers' logs, go in ``tmp``; every worker uses the
    key prefix ``prefix`` and the app ``app`` (``module:function``), with ``extra_env`` on top
    (what the app itself reads). No audit log is inherited from the test's environment.
    """
    key_file = tmp / "server.key"
    server.save(key_file)
    policy_file = tmp / "policy.json"
    policy_file.write_text(json.dumps(policy))
    env = {
        **os.environ,
        "A2A_SECURE_KEY_FILE": str(key_file),
        "A2A_SECURE_POLICY": str(policy_file),
        "A2A_SECURE_REDIS_URL": store_url,
        "A2A_SECURE_REDIS_PREFIX": prefix,
        "A2A_SECURE_APP": app,
        **(extra_env or {}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p),
    }
    env.pop("A2A_SECURE_AUDIT_LOG", None)
    ports = [free_port() for _ in range(count)]
    logs = [tmp / f"server-{i}.log" for i in range(count)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port, log in zip(ports, logs, strict=True):
            procs.append(start_worker(port, env, log))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, proc, log in zip(urls, procs, logs, strict=True):
            wait_healthy(url, proc, log, server.did)
        yield urls, procs
    finally:
        for proc in procs:
            stop_worker(proc)
