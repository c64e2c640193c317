"""Shape checks for received messages (PROTOCOL.md §1, §4, §9).

They depend only on the error tree and the identity codecs, so every layer that parses a
JSON value (the protocol core, the stores, the policy value type) can use them without
importing the protocol core; ``a2a_secure.protocol.validate`` re-exports them.

Each check raises the error class the caller names, so the same check can give -32602 for a
JSON-RPC ``params`` member and -32040 for a member of a signed payload (§9: a signed
member of the wrong type is an authentication failure).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

import orjson

from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.did import check_did_syntax

__all__ = [
    "FRESHNESS_WINDOW",
    "MAX_SAFE_INT",
    "ErrorType",
    "check_payload_matches",
    "ct_equal",
    "exact_members",
    "is_fresh",
    "json_equal",
    "require_b64u_bytes",
    "require_bool",
    "require_did",
    "require_hash",
    "require_int",
    "require_object",
    "require_str",
]

MAX_SAFE_INT = encoding.MAX_SAFE_INT
FRESHNESS_WINDOW = 300

ErrorType = type[A2AError]


def exact_members(obj: Any, members: frozenset[str], what: str, error: ErrorType = InvalidParams) -> None:
    """``obj`` is a dict whose member names are exactly ``members``."""
    if not isinstance(obj, dict):
        raise error(f"{what} must be an object")
    if obj.keys() != members:
        missing = sorted(members - obj.keys())
        extra = sorted(obj.keys() - members)
        detail = f"missing {missing[0]!r}" if missing else f"unexpected member {extra[0][:64]!r}"
        raise error(f"{what}: {detail}")


def require_object(value: Any, what: str, error: ErrorType = InvalidParams) -> dict[str, Any]:
    """A JSON object."""
    if not isinstance(value, dict):
        raise error(f"{what} must be an object")
    return value


def require_str(
    value: Any, what: str, *, min_len: int = 0, max_len: int = 2048, error: ErrorType = InvalidParams
) -> str:
    """A string whose length in code points lies in ``[min_len, max_len]``."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string")
    if not min_len <= len(value) <= max_len:
        raise error(f"{what} must be {min_len}-{max_len} characters")
    return value


def require_int(
    value: Any, what: str, *, minimum: int = 0, maximum: int = MAX_SAFE_INT, error: ErrorType = InvalidParams
) -> int:
    """A JSON integer (not a boolean, not a float) in ``[minimum, maximum]``."""
    if type(value) is not int:
        raise error(f"{what} must be an integer")
    if not minimum <= value <= maximum:
        raise error(f"{what} must be in {minimum}..{maximum}")
    return value


def require_bool(value: Any, what: str, error: ErrorType = InvalidParams) -> bool:
    """A JSON boolean."""
    if type(value) is not bool:
        raise error(f"{what} must be a boolean")
    return value


def require_hash(value: Any, what: str, error: ErrorType = InvalidParams) -> str:
    """A hash string ``sha256:`` + 64 lowercase hex digits."""
    if not encoding.is_hash_string(value):
        raise error(f"{what} must be a sha256 hash string")
    return str(value)


def require_b64u_bytes(value: Any, what: str, length: int, error: ErrorType = InvalidParams) -> bytes:
    """Strict base64url of exactly ``length`` bytes."""
    if not isinstance(value, str) or len(value) > 4 * length:
        raise error(f"{what} must be base64url")
    raw = encoding.b64u_decode(value, error=error)
    if len(raw) != length:
        raise error(f"{what} must encode {length} bytes")
    return raw


def require_did(value: Any, what: str, error: ErrorType = InvalidParams) -> str:
    """A syntactically valid DID."""
    try:
        return check_did_syntax(value)
    except InvalidParams:
        raise error(f"{what} is not a DID") from None


def is_fresh(timestamp: int, now: float) -> bool:
    """PROTOCOL.md §1: fresh when ``abs(now - timestamp) <= 300`` (integer seconds)."""
    return abs(int(now) - timestamp) <= FRESHNESS_WINDOW


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values as PROTOCOL.md §1 defines it: byte-identical JCS forms.

    Computed structurally rather than by serialising both sides (JCS in pure Python was
    a fifth of an intent's cost): ``true`` and ``1`` differ, ``1`` and ``1.0`` are equal
    (JCS writes both as ``1``), strings compare by code points, member order is ignored.
    Top-level strings (nonces, hashes, commitments) compare in constant time.
    """
    if type(a) is str and type(b) is str:
        return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))
    if type(a) is dict and type(b) is dict:
        # Objects (an intent and its inputs, at every request): the same text with sorted
        # members is the same JSON value, written in C. Any difference in the text (``1``
        # and ``1.0``, member order aside) is decided by the structural comparison below.
        try:
            if orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS):
                return True
        except (orjson.JSONEncodeError, TypeError):
            pass
    return _equal(a, b)


_NUMBER_TYPES = (int, float)


def _equal(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if ta is str or ta is bool or a is None:
        return ta is tb and a == b
    if ta in _NUMBER_TYPES:
        return tb in _NUMBER_TYPES and a == b
    if ta is dict:
        return tb is dict and a.keys() == b.keys() and all(_equal(v, b[k]) for k, v in a.items())
    if ta is list:
        return tb is list and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return False


def ct_equal(a: str, b: str) -> bool:
    """Constant-time comparison of two strings."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


def check_payload_matches(payload: Mapping[str, Any], expected: Mapping[str, Any], error: ErrorType) -> None:
    """Every expected member of a verified payload equals the receiver's own value."""
    for name, value in expected.items():
        if not json_equal(payload[name], value):
            raise error(f"signed {name} does not match")
