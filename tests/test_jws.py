"""Strict compact JWS (PROTOCOL.md §3; ATTACKS.md B, C1-C4).

Interop with joserfc in both directions, then one test per rejection. Crafted tokens are
built by hand (base64url of raw JSON bytes, signed with the real key over the signing
input), so the signature is valid and only the one thing under test is wrong.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest
from joserfc import jws as jose_jws
from joserfc.jwk import OKPKey

from a2a_secure.errors import A2AError, AuthenticationFailed, InvalidParams
from a2a_secure.identity import Identity, b64u_encode, jws_sign, jws_verify
from a2a_secure.identity import jws as jws_module
from a2a_secure.identity.jws import jws_decode_unverified

TYP = "a2a-request+jws"
PAYLOAD: dict[str, Any] = {"session_id": "abc", "sequence": 1, "intent": {"goal": "echo"}}

# joserfc warns that "EdDSA" is deprecated by RFC 9864; that is its policy, not a failure.
joserfc_quiet = pytest.mark.filterwarnings("ignore::joserfc.errors.SecurityWarning")


@pytest.fixture(scope="module")
def ident() -> Identity:
    return Identity.from_seed(bytes(range(32)), "signer")


@pytest.fixture(scope="module")
def other() -> Identity:
    return Identity.from_seed(bytes(range(1, 33)), "other")


def _raw(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def header_bytes(ident: Identity, **overrides: Any) -> bytes:
    """The raw header JSON, {alg, typ, kid} with ``overrides`` (None removes a member)."""
    header: dict[str, Any] = {"alg": "EdDSA", "typ": TYP, "kid": ident.kid}
    for name, value in overrides.items():
        if value is None:
            header.pop(name, None)
        else:
            header[name] = value
    return _raw(header)


def craft(
    header: bytes,
    payload: bytes,
    signer: Identity,
    *,
    signature: bytes | None = None,
) -> str:
    """A compact token from raw header and payload bytes, validly signed by ``signer``."""
    signing_input = f"{b64u_encode(header)}.{b64u_encode(payload)}"
    if signature is None:
        signature = signer.sign(signing_input.encode("ascii"))
    return f"{signing_input}.{b64u_encode(signature)}"


def good_token(ident: Identity) -> str:
    return craft(header_bytes(ident), _raw(PAYLOAD), ident)


def verify(token: str, ident: Identity, **kw: Any) -> dict[str, Any]:
    return jws_verify(
        token, kw.get("public_key", ident.public_key), typ=kw.get("typ", TYP), kid=kw.get("kid", ident.kid)
    )


def expect(exc: type[A2AError], code: int, token: str, ident: Identity, **kw: Any) -> None:
    with pytest.raises(A2AError) as info:
        verify(token, ident, **kw)
    assert type(info.value) is exc, repr(info.value)
    assert info.value.code == code


# -- positive control and interop ------------------------------------------------------------


def test_crafted_control_token_verifies(ident: Identity) -> None:
    # Every rejection below differs from this token in exactly one way.
    assert verify(good_token(ident), ident) == PAYLOAD


def test_sign_then_verify_round_trip(ident: Identity) -> None:
    token = jws_sign(PAYLOAD, ident, TYP)
    assert verify(token, ident) == PAYLOAD


def test_sign_uses_exact_header(ident: Identity) -> None:
    token = jws_sign(PAYLOAD, ident, TYP)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "EdDSA", "typ": TYP, "kid": ident.kid}


@joserfc_quiet
def test_jws_sign_verifies_with_joserfc(ident: Identity) -> None:
    token = jws_sign(PAYLOAD, ident, TYP)
    key = OKPKey.import_key({"kty": "OKP", "crv": "Ed25519", "x": b64u_encode(ident.public_key)})
    obj = jose_jws.deserialize_compact(token, key, algorithms=["EdDSA"])
    assert json.loads(obj.payload) == PAYLOAD
    assert obj.protected == {"alg": "EdDSA", "typ": TYP, "kid": ident.kid}


@joserfc_quiet
def test_joserfc_token_verifies_with_jws_verify(ident: Identity) -> None:
    private = OKPKey.import_key(
        {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": b64u_encode(ident.public_key),
            "d": ident.private_key_b64u(),
        }
    )
    token = jose_jws.serialize_compact(
        {"alg": "EdDSA", "typ": TYP, "kid": ident.kid}, _raw(PAYLOAD), private, algorithms=["EdDSA"]
    )
    assert verify(token, ident) == PAYLOAD


# -- alg (B1-B5) -------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_with_empty_signature(ident: Identity, alg: str) -> None:
    header = b64u_encode(header_bytes(ident, alg=alg))
    token = f"{header}.{b64u_encode(_raw(PAYLOAD))}."
    expect(AuthenticationFailed, -32040, token, ident)


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_with_valid_ed25519_signature(ident: Identity, alg: str) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, alg=alg), _raw(PAYLOAD), ident), ident)


@pytest.mark.parametrize("secret_kind", ["raw", "b64u", "jwk"])
def test_alg_hs256_with_public_key_as_hmac_secret(ident: Identity, secret_kind: str) -> None:
    secret = {
        "raw": ident.public_key,
        "b64u": b64u_encode(ident.public_key).encode(),
        "jwk": _raw({"kty": "OKP", "crv": "Ed25519", "x": b64u_encode(ident.public_key)}),
    }[secret_kind]
    signing_input = f"{b64u_encode(header_bytes(ident, alg='HS256'))}.{b64u_encode(_raw(PAYLOAD))}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{b64u_encode(mac)}"
    expect(AuthenticationFailed, -32040, token, ident)


def test_alg_missing(ident: Identity) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, alg=None), _raw(PAYLOAD), ident), ident)


@pytest.mark.parametrize("alg", ["ES256", "RS256"])
def test_alg_of_another_family(ident: Identity, alg: str) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, alg=alg), _raw(PAYLOAD), ident), ident)


def test_alg_ed25519_rfc9864_not_adopted(ident: Identity) -> None:
    token = craft(header_bytes(ident, alg="Ed25519"), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


@pytest.mark.parametrize("alg", ["eddsa", "EdDSA ", ["EdDSA"], 1])
def test_alg_near_misses(ident: Identity, alg: Any) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, alg=alg), _raw(PAYLOAD), ident), ident)


# -- header members (B6-B12) ---------------------------------------------------------------------


@pytest.mark.parametrize("crit", [["urn:example:unknown"], [], ["alg"], ["exp"]])
def test_crit_is_rejected(ident: Identity, crit: list[str]) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, crit=crit), _raw(PAYLOAD), ident), ident)


def test_embedded_jwk_with_attacker_key(ident: Identity, other: Identity) -> None:
    # The attacker claims the victim's kid, embeds their own key and signs with it.
    attacker_jwk = {"kty": "OKP", "crv": "Ed25519", "x": b64u_encode(other.public_key)}
    token = craft(header_bytes(ident, jwk=attacker_jwk), _raw(PAYLOAD), other)
    expect(AuthenticationFailed, -32040, token, ident)
    # Even with the attacker's own key as the resolved key, the header member alone fails it.
    expect(AuthenticationFailed, -32040, token, ident, public_key=other.public_key)


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("jku", "http://169.254.169.254/keys.json"),
        ("jku", "http://127.0.0.1/jwks"),
        ("x5u", "https://127.0.0.1/cert.pem"),
        ("x5c", ["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]),
    ],
)
def test_key_location_headers_are_rejected(ident: Identity, member: str, value: Any) -> None:
    token = craft(header_bytes(ident, **{member: value}), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


def test_b64_false_with_encoded_payload(ident: Identity) -> None:
    # Structurally a normal token, but the header asks for RFC 7797: an extra member.
    token = craft(header_bytes(ident, b64=False, crit=["b64"]), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


def test_b64_false_with_unencoded_payload(ident: Identity) -> None:
    # The real RFC 7797 form: the payload is raw JSON, which is not base64url (-32602).
    header = b64u_encode(header_bytes(ident, b64=False, crit=["b64"]))
    raw_payload = '{"a":1}'
    sig = ident.sign(f"{header}.{raw_payload}".encode())
    token = f"{header}.{raw_payload}.{b64u_encode(sig)}"
    expect(InvalidParams, -32602, token, ident)


@pytest.mark.parametrize(("member", "value"), [("x", 1), ("cty", "json"), ("iat", 1763700000)])
def test_extra_header_member(ident: Identity, member: str, value: Any) -> None:
    token = craft(header_bytes(ident, **{member: value}), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


@pytest.mark.parametrize("order", ["first_good", "last_good"])
def test_duplicate_header_member(ident: Identity, order: str) -> None:
    # Not I-JSON, so -32602. "last_good" is the dangerous one: json.loads keeps the last.
    first, last = ("EdDSA", "none") if order == "first_good" else ("none", "EdDSA")
    header = f'{{"alg":"{first}","typ":"{TYP}","kid":"{ident.kid}","alg":"{last}"}}'.encode()
    expect(InvalidParams, -32602, craft(header, _raw(PAYLOAD), ident), ident)


def test_wrong_typ(ident: Identity) -> None:
    # B13: a PROOF token presented where an intent request is expected.
    token = craft(header_bytes(ident, typ="a2a-proof+jws"), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)
    assert verify(token, ident, typ="a2a-proof+jws") == PAYLOAD


def test_wrong_kid_fragment(ident: Identity) -> None:
    token = craft(header_bytes(ident, kid=ident.did + "#key-2"), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


def test_kid_of_another_did(ident: Identity, other: Identity) -> None:
    token = craft(header_bytes(ident, kid=other.kid), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, token, ident)


@pytest.mark.parametrize(
    "kid", ["../../etc/passwd", "' OR 1=1 --", "did:web:169.254.169.254#k", "did:key:z6Mk"]
)
def test_hostile_kid(ident: Identity, kid: str) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident, kid=kid), _raw(PAYLOAD), ident), ident)


@pytest.mark.parametrize("header", [b'["EdDSA"]', b'"EdDSA"', b"1", b"null", b"true"])
def test_header_not_an_object(ident: Identity, header: bytes) -> None:
    expect(InvalidParams, -32602, craft(header, _raw(PAYLOAD), ident), ident)


def test_header_invalid_utf8(ident: Identity) -> None:
    header = b'{"alg":"EdDSA","typ":"' + TYP.encode() + b'\xff","kid":"' + ident.kid.encode() + b'"}'
    expect(InvalidParams, -32602, craft(header, _raw(PAYLOAD), ident), ident)


def test_header_reserialised_with_whitespace_keeps_old_signature(ident: Identity) -> None:
    # B15: the signature covers the exact received bytes; re-encoding must not rescue it.
    token = good_token(ident)
    sig_b64 = token.split(".")[2]
    spaced = json.dumps({"alg": "EdDSA", "typ": TYP, "kid": ident.kid}, separators=(", ", ": "))
    forged = f"{b64u_encode(spaced.encode())}.{token.split('.')[1]}.{sig_b64}"
    expect(AuthenticationFailed, -32040, forged, ident)


def test_header_member_order_is_free_when_signed(ident: Identity) -> None:
    # The check is on the member set, not on one serialisation of it.
    header = _raw({"kid": ident.kid, "typ": TYP, "alg": "EdDSA"})
    assert verify(craft(header, _raw(PAYLOAD), ident), ident) == PAYLOAD


# -- segments and base64url (B16, C1, C2) ----------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 4, 5])
def test_wrong_segment_count(ident: Identity, count: int) -> None:
    parts = good_token(ident).split(".")
    parts = (parts * 2)[:count]
    expect(InvalidParams, -32602, ".".join(parts), ident)


def test_empty_signature_segment(ident: Identity) -> None:
    # "" is canonical base64url of zero bytes, so the token is well formed (§3) and the
    # failure is the signature's: -32040.
    h, p, _ = good_token(ident).split(".")
    expect(AuthenticationFailed, -32040, f"{h}.{p}.", ident)


@pytest.mark.parametrize("segment", [0, 1, 2])
def test_empty_header_or_payload_segment(ident: Identity, segment: int) -> None:
    parts = good_token(ident).split(".")
    parts[segment] = ""
    exc = AuthenticationFailed if segment == 2 else InvalidParams
    expect(exc, exc.code, ".".join(parts), ident)


@pytest.mark.parametrize("segment", [0, 1, 2])
def test_padding_is_rejected(ident: Identity, segment: int) -> None:
    parts = good_token(ident).split(".")
    parts[segment] += "=" * (-len(parts[segment]) % 4 or 4)
    expect(InvalidParams, -32602, ".".join(parts), ident)


@pytest.mark.parametrize("char", ["+", "/", "=", " ", "\n", "\t", "!", "\u00e9"])
@pytest.mark.parametrize("segment", [0, 1, 2])
def test_non_alphabet_character(ident: Identity, char: str, segment: int) -> None:
    parts = good_token(ident).split(".")
    mid = len(parts[segment]) // 2
    parts[segment] = parts[segment][:mid] + char + parts[segment][mid:]
    expect(InvalidParams, -32602, ".".join(parts), ident)


def test_standard_base64_alphabet_signature(ident: Identity) -> None:
    # Same bytes written with '+' and '/': Python's decoder would accept both spellings.
    for n in range(200):
        token = craft(header_bytes(ident), _raw({**PAYLOAD, "n": n}), ident)
        h, p, s = token.split(".")
        if "-" in s or "_" in s:
            break
    else:  # pragma: no cover - 200 signatures without '-' or '_' is ~1e-235
        pytest.fail("no signature with '-' or '_'")
    std = s.replace("-", "+").replace("_", "/")
    expect(InvalidParams, -32602, f"{h}.{p}.{std}", ident)


def _alias_with_trailing_bits(segment: str) -> str:
    # The last character carries unused low bits; set one: same bytes, different text.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    idx = alphabet.index(segment[-1])
    unused = {2: 0b1111, 3: 0b11}[len(segment) % 4]
    assert idx & unused == 0
    alias = segment[:-1] + alphabet[idx | 1]
    assert base64.urlsafe_b64decode(alias + "==") == base64.urlsafe_b64decode(segment + "==")
    return alias


def test_non_canonical_trailing_bits_in_signature(ident: Identity) -> None:
    h, p, s = good_token(ident).split(".")
    assert len(s) == 86
    expect(InvalidParams, -32602, f"{h}.{p}.{_alias_with_trailing_bits(s)}", ident)


def test_non_canonical_trailing_bits_in_header(ident: Identity) -> None:
    for n in range(4):
        typ = TYP + "x" * n
        token = craft(header_bytes(ident, typ=typ), _raw(PAYLOAD), ident)
        if len(token.split(".")[0]) % 4:
            break
    h, p, s = token.split(".")
    assert verify(token, ident, typ=typ) == PAYLOAD
    expect(InvalidParams, -32602, f"{_alias_with_trailing_bits(h)}.{p}.{s}", ident, typ=typ)


def test_non_canonical_trailing_bits_in_payload(ident: Identity) -> None:
    for n in range(4):
        token = craft(header_bytes(ident), _raw({**PAYLOAD, "pad": "x" * n}), ident)
        if len(token.split(".")[1]) % 4:
            break
    h, p, s = token.split(".")
    expect(InvalidParams, -32602, f"{h}.{_alias_with_trailing_bits(p)}.{s}", ident)


@pytest.mark.parametrize("length", [0, 32, 63, 65, 128])
def test_wrong_signature_length(ident: Identity, length: int) -> None:
    token = good_token(ident)
    h, p, s = token.split(".")
    sig = base64.urlsafe_b64decode(s + "==")
    bad = (sig + b"\x00" * 64)[:length]
    expect(AuthenticationFailed, -32040, f"{h}.{p}.{b64u_encode(bad)}", ident)


def test_signature_with_trailing_garbage(ident: Identity) -> None:
    h, p, s = good_token(ident).split(".")
    sig = base64.urlsafe_b64decode(s + "==")
    expect(AuthenticationFailed, -32040, f"{h}.{p}.{b64u_encode(sig + b'garbage')}", ident)


def test_token_not_a_string(ident: Identity) -> None:
    for value in (None, b"a.b.c", 1, ["a", "b", "c"]):
        with pytest.raises(InvalidParams) as info:
            jws_verify(value, ident.public_key, typ=TYP, kid=ident.kid)  # type: ignore[arg-type]
        assert info.value.code == -32602


def test_token_too_long(ident: Identity) -> None:
    h, _, s = good_token(ident).split(".")
    token = f"{h}.{'A' * 1_500_000}.{s}"
    expect(InvalidParams, -32602, token, ident)


# -- payload (B17, C3, C4) ----------------------------------------------------------------------


def test_payload_changed_signature_kept(ident: Identity) -> None:
    h, _, s = good_token(ident).split(".")
    changed = b64u_encode(_raw({**PAYLOAD, "sequence": 2}))
    expect(AuthenticationFailed, -32040, f"{h}.{changed}.{s}", ident)


def test_signature_from_another_key(ident: Identity, other: Identity) -> None:
    expect(AuthenticationFailed, -32040, craft(header_bytes(ident), _raw(PAYLOAD), other), ident)


def test_right_token_wrong_resolved_key(ident: Identity, other: Identity) -> None:
    expect(AuthenticationFailed, -32040, good_token(ident), ident, public_key=other.public_key)


def test_duplicate_payload_member(ident: Identity) -> None:
    payload = b'{"session_id":"abc","sequence":1,"sequence":2}'
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


@pytest.mark.parametrize(
    "number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9007199254740992", b"1" * 5000]
)
def test_payload_non_finite_or_out_of_range_number(ident: Identity, number: bytes) -> None:
    payload = b'{"session_id":"abc","timestamp":' + number + b"}"
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


@pytest.mark.parametrize("payload", [b"[1,2]", b'"text"', b"1", b"null", b"Example of Ed25519 signing"])
def test_payload_not_an_object(ident: Identity, payload: bytes) -> None:
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


def test_payload_lone_surrogate(ident: Identity) -> None:
    payload = b'{"text":"\\ud800"}'
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


def test_payload_with_bom(ident: Identity) -> None:
    payload = b"\xef\xbb\xbf" + _raw(PAYLOAD)
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


def test_payload_too_deep(ident: Identity) -> None:
    payload = b'{"a":' * 40 + b"1" + b"}" * 40
    expect(InvalidParams, -32602, craft(header_bytes(ident), payload, ident), ident)


# -- the decoded-header cache -----------------------------------------------------------------------


def test_cached_header_decode_is_a_copy(ident: Identity) -> None:
    token = good_token(ident)
    first = jws_decode_unverified(token)[0]
    first["alg"] = "none"
    first["jwk"] = {"kty": "OKP"}
    again = jws_decode_unverified(token)[0]
    assert again == {"alg": "EdDSA", "typ": TYP, "kid": ident.kid}
    assert verify(token, ident) == PAYLOAD


def test_a_bad_header_is_refused_every_time_it_comes(ident: Identity) -> None:
    # The cache holds decodes, never verdicts: the same hostile header fails on each use.
    token = craft(header_bytes(ident, alg="none"), _raw(PAYLOAD), ident)
    for _ in range(3):
        expect(AuthenticationFailed, -32040, token, ident)
    duplicate = b'{"alg":"EdDSA","typ":"%s","kid":"%s","kid":"%s"}' % (
        TYP.encode(),
        ident.kid.encode(),
        ident.kid.encode(),
    )
    for _ in range(3):
        expect(InvalidParams, -32602, craft(duplicate, _raw(PAYLOAD), ident), ident)


def test_header_cache_stays_bounded_under_a_flood_of_distinct_headers(ident: Identity) -> None:
    for i in range(jws_module._HEADER_CACHE_MAX + 50):
        token = craft(header_bytes(ident, kid=f"{ident.did}#k{i}"), _raw(PAYLOAD), ident)
        expect(AuthenticationFailed, -32040, token, ident)
        assert len(jws_module._HEADER_CACHE) <= jws_module._HEADER_CACHE_MAX
    # A header too long to keep is decoded each time and never stored.
    long_kid = ident.did + "#" + "k" * 600
    before = len(jws_module._HEADER_CACHE)
    long_token = craft(header_bytes(ident, kid=long_kid), _raw(PAYLOAD), ident)
    expect(AuthenticationFailed, -32040, long_token, ident)
    assert len(jws_module._HEADER_CACHE) == before
    assert verify(good_token(ident), ident) == PAYLOAD
