"""The §8 audit record (PROTOCOL.md §8): its members, their limits and its JSON line form.

:class:`AuditEvent` has no member for intent inputs, results, tokens or credentials, so none
of those can be recorded by mistake; members that may come from a peer are sanitized rather
than refused, so hostile input cannot make auditing fail.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from a2a_secure.errors import A2AError
from a2a_secure.identity import encoding
from a2a_secure.identity.did import MAX_DID_LENGTH

__all__ = [
    "AUDIT_JWS_TYP",
    "DELEGATION_MEMBERS",
    "EVENTS",
    "MAX_UNVERIFIED_LENGTH",
    "RECORD_MEMBERS",
    "ZERO_HASH",
    "AuditEvent",
    "AuditRecord",
]

AUDIT_JWS_TYP = "a2a-audit+jws"
ZERO_HASH = "sha256:" + "0" * 64
MAX_UNVERIFIED_LENGTH = 256
# Authenticated strings are already bounded by the protocol (DIDs <= 2048, goals <= 128);
# this cap only keeps a bug elsewhere from writing megabyte lines.
MAX_VERIFIED_LENGTH = MAX_DID_LENGTH
MAX_INT = encoding.MAX_SAFE_INT

Role = Literal["client", "server"]
EventName = Literal[
    "hello",
    "proof",
    "accept_policy",
    "intent",
    "close",
    "reject",
    # Key lifecycle (docs/PROTOCOL.md §12.4): client_did holds the DID or key id concerned,
    # server_did the successor DID of a followed rotation or the rotated agent's new DID.
    "rotate",
    "revoke",
    "unrevoke",
    "follow_rotation",
    # an action's life under human approval (PROTOCOL.md §12)
    "action_created",
    "action_approved",
    "action_rejected",
    "action_refused",
    "action_executed",
    "action_failed",
]
Status = Literal["success", "error"]

EVENTS: frozenset[str] = frozenset(get_args(EventName))
_ROLES = frozenset(("client", "server"))
_STATUSES = frozenset(("success", "error"))
_STRING_FIELDS = ("session_id", "client_did", "server_did", "intent_goal")

#: The members of a record line, in the order they are written.
RECORD_MEMBERS: tuple[str, ...] = (
    "timestamp",
    "event",
    "role",
    "session_id",
    "client_did",
    "server_did",
    "intent_goal",
    "sequence",
    "status",
    "duration_ms",
    "error_code",
    "verified",
    "prev_hash",
)
#: Members of the record of an intent that acted under a delegation chain (PROTOCOL.md
#: §12.7), after ``verified``: the chain's principal and its name. Absent from every other
#: record, so a log without delegation is the base contract's, byte for byte.
DELEGATION_MEMBERS: tuple[str, ...] = ("principal", "delegation")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _clean_string(value: object, limit: int) -> str | None:
    """``value`` cut to ``limit`` code points, lone surrogates replaced; None for a non-string."""
    if not isinstance(value, str):
        return None
    value = value[:limit]
    # A lone surrogate cannot be written as UTF-8 and is refused by I-JSON readers.
    return _SURROGATE_RE.sub("\ufffd", value)


def _number(value: object, name: str, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite non-negative number")
    return number


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One audit record of PROTOCOL.md §8: only these members exist, keyword-only.

    Members that come from the SDK itself (``event``, ``role``, ``status``, ``verified``,
    ``timestamp``, ``duration_ms``, ``error_code``) are checked and a wrong value is a
    ``TypeError``/``ValueError`` (a bug). Members that may come from a peer (``session_id``,
    the DIDs, ``intent_goal``, ``sequence``) are sanitized instead, so hostile input cannot
    make auditing fail: a value of the wrong type becomes ``None``, a ``sequence`` outside
    0…2^53−1 becomes ``None``, lone surrogates become U+FFFD, and when ``verified`` is false
    every string is cut to 256 characters (2048 when verified).
    """

    timestamp: float
    event: EventName
    role: Role
    status: Status
    verified: bool = False
    session_id: str | None = None
    client_did: str | None = None
    server_did: str | None = None
    intent_goal: str | None = None
    sequence: int | None = None
    duration_ms: float | None = None
    error_code: int | None = None
    principal: str | None = None  # §12.7: on whose behalf, from a verified chain
    delegation: str | None = None  # §12.7: the chain's name (the hash of its last link)

    def __post_init__(self) -> None:
        put = object.__setattr__
        if self.event not in EVENTS:
            raise ValueError(f"audit event must be one of {sorted(EVENTS)}")
        if self.role not in _ROLES:
            raise ValueError("audit role must be 'client' or 'server'")
        if self.status not in _STATUSES:
            raise ValueError("audit status must be 'success' or 'error'")
        if type(self.verified) is not bool:
            raise TypeError("verified must be a bool")
        put(self, "timestamp", _number(self.timestamp, "timestamp", optional=False))
        duration = _number(self.duration_ms, "duration_ms", optional=True)
        put(self, "duration_ms", None if duration is None else round(duration, 3))
        if self.error_code is not None and (
            type(self.error_code) is not int or not -MAX_INT <= self.error_code <= MAX_INT
        ):
            raise TypeError("error_code must be an int or None")
        limit = MAX_VERIFIED_LENGTH if self.verified else MAX_UNVERIFIED_LENGTH
        for name in (*_STRING_FIELDS, *DELEGATION_MEMBERS):
            put(self, name, _clean_string(getattr(self, name), limit))
        seq = self.sequence
        if type(seq) is not int or not 0 <= seq <= MAX_INT:
            put(self, "sequence", None)

    def to_dict(self) -> dict[str, Any]:
        """The record's members in the order of :data:`RECORD_MEMBERS` (without ``prev_hash``),
        and :data:`DELEGATION_MEMBERS` when the record names a principal."""
        out = {
            "timestamp": self.timestamp,
            "event": self.event,
            "role": self.role,
            "session_id": self.session_id,
            "client_did": self.client_did,
            "server_did": self.server_did,
            "intent_goal": self.intent_goal,
            "sequence": self.sequence,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "error_code": self.error_code,
            "verified": self.verified,
        }
        if self.principal is not None or self.delegation is not None:
            out["principal"] = self.principal
            out["delegation"] = self.delegation
        return out

    def to_json(self) -> str:
        """The record as one line of compact ASCII JSON."""
        return _json_text(self.to_dict())


#: The builder of §8 records is :class:`AuditEvent` itself (frozen, keyword-only).
AuditRecord = AuditEvent


def _json_text(obj: Mapping[str, Any]) -> str:
    # ASCII keeps every line free of raw control or separator characters.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _parse_object(line: bytes) -> dict[str, Any] | None:
    """The line as a JSON object, or None when it is not one (a torn line)."""
    try:
        value = encoding.loads(line)
    except A2AError:
        return None
    return value if isinstance(value, dict) else None
