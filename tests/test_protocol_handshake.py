"""The handshake of PROTOCOL.md §5 between the two sans-I/O state machines, in memory.

Server side: one test per rejection of §5.1-§5.5 (ATTACKS.md F), each asserting the exact
error code and HTTP status, that the store did not change (``snapshot``), and that the
honest handshake still completes afterwards (the pending handshake was not consumed).
Client side: every check of §5.2, §5.4 and §5.6 makes the ``ClientHandshake`` fail for good.
"""

from __future__ import annotations

import copy
from typing import Any

import base58
import pytest
from protocol_helpers import (
    DROP,
    Flow,
    World,
    expect_error,
    flip_signature,
    identity,
    make_world,
    payload_of,
    resign,
    sign_raw,
)

from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InvalidRequest,
    PolicyViolation,
    StaleTimestamp,
    UnsupportedVersion,
)
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import HandshakeState
from a2a_secure.protocol.messages import Typ
from a2a_secure.protocol.server import ServerLimits

AUTH, HS_UNKNOWN, STALE, INVALID, VERSION, DID_ERR, FULL = (
    (-32040, 401),
    (-32041, 401),
    (-32045, 401),
    (-32602, 400),
    (-32046, 400),
    (-32047, 401),
    (-32048, 503),
)
THIRD = identity("mallory")


@pytest.fixture
def w() -> World:
    return make_world()


async def reject(w: World, method: str, params: Any, expected: tuple[int, int], **kw: Any) -> Any:
    """Send and expect exactly ``expected`` with no change of the store."""
    reply = await expect_error(lambda: w.call(method, params, **kw), *expected, store=w.store)
    assert "response_jws" not in (reply.error.get("data") or {}), "handshake errors are unsigned"
    return reply


def other_nonce() -> str:
    return encoding.b64u_encode(bytes(range(1, 33)))


# -- the honest handshake ---------------------------------------------------------------------
async def test_honest_handshake_creates_exactly_one_session(w: World) -> None:
    flow = Flow(w)
    await flow.start()
    assert w.store.counts() == {"pending": 1, "sessions": 0, "rates": 0, "claims": 0}
    pending = w.store._pending[(w.server_id.did, flow.challenge["nonce_b"])]
    assert pending.proven_kid is None and pending.client_did == w.client_id.did
    assert pending.expires_at == pending.created_at + 60
    await flow.prove()
    assert w.store._pending[(w.server_id.did, flow.challenge["nonce_b"])].proven_kid == w.client_id.kid
    sess = await flow.complete()
    assert w.store.counts() == {"pending": 0, "sessions": 1, "rates": 0, "claims": 0}
    assert flow.hs.state is HandshakeState.DONE
    rec = w.store._sessions[sess.session_id]
    assert rec.client_did == w.client_id.did and rec.server_did == w.server_id.did
    assert rec.session_commitment == sess.session_commitment
    assert rec.session_commitment == m.session_commitment(
        flow.hello["nonce"], flow.challenge["nonce_b"], flow.challenge["policy_hash"]
    )
    assert rec.expires_at == rec.created_at + Policy().session_timeout == sess.expires_at
    # The signatures carry the typ of their step (domain separation, §3).
    assert payload_of(flow.challenge["policy_signature"])["hello_hash"] == encoding.hash_of(flow.hello)
    assert [e["event"] for e in w.audit] == ["hello", "proof", "accept_policy"]
    assert all(e["status"] == "success" and e["role"] == "server" for e in w.audit)
    assert [e["verified"] for e in w.audit] == [False, True, True]


async def test_replayed_hello_opens_a_new_pending_that_cannot_complete(w: World) -> None:
    flow = await Flow(w).start()
    r = await w.call("hello", flow.hello)
    assert r.error is None and r.result["nonce_b"] != flow.challenge["nonce_b"]
    assert w.store.counts()["pending"] == 2
    # The attacker replays the honest PROOF against the new challenge: the payload names
    # the other nonce_b and challenge, so it fails and leaves both pendings as they were.
    await reject(w, "proof", {**flow.proof, "nonce_b": r.result["nonce_b"]}, AUTH)
    await flow.complete()


# -- HELLO (§5.1) ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("member", "value"),
    [("type", 1), ("type", None), ("protocol_version", 1), ("protocol_version", None), ("type", ["hello"])],
)
async def test_hello_type_and_version_must_be_strings(w: World, member: str, value: Any) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, member: value}, INVALID)


async def test_hello_type_must_be_hello(w: World) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "type": "proof"}, INVALID)


@pytest.mark.parametrize("version", ["2.0", "1.0 ", "2.0-beta", "1", "", "1.1"])
async def test_hello_unsupported_version(w: World, version: str) -> None:
    hello = w.handshake().hello()
    reply = await reject(w, "hello", {**hello, "protocol_version": version}, VERSION)
    assert reply.error["data"] == {"supported": ["1.0"]}


async def test_hello_version_is_checked_before_other_shapes(w: World) -> None:
    hello = w.handshake().hello()
    bad = {**hello, "protocol_version": "2.0", "agent_id": "", "extra": 1, "timestamp": 0}
    await reject(w, "hello", bad, VERSION)


@pytest.mark.parametrize(
    "change",
    [
        {"extra": 1},
        {"session_id": "x"},  # F17: a client-proposed session id is not a member
        {"agent_did": DROP},
        {"nonce": DROP},
        {"timestamp": DROP},
    ],
    ids=["unknown-member", "session-id-proposal", "no-agent-did", "no-nonce", "no-timestamp"],
)
async def test_hello_members_exact(w: World, change: dict[str, Any]) -> None:
    hello = w.handshake().hello()
    for k, v in change.items():
        if v is DROP:
            del hello[k]
        else:
            hello[k] = v
    await reject(w, "hello", hello, INVALID)


@pytest.mark.parametrize("agent_id", ["", "x" * 129, 7, None])
async def test_hello_agent_id_bounds(w: World, agent_id: Any) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "agent_id": agent_id}, INVALID)


async def test_hello_agent_id_of_128_characters_passes(w: World) -> None:
    await Flow(w, identity("a" * 128)).complete()


@pytest.mark.parametrize(
    "nonce",
    [
        encoding.b64u_encode(bytes(range(1, 32))),  # 31 bytes
        encoding.b64u_encode(bytes(range(1, 34))),  # 33 bytes
        encoding.b64u_encode(bytes(range(1, 33))) + "=",  # padding
        encoding.b64u_encode(bytes(range(1, 33)))[:-1] + "B",  # non-canonical trailing bits
        "+" + encoding.b64u_encode(bytes(range(1, 33)))[1:],  # outside the alphabet
        encoding.b64u_encode(bytes(32)),  # all zero: not random
        "",
        12345,
    ],
    ids=["31-bytes", "33-bytes", "padding", "trailing-bits", "alphabet", "zero", "empty", "integer"],
)
async def test_hello_bad_nonce(w: World, nonce: Any) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "nonce": nonce}, INVALID)


@pytest.mark.parametrize("delta", [-301, 301, 3600, -86400])
async def test_hello_stale_or_future_timestamp(w: World, delta: int) -> None:
    hs = w.handshake()
    with w.clock.shifted(delta):
        hello = hs.hello()
    await reject(w, "hello", hello, STALE)


@pytest.mark.parametrize("delta", [-300, 300])
async def test_hello_timestamp_at_the_boundary_passes(w: World, delta: int) -> None:
    flow = Flow(w)
    with w.clock.shifted(delta):
        flow.hello = flow.hs.hello()
    r = await w.call("hello", flow.hello)
    assert r.error is None, r.error
    flow.challenge = r.result
    flow.proof = flow.hs.receive_challenge(r.result)
    await flow.complete()


@pytest.mark.parametrize(
    "timestamp", ["1763700000", 1763700000.0, True, None, -1], ids=["string", "float", "bool", "null", "neg"]
)
async def test_hello_timestamp_wrong_type(w: World, timestamp: Any) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "timestamp": timestamp}, INVALID)


async def test_hello_timestamp_in_milliseconds_is_stale(w: World) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "timestamp": hello["timestamp"] * 1000}, STALE)


async def test_hello_freshness_comes_before_did_syntax(w: World) -> None:
    hello = w.handshake().hello()
    await reject(
        w, "hello", {**hello, "agent_did": "not-a-did", "timestamp": hello["timestamp"] - 301}, STALE
    )


@pytest.mark.parametrize(
    "did", ["not-a-did", "did:", "did:key:", "DID:key:z6Mk", "did:key:z6Mk" + "x" * 2048]
)
async def test_hello_did_syntax(w: World, did: str) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "agent_did": did}, INVALID)


@pytest.mark.parametrize(
    "did",
    [
        "did:example:123456789abcdefghi",
        "did:web:example.com",  # no did:web resolver registered here: nothing is fetched
        "did:key:z" + base58.b58encode(b"\xec\x01" + bytes(range(32))).decode(),  # X25519 multicodec
        "did:key:z" + base58.b58encode(b"\xed\x01" + bytes(31)).decode(),  # key too short
        "did:key:z" + base58.b58encode(b"\xed\x01" + bytes(32)).decode(),  # small-order point
    ],
    ids=["unsupported-method", "did-web-unregistered", "x25519", "short-key", "small-order"],
)
async def test_hello_did_not_resolvable(w: World, did: str) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "agent_did": did}, DID_ERR)


async def test_hello_public_keys_bound_to_another_did(w: World) -> None:
    hello = w.handshake().hello()
    # The third party's own entry (its kid names its DID).
    await reject(w, "hello", {**hello, "public_keys": [THIRD.public_key_entry()]}, AUTH)
    # The client's kid with the third party's key.
    entry = {**THIRD.public_key_entry(), "kid": w.client_id.kid}
    await reject(w, "hello", {**hello, "public_keys": [entry]}, AUTH)
    # The honest entry plus a foreign one.
    both = [w.client_id.public_key_entry(), THIRD.public_key_entry()]
    await reject(w, "hello", {**hello, "public_keys": both}, AUTH)
    # The same entry twice.
    twice = [w.client_id.public_key_entry()] * 2
    await reject(w, "hello", {**hello, "public_keys": twice}, AUTH)


@pytest.mark.parametrize(
    "public_keys",
    [
        [],
        "x",
        [identity("k").public_key_entry()] * 9,
        [{**identity("k").public_key_entry(), "jwk": {}}],
        [{**identity("k").public_key_entry(), "crv": "X25519"}],
        [{**identity("k").public_key_entry(), "key": encoding.b64u_encode(bytes(31))}],
    ],
    ids=["empty", "string", "nine", "extra-member", "crv", "short-key"],
)
async def test_hello_public_keys_shape(w: World, public_keys: Any) -> None:
    hello = w.handshake().hello()
    await reject(w, "hello", {**hello, "public_keys": public_keys}, INVALID)


async def test_hello_from_the_servers_own_did_is_refused(w: World) -> None:
    """F5: a handshake with oneself (a reflected HELLO) is refused."""
    hello = make_world().handshake(w.server_id, server_did=THIRD.did).hello()
    await reject(w, "hello", hello, AUTH)


async def test_hello_capacity_per_source_and_total() -> None:
    w = make_world(limits=ServerLimits(max_pending_per_source=2, max_pending_total=3))
    a1 = await Flow(w, identity("c1"), source="10.0.0.1").start()
    a2 = await Flow(w, identity("c2"), source="10.0.0.1").start()
    # Per source: a third HELLO from the same address is refused, nothing evicted.
    reply = await reject(w, "hello", Flow(w).hs.hello(), FULL, source="10.0.0.1")
    assert reply.retry_after is not None and reply.retry_after >= 1
    assert reply.error["data"]["retry_after"] == reply.retry_after
    b1 = await Flow(w, identity("c3"), source="10.0.0.2").start()
    # In total: a fourth pending is refused whatever its source.
    await reject(w, "hello", Flow(w).hs.hello(), FULL, source="10.0.0.3")
    # No valid entry was evicted: every earlier handshake still completes.
    for flow in (a1, a2, b1):
        await flow.complete()
    assert w.store.counts() == {"pending": 0, "sessions": 3, "rates": 0, "claims": 0}
    await Flow(w, source="10.0.0.1").complete()


async def test_hello_capacity_frees_up_when_pendings_expire() -> None:
    w = make_world(limits=ServerLimits(max_pending_per_source=1, max_pending_total=10))
    old = await Flow(w, source="s").start()
    await reject(w, "hello", Flow(w).hs.hello(), FULL, source="s")
    w.clock.advance(59)
    await reject(w, "hello", Flow(w).hs.hello(), FULL, source="s")
    w.clock.advance(2)  # the old pending is now expired and may be swept
    await Flow(w, source="s").complete()
    r = await w.call("proof", old.proof)
    assert r.error is not None and r.error["code"] == -32041


# -- PROOF (§5.3) --------------------------------------------------------------------------
def _proof_forgeries(flow: Flow, w: World) -> dict[str, str]:
    tok = flow.proof["proof_jws"]
    c, s = w.client_id, w.server_id
    p = payload_of(tok)
    return {
        "typ-accept": resign(tok, c, typ=Typ.ACCEPT),
        "typ-request": resign(tok, c, typ=Typ.REQUEST),
        "typ-policy": resign(tok, c, typ=Typ.POLICY),
        "kid-unknown-fragment": resign(tok, c, kid=c.did + "#other"),
        "kid-third": resign(tok, c, kid=THIRD.kid),
        "signer-third-client-kid": resign(tok, THIRD),
        "signer-third-own-kid": resign(tok, THIRD, kid=THIRD.kid),
        "signer-server": resign(tok, s, kid=c.kid),
        "bad-signature": flip_signature(tok),
        "header-jwk": resign(tok, c, extra_header={"jwk": {"kty": "OKP"}}),
        "header-crit": resign(tok, c, extra_header={"crit": ["exp"]}),
        "swapped-dids": resign(tok, c, client_did=s.did, server_did=c.did),
        "server-did-third": resign(tok, c, server_did=THIRD.did),
        "client-did-third": resign(tok, c, client_did=THIRD.did),
        "nonce-a": resign(tok, c, nonce_a=other_nonce()),
        "nonce-b": resign(tok, c, nonce_b=other_nonce()),
        "challenge-hash": resign(tok, c, challenge_hash=encoding.hash_of({"x": 1})),
        "client-manifest": resign(tok, c, client_manifest_hash=encoding.hash_of({"x": 2})),
        "server-manifest": resign(tok, c, server_manifest_hash=encoding.hash_of({"x": 3})),
        "extra-member": resign(tok, c, session_id="x"),
        "missing-member": resign(tok, c, challenge_hash=DROP),
        "timestamp-string": resign(tok, c, timestamp=str(p["timestamp"])),
        "timestamp-float": resign(tok, c, timestamp=float(p["timestamp"]) + 0.5),
        "timestamp-bool": resign(tok, c, timestamp=True),
        "nonce-a-type": resign(tok, c, nonce_a=1),
    }


PROOF_CASES = [
    "typ-accept",
    "typ-request",
    "typ-policy",
    "kid-unknown-fragment",
    "kid-third",
    "signer-third-client-kid",
    "signer-third-own-kid",
    "signer-server",
    "bad-signature",
    "header-jwk",
    "header-crit",
    "swapped-dids",
    "server-did-third",
    "client-did-third",
    "nonce-a",
    "nonce-b",
    "challenge-hash",
    "client-manifest",
    "server-manifest",
    "extra-member",
    "missing-member",
    "timestamp-string",
    "timestamp-float",
    "timestamp-bool",
    "nonce-a-type",
]


@pytest.mark.parametrize("case", PROOF_CASES)
async def test_proof_forgery_is_authentication_failure(w: World, case: str) -> None:
    flow = await Flow(w).start()
    forged = _proof_forgeries(flow, w)[case]
    await reject(w, "proof", {**flow.proof, "proof_jws": forged}, AUTH)
    assert w.store._pending[(w.server_id.did, flow.challenge["nonce_b"])].proven_kid is None
    await flow.complete()  # the pending handshake was left as it was


async def test_proof_forgery_list_is_complete(w: World) -> None:
    flow = await Flow(w).start()
    assert sorted(_proof_forgeries(flow, w)) == sorted(PROOF_CASES)


@pytest.mark.parametrize("delta", [-301, 301])
async def test_proof_stale_or_future_timestamp(w: World, delta: int) -> None:
    flow = await Flow(w).start()
    tok = flow.proof["proof_jws"]
    forged = resign(tok, w.client_id, timestamp=payload_of(tok)["timestamp"] + delta)
    await reject(w, "proof", {**flow.proof, "proof_jws": forged}, STALE)
    await flow.complete()


@pytest.mark.parametrize("delta", [-300, 300])
async def test_proof_timestamp_at_the_boundary_passes(w: World, delta: int) -> None:
    flow = await Flow(w).start()
    tok = flow.proof["proof_jws"]
    flow.proof = {**flow.proof, "proof_jws": resign(tok, w.client_id, timestamp=int(w.clock()) + delta)}
    await flow.complete()


async def test_proof_unknown_nonce_b(w: World) -> None:
    flow = await Flow(w).start()
    await reject(w, "proof", {**flow.proof, "nonce_b": other_nonce()}, HS_UNKNOWN)
    await flow.complete()


async def test_proof_replayed(w: World) -> None:
    flow = await Flow(w).start()
    await flow.prove()
    await reject(w, "proof", flow.proof, HS_UNKNOWN)  # already proven
    await flow.accept()
    await reject(w, "proof", flow.proof, HS_UNKNOWN)  # handshake consumed


async def test_proof_after_pending_expired(w: World) -> None:
    flow = await Flow(w).start()
    w.clock.advance(61)
    reply = await w.call("proof", flow.proof)
    assert reply.error is not None and (reply.error["code"], reply.http_status) == HS_UNKNOWN
    assert w.store.counts() == {"pending": 0, "sessions": 0, "rates": 0, "claims": 0}


async def test_proof_just_before_pending_expiry_passes(w: World) -> None:
    flow = await Flow(w).start()
    w.clock.advance(59)
    await flow.complete()


async def test_proof_from_another_handshake(w: World) -> None:
    """F2/F3/F6: a PROOF of handshake 1 sent under handshake 2's nonce_b."""
    one = await Flow(w).start()
    two = await Flow(w).start()
    await reject(w, "proof", {**one.proof, "nonce_b": two.challenge["nonce_b"]}, AUTH)
    # Another client's PROOF relayed into this client's handshake (unknown key share).
    other = await Flow(w, identity("eve")).start()
    await reject(w, "proof", {**other.proof, "nonce_b": two.challenge["nonce_b"]}, AUTH)
    for flow in (one, two, other):
        await flow.complete()


async def test_proof_reflected_server_signature(w: World) -> None:
    """F4: the server's own policy signature sent back as a PROOF."""
    flow = await Flow(w).start()
    await reject(w, "proof", {**flow.proof, "proof_jws": flow.challenge["policy_signature"]}, AUTH)
    await flow.complete()


@pytest.mark.parametrize(
    "change",
    [
        {"type": "accept_policy"},
        {"type": DROP},
        {"extra": 1},
        {"nonce_b": encoding.b64u_encode(bytes(range(1, 32)))},
        {"nonce_b": encoding.b64u_encode(bytes(range(1, 33))) + "="},
        {"proof_jws": "a.b"},
        {"proof_jws": "e30.e30.@@"},
        {"proof_jws": 1},
    ],
    ids=["type", "no-type", "extra", "nonce-31", "nonce-padding", "jws-2-parts", "jws-alphabet", "jws-int"],
)
async def test_proof_params_shape(w: World, change: dict[str, Any]) -> None:
    flow = await Flow(w).start()
    params = dict(flow.proof)
    for k, v in change.items():
        if v is DROP:
            del params[k]
        else:
            params[k] = v
    await reject(w, "proof", params, INVALID)
    await flow.complete()


# -- ACCEPT_POLICY (§5.5) --------------------------------------------------------------------
def _accept_forgeries(flow: Flow, w: World) -> dict[str, str]:
    tok = flow.accept_msg["accept_jws"]
    c, s = w.client_id, w.server_id
    p = payload_of(tok)
    other_hash = Policy.build(allowed=["*"], rate_limit=10**6).hash
    return {
        "typ-proof": resign(tok, c, typ=Typ.PROOF),
        "typ-close": resign(tok, c, typ=Typ.CLOSE),
        "kid-unknown-fragment": resign(tok, c, kid=c.did + "#other"),
        "kid-third": resign(tok, c, kid=THIRD.kid),
        "signer-third": resign(tok, THIRD),
        "bad-signature": flip_signature(tok),
        "header-x5u": resign(tok, c, extra_header={"x5u": "https://evil"}),
        "swapped-dids": resign(tok, c, client_did=s.did, server_did=c.did),
        "policy-hash": resign(
            tok,
            c,
            policy_hash=other_hash,
            session_commitment=m.session_commitment(p["nonce_a"], p["nonce_b"], other_hash),
        ),
        "commitment": resign(tok, c, session_commitment=encoding.hash_of({"c": 1})),
        "nonce-a": resign(tok, c, nonce_a=other_nonce()),
        "nonce-b": resign(tok, c, nonce_b=other_nonce()),
        "extra-member": resign(tok, c, session_id=encoding.b64u_encode(bytes(32))),
        "missing-member": resign(tok, c, session_commitment=DROP),
        "timestamp-string": resign(tok, c, timestamp=str(p["timestamp"])),
    }


ACCEPT_CASES = [
    "typ-proof",
    "typ-close",
    "kid-unknown-fragment",
    "kid-third",
    "signer-third",
    "bad-signature",
    "header-x5u",
    "swapped-dids",
    "policy-hash",
    "commitment",
    "nonce-a",
    "nonce-b",
    "extra-member",
    "missing-member",
    "timestamp-string",
]


@pytest.mark.parametrize("case", ACCEPT_CASES)
async def test_accept_forgery_is_authentication_failure(w: World, case: str) -> None:
    flow = await (await Flow(w).start()).prove()
    forged = _accept_forgeries(flow, w)[case]
    await reject(w, "accept_policy", {**flow.accept_msg, "accept_jws": forged}, AUTH)
    assert w.store.counts() == {"pending": 1, "sessions": 0, "rates": 0, "claims": 0}
    await flow.accept()


async def test_accept_forgery_list_is_complete(w: World) -> None:
    flow = await (await Flow(w).start()).prove()
    assert sorted(_accept_forgeries(flow, w)) == sorted(ACCEPT_CASES)


async def test_accept_proof_token_in_accept_slot(w: World) -> None:
    """A PROOF signature is not an ACCEPT (typ and payload differ)."""
    flow = await (await Flow(w).start()).prove()
    await reject(w, "accept_policy", {**flow.accept_msg, "accept_jws": flow.proof["proof_jws"]}, AUTH)
    await flow.accept()


@pytest.mark.parametrize("delta", [-301, 301])
async def test_accept_stale_or_future_timestamp(w: World, delta: int) -> None:
    flow = await (await Flow(w).start()).prove()
    tok = flow.accept_msg["accept_jws"]
    forged = resign(tok, w.client_id, timestamp=payload_of(tok)["timestamp"] + delta)
    await reject(w, "accept_policy", {**flow.accept_msg, "accept_jws": forged}, STALE)
    await flow.accept()


@pytest.mark.parametrize("delta", [-300, 300])
async def test_accept_timestamp_at_the_boundary_passes(w: World, delta: int) -> None:
    flow = await (await Flow(w).start()).prove()
    tok = flow.accept_msg["accept_jws"]
    flow.accept_msg = {
        **flow.accept_msg,
        "accept_jws": resign(tok, w.client_id, timestamp=int(w.clock()) + delta),
    }
    await flow.accept()


async def test_accept_before_proof(w: World) -> None:
    """F13: a validly signed ACCEPT for a handshake whose PROOF was not verified yet."""
    flow = await Flow(w).start()
    nonce_a, nonce_b, policy_hash = (
        flow.hello["nonce"],
        flow.challenge["nonce_b"],
        flow.challenge["policy_hash"],
    )
    payload = {
        "policy_hash": policy_hash,
        "session_commitment": m.session_commitment(nonce_a, nonce_b, policy_hash),
        "nonce_a": nonce_a,
        "nonce_b": nonce_b,
        "client_did": w.client_id.did,
        "server_did": w.server_id.did,
        "timestamp": int(w.clock()),
    }
    early = {
        "type": "accept_policy",
        "nonce_b": nonce_b,
        "accept_jws": sign_raw(payload, w.client_id, typ=Typ.ACCEPT),
    }
    await reject(w, "accept_policy", early, HS_UNKNOWN)
    await flow.prove()
    # The very same ACCEPT is good once the PROOF is verified.
    r = await w.call("accept_policy", early)
    assert r.error is None
    flow.hs.receive_session(r.result)


async def test_accept_replayed(w: World) -> None:
    flow = await (await Flow(w).start()).prove()
    await flow.accept()
    await reject(w, "accept_policy", flow.accept_msg, HS_UNKNOWN)
    await reject(w, "proof", flow.proof, HS_UNKNOWN)
    assert w.store.counts()["sessions"] == 1


async def test_accept_unknown_nonce_b(w: World) -> None:
    flow = await (await Flow(w).start()).prove()
    await reject(w, "accept_policy", {**flow.accept_msg, "nonce_b": other_nonce()}, HS_UNKNOWN)
    await flow.accept()


async def test_accept_after_pending_expired(w: World) -> None:
    flow = await (await Flow(w).start()).prove()
    w.clock.advance(61)
    reply = await w.call("accept_policy", flow.accept_msg)
    assert reply.error is not None and (reply.error["code"], reply.http_status) == HS_UNKNOWN
    assert w.store.counts() == {"pending": 0, "sessions": 0, "rates": 0, "claims": 0}


async def test_accept_from_another_handshake(w: World) -> None:
    one = await (await Flow(w).start()).prove()
    two = await (await Flow(w).start()).prove()
    await reject(w, "accept_policy", {**one.accept_msg, "nonce_b": two.challenge["nonce_b"]}, AUTH)
    await one.accept()
    await two.accept()


@pytest.mark.parametrize(
    "change",
    [{"type": "proof"}, {"extra": 1}, {"session_id": "abc"}, {"accept_jws": "x.y"}],
    ids=["type", "extra", "session-id-proposal", "jws-2-parts"],
)
async def test_accept_params_shape(w: World, change: dict[str, Any]) -> None:
    flow = await (await Flow(w).start()).prove()
    await reject(w, "accept_policy", {**flow.accept_msg, **change}, INVALID)
    await flow.accept()


async def test_session_capacity_full() -> None:
    w = make_world(limits=ServerLimits(max_sessions=1))
    first = await Flow(w).complete()
    flow = await (await Flow(w, identity("second")).start()).prove()
    reply = await reject(w, "accept_policy", flow.accept_msg, FULL)
    assert reply.retry_after is not None
    assert reply.error["data"] == {"retry_after": reply.retry_after, "pool": "shared"}
    # The open session was not evicted and still serves intents.
    assert (await w.intent(first, x=1)).result["echo"] == {"x": 1}
    # The pending handshake was not consumed: once a session closes, the same ACCEPT works.
    close = first.prepare_close()
    r = await w.call("close", close.params)
    first.verify_closed(close, r.result)
    await flow.accept()


async def test_session_capacity_counts_only_unexpired_sessions() -> None:
    w = make_world(Policy.build(session_timeout=100), limits=ServerLimits(max_sessions=1))
    await Flow(w).complete()
    w.clock.advance(50)
    flow = await Flow(w, identity("second")).start()
    w.clock.advance(50)  # the first session expires exactly now
    await flow.complete()
    assert w.store.counts()["sessions"] == 1


@pytest.mark.parametrize("method", ["hello", "proof", "accept_policy"])
async def test_handshake_params_not_an_object(w: World, method: str) -> None:
    await reject(w, method, ["hello"], INVALID)


async def test_unknown_method(w: World) -> None:
    await expect_error(lambda: w.call("session", {}), -32601, 404, store=w.store)


# -- the client side (§5.2, §5.4, §5.6) --------------------------------------------------------
async def _client_at_challenge(w: World) -> tuple[Any, dict[str, Any]]:
    hs = w.handshake()
    r = await w.call("hello", hs.hello())
    return hs, r.result


def _assert_failed_for_good(hs: Any) -> None:
    assert hs.state is HandshakeState.FAILED
    for call in (
        hs.hello,
        lambda: hs.receive_challenge({}),
        lambda: hs.receive_policy({}),
        lambda: hs.receive_session({}),
    ):
        with pytest.raises(InvalidRequest):
            call()
        assert hs.state is HandshakeState.FAILED


async def test_client_challenge_from_a_different_server_did(w: World) -> None:
    hs = w.handshake(server_did=THIRD.did)  # the client meant to reach THIRD
    r = await w.call("hello", hs.hello())
    assert r.error is None
    with pytest.raises(AuthenticationFailed):
        hs.receive_challenge(r.result)
    _assert_failed_for_good(hs)


def _challenge_tamperings(w: World, c: dict[str, Any]) -> dict[str, tuple[dict[str, Any], type[A2AError]]]:
    sig = c["policy_signature"]
    s = w.server_id
    resigned_payload = payload_of(sig)
    return {
        "policy-hash": ({**c, "policy_hash": Policy.build(rate_limit=5).hash}, AuthenticationFailed),
        "nonce-b": ({**c, "nonce_b": other_nonce()}, AuthenticationFailed),
        "manifest-hash": ({**c, "manifest_hash": encoding.hash_of({"m": 1})}, AuthenticationFailed),
        "timestamp": ({**c, "timestamp": c["timestamp"] + 1}, AuthenticationFailed),
        "server-did": ({**c, "server_did": THIRD.did}, AuthenticationFailed),
        "public-keys-other-did": ({**c, "public_keys": [THIRD.public_key_entry()]}, AuthenticationFailed),
        "signed-by-third": ({**c, "policy_signature": resign(sig, THIRD)}, AuthenticationFailed),
        "wrong-typ": ({**c, "policy_signature": resign(sig, s, typ=Typ.SESSION)}, AuthenticationFailed),
        "swapped-dids": (
            {
                **c,
                "policy_signature": resign(
                    sig,
                    s,
                    client_did=resigned_payload["server_did"],
                    server_did=resigned_payload["client_did"],
                ),
            },
            AuthenticationFailed,
        ),
        "hello-hash": (
            {**c, "policy_signature": resign(sig, s, hello_hash=encoding.hash_of({}))},
            AuthenticationFailed,
        ),
        "bad-signature": ({**c, "policy_signature": flip_signature(sig)}, AuthenticationFailed),
        "type": ({**c, "type": "policy"}, AuthenticationFailed),
        "extra-member": ({**c, "session_id": "x"}, AuthenticationFailed),
        "version": ({**c, "protocol_version": "0.9"}, UnsupportedVersion),
    }


CHALLENGE_CASES = [
    "policy-hash",
    "nonce-b",
    "manifest-hash",
    "timestamp",
    "server-did",
    "public-keys-other-did",
    "signed-by-third",
    "wrong-typ",
    "swapped-dids",
    "hello-hash",
    "bad-signature",
    "type",
    "extra-member",
    "version",
]


@pytest.mark.parametrize("case", CHALLENGE_CASES)
async def test_client_rejects_tampered_challenge(w: World, case: str) -> None:
    hs, challenge = await _client_at_challenge(w)
    tampered, exc = _challenge_tamperings(w, challenge)[case]
    with pytest.raises(exc):
        hs.receive_challenge(tampered)
    _assert_failed_for_good(hs)


async def test_client_challenge_cases_complete(w: World) -> None:
    _, challenge = await _client_at_challenge(w)
    assert sorted(_challenge_tamperings(w, challenge)) == sorted(CHALLENGE_CASES)


@pytest.mark.parametrize("delta", [-301, 301])
async def test_client_rejects_stale_challenge(w: World, delta: int) -> None:
    hs, challenge = await _client_at_challenge(w)
    with w.clock.shifted(delta), pytest.raises(StaleTimestamp):
        hs.receive_challenge(challenge)
    _assert_failed_for_good(hs)


async def test_client_rejects_reflected_proof_as_challenge(w: World) -> None:
    """F4: the client's own PROOF signature reflected back in a CHALLENGE."""
    hs, challenge = await _client_at_challenge(w)
    other = Flow(w)
    await other.start()
    with pytest.raises(AuthenticationFailed):
        hs.receive_challenge({**challenge, "policy_signature": other.proof["proof_jws"]})
    _assert_failed_for_good(hs)


async def _client_at_policy(w: World) -> tuple[Flow, dict[str, Any]]:
    flow = await Flow(w).start()
    r = await w.call("proof", flow.proof)
    return flow, r.result


async def test_client_rejects_policy_not_hashing_to_policy_hash(w: World) -> None:
    flow, msg = await _client_at_policy(w)
    edited = copy.deepcopy(msg)
    edited["policy"]["rate_limit"] += 1
    with pytest.raises(AuthenticationFailed):
        flow.hs.receive_policy(edited)
    _assert_failed_for_good(flow.hs)


async def test_client_rejects_policy_with_matching_but_unsigned_hash(w: World) -> None:
    """F11: a MITM edits the policy and the hash to match; the signed hash differs."""
    flow, msg = await _client_at_policy(w)
    edited = copy.deepcopy(msg)
    edited["policy"]["allowed_intents"] = ["*"]
    edited["policy"]["rate_limit"] = 10**9
    edited["policy_hash"] = encoding.hash_of(edited["policy"])
    with pytest.raises(AuthenticationFailed):
        flow.hs.receive_policy(edited)
    _assert_failed_for_good(flow.hs)


async def test_client_rejects_policy_with_another_signature(w: World) -> None:
    """F12: the POLICY of another handshake (same policy, other nonces) replayed."""
    flow, msg = await _client_at_policy(w)
    _, older = await _client_at_policy(w)
    assert older["policy_hash"] == msg["policy_hash"]
    with pytest.raises(AuthenticationFailed):
        flow.hs.receive_policy({**msg, "policy_signature": older["policy_signature"]})
    _assert_failed_for_good(flow.hs)


@pytest.mark.parametrize(
    "change",
    [{"type": "challenge"}, {"extra": 1}, {"policy": {"rate_limit": 1}}, {"policy": None}],
    ids=["type", "extra", "policy-members", "policy-null"],
)
async def test_client_rejects_malformed_policy(w: World, change: dict[str, Any]) -> None:
    flow, msg = await _client_at_policy(w)
    with pytest.raises(AuthenticationFailed):
        flow.hs.receive_policy({**msg, **change})
    _assert_failed_for_good(flow.hs)


async def test_client_may_refuse_the_offered_policy(w: World) -> None:
    flow, msg = await _client_at_policy(w)
    with pytest.raises(PolicyViolation):
        flow.hs.receive_policy(msg, accept=lambda p: p.rate_limit <= 10)
    _assert_failed_for_good(flow.hs)


async def _client_at_session(w: World) -> tuple[Flow, dict[str, Any]]:
    flow = await (await Flow(w).start()).prove()
    r = await w.call("accept_policy", flow.accept_msg)
    return flow, r.result


def _session_tamperings(
    w: World, flow: Flow, s: dict[str, Any]
) -> dict[str, tuple[dict[str, Any], type[A2AError]]]:
    tok = s["session_jws"]
    srv = w.server_id
    wrong_commitment = encoding.hash_of({"commitment": 1})
    return {
        "commitment-outer": ({**s, "session_commitment": wrong_commitment}, AuthenticationFailed),
        "commitment-signed": (
            {
                **s,
                "session_commitment": wrong_commitment,
                "session_jws": resign(tok, srv, session_commitment=wrong_commitment),
            },
            AuthenticationFailed,
        ),
        "swapped-dids-outer": (
            {**s, "client_did": s["server_did"], "server_did": s["client_did"]},
            AuthenticationFailed,
        ),
        "swapped-dids-signed": (
            {**s, "session_jws": resign(tok, srv, client_did=s["server_did"], server_did=s["client_did"])},
            AuthenticationFailed,
        ),
        "client-did-third": (
            {**s, "client_did": THIRD.did, "session_jws": resign(tok, srv, client_did=THIRD.did)},
            AuthenticationFailed,
        ),
        "signed-by-third": ({**s, "session_jws": resign(tok, THIRD)}, AuthenticationFailed),
        "wrong-typ": ({**s, "session_jws": resign(tok, srv, typ=Typ.POLICY)}, AuthenticationFailed),
        "wrong-kid": ({**s, "session_jws": resign(tok, srv, kid=srv.did + "#k2")}, AuthenticationFailed),
        "bad-signature": ({**s, "session_jws": flip_signature(tok)}, AuthenticationFailed),
        "session-id-outer": ({**s, "session_id": other_nonce()}, AuthenticationFailed),
        "lifetime": (
            {
                **s,
                "expires_at": s["expires_at"] + 1,
                "session_jws": resign(tok, srv, expires_at=s["expires_at"] + 1),
            },
            AuthenticationFailed,
        ),
        "stale-created": (
            {
                **s,
                "created_at": s["created_at"] - 301,
                "expires_at": s["expires_at"] - 301,
                "session_jws": resign(
                    tok, srv, created_at=s["created_at"] - 301, expires_at=s["expires_at"] - 301
                ),
            },
            StaleTimestamp,
        ),
        "public-keys-other-did": ({**s, "public_keys": [THIRD.public_key_entry()]}, AuthenticationFailed),
        "extra-member": ({**s, "token": "x"}, AuthenticationFailed),
        "type": ({**s, "type": "policy"}, AuthenticationFailed),
    }


SESSION_CASES = [
    "commitment-outer",
    "commitment-signed",
    "swapped-dids-outer",
    "swapped-dids-signed",
    "client-did-third",
    "signed-by-third",
    "wrong-typ",
    "wrong-kid",
    "bad-signature",
    "session-id-outer",
    "lifetime",
    "stale-created",
    "public-keys-other-did",
    "extra-member",
    "type",
]


@pytest.mark.parametrize("case", SESSION_CASES)
async def test_client_rejects_tampered_session(w: World, case: str) -> None:
    flow, msg = await _client_at_session(w)
    tampered, exc = _session_tamperings(w, flow, msg)[case]
    with pytest.raises(exc):
        flow.hs.receive_session(tampered)
    _assert_failed_for_good(flow.hs)


async def test_client_session_cases_complete(w: World) -> None:
    flow, msg = await _client_at_session(w)
    assert sorted(_session_tamperings(w, flow, msg)) == sorted(SESSION_CASES)


async def test_client_rejects_session_of_another_handshake(w: World) -> None:
    flow, _ = await _client_at_session(w)
    _, other = await _client_at_session(w)
    with pytest.raises(AuthenticationFailed):
        flow.hs.receive_session(other)
    _assert_failed_for_good(flow.hs)


async def test_client_out_of_order_calls(w: World) -> None:
    hs = w.handshake()
    with pytest.raises(InvalidRequest):
        hs.receive_challenge({})
    _assert_failed_for_good(hs)

    hs = w.handshake()
    hs.hello()
    with pytest.raises(InvalidRequest):
        hs.hello()
    _assert_failed_for_good(hs)

    flow = await Flow(w).start()
    with pytest.raises(InvalidRequest):
        flow.hs.receive_session({})
    _assert_failed_for_good(flow.hs)

    flow = await Flow(w).start()
    with pytest.raises(InvalidRequest):  # a CHALLENGE twice (duplicated message)
        flow.hs.receive_challenge(flow.challenge)
    _assert_failed_for_good(flow.hs)

    flow = Flow(w)
    await flow.complete()
    assert flow.hs.state is HandshakeState.DONE
    with pytest.raises(InvalidRequest):
        flow.hs.receive_session(flow.session_msg)
    assert flow.hs.state is HandshakeState.FAILED


async def test_client_refuses_a_handshake_with_itself(w: World) -> None:
    hs = w.handshake(w.client_id, server_did=w.client_id.did)
    with pytest.raises(AuthenticationFailed):
        hs.hello()
    _assert_failed_for_good(hs)


async def test_client_rejects_garbage_replies(w: World) -> None:
    for garbage in (None, [], "challenge", {"type": "challenge"}):
        hs = w.handshake()
        hs.hello()
        with pytest.raises(A2AError):
            hs.receive_challenge(garbage)
        _assert_failed_for_good(hs)
