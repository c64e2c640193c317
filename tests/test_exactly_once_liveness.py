"""Liveness of ``intent_id`` claims under the faults of the campaign (scripts/chaos.py).

Retries repeat nothing that succeeded and finish what never started:

* the claim's answer is in Redis when ``finish_intent`` returns (the server sends the answer
  only then): a worker killed right after answering no longer leaves resends "still running";
* a claim whose handler never started (its owner paused, killed, or refused between the
  claim and the start) is taken over by the resend, which runs it; the first owner then
  does not run it and answers with the resend's answer;
* an answer (or a start given back) the store could not take is retried until the lease ends;
* a stream's lease is one handler timeout, moved on as its events come, not its session's;
* ``claim_lease_margin`` is a setting (policy file, ``--claim-lease-margin``, environment);
* ``A2A_SECURE_TEST_CLOCK_DIR`` steps a worker's wall clock (fault campaigns only).

Real uvicorn on 127.0.0.1 and real Redis (``redis_url``) where it is about them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import build_server, identity
from redis_helpers import redis_prefix, redis_url  # noqa: F401
from test_exactly_once_cluster import counting_server
from test_multiworker import handshake, send

from a2a_secure.cli import main as cli_main
from a2a_secure.errors import Unavailable
from a2a_secure.policy import Policy
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import app_from_env, load_scheduling
from a2a_secure.server.timing import lease_setting
from a2a_secure.store.base import StoredReply
from a2a_secure.store.intents import ClaimKind
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import SteppedClock, serve_app

H = "sha256:" + "7" * 64


async def test_the_claims_answer_is_in_redis_when_finish_intent_returns(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    """A second process (another RedisStore) reads the answer at once: nothing lingers.
    Before: it was sent with the next command or 20 ms later, after the answer had left."""
    a = RedisStore(redis_url, prefix=redis_prefix)
    b = RedisStore(redis_url, prefix=redis_prefix)
    did, iid, now = "did:key:zCaller", "I" * 22, time.time()
    key = a._k_intent("", did, iid)
    try:
        # A started claim, as a begin and a start leave it.
        await a.client.hset(
            key, mapping={"h": bytes.fromhex("7" * 64), "u": int(now) + 30, "e": int(now) + 3600, "s": "1"}
        )
        assert (await b.get_claim(did, iid, H, now)).kind is ClaimKind.RUNNING
        await a.finish_intent(did, iid, H, StoredReply(200, {"ok": 1}))
        seen = await b.get_claim(did, iid, H, now)
        assert seen.kind is ClaimKind.DONE and seen.reply == StoredReply(200, {"ok": 1})
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_claim_never_started_is_run_by_the_resend_and_only_once(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    """A's worker pauses between its claim and its start (SIGSTOP, a lost connection); the
    resend B, on another session, takes the claim over and runs the intent; A, resumed, finds
    the claim taken, does not run, and answers B's answer. Before: B waited "still running"
    and then was told "outcome unknown" about an intent that never ran."""
    store = RedisStore(redis_url, prefix=redis_prefix)
    server, runs = counting_server(store)
    reached, release = asyncio.Event(), asyncio.Event()
    start = store.start_intent
    paused = {"once": True}

    async def held(*args: Any, **kw: Any) -> bool:
        if paused.pop("once", False):
            reached.set()
            await release.wait()
        return await start(*args, **kw)

    store.start_intent = held  # type: ignore[method-assign]
    intent = {"goal": "record", "inputs": {"k": 1}, "intent_id": "N" * 22}
    client = identity("paused-caller")
    try:
        async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
            s_a = await handshake(http, [url], client, server.identity.did)
            s_b = await handshake(http, [url], client, server.identity.did)
            req_a = s_a.prepare_intent(intent)
            a = asyncio.ensure_future(send(http, url, req_a))
            await asyncio.wait_for(reached.wait(), 5)
            req_b = s_b.prepare_intent(intent)
            resp_b = await asyncio.wait_for(send(http, url, req_b), 5)
            assert resp_b.status_code == 200, resp_b.text
            answer = s_b.verify_result(req_b, resp_b.json()["result"]).result
            assert answer == {"inputs": {"k": 1}, "run": 1}
            release.set()
            resp_a = await a
            assert resp_a.status_code == 200, resp_a.text
            assert s_a.verify_result(req_a, resp_a.json()["result"]).result == answer
    finally:
        await store.aclose()
    assert runs == Counter({"N" * 22: 1})


class FlakyStore(MemoryStore):
    """A MemoryStore whose first ``finish_intent`` fails as a store that went away."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def finish_intent(self, *args: Any, **kw: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise Unavailable("shared store unavailable", retry_after=1)
        await super().finish_intent(*args, **kw)


async def test_an_answer_the_store_could_not_keep_is_kept_once_it_is_back() -> None:
    """Before: the answer went out, the claim stayed unanswered, and every resend was told
    "still running" and then "outcome unknown"."""
    store = FlakyStore()
    server, runs = counting_server(store, ServerLimits(replay_wait_seconds=3))
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        caller = identity("flaky-caller")
        s1 = await handshake(http, [url], caller, server.identity.did)
        intent = {"goal": "record", "inputs": {"k": 2}, "intent_id": "F" * 22}
        first = s1.prepare_intent(intent)
        resp = await send(http, url, first)
        assert resp.status_code == 200, resp.text
        s2 = await handshake(http, [url], caller, server.identity.did)
        again = s2.prepare_intent(intent)
        resp = await send(http, url, again)  # waits while the answer is retried, then gets it
        assert resp.status_code == 200, resp.text
        assert s2.verify_result(again, resp.json()["result"]).result == {"inputs": {"k": 2}, "run": 1}
    assert store.failures == 0 and runs == Counter({"F" * 22: 1})


async def test_a_streams_lease_is_one_timeout_and_moves_on_with_its_events() -> None:
    """Before: a stream's claim stayed RUNNING until its session's end (an hour): a worker
    killed mid-stream left the id "still running" that long."""
    store = MemoryStore()
    limits = ServerLimits(max_handler_timeout_ms=2000, claim_lease_margin=3)
    server = build_server(identity("stream-lease"), store=store, limits=limits)
    leases: list[int] = []
    key: list[Any] = []

    async def ticks(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        for i in range(3):
            c = next(iter(store._claims.values()))
            leases.append(c.running_until)
            key.append(c)
            yield {"i": i}
            await asyncio.sleep(1.6)  # past half the margin: the next event moves the lease

    server.add_stream("ticks", ticks)
    async with serve_app(server.app()) as url:
        from a2a_secure.client.http import A2AClient

        async with A2AClient(identity("streamer")) as client:
            started = time.time()
            got = [
                x
                async for x in client.stream(
                    server.identity.did, {"goal": "ticks", "inputs": {}}, endpoint=url
                )
            ]
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert leases[0] <= started + 2 + 3 + 2  # one timeout and the margin, not the session's hour
    assert leases[-1] > leases[0]  # moved on by the events


def test_the_lease_margin_is_a_setting(tmp_path: Path) -> None:
    assert ServerLimits().claim_lease_margin == 60
    with pytest.raises(ValueError, match="claim_lease_margin"):
        ServerLimits(claim_lease_margin=0)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"claim_lease_margin": 5, "max_handler_timeout_ms": 1500}))
    _, limits = load_scheduling(policy)
    assert (limits.claim_lease_margin, limits.max_handler_timeout_ms) == (5, 1500)
    policy.write_text(json.dumps({"claim_lease_margin": "5"}))
    with pytest.raises(ValueError, match="claim_lease_margin must be a positive number"):
        load_scheduling(policy)
    assert lease_setting("7") == 7
    for bad in ("0", "-1", "1.5", " 7", "86401"):
        with pytest.raises(ValueError, match="from 1 to 86400"):
            lease_setting(bad)
    key = tmp_path / "agent.key"
    identity("lease").save(key)
    app = app_from_env({"A2A_SECURE_KEY_FILE": str(key), "A2A_SECURE_CLAIM_LEASE_MARGIN": "9"})
    assert app.state.agent_server.limits.claim_lease_margin == 9
    with pytest.raises(ValueError, match="A2A_SECURE_CLAIM_LEASE_MARGIN"):
        app_from_env({"A2A_SECURE_KEY_FILE": str(key), "A2A_SECURE_CLAIM_LEASE_MARGIN": "0"})
    assert cli_main(["serve", "--key-file", str(key), "--claim-lease-margin", "0"]) == 2


async def test_a_claim_lapses_after_the_timeout_and_the_configured_margin() -> None:
    """A run that started and never answered is LOST after timeout + margin, not + 60 s."""
    store = MemoryStore()
    limits = ServerLimits(max_handler_timeout_ms=1000, claim_lease_margin=2)
    server, _ = counting_server(store, limits)
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        caller = identity("lapse")
        s = await handshake(http, [url], caller, server.identity.did)
        req = s.prepare_intent({"goal": "record", "inputs": {}, "intent_id": "L" * 22})
        assert (await send(http, url, req)).status_code == 200
    (claim,) = store._claims.values()
    assert claim.running_until <= time.time() + 1 + 2 + 1


def test_a_stepped_clock_reads_its_offset_file(tmp_path: Path) -> None:
    path = tmp_path / str(os.getpid())
    clock = SteppedClock(path, every=0)
    assert abs(clock() - time.time()) < 1
    path.write_text("-120.5")
    assert abs(clock() - (time.time() - 120.5)) < 1
    path.write_text("not a number")
    assert abs(clock() - time.time()) < 1
    key = tmp_path / "agent.key"
    identity("clock").save(key)
    path.write_text("200")
    app = app_from_env({"A2A_SECURE_KEY_FILE": str(key), "A2A_SECURE_TEST_CLOCK_DIR": str(tmp_path)})
    assert abs(app.state.agent_server._clock() - (time.time() + 200)) < 1


async def test_an_answer_retried_across_a_clock_step_is_kept() -> None:
    """The retries of an answer the store could not take are timed by the monotonic clock:
    the server's wall clock stepping 200 s forward right after the run (within the 300 s of
    freshness) neither ends them at once nor leaves the id "outcome unknown"."""
    store = FlakyStore()
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    server = build_server(identity("stepped"), store=store, clock=clock)

    @server.intent("record")
    async def record(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        offset[0] = 200.0  # the wall clock steps while the intent runs
        return {"inputs": inputs}

    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        caller = identity("stepped-caller")
        s1 = await handshake(http, [url], caller, server.identity.did)
        intent = {"goal": "record", "inputs": {"k": 3}, "intent_id": "S" * 22}
        assert (await send(http, url, s1.prepare_intent(intent))).status_code == 200
        await asyncio.sleep(0.3)  # the first retry, 50 ms after the failure
        again = s1.prepare_intent(intent)
        resp = await send(http, url, again)
        assert resp.status_code == 200, resp.text
        assert s1.verify_result(again, resp.json()["result"]).result == {"inputs": {"k": 3}}
    assert store.failures == 0


@pytest.mark.parametrize("option", ["exactly_once", "sealed"])
async def test_a_card_fetch_that_failed_is_a_503_and_the_next_try_sends(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The campaign's proxy cut a card fetch: ``A2AClient(exactly_once=True)`` (or
    ``sealed=True``) answered -32602 "does not declare the extension" about a server that
    declares it. Now 503 (nothing sent), and the next try fetches the card and goes through."""
    from a2a_secure.client import extensions
    from a2a_secure.client.http import A2AClient

    extensions.forget()
    server, runs = counting_server(MemoryStore(), ServerLimits(sealed_intents=True))
    fetch = extensions.fetch_card
    # exactly_once: the handshake's look-up and the one made again before the intent is sent;
    # sealed: the handshake's (it needs a checked card).
    cut = {"left": 2 if option == "exactly_once" else 1}

    async def cut_once(*args: Any, **kw: Any) -> Any:
        if cut["left"]:
            cut["left"] -= 1
            raise httpx.ReadError("connection cut")
        return await fetch(*args, **kw)

    monkeypatch.setattr(extensions, "fetch_card", cut_once)
    async with serve_app(server.app()) as url, A2AClient(identity("cut-card"), **{option: True}) as client:
        intent = {"goal": "record", "inputs": {"k": 4}}
        with pytest.raises(Unavailable, match="could not be checked"):
            await client.request(server.identity.did, intent, endpoint=url)
        got = await client.request(server.identity.did, intent, endpoint=url)
        assert got.result == {"inputs": {"k": 4}, "run": 1}
    assert sum(runs.values()) == 1


async def test_a_wall_clock_stepped_back_mid_request_still_answers_and_audits() -> None:
    """The campaign stepped a worker's clock back while an intent ran: the audit record's
    duration (wall clock, end minus start) came out negative, the record refused it, and the
    request ended in an unsigned, unlogged 500 "internal error" (its answer kept, never
    sent). Durations are now taken on the monotonic clock."""
    from a2a_secure.audit import Auditor, MemoryAuditSink

    sink = MemoryAuditSink()
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    server = AgentServer(
        identity("stepped-back"),
        Policy(),
        store=MemoryStore(),
        audit=Auditor([sink], role="server"),
        clock=clock,
    )

    @server.intent("record")
    async def record(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        offset[0] = -120.0  # back two minutes: within the freshness window
        return {"inputs": inputs}

    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        s = await handshake(http, [url], identity("stepped-back-caller"), server.identity.did)
        req = s.prepare_intent({"goal": "record", "inputs": {"k": 5}})
        resp = await send(http, url, req)
        assert resp.status_code == 200, resp.text
        assert s.verify_result(req, resp.json()["result"]).result == {"inputs": {"k": 5}}
    intents = [e for e in sink.events if e.event == "intent"]
    assert len(intents) == 1 and intents[0].status == "success"
    assert intents[0].duration_ms is not None and intents[0].duration_ms >= 0


class LostStartReply(MemoryStore):
    """A MemoryStore whose first ``start_intent`` is applied and its reply lost (Redis killed
    after running the script, before answering)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 1

    async def start_intent(self, *args: Any, **kw: Any) -> bool:
        done = await super().start_intent(*args, **kw)
        if self.lost and kw.get("started", True):
            self.lost -= 1
            raise Unavailable("shared store unavailable", retry_after=1)
        return done


async def test_a_start_whose_reply_was_lost_is_given_back_and_the_resend_runs() -> None:
    """Before: the claim stayed marked started for an intent that never ran, and resends got
    "still running", then "outcome unknown"."""
    store = LostStartReply()
    server, runs = counting_server(store, ServerLimits(replay_wait_seconds=1))
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        s = await handshake(http, [url], identity("lost-start"), server.identity.did)
        intent = {"goal": "record", "inputs": {"k": 6}, "intent_id": "G" * 22}
        first = await send(http, url, s.prepare_intent(intent))
        assert first.status_code == 503, first.text  # not run: the start is not known
        await asyncio.sleep(0.3)  # the give-back, 50 ms later
        again = s.prepare_intent(intent)
        resp = await send(http, url, again)
        assert resp.status_code == 200, resp.text
        assert s.verify_result(again, resp.json()["result"]).result == {"inputs": {"k": 6}, "run": 1}
    assert runs == Counter({"G" * 22: 1})


async def test_a_worker_started_while_redis_is_down_comes_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The campaign killed a worker while Redis restarted: the supervisor's new worker failed
    its start-up check, and uvicorn stopped the whole server. The check now says so (once,
    naming the URL) and the worker comes up, answering 503 until Redis is back."""
    import logging
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = closed.getsockname()[1]
    key = tmp_path / "agent.key"
    identity("restarted").save(key)
    env = {"A2A_SECURE_KEY_FILE": str(key), "A2A_SECURE_REDIS_URL": f"redis://127.0.0.1:{down}/0"}
    app = app_from_env(env)
    with caplog.at_level(logging.ERROR, logger="a2a_secure.server"):
        async with app.router.lifespan_context(app):
            pass
    assert f"Redis at redis://127.0.0.1:{down}/0 does not answer" in caplog.text
