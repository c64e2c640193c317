"""One admission for the goal that runs, wherever it runs (PROTOCOL.md §6.1 steps 9-10).

A goal runs directly (an intent, an A2A method, which is an intent for its goal), inside
another goal (``tool.execute``'s tool), or later on someone's approval (an approved action,
§12.1). Every one of them is admitted here, by :func:`admit_goal`, with the same rules in
the same order, so that no dispatcher can run a goal a direct intent for it could not:

1. the session's policy (§5.4) allows the goal;
2. the delegation chain the intent acts under (§12.7) is usable (checks 1-7 and 9, made
   once per intent by :class:`~.delegation.DelegationGuard`), and covers *this* goal at the
   priority asked (check 8): a chain that grants ``tool.execute`` grants no tool it does
   not name;
3. a goal reserved to named principals runs only on behalf of one of them: the principal of
   a chain that covers the goal (or, for an approved action, the one stored with it when
   the intent that asked for it was admitted), never one a request names;
4. the caller's priority rights (§12.3);
5. data that came sealed (§12.6) runs only on a sealed session;
6. a handler serves the goal (-32601), as a stream only if asked so (-32602); and when the
   goal runs another (:meth:`~.dispatcher.IntentDispatcher.inner_goal`), that goal is admitted
   by the same rules, with the same session, chain and priority, and is not one that always
   streams (-32602: a goal inside a goal answers once).

Pure: no I/O, no clock of its own. Refusals are raised (-32042 for rules 1-4, -32602, -32601);
the intent's refusal is given at step 9, signed, after the sequence is used (§6.1).
"""

from __future__ import annotations

from typing import Any

from a2a_secure.errors import InvalidParams, MethodNotFound, PolicyViolation
from a2a_secure.protocol.priority import DEFAULT_PRIORITY
from a2a_secure.protocol.server.common import ServerConfig
from a2a_secure.protocol.server.delegation import NO_DELEGATION, Verdict, as_told
from a2a_secure.store.actions import PendingAction
from a2a_secure.store.base import SessionRecord

__all__ = ["admit_action", "admit_goal"]


def admit_goal(
    cfg: ServerConfig,
    session: SessionRecord,
    goal: str,
    inputs: Any,
    *,
    requested: int | None = None,
    stream: bool | None = None,
    delegated: Verdict = NO_DELEGATION,
    principal: str | None = None,
    sealed: bool = False,
    handled: bool | None = None,
) -> int:
    """Admit ``goal`` with ``inputs`` on ``session``; the priority it runs at, or the refusal.

    ``requested``: the intent's priority (None when absent); ``stream``: its ``stream``
    constraint (None when absent); ``delegated``: the verdict on the chain it acts under.
    ``principal``: for a goal run without its chain at hand (an approved action), the
    principal stored when the intent that asked for it was admitted. ``sealed``: the goal's
    data came sealed. ``handled``: whether something other than the dispatcher serves the goal
    (an approved action's executor); None: the dispatcher's handler, and its inner goal.
    """
    # 1. The policy agreed in the handshake, not today's configuration ...
    if not session.policy.allows(goal):
        raise PolicyViolation(f"intent {goal[:64]!r} is not allowed by the session policy")
    # 2. ... intersected with the scope of the chain the intent acts under.
    if delegated.refusal is not None:
        raise as_told(delegated.refusal, session)
    chain = delegated.chain
    if chain is not None:
        refused = chain.refusal_for(goal, requested or DEFAULT_PRIORITY)
        if refused is not None:
            raise as_told(refused, session)
        principal = chain.principal
    # 3. A goal reserved to named principals.
    rules = cfg.delegation
    if rules is not None and rules.required_principals:
        refusal = rules.refusal_of(goal, principal)
        if refusal is not None:
            raise as_told(refusal, session)
    # 4. The server's priority rights, also -32042 before anything runs.
    priority = cfg.priority_rights.effective(requested, session.client_did)
    # 5. What came sealed is never run for a session that is not.
    if sealed and not session.seal_keys:
        raise InvalidParams(f"{goal[:64]!r} was asked on a sealed session: it runs only on a sealed session")
    # 6. A handler (step 10), and the goal it runs inside it, if any.
    if handled is not None:
        if not handled:
            raise MethodNotFound(f"no handler for intent {goal[:64]!r}")
        return priority
    dispatcher = cfg.dispatcher
    if not dispatcher.has(goal):
        raise MethodNotFound(f"no handler for intent {goal[:64]!r}")
    if stream is False and dispatcher.is_always_streamed(goal):
        raise InvalidParams(f"intent {goal[:64]!r} is always streamed; stream: false is not allowed")
    inner = dispatcher.inner_goal(goal, inputs)
    if inner is not None:
        inner_goal = inner[0]
        admit_goal(
            cfg, session, inner_goal, inner[1], requested=requested, delegated=delegated, principal=principal
        )
        if dispatcher.is_always_streamed(inner_goal):  # a goal inside a goal answers once
            raise InvalidParams(f"intent {inner_goal[:64]!r} is always streamed; {goal[:64]} cannot run it")
    return priority


def admit_action(cfg: ServerConfig, session: SessionRecord, action: PendingAction) -> None:
    """Admit the goal of an approved ``action`` on the approver's ``session`` before it runs.

    The action's chain is not at hand (its name only is stored): the principal stored with
    it stands for it, as verified when the intent that asked for it was admitted. Its executor
    is the approval engine's to find; an action asked sealed runs only for a sealed session.
    """
    admit_goal(
        cfg,
        session,
        action.goal,
        action.action_data,
        principal=action.principal,
        sealed=action.sealed is not None,
        handled=True,
    )
