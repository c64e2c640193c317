"""docs/PROTOCOL.md §12.7 is the code's contract: the delegation examples checked against it.

The documented links verify with the keys their issuers' DIDs resolve to and form a chain
that passes every rule; the documented requests, replayed by a real client session against a
fresh server configured as the generator's (``scripts/protocol_examples.py``), are exactly
what the client signs and get exactly the documented answers, which the client accepts.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from test_protocol_doc import DOCUMENTED, pe  # the document and its generator, loaded once

from a2a_secure.delegation import CHAIN_UNKNOWN, TYP, parse_chain, verify_signatures
from a2a_secure.errors import PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol import models
from a2a_secure.protocol.wire import encode_error, encode_result
from a2a_secure.testing import FakeClock

# (request, answer, step time)
STEPS = [
    ("delegation-request", "delegation-result", "first"),
    ("delegation-again-request", "delegation-again-result", "again"),
    ("delegation-refused-request", "delegation-refused-error", "refused"),
    ("delegation-unknown-request", "delegation-unknown-error", "unknown"),
]


def value(name: str) -> Any:
    lang, _http, body = DOCUMENTED[name]
    assert lang == "json", name
    return json.loads(body)


def same_json(a: Any, b: Any) -> bool:
    return encoding.jcs(a) == encoding.jcs(b)


def test_the_documented_chain_verifies_with_the_issuers_keys_and_narrows() -> None:
    tokens = value("delegation-request")["params"]["intent"]["delegation"]
    chain = parse_chain(tokens)

    def key_for(link: Any) -> bytes:
        key = resolve_did_key(link.issuer).key_for(link.kid)
        assert key is not None
        return key

    verify_signatures(chain, key_for)
    assert same_json(jws_decode_unverified(tokens[1])[0], value("delegation-header"))
    assert value("delegation-header")["typ"] == TYP
    assert same_json(jws_decode_unverified(tokens[0])[1], value("delegation-root-payload"))
    assert same_json(jws_decode_unverified(tokens[1])[1], value("delegation-hop-payload"))
    client_did = value("hello")["params"]["agent_did"]
    server_did = value("challenge")["result"]["server_did"]
    assert chain.principal == pe.person_identity().did and chain.audience == client_did
    assert chain.links[1].parent == encoding.hash_bytes(tokens[0].encode())
    assert set(chain.leaf.goals) < set(chain.links[0].goals)
    assert value("delegation-again-request")["params"]["intent"]["delegation"] == chain.hash
    now = pe.DELEGATION_AT["first"]
    chain.check_use(now=now, client_did=client_did, server_did=server_did, goal="echo")
    assert chain.refusal(now=now, client_did=client_did, server_did=server_did, goal="count") is not None


async def test_the_documented_requests_get_the_documented_answers() -> None:
    clock = FakeClock(float(pe.T0))
    runs: list[Any] = []
    server = pe.make_delegation_server(clock, runs)
    session = await pe.open_session(
        server, clock, pe.DELEGATION_AT["handshake"], b"a2a-secure example client random 4"
    )
    assert session.server_manifest_hash == encoding.hash_of(pe.delegation_card(pe.server_identity()))
    assert "delegation" in pe.delegation_card(pe.server_identity())["a2a_secure_extensions"]
    for name, answer, step in STEPS:
        body = value(name)
        models.IntentRequest.parse(body["params"])
        clock.now = pe.DELEGATION_AT[step]
        req = session.prepare_intent(body["params"]["intent"])
        assert same_json(req.params, body["params"]), name
        reply = await server.handle("intent", copy.deepcopy(body["params"]))
        assert reply.http_status == DOCUMENTED[answer][1], (name, reply.error)
        wire = (
            encode_result(body["id"], reply.result)
            if reply.error is None
            else encode_error(body["id"], reply.error)
        )
        assert same_json(encoding.loads(wire), value(answer)), f"{answer} differs from the server's"
        documented = value(answer)
        if "result" in documented:
            session.verify_result(req, documented["result"])
        else:
            err = session.error_from_reply(req, documented["error"])
            assert err.signed and isinstance(err, PolicyViolation)
            assert err.message.startswith("delegation refused:")
            if name == "delegation-unknown-request":  # §12.7: a member, not only the text, says so
                unknown = body["params"]["intent"]["delegation"]
                assert err.data == {"chain_unknown": unknown} and err.message.endswith(CHAIN_UNKNOWN)
    # The two echoes ran, the refused count and the unknown chain did not.
    assert [(r.goal, r.sequence) for r in runs] == [("echo", 1), ("echo", 2)]


async def test_the_documented_sealed_chain_opens_to_the_chain_and_nothing_of_it_is_in_the_clear() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from a2a_secure.protocol import messages as m

    tokens = value("delegation-request")["params"]["intent"]["delegation"]
    request = value("sealed-delegation-request")
    intent = request["params"]["intent"]
    assert "delegation" not in intent and set(intent) == {"goal", "inputs", "sealed", "sealed_delegation"}
    # The vector: the documented key, nonce and associated data open the member to the chain.
    vector = value("sealed-delegation-vector")
    assert vector["sealed_delegation"] == intent["sealed_delegation"]
    assert vector["delegation_nonce"][14:16] == "06"  # part byte 6
    plain = ChaCha20Poly1305(bytes.fromhex(vector["c2s_key"])).decrypt(
        bytes.fromhex(vector["delegation_nonce"]),
        encoding.b64u_decode(intent["sealed_delegation"]),
        vector["delegation_aad"].encode(),
    )
    assert json.loads(plain) == tokens and plain.decode() == vector["delegation_plaintext"]
    # Signed by its digest, as intent.sealed.
    payload = value("sealed-delegation-payload")
    assert (
        payload["intent"]["sealed_delegation"]
        == m.sealed_digest(intent["sealed_delegation"])
        == vector["digest"]
    )
    # No link, DID of the chain, or its name crosses in the clear, in the requests or the refusal.
    chain = parse_chain(tokens)
    secrets = [
        *tokens,
        chain.hash,
        chain.principal,
        pe.assistant_identity().did,
        *(lk.jti for lk in chain.links),
    ]
    unknown = value("sealed-chain-unknown-data")["chain_unknown"]
    for name in ("sealed-delegation-request", "sealed-chain-unknown-request", "sealed-chain-unknown-error"):
        text = json.dumps(value(name))
        assert not [x for x in [*secrets, unknown] if x in text], name
    error = value("sealed-chain-unknown-error")["error"]
    assert error["message"] == f"delegation refused: chain {CHAIN_UNKNOWN}"
    assert set(error["data"]) == {"sealed", "response_jws"}


async def test_the_documented_sealed_chain_requests_get_the_documented_answers() -> None:
    clock = FakeClock(float(pe.T0))
    runs: list[Any] = []
    server = pe.make_delegation_server(clock, runs, sealed=True)
    session = await pe.open_session(
        server, clock, pe.DELEGATION_AT["sealed_handshake"], b"a2a-secure example client random 5", seal=True
    )
    assert session.sealed
    tokens = value("delegation-request")["params"]["intent"]["delegation"]
    steps = [
        ("sealed-delegation-request", "sealed_first", tokens, None),
        ("sealed-chain-unknown-request", "sealed_unknown", None, "sealed-chain-unknown-error"),
    ]
    for name, step, chain, answer in steps:
        body = value(name)
        clock.now = pe.DELEGATION_AT[step]
        member = chain if chain is not None else value("sealed-chain-unknown-data")["chain_unknown"]
        req = session.prepare_intent(
            {"goal": "echo", "inputs": {"text": "Add the dentist on Friday"}, "delegation": member}
        )
        assert same_json(req.params, body["params"]), name  # what the client seals and signs
        reply = await server.handle("intent", copy.deepcopy(body["params"]))
        if answer is None:
            assert reply.error is None
            assert session.verify_result(req, reply.result).result == {"text": "Add the dentist on Friday"}
            continue
        wire = encoding.loads(encode_error(body["id"], reply.error))
        assert same_json(wire, value(answer)) and reply.http_status == DOCUMENTED[answer][1]
        err = session.error_from_reply(req, value(answer)["error"])
        assert err.signed and isinstance(err, PolicyViolation)
        assert same_json(err.data, value("sealed-chain-unknown-data"))
        assert err.message == err.data["reason"]  # the full message, read after opening
        # A member added beside the sealed data on the way is not read (it is not signed),
        # with the sealed data there or stripped.
        forged = copy.deepcopy(value(answer)["error"])
        forged["data"]["chain_unknown"] = "sha256:" + "0" * 64
        assert session.error_from_reply(req, forged).data["chain_unknown"] == err.data["chain_unknown"]
        del forged["data"]["sealed"]
        stripped = session.error_from_reply(req, forged)
        assert stripped.signed and not stripped.data and stripped.message == value(answer)["error"]["message"]
    assert [(r.goal, r.sequence) for r in runs] == [("echo", 1)]
