"""Human approval before an action runs (PROTOCOL.md §12): the sans-I/O server side.

A handler answers :class:`NeedsApproval` instead of acting. :class:`ApprovalEngine` then
stores the action (``store/actions.py``) and answers the caller with what the person will
approve: the action's id, ``action_hash`` = ``hash_of(action_data)``, the server's preview
and when the offer expires. The person's own agent later sends the signed intent
``tool.approve`` ``{"action_id", "action_hash", "approved"}``; the engine checks, in this
order, that the inputs are exactly those three members, that the signer is a configured
approver, that the action exists, that the signed hash is the stored one, and that the
action is still pending and unexpired, and only then moves it pending → approved in one
atomic store step and runs the stored ``action_data`` with the executor registered under
the action's name. The data the approver sends is never what runs, and of two approvals
racing on two workers only the one that won the store step runs the action.

Why each check is where it is:

* the approver check comes before the look-up, so a DID that approves nothing cannot learn
  which action ids exist;
* a wrong hash is refused before any state changes: a substituted or stale approval must not
  consume the pending action (the person can still approve the real one);
* the executor is found by name on whichever worker receives the approval; a closure would
  exist only in the process that created the action.

The approver entry :data:`PRINCIPAL` (the word ``"principal"`` in an approvers list) names
the principal of the delegation chain (PROTOCOL.md §12.7) an action was asked under: the
chain's root issuer, verified when the intent ran and stored with the action. That DID, and
only on a session of its own (the signer is always the session's client DID, never a
chain's principal), approves the action, besides the DIDs listed with it. An action asked
without a chain has no principal, and the entry matches nobody for it.

An action asked on a sealed session (§12.6) is stored sealed at rest under a key derived
from the agent's own key (``protocol/sealed_actions.py``): the store holds neither its data,
its preview, nor the hash the approver signs in the clear. It is shown, approved and
rejected only on a sealed session of its approver, so data that came sealed never leaves in
the clear; on a session without sealing keys ``tool.pending`` and ``tool.approve`` refuse it
(-32602) after the approver checks, so that they tell nobody else it exists.

Codes: -32602 bad inputs, a hash that is not the stored one, or an action asked sealed
reached on a session that is not, -32042 a signer that is not an approver of this action (or
an action only a principal approves, asked without a chain), -32050
(:class:`~a2a_secure.errors.ActionNotPending`) an action that is unknown, expired, already
approved or rejected, or sealed at rest and not opening with this agent's keys, -32048 too
many pending actions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from a2a_secure import system
from a2a_secure.errors import (
    A2AError,
    ActionNotPending,
    IntentTimeout,
    InternalError,
    InvalidParams,
    PolicyViolation,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.did import check_did_syntax
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.capacity import full, pool_of
from a2a_secure.protocol.sealed_actions import open_action, seal_action
from a2a_secure.protocol.validate import (
    ct_equal,
    exact_members,
    require_b64u_bytes,
    require_bool,
    require_hash,
)
from a2a_secure.store.actions import ActionState, ActionStore, DecisionKind, PendingAction

__all__ = [
    "APPROVAL_GOALS",
    "AUDIT_EVENTS",
    "ActionAdmission",
    "ActionContext",
    "ApprovalEngine",
    "ApprovalSettings",
    "NeedsApproval",
    "PRINCIPAL",
    "TOOL_APPROVE",
    "TOOL_PENDING",
    "approver_dids",
    "new_action_id",
]

TOOL_APPROVE = "tool.approve"
TOOL_PENDING = "tool.pending"
APPROVAL_GOALS = (TOOL_APPROVE, TOOL_PENDING)
ACTION_ID_BYTES = 16  # 128 bits from the CSPRNG: an id cannot be guessed
MAX_ACTION_DATA_BYTES = 64 * 1024
MAX_PREVIEW_BYTES = 8 * 1024

#: The audit events of an action's life (PROTOCOL.md §12); records never hold its data.
AUDIT_EVENTS = (
    "action_created",
    "action_approved",
    "action_rejected",
    "action_refused",
    "action_executed",
    "action_failed",
)

#: The approver entry that names the principal of the action's delegation chain (§12.7).
PRINCIPAL = "principal"

_APPROVE_MEMBERS = frozenset(("action_id", "action_hash", "approved"))
_PENDING_MEMBERS = frozenset(("action_id",))

Clock = Callable[[], float]
RandomSource = Callable[[int], bytes]
AuditHook = Callable[..., object]
#: The agent's signing identity whose key id is ``kid`` (None: its current one) at ``now``,
#: or None when it no longer holds that key (a retired key past its overlap window).
KeyLookup = Callable[[str | None, float], Identity | None]
#: The server's admission of an approved action's goal on the approver's session (the rules a
#: direct intent for it meets: protocol/server/admission.py), run before the action is
#: claimed; raises the refusal.
ActionAdmission = Callable[[PendingAction], None]


def _json_size(value: Any, what: str, limit: int) -> None:
    problem = encoding.ijson_problem(value, max_depth=encoding.MAX_DEPTH - 4)
    if problem is not None:
        raise ValueError(f"{what} is not I-JSON: {problem}")
    if len(encoding.dumps(value)) > limit:
        raise ValueError(f"{what} is larger than {limit} bytes")


def approver_dids(dids: Iterable[str]) -> tuple[str, ...]:
    """``dids`` checked as a collection of DIDs, or :data:`PRINCIPAL` (one string is refused:
    it is no list)."""
    if isinstance(dids, str):
        raise TypeError("approvers is a collection of DIDs, not one string")
    return tuple(did if did == PRINCIPAL else check_did_syntax(did) for did in dids)


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """A handler's answer: run ``action_data`` only once a person approves it.

    ``action_data`` (a JSON value, at most 64 KiB) is what the executor registered under
    ``action`` (default: the intent's goal) receives on approval; ``preview`` (a JSON value,
    at most 8 KiB, usually a sentence) is what the approver is shown. The caller gets a
    signed ``{"needs_approval": true, "action_id", "action_hash", "preview", "expires_at"}``.
    """

    action_data: Any
    preview: Any
    action: str | None = None

    def __post_init__(self) -> None:
        _json_size(self.action_data, "action_data", MAX_ACTION_DATA_BYTES)
        _json_size(self.preview, "preview", MAX_PREVIEW_BYTES)
        if self.action is not None and (not isinstance(self.action, str) or not 1 <= len(self.action) <= 128):
            raise ValueError("action must be 1-128 characters")


@dataclass(frozen=True, slots=True)
class ActionContext:
    """What an executor learns besides ``action_data`` (all authenticated)."""

    action_id: str
    action: str
    goal: str
    caller_did: str  # the agent whose intent asked for the action
    approver_did: str  # the person's DID that signed the approval
    created_at: int
    session_id: str  # the approver's session
    sequence: int  # the approval's sequence on that session
    principal: str | None = None  # on whose behalf it was asked (§12.7), else None


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    """Server-side bounds of approvals (not negotiated: the policy has five members only)."""

    ttl: int = 900  # seconds an action waits for its approval
    retain: int = 3600  # seconds a decided or expired action is kept to answer late approvals
    max_per_caller: int = 16  # pending actions per caller DID
    max_total: int = 1000  # pending actions in the store

    def __post_init__(self) -> None:
        for name in ("ttl", "retain", "max_per_caller", "max_total"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer")


Executor = Callable[[Any, ActionContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class _Registered:
    executor: Executor
    approvers: frozenset[str] | None  # None: the server's approvers


@dataclass(frozen=True, slots=True)
class _Step:
    """What one audit record says about a step (besides the request's own members)."""

    session_id: str
    client_did: str
    sequence: int
    started: float  # on the monotonic clock: durations only


def new_action_id(random_bytes: Callable[[int], bytes]) -> str:
    """A fresh action id: base64url of ``ACTION_ID_BYTES`` random bytes, never starting with "-".

    A person types it after ``--action-id``, and a command line takes a word that starts with
    "-" for an option (one id in 64 would have). The first character is moved off "-" by
    flipping one bit of the first byte: about 0.02 bit of the 128 is lost, and no redraw can
    loop on a bad random source.
    """
    raw = bytearray(random_bytes(ACTION_ID_BYTES))
    if raw[0] >> 2 == 62:  # the 6-bit value of "-"
        raw[0] ^= 0x80
    return encoding.b64u_encode(bytes(raw))


class ApprovalEngine:
    """Stores actions that need approval and runs each approved one once.

    ``approvers`` are the DIDs allowed to approve any action; an executor registered with
    its own ``approvers`` uses those instead. Either may hold :data:`PRINCIPAL`: the
    principal of the chain the action was asked under approves it too. ``audit`` is the
    server's audit hook. ``keys`` finds the agent's keys that seal actions asked on a sealed
    session at rest (without it such an action is refused, -32603, rather than kept in the clear).
    """

    def __init__(
        self,
        *,
        server_did: str,
        store: ActionStore,
        approvers: Iterable[str] = (),
        settings: ApprovalSettings | None = None,
        audit: AuditHook | None = None,
        clock: Clock = system.wall_clock,
        random_bytes: RandomSource = system.random_bytes,
        keys: KeyLookup | None = None,
        monotonic: system.MonoClock = system.mono_now,
    ) -> None:
        self.server_did = server_did
        self._keys = keys
        self.store = store
        self.settings = settings or ApprovalSettings()
        self.audit = audit
        self._clock = clock
        self._monotonic = monotonic  # the audit records' durations
        self._random = random_bytes
        self._approvers: frozenset[str] = frozenset()
        self._executors: dict[str, _Registered] = {}
        self.approvers = approvers
        # The bound a caller is held to, of a shared bound (protocol/capacity.py): the
        # server's, once it serves this engine; every caller may fill it until then.
        self.limit_for: Callable[[int, str], int] = lambda total, did: total

    def named(self) -> frozenset[str]:
        """Every DID named as an approver, of any action (reserved capacity)."""
        named = set(self._approvers)
        for entry in self._executors.values():
            named |= entry.approvers or frozenset()
        named.discard(PRINCIPAL)
        return frozenset(named)

    # -- configuration ------------------------------------------------------------------------
    @property
    def approvers(self) -> frozenset[str]:
        """The DIDs that may approve any action (server configuration)."""
        return self._approvers

    @approvers.setter
    def approvers(self, dids: Iterable[str]) -> None:
        self._approvers = frozenset(approver_dids(dids))

    def register(self, action: str, executor: Executor, *, approvers: Iterable[str] | None = None) -> None:
        """Run ``executor(action_data, context)`` when an ``action`` is approved."""
        if not isinstance(action, str) or not 1 <= len(action) <= 128:
            raise ValueError("action must be 1-128 characters")
        own = None if approvers is None else frozenset(approver_dids(approvers))
        self._executors[action] = _Registered(executor, own)

    @property
    def actions(self) -> list[str]:
        """The names of the registered actions, sorted."""
        return sorted(self._executors)

    def approvers_of(self, action: str) -> frozenset[str]:
        """Who may approve ``action``."""
        entry = self._executors.get(action)
        if entry is None or entry.approvers is None:
            return self._approvers
        return entry.approvers

    def _listed_anywhere(self, entry: str) -> bool:
        """Whether ``entry`` (a DID, or :data:`PRINCIPAL`) is in any approvers list."""
        return entry in self._approvers or any(
            e.approvers is not None and entry in e.approvers for e in self._executors.values()
        )

    def _approves(self, did: str, action: PendingAction) -> bool:
        """Whether ``did`` (a session's client DID, proven by its handshake) approves ``action``."""
        allowed = self.approvers_of(action.action)
        if did != PRINCIPAL and did in allowed:
            return True
        # The principal stored with the action, verified when its intent ran; never a DID a
        # request names: the signer is the approval session's own client.
        return PRINCIPAL in allowed and action.principal is not None and did == action.principal

    # -- audit --------------------------------------------------------------------------------
    def _record(
        self,
        event: str,
        step: _Step,
        action: str | None,
        error: A2AError | None = None,
        code: int | None = None,
        *,
        of: PendingAction | None = None,
    ) -> None:
        if self.audit is None:
            return
        error_code = error.code if error is not None else code
        # Every record of an action asked under a chain names its principal and the chain
        # (§12.7's two members); others are as before, so a plain audit hook keeps working.
        chain: dict[str, Any] = {}
        if of is not None and (of.principal is not None or of.delegation is not None):
            chain = {"principal": of.principal, "delegation": of.delegation}
        self.audit(
            **chain,
            event=event,
            role="server",
            session_id=step.session_id,
            client_did=step.client_did,
            server_did=self.server_did,
            intent_goal=action,
            sequence=step.sequence,
            status="error" if error_code is not None else "success",
            duration_ms=round((self._monotonic() - step.started) * 1000, 3),
            error_code=error_code,
            verified=True,
        )

    # -- the steps ----------------------------------------------------------------------------
    async def create(
        self,
        needs: NeedsApproval,
        *,
        goal: str,
        caller_did: str,
        session_id: str,
        sequence: int,
        principal: str | None = None,
        delegation: str | None = None,
        sealed: bool = False,
    ) -> dict[str, Any]:
        """Store the action ``needs`` describes; the result the caller gets.

        ``principal`` and ``delegation``: the verified chain's principal and name when the
        intent ran under one (§12.7), stored with the action (what :data:`PRINCIPAL` reads).
        ``sealed``: the intent came on a sealed session (§12.6); the action is stored sealed.
        """
        now = self._clock()
        step = _Step(session_id, caller_did, sequence, self._monotonic())
        name = needs.action or goal
        # Fail closed on a configuration that could never run or approve the action.
        if name not in self._executors:
            raise InternalError(f"no approved action {name[:64]!r} is registered")
        approvers = self.approvers_of(name)
        if not approvers:
            raise InternalError(f"no approver is configured for {name[:64]!r}")
        if principal is None and approvers == {PRINCIPAL}:  # nobody could ever approve it
            raise PolicyViolation(
                f"only the principal of a delegation chain approves {name[:64]!r}: send the intent under one"
            )
        now_i = int(now)
        expires_at = now_i + self.settings.ttl
        action = PendingAction(
            action_id=new_action_id(self._random),
            action=name,
            goal=goal,
            caller_did=caller_did,
            action_data=needs.action_data,
            action_hash=encoding.hash_of(needs.action_data),
            preview=needs.preview,
            created_at=now_i,
            expires_at=expires_at,
            keep_until=expires_at + self.settings.retain,
            server_did=self.server_did,
            principal=principal,
            delegation=delegation,
        )
        stored = self._seal(action, now) if sealed else action
        added = await self.store.add_action(
            stored,
            max_per_caller=self.settings.max_per_caller,
            max_total=self.limit_for(self.settings.max_total, caller_did),
            now=now,
        )
        if not added:
            exc = full("too many actions waiting for approval", retry_after=60, pool=pool_of(added))
            self._record("action_refused", step, name, exc, of=action)
            raise exc
        self._record("action_created", step, name, of=action)
        return {
            "needs_approval": True,
            "action_id": action.action_id,
            "action_hash": action.action_hash,
            "preview": action.preview,
            "expires_at": action.expires_at,
        }

    def _seal(self, action: PendingAction, now: float) -> PendingAction:
        """``action`` sealed at rest under the agent's current key (protocol/sealed_actions.py)."""
        identity = self._keys(None, now) if self._keys is not None else None
        if identity is None:  # never kept in the clear instead
            raise InternalError("no agent key to keep an action asked on a sealed session sealed")
        return seal_action(
            action, kid=identity.kid, derive_key=identity.derive_key, random_bytes=self._random
        )

    def _open(self, action: PendingAction, sealed: bool, now: float) -> PendingAction:
        """The stored ``action`` opened for an approver on a session ``sealed`` or not.

        An action asked sealed is refused on a session that is not (-32602), so that what came
        sealed never leaves in the clear; one that does not open is -32050.
        """
        if action.sealed is None:
            return action
        if not sealed:
            raise InvalidParams(
                "this action was asked on a sealed session: it is shown and decided only on a"
                " sealed session (PROTOCOL.md §12.1)"
            )
        identity = self._keys(action.sealed_kid, now) if self._keys is not None else None
        return open_action(action, None if identity is None else identity.derive_key)

    async def _find(self, action_id: str, approver: str, now: float) -> PendingAction:
        listed = approver != PRINCIPAL and self._listed_anywhere(approver)
        if not listed and not self._listed_anywhere(PRINCIPAL):
            raise PolicyViolation("this DID is not an approver at this agent")
        action = await self.store.get_action(action_id, now)
        # Agents sharing one store see each other's actions: one created by another agent is
        # unknown here, or an approver of this agent could run it with this agent's executor.
        ours = action if action is not None and action.server_did == self.server_did else None
        if ours is None and listed:
            raise ActionNotPending("unknown action")
        # Any DID may be some action's principal: one that is listed nowhere is told the same
        # for an unknown action as for another's, so it still learns no action id it cannot
        # approve.
        if ours is None or not self._approves(approver, ours):
            raise PolicyViolation("this DID is not an approver of this action")
        return ours

    async def pending(
        self, inputs: Any, *, approver: str, session_id: str, sequence: int, sealed: bool = False
    ) -> dict[str, Any]:
        """``tool.pending``: an approver reads what it is asked to approve.

        ``sealed``: the approver's session is sealed (§12.6); an action asked sealed is shown
        on such a session only.
        """
        now = self._clock()
        step = _Step(session_id, approver, sequence, self._monotonic())
        name: str | None = None
        try:
            exact_members(inputs, _PENDING_MEMBERS, "tool.pending inputs")
            action_id = inputs["action_id"]
            require_b64u_bytes(action_id, "action_id", ACTION_ID_BYTES)
            action = self._open(await self._find(action_id, approver, now), sealed, now)
        except A2AError as exc:
            self._record("action_refused", step, name, exc)
            raise
        details = {
            "action_id": action.action_id,
            "action": action.action,
            "action_data": action.action_data,
            "action_hash": action.action_hash,
            "preview": action.preview,
            "caller_did": action.caller_did,
            "created_at": action.created_at,
            "expires_at": action.expires_at,
            "state": action.state_at(now).value,
        }
        if action.principal is not None:  # asked on someone's behalf (§12.7): say whose
            details["principal"] = action.principal
        return details

    async def approve(
        self,
        inputs: Any,
        *,
        approver: str,
        session_id: str,
        sequence: int,
        sealed: bool = False,
        admit: ActionAdmission | None = None,
    ) -> dict[str, Any]:
        """``tool.approve``: check the approval, claim the action, run it once.

        ``sealed``: the approver's session is sealed (§12.6); an action asked sealed is
        decided on such a session only, and runs with its data opened. ``admit(action)``:
        the server's admission of the action's goal now (its policy, the goal's reserved
        principals against the principal stored with the action, sealing), checked before
        the action is claimed: a refused approval leaves it pending.
        """
        now = self._clock()
        step = _Step(session_id, approver, sequence, self._monotonic())
        name: str | None = None
        found: PendingAction | None = None
        try:
            exact_members(inputs, _APPROVE_MEMBERS, "tool.approve inputs")
            action_id = inputs["action_id"]
            require_b64u_bytes(action_id, "action_id", ACTION_ID_BYTES)
            signed_hash = require_hash(inputs["action_hash"], "action_hash")
            approved = require_bool(inputs["approved"], "approved")
            found = await self._find(action_id, approver, now)
            name = found.action
            # Its goal, admitted now as an intent for it would be (a rejection runs nothing).
            if admit is not None and approved:
                admit(found)
            action = self._open(found, sealed, now)
            if not ct_equal(signed_hash, action.action_hash):
                raise InvalidParams("action_hash is not the hash of the pending action")
            state = action.state_at(now)
            if state is not ActionState.PENDING:
                raise ActionNotPending(f"action is {state.value}")
            registered = self._executors.get(name)
            if registered is None:  # checked before the action is claimed: it stays pending
                raise InternalError(f"no approved action {name[:64]!r} is registered")
            decision = await self.store.decide_action(
                action_id,
                caller_did=found.caller_did,
                action_hash=found.action_hash,  # as the store keeps it (an HMAC of it, if sealed)
                approve=approved,
                decided_by=approver,
                now=now,
            )
            if decision.kind is DecisionKind.UNKNOWN:
                raise ActionNotPending("unknown action")
            if decision.kind is DecisionKind.MISMATCH:  # pragma: no cover - hash checked above
                raise InvalidParams("action_hash is not the hash of the pending action")
            if decision.kind is not DecisionKind.DECIDED:
                now_state = decision.action.state.value if decision.action else "decided"
                raise ActionNotPending(f"action is {now_state}")
        except A2AError as exc:
            self._record("action_refused", step, name, exc, of=found)
            raise
        answer: dict[str, Any] = {
            "action_id": action.action_id,
            "action_hash": action.action_hash,
            "approved": approved,
        }
        if not approved:
            self._record("action_rejected", step, name, of=action)
            return answer
        self._record("action_approved", step, name, of=action)
        context = ActionContext(
            action_id=action.action_id,
            action=name,
            goal=action.goal,
            caller_did=action.caller_did,
            approver_did=approver,
            created_at=action.created_at,
            session_id=session_id,
            sequence=sequence,
            principal=action.principal,
        )
        try:
            result = await registered.executor(action.action_data, context)
            if encoding.ijson_problem(result, max_depth=encoding.MAX_DEPTH - 4) is not None:
                raise InternalError("the action returned a value that is not I-JSON")
        except A2AError as exc:
            self._record("action_failed", step, name, exc, of=action)
            raise
        except Exception:
            self._record("action_failed", step, name, code=InternalError.code, of=action)
            raise
        except BaseException:  # cancelled: the approval's time ran out while the action ran
            self._record("action_failed", step, name, code=IntentTimeout.code, of=action)
            raise
        self._record("action_executed", step, name, of=action)
        answer["result"] = result
        return answer
