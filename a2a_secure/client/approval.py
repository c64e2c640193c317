"""Human approval before an action runs (client side): the result a caller gets, and the approver's side.

The server side, which stores the action and runs it once approved, is
:mod:`a2a_secure.protocol.approval`; its public types are named here too.

On the server, a handler answers :class:`NeedsApproval` instead of acting, and an executor
registered under the action's name runs the stored data once a person approves::

    @agent.intent("create_event")
    def create_event(inputs):
        return NeedsApproval(inputs, preview=f"Create {inputs['title']!r} with {inputs['guests']}")

    @agent.approved_action("create_event")
    def really_create(action_data):
        return calendar.insert(action_data)

The caller's :meth:`A2AAgent.request <a2a_secure.A2AAgent.request>` then returns a
:class:`RequestResult` with ``needs_approval`` true, and the person's own agent approves::

    result = await agent.request("calendar", {"goal": "create_event", "inputs": {...}})
    if result.needs_approval:
        outcome = await person.approve("calendar", result.action_id, approved=True)

Without ``action_hash``, ``approve`` first reads the pending action (``tool.pending``),
checks that the action data it was shown hashes to the action_hash the server stored, and
signs that hash. PROTOCOL.md §12 has the wire form, SECURITY.md what approval guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from a2a_secure.errors import AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.protocol.approval import TOOL_APPROVE, TOOL_PENDING, ActionContext, NeedsApproval
from a2a_secure.protocol.validate import ct_equal

if TYPE_CHECKING:
    from a2a_secure.client.http import A2AClient

__all__ = [
    "ActionContext",
    "ActionDetails",
    "ApprovalOutcome",
    "NeedsApproval",
    "RequestResult",
    "approve",
    "as_result",
    "pending_action",
]


class RequestResult(dict[str, Any]):
    """A verified result that is a JSON object: a ``dict``, plus the approval members.

    ``needs_approval`` is true when the agent stored the action for a person's approval;
    ``action_id``, ``action_hash``, ``preview`` and ``expires_at`` then say which (else None).
    """

    @property
    def needs_approval(self) -> bool:
        """Whether the result asks for a person's approval (PROTOCOL.md §12)."""
        return self.get("needs_approval") is True and isinstance(self.get("action_id"), str)

    def _member(self, name: str) -> Any:
        return self.get(name) if self.needs_approval else None

    @property
    def action_id(self) -> str | None:
        """The pending action's id."""
        value = self._member("action_id")
        return value if isinstance(value, str) else None

    @property
    def action_hash(self) -> str | None:
        """``hash_of`` the action data that will run once approved."""
        value = self._member("action_hash")
        return value if isinstance(value, str) else None

    @property
    def preview(self) -> Any:
        """The server's description of the action (its text: see SECURITY.md)."""
        return self._member("preview")

    @property
    def expires_at(self) -> int | None:
        """When the offer ends (Unix seconds)."""
        value = self._member("expires_at")
        return value if type(value) is int else None


def as_result(value: Any) -> Any:
    """``value`` as a :class:`RequestResult` when it is a JSON object, else unchanged."""
    return RequestResult(value) if type(value) is dict else value


def _bad(what: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"the agent's {what} is not what was asked")


@dataclass(frozen=True, slots=True)
class ActionDetails:
    """A pending action as its approver sees it (the verified ``tool.pending`` result)."""

    action_id: str
    action: str
    action_data: Any
    action_hash: str
    preview: Any
    caller_did: str
    created_at: int
    expires_at: int
    state: str
    principal: str | None = None  # on whose behalf the action was asked (§12.7), if anyone's

    @classmethod
    def from_result(cls, result: Any, action_id: str) -> ActionDetails:
        """Check a ``tool.pending`` result: its shape, its id, and that the data hashes right.

        The hash check is what makes the shown ``action_data`` the one the approval signs:
        a server that showed one thing and stored another is caught here.
        """
        if not isinstance(result, dict) or result.keys() - _OPTIONAL_DETAILS != _DETAIL_MEMBERS:
            raise _bad("pending action")
        strings = (
            "action_id",
            "action",
            "action_hash",
            "caller_did",
            "state",
            *result.keys() & _OPTIONAL_DETAILS,
        )
        if not all(isinstance(result[n], str) for n in strings) or not all(
            type(result[n]) is int for n in ("created_at", "expires_at")
        ):
            raise _bad("pending action")
        details = cls(**result)
        if details.action_id != action_id:
            raise _bad("pending action id")
        if not ct_equal(encoding.hash_of(details.action_data), details.action_hash):
            raise AuthenticationFailed("the pending action's data does not hash to its action_hash")
        return details


_OPTIONAL_DETAILS = frozenset(("principal",))  # only an action asked under a chain has one
_DETAIL_MEMBERS = frozenset(f.name for f in fields(ActionDetails)) - _OPTIONAL_DETAILS


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """What an approval did: ``result`` is the action's result when ``approved``."""

    action_id: str
    action_hash: str
    approved: bool
    result: Any = None
    details: ActionDetails | None = None


async def pending_action(
    client: A2AClient, server_did: str, action_id: str, *, endpoint: str | None = None
) -> ActionDetails:
    """Read the pending action ``action_id`` at ``server_did`` (approvers only)."""
    answer = await client.request(
        server_did, {"goal": TOOL_PENDING, "inputs": {"action_id": action_id}}, endpoint=endpoint
    )
    return ActionDetails.from_result(answer.result, action_id)


async def approve(
    client: A2AClient,
    server_did: str,
    action_id: str,
    *,
    approved: bool = True,
    action_hash: str | None = None,
    endpoint: str | None = None,
) -> ApprovalOutcome:
    """Sign the approval (or rejection) of ``action_id`` at ``server_did``; the outcome.

    Without ``action_hash`` the pending action is read first (:func:`pending_action`), and
    its checked hash is the one signed; the details come back in the outcome.
    """
    details: ActionDetails | None = None
    if action_hash is None:
        details = await pending_action(client, server_did, action_id, endpoint=endpoint)
        action_hash = details.action_hash
    inputs = {"action_id": action_id, "action_hash": action_hash, "approved": approved}
    answer = await client.request(server_did, {"goal": TOOL_APPROVE, "inputs": inputs}, endpoint=endpoint)
    result = answer.result
    expected = {"action_id", "action_hash", "approved"} | ({"result"} if approved else set())
    if not isinstance(result, Mapping) or set(result) != expected:
        raise _bad("approval answer")
    if result["action_id"] != action_id or result["action_hash"] != action_hash:
        raise _bad("approval answer")
    if result["approved"] is not approved:
        raise _bad("approval answer")
    return ApprovalOutcome(action_id, action_hash, approved, result.get("result"), details)
