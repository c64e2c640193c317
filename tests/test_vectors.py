"""Known-answer tests from the published vectors (ATTACKS.md §J.1, sections A and D).

Each test reads a vector file unchanged and checks the SDK against it: RFC 8032 §7.1,
RFC 8037 Appendix A, Wycheproof (151), ed25519-speccheck (12), did:key and did:web.
"""

from __future__ import annotations

import hashlib
from typing import Any

import base58
import pytest
from conftest import load_vector

from a2a_secure.errors import A2AError, AuthenticationFailed, DIDResolutionError, InvalidParams
from a2a_secure.identity import (
    Identity,
    b64u_decode,
    b64u_encode,
    did_key_from_public_key,
    did_web_to_url,
    jws_verify,
    key_id_for_did_key,
    public_key_from_did_key,
    resolve_did_key,
    verify_signature,
)
from a2a_secure.identity.encoding import jcs

RFC8032 = load_vector("rfc8032_ed25519.json")
RFC8037 = load_vector("rfc8037_jose_ed25519.json")
WYCHEPROOF = load_vector("wycheproof_ed25519_test.json")
SPECCHECK = load_vector("ed25519_speccheck_cases.json")
DID_KEY = load_vector("did_key_ed25519.json")
DID_KEY_SPEC = load_vector("did_key_ed25519_x25519_testvectors.json")
DID_WEB = load_vector("did_web_urls.json")


def _wycheproof_cases() -> list[Any]:
    cases = []
    for group in WYCHEPROOF["testGroups"]:
        pk = bytes.fromhex(group["publicKey"]["pk"])
        for test in group["tests"]:
            cases.append(pytest.param(pk, test, id=f"tc{test['tcId']}"))
    return cases


WYCHEPROOF_CASES = _wycheproof_cases()


# -- RFC 8032 §7.1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("vector", RFC8032["vectors"], ids=lambda v: v["name"])
def test_rfc8032_sign_gives_exact_signature(vector: dict[str, Any]) -> None:
    ident = Identity.from_seed(bytes.fromhex(vector["secret_key_hex"]), "rfc8032")
    message = bytes.fromhex(vector["message_hex"])
    assert ident.public_key.hex() == vector["public_key_hex"]
    assert ident.sign(message).hex() == vector["signature_hex"]


@pytest.mark.parametrize("vector", RFC8032["vectors"], ids=lambda v: v["name"])
def test_rfc8032_signature_verifies_and_tampering_fails(vector: dict[str, Any]) -> None:
    pk = bytes.fromhex(vector["public_key_hex"])
    message = bytes.fromhex(vector["message_hex"])
    sig = bytes.fromhex(vector["signature_hex"])
    assert verify_signature(pk, message, sig) is True
    assert verify_signature(pk, message + b"\x00", sig) is False
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert verify_signature(pk, message, flipped) is False


def test_rfc8032_file_has_the_five_vectors() -> None:
    names = [v["name"] for v in RFC8032["vectors"]]
    assert names == ["TEST 1", "TEST 2", "TEST 3", "TEST 1024", "TEST SHA(abc)"]


def test_signature_with_s_plus_l_is_rejected() -> None:
    # A1: S + L is the same signature for a lax verifier; RFC 8032 §5.1.7 requires S < L.
    vector = RFC8032["vectors"][0]
    order = int(RFC8032["constants"]["L_group_order"])
    sig = bytes.fromhex(vector["signature_hex"])
    s = int.from_bytes(sig[32:], "little") + order
    malleated = sig[:32] + s.to_bytes(32, "little")
    pk = bytes.fromhex(vector["public_key_hex"])
    assert verify_signature(pk, bytes.fromhex(vector["message_hex"]), malleated) is False


# -- RFC 8037 Appendix A -----------------------------------------------------------------------


def test_rfc8037_a1_a2_private_key_gives_public_key() -> None:
    d = b64u_decode(RFC8037["A1_private_jwk"]["d"])
    assert d.hex() == RFC8037["A1_d_hex"]
    ident = Identity.from_seed(d, "rfc8037")
    assert b64u_encode(ident.public_key) == RFC8037["A2_public_jwk"]["x"]
    assert ident.public_key.hex() == RFC8037["A2_x_hex"]


def test_rfc8037_a3_thumbprint_input_is_jcs_of_public_jwk() -> None:
    thumb = RFC8037["A3_thumbprint"]
    assert jcs(RFC8037["A2_public_jwk"]).decode() == thumb["canonical_json_input"]
    digest = hashlib.sha256(thumb["canonical_json_input"].encode()).digest()
    assert digest.hex() == thumb["sha256_hex"]
    assert b64u_encode(digest) == thumb["thumbprint_b64url"]


def test_rfc8037_a4_compact_jws_reproduced_by_raw_signer() -> None:
    a4 = RFC8037["A4_signing"]
    ident = Identity.from_private_key(RFC8037["A1_private_jwk"]["d"], "rfc8037")
    header_b64 = b64u_encode(a4["protected_header_json"].encode())
    payload_b64 = b64u_encode(a4["payload_utf8"].encode())
    assert header_b64 == a4["protected_header_b64url"]
    assert payload_b64 == a4["payload_b64url"]
    signing_input = f"{header_b64}.{payload_b64}"
    assert signing_input == a4["jws_signing_input"]
    signature = ident.sign(signing_input.encode("ascii"))
    assert signature.hex() == a4["signature_hex"]
    assert f"{signing_input}.{b64u_encode(signature)}" == a4["compact_jws"]


def test_rfc8037_a4_signature_verifies_over_signing_input() -> None:
    a4 = RFC8037["A4_signing"]
    pk = b64u_decode(RFC8037["A2_public_jwk"]["x"])
    sig = b64u_decode(a4["signature_b64url"])
    assert verify_signature(pk, a4["jws_signing_input"].encode("ascii"), sig) is True
    assert verify_signature(pk, a4["jws_signing_input"].encode("ascii") + b"x", sig) is False


def test_rfc8037_a5_token_rejected_as_malformed_because_payload_is_not_json() -> None:
    # The A.5 token is validly signed, but its payload is the text "Example of Ed25519
    # signing", not a JSON object: PROTOCOL.md §3 makes that -32602, checked before the header.
    a5 = RFC8037["A5_validation"]
    pk = b64u_decode(a5["public_jwk"]["x"])
    kid = key_id_for_did_key(did_key_from_public_key(pk))
    with pytest.raises(InvalidParams) as info:
        jws_verify(a5["compact_jws"], pk, typ="a2a-request+jws", kid=kid)
    assert info.value.code == -32602


def test_rfc8037_header_without_typ_and_kid_is_rejected() -> None:
    # The A.5 header {"alg":"EdDSA"} over a JSON payload, signed with the RFC key: only the
    # missing typ and kid are wrong, so this is an authentication failure (-32040).
    ident = Identity.from_private_key(RFC8037["A1_private_jwk"]["d"], "rfc8037")
    header = RFC8037["A4_signing"]["protected_header_b64url"]
    payload = b64u_encode(b'{"a":1}')
    sig = ident.sign(f"{header}.{payload}".encode())
    token = f"{header}.{payload}.{b64u_encode(sig)}"
    with pytest.raises(AuthenticationFailed) as info:
        jws_verify(token, ident.public_key, typ="a2a-request+jws", kid=ident.kid)
    assert info.value.code == -32040


def test_rfc9864_alg_ed25519_token_is_rejected() -> None:
    # The derived RFC 9864 token also has a non-JSON payload, so it is malformed (-32602);
    # its signature is good, so the rejection is not the crypto. The alg policy itself is
    # tested with a well-formed token below.
    entry = RFC8037["derived_rfc9864"]
    token = entry["compact_jws"]
    pk = b64u_decode(entry["public_jwk"]["x"])
    header_b64, payload_b64, sig_b64 = token.split(".")
    assert verify_signature(pk, f"{header_b64}.{payload_b64}".encode(), b64u_decode(sig_b64))
    kid = key_id_for_did_key(did_key_from_public_key(pk))
    with pytest.raises(InvalidParams) as info:
        jws_verify(token, pk, typ="a2a-request+jws", kid=kid)
    assert info.value.code == -32602


def test_rfc9864_alg_ed25519_with_full_header_is_rejected_by_policy() -> None:
    ident = Identity.from_private_key(RFC8037["A1_private_jwk"]["d"], "rfc8037")
    header = b64u_encode(f'{{"alg":"Ed25519","typ":"a2a-request+jws","kid":"{ident.kid}"}}'.encode())
    payload = b64u_encode(b'{"a":1}')
    sig = ident.sign(f"{header}.{payload}".encode())
    token = f"{header}.{payload}.{b64u_encode(sig)}"
    with pytest.raises(AuthenticationFailed) as info:
        jws_verify(token, ident.public_key, typ="a2a-request+jws", kid=ident.kid)
    assert info.value.code == -32040


# -- Wycheproof (A7) ---------------------------------------------------------------------------


def test_wycheproof_counts() -> None:
    results = [t["result"] for g in WYCHEPROOF["testGroups"] for t in g["tests"]]
    assert len(results) == WYCHEPROOF["numberOfTests"] == 151
    assert results.count("valid") == 88
    assert results.count("invalid") == 63


@pytest.mark.parametrize(("public_key", "test"), WYCHEPROOF_CASES)
def test_wycheproof(public_key: bytes, test: dict[str, Any]) -> None:
    expected = test["result"] == "valid"
    got = verify_signature(public_key, bytes.fromhex(test["msg"]), bytes.fromhex(test["sig"]))
    assert got is expected, f"tcId {test['tcId']} ({test['comment']}, {test['flags']})"


# -- ed25519-speccheck (A3-A5) ----------------------------------------------------------------


def test_speccheck_strict_pattern() -> None:
    assert len(SPECCHECK["cases"]) == 12
    pattern = "".join(
        "V"
        if verify_signature(
            bytes.fromhex(case["pub_key"]),
            bytes.fromhex(case["message"]),
            bytes.fromhex(case["signature"]),
        )
        else "X"
        for case in SPECCHECK["cases"]
    )
    assert pattern == "XXXVXXXXXXXX"


# -- did:key -----------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", DID_KEY["valid"], ids=lambda v: v["name"])
def test_did_key_valid_round_trip(vector: dict[str, Any]) -> None:
    pk = bytes.fromhex(vector["public_key_hex"])
    did = vector["did"]
    assert public_key_from_did_key(did) == pk
    assert did_key_from_public_key(pk) == did
    assert b64u_encode(pk) == vector["public_key_b64url"]
    assert base58.b58decode(did[len("did:key:z") :]).hex() == vector["multicodec_bytes_hex"]
    kid = key_id_for_did_key(did)
    assert kid == f"{did}#{did[len('did:key:') :]}"
    assert resolve_did_key(did).keys == {kid: pk}
    if "seed_hex" in vector:
        ident = Identity.from_seed(bytes.fromhex(vector["seed_hex"]), "vec")
        assert ident.did == did
        assert ident.kid == kid


def test_did_key_file_has_nine_valid_and_seventeen_invalid() -> None:
    assert len(DID_KEY["valid"]) == 9
    assert len(DID_KEY["invalid"]) == 17


# PROTOCOL.md §9: a string that is not did:<method>:<id> is -32602; a well-formed DID that
# cannot be used (method, multibase, multicodec, length, point) is -32047.
DID_KEY_INVALID_EXPECTED: dict[str, type[A2AError]] = {
    "did:key:zTjsVPtY": DIDResolutionError,
    "notDid:key:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": InvalidParams,
    "did:experimental:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": DIDResolutionError,
    "did:key:-4:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": DIDResolutionError,
    "did:key:6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": DIDResolutionError,
    "did:key:@": InvalidParams,
    (
        "did:key:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b/^bar^/?query=`"
        "#z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b"
    ): InvalidParams,
    "did:key:z6LSfHfAMAopsuBxaBzvp51GXrPf38Az13j2fmwqadbwwrzJ": DIDResolutionError,
    "did:key:zQechYdh4g2MS6AKXZJCiXr3zY7sGAhvoJb38RBEPSWGJ4rR5": DIDResolutionError,
    "did:key:z2DeHkn9yYkNcGW8M2t5P9TwwVBYSMkZ56QMPgZ2tX2vbbb": DIDResolutionError,
    "did:key:z6MkeXATEjyXENzBXBxgC5EHk2JE5aqd7qMGGtDpLUH1e2Sj": DIDResolutionError,
    "did:key:z6MkeTG3bFFSLYVU7VqhgZxqr6YzpaGrQtFMh1uvqGy1vDnP": DIDResolutionError,
    "did:key:z6MkvYDV6cfbwNp6jpaZGAcYpZgdfuK59wb3FKdA8t7sBVka": DIDResolutionError,
    "did:key:z6Mk0OIl7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": DIDResolutionError,
    "did:KEY:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": InvalidParams,
    " did:key:z6MktKwz7Ge1Yxzr4JHavN33wiwa8y81QdcMRLXQsrH9T53b": InvalidParams,
    "did:key:u7QHOJCF5AD3FJEAQEU1Rwj8ahfZ4p5ufH9AZG7jBrw9N9g": DIDResolutionError,
}


def test_did_key_invalid_table_covers_the_file() -> None:
    assert {v["input"] for v in DID_KEY["invalid"]} == set(DID_KEY_INVALID_EXPECTED)


@pytest.mark.parametrize(
    "vector", DID_KEY["invalid"], ids=lambda v: f"{v['input'][:40]}:{v['expected_error'][:30]}"
)
def test_did_key_invalid_rejected_with_code(vector: dict[str, Any]) -> None:
    expected = DID_KEY_INVALID_EXPECTED[vector["input"]]
    with pytest.raises(A2AError) as info:
        public_key_from_did_key(vector["input"])
    assert type(info.value) is expected
    assert info.value.code == expected.code
    assert info.value.code in (-32602, -32047)
    with pytest.raises(expected):
        resolve_did_key(vector["input"])


SPEC_DIDS = [k for k in DID_KEY_SPEC if k != "source"]


def test_did_key_spec_file_has_five_dids() -> None:
    assert len(SPEC_DIDS) == 5


@pytest.mark.parametrize("did", SPEC_DIDS)
def test_did_key_spec_vector_seed_gives_did(did: str) -> None:
    entry = DID_KEY_SPEC[did]
    ident = Identity.from_seed(bytes.fromhex(entry["seed"]), "spec")
    assert ident.did == did
    vm = entry["verificationKeyPair"]
    assert vm["controller"] == did
    assert vm["id"].split("#", 1)[1] == ident.kid.split("#", 1)[1]
    if "publicKeyBase58" in vm:
        assert base58.b58decode(vm["publicKeyBase58"]) == ident.public_key
    else:
        assert b64u_decode(vm["publicKeyJwk"]["x"]) == ident.public_key
    assert public_key_from_did_key(did) == ident.public_key


# -- did:web URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", DID_WEB["vectors"], ids=lambda v: v["did"])
def test_did_web_to_url(vector: dict[str, str]) -> None:
    assert did_web_to_url(vector["did"]) == vector["url"]


DID_WEB_INVALID_EXPECTED: dict[str, type[A2AError]] = {
    "did:web:127.0.0.1": DIDResolutionError,
    "did:web:192.168.1.10%3A8443": DIDResolutionError,
    "did:web:[::1]": InvalidParams,  # '[' and ']' are not DID idchars
    "did:WEB:example.com": InvalidParams,  # method names are lower case
}


def test_did_web_invalid_table_covers_the_file() -> None:
    dids = {v["did"] for v in DID_WEB["invalid_per_spec"] if "did" in v}
    assert dids == set(DID_WEB_INVALID_EXPECTED)


@pytest.mark.parametrize("did", sorted(DID_WEB_INVALID_EXPECTED))
def test_did_web_invalid_per_spec_rejected(did: str) -> None:
    expected = DID_WEB_INVALID_EXPECTED[did]
    with pytest.raises(A2AError) as info:
        did_web_to_url(did)
    assert type(info.value) is expected
    assert info.value.code == expected.code


# The SDK-policy list: those decidable from the DID string alone are refused by the URL rule.
# Loopback and metadata names (localhost, *.localhost, metadata.google.internal) and DNS
# rebinding are the resolver's checks at connect time (it must still allow loopback in its
# explicit development mode), so did_web_to_url maps them to a URL.
DID_WEB_POLICY_SYNTACTIC: dict[str, type[A2AError]] = {
    "did:web:localhost.": DIDResolutionError,
    "did:web:2130706433": DIDResolutionError,
    "did:web:0x7f000001": DIDResolutionError,
    "did:web:169.254.169.254": DIDResolutionError,
    "did:web:example.com%3A0": DIDResolutionError,
    "did:web:example.com%3A99999": DIDResolutionError,
    "did:web:example.com%2Fevil": DIDResolutionError,
    "did:web:example.com%40evil.example": DIDResolutionError,
    "did:web:example.com:..:admin": DIDResolutionError,
    "did:web:example.com::alice": DIDResolutionError,
    "did:web:example.com:user%2F..%2Fadmin": DIDResolutionError,
    "did:web:example.com:user:alice#key-1": InvalidParams,
}
DID_WEB_POLICY_AT_CONNECT = {
    "did:web:localhost",
    "did:web:localhost%3A8080",
    "did:web:foo.localhost",
    "did:web:metadata.google.internal",
    "did:web:rebind.example",
}


def test_did_web_policy_tables_cover_the_file() -> None:
    dids = {v["did"] for v in DID_WEB["sdk_policy_rejects_not_in_spec"]}
    assert dids == set(DID_WEB_POLICY_SYNTACTIC) | DID_WEB_POLICY_AT_CONNECT


@pytest.mark.parametrize("did", sorted(DID_WEB_POLICY_SYNTACTIC))
def test_did_web_policy_rejects_from_the_string(did: str) -> None:
    expected = DID_WEB_POLICY_SYNTACTIC[did]
    with pytest.raises(A2AError) as info:
        did_web_to_url(did)
    assert type(info.value) is expected
    assert info.value.code == expected.code
