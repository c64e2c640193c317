"""Strict encodings of PROTOCOL.md §1 and §9: base64url, I-JSON, JCS hashing (ATTACKS.md C, I4).

One test per rule, then Hypothesis properties: round trips, and that the parsers let only
the SDK's own errors escape.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import tracemalloc
import types
from typing import Any

import nacl.signing
import orjson
import pytest
import rfc8785
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from a2a_secure.errors import A2AError, AuthenticationFailed, InvalidParams, ParseError
from a2a_secure.identity import (
    Identity,
    b64u_decode,
    b64u_encode,
    did_key_from_public_key,
    hash_of,
    jws_sign,
    jws_verify,
    public_key_from_did_key,
)
from a2a_secure.identity.encoding import (
    MAX_DEPTH,
    MAX_SAFE_INT,
    dumps,
    hash_bytes,
    ijson_problem,
    is_hash_string,
    jcs,
    loads,
)

# -- base64url (§1) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text"),
    [(b"", ""), (b"f", "Zg"), (b"fo", "Zm8"), (b"foo", "Zm9v"), (b"\xfb\xff", "-_8")],
)
def test_b64u_known_answers(raw: bytes, text: str) -> None:
    assert b64u_encode(raw) == text
    assert b64u_decode(text) == raw


@pytest.mark.parametrize("text", ["Zg==", "Zg=", "Zm8=", "Zm9v===="])
def test_b64u_padding_rejected(text: str) -> None:
    with pytest.raises(InvalidParams) as info:
        b64u_decode(text)
    assert info.value.code == -32602


@pytest.mark.parametrize(
    "text",
    [
        *("+_8", "-/8", "Zm 9v", "Zm9v\n", " Zm9v", "Zm\t9v", "Z!g", "Zm9v.", "Zm9\u00e9", "Zm9\u0660"),
        # '=' anywhere, NUL, CR LF, and '+' '/' '=' where the translation to the standard
        # alphabet must not let them through.
        *("Zg=A", "=ZgA", "Z=gA", "Zm\x00v", "\x00\x00", "Zm9v\r\n", "Zm9v+w", "Zm9v/w", "Zm9v=w", "Zm!v"),
    ],
)
def test_b64u_characters_outside_alphabet_rejected(text: str) -> None:
    # Python's decoder drops unknown characters ("Z!g" -> b"f") and takes '+' and '/'.
    with pytest.raises(InvalidParams):
        b64u_decode(text)


@pytest.mark.parametrize("text", ["A", "AAAAA", "Zm9vY"])
def test_b64u_length_one_mod_four_rejected(text: str) -> None:
    with pytest.raises(InvalidParams):
        b64u_decode(text)


@pytest.mark.parametrize(("alias", "canonical"), [("Zh", "Zg"), ("Zm9", "Zm8"), ("Zm-", "Zm8")])
def test_b64u_non_canonical_trailing_bits_rejected(alias: str, canonical: str) -> None:
    # C1: "Zh" decodes to b"f" like "Zg" under a lax decoder; a replay cache keyed on
    # the text would see two different tokens.
    assert base64.urlsafe_b64decode(alias + "==") == base64.urlsafe_b64decode(canonical + "==")
    with pytest.raises(InvalidParams):
        b64u_decode(alias)
    assert b64u_encode(b64u_decode(canonical)) == canonical


@pytest.mark.parametrize("value", [b"Zg", None, 1, ["Zg"]])
def test_b64u_decode_refuses_non_str(value: Any) -> None:
    with pytest.raises(InvalidParams):
        b64u_decode(value)


def test_b64u_decode_custom_error_class() -> None:
    with pytest.raises(AuthenticationFailed):
        b64u_decode("Zg==", error=AuthenticationFailed)


def test_b64u_encode_has_no_padding() -> None:
    for n in range(10):
        assert "=" not in b64u_encode(bytes(n))


# -- I-JSON parsing (§1, §9) -----------------------------------------------------------------------


def _parse_error(data: bytes | str) -> ParseError:
    with pytest.raises(ParseError) as info:
        loads(data)
    assert info.value.code == -32700
    return info.value


def test_loads_accepts_plain_json() -> None:
    assert loads(b'{"a":[1,2.5,"x",true,false,null]}') == {"a": [1, 2.5, "x", True, False, None]}
    assert loads('{"a":1}') == {"a": 1}
    assert loads(b' {"a":1} \n') == {"a": 1}


@pytest.mark.parametrize("data", [b"\xff", b'{"a":"\xc3"}', b'{"a":"\xed\xa0\x80"}', b"\xc0\xaf"])
def test_loads_invalid_utf8(data: bytes) -> None:
    # \xed\xa0\x80 is a UTF-8-encoded surrogate (CESU-8): not UTF-8.
    _parse_error(data)


@pytest.mark.parametrize("data", [b'\xef\xbb\xbf{"a":1}', '\ufeff{"a":1}'])
def test_loads_byte_order_mark(data: bytes | str) -> None:
    _parse_error(data)


@pytest.mark.parametrize(
    "data", [b'{"a":1,"a":2}', b'{"x":{"a":1,"a":1}}', b'[{"b":1,"b":1}]', b'{"a":1,"\\u0061":2}']
)
def test_loads_duplicate_member_names(data: bytes) -> None:
    _parse_error(data)


@pytest.mark.parametrize(
    "data", [b'{"a":NaN}', b"[Infinity]", b"[-Infinity]", b"[1e999]", b"[-1e999]", b"[1E400]"]
)
def test_loads_non_finite_numbers(data: bytes) -> None:
    # C4: abs(now - NaN) > 300 is False, so a NaN timestamp would pass a naive check.
    _parse_error(data)


def test_loads_integer_range() -> None:
    assert loads(str(MAX_SAFE_INT).encode()) == 2**53 - 1
    assert loads(str(-MAX_SAFE_INT).encode()) == -(2**53 - 1)
    _parse_error(str(MAX_SAFE_INT + 1).encode())
    _parse_error(str(-MAX_SAFE_INT - 1).encode())
    _parse_error(b"18446744073709551616")


@pytest.mark.parametrize(
    "data",
    [
        b"9007199254740992",
        b" \n-9007199254740992",
        b'{"a" :\t9007199254740992}',
        b"[1, [ \r\n 18446744073709551616]]",
        b'{"a":{"b":[true,null,-9007199254740992]}}',
    ],
)
def test_loads_integer_range_in_any_position(data: bytes) -> None:
    _parse_error(data)
    # One less in magnitude is accepted, wherever it stands.
    assert loads(
        data.replace(b"9007199254740992", b"9007199254740991").replace(b"18446744073709551616", b"7")
    )


def test_loads_huge_integer_is_parse_error_not_value_error() -> None:
    # C6: Python raises ValueError past 4300 digits; it must surface as ParseError.
    _parse_error(b"[" + b"9" * 5000 + b"]")


@pytest.mark.parametrize("data", [b'["\\ud800"]', b'{"\\udc00":1}', b'["a\\udbffb"]', b'["\\ude00\\ud83d"]'])
def test_loads_lone_surrogate_escapes(data: bytes) -> None:
    _parse_error(data)


def test_loads_raw_lone_surrogate_in_str_input() -> None:
    # A str argument can hold a surrogate code point that no UTF-8 body could.
    _parse_error('{"a":"\ud800"}')
    _parse_error('["\ud83d\ude00"]')  # two separate code units, not one character


def test_loads_surrogate_pair_escape_is_one_character() -> None:
    assert loads(b'["\\ud83d\\ude00"]') == ["\U0001f600"]


def _nested(depth: int, kind: str = "list") -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_loads_depth_limit(kind: str) -> None:
    # §9: depth counts containers, the outermost being 1; the limit is 32.
    assert MAX_DEPTH == 32
    loads(_nested(32, kind))
    _parse_error(_nested(33, kind))


def test_loads_depth_limit_mixed_containers() -> None:
    ok = b'{"a":' + b"[" * 31 + b"]" * 31 + b"}"
    loads(ok)
    _parse_error(b'{"a":' + b"[" * 32 + b"]" * 32 + b"}")


def test_loads_scalar_has_depth_zero() -> None:
    assert loads(b"1") == 1
    assert loads(b'"x"') == "x"


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_loads_very_deep_nesting_is_parse_error(depth: int) -> None:
    # H2: json raises RecursionError near depth 1000; it must not escape.
    _parse_error(b"[" * depth + b"]" * depth)
    _parse_error(b'{"a":' * depth + b"1" + b"}" * depth)


@pytest.mark.parametrize("data", [b"{} x", b"{}{}", b"[1] [2]", b'{"a":1}garbage'])
def test_loads_trailing_data(data: bytes) -> None:
    _parse_error(data)


@pytest.mark.parametrize("data", [b"", b"{", b"{'a':1}", b"[1,]", b'{"a":1,}', b"undefined", b'"a\x01"'])
def test_loads_not_json(data: bytes) -> None:
    _parse_error(data)


def test_loads_custom_error_class() -> None:
    with pytest.raises(InvalidParams):
        loads(b'{"a":1,"a":2}', error=InvalidParams)


def test_loads_keeps_bool_and_int_distinct() -> None:
    # C5: the parser keeps true as bool; callers check type(x) is int.
    value = loads(b'{"a":true,"b":1,"c":1.0}')
    assert type(value["a"]) is bool
    assert type(value["b"]) is int
    assert type(value["c"]) is float


# -- JCS hashing (§1, C8) ------------------------------------------------------------------------

RFC8785_INPUT = (
    r'{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
    r' "string": "\u20ac$\u000F\u000aA'
    "'"
    r'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}'
)
RFC8785_OUTPUT = (
    r'{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    r'"string":"€$\u000f\nA'
    "'"
    r'B\"\\\\\"/"}'
)


def test_jcs_rfc8785_section_3_2_2_example() -> None:
    assert jcs(loads(RFC8785_INPUT)) == RFC8785_OUTPUT.encode()
    assert hash_of(loads(RFC8785_INPUT)) == "sha256:" + hashlib.sha256(RFC8785_OUTPUT.encode()).hexdigest()


def test_jcs_rfc8785_section_3_2_3_sorting_by_utf16() -> None:
    # U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16, after it in code points.
    obj = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = list(json.loads(jcs(obj)))
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (9007199254740992.0, "9007199254740992"),
        (295147905179352830000.0, "295147905179352830000"),
        (0.000001, "0.000001"),
        (333333333.3333332, "333333333.3333332"),
    ],
)
def test_jcs_rfc8785_number_serialisation(number: float, text: str) -> None:
    assert jcs([number]) == f"[{text}]".encode()


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"b": 1, "a": [1, 2, {"z": None}]},
        {"policy": {"rate_limit": 1000, "allowed_intents": ["x"]}},
        [1, "é"],
    ],
)
def test_hash_of_is_sha256_of_jcs(obj: Any) -> None:
    expected = "sha256:" + hashlib.sha256(jcs(obj)).hexdigest()
    assert hash_of(obj) == expected
    assert is_hash_string(hash_of(obj))


def test_hash_of_one_equals_one_point_zero() -> None:
    assert hash_of({"n": 1}) == hash_of({"n": 1.0}) == hash_of(loads(b'{"n":1.0}'))


@pytest.mark.parametrize(("a", "b"), [(True, 1), (False, 0), ("1", 1), (None, 0), ([], {})])
def test_hash_of_distinguishes_types(a: Any, b: Any) -> None:
    assert hash_of({"n": a}) != hash_of({"n": b})


def test_hash_of_ignores_member_order_and_mapping_type() -> None:
    one = {"a": 1, "b": [1, 2]}
    two = {"b": [1, 2], "a": 1}
    assert hash_of(one) == hash_of(two) == hash_of(types.MappingProxyType(one))


def test_hash_of_known_value() -> None:
    assert hash_of({}) == "sha256:" + hashlib.sha256(b"{}").hexdigest()
    assert hash_bytes(b"abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1, 2}, b"bytes", {"a": "\ud800"}])
def test_hash_of_refuses_non_json(bad: Any) -> None:
    with pytest.raises(InvalidParams):
        hash_of({"v": bad})


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("sha256:" + "0" * 64, True),
        ("sha256:" + "a" * 64, True),
        ("sha256:" + "A" * 64, False),
        ("sha256:" + "0" * 63, False),
        ("sha256:" + "0" * 65, False),
        ("sha512:" + "0" * 64, False),
        ("sha256:" + "0" * 64 + "\n", False),
        (None, False),
    ],
)
def test_is_hash_string(value: Any, ok: bool) -> None:
    assert is_hash_string(value) is ok


def test_dumps_is_compact_utf8() -> None:
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    with pytest.raises(ValueError):
        dumps({"a": float("nan")})


# dumps and jcs write plain values (the protocol's own messages) with orjson: its bytes must
# be the json module's and RFC 8785's for every code point, in strings and in member names.
_WIRE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_ALL_CODE_POINTS = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
_CHUNKS = ["".join(_ALL_CODE_POINTS[i : i + 4096]) for i in range(0, len(_ALL_CODE_POINTS), 4096)]


def test_dumps_and_jcs_write_every_code_point_as_json_and_rfc8785_do() -> None:
    for chunk in _CHUNKS:
        value = {"s": chunk, "l": [chunk, 1, None, True]}
        assert dumps(value) == _WIRE.encode(value).encode()
        assert jcs(value) == rfc8785.dumps(value)


def test_jcs_sorts_every_ascii_member_name_as_rfc8785_does() -> None:
    value = {chr(c) + tail: c for c in range(128) for tail in ("", "a", "\x00")}
    assert dumps(value) == _WIRE.encode(value).encode()
    assert jcs(value) == rfc8785.dumps(value)


def test_dumps_output_holds_only_its_bytes() -> None:
    # A store keeps one encoded answer per session: the object must not keep a write buffer
    # several times its length (orjson's own output keeps 8 KiB for this 650-byte value).
    value = {"status": "success", "sequence": 1, "response_jws": "x" * 600}
    tracemalloc.start()
    try:
        kept = [dumps(value) for _ in range(200)]
        size, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size / len(kept) < 2 * len(kept[0])


@pytest.mark.parametrize(
    "value",
    [
        {"a": "\ud800"},  # a lone surrogate: refused by both encoders
        {1: "an int member name"},  # json writes it as "1"
        {"f": 1.5e16},  # floats take json's form (orjson would write 1.5e16)
        {"big": 2**60},  # beyond I-JSON, still written as json does
        ("tuple", "of", "strings"),
        {"nested": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
    ],
)
def test_dumps_of_values_outside_the_fast_path_is_json_s(value: Any) -> None:
    try:
        expected: bytes | type[Exception] = _WIRE.encode(value).encode()
    except (TypeError, ValueError) as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert dumps(value) == expected
    else:
        with pytest.raises(expected):
            dumps(value)


# -- properties (I4) -----------------------------------------------------------------------------


@given(st.binary(max_size=512))
def test_prop_b64u_round_trip(data: bytes) -> None:
    text = b64u_encode(data)
    assert b64u_decode(text) == data
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert len(text) % 4 != 1


@given(st.text(max_size=64))
def test_prop_b64u_decode_is_unique_or_invalid_params(text: str) -> None:
    # Any accepted text is the one canonical encoding of what it decodes to.
    try:
        raw = b64u_decode(text)
    except InvalidParams:
        return
    assert b64u_encode(raw) == text


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/= ", max_size=16))
def test_prop_b64u_decode_alphabet_fuzz(text: str) -> None:
    try:
        raw = b64u_decode(text)
    except InvalidParams:
        return
    assert b64u_encode(raw) == text


@given(st.binary(min_size=32, max_size=32))
def test_prop_did_key_round_trip(seed: bytes) -> None:
    key = nacl.signing.SigningKey(seed)
    public = bytes(key.verify_key)
    did = did_key_from_public_key(public)
    assert did.startswith("did:key:z6Mk")
    assert public_key_from_did_key(did) == public
    assert Identity.from_seed(seed, "prop").did == did


@pytest.fixture(scope="module")
def prop_identity() -> Identity:
    return Identity.from_seed(b"\x07" * 32, "prop")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prop_any_single_character_change_breaks_the_jws(
    prop_identity: Identity, data: st.DataObject
) -> None:
    token = jws_sign({"seq": 1, "text": "hello"}, prop_identity, "a2a-request+jws")
    i = data.draw(st.integers(min_value=0, max_value=len(token) - 1), label="index")
    replacement = data.draw(
        st.one_of(
            st.characters(min_codepoint=0, max_codepoint=255),
            st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."),
            st.characters(),
        ),
        label="replacement",
    )
    assume(replacement != token[i])
    tampered = token[:i] + replacement + token[i + 1 :]
    with pytest.raises(A2AError) as info:
        jws_verify(tampered, prop_identity.public_key, typ="a2a-request+jws", kid=prop_identity.kid)
    assert type(info.value) in (InvalidParams, AuthenticationFailed)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prop_any_single_byte_change_to_decoded_signature_breaks_the_jws(
    prop_identity: Identity, data: st.DataObject
) -> None:
    token = jws_sign({"seq": 1}, prop_identity, "a2a-request+jws")
    h, p, s = token.split(".")
    sig = bytearray(b64u_decode(s))
    i = data.draw(st.integers(min_value=0, max_value=63))
    new = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != sig[i]))
    sig[i] = new
    with pytest.raises(AuthenticationFailed):
        jws_verify(
            f"{h}.{p}.{b64u_encode(bytes(sig))}",
            prop_identity.public_key,
            typ="a2a-request+jws",
            kid=prop_identity.kid,
        )


def _loads_only_parse_error(data: bytes | str) -> None:
    with contextlib.suppress(ParseError):
        loads(data)


@given(st.binary(max_size=256))
def test_prop_loads_bytes_only_parse_error(data: bytes) -> None:
    _loads_only_parse_error(data)


@given(st.text(max_size=256))
def test_prop_loads_text_only_parse_error(text: str) -> None:
    _loads_only_parse_error(text)


JSONISH = st.text(alphabet='{}[]":,0123456789.eE+- \\utrnfalsNIiy\ud800\udc00\ufeff', max_size=128)


@settings(max_examples=500)
@given(JSONISH)
def test_prop_loads_jsonish_only_parse_error(text: str) -> None:
    _loads_only_parse_error(text)
    _loads_only_parse_error(text.encode("utf-8", "surrogatepass"))


def json_like(*, int_bound: int, keys: st.SearchStrategy[Any], tuples: bool) -> st.SearchStrategy[Any]:
    """Values close to JSON: any float, ints up to ``int_bound``, member names from ``keys``."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-int_bound, max_value=int_bound)
        | st.floats()
        | st.text(alphabet=st.characters(), max_size=8)
    )

    def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        out = st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4)
        return out | st.tuples(inner, inner) if tuples else out

    return st.recursive(leaves, containers, max_leaves=24)


# Integer member names too: they must be refused, not silently turned into strings.
json_values = json_like(
    int_bound=2**60, keys=st.text(alphabet=st.characters(), max_size=8) | st.integers(), tuples=False
)


@given(
    json_like(
        int_bound=2**70, keys=st.text(alphabet=st.characters(), max_size=8) | st.integers(), tuples=True
    )
)
def test_prop_dumps_and_jcs_agree_with_json_and_rfc8785(value: Any) -> None:
    # Same bytes, or the same kind of refusal, whichever encoder writes the value.
    try:
        wire: bytes | None = _WIRE.encode(value).encode()
    except (TypeError, ValueError):
        wire = None
    if wire is None:
        with pytest.raises((TypeError, ValueError)):
            dumps(value)
    else:
        assert dumps(value) == wire
    try:
        canonical: bytes | None = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        canonical = None
    if canonical is None:
        with pytest.raises(InvalidParams):
            jcs(value)
    else:
        assert jcs(value) == canonical


@given(json_values)
def test_prop_loads_of_python_json_output(value: Any) -> None:
    # Whatever json.dumps emits (NaN, big ints, surrogates included) is either parsed back
    # as the same value or refused with ParseError.
    text = json.dumps(value)
    try:
        parsed = loads(text)
    except ParseError:
        return
    assert json.dumps(parsed) == text


def _same_parse(data: bytes) -> None:
    # loads takes a fast path for bytes (orjson, checked by writing the value back); a str
    # always takes the strict parser. Both must give the same value, or both refuse.
    try:
        fast: Any = loads(data)
    except ParseError:
        fast = ParseError
    try:
        strict: Any = loads(data.decode("utf-8"))
    except (ParseError, UnicodeDecodeError):
        strict = ParseError
    if fast is ParseError or strict is ParseError:
        assert fast is strict, data
    else:
        assert json.dumps(fast) == json.dumps(strict), data


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":1,"a":1}',
        b'{"a":{"b":2,"b":2}}',
        b"[9007199254740991,-9007199254740991]",
        b"[9007199254740992]",
        b"[-9007199254740992]",
        b"[9223372036854775807]",
        b"[18446744073709551616]",
        b"[-0.0,0.0,1.0,1e+16,0.00001]",
        b'["\\u0001\\u001f"]',
        b'["\\\\","\\"","\\n"]',
        b'["\\ud83d\\ude00"]',
        b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        b'["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]',
        b'{"\\u0000":null,"k":[true,false]}',
    ],
)
def test_loads_fast_path_agrees_with_the_strict_parser(data: bytes) -> None:
    _same_parse(data)


@given(json_values)
def test_prop_loads_fast_path_agrees_with_the_strict_parser(value: Any) -> None:
    # The compact bytes the SDK writes take the fast path whatever they hold.
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return
    _same_parse(data)


@settings(max_examples=500)
@given(JSONISH)
def test_prop_loads_fast_path_agrees_on_jsonish_bytes(text: str) -> None:
    with contextlib.suppress(UnicodeEncodeError):
        _same_parse(text.encode("utf-8"))


# -- ijson_problem: a handler's result checked without encoding it ------------------------------------
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, "x", True, None]}, None),
        ((1, "tuple encodes as an array"), None),
        ({"n": MAX_SAFE_INT, "m": -MAX_SAFE_INT}, None),
        ({"n": MAX_SAFE_INT + 1}, "not I-JSON: integer out of the I-JSON range"),
        ([-(2**64)], "not I-JSON: integer out of the I-JSON range"),
        ({"x": float("nan")}, "non-finite number"),
        ([float("-inf")], "non-finite number"),
        ({1: "int key"}, "member name is not a string"),
        ({None: "null key"}, "member name is not a string"),
        ({"s": "\ud800"}, "lone surrogate in string"),
        ({"\udfff": 1}, "lone surrogate in string"),
        ({"set": {1, 2}}, "set is not a JSON type"),
        ([b"bytes"], "bytes is not a JSON type"),
        ({"o": object()}, "object is not a JSON type"),
    ],
)
def test_ijson_problem_names_the_first_problem(value: Any, problem: str | None) -> None:
    assert ijson_problem(value) == problem


def test_ijson_problem_depth_counts_containers() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH):
        value = [value]
    assert ijson_problem(value) is None
    assert ijson_problem([value]) == f"JSON nested deeper than {MAX_DEPTH}"
    assert ijson_problem(value, max_depth=MAX_DEPTH - 1) is not None
    # Iterative: a hostile depth costs no Python stack.
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert ijson_problem(deep) is not None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats()
    | st.text(alphabet=st.characters(), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet=st.characters(), max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_prop_ijson_problem_agrees_with_encoding_and_parsing(value: Any) -> None:
    # No problem found means the value survives dumps then loads unchanged; a problem found
    # means one of them refuses it or changes it (an int key comes back as a string).
    problem = ijson_problem(value)
    try:
        back = loads(dumps(value))
    except (A2AError, ValueError, TypeError):
        assert problem is not None
        return
    if problem is None:
        assert back == value
    else:
        assert problem == "member name is not a string"


# -- jcs: the C encoder where it writes what RFC 8785 writes ------------------------------------------
jcs_values = json_like(int_bound=2**54, keys=st.text(alphabet=st.characters(), max_size=6), tuples=True)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(jcs_values)
def test_prop_jcs_is_byte_identical_to_rfc8785(value: Any) -> None:
    # Whichever path jcs takes, its bytes are the reference implementation's, and it refuses
    # exactly what the reference refuses (as InvalidParams).
    try:
        reference = rfc8785.dumps(value)
    except Exception:
        with pytest.raises(InvalidParams):
            jcs(value)
        return
    assert jcs(value) == reference


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [True, None, "x"], "A": {"z": '\u0000\u001f\b\f\n\r\t"\\/\u007f\u2028'}},
        {"é": 1, "e": 2, "\U0001f600": 3, "\ufb33": 4},  # non-ASCII names: UTF-16 order
        {"n": 2**53 - 1, "m": -(2**53 - 1), "f": 1.0, "g": 1e21},
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    ],
)
def test_jcs_matches_rfc8785_on_the_edges_of_the_fast_path(value: Any) -> None:
    assert jcs(value) == rfc8785.dumps(value)
