"""Message names, ``typ`` values, member sets and the shared pieces of PROTOCOL.md §2–§6."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from a2a_secure.errors import A2AError, AuthenticationFailed, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.resolver import ResolvedDID
from a2a_secure.protocol.validate import exact_members, require_b64u_bytes, require_str

__all__ = [
    "PROTOCOL_NAME",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "Typ",
    "bind_public_keys",
    "client_manifest_hash",
    "request_hash",
    "sealed_digest",
    "session_commitment",
]

PROTOCOL_NAME: Final = "a2a-secure/1.0"
PROTOCOL_VERSION: Final = "1.0"
SUPPORTED_VERSIONS: Final = ("1.0",)
NONCE_BYTES: Final = 32
SESSION_ID_BYTES: Final = 32
PENDING_LIFETIME: Final = 60


class Typ:
    """The JWS ``typ`` of every signature kind (PROTOCOL.md §3): domain separation."""

    POLICY: Final = "a2a-policy+jws"
    PROOF: Final = "a2a-proof+jws"
    ACCEPT: Final = "a2a-accept+jws"
    SESSION: Final = "a2a-session+jws"
    REQUEST: Final = "a2a-request+jws"
    CLOSE: Final = "a2a-close+jws"
    RESPONSE: Final = "a2a-response+jws"
    EVENT: Final = "a2a-event+jws"
    AUDIT: Final = "a2a-audit+jws"
    REFUSAL: Final = "a2a-refusal+jws"  # §12.6: a session refused for want of seal keys


HELLO_MEMBERS: Final = frozenset(
    (
        "type",
        "protocol_version",
        "agent_did",
        "agent_id",
        "manifest_hash",
        "nonce",
        "public_keys",
        "timestamp",
    )
)
CHALLENGE_MEMBERS: Final = frozenset(
    (
        "type",
        "protocol_version",
        "nonce_b",
        "server_did",
        "manifest_hash",
        "public_keys",
        "policy_hash",
        "policy_signature",
        "timestamp",
    )
)
POLICY_PAYLOAD: Final = frozenset(
    (
        "protocol_version",
        "hello_hash",
        "client_did",
        "server_did",
        "nonce_a",
        "nonce_b",
        "client_manifest_hash",
        "server_manifest_hash",
        "policy_hash",
        "timestamp",
    )
)
PROOF_MEMBERS: Final = frozenset(("type", "nonce_b", "proof_jws"))
PROOF_PAYLOAD: Final = frozenset(
    (
        "nonce_a",
        "nonce_b",
        "client_did",
        "server_did",
        "client_manifest_hash",
        "server_manifest_hash",
        "challenge_hash",
        "timestamp",
    )
)
POLICY_MSG_MEMBERS: Final = frozenset(("type", "policy", "policy_hash", "policy_signature"))
ACCEPT_MEMBERS: Final = frozenset(("type", "nonce_b", "accept_jws"))
ACCEPT_PAYLOAD: Final = frozenset(
    ("policy_hash", "session_commitment", "nonce_a", "nonce_b", "client_did", "server_did", "timestamp")
)
SESSION_MEMBERS: Final = frozenset(
    (
        "type",
        "session_id",
        "server_did",
        "client_did",
        "session_commitment",
        "created_at",
        "expires_at",
        "public_keys",
        "session_jws",
    )
)
SESSION_PAYLOAD: Final = frozenset(
    ("session_id", "session_commitment", "client_did", "server_did", "created_at", "expires_at")
)
INTENT_PARAMS: Final = frozenset(("session_id", "session_commitment", "sequence", "intent", "request_jws"))
REQUEST_PAYLOAD: Final = frozenset(("session_id", "session_commitment", "sequence", "timestamp", "intent"))
CLOSE_PARAMS: Final = frozenset(("session_id", "session_commitment", "sequence", "request_jws"))
CLOSE_PAYLOAD: Final = frozenset(("session_id", "session_commitment", "sequence", "timestamp", "close"))
RESULT_MEMBERS: Final = frozenset(("status", "sequence", "result", "response_jws"))
RESPONSE_PAYLOAD: Final = frozenset(
    ("session_id", "sequence", "request_hash", "status", "result", "timestamp")
)
ERROR_PAYLOAD: Final = frozenset(("session_id", "sequence", "request_hash", "status", "error", "timestamp"))
EVENT_MEMBERS: Final = frozenset(("status", "sequence", "index", "final", "result", "response_jws"))
EVENT_ERROR_MEMBERS: Final = frozenset(("status", "sequence", "index", "final", "error", "response_jws"))
EVENT_PAYLOAD: Final = frozenset(
    ("session_id", "sequence", "request_hash", "index", "final", "status", "result", "timestamp")
)
EVENT_ERROR_PAYLOAD: Final = frozenset(
    ("session_id", "sequence", "request_hash", "index", "final", "status", "error", "timestamp")
)
CLOSED_MEMBERS: Final = frozenset(("type", "session_id", "response_jws"))
# "intent_id": the intent_id extension (PROTOCOL.md §12.5), refused by a server
# that does not declare it; "priority": PROTOCOL.md §12.3.
INTENT_MEMBERS: Final = frozenset(
    (
        "goal",
        "domain",
        "inputs",
        "constraints",
        "priority",
        "intent_id",
        "sealed",
        "sealed_key",
        "delegation",
        "sealed_delegation",
    )
)
CONSTRAINT_MEMBERS: Final = frozenset(("timeout_ms", "max_tokens", "stream"))
KEY_ENTRY_MEMBERS: Final = frozenset(("kid", "kty", "crv", "alg", "key"))


def session_commitment(nonce_a: str, nonce_b: str, policy_hash: str) -> str:
    """``sha256:`` + hex(SHA-256(UTF8(nonce_a | nonce_b | policy_hash))) (§5.5)."""
    return encoding.hash_bytes(f"{nonce_a}|{nonce_b}|{policy_hash}".encode())


def request_hash(request_jws: str) -> str:
    """``sha256:`` + hex(SHA-256(ASCII(request_jws))) (§6.2)."""
    return "sha256:" + hashlib.sha256(request_jws.encode("ascii")).hexdigest()


def sealed_digest(sealed: str) -> str:
    """``sha256:`` + hex(SHA-256(UTF-8(sealed))): a sealed value as its signed payload has it (§12.6).

    Total over ``str`` (a peer's malformed value gets a digest that matches nothing).
    """
    return "sha256:" + hashlib.sha256(sealed.encode("utf-8", "surrogatepass")).hexdigest()


def client_manifest_hash(agent_id: str, did: str, card: Mapping[str, Any] | None = None) -> str:
    """A client's manifest hash: of its card if it has one, else of ``{agent_id, did}`` (§4)."""
    if card is not None:
        return encoding.hash_of(dict(card))
    return encoding.hash_of({"agent_id": agent_id, "did": did})


def parse_public_keys(value: Any, error: type[A2AError] = InvalidParams) -> list[tuple[str, bytes]]:
    """Shape of a ``public_keys`` list: 1-8 exact entries (§2). Returns (kid, raw key) pairs."""
    if not isinstance(value, list) or not 1 <= len(value) <= 8:
        raise error("public_keys must hold 1 to 8 entries")
    out: list[tuple[str, bytes]] = []
    for entry in value:
        exact_members(entry, KEY_ENTRY_MEMBERS, "public key entry", error)
        kid = require_str(entry["kid"], "public key kid", min_len=1, max_len=2304, error=error)
        if entry["kty"] != "OKP" or entry["crv"] != "Ed25519" or entry["alg"] != "EdDSA":
            raise error("public key entry must be OKP / Ed25519 / EdDSA")
        out.append((kid, require_b64u_bytes(entry["key"], "public key", 32, error)))
    return out


def bind_public_keys(entries: list[tuple[str, bytes]], resolved: ResolvedDID) -> dict[str, bytes]:
    """Check every entry against the DID's resolution (§2); return the bound keys.

    A key that merely appears in ``public_keys`` is never trusted on its own: each ``kid``
    must be a key id of the sender's DID and each key the one the DID resolves to for it.
    """
    bound: dict[str, bytes] = {}
    for kid, key in entries:
        if not kid.startswith(resolved.did + "#"):
            raise AuthenticationFailed("public key kid is not a key id of the sender's DID")
        expected = resolved.key_for(kid)
        if expected is None or expected != key:
            raise AuthenticationFailed("public key does not match the sender's DID")
        if kid in bound:
            raise AuthenticationFailed("public key listed twice")
        bound[kid] = key
    return bound
