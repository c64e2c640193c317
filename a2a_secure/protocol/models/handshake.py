"""The handshake messages of PROTOCOL.md §2 and §5.

Public key entries, HELLO, CHALLENGE, POLICY, PROOF, ACCEPT_POLICY, SESSION and the
payloads their signatures cover.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.errors import AuthenticationFailed, InvalidParams, UnsupportedVersion
from a2a_secure.identity import encoding
from a2a_secure.identity.did import check_did_syntax
from a2a_secure.identity.jws import Decoded, jws_decode_unverified
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.models._base import (
    _NOT_DECODED,
    ErrorType,
    Json,
    _check_expected,
    _make,
    _set,
    _stale,
    _Validated,
)
from a2a_secure.protocol.validate import (
    exact_members,
    is_fresh,
    require_b64u_bytes,
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
    "Hello",
    "PolicyMessage",
    "PolicyPayload",
    "Proof",
    "ProofPayload",
    "PublicKeyEntry",
    "SessionMessage",
    "SessionPayload",
]


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
                # Both named, so that a mistyped DID is seen at once; the peer's is checked
                # as a DID first (its text goes into a message a terminal may show).
                try:
                    shown = check_did_syntax(obj["server_did"])[:128]
                except InvalidParams:
                    shown = "something that is not a DID"
                raise error(
                    f"challenge comes from another DID than the one meant: the agent there is {shown},"
                    f" not {server_did[:128]}"
                )
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
        cls,
        obj: Any,
        *,
        error: ErrorType = AuthenticationFailed,
        expected: Mapping[str, Any] | None = None,
        optional: frozenset[str] = frozenset(),
    ) -> AcceptPayload:
        """Exact members, integer timestamp, then the members equal to ``expected``.

        ``optional``: extension members (§12) this receiver takes when present.
        """
        present = optional & obj.keys() if isinstance(obj, dict) else frozenset()
        exact_members(obj, m.ACCEPT_PAYLOAD | present, "accept payload", error)
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
        cls,
        obj: Any,
        *,
        error: ErrorType = AuthenticationFailed,
        expected: Mapping[str, Any] | None = None,
        extra: frozenset[str] = frozenset(),
    ) -> SessionPayload:
        """Exact members, then (given ``expected``) every member equal to the client's value.

        ``extra``: the extension members (§12) the payload must carry as well.
        """
        exact_members(obj, m.SESSION_PAYLOAD | extra, "session payload", error)
        _check_expected(obj, expected, error)
        return _make(cls, *(obj[name] for name in cls.__slots__))

    def to_dict(self) -> dict[str, Any]:
        """The signed object."""
        return {name: getattr(self, name) for name in self.__slots__}
