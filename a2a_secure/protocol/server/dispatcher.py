"""The application's side of an intent: goals, their handlers, and what a handler is told.

Implements the interface behind PROTOCOL.md §6.1 steps 10-11 (is there a handler for the
goal, run it) and §6.4 (which goals answer as a stream). :class:`IntentDispatcher` owns the
goal → handler tables; adapters subclass or fill it, and the core only calls it.
:class:`IntentContext` is the authenticated part of a request a handler may read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["InnerGoal", "IntentContext", "IntentDispatcher"]

# A goal that runs another goal (``tool.execute``): given its inputs, the goal it runs and
# that goal's inputs, or the refusal of inputs that name none (raised). The core admits the
# inner goal exactly as an intent for it (a2a_secure.protocol.server.admission).
InnerGoal = Callable[[Any], tuple[str, Any]]


@dataclass(frozen=True, slots=True)
class IntentContext:
    """What a handler learns about the request besides its inputs (all authenticated)."""

    caller_did: str
    session_id: str
    sequence: int
    goal: str
    domain: str | None
    constraints: Mapping[str, Any]
    client_agent_id: str = ""
    priority: int = 3  # the priority it runs at (PROTOCOL.md §12.3)
    intent_id: str | None = None  # the caller's id for this intent, run at most once
    # On whose behalf (PROTOCOL.md §12.7): the chain's root issuer, and the verified chain
    # (a2a_secure.delegation.Chain: ``.hops``, ``.hash``); None without one.
    principal: str | None = None
    delegation: Any = None
    # Whether the request came on a sealed session (§12.6): its inputs crossed the wire sealed,
    # and its answer will. An action it asks for is kept sealed at rest (§12.1); a handler that
    # would send them elsewhere (a webhook) can tell.
    sealed: bool = False


class IntentDispatcher:
    """Maps goals to handlers. Adapters subclass or fill it; the core only calls it."""

    def __init__(self) -> None:
        self._handlers: dict[str, Callable[[Any, IntentContext], Awaitable[Any]]] = {}
        self._streams: dict[str, Callable[[Any, IntentContext], AsyncIterator[Any]]] = {}
        self._always_streamed: set[str] = set()
        self._inner: dict[str, InnerGoal] = {}

    def add(
        self,
        goal: str,
        handler: Callable[[Any, IntentContext], Awaitable[Any]],
        *,
        inner: InnerGoal | None = None,
    ) -> None:
        """Serve ``goal`` with the async ``handler(inputs, context)``.

        ``inner(inputs)``: for a goal that runs another goal, which one and with what inputs
        (raises the refusal of inputs that name none). The core then admits that goal as an
        intent for it (policy, priority, delegation chain, reserved principals, handler)
        before an ``intent_id`` is claimed (PROTOCOL.md §12.5) and the handler runs.
        """
        self._streams.pop(goal, None)
        self._always_streamed.discard(goal)
        self._handlers[goal] = handler
        if inner is None:
            self._inner.pop(goal, None)
        else:
            self._inner[goal] = inner

    def inner_goal(self, goal: str, inputs: Any) -> tuple[str, Any] | None:
        """The goal ``goal`` runs inside it with ``inputs``, and its inputs; None for most goals."""
        inner = self._inner.get(goal)
        return None if inner is None else inner(inputs)

    def add_stream(
        self,
        goal: str,
        handler: Callable[[Any, IntentContext], AsyncIterator[Any]],
        *,
        always: bool = False,
    ) -> None:
        """Serve ``goal`` with ``handler(inputs, context)``, an async iterator of partial results.

        ``always``: the goal is always answered as a stream, even without ``stream: true``,
        and ``stream: false`` is -32602 (the A2A goals that stream, PROTOCOL.md §6.4, §10).
        """
        self._handlers.pop(goal, None)
        self._inner.pop(goal, None)
        self._streams[goal] = handler
        if always:
            self._always_streamed.add(goal)
        else:
            self._always_streamed.discard(goal)

    def has(self, goal: str) -> bool:
        """Whether a handler serves ``goal``."""
        return goal in self._handlers or goal in self._streams

    def is_streaming(self, goal: str) -> bool:
        """Whether ``goal`` is served by a streaming handler."""
        return goal in self._streams

    def is_always_streamed(self, goal: str) -> bool:
        """Whether ``goal`` is always answered as a stream (``stream: false`` is refused)."""
        return goal in self._always_streamed

    @property
    def goals(self) -> list[str]:
        """The goals served, sorted."""
        return sorted({*self._handlers, *self._streams})

    @property
    def streaming_goals(self) -> list[str]:
        """The goals served by streaming handlers, sorted."""
        return sorted(self._streams)

    async def run(self, goal: str, inputs: Any, context: IntentContext) -> Any:
        """Run the (non-streaming) handler for ``goal``."""
        return await self._handlers[goal](inputs, context)

    def open_stream(self, goal: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        """The partial results of ``goal``: a streaming handler's, or a plain one's single result."""
        stream = self._streams.get(goal)
        if stream is not None:
            return stream(inputs, context)
        return self._single(goal, inputs, context)

    async def _single(self, goal: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        yield await self.run(goal, inputs, context)
