"""What a store remembers about intent ids (the ``intent_id`` extension, PROTOCOL.md §12.5).

A request that carries an ``intent_id`` is, besides §6.1 steps 7-8, a *claim* of
(agent, client DID, intent_id), the agent being the server DID (several agents may share
one store; an id claimed at one of them is unknown at the others): the first request with
that id runs, every later one (on any session, at any worker) gets that run's answer, or
waits for it, and never runs the intent again. The claim is made in the same atomic step
as the sequence check and the rate count (:meth:`IntentStore.begin_intent`), so a shared
store answers it in the same round trip. (A RedisStore spread over a cluster makes it as
two single-slot scripts in that round trip, and gives back what a request that does not
run took: see redis_cluster.py.)

A claim lives ``retention`` seconds (``ServerLimits.intent_id_retention``) whatever happens
to the session that made it, and holds:

* the hash of the intent as signed (``hash_of(intent)``): a later request with the same id
  and another intent is refused, it never gets the first one's answer;
* ``running_until``: while the first run has not reported its answer, the claim is
  RUNNING up to that time (the longest a run can take, plus a margin; a stream moves it on
  as it goes, :meth:`IntentStore.renew_intent`), and LOST after it (the worker died mid-run:
  the outcome is unknown, and the intent is not run again);
* the answer (a :class:`~a2a_secure.store.base.StoredReply`, kept unsigned), once DONE;
* the owner (a random token of the request that made the claim) and whether its handler
  started: the request records the start (:meth:`IntentStore.start_intent`) before it calls
  the handler. A claim whose handler never started (its worker died, paused or was refused
  a replicated write between the claim and the start) is taken over by the next request
  with the same id and intent, which runs it: the owner's start then fails and it does not
  run. A claim made before starts were recorded counts as started.

Each DID may hold at most ``max_per_did`` unexpired claims at each agent, and the store at
most ``max_total`` in all (for every agent sharing it, as its open sessions are bounded):
past either bound a new id is refused (FULL, TOTAL_FULL; nothing claimed, nothing
consumed), never by evicting a claim still inside its retention window, which would let
that intent run a second time. A request whose id is already claimed is answered from the
claim even when the store is full: it adds nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from a2a_secure.store.base import Begin, Store, StoredReply

__all__ = ["Claim", "ClaimKind", "ClaimRequest", "IntentStore", "supports_intent_ids"]


class ClaimKind(enum.Enum):
    """What the store knows about (client DID, intent_id) for a request's intent hash."""

    NEW = "new"  # claimed now by this request: run it
    DONE = "done"  # the same intent ran: ``reply`` is its answer
    RUNNING = "running"  # the same intent is still running (or its answer is on its way)
    LOST = "lost"  # the same intent's run never reported an answer: outcome unknown
    CONFLICT = "conflict"  # the id was claimed for a different intent
    FULL = "full"  # the DID holds ``max_per_did`` claims: nothing claimed, nothing consumed
    TOTAL_FULL = "total_full"  # the store holds ``max_total`` claims: likewise
    UNKNOWN = "unknown"  # no claim (only from :meth:`IntentStore.get_claim`)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The claim a request with an ``intent_id`` makes (all times in Unix seconds)."""

    intent_id: str
    intent_hash: str
    running_until: int
    expires_at: int
    max_per_did: int
    # The bound on the claims of every agent and DID in the store (None: no bound).
    max_total: int | None = None
    # The request's own random token: only it may record the start (start_intent).
    owner: bytes = b""


@dataclass(frozen=True, slots=True)
class Claim:
    """The store's answer about a claim; ``retry_after`` (seconds) only for FULL, TOTAL_FULL."""

    kind: ClaimKind
    reply: StoredReply | None = None
    retry_after: int = 0


@runtime_checkable
class IntentStore(Store, Protocol):
    """A :class:`Store` that also remembers intent ids; each method is atomic."""

    async def begin_intent(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        claim: ClaimRequest,
        agent: str = "",
    ) -> tuple[Begin, Claim | None]:
        """:meth:`Store.begin_request` and, when it would answer NEW, ``agent``'s claim,
        atomically.

        The claim is None unless the request is new. A FULL or TOTAL_FULL claim comes with a
        Begin whose kind is ``RATE_LIMITED``: nothing was consumed or counted.
        """
        ...

    async def get_claim(
        self, client_did: str, intent_id: str, intent_hash: str, now: float, *, agent: str = ""
    ) -> Claim:
        """The claim's state as seen by a request with ``intent_hash`` (never NEW or FULL)."""
        ...

    async def finish_intent(
        self, client_did: str, intent_id: str, intent_hash: str, reply: StoredReply, *, agent: str = ""
    ) -> None:
        """Keep ``reply`` as the answer of the claim, if it is still there for that hash."""
        ...

    async def renew_intent(
        self,
        client_did: str,
        intent_id: str,
        intent_hash: str,
        owner: bytes,
        running_until: int,
        *,
        agent: str = "",
    ) -> None:
        """Move the lease of ``owner``'s unanswered claim to ``running_until`` (a stream that
        goes on); nothing when the claim is not ``owner``'s or has its answer."""
        ...

    async def start_intent(
        self,
        client_did: str,
        intent_id: str,
        intent_hash: str,
        owner: bytes,
        *,
        started: bool = True,
        agent: str = "",
    ) -> bool:
        """Record that ``owner``'s handler starts (``started=False``: that it did not after all).

        True when the claim is still ``owner``'s, for that hash, without an answer, and was
        not (``started=False``: was) started; else nothing changes and it is False: another
        request took the claim over, and this one must not run the intent. Raises
        :class:`~a2a_secure.errors.Unavailable` when the store cannot say (or, with
        replication required, the replicas did not confirm the start).
        """
        ...


def supports_intent_ids(store: object) -> bool:
    """Whether ``store`` can remember intent ids: it has the three methods, and does not
    say otherwise with a ``supports_intent_ids`` attribute that is not True (a store that
    cannot make the claim atomic with the sequence in some configuration)."""
    return getattr(store, "supports_intent_ids", True) is True and all(
        callable(getattr(store, name, None))
        for name in ("begin_intent", "get_claim", "finish_intent", "start_intent", "renew_intent")
    )
