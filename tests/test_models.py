"""The typed message models (a2a_secure.protocol.models): round trips, refusals, immutability."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InvalidParams,
    StaleTimestamp,
    UnsupportedVersion,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol import models as md

T0 = 1_763_700_000
ID = Identity.from_seed(b"\x01" * 32, agent_id="models")
NONCE = encoding.b64u_encode(bytes(range(1, 33)))
NONCE_B = encoding.b64u_encode(bytes(range(2, 34)))
SID = encoding.b64u_encode(bytes(range(3, 35)))
H = encoding.hash_of({"x": 1})
TOKEN = jws_sign({"a": 1}, ID, "a2a-request+jws")
KEY = ID.public_key_entry()
POLICY = Policy.build(allowed=["echo"]).to_dict()

SAMPLES: dict[type[Any], dict[str, Any]] = {
    md.PublicKeyEntry: KEY,
    md.Hello: {
        "type": "hello",
        "protocol_version": "1.0",
        "agent_did": ID.did,
        "agent_id": "client",
        "manifest_hash": H,
        "nonce": NONCE,
        "public_keys": [KEY],
        "timestamp": T0,
    },
    md.Challenge: {
        "type": "challenge",
        "protocol_version": "1.0",
        "nonce_b": NONCE_B,
        "server_did": ID.did,
        "manifest_hash": H,
        "public_keys": [KEY],
        "policy_hash": H,
        "policy_signature": TOKEN,
        "timestamp": T0,
    },
    md.PolicyPayload: {
        "protocol_version": "1.0",
        "hello_hash": H,
        "client_did": ID.did,
        "server_did": ID.did,
        "nonce_a": NONCE,
        "nonce_b": NONCE_B,
        "client_manifest_hash": H,
        "server_manifest_hash": H,
        "policy_hash": H,
        "timestamp": T0,
    },
    md.Proof: {"type": "proof", "nonce_b": NONCE_B, "proof_jws": TOKEN},
    md.AcceptPolicy: {"type": "accept_policy", "nonce_b": NONCE_B, "accept_jws": TOKEN},
    md.ProofPayload: {
        "nonce_a": NONCE,
        "nonce_b": NONCE_B,
        "client_did": ID.did,
        "server_did": ID.did,
        "client_manifest_hash": H,
        "server_manifest_hash": H,
        "challenge_hash": H,
        "timestamp": T0,
    },
    md.AcceptPayload: {
        "policy_hash": H,
        "session_commitment": H,
        "nonce_a": NONCE,
        "nonce_b": NONCE_B,
        "client_did": ID.did,
        "server_did": ID.did,
        "timestamp": T0,
    },
    md.PolicyMessage: {"type": "policy", "policy": POLICY, "policy_hash": H, "policy_signature": TOKEN},
    md.SessionMessage: {
        "type": "session",
        "session_id": SID,
        "server_did": ID.did,
        "client_did": ID.did,
        "session_commitment": H,
        "created_at": T0,
        "expires_at": T0 + 3600,
        "public_keys": [KEY],
        "session_jws": TOKEN,
    },
    md.SessionPayload: {
        "session_id": SID,
        "session_commitment": H,
        "client_did": ID.did,
        "server_did": ID.did,
        "created_at": T0,
        "expires_at": T0 + 3600,
    },
    md.Constraints: {"timeout_ms": 1000, "max_tokens": 5, "stream": True},
    md.Intent: {
        "goal": "echo",
        "domain": "nlp",
        "inputs": {"text": "hi"},
        "constraints": {"timeout_ms": 1000},
    },
    md.IntentRequest: {
        "session_id": SID,
        "session_commitment": H,
        "sequence": 1,
        "intent": {"goal": "echo", "inputs": {}},
        "request_jws": TOKEN,
    },
    md.CloseRequest: {"session_id": SID, "session_commitment": H, "sequence": 2, "request_jws": TOKEN},
    md.RequestPayload: {
        "session_id": SID,
        "session_commitment": H,
        "sequence": 1,
        "timestamp": T0,
        "intent": {"goal": "echo", "inputs": {}},
    },
    md.ClosePayload: {
        "session_id": SID,
        "session_commitment": H,
        "sequence": 2,
        "timestamp": T0,
        "close": True,
    },
    md.ErrorObject: {"code": -32042, "message": "not allowed"},
    md.IntentResultMessage: {"status": "success", "sequence": 1, "result": {"a": 1}, "response_jws": TOKEN},
    md.ClosedMessage: {"type": "closed", "session_id": SID, "response_jws": TOKEN},
    md.ResponsePayload: {
        "session_id": SID,
        "sequence": 1,
        "request_hash": H,
        "status": "success",
        "result": {"a": 1},
        "timestamp": T0,
    },
    md.EventMessage: {
        "status": "success",
        "sequence": 1,
        "index": 0,
        "final": False,
        "result": {"i": 0},
        "response_jws": TOKEN,
    },
    md.EventPayload: {
        "session_id": SID,
        "sequence": 1,
        "request_hash": H,
        "index": 0,
        "final": False,
        "status": "success",
        "result": {"i": 0},
        "timestamp": T0,
    },
}
ERROR_VARIANTS: dict[type[Any], dict[str, Any]] = {
    md.ResponsePayload: {
        "session_id": SID,
        "sequence": 1,
        "request_hash": H,
        "status": "error",
        "error": {"code": -32042, "message": "no"},
        "timestamp": T0,
    },
    md.EventMessage: {
        "status": "error",
        "sequence": 1,
        "index": 3,
        "final": True,
        "error": {"code": -32049, "message": "timeout"},
        "response_jws": TOKEN,
    },
    md.EventPayload: {
        "session_id": SID,
        "sequence": 1,
        "request_hash": H,
        "index": 3,
        "final": True,
        "status": "error",
        "error": {"code": -32049, "message": "timeout"},
        "timestamp": T0,
    },
}
ALL = [*SAMPLES.items(), *ERROR_VARIANTS.items()]
IDS = [cls.__name__ for cls, _ in SAMPLES.items()] + [f"{c.__name__}-error" for c in ERROR_VARIANTS]


def _default_error(cls: type[Any]) -> type[A2AError]:
    params = {
        md.Hello,
        md.Proof,
        md.AcceptPolicy,
        md.IntentRequest,
        md.CloseRequest,
        md.Intent,
        md.Constraints,
        md.PublicKeyEntry,
    }
    return InvalidParams if cls in params else AuthenticationFailed


def test_every_model_of_the_brief_has_a_sample() -> None:
    public = {getattr(md, name) for name in md.__all__ if dataclasses.is_dataclass(getattr(md, name))}
    assert public == set(SAMPLES)


@pytest.mark.parametrize(("cls", "wire"), ALL, ids=IDS)
def test_round_trip_gives_the_wire_object_back(cls: type[Any], wire: dict[str, Any]) -> None:
    model = cls.parse(copy.deepcopy(wire))
    assert model.to_dict() == wire
    assert encoding.hash_of(model.to_dict()) == encoding.hash_of(wire)
    assert cls.parse(model.to_dict()) == model


@pytest.mark.parametrize(("cls", "wire"), ALL, ids=IDS)
def test_models_are_frozen_and_slotted(cls: type[Any], wire: dict[str, Any]) -> None:
    model = cls.parse(wire)
    assert dataclasses.is_dataclass(model)
    assert not hasattr(model, "__dict__")
    name = dataclasses.fields(model)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(model, name, None)
    with pytest.raises((AttributeError, TypeError)):
        model.not_a_field = 1  # type: ignore[union-attr]


@pytest.mark.parametrize(("cls", "wire"), ALL, ids=IDS)
def test_direct_construction_is_validated(cls: type[Any], wire: dict[str, Any]) -> None:
    model = cls.parse(wire)
    values = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
    assert cls(**values) == model


@pytest.mark.parametrize(("cls", "wire"), ALL, ids=IDS)
def test_missing_extra_and_non_object_are_refused(cls: type[Any], wire: dict[str, Any]) -> None:
    err = _default_error(cls)
    bad: Any
    for bad in ([], "x", None, 1):
        with pytest.raises(err) as info:
            cls.parse(bad)
        assert info.value.code == err.code
    with pytest.raises(err):
        cls.parse({**wire, "zzz_extra": 1})
    if cls is not md.Constraints:  # all constraints are optional
        victim = next(k for k in wire if k not in ("type", "protocol_version", "domain", "constraints"))
        with pytest.raises(err):
            cls.parse({k: v for k, v in wire.items() if k != victim})


@pytest.mark.parametrize(("cls", "wire"), ALL, ids=IDS)
def test_error_class_follows_the_caller(cls: type[Any], wire: dict[str, Any]) -> None:
    other = AuthenticationFailed if _default_error(cls) is InvalidParams else InvalidParams
    with pytest.raises(other):
        cls.parse({**wire, "zzz_extra": 1}, error=other)


def _bad(cls: type[Any], **changes: Any) -> dict[str, Any]:
    return {**SAMPLES[cls], **changes}


CASES: list[tuple[type[Any], dict[str, Any], type[A2AError]]] = [
    (md.PublicKeyEntry, _bad(md.PublicKeyEntry, kty="EC"), InvalidParams),
    (md.PublicKeyEntry, _bad(md.PublicKeyEntry, kid=""), InvalidParams),
    (md.PublicKeyEntry, _bad(md.PublicKeyEntry, key=encoding.b64u_encode(bytes(31))), InvalidParams),
    (md.PublicKeyEntry, _bad(md.PublicKeyEntry, key=KEY["key"] + "="), InvalidParams),
    (md.Hello, _bad(md.Hello, protocol_version=1), InvalidParams),
    (md.Hello, _bad(md.Hello, type=None), InvalidParams),
    (md.Hello, _bad(md.Hello, protocol_version="2.0"), UnsupportedVersion),
    (md.Hello, _bad(md.Hello, type="proof"), InvalidParams),
    (md.Hello, _bad(md.Hello, agent_id="x" * 129), InvalidParams),
    (md.Hello, _bad(md.Hello, manifest_hash="sha256:AB"), InvalidParams),
    (md.Hello, _bad(md.Hello, nonce=encoding.b64u_encode(bytes(32))), InvalidParams),
    (md.Hello, _bad(md.Hello, public_keys=[]), InvalidParams),
    (md.Hello, _bad(md.Hello, public_keys=[KEY] * 9), InvalidParams),
    (md.Hello, _bad(md.Hello, timestamp=True), InvalidParams),
    (md.Hello, _bad(md.Hello, timestamp=1.0), InvalidParams),
    (md.Hello, _bad(md.Hello, agent_did="not-a-did"), InvalidParams),
    (md.Challenge, _bad(md.Challenge, type="hello"), AuthenticationFailed),
    (md.Challenge, _bad(md.Challenge, protocol_version="2.0"), UnsupportedVersion),
    (md.Challenge, _bad(md.Challenge, server_did="nope"), AuthenticationFailed),
    (md.Challenge, _bad(md.Challenge, nonce_b="!"), AuthenticationFailed),
    (md.Challenge, _bad(md.Challenge, policy_hash=1), AuthenticationFailed),
    (md.Challenge, _bad(md.Challenge, timestamp="1"), AuthenticationFailed),
    (md.Proof, _bad(md.Proof, type="accept_policy"), InvalidParams),
    (md.Proof, _bad(md.Proof, nonce_b=NONCE_B[:-1]), InvalidParams),
    (md.Proof, _bad(md.Proof, proof_jws="a.b"), InvalidParams),
    (md.AcceptPolicy, _bad(md.AcceptPolicy, accept_jws=5), InvalidParams),
    (md.ProofPayload, _bad(md.ProofPayload, timestamp="1"), AuthenticationFailed),
    (md.AcceptPayload, _bad(md.AcceptPayload, timestamp=-1), AuthenticationFailed),
    (md.PolicyMessage, _bad(md.PolicyMessage, type="session"), AuthenticationFailed),
    (md.PolicyMessage, _bad(md.PolicyMessage, policy={**POLICY, "rate_limit": 0}), AuthenticationFailed),
    (md.SessionMessage, _bad(md.SessionMessage, type="policy"), AuthenticationFailed),
    (md.SessionMessage, _bad(md.SessionMessage, session_id=NONCE[:10]), AuthenticationFailed),
    (md.SessionMessage, _bad(md.SessionMessage, expires_at=2**53), AuthenticationFailed),
    (md.Constraints, _bad(md.Constraints, timeout_ms=0), InvalidParams),
    (md.Constraints, _bad(md.Constraints, max_tokens=True), InvalidParams),
    (md.Constraints, _bad(md.Constraints, stream=1), InvalidParams),
    (md.Intent, _bad(md.Intent, goal=""), InvalidParams),
    (md.Intent, _bad(md.Intent, goal="g" * 129), InvalidParams),
    (md.Intent, _bad(md.Intent, inputs=[]), InvalidParams),
    (md.Intent, _bad(md.Intent, domain=None), InvalidParams),
    (md.Intent, _bad(md.Intent, constraints={"unknown": 1}), InvalidParams),
    (md.IntentRequest, _bad(md.IntentRequest, sequence=0), InvalidParams),
    (md.IntentRequest, _bad(md.IntentRequest, session_commitment="x"), InvalidParams),
    (md.IntentRequest, _bad(md.IntentRequest, intent={"goal": "echo"}), InvalidParams),
    (md.IntentRequest, _bad(md.IntentRequest, request_jws="x"), InvalidParams),
    (md.CloseRequest, _bad(md.CloseRequest, session_id=H), InvalidParams),
    (md.RequestPayload, _bad(md.RequestPayload, sequence=0), AuthenticationFailed),
    (md.RequestPayload, _bad(md.RequestPayload, timestamp=None), AuthenticationFailed),
    (md.ClosePayload, _bad(md.ClosePayload, close=1), AuthenticationFailed),
    (md.ErrorObject, _bad(md.ErrorObject, code=1.0), AuthenticationFailed),
    (md.ErrorObject, _bad(md.ErrorObject, message=None), AuthenticationFailed),
    (md.IntentResultMessage, _bad(md.IntentResultMessage, response_jws=None), AuthenticationFailed),
    (md.ClosedMessage, _bad(md.ClosedMessage, response_jws=1), AuthenticationFailed),
    (md.ResponsePayload, _bad(md.ResponsePayload, timestamp=1.5), AuthenticationFailed),
    (md.EventMessage, _bad(md.EventMessage, response_jws=None), AuthenticationFailed),
    (md.EventPayload, _bad(md.EventPayload, index=True), AuthenticationFailed),
    (md.EventPayload, _bad(md.EventPayload, final=0), AuthenticationFailed),
    (md.EventPayload, _bad(md.EventPayload, status="error"), AuthenticationFailed),
    (md.EventPayload, {**ERROR_VARIANTS[md.EventPayload], "final": False}, AuthenticationFailed),
]


@pytest.mark.parametrize(("cls", "wire", "err"), CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_invalid_shape_gives_the_right_error(
    cls: type[Any], wire: dict[str, Any], err: type[A2AError]
) -> None:
    with pytest.raises(A2AError) as info:
        cls.parse(wire)
    assert type(info.value) is err
    assert info.value.code == err.code


def test_hello_order_version_before_other_shapes() -> None:
    # §5.1: strings, then version (-32046 with data.supported), then the other shapes.
    wire = _bad(md.Hello, protocol_version="9.9", type="nope", agent_id="")
    with pytest.raises(UnsupportedVersion) as info:
        md.Hello.parse(wire)
    assert info.value.data == {"supported": ["1.0"]}
    with pytest.raises(InvalidParams):
        md.Hello.parse({**wire, "protocol_version": 9.9})


def test_hello_order_freshness_before_did_syntax() -> None:
    wire = _bad(md.Hello, agent_did="not-a-did")
    with pytest.raises(StaleTimestamp):
        md.Hello.parse(wire, now=T0 + 301)
    with pytest.raises(InvalidParams):
        md.Hello.parse(wire, now=T0 + 300)


def test_hello_reports_the_claimed_did_before_later_failures() -> None:
    seen: list[str] = []
    with pytest.raises(InvalidParams):
        md.Hello.parse(_bad(md.Hello, agent_id=""), on_agent_did=seen.append)
    assert seen == [ID.did]


def test_challenge_server_did_is_compared_before_the_nonce() -> None:
    wire = _bad(md.Challenge, nonce_b=1)
    with pytest.raises(AuthenticationFailed, match="another DID"):
        md.Challenge.parse(wire, server_did="did:key:zother")
    with pytest.raises(AuthenticationFailed, match="nonce_b"):
        md.Challenge.parse(wire, server_did=ID.did)


@pytest.mark.parametrize(
    "cls", [md.PolicyPayload, md.ProofPayload, md.AcceptPayload, md.SessionPayload, md.RequestPayload]
)
def test_payload_members_are_compared_with_expected(cls: type[Any]) -> None:
    wire = SAMPLES[cls]
    name = next(k for k in wire if k != "timestamp")
    assert cls.parse(wire, expected={name: wire[name]}).to_dict() == wire
    with pytest.raises(AuthenticationFailed, match=f"signed {name} does not match"):
        cls.parse(wire, expected={name: "other"})


def test_payload_number_members_follow_json_equality() -> None:
    # §1: 1 and 1.0 are equal, so a compared member is not type-checked first.
    wire = _bad(md.SessionPayload, created_at=float(T0))
    assert md.SessionPayload.parse(wire, expected={"created_at": T0}).created_at == T0


def test_event_payload_is_checked_against_its_event_and_index() -> None:
    event = md.EventMessage.parse(SAMPLES[md.EventMessage])
    payload = SAMPLES[md.EventPayload]
    assert md.EventPayload.parse(payload, event=event, index=0).index == 0
    with pytest.raises(AuthenticationFailed, match="where 1 was expected"):
        md.EventPayload.parse(payload, event=event, index=1)
    with pytest.raises(AuthenticationFailed, match="result differs"):
        md.EventPayload.parse({**payload, "result": {"i": 9}}, event=event, index=0)


def test_intent_absent_members_stay_absent() -> None:
    intent = md.Intent.parse({"goal": "echo", "inputs": {}})
    assert intent.domain is None and intent.constraints is None and intent.stream is None
    assert intent.constraints_dict == {}
    assert intent.to_dict() == {"goal": "echo", "inputs": {}}
    assert md.Intent.parse({"goal": "echo", "inputs": {}, "domain": ""}).to_dict()["domain"] == ""


def test_token_models_keep_the_decoded_token_out_of_eq_and_repr() -> None:
    req = md.IntentRequest.parse(SAMPLES[md.IntentRequest])
    assert req.decoded[1] == {"a": 1}
    assert "decoded" not in repr(req)
    built = md.IntentRequest(
        req.session_id, req.session_commitment, req.sequence, req.intent, req.request_jws
    )
    assert built == req and built.decoded == req.decoded


def test_direct_construction_in_an_invalid_shape_is_refused() -> None:
    with pytest.raises(InvalidParams):
        md.Intent(goal="", inputs={})
    with pytest.raises(InvalidParams):
        md.Constraints(timeout_ms=0)
    with pytest.raises(InvalidParams):
        md.ErrorObject(code=True, message="x")
    with pytest.raises(InvalidParams):
        md.PublicKeyEntry(kid="", key=bytes(32))
    with pytest.raises(InvalidParams):
        md.CloseRequest(SID, H, 0, TOKEN)
