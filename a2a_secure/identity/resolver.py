"""DID resolution with a pluggable method registry.

``did:key`` resolves offline. ``did:web`` (``a2a_secure.identity.didweb``) fetches the DID
document over HTTPS with every bound of PROTOCOL.md §2. Other methods plug in with
:meth:`DIDResolver.register`.

A resolution gives the DID's usable Ed25519 keys that are listed under ``authentication``,
by key id. The protocol core never resolves by itself: adapters resolve once per handshake
and hand the result to the core, which pins that key for the handshake and the session.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.errors import A2AError, DIDResolutionError
from a2a_secure.identity.did import (
    check_did_syntax,
    did_method,
    key_id_for_did_key,
    public_key_from_did_key,
)

__all__ = ["DIDResolver", "MethodResolver", "ResolvedDID", "resolve_did_key"]


@dataclass(frozen=True, slots=True)
class ResolvedDID:
    """What a DID resolved to: its authentication keys (key id → raw key) and services."""

    did: str
    keys: Mapping[str, bytes]
    services: tuple[Mapping[str, Any], ...] = ()
    document: Mapping[str, Any] | None = field(default=None, compare=False)

    def key_for(self, kid: str) -> bytes | None:
        """The raw key listed under ``kid``, or None."""
        return self.keys.get(kid)


MethodResolver = Callable[[str], Awaitable[ResolvedDID]]


def resolve_did_key(did: str) -> ResolvedDID:
    """Resolve a did:key offline (no I/O)."""
    key = public_key_from_did_key(did)
    return ResolvedDID(did=did, keys={key_id_for_did_key(did): key})


async def _resolve_did_key_async(did: str) -> ResolvedDID:
    return resolve_did_key(did)


class DIDResolver:
    """Resolves DIDs through a registry of methods, caching successes for ``cache_ttl`` seconds.

    Failures are never cached as successes. The cache is keyed by the exact DID string.
    """

    def __init__(
        self,
        *,
        cache_ttl: float = 300.0,
        max_cache_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._methods: dict[str, MethodResolver] = {"key": _resolve_did_key_async}
        self._cache: dict[str, tuple[float, ResolvedDID]] = {}
        self._ttl = cache_ttl
        self._max = max_cache_entries
        self._clock = clock

    def register(self, method: str, resolver: MethodResolver) -> None:
        """Serve DIDs of ``method`` with ``resolver`` (replacing any earlier one)."""
        self._methods[method] = resolver

    @property
    def methods(self) -> frozenset[str]:
        """The DID methods this resolver knows."""
        return frozenset(self._methods)

    def resolve_offline(self, did: str) -> ResolvedDID | None:
        """Resolve without I/O when possible (did:key or a fresh cache entry), else None."""
        if did.startswith("did:key:"):
            return resolve_did_key(did)
        hit = self._cache.get(did)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        return None

    async def resolve(self, did: str) -> ResolvedDID:
        """Resolve ``did`` or raise ``InvalidParams`` (syntax) / ``DIDResolutionError``."""
        check_did_syntax(did)
        offline = self.resolve_offline(did)
        if offline is not None:
            return offline
        method = did_method(did)
        resolver = self._methods.get(method)
        if resolver is None:
            raise DIDResolutionError(f"DID method '{method}' is not supported")
        try:
            resolved = await resolver(did)
        except A2AError:
            raise
        except Exception:  # a method plug-in's own failure is a resolution failure
            raise DIDResolutionError("DID resolution failed") from None
        if resolved.did != did or not resolved.keys:
            raise DIDResolutionError("DID resolution gave no usable key")
        if len(self._cache) >= self._max:
            self._evict()
        self._cache[did] = (self._clock() + self._ttl, resolved)
        return resolved

    def _evict(self) -> None:
        now = self._clock()
        for key in [k for k, (exp, _) in self._cache.items() if exp <= now]:
            del self._cache[key]
        while len(self._cache) >= self._max:
            self._cache.pop(next(iter(self._cache)))
