"""Actions waiting for a person's approval, and the store operations that keep them.

A handler that must not act before a person agrees answers ``NeedsApproval``; the server then
keeps a :class:`PendingAction` in the shared store, so that whichever worker receives the
approval can find it and run it. The store methods are atomic check-and-updates, as the other
store methods are: the pending → approved transition happens once, whatever the number of
workers racing for it, and that is what makes an approved action run exactly once.

An :class:`ActionStore` is a separate interface from :class:`~a2a_secure.store.base.Store`,
so a custom store that predates approvals keeps satisfying ``Store``; ``MemoryStore`` and
``RedisStore`` implement both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from a2a_secure.store.base import Added

__all__ = ["ActionState", "ActionStore", "Decision", "DecisionKind", "PendingAction"]


class ActionState(enum.Enum):
    """Where a stored action stands. Only ``PENDING`` may change, and only once."""

    PENDING = "pending"
    APPROVED = "approved"  # claimed for its single run
    REJECTED = "rejected"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class PendingAction:
    """One action waiting for (or past) its approval.

    ``action`` names the executor registered on every worker (never a closure);
    ``action_hash`` is ``hash_of(action_data)``, what the approver signs. The record is kept
    until ``keep_until`` (after ``expires_at``), so that a late or replayed approval is told
    what became of the action instead of "unknown".
    """

    action_id: str
    action: str
    goal: str
    caller_did: str
    action_data: Any
    action_hash: str
    preview: Any
    created_at: int
    expires_at: int
    keep_until: int
    state: ActionState = ActionState.PENDING
    decided_by: str | None = None
    decided_at: int | None = None
    server_did: str = ""  # the agent that created it: only that agent may act on it
    # On whose behalf it was asked (PROTOCOL.md §12.7): the verified chain's principal and
    # name, None without a chain. The approval check reads the principal, on any worker.
    principal: str | None = None
    delegation: str | None = None
    # An action asked on a sealed session (PROTOCOL.md §12.6) is kept sealed at rest
    # (protocol/sealed_actions.py): ``sealed`` holds its data and preview as ciphertext,
    # ``sealed_kid`` the agent key id it was sealed under; ``action_data`` and ``preview`` are
    # then None and ``action_hash`` is an HMAC of the hash the approver signs. None: in the clear.
    sealed: str | None = None
    sealed_kid: str | None = None

    def state_at(self, now: float) -> ActionState:
        """The state, with a pending action past ``expires_at`` seen as expired."""
        if self.state is ActionState.PENDING and now >= self.expires_at:
            return ActionState.EXPIRED
        return self.state

    def decided(self, state: ActionState, by: str | None, at: int) -> PendingAction:
        """The same action in ``state``, decided by ``by`` at ``at``."""
        return replace(self, state=state, decided_by=by, decided_at=at)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for shared stores (``principal`` and ``delegation`` only when set,
        so an action without a chain is stored as before; ``sealed`` and ``sealed_kid`` likewise)."""
        out = {
            "action_id": self.action_id,
            "action": self.action,
            "goal": self.goal,
            "caller_did": self.caller_did,
            "action_data": self.action_data,
            "action_hash": self.action_hash,
            "preview": self.preview,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "keep_until": self.keep_until,
            "state": self.state.value,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at,
            "server_did": self.server_did,
        }
        if self.principal is not None:
            out["principal"] = self.principal
            out["delegation"] = self.delegation
        if self.sealed is not None:
            out["sealed"] = self.sealed
            out["sealed_kid"] = self.sealed_kid
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> PendingAction:
        """Inverse of :meth:`to_dict`."""
        data = dict(obj)
        data["state"] = ActionState(data.get("state", "pending"))
        return cls(**data)


class DecisionKind(enum.Enum):
    """The outcome of :meth:`ActionStore.decide_action`."""

    DECIDED = "decided"  # pending → approved/rejected now: this caller (alone) acts on it
    UNKNOWN = "unknown"  # no such action (never existed, or forgotten after keep_until)
    EXPIRED = "expired"  # still pending at expires_at: now marked expired
    ALREADY = "already"  # decided before (``action.state`` says how)
    MISMATCH = "mismatch"  # the hash is not the stored one: nothing changed


@dataclass(frozen=True, slots=True)
class Decision:
    """What :meth:`ActionStore.decide_action` decided, with the action as it now stands."""

    kind: DecisionKind
    action: PendingAction | None = None


@runtime_checkable
class ActionStore(Protocol):
    """Pending actions, one atomic operation per method. ``now`` is Unix seconds."""

    async def add_action(
        self, action: PendingAction, *, max_per_caller: int, max_total: int, now: float
    ) -> Added:
        """Store a new pending action; a false :class:`Added` (nothing stored) when a bound is
        reached, saying which.

        Only pending, unexpired actions count against the bounds (per ``caller_did`` and in
        total); an action still inside its window is never evicted to make room.
        """
        ...

    async def get_action(self, action_id: str, now: float) -> PendingAction | None:
        """The action as stored (until its ``keep_until``), or None."""
        ...

    async def decide_action(
        self,
        action_id: str,
        *,
        caller_did: str,
        action_hash: str,
        approve: bool,
        decided_by: str,
        now: float,
    ) -> Decision:
        """Move a pending, unexpired action whose hash is ``action_hash`` to approved/rejected.

        Atomic: of several concurrent calls, one gets ``DECIDED`` and the others
        ``ALREADY``. A wrong hash (``MISMATCH``) changes nothing. ``caller_did`` is the
        caller stored with the action (read before, from :meth:`get_action`).
        """
        ...
