"""The answers of PROTOCOL.md §6.2 and §6.3.

The signed error object, the intent result, the close answer and the response payload their
signatures cover.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from a2a_secure.errors import AuthenticationFailed
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.models._base import (
    ErrorType,
    Json,
    _check_expected,
    _make,
    _require_token,
    _Validated,
)
from a2a_secure.protocol.validate import exact_members, require_int

__all__ = ["ClosedMessage", "ErrorObject", "IntentResultMessage", "ResponsePayload"]

_ERROR_MEMBERS: Final = frozenset(("code", "message"))


# -- §6.2 / §6.3 answers ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ErrorObject(_Validated):
    """A signed ``{"code","message"}`` error (§6.2, §6.4)."""

    code: int
    message: str

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> ErrorObject:
        """Exactly ``code`` (an integer) and ``message`` (a string)."""
        exact_members(obj, _ERROR_MEMBERS, "signed error", error)
        code, message = obj["code"], obj["message"]
        if type(code) is not int or not isinstance(message, str):
            raise error("signed error must have an integer code and a string message")
        return _make(cls, code, message)

    def to_dict(self) -> dict[str, Any]:
        """The wire object."""
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class IntentResultMessage(_Validated):
    """An intent ``result`` (§6.2) before verification: ``status``/``sequence``/``result`` are
    compared with the signed ones after the signature check."""

    status: Json
    sequence: Json
    result: Json
    response_jws: str

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> IntentResultMessage:
        """Exact members and a string token."""
        exact_members(obj, m.RESULT_MEMBERS, "intent result", error)
        token = _require_token(obj, "", error)
        return _make(cls, obj["status"], obj["sequence"], obj["result"], token)

    def to_dict(self) -> dict[str, Any]:
        """The wire result."""
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class ClosedMessage(_Validated):
    """The result of a close (§6.3) before verification."""

    type: Json
    session_id: Json
    response_jws: str

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> ClosedMessage:
        """Exact members and a string token."""
        exact_members(obj, m.CLOSED_MEMBERS, "close result", error)
        token = _require_token(obj, "", error)
        return _make(cls, obj["type"], obj["session_id"], token)

    def to_dict(self) -> dict[str, Any]:
        """The wire result."""
        return {"type": self.type, "session_id": self.session_id, "response_jws": self.response_jws}


@dataclass(frozen=True, slots=True)
class ResponsePayload(_Validated):
    """``response_jws`` payload (§6.2): a success (``result``) or, with ``is_error``, an error."""

    session_id: Json
    sequence: Json
    request_hash: Json
    status: Json
    result: Json
    error: Json
    timestamp: int
    is_error: bool = False

    @classmethod
    def parse(
        cls,
        obj: Any,
        *,
        error: ErrorType = AuthenticationFailed,
        expected: Mapping[str, Any] | None = None,
        is_error: bool | None = None,
    ) -> ResponsePayload:
        """Exact members (of an error payload when ``is_error``), ``expected``, integer timestamp.

        ``is_error`` None: whichever of the two member sets the object has.
        """
        if is_error is None:
            is_error = isinstance(obj, dict) and "error" in obj
        exact_members(obj, m.ERROR_PAYLOAD if is_error else m.RESPONSE_PAYLOAD, "response payload", error)
        _check_expected(obj, expected, error)
        ts = require_int(obj["timestamp"], "response timestamp", error=error)
        return _make(
            cls, obj["session_id"], obj["sequence"], obj["request_hash"], obj["status"],
            None if is_error else obj["result"], obj["error"] if is_error else None, ts, is_error,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "sequence": self.sequence,
            "request_hash": self.request_hash,
            "status": self.status,
        }
        if self.is_error:
            out["error"] = self.error
        else:
            out["result"] = self.result
        out["timestamp"] = self.timestamp
        return out
