"""The common intent's flat path answers exactly as the general path (PROTOCOL.md §6.1).

Hand-picked requests, honest and hostile (tampered payloads, mismatched, extra and mistyped
members, replays, stale timestamps, wrong commitments, bad signatures, huge numbers,
duplicate members, non-canonical base64url, payloads written otherwise), each sent to two
identical worlds, one through each path (common_intent_helpers.Pair); generated ones are in
tests/test_common_intent_generated.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from common_intent_helpers import (
    ECHO,
    ECHO_A,
    MALLORY,
    Pair,
    assert_same,
    assert_same_state,
    next_sequence,
    non_canonical,
    payload_for,
    raw_token,
    signed_params,
)
from protocol_helpers import DROP, T0, World, flip_signature, forge_request, with_token

from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.server import IntentContext, Reply, ServerLimits, common_intent
from a2a_secure.protocol.validate import MAX_SAFE_INT


@pytest.fixture
async def pair() -> Pair:
    return Pair()


Case = Callable[[ClientSession], Any]


def _honest(intent: dict[str, Any]) -> Case:
    return lambda s: s.prepare_intent(intent).params


def _forged(intent: Any, **kwargs: Any) -> Case:
    return lambda s: forge_request(s, intent, **kwargs).params


def _params(**changes: Any) -> Case:
    def build(s: ClientSession) -> Any:
        params = dict(s.prepare_intent(ECHO).params)
        for name, value in changes.items():
            if value is DROP:
                del params[name]
            else:
                params[name] = value
        return params

    return build


def _intent_params(**members: Any) -> Case:
    """An honestly signed request whose intent has ``members`` changed (a value of DROP: removed)."""

    def build(s: ClientSession) -> Any:
        intent: dict[str, Any] = {"goal": "echo", "inputs": {"a": 1}}
        for name, value in members.items():
            if value is DROP:
                intent.pop(name, None)
            else:
                intent[name] = value
        return signed_params(s, payload_for(s, intent))

    return build


def _payload_change(**changes: Any) -> Case:
    return lambda s: signed_params(s, payload_for(s, {"goal": "echo", "inputs": {"a": 1}}, changes), ECHO_A)


def _with(s: ClientSession, change: Callable[[dict[str, Any]], Any]) -> Any:
    return change(dict(s.prepare_intent(ECHO).params))


def _spare_signature(token: str) -> str:
    head, body, sig = token.split(".")
    return f"{head}.{body}.{non_canonical(sig)}"


def _duplicate(s: ClientSession) -> Any:
    n = next_sequence(s)
    body = (
        b'{"session_id":"%s","session_id":"%s","session_commitment":"%s","sequence":%d,"timestamp":%d,'
        b'"intent":{"goal":"echo","inputs":{}}}'
        % (s.session_id.encode(), s.session_id.encode(), s.session_commitment.encode(), n, T0)
    )
    params = {"session_id": s.session_id, "session_commitment": s.session_commitment, "sequence": n}
    return {**params, "intent": {"goal": "echo", "inputs": {}}, "request_jws": raw_token(s, body)}


def _huge_payload(s: ClientSession) -> Any:
    n = next_sequence(s)
    body = (
        b'{"session_id":"%s","session_commitment":"%s","sequence":%d,"timestamp":%d,'
        b'"intent":{"goal":"echo","inputs":{"a":%d}}}'
        % (s.session_id.encode(), s.session_commitment.encode(), n, T0, 2**60)
    )
    params = {"session_id": s.session_id, "session_commitment": s.session_commitment, "sequence": n}
    return {**params, "intent": {"goal": "echo", "inputs": {"a": 2**60}}, "request_jws": raw_token(s, body)}


def _raw(s: ClientSession, change: Callable[[bytes], bytes], params_intent: Any = None) -> Any:
    """Params for ECHO whose payload text is the client's with ``change`` applied, re-signed."""
    req = s.prepare_intent(ECHO)
    text = encoding.b64u_decode(req.params["request_jws"].split(".")[1])
    params = {**req.params, "request_jws": raw_token(s, change(text))}
    if params_intent is not None:
        params["intent"] = params_intent
    return params


def _spaced(text: bytes) -> bytes:
    return json.dumps(encoding.loads(text), separators=(", ", ": "), ensure_ascii=False).encode()


def _reordered(text: bytes) -> bytes:
    payload = encoding.loads(text)
    return encoding.dumps({name: payload[name] for name in reversed(list(payload))})


def _nested(s: ClientSession, depth: int) -> Any:
    """An honest request whose payload nests ``depth`` containers (the payload being one)."""
    inputs: Any = {}
    for _ in range(depth - 3):  # payload, intent and inputs are three
        inputs = {"n": inputs}
    intent = {"goal": "echo", "inputs": inputs}
    text = encoding.dumps(payload_for(s, intent))
    return {
        **signed_params(s, {"sequence": s.last_sequence, "intent": intent}),
        "request_jws": raw_token(s, text),
    } | {
        "sequence": s.last_sequence,
        "intent": intent,
    }


def _signed_seq(s: ClientSession, signed: Callable[[int], Any]) -> Any:
    payload = payload_for(s, ECHO_A)
    n = payload["sequence"]
    payload["sequence"] = signed(n)
    params = signed_params(s, payload)
    params["sequence"] = n
    return params


# name -> (the params, given the session; whether the flat path starts the request)
CASES: dict[str, tuple[Case, bool]] = {
    "plain": (_honest(ECHO), True),
    "domain": (_honest({**ECHO, "domain": "fr"}), True),
    "empty inputs": (_honest({"goal": "echo", "inputs": {}}), True),
    "constraints in any order": (
        _honest(
            {
                "goal": "context",
                "inputs": {},
                "constraints": {"stream": False, "max_tokens": 5, "timeout_ms": 9},
            }
        ),
        True,
    ),
    "context": (
        _honest({"goal": "context", "domain": "d", "inputs": {"x": [1, 2.5, None, True, "é"]}}),
        True,
    ),
    "priority allowed": (_honest({"goal": "context", "inputs": {}, "priority": 2}), True),
    "priority above the caller's": (_honest({**ECHO, "priority": 5}), True),
    "unicode and escapes": (_honest({"goal": "echo", "inputs": {"s": 'é\u2028"\\\n\x00😀', "é": 1}}), True),
    "numbers": (
        _honest({"goal": "echo", "inputs": {"n": [0, -1, MAX_SAFE_INT, -MAX_SAFE_INT, 0.5, -0.0, 1e300]}}),
        True,
    ),
    "blocked by the session policy": (_forged({"goal": "blocked", "inputs": {}}), True),
    "no handler": (_honest({"goal": "nobody", "inputs": {}}), True),
    "handler fails": (_honest({"goal": "boom", "inputs": {}}), True),
    "handler refuses": (_honest({"goal": "reject", "inputs": {}}), True),
    "handler suspends": (_honest({"goal": "slow", "inputs": {"k": 1}, "priority": 1}), True),
    "handler past its deadline": (
        _honest({"goal": "hang", "inputs": {}, "constraints": {"timeout_ms": 5}}),
        True,
    ),
    "always streamed, stream false": (
        _honest({"goal": "ticks", "inputs": {}, "constraints": {"stream": False}}),
        True,
    ),
    "freshness: oldest accepted": (_forged(ECHO, timestamp=T0 - 300), True),
    "freshness: too old": (_forged(ECHO, timestamp=T0 - 301), True),
    "freshness: too new": (_forged(ECHO, timestamp=T0 + 301), True),
    # The general path from step 1.
    "streamed": (_honest({"goal": "ticks", "inputs": {}, "constraints": {"stream": True}}), False),
    "always streamed": (_honest({"goal": "ticks", "inputs": {}}), False),
    "intent_id": (_honest({**ECHO, "intent_id": "A" * 22}), False),
    "sealed member": (_intent_params(sealed="A" * 24), False),
    "delegation member": (_intent_params(delegation="sha256:" + "0" * 64), False),
    "unknown intent member": (_intent_params(extra=1), False),
    "goal empty": (_intent_params(goal=""), False),
    "goal too long": (_intent_params(goal="g" * 129), False),
    "goal longest": (_intent_params(goal="g" * 128), True),
    "goal not a string": (_intent_params(goal=7), False),
    "goal missing": (_intent_params(goal=DROP), False),
    "inputs a list": (_intent_params(inputs=[1]), False),
    "inputs missing": (_intent_params(inputs=DROP), False),
    "domain too long": (_intent_params(domain="d" * 129), False),
    "domain null": (_intent_params(domain=None), False),
    "domain empty": (_intent_params(domain=""), True),
    "constraints unknown": (_intent_params(constraints={"x": 1}), False),
    "constraints not an object": (_intent_params(constraints=[]), False),
    "timeout zero": (_intent_params(constraints={"timeout_ms": 0}), False),
    "timeout a float": (_intent_params(constraints={"timeout_ms": 5.0}), False),
    "timeout huge": (_intent_params(constraints={"max_tokens": MAX_SAFE_INT + 1}), False),
    "stream a string": (_intent_params(constraints={"stream": "yes"}), False),
    "priority zero": (_intent_params(priority=0), False),
    "priority six": (_intent_params(priority=6), False),
    "priority true": (_intent_params(priority=True), False),
    "priority a float": (_intent_params(priority=3.0), False),
    "params: extra member": (_params(extra=1), False),
    "params: no token": (_params(request_jws=DROP), False),
    "params: sequence zero": (_params(sequence=0), False),
    "params: sequence a float": (_params(sequence=1.0), False),
    "params: sequence true": (_params(sequence=True), False),
    "params: sequence huge": (_params(sequence=MAX_SAFE_INT + 1), False),
    "params: session id short": (_params(session_id="A" * 42), False),
    "params: session id spare bits": (
        lambda s: _with(s, lambda p: {**p, "session_id": non_canonical(p["session_id"])}),
        False,
    ),
    "params: session id unknown": (_params(session_id="A" * 43), False),
    "params: session id a number": (_params(session_id=7), False),
    "params: commitment not a hash": (_params(session_commitment="sha256:XYZ"), False),
    "params: commitment wrong": (_params(session_commitment=encoding.hash_of({"guess": 1})), False),
    "params: intent a list": (_params(intent=[]), False),
    "params: token not a string": (_params(request_jws=7), False),
    "params: token four segments": (
        lambda s: _with(s, lambda p: {**p, "request_jws": p["request_jws"] + ".x"}),
        False,
    ),
    "token: bad signature": (
        lambda s: with_token(r := s.prepare_intent(ECHO), flip_signature(r.params["request_jws"])).params,
        True,
    ),
    "token: spare bits in the signature": (
        lambda s: with_token(r := s.prepare_intent(ECHO), _spare_signature(r.params["request_jws"])).params,
        False,
    ),
    "token: wrong typ": (_forged(ECHO, typ=m.Typ.CLOSE), True),
    "token: wrong kid": (_forged(ECHO, kid=MALLORY.kid), True),
    "token: another key": (_forged(ECHO, signer=MALLORY), True),
    "token: duplicate members": (_duplicate, False),
    "token: payload not I-JSON": (_huge_payload, False),
    # Step 5: a payload that differs from the params (re-signed with the client's key), or
    # the same written otherwise: parsed and compared by the flat path, or the general path's.
    "payload: intent tampered": (
        _forged(ECHO, payload_changes={"intent": {"goal": "echo", "inputs": {"text": "ho"}}}),
        False,
    ),
    "payload: goal tampered": (
        _forged(ECHO, payload_changes={"intent": {"goal": "boom", "inputs": {"text": "hi"}}}),
        False,
    ),
    "payload: member order differs": (
        lambda s: signed_params(
            s,
            payload_for(s, {"inputs": {"b": 2, "a": 1}, "goal": "echo"}),
            {"goal": "echo", "inputs": {"a": 1, "b": 2}},
        ),
        True,
    ),
    "payload: 1.0 for 1": (
        lambda s: signed_params(
            s, payload_for(s, {"goal": "echo", "inputs": {"n": 1.0}}), {"goal": "echo", "inputs": {"n": 1}}
        ),
        False,
    ),
    "payload: 1 for 1.0": (
        lambda s: signed_params(
            s, payload_for(s, {"goal": "echo", "inputs": {"n": 1}}), {"goal": "echo", "inputs": {"n": 1.0}}
        ),
        False,
    ),
    "payload: true for 1": (
        lambda s: signed_params(
            s, payload_for(s, {"goal": "echo", "inputs": {"n": True}}), {"goal": "echo", "inputs": {"n": 1}}
        ),
        False,
    ),
    "payload: huge number in the params": (
        lambda s: signed_params(s, payload_for(s, ECHO_A), {"goal": "echo", "inputs": {"a": 2**70}}),
        False,
    ),
    "payload: 2**60 in the params": (
        lambda s: signed_params(s, payload_for(s, ECHO_A), {"goal": "echo", "inputs": {"a": 2**60}}),
        False,
    ),
    "payload: extra member": (_payload_change(extra=1), False),
    "payload: close member": (_payload_change(close=True), False),
    "payload: no timestamp": (_payload_change(timestamp=DROP), False),
    "payload: no intent": (_payload_change(intent=DROP), False),
    "payload: timestamp a float": (_payload_change(timestamp=float(T0)), False),
    "payload: timestamp true": (_payload_change(timestamp=True), False),
    "payload: timestamp negative": (_payload_change(timestamp=-1), False),
    "payload: timestamp a string": (_payload_change(timestamp=str(T0)), False),
    "payload: sequence a float": (lambda s: _signed_seq(s, float), False),
    "payload: sequence a string": (lambda s: _signed_seq(s, str), False),
    "payload: sequence another": (lambda s: _signed_seq(s, lambda n: n + 1), False),
    "payload: session id another": (_payload_change(session_id="B" * 43), False),
    "payload: session id a number": (_payload_change(session_id=5), False),
    "payload: commitment another": (_payload_change(session_commitment=encoding.hash_of({"x": 1})), False),
    "payload: members in another order": (lambda s: _raw(s, _reordered), True),
    "payload: spaces": (lambda s: _raw(s, _spaced), True),
    "payload: escaped characters": (lambda s: _raw(s, lambda b: b.replace(b'"hi"', b'"h\\u0069"')), True),
    "payload: timestamp -0": (
        lambda s: _raw(s, lambda b: b.replace(b'"timestamp":%d' % T0, b'"timestamp":-0')),
        True,
    ),
    "payload: timestamp 0": (
        lambda s: _raw(s, lambda b: b.replace(b'"timestamp":%d' % T0, b'"timestamp":0')),
        True,
    ),
    "payload: timestamp with a leading zero": (
        lambda s: _raw(s, lambda b: b.replace(b'"timestamp":%d' % T0, b'"timestamp":0%d' % T0)),
        False,
    ),
    "payload: timestamp in exponent form": (
        lambda s: _raw(s, lambda b: b.replace(b'"timestamp":%d' % T0, b'"timestamp":1.7637e9')),
        False,
    ),
    "payload: timestamp past 2**53": (
        lambda s: _raw(s, lambda b: b.replace(b'"timestamp":%d' % T0, b'"timestamp":%d' % 2**53)),
        False,
    ),
    "payload: a float written otherwise": (
        lambda s: _raw(
            s, lambda b: b.replace(b'"hi"', b"1e+300"), {"goal": "echo", "inputs": {"text": 1e300}}
        ),
        True,
    ),
    "payload: nested 31 deep": (lambda s: _nested(s, 31), True),
    "payload: nested 32 deep": (lambda s: _nested(s, 32), True),
    "payload: nested 33 deep": (lambda s: _nested(s, 33), False),
    "payload: a lone surrogate in the params": (
        lambda s: signed_params(s, payload_for(s, ECHO_A), {"goal": "echo", "inputs": {"a": "\ud800"}}),
        False,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_each_case_gets_the_same_answer_on_both_paths(pair: Pair, name: str) -> None:
    build, flat = CASES[name]
    sess = await pair.open()
    await pair.send("intent", sess.prepare_intent(ECHO).params)  # a first intent, through both
    assert pair.flat == 1
    params = build(sess)
    await pair.send("intent", params)
    assert pair.flat == 1 + flat, f"the flat path {'did not start' if flat else 'started'} {name!r}"
    # And the session goes on alike: the next honest intent, the same retried, a close.
    req = sess.prepare_intent({"goal": "context", "inputs": {"after": name}})
    first = await pair.send("intent", req.params)
    assert first.error is None, first.error
    assert await pair.send("intent", req.params) == first  # a byte-identical retry
    await pair.send("close", sess.prepare_close().params)
    await pair.send("intent", sess.prepare_intent(ECHO).params)  # -32043 on both


async def test_sequences_replays_and_retries(pair: Pair) -> None:
    sess = await pair.open()
    await pair.send("intent", sess.prepare_intent(ECHO).params)
    req = sess.prepare_intent(ECHO)
    first = await pair.send("intent", req.params)
    assert first.error is None
    replay = await pair.send("intent", req.params)
    assert replay == first
    assert pair.fast.audit[-1] == {
        **pair.general.audit[-1],
        "duration_ms": pair.fast.audit[-1]["duration_ms"],
    }
    # The same sequence with another token, an older one, a newer one after a gap.
    again = forge_request(sess, ECHO, sequence=req.sequence, timestamp=T0 - 1)
    assert (await pair.send("intent", again.params)).error["code"] == -32044  # type: ignore[index]
    older = forge_request(sess, ECHO, sequence=req.sequence - 1)
    assert (await pair.send("intent", older.params)).error["code"] == -32044  # type: ignore[index]
    gap = forge_request(sess, ECHO, sequence=req.sequence + 10)
    assert (await pair.send("intent", gap.params)).error is None
    sess.last_sequence = gap.sequence
    # A failed intent's answer is stored and replayed as well.
    boom = sess.prepare_intent({"goal": "boom", "inputs": {}})
    answer = await pair.send("intent", boom.params)
    assert answer.error is not None and answer.error["code"] == -32603
    assert await pair.send("intent", boom.params) == answer


async def test_a_retry_while_the_original_runs_waits_for_it_alike() -> None:
    pair = Pair()
    sess = await pair.open()
    gates = {w: asyncio.Event() for w in ("fast", "general")}

    def gated(name: str) -> Any:
        async def handler(inputs: Any, ctx: IntentContext) -> Any:
            await gates[name].wait()
            return {"done": inputs}

        return handler

    pair.fast.handlers.dispatcher.add("gated", gated("fast"))
    pair.general.handlers.dispatcher.add("gated", gated("general"))
    req = sess.prepare_intent({"goal": "gated", "inputs": {"n": 1}})
    replies = []
    for name, handle in (("fast", _handle_now(pair.fast)), ("general", pair.general.server.handle)):
        original = asyncio.ensure_future(handle("intent", copy.deepcopy(req.params)))
        retry = asyncio.ensure_future(handle("intent", copy.deepcopy(req.params)))
        await asyncio.sleep(0.05)
        assert not original.done() and not retry.done()
        gates[name].set()
        replies.append((await original, await retry))
    (fast_original, fast_retry), (general_original, general_retry) = replies
    assert_same(fast_original, general_original)
    assert_same(fast_retry, general_retry)
    assert fast_retry == fast_original
    assert_same_state(pair.fast, pair.general)


def _handle_now(w: World) -> Callable[[str, Any], Any]:
    async def handle(method: str, params: Any) -> Reply:
        pending = w.server.handle_now(method, params)
        return pending if isinstance(pending, Reply) else await pending

    return handle


async def test_rate_limit_and_expiry_answer_alike() -> None:
    pair = Pair(Policy.build(rate_limit=2, rate_period=60, session_timeout=120))
    sess = await pair.open()
    for _ in range(3):
        reply = await pair.send("intent", sess.prepare_intent(ECHO).params)
    assert reply.error is not None and reply.error["code"] == -32048 and reply.retry_after is not None
    for w in (pair.fast, pair.general):
        w.clock.advance(121)
    reply = await pair.send("intent", forge_request(sess, ECHO, timestamp=T0 + 121).params)
    assert reply.error is not None and reply.error["code"] == -32043
    assert pair.flat == 4


async def test_a_sealed_session_gets_the_general_answer_to_an_open_intent() -> None:
    pair = Pair(limits=ServerLimits(sealed_intents=True))
    sess = await pair.open(seal=True)
    honest = await pair.send("intent", sess.prepare_intent(ECHO).params)  # sealed: the flat path's
    assert honest.error is None
    reply = await pair.send("intent", forge_request(sess, ECHO).params)
    assert reply.error is not None and reply.error["code"] == -32602
    assert "sealed" in reply.error["message"]
    # Both started; the clear one handed to the general path once the session is known sealed
    # (tests/test_common_intent_sealed.py has the sealed cases).
    assert pair.flat == 2


async def test_a_client_whose_document_is_due_again_takes_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = Pair()
    sess = await pair.open()
    checked: list[str] = []
    guard = pair.fast.server._config.key_guard

    def due(resolver: Any, session: Any) -> bool:
        checked.append(session.session_id)
        return False

    monkeypatch.setattr(guard, "session_checked_now", due)
    reply = await pair.send("intent", sess.prepare_intent(ECHO).params)
    # The flat path asks, then hands the request to the general path from step 5, which asks
    # again and checks the session as it always does.
    assert reply.error is None and checked == [sess.session_id] * 2
    assert pair.flat == 1


async def test_the_client_s_payload_is_compared_as_text_and_not_parsed(pair: Pair) -> None:
    sess = await pair.open()
    req = sess.prepare_intent({**ECHO, "domain": "d", "constraints": {"max_tokens": 3}})
    text = encoding.b64u_decode(req.params["request_jws"].split(".")[1])
    args = (sess.session_id, sess.session_commitment, req.sequence, req.params["intent"])
    assert common_intent._as_written(text, *args) == T0
    found = common_intent.common_intent(req.params)
    assert found is not None and found[-1] == T0
    # Written otherwise, the same payload is parsed and compared as JSON: the same timestamp.
    assert common_intent._as_written(_spaced(text), *args) is None
    spaced = {**req.params, "request_jws": raw_token(sess, _spaced(text))}
    found = common_intent.common_intent(spaced)
    assert found is not None and found[-1] == T0
