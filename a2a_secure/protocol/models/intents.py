"""The intent messages of PROTOCOL.md §6.1.

The intent and its constraints, the ``intent`` and ``close`` requests and the payloads their
signatures cover.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.delegation import check_member as check_delegation
from a2a_secure.errors import AuthenticationFailed, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import Decoded, jws_decode_unverified
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.intent_id import check_intent_id
from a2a_secure.protocol.models._base import (
    _NOT_DECODED,
    ErrorType,
    Json,
    _check_expected,
    _make,
    _set,
    _Validated,
)
from a2a_secure.protocol.priority import check_priority
from a2a_secure.protocol.validate import (
    exact_members,
    require_b64u_bytes,
    require_bool,
    require_hash,
    require_int,
    require_object,
    require_str,
)

# The longest sealed chain taken (§12.6): a chain of §12.7 (16 KiB of tokens at most, and its
# JSON punctuation) sealed and in base64url is below it; anything longer is refused unread.
MAX_SEALED_CHAIN = 32_768

__all__ = [
    "MAX_SEALED_CHAIN",
    "ClosePayload",
    "CloseRequest",
    "Constraints",
    "Intent",
    "IntentRequest",
    "RequestPayload",
    "sealed_inputs_bytes",
]


def sealed_inputs_bytes(value: Any, error: ErrorType = InvalidParams) -> bytes:
    """The bytes of an ``intent.sealed`` member (§12.6, step 1), else ``error``: canonical
    base64url of at most 2 MiB of text, and of at least 18 bytes (an AEAD tag, 16 bytes, over
    at least ``{}``: anything shorter cannot be sealed inputs).

    The one check of the member, for :meth:`Intent.parse` and the common intent's flat path.
    """
    sealed = require_str(value, "intent sealed", min_len=1, max_len=1 << 21, error=error)
    data = encoding.b64u_decode(sealed, error=error)
    if len(data) < 18:
        raise error("intent sealed is too short to hold sealed inputs")
    return data


# -- §6.1 intents --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Constraints(_Validated):
    """``intent.constraints`` (§6.1, §6.4); None means the member is absent."""

    timeout_ms: int | None = None
    max_tokens: int | None = None
    stream: bool | None = None

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> Constraints:
        """An object with only known members: positive integers and a boolean (§9)."""
        constraints = require_object(obj, "intent constraints", error)
        unknown = constraints.keys() - m.CONSTRAINT_MEMBERS
        if unknown:
            raise error(f"unknown constraint {sorted(unknown)[0][:64]!r}")
        values: list[Any] = []
        for name in ("timeout_ms", "max_tokens"):
            value = constraints.get(name)
            if name in constraints:
                require_int(value, f"constraints {name}", minimum=1, error=error)
            values.append(value)
        stream = constraints.get("stream")
        if "stream" in constraints:
            require_bool(stream, "constraints stream", error)
        return _make(cls, values[0], values[1], stream)

    def to_dict(self) -> dict[str, Any]:
        """The wire object: only the members present."""
        out: dict[str, Any] = {}
        if self.timeout_ms is not None:
            out["timeout_ms"] = self.timeout_ms
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.stream is not None:
            out["stream"] = self.stream
        return out


@dataclass(frozen=True, slots=True)
class Intent(_Validated):
    """``intent`` (§6.1): ``goal`` and ``inputs`` required; ``domain``/``constraints`` None when absent.

    ``inputs`` is the application's JSON object, handed to the handler as received.
    ``priority`` (§12.3) is None when absent (the default, 3).
    """

    goal: str
    inputs: dict[str, Any]
    domain: str | None = None
    constraints: Constraints | None = None
    priority: int | None = None
    intent_id: str | None = None  # the intent_id extension (protocol/intent_id.py)
    sealed: str | None = None  # sealed intents (protocol/sealing.py): the sealed inputs
    # ... and its bytes, decoded once at step 1 (base64url costs more than the AEAD).
    sealed_bytes: bytes = field(default=b"", compare=False, repr=False)
    sealed_key: str | None = None  # sealed intents with an intent_id: the sealed answer key
    # The delegation extension (a2a_secure/delegation.py): a chain of tokens, or a chain's hash.
    delegation: tuple[str, ...] | str | None = None
    # ... or, on a sealed session, the same value sealed (§12.6, part ``delegation``).
    sealed_delegation: str | None = None

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> Intent:
        """Unknown members, required members, then each member's shape (-32602)."""
        intent = require_object(obj, "intent", error)
        extra = intent.keys() - m.INTENT_MEMBERS
        if extra:
            raise error(f"intent: unexpected member {sorted(extra)[0][:64]!r}")
        if "goal" not in intent or "inputs" not in intent:
            raise error("intent needs goal and inputs")
        goal = require_str(intent["goal"], "intent goal", min_len=1, max_len=128, error=error)
        inputs = require_object(intent["inputs"], "intent inputs", error)
        domain = intent.get("domain")
        if "domain" in intent:
            require_str(domain, "intent domain", max_len=128, error=error)
        constraints = None
        if "constraints" in intent:
            constraints = Constraints.parse(intent["constraints"], error=error)
        priority = None
        if "priority" in intent:  # §12.3
            priority = check_priority(intent["priority"], error)
        intent_id = None
        if "intent_id" in intent:
            intent_id = check_intent_id(intent["intent_id"], error)
        sealed, sealed_bytes = None, b""
        if "sealed" in intent:  # §12.6: the inputs travel sealed, and the plain member is {}
            sealed = intent["sealed"]
            sealed_bytes = sealed_inputs_bytes(sealed, error)
            if inputs:
                raise error("intent inputs must be {} when the inputs are sealed")
        sealed_key = None
        if "sealed_key" in intent:  # §12.6: a 32-byte key and its 16-byte tag
            sealed_key = intent["sealed_key"]
            require_b64u_bytes(sealed_key, "intent sealed_key", 48, error)
            if sealed is None:
                raise error("intent sealed_key needs sealed inputs")
        delegation = None
        if "delegation" in intent:
            delegation = check_delegation(intent["delegation"], error)
        sealed_delegation = None
        if "sealed_delegation" in intent:  # §12.6: the chain sealed, next to the sealed inputs
            sealed_delegation = intent["sealed_delegation"]
            what = "intent sealed_delegation"
            require_str(sealed_delegation, what, min_len=1, max_len=MAX_SEALED_CHAIN, error=error)
            if len(encoding.b64u_decode(sealed_delegation, error=error)) < 18:
                raise error("intent sealed_delegation is too short to hold a sealed chain")
            if sealed is None:
                raise error("intent sealed_delegation needs sealed inputs")
            if delegation is not None:
                raise error("intent has both delegation and sealed_delegation")
        return _make(
            cls,
            goal,
            inputs,
            domain,
            constraints,
            priority,
            intent_id,
            sealed,
            sealed_bytes,
            sealed_key,
            delegation,
            sealed_delegation,
        )

    @property
    def constraints_dict(self) -> dict[str, Any]:
        """The constraints as the wire has them (``{}`` when absent)."""
        return {} if self.constraints is None else self.constraints.to_dict()

    @property
    def stream(self) -> bool | None:
        """``constraints.stream``, None when absent."""
        return None if self.constraints is None else self.constraints.stream

    def to_dict(self) -> dict[str, Any]:
        """The wire object: ``domain`` and ``constraints`` only when present."""
        out: dict[str, Any] = {"goal": self.goal, "inputs": self.inputs}
        if self.domain is not None:
            out["domain"] = self.domain
        if self.constraints is not None:
            out["constraints"] = self.constraints.to_dict()
        if self.priority is not None:
            out["priority"] = self.priority
        if self.intent_id is not None:
            out["intent_id"] = self.intent_id
        if self.sealed is not None:
            out["sealed"] = self.sealed
        if self.sealed_key is not None:
            out["sealed_key"] = self.sealed_key
        if self.delegation is not None:
            d = self.delegation
            out["delegation"] = d if isinstance(d, str) else list(d)
        if self.sealed_delegation is not None:
            out["sealed_delegation"] = self.sealed_delegation
        return out


def _parse_request(
    obj: Any, method: str, members: frozenset[str], error: ErrorType, *, with_intent: bool
) -> tuple[Any, ...]:
    p = require_object(obj, "params", error)
    exact_members(p, members, method, error)
    session_id = p["session_id"]
    require_b64u_bytes(session_id, "session_id", m.SESSION_ID_BYTES, error)
    commitment = require_hash(p["session_commitment"], "session_commitment", error)
    sequence = require_int(p["sequence"], "sequence", minimum=1, error=error)
    intent = Intent.parse(p["intent"], error=error) if with_intent else None
    token = p["request_jws"]
    decoded = jws_decode_unverified(token)
    return session_id, commitment, sequence, intent, token, decoded


@dataclass(frozen=True, slots=True)
class IntentRequest(_Validated):
    """Params of method ``intent`` (§6.1 step 1); ``decoded`` is the split, unverified token."""

    session_id: str
    session_commitment: str
    sequence: int
    intent: Intent
    request_jws: str
    decoded: Decoded = field(compare=False, repr=False, default=_NOT_DECODED)

    def __post_init__(self) -> None:
        _set(self, "decoded", type(self).parse(self.to_dict()).decoded)

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> IntentRequest:
        """Exact members, session id, commitment, sequence, intent, token form."""
        return _make(cls, *_parse_request(obj, "intent", m.INTENT_PARAMS, error, with_intent=True))

    def to_dict(self) -> dict[str, Any]:
        """The wire params."""
        return {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "sequence": self.sequence,
            "intent": self.intent.to_dict(),
            "request_jws": self.request_jws,
        }


@dataclass(frozen=True, slots=True)
class CloseRequest(_Validated):
    """Params of method ``close`` (§6.3); ``decoded`` is the split, unverified token."""

    session_id: str
    session_commitment: str
    sequence: int
    request_jws: str
    decoded: Decoded = field(compare=False, repr=False, default=_NOT_DECODED)

    def __post_init__(self) -> None:
        _set(self, "decoded", type(self).parse(self.to_dict()).decoded)

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> CloseRequest:
        """Exact members, session id, commitment, sequence, token form."""
        sid, commitment, seq, _intent, token, decoded = _parse_request(
            obj, "close", m.CLOSE_PARAMS, error, with_intent=False
        )
        return _make(cls, sid, commitment, seq, token, decoded)

    @property
    def intent(self) -> None:
        """A close carries no intent."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The wire params."""
        return {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "sequence": self.sequence,
            "request_jws": self.request_jws,
        }


@dataclass(frozen=True, slots=True)
class RequestPayload(_Validated):
    """``request_jws`` payload of an intent (§6.1 step 5)."""

    session_id: Json
    session_commitment: Json
    sequence: int
    timestamp: int
    intent: Json

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> RequestPayload:
        """Exact members, signed sequence and timestamp, then the members equal to ``expected``."""
        exact_members(obj, m.REQUEST_PAYLOAD, "request payload", error)
        sequence = require_int(obj["sequence"], "signed sequence", minimum=1, error=error)
        ts = require_int(obj["timestamp"], "signed timestamp", error=error)
        _check_expected(obj, expected, error)
        return _make(cls, obj["session_id"], obj["session_commitment"], sequence, ts, obj["intent"])

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class ClosePayload(_Validated):
    """``request_jws`` payload of a close (§6.3): ``close`` is ``true``."""

    session_id: Json
    session_commitment: Json
    sequence: int
    timestamp: int

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> ClosePayload:
        """Exact members, signed sequence and timestamp, ``close: true``, then ``expected``."""
        exact_members(obj, m.CLOSE_PAYLOAD, "request payload", error)
        sequence = require_int(obj["sequence"], "signed sequence", minimum=1, error=error)
        ts = require_int(obj["timestamp"], "signed timestamp", error=error)
        if obj["close"] is not True:
            raise error("signed close must be true")
        _check_expected(obj, expected, error)
        return _make(cls, obj["session_id"], obj["session_commitment"], sequence, ts)

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "sequence": self.sequence,
            "timestamp": self.timestamp,
            "close": True,
        }
