"""The HTTP adapter of the server side: an agent's server, its card and its FastAPI routes.

Everything protocol-shaped lives in the core (``ServerProtocol``). :class:`AgentServer`
holds what an agent is (identity, policy, handlers, store, card) and builds the app; the two
hot endpoints are raw ASGI exchanges (:mod:`a2a_secure.server.asgi`: FastAPI's validation
would cost as much as the signature work and could answer with shapes the protocol does not
allow), and human approval is :mod:`a2a_secure.server.approvals`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import (
    InternalError,
    log_unexpected,
)
from a2a_secure.identity import did as did_module
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.approval import (
    ApprovalEngine,
    ApprovalSettings,
    NeedsApproval,
    approver_dids,
)
from a2a_secure.protocol.intent_id import CARD_MEMBER as EXTENSIONS_MEMBER
from a2a_secure.protocol.keyguard import KeyGuard
from a2a_secure.protocol.messages import PROTOCOL_NAME
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import (
    AuditHook,
    IntentContext,
    ServerLimits,
)
from a2a_secure.protocol.server.dispatcher import InnerGoal
from a2a_secure.protocol.tools import TOOL_EXECUTE, TOOL_LIST, ToolService
from a2a_secure.protocol.wire import (
    encode_error,
)
from a2a_secure.runtime.exactly_once import server_extensions
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.runtime.sweeper import SessionSweeper
from a2a_secure.server.approvals import ApprovalHost, Handler, as_async, positional_arity
from a2a_secure.server.asgi import (
    AgentApp,
    AsgiEndpoint,
    http_error,
    not_found,
    serve_exchange,
)
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.system import mono_clock_of, mono_now, wall_clock_of, wall_now
from a2a_secure.telemetry import tracing
from a2a_secure.telemetry.observer import ServerObserver

if TYPE_CHECKING:
    from a2a_secure.audit import Auditor
    from a2a_secure.identity.rotation import KeyRing
    from a2a_secure.store.revocation import Revocations
    from a2a_secure.telemetry.metrics import ServerMetrics

_log = logging.getLogger("a2a_secure.server")

__all__ = ["AgentServer", "create_app", "public_url"]

DEFAULT_MAX_BODY = 1024 * 1024
_CARD_CORE_MEMBERS = ("did", "protocol", "endpoints", "intents", "public_keys")


def public_url(url: str) -> str:
    """``url`` as the card's ``url`` (PROTOCOL.md §4): ``""``, or an absolute http(s) URL with
    no query or fragment, its trailing ``/`` dropped; ValueError for anything else."""
    if url == "":
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(
            f"the agent's url must be an absolute http(s) URL, no query or fragment: {url[:200]!r}"
        )
    return url.rstrip("/")


class AgentServer(ApprovalHost):
    """An agent's server: its identity, policy, intent handlers, store and routes.

    Register handlers with the decorator; a handler takes ``(inputs)`` or
    ``(inputs, context)``, may be sync (run in a worker thread) or async, and returns a
    JSON value. Raise ``InvalidParams`` to reject its inputs (-32602).
    """

    def __init__(
        self,
        identity: Identity,
        policy: Policy = DEFAULT_POLICY,
        *,
        name: str | None = None,
        description: str = "",
        version: str = "0.1.0",
        url: str = "",
        store: Store | None = None,
        resolver: DIDResolver | None = None,
        audit: Auditor | AuditHook | None = None,
        limits: ServerLimits | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        clock: Callable[[], float] = wall_now,
        monotonic: Callable[[], float] = mono_now,
        key_ring: KeyRing | None = None,
        revocations: Iterable[Revocations] = (),
        priority_rights: PriorityRights | None = None,
        approvers: Iterable[str] = (),
        approval: ApprovalSettings | None = None,
        serve_tools: bool = False,
        metrics: bool | ServerMetrics = False,
        log_requests: bool = False,
        delegation: DelegationRules | Mapping[str, Iterable[str]] | None = None,
        require_sealed: bool = False,
    ) -> None:
        """``priority_rights``: the highest intent priority each caller may use (PROTOCOL.md
        §12.3; default 3 for everyone). ``limits.max_concurrent_intents`` turns the priority
        queue on (per worker process). ``delegation``: accept delegation chains (§12.7), and
        the goals that run only on behalf of listed principals, as :class:`DelegationRules`
        or as the policy file's member ``{goal: [principal DIDs]}`` (``{}``: chains accepted,
        no goal reserved); None: the extension is off.
        Sealed intents (§12.6) are served unless ``limits.sealed_intents`` is False;
        ``require_sealed`` (or ``limits.require_sealed``) refuses every session without
        seal keys, with a signed -32042 at ACCEPT_POLICY.

        ``metrics``: True (or a :class:`~a2a_secure.telemetry.metrics.ServerMetrics`) serves
        Prometheus metrics at ``/metrics`` (the ``metrics`` extra). ``log_requests``: one
        record per answered request on the logger ``a2a_secure.events`` (JSON lines with
        :class:`~a2a_secure.telemetry.logs.JsonFormatter`). Traces need no setting: spans
        are made once the application configures an OpenTelemetry SDK."""
        super().__init__()
        self._untimed: dict[str, tuple[Callable[[Any, IntentContext], Awaitable[Any]], InnerGoal | None]] = {}
        if key_ring is not None and key_ring.current.did != identity.did:
            raise ValueError("the key ring's current key is not the identity's")
        self.identity = identity
        # Key lifecycle: retired keys still answering for their sessions, and the deny lists
        # besides the store's own (a2a_secure.protocol.keyguard).
        self.key_ring = key_ring
        self.revocations = tuple(revocations)
        self.policy = policy
        self.name = name or identity.agent_id
        self.description = description
        self.version = version
        self.url = public_url(url)
        self.store: Store = store if store is not None else MemoryStore()
        self.resolver = resolver or DIDResolver()
        self.limits = limits or ServerLimits()
        if require_sealed and not self.limits.require_sealed:
            self.limits = dataclasses.replace(self.limits, require_sealed=True)
        self.priority_rights = priority_rights or PriorityRights()
        self.delegation = (
            DelegationRules.from_member(delegation)
            if delegation is not None and not isinstance(delegation, DelegationRules)
            else delegation
        )
        self.max_body = max_body
        self._clock = clock
        self._monotonic = monotonic
        hook: AuditHook | None
        hook = audit if audit is None or callable(audit) else audit.record
        self._audit = hook
        self._protocol: ServerProtocol | None = None
        self._card: dict[str, Any] | None = None
        self._card_builder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._intent_schemas: dict[str, dict[str, Any]] = {}
        # Human approval and tools (PROTOCOL.md §12), configured here, not in the policy.
        self._approvers = approver_dids(approvers)
        self._approval_settings = approval
        self._approvals: ApprovalEngine | None = None
        if metrics is True:
            from a2a_secure.telemetry.metrics import ServerMetrics  # noqa: PLC0415 - metrics extra

            metrics = ServerMetrics()
        self.metrics: ServerMetrics | None = metrics or None
        self._observer = ServerObserver(
            metrics=self.metrics,
            log_requests=log_requests,
            serves=self.has,
            session_timeout=lambda: self.policy.session_timeout,
            scheduler=lambda: self._protocol.scheduler if self._protocol is not None else None,
        )
        if serve_tools:
            self.enable_tools()

    # -- handlers -----------------------------------------------------------------------------
    def intent(
        self,
        goal: str,
        *,
        description: str | None = None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: serve ``goal`` with the decorated function.

        ``description`` and ``input_schema`` are published in the card (see
        :meth:`describe_intent`) and by ``tool.list``.
        """

        def register(fn: Handler) -> Handler:
            self.add_handler(goal, fn, description=description, input_schema=input_schema)
            return fn

        return register

    def add_handler(
        self,
        goal: str,
        fn: Handler,
        *,
        description: str | None = None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> None:
        """Serve ``goal`` with ``fn(inputs)`` or ``fn(inputs, context)``, sync or async.

        The handler may return :class:`~a2a_secure.NeedsApproval` to have a person approve
        the action first (see :meth:`approved_action`).
        """
        if not isinstance(goal, str) or not 1 <= len(goal) <= 128:
            raise ValueError("goal must be 1-128 characters")
        if description is not None or input_schema is not None:
            self.describe_intent(goal, description or "", input_schema)
        wants_context = positional_arity(fn) >= 2
        if inspect.isasyncgenfunction(fn):
            # A streaming handler: an async generator of partial results (§6.4).
            def open_stream(inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
                return fn(inputs, context) if wants_context else fn(inputs)  # type: ignore[no-any-return]

            self.add_stream(goal, open_stream)
            return
        self.add(goal, as_async(fn))

    def add(
        self,
        goal: str,
        handler: Callable[[Any, IntentContext], Awaitable[Any]],
        *,
        inner: InnerGoal | None = None,
    ) -> None:
        """See :meth:`IntentDispatcher.add`; the card and core are rebuilt to list it."""
        self._untimed[goal] = (handler, inner)  # timed again if metrics are turned on later
        super().add(goal, self._observer.timed(goal, handler), inner=inner)
        self._card = None
        self._protocol = None

    def add_stream(
        self,
        goal: str,
        handler: Callable[[Any, IntentContext], AsyncIterator[Any]],
        *,
        always: bool = False,
    ) -> None:
        """See :meth:`IntentDispatcher.add_stream`; the card and core are rebuilt to list it."""
        self._untimed.pop(goal, None)
        super().add_stream(goal, handler, always=always)
        self._card = None
        self._protocol = None

    def set_card_builder(self, builder: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        """Serve ``builder(card)`` in place of the PROTOCOL.md §4 card (an A2A AgentCard, §10).

        The card it returns must keep ``did``, ``protocol``, ``endpoints``, ``intents`` and
        ``public_keys`` equal to those it was given, and may list in ``a2a_secure_extensions``
        only extensions it was given (PROTOCOL.md §12: a server lists a name only if it serves
        it; without the member it declares none); its hash is the handshake's manifest_hash.
        """
        self._card_builder = builder
        self._card = None
        self._protocol = None

    def describe_intent(
        self, goal: str, description: str = "", input_schema: Mapping[str, Any] | None = None
    ) -> None:
        """Publish what ``goal`` does and the JSON Schema of its inputs in the agent card.

        They go under the card's optional member ``intent_schemas``
        (``{goal: {"description", "input_schema"}}``), which LLM tool bridges
        (``a2a_secure.llm_tools``) show to a model. Peers that do not read it are unaffected.
        """
        if input_schema is not None and (
            not isinstance(input_schema, Mapping) or input_schema.get("type") != "object"
        ):
            raise ValueError("input_schema must be a JSON Schema object with type 'object'")
        entry: dict[str, Any] = {"description": description}
        if input_schema is not None:
            entry["input_schema"] = encoding.loads(encoding.dumps(dict(input_schema)))
        self._intent_schemas[goal] = entry
        self._card = None
        self._protocol = None

    # -- tools (PROTOCOL.md §12.2); approval (§12.1) is ApprovalHost's ---------------------------
    def enable_tools(self) -> None:
        """Serve ``tool.list`` and ``tool.execute`` (each still needs the session's policy)."""
        catalog = ToolService(self, lambda: self._intent_schemas, self.store, self._clock)
        self.add(TOOL_LIST, catalog.list_tools)
        self.add(TOOL_EXECUTE, catalog.execute, inner=catalog.inner_of)

    def _reserved(self, goal: str) -> bool:
        """Whether ``goal`` runs only on behalf of principals the configuration names (§12.7)."""
        return self.delegation is not None and goal in self.delegation.required_principals

    async def run(self, goal: str, inputs: Any, context: IntentContext) -> Any:
        """See :meth:`IntentDispatcher.run`; a ``NeedsApproval`` answer is stored for approval."""
        result = await self._handlers[goal](inputs, context)  # IntentDispatcher.run, one frame less
        if isinstance(result, NeedsApproval):
            return await self.approvals.create(
                result,
                goal=goal,
                caller_did=context.caller_did,
                session_id=context.session_id,
                sequence=context.sequence,
                # A chain's principal approves (the "principal" approver entry) only where
                # the goal is reserved to named principals: anyone can make a DID and
                # delegate to their own agent, and must not so approve their own request.
                principal=context.principal if self._reserved(goal) else None,
                delegation=None if context.delegation is None else context.delegation.hash,
                # Asked on a sealed session (§12.6): kept sealed at rest, shown sealed only.
                sealed=context.sealed,
            )
        return result

    # -- card and core ------------------------------------------------------------------------
    @property
    def card(self) -> dict[str, Any]:
        """The agent card served at ``/.well-known/agent-card.json`` (PROTOCOL.md §4)."""
        if self._card is None:
            card: dict[str, Any] = {
                "name": self.name,
                "description": self.description,
                "version": self.version,
                "url": self.url,
                "did": self.identity.did,
                "protocol": PROTOCOL_NAME,
                "endpoints": {"handshake": "/a2a/handshake", "intent": "/a2a/intent"},
                "intents": self.goals,
                "public_keys": [self.identity.public_key_entry()],
            }
            if self.streaming_goals:
                card["streaming_intents"] = self.streaming_goals
            if self._intent_schemas:
                card["intent_schemas"] = {g: dict(v) for g, v in sorted(self._intent_schemas.items())}
            extensions = server_extensions(self.limits, self.store, delegation=self.delegation is not None)
            if extensions:  # additive: a server without extensions keeps today's card
                card[EXTENSIONS_MEMBER] = extensions
            if self._card_builder is not None:
                built = self._card_builder(dict(card))
                for member in _CARD_CORE_MEMBERS:
                    if member not in built or encoding.jcs(built[member]) != encoding.jcs(card[member]):
                        raise ValueError(f"the card builder changed or dropped the card member {member!r}")
                declared = built.get(EXTENSIONS_MEMBER)
                if declared is not None and (
                    not isinstance(declared, list)
                    or not declared
                    or not all(isinstance(name, str) for name in declared)
                    or declared != sorted(set(declared))
                    or not set(declared) <= set(card.get(EXTENSIONS_MEMBER, ()))
                ):
                    # A client sends a member only to a server whose card lists it (§12): a
                    # name listed that this server does not serve gets its clients refused.
                    raise ValueError(
                        f"the card builder's {EXTENSIONS_MEMBER!r} must be a sorted list of extensions"
                        " this server serves"
                    )
                card = built
            self._card = card
        return self._card

    @property
    def manifest_hash(self) -> str:
        """``hash_of`` the agent card."""
        return encoding.hash_of(self.card)

    @property
    def protocol(self) -> ServerProtocol:
        """The core this server wraps (built on first use, after handlers are registered)."""
        if self._protocol is None:
            self._protocol = ServerProtocol(
                self.identity,
                self.policy,
                store=self.store,
                resolver=self.resolver,
                dispatcher=self,
                manifest_hash=self.manifest_hash,
                limits=self.limits,
                audit=self._audit,
                clock=wall_clock_of(self._clock),
                monotonic=mono_clock_of(self._monotonic),
                key_guard=KeyGuard(
                    ring=self.key_ring, revocations=self.revocations, monotonic=mono_clock_of(self._monotonic)
                ),
                priority_rights=self.priority_rights,
                # Told of each request only when it has somewhere to go: metrics or log lines,
                # or a span (handle_asgi installs it the first time it finds a tracer).
                observe=self._observer.observe if self._observer.has_sinks else None,
                delegation=self.delegation,
            )
            self._protocol.named_callers = self._named_callers
        return self._protocol

    def _named_callers(self) -> frozenset[str]:
        """The approvers, for reserved capacity (protocol/capacity.py)."""
        return self._approvals.named() if self._approvals is not None else frozenset(self._approvers)

    # -- HTTP ---------------------------------------------------------------------------------
    def handle_asgi(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> Awaitable[None]:
        """Serve one POST to ``/a2a/<endpoint>`` as a raw ASGI exchange (see :meth:`_handle_asgi`).

        With an OpenTelemetry SDK configured it runs in a server span, the child of the
        request's ``traceparent`` header if it has one (a2a_secure.telemetry.tracing).
        Not a coroutine function itself: without tracing, no coroutine of its own.
        """
        tracer = tracing.tracer()
        if tracer is None:
            if self._observer.log_requests:  # the log line names the caller's trace, SDK or not
                tracing.remember_request_trace(scope["headers"])
            return self._handle_asgi(scope, receive, send, endpoint)
        self.protocol.observe = self._observer.observe  # the span gets the request's fields
        return self._traced_asgi(tracer, scope, receive, send, endpoint)

    async def _traced_asgi(
        self, tracer: Any, scope: Scope, receive: Receive, send: Send, endpoint: str
    ) -> None:
        with tracing.server_span(tracer, scope["headers"], endpoint):
            await self._handle_asgi(scope, receive, send, endpoint)

    async def _handle_asgi(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        """Serve one POST to ``/a2a/<endpoint>`` (:func:`a2a_secure.server.asgi.serve_exchange`)."""
        await serve_exchange(self.protocol, self.max_body, scope, receive, send, endpoint)

    async def card_endpoint(self, request: Request) -> Response:
        """GET /.well-known/agent-card.json."""
        return Response(encoding.dumps(self.card), media_type="application/json")

    async def did_document_endpoint(self, request: Request) -> Response:
        """GET /.well-known/did.json for a did:web identity."""
        did = self.identity.did
        if not did.startswith("did:web:"):
            return JSONResponse({"error": "this agent does not use did:web"}, status_code=404)
        if self.key_ring is not None:  # the retired keys too, until their window ends
            doc = self.key_ring.did_document(endpoint=self.url or None, now=self._clock())
            return Response(encoding.dumps(doc), media_type="application/json")
        fragment = self.identity.kid.split("#", 1)[1]
        doc = did_module.did_web_document(
            did, self.identity.public_key, fragment=fragment, endpoint=self.url or None
        )
        return Response(encoding.dumps(doc), media_type="application/json")

    async def rotation_endpoint(self, request: Request) -> Response:
        """GET /.well-known/a2a-rotation.json: this agent's did:key rotation statements."""
        statements = list(self.key_ring.statements) if self.key_ring is not None else []
        return Response(encoding.dumps({"statements": statements}), media_type="application/json")

    async def metrics_endpoint(self, request: Request) -> Response:
        """GET /metrics: the Prometheus metrics (only with ``metrics``)."""
        assert self.metrics is not None
        self._observer.update_gauges()
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def health_endpoint(self, request: Request) -> Response:
        """GET /health: liveness, and the DID served."""
        return JSONResponse({"status": "ok", "did": self.identity.did})

    def router(self) -> APIRouter:
        """The routes, to mount into an existing FastAPI app."""
        router = APIRouter()
        # Raw ASGI endpoints: Starlette routes call a non-function endpoint as an ASGI app.
        router.routes.append(Route("/a2a/handshake", AsgiEndpoint(self, "handshake"), methods=["POST"]))
        router.routes.append(Route("/a2a/intent", AsgiEndpoint(self, "intent"), methods=["POST"]))
        router.add_route("/.well-known/agent-card.json", self.card_endpoint, methods=["GET"])
        router.add_route("/.well-known/did.json", self.did_document_endpoint, methods=["GET"])
        router.add_route("/.well-known/a2a-rotation.json", self.rotation_endpoint, methods=["GET"])
        router.add_route("/health", self.health_endpoint, methods=["GET"])
        if self.metrics is not None:
            router.add_route("/metrics", self.metrics_endpoint, methods=["GET"])
        return router

    def app(self) -> FastAPI:
        """A FastAPI application serving this agent.

        POSTs to the two protocol endpoints go straight to :meth:`handle_asgi` unless
        middleware was added to the app (then they take the normal route through it). Its
        lifespan sweeps expired sessions out of the store every
        ``limits.session_sweep_seconds`` (:mod:`a2a_secure.runtime.sweeper`): an ASGI server
        must run it (uvicorn does by default) for a sealed session's keys to go on time.
        """
        app = AgentApp(title=self.name, docs_url=None, redoc_url=None, openapi_url=None)
        app.agent_server = self
        # Expired sessions (and a sealed one's keys) leave memory on a timer while it runs.
        sweeper = SessionSweeper(lambda: self.store, lambda: self.limits.session_sweep_seconds, self._clock)
        app.router.lifespan_context = sweeper.running
        app.include_router(self.router())
        # A peer that reaches a wrong path or uses a wrong HTTP method gets a JSON-RPC error
        # (PROTOCOL.md §4), as on the protocol endpoints, not the framework's own shape.
        app.router.default = not_found
        app.add_exception_handler(HTTPException, http_error)

        @app.exception_handler(Exception)
        async def _internal(request: Request, exc: Exception) -> Response:
            # Last line of defence: never a stack trace on the wire; the bug is logged.
            log_unexpected(_log, "unanswered failure", exc)
            body = encode_error(None, InternalError().to_error_object())
            return Response(body, status_code=500, media_type="application/json")

        return app


def create_app(
    identity: Identity,
    policy: Policy = DEFAULT_POLICY,
    handlers: Mapping[str, Handler] | None = None,
    *,
    store: Store | None = None,
    audit: Auditor | AuditHook | None = None,
    **kwargs: Any,
) -> FastAPI:
    """A FastAPI app serving ``handlers`` (goal → function) for ``identity`` under ``policy``."""
    server = AgentServer(identity, policy, store=store, audit=audit, **kwargs)
    for goal, fn in (handlers or {}).items():
        server.add_handler(goal, fn)
    app = server.app()
    app.state.agent_server = server
    return app
