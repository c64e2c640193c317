"""The server's side of delegation chains (PROTOCOL.md §12.7): keys, deny list, cache.

The rules are :mod:`a2a_secure.delegation`'s; this room feeds them what takes I/O:
each issuer's key, resolved from its DID with the server's resolver (never taken from the
token), and the deny list (the store's, shared by every worker, and the server's other
lists), read at every use. A chain verified once is kept per session by its hash (bounded),
so later intents carry the hash alone; its time and revocations are still checked at each
use, and its goal and priority against each intent.

A later use costs the same for any chain length: the chain is kept with what its first use
on the session found (audience and targets passed, its window as one interval) and with the
epoch of each deny list (:mod:`a2a_secure.store.revocation`) read before it was last found
clean. Each use reads the epochs again (one look-up per list: on Redis one GET, in process
none) and looks every link up again only when one has moved, so a revocation written by any
worker ends the chain at its next use. A list that keeps no epoch is looked up in full.

:meth:`DelegationGuard.verdict` runs before §6.1 step 7 and never raises: its refusal is
given at step 9 (-32042, signed, the sequence used up) like any refusal of the policy, and an
intent refused there claims no ``intent_id``.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from a2a_secure.delegation import (
    CHAIN_UNKNOWN,
    DELEGATION,
    NBF_SKEW,
    REVOCATION_PREFIX,
    Chain,
    DelegationRefused,
    Link,
    parse_chain,
    reference_of,
    verify_signatures,
)
from a2a_secure.errors import A2AError, DIDResolutionError, InternalError, InvalidParams
from a2a_secure.protocol.keyguard import revoked_message
from a2a_secure.protocol.models import Intent
from a2a_secure.protocol.priority import DEFAULT_PRIORITY
from a2a_secure.protocol.server.common import ServerConfig
from a2a_secure.store.base import SessionRecord
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import FileRevocations, Revocation, RevocationStore, StoreRevocations

__all__ = ["MAX_CACHED_CHAINS", "NO_DELEGATION", "DelegationGuard", "Verdict", "claim_form"]

# Verified chains kept by this process, all sessions together (a chain is at most 16 KiB of
# tokens: 64 MiB at worst), least recently used first out.
MAX_CACHED_CHAINS: Final = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the chain of one intent allows: the verified chain, or the refusal to give at step 9."""

    chain: Chain | None = None
    refusal: A2AError | None = None
    # A kept chain whose revocation check waits for the deny list's epoch that the store
    # reads with the sequence (:meth:`DelegationGuard.recheck`); None: checked already.
    recheck: Any = None


NO_DELEGATION: Final = Verdict()


class _Kept:
    """A chain verified on one session, with what later uses need not work out again."""

    __slots__ = ("chain", "epochs", "expires", "not_before", "scoped", "verdict")

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.verdict = Verdict(chain=chain)
        # Every link's window at once: usable from the latest nbf (less the skew) to the
        # earliest exp.
        self.not_before = max(link.nbf for link in chain.links) - NBF_SKEW
        self.expires = min(link.exp for link in chain.links)
        # Whether a use on this session passed the checks that do not change with the intent
        # or the time: the audience is the session's client, this agent is among the targets.
        self.scoped = False
        # The deny lists' epochs read before the chain was last found clean (None: never).
        self.epochs: tuple[object, ...] | None = None

    def fits(self, now: float, goal: str, priority: int) -> bool:
        """Whether a use now for ``goal`` at ``priority`` passes every check of ``check_use``."""
        leaf = self.chain.leaf
        return (
            self.scoped
            and self.not_before <= now < self.expires
            and leaf.allows_goal(goal)
            and priority <= leaf.max_priority
        )


def claim_form(intent_obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``intent_obj`` with its chain named by hash, the form an ``intent_id`` claim hashes.

    The first intent of a session carries the chain, a resend on the next session may carry
    it again or only its hash: the same intent either way (§12.5 ``intent_hash``).
    """
    value = intent_obj.get(DELEGATION)
    if not isinstance(value, list):
        return intent_obj
    return {**intent_obj, DELEGATION: reference_of(tuple(value))}


# Awaits look-ups and gives their answers in order (``asyncio.gather``'s shape): the core
# never waits on its own, so the runtime above hands it the way to wait on several at once.
Gather = Callable[..., Awaitable[Sequence[Any]]]


async def _one_by_one(*awaitables: Awaitable[Any]) -> list[Any]:
    return [await one for one in awaitables]


class DelegationGuard:
    """Verifies the chains intents carry, for one server (see the module documentation).

    State: the chains verified on each session, by (session, hash): at most
    ``DelegationRules.max_cached_chains`` per session and :data:`MAX_CACHED_CHAINS` in all.
    """

    def __init__(self, config: ServerConfig, *, gather: Gather | None = None) -> None:
        """``gather``: awaits several look-ups of a shared store together (the runtime's
        ``asyncio.gather``); by default they are awaited one after the other."""
        self._config = config
        self._gather = gather or _one_by_one
        self._verified: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._per_session: dict[str, list[str]] = {}  # session id -> its hashes, oldest first
        # (the store and lists it was worked out for, the deny lists, all in this process)
        self._lists: tuple[tuple[object, object], tuple[Any, ...], bool] | None = None

    def check_member(self, intent: Intent) -> None:
        """Step 1 for a server without the extension: ``delegation`` is an unknown member."""
        if self._config.delegation is None:
            raise InvalidParams(f"intent: unexpected member {DELEGATION!r}")

    async def verdict(
        self, session: SessionRecord, intent: Intent, now: float, *, epoch_later: bool = False
    ) -> Verdict:
        """The chain ``intent`` acts under, checked for this use, or why it is refused.

        ``epoch_later``: the store will read its deny list's epoch with steps 7-8 (one Redis:
        ``begin_request_reading_epoch``). A kept chain whose only deny list is the store's
        then leaves its revocation check to :meth:`recheck`, with no look-up of its own.
        """
        rules = self._config.delegation
        if intent.delegation is None and (rules is None or not rules.required_principals):
            return NO_DELEGATION
        deferred: Verdict | None = None
        try:
            kept = None if intent.delegation is None else await self._chain(session, intent.delegation)
            chain = None if kept is None else kept.chain
            if kept is not None:
                priority = intent.priority or DEFAULT_PRIORITY
                if not kept.fits(now, intent.goal, priority):
                    kept.chain.check_use(
                        now=now,
                        client_did=session.client_did,
                        server_did=session.server_did,
                        goal=intent.goal,
                        priority=priority,
                    )
                    kept.scoped = True  # what does not change on this session has passed
                if epoch_later and kept.epochs is not None and self._store_list_only():
                    deferred = Verdict(chain=kept.chain, recheck=kept)
                else:
                    await self._check_revoked(kept)
            if rules is not None:
                refused = rules.refusal(intent.goal, chain)
                if refused is not None:
                    raise refused
        except A2AError as exc:
            return Verdict(refusal=exc)
        if kept is None:
            return NO_DELEGATION
        return deferred if deferred is not None else kept.verdict

    async def recheck(self, verdict: Verdict, epoch: object) -> Verdict:
        """A deferred verdict, given the store's epoch read with steps 7-8: the same chain
        when the deny list has not changed since it was found clean, else looked up again."""
        kept: _Kept = verdict.recheck
        if (epoch,) == kept.epochs:
            return kept.verdict
        try:
            await self._check_revoked(kept)
        except A2AError as exc:
            return Verdict(refusal=exc)
        return kept.verdict

    def _store_list_only(self) -> bool:
        """Whether the one deny list to read is the store's own, in another process."""
        lists, local = self._deny_lists()
        only = lists[0] if len(lists) == 1 else None
        store: object = self._config.store
        return not local and isinstance(only, StoreRevocations) and only.store is store

    def forget(self, session_id: str) -> None:
        """Drop the chains kept for a session that ended."""
        for ref in self._per_session.pop(session_id, ()):
            self._verified.pop((session_id, ref), None)

    async def _chain(self, session: SessionRecord, value: tuple[str, ...] | str) -> _Kept:
        ref = reference_of(value)
        hit = self._verified.get((session.session_id, ref))
        if hit is not None:
            self._verified.move_to_end((session.session_id, ref))
            return hit
        if isinstance(value, str):
            # Another worker, or a chain this one has since let go: the client sends it again.
            raise DelegationRefused(f"delegation refused: chain {ref} {CHAIN_UNKNOWN}")
        chain = parse_chain(value)
        keys = await self._resolve_keys(chain)
        verify_signatures(chain, keys.__getitem__)
        return self._keep(session.session_id, chain)

    async def _resolve_keys(self, chain: Chain) -> dict[Link, bytes]:
        resolver = self._config.resolver
        now = resolver.clock()
        keys: dict[Link, bytes] = {}
        for at, link in enumerate(chain.links):
            try:
                resolved = await resolver.resolve(link.issuer)
                resolved.check_key_current(link.kid, now)
            except A2AError as exc:
                what = "cannot be resolved" if isinstance(exc, DIDResolutionError) else "is not usable"
                raise DelegationRefused(
                    f"delegation refused: link {at}: issuer {link.issuer[:128]} {what}: {exc.message}"[:400]
                ) from None
            key = resolved.key_for(link.kid)
            if key is None:
                raise DelegationRefused(
                    f"delegation refused: link {at}: {link.kid[:200]} is not a key of the issuer's DID"
                )
            keys[link] = key
        return keys

    def _keep(self, session_id: str, chain: Chain) -> _Kept:
        rules = self._config.delegation
        limit = rules.max_cached_chains if rules is not None else 1
        mine = self._per_session.setdefault(session_id, [])
        mine.append(chain.hash)
        kept = self._verified[(session_id, chain.hash)] = _Kept(chain)
        while len(mine) > limit:
            self._verified.pop((session_id, mine.pop(0)), None)
        while len(self._verified) > MAX_CACHED_CHAINS:
            (old_session, old_ref), _ = self._verified.popitem(last=False)
            hashes = self._per_session.get(old_session)
            if hashes is not None:
                with contextlib.suppress(ValueError):
                    hashes.remove(old_ref)
                if not hashes:
                    del self._per_session[old_session]
        return kept

    def _deny_lists(self) -> tuple[tuple[Any, ...], bool]:
        """The deny lists to read, and whether all of them are in this process.

        Worked out once per configuration (a store or a list replaced on a live server is
        seen at the next intent): a runtime Protocol check costs as much as the rest of a
        later use of a chain.
        """
        cfg = self._config
        key = (cfg.store, cfg.key_guard.revocations)
        if self._lists is not None and self._lists[0][0] is key[0] and self._lists[0][1] is key[1]:
            return self._lists[1], self._lists[2]
        store: object = cfg.store
        # The store's own list is read once below, however the server was handed it.
        lists: list[Any] = [
            lst
            for lst in cfg.key_guard.revocations
            if not (isinstance(lst, StoreRevocations) and lst.store is store)
        ]
        if isinstance(store, RevocationStore):
            lists.append(StoreRevocations(store))
        local = all(
            isinstance(lst, FileRevocations)
            or (isinstance(lst, StoreRevocations) and isinstance(lst.store, MemoryStore))
            for lst in lists
        )
        self._lists = (key, tuple(lists), local)
        return self._lists[1], local

    async def _epochs(self, lists: tuple[Any, ...], local: bool) -> tuple[object, ...] | None:
        """Every list's epoch (one look-up each), or None when one of them keeps none."""
        if local:
            epochs = [lst.epoch_now() for lst in lists]
        elif all(hasattr(lst, "epoch") for lst in lists):
            epochs = list(await self._gather(*(lst.epoch() for lst in lists)))
        else:  # a list of the application's own, without an epoch: read in full
            return None
        return None if any(e is None for e in epochs) else tuple(epochs)

    async def _check_revoked(self, kept: _Kept) -> None:
        """Every link against every deny list: a revoked link ends everything below it.

        Skipped when no list has changed since the chain was last found clean (the epochs).
        """
        lists, local = self._deny_lists()
        if not lists:
            return
        chain = kept.chain
        try:
            # Read before looking: a change made after this read moves the epoch again.
            epochs = await self._epochs(lists, local)
            if epochs is not None and epochs == kept.epochs:
                return
            probes: list[tuple[str, tuple[str, ...]]] = [(link.issuer, (link.kid,)) for link in chain.links]
            probes += [(REVOCATION_PREFIX + link.jti, ()) for link in chain.links]
            lookups = [lst.lookup(did, kids) for lst in lists for did, kids in probes]
            # In-process lists answer at once; a shared store's look-ups go out together.
            found = [await one for one in lookups] if local else await self._gather(*lookups)
        except RuntimeError:  # a deny list that cannot be read: fail closed
            raise InternalError("the revocation list cannot be read") from None
        hit: Revocation | None = next((h for h in found if h is not None), None)
        if hit is not None:
            kept.epochs = None
            if hit.target.startswith(REVOCATION_PREFIX):
                raise DelegationRefused(f"delegation refused: token id revoked: {hit.target[:100]}")
            raise DelegationRefused(f"delegation refused: {revoked_message(hit)}"[:400])
        kept.epochs = epochs
