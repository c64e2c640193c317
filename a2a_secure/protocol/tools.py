"""``tool.list`` and ``tool.execute`` (PROTOCOL.md §12): an agent's intents as tools.

Both are ordinary goals inside a session (its policy must allow them). ``tool.execute``
runs its inner tool admitted exactly as a direct intent for it would be (the session's
policy, the delegation chain's scope and reserved principals of §12.7, the priority rights,
a handler: protocol/server/admission.py): without that, a session allowed only
``tool.execute``, or a chain that grants only ``tool.execute``, could run a goal its policy,
or its principal, never allowed. It never runs a ``tool.*`` goal (the namespace of these
built-in goals), so it cannot call itself or approve an action on someone's behalf.
``arguments`` reach the handler as they are, exactly as the inputs of a direct intent do:
the handler checks its own inputs (the published ``input_schema`` describes them, it is not
a second validator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from a2a_secure import system
from a2a_secure.errors import PolicyViolation, SessionUnknown
from a2a_secure.policy import Policy
from a2a_secure.protocol.validate import exact_members, require_object, require_str
from a2a_secure.store.base import Store

if TYPE_CHECKING:
    from a2a_secure.protocol.server import IntentContext, IntentDispatcher

__all__ = ["TOOL_EXECUTE", "TOOL_GOALS", "TOOL_LIST", "TOOL_PREFIX", "ToolService"]

TOOL_LIST = "tool.list"
TOOL_EXECUTE = "tool.execute"
TOOL_GOALS = (TOOL_LIST, TOOL_EXECUTE)
TOOL_PREFIX = "tool."

_EXECUTE_MEMBERS = frozenset(("tool", "arguments"))
_NO_MEMBERS: frozenset[str] = frozenset()


class ToolService:
    """Serves ``tool.list`` and ``tool.execute`` for the goals of ``dispatcher``.

    ``details()`` gives ``{goal: {"description", "input_schema"}}`` (the card's
    ``intent_schemas``); the session's policy comes from ``store``, as pinned by its handshake.
    """

    def __init__(
        self,
        dispatcher: IntentDispatcher,
        details: Callable[[], Mapping[str, Mapping[str, Any]]],
        store: Store,
        clock: Callable[[], float] = system.wall_clock,
    ) -> None:
        self.dispatcher = dispatcher
        self.details = details
        self.store = store
        self._clock = clock

    async def _policy(self, context: IntentContext) -> Policy:
        session = await self.store.get_session(context.session_id, self._clock())
        if session is None:
            raise SessionUnknown("unknown, expired or closed session")
        return session.policy

    def _callable(self, goal: str, policy: Policy) -> bool:
        return (
            not goal.startswith(TOOL_PREFIX)
            and policy.allows(goal)
            and not self.dispatcher.is_always_streamed(goal)
        )

    async def list_tools(self, inputs: Any, context: IntentContext) -> dict[str, Any]:
        """``tool.list`` ``{}``: the tools this session may execute, with what the card says."""
        exact_members(inputs, _NO_MEMBERS, "tool.list inputs")
        policy = await self._policy(context)
        details = self.details()
        tools = []
        for goal in self.dispatcher.goals:
            if not self._callable(goal, policy):
                continue
            entry = details.get(goal, {})
            tools.append(
                {
                    "name": goal,
                    "description": entry.get("description", ""),
                    "input_schema": entry.get("input_schema", {"type": "object"}),
                }
            )
        return {"tools": tools}

    def inner_of(self, inputs: Any) -> tuple[str, Any]:
        """The goal ``tool.execute`` runs and its inputs: ``(tool, arguments)``.

        Only the form is checked here, and the goals it never runs (``tool.*``); the core
        admits the tool itself exactly as an intent for it (the session's policy, the chain's
        scope, reserved principals, a handler, not one that always streams:
        protocol/server/admission.py), before an ``intent_id`` is claimed (PROTOCOL.md §12.5)
        and before this runs it.
        """
        exact_members(inputs, _EXECUTE_MEMBERS, "tool.execute inputs")
        tool = require_str(inputs["tool"], "tool", min_len=1, max_len=128)
        arguments = require_object(inputs["arguments"], "arguments")
        if tool.startswith(TOOL_PREFIX):
            raise PolicyViolation("tool.execute does not run tool.* goals")
        return tool, arguments

    async def execute(self, inputs: Any, context: IntentContext) -> Any:
        """``tool.execute`` ``{"tool", "arguments"}``: run one tool, admitted as a direct intent.

        The handler is told what a direct intent's would be: the same caller, session, chain
        and principal (the core refused the tool unless that chain covers it).
        """
        tool, arguments = self.inner_of(inputs)
        inner = dataclasses.replace(context, goal=tool)
        if self.dispatcher.is_streaming(tool):
            # As a streaming goal asked without stream: the array of its partial results.
            return [item async for item in self.dispatcher.open_stream(tool, arguments, inner)]
        return await self.dispatcher.run(tool, arguments, inner)
