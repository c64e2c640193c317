"""Sealed intents (PROTOCOL.md §12.6) answered on the common intent's flat path exactly as on
the general path.

On a sealed session, the common intent carries ``inputs: {}`` and its inputs ``sealed``, which
the signed payload carries by digest. Each request below, honest or hostile (values that do
not open: a wrong tag, another sequence, goal or session; values that open to the wrong thing;
stale timestamps, replays, unknown goals, handlers that fail, refuse with data, suspend or
answer what is not I-JSON; step 1 and step 5 mismatches), is sent to two identical worlds,
one through each path (common_intent_helpers.Pair): the bytes on the wire, the HTTP status,
the stored answer, the audit records, the stores and the handlers' runs must be the same.
``flat`` says whether the flat path starts the request (it hands the rest on, from step 1
or from step 5), so that a case cannot pass by never reaching the code it is about.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from common_intent_helpers import ECHO, Pair, next_sequence, non_canonical, raw_token
from protocol_helpers import T0, flip_signature, forge_request, identity, sign_raw

from a2a_secure.errors import PolicyViolation, Unavailable
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.sealing import SessionKeys, SessionSealer
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.protocol.validate import MAX_SAFE_INT

Case = Callable[[ClientSession], Any]
_KEEP = object()


async def _data_error(inputs: Any, ctx: IntentContext) -> Any:
    raise PolicyViolation("not for you", data={"field": "x", "got": inputs})


async def _busy(inputs: Any, ctx: IntentContext) -> Any:
    raise Unavailable("busy", retry_after=7, data={"queue": inputs})


async def _busy_bare(inputs: Any, ctx: IntentContext) -> Any:
    raise Unavailable("busy", retry_after=2)  # only retry_after: nothing is sealed


async def _not_ijson(inputs: Any, ctx: IntentContext) -> Any:
    return {"big": 2**60}


async def _slow_error(inputs: Any, ctx: IntentContext) -> Any:
    import asyncio

    await asyncio.sleep(0)
    raise PolicyViolation("later", data={"after": "suspending"})


def sealed_pair(limits: ServerLimits | None = None) -> Pair:
    pair = Pair(limits=limits)
    for w in (pair.fast, pair.general):
        d = w.handlers.dispatcher
        d.add("data_error", _data_error)
        d.add("busy", _busy)
        d.add("busy_bare", _busy_bare)
        d.add("not_ijson", _not_ijson)
        d.add("slow_error", _slow_error)
    return pair


@pytest.fixture
async def pair() -> Pair:
    return sealed_pair()


def sealed_params(
    s: ClientSession,
    intent: dict[str, Any],
    *,
    sequence: int | None = None,
    timestamp: int = T0,
    seal_sequence: int | None = None,
    seal_goal: str | None = None,
    sealer: SessionSealer | None = None,
    plaintext: Any = _KEEP,
    ciphertext: Callable[[str], Any] | None = None,
    signed_sealed: Callable[[str], Any] | None = None,
    wire: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    signer: Any = None,
    typ: str = m.Typ.REQUEST,
    clear_inputs: bool = False,
) -> dict[str, Any]:
    """A request with ``intent``'s inputs sealed as the client seals them, but for what is told.

    ``seal_sequence``/``seal_goal``/``sealer``: sealed for another place or session;
    ``plaintext``: what is sealed instead of the inputs; ``ciphertext``: a change to the
    sealed text; ``signed_sealed``: what the payload signs instead of its digest; ``wire``: a
    change to the params' intent after signing; ``clear_inputs``: the inputs sent (and
    signed) in the clear as well.
    """
    n = next_sequence(s) if sequence is None else sequence
    keys = sealer or s.sealer
    assert keys is not None
    value = intent["inputs"] if plaintext is _KEEP else plaintext
    text: Any = keys.seal_inputs(seal_sequence or n, seal_goal or intent["goal"], value)
    if ciphertext is not None:
        text = ciphertext(text)
    sent = {**intent, "inputs": intent["inputs"] if clear_inputs else {}, "sealed": text}
    digest = m.sealed_digest(text) if isinstance(text, str) else text
    signed = {**sent, "sealed": digest if signed_sealed is None else signed_sealed(text)}
    payload = {
        "session_id": s.session_id,
        "session_commitment": s.session_commitment,
        "sequence": n,
        "timestamp": timestamp,
        "intent": signed,
    }
    params = {
        "session_id": s.session_id,
        "session_commitment": s.session_commitment,
        "sequence": n,
        "intent": sent,
        "request_jws": sign_raw(payload, signer or s.identity, typ=typ),
    }
    if wire is not None:
        params["intent"] = wire(copy.deepcopy(sent))
    return params


def _honest(intent: dict[str, Any]) -> Case:
    return lambda s: s.prepare_intent(intent).params


def _sealed(intent: dict[str, Any] = ECHO, **kwargs: Any) -> Case:
    return lambda s: sealed_params(s, intent, **kwargs)


def _flip_tag(text: str) -> str:
    raw = bytearray(encoding.b64u_decode(text))
    raw[-1] ^= 1
    return encoding.b64u_encode(bytes(raw))


def _flip_body(text: str) -> str:
    raw = bytearray(encoding.b64u_decode(text))
    raw[0] ^= 0x80
    return encoding.b64u_encode(bytes(raw))


def _other_sealer(s: ClientSession) -> SessionSealer:
    return SessionSealer(SessionKeys(b"\x01" * 32, b"\x02" * 32), s.session_id)


def _elsewhere(s: ClientSession) -> ClientSession:
    """``s`` as if its session id were another (one the server does not know)."""
    other = copy.copy(s)
    other.session_id = "A" * 43
    return other


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


def _raw_payload(s: ClientSession, change: Callable[[bytes], bytes]) -> Any:
    """The client's honest sealed request, its payload text changed and signed again."""
    req = s.prepare_intent(ECHO)
    text = encoding.b64u_decode(req.params["request_jws"].split(".")[1])
    return {**req.params, "request_jws": raw_token(s, change(text))}


def _spaced(text: bytes) -> bytes:
    import json

    return json.dumps(encoding.loads(text), separators=(", ", ": "), ensure_ascii=False).encode()


def _reordered(text: bytes) -> bytes:
    payload = encoding.loads(text)
    payload["intent"] = dict(reversed(list(payload["intent"].items())))
    return encoding.dumps({name: payload[name] for name in reversed(list(payload))})


def _with_key(s: ClientSession) -> Any:
    """An honest sealed intent with an intent_id (it carries its sealed answer key)."""
    return s.prepare_intent({**ECHO, "intent_id": "B" * 22}).params


def _key_without_id(s: ClientSession) -> Any:
    def add_key(intent: dict[str, Any]) -> dict[str, Any]:
        return {**intent, "sealed_key": encoding.b64u_encode(b"k" * 48)}

    n = next_sequence(s)
    params = sealed_params(s, ECHO, sequence=n)
    params["intent"] = add_key(params["intent"])
    payload = encoding.loads(encoding.b64u_decode(params["request_jws"].split(".")[1]))
    payload["intent"] = add_key(payload["intent"])
    params["request_jws"] = sign_raw(payload, s.identity, typ=m.Typ.REQUEST)
    return params


def _sealed_chain(s: ClientSession) -> Any:
    n = next_sequence(s)
    sealer = s.sealer
    assert sealer is not None
    chain = sealer.seal_delegation(n, "echo", "sha256:" + "0" * 64)
    params = sealed_params(s, ECHO, sequence=n)
    params["intent"]["sealed_delegation"] = chain
    payload = encoding.loads(encoding.b64u_decode(params["request_jws"].split(".")[1]))
    payload["intent"]["sealed_delegation"] = m.sealed_digest(chain)
    params["request_jws"] = sign_raw(payload, s.identity, typ=m.Typ.REQUEST)
    return params


# name -> (the params, given a sealed session; whether the flat path starts the request)
CASES: dict[str, tuple[Case, bool]] = {
    # Honest sealed intents: the flat path answers them, sealed.
    "honest": (_honest(ECHO), True),
    "empty inputs": (_honest({"goal": "echo", "inputs": {}}), True),
    "domain, constraints, priority": (
        _honest(
            {
                "goal": "context",
                "domain": "d",
                "inputs": {"x": [1, 2.5, None, True, "é"]},
                "constraints": {"stream": False, "max_tokens": 5, "timeout_ms": 9},
                "priority": 2,
            }
        ),
        True,
    ),
    "numbers and escapes": (
        _honest({"goal": "echo", "inputs": {"n": [MAX_SAFE_INT, -0.0, 1e300, 0.5], "s": 'é\u2028"\\\x00😀'}}),
        True,
    ),
    "goal longest": (_honest({"goal": "g" * 128, "inputs": {"a": 1}}), True),
    "handler suspends": (_honest({"goal": "slow", "inputs": {"k": 1}, "priority": 1}), True),
    "handler past its deadline": (
        _honest({"goal": "hang", "inputs": {}, "constraints": {"timeout_ms": 5}}),
        True,
    ),
    "always streamed, stream false": (
        _honest({"goal": "ticks", "inputs": {}, "constraints": {"stream": False}}),
        True,
    ),
    # Refusals after the sequence is consumed: the error's data sealed, retry_after kept.
    "unknown goal": (_honest({"goal": "nobody", "inputs": {}}), True),
    "blocked by the session policy": (_sealed({"goal": "blocked", "inputs": {"a": 1}}), True),
    "priority above the caller's": (_honest({**ECHO, "priority": 5}), True),
    "handler fails": (_honest({"goal": "boom", "inputs": {}}), True),
    "handler refuses": (_honest({"goal": "reject", "inputs": {}}), True),
    "handler refuses with data": (_honest({"goal": "data_error", "inputs": {"secret": "s3"}}), True),
    "handler busy with data": (_honest({"goal": "busy", "inputs": {"secret": "s4"}}), True),
    "handler busy, only retry_after": (_honest({"goal": "busy_bare", "inputs": {}}), True),
    "handler suspends, then refuses with data": (_honest({"goal": "slow_error", "inputs": {}}), True),
    "handler answers what is not I-JSON": (_honest({"goal": "not_ijson", "inputs": {}}), True),
    # Freshness (step 6), after the inputs are opened.
    "freshness: oldest accepted": (_sealed(timestamp=T0 - 300), True),
    "freshness: too old": (_sealed(timestamp=T0 - 301), True),
    "freshness: too new": (_sealed(timestamp=T0 + 301), True),
    # Values that do not open, or open to the wrong thing: -32040, signed, before freshness.
    "wrong tag": (_sealed(ciphertext=_flip_tag), True),
    "ciphertext changed": (_sealed(ciphertext=_flip_body), True),
    "sealed for another sequence": (
        lambda s: sealed_params(s, ECHO, seal_sequence=s.last_sequence + 2),
        True,
    ),
    "sealed for another goal": (_sealed(seal_goal="context"), True),
    "sealed with other keys": (lambda s: sealed_params(s, ECHO, sealer=_other_sealer(s)), True),
    "wrong tag and stale": (_sealed(ciphertext=_flip_tag, timestamp=T0 - 1000), True),
    "opens to an array": (_sealed(plaintext=[1, 2]), True),
    "opens to a string": (_sealed(plaintext="text"), True),
    "opens to null": (_sealed(plaintext=None), True),
    "opens nested too deep": (_sealed(plaintext=_nested(encoding.MAX_DEPTH - 2)), True),
    "opens nested deepest": (_sealed(plaintext=_nested(encoding.MAX_DEPTH - 3)), True),
    "a sealed goal that is blocked and does not open": (
        _sealed({"goal": "blocked", "inputs": {}}, ciphertext=_flip_tag),
        True,
    ),
    # Before step 5: unsigned refusals (the flat path starts, the general code refuses).
    "token: bad signature": (
        lambda s: {**(p := s.prepare_intent(ECHO).params), "request_jws": flip_signature(p["request_jws"])},
        True,
    ),
    "token: another key": (_sealed(signer=identity("mallory")), True),
    "token: close typ": (_sealed(typ=m.Typ.CLOSE), True),
    "params: commitment wrong": (
        lambda s: {**s.prepare_intent(ECHO).params, "session_commitment": encoding.hash_of({"x": 1})},
        False,
    ),
    "params: session unknown": (lambda s: {**s.prepare_intent(ECHO).params, "session_id": "A" * 43}, False),
    "session unknown, signed for it": (lambda s: sealed_params(_elsewhere(s), ECHO), True),
    # Step 5, the payload against the params: compared as text, or parsed when written otherwise.
    "payload: spaces": (lambda s: _raw_payload(s, _spaced), True),
    "payload: members in another order": (lambda s: _raw_payload(s, _reordered), True),
    "payload signs the ciphertext": (_sealed(signed_sealed=lambda t: t), False),
    "payload signs another digest": (_sealed(signed_sealed=lambda t: m.sealed_digest(t + "A")), False),
    "payload signs the digest in capitals": (
        _sealed(signed_sealed=lambda t: "sha256:" + m.sealed_digest(t)[7:].upper()),
        False,
    ),
    "payload signs sealed null": (_sealed(signed_sealed=lambda t: None), False),
    "params: another ciphertext than signed": (
        _sealed(wire=lambda i: {**i, "sealed": _flip_tag(i["sealed"])}),
        False,
    ),
    # Step 1: the member's shape (unsigned -32602 of the general path).
    "sealed too short": (_sealed(ciphertext=lambda t: encoding.b64u_encode(b"x" * 17)), False),
    "sealed 18 bytes": (_sealed(ciphertext=lambda t: encoding.b64u_encode(b"x" * 18)), True),
    "sealed not canonical": (_sealed(ciphertext=non_canonical), False),
    "sealed with padding": (_sealed(ciphertext=lambda t: t + "=" * (-len(t) % 4 or 4)), False),
    "sealed with a plus": (_sealed(ciphertext=lambda t: "+" + t[1:]), False),
    "sealed empty": (_sealed(ciphertext=lambda t: ""), False),
    "sealed a number": (_sealed(ciphertext=lambda t: 7), False),
    "sealed null": (_sealed(ciphertext=lambda t: None), False),
    "sealed too long": (_sealed(ciphertext=lambda t: "A" * ((1 << 21) + 4)), False),
    "sealed with clear inputs": (_sealed({"goal": "echo", "inputs": {"a": 1}}, clear_inputs=True), False),
    "sealed with other clear inputs than signed": (_sealed(wire=lambda i: {**i, "inputs": {"a": 1}}), False),
    "sealed with an unknown member": (_sealed(wire=lambda i: {**i, "extra": 1}), False),
    "sealed inputs a list": (_sealed(wire=lambda i: {**i, "inputs": []}), False),
    # Other extensions next to sealed: the general path from step 1.
    "intent_id and sealed_key": (_with_key, False),
    "sealed_key without intent_id": (_key_without_id, False),
    "sealed_delegation": (_sealed_chain, False),
    "streamed": (_honest({"goal": "ticks", "inputs": {}, "constraints": {"stream": True}}), False),
    # A clear intent on a sealed session: started, refused from step 5 by the general path.
    "clear inputs on a sealed session": (
        lambda s: forge_request(s, {"goal": "echo", "inputs": {"a": 1}}).params,
        True,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_each_sealed_case_gets_the_same_answer_on_both_paths(pair: Pair, name: str) -> None:
    build, flat = CASES[name]
    sess = await pair.open(seal=True)
    assert sess.sealed
    first = sess.prepare_intent(ECHO)
    reply = await pair.send("intent", first.params)  # a first intent, through both
    assert sess.verify_result(first, reply.result).result["echo"] == ECHO["inputs"]
    assert pair.flat == 1
    params = build(sess)
    reply = await pair.send("intent", params)
    assert pair.flat == 1 + flat, f"the flat path {'did not start' if flat else 'started'} {name!r}"
    await pair.send("intent", params)  # the same request again: a replay, or refused alike
    # And the session goes on alike: the next honest intent, the same retried, a close.
    req = sess.prepare_intent({"goal": "context", "inputs": {"after": name}})
    after = await pair.send("intent", req.params)
    assert after.error is None, after.error
    assert sess.verify_result(req, after.result).result["sequence"] == req.sequence
    assert await pair.send("intent", req.params) == after  # a byte-identical retry
    await pair.send("close", sess.prepare_close().params)
    await pair.send("intent", sess.prepare_intent(ECHO).params)  # -32043 on both


async def test_what_the_flat_path_answers_opens_for_the_client(pair: Pair) -> None:
    """Not only alike: the flat path's sealed answers are what the client verifies and opens."""
    sess = await pair.open(seal=True)
    req = sess.prepare_intent({"goal": "echo", "inputs": {"secret": "the merger"}})
    reply = await pair.send("intent", req.params)
    assert isinstance(reply.result["result"], str)  # sealed
    assert b"the merger" not in (reply.result_json or b"")
    assert sess.verify_result(req, reply.result).result["echo"] == {"secret": "the merger"}
    refused = sess.prepare_intent({"goal": "data_error", "inputs": {"secret": "s5"}})
    reply = await pair.send("intent", refused.params)
    assert reply.error is not None and set(reply.error["data"]) == {"sealed", "response_jws"}
    assert b"s5" not in repr(reply.error).encode()
    err = sess.error_from_reply(refused, reply.error)
    assert isinstance(err, PolicyViolation) and err.data == {"field": "x", "got": {"secret": "s5"}}
    busy = sess.prepare_intent({"goal": "busy", "inputs": {"n": 1}})
    reply = await pair.send("intent", busy.params)
    assert reply.retry_after == 7 and reply.error is not None
    assert set(reply.error["data"]) == {"sealed", "retry_after", "response_jws"}
    assert pair.flat == 3


async def test_sequences_replays_and_retries_on_a_sealed_session(pair: Pair) -> None:
    sess = await pair.open(seal=True)
    await pair.send("intent", sess.prepare_intent(ECHO).params)
    req = sess.prepare_intent(ECHO)
    first = await pair.send("intent", req.params)
    assert first.error is None
    assert await pair.send("intent", req.params) == first  # the stored sealed answer, as sent
    # The same sequence with another token, an older one, a newer one after a gap.
    again = sealed_params(sess, ECHO, sequence=req.sequence, timestamp=T0 - 1)
    assert (await pair.send("intent", again)).error["code"] == -32044  # type: ignore[index]
    older = sealed_params(sess, ECHO, sequence=req.sequence - 1)
    assert (await pair.send("intent", older)).error["code"] == -32044  # type: ignore[index]
    gap = sealed_params(sess, ECHO, sequence=req.sequence + 10)
    assert (await pair.send("intent", gap)).error is None
    sess.last_sequence = req.sequence + 10
    # A refusal with sealed data, and a handler that suspends, are stored and replayed alike.
    for goal in ("data_error", "slow", "slow_error", "boom"):
        r = sess.prepare_intent({"goal": goal, "inputs": {"k": goal}})
        answer = await pair.send("intent", r.params)
        assert await pair.send("intent", r.params) == answer
    # A request that did not open did not use its sequence up: the honest one still runs.
    n = next_sequence(sess)
    bad = sealed_params(sess, ECHO, sequence=n, ciphertext=_flip_tag)
    assert (await pair.send("intent", bad)).error["code"] == -32040  # type: ignore[index]
    good = sealed_params(sess, ECHO, sequence=n)
    assert (await pair.send("intent", good)).error is None
    assert pair.flat == 16  # every one of them


async def test_sealed_inputs_on_a_session_without_keys_are_refused_alike() -> None:
    pair = sealed_pair()
    sess = await pair.open(seal=False)
    assert not sess.sealed
    n = next_sequence(sess)
    sealer = _other_sealer(sess)
    params = sealed_params(sess, ECHO, sequence=n, sealer=sealer)
    reply = await pair.send("intent", params)
    assert reply.error is not None and reply.error["code"] == -32602
    assert "sealed" in reply.error["message"]
    assert pair.flat == 1  # started, handed to the general path once the session is known


async def test_a_server_that_does_not_seal_refuses_the_member_alike() -> None:
    pair = sealed_pair(ServerLimits(sealed_intents=False))
    sess = await pair.open(seal=False)
    reply = await pair.send("intent", sealed_params(sess, ECHO, sealer=_other_sealer(sess)))
    assert reply.error is not None and reply.error["code"] == -32602
    assert "does not seal" in reply.error["message"]
    assert pair.flat == 0  # the general path's, from step 1


async def test_damaged_sealing_keys_are_the_server_s_fault_alike(pair: Pair) -> None:
    sess = await pair.open(seal=True)
    await pair.send("intent", sess.prepare_intent(ECHO).params)
    for w in (pair.fast, pair.general):
        record = w.store._sessions[sess.session_id]
        w.store._sessions[sess.session_id] = dataclasses.replace(record, seal_keys=b"\x00" * 10, sealer=None)
    req = sess.prepare_intent(ECHO)
    reply = await pair.send("intent", req.params)
    assert reply.error is not None and reply.error["code"] == -32603
    assert pair.flat == 2


async def test_a_sealed_intent_s_handler_is_told_it_is_sealed_alike(pair: Pair) -> None:
    told: dict[str, list[Any]] = {"fast": [], "general": []}
    for name, w in (("fast", pair.fast), ("general", pair.general)):

        def handler(seen: list[Any]) -> Any:
            async def h(inputs: Any, ctx: IntentContext) -> Any:
                seen.append((inputs, ctx.sealed, ctx.sequence, ctx.goal))
                return {"ok": True}

            return h

        w.handlers.dispatcher.add("tell", handler(told[name]))
    sess = await pair.open(seal=True)
    await pair.send("intent", sess.prepare_intent({"goal": "tell", "inputs": {"q": [1, "two"]}}).params)
    assert told["fast"] == told["general"] == [({"q": [1, "two"]}, True, 1, "tell")]
    assert pair.flat == 1


def test_the_sealed_payload_is_compared_as_text() -> None:
    """The client's payload for a sealed intent passes the text comparison, not the parser."""
    from a2a_secure.protocol.server import common_intent

    s = ClientSession(
        session_id="A" * 43,
        session_commitment=encoding.hash_of({"c": 1}),
        identity=identity("client"),
        server_did=identity("server").did,
        server_kid=identity("server").kid,
        server_key=identity("server").public_key,
        policy=Policy(),
        created_at=T0,
        expires_at=T0 + 3600,
        clock=lambda: T0,
        seal_keys=SessionKeys(b"\x03" * 32, b"\x04" * 32),
    )
    params = sealed_params(s, {"goal": "echo", "inputs": {"a": 1}, "domain": "d"})
    found = common_intent.common_intent(params)
    assert found is not None and found[-1] == T0
    assert found[5] == {} and found[6] == encoding.b64u_decode(params["intent"]["sealed"])
    text = encoding.b64u_decode(params["request_jws"].split(".")[1])
    signed = {**params["intent"], "sealed": m.sealed_digest(params["intent"]["sealed"])}
    args = (s.session_id, s.session_commitment, params["sequence"])
    assert common_intent._as_written(text, *args, signed) == T0
    assert common_intent._as_written(text, *args, params["intent"]) is None  # the ciphertext is not signed
    # Written otherwise: parsed, and compared with the params' intent as signed.
    spaced = {**params, "request_jws": raw_token(s, _spaced(text))}
    found = common_intent.common_intent(spaced)
    assert found is not None and found[-1] == T0


async def test_a_sealed_intent_whose_client_document_is_due_takes_the_general_path(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    sess = await pair.open(seal=True)
    checked: list[str] = []
    guard = pair.fast.server._config.key_guard

    def due(resolver: Any, session: Any) -> bool:
        checked.append(session.session_id)
        return False

    monkeypatch.setattr(guard, "session_checked_now", due)
    req = sess.prepare_intent({"goal": "echo", "inputs": {"k": "v"}})
    reply = await pair.send("intent", req.params)
    # The flat path asks, then hands the request to the general path from step 5, which opens
    # the inputs, asks again and checks the session as it always does.
    assert reply.error is None and checked == [sess.session_id] * 2
    assert sess.verify_result(req, reply.result).result["echo"] == {"k": "v"}
    assert pair.flat == 1
