"""The signed refusal of a handshake (PROTOCOL.md §12.6, "Sealing required"). Pure, no I/O.

A server that requires seal keys refuses an ACCEPT_POLICY without one. Handshake errors are
unsigned in the base contract, so anyone on the path could forge that refusal (or strip
it); this one carries ``data.refusal_jws``, a JWS (``typ`` ``a2a-refusal+jws``) by the
server's key over the handshake's nonces and DIDs, the hash of the refused ``accept_jws``
and the error itself. A client verifies it with the key of the CHALLENGE, as it verifies
``session_jws``; one that cannot treats the refusal as unsigned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity.jws import jws_token, jws_verify
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.validate import exact_members, is_fresh, json_equal

__all__ = ["MEMBER", "PAYLOAD_MEMBERS", "refusal_is_signed", "sign_refusal"]

MEMBER: Final = "refusal_jws"
"""The one member of the refusal's ``data``."""
PAYLOAD_MEMBERS: Final = frozenset(
    ("nonce_a", "nonce_b", "client_did", "server_did", "accept_hash", "error", "timestamp")
)


def sign_refusal(
    exc: A2AError,
    identity: Identity,
    *,
    nonce_a: str,
    nonce_b: str,
    client_did: str,
    accept_jws: str,
    now: int,
) -> A2AError:
    """``exc`` with ``data`` = ``{"refusal_jws": ...}``, signed by ``identity`` (the server)."""
    payload = {
        "nonce_a": nonce_a,
        "nonce_b": nonce_b,
        "client_did": client_did,
        "server_did": identity.did,
        "accept_hash": m.request_hash(accept_jws),
        "error": {"code": exc.code, "message": exc.message},
        "timestamp": now,
    }
    exc.data = {MEMBER: jws_token(payload, identity, m.Typ.REFUSAL)}
    return exc


def refusal_is_signed(
    error: Any,
    *,
    server_key: bytes,
    server_kid: str,
    expected: Mapping[str, Any],
    accept_jws: str,
    now: float,
) -> bool:
    """Whether the JSON-RPC ``error`` answering ``accept_jws`` is the server's signed refusal.

    ``expected``: the handshake's ``nonce_a``, ``nonce_b``, ``client_did`` and ``server_did``.
    Anything that does not verify (no token, another key, other members or values, a stale
    timestamp) is False: the error is then as unsigned as any handshake error.
    """
    data = error.get("data") if isinstance(error, Mapping) else None
    token = data.get(MEMBER) if isinstance(data, Mapping) else None
    if not isinstance(token, str):
        return False
    err = AuthenticationFailed
    try:
        payload = jws_verify(token, server_key, typ=m.Typ.REFUSAL, kid=server_kid)
        exact_members(payload, PAYLOAD_MEMBERS, "refusal payload", err)
        signed_error = payload["error"]
        if not isinstance(signed_error, Mapping):
            return False
        exact_members(signed_error, frozenset(("code", "message")), "refusal error", err)
        timestamp = payload["timestamp"]
        return (
            all(json_equal(payload[k], v) for k, v in expected.items())
            and json_equal(payload["accept_hash"], m.request_hash(accept_jws))
            and json_equal(signed_error["code"], error.get("code"))
            and json_equal(signed_error["message"], error.get("message"))
            and type(timestamp) is int
            and is_fresh(timestamp, now)
        )
    except A2AError:
        return False
