"""Strict compact JWS with EdDSA/Ed25519 (RFC 7515, RFC 8037) as PROTOCOL.md §3 profiles it.

The verifier is an allow-list, not a JOSE library: the protected header has exactly the
members ``alg`` (``"EdDSA"``), ``typ`` and ``kid``; the key is the one the caller resolved
from the peer's DID and is never taken from the token (no ``jwk``/``jku``/``x5u``/``x5c``);
``typ`` separates the signature of every step from every other; the signature is checked
over the exact bytes received. Error codes follow §3: a token that is not three canonical
base64url segments whose first two decode to JSON objects is ``InvalidParams`` (-32602),
every other failure ``AuthenticationFailed`` (-32040).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from a2a_secure.errors import AuthenticationFailed, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.ed25519 import verify_signature

__all__ = [
    "MAX_TOKEN_LENGTH",
    "PendingJWS",
    "jws_check",
    "jws_decode_unverified",
    "jws_sign",
    "jws_sign_awaited",
    "jws_sign_bytes",
    "jws_sign_json",
    "jws_split",
    "jws_token",
    "jws_verify",
]

# A token carries an intent's inputs, and bodies are capped at 1 MiB; 4/3 of that plus headroom.
MAX_TOKEN_LENGTH = 1_500_000
_HEADER_MEMBERS = frozenset(("alg", "typ", "kid"))
# (header, payload, signing input, signature) of a token split but not verified.
Decoded = tuple[dict[str, Any], dict[str, Any], bytes, bytes]


class Signer(Protocol):
    """What signs a JWS: an :class:`~a2a_secure.identity.keys.Identity` (named by its shape,
    so that the modules above keys, delegation tokens among them, need not import it)."""

    @property
    def did(self) -> str:
        """The signer's DID."""
        ...

    @property
    def kid(self) -> str:
        """The key id the header names (a DID URL of ``did``)."""
        ...

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature of ``message``."""
        ...


class RemoteSigner(Signer, Protocol):
    """A :class:`Signer` whose key is held by a service that answers over the network
    (:mod:`a2a_secure.identity.remote`): an Identity with such a holder."""

    @property
    def remote(self) -> bool:
        """True when a signature is awaited (:meth:`sign_async`), not computed in place."""
        ...

    async def sign_async(self, message: bytes) -> bytes:
        """:meth:`sign`, awaited; verified against the public key before it is returned."""
        ...


class PendingJWS:
    """A compact JWS whose signature is still to come: what the core writes where a token
    goes when its signer's key is remote.

    The core never waits: it hands the runtime the signing input and the signer, and the
    runtime (:mod:`a2a_secure.runtime.signing`) awaits the signature and puts the finished
    token in its place before anything is sent or stored. A pending token is always a
    member of a reply's ``result`` object, of its error's ``data``, or of a stream event.
    """

    __slots__ = ("signer", "signing_input")

    def __init__(self, signing_input: bytes, signer: RemoteSigner) -> None:
        self.signing_input = signing_input
        self.signer = signer

    async def sign(self) -> str:
        """The token, its signature awaited from the signer (and checked there, by
        ``Identity.sign_async``); for the runtime and the client's adapter, never the core."""
        signature = await self.signer.sign_async(self.signing_input)
        return (self.signing_input + b"." + encoding.b64u_encode_bytes(signature)).decode("ascii")

    def __repr__(self) -> str:
        return f"PendingJWS(kid={self.signer.kid!r})"


def jws_token(payload: Mapping[str, Any] | bytes, identity: Signer, typ: str) -> str | PendingJWS:
    """:func:`jws_sign` on a path the runtime serves: the token, or, when ``identity``'s key is
    remote, the :class:`PendingJWS` the runtime finishes (``payload`` may be JSON bytes)."""
    body = payload if isinstance(payload, bytes) else encoding.dumps(dict(payload))
    if getattr(identity, "remote", False):
        return PendingJWS(_signing_input(body, identity, typ), identity)  # type: ignore[arg-type]
    return jws_sign_bytes(body, identity, typ).decode("ascii")


async def jws_sign_awaited(payload: Mapping[str, Any], identity: Signer, typ: str) -> str:
    """:func:`jws_sign`, awaiting a remote key's signature (where the token is needed at once:
    hashed or kept before the reply is sent); a local key signs in place."""
    token = jws_token(payload, identity, typ)
    return token if isinstance(token, str) else await token.sign()


def jws_sign(payload: Mapping[str, Any], identity: Signer, typ: str) -> str:
    """Sign ``payload`` (a JSON object) as a compact JWS with header ``{alg, typ, kid}``."""
    return jws_sign_json(encoding.dumps(dict(payload)), identity, typ)


def jws_sign_json(payload: bytes, identity: Signer, typ: str) -> str:
    """:func:`jws_sign` of a payload already written as compact JSON (a JSON object)."""
    return jws_sign_bytes(payload, identity, typ).decode("ascii")


def jws_sign_bytes(payload: bytes, identity: Signer, typ: str) -> bytes:
    """:func:`jws_sign_json`, the token as its ASCII bytes (what a body written as bytes takes)."""
    signing_input = _signing_input(payload, identity, typ)
    return signing_input + b"." + encoding.b64u_encode_bytes(identity.sign(signing_input))


def _signing_input(payload: bytes, identity: Signer, typ: str) -> bytes:
    """The encoded header (kept per signer and typ), ".", and the encoded ``payload``."""
    key = (identity.kid, typ)
    head = _HEADS.get(key)
    if head is None:
        header = {"alg": "EdDSA", "typ": typ, "kid": identity.kid}
        head = encoding.b64u_encode_bytes(encoding.dumps(header)) + b"."
        if len(_HEADS) >= _HEADER_CACHE_MAX:
            _HEADS.clear()
        _HEADS[key] = head
    return head + encoding.b64u_encode_bytes(payload)


# A peer signs every message with the same few headers: their decodes are kept (a copy is
# returned each time). Bounded in count and entry size, emptied when full, so a stream of
# distinct headers costs what it would without the cache.
_HEADER_CACHE: dict[str, dict[str, Any]] = {}
_HEADER_CACHE_MAX = 1024
_HEADER_CACHE_MAX_TEXT = 512
# The encoded header each signer puts on each typ, and the "." after it.
_HEADS: dict[tuple[str, str], bytes] = {}


def _decode_header(h_text: str) -> Any:
    cached = _HEADER_CACHE.get(h_text)
    if cached is not None:
        return dict(cached)
    header = encoding.loads(encoding.b64u_decode(h_text), error=InvalidParams)
    if isinstance(header, dict) and len(h_text) <= _HEADER_CACHE_MAX_TEXT:
        if len(_HEADER_CACHE) >= _HEADER_CACHE_MAX:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[h_text] = dict(header)
    return header


def jws_decode_unverified(token: object) -> Decoded:
    """Split and decode a token without checking anything but its form.

    Returns (header, payload, signing input, signature). Raises ``InvalidParams`` unless the
    token is three canonical base64url segments whose first two decode to JSON objects.
    """
    if not isinstance(token, str):
        raise InvalidParams("JWS must be a string")
    if len(token) > MAX_TOKEN_LENGTH:
        raise InvalidParams("JWS too long")
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidParams("JWS must have three segments")
    h_text, p_text, s_text = parts
    header = _decode_header(h_text)
    payload = encoding.loads(encoding.b64u_decode(p_text), error=InvalidParams)
    signature = encoding.b64u_decode(s_text)
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise InvalidParams("JWS header and payload must be JSON objects")
    signing_input = token[: len(h_text) + 1 + len(p_text)].encode("ascii")
    return header, payload, signing_input, signature


def jws_split(token: object) -> tuple[dict[str, Any], bytes, bytes, bytes] | None:
    """:func:`jws_decode_unverified` with the payload's JSON text not parsed: (header, payload
    text, signing input, signature), or None where that raises for anything but the payload.

    For a receiver that knows what the payload must say and compares its text.
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    h_text, p_text, s_text = parts
    try:
        header = _decode_header(h_text)
        payload = encoding.b64u_decode(p_text)
        signature = encoding.b64u_decode(s_text)
    except InvalidParams:
        return None
    if not isinstance(header, dict):
        return None
    return header, payload, token[: len(h_text) + 1 + len(p_text)].encode("ascii"), signature


def jws_verify(
    token: str, public_key: bytes, *, typ: str, kid: str, decoded: Decoded | None = None
) -> dict[str, Any]:
    """Verify ``token`` against the resolved ``public_key`` and return its payload.

    ``typ`` and ``kid`` are what the receiver expects at this step; both must match the
    header exactly. The caller then checks the payload's members against its own state.
    ``decoded`` is what :func:`jws_decode_unverified` returned for this very token, when
    the caller already split it (a shape check that comes before the signature check).
    """
    header, payload, signing_input, signature = decoded or jws_decode_unverified(token)
    jws_check(header, signing_input, signature, public_key, typ=typ, kid=kid)
    return payload


def jws_check(
    header: Mapping[str, Any],
    signing_input: bytes,
    signature: bytes,
    public_key: bytes,
    *,
    typ: str,
    kid: str,
) -> None:
    """:func:`jws_verify` of a token already split: its header, signing input and signature."""
    if header.keys() != _HEADER_MEMBERS:
        raise AuthenticationFailed("JWS header must have exactly alg, typ and kid")
    if header["alg"] != "EdDSA":
        raise AuthenticationFailed("JWS alg must be EdDSA")
    if header["typ"] != typ:
        raise AuthenticationFailed(f"JWS typ must be {typ}")
    if header["kid"] != kid:
        raise AuthenticationFailed("JWS kid is not the signer's resolved key id")
    if len(signature) != 64:
        raise AuthenticationFailed("JWS signature must be 64 bytes")
    if not verify_signature(public_key, signing_input, signature):
        raise AuthenticationFailed("JWS signature does not verify")
