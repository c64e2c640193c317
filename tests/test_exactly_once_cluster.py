"""The intent_id extension end to end on a server whose RedisStore is spread over Redis Cluster.

A real uvicorn server (in this process, so a test can hold its store at one point of a
request) on the session's local cluster, with the default key layout (no hash tag in the
prefix): the session and the DID's claim lie in different slots, and the claim is given
back when its request does not run (a2a_secure/store/redis_cluster.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from cluster_helpers import LocalCluster, delete_prefix
from http_helpers import build_server, identity
from test_multiworker import error_of, handshake, send

from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app

X = "spread-cluster-intent-0001"


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


@pytest.fixture
async def cstore(redis_cluster: LocalCluster) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_cluster.url, prefix=f"a2a-test:{uuid.uuid4().hex}:")
    assert store._spread
    try:
        yield store
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, store.prefix)


def counting_server(
    store: Any, limits: ServerLimits | None = None
) -> tuple[AgentServer, Counter[str | None]]:
    """A server whose ``record`` intent counts its runs per intent_id (any store)."""
    limits = limits or ServerLimits(replay_wait_seconds=5)
    server = build_server(identity("eo-cluster"), store=store, limits=limits)
    runs: Counter[str | None] = Counter()

    @server.intent("record")
    async def record(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        runs[ctx.intent_id] += 1
        return {"inputs": inputs, "run": runs[ctx.intent_id]}

    return server, runs


async def test_a_server_on_a_spread_cluster_runs_each_intent_id_once(cstore: RedisStore) -> None:
    server, runs = counting_server(cstore)
    assert "intent_id" in server.card["a2a_secure_extensions"]
    async with serve_app(server.app()) as url:
        for attempt in range(3):  # three "processes" of the caller, each with a new session
            async with A2AClient(identity("cluster-caller")) as client:
                res = await client.request(
                    server.identity.did, {"goal": "record", "inputs": {"n": 7}}, endpoint=url, intent_id=X
                )
                assert res.result == {"inputs": {"n": 7}, "run": 1}, attempt
    assert runs == Counter({X: 1})


async def test_a_request_finding_a_claim_being_given_back_runs_it_once(cstore: RedisStore) -> None:
    """A (a stale sequence carrying X) claims X, never to start it; B (the same DID, another
    session, X) finds the claim not started and takes it over: B runs X, once; A's
    give-back leaves B's claim alone, and every later request gets B's answer."""
    server, runs = counting_server(cstore)
    client = identity("cluster-race")
    intent = {"goal": "record", "inputs": {"k": 1}, "intent_id": X}
    reached, release = asyncio.Event(), asyncio.Event()
    quietly = cstore._quietly

    async def paused(calls: list[Any]) -> list[Any]:
        if any(script is cstore._c_unclaim for script, _, _ in calls):
            reached.set()
            await release.wait()
        return await quietly(calls)

    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        s_a = await handshake(http, [url], client, server.identity.did)
        s_b = await handshake(http, [url], client, server.identity.did)
        stale = s_a.prepare_intent(intent)  # sequence 1, sent after 2
        later = s_a.prepare_intent({"goal": "record", "inputs": {"k": 0}})
        assert (await send(http, url, later)).status_code == 200

        cstore._quietly = paused  # type: ignore[method-assign]
        a = asyncio.ensure_future(send(http, url, stale))
        await asyncio.wait_for(reached.wait(), 5)
        req_b = s_b.prepare_intent(intent)
        resp_b = await send(http, url, req_b)  # not held up by A: it runs X
        assert resp_b.status_code == 200, resp_b.text
        assert s_b.verify_result(req_b, resp_b.json()["result"]).result == {"inputs": {"k": 1}, "run": 1}
        release.set()
        assert error_of(await a) == (409, -32044)  # A: stale
        assert runs[X] == 1
        # From now on X is answered from its claim, on any session.
        again = s_a.prepare_intent(intent)
        resp = await send(http, url, again)
        assert s_a.verify_result(again, resp.json()["result"]).result == {"inputs": {"k": 1}, "run": 1}
    assert runs[X] == 1
