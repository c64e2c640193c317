"""Keys, DIDs, strict JWS and canonical hashing (PROTOCOL.md §1–§3)."""

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
