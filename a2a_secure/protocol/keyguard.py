"""Key lifecycle checks of the server: revoked and retired keys, and its own rotated keys.

``ServerProtocol`` calls one :class:`KeyGuard` at four points:

* HELLO, once the client's keys are bound to its DID: a key whose overlap window has ended
  (``expires`` in its did:web document) or a revoked DID or key id is refused (-32040,
  naming the DID or key id);
* each intent or close, before the sequence is consumed (:meth:`KeyGuard.check_session`):
  the deny lists that are not kept in the session store (a :class:`FileRevocations`: one
  ``stat``), and for a DID that is not did:key, whether the DID's current document still
  lists the session's key. Nothing is fetched while the document the DID was last checked
  against (at HELLO, or by an earlier intent) is fresh in the resolver's cache
  (``cache_ttl``, 300 s by default): within that window the key stays pinned (ATTACKS.md
  F18). The first intent after it resolves the DID again, once for all of its sessions: a
  key dropped from the document, or replaced under the same key id, ends its sessions
  (-32043). A failed fetch refuses the intent (-32047) without consuming it.
  Revocations kept in the session store are checked by the store's ``begin_request`` in
  the same atomic step (``BeginKind.REVOKED``);
* each stream event (:meth:`KeyGuard.check_stream`): the same, plus the store's deny list,
  read at most once per ``stream_staleness`` seconds per session;
* signing answers (:meth:`KeyGuard.signer_for`): a session opened before this server's
  key was rotated is answered with the key it was opened with while that key is in its
  overlap window; afterwards the session is over (-32043, unsigned: no other key may stand
  in for the one the client pinned).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from a2a_secure import system
from a2a_secure.errors import AuthenticationFailed, DIDResolutionError, InternalError, SessionUnknown
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.identity.rotation import KeyRing
from a2a_secure.store.base import SessionRecord, Store
from a2a_secure.store.revocation import (
    Revocation,
    Revocations,
    RevocationStore,
    StoreRevocations,
)
from a2a_secure.system import MonoClock, MonoSeconds, WallSeconds

__all__ = ["KeyGuard", "revoked_message"]


def revoked_message(entry: Revocation) -> str:
    """The error message for a refusal because of ``entry``."""
    what = "key id" if "#" in entry.target else "DID"
    return f"{what} revoked: {entry.target[:300]}"


class KeyGuard:
    """The checks above, for one server: its key ring and its deny lists besides the store's.

    The store, resolver and identity are the server's live configuration, given at each
    call (a server may be handed another store or identity while it runs).
    """

    def __init__(
        self,
        *,
        ring: KeyRing | None = None,
        revocations: Iterable[Revocations] = (),
        stream_staleness: float = 1.0,
        monotonic: MonoClock = system.mono_now,
    ) -> None:
        self.ring = ring
        self.revocations = tuple(revocations)
        self._stream_staleness = stream_staleness
        self._monotonic = monotonic
        self._stream_checked: dict[str, float] = {}
        # DID -> until when (resolver clock) the document its sessions were checked against is
        # fresh: a key dropped from it is seen on the first intent after that.
        self._fresh_until: dict[str, MonoSeconds] = {}

    def _note_fresh(self, resolver: DIDResolver, did: str) -> None:
        until = resolver.fresh_until(did)
        if until is None:
            return
        if len(self._fresh_until) >= 10_000:
            now = resolver.clock()
            self._fresh_until = {d: t for d, t in self._fresh_until.items() if t > now}
            if len(self._fresh_until) >= 10_000:
                self._fresh_until.clear()
        self._fresh_until[did] = until

    async def _find(
        self, store: Store, did: str, kids: Sequence[str], *, with_store: bool
    ) -> Revocation | None:
        in_store = store if isinstance(store, RevocationStore) else None
        try:
            for lst in self.revocations:
                # The store's own list is checked by its begin_request: not again here.
                if isinstance(lst, StoreRevocations) and lst.store is in_store:
                    continue
                hit = await lst.lookup(did, kids)
                if hit is not None:
                    return hit
        except RuntimeError:  # a deny list that cannot be read: fail closed
            raise InternalError("the revocation list cannot be read") from None
        if with_store and in_store is not None:
            return await in_store.find_revocation(did, kids)
        return None

    async def check_hello(
        self,
        store: Store,
        resolver: DIDResolver,
        did: str,
        keys: Mapping[str, bytes],
        resolved: ResolvedDID,
        now: WallSeconds,
    ) -> None:
        """Refuse (-32040) a retired key past its window, a revoked DID or a revoked key id."""
        for kid in keys:
            resolved.check_key_current(kid, now)
        hit = await self._find(store, did, list(keys), with_store=True)
        if hit is not None:
            raise AuthenticationFailed(revoked_message(hit))
        if not did.startswith("did:key:"):
            self._note_fresh(resolver, did)

    def session_checked_now(self, resolver: DIDResolver, session: SessionRecord) -> bool:
        """True when :meth:`check_session` has nothing to check for ``session`` now: no deny
        list of its own, and a did:key client (its key is its DID) or a document still fresh.
        The intent path then awaits nothing for it."""
        if self.revocations:
            return False
        did = session.client_did
        if did.startswith("did:key:"):
            return True
        until = self._fresh_until.get(did)
        return until is not None and resolver.clock() < until

    async def check_session(self, store: Store, resolver: DIDResolver, session: SessionRecord) -> None:
        """The per-intent checks that the store does not make (see the module documentation)."""
        if self.revocations:
            hit = await self._find(store, session.client_did, (session.client_kid,), with_store=False)
            if hit is not None:
                raise SessionUnknown(f"session ended: {revoked_message(hit)}")
        did = session.client_did
        if did.startswith("did:key:"):
            return
        until = self._fresh_until.get(did)
        if until is not None and resolver.clock() < until:
            return  # checked against a document that is still fresh
        try:
            resolved = await resolver.resolve(did)  # the cached document, or a new fetch
        except DIDResolutionError as exc:
            raise DIDResolutionError(f"the client's DID could not be resolved again: {exc.message}") from None
        self._note_fresh(resolver, did)
        if resolved.key_for(session.client_kid) != session.client_key:
            await store.close_session(session.session_id)
            raise SessionUnknown(
                f"session ended: {session.client_kid[:300]} is no longer in the DID document"
            )

    async def check_stream(self, store: Store, resolver: DIDResolver, session: SessionRecord) -> None:
        """:meth:`check_session` and, at most every ``stream_staleness`` s, the store's list."""
        await self.check_session(store, resolver, session)
        if not isinstance(store, RevocationStore):
            return
        now = self._monotonic()
        sid = session.session_id
        if now - self._stream_checked.get(sid, -float("inf")) < self._stream_staleness:
            return
        if len(self._stream_checked) > 10_000:
            self._stream_checked.clear()
        self._stream_checked[sid] = now
        hit = await store.find_revocation(session.client_did, [session.client_kid])
        if hit is not None:
            await store.close_session(sid)
            raise SessionUnknown(f"session ended: {revoked_message(hit)}")

    def signer_for(self, identity: Identity, session: SessionRecord, now: float) -> Identity:
        """The key that answers on ``session``; -32043 once the key it was opened with is gone."""
        kid = session.server_kid
        if not kid or kid == identity.kid:
            return identity
        signer = self.ring.signer(kid, now) if self.ring is not None else None
        if signer is None:
            retired = self.ring.retired if self.ring is not None else ()
            if not any(r.identity.kid == kid for r in retired):
                # Never a key of this agent: a session of another agent sharing the store, as
                # unknown here as any other (this agent does not speak of that agent's keys).
                raise SessionUnknown("unknown, expired or closed session")
            raise SessionUnknown(f"session ended: it was opened with the retired server key {kid[:300]}")
        return signer
