"""Actions waiting for a person's approval (store/actions.py), kept in process memory.

The part of :class:`~a2a_secure.store.memory.MemoryStore` that keeps pending actions: by id,
the pending ones per caller (the per-DID bound) and in total (the store's bound, a counter),
and two heaps by expiry, so that the bounds and the forgetting of decided records take time
in the number of entries due, never in the number held.
"""

from __future__ import annotations

import heapq

from a2a_secure.store.actions import ActionState, Decision, DecisionKind, PendingAction
from a2a_secure.store.base import Added
from a2a_secure.store.expiry import heap_needs_compacting, pop_expired

__all__ = ["MemoryActions"]


class MemoryActions:
    """Pending actions of a :class:`~a2a_secure.store.memory.MemoryStore` (the module's text)."""

    def _init_actions(self) -> None:
        # Actions waiting for approval (store/actions.py), and the pending ones per caller.
        self._actions: dict[str, PendingAction] = {}
        self._actions_pending: dict[str, set[str]] = {}
        self._actions_pending_total = 0
        # (expires_at, id): when a pending action stops counting; (keep_until, id): when the
        # record is forgotten.
        self._actions_by_expiry: list[tuple[int, str]] = []
        self._actions_by_keep: list[tuple[int, str]] = []

    # -- actions waiting for approval (store/actions.py) ------------------------------------
    def _unpend(self, action: PendingAction) -> None:
        ids = self._actions_pending.get(action.caller_did)
        if ids is not None and action.action_id in ids:
            ids.discard(action.action_id)
            self._actions_pending_total -= 1
            if not ids:
                del self._actions_pending[action.caller_did]

    def _sweep_actions(self, now: float) -> None:
        # A pending action stops counting at its expiry, and is forgotten at keep_until.
        for expires_at, action_id in pop_expired(self._actions_by_expiry, now):
            action = self._actions.get(action_id)
            if action is not None and action.expires_at == expires_at:
                self._unpend(action)
        for keep_until, action_id in pop_expired(self._actions_by_keep, now):
            action = self._actions.get(action_id)
            if action is not None and action.keep_until == keep_until:
                del self._actions[action_id]
                self._unpend(action)
        if heap_needs_compacting(self._actions_by_keep, len(self._actions)):
            self._actions_by_keep = [(a.keep_until, i) for i, a in self._actions.items()]
            heapq.heapify(self._actions_by_keep)
        if heap_needs_compacting(self._actions_by_expiry, self._actions_pending_total):
            self._actions_by_expiry = [
                (self._actions[i].expires_at, i) for ids in self._actions_pending.values() for i in ids
            ]
            heapq.heapify(self._actions_by_expiry)

    def _pending_counts(self, caller_did: str) -> tuple[int, int]:
        return len(self._actions_pending.get(caller_did, ())), self._actions_pending_total

    async def add_action(
        self, action: PendingAction, *, max_per_caller: int, max_total: int, now: float
    ) -> Added:
        """See :meth:`ActionStore.add_action`."""
        self._sweep_actions(now)
        mine, total = self._pending_counts(action.caller_did)
        if mine >= max_per_caller:
            return Added.OWN_FULL
        # Decided records are kept a while for clear answers, but never past 4x the bound.
        if total >= max_total or len(self._actions) >= 4 * max_total:
            return Added.TOTAL_FULL
        if action.action_id in self._actions:
            return Added.TAKEN
        self._actions[action.action_id] = action
        self._actions_pending.setdefault(action.caller_did, set()).add(action.action_id)
        self._actions_pending_total += 1
        heapq.heappush(self._actions_by_expiry, (action.expires_at, action.action_id))
        heapq.heappush(self._actions_by_keep, (action.keep_until, action.action_id))
        return Added.ADDED

    async def get_action(self, action_id: str, now: float) -> PendingAction | None:
        """See :meth:`ActionStore.get_action`."""
        action = self._actions.get(action_id)
        if action is None:
            return None
        if action.keep_until <= now:
            del self._actions[action_id]
            self._unpend(action)
            return None
        return action

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
        """See :meth:`ActionStore.decide_action`."""
        action = await self.get_action(action_id, now)
        if action is None or action.caller_did != caller_did:
            return Decision(DecisionKind.UNKNOWN)
        if action.state is not ActionState.PENDING:
            return Decision(DecisionKind.ALREADY, action)
        if action.action_hash != action_hash:
            return Decision(DecisionKind.MISMATCH, action)
        if now >= action.expires_at:
            expired = action.decided(ActionState.EXPIRED, None, int(now))
            self._actions[action_id] = expired
            self._unpend(action)
            return Decision(DecisionKind.EXPIRED, expired)
        state = ActionState.APPROVED if approve else ActionState.REJECTED
        decided = action.decided(state, decided_by, int(now))
        self._actions[action_id] = decided
        self._unpend(action)
        return Decision(DecisionKind.DECIDED, decided)
