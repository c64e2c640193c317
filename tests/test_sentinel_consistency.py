"""Behind Sentinel: ``wait_replicas`` when a replica stops, and an old primary that comes back.

Each test starts its own Sentinel deployment (a primary, one replica, three sentinels,
``down-after-milliseconds`` 1000; tests/sentinel_helpers.py) and real uvicorn servers in
this process, each with its own :class:`RedisStore` on ``redis+sentinel://`` (two servers
sharing one store are two workers of one agent). Their ``echo`` counts its executions per
marker and per (session, sequence), so a second run of anything is seen.

* a replica that stops (SIGSTOP) with ``wait_replicas=1``: 503 with Retry-After, the handler
  never called, and service again on a new sequence once it resumes;
* a primary frozen (SIGSTOP) until Sentinel promotes its replica, then resumed (SIGCONT):
  it still believes it is the primary for about 10 s, until the sentinels demote it. With
  ``wait_replicas=1`` nothing it accepts in that time is acknowledged (it has no replica
  left), so nothing runs on it and nothing acknowledged is lost; a worker that stayed idle
  through the freeze, its pooled connections still open to the old primary, must not
  serve a session from there (it would run again a request the new primary has answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from sentinel_helpers import LocalSentinel
from test_multiworker import client_identity, error_of, handshake, send

from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app

PREFIX = "sc:"


@dataclass
class Runs:
    """Executions of ``echo``: per marker and per (session, sequence)."""

    markers: Counter[str] = field(default_factory=Counter)
    sequences: Counter[tuple[str, int]] = field(default_factory=Counter)

    def total(self) -> int:
        return sum(self.markers.values())

    def twice(self) -> list[Any]:
        return [m for m, n in self.markers.items() if n != 1] + [
            s for s, n in self.sequences.items() if n != 1
        ]


def agent(server: Identity, store: RedisStore, runs: Runs) -> AgentServer:
    """One worker: ``server`` on ``store``, an ``echo`` that counts its runs."""
    app = AgentServer(
        server,
        Policy(rate_limit=100_000),
        store=store,
        # A retry of a request whose answer is not there yet waits 0.3 s, not 5, for it.
        limits=ServerLimits(replay_wait_seconds=0.3),
    )

    @app.intent("echo")
    async def echo(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        runs.markers[str(inputs.get("marker"))] += 1
        runs.sequences[(ctx.session_id, ctx.sequence)] += 1
        return inputs

    return app


@contextlib.asynccontextmanager
async def workers(
    sentinels: LocalSentinel, count: int, runs: Runs, **options: Any
) -> AsyncIterator[tuple[list[str], Identity, list[RedisStore]]]:
    """``count`` uvicorn servers of one identity, each with its own store: (URLs, identity, stores)."""
    server = Identity.generate("sentinel-consistency")
    stores = [RedisStore(sentinels.url, prefix=PREFIX, **options) for _ in range(count)]
    urls: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        try:
            for store in stores:
                urls.append(await stack.enter_async_context(serve_app(agent(server, store, runs).app())))
            yield urls, server, stores
        finally:
            for store in stores:
                await store.aclose()


@pytest.fixture
def sentinels(tmp_path: Path) -> Any:
    deployment = LocalSentinel(tmp_path)
    deployment.start()
    try:
        yield deployment
    finally:
        deployment.stop()


def replica_port(sentinels: LocalSentinel) -> int:
    (port,) = (p for p in sentinels.servers if p != sentinels.first_primary)
    return port


def unavailable(sess: ClientSession, req: PreparedRequest, resp: httpx.Response) -> None:
    """``resp`` is 503 -32048 with Retry-After, signed by the server over ``req``."""
    assert error_of(resp) == (503, -32048), resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    # The request's signature was verified before the store was asked: the error is signed.
    assert sess.error_from_reply(req, resp.json()["error"]).signed


async def answered(http: httpx.AsyncClient, url: str, sess: ClientSession, req: PreparedRequest) -> Any:
    """Send ``req`` to ``url``: it must be answered 200 with a verified result; the result."""
    resp = await send(http, url, req)
    assert resp.status_code == 200, resp.text
    return sess.verify_result(req, resp.json()["result"]).result


# -- a replica stops: wait_replicas=1 ----------------------------------------------------------------------
async def test_wait_replicas_behind_sentinel(sentinels: LocalSentinel) -> None:
    runs = Runs()
    replica = replica_port(sentinels)
    async with (
        workers(sentinels, 1, runs, wait_replicas=1, wait_timeout_ms=300, finish_linger=None) as (
            (url,),
            server,
            (store,),
        ),
        httpx.AsyncClient(timeout=10) as http,
    ):
        sess = await handshake(http, [url], client_identity("wait"), server.did)
        key = store._k_session(sess.session_id)
        r = redis_sync.Redis(port=replica, socket_timeout=2.0)
        try:
            # Normal operation: when the answer comes back, the replica holds the consumed
            # sequence and the stored answer (finish_linger=None: written and waited for
            # before the reply).
            for i in range(1, 4):
                req = sess.prepare_intent({"goal": "echo", "inputs": {"marker": f"w{i}"}})
                assert await answered(http, url, sess, req) == {"marker": f"w{i}"}
                assert r.hget(key, "l") == str(req.sequence).encode()
                assert r.hget(key, "y") is not None
            assert runs.total() == 3

            # The replica stops: every new request is refused before its intent runs.
            sentinels.freeze(replica)
            try:
                frozen = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "frozen"}})
                for _ in range(3):  # the retries too (the sequence is consumed: "still running")
                    unavailable(sess, frozen, await send(http, url, frozen))
                other = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "frozen-2"}})
                unavailable(sess, other, await send(http, url, other))
                assert runs.total() == 3  # the handler was never called
            finally:
                sentinels.thaw(replica)

            # The replica is back: a request refused while it was stopped never runs (its
            # sequence stays consumed without an answer: "still running", or stale once a
            # later one was consumed); a new sequence is served.
            deadline = time.monotonic() + 10
            while sentinels.info(replica).get("master_link_status") != "up":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            unavailable(sess, other, await send(http, url, other))
            stale = await send(http, url, frozen)
            assert error_of(stale) == (409, -32044)
            assert sess.error_from_reply(frozen, stale.json()["error"]).signed
            after = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "after"}})
            assert await answered(http, url, sess, after) == {"marker": "after"}
            assert r.hget(key, "l") == str(after.sequence).encode()
            assert runs.total() == 4 and not runs.twice()
            assert "frozen" not in runs.markers and "frozen-2" not in runs.markers
        finally:
            r.close()


# -- an old primary comes back ------------------------------------------------------------------------------
async def test_idle_worker_does_not_serve_from_the_old_primary(sentinels: LocalSentinel) -> None:
    """Without wait_replicas: a worker idle through the failover asks the sentinels again.

    Worker B serves a session, then stays idle while the primary is frozen, promoted away
    from and resumed; worker A serves the next request on the new primary meanwhile. The
    resumed old primary still says it is the primary (for about 10 s), and B's pooled
    connections are still open to it: B must not read the session's state there, where the
    request A answered is unknown and would run a second time.
    """
    runs = Runs()
    old = sentinels.first_primary
    async with (
        workers(sentinels, 2, runs, finish_linger=None) as ((a, b), server, _stores),
        httpx.AsyncClient(timeout=10) as http,
    ):
        sess = await handshake(http, [b], client_identity("idle"), server.did)
        first = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "first"}})
        await answered(http, b, sess, first)

        sentinels.freeze(old)
        try:
            new = await asyncio.to_thread(sentinels.wait_failover, old, 20.0)
            second = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "second"}})
            deadline = time.monotonic() + 10
            while True:  # A's connection to the frozen primary times out: 503, then the new one
                resp = await send(http, a, second)
                if resp.status_code == 200:
                    break
                unavailable(sess, second, resp)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            result = sess.verify_result(second, resp.json()["result"]).result
        finally:
            sentinels.thaw(old)
        assert sentinels.info(old).get("role") == "master"  # resumed, and not demoted yet

        # The retry of the answered request, at B: the stored answer, not a second run.
        again = await send(http, b, second)
        assert again.status_code == 200, again.text
        assert again.json()["result"] == resp.json()["result"] and result == {"marker": "second"}
        # B serves the next sequence where A can see it.
        third = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "third"}})
        await answered(http, b, sess, third)
        assert (await send(http, a, third)).json()["result"]["result"] == {"marker": "third"}
        assert sentinels.info(old).get("role") == "master"  # all of it before the demotion
        assert runs.markers == Counter({"first": 1, "second": 1, "third": 1}), runs.markers
        assert not runs.twice()
        assert new != old


@dataclass
class Sent:
    """One intent of a client under load, and what came of it."""

    req: PreparedRequest
    body: Any = None  # the JSON "result" member of its 200 answer
    answered_at: float | None = None


async def load(
    http: httpx.AsyncClient,
    urls: list[str],
    sess: ClientSession,
    name: str,
    sent: list[Sent],
    state: dict[str, Any],
) -> None:
    """Intents ``name-1``, ``name-2``… to ``urls`` in turn until ``state["stop"]``, kept in ``sent``.

    A request answered 503 (-32048, Retry-After, signed) is sent again byte for byte for 3 s,
    then given up, and the next sequence is used; any other answer fails the test.
    """
    while not state["stop"]:
        marker = f"{name}-{len(sent) + 1}"
        one = Sent(sess.prepare_intent({"goal": "echo", "inputs": {"marker": marker}}))
        sent.append(one)
        deadline = time.monotonic() + 3.0
        k = len(sent)
        while time.monotonic() < deadline:
            resp = await send(http, urls[k % len(urls)], one.req)
            k += 1
            if resp.status_code == 200:
                assert sess.verify_result(one.req, resp.json()["result"]).result == {"marker": marker}
                one.body, one.answered_at = resp.json()["result"], time.monotonic()
                break
            unavailable(sess, one.req, resp)  # never a 500, never anything else
            state["unavailable"] += 1
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.01)


async def test_old_primary_frozen_then_resumed_with_wait_replicas(sentinels: LocalSentinel) -> None:
    """The primary is frozen until its replica is promoted, then resumed; wait_replicas=1.

    Until the sentinels demote the old primary (about 10 s after it resumes) and it has
    synced from the new one, the new primary has no replica and the old one none either:
    nothing can be acknowledged, and every new request is refused (503) before it runs.
    Then service resumes on both workers. Nothing ran twice, the two workers agree on every
    session, and each answer given just before the freeze is still the answer (REPLAY).
    """
    runs = Runs()
    old = sentinels.first_primary
    options = {"wait_replicas": 1, "wait_timeout_ms": 300, "finish_linger": None}
    async with (
        workers(sentinels, 2, runs, **options) as (urls, server, _),
        httpx.AsyncClient(timeout=10) as http,
    ):
        a, b = urls
        clients = [await handshake(http, urls, client_identity(f"st{i}"), server.did) for i in range(4)]
        probes = [await handshake(http, urls, client_identity(f"pr{i}"), server.did) for i in range(6)]
        state: dict[str, Any] = {"stop": False, "unavailable": 0}
        sent: list[list[Sent]] = [[] for _ in clients]
        tasks = [
            asyncio.create_task(load(http, urls, sess, f"c{i}", sent[i], state))
            for i, sess in enumerate(clients)
        ]
        await asyncio.sleep(1.0)

        # Answered just before the freeze: each probe session's one request.
        asked = [
            p.prepare_intent({"goal": "echo", "inputs": {"marker": f"probe-{i}"}})
            for i, p in enumerate(probes)
        ]
        replies = await asyncio.gather(*(send(http, urls[i % 2], r) for i, r in enumerate(asked)))
        sentinels.freeze(old)
        frozen_at = time.monotonic()
        try:
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            new = await asyncio.to_thread(sentinels.wait_failover, old, 20.0)
            failed_over = time.monotonic() - frozen_at
            await asyncio.sleep(0.5)
        finally:
            sentinels.thaw(old)
        assert sentinels.info(old).get("role") == "master"  # stale: it still says so
        unsynced_until = await asyncio.to_thread(sentinels.wait_replica_of, old, new, 30.0)
        recovered_at = time.monotonic()
        for _ in range(100):  # every client served again, within 10 s
            await asyncio.sleep(0.1)
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
            if all(any((x.answered_at or 0) > recovered_at for x in mine) for mine in sent):
                break
        # When each client was first served after the old primary rejoined (fails if one was not).
        served = [
            min(x.answered_at for x in mine if x.answered_at and x.answered_at > recovered_at)
            for mine in sent
        ]
        state["stop"] = True
        await asyncio.gather(*tasks)

        # Nothing ran twice; the outage was seen as 503 + Retry-After.
        assert not runs.twice(), runs.twice()
        assert state["unavailable"] > 0
        # Nothing ran between the freeze and the old primary's demotion: nothing could be
        # acknowledged (it had no replica left, nor had the promoted one). The window ends
        # at the last moment it was seen unsynced, not when the poll noticed the sync.
        window = [
            x
            for mine in sent
            for x in mine
            if x.answered_at and frozen_at + 1.5 < x.answered_at < unsynced_until
        ]
        assert not window, [x.req.params["sequence"] for x in window]

        # The answers given just before the freeze survived: the same answer, at both
        # workers, and no second run.
        before = runs.total()
        for probe, req, reply in zip(probes, asked, replies, strict=True):
            for url in urls:
                again = await send(http, url, req)
                assert again.status_code == 200, again.text
                assert again.json()["result"] == reply.json()["result"]
                probe.verify_result(req, again.json()["result"])
        # Each client's requests: the last one sent gets its answer again if it had one (at
        # both workers), every earlier one is refused as stale (signed -32044), none runs.
        for sess, mine in zip(clients, sent, strict=True):
            last = mine[-1]
            for url in urls:
                if last.body is not None:
                    again = await send(http, url, last.req)
                    assert again.status_code == 200 and again.json()["result"] == last.body, again.text
                for earlier in mine[:-1]:
                    stale = await send(http, url, earlier.req)
                    assert error_of(stale) == (409, -32044), stale.text
                    assert sess.error_from_reply(earlier.req, stale.json()["error"]).signed
        assert runs.total() == before
        # Both workers see one sequence state per session: the next request, answered at
        # A, is the stored answer at B.
        for sess in clients:
            nxt = sess.prepare_intent({"goal": "echo", "inputs": {"marker": f"final-{sess.session_id}"}})
            body = await answered(http, a, sess, nxt)
            again = await send(http, b, nxt)
            assert again.status_code == 200 and again.json()["result"]["result"] == body
        assert not runs.twice() and runs.total() == before + len(clients)
        answered_n = sum(x.body is not None for mine in sent for x in mine)
        print(
            f"sentinel stale primary (wait_replicas=1): failed over {failed_over:.1f} s after the freeze, "
            f"old primary back as a replica {recovered_at - frozen_at:.1f} s after it, every client "
            f"served again {max(served) - frozen_at:.1f} s after it; {sum(map(len, sent))} intents, "
            f"{answered_n} answered, {state['unavailable']} answers 503"
        )
