"""DID syntax, ``did:key`` (Ed25519 only) and the ``did:web`` URL rule (PROTOCOL.md §2, §9).

Errors follow PROTOCOL.md §9: a string that is not a DID is ``InvalidParams`` (-32602); a
well-formed DID that cannot be used (unsupported method, not ``z``-base58btc, a multicodec
other than 0xed01, a wrong key length, an invalid point, a did:web failure) is
``DIDResolutionError`` (-32047).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Any

import base58

from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity.ed25519 import check_public_key

__all__ = [
    "A2A_SERVICE_TYPE",
    "MAX_DID_LENGTH",
    "check_did_syntax",
    "did_key_from_public_key",
    "did_method",
    "did_web_document",
    "did_web_host_port",
    "did_web_to_url",
    "key_id_for_did_key",
    "public_key_from_did_key",
    "split_key_id",
]

MAX_DID_LENGTH = 2048
# The DID document service type under which an agent publishes its base URL.
A2A_SERVICE_TYPE = "A2ASecureAgent"
ED25519_MULTICODEC = b"\xed\x01"

# DID Core ABNF: "did:" method-name ":" method-specific-id, with idchar = ALPHA / DIGIT /
# "." / "-" / "_" / pct-encoded. Linear-time pattern, applied only after the length cap.
_IDCHAR = r"(?:[A-Za-z0-9._-]|%[0-9A-Fa-f]{2})"
_DID_RE = re.compile(rf"did:[a-z0-9]+:(?:{_IDCHAR}*:)*{_IDCHAR}+")
_FRAGMENT_RE = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/?-]+|(?:%[0-9A-Fa-f]{2})+")
_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")
_B58_ALPHABET = set("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")


def check_did_syntax(did: object) -> str:
    """Return ``did`` if it is an ASCII DID (not a DID URL) of at most 2048 characters."""
    if not isinstance(did, str):
        raise InvalidParams("DID must be a string")
    if len(did) > MAX_DID_LENGTH:
        raise InvalidParams("DID longer than 2048 characters")
    if not did.isascii() or _DID_RE.fullmatch(did) is None:
        raise InvalidParams("not a DID")
    return did


def did_method(did: str) -> str:
    """The method name of a syntactically valid DID."""
    return check_did_syntax(did).split(":", 2)[1]


def split_key_id(kid: str) -> tuple[str, str]:
    """Split a key id ``did#fragment`` into the DID and the fragment."""
    if not isinstance(kid, str) or len(kid) > MAX_DID_LENGTH + 256 or "#" not in kid:
        raise InvalidParams("key id must be a DID URL with a fragment")
    did, fragment = kid.split("#", 1)
    check_did_syntax(did)
    if not fragment or _FRAGMENT_RE.fullmatch(fragment) is None:
        raise InvalidParams("key id has an invalid fragment")
    return did, fragment


# -- did:key -------------------------------------------------------------------------------


def did_key_from_public_key(public_key: bytes) -> str:
    """``did:key:z`` + base58btc(0xed 0x01 ‖ key) for a raw 32-byte Ed25519 key."""
    if type(public_key) is not bytes or len(public_key) != 32:
        raise InvalidParams("Ed25519 public key must be 32 bytes")
    return "did:key:z" + base58.b58encode(ED25519_MULTICODEC + public_key).decode("ascii")


def key_id_for_did_key(did: str) -> str:
    """The key id of a did:key: the DID, ``#``, the multibase value again."""
    return f"{did}#{did[len('did:key:') :]}"


def _decode_multikey(value: str) -> bytes:
    if not value.startswith("z"):
        raise DIDResolutionError("multibase value must be base58btc ('z')")
    body = value[1:]
    if not body or len(body) > 64 or not set(body) <= _B58_ALPHABET:
        raise DIDResolutionError("multibase value is not base58btc")
    raw = base58.b58decode(body)
    # The multicodec header is an unsigned varint: 0xed 0x01 for ed25519-pub. A single
    # 0xed byte, or 0xec 0x01 (X25519), is a different thing and is refused.
    if raw[:2] != ED25519_MULTICODEC:
        raise DIDResolutionError("multicodec is not ed25519-pub (0xed01)")
    key = raw[2:]
    if len(key) != 32:
        raise DIDResolutionError(f"Ed25519 key must be 32 bytes, got {len(key)}")
    return key


def public_key_from_multibase(value: str) -> bytes:
    """The raw key of a ``publicKeyMultibase`` value (``z`` + base58btc(0xed01 ‖ key)).

    The key is not yet checked as a curve point; resolvers call ``check_public_key``.
    """
    if not isinstance(value, str):
        raise DIDResolutionError("publicKeyMultibase must be a string")
    return _decode_multikey(value)


@functools.lru_cache(maxsize=4096)
def _did_key_cached(did: str) -> bytes:
    method_specific = did[len("did:key:") :]
    if ":" in method_specific:
        # did:key:<version>:<mbvalue> is in the draft spec; only version 1 (implicit) exists.
        raise DIDResolutionError("did:key versions other than the default are not supported")
    return check_public_key(_decode_multikey(method_specific))


def public_key_from_did_key(did: str) -> bytes:
    """The raw 32-byte Ed25519 key of a ``did:key`` DID, checked as a valid point.

    ``InvalidParams`` when ``did`` is not a DID; ``DIDResolutionError`` when it is a DID
    but not a usable Ed25519 did:key (other method, multibase, multicodec, length, point).
    """
    check_did_syntax(did)
    if not did.startswith("did:key:"):
        raise DIDResolutionError("not a did:key DID")
    return _did_key_cached(did)


# -- did:web -------------------------------------------------------------------------------


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    # Forms that resolvers turn into addresses: 2130706433, 0x7f000001, 127.1, 0177.0.0.1
    return bool(re.fullmatch(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}", host))


def did_web_host_port(did: str) -> tuple[str, int | None, list[str]]:
    """Split a did:web DID into (host, port or None, path segments), refusing unsafe forms.

    Refused (``DIDResolutionError``): IP literals in any notation, upper-case or otherwise
    invalid host names, a trailing dot, ports outside 1-65535, any percent-encoding other
    than the port's ``%3A``, empty or dot path segments.
    """
    check_did_syntax(did)
    if not did.startswith("did:web:"):
        raise DIDResolutionError("not a did:web DID")
    parts = did[len("did:web:") :].split(":")
    authority, segments = parts[0], parts[1:]
    port: int | None = None
    host = authority
    lowered = authority.lower()
    if "%3a" in lowered:
        idx = lowered.index("%3a")
        host, port_text = authority[:idx], authority[idx + 3 :]
        if not port_text.isdigit() or len(port_text) > 5 or port_text.startswith("0"):
            raise DIDResolutionError("did:web port is not a number in 1-65535")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise DIDResolutionError("did:web port is not a number in 1-65535")
    if "%" in host:
        raise DIDResolutionError("did:web host may not be percent-encoded")
    if not host or len(host) > 253 or host.endswith("."):
        raise DIDResolutionError("did:web host is not a DNS name")
    if _is_ip_literal(host):
        raise DIDResolutionError("did:web may not name an IP address")
    labels = host.split(".")
    if not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise DIDResolutionError("did:web host is not a lower-case DNS name")
    for seg in segments:
        if not _SEGMENT_RE.fullmatch(seg) or seg in (".", ".."):
            raise DIDResolutionError("did:web path segment is empty, a dot segment or encoded")
    return host, port, segments


def did_web_to_url(did: str) -> str:
    """The HTTPS URL of a did:web DID's document, per the did:web specification."""
    host, port, segments = did_web_host_port(did)
    netloc = host if port is None else f"{host}:{port}"
    path = "/".join(segments) + "/did.json" if segments else ".well-known/did.json"
    return f"https://{netloc}/{path}"


# -- did:web documents ---------------------------------------------------------------------

DID_CONTEXT = "https://www.w3.org/ns/did/v1"
MULTIKEY_CONTEXT = "https://w3id.org/security/multikey/v1"


def did_web_document(
    did: str, public_key: bytes, fragment: str = "key-1", *, endpoint: str | None = None
) -> dict[str, Any]:
    """The DID document to serve at ``did_web_to_url(did)`` for one Ed25519 key.

    One ``Multikey`` verification method ``did#fragment`` (``publicKeyMultibase`` =
    ``z`` + base58btc(0xed01 ‖ key)), listed under ``authentication`` and
    ``assertionMethod``; with ``endpoint``, a service ``did#a2a`` of type
    ``A2ASecureAgent`` whose ``serviceEndpoint`` is the agent's base URL, so that callers
    can find the agent from its DID alone. Raises ``InvalidParams`` for a bad fragment or
    key, and what :func:`did_web_host_port` raises for a DID that is not a usable did:web.
    """
    did_web_host_port(did)
    kid = f"{did}#{fragment}"
    split_key_id(kid)
    multibase = did_key_from_public_key(public_key)[len("did:key:") :]
    try:
        check_public_key(public_key)
    except DIDResolutionError:
        raise InvalidParams("not a usable Ed25519 public key") from None
    document: dict[str, Any] = {
        "@context": [DID_CONTEXT, MULTIKEY_CONTEXT],
        "id": did,
        "verificationMethod": [
            {"id": kid, "type": "Multikey", "controller": did, "publicKeyMultibase": multibase}
        ],
        "authentication": [kid],
        "assertionMethod": [kid],
    }
    if endpoint is not None:
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            raise InvalidParams("the service endpoint must be an http(s) URL")
        document["service"] = [{"id": f"{did}#a2a", "type": A2A_SERVICE_TYPE, "serviceEndpoint": endpoint}]
    return document
