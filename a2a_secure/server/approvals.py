"""Human approval (PROTOCOL.md §12.1) as an agent server hosts it, and how handlers are called.

:class:`ApprovalHost` is the part of :class:`~a2a_secure.server.app.AgentServer` that keeps
actions waiting for a person: the engine over the server's store, the executors registered
with :meth:`ApprovalHost.approved_action`, and the goals ``tool.approve`` and
``tool.pending``, whose approved action is admitted on the approver's session as an intent
for it would be. :func:`as_async` adapts a handler, sync or async, with or without the
context, to the one form the core calls.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from a2a_secure.errors import SessionUnknown
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.approval import APPROVAL_GOALS, ApprovalEngine, ApprovalSettings
from a2a_secure.protocol.server import AuditHook, IntentContext, IntentDispatcher
from a2a_secure.protocol.server.admission import admit_action
from a2a_secure.store.actions import ActionStore
from a2a_secure.system import mono_clock_of

if TYPE_CHECKING:
    from a2a_secure.identity.rotation import KeyRing
    from a2a_secure.runtime.router import ServerProtocol
    from a2a_secure.store.base import Store
    from a2a_secure.telemetry.observer import ServerObserver

__all__ = ["ApprovalHost", "Handler", "as_async", "positional_arity"]

Handler = Callable[..., Any]


def positional_arity(fn: Handler) -> int:
    return len(
        [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


def as_async(fn: Handler) -> Callable[[Any, Any], Awaitable[Any]]:
    """``fn(data)`` or ``fn(data, context)``, sync (run in a worker thread) or async.

    An async ``fn`` is called directly (or through a plain function dropping the context):
    no coroutine of our own between the runner and the handler.
    """
    wants_context = positional_arity(fn) >= 2
    if inspect.iscoroutinefunction(fn):
        if wants_context:
            return fn
        return lambda inputs, context: fn(inputs)

    async def call(inputs: Any, context: Any) -> Any:
        args = (inputs, context) if wants_context else (inputs,)
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    return call


class ApprovalHost(IntentDispatcher):
    """The approval side of an agent server (the module's text)."""

    if TYPE_CHECKING:
        identity: Identity
        key_ring: KeyRing | None
        store: Store
        _clock: Callable[[], float]
        _monotonic: Callable[[], float]
        _audit: AuditHook | None
        _observer: ServerObserver
        _approvers: tuple[str, ...]
        _approval_settings: ApprovalSettings | None
        _approvals: ApprovalEngine | None

        @property
        def protocol(self) -> ServerProtocol: ...

    @property
    def approvals(self) -> ApprovalEngine:
        """The approval engine: pending actions in this server's store, its approvers."""
        if self._approvals is None:
            if not isinstance(self.store, ActionStore):
                raise TypeError(f"{type(self.store).__name__} cannot keep actions waiting for approval")
            self._approvals = ApprovalEngine(
                server_did=self.identity.did,
                store=self.store,
                approvers=self._approvers,
                settings=self._approval_settings,
                audit=self._audit_action,
                clock=self._clock,
                random_bytes=os.urandom,
                keys=self._action_key,
                monotonic=mono_clock_of(self._monotonic),
            )
            self._approvals.limit_for = self._limit_for
        return self._approvals

    def _limit_for(self, total: int, did: str) -> int:
        # Read at each use: the core is built once the handlers are registered.
        return self.protocol.limit_for(total, did)

    def _action_key(self, kid: str | None, now: float) -> Identity | None:
        """This agent's key ``kid`` (None: the current one), or a retired one in its window.

        What seals an action asked on a sealed session at rest, and opens it again on any
        worker holding the same key file (PROTOCOL.md §12.1).
        """
        if kid is None or kid == self.identity.kid:
            return self.identity
        return self.key_ring.signer(kid, now) if self.key_ring is not None else None

    def _audit_action(self, **record: Any) -> None:
        # Looked up at each call: the hook may be replaced after the server is built.
        self._observer.action(record)
        if self._audit is not None:
            self._audit(**record)

    def approved_action(
        self, action: str, *, approvers: Iterable[str] | None = None
    ) -> Callable[[Handler], Handler]:
        """Decorator: run the decorated ``fn(action_data)`` or ``fn(action_data, context)``
        when a person approves an ``action`` that a handler answered with ``NeedsApproval``.

        ``approvers`` (DIDs, or ``"principal"``: the principal of the action's delegation
        chain, PROTOCOL.md §12.1) replace the server's approvers for this action. Registering
        the first action serves ``tool.approve`` and ``tool.pending``.
        """

        def register(fn: Handler) -> Handler:
            self.add_approved_action(action, fn, approvers=approvers)
            return fn

        return register

    def add_approved_action(
        self, action: str, fn: Handler, *, approvers: Iterable[str] | None = None
    ) -> None:
        """See :meth:`approved_action`."""
        self.approvals.register(action, as_async(fn), approvers=approvers)
        self._serve_approvals()

    def _serve_approvals(self) -> None:
        if self.has(APPROVAL_GOALS[0]):
            return
        engine = self.approvals

        async def approve(inputs: Any, context: IntentContext) -> Any:
            # The action's goal is admitted on this session as an intent for it would be.
            session = await self.store.get_session(context.session_id, self._clock())
            if session is None:
                raise SessionUnknown("unknown, expired or closed session")
            return await engine.approve(
                inputs,
                approver=context.caller_did,
                session_id=context.session_id,
                sequence=context.sequence,
                sealed=context.sealed,
                admit=functools.partial(admit_action, self.protocol.config, session),
            )

        async def pending(inputs: Any, context: IntentContext) -> Any:
            return await engine.pending(
                inputs,
                approver=context.caller_did,
                session_id=context.session_id,
                sequence=context.sequence,
                sealed=context.sealed,
            )

        self.add(APPROVAL_GOALS[0], approve)
        self.add(APPROVAL_GOALS[1], pending)
