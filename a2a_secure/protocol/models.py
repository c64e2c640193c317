"""Typed models of the messages of PROTOCOL.md §2, §5 and §6: raw dicts stop here.

Every model is a frozen, slotted dataclass built by ``parse(obj, error=...)``, which runs the
checks of the specification on the received JSON value *in the order the specification fixes*
(the tests check that order) and raises the error class the caller names: ``InvalidParams``
(-32602) for JSON-RPC ``params``, ``AuthenticationFailed`` (-32040) for a signed payload and
for a reply the client receives (§9). ``to_dict()`` gives the exact wire object back.

Constructing a model directly re-validates it through ``parse`` (``__post_init__``), so a
model cannot exist in a shape the wire would refuse; ``parse`` itself builds without that
second pass, because the intent path is hot.

Where to draw the line: a member the receiver *type-checks* today is typed here. A member of
a signed payload (or of a reply) that the receiver only *compares* with a value it already
holds (§3: "the receiver compares each member with the message's own fields and with its own
state") is kept as the JSON value received (typed :data:`Json`), and ``parse`` compares it
when given ``expected``. Comparison is stricter than a type check, and a type check in front
of it would change which failure a doubly-broken message reports, or (for numbers, where §1
equality makes ``1`` equal ``1.0``) what is accepted.

Hashes (``hello_hash``, ``challenge_hash``, ``hash_of(policy)``) are computed by the core on
the object *as received*; ``to_dict()`` gives an equal object back, but the core does not
rely on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InvalidParams,
    StaleTimestamp,
    UnsupportedVersion,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import Decoded, jws_decode_unverified
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.exactly_once import check_intent_id
from a2a_secure.protocol.policy import Policy
from a2a_secure.protocol.validate import (
    check_payload_matches,
    exact_members,
    is_fresh,
    json_equal,
    require_b64u_bytes,
    require_bool,
    require_did,
    require_hash,
    require_int,
    require_object,
    require_str,
)

__all__ = [
    "AcceptPayload",
    "AcceptPolicy",
    "Challenge",
    "CloseRequest",
    "ClosePayload",
    "ClosedMessage",
    "Constraints",
    "ErrorObject",
    "EventMessage",
    "EventPayload",
    "Hello",
    "Intent",
    "IntentRequest",
    "IntentResultMessage",
    "Json",
    "PolicyMessage",
    "PolicyPayload",
    "Proof",
    "ProofPayload",
    "PublicKeyEntry",
    "RequestPayload",
    "ResponsePayload",
    "SessionMessage",
    "SessionPayload",
]

Json = Any
"""A JSON value as received (a member the receiver compares rather than type-checks)."""

ErrorType = type[A2AError]
_M = TypeVar("_M")
_set = object.__setattr__
_ERROR_MEMBERS: Final = frozenset(("code", "message"))


_SETTERS: dict[type[Any], tuple[Callable[[Any, Any], None], ...]] = {}


def _make(cls: type[_M], *values: Any) -> _M:
    """Build an already-checked model without re-running ``__post_init__`` (hot path).

    Writes through the slot descriptors, as the frozen dataclass's own ``__init__`` does
    with ``object.__setattr__``, only cheaper.
    """
    obj = object.__new__(cls)
    setters = _SETTERS.get(cls)
    if setters is None:
        slots: tuple[str, ...] = cls.__slots__  # type: ignore[attr-defined]
        setters = _SETTERS[cls] = tuple(getattr(cls, name).__set__ for name in slots)
    for setter, value in zip(setters, values, strict=True):
        setter(obj, value)
    return obj


def _stale(what: str, ts: int, now: float) -> StaleTimestamp:
    return StaleTimestamp(f"{what} timestamp {ts} is not within 300 s of {int(now)}")


# A constructed (not parsed) token-carrying model decodes its token in ``__post_init__``.
_NOT_DECODED: Final[Decoded] = ({}, {}, b"", b"")


class _Validated:
    """Mixin: direct construction re-validates through ``parse`` on the wire form."""

    __slots__ = ()

    def __post_init__(self) -> None:
        type(self).parse(self.to_dict(), error=InvalidParams)  # type: ignore[attr-defined]


# -- §2 public key entries -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PublicKeyEntry(_Validated):
    """One ``public_keys`` entry: OKP / Ed25519 / EdDSA, a key id and the raw 32-byte key."""

    kid: str
    key: bytes

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> PublicKeyEntry:
        """Exact members, ``kid`` 1-2304 characters, fixed kty/crv/alg, strict 32-byte key."""
        exact_members(obj, m.KEY_ENTRY_MEMBERS, "public key entry", error)
        kid = require_str(obj["kid"], "public key kid", min_len=1, max_len=2304, error=error)
        if obj["kty"] != "OKP" or obj["crv"] != "Ed25519" or obj["alg"] != "EdDSA":
            raise error("public key entry must be OKP / Ed25519 / EdDSA")
        return _make(cls, kid, require_b64u_bytes(obj["key"], "public key", 32, error))

    @classmethod
    def parse_list(cls, value: Any, *, error: ErrorType = InvalidParams) -> tuple[PublicKeyEntry, ...]:
        """A ``public_keys`` list: 1 to 8 entries (§2)."""
        if not isinstance(value, list) or not 1 <= len(value) <= 8:
            raise error("public_keys must hold 1 to 8 entries")
        return tuple(cls.parse(entry, error=error) for entry in value)

    @staticmethod
    def pairs(entries: tuple[PublicKeyEntry, ...]) -> list[tuple[str, bytes]]:
        """(kid, key) pairs, as :func:`messages.bind_public_keys` takes them."""
        return [(e.kid, e.key) for e in entries]

    def to_dict(self) -> dict[str, Any]:
        """The wire entry."""
        return {
            "kid": self.kid,
            "kty": "OKP",
            "crv": "Ed25519",
            "alg": "EdDSA",
            "key": encoding.b64u_encode(self.key),
        }


def _keys_to_list(entries: tuple[PublicKeyEntry, ...]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in entries]


# -- §5.1 HELLO ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello(_Validated):
    """HELLO params (§5.1). ``agent_did`` is syntax-checked, ``nonce`` random and 32 bytes."""

    protocol_version: str
    agent_did: str
    agent_id: str
    manifest_hash: str
    nonce: str
    public_keys: tuple[PublicKeyEntry, ...]
    timestamp: int

    @classmethod
    def parse(
        cls,
        obj: Any,
        *,
        error: ErrorType = InvalidParams,
        now: float | None = None,
        on_agent_did: Callable[[str], object] | None = None,
    ) -> Hello:
        """The checks of §5.1 up to and including the DID syntax, in its order.

        ``now``: the receiver's clock; freshness (-32045) is checked where §5.1 puts it,
        between the other shapes and the DID syntax (skipped when None). ``on_agent_did`` is
        called with the claimed DID as soon as it is a string, so a later failure can still
        be audited with it.
        """
        p = require_object(obj, "params", error)
        if not isinstance(p.get("type"), str) or not isinstance(p.get("protocol_version"), str):
            raise error("hello needs string type and protocol_version")
        # §5.1: only "are strings" comes before the version; type == "hello" is one of the
        # "other shapes" checked after it.
        if p["protocol_version"] not in m.SUPPORTED_VERSIONS:
            raise UnsupportedVersion(
                "unsupported protocol version", data={"supported": list(m.SUPPORTED_VERSIONS)}
            )
        if p["type"] != "hello":
            raise error("params type must be 'hello'")
        exact_members(p, m.HELLO_MEMBERS, "hello", error)
        agent_did = require_str(p["agent_did"], "agent_did", min_len=1, max_len=2048, error=error)
        if on_agent_did is not None:
            on_agent_did(agent_did)
        agent_id = require_str(p["agent_id"], "agent_id", min_len=1, max_len=128, error=error)
        manifest_hash = require_hash(p["manifest_hash"], "manifest_hash", error)
        nonce_raw = require_b64u_bytes(p["nonce"], "nonce", m.NONCE_BYTES, error)
        if not any(nonce_raw):
            raise error("nonce must be random")
        keys = PublicKeyEntry.parse_list(p["public_keys"], error=error)
        ts = require_int(p["timestamp"], "timestamp", error=error)
        if now is not None and not is_fresh(ts, now):
            raise _stale("hello", ts, now)
        require_did(agent_did, "agent_did", error)
        return _make(cls, p["protocol_version"], agent_did, agent_id, manifest_hash, p["nonce"], keys, ts)

    def to_dict(self) -> dict[str, Any]:
        """The wire params."""
        return {
            "type": "hello",
            "protocol_version": self.protocol_version,
            "agent_did": self.agent_did,
            "agent_id": self.agent_id,
            "manifest_hash": self.manifest_hash,
            "nonce": self.nonce,
            "public_keys": _keys_to_list(self.public_keys),
            "timestamp": self.timestamp,
        }


# -- §5.2 CHALLENGE --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Challenge(_Validated):
    """CHALLENGE (§5.2) as the client checks it before the signature.

    ``policy_signature`` is the token as received: its form is checked when it is decoded
    (-32602, §3) and the rest by the signature check.
    """

    protocol_version: str
    nonce_b: str
    server_did: str
    manifest_hash: str
    public_keys: tuple[PublicKeyEntry, ...]
    policy_hash: str
    policy_signature: Json
    timestamp: int

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, server_did: str | None = None
    ) -> Challenge:
        """Exact members, type, version (-32046), ``server_did``, nonce, hashes, timestamp, keys.

        ``server_did``: the DID the client meant to reach, compared where §5.2 puts it;
        without it, ``server_did`` must merely be a DID.
        """
        exact_members(obj, m.CHALLENGE_MEMBERS, "challenge", error)
        if obj["type"] != "challenge":
            raise error("reply is not a challenge")
        if obj["protocol_version"] != m.PROTOCOL_VERSION:
            raise UnsupportedVersion("server chose a protocol version that was not offered")
        if server_did is not None:
            if obj["server_did"] != server_did:
                raise error("challenge comes from another DID than the one meant")
        else:
            require_did(obj["server_did"], "server_did", error)
        nonce_b = obj["nonce_b"]
        require_b64u_bytes(nonce_b, "nonce_b", m.NONCE_BYTES, error)
        manifest_hash = require_hash(obj["manifest_hash"], "manifest_hash", error)
        policy_hash = require_hash(obj["policy_hash"], "policy_hash", error)
        ts = require_int(obj["timestamp"], "timestamp", error=error)
        keys = PublicKeyEntry.parse_list(obj["public_keys"], error=error)
        return _make(
            cls, m.PROTOCOL_VERSION, nonce_b, obj["server_did"], manifest_hash, keys, policy_hash,
            obj["policy_signature"], ts,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The wire result."""
        return {
            "type": "challenge",
            "protocol_version": self.protocol_version,
            "nonce_b": self.nonce_b,
            "server_did": self.server_did,
            "manifest_hash": self.manifest_hash,
            "public_keys": _keys_to_list(self.public_keys),
            "policy_hash": self.policy_hash,
            "policy_signature": self.policy_signature,
            "timestamp": self.timestamp,
        }


def _check_expected(obj: Mapping[str, Any], expected: Mapping[str, Any] | None, error: ErrorType) -> None:
    if expected is not None:
        check_payload_matches(obj, expected, error)


@dataclass(frozen=True, slots=True)
class PolicyPayload(_Validated):
    """``policy_signature`` payload (§5.2): exact members, each compared by the client."""

    protocol_version: Json
    hello_hash: Json
    client_did: Json
    server_did: Json
    nonce_a: Json
    nonce_b: Json
    client_manifest_hash: Json
    server_manifest_hash: Json
    policy_hash: Json
    timestamp: Json

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> PolicyPayload:
        """Exact members, then (given ``expected``) every member equal to the client's value."""
        exact_members(obj, m.POLICY_PAYLOAD, "policy signature payload", error)
        _check_expected(obj, expected, error)
        return _make(cls, *(obj[name] for name in cls.__slots__))

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}


# -- §5.3 PROOF / §5.5 ACCEPT_POLICY params -----------------------------------------------------
def _parse_step(
    obj: Any, method: str, members: frozenset[str], jws_member: str, error: ErrorType
) -> tuple[str, str, Decoded]:
    p = require_object(obj, "params", error)
    if p.get("type") != method:
        raise error(f"params type must be {method!r}")
    exact_members(p, members, method, error)
    require_b64u_bytes(p["nonce_b"], "nonce_b", m.NONCE_BYTES, error)
    # A malformed token is -32602 whoever asks (§3); it is a shape, checked before any look-up.
    decoded = jws_decode_unverified(p[jws_member])
    return p["nonce_b"], p[jws_member], decoded


@dataclass(frozen=True, slots=True)
class Proof(_Validated):
    """PROOF params (§5.3); ``decoded`` is the split, unverified token."""

    nonce_b: str
    proof_jws: str
    decoded: Decoded = field(compare=False, repr=False, default=_NOT_DECODED)

    def __post_init__(self) -> None:
        _set(self, "decoded", type(self).parse(self.to_dict()).decoded)

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> Proof:
        """Type, exact members, nonce, token form."""
        return _make(cls, *_parse_step(obj, "proof", m.PROOF_MEMBERS, "proof_jws", error))

    def to_dict(self) -> dict[str, Any]:
        """The wire params."""
        return {"type": "proof", "nonce_b": self.nonce_b, "proof_jws": self.proof_jws}


@dataclass(frozen=True, slots=True)
class AcceptPolicy(_Validated):
    """ACCEPT_POLICY params (§5.5); ``decoded`` is the split, unverified token."""

    nonce_b: str
    accept_jws: str
    decoded: Decoded = field(compare=False, repr=False, default=_NOT_DECODED)

    def __post_init__(self) -> None:
        _set(self, "decoded", type(self).parse(self.to_dict()).decoded)

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = InvalidParams) -> AcceptPolicy:
        """Type, exact members, nonce, token form."""
        return _make(cls, *_parse_step(obj, "accept_policy", m.ACCEPT_MEMBERS, "accept_jws", error))

    def to_dict(self) -> dict[str, Any]:
        """The wire params."""
        return {"type": "accept_policy", "nonce_b": self.nonce_b, "accept_jws": self.accept_jws}


@dataclass(frozen=True, slots=True)
class ProofPayload(_Validated):
    """``proof_jws`` payload (§5.3): an integer timestamp, every other member compared."""

    nonce_a: Json
    nonce_b: Json
    client_did: Json
    server_did: Json
    client_manifest_hash: Json
    server_manifest_hash: Json
    challenge_hash: Json
    timestamp: int

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> ProofPayload:
        """Exact members, integer timestamp, then the members equal to ``expected``."""
        exact_members(obj, m.PROOF_PAYLOAD, "proof payload", error)
        require_int(obj["timestamp"], "proof timestamp", error=error)
        _check_expected(obj, expected, error)
        return _make(cls, *(obj[name] for name in cls.__slots__))

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class AcceptPayload(_Validated):
    """``accept_jws`` payload (§5.5): an integer timestamp, every other member compared."""

    policy_hash: Json
    session_commitment: Json
    nonce_a: Json
    nonce_b: Json
    client_did: Json
    server_did: Json
    timestamp: int

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> AcceptPayload:
        """Exact members, integer timestamp, then the members equal to ``expected``."""
        exact_members(obj, m.ACCEPT_PAYLOAD, "accept payload", error)
        require_int(obj["timestamp"], "accept timestamp", error=error)
        _check_expected(obj, expected, error)
        return _make(cls, *(obj[name] for name in cls.__slots__))

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}


# -- §5.4 POLICY, §5.6 SESSION ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PolicyMessage(_Validated):
    """POLICY result (§5.4): the policy parsed; hash and signature compared with the CHALLENGE's."""

    policy: Policy
    policy_hash: Json
    policy_signature: Json

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> PolicyMessage:
        """Exact members, type, the exact five-member policy."""
        exact_members(obj, m.POLICY_MSG_MEMBERS, "policy message", error)
        if obj["type"] != "policy":
            raise error("reply is not a policy")
        policy = Policy.from_dict(obj["policy"], error=error)
        return _make(cls, policy, obj["policy_hash"], obj["policy_signature"])

    def to_dict(self) -> dict[str, Any]:
        """The wire result."""
        return {
            "type": "policy",
            "policy": self.policy.to_dict(),
            "policy_hash": self.policy_hash,
            "policy_signature": self.policy_signature,
        }


@dataclass(frozen=True, slots=True)
class SessionMessage(_Validated):
    """SESSION result (§5.6) as the client checks it before the signature.

    ``server_did``, ``client_did`` and ``session_commitment`` are compared with the client's
    own values after the signature; ``session_jws`` is the token as received.
    """

    session_id: str
    server_did: Json
    client_did: Json
    session_commitment: Json
    created_at: int
    expires_at: int
    public_keys: tuple[PublicKeyEntry, ...]
    session_jws: Json

    @classmethod
    def parse(cls, obj: Any, *, error: ErrorType = AuthenticationFailed) -> SessionMessage:
        """Exact members, type, session id, the two integers, the keys."""
        exact_members(obj, m.SESSION_MEMBERS, "session", error)
        if obj["type"] != "session":
            raise error("reply is not a session")
        require_b64u_bytes(obj["session_id"], "session_id", m.SESSION_ID_BYTES, error)
        created = require_int(obj["created_at"], "created_at", error=error)
        expires = require_int(obj["expires_at"], "expires_at", error=error)
        keys = PublicKeyEntry.parse_list(obj["public_keys"], error=error)
        return _make(
            cls, obj["session_id"], obj["server_did"], obj["client_did"], obj["session_commitment"],
            created, expires, keys, obj["session_jws"],
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The wire result."""
        return {
            "type": "session",
            "session_id": self.session_id,
            "server_did": self.server_did,
            "client_did": self.client_did,
            "session_commitment": self.session_commitment,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "public_keys": _keys_to_list(self.public_keys),
            "session_jws": self.session_jws,
        }


@dataclass(frozen=True, slots=True)
class SessionPayload(_Validated):
    """``session_jws`` payload (§5.6): exact members, each compared by the client."""

    session_id: Json
    session_commitment: Json
    client_did: Json
    server_did: Json
    created_at: Json
    expires_at: Json

    @classmethod
    def parse(
        cls, obj: Any, *, error: ErrorType = AuthenticationFailed, expected: Mapping[str, Any] | None = None
    ) -> SessionPayload:
        """Exact members, then (given ``expected``) every member equal to the client's value."""
        exact_members(obj, m.SESSION_PAYLOAD, "session payload", error)
        _check_expected(obj, expected, error)
        return _make(cls, *(obj[name] for name in cls.__slots__))

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}


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
    """

    goal: str
    inputs: dict[str, Any]
    domain: str | None = None
    constraints: Constraints | None = None
    intent_id: str | None = None  # the intent_id extension (protocol/exactly_once.py)

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
        intent_id = None
        if "intent_id" in intent:
            intent_id = check_intent_id(intent["intent_id"], error)
        return _make(cls, goal, inputs, domain, constraints, intent_id)

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
        if self.intent_id is not None:
            out["intent_id"] = self.intent_id
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


# -- §6.2 / §6.3 / §6.4 answers ----------------------------------------------------------------
def _require_token(obj: Mapping[str, Any], what: str, error: ErrorType) -> str:
    token = obj["response_jws"]
    if not isinstance(token, str):
        raise error(f"{what}response_jws missing")
    return token


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
    ) -> EventPayload:
        """The client's checks of §6.4 in order: members, ``expected``, equal to ``event``,
        ``index``, ``final``, status, the final rule, timestamp."""
        is_error = event.is_error if event is not None else isinstance(obj, dict) and "error" in obj
        exact_members(obj, m.EVENT_ERROR_PAYLOAD if is_error else m.EVENT_PAYLOAD, "event payload", error)
        _check_expected(obj, expected, error)
        if event is not None:
            for name in ("sequence", "index", "final", "status", "error" if is_error else "result"):
                if not json_equal(obj[name], getattr(event, name)):
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
