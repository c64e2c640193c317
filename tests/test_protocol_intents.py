"""Signed intents and close (PROTOCOL.md §6, §7; ATTACKS.md G) between the two state machines.

Each rejection asserts the exact code and HTTP status, whether the error is signed (steps
5-11 carry ``data.response_jws``, steps 1-4 do not) and what happened to the state: steps
1-8 change nothing (the very same sequence is accepted afterwards), steps 9-11 consume the
sequence and store their answer, exactly as §6.1 step 8 says.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from protocol_helpers import (
    DROP,
    Flow,
    World,
    expect_error,
    flip_signature,
    forge_request,
    identity,
    is_signed_error,
    make_world,
    payload_of,
    resign,
    sign_raw,
    snapshot,
    with_token,
)

from a2a_secure.errors import (
    AuthenticationFailed,
    InvalidParams,
    PolicyViolation,
    SessionUnknown,
    StaleTimestamp,
    Unavailable,
)
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.messages import Typ
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.protocol.validate import MAX_SAFE_INT

ECHO: dict[str, Any] = {"goal": "echo", "inputs": {"x": 1}}
THIRD = identity("mallory")


async def open_session(w: World, client: str | None = None) -> ClientSession:
    return await Flow(w, identity(client) if client else None).complete()


async def send(w: World, req: PreparedRequest) -> Any:
    return await w.call(req.method, req.params)


async def accepted(w: World, sess: ClientSession, req: PreparedRequest) -> Any:
    reply = await send(w, req)
    assert reply.error is None, reply.error
    assert reply.http_status == 200
    if req.method == "close":
        sess.verify_closed(req, reply.result)
        return reply.result
    return sess.verify_result(req, reply.result)


async def rejected(
    w: World,
    sess: ClientSession,
    req: PreparedRequest,
    code: int,
    status: int,
    *,
    signed: bool,
    unchanged: bool = True,
) -> Any:
    """Send ``req``; expect exactly ``code``/``status``, signed or not; by default no state change."""
    reply = await expect_error(lambda: send(w, req), code, status, store=w.store if unchanged else None)
    assert is_signed_error(reply) is signed
    err = sess.error_from_reply(req, reply.error)
    assert err.code == code
    assert err.signed is signed
    return reply


def last_sequence(w: World, sess: ClientSession) -> int:
    return w.store._seq[sess.session_id].last


@pytest.fixture
def w() -> World:
    return make_world()


@pytest.fixture
async def sess(w: World) -> ClientSession:
    return await open_session(w)


# -- 1. the honest path ------------------------------------------------------------------------
async def test_handshake_intents_retry_and_close(w: World) -> None:
    sess = await open_session(w)
    assert w.store.counts() == {"pending": 0, "sessions": 1, "rates": 0, "claims": 0}
    results = []
    for i, goal in enumerate(["echo", "translate", "echo", "echo"], start=1):
        req = sess.prepare_intent({"goal": goal, "domain": "test", "inputs": {"i": i}})
        assert req.sequence == i
        res = await accepted(w, sess, req)
        assert res.status == "success" and res.sequence == i
        assert res.result == {"echo": {"i": i}, "caller": w.client_id.did, "sequence": i}
        results.append((req, res))
        w.clock.advance(7)
    assert w.handlers.count() == 4
    assert last_sequence(w, sess) == 4

    # A byte-identical retry of the last request: the stored answer, the handler not run again.
    req, first = results[-1]
    w.clock.advance(100)
    before = snapshot(w.store)
    reply = await send(w, req)
    assert reply.error is None
    assert reply.result["response_jws"] == first.response_jws  # the stored answer, byte for byte
    assert sess.verify_result(req, reply.result).result == first.result
    assert w.handlers.count() == 4
    assert snapshot(w.store) == before
    # A retry of an older request is a sequence error (only the last answer is kept).
    await rejected(w, sess, results[1][0], -32044, 409, signed=True)

    close = sess.prepare_close()
    assert close.sequence == 5
    closed = await accepted(w, sess, close)
    assert closed["type"] == "closed" and closed["session_id"] == sess.session_id
    assert sess.closed and sess.expired()
    assert w.store.counts()["sessions"] == 0
    with pytest.raises(SessionUnknown):
        sess.prepare_intent(ECHO)
    # After close the session is unknown, a retried close and a fresh forged intent included.
    await rejected(w, sess, close, -32043, 401, signed=False)
    await rejected(w, sess, forge_request(sess, ECHO, sequence=6), -32043, 401, signed=False)
    assert w.handlers.count() == 4
    events = [(e["event"], e["status"], e["error_code"]) for e in w.audit]
    assert events[:3] == [
        ("hello", "success", None),
        ("proof", "success", None),
        ("accept_policy", "success", None),
    ]
    assert events[3:8] == [("intent", "success", None)] * 5
    assert events[8] == ("intent", "error", -32044)
    assert events[9] == ("close", "success", None)


async def test_retry_of_a_stored_error_answer(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "boom", "inputs": {}})
    first = await rejected(w, sess, req, -32603, 500, signed=True, unchanged=False)
    again = await rejected(w, sess, req, -32603, 500, signed=True)
    assert again.error == first.error
    assert w.handlers.count("boom") == 1


def _slow(w: World) -> tuple[asyncio.Event, asyncio.Event, list[int]]:
    """Serve ``slow``: it records its sequence, sets ``started``, and waits for ``gate``."""
    gate, started, runs = asyncio.Event(), asyncio.Event(), []

    async def slow(inputs: Any, ctx: IntentContext) -> Any:
        runs.append(ctx.sequence)
        started.set()
        await gate.wait()
        return {"done": True}

    w.handlers.dispatcher.add("slow", slow)
    return gate, started, runs


async def test_retry_while_the_original_still_runs(w: World, sess: ClientSession) -> None:
    gate, started, runs = _slow(w)
    req = sess.prepare_intent({"goal": "slow", "inputs": {}})
    original = asyncio.create_task(send(w, req))
    await started.wait()
    retry = asyncio.create_task(send(w, req))
    await asyncio.sleep(0)
    gate.set()
    r1, r2 = await original, await retry
    assert r1.result == r2.result
    sess.verify_result(req, r2.result)
    assert runs == [req.sequence]


async def test_retry_while_running_gives_up_after_the_wait(w: World, sess: ClientSession) -> None:
    gate, started, _runs = _slow(w)
    req = sess.prepare_intent({"goal": "slow", "inputs": {}})
    original = asyncio.create_task(send(w, req))
    await started.wait()
    retry = asyncio.create_task(send(w, req))
    await asyncio.sleep(0)
    w.clock.advance(ServerLimits().replay_wait_seconds + 1)
    r2 = await retry
    assert r2.error is not None and (r2.error["code"], r2.http_status) == (-32048, 503)
    assert r2.retry_after == 1 and r2.error["data"]["retry_after"] == 1
    assert sess.error_from_reply(req, r2.error).signed
    gate.set()
    r1 = await original
    sess.verify_result(req, r1.result)
    r3 = await send(w, req)
    assert r3.result == r1.result


async def test_retry_waiting_through_a_store_that_lost_the_original(w: World, sess: ClientSession) -> None:
    # A failover to a replica the original's begin had not reached: the waiting retry's
    # look-up finds the sequence free and takes it again (same hash). It must keep waiting
    # for the original's answer, not run the intent nor tell the client it was refused.
    gate, started, runs = _slow(w)
    req = sess.prepare_intent({"goal": "slow", "inputs": {}})
    original = asyncio.create_task(send(w, req))
    await started.wait()
    state = w.store._seq[sess.session_id]
    lost_to = req.sequence - 1
    retry = asyncio.create_task(send(w, req))
    for _ in range(5):
        await asyncio.sleep(0.02)  # the retry is waiting, polling the store
    assert not retry.done()
    state.last, state.request_hash = lost_to, ""  # the failover: the begin is gone
    for _ in range(5):
        await asyncio.sleep(0.02)
    assert not retry.done() and state.last == req.sequence  # taken again by the poll
    gate.set()
    r1, r2 = await original, await retry
    assert r2.error is None, r2.error
    assert r1.result == r2.result
    sess.verify_result(req, r2.result)
    assert runs == [req.sequence]


# -- step 1: shapes (-32602), nothing changes ----------------------------------------------------
def _mutated(params: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(params)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


INTENT_SHAPES = [
    (("extra",), 1),
    (("type",), "intent"),
    (("intent",), DROP),
    (("request_jws",), DROP),
    (("sequence",), 0),
    (("sequence",), -1),
    (("sequence",), True),
    (("sequence",), 1.0),
    (("sequence",), "1"),
    (("sequence",), MAX_SAFE_INT + 1),
    (("session_id",), encoding.b64u_encode(bytes(31))),
    (("session_id",), encoding.b64u_encode(bytes(32)) + "="),
    (("session_commitment",), "sha256:XYZ"),
    (("session_commitment",), "sha256:" + "A" * 64),
    (("intent", "extra"), 1),
    (("intent", "goal"), ""),
    (("intent", "goal"), "g" * 129),
    (("intent", "goal"), 5),
    (("intent", "inputs"), [1]),
    (("intent", "inputs"), DROP),
    (("intent", "domain"), 1),
    (("intent", "constraints"), {"retries": 3}),
    (("intent", "constraints"), {"timeout_ms": 0}),
    (("intent", "constraints"), {"timeout_ms": 1.5}),
    (("intent", "constraints"), {"max_tokens": -1}),
    (("intent", "constraints"), {"stream": "yes"}),
    (("intent", "constraints"), []),
    (("request_jws",), "a.b"),
    (("request_jws",), "a.b.c.d"),
    (("request_jws",), 7),
]


@pytest.mark.parametrize(("path", "value"), INTENT_SHAPES, ids=lambda v: repr(v)[:40])
async def test_intent_params_shape(w: World, sess: ClientSession, path: tuple[str, ...], value: Any) -> None:
    req = sess.prepare_intent(ECHO)
    bad = _mutated(req.params, path, value)
    await expect_error(lambda: w.call("intent", bad), -32602, 400, store=w.store)
    await accepted(w, sess, req)  # the sequence was not consumed


async def test_intent_params_not_an_object(w: World, sess: ClientSession) -> None:
    await expect_error(lambda: w.call("intent", [1]), -32602, 400, store=w.store)
    await expect_error(lambda: w.call("close", None), -32602, 400, store=w.store)


@pytest.mark.parametrize(
    ("path", "value"),
    [(("extra",), 1), (("intent",), ECHO), (("sequence",), 0), (("request_jws",), DROP)],
    ids=["extra", "intent-member", "sequence-0", "no-jws"],
)
async def test_close_params_shape(w: World, sess: ClientSession, path: tuple[str, ...], value: Any) -> None:
    req = sess.prepare_close()
    await expect_error(lambda: w.call("close", _mutated(req.params, path, value)), -32602, 400, store=w.store)
    await accepted(w, sess, req)


async def test_client_refuses_malformed_intents(sess: ClientSession) -> None:
    for bad in ({"goal": "echo"}, {"goal": "", "inputs": {}}, {"goal": "echo", "inputs": {}, "x": 1}):
        with pytest.raises(InvalidParams):
            sess.prepare_intent(bad)
    assert sess.last_sequence == 0


# -- steps 2-4: session, commitment, signature (unsigned errors) -----------------------------------
async def test_unknown_session(w: World, sess: ClientSession) -> None:
    req = forge_request(
        sess, ECHO, sequence=1, params_changes={"session_id": encoding.b64u_encode(bytes(32))}
    )
    await rejected(w, sess, req, -32043, 401, signed=False)
    await accepted(w, sess, forge_request(sess, ECHO, sequence=1))


async def test_session_expires_at_expires_at() -> None:
    w = make_world(Policy.build(session_timeout=600))
    sess = await open_session(w)
    w.clock.advance(599)
    await accepted(w, sess, sess.prepare_intent(ECHO))  # one second before: still open
    late = sess.prepare_intent(ECHO)
    w.clock.advance(1)  # now == expires_at
    assert sess.expired()
    reply = await rejected(w, sess, late, -32043, 401, signed=False, unchanged=False)
    assert reply.retry_after is None
    assert w.store.counts()["sessions"] == 0
    assert w.handlers.count() == 1
    with pytest.raises(SessionUnknown):  # the client refuses too
        sess.prepare_intent(ECHO)
    assert sess.last_sequence == 2
    w.clock.advance(10_000)
    await rejected(w, sess, late, -32043, 401, signed=False)


async def test_closed_session(w: World, sess: ClientSession) -> None:
    pending = sess.prepare_intent(ECHO)  # signed before the close
    await accepted(w, sess, sess.prepare_close())
    await rejected(w, sess, pending, -32043, 401, signed=False)


async def test_commitment_mismatch_in_params(w: World, sess: ClientSession) -> None:
    req = forge_request(sess, ECHO, sequence=1, params_changes={"session_commitment": encoding.hash_of({})})
    await rejected(w, sess, req, -32040, 401, signed=False)
    await accepted(w, sess, forge_request(sess, ECHO, sequence=1))


def _signature_forgeries(w: World, sess: ClientSession) -> dict[str, PreparedRequest]:
    c = w.client_id
    plain = forge_request(sess, ECHO, sequence=1)
    return {
        "typ-close": forge_request(sess, ECHO, sequence=1, typ=Typ.CLOSE),
        "typ-response": forge_request(sess, ECHO, sequence=1, typ=Typ.RESPONSE),
        "typ-proof": forge_request(sess, ECHO, sequence=1, typ=Typ.PROOF),
        "kid-other-fragment": forge_request(sess, ECHO, sequence=1, kid=c.did + "#k2"),
        "kid-third": forge_request(sess, ECHO, sequence=1, kid=THIRD.kid),
        "signer-third": forge_request(sess, ECHO, sequence=1, signer=THIRD, kid=c.kid),
        "signer-third-own-kid": forge_request(sess, ECHO, sequence=1, signer=THIRD),  # G10
        "signer-server": forge_request(sess, ECHO, sequence=1, signer=w.server_id, kid=c.kid),
        "bad-signature": with_token(plain, flip_signature(plain.params["request_jws"])),
    }


SIGNATURE_CASES = [
    "typ-close",
    "typ-response",
    "typ-proof",
    "kid-other-fragment",
    "kid-third",
    "signer-third",
    "signer-third-own-kid",
    "signer-server",
    "bad-signature",
]


@pytest.mark.parametrize("case", SIGNATURE_CASES)
async def test_request_signature_failures_are_unsigned(w: World, sess: ClientSession, case: str) -> None:
    forgeries = _signature_forgeries(w, sess)
    assert sorted(forgeries) == sorted(SIGNATURE_CASES)
    await rejected(w, sess, forgeries[case], -32040, 401, signed=False)
    assert last_sequence(w, sess) == 0
    await accepted(w, sess, forge_request(sess, ECHO, sequence=1))


async def test_header_with_extra_member_is_refused(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent(ECHO)
    tok = resign(req.params["request_jws"], w.client_id, extra_header={"jku": "https://evil/keys"})
    await rejected(w, sess, with_token(req, tok), -32040, 401, signed=False)
    await accepted(w, sess, req)


async def test_session_of_another_did(w: World, sess: ClientSession) -> None:
    """G10/F17: B presents A's session id and commitment with B's own signature."""
    other = await open_session(w, "bob")
    forged = forge_request(other, ECHO, sequence=1)
    forged = with_token(
        forge_request(sess, ECHO, sequence=1),
        sign_raw(
            {
                **payload_of(forged.params["request_jws"]),
                "session_id": sess.session_id,
                "session_commitment": sess.session_commitment,
            },
            other.identity,
            typ=Typ.REQUEST,
        ),
    )
    await rejected(w, sess, forged, -32040, 401, signed=False)
    await accepted(w, sess, forge_request(sess, ECHO, sequence=1))
    await accepted(w, other, other.prepare_intent(ECHO))


async def test_close_and_request_signatures_are_not_interchangeable(w: World, sess: ClientSession) -> None:
    intent = sess.prepare_intent(ECHO)
    close = sess.prepare_close()
    as_close = PreparedRequest(
        "close",
        {k: v for k, v in intent.params.items() if k != "intent"},
        intent.sequence,
        intent.request_hash,
        intent.timestamp,
    )
    await rejected(w, sess, as_close, -32040, 401, signed=False)
    as_intent = PreparedRequest(
        "intent", {**close.params, "intent": ECHO}, close.sequence, close.request_hash, close.timestamp
    )
    await rejected(w, sess, as_intent, -32040, 401, signed=False)
    await accepted(w, sess, intent)
    await accepted(w, sess, close)


# -- step 5: payload members (signed -32040, sequence from params) ---------------------------------
PAYLOAD_CASES: dict[str, dict[str, Any]] = {
    "intent-differs": {"payload_changes": {"intent": {"goal": "echo", "inputs": {"x": 2}}}},
    "goal-differs": {"payload_changes": {"intent": {"goal": "translate", "inputs": {"x": 1}}}},
    "sequence-differs": {"payload_changes": {"sequence": 2}},
    "extra-member": {"payload_changes": {"aud": "did:key:z"}},
    "missing-member": {"payload_changes": {"timestamp": DROP}},
    "timestamp-string": {"payload_changes": {"timestamp": "1763700000"}},
    "sequence-bool": {"payload_changes": {"sequence": True}},
    "intent-number-type": {"payload_changes": {"intent": {"goal": "echo", "inputs": {"x": True}}}},
}


@pytest.mark.parametrize("case", sorted(PAYLOAD_CASES))
async def test_payload_mismatch_is_a_signed_authentication_failure(
    w: World, sess: ClientSession, case: str
) -> None:
    """G6: only signed content is acted on; unsigned params must equal the signed ones."""
    req = forge_request(sess, ECHO, sequence=1, **PAYLOAD_CASES[case])
    reply = await rejected(w, sess, req, -32040, 401, signed=True)
    signed = payload_of(reply.error["data"]["response_jws"])
    assert signed["sequence"] == 1 and signed["status"] == "error"  # §9: the params' sequence
    assert signed["request_hash"] == req.request_hash
    await accepted(w, sess, forge_request(sess, ECHO, sequence=1))


async def test_request_of_another_session_replayed(w: World, sess: ClientSession) -> None:
    """G4: a request of session 1 sent into session 2 of the same peers."""
    two = await open_session(w)
    req = sess.prepare_intent(ECHO)
    moved = PreparedRequest(
        "intent",
        {**req.params, "session_id": two.session_id, "session_commitment": two.session_commitment},
        req.sequence,
        req.request_hash,
        req.timestamp,
    )
    reply = await rejected(w, two, moved, -32040, 401, signed=True)
    assert payload_of(reply.error["data"]["response_jws"])["session_id"] == two.session_id
    await accepted(w, sess, req)
    await accepted(w, two, two.prepare_intent(ECHO))


async def test_close_payload_must_say_true(w: World, sess: ClientSession) -> None:
    req = sess.prepare_close()
    tok = resign(req.params["request_jws"], w.client_id, close=1)
    await rejected(w, sess, with_token(req, tok), -32040, 401, signed=True)
    await accepted(w, sess, req)


# -- step 6: freshness (signed -32045, nothing consumed) -------------------------------------------
@pytest.mark.parametrize("delta", [-301, 301, -3600])
async def test_intent_stale_or_future_timestamp(w: World, sess: ClientSession, delta: int) -> None:
    with w.clock.shifted(delta):
        req = sess.prepare_intent(ECHO)
    await rejected(w, sess, req, -32045, 401, signed=True)
    # The sequence was not consumed: the same number, freshly signed, is accepted.
    await accepted(w, sess, forge_request(sess, ECHO, sequence=req.sequence))
    assert w.handlers.count() == 1


@pytest.mark.parametrize("delta", [-300, 300])
async def test_intent_timestamp_at_the_boundary_passes(w: World, sess: ClientSession, delta: int) -> None:
    with w.clock.shifted(delta):
        req = sess.prepare_intent(ECHO)
    await accepted(w, sess, req)


@pytest.mark.parametrize("delta", [-301, 301])
async def test_close_stale_timestamp(w: World, sess: ClientSession, delta: int) -> None:
    with w.clock.shifted(delta):
        req = sess.prepare_close()
    await rejected(w, sess, req, -32045, 401, signed=True)
    assert w.store.counts()["sessions"] == 1


# -- step 7: sequences --------------------------------------------------------------------------
async def test_same_sequence_different_bytes(w: World, sess: ClientSession) -> None:
    """G1: the same sequence with another request is a replay (-32044), signed."""
    first = sess.prepare_intent(ECHO)
    await accepted(w, sess, first)
    w.clock.advance(1)
    other = forge_request(sess, ECHO, sequence=first.sequence)  # same intent, new timestamp
    assert other.params["request_jws"] != first.params["request_jws"]
    await rejected(w, sess, other, -32044, 409, signed=True)
    await rejected(
        w,
        sess,
        forge_request(sess, {"goal": "echo", "inputs": {"y": 1}}, sequence=1),
        -32044,
        409,
        signed=True,
    )
    assert w.handlers.count() == 1
    await accepted(w, sess, sess.prepare_intent(ECHO))


async def test_lower_sequence(w: World, sess: ClientSession) -> None:
    for _ in range(3):
        await accepted(w, sess, sess.prepare_intent(ECHO))
    reply = await rejected(w, sess, forge_request(sess, ECHO, sequence=2), -32044, 409, signed=True)
    assert "2" in reply.error["message"] and "3" in reply.error["message"]
    await accepted(w, sess, sess.prepare_intent(ECHO))
    assert last_sequence(w, sess) == 4


async def test_gaps_are_allowed(w: World, sess: ClientSession) -> None:
    """G2 as PROTOCOL.md decides: gaps are allowed, a number is accepted at most once."""
    for seq in (1, 5, 9):
        sess.last_sequence = seq - 1
        res = await accepted(w, sess, sess.prepare_intent(ECHO))
        assert res.sequence == seq
    w.clock.advance(1)  # so that a re-signed 9 is not byte-identical to the accepted one
    for seq in (2, 4, 5, 8, 9):
        await rejected(w, sess, forge_request(sess, ECHO, sequence=seq), -32044, 409, signed=True)
    assert [s for _, _, s in w.handlers.calls] == [1, 5, 9]


async def test_largest_sequence(w: World, sess: ClientSession) -> None:
    """G8: 2^53-1 is the last sequence; the client then needs a new session."""
    sess.last_sequence = MAX_SAFE_INT - 1
    await accepted(w, sess, sess.prepare_intent(ECHO))
    with pytest.raises(SessionUnknown):
        sess.prepare_intent(ECHO)


async def test_close_with_an_old_sequence(w: World, sess: ClientSession) -> None:
    await accepted(w, sess, sess.prepare_intent(ECHO))
    await accepted(w, sess, sess.prepare_intent(ECHO))
    sess.last_sequence = 1
    close = sess.prepare_close()
    await rejected(w, sess, close, -32044, 409, signed=True)
    assert w.store.counts()["sessions"] == 1
    sess.last_sequence = 2
    await accepted(w, sess, sess.prepare_close())


async def test_close_consumes_a_sequence(w: World, sess: ClientSession) -> None:
    """Close shares the counter: an intent signed before the close with the same number fails."""
    intent = forge_request(sess, ECHO, sequence=1)
    sess.last_sequence = 0
    await accepted(w, sess, sess.prepare_close())
    await rejected(w, sess, intent, -32043, 401, signed=False)


# -- step 8: rate limit ----------------------------------------------------------------------------
async def test_rate_limit() -> None:
    w = make_world(Policy.build(rate_limit=2, rate_period=60))
    sess = await open_session(w)
    assert int(w.clock()) % 60 == 0
    w.clock.advance(10)
    for _ in range(2):
        await accepted(w, sess, sess.prepare_intent(ECHO))
    over = sess.prepare_intent(ECHO)
    reply = await rejected(w, sess, over, -32048, 503, signed=True)
    assert reply.retry_after == 50
    assert reply.error["data"]["retry_after"] == 50
    err = sess.error_from_reply(over, reply.error)
    assert isinstance(err, Unavailable) and err.retry_after == 50 and err.signed
    assert last_sequence(w, sess) == 2
    # Nothing was consumed: the very same request is accepted once the window has moved.
    w.clock.advance(49)
    await rejected(w, sess, over, -32048, 503, signed=True)
    w.clock.advance(1)
    await accepted(w, sess, over)
    assert w.handlers.count() == 3


async def test_rate_limit_is_per_did_across_sessions() -> None:
    w = make_world(Policy.build(rate_limit=3, rate_period=60))
    one, two = await open_session(w), await open_session(w)
    bob = await open_session(w, "bob")
    await accepted(w, one, one.prepare_intent(ECHO))
    await accepted(w, one, one.prepare_intent(ECHO))
    await accepted(w, two, two.prepare_intent(ECHO))
    await rejected(w, two, two.prepare_intent(ECHO), -32048, 503, signed=True)
    await rejected(w, one, one.prepare_intent(ECHO), -32048, 503, signed=True)
    await accepted(w, bob, bob.prepare_intent(ECHO))  # another DID has its own counter
    # Close is not rate limited.
    await accepted(w, one, one.prepare_close())


# -- step 9: policy --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "goal", "allowed"),
    [
        (Policy.build(allowed=["echo"], blocked=["echo"]), "echo", False),  # blocked wins
        (Policy.build(allowed=["*"], blocked=["boom"]), "boom", False),
        (Policy.build(allowed=["*"], blocked=["boom"]), "echo", True),
        (Policy.build(allowed=["*"], blocked=["*"]), "echo", False),
        (Policy.build(allowed=["echo"], blocked=["*"]), "echo", False),
        (Policy.build(allowed=[]), "echo", False),  # an empty allow list allows none
        (Policy.build(allowed=["echo"]), "translate", False),
        (Policy.build(allowed=["echo"]), "echo", True),
        (Policy.build(allowed=["ech*"]), "echo", False),  # "*" is not a glob
        (Policy.build(allowed=["*"]), "*", True),
    ],
)
async def test_policy(policy: Policy, goal: str, allowed: bool) -> None:
    w = make_world(policy)
    w.handlers.dispatcher.add("*", w.handlers.dispatcher._handlers["echo"])
    sess = await open_session(w)
    intent = {"goal": goal, "inputs": {}}
    assert sess.policy.allows(goal) is allowed
    if allowed:
        await accepted(w, sess, sess.prepare_intent(intent))
        return
    with pytest.raises(PolicyViolation):  # the client refuses to send it
        sess.prepare_intent(intent)
    assert sess.last_sequence == 0
    req = forge_request(sess, intent)
    reply = await rejected(w, sess, req, -32042, 403, signed=True, unchanged=False)
    assert w.handlers.count() == 0
    # Step 9 comes after the sequence was consumed: the answer is stored and replayed.
    assert last_sequence(w, sess) == 1
    again = await rejected(w, sess, req, -32042, 403, signed=True)
    assert again.error == reply.error
    assert w.handlers.count() == 0


async def test_session_keeps_its_policy(w: World, sess: ClientSession) -> None:
    w.server.policy = Policy.build(blocked=["*"])
    await accepted(w, sess, sess.prepare_intent(ECHO))
    later = await open_session(w)
    assert later.policy.blocked_intents == ("*",)
    await rejected(w, later, forge_request(later, ECHO), -32042, 403, signed=True, unchanged=False)


# -- steps 10-11: handler --------------------------------------------------------------------------
async def test_no_handler(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "unknown-goal", "inputs": {}})
    await rejected(w, sess, req, -32601, 404, signed=True, unchanged=False)
    assert last_sequence(w, sess) == req.sequence
    await rejected(w, sess, req, -32601, 404, signed=True)  # stored answer


async def test_handler_timeout(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "hang", "inputs": {}, "constraints": {"timeout_ms": 1}})
    reply = await rejected(w, sess, req, -32049, 504, signed=True, unchanged=False)
    assert "1 ms" in reply.error["message"]
    await rejected(w, sess, req, -32049, 504, signed=True)
    assert w.handlers.count("hang") == 1


async def test_handler_timeout_is_capped_by_the_server() -> None:
    w = make_world(limits=ServerLimits(max_handler_timeout_ms=1))
    sess = await open_session(w)
    req = sess.prepare_intent({"goal": "hang", "inputs": {}, "constraints": {"timeout_ms": 10**9}})
    await rejected(w, sess, req, -32049, 504, signed=True, unchanged=False)


async def test_handler_exception_is_generic(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "boom", "inputs": {}})
    reply = await rejected(w, sess, req, -32603, 500, signed=True, unchanged=False)
    text = repr(reply.error) + repr(payload_of(reply.error["data"]["response_jws"])) + repr(w.audit)
    assert "SECRET" not in text and "hunter2" not in text and "handler.py" not in text
    assert "Traceback" not in text and "RuntimeError" not in text
    assert w.audit[-1]["error_code"] == -32603 and w.audit[-1]["verified"] is True
    await accepted(w, sess, sess.prepare_intent(ECHO))


async def test_handler_rejecting_inputs(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "reject", "inputs": {"x": 1}})
    reply = await rejected(w, sess, req, -32602, 400, signed=True, unchanged=False)
    assert reply.error["message"] == "inputs.x must be a string"


async def test_handler_returning_non_json(w: World, sess: ClientSession) -> None:
    async def bad(inputs: Any, ctx: IntentContext) -> Any:
        return {"x": float("nan")}

    w.handlers.dispatcher.add("nan", bad)
    await rejected(
        w, sess, sess.prepare_intent({"goal": "nan", "inputs": {}}), -32603, 500, signed=True, unchanged=False
    )


# -- signed answers seen by the client --------------------------------------------------------------
async def test_mitm_edits_of_a_signed_error(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent({"goal": "unknown-goal", "inputs": {}})
    reply = await send(w, req)
    assert sess.error_from_reply(req, reply.error).signed
    edits = {
        "code": {**reply.error, "code": -32042},
        "message": {**reply.error, "message": "policy says no"},
        "no-jws": {**reply.error, "data": {}},
        "no-data": {"code": reply.error["code"], "message": reply.error["message"]},
        "jws-flipped": {
            **reply.error,
            "data": {"response_jws": flip_signature(reply.error["data"]["response_jws"])},
        },
    }
    for name, edited in edits.items():
        err = sess.error_from_reply(req, edited)
        assert err.signed is False, name
    assert sess.error_from_reply(req, edits["code"]).code == -32042  # the claim, unauthenticated
    # A signed error for another request does not authenticate this one.
    other = sess.prepare_intent({"goal": "unknown-goal", "inputs": {}})
    assert sess.error_from_reply(other, reply.error).signed is False
    assert sess.error_from_reply(req, None).signed is False


async def test_edited_result_fails_verification(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent(ECHO)
    reply = await send(w, req)
    good = reply.result
    other_req = sess.prepare_intent(ECHO)
    other = (await send(w, other_req)).result
    edits = {
        "result": {**good, "result": {**good["result"], "echo": {"x": 2}}},
        "status": {**good, "status": "error"},
        "sequence": {**good, "sequence": 2},
        "sequence-type": {**good, "sequence": 1.0},
        "extra": {**good, "extra": 1},
        "jws-of-other-request": {**good, "response_jws": other["response_jws"]},
        "jws-flipped": {**good, "response_jws": flip_signature(good["response_jws"])},
        "jws-resigned-by-third": {**good, "response_jws": resign(good["response_jws"], THIRD)},
        "jws-wrong-typ": {**good, "response_jws": resign(good["response_jws"], w.server_id, typ=Typ.EVENT)},
        "jws-malformed": {**good, "response_jws": "a.b"},
    }
    for name, edited in edits.items():
        with pytest.raises(AuthenticationFailed):
            sess.verify_result(req, edited)
        assert name
    with pytest.raises(AuthenticationFailed):
        sess.verify_result(req, other)
    assert sess.verify_result(req, good).result == good["result"]


async def test_client_checks_response_freshness(w: World, sess: ClientSession) -> None:
    req = sess.prepare_intent(ECHO)
    reply = await send(w, req)
    with w.clock.shifted(301), pytest.raises(StaleTimestamp):
        sess.verify_result(req, reply.result)
    with w.clock.shifted(300):
        sess.verify_result(req, reply.result)


async def test_edited_close_result_fails_verification(w: World, sess: ClientSession) -> None:
    req = sess.prepare_close()
    reply = await send(w, req)
    for edited in (
        {**reply.result, "session_id": encoding.b64u_encode(bytes(32))},
        {**reply.result, "type": "open"},
        {**reply.result, "response_jws": resign(reply.result["response_jws"], THIRD)},
    ):
        with pytest.raises(AuthenticationFailed):
            sess.verify_closed(req, edited)
    assert not sess.closed
    sess.verify_closed(req, reply.result)
    assert sess.closed


# -- audit --------------------------------------------------------------------------------------
async def test_audit_records_of_rejections(w: World, sess: ClientSession) -> None:
    n = len(w.audit)
    await send(w, forge_request(sess, ECHO, sequence=1, signer=THIRD))
    await send(w, forge_request(sess, ECHO, sequence=1, payload_changes={"sequence": 3}))
    await send(w, forge_request(sess, {"goal": "echo", "inputs": {"secret": "tok-123"}}, sequence=1))
    recs = w.audit[n:]
    assert [(r["event"], r["error_code"], r["verified"]) for r in recs] == [
        ("intent", -32040, False),
        ("intent", -32040, True),
        ("intent", None, True),
    ]
    assert all(r["session_id"] == sess.session_id and r["client_did"] == w.client_id.did for r in recs)
    assert "tok-123" not in repr(w.audit)
    assert {r["sequence"] for r in recs} == {1}


async def test_messages_name_the_numbers(w: World, sess: ClientSession) -> None:
    await accepted(w, sess, forge_request(sess, ECHO, sequence=7))
    reply = await send(w, forge_request(sess, ECHO, sequence=4))
    assert reply.error["message"] == "sequence 4 is not greater than 7"


async def test_replayed_503_keeps_retry_after(w: World, sess: ClientSession) -> None:
    """A stored 503 answer (a handler that raised Unavailable) is replayed with its Retry-After."""

    async def busy(inputs: Any, ctx: IntentContext) -> Any:
        raise Unavailable("backend busy", retry_after=7)

    w.handlers.dispatcher.add("busy", busy)
    req = sess.prepare_intent({"goal": "busy", "inputs": {}})
    first = await rejected(w, sess, req, -32048, 503, signed=True, unchanged=False)
    again = await rejected(w, sess, req, -32048, 503, signed=True)
    assert first.retry_after == again.retry_after == 7
    assert again.error == first.error


async def test_stored_answer_is_kept_unsigned_and_replayed_byte_for_byte(
    w: World, sess: ClientSession
) -> None:
    """The store keeps the result and its timestamp, not the token: a retry re-signs it."""
    req = sess.prepare_intent({"goal": "echo", "inputs": {"text": "x" * 300, "n": [1.5, -0.0, 2**53 - 1]}})
    reply = await send(w, req)
    token = reply.result["response_jws"]
    kept = w.store._seq[sess.session_id].reply
    assert kept is not None
    assert token.encode() not in kept and token.split(".")[2].encode() not in kept
    assert len(kept) < len(token) // 2
    stored = encoding.loads(kept)
    assert stored["signed_at"] == payload_of(token)["timestamp"]
    w.clock.advance(120)  # a re-sign with today's time would differ
    again = await send(w, req)
    assert encoding.dumps(again.result) == encoding.dumps(reply.result)
    assert w.handlers.count() == 1


async def test_stored_signed_error_with_data_is_replayed_byte_for_byte(w: World, sess: ClientSession) -> None:
    async def busy(inputs: Any, ctx: IntentContext) -> Any:
        raise Unavailable("backend busy", retry_after=7)

    w.handlers.dispatcher.add("busy", busy)
    req = sess.prepare_intent({"goal": "busy", "inputs": {}})
    first = await send(w, req)
    w.clock.advance(60)
    again = await send(w, req)
    assert encoding.dumps(again.error) == encoding.dumps(first.error)
    assert first.error["data"]["retry_after"] == 7 and again.retry_after == 7


async def test_an_answer_kept_whole_by_an_older_version_is_still_replayed(
    w: World, sess: ClientSession
) -> None:
    # Entries written before answers were kept unsigned hold the reply as sent.
    req = sess.prepare_intent(ECHO)
    reply = await send(w, req)
    state = w.store._seq[sess.session_id]
    state.reply = encoding.dumps({"http_status": 200, "result": reply.result, "error": None})
    w.clock.advance(30)
    again = await send(w, req)
    assert again.http_status == 200 and again.result == reply.result
    sess.verify_result(req, again.result)


async def test_an_unexpected_failure_is_logged_without_its_text(
    w: World, sess: ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # The operator learns what failed and where; the log never quotes the exception's text,
    # which may hold an intent's inputs or a secret.
    caplog.set_level(logging.ERROR, logger="a2a_secure.server")
    req = sess.prepare_intent({"goal": "boom", "inputs": {"token": "INPUT-SECRET"}})
    await rejected(w, sess, req, -32603, 500, signed=True, unchanged=False)
    records = [r for r in caplog.records if r.name == "a2a_secure.server"]
    assert len(records) == 1
    text = records[0].getMessage()
    assert "an intent handler failed: RuntimeError at " in text
    assert "protocol_helpers.py:" in text and "in _boom" in text
    assert "hunter2" not in text and "SECRET" not in text and "INPUT-SECRET" not in caplog.text
    assert records[0].exc_info is None  # no traceback text either


async def test_a_bug_in_the_core_answers_500_and_is_logged(
    w: World, sess: ClientSession, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="a2a_secure.server")

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("SECRET-key-material")

    monkeypatch.setattr(w.store, "get_session", broken)
    reply = await w.call("intent", sess.prepare_intent(ECHO).params)
    assert reply.http_status == 500 and reply.error is not None and reply.error["code"] == -32603
    assert "SECRET" not in repr(reply.error)
    (record,) = [r for r in caplog.records if r.name == "a2a_secure.server"]
    assert "internal error in 'intent': KeyError at " in record.getMessage()
    assert "in broken" in record.getMessage() and "SECRET" not in caplog.text
