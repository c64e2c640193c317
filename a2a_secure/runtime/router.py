"""``ServerProtocol``: builds the rooms of the server core and routes each method to its room.

It implements only the dispatch of PROTOCOL.md §4 (``hello``, ``proof`` and
``accept_policy`` to the handshake responder of §5; ``intent`` and ``close`` to the intent
processor of §6) and the one rule every method shares: ``handle`` never raises, whatever
fails becomes the JSON-RPC error of §7, and each request writes one audit record (§8).
PROOF and ACCEPT_POLICY pass the failure budget first (ATTACKS.md H4).

It lives in the runtime because it wires the core's rooms (:mod:`a2a_secure.protocol.server`)
to the runtime's, which wait (this package's docstring).

State: the :class:`ServerConfig` all rooms share (its public attributes read and replace
members of it); each room owns its own part (see the two packages' docstrings).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from a2a_secure import system
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import A2AError, InternalError, MethodNotFound
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import Policy
from a2a_secure.protocol.keyguard import KeyGuard
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server.auditing import AuditFields, AuditWriter, ObserveHook
from a2a_secure.protocol.server.budget import FailureBudget
from a2a_secure.protocol.server.common import (
    INTENT_METHODS,
    AuditHook,
    Clock,
    MonoClock,
    RandomSource,
    Reply,
    ServerConfig,
    ServerLimits,
    log_unexpected,
)
from a2a_secure.protocol.server.common_intent import CommonIntentProcessor
from a2a_secure.protocol.server.deadlines import SessionDeadlines
from a2a_secure.protocol.server.delegation import DelegationGuard
from a2a_secure.protocol.server.dispatcher import IntentDispatcher
from a2a_secure.protocol.server.events import EventSigner
from a2a_secure.protocol.server.handshake import HandshakeResponder
from a2a_secure.protocol.server.replies import SignedReplies, unsigned_error
from a2a_secure.protocol.server.scheduler import Scheduler
from a2a_secure.runtime.exactly_once import ExactlyOnce
from a2a_secure.runtime.replay import Replayer
from a2a_secure.runtime.runner import IntentRunner
from a2a_secure.runtime.signing import finish_reply, has_pending, may_pend
from a2a_secure.runtime.stream_pump import StreamPump
from a2a_secure.store.base import Store

__all__ = ["ServerProtocol"]

_log = logging.getLogger("a2a_secure.server")


class ServerProtocol:
    """One agent's server side of the handshake and intent protocol."""

    def __init__(
        self,
        identity: Identity,
        policy: Policy,
        *,
        store: Store,
        resolver: DIDResolver,
        dispatcher: IntentDispatcher,
        manifest_hash: str,
        limits: ServerLimits | None = None,
        audit: AuditHook | None = None,
        clock: Clock = system.wall_now,
        random_bytes: RandomSource = os.urandom,
        monotonic: MonoClock = system.mono_now,
        key_guard: KeyGuard | None = None,
        priority_rights: PriorityRights | None = None,
        observe: ObserveHook | None = None,
        delegation: DelegationRules | None = None,
    ) -> None:
        """``observe(audit_fields, reply, seconds)`` is told of every answered request
        (telemetry: a2a_secure.telemetry), like the audit hook and whether or not there is one."""
        config = ServerConfig(
            identity=identity,
            policy=policy,
            store=store,
            resolver=resolver,
            dispatcher=dispatcher,
            manifest_hash=manifest_hash,
            limits=limits or ServerLimits(),
            key_guard=key_guard or KeyGuard(monotonic=monotonic),
            priority_rights=priority_rights or PriorityRights(),
            delegation=delegation,
        )
        self._config = config
        self._clock = clock
        self._monotonic = monotonic  # request durations (audit, telemetry)
        deadlines = SessionDeadlines(config, monotonic)
        auditor = AuditWriter(audit, config, monotonic, observe)
        replies = SignedReplies(config)
        runner = IntentRunner(config)  # its gate (§12.3) is shared with the stream pump
        self._scheduler = runner.gate.scheduler
        events = EventSigner(config, clock)
        streams = StreamPump(
            config, deadlines=deadlines, audit=auditor, clock=clock, events=events, gate=runner.gate
        )
        self._budget = FailureBudget(config)
        self._handshake = HandshakeResponder(
            config, deadlines=deadlines, clock=clock, random_bytes=random_bytes
        )
        replayer = Replayer(
            config, replies=replies, events=events, live=streams.live, audit=auditor, clock=clock
        )
        # The intent_id extension: the claims of intents that carry one (exactly_once.py).
        exactly_once = ExactlyOnce(config, replies=replies, replayer=replayer, events=events, clock=clock)
        streams.exactly_once = exactly_once
        self._intents = CommonIntentProcessor(
            config,
            deadlines=deadlines,
            replies=replies,
            replayer=replayer,
            runner=runner,
            streams=streams,
            clock=clock,
            exactly_once=exactly_once,
            random_bytes=random_bytes,
            delegation=DelegationGuard(config, gather=asyncio.gather, monotonic=monotonic),
        )
        # Bound once: ``handle`` runs for every request.
        self._hello = self._handshake.hello
        self._proof = self._handshake.proof
        self._accept = self._handshake.accept
        self._intent_or_close = self._intents.handle
        self._common_intent = self._intents.common
        self._answer_now = self._intents.answer_now
        self._write_audit = auditor.write
        self._auditor = auditor

    # The configuration all rooms share: replacing a member here reaches each of them.
    @property
    def config(self) -> ServerConfig:
        """What this server is configured with (shared by its rooms; read, do not keep)."""
        return self._config

    @property
    def identity(self) -> Identity:
        """The agent's identity, which signs every answer."""
        return self._config.identity

    @identity.setter
    def identity(self, value: Identity) -> None:
        self._config.identity = value

    @property
    def policy(self) -> Policy:
        """The policy offered to new handshakes (a session keeps the one it agreed to)."""
        return self._config.policy

    @policy.setter
    def policy(self, value: Policy) -> None:
        self._config.policy = value

    @property
    def store(self) -> Store:
        """Where pending handshakes, sessions and stored answers live."""
        return self._config.store

    @store.setter
    def store(self, value: Store) -> None:
        self._config.store = value

    @property
    def resolver(self) -> DIDResolver:
        """Resolves the DIDs of clients."""
        return self._config.resolver

    @resolver.setter
    def resolver(self, value: DIDResolver) -> None:
        self._config.resolver = value

    @property
    def dispatcher(self) -> IntentDispatcher:
        """The goals served and their handlers."""
        return self._config.dispatcher

    @dispatcher.setter
    def dispatcher(self, value: IntentDispatcher) -> None:
        self._config.dispatcher = value

    @property
    def manifest_hash(self) -> str:
        """``hash_of`` the agent card, sent in the CHALLENGE."""
        return self._config.manifest_hash

    @manifest_hash.setter
    def manifest_hash(self, value: str) -> None:
        self._config.manifest_hash = value

    @property
    def limits(self) -> ServerLimits:
        """The capacity and timing bounds."""
        return self._config.limits

    @limits.setter
    def limits(self, value: ServerLimits) -> None:
        self._config.limits = value

    @property
    def named_callers(self) -> Callable[[], Iterable[str]] | None:
        """Further DIDs the application names (its approvers): reserved capacity."""
        return self._config.named_callers

    @named_callers.setter
    def named_callers(self, value: Callable[[], Iterable[str]] | None) -> None:
        self._config.named_callers = value

    def limit_for(self, total: int, did: str) -> int:
        """The bound ``did`` is held to, of a shared bound of ``total`` (protocol/capacity.py)."""
        return self._config.limit_for(total, did)

    @property
    def priority_rights(self) -> PriorityRights:
        """The highest priority each caller may use (§12.3)."""
        return self._config.priority_rights

    @priority_rights.setter
    def priority_rights(self, value: PriorityRights) -> None:
        self._config.priority_rights = value

    @property
    def observe(self) -> ObserveHook | None:
        """``observe(audit_fields, reply, seconds)``, told of every answered request, or None."""
        return self._auditor.observe

    @observe.setter
    def observe(self, value: ObserveHook | None) -> None:
        self._auditor.observe = value

    @property
    def scheduler(self) -> Scheduler:
        """This agent's intent queue in this process (§12.3): how many run, how many wait."""
        return self._scheduler

    async def handle(self, method: str, params: Any, *, source: str = "") -> Reply:
        """Process one JSON-RPC call whose envelope is already valid; never raises."""
        audit = AuditFields(event=method, started=self._monotonic())
        try:
            if method == "hello":
                reply = Reply(200, await self._hello(params, source, audit))
            elif method in ("proof", "accept_policy"):
                self._budget.check(source)
                try:
                    if method == "proof":
                        reply = Reply(200, await self._proof(params, audit))
                    else:
                        reply = Reply(200, await self._accept(params, audit))
                except A2AError:
                    # Only failures that cost an Ed25519 verification spend the budget:
                    # cheap refusals (shape, unknown nonce, wrong kid) are cheap to repeat.
                    if audit.signature_checked:
                        self._budget.spend(source)
                    raise
            elif method in INTENT_METHODS:
                reply = await self._intent_or_close(method, params, audit)
            else:
                raise MethodNotFound(f"unknown method {method[:64]!r}")
        except A2AError as exc:
            reply = unsigned_error(exc)
        except Exception as exc:  # a bug must not leak a stack trace or kill the server
            log_unexpected(_log, f"internal error in {method[:32]!r}", exc)
            reply = unsigned_error(InternalError())
        if may_pend(self._config) and has_pending(reply):
            reply = await finish_reply(reply)
        if not audit.deferred:
            self._write_audit(audit, reply)
        return reply

    def handle_now(self, method: str, params: Any, *, source: str = "") -> Reply | Awaitable[Reply]:
        """:meth:`handle`, without a coroutine for the common intent whose handler does not
        suspend: a :class:`Reply`, or what to await for it. Never raises."""
        if method != "intent":
            return self.handle(method, params, source=source)
        found = self._common_intent(params)  # reads nothing but params and the configuration
        if found is None:
            return self.handle(method, params, source=source)
        audit = AuditFields(method, self._monotonic())
        try:
            reply = self._answer_now(found, params, audit)
        except A2AError as exc:
            reply = unsigned_error(exc)
        except Exception as exc:  # a bug must not leak a stack trace or kill the server
            log_unexpected(_log, f"internal error in {method[:32]!r}", exc)
            reply = unsigned_error(InternalError())
        if not isinstance(reply, Reply) or (may_pend(self._config) and has_pending(reply)):
            return self._answered(reply, method, audit)
        if not audit.deferred:
            self._write_audit(audit, reply)
        return reply

    async def _answered(self, pending: Awaitable[Reply] | Reply, method: str, audit: AuditFields) -> Reply:
        """:meth:`handle_now`'s reply once ``pending`` is done and its tokens are signed."""
        try:
            reply = pending if isinstance(pending, Reply) else await pending
        except A2AError as exc:
            reply = unsigned_error(exc)
        except Exception as exc:
            log_unexpected(_log, f"internal error in {method[:32]!r}", exc)
            reply = unsigned_error(InternalError())
        if may_pend(self._config) and has_pending(reply):
            reply = await finish_reply(reply)
        if not audit.deferred:
            self._write_audit(audit, reply)
        return reply

    def reject(self, exc: A2AError, *, event: str = "reject") -> Reply:
        """The reply (and audit record) for a request refused before ``handle``."""
        reply = unsigned_error(exc)
        self._write_audit(AuditFields(event=event, started=self._monotonic()), reply)
        return reply
