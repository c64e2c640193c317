"""The intent_id extension end to end: a real uvicorn server and the real client.

The server declares the extension in its agent card; the client learns it once per signed
manifest hash (a card that does not hash to it counts as no extension) and then sends every
intent with a random ``intent_id``, kept across its retries and re-handshakes.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import cluster_helpers
import httpx
import pytest
from approval_helpers import start_desk
from http_helpers import build_server, identity
from redis_helpers import redis_prefix, redis_url  # noqa: F401

from a2a_secure.agent import A2AAgent, RegistryEntry
from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient
from a2a_secure.errors import A2AError, InvalidParams, Unavailable
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.intent_id import is_ids_full
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


def recording_server(
    limits: ServerLimits | None = None, name: str = "eo-server", store: Store | None = None
) -> AgentServer:
    server = build_server(identity(name), limits=limits, store=store)
    server.seen = []  # type: ignore[attr-defined]
    server.card_hits = Counter()  # type: ignore[attr-defined]

    @server.intent("record")
    async def record(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        server.seen.append(ctx.intent_id)  # type: ignore[attr-defined]
        return {"inputs": inputs, "intent_id": ctx.intent_id, "run": len(server.seen)}  # type: ignore[attr-defined]

    honest_card = server.card_endpoint

    async def counted(request: Any) -> Any:
        server.card_hits["card"] += 1  # type: ignore[attr-defined]
        return await honest_card(request)

    server.card_endpoint = counted  # type: ignore[method-assign]
    return server


async def test_card_declares_the_extension_only_when_it_is_on() -> None:
    on = recording_server()  # sealing is on by default too (§12.6)
    assert on.card["a2a_secure_extensions"] == ["intent_id", "priority", "sealed"]
    off = recording_server(ServerLimits(intent_id_retention=0))
    assert off.card["a2a_secure_extensions"] == ["priority", "sealed"]
    assert encoding.hash_of(off.card) == off.manifest_hash


async def test_client_learns_the_extension_once_and_sends_an_intent_id() -> None:
    server = recording_server()
    async with (
        serve_app(server.app()) as url,
        A2AClient(identity("alice")) as alice,
        A2AClient(identity("bob")) as bob,
    ):
        for client in (alice, bob, alice):
            await client.handshake(server.identity.did, url)
            res = await client.request(server.identity.did, {"goal": "record", "inputs": {}})
            assert res.intent_id is not None and len(res.intent_id) == 22
            assert res.result["intent_id"] == res.intent_id
        # Each request had its own id; the card was fetched once for three handshakes
        # of two clients (the cache is keyed by the signed manifest hash).
        assert len(set(server.seen)) == 3  # type: ignore[attr-defined]
        assert server.card_hits["card"] == 1  # type: ignore[attr-defined]


async def test_a_caller_id_makes_its_own_retries_exactly_once() -> None:
    server = recording_server()
    iid = "order-4711-retry-safe-00001"
    async with serve_app(server.app()) as url:
        for attempt in range(3):  # three "processes" of the caller, each with a new session
            async with A2AClient(identity("caller")) as client:
                res = await client.request(
                    server.identity.did,
                    {"goal": "record", "inputs": {"amount": 5}},
                    endpoint=url,
                    intent_id=iid,
                )
                assert res.intent_id == iid
                assert res.result == {"inputs": {"amount": 5}, "intent_id": iid, "run": 1}, attempt
        assert server.seen == [iid]  # type: ignore[attr-defined]
        # The same id for other inputs is refused (signed), and the first answer is unchanged.
        async with A2AClient(identity("caller")) as client:
            with pytest.raises(A2AError) as caught:
                await client.request(
                    server.identity.did,
                    {"goal": "record", "inputs": {"amount": 500}},
                    endpoint=url,
                    intent_id=iid,
                )
            assert caught.value.code == -32044 and caught.value.signed
            res = await client.request(
                server.identity.did, {"goal": "record", "inputs": {"amount": 5}}, endpoint=url, intent_id=iid
            )
            assert res.result["run"] == 1
        assert server.seen == [iid]  # type: ignore[attr-defined]


async def test_agent_request_passes_the_callers_intent_id() -> None:
    server = recording_server()
    async with serve_app(server.app()) as url:
        async with A2AAgent("orchestrator", identity("orchestrator")) as agent:
            agent.registry.add(RegistryEntry("srv", server.identity.did, url))
            first = await agent.request("srv", {"goal": "record", "inputs": {"x": 1}}, intent_id="A" * 30)
            second = await agent.request("srv", {"goal": "record", "inputs": {"x": 1}}, intent_id="A" * 30)
            assert first == second and first["intent_id"] == "A" * 30
        assert server.seen == ["A" * 30]  # type: ignore[attr-defined]


async def test_exactly_once_true_refuses_a_server_that_does_not_declare_it() -> None:
    server = recording_server(ServerLimits(intent_id_retention=0))
    async with serve_app(server.app()) as url:
        async with A2AClient(identity("strict"), exactly_once=True) as client:
            with pytest.raises(InvalidParams, match="does not declare the intent_id extension"):
                await client.request(server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url)
        async with A2AClient(identity("lenient")) as client:
            # A caller's own id needs the extension too...
            with pytest.raises(InvalidParams, match="does not declare"):
                await client.request(
                    server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url, intent_id="B" * 22
                )
            # ... while by default the intent goes without one, as today.
            res = await client.request(server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url)
            assert res.intent_id is None
        assert server.seen == [None]  # type: ignore[attr-defined]


async def test_exactly_once_false_never_sends_an_id_and_never_fetches_the_card() -> None:
    server = recording_server()
    async with serve_app(server.app()) as url:
        # sealed=False as well: by default the card is read once for sealed intents (§12.6).
        async with A2AClient(identity("plain"), exactly_once=False, sealed=False) as client:
            res = await client.request(server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url)
            assert res.intent_id is None
        assert server.seen == [None]  # type: ignore[attr-defined]
        assert server.card_hits["card"] == 0  # type: ignore[attr-defined]


async def test_a_card_that_does_not_hash_to_the_signed_manifest_hash_means_no_extension(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = recording_server()

    async def altered(request: Any) -> Any:
        from starlette.responses import Response

        card = {**server.card, "description": "altered on the way"}
        return Response(encoding.dumps(card), media_type="application/json")

    server.card_endpoint = altered  # type: ignore[method-assign]
    async with serve_app(server.app()) as url:
        with caplog.at_level(logging.DEBUG, logger="a2a_secure.client.extensions"):
            async with A2AClient(identity("mismatch")) as client:
                res = await client.request(
                    server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url
                )
                assert res.intent_id is None  # not an error: the server is treated as PROTOCOL.md-only
            async with A2AClient(identity("mismatch"), exactly_once=True) as client:
                # Nothing known (the card is not the one signed): 503, try again; nothing sent.
                with pytest.raises(Unavailable, match="could not be checked"):
                    await client.request(server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url)
        assert "does not hash to the signed manifest_hash" in caplog.text


async def test_streams_carry_the_intent_id_and_a_resend_replays_the_one_run() -> None:
    server = recording_server()
    runs: list[str | None] = []

    @server.intent("ticks")
    async def ticks(inputs: dict[str, Any], ctx: IntentContext) -> AsyncIterator[Any]:
        runs.append(ctx.intent_id)
        for i in range(int(inputs["n"])):
            yield {"i": i, "intent_id": ctx.intent_id}

    async with serve_app(server.app()) as url:
        got = []
        for _ in range(2):
            async with A2AClient(identity("streamer")) as client:
                await client.handshake(server.identity.did, url)
                got.append(
                    [
                        item
                        async for item in client.stream(
                            server.identity.did, {"goal": "ticks", "inputs": {"n": 3}}, intent_id="S" * 22
                        )
                    ]
                )
        assert got[0] == got[1] == [{"i": i, "intent_id": "S" * 22} for i in range(3)]
        assert runs == ["S" * 22]


async def test_an_unreachable_card_is_no_extension_and_is_not_fetched_per_handshake() -> None:
    server = recording_server()
    hits = Counter[str]()

    async def gone(request: Any) -> Any:
        from starlette.responses import Response

        hits["card"] += 1
        return Response(b"not here", status_code=404)

    server.card_endpoint = gone  # type: ignore[method-assign]
    async with serve_app(server.app()) as url, httpx.AsyncClient() as http:
        async with A2AClient(identity("nocard"), http=http) as client:
            for _ in range(3):
                await client.handshake(server.identity.did, url)
                res = await client.request(server.identity.did, {"goal": "record", "inputs": {}})
                assert res.intent_id is None
        assert hits["card"] == 1


async def test_a_full_did_gets_its_intents_through_without_an_id(caplog: pytest.LogCaptureFixture) -> None:
    # The server keeps 3 ids per DID. A client that picks its ids itself must not stop
    # working at the 4th intent: the refusal ran nothing, so the intent goes again without
    # an id (base-protocol semantics), and the next ones skip the id for a while.
    caplog.set_level(logging.WARNING, logger="a2a_secure.client")
    server = recording_server(ServerLimits(max_intent_ids_per_did=3))
    async with serve_app(server.app()) as url, A2AClient(identity("busy")) as client:
        await client.handshake(server.identity.did, url)
        results = [
            await client.request(server.identity.did, {"goal": "record", "inputs": {"n": n}})
            for n in range(6)
        ]
        streamed = [
            r async for r in client.stream(server.identity.did, {"goal": "record", "inputs": {"n": 6}})
        ]
    assert [r.result["inputs"]["n"] for r in results] == list(range(6))
    assert all(r.intent_id is not None for r in results[:3])
    assert all(r.intent_id is None for r in results[3:])
    assert streamed[-1]["inputs"] == {"n": 6}
    # Each intent ran once: the refused attempt ran nothing.
    assert len(server.seen) == 7  # type: ignore[attr-defined]
    assert server.seen[3:] == [None] * 4  # type: ignore[attr-defined]
    assert "keeps no more intent_ids" in caplog.text


async def test_a_full_did_refuses_an_id_the_caller_chose_or_required() -> None:
    server = recording_server(ServerLimits(max_intent_ids_per_did=1))
    async with (
        serve_app(server.app()) as url,
        A2AClient(identity("strict"), exactly_once=True) as strict,
        A2AClient(identity("chooser")) as chooser,
    ):
        for client in (strict, chooser):
            await client.handshake(server.identity.did, url)
            await client.request(server.identity.did, {"goal": "record", "inputs": {}})
        with pytest.raises(A2AError) as refused:
            await strict.request(server.identity.did, {"goal": "record", "inputs": {}})
        assert refused.value.code == -32048 and refused.value.signed
        with pytest.raises(A2AError) as refused:
            await chooser.request(server.identity.did, {"goal": "record", "inputs": {}}, intent_id="C" * 22)
        assert refused.value.code == -32048 and "intent_ids remembered" in refused.value.message
    assert len(server.seen) == 2  # type: ignore[attr-defined]


async def test_a_priority_above_the_callers_right_leaves_the_id_for_the_corrected_intent() -> None:
    server = recording_server()  # every caller may use priorities up to 3
    iid = "order-4712-priority-00001"
    async with serve_app(server.app()) as url, A2AClient(identity("eager")) as client:
        with pytest.raises(A2AError) as refused:
            await client.request(
                server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url, priority=5, intent_id=iid
            )
        assert refused.value.code == -32042 and refused.value.signed
        res = await client.request(
            server.identity.did, {"goal": "record", "inputs": {}}, endpoint=url, intent_id=iid
        )
        assert res.result["run"] == 1
    assert server.seen == [iid]  # type: ignore[attr-defined]


@pytest.fixture(params=["memory", "redis", "cluster"])
def claim_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A MemoryStore, a RedisStore on one Redis, or one spread over a local Redis Cluster."""
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "redis":
        yield RedisStore(request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("redis_prefix"))
    else:
        url = request.getfixturevalue("redis_cluster").url
        prefix = f"a2a-test:{uuid.uuid4().hex}:"
        yield RedisStore(url, prefix=prefix)
        cluster_helpers.delete_prefix(url, prefix)


async def test_a_full_store_refuses_a_new_id_and_consumes_nothing(claim_store: Store) -> None:
    # Two ids in the whole store, whoever the DIDs: a third is refused (503, signed) before
    # anything is claimed or consumed; an id already there is still answered.
    limits = ServerLimits(max_intent_ids_total=2, intent_id_retention=1)
    try:
        async with start_desk(store=claim_store, limits=limits) as w:
            first = {"goal": "echo", "inputs": {"n": 1}, "intent_id": "first-intent-id-000000001"}
            for n, name in enumerate(("did-1", "did-2")):
                sess = await w.open_session(Identity.generate(name))
                intent = {**first, "intent_id": f"first-intent-id-00000000{n}"}
                assert (await w.send(sess.prepare_intent(intent))).status_code == 200
            newcomer = await w.open_session(Identity.generate("did-3"))
            req = newcomer.prepare_intent(
                {"goal": "echo", "inputs": {"n": 3}, "intent_id": "third-intent-id-0000003"}
            )
            resp = await w.send(req)
            assert resp.status_code == 503 and resp.headers["retry-after"].isdigit(), resp.text
            error = newcomer.error_from_reply(req, resp.json()["error"])
            assert error.signed and error.code == -32048
            assert error.message == "this server already has 2 intent_ids remembered" and is_ids_full(error)
            assert w.calls["echo"] == 2
            # Nothing was consumed: once the two claims have lapsed, the same bytes run.
            w.clock.advance(200)
            resp = await w.send(req)
            assert resp.status_code == 200, resp.text
            assert w.calls["echo"] == 3
    finally:
        await claim_store.aclose()


async def test_a_full_store_still_answers_an_id_it_holds(claim_store: Store) -> None:
    limits = ServerLimits(max_intent_ids_total=1)
    try:
        async with start_desk(store=claim_store, limits=limits) as w:
            intent = {"goal": "echo", "inputs": {"n": 1}, "intent_id": "the-only-intent-id-00001"}
            holder = Identity.generate("holder")
            sess = await w.open_session(holder)
            assert (await w.send(sess.prepare_intent(intent))).status_code == 200
            again = await w.open_session(holder)
            resend = await w.send(again.prepare_intent(intent))
            assert resend.status_code == 200
            assert w.calls["echo"] == 1
    finally:
        await claim_store.aclose()


async def test_the_default_client_gets_through_a_full_store_without_an_id(claim_store: Store) -> None:
    server = recording_server(ServerLimits(max_intent_ids_total=1), store=claim_store)
    try:
        async with serve_app(server.app()) as url:
            for name in ("first", "second"):
                async with A2AClient(identity(name)) as client:
                    await client.handshake(server.identity.did, url)
                    res = await client.request(server.identity.did, {"goal": "record", "inputs": {}})
                    assert (res.intent_id is None) is (name == "second")
        assert len(server.seen) == 2  # type: ignore[attr-defined]
    finally:
        await claim_store.aclose()


async def test_tool_execute_of_a_goal_the_policy_blocks_leaves_the_id_for_the_corrected_call() -> None:
    # tool.execute's check of steps 9-10 for its inner goal comes before the claim as well.
    async with start_desk() as w:
        sess = await w.open_session(Identity.generate("tool-caller"))
        iid = "tool-execute-intent-id-01"
        blocked = {"goal": "tool.execute", "inputs": {"tool": "blocked", "arguments": {}}, "intent_id": iid}
        req = sess.prepare_intent(blocked)
        resp = await w.send(req)
        assert resp.status_code == 403, resp.text
        assert sess.error_from_reply(req, resp.json()["error"]).code == -32042
        echo = {"goal": "tool.execute", "inputs": {"tool": "echo", "arguments": {"a": 1}}, "intent_id": iid}
        req = sess.prepare_intent(echo)
        resp = await w.send(req)
        assert resp.status_code == 200, resp.text
        assert sess.verify_result(req, resp.json()["result"]).result == {"echo": {"a": 1}}
        assert w.calls["echo"] == 1 and w.calls["blocked"] == 0
