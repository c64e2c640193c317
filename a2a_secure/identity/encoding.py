"""Strict encodings of PROTOCOL.md §1: base64url, I-JSON parsing, JCS hashing.

Python's own decoders are lax in ways an attacker can use: ``base64.urlsafe_b64decode``
drops unknown characters and accepts padding and non-canonical trailing bits (so two
different strings decode to the same bytes and a replay cache keyed on the text is
bypassed); ``json.loads`` keeps the last of duplicate members, accepts ``NaN`` and lone
surrogates and recurses until ``RecursionError``. Everything here refuses those inputs.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson
import rfc8785

from a2a_secure.errors import InvalidParams, ParseError

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INT",
    "b64u_decode",
    "b64u_decode_bytes",
    "b64u_encode",
    "b64u_encode_bytes",
    "dumps",
    "hash_bytes",
    "hash_of",
    "ijson_problem",
    "is_hash_string",
    "jcs",
    "loads",
]

MAX_SAFE_INT = 2**53 - 1
MAX_DEPTH = 32
_MAX_INT_CHARS = len(str(-MAX_SAFE_INT))

# base64url to the standard alphabet for binascii; "+", "/" and "=" in the input become "!",
# which strict_mode refuses like any other character outside the alphabet.
_B64U_TO_STD = bytes.maketrans(b"-_+/=", b"+/!!!")
_STD_TO_B64U = bytes.maketrans(b"+/", b"-_")
_B64U_VALUE = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")}
_B64U_BYTE_VALUE = {ord(c): i for c, i in _B64U_VALUE.items()}
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
# A lone surrogate can only enter a decoded str through a \uD800-\uDFFF escape.
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def b64u_encode(data: bytes) -> str:
    """Base64url without padding (RFC 4648 §5)."""
    # base64.urlsafe_b64encode's own steps, without its Python-level calls.
    return binascii.b2a_base64(data, newline=False).translate(_STD_TO_B64U).rstrip(b"=").decode("ascii")


def b64u_encode_bytes(data: bytes) -> bytes:
    """:func:`b64u_encode` as ASCII bytes."""
    return binascii.b2a_base64(data, newline=False).translate(_STD_TO_B64U).rstrip(b"=")


def b64u_decode(text: str, *, error: type[Exception] = InvalidParams) -> bytes:
    """Decode strict base64url: no padding, only ``[A-Za-z0-9_-]``, canonical trailing bits.

    Raises ``error`` (``InvalidParams`` unless told otherwise) on any deviation.
    """
    if not isinstance(text, str) or len(text) % 4 == 1:
        raise error("not canonical base64url")
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise error("not canonical base64url") from None
    return b64u_decode_bytes(raw, error=error)


def b64u_decode_bytes(raw: bytes, *, error: type[Exception] = InvalidParams) -> bytes:
    """:func:`b64u_decode` of base64url text given as its bytes (a segment of a token read
    from a body): the same strictness."""
    if len(raw) % 4 == 1:
        raise error("not canonical base64url")
    # Non-zero trailing bits decode to the same bytes as the canonical form: refuse them.
    # Only the last character of a text whose length is 2 or 3 mod 4 carries such bits
    # (4 or 2 of them); its 6-bit value must be a multiple of 16 or 4 (a character outside
    # the alphabet counts as 1: refused).
    tail = len(raw) % 4
    if tail and _B64U_BYTE_VALUE.get(raw[-1], 1) % (16 if tail == 2 else 4):
        raise error("not canonical base64url")
    # strict_mode refuses every character outside the alphabet (whitespace included) and
    # any padding but the one added here: no regex pass over the text is needed.
    try:
        return binascii.a2b_base64(raw.translate(_B64U_TO_STD) + b"=" * (-len(raw) % 4), strict_mode=True)
    except binascii.Error:
        raise error("not canonical base64url") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("non-finite number")
    return value


def _parse_int(text: str) -> int:
    # Called by the C scanner for each integer literal only: cheaper than any scan of the
    # whole text (a regex for long digit runs cost 8 us per KB, more than the parse itself).
    # JSON has no leading zeros, so a literal longer than "-9007199254740991" is out of
    # range: refused before int() spends time on a long run of digits.
    if len(text) > _MAX_INT_CHARS:
        raise ValueError("integer out of the I-JSON range")
    value = int(text)
    if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        raise ValueError("integer out of the I-JSON range")
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate member name")
    return obj


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_reject_constant,
    strict=True,
)


_NOT_COMPACT = object()
_STRICT_INTEGER = orjson.OPT_STRICT_INTEGER


def _loads_compact(data: bytes, max_depth: int) -> Any:
    """The value of ``data`` if it is exactly what :func:`dumps` writes for it, else ``_NOT_COMPACT``.

    Every body and payload this library signs or sends is written that way, so most texts
    take this path: orjson parses them five times faster than the hooked ``json`` decoder.
    orjson alone is lax where I-JSON is strict (it keeps the last of duplicate members and
    parses integers past ±(2^53−1), or past 64 bits as floats), so the value is written back
    and must give the very same bytes: a dropped duplicate, an integer out of range (which
    ``OPT_STRICT_INTEGER`` refuses to write), a float from an integer literal, an escape,
    whitespace, all differ and go to the strict parser, which refuses them or parses them
    with its own checks. orjson refuses invalid UTF-8, a BOM, lone surrogates, ``NaN`` and
    numbers that overflow. Only the depth is left, tested as :func:`loads` does.
    """
    try:
        value = orjson.loads(data)
        same = orjson.dumps(value, option=_STRICT_INTEGER) == data
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return _NOT_COMPACT
    if not same:
        return _NOT_COMPACT
    if data.count(b"[") + data.count(b"{") > max_depth and ijson_problem(value, max_depth=max_depth):
        return _NOT_COMPACT  # the strict parser names the problem
    return value


def loads(
    data: bytes | str,
    *,
    max_depth: int = MAX_DEPTH,
    error: type[Exception] = ParseError,
) -> Any:
    """Parse one I-JSON text (RFC 7493) or raise ``error`` (``ParseError`` by default).

    Refused: invalid UTF-8, a BOM, duplicate member names, ``NaN``/``Infinity`` and numbers
    that overflow to them, integers outside ±(2^53−1), lone surrogates, nesting deeper
    than ``max_depth`` (containers, the outermost being 1), trailing data.
    """
    if type(data) is bytes:
        value = _loads_compact(data, max_depth)
        if value is not _NOT_COMPACT:
            return value
    from_bytes = not isinstance(data, str)
    if not isinstance(data, str):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise error("body is not valid UTF-8") from None
    else:
        text = data
    if text.startswith("\ufeff"):
        raise error("byte order mark not allowed")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise error("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError, and so are the hooks'
        raise error(f"not I-JSON: {_short(exc)}") from None
    # Integers were range-checked by the scanner. Cheap C-level tests decide whether the
    # parsed value needs a walk at all: nesting deeper than max_depth needs more than
    # max_depth brackets; a lone surrogate enters through a \uD8xx escape (or, for a str
    # argument, raw: UTF-8 decoding refuses it in bytes).
    depth = text.count("[") + text.count("{") > max_depth
    surrogates = ("\\u" in text and _SURROGATE_ESCAPE_RE.search(text) is not None) or (
        not from_bytes and _SURROGATE_RE.search(text) is not None
    )
    if depth or surrogates:
        problem = ijson_problem(value, max_depth=max_depth)
        if problem is not None:
            raise error(problem)
    return value


def ijson_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``value`` would not encode to I-JSON, or None if it does; no encoding is done.

    A value encodes to I-JSON if it is built of dicts with str keys, lists or tuples, str
    without lone surrogates, bool, None, int within ±(2^53−1) and finite floats, nested at
    most ``max_depth`` containers deep. It is what ``loads(dumps(value))`` would accept,
    at a fraction of the cost (a handler's result is checked this way on every intent);
    :func:`loads` also runs it on a parsed value, for what the C parser cannot refuse.
    Iterative, so a hostile depth cannot exhaust the Python stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            # isascii() is O(1) in CPython: only a non-ASCII string can hold a surrogate.
            if not item.isascii() and _SURROGATE_RE.search(item) is not None:
                return "lone surrogate in string"
        elif isinstance(item, dict | list | tuple):
            if depth > max_depth:
                return f"JSON nested deeper than {max_depth}"
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        return "member name is not a string"
                    if not key.isascii() and _SURROGATE_RE.search(key) is not None:
                        return "lone surrogate in string"
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                return "not I-JSON: integer out of the I-JSON range"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "non-finite number"
        else:
            return f"{type(item).__name__} is not a JSON type"
    return None


def _short(exc: Exception) -> str:
    msg = str(exc).split(":", 1)[0] if isinstance(exc, json.JSONDecodeError) else str(exc)
    return msg[:80]


# Built once: json.dumps with any non-default option builds an encoder on every call.
_WIRE_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON for the wire (not canonical; hashes use :func:`jcs`).

    The bytes are those of ``json`` with ``separators=(",", ":")``, ``ensure_ascii=False``
    and ``allow_nan=False``, and so are the errors. A value :func:`_plain` accepts, which is
    every message the protocol builds, is written by orjson (10 to 20 times faster here);
    anything else, or anything orjson refuses, by ``json``.
    """
    if _plain(obj):
        try:
            # Copied: orjson's bytes object keeps its whole write buffer (8 KiB for a 700-byte
            # answer), and a store keeps the last answer of every session.
            return bytes(memoryview(orjson.dumps(obj)))
        except orjson.JSONEncodeError:  # a lone surrogate: json raises its own error below
            pass
    return _WIRE_ENCODER.encode(obj).encode()


def ijson_dumps(value: Any, *, max_depth: int = MAX_DEPTH) -> bytes | None:
    """:func:`dumps` of ``value`` if it is I-JSON nested at most ``max_depth`` containers
    deep, else None (:func:`ijson_problem` says why).

    One walk where checking with :func:`ijson_problem` and then writing with :func:`dumps`
    take two: a handler's result is checked and written this way on every intent.
    """
    if _plain_within(value, max_depth):
        try:
            return bytes(memoryview(orjson.dumps(value)))
        except orjson.JSONEncodeError:  # a lone surrogate: not I-JSON
            return None
    if ijson_problem(value, max_depth=max_depth) is not None:
        return None
    return _WIRE_ENCODER.encode(value).encode()


def _plain_within(value: Any, max_depth: int) -> bool:
    """:func:`_plain`, with no container deeper than ``max_depth`` (the outermost being 1)."""
    level: list[Any] = [value]
    depth = 1
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or kind is bool or item is None:
                continue
            if kind is dict:
                if depth > max_depth:
                    return False
                for key in item:
                    if type(key) is not str or not key.isascii():
                        return False
                below.extend(item.values())
            elif kind is list:
                if depth > max_depth:
                    return False
                below.extend(item)
            elif kind is not int or not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                return False
        depth += 1
        level = below
    return True


def _plain(value: Any) -> bool:
    """True if orjson writes ``value`` exactly as ``json`` does, and with sorted keys
    exactly as RFC 8785 does.

    That holds for values made only of dicts with ASCII member names (code point order is
    then UTF-16 order), lists, str, bool, None and ints within ±(2^53−1): orjson and Python
    escape every code point as ECMAScript does (short forms, else ``\\u00xx`` in
    lowercase; ``tests/test_encoding.py`` compares all of them). Floats, whose forms
    differ, subclasses of the JSON types and everything else take the slower path, as do
    values nested deeper than ``MAX_DEPTH``.
    """
    level: list[Any] = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or kind is bool or item is None:
                continue
            if kind is dict:
                for key in item:
                    if type(key) is not str or not key.isascii():
                        return False
                below.extend(item.values())
            elif kind is list:
                below.extend(item)
            elif kind is not int or not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                return False
        depth += 1
        if below and depth > MAX_DEPTH:
            return False
        level = below
    return True


def jcs(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes."""
    try:
        if _plain(obj):
            # The pure-Python rfc8785 costs about a handshake step's signature; orjson with
            # sorted keys writes a plain value identically, in a few microseconds.
            return bytes(memoryview(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)))
        return rfc8785.dumps(obj)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidParams(f"value cannot be canonicalized: {exc}"[:120]) from None


def hash_bytes(data: bytes) -> str:
    """``"sha256:" + hex(SHA-256(data))``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hash_of(obj: Any) -> str:
    """``hash_of(obj)`` of PROTOCOL.md §1: SHA-256 over the JCS form, as a hash string."""
    if isinstance(obj, Mapping) and not isinstance(obj, dict):
        obj = dict(obj)
    return hash_bytes(jcs(obj))


def is_hash_string(value: object) -> bool:
    """True for ``"sha256:"`` followed by exactly 64 lowercase hex digits."""
    return isinstance(value, str) and _HASH_RE.fullmatch(value) is not None
