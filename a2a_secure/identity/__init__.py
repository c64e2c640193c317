"""Keys, DIDs, strict JWS and canonical hashing (PROTOCOL.md §1–§3).

The names below load on first use (PEP 562): did:key, JWS and hashing need no network
stack, and httpx with the TLS stack loads only when the did:web resolver is asked for.
"""

from typing import TYPE_CHECKING

from a2a_secure._lazy import attach

if TYPE_CHECKING:
    from a2a_secure.identity.did import (
        check_did_syntax,
        did_key_from_public_key,
        did_web_to_url,
        key_id_for_did_key,
        public_key_from_did_key,
    )
    from a2a_secure.identity.didweb import DidWebResolver, make_resolver
    from a2a_secure.identity.encoding import b64u_decode, b64u_encode, hash_of
    from a2a_secure.identity.jws import jws_sign, jws_verify
    from a2a_secure.identity.keys import Identity, KeyFileError, check_public_key, verify_signature
    from a2a_secure.identity.resolver import DIDResolver, ResolvedDID, resolve_did_key

__all__ = [
    "DIDResolver",
    "DidWebResolver",
    "Identity",
    "KeyFileError",
    "ResolvedDID",
    "b64u_decode",
    "b64u_encode",
    "check_did_syntax",
    "check_public_key",
    "did_key_from_public_key",
    "did_web_to_url",
    "hash_of",
    "jws_sign",
    "jws_verify",
    "key_id_for_did_key",
    "make_resolver",
    "public_key_from_did_key",
    "resolve_did_key",
    "verify_signature",
]

__getattr__, __dir__ = attach(
    __name__,
    {
        "DIDResolver": "a2a_secure.identity.resolver",
        "DidWebResolver": "a2a_secure.identity.didweb",
        "Identity": "a2a_secure.identity.keys",
        "KeyFileError": "a2a_secure.identity.keys",
        "ResolvedDID": "a2a_secure.identity.resolver",
        "b64u_decode": "a2a_secure.identity.encoding",
        "b64u_encode": "a2a_secure.identity.encoding",
        "check_did_syntax": "a2a_secure.identity.did",
        "check_public_key": "a2a_secure.identity.keys",
        "did_key_from_public_key": "a2a_secure.identity.did",
        "did_web_to_url": "a2a_secure.identity.did",
        "hash_of": "a2a_secure.identity.encoding",
        "jws_sign": "a2a_secure.identity.jws",
        "jws_verify": "a2a_secure.identity.jws",
        "key_id_for_did_key": "a2a_secure.identity.did",
        "make_resolver": "a2a_secure.identity.didweb",
        "public_key_from_did_key": "a2a_secure.identity.did",
        "resolve_did_key": "a2a_secure.identity.resolver",
        "verify_signature": "a2a_secure.identity.keys",
    },
)
