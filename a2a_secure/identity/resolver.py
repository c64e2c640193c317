"""DID resolution with a pluggable method registry.

``did:key`` resolves offline. ``did:web`` (``a2a_secure.identity.didweb``) fetches the DID
document over HTTPS with every bound of PROTOCOL.md §2. Both are method plug-ins
(``a2a_secure.identity.methods``) registered by default. Other methods plug in with
:meth:`DIDResolver.register`, or from an installed package through the entry point group
``a2a_secure.did_methods`` (name = the method, value = a method resolver, or a class or
factory that takes no argument and returns one), loaded on the first DID of that method.
Every method resolver runs under the resolver's ``timeout``; one that fails, raises or
hangs gives ``DIDResolutionError`` (-32047) naming its method.

A resolution gives the DID's usable Ed25519 keys that are listed under ``authentication``,
by key id. The protocol core never resolves by itself: adapters resolve once per handshake
and hand the result to the core, which pins that key for the handshake and the session.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.errors import A2AError, AuthenticationFailed, DIDResolutionError
from a2a_secure.identity.did import (
    check_did_syntax,
    did_method,
    key_id_for_did_key,
    public_key_from_did_key,
)
from a2a_secure.system import MonoSeconds, WallSeconds, mono_clock_of, mono_now

__all__ = [
    "DID_METHODS_ENTRY_POINT_GROUP",
    "DIDResolver",
    "MethodResolver",
    "ResolvedDID",
    "resolve_did_key",
]

DID_METHODS_ENTRY_POINT_GROUP = "a2a_secure.did_methods"
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResolvedDID:
    """What a DID resolved to: its authentication keys (key id → raw key) and services."""

    did: str
    keys: Mapping[str, bytes]
    services: tuple[Mapping[str, Any], ...] = ()
    document: Mapping[str, Any] | None = field(default=None, compare=False)
    # Key id -> end of its overlap window (Unix seconds) for a key its controller retired
    # (a verification method with ``expires``, docs/PROTOCOL.md §12.4). Keys not listed here
    # do not expire.
    expires: Mapping[str, int] = field(default_factory=dict, compare=False)

    def key_for(self, kid: str) -> bytes | None:
        """The raw key listed under ``kid``, or None."""
        return self.keys.get(kid)

    def check_key_current(self, kid: str, now: WallSeconds) -> None:
        """Raise ``AuthenticationFailed`` naming ``kid`` when its overlap window has ended.

        ``now``: Unix seconds (``expires`` is), never the resolver's cache clock.
        """
        end = self.expires.get(kid)
        if end is not None and now >= end:
            raise AuthenticationFailed(f"key {kid[:300]} was retired; its overlap window ended at {end}")


MethodResolver = Callable[[str], Awaitable[ResolvedDID]]


def resolve_did_key(did: str) -> ResolvedDID:
    """Resolve a did:key offline (no I/O)."""
    key = public_key_from_did_key(did)
    return ResolvedDID(did=did, keys={key_id_for_did_key(did): key})


class DIDResolver:
    """Resolves DIDs through a registry of methods, caching successes for ``cache_ttl`` seconds.

    Failures are never cached as successes. The cache is keyed by the exact DID string.
    ``did:key`` is always known; ``did:web`` is registered by default with the default
    :class:`~a2a_secure.identity.didweb.DidWebResolver` bounds (``make_resolver`` configures
    them), and other methods come from :meth:`register` or the entry point group
    :data:`DID_METHODS_ENTRY_POINT_GROUP`. ``timeout`` (seconds) bounds one method call.
    """

    def __init__(
        self,
        *,
        cache_ttl: float = 300.0,
        max_cache_entries: int = 10_000,
        clock: Callable[[], float] = mono_now,
        timeout: float = 10.0,
    ) -> None:
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        self._methods: dict[str, MethodResolver] = {}
        self._cache: dict[str, tuple[MonoSeconds, ResolvedDID]] = {}
        self._ttl = cache_ttl
        self._max = max_cache_entries
        self._clock = mono_clock_of(clock)  # cache ages only: a monotonic clock
        self._timeout = float(timeout)
        # Methods whose plug-in was looked up, and the error of those that failed to load:
        # a plug-in is loaded once, and a broken one keeps failing with the same error.
        self._looked_up: dict[str, DIDResolutionError | None] = {}

    @property
    def cache_ttl(self) -> float:
        """How long (seconds) a successful resolution is reused."""
        return self._ttl

    def register(self, method: str, resolver: MethodResolver) -> None:
        """Serve DIDs of ``method`` with ``resolver`` (replacing any earlier one)."""
        self._methods[method] = resolver

    def _method_resolver(self, method: str) -> MethodResolver:
        resolver = self._methods.get(method)
        if resolver is not None:
            return resolver
        if method not in self._looked_up:
            try:
                loaded = _load_method(method)
            except DIDResolutionError as exc:
                self._looked_up[method] = exc
                raise
            self._looked_up[method] = None
            if loaded is not None:
                self._methods[method] = loaded
                return loaded
        failed = self._looked_up.get(method)
        if failed is not None:
            raise DIDResolutionError(failed.message)
        raise DIDResolutionError(f"DID method '{method}' is not supported")

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
        # Imported here: the pure layers that import this module must not load asyncio.
        from asyncio import timeout  # noqa: PLC0415

        method = did_method(did)
        resolver = self._method_resolver(method)
        try:
            # A plug-in is foreign code: whatever it does, it answers within the time cap.
            async with timeout(self._timeout):
                resolved = await resolver(did)
        except A2AError:
            raise
        except TimeoutError:
            raise DIDResolutionError(f"DID method '{method}' did not answer in time") from None
        except Exception:  # a method plug-in's own failure is a resolution failure
            raise DIDResolutionError(f"DID method '{method}' failed to resolve the DID") from None
        if not isinstance(resolved, ResolvedDID) or resolved.did != did or not resolved.keys:
            raise DIDResolutionError(f"DID method '{method}' gave no usable key")
        if len(self._cache) >= self._max:
            self._evict()
        self._cache[did] = (MonoSeconds(self._clock() + self._ttl), resolved)
        return resolved

    def clock(self) -> MonoSeconds:
        """The resolver's cache clock (the time base of :meth:`fresh_until`): monotonic, never
        comparable with a key's ``expires`` or a token's ``exp``."""
        return self._clock()

    def fresh_until(self, did: str) -> MonoSeconds | None:
        """When the cached resolution of ``did`` goes stale (:meth:`clock` time), or None."""
        hit = self._cache.get(did)
        return None if hit is None else hit[0]

    def forget(self, did: str) -> None:
        """Drop the cached resolution of ``did`` (the next :meth:`resolve` fetches it again)."""
        self._cache.pop(did, None)

    def _evict(self) -> None:
        now = self._clock()
        for key in [k for k, (exp, _) in self._cache.items() if exp <= now]:
            del self._cache[key]
        while len(self._cache) >= self._max:
            self._cache.pop(next(iter(self._cache)))


# The built-in methods, loaded on first use like any plug-in (so that importing the resolver
# does not import httpx for did:web).
_BUILTIN_METHODS = {
    "key": "a2a_secure.identity.methods.key:resolve",
    "web": "a2a_secure.identity.methods.web:DidWebMethod",
}


def _load_method(method: str) -> MethodResolver | None:
    """The resolver a built-in or an installed plug-in provides for ``method``, or None.

    A plug-in that is installed but fails to load is ``DIDResolutionError`` naming it.
    """
    import importlib.metadata  # noqa: PLC0415 - only on a method's first use (it loads socket)

    try:
        builtin = _BUILTIN_METHODS.get(method)
        if builtin is not None:
            obj: Any = importlib.metadata.EntryPoint(method, builtin, DID_METHODS_ENTRY_POINT_GROUP).load()
        else:
            found = importlib.metadata.entry_points(group=DID_METHODS_ENTRY_POINT_GROUP, name=method)
            if not found:
                return None
            obj = next(iter(found)).load()
        if isinstance(obj, type):
            obj = obj()
        if not callable(obj):
            raise TypeError("not callable")
    except Exception as exc:
        _log.warning("DID method plug-in %r failed to load: %s", method, type(exc).__name__)
        raise DIDResolutionError(f"DID method '{method}' plug-in failed to load") from None
    return obj  # type: ignore[no-any-return]
