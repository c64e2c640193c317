"""Sealed intents, sans-I/O (PROTOCOL.md §12.6): the key schedule, seal and open.

Real X25519, HKDF and ChaCha20-Poly1305 from pyca/cryptography; nothing mocked. Each test
moves, changes or reflects one thing and shows the receiver refuses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from a2a_secure.errors import AuthenticationFailed, InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol import sealed_claims, sealing
from a2a_secure.protocol.sealing import EphemeralKey, Part, SessionKeys, SessionSealer

ROOT = Path(__file__).resolve().parent.parent
SID = encoding.b64u_encode(bytes(range(32)))
OTHER_SID = encoding.b64u_encode(bytes(range(1, 33)))
REQ_HASH = "sha256:" + "ab" * 32
OTHER_HASH = "sha256:" + "cd" * 32


def seeded(label: str) -> Any:
    """A deterministic random source (the core takes randomness as a parameter)."""
    counter = iter(range(1 << 30))

    def random_bytes(n: int) -> bytes:
        out = b""
        while len(out) < n:
            out += hashlib.sha256(f"{label}:{next(counter)}".encode()).digest()
        return out[:n]

    return random_bytes


TRANSCRIPT = {
    "client_did": "did:key:z6MkClient",
    "server_did": "did:key:z6MkServer",
    "nonce_a": "A" * 43,
    "nonce_b": "B" * 43,
    "session_id": SID,
    "session_commitment": "sha256:" + "00" * 32,
}


def agree(**changes: str) -> tuple[SessionKeys, SessionKeys]:
    """Both sides' keys for one exchange; ``changes`` alter the server's transcript only."""
    client, server = EphemeralKey(seeded("c")), EphemeralKey(seeded("s"))
    keys_members = {"client_seal_key": client.public_b64u, "server_seal_key": server.public_b64u}
    client_view = {**TRANSCRIPT, **keys_members}
    server_view = {**client_view, **changes}
    c = sealing.derive_keys(client.exchange(server.public), sealing.transcript(**client_view))
    s = sealing.derive_keys(server.exchange(client.public), sealing.transcript(**server_view))
    return c, s


def pair(session_id: str = SID) -> tuple[SessionSealer, SessionSealer]:
    c, s = agree()
    return SessionSealer(c, session_id), SessionSealer(s, session_id)


def flip(token: str, at: int = 0) -> str:
    raw = bytearray(encoding.b64u_decode(token))
    raw[at] ^= 1
    return encoding.b64u_encode(bytes(raw))


# -- the key schedule -------------------------------------------------------------------------
def test_both_sides_derive_the_same_directional_keys() -> None:
    c, s = agree()
    assert c == s
    assert c.c2s != c.s2c
    assert len(c.to_bytes()) == 64 and SessionKeys.from_bytes(c.to_bytes()) == c


@pytest.mark.parametrize("member", sorted(TRANSCRIPT))
def test_keys_are_bound_to_every_transcript_member(member: str) -> None:
    c, s = agree(**{member: TRANSCRIPT[member] + "x"})
    assert c.c2s != s.c2s and c.s2c != s.s2c


def test_keys_are_bound_to_both_seal_keys() -> None:
    other = EphemeralKey(seeded("mallory")).public_b64u
    for member in ("client_seal_key", "server_seal_key"):
        c, s = agree(**{member: other})
        assert c != s


def test_the_keys_never_show_in_repr() -> None:
    keys, _ = agree()
    assert keys.c2s.hex() not in repr(keys) and "c2s=" not in repr(keys)
    assert "private" in repr(EphemeralKey(seeded("x")))


def test_an_ephemeral_key_is_used_once() -> None:
    eph = EphemeralKey(seeded("once"))
    peer = EphemeralKey(seeded("peer"))
    eph.exchange(peer.public)
    with pytest.raises(AuthenticationFailed, match="already used"):
        eph.exchange(peer.public)


@pytest.mark.parametrize(
    "bad",
    [
        bytes(32),
        (1).to_bytes(32, "little"),
        bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    ],
)
def test_a_low_order_seal_key_is_refused(bad: bytes) -> None:
    # The shared secret would be all zeros: keys anyone could compute.
    with pytest.raises(AuthenticationFailed, match="not a usable X25519 key"):
        EphemeralKey(seeded("lo")).exchange(bad)


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_a_seal_key_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(AuthenticationFailed, match="seal_key"):
        sealing.parse_seal_key(encoding.b64u_encode(b"\x01" * length))


@pytest.mark.parametrize("length", [0, 31, 33])
def test_a_session_key_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        SessionKeys(b"\x01" * length, b"\x02" * 32)
    with pytest.raises(ValueError, match="64 bytes"):
        SessionKeys.from_bytes(b"\x01" * (32 + length))


# -- nonce and associated data ----------------------------------------------------------------
def test_the_nonce_is_sequence_part_index() -> None:
    assert sealing.nonce(1, Part.INPUTS) == bytes.fromhex("000000000000010100000000")
    assert sealing.nonce(2**53 - 1, Part.EVENT, 7) == bytes.fromhex("1fffffffffffff0400000007")
    with pytest.raises(InvalidParams):
        sealing.nonce(0, Part.INPUTS)
    with pytest.raises(InvalidParams):
        sealing.nonce(1, Part.EVENT, 2**32)


def test_the_aad_names_direction_session_sequence_part_index_and_request() -> None:
    assert sealing.aad("s2c", SID, 3, Part.RESULT, 0, REQ_HASH) == (
        f"a2a-secure/sealed/v1|s2c|{SID}|3|result|0|{REQ_HASH}".encode()
    )


def test_the_sealer_s_own_aad_is_aad_for_every_part_and_direction() -> None:
    sealer, _ = pair()
    for part in Part:
        for direction in ("c2s", "s2c"):
            expected = sealing.aad(direction, sealer.session_id, 7, part, 2, "b|x")
            assert sealer._aad(direction, 7, part, 2, "b|x") == expected


# -- seal and open ----------------------------------------------------------------------------------
def test_inputs_results_events_and_error_data_round_trip() -> None:
    client, server = pair()
    inputs = {"text": "the merger closes on Friday", "n": [1, 2.5, None, True]}
    assert server.open_inputs(4, "echo", client.seal_inputs(4, "echo", inputs)) == inputs
    assert client.open_result(4, REQ_HASH, server.seal_result(4, REQ_HASH, {"ok": 1})) == {"ok": 1}
    assert client.open_result(4, REQ_HASH, server.seal_result(4, REQ_HASH, None)) is None
    token = server.seal_event(4, REQ_HASH, 2, False, {"i": 2})
    assert client.open_event(4, REQ_HASH, 2, False, token) == {"i": 2}
    data = server.seal_error_data(4, REQ_HASH, {"detail": "x"})
    assert client.open_error_data(4, REQ_HASH, data) == {"detail": "x"}


def test_the_plaintext_is_not_in_the_ciphertext() -> None:
    client, _ = pair()
    token = client.seal_inputs(1, "echo", {"text": "the merger closes on Friday"})
    assert "merger" not in token and b"merger" not in encoding.b64u_decode(token)


def test_tampered_ciphertext_is_refused() -> None:
    client, server = pair()
    token = client.seal_inputs(1, "echo", {"a": 1})
    for at in (0, 5, len(encoding.b64u_decode(token)) - 1):  # body and tag
        with pytest.raises(AuthenticationFailed, match="does not open"):
            server.open_inputs(1, "echo", flip(token, at))


def test_sealed_inputs_moved_to_another_sequence_are_refused() -> None:
    client, server = pair()
    token = client.seal_inputs(1, "echo", {"a": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        server.open_inputs(2, "echo", token)


def test_sealed_inputs_moved_to_another_goal_are_refused() -> None:
    client, server = pair()
    with pytest.raises(AuthenticationFailed, match="does not open"):
        server.open_inputs(1, "transfer", client.seal_inputs(1, "echo", {"a": 1}))


def test_sealed_inputs_moved_to_another_session_are_refused() -> None:
    client, _ = pair()
    # Another session's keys (new ephemeral keys), and the same keys under another id.
    c2, s2 = EphemeralKey(seeded("c2")), EphemeralKey(seeded("s2"))
    other_keys = sealing.derive_keys(
        s2.exchange(c2.public),
        sealing.transcript(**TRANSCRIPT, client_seal_key=c2.public_b64u, server_seal_key=s2.public_b64u),
    )
    token = client.seal_inputs(1, "echo", {"a": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        SessionSealer(other_keys, SID).open_inputs(1, "echo", token)
    _, same_keys_other_id = pair(OTHER_SID)
    with pytest.raises(AuthenticationFailed, match="does not open"):
        same_keys_other_id.open_inputs(1, "echo", token)


def test_a_message_reflected_to_its_sender_is_refused() -> None:
    client, server = pair()
    # The client's sealed inputs handed back to it as the server's result, and the server's
    # result handed back to it as inputs: other key, other direction in the AAD.
    inputs = client.seal_inputs(1, "echo", {"a": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_result(1, REQ_HASH, inputs)
    result = server.seal_result(1, REQ_HASH, {"a": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        server.open_inputs(1, "echo", result)


def test_a_result_moved_to_another_request_is_refused() -> None:
    client, server = pair()
    token = server.seal_result(1, REQ_HASH, {"a": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_result(1, OTHER_HASH, token)
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_error_data(1, REQ_HASH, token)  # a result is not error data


def test_an_event_moved_to_another_index_or_finality_is_refused() -> None:
    client, server = pair()
    token = server.seal_event(3, REQ_HASH, 1, False, {"i": 1})
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_event(3, REQ_HASH, 2, False, token)
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_event(3, REQ_HASH, 1, True, token)
    with pytest.raises(AuthenticationFailed, match="does not open"):
        client.open_result(3, REQ_HASH, token)


@pytest.mark.parametrize("token", [None, 7, {"x": 1}, "not base64!", "AA=="])
def test_a_sealed_member_that_is_no_ciphertext_is_refused(token: Any) -> None:
    client, _ = pair()
    with pytest.raises(AuthenticationFailed):
        client.open_result(1, REQ_HASH, token)


def test_sealed_inputs_must_be_an_object() -> None:
    client, server = pair()
    with pytest.raises(AuthenticationFailed, match="not an object"):
        server.open_inputs(1, "echo", client._seal(client._c2s, "c2s", 1, Part.INPUTS, 0, "echo", [1]))


# -- the server's hooks ------------------------------------------------------------------------
def _intent(**members: Any) -> Any:
    from a2a_secure.protocol.models import Intent

    return Intent.parse({"goal": "echo", "inputs": {}, **members})


def test_a_sealed_session_takes_only_sealed_intents_and_an_open_one_none() -> None:
    client, server = pair()
    with pytest.raises(InvalidParams, match="this session is sealed"):
        sealing.open_intent_inputs(server, _intent(inputs={"a": 1}), 1)
    with pytest.raises(InvalidParams, match="agreed on no sealing keys"):
        sealing.open_intent_inputs(None, _intent(sealed=client.seal_inputs(1, "echo", {})), 1)
    sealed = client.seal_inputs(1, "echo", {"a": 1})
    assert sealing.open_intent_inputs(server, _intent(sealed=sealed), 1) == ({"a": 1}, None)
    assert sealing.open_intent_inputs(None, _intent(inputs={"a": 1}), 1) == ({"a": 1}, None)


def test_an_intent_id_on_a_sealed_session_brings_its_answer_key() -> None:
    client, server = pair()
    iid, key = "i" * 22, bytes(range(32))
    sealed = client.seal_inputs(3, "echo", {"a": 1})
    sealed_key = client.seal_answer_key(3, "echo", iid, key)
    assert sealing.open_intent_inputs(
        server, _intent(sealed=sealed, intent_id=iid, sealed_key=sealed_key), 3
    ) == (
        {"a": 1},
        key,
    )
    with pytest.raises(InvalidParams, match="sealed_key exactly when it has an intent_id"):
        sealing.open_intent_inputs(server, _intent(sealed=sealed, intent_id=iid), 3)
    with pytest.raises(InvalidParams, match="sealed_key exactly when it has an intent_id"):
        sealing.open_intent_inputs(server, _intent(sealed=sealed, sealed_key=sealed_key), 3)
    # The key is bound to its sequence, goal and intent_id like any sealed value.
    for seq, goal, other_id in ((4, "echo", iid), (3, "book", iid), (3, "echo", "j" * 22)):
        with pytest.raises(AuthenticationFailed, match="does not open"):
            server.open_answer_key(seq, goal, other_id, sealed_key)
    with pytest.raises(InvalidParams, match="needs sealed inputs"):
        _intent(sealed_key=sealed_key)


def test_the_answer_key_is_stable_per_intent_and_secret_per_client() -> None:
    seed = bytes(32)
    mine, other = (
        Identity.from_seed(seed, "a").derive_key,
        Identity.from_seed(bytes([1]) * 32, "b").derive_key,
    )
    k = sealed_claims.derive_answer_key(mine, "did:key:zS", "i" * 22)
    assert k == sealed_claims.derive_answer_key(mine, "did:key:zS", "i" * 22) and len(k) == 32
    assert k != sealed_claims.derive_answer_key(other, "did:key:zS", "i" * 22)
    assert k != sealed_claims.derive_answer_key(mine, "did:key:zT", "i" * 22)
    assert k != sealed_claims.derive_answer_key(mine, "did:key:zS", "j" * 22)
    # A key file's holder derives as before holders existed: HKDF-SHA256 of the seed, so a
    # client that restarts on a new version still brings the answer key its first send did.
    info = b"a2a-secure/sealed/v1 answer key|did:key:zS|" + b"i" * 22
    assert k == HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(seed)


def test_a_claim_hashes_the_inputs_under_the_answer_key() -> None:
    key = bytes(range(32))
    intent = {"goal": "echo", "inputs": {}, "sealed": "AAAA", "sealed_key": "BBBB", "intent_id": "i" * 22}
    claimed = sealed_claims.claim_intent(intent, {"room": 4}, key)
    assert set(claimed) == {"goal", "inputs", "intent_id"} and claimed["inputs"].startswith("hmac-sha256:")
    assert "room" not in encoding.dumps(claimed).decode()
    # Another session's ciphertext of the same intent claims the same; other inputs do not.
    assert sealed_claims.claim_intent({**intent, "sealed": "CCCC"}, {"room": 4}, key) == claimed
    assert sealed_claims.claim_intent(intent, {"room": 5}, key) != claimed
    assert sealed_claims.claim_intent(intent, {"room": 4}, bytes(32)) != claimed


def test_a_kept_answer_moves_from_one_session_to_another_only_through_the_answer_key() -> None:
    from a2a_secure.store.base import StoredReply

    first_client, first_server = pair()
    second_client, second_server = pair(OTHER_SID)
    box = sealed_claims.ClaimBox(bytes(range(32)), "i" * 22, seeded("box"))
    answer = StoredReply(200, result=first_server.seal_result(2, REQ_HASH, {"ok": "the room"}), signed_at=5)
    kept = sealed_claims.to_claim(answer, first_server, 2, REQ_HASH, box)
    assert "the room" not in encoding.dumps(kept.to_dict()).decode()
    again = sealed_claims.from_claim(kept, 7, OTHER_HASH, box, second_server)
    assert second_client.open_result(7, OTHER_HASH, again.result) == {"ok": "the room"}
    with pytest.raises(AuthenticationFailed, match="answer key"):
        sealed_claims.from_claim(
            kept, 7, OTHER_HASH, sealed_claims.ClaimBox(bytes(32), "i" * 22, seeded("box")), second_server
        )
    with pytest.raises(AuthenticationFailed, match="answer key"):
        sealed_claims.from_claim(
            kept,
            7,
            OTHER_HASH,
            sealed_claims.ClaimBox(bytes(range(32)), "j" * 22, seeded("box")),
            second_server,
        )
    events = (
        {
            "status": "success",
            "sequence": 2,
            "index": 0,
            "final": False,
            "result": first_server.seal_event(2, REQ_HASH, 0, False, {"i": 0}),
        },
        {"status": "success", "sequence": 2, "index": 1, "final": True, "result": None},
    )
    kept = sealed_claims.to_claim(StoredReply(200, events=events), first_server, 2, REQ_HASH, box)
    again = sealed_claims.from_claim(kept, 7, OTHER_HASH, box, second_server)
    assert again.events is not None and again.events[1]["result"] is None
    assert second_client.open_event(7, OTHER_HASH, 0, False, again.events[0]["result"]) == {"i": 0}
    assert first_client is not second_client


def test_a_claim_box_never_seals_twice_under_one_key_and_nonce() -> None:
    # One intent_id, one answer key, run again after its claim lapsed: a fresh box each run
    # (as the server builds one per request, from its random source).
    key, iid = bytes(range(32)), "i" * 22
    first = sealed_claims.ClaimBox(key, iid, seeded("run")).seal(Part.RESULT, 0, True, {"run": 1})
    second = sealed_claims.ClaimBox(key, iid, seeded("run2")).seal(Part.RESULT, 0, True, {"run": 2})
    again = sealed_claims.ClaimBox(key, iid, seeded("run3"))
    third = [again.seal(Part.RESULT, 0, True, {"run": 3}) for _ in range(2)]
    nonces = [encoding.b64u_decode(t.removeprefix("2."))[:12] for t in (first, second, *third)]
    assert all(t.startswith("2.") for t in (first, second, *third))
    assert len(set(nonces)) == 4  # one box draws a new nonce per seal too
    opener = sealed_claims.ClaimBox(key, iid, seeded("other"))
    assert opener.open(Part.RESULT, 0, True, first) == {"run": 1}
    assert opener.open(Part.RESULT, 0, True, second) == {"run": 2}
    # Moved to another place, or cut short: it does not open.
    with pytest.raises(AuthenticationFailed):
        opener.open(Part.EVENT, 0, True, first)
    for cut in ("2.", "2." + first[2:12]):
        with pytest.raises(AuthenticationFailed):
            opener.open(Part.RESULT, 0, True, cut)


def test_a_claim_kept_with_the_fixed_nonce_still_opens() -> None:
    # An answer kept before nonces were drawn: nonce(1, part, index), no head.
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    key, iid = bytes(range(32)), "i" * 22
    where = f"{sealing.LABEL}|claim|{iid}|event|3|partial".encode()
    old = ChaCha20Poly1305(key).encrypt(sealing.nonce(1, Part.EVENT, 3), b'{"i":3}', where)
    box = sealed_claims.ClaimBox(key, iid, seeded("box"))
    assert box.open(Part.EVENT, 3, False, encoding.b64u_encode(old)) == {"i": 3}
    with pytest.raises(AuthenticationFailed):
        box.open(Part.EVENT, 3, True, encoding.b64u_encode(old))


def test_error_data_is_sealed_but_retry_after_stays_readable() -> None:
    client, server = pair()
    raised = PolicyViolation("no", data={"detail": "the account number", "retry_after": 3})
    exc = sealing.seal_error_data(server, raised, 2, REQ_HASH)
    assert exc.data is not None and exc.data["retry_after"] == 3
    assert "account" not in encoding.dumps(exc.data).decode()
    assert client.open_error_data(2, REQ_HASH, exc.data["sealed"]) == {"detail": "the account number"}
    assert raised.data == {"detail": "the account number", "retry_after": 3}  # a copy was sealed
    assert type(exc) is PolicyViolation and exc.code == raised.code and exc.message == raised.message
    plain = PolicyViolation("no", data={"retry_after": 3})
    assert sealing.seal_error_data(server, plain, 2, REQ_HASH) is plain


# -- the documented vector (docs/PROTOCOL.md §12.6), checked with the primitives alone ------------
def test_the_documented_key_schedule_reproduces_with_the_primitives_alone() -> None:
    import json

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from a2a_secure.identity.jws import jws_decode_unverified

    spec = importlib.util.spec_from_file_location(
        "protocol_examples", ROOT / "scripts" / "protocol_examples.py"
    )
    assert spec is not None and spec.loader is not None
    pe = sys.modules.setdefault("protocol_examples", importlib.util.module_from_spec(spec))
    if not hasattr(pe, "examples_in"):
        spec.loader.exec_module(pe)
    doc = pe.examples_in((ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8"))

    def value(name: str) -> Any:
        return json.loads(doc[name][2])

    v = value("sealed-key-schedule")
    accept, session = value("sealed-accept-payload"), value("sealed-session-payload")
    client = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["client_seal_private"]))
    server = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["server_seal_private"]))
    assert encoding.b64u_encode(client.public_key().public_bytes_raw()) == accept["seal_key"]
    assert encoding.b64u_encode(server.public_key().public_bytes_raw()) == session["seal_key"]
    shared = client.exchange(X25519PublicKey.from_public_bytes(server.public_key().public_bytes_raw()))
    assert shared.hex() == v["shared_secret"]
    transcript = json.loads(v["transcript"])
    assert transcript == {
        "label": "a2a-secure/sealed/v1",
        "client_did": accept["client_did"],
        "server_did": accept["server_did"],
        "nonce_a": accept["nonce_a"],
        "nonce_b": accept["nonce_b"],
        "session_id": session["session_id"],
        "session_commitment": session["session_commitment"],
        "client_seal_key": accept["seal_key"],
        "server_seal_key": session["seal_key"],
    }
    assert encoding.jcs(transcript).decode() == v["transcript"]
    salt = hashlib.sha256(v["transcript"].encode()).digest()
    assert salt.hex() == v["salt"]
    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=v["info"].encode()).derive(shared)
    assert okm[:32].hex() == v["c2s_key"] and okm[32:].hex() == v["s2c_key"]

    request = value("sealed-intent-request")["params"]
    sealed = ChaCha20Poly1305(okm[:32]).encrypt(
        bytes.fromhex(v["inputs_nonce"]), v["inputs_plaintext"].encode(), v["inputs_aad"].encode()
    )
    assert encoding.b64u_encode(sealed) == request["intent"]["sealed"]
    # The signed request carries the sealed inputs' digest (SHA-256 of the base64url text,
    # hashlib alone), in the payload the document shows; the result opens with the other key.
    digest = "sha256:" + hashlib.sha256(request["intent"]["sealed"].encode()).hexdigest()
    signed = jws_decode_unverified(request["request_jws"])[1]
    assert signed == value("sealed-request-payload")
    assert signed["intent"] == {**request["intent"], "sealed": digest}
    result = value("sealed-intent-result")["result"]["result"]
    signed = jws_decode_unverified(value("sealed-intent-result")["result"]["response_jws"])[1]
    assert signed == value("sealed-response-payload")
    assert signed["result"] == "sha256:" + hashlib.sha256(result.encode()).hexdigest()
    opened = ChaCha20Poly1305(okm[32:]).decrypt(
        bytes.fromhex(v["result_nonce"]), encoding.b64u_decode(result), v["result_aad"].encode()
    )
    assert json.loads(opened) == json.loads(v["inputs_plaintext"])  # the test agent's echo
    assert v["result_aad"].endswith("|" + value("sealed-response-payload")["request_hash"])


def test_a_damaged_key_record_is_an_internal_error_not_a_crash() -> None:
    from dataclasses import dataclass as _dc

    from a2a_secure.errors import InternalError

    @_dc
    class Record:
        seal_keys: bytes
        session_id: str = SID
        sealer: Any = None

    with pytest.raises(InternalError, match="sealing keys are unusable"):
        sealing.record_sealer(Record(b"\x01" * 63))
    assert sealing.record_sealer(Record(b"")) is None
    good = Record(b"\x01" * 64)
    first = sealing.record_sealer(good)
    assert first is not None and sealing.record_sealer(good) is first  # kept on the record
