"""The common intent's flat path answers generated requests exactly as the general path.

Hypothesis replaces one member of the params or of the signed payload (re-signed with the
client's key, so that it reaches step 5) with JSON values of every kind, and sends the
request to two identical worlds, one through each path (common_intent_helpers.Pair). And the
success reply, written in parts, is the one written whole.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from common_intent_helpers import Pair, payload_for, signed_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import DROP, T0, make_world

from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.server.replies import SignedReplies
from a2a_secure.protocol.validate import MAX_SAFE_INT

# -- generated: one member of params or payload replaced --------------------------------------------
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["", "echo", "sha256:" + "0" * 64, "A" * 43, "A" * 22, T0, 1, 1.0, 0, -1])
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
PATHS = [
    (),
    ("session_id",),
    ("session_commitment",),
    ("sequence",),
    ("timestamp",),
    ("intent",),
    ("intent", "goal"),
    ("intent", "inputs"),
    ("intent", "inputs", "a"),
    ("intent", "domain"),
    ("intent", "constraints"),
    ("intent", "constraints", "timeout_ms"),
    ("intent", "constraints", "max_tokens"),
    ("intent", "constraints", "stream"),
    ("intent", "priority"),
    ("intent", "intent_id"),
    ("intent", "sealed"),
    ("extra",),
]


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        inner = obj.get(name)
        if not isinstance(inner, dict):
            return
        obj = inner
    if value is DROP:
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = value


class Generated:
    """A pair of worlds and one open session, kept across Hypothesis examples."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.pair = Pair()
        self.sess = self.runner.run(self.pair.open())

    def send(self, params: Any) -> None:
        self.runner.run(self.pair.send("intent", params))


@pytest.fixture(scope="module")
def generated() -> Iterator[Generated]:
    g = Generated()
    yield g
    g.runner.close()


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    where=st.sampled_from(["params", "payload", "both"]),
    path=st.sampled_from(PATHS[1:]),
    value=json_values | st.just(DROP),
    constraints=st.sampled_from([None, {"timeout_ms": 50}, {"stream": False, "max_tokens": 3}]),
    priority=st.sampled_from([None, 1, 3, 4]),
)
def test_generated_requests_get_the_same_answer_on_both_paths(
    generated: Generated, where: str, path: tuple[str, ...], value: Any, constraints: Any, priority: Any
) -> None:
    sess = generated.sess
    intent: dict[str, Any] = {"goal": "context", "inputs": {"a": 1, "b": [1, "x"]}, "domain": "d"}
    if constraints is not None:
        intent["constraints"] = dict(constraints)
    if priority is not None:
        intent["priority"] = priority
    payload = payload_for(sess, copy.deepcopy(intent))
    params_intent = copy.deepcopy(intent)
    value = value if value is DROP else copy.deepcopy(value)
    if where in ("payload", "both"):
        _set(payload, path, value)
    params = signed_params(sess, payload, params_intent)
    params["sequence"] = sess.last_sequence
    if where in ("params", "both"):
        _set(params, path, value if value is DROP else copy.deepcopy(value))
    generated.send(params)


# -- the same on a sealed session (§12.6): inputs {} and sealed, signed by the digest -------------
SEALED_PATHS = [p for p in PATHS[1:] if p != ("intent", "inputs", "a")] + [("intent", "sealed_key")]
# What the sealed text (of the params, the payload or both) may become besides any JSON value:
# made from the honest ciphertext, so that most still decode and reach the AEAD.
SEALED_CHANGES = {
    "truncated": lambda t: t[:-2],
    "shortest": lambda t: t[:24],
    "too short": lambda t: t[:23],
    "one more": lambda t: t + "A",
    "first flipped": lambda t: ("B" if t[0] == "A" else "A") + t[1:],
    "last flipped": lambda t: t[:-1] + ("w" if t[-1] == "A" else "A"),
    "its digest": m.sealed_digest,
    "digest of another": lambda t: m.sealed_digest(t[:-1]),
}


class GeneratedSealed(Generated):
    """:class:`Generated` on a sealed session."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.pair = Pair()
        self.sess = self.runner.run(self.pair.open(seal=True))


@pytest.fixture(scope="module")
def generated_sealed() -> Iterator[Generated]:
    g = GeneratedSealed()
    yield g
    g.runner.close()


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    where=st.sampled_from(["params", "payload", "both"]),
    path=st.sampled_from(SEALED_PATHS),
    value=json_values | st.just(DROP) | st.sampled_from(sorted(SEALED_CHANGES)),
    inputs=st.sampled_from([{"a": 1, "b": [1, "x"]}, {}, {"n": 1.5, "s": "é"}]),
    constraints=st.sampled_from([None, {"timeout_ms": 50}, {"stream": False, "max_tokens": 3}]),
    priority=st.sampled_from([None, 1, 3, 4]),
)
def test_generated_sealed_requests_get_the_same_answer_on_both_paths(
    generated_sealed: Generated,
    where: str,
    path: tuple[str, ...],
    value: Any,
    inputs: Any,
    constraints: Any,
    priority: Any,
) -> None:
    g = generated_sealed
    sess = g.sess
    sealer = sess.sealer
    assert sealer is not None
    intent: dict[str, Any] = {"goal": "context", "inputs": {}, "domain": "d"}
    if constraints is not None:
        intent["constraints"] = dict(constraints)
    if priority is not None:
        intent["priority"] = priority
    payload = payload_for(sess, copy.deepcopy(intent))
    ciphertext = sealer.seal_inputs(sess.last_sequence, "context", inputs)
    payload["intent"]["sealed"] = m.sealed_digest(ciphertext)
    params_intent = {**copy.deepcopy(intent), "sealed": ciphertext}
    if isinstance(value, str) and value in SEALED_CHANGES:
        value = SEALED_CHANGES[value](ciphertext)
        path = ("intent", "sealed")
    value = value if value is DROP else copy.deepcopy(value)
    if where in ("payload", "both"):
        _set(payload, path, value)
    params = signed_params(sess, payload, params_intent)
    params["sequence"] = sess.last_sequence
    if where in ("params", "both"):
        _set(params, path, value if value is DROP else copy.deepcopy(value))
    g.send(params)


# -- the success reply written in parts is the one written whole -----------------------------------
@settings(max_examples=200, deadline=None, database=None)
@given(
    result=json_values.filter(lambda v: encoding.ijson_problem(v) is None),
    sequence=st.integers(min_value=1, max_value=MAX_SAFE_INT),
    at=st.integers(min_value=0, max_value=MAX_SAFE_INT),
    session_id=st.sampled_from(["A" * 43, "abc-_", 'q"uote\\', "é"]),
)
def test_a_success_is_the_answer_written_whole(result: Any, sequence: int, at: int, session_id: str) -> None:
    w = make_world()
    replies = SignedReplies(w.server._config)
    req_hash = "sha256:" + hashlib.sha256(session_id.encode()).hexdigest()
    reply = replies.success(session_id, sequence, req_hash, result, at)
    payload = {
        "session_id": session_id,
        "sequence": sequence,
        "request_hash": req_hash,
        "status": "success",
        "result": result,
        "timestamp": at,
    }
    token = jws_sign(payload, w.server_id, m.Typ.RESPONSE)
    sent = {"status": "success", "sequence": sequence, "result": result, "response_jws": token}
    assert reply.result == sent
    assert reply.result_json == encoding.dumps(sent)
    assert reply.stored is not None
    stored: dict[str, Any] = {"http_status": 200, "result": result, "signed_at": at}
    if result is None:
        del stored["result"]
    assert reply.stored.to_json() == encoding.dumps(stored)
