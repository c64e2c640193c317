"""The HTTP adapter of the server side: FastAPI routes around ``ServerProtocol``.

Everything protocol-shaped lives in the core; this module only reads bodies (with the size
limit enforced while reading), checks the content type, parses the JSON-RPC envelope and
writes the reply with the HTTP status of PROTOCOL.md §7. The two hot endpoints take the raw
``Request`` and return a raw ``Response``: FastAPI's validation would cost as much as the
signature work and could answer with shapes the protocol does not allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI
from fastapi.exception_handlers import http_exception_handler
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import (
    A2AError,
    HTTPMethodNotAllowed,
    InternalError,
    MethodNotFound,
    PayloadTooLarge,
    SessionUnknown,
    UnsupportedMediaType,
    log_unexpected,
)
from a2a_secure.identity import did as did_module
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.approval import (
    APPROVAL_GOALS,
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
    IntentDispatcher,
    Reply,
    ServerLimits,
)
from a2a_secure.protocol.server.admission import admit_action
from a2a_secure.protocol.server.dispatcher import InnerGoal
from a2a_secure.protocol.tools import TOOL_EXECUTE, TOOL_LIST, ToolService
from a2a_secure.protocol.wire import (
    EnvelopeError,
    encode_error,
    encode_result,
    encode_result_json,
    read_request,
)
from a2a_secure.runtime.exactly_once import server_extensions
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.runtime.sweeper import SessionSweeper
from a2a_secure.store.actions import ActionStore
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
_JSON_TYPES = frozenset((b"application/json", b"application/json; charset=utf-8"))
# RFC 9110 §8.3.1 and RFC 9110 §5.6.6: media-type = type "/" subtype parameters, where
# parameters = *( OWS ";" OWS [ parameter ] ) and parameter = token "=" ( token / quoted-string ).
_TCHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t !-~\x80-\xff])*"'
_PARAMETER = re.compile(rf"[ \t]*;[ \t]*(?:({_TCHARS})=({_TCHARS}|{_QUOTED}))?")
_ANY_PARAMETER = rf"[ \t]*;[ \t]*(?:{_TCHARS}=(?:{_TCHARS}|{_QUOTED}))?"
_MEDIA_TYPE = re.compile(rf"[ \t]*({_TCHARS})/({_TCHARS})((?:{_ANY_PARAMETER})*)[ \t]*")
_UNQUOTE = re.compile(r"\\(.)")
_CARD_CORE_MEMBERS = ("did", "protocol", "endpoints", "intents", "public_keys")
Handler = Callable[..., Any]


_HOT_PATHS = {"/a2a/handshake": "handshake", "/a2a/intent": "intent"}
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class _AsgiEndpoint:
    """A protocol endpoint as a raw ASGI app (used inside Starlette routing)."""

    def __init__(self, server: AgentServer, endpoint: str) -> None:
        self.server = server
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.server.handle_asgi(scope, receive, send, self.endpoint)


class _AgentApp(FastAPI):
    """FastAPI with a direct path for the two protocol endpoints."""

    agent_server: AgentServer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not self.user_middleware:
            endpoint = _HOT_PATHS.get(scope["path"])
            if endpoint is not None:
                try:
                    await self.agent_server.handle_asgi(scope, receive, send, endpoint)
                except Exception as exc:
                    # handle_asgi answers every protocol failure itself; this is a bug's last
                    # line of defence: no stack trace on the wire (nothing if already started),
                    # and the bug logged by type and place for the operator.
                    log_unexpected(_log, "unanswered failure on a protocol endpoint", exc)
                    with contextlib.suppress(Exception):
                        body = encode_error(None, InternalError().to_error_object())
                        await _send_json(send, 500, body)
                return
        await super().__call__(scope, receive, send)


async def _receive_body(receive: Receive, limit: int, message: Message | None = None) -> bytes | None:
    """The request body, refused past ``limit`` bytes as it arrives; None on disconnect.

    ``message``: the first message, when the caller has received it already.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if message is None:
            message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                await _linger(receive, limit)
                raise PayloadTooLarge()
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = None


async def _linger(receive: Receive, budget: int, seconds: float = 1.0) -> None:
    # Discard a bounded amount of what the peer is still sending before the 413: closing a
    # socket with unread data makes the kernel reset it, and a client that overshot the
    # limit a little would then never read the answer (nginx's "lingering close"). The
    # bound keeps a flood from costing more than one more limit's worth, or a second.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while budget > 0:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return
                budget -= len(message.get("body", b""))


async def _send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _reply_messages(request_id: Any, reply: Reply, close: bool) -> tuple[Message, Message]:
    """The two ASGI messages of a JSON answer: its start and its body."""
    if reply.error is not None:
        body = encode_error(request_id, reply.error)
    elif reply.result_json is not None:
        body = encode_result_json(request_id, reply.result_json)
    else:
        body = encode_result(request_id, reply.result)
    extra: list[tuple[bytes, bytes]] = []
    if reply.retry_after is not None:
        extra.append((b"retry-after", str(reply.retry_after).encode()))
    if close:
        extra.append((b"connection", b"close"))
    headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(body)), *extra]
    return (
        {"type": "http.response.start", "status": reply.http_status, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


async def _send_stream(
    send: Send,
    request_id: Any,
    events: AsyncIterator[Mapping[str, Any]],
    abort: Callable[[int], AsyncIterator[Mapping[str, Any]]] | None = None,
) -> None:
    """Frame events as PROTOCOL.md §6.4 says: ``id: <index>`` LF ``data: <JSON>`` LF LF."""

    def frame(event: Mapping[str, Any]) -> bytes:
        if not event:  # keep-alive
            return b": keep-alive\n\n"
        return b"id: %d\ndata: %s\n\n" % (event["index"], encode_result(request_id, event))

    await send({"type": "http.response.start", "status": 200, "headers": list(_SSE_HEADERS)})
    next_index = 0
    try:
        async for event in events:
            await send({"type": "http.response.body", "body": frame(event), "more_body": True})
            if event:
                next_index = event["index"] + 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        return  # the client went away; the handler runs on (PROTOCOL.md §6.4)
    except asyncio.CancelledError:
        # The HTTP server is shutting down and gave up waiting for this stream: stop the
        # handler, and send the final -32603 event its pump signs (§6.4) before the
        # connection closes, if it comes within a moment.
        if abort is not None:
            rest = abort(next_index)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    async for event in rest:
                        await send({"type": "http.response.body", "body": frame(event), "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        raise
    finally:
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await closer()


def _positional_arity(fn: Handler) -> int:
    return len(
        [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


def _as_async(fn: Handler) -> Callable[[Any, Any], Awaitable[Any]]:
    """``fn(data)`` or ``fn(data, context)``, sync (run in a worker thread) or async.

    An async ``fn`` is called directly (or through a plain function dropping the context):
    no coroutine of our own between the runner and the handler.
    """
    wants_context = _positional_arity(fn) >= 2
    if inspect.iscoroutinefunction(fn):
        if wants_context:
            return fn
        return lambda inputs, context: fn(inputs)

    async def call(inputs: Any, context: Any) -> Any:
        args = (inputs, context) if wants_context else (inputs,)
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    return call


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


def _content_type_ok(value: bytes) -> bool:
    """Whether ``value`` is ``application/json``, bare or with ``charset=utf-8`` (PROTOCOL.md §4).

    Read as RFC 9110 says: type, subtype, parameter names and the charset value are
    case-insensitive, a parameter value may be a quoted-string (``charset="utf-8"`` is
    ``charset=utf-8``), whitespace around ``;`` is allowed. Any other parameter, a second
    charset or another charset is refused: the body is read as UTF-8 and nothing else.
    """
    if value in _JSON_TYPES:  # the common forms, without the parse
        return True
    match = _MEDIA_TYPE.fullmatch(value.decode("latin-1"))
    if match is None or match[1].lower() != "application" or match[2].lower() != "json":
        return False
    charsets = 0
    for name, raw in _PARAMETER.findall(match[3]):
        if not name:  # an empty parameter (a stray ";") is allowed by the grammar
            continue
        text = _UNQUOTE.sub(r"\1", raw[1:-1]) if raw.startswith('"') else raw
        if name.lower() != "charset" or text.lower() != "utf-8":
            return False
        charsets += 1
    return charsets <= 1


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """Any path the app does not serve: a JSON-RPC -32601 with HTTP 404, not a framework page."""
    if scope["type"] != "http":
        return
    error = MethodNotFound(f"no such endpoint: {scope['path'][:128]}")
    await _send_json(send, error.http_status, encode_error(None, error.to_error_object()))


async def _http_error(request: Request, exc: Exception) -> Response:
    """A path served for other HTTP methods: a JSON-RPC -32600 with HTTP 405 and ``Allow``."""
    assert isinstance(exc, HTTPException)
    if exc.status_code != HTTPMethodNotAllowed.http_status:
        return await http_exception_handler(request, exc)
    error = HTTPMethodNotAllowed(f"{request.method[:16]} is not served on {request.url.path[:128]}")
    body = encode_error(None, error.to_error_object())
    return Response(body, status_code=exc.status_code, headers=exc.headers, media_type="application/json")


class AgentServer(IntentDispatcher):
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
        wants_context = _positional_arity(fn) >= 2
        if inspect.isasyncgenfunction(fn):
            # A streaming handler: an async generator of partial results (§6.4).
            def open_stream(inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
                return fn(inputs, context) if wants_context else fn(inputs)  # type: ignore[no-any-return]

            self.add_stream(goal, open_stream)
            return
        self.add(goal, _as_async(fn))

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

    # -- human approval and tools (PROTOCOL.md §12) -------------------------------------------
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
        self.approvals.register(action, _as_async(fn), approvers=approvers)
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
        """Serve one POST to ``/a2a/<endpoint>`` as a raw ASGI exchange.

        The two hot endpoints bypass Starlette's Request/Response objects (and, in the app
        from :meth:`app`, the middleware stack and routing): they cost as much as the
        signature work. The Content-Type is checked before the body is read, and the body
        limit is enforced while reading, whatever Content-Length claims (PROTOCOL.md §9).
        """
        protocol = self.protocol
        close = False
        request_id: Any = None
        try:
            content_type: bytes | None = None
            declared: bytes | None = None
            for name, value in scope["headers"]:
                if name == b"content-type":
                    content_type = value
                elif name == b"content-length":
                    declared = value
            if content_type is None or not _content_type_ok(content_type):
                raise UnsupportedMediaType()
            if declared is not None and declared.isdigit() and int(declared) > self.max_body:
                raise PayloadTooLarge()
            # One message holds a small body: taken here without a coroutine of its own.
            message = await receive()
            body = message.get("body", b"")
            if (
                message["type"] != "http.request"
                or message.get("more_body", False)
                or len(body) > self.max_body
            ):
                body = await _receive_body(receive, self.max_body, message)
            if body is None:
                return  # the client went away
            request_id, method, params = read_request(body, endpoint)
        except A2AError as exc:
            reply = protocol.reject(exc)
            # The body was not read to its end: end the connection, or the HTTP server would
            # go on reading whatever the peer still sends (ATTACKS.md H1).
            close = isinstance(exc, PayloadTooLarge | UnsupportedMediaType)
        except EnvelopeError as exc:
            reply = protocol.reject(exc.error, event=exc.event)
            request_id = exc.request_id
        else:
            client = scope.get("client")
            source = client[0] if client else ""
            pending = protocol.handle_now(method, params, source=source)
            reply = pending if isinstance(pending, Reply) else await pending
        if reply.stream is not None:
            await _send_stream(send, request_id, reply.stream, reply.abort)
            return
        start, answer = _reply_messages(request_id, reply, close)
        await send(start)
        await send(answer)

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
        router.routes.append(Route("/a2a/handshake", _AsgiEndpoint(self, "handshake"), methods=["POST"]))
        router.routes.append(Route("/a2a/intent", _AsgiEndpoint(self, "intent"), methods=["POST"]))
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
        app = _AgentApp(title=self.name, docs_url=None, redoc_url=None, openapi_url=None)
        app.agent_server = self
        # Expired sessions (and a sealed one's keys) leave memory on a timer while it runs.
        sweeper = SessionSweeper(lambda: self.store, lambda: self.limits.session_sweep_seconds, self._clock)
        app.router.lifespan_context = sweeper.running
        app.include_router(self.router())
        # A peer that reaches a wrong path or uses a wrong HTTP method gets a JSON-RPC error
        # (PROTOCOL.md §4), as on the protocol endpoints, not the framework's own shape.
        app.router.default = _not_found
        app.add_exception_handler(HTTPException, _http_error)

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
