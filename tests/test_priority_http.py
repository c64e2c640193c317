"""Intent priority over real HTTP (PROTOCOL.md §12.3): uvicorn on loopback, the real clients.

Each test starts an ``AgentServer`` with a concurrency limit and handlers that record, in
one list, when they start, finish and see ``asyncio.CancelledError``; callers are
``A2AClient``s (one per concurrent caller: a client sends one intent at a time per peer), an
``A2AAgent``, or a raw session when a test needs the exact bytes on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conformance_helpers import wait_for
from http_helpers import JSON, envelope, identity, raw_handshake
from protocol_helpers import forge_request

from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import IntentTimeout, InvalidParams, PolicyViolation
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.priority import INTERRUPTED_MESSAGE, PriorityRights
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

NO_RETRY = RetryPolicy(attempts=1)
LOW = identity("priority-low")
HIGH = identity("priority-high")


@dataclass
class Probe:
    """What the handlers did, in order: ("start" | "finish" | "cancelled", tag)."""

    log: list[tuple[str, str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def tags(self, what: str) -> list[str]:
        return [tag for event, tag in self.log if event == what]


def priority_server(probe: Probe, limits: ServerLimits, rights: PriorityRights | None = None) -> AgentServer:
    server = AgentServer(
        identity("priority-server"),
        Policy(),
        store=MemoryStore(),
        limits=limits,
        priority_rights=rights or PriorityRights(per_did={HIGH.did: 5}),
    )

    @server.intent("work")
    async def work(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        tag = inputs["tag"]
        probe.log.append(("start", tag))
        try:
            if inputs.get("hold"):
                await probe.release.wait()
            await asyncio.sleep(inputs.get("seconds", 0.005))
        except asyncio.CancelledError:
            probe.log.append(("cancelled", tag))
            raise
        probe.log.append(("finish", tag))
        return {"tag": tag, "priority": ctx.priority}

    @server.intent("ticker")
    async def ticker(inputs: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
        tag = inputs["tag"]
        probe.log.append(("start", tag))
        try:
            for i in range(1000):
                yield {"i": i}
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            probe.log.append(("cancelled", tag))
            raise

    return server


@contextlib.asynccontextmanager
async def running(server: AgentServer) -> AsyncIterator[str]:
    async with serve_app(server.app()) as url:
        yield url


@contextlib.asynccontextmanager
async def clients(who: list[Identity]) -> AsyncIterator[list[A2AClient]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(A2AClient(i, retry=NO_RETRY)) for i in who]


def work(tag: str, **extra: Any) -> dict[str, Any]:
    return {"goal": "work", "inputs": {"tag": tag, **extra}}


async def raw_session(http: httpx.AsyncClient, url: str, server: AgentServer, who: Identity) -> ClientSession:
    return await raw_handshake(http, url, who, server.identity.did)


async def post(http: httpx.AsyncClient, url: str, req: PreparedRequest, rid: int = 7) -> httpx.Response:
    return await http.post(url + "/a2a/intent", content=envelope("intent", req.params, rid), headers=JSON)


async def test_under_a_full_queue_intents_complete_in_priority_order_fifo_within_a_level() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1), PriorityRights(default=4))
    order = [("p2-first", 2), ("p4-first", 4), ("p1", 1), ("p2-second", 2), ("p4-second", 4), ("p3", 3)]
    callers = [identity(f"order-{i}") for i in range(len(order) + 1)]
    async with running(server) as url, clients(callers) as (blocker, *waiting):
        did = server.identity.did
        held = asyncio.create_task(blocker.request(did, work("blocker", hold=True), endpoint=url))
        await wait_for(lambda: probe.tags("start") == ["blocker"])
        tasks = []
        for n, (client, (tag, priority)) in enumerate(zip(waiting, order, strict=True), start=1):
            tasks.append(asyncio.create_task(client.request(did, work(tag), endpoint=url, priority=priority)))
            # Arrival order is the order of this list: wait until each one is in the queue.
            await wait_for(lambda n=n: server.protocol.scheduler.queued == n)
        assert probe.tags("start") == ["blocker"]  # nothing overtakes a running intent
        probe.release.set()
        results = await asyncio.gather(held, *tasks)
    expected = ["blocker", "p4-first", "p4-second", "p3", "p2-first", "p2-second", "p1"]
    assert probe.tags("finish") == expected
    assert probe.tags("start") == expected  # one at a time: each started after the one before ended
    assert {r.result["tag"]: r.result["priority"] for r in results[1:]} == dict(order)
    assert server.protocol.scheduler.running == 0 and server.protocol.scheduler.queued == 0


async def test_priority_5_interrupts_a_long_running_intent_whose_caller_gets_a_signed_error() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, httpx.AsyncClient(timeout=10) as http:
        sess = await raw_session(http, url, server, LOW)
        long_req = sess.prepare_intent(work("long", hold=True))
        victim = asyncio.create_task(post(http, url, long_req))
        await wait_for(lambda: probe.tags("start") == ["long"])
        registry = AgentRegistry([RegistryEntry("worker", server.identity.did, url)])
        async with A2AAgent("high", HIGH, registry=registry, retry=NO_RETRY) as agent:
            urgent = await agent.request("worker", work("urgent"), priority=5)
        assert urgent == {"tag": "urgent", "priority": 5}
        resp = await victim
        # The handler saw the cancellation before the priority-5 intent started.
        assert probe.log == [
            ("start", "long"),
            ("cancelled", "long"),
            ("start", "urgent"),
            ("finish", "urgent"),
        ]
        # The caller's answer is a -32049 signed over its own request, checked by the client.
        assert resp.status_code == 504
        err = sess.error_from_reply(long_req, resp.json()["error"])
        assert isinstance(err, IntentTimeout) and err.signed
        assert err.message == INTERRUPTED_MESSAGE
        # The sequence is used up and the error is its stored answer: a byte-identical retry
        # gets the very same answer and the handler does not run again.
        again = await post(http, url, long_req)
        assert again.status_code == 504 and again.content == resp.content
        assert probe.tags("start") == ["long", "urgent"]
        nxt = sess.prepare_intent(work("after"))
        assert sess.verify_result(nxt, (await post(http, url, nxt)).json()["result"]).result["tag"] == "after"


async def test_priority_5_never_interrupts_priority_5() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, clients([HIGH, HIGH]) as (first, second):
        did = server.identity.did
        held = asyncio.create_task(first.request(did, work("five-1", hold=True), endpoint=url, priority=5))
        await wait_for(lambda: probe.tags("start") == ["five-1"])
        waiting = asyncio.create_task(second.request(did, work("five-2"), endpoint=url, priority=5))
        await wait_for(lambda: server.protocol.scheduler.queued == 1)
        assert probe.tags("cancelled") == []
        probe.release.set()
        await asyncio.gather(held, waiting)
    assert probe.tags("finish") == ["five-1", "five-2"]


async def test_a_stream_interrupted_by_priority_5_ends_with_a_signed_error_event() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, clients([LOW, HIGH]) as (low, high):
        did = server.identity.did
        received: list[Any] = []

        async def listen() -> None:
            async for item in low.stream(did, {"goal": "ticker", "inputs": {"tag": "stream"}}, endpoint=url):
                received.append(item)

        listener = asyncio.create_task(listen())
        await wait_for(lambda: len(received) >= 2)
        result = await high.request(did, work("urgent"), endpoint=url, priority=5)
        assert result.result == {"tag": "urgent", "priority": 5}
        with pytest.raises(IntentTimeout) as caught:
            await listener
    # The final event's error is signed over the stream's request: the client checked it.
    assert caught.value.signed and caught.value.message == INTERRUPTED_MESSAGE
    assert received[:2] == [{"i": 0}, {"i": 1}]
    assert probe.log[:3] == [("start", "stream"), ("cancelled", "stream"), ("start", "urgent")]


async def test_a_caller_without_the_right_is_refused_before_anything_runs() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, clients([LOW]) as (low,):
        did = server.identity.did
        for priority in (4, 5):
            with pytest.raises(PolicyViolation) as caught:
                await low.request(did, work(f"p{priority}"), endpoint=url, priority=priority)
            assert caught.value.signed
            assert f"priority {priority} is above this caller's highest, 3" in caught.value.message
        assert probe.log == []  # the handler was never called
        # Priorities within the right work on the same session.
        for priority in (None, 1, 3):
            result = await low.request(did, work(f"ok-{priority}"), endpoint=url, priority=priority)
            assert result.result["priority"] == (priority or 3)


async def test_the_card_declares_priority_and_a_server_without_it_is_not_asked() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits())
    assert "priority" in server.card["a2a_secure_extensions"]
    # A server whose card does not declare the extension (a base-contract server, say): the
    # client refuses to ask it for a priority before anything is signed or sent.
    plain = priority_server(probe, ServerLimits())
    plain.set_card_builder(lambda card: {k: v for k, v in card.items() if k != "a2a_secure_extensions"})
    async with running(plain) as url, clients([HIGH]) as (high,):
        did = plain.identity.did
        with pytest.raises(InvalidParams, match="does not declare the priority extension") as caught:
            await high.request(did, work("asked"), endpoint=url, priority=5)
        assert not caught.value.signed
        assert probe.log == []
        # Without a priority the intent goes out as a base-contract intent, sequence 1.
        result = await high.request(did, work("plain"), endpoint=url)
        assert result.sequence == 1 and result.result["priority"] == 3


@pytest.mark.parametrize("value", [0, 6, "5", 3.5, 5.0, True], ids=repr)
async def test_a_bad_priority_is_refused_unsigned_and_consumes_nothing(value: Any) -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, httpx.AsyncClient(timeout=10) as http:
        sess = await raw_session(http, url, server, LOW)
        bad = forge_request(sess, {**work("bad"), "priority": value}, sequence=1)
        resp = await post(http, url, bad)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["code"] == -32602 and "data" not in error  # refused at the shape step
        # Nothing was consumed: the same sequence carries the corrected request.
        good = forge_request(sess, {**work("good"), "priority": 2}, sequence=1)
        resp = await post(http, url, good)
        assert resp.status_code == 200, resp.text
        assert sess.verify_result(good, resp.json()["result"]).result == {"tag": "good", "priority": 2}
    assert probe.tags("start") == ["good"]


async def test_the_clients_refuse_a_bad_priority_before_sending_anything() -> None:
    async with A2AClient(LOW, retry=NO_RETRY) as client:
        for value in (0, 6, "5", 3.5, True):
            with pytest.raises(InvalidParams, match="intent priority"):
                # Unreachable endpoint: a request that went out would fail otherwise.
                await client.request(
                    "did:key:z6Mkf5rGMoatrSj1f4CyvuHBeXJELe9RPdzo2PKGNCKVtZxP",
                    work("x"),
                    endpoint="http://127.0.0.1:9",
                    priority=value,
                )


async def test_time_in_the_queue_counts_against_the_deadline() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1))
    async with running(server) as url, clients([LOW, identity("late")]) as (blocker, late):
        did = server.identity.did
        held = asyncio.create_task(blocker.request(did, work("blocker", hold=True), endpoint=url))
        await wait_for(lambda: probe.tags("start") == ["blocker"])
        intent = {**work("late"), "constraints": {"timeout_ms": 200}}
        with pytest.raises(IntentTimeout) as caught:
            await late.request(did, intent, endpoint=url)
        assert caught.value.signed and "waited to run past its deadline of 200 ms" in caught.value.message
        assert server.protocol.scheduler.queued == 0  # it left the queue
        probe.release.set()
        await held
    assert probe.tags("start") == ["blocker"]  # the expired intent never ran


async def test_a_full_queue_is_a_signed_503_that_leaves_the_sequence_unused() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits(max_concurrent_intents=1, max_queued_intents=1))
    async with (
        running(server) as url,
        clients([LOW, identity("queued")]) as (blocker, queued),
        httpx.AsyncClient(timeout=10) as http,
    ):
        did = server.identity.did
        held = asyncio.create_task(blocker.request(did, work("blocker", hold=True), endpoint=url))
        await wait_for(lambda: probe.tags("start") == ["blocker"])
        waiting = asyncio.create_task(queued.request(did, work("queued"), endpoint=url))
        await wait_for(lambda: server.protocol.scheduler.queued == 1)
        sess = await raw_session(http, url, server, identity("refused"))
        req = sess.prepare_intent(work("refused"))
        resp = await post(http, url, req)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        err = sess.error_from_reply(req, resp.json()["error"])
        assert err.code == -32048 and err.signed
        probe.release.set()
        await asyncio.gather(held, waiting)
        # Not consumed: the byte-identical request runs once there is room.
        resp = await post(http, url, req)
        assert resp.status_code == 200, resp.text
        assert sess.verify_result(req, resp.json()["result"]).result["tag"] == "refused"
    assert probe.tags("finish") == ["blocker", "queued", "refused"]


async def test_without_a_limit_there_is_no_queue_and_priority_5_interrupts_nothing() -> None:
    probe = Probe()
    server = priority_server(probe, ServerLimits())
    async with running(server) as url, clients([LOW, identity("low-2"), HIGH]) as (a, b, high):
        did = server.identity.did
        held = [
            asyncio.create_task(c.request(did, work(t, hold=True), endpoint=url))
            for c, t in ((a, "a"), (b, "b"))
        ]
        await wait_for(lambda: sorted(probe.tags("start")) == ["a", "b"])
        result = await high.request(did, work("urgent"), endpoint=url, priority=5)
        assert result.result == {"tag": "urgent", "priority": 5}
        assert probe.tags("cancelled") == []
        assert server.protocol.scheduler.running == 0  # the scheduler was never entered
        probe.release.set()
        await asyncio.gather(*held)
