"""The machinery every message model shares.

Building an already-checked model without re-validation, the re-validating mixin and the
helpers several message families' parsers have in common.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from a2a_secure.errors import A2AError, InvalidParams, StaleTimestamp
from a2a_secure.frozen import builder
from a2a_secure.identity.jws import Decoded
from a2a_secure.protocol.validate import check_payload_matches

Json = Any
"""A JSON value as received (a member the receiver compares rather than type-checks)."""

ErrorType = type[A2AError]
_M = TypeVar("_M")
_set = object.__setattr__


_BUILDERS: dict[type[Any], Callable[..., Any]] = {}


def _make(cls: type[_M], *values: Any) -> _M:
    """Build an already-checked model without re-running ``__post_init__`` (hot path).

    Writes through the slot descriptors, as the frozen dataclass's own ``__init__`` does
    with ``object.__setattr__``, only cheaper (:func:`a2a_secure.frozen.builder`).
    """
    build = _BUILDERS.get(cls)
    if build is None:
        build = _BUILDERS[cls] = builder(cls)
    return build(*values)  # type: ignore[no-any-return]


def _stale(what: str, ts: int, now: float) -> StaleTimestamp:
    return StaleTimestamp(f"{what} timestamp {ts} is not within 300 s of {int(now)}")


# A constructed (not parsed) token-carrying model decodes its token in ``__post_init__``.
_NOT_DECODED: Final[Decoded] = ({}, {}, b"", b"")


class _Validated:
    """Mixin: direct construction re-validates through ``parse`` on the wire form."""

    __slots__ = ()

    def __post_init__(self) -> None:
        type(self).parse(self.to_dict(), error=InvalidParams)  # type: ignore[attr-defined]


def _check_expected(obj: Mapping[str, Any], expected: Mapping[str, Any] | None, error: ErrorType) -> None:
    if expected is not None:
        check_payload_matches(obj, expected, error)


def _require_token(obj: Mapping[str, Any], what: str, error: ErrorType) -> str:
    token = obj["response_jws"]
    if not isinstance(token, str):
        raise error(f"{what}response_jws missing")
    return token
