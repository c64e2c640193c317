"""A DID document read into the keys it authorises (W3C DID Core, as PROTOCOL.md §2 profiles it).

Pure: no I/O. :func:`parse_did_document` takes the document a did:web (or a method plug-in of
§12.4) fetched and keeps only what may be trusted: the document's ``id`` is the DID exactly
(ATTACKS.md E8, E12), relative method ids are resolved against the DID, methods of other
controllers are ignored, duplicate ids and published private keys refuse the whole document
(E9, E10), counts are capped (H8), and a retired key's ``expires`` (§12.4) is kept beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.did import public_key_from_multibase, split_key_id
from a2a_secure.identity.keys import check_public_key
from a2a_secure.identity.resolver import ResolvedDID
from a2a_secure.identity.rfc3339 import parse_expires

__all__ = ["MAX_SERVICES", "MAX_VERIFICATION_METHODS", "parse_did_document"]

MAX_VERIFICATION_METHODS: Final = 64
MAX_SERVICES: Final = 64
_RELATIONSHIPS: Final = (
    "authentication",
    "assertionMethod",
    "keyAgreement",
    "capabilityInvocation",
    "capabilityDelegation",
)
# Members that only a private key has (RFC 7517/7518): a document publishing one is broken.
_PRIVATE_JWK_MEMBERS: Final = frozenset({"d", "p", "q", "dp", "dq", "qi", "k", "oth"})


def _absolute_id(did: str, value: object) -> str | None:
    """A verification-method id as an absolute DID URL, or None if it is not one.

    ``#key-1`` is resolved against the DID (PROTOCOL.md §2). Other relative forms
    (``key-1``, ``/path``, ``?q``) are not ids of this DID and give None.
    """
    if not isinstance(value, str) or not value:
        return None
    absolute = did + value if value.startswith("#") else value
    try:
        split_key_id(absolute)
    except InvalidParams:
        return None
    return absolute


def _owned_by(did: str, kid: str, method: Mapping[str, Any]) -> bool:
    # A key of another DID (by id or controller) is never a key of this DID (E9): a document
    # may list it, but a signature under this DID may not use it.
    if kid.split("#", 1)[0] != did:
        return False
    controller = method.get("controller", did)
    return controller == did and isinstance(controller, str)


def _key_of_method(did: str, kid: str, method: Mapping[str, Any]) -> bytes | None:
    """The checked Ed25519 key of a usable method, None for a method of another kind.

    Raises ``DIDResolutionError`` when the method is hostile rather than merely foreign:
    private key material (E10) or an Ed25519 key that is not a valid prime-order point.
    """
    jwk = method.get("publicKeyJwk")
    if isinstance(jwk, Mapping) and _PRIVATE_JWK_MEMBERS & set(jwk):
        raise DIDResolutionError("DID document publishes private key material")
    if "privateKeyJwk" in method or "privateKeyMultibase" in method:
        raise DIDResolutionError("DID document publishes private key material")
    if not _owned_by(did, kid, method):
        return None
    kind = method.get("type")
    if kind in ("Multikey", "Ed25519VerificationKey2020"):
        value = method.get("publicKeyMultibase")
        if not isinstance(value, str):
            return None
        if kind == "Multikey":
            # Multikey also carries P-256, X25519, ... keys: those are simply not usable here.
            try:
                raw = public_key_from_multibase(value)
            except DIDResolutionError:
                return None
        else:
            raw = public_key_from_multibase(value)
        # Small-order and non-canonical keys accept forged signatures (ATTACKS.md A3, A4).
        return check_public_key(raw)
    if kind == "JsonWebKey2020":
        if not isinstance(jwk, Mapping):
            return None
        # Only an Ed25519 signing key: X25519 (key agreement), EC or RSA keys are refused (E10).
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            return None
        if jwk.get("alg", "EdDSA") not in ("EdDSA", "Ed25519") or jwk.get("use", "sig") != "sig":
            return None
        x = jwk.get("x")
        if not isinstance(x, str):
            raise DIDResolutionError("JsonWebKey2020 lacks x")
        raw = encoding.b64u_decode(x, error=DIDResolutionError)
        return check_public_key(raw)
    return None


def _bounded_list(document: Mapping[str, Any], name: str, cap: int) -> list[Any]:
    value = document.get(name, [])
    if not isinstance(value, list):
        raise DIDResolutionError(f"DID document member {name} is not an array")
    if len(value) > cap:
        # H8: a document with thousands of entries costs work on every resolution.
        raise DIDResolutionError(f"DID document has more than {cap} entries in {name}")
    return value


def parse_did_document(did: str, document: Any) -> ResolvedDID:
    """Check a parsed did:web document for ``did`` and extract its authentication keys.

    Args:
        did: The DID that was resolved (compared byte for byte with the document's ``id``).
        document: The parsed JSON document.

    Returns:
        The DID's usable Ed25519 keys listed under ``authentication`` (key id → raw key),
        its ``service`` entries, the document, and for each key whose method carries
        ``expires`` (an RFC 3339 date-time: a key retired by a rotation, docs/PROTOCOL.md
        §12.4) the end of its overlap window.

    Raises:
        DIDResolutionError: The document is not an object, its ``id`` is not ``did``
            exactly, it has duplicate verification-method ids, too many entries, private
            key material or an invalid Ed25519 key, a malformed ``expires``, or no usable
            authentication key.
    """
    if not isinstance(document, dict):
        raise DIDResolutionError("DID document is not a JSON object")
    # E8/E12: exact string equality, never after case folding or IDNA mapping.
    if document.get("id") != did or not isinstance(document.get("id"), str):
        raise DIDResolutionError("DID document id does not match the DID")

    top_level = _bounded_list(document, "verificationMethod", MAX_VERIFICATION_METHODS)
    relationships = {name: _bounded_list(document, name, MAX_VERIFICATION_METHODS) for name in _RELATIONSHIPS}
    services = _bounded_list(document, "service", MAX_SERVICES)

    # Every method object in the document: the top-level list and those embedded in a
    # relationship. Ids must be unique across all of them (E9: two keys under one kid would
    # let the signer pick whichever verifies).
    seen_ids: set[str] = set()
    expiry: dict[str, int] = {}
    usable_top: dict[str, bytes] = {}
    usable_auth: dict[str, bytes] = {}
    embedded = [
        (name, m) for name, entries in relationships.items() for m in entries if not isinstance(m, str)
    ]
    for origin, method in [("verificationMethod", m) for m in top_level] + embedded:
        if not isinstance(method, dict):
            raise DIDResolutionError(f"DID document {origin} entry is not an object")
        kid = _absolute_id(did, method.get("id"))
        if kid is None:
            continue  # no usable id: the method cannot be named by a kid
        if kid in seen_ids:
            raise DIDResolutionError("DID document has duplicate verification method ids")
        seen_ids.add(kid)
        key = _key_of_method(did, kid, method)
        if key is None:
            continue
        if "expires" in method:
            expiry[kid] = parse_expires(method["expires"])
        if origin == "verificationMethod":
            usable_top[kid] = key
        elif origin == "authentication":
            usable_auth[kid] = key

    keys: dict[str, bytes] = {}
    for entry in relationships["authentication"]:
        if isinstance(entry, str):
            kid = _absolute_id(did, entry)
            if kid is not None and kid in usable_top:
                keys[kid] = usable_top[kid]
        else:
            kid = _absolute_id(did, entry.get("id"))
            if kid is not None and kid in usable_auth:
                keys[kid] = usable_auth[kid]
    if not keys:
        raise DIDResolutionError("DID document has no usable Ed25519 authentication key")

    if not all(isinstance(s, dict) for s in services):
        raise DIDResolutionError("DID document service entry is not an object")
    return ResolvedDID(
        did=did,
        keys=MappingProxyType(keys),
        services=tuple(dict(s) for s in services),
        document=document,
        expires=MappingProxyType({kid: t for kid, t in expiry.items() if kid in keys}),
    )
