"""The server's side of delegation chains (PROTOCOL.md §12.7): keys, deny list, cache.

The rules are :mod:`a2a_secure.delegation`'s; this room feeds them what takes I/O:
each issuer's key, resolved from its DID with the server's resolver (never taken from the
token), and the deny list (the store's, shared by every worker, and the server's other
lists), read at every use. A chain verified once is kept per session by its hash
(:mod:`.chain_cache`: bounded per session, and each session's full verifications bounded by
its rate), so later intents carry the hash alone; its time, audience, targets, revocations
and the retirement of the keys that signed it are still checked at each use.

A later use costs the same for any chain length: the chain is kept with what its first use
on the session found (audience and targets passed, its window as one interval) and with the
epoch of each deny list (:mod:`a2a_secure.store.revocation`) read before it was last found
clean. Each use reads the epochs again (in process: nothing to wait for; on one Redis: in
the script that takes the sequence, :meth:`DelegationGuard.recheck`; else one GET) and looks
every link up again only when one has moved, so a revocation written by any worker ends the
chain at its next use. A list that keeps no epoch is looked up in full.

:meth:`DelegationGuard.verdict` runs before §6.1 step 7 and raises only the 503 of a session
past its budget of verifications (signed, the sequence not used up); any other refusal is
given at step 9 (-32042, signed, the sequence used up) like any refusal of the policy, and an
intent refused there claims no ``intent_id``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from a2a_secure import system
from a2a_secure.delegation import (
    CHAIN_UNKNOWN,
    CHAIN_UNKNOWN_MEMBER,
    DELEGATION,
    REVOCATION_PREFIX,
    Chain,
    DelegationRefused,
    Link,
    parse_chain,
    reference_of,
    verify_signatures,
)
from a2a_secure.errors import A2AError, DIDResolutionError, InternalError, InvalidParams, Unavailable
from a2a_secure.protocol.keyguard import revoked_message
from a2a_secure.protocol.models import Intent
from a2a_secure.protocol.sealing import CHAIN_MEMBER
from a2a_secure.protocol.server.chain_cache import MAX_CACHED_CHAINS, ChainCache, Kept
from a2a_secure.protocol.server.common import MonoClock, ServerConfig
from a2a_secure.store.base import SessionRecord
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import FileRevocations, Revocation, RevocationStore, StoreRevocations
from a2a_secure.system import WallSeconds

__all__ = [
    "MAX_CACHED_CHAINS",
    "NO_DELEGATION",
    "REASON_MEMBER",
    "DelegationGuard",
    "Verdict",
    "as_told",
    "claim_form",
    "quiet_refusal",
]

REASON_MEMBER: Final = "reason"
"""The member of a sealed session's delegation refusal ``data`` with the full message (§12.7)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the chain of one intent allows: the verified chain, or the refusal to give at step 9."""

    chain: Chain | None = None
    refusal: A2AError | None = None
    # A kept chain whose revocation check waits for the deny list's epoch that the store
    # reads with the sequence (:meth:`DelegationGuard.recheck`); None: checked already.
    recheck: Kept | None = None


NO_DELEGATION: Final = Verdict()


def quiet_refusal(exc: A2AError) -> A2AError:
    """``exc`` as a sealed session gives it: a message naming nothing of the chain (§12.7).

    The message is never sealed; the full one goes in ``data.reason``, sealed with the rest of
    the error's data (beside ``chain_unknown``, which keeps its text's ending). Any other
    error is returned as it is.
    """
    if not isinstance(exc, DelegationRefused) or REASON_MEMBER in (exc.data or {}):
        return exc  # not a refusal of the chain, or already quiet
    data = dict(exc.data or {})
    data[REASON_MEMBER] = exc.message
    unknown = CHAIN_UNKNOWN_MEMBER in data
    message = f"delegation refused: chain {CHAIN_UNKNOWN}" if unknown else "delegation refused"
    return DelegationRefused(message, data=data)


def as_told(refusal: A2AError, session: SessionRecord) -> A2AError:
    """``refusal`` as ``session`` is told it: quiet on a sealed session (:func:`quiet_refusal`)."""
    return quiet_refusal(refusal) if session.seal_keys else refusal


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


def _epoch_reader(lst: Any) -> Callable[[], object]:
    """How to read the epoch of a deny list in this process, with no look-up on the way."""
    if isinstance(lst, StoreRevocations):
        read: Callable[[], object] | None = getattr(lst.store, "revocation_epoch_now", None)
        if read is not None:
            return read
    return lst.epoch_now  # type: ignore[no-any-return]


class DelegationGuard:
    """Verifies the chains intents carry, for one server (see the module documentation).

    State: the chains verified on each session (:class:`~.chain_cache.ChainCache`): at most
    ``DelegationRules.max_cached_chains`` per session and :data:`MAX_CACHED_CHAINS` in all.
    """

    def __init__(
        self, config: ServerConfig, *, gather: Gather | None = None, monotonic: MonoClock = system.mono_now
    ) -> None:
        """``gather``: awaits several look-ups of a shared store together (the runtime's
        ``asyncio.gather``); by default they are awaited one after the other. ``monotonic``:
        the clock of each session's budget of verifications."""
        self._config = config
        self._gather = gather or _one_by_one
        self._monotonic = monotonic
        self._cache = ChainCache()
        # (the store and lists it was worked out for, the deny lists, all in this process)
        self._lists: tuple[tuple[object, object], tuple[Any, ...], bool] | None = None
        # For lists all in this process, how to read each one's epoch, found with the lists.
        self._epoch_readers: tuple[Callable[[], object], ...] = ()

    def check_member(self, intent: Intent) -> None:
        """Step 1: ``delegation`` is an unknown member at a server without the extension, and
        ``sealed_delegation`` at one that does not declare both it and sealed intents (§12.6)."""
        cfg = self._config
        if cfg.delegation is None:
            name = DELEGATION if intent.delegation is not None else CHAIN_MEMBER
            raise InvalidParams(f"intent: unexpected member {name!r}")
        if intent.sealed_delegation is not None and not cfg.limits.sealed_intents:
            raise InvalidParams(f"intent: unexpected member {CHAIN_MEMBER!r} (this server does not seal)")

    async def verdict(
        self,
        session: SessionRecord,
        intent: Intent,
        now: WallSeconds,
        value: tuple[str, ...] | str | None = None,
        *,
        epoch_later: bool = False,
    ) -> Verdict:
        """The chain ``intent`` acts under, verified for this session now, or why it is refused.

        Checks 1-7 and 9 of §12.7: the chain itself, whoever uses it, here, now. Check 8 (the
        goal and the priority) and the goals reserved to principals are the admission's
        (:mod:`.admission`), made for every goal the intent runs, a goal inside a goal included.
        ``value``: the chain, opened when it came sealed (by default ``intent.delegation``).
        On a sealed session a refusal names nothing of the chain in its message: the
        admission gives it so (:func:`quiet_refusal`), the message is never sealed.

        ``epoch_later``: the store will read its deny list's epoch with steps 7-8 (one Redis:
        ``begin_request_reading_epoch``). A kept chain whose only deny list is the store's
        then leaves its revocation check to :meth:`recheck`, with no look-up of its own.
        """
        if value is None:
            value = intent.delegation
        if value is None:
            return NO_DELEGATION
        try:
            kept = await self._chain(session, value, now)
            if not (kept.scoped and kept.not_before <= now < kept.expires):
                refused = kept.chain.refusal_now(
                    now=now, client_did=session.client_did, server_did=session.server_did
                )
                if refused is not None:
                    raise refused
                kept.scoped = True  # what does not change on this session has passed
            if epoch_later and kept.epochs is not None and self._store_list_only():
                return Verdict(chain=kept.chain, recheck=kept)
            await self._check_revoked(kept)
        except Unavailable:  # past this session's budget of verifications: try again later
            raise
        except A2AError as exc:
            return Verdict(refusal=exc)
        return self._verdict_of(kept)

    async def recheck(self, verdict: Verdict, epoch: object) -> Verdict:
        """A deferred verdict, given the store's epoch read with steps 7-8: the same chain
        when the deny list has not changed since it was found clean, else looked up again
        (the sequence is used up by then: any refusal, a store down included, is step 9's)."""
        kept = verdict.recheck
        assert kept is not None
        if (epoch,) == kept.epochs:
            return self._verdict_of(kept)
        try:
            await self._check_revoked(kept)
        except A2AError as exc:
            return Verdict(refusal=exc)
        return self._verdict_of(kept)

    @staticmethod
    def _verdict_of(kept: Kept) -> Verdict:
        if kept.verdict is None:
            kept.verdict = Verdict(chain=kept.chain)
        return kept.verdict  # type: ignore[no-any-return]

    def _store_list_only(self) -> bool:
        """Whether the one deny list to read is the store's own, in another process."""
        lists, local = self._deny_lists()
        only = lists[0] if len(lists) == 1 else None
        store: object = self._config.store
        return not local and isinstance(only, StoreRevocations) and only.store is store

    def forget(self, session_id: str) -> None:
        """Drop the chains kept for a session that ended."""
        self._cache.forget(session_id)

    async def _chain(self, session: SessionRecord, value: tuple[str, ...] | str, now: WallSeconds) -> Kept:
        ref = reference_of(value)
        kept = self._cache.get(session.session_id, ref)
        if kept is not None:
            retired = kept.refusal(now)
            if retired is not None:
                raise retired
            return kept
        if isinstance(value, str):
            # Another worker, or a chain this one has since let go: the client sends it again.
            message = f"delegation refused: chain {ref} {CHAIN_UNKNOWN}"
            raise DelegationRefused(message, data={CHAIN_UNKNOWN_MEMBER: ref})
        # Counted before anything is decoded, resolved or verified (503 past the budget).
        self._cache.spend(session.session_id, session.policy, self._monotonic())
        chain = parse_chain(value)
        keys, kept = await self._resolve_keys(chain, now)
        verify_signatures(chain, keys.__getitem__)
        rules = self._config.delegation
        self._cache.keep(session.session_id, kept, rules.max_cached_chains if rules is not None else 1)
        return kept

    async def _resolve_keys(self, chain: Chain, now: WallSeconds) -> tuple[dict[Link, bytes], Kept]:
        """Each link's key, resolved from its issuer's DID; a retired key past its ``expires``
        (Unix seconds, compared with the intent's wall-clock ``now``) refuses the chain. Also
        the chain as it is kept: until the earliest ``expires`` of the keys that signed it."""
        resolver = self._config.resolver
        keys: dict[Link, bytes] = {}
        until: WallSeconds | None = None
        retired = ""
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
            end = resolved.expires.get(link.kid)
            if end is not None and (until is None or end < until):
                until = WallSeconds(end)
                retired = (
                    f"delegation refused: link {at}: issuer {link.issuer[:128]} is not usable: key"
                    f" {link.kid[:200]} was retired; its overlap window ended at {end}"
                )[:400]
        return keys, Kept(chain, until, retired)

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
        self._epoch_readers = tuple(_epoch_reader(lst) for lst in lists) if local else ()
        return self._lists[1], local

    async def _epochs(self, lists: tuple[Any, ...], local: bool) -> tuple[object, ...] | None:
        """Every list's epoch (one look-up each), or None when one of them keeps none."""
        if local:
            readers = self._epoch_readers
            if len(readers) == 1:  # the store's own list: one attribute read
                only = readers[0]()
                return None if only is None else (only,)
            epochs = [read() for read in readers]
        elif all(hasattr(lst, "epoch") for lst in lists):
            epochs = list(await self._gather(*(lst.epoch() for lst in lists)))
        else:  # a list of the application's own, without an epoch: read in full
            return None
        return None if any(e is None for e in epochs) else tuple(epochs)

    async def _check_revoked(self, kept: Kept) -> None:
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
