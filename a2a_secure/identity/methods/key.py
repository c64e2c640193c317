"""The ``did:key`` method plug-in (Ed25519 only): resolved offline, no I/O."""

from __future__ import annotations

from a2a_secure.identity.resolver import ResolvedDID, resolve_did_key

__all__ = ["resolve"]


async def resolve(did: str) -> ResolvedDID:
    """Resolve a ``did:key`` DID (``DIDResolutionError`` when it is not a usable one)."""
    return resolve_did_key(did)
