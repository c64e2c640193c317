"""``a2a-secure serve --redis-wait-replicas N [--redis-wait-timeout-ms MS]``: Redis WAIT from serve.

The options reach every worker as ``A2A_SECURE_REDIS_WAIT_REPLICAS`` and
``A2A_SECURE_REDIS_WAIT_TIMEOUT_MS`` (the ``wait_replicas`` and ``wait_timeout_ms`` of the
``RedisStore``). Checked here with the real command:

* argument errors are usage errors: exit code 2, one error line, no traceback, nothing started;
* a worker given a bad value in its environment stops at start-up, naming the variable;
* against the shared Redis, which has no replica, ``--redis-wait-replicas 1`` answers every
  intent 503 with Retry-After and never runs its handler, and ``0`` runs it;
* against a Redis of the test's own with one replica, ``--redis-wait-replicas 1`` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as redis_sync
from redis_helpers import COUNTER_KEY_ENV, COUNTER_URL_ENV, OwnedRedis, free_port, redis_prefix, redis_url  # noqa: F401
from test_multiworker import client_identity, error_of, handshake, send
from worker_helpers import TESTS_DIR, start_worker, stop_group, wait_healthy

from a2a_secure.identity.keys import Identity
from a2a_secure.server.run import app_from_env

REPO = TESTS_DIR.parent
SERVER = Identity.generate("serve-wait")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_SECURE_") or "_TEST_" in k}
    path = os.pathsep.join(p for p in (str(TESTS_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, **extra}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "server.key"
    SERVER.save(path)
    return path


# -- argument errors ------------------------------------------------------------------------------
REDIS = ["--redis-url", "redis://127.0.0.1:1"]  # never reached: the arguments are refused first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-wait-replicas", "1"], "a2a-secure: error: --redis-wait-replicas needs --redis-url"),
        (["--redis-wait-replicas", "0"], "a2a-secure: error: --redis-wait-replicas needs --redis-url"),
        (["--redis-prefix", "p:"], "a2a-secure: error: --redis-prefix needs --redis-url"),
        (
            [*REDIS, "--redis-wait-timeout-ms", "50"],
            "a2a-secure: error: --redis-wait-timeout-ms needs --redis-wait-replicas",
        ),
        (
            [*REDIS, "--redis-wait-replicas", "x"],
            "a2a-secure serve: error: argument --redis-wait-replicas: "
            "must be an integer from 0 to 1000, not 'x'",
        ),
        (
            [*REDIS, "--redis-wait-replicas", "-1"],
            "a2a-secure serve: error: argument --redis-wait-replicas: "
            "must be an integer from 0 to 1000, not '-1'",
        ),
        (
            [*REDIS, "--redis-wait-replicas", "1.0"],
            "a2a-secure serve: error: argument --redis-wait-replicas: "
            "must be an integer from 0 to 1000, not '1.0'",
        ),
        (
            [*REDIS, "--redis-wait-replicas", "1", "--redis-wait-timeout-ms", "0"],
            "a2a-secure serve: error: argument --redis-wait-timeout-ms: "
            "must be an integer from 1 to 800, not '0'",
        ),
        (
            [*REDIS, "--redis-wait-replicas", "1", "--redis-wait-timeout-ms", "5000"],
            "a2a-secure serve: error: argument --redis-wait-timeout-ms: "
            "must be an integer from 1 to 800, not '5000'",
        ),
        (["--workers", "2"], "a2a-secure: error: --workers > 1 needs --redis-url"),
    ],
)
def test_argument_errors_are_usage_errors(
    key_file: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "a2a_secure", "serve", "--key-file", str(key_file), "--port", "1", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    # argparse's own errors come after the usage lines; the error itself is one line.
    assert lines[-1].startswith(message), done.stderr
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"A2A_SECURE_REDIS_WAIT_REPLICAS": "1"},
            "A2A_SECURE_REDIS_WAIT_REPLICAS needs A2A_SECURE_REDIS_URL",
        ),
        (
            {"A2A_SECURE_REDIS_URL": "redis://127.0.0.1:1", "A2A_SECURE_REDIS_WAIT_REPLICAS": "one"},
            "A2A_SECURE_REDIS_WAIT_REPLICAS must be an integer from 0 to 1000, not 'one'",
        ),
        (
            {"A2A_SECURE_REDIS_URL": "redis://127.0.0.1:1", "A2A_SECURE_REDIS_WAIT_REPLICAS": "-2"},
            "A2A_SECURE_REDIS_WAIT_REPLICAS must be an integer from 0 to 1000, not '-2'",
        ),
        (
            {
                "A2A_SECURE_REDIS_URL": "redis://127.0.0.1:1",
                "A2A_SECURE_REDIS_WAIT_REPLICAS": "1",
                "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS": "1e3",
            },
            "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS must be an integer from 1 to 800, not '1e3'",
        ),
        (
            {"A2A_SECURE_REDIS_URL": "redis://127.0.0.1:1", "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS": "200"},
            "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS needs A2A_SECURE_REDIS_WAIT_REPLICAS",
        ),
    ],
)
def test_bad_environment_values_stop_the_worker_factory(
    key_file: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        app_from_env({"A2A_SECURE_KEY_FILE": str(key_file), **env})
    assert str(info.value) == message


def test_a_worker_with_a_bad_value_stops_at_start_up(key_file: Path, tmp_path: Path) -> None:
    env = _env(
        A2A_SECURE_KEY_FILE=str(key_file),
        A2A_SECURE_REDIS_URL="redis://127.0.0.1:1",
        A2A_SECURE_REDIS_WAIT_REPLICAS="1.5",
    )
    log = tmp_path / "worker.log"
    proc = start_worker(free_port(), env, log)
    try:
        assert proc.wait(30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert "A2A_SECURE_REDIS_WAIT_REPLICAS must be an integer from 0 to 1000, not '1.5'" in log.read_text()


# -- the real command against Redis ------------------------------------------------------------------
@contextlib.contextmanager
def serving(
    key_file: Path, tmp: Path, store_url: str, prefix: str, counter_url: str, *args: str
) -> Iterator[tuple[str, Path]]:
    """``a2a-secure serve`` on the store at ``store_url`` with ``args``: (its URL, its log).

    Its ``echo`` INCRs ``<prefix>executions`` at ``counter_url`` each time it runs.
    """
    port = free_port()
    argv = [
        sys.executable, "-m", "a2a_secure", "serve", "--key-file", str(key_file), "--port", str(port),
        "--redis-url", store_url, "--redis-prefix", prefix, "--app", "redis_helpers:register_counting",
        *args,
    ]  # fmt: skip
    env = _env(**{COUNTER_URL_ENV: counter_url, COUNTER_KEY_ENV: f"{prefix}executions"})
    log = tmp / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, SERVER.did)
        yield url, log
    finally:
        stop_group(proc)


def executions(counter_url: str, prefix: str) -> int:
    r = redis_sync.Redis.from_url(counter_url, socket_timeout=2.0)
    try:
        return int(r.get(f"{prefix}executions") or 0)
    finally:
        r.close()


def replicas_of(url: str) -> int:
    r = redis_sync.Redis.from_url(url, socket_timeout=2.0)
    try:
        return int(r.info("replication")["connected_slaves"])
    finally:
        r.close()


def in_sync(replica_url: str) -> bool:
    r = redis_sync.Redis.from_url(replica_url, socket_timeout=2.0)
    try:
        return r.info("replication").get("master_link_status") == "up"
    finally:
        r.close()


async def test_wait_for_a_replica_that_does_not_exist_refuses_before_running(
    key_file: Path,
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    if replicas_of(redis_url) != 0:
        pytest.skip(f"the Redis at {redis_url} has a replica: WAIT 1 would be acknowledged")
    wait = ["--redis-wait-replicas", "1", "--redis-wait-timeout-ms", "50"]
    with serving(key_file, tmp_path, redis_url, redis_prefix, redis_url, *wait) as (url, log):
        async with httpx.AsyncClient(timeout=10) as http:
            sess = await handshake(http, [url], client_identity("wait"), SERVER.did)
            req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 1}})
            # Refused before running; its sequence stays consumed without an answer, so the
            # same bytes again wait for that answer (replay_wait_seconds) and get 503 too.
            for message in ("shared store unavailable", "the original request is still running"):
                resp = await send(http, url, req)
                assert error_of(resp) == (503, -32048), resp.text
                assert resp.json()["error"]["message"] == message
                assert int(resp.headers["Retry-After"]) >= 1
            for i in (2, 3):  # a new sequence: refused too
                resp = await send(http, url, sess.prepare_intent({"goal": "echo", "inputs": {"i": i}}))
                assert error_of(resp) == (503, -32048), resp.text
        assert executions(redis_url, redis_prefix) == 0
        await asyncio.sleep(0.2)  # the worker's log is written
        assert "WAIT: fewer than 1 replica(s) acknowledged in time" in log.read_text()


async def test_wait_replicas_zero_runs_the_intent(
    key_file: Path,
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    no_wait = ["--redis-wait-replicas", "0"]
    with serving(key_file, tmp_path, redis_url, redis_prefix, redis_url, *no_wait) as (url, _):
        async with httpx.AsyncClient(timeout=10) as http:
            sess = await handshake(http, [url], client_identity("nowait"), SERVER.did)
            req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 1}})
            resp = await send(http, url, req)
            assert resp.status_code == 200, resp.text
            assert sess.verify_result(req, resp.json()["result"]).result == {"i": 1}
    assert executions(redis_url, redis_prefix) == 1


async def test_wait_for_a_replica_that_exists_runs_the_intent_once(
    key_file: Path,
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = OwnedRedis(tmp_path / "primary")
    replica = OwnedRedis(tmp_path / "replica", args=("--replicaof", "127.0.0.1", str(primary.port)))
    with primary, replica:
        deadline = time.monotonic() + 10
        while not in_sync(replica.url):
            assert time.monotonic() < deadline, "the replica did not sync"
            await asyncio.sleep(0.05)
        wait = ["--redis-wait-replicas", "1", "--redis-wait-timeout-ms", "800"]  # a loaded machine
        with serving(key_file, tmp_path, primary.url, redis_prefix, redis_url, *wait) as (url, _):
            async with httpx.AsyncClient(timeout=10) as http:
                sess = await handshake(http, [url], client_identity("replica"), SERVER.did)
                for i in range(3):
                    req = sess.prepare_intent({"goal": "echo", "inputs": {"i": i}})
                    resp = await send(http, url, req)
                    assert resp.status_code == 200, resp.text
                    assert sess.verify_result(req, resp.json()["result"]).result == {"i": i}
                    again = await send(http, url, req)  # the same bytes: the stored answer
                    assert again.status_code == 200 and again.json()["result"] == resp.json()["result"]
    assert executions(redis_url, redis_prefix) == 3
