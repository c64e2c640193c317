"""Intent priority with two worker processes sharing Redis (PROTOCOL.md §12.3).

The rights come from the same configuration on every worker, so a caller without the right
is refused on both. The concurrency limit and the queue belong to each process: a
priority-5 intent interrupts only an intent running on the worker it reaches, and runs at
once on a worker with a free slot. Both workers serve ``priority_helpers:register_traced``
with ``max_concurrent_intents`` 1, which logs to Redis what each handler did and in which
process.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis as redis_sync
from redis_helpers import COUNTER_KEY_ENV, COUNTER_URL_ENV, delete_prefix, redis_url  # noqa: F401
from test_multiworker import client_identity, error_of, handshake, send
from worker_helpers import serve_workers

from a2a_secure.errors import IntentTimeout
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.priority import INTERRUPTED_MESSAGE


@dataclass
class Workers:
    urls: list[str]
    server: Identity
    high: Identity
    redis_url: str
    events_key: str

    def events(self) -> list[str]:
        r = redis_sync.Redis.from_url(self.redis_url, socket_timeout=2.0)
        try:
            return [e.decode() for e in r.lrange(self.events_key, 0, -1)]
        finally:
            r.close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Workers]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("priority-workers")
    server = Identity.generate("prio-mw-server")
    high = Identity.generate("prio-mw-high")
    # One file: the negotiated policy, and the server's own scheduling settings (never sent).
    policy = {
        "rate_limit": 1000,
        "priority_rights": {"default": 3, "per_did": {high.did: 5}},
        "max_concurrent_intents": 1,
        "max_queued_intents": 4,
    }
    prefix = f"a2a-test:prio-mw:{uuid.uuid4().hex}:"
    try:
        with serve_workers(
            tmp,
            server,
            policy,
            store_url=redis_url,
            prefix=prefix,
            app="priority_helpers:register_traced",
            extra_env={COUNTER_URL_ENV: redis_url, COUNTER_KEY_ENV: prefix + "events"},
        ) as (urls, _procs):
            yield Workers(urls, server, high, redis_url, prefix + "events")
    finally:
        delete_prefix(redis_url, prefix)


async def wait_until(predicate: object, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_caller_without_the_right_is_refused_on_both_workers(workers: Workers) -> None:
    a, b = workers.urls
    async with httpx.AsyncClient(timeout=10) as http:
        low = await handshake(http, [a, b], client_identity("prio-low"), workers.server.did)
        for url in (a, b, a):
            req = low.prepare_intent({"goal": "work", "inputs": {"tag": "denied"}, "priority": 5})
            resp = await send(http, url, req)
            assert error_of(resp) == (403, -32042)
            assert low.error_from_reply(req, resp.json()["error"]).signed
        high = await handshake(http, [b, a], workers.high, workers.server.did)
        for url in (a, b):
            intent = {"goal": "work", "inputs": {"tag": f"allowed-{url[-5:]}"}, "priority": 5}
            req = high.prepare_intent(intent)
            resp = await send(http, url, req)
            assert resp.status_code == 200, resp.text
            assert high.verify_result(req, resp.json()["result"]).result["priority"] == 5
    assert not any(e.startswith("start:denied:") for e in workers.events())


async def test_priority_5_interrupts_only_on_the_worker_running_the_long_intent(workers: Workers) -> None:
    a, b = workers.urls
    async with httpx.AsyncClient(timeout=30) as http:
        low = await handshake(http, [a], client_identity("prio-victim"), workers.server.did)
        high = await handshake(http, [b], workers.high, workers.server.did)
        long_req = low.prepare_intent({"goal": "work", "inputs": {"tag": "long", "seconds": 20}})
        victim = asyncio.create_task(send(http, a, long_req))
        await wait_until(lambda: any(e.startswith("start:long:") for e in workers.events()))
        long_pid = next(e for e in workers.events() if e.startswith("start:long:")).rsplit(":", 1)[1]

        # Worker B has its own slot: a priority-5 intent there runs at once, interrupting nothing.
        req = high.prepare_intent({"goal": "work", "inputs": {"tag": "on-b"}, "priority": 5})
        resp = await send(http, b, req)
        on_b = high.verify_result(req, resp.json()["result"]).result
        assert str(on_b["pid"]) != long_pid
        assert not victim.done() and not any(e.startswith("cancelled:") for e in workers.events())

        # On worker A it takes the slot of the long intent, whose caller gets the signed error.
        req = high.prepare_intent({"goal": "work", "inputs": {"tag": "on-a"}, "priority": 5})
        resp = await send(http, a, req)
        on_a = high.verify_result(req, resp.json()["result"]).result
        assert str(on_a["pid"]) == long_pid
        resp = await victim
        assert resp.status_code == 504
        err = low.error_from_reply(long_req, resp.json()["error"])
        assert isinstance(err, IntentTimeout) and err.signed and err.message == INTERRUPTED_MESSAGE
        # The stored answer is shared: a byte-identical retry at worker B gets the same error.
        retry = await send(http, b, long_req)
        assert retry.status_code == 504 and retry.json()["error"] == resp.json()["error"]
    events = [e for e in workers.events() if ":long:" in e or ":on-a:" in e]
    assert events == [
        f"start:long:{long_pid}",
        f"cancelled:long:{long_pid}",
        f"start:on-a:{long_pid}",
        f"finish:on-a:{long_pid}",
    ]
