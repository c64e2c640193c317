"""The streamed events of PROTOCOL.md §6.4.

One event's ``result`` object and the payload its signature covers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
from a2a_secure.protocol.validate import exact_members, json_equal, require_int

__all__ = ["EventMessage", "EventPayload"]


@dataclass(frozen=True, slots=True)
class EventMessage(_Validated):
    """One streamed event's ``result`` object (§6.4) before verification."""

    status: Json
    sequence: Json
    index: Json
    final: Json
    result: Json
    error: Json
    response_jws: str
    is_error: bool = False

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> EventMessage:
        """An object with the members of a result event or of an error event, a string token."""
        if not isinstance(obj, dict):
            raise error("event is not an object")
        is_error = "error" in obj
        exact_members(obj, m.EVENT_ERROR_MEMBERS if is_error else m.EVENT_MEMBERS, "event", error)
        token = _require_token(obj, "event ", error)
        return _make(
            cls, obj["status"], obj["sequence"], obj["index"], obj["final"],
            None if is_error else obj["result"], obj["error"] if is_error else None, token, is_error,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The wire object."""
        out: dict[str, Any] = {"status": self.status, "sequence": self.sequence, "index": self.index}
        out["final"] = self.final
        if self.is_error:
            out["error"] = self.error
        else:
            out["result"] = self.result
        out["response_jws"] = self.response_jws
        return out


@dataclass(frozen=True, slots=True)
class EventPayload(_Validated):
    """``a2a-event+jws`` payload (§6.4): an integer ``index``, a boolean ``final``, a status
    that matches the body, errors always final, an integer timestamp."""

    session_id: Json
    sequence: Json
    request_hash: Json
    index: int
    final: bool
    status: str
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
        event: EventMessage | None = None,
        index: int | None = None,
        sealed: bool = False,
    ) -> EventPayload:
        """The client's checks of §6.4 in order: members, ``expected``, equal to ``event``,
        ``index``, ``final``, status, the final rule, timestamp.

        ``sealed`` (§12.6): a string ``result`` of ``event`` is signed by its digest.
        """
        is_error = event.is_error if event is not None else isinstance(obj, dict) and "error" in obj
        exact_members(obj, m.EVENT_ERROR_PAYLOAD if is_error else m.EVENT_PAYLOAD, "event payload", error)
        _check_expected(obj, expected, error)
        if event is not None:
            for name in ("sequence", "index", "final", "status", "error" if is_error else "result"):
                mine = getattr(event, name)
                if sealed and name == "result" and isinstance(mine, str):
                    mine = m.sealed_digest(mine)
                if not json_equal(obj[name], mine):
                    raise error(f"event {name} differs from the signed one")
        signed_index = obj["index"]
        if type(signed_index) is not int or (index is not None and signed_index != index):
            where = index if index is not None else "an integer"
            raise error(f"event index {signed_index!r} where {where} was expected")
        final = obj["final"]
        if type(final) is not bool:
            raise error("event final must be a boolean")
        status = obj["status"]
        if status != ("error" if is_error else "success"):
            raise error("event status does not match its body")
        if is_error and not final:
            raise error("an error event must be final")
        ts = require_int(obj["timestamp"], "event timestamp", error=error)
        return _make(
            cls, obj["session_id"], obj["sequence"], obj["request_hash"], signed_index, final, status,
            None if is_error else obj["result"], obj["error"] if is_error else None, ts, is_error,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "sequence": self.sequence,
            "request_hash": self.request_hash,
            "index": self.index,
            "final": self.final,
            "status": self.status,
        }
        if self.is_error:
            out["error"] = self.error
        else:
            out["result"] = self.result
        out["timestamp"] = self.timestamp
        return out
