"""The intent_id extension in the protocol core (docs/PROTOCOL.md §12.5).

An intent that carries an ``intent_id`` runs at most once per (client DID, intent_id), across
sessions: a resend on a new session gets the first run's answer, signed again for the new
request; a different intent under the same id is refused; a resend while the first run is
still running waits or gets 503, and never runs a second time. All in memory, with the fake
clock of ``protocol_helpers``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from protocol_helpers import T0, World, error_code, expect_error, is_signed_error, make_world, payload_of

from a2a_secure.errors import A2AError
from a2a_secure.identity import encoding
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.intent_id import new_intent_id
from a2a_secure.protocol.server import IntentContext, Reply, ServerLimits
from a2a_secure.runtime.exactly_once import STILL_RUNNING
from a2a_secure.store.intents import ClaimKind

IID = "AAAAAAAAAAAAAAAAAAAAAA"  # 22 characters: the shortest valid id
IID2 = "intent-id_0123456789-abcdefghij"


def with_id(intent: dict[str, Any], iid: str = IID) -> dict[str, Any]:
    return {**intent, "intent_id": iid}


async def send(w: World, sess: ClientSession, intent: dict[str, Any]) -> tuple[PreparedRequest, Reply]:
    req = sess.prepare_intent(intent)
    return req, await w.call("intent", req.params)


def result_of(sess: ClientSession, req: PreparedRequest, reply: Reply) -> Any:
    assert reply.error is None, reply.error
    return sess.verify_result(req, reply.result)


async def events_of(reply: Reply) -> list[dict[str, Any]]:
    assert reply.stream is not None, reply.error
    return [dict(ev) async for ev in reply.stream]


# -- the wire form ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        None,
        12345678901234567890123,
        ["A" * 22],
        "A" * 21,
        "A" * 65,
        "A" * 21 + "=",
        "A" * 21 + "+",
        "A" * 21 + "/",
        "A" * 21 + " ",
        "A" * 21 + "é",
        "",
    ],
)
async def test_bad_intent_id_forms_are_invalid_params(bad: Any) -> None:
    w = make_world()
    sess, _ = await w.open_session()
    req = sess.prepare_intent({"goal": "echo", "inputs": {}})
    params = {**req.params, "intent": {**req.params["intent"], "intent_id": bad}}
    # Step 1 (shape), before the session is looked up: unsigned -32602, nothing stored.
    reply = await expect_error(lambda: w.call("intent", params), -32602, 400, w.store)
    assert not is_signed_error(reply)
    # The client refuses to sign such an intent in the first place.
    with pytest.raises(A2AError) as caught:
        sess.prepare_intent({"goal": "echo", "inputs": {}, "intent_id": bad})
    assert caught.value.code == -32602


@pytest.mark.parametrize("length", [22, 43, 64])
async def test_valid_intent_ids_run(length: int) -> None:
    w = make_world()
    sess, _ = await w.open_session()
    iid = ("abcXYZ-_09" * 7)[:length]
    req, reply = await send(w, sess, with_id({"goal": "echo", "inputs": {"n": 1}}, iid))
    res = result_of(sess, req, reply)
    assert res.intent_id == iid and req.intent_id == iid
    assert w.handlers.count() == 1


def test_new_intent_ids_are_22_base64url_characters() -> None:
    ids = {new_intent_id(__import__("os").urandom) for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 22 and encoding.b64u_decode(i) for i in ids)


async def test_a_server_with_the_extension_off_refuses_intent_id_as_an_unknown_member() -> None:
    w = make_world(limits=ServerLimits(intent_id_retention=0))
    sess, _ = await w.open_session()
    req = sess.prepare_intent(with_id({"goal": "echo", "inputs": {}}))
    reply = await expect_error(lambda: w.call("intent", req.params), -32602, 400, w.store)
    assert "intent_id" in reply.error["message"]  # type: ignore[index]
    assert w.handlers.count() == 0
    # Without the member everything is as before.
    await w.intent(sess, n=1)


async def test_an_intent_without_intent_id_claims_nothing() -> None:
    w = make_world()
    sess, _ = await w.open_session()
    await w.intent(sess, n=1)
    assert w.store._claims == {} and w.store._claims_by_did == {}
    assert w.server._intents._exactly_once.running == {}


# -- at most once across sessions -------------------------------------------------------------------


async def test_resend_on_a_new_session_gets_the_first_answer_signed_again() -> None:
    w = make_world()
    intent = with_id({"goal": "echo", "inputs": {"text": "hi"}})
    s1, _ = await w.open_session()
    req1, reply1 = await send(w, s1, intent)
    first = result_of(s1, req1, reply1)
    assert w.handlers.count() == 1

    w.clock.advance(7)
    s2, _ = await w.open_session()
    s2.last_sequence = 4  # another session, another sequence
    req2, reply2 = await send(w, s2, intent)
    second = result_of(s2, req2, reply2)  # verifies: the new session, sequence and request hash
    assert w.handlers.count() == 1  # the handler did not run again
    assert second.result == first.result  # the first run's result (it names session 1)
    assert first.result["sequence"] == req1.sequence
    payload = payload_of(second.response_jws)
    assert payload["session_id"] == s2.session_id and payload["sequence"] == 5
    assert payload["request_hash"] == req2.request_hash
    assert payload["timestamp"] == T0 + 7  # signed at the resend, not at the first run

    # A byte-identical retry of the resend is answered from its stored answer, byte for byte.
    w.clock.advance(3)
    again = await w.call("intent", req2.params)
    assert again.result == reply2.result
    assert w.handlers.count() == 1


async def test_resend_on_the_same_session_with_a_new_sequence_gets_the_first_answer() -> None:
    w = make_world()
    intent = with_id({"goal": "echo", "inputs": {"k": 1}})
    sess, _ = await w.open_session()
    req1, reply1 = await send(w, sess, intent)
    req2, reply2 = await send(w, sess, intent)
    assert req2.sequence == req1.sequence + 1
    assert result_of(sess, req2, reply2).result == result_of(sess, req1, reply1).result
    assert w.handlers.count() == 1


async def test_same_intent_id_for_a_different_intent_is_refused_and_the_answer_kept() -> None:
    w = make_world()
    s1, _ = await w.open_session()
    req1, reply1 = await send(w, s1, with_id({"goal": "echo", "inputs": {"amount": 10}}))
    original = result_of(s1, req1, reply1)

    s2, _ = await w.open_session()
    for other in (
        {"goal": "echo", "inputs": {"amount": 1000}},
        {"goal": "translate", "inputs": {"amount": 10}},
        {"goal": "echo", "inputs": {"amount": 10}, "domain": "x"},
        {"goal": "echo", "inputs": {"amount": 10}, "constraints": {"timeout_ms": 5}},
    ):
        req, reply = await send(w, s2, with_id(other))
        assert error_code(reply) == -32044 and reply.http_status == 409
        assert "different intent" in reply.error["message"]  # type: ignore[index]
        err = s2.error_from_reply(req, reply.error)
        assert err.signed
    assert w.handlers.count() == 1
    # The original answer is unchanged for the original intent.
    req3, reply3 = await send(w, s2, with_id({"goal": "echo", "inputs": {"amount": 10}}))
    assert result_of(s2, req3, reply3).result == original.result
    assert w.handlers.count() == 1


async def test_the_same_intent_id_of_another_did_is_another_intent() -> None:
    w = make_world()
    intent = with_id({"goal": "echo", "inputs": {}})
    alice, _ = await w.open_session()
    from protocol_helpers import identity

    bob, _ = await w.open_session(identity("bob"))
    for sess in (alice, bob):
        req, reply = await send(w, sess, intent)
        result_of(sess, req, reply)
    assert w.handlers.count() == 2


async def test_errors_are_answers_too() -> None:
    w = make_world()
    s1, _ = await w.open_session()
    _req, reply = await send(w, s1, with_id({"goal": "reject", "inputs": {}}))
    assert error_code(reply) == -32602 and is_signed_error(reply)
    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, with_id({"goal": "reject", "inputs": {}}))
    assert error_code(reply2) == -32602
    err = s2.error_from_reply(req2, reply2.error)
    assert err.signed and err.message == reply.error["message"]  # type: ignore[index]
    assert w.handlers.count("reject") == 1


async def test_a_refused_intent_does_not_use_up_its_id() -> None:
    w = make_world()
    sess, _ = await w.open_session()
    _req, reply = await send(w, sess, with_id({"goal": "no-handler", "inputs": {}}))
    assert error_code(reply) == -32601
    assert w.store._claims == {}
    # Once a handler serves the goal, the same id runs.
    w.handlers.dispatcher.add("no-handler", w.handlers._echo)
    req2, reply2 = await send(w, sess, with_id({"goal": "no-handler", "inputs": {}}))
    result_of(sess, req2, reply2)
    assert len(w.store._claims) == 1


async def test_a_priority_above_the_callers_right_does_not_use_up_its_id() -> None:
    # §12.5: steps 9 and 10 come before the claim; the priority right is part of step 9.
    w = make_world()  # every caller may use priorities up to 3
    sess, _ = await w.open_session()
    req, reply = await send(w, sess, with_id({"goal": "echo", "inputs": {}, "priority": 5}))
    assert error_code(reply) == -32042 and sess.error_from_reply(req, reply.error).signed
    assert w.store._claims == {}
    # The corrected intent (another intent hash, the same id) runs, rather than a 409.
    req2, reply2 = await send(w, sess, with_id({"goal": "echo", "inputs": {}, "priority": 3}))
    result_of(sess, req2, reply2)
    assert w.handlers.count("echo") == 1


async def test_stream_false_on_an_always_streamed_goal_does_not_use_up_its_id() -> None:
    w = make_world()

    async def ticks(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        w.handlers.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        yield {"tick": 1}

    w.handlers.dispatcher.add_stream("ticks", ticks, always=True)
    sess, _ = await w.open_session()
    _req, reply = await send(
        w, sess, with_id({"goal": "ticks", "inputs": {}, "constraints": {"stream": False}})
    )
    assert error_code(reply) == -32602
    assert w.store._claims == {}
    _req2, reply2 = await send(w, sess, with_id({"goal": "ticks", "inputs": {}}))
    events = await events_of(reply2)
    assert events[-1]["final"] is True and w.handlers.count("ticks") == 1


# -- running, lost, full, expired ---------------------------------------------------------------------


def gate(w: World) -> asyncio.Event:
    release = asyncio.Event()

    async def slow(inputs: Any, ctx: IntentContext) -> Any:
        w.handlers.calls.append((ctx.goal, ctx.session_id, ctx.sequence))
        await release.wait()
        return {"done": inputs, "intent_id": ctx.intent_id}

    w.handlers.dispatcher.add("slow", slow)
    return release


async def test_resend_while_running_waits_then_503_and_never_runs_twice() -> None:
    w = make_world(limits=ServerLimits(replay_wait_seconds=0.05))
    release = gate(w)
    intent = with_id({"goal": "slow", "inputs": {"x": 1}})
    s1, _ = await w.open_session()
    req1 = s1.prepare_intent(intent)
    first = asyncio.ensure_future(w.call("intent", req1.params))
    await asyncio.sleep(0.01)
    assert w.handlers.count("slow") == 1

    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, intent)
    assert error_code(reply2) == -32048 and reply2.http_status == 503 and reply2.retry_after == 1
    assert reply2.error["message"] == STILL_RUNNING  # type: ignore[index]
    assert s2.error_from_reply(req2, reply2.error).signed
    # A byte-identical retry while it still runs: 503 again, still one run.
    assert error_code(await w.call("intent", req2.params)) == -32048

    release.set()
    res1 = result_of(s1, req1, await first)
    assert res1.result == {"done": {"x": 1}, "intent_id": IID}
    # The retry of the resend now gets the first run's answer, for its own request.
    retry = await w.call("intent", req2.params)
    assert result_of(s2, req2, retry).result == res1.result
    assert w.handlers.count("slow") == 1
    # ... and from then on the same bytes.
    assert (await w.call("intent", req2.params)).result == retry.result


async def test_resend_while_running_gets_the_answer_when_it_comes_within_the_wait() -> None:
    w = make_world(limits=ServerLimits(replay_wait_seconds=5))
    release = gate(w)
    intent = with_id({"goal": "slow", "inputs": {}})
    s1, _ = await w.open_session()
    req1 = s1.prepare_intent(intent)
    first = asyncio.ensure_future(w.call("intent", req1.params))
    await asyncio.sleep(0.01)
    s2, _ = await w.open_session()
    req2 = s2.prepare_intent(intent)
    second = asyncio.ensure_future(w.call("intent", req2.params))
    await asyncio.sleep(0.05)
    assert not second.done()
    release.set()
    r1, r2 = await first, await second
    assert result_of(s2, req2, r2).result == result_of(s1, req1, r1).result
    assert w.handlers.count("slow") == 1


async def test_a_run_that_never_reports_is_lost_and_not_run_again() -> None:
    # The first run's worker "dies": its request never finishes (a handler that hangs past
    # the running bound, on a clock moved by hand). A resend gets a signed "outcome
    # unknown" (-32049), never a second run.
    w = make_world(limits=ServerLimits(replay_wait_seconds=0.02))
    release = gate(w)
    intent = with_id({"goal": "slow", "inputs": {}})
    s1, _ = await w.open_session()
    req1 = s1.prepare_intent(intent)
    first = asyncio.ensure_future(w.call("intent", req1.params))
    await asyncio.sleep(0.01)
    w.clock.advance(30 + 60 + 1)  # max handler timeout + margin
    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, intent)
    assert error_code(reply2) == -32049 and reply2.http_status == 504
    assert "outcome unknown" in reply2.error["message"]  # type: ignore[index]
    assert s2.error_from_reply(req2, reply2.error).signed
    assert w.handlers.count("slow") == 1
    # If the run reports after all, later resends get its answer (still never a second run).
    release.set()
    await first
    s3, _ = await w.open_session()
    req3, reply3 = await send(w, s3, intent)
    assert result_of(s3, req3, reply3).result["intent_id"] == IID
    assert w.handlers.count("slow") == 1


async def test_per_did_bound_refuses_new_ids_without_consuming_the_sequence() -> None:
    w = make_world(limits=ServerLimits(max_intent_ids_per_did=2, intent_id_retention=600))
    sess, _ = await w.open_session()
    ids = [new_intent_id(w.rand) for _ in range(3)]
    for iid in ids[:2]:
        req, reply = await send(w, sess, with_id({"goal": "echo", "inputs": {}}, iid))
        result_of(sess, req, reply)
    req, reply = await send(w, sess, with_id({"goal": "echo", "inputs": {}}, ids[2]))
    assert error_code(reply) == -32048 and reply.http_status == 503
    assert 1 <= reply.retry_after <= 600 + 151  # until the oldest id expires
    assert "intent_ids" in reply.error["message"]  # type: ignore[index]
    assert sess.error_from_reply(req, reply.error).signed
    assert w.handlers.count() == 2
    # Nothing was consumed: another request may take that sequence number.
    sess.last_sequence -= 1
    req4, reply4 = await send(w, sess, {"goal": "echo", "inputs": {"plain": True}})
    assert req4.sequence == req.sequence
    result_of(sess, req4, reply4)
    # A remembered id is still answered while the DID is full.
    req5, reply5 = await send(w, sess, with_id({"goal": "echo", "inputs": {}}, ids[0]))
    result_of(sess, req5, reply5)
    assert w.handlers.count() == 3
    # Once the retention has passed, there is room again.
    w.clock.advance(600 + 200)
    s2, _ = await w.open_session()
    req6, reply6 = await send(w, s2, with_id({"goal": "echo", "inputs": {}}, ids[2]))
    result_of(s2, req6, reply6)


async def test_after_the_retention_window_a_resend_runs_again() -> None:
    w = make_world(limits=ServerLimits(intent_id_retention=1000))
    intent = with_id({"goal": "echo", "inputs": {}})
    s1, _ = await w.open_session()
    await send(w, s1, intent)
    w.clock.advance(999)
    s2, _ = await w.open_session()
    await send(w, s2, intent)
    assert w.handlers.count() == 1
    w.clock.advance(2 + 150)  # past the retention (and the running bound's margin)
    s3, _ = await w.open_session()
    req, reply = await send(w, s3, intent)
    result_of(s3, req, reply)
    assert w.handlers.count() == 2  # documented: outside the window the id is forgotten


# -- streams ---------------------------------------------------------------------------------------


def add_counter(w: World, runs: list[str]) -> asyncio.Event:
    release = asyncio.Event()
    release.set()

    async def counter(inputs: Any, ctx: IntentContext) -> AsyncIterator[Any]:
        runs.append(ctx.intent_id or "")
        for i in range(int(inputs["n"])):
            if i == 1:
                await release.wait()
            yield {"i": i}

    w.handlers.dispatcher.add_stream("counter", counter)
    return release


def check_events(sess: ClientSession, req: PreparedRequest, events: list[dict[str, Any]]) -> list[Any]:
    out = []
    for i, ev in enumerate(events):
        verified = sess.verify_event(req, ev, i)
        if verified.error is not None:
            raise verified.error
        out.append(verified.result)
    return out


async def test_resend_of_a_finished_stream_replays_its_events_signed_for_the_new_request() -> None:
    w = make_world()
    runs: list[str] = []
    add_counter(w, runs)
    intent = with_id({"goal": "counter", "inputs": {"n": 3}, "constraints": {"stream": True}})
    s1, _ = await w.open_session()
    req1, reply1 = await send(w, s1, intent)
    items1 = check_events(s1, req1, await events_of(reply1))
    assert items1 == [{"i": 0}, {"i": 1}, {"i": 2}, None]

    w.clock.advance(5)
    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, intent)
    events2 = await events_of(reply2)
    assert check_events(s2, req2, events2) == items1  # the signatures are for session 2
    assert all(payload_of(ev["response_jws"])["timestamp"] == T0 + 5 for ev in events2)
    assert runs == [IID]
    # A byte-identical retry of the resend replays the same events, byte for byte.
    again = await events_of(await w.call("intent", req2.params))
    assert again == events2


async def test_resend_of_a_truncated_stream_ends_with_a_signed_error() -> None:
    w = make_world()
    runs: list[str] = []
    add_counter(w, runs)
    intent = with_id({"goal": "counter", "inputs": {"n": 300}, "constraints": {"stream": True}})
    s1, _ = await w.open_session()
    _req1, reply1 = await send(w, s1, intent)
    assert len(await events_of(reply1)) == 301
    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, intent)
    events = await events_of(reply2)
    assert len(events) == 257  # the 256 kept events, then the final error
    with pytest.raises(A2AError) as caught:
        check_events(s2, req2, events)
    assert caught.value.code == -32048 and caught.value.signed
    assert check_events(s2, req2, events[:256]) == [{"i": i} for i in range(256)]
    assert runs == [IID]


async def test_resend_while_a_stream_runs_gets_still_running_then_its_events() -> None:
    w = make_world(limits=ServerLimits(replay_wait_seconds=0.05))
    runs: list[str] = []
    release = add_counter(w, runs)
    release.clear()
    intent = with_id({"goal": "counter", "inputs": {"n": 2}, "constraints": {"stream": True}})
    s1, _ = await w.open_session()
    req1, reply1 = await send(w, s1, intent)
    assert reply1.stream is not None  # the first event is out, the second is held
    s2, _ = await w.open_session()
    req2, reply2 = await send(w, s2, intent)
    assert error_code(reply2) == -32048 and reply2.error["message"] == STILL_RUNNING  # type: ignore[index]
    release.set()
    items1 = check_events(s1, req1, await events_of(reply1))
    await asyncio.sleep(0.01)
    retry = await w.call("intent", req2.params)
    assert check_events(s2, req2, await events_of(retry)) == items1
    assert runs == [IID]


# -- the store's side ---------------------------------------------------------------------------


async def test_the_claim_holds_the_answer_without_signatures() -> None:
    w = make_world()
    runs: list[str] = []
    add_counter(w, runs)
    s1, _ = await w.open_session()
    req, reply = await send(
        w, s1, with_id({"goal": "counter", "inputs": {"n": 2}, "constraints": {"stream": True}})
    )
    await events_of(reply)
    claim = await w.store.get_claim(
        w.client_id.did, IID, encoding.hash_of(req.params["intent"]), w.clock(), agent=w.server_id.did
    )
    assert claim.kind is ClaimKind.DONE and claim.reply is not None
    assert claim.reply.events is not None and len(claim.reply.events) == 3
    assert all("response_jws" not in ev for ev in claim.reply.events)
    other = await w.store.get_claim(
        w.client_id.did, IID, "sha256:" + "0" * 64, w.clock(), agent=w.server_id.did
    )
    assert other.kind is ClaimKind.CONFLICT


def test_intent_model_keeps_intent_id_in_its_wire_form() -> None:
    from a2a_secure.protocol.models import Intent

    intent = Intent.parse({"goal": "g", "inputs": {}, "intent_id": IID})
    assert intent.intent_id == IID and intent.to_dict()["intent_id"] == IID
    assert "intent_id" not in Intent.parse({"goal": "g", "inputs": {}}).to_dict()
    assert dataclasses.replace(intent, intent_id=None).to_dict() == {"goal": "g", "inputs": {}}
