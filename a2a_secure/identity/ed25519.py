"""The two Ed25519 checks every other identity module builds on (RFC 8032, via libsodium).

They sit below both ``did`` and ``keys``: ``did`` needs the point check to decode a did:key,
``keys`` needs ``did`` to name an identity, so these checks cannot live in either without an
import cycle. Nothing here implements a primitive.
"""

from __future__ import annotations

import nacl.bindings
import nacl.exceptions

from a2a_secure.errors import DIDResolutionError

__all__ = ["PUBLIC_KEY_LEN", "SIGNATURE_LEN", "check_public_key", "verify_signature"]

PUBLIC_KEY_LEN = 32
SIGNATURE_LEN = 64


def check_public_key(public_key: bytes) -> bytes:
    """Return ``public_key`` if it is a usable Ed25519 key, else raise ``DIDResolutionError``.

    Usable means 32 bytes, canonically encoded, on the curve and in the prime-order subgroup
    (libsodium's ``crypto_core_ed25519_is_valid_point``). That refuses the small-order keys
    for which OpenSSL accepts one signature for every message (ATTACKS.md A3), non-canonical
    encodings (A4) and keys with a torsion component, which no honest key generator makes.
    """
    if type(public_key) is not bytes or len(public_key) != PUBLIC_KEY_LEN:
        raise DIDResolutionError("Ed25519 public key must be 32 bytes")
    if not nacl.bindings.crypto_core_ed25519_is_valid_point(public_key):
        raise DIDResolutionError("Ed25519 public key is not a valid prime-order point")
    return public_key


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True only if ``signature`` is a valid strict Ed25519 signature of ``message``.

    Never raises: wrong types, wrong lengths, small-order or non-canonical keys and R
    values, and S >= L all give False.
    """
    if (
        type(public_key) is not bytes
        or type(signature) is not bytes
        or not isinstance(message, bytes | bytearray | memoryview)
        or len(public_key) != PUBLIC_KEY_LEN
        or len(signature) != SIGNATURE_LEN
    ):
        return False
    try:
        nacl.bindings.crypto_sign_open(signature + bytes(message), public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError, ValueError, TypeError):
        return False
    return True
