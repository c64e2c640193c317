"""Exactly once across a server process killed mid-run and a Redis restart mid-run.

The store is a ``redis-server`` owned by this module (fsync'd append-only file, so it can
be restarted without losing state; never the machine's Redis). The first server is a real
process (``uvicorn --factory a2a_secure.server.run:app_from_env``) killed with SIGKILL while
its handler runs; the servers after it are fresh in-process apps on the same key and store.
A resend of the intent (same ``intent_id``, another session) must never run it again: it
gets 503 "still running" while the dead run's bound lasts, then a signed "outcome unknown".
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
import redis.asyncio as redis_asyncio
from redis.maint_notifications import MaintNotificationsConfig
from redis_helpers import COUNTER_KEY_ENV, COUNTER_URL_ENV, OwnedRedis, free_port
from test_multiworker import handshake, send
from worker_helpers import TESTS_DIR, start_worker, wait_healthy

from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app

IID = "restart-proof-intent-id-01"


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnedRedis]:
    redis = OwnedRedis(tmp_path_factory.mktemp("eo-redis"), persist=True)
    redis.start()
    try:
        yield redis
    finally:
        redis.kill()


def count(url: str, key: str) -> int:
    r = redis_sync.Redis.from_url(url, socket_timeout=2.0)
    try:
        return int(r.get(key) or 0)
    finally:
        r.close()


def fresh_server(
    server_id: Identity, owned: OwnedRedis, prefix: str, *, clock_offset: float = 0.0, **limits: Any
) -> AgentServer:
    """A new server process's app: same key, same store, nothing in memory."""
    server = AgentServer(
        server_id,
        store=RedisStore(owned.url, prefix=prefix, socket_timeout=1.0),
        limits=ServerLimits(replay_wait_seconds=0.2, **limits),
        clock=lambda: time.time() + clock_offset,
    )
    counter = redis_asyncio.Redis.from_url(
        owned.url, socket_timeout=2.0, maint_notifications_config=MaintNotificationsConfig(enabled=False)
    )
    key = os.environ[COUNTER_KEY_ENV]

    # redis_helpers.register_counting's echo, with a counter client the test closes.
    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        await counter.incr(key)
        await asyncio.sleep(float(inputs.get("sleep", 0)))
        return inputs

    server.counter = counter  # type: ignore[attr-defined]
    return server


async def close(server: AgentServer) -> None:
    await server.store.aclose()
    await server.counter.aclose()  # type: ignore[attr-defined]


async def test_a_server_killed_mid_run_never_runs_the_intent_again(
    owned: OwnedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_id = Identity.generate("eo-restart")
    key_file = tmp_path / "server.key"
    server_id.save(key_file)
    prefix = f"eo:{uuid.uuid4().hex}:"
    counter = prefix + "executions"
    monkeypatch.setenv(COUNTER_URL_ENV, owned.url)
    monkeypatch.setenv(COUNTER_KEY_ENV, counter)
    env = {
        **os.environ,
        "A2A_SECURE_KEY_FILE": str(key_file),
        "A2A_SECURE_REDIS_URL": owned.url,
        "A2A_SECURE_REDIS_PREFIX": prefix,
        "A2A_SECURE_APP": "redis_helpers:register_counting",
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p),
    }
    env.pop("A2A_SECURE_AUDIT_LOG", None)
    port = free_port()
    log = tmp_path / "server.log"
    proc = start_worker(port, env, log)
    url = f"http://127.0.0.1:{port}"
    client = Identity.generate("eo-restart-client")
    intent = {"goal": "echo", "inputs": {"sleep": 5, "tag": "dies"}, "intent_id": IID}
    try:
        wait_healthy(url, proc, log, server_id.did)
        async with httpx.AsyncClient(timeout=10) as http:
            s1 = await handshake(http, [url], client, server_id.did)
            req1 = s1.prepare_intent(intent)
            first = asyncio.ensure_future(send(http, url, req1))
            for _ in range(200):  # until the handler has started
                if count(owned.url, counter) == 1:
                    break
                await asyncio.sleep(0.02)
            assert count(owned.url, counter) == 1
            os.kill(proc.pid, signal.SIGKILL)  # the worker dies mid-run
            proc.wait(10)
            with pytest.raises(httpx.HTTPError):
                await first

            # A fresh process on the same store: the session is still there (Redis), the
            # claim is RUNNING: "still running", never a second run.
            b = fresh_server(server_id, owned, prefix)
            async with serve_app(b.app()) as url_b:
                s2 = await handshake(http, [url_b], client, server_id.did)
                req2 = s2.prepare_intent(intent)
                resp = await send(http, url_b, req2)
                assert resp.status_code == 503, resp.text
                err = s2.error_from_reply(req2, resp.json()["error"])
                assert err.signed and err.code == -32048 and "still running" in err.message
                # The old session's byte-identical retry is still in progress, not re-run.
                resp = await send(http, url_b, req1)
                assert resp.status_code == 503
            assert count(owned.url, counter) == 1

            # Past the dead run's bound (30 s handler maximum + 60 s margin): outcome unknown.
            c = fresh_server(server_id, owned, prefix, clock_offset=95)
            async with serve_app(c.app()) as url_c:
                s3 = await handshake(http, [url_c], client, server_id.did)
                s3._clock = lambda: time.time() + 95  # type: ignore[method-assign]
                req3 = s3.prepare_intent(intent)
                resp = await send(http, url_c, req3)
                assert resp.status_code == 504, resp.text
                err = s3.error_from_reply(req3, resp.json()["error"])
                assert err.signed and err.code == -32049 and "outcome unknown" in err.message
            assert count(owned.url, counter) == 1
            for server in (b, c):
                await close(server)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


async def test_a_redis_restart_mid_run_never_runs_the_intent_again(
    owned: OwnedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_id = Identity.generate("eo-redis-restart")
    prefix = f"eo:{uuid.uuid4().hex}:"
    counter = prefix + "executions"
    monkeypatch.setenv(COUNTER_URL_ENV, owned.url)
    monkeypatch.setenv(COUNTER_KEY_ENV, counter)
    client = Identity.generate("eo-redis-client")
    server = fresh_server(server_id, owned, prefix)
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=15) as http:
        s1 = await handshake(http, [url], client, server_id.did)
        answers = []
        for attempt, (sleep, restart_at) in enumerate(((1.5, 0.2), (0.3, 0.5))):
            # First: Redis restarts while the handler runs (it is back before the answer);
            # then: Redis restarts just as the answer is being stored.
            intent = {
                "goal": "echo",
                "inputs": {"sleep": sleep, "n": attempt},
                "intent_id": IID + str(attempt),
            }
            req = s1.prepare_intent(intent)
            first = asyncio.ensure_future(send(http, url, req))
            await asyncio.sleep(restart_at)
            await asyncio.to_thread(owned.restart)
            resp = await first
            # The run's answer reaches the caller even if the store could not keep it.
            assert resp.status_code == 200, resp.text
            answers.append(s1.verify_result(req, resp.json()["result"]).result)
            assert count(owned.url, counter) == attempt + 1
            # A resend on a new session: the one run's answer, or (if the store lost the
            # answer) "still running" / "outcome unknown", never a second run.
            for _ in range(3):
                try:
                    s2 = await handshake(http, [url], client, server_id.did)
                    break
                except AssertionError:  # the store's first command after the restart
                    await asyncio.sleep(0.2)
            req2 = s2.prepare_intent(intent)
            resp2 = await send(http, url, req2)
            if resp2.status_code == 200:
                assert s2.verify_result(req2, resp2.json()["result"]).result == answers[-1]
            else:
                err = s2.error_from_reply(req2, resp2.json()["error"])
                assert err.signed and err.code in (-32048, -32049), json.dumps(resp2.json())
            assert count(owned.url, counter) == attempt + 1
    await close(server)
