"""Where an agent's key comes from: a key file, or a ``pkcs11:`` URI naming a token's key.

Every command and the server load keys through these two functions, so a key source the
one accepts every other accepts too (``serve`` and each of its workers, ``call``,
``delegate``, ``approve``, ``did``, ``key rotate``, ``mcp``).
"""

from __future__ import annotations

import os

from a2a_secure.identity.keys import Identity
from a2a_secure.identity.rotation import KeyRing

__all__ = ["URI_SCHEME", "is_token_uri", "load_identity", "load_key_ring"]

URI_SCHEME = "pkcs11:"


def is_token_uri(source: str | os.PathLike[str]) -> bool:
    """True for a ``pkcs11:`` URI (a key in a token), False for a key file's path."""
    return isinstance(source, str) and source.startswith(URI_SCHEME)


def load_identity(source: str | os.PathLike[str]) -> Identity:
    """The current identity of a key file or of a token key."""
    return load_key_ring(source).current if is_token_uri(source) else Identity.load(source)


def load_key_ring(source: str | os.PathLike[str]) -> KeyRing:
    """The key ring (current key, retired keys in their window) of a key file or token key."""
    if is_token_uri(source):
        from a2a_secure.identity.pkcs11_ring import load_token_ring  # noqa: PLC0415 - pkcs11 extra

        return load_token_ring(str(source))
    return KeyRing.load(source)
