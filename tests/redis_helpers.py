"""Redis for the tests: the shared server, test-owned servers, and the skip-or-fail rule.

Tests that need Redis SKIP with a clear reason when it is unreachable, and FAIL instead when
``A2A_SECURE_REQUIRE_REDIS=1`` (CI sets it, so a missing Redis cannot pass silently).

* ``redis_url`` (fixture): the shared Redis (``A2A_SECURE_TEST_REDIS_URL``, default
  ``redis://127.0.0.1:6379/0``), pinged once per session;
* ``redis_prefix`` (fixture): a fresh key prefix per test; every key under it is deleted
  afterwards;
* :class:`OwnedRedis`: a ``redis-server`` started by the test on a free port, which the test
  may kill and restart (same port, same data directory);
* :func:`register_counting` is an ``A2A_SECURE_APP`` target for server subprocesses: an
  ``echo`` whose every execution INCRs a Redis key, so tests can count executions across
  processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

REDIS_URL = os.environ.get("A2A_SECURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_ENV = "A2A_SECURE_REQUIRE_REDIS"


def redis_required() -> bool:
    """Whether a missing Redis must fail the test run instead of skipping."""
    return os.environ.get(REQUIRE_ENV, "") == "1"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it when ``A2A_SECURE_REQUIRE_REDIS=1``."""
    if redis_required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def ping(url: str, timeout: float = 1.0) -> str | None:
    """None when Redis at ``url`` answers PING, else why not."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install 'a2a-secure[redis]')"
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis URL, or skip/fail when it does not answer."""
    why = ping(REDIS_URL)
    if why is not None:
        skip_or_fail(f"Redis at {REDIS_URL} is unreachable: {why}")
    return REDIS_URL


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` at ``url``; how many were deleted."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        keys = list(client.scan_iter(match=prefix.replace("[", "\\[") + "*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix for one test; its keys are deleted afterwards."""
    # Unique per test, and naming the pytest-xdist worker (gw0, gw1…) that owns the keys.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    prefix = f"a2a-test:{worker}:{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        with contextlib.suppress(Exception):
            delete_prefix(redis_url, prefix)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_server_binary() -> str:
    """The ``redis-server`` executable, or skip/fail."""
    path = shutil.which("redis-server")
    if path is None:
        skip_or_fail("redis-server is not on PATH")
    return path


class OwnedRedis:
    """A ``redis-server`` owned by one test: start, kill (SIGKILL), restart on the same port.

    ``persist=True`` turns on the append-only file with ``appendfsync always`` in ``workdir``,
    so a killed server comes back with every acknowledged write; otherwise nothing is saved.
    ``args`` are added to the command line (``("--replicaof", "127.0.0.1", "6380")``).
    """

    def __init__(
        self, workdir: Path, *, persist: bool = False, port: int | None = None, args: Sequence[str] = ()
    ) -> None:
        self.binary = redis_server_binary()
        self.workdir = workdir
        self.persist = persist
        self.port = port or free_port()
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        if self.persist:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        args += self.args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        why: str | None = "not started"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            why = ping(self.url, timeout=0.5)
            if why is None:
                return
            time.sleep(0.02)
        self.kill()
        log = self.workdir / "redis.log"
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        skip_or_fail(f"test-owned redis-server on port {self.port} did not start: {why} {tail}")

    def kill(self) -> None:
        """SIGKILL the server and wait for it (the port is then free again)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def __enter__(self) -> OwnedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# -- an A2A_SECURE_APP target for server subprocesses ------------------------------------------------
COUNTER_URL_ENV = "A2A_TEST_COUNTER_URL"
COUNTER_KEY_ENV = "A2A_TEST_COUNTER_KEY"


def register_counting(server: Any) -> None:
    """Register ``echo`` (result = inputs) that INCRs ``$A2A_TEST_COUNTER_KEY`` per execution.

    ``echo`` sleeps ``inputs["sleep"]`` seconds (if given) after counting, so that retries
    arrive while the original still runs.
    """
    import asyncio

    import redis.asyncio as redis_asyncio
    from redis.maint_notifications import MaintNotificationsConfig

    client = redis_asyncio.Redis.from_url(
        os.environ[COUNTER_URL_ENV],
        socket_timeout=30.0,  # a loaded machine: a handler's count must not fail the run
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    key = os.environ[COUNTER_KEY_ENV]

    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        await client.incr(key)
        sleep = inputs.get("sleep")
        if isinstance(sleep, int | float) and 0 < sleep <= 5:
            await asyncio.sleep(sleep)
        return inputs
