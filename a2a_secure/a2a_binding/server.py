"""Serve an a2a-sdk request handler behind the DID session (PROTOCOL.md §10).

:class:`A2ABridge` mounts a ``RequestHandler`` (an a2a-sdk ``DefaultRequestHandler`` around
any ``AgentExecutor``) into an :class:`~a2a_secure.server.app.AgentServer` as one goal per
A2A method. Only callers that completed the handshake reach it; every call is a signed,
sequenced intent and every answer, each streamed event included, is signed. The SDK's own
(unauthenticated) routes are never mounted: the handler is called in-process with a
``ServerCallContext`` whose user is the caller's DID, so tasks belong to the DID that
created them.

    handler = DefaultRequestHandler(agent_executor=MyExecutor(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    server = AgentServer(identity, policy, url="https://agent.example")
    A2ABridge(handler, agent_card=card).mount(server)
    app = server.app()

The card declares the extensions the server serves (PROTOCOL.md §12: sealed intents,
intent_id, delegation, priority) as any server's does. On a sealed session (§12.6) push
notifications are refused unless ``push_when_sealed=True``: the a2a-sdk's sender would POST
the task's messages and artifacts to the webhook in the clear.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from a2a.auth.user import User
from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler, RequestHandler
from a2a.server.tasks import PushNotificationConfigStore
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    SendMessageRequest,
    SendMessageResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils import errors as sdk_errors
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import Message as ProtoMessage
from packaging.version import InvalidVersion, Version

from a2a_secure.a2a_binding.card import build_agent_card, card_json, sign_agent_card
from a2a_secure.a2a_binding.errors import (
    PushNotificationNotSupported,
    TaskNotFound,
    VersionNotSupported,
    from_sdk_error,
)
from a2a_secure.errors import A2AError, IntentTimeout, InternalError, InvalidParams
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer

__all__ = [
    "A2A_DOMAIN",
    "SERVICE_PARAMETERS",
    "STREAMING_METHODS",
    "UNARY_METHODS",
    "A2ABridge",
    "DIDUser",
]

A2A_DOMAIN = "a2a"
SERVICE_PARAMETERS = "a2a-service-parameters"
VERSION_PARAMETER = "a2a-version"

# A2A JSON-RPC method → the SDK request type it takes.
UNARY_METHODS: Mapping[str, type[ProtoMessage]] = {
    "SendMessage": SendMessageRequest,
    "GetTask": GetTaskRequest,
    "ListTasks": ListTasksRequest,
    "CancelTask": CancelTaskRequest,
    "CreateTaskPushNotificationConfig": TaskPushNotificationConfig,
    "GetTaskPushNotificationConfig": GetTaskPushNotificationConfigRequest,
    "ListTaskPushNotificationConfigs": ListTaskPushNotificationConfigsRequest,
    "DeleteTaskPushNotificationConfig": DeleteTaskPushNotificationConfigRequest,
    "GetExtendedAgentCard": GetExtendedAgentCardRequest,
}
STREAMING_METHODS: Mapping[str, type[ProtoMessage]] = {
    "SendStreamingMessage": SendMessageRequest,
    "SubscribeToTask": SubscribeToTaskRequest,
}
_SENDS = ("SendMessage", "SendStreamingMessage")
SEALED_PUSH_REFUSED = (
    "no push notifications from a sealed session: they would carry the task to the webhook in the clear"
)


class DIDUser(User):
    """The A2A user of a call: the caller's DID, authenticated by the handshake."""

    def __init__(self, did: str) -> None:
        self.did = did

    @property
    def is_authenticated(self) -> bool:
        """Always true: only handshaken callers reach the handler."""
        return True

    @property
    def user_name(self) -> str:
        """The DID (the SDK's stores scope tasks by it)."""
        return self.did

    def __repr__(self) -> str:
        return f"DIDUser({self.did!r})"


def _service_parameters(inputs: Mapping[str, Any]) -> dict[str, str]:
    params = inputs.get(SERVICE_PARAMETERS, {})
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= 4096 for k, v in params.items()
    ):
        raise InvalidParams(f"{SERVICE_PARAMETERS} must be an object of strings")
    for name, value in params.items():
        if name.lower() != VERSION_PARAMETER:
            continue
        try:
            major = Version(value).major
        except InvalidVersion:
            raise VersionNotSupported(f"A2A version {value[:32]!r} is not a version") from None
        if major != 1:
            raise VersionNotSupported(f"A2A version {value[:32]!r} is not supported; this agent speaks 1.x")
    return dict(params)


class A2ABridge:
    """One goal per A2A method, calling ``request_handler`` in-process for the caller's DID.

    ``agent_card`` is the A2A card to publish (skills, modes, capabilities…); by default
    the request handler's own. Its interfaces are replaced by the signed-intent binding and
    the did-session extension is added; the card is signed with the server's DID key and
    served at ``/.well-known/agent-card.json`` as the server's card, so its hash is the
    ``manifest_hash`` of the handshake; it lists the server's ``a2a_secure_extensions``
    (PROTOCOL.md §12), so a server with ``ServerLimits(sealed_intents=True)`` seals its A2A
    calls as any other intent. ``methods`` limits the A2A methods mounted (the session policy
    then authorises them one by one).

    ``push_when_sealed``: whether a sealed session may set up push notifications
    (``CreateTaskPushNotificationConfig``, or a ``SendMessage`` carrying a config) or send a
    message to a task that already has them. The a2a-sdk's sender POSTs every event of the
    task (its messages and artifacts) to the webhook as plain JSON, outside the seal; by
    default such a request is refused with a signed -32003 before the agent runs.
    """

    def __init__(
        self,
        request_handler: RequestHandler,
        *,
        agent_card: AgentCard | None = None,
        methods: Iterable[str] | None = None,
        push_when_sealed: bool = False,
    ) -> None:
        template = agent_card if agent_card is not None else getattr(request_handler, "_agent_card", None)
        if not isinstance(template, AgentCard):
            raise ValueError("pass agent_card: the request handler has no AgentCard to publish")
        known = {**UNARY_METHODS, **STREAMING_METHODS}
        chosen = list(known) if methods is None else list(methods)
        unknown = [name for name in chosen if name not in known]
        if unknown:
            raise ValueError(f"not an A2A method: {unknown[0]!r}")
        self.request_handler = request_handler
        self.template = template
        self.methods = tuple(chosen)
        self.push_when_sealed = push_when_sealed
        self._server: AgentServer | None = None
        self._signed: AgentCard | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- mounting ---------------------------------------------------------------------------------
    def mount(self, server: AgentServer) -> AgentServer:
        """Serve the A2A methods on ``server`` and publish the signed A2A card as its card."""
        self._server = server
        for method in self.methods:
            if method in STREAMING_METHODS:
                server.add_stream(method, self._stream_handler(method), always=True)
            else:
                server.add(method, self._unary_handler(method))
        server.set_card_builder(self._build_card)
        return server

    def _build_card(self, core: dict[str, Any]) -> dict[str, Any]:
        assert self._server is not None
        signed = sign_agent_card(build_agent_card(self.template, core), self._server.identity)
        self._signed = signed
        return card_json(signed)

    @property
    def agent_card(self) -> AgentCard:
        """The signed A2A card the server publishes (built on first use)."""
        if self._server is None:
            raise RuntimeError("mount the bridge on a server first")
        _ = self._server.card
        assert self._signed is not None
        copy = AgentCard()
        copy.CopyFrom(self._signed)
        return copy

    # -- one call ---------------------------------------------------------------------------------
    def _prepare(
        self, method: str, inputs: Any, context: IntentContext
    ) -> tuple[ProtoMessage, ServerCallContext]:
        if context.domain != A2A_DOMAIN:
            raise InvalidParams(f"A2A methods take the domain {A2A_DOMAIN!r}")
        if not isinstance(inputs, dict):
            raise InvalidParams("A2A params must be an object")
        service = _service_parameters(inputs)
        params = {k: v for k, v in inputs.items() if k != SERVICE_PARAMETERS}
        model = {**UNARY_METHODS, **STREAMING_METHODS}[method]
        try:
            request = ParseDict(params, model(), ignore_unknown_fields=True)
        except Exception as exc:
            raise InvalidParams(f"invalid {method} params: {str(exc)[:160]}") from None
        extensions = [v for k, v in service.items() if k.lower() == HTTP_EXTENSION_HEADER.lower()]
        call_context = ServerCallContext(
            user=DIDUser(context.caller_did),
            state={
                "headers": service,
                "method": method,
                "a2a_secure": {
                    "caller_did": context.caller_did,
                    "session_id": context.session_id,
                    "sequence": context.sequence,
                    # §12.7: on whose behalf, from a verified chain (None without one)
                    "principal": context.principal,
                    "delegation": None if context.delegation is None else context.delegation.hops,
                },
            },
            tenant=str(getattr(request, "tenant", "") or ""),
            requested_extensions=get_requested_extensions(extensions),
        )
        return request, call_context

    async def _refuse_push_when_sealed(
        self, method: str, request: Any, context: IntentContext, ctx: ServerCallContext
    ) -> None:
        """On a sealed session, refuse what would send the task to a webhook in the clear.

        Push notifications leave the session: the SDK's sender POSTs each event of the task
        (status messages, artifacts) as plain JSON to the URL of every config the task has.
        So, unless the operator allows it, a sealed session may neither set a config up nor
        send a message to a task that has one (set up earlier, on an unsealed session).
        """
        if not context.sealed or self.push_when_sealed:
            return
        if method == "CreateTaskPushNotificationConfig" or (
            method in _SENDS and request.configuration.HasField("task_push_notification_config")
        ):
            raise PushNotificationNotSupported(SEALED_PUSH_REFUSED)
        if method not in _SENDS or not request.message.task_id:
            return
        if await self._may_push(request.tenant, request.message.task_id, ctx):
            raise PushNotificationNotSupported(SEALED_PUSH_REFUSED)

    async def _may_push(self, tenant: str, task_id: str, ctx: ServerCallContext) -> bool:
        """Whether a message to ``task_id`` could reach a webhook: True unless shown otherwise.

        The SDK's own look-up answers it, and "no such task" (for this DID) means no. A
        look-up the SDK refuses says nothing: a card without
        ``capabilities.push_notifications`` makes it refuse, while the SDK still stores the
        configs sent with messages and its sender still posts to them. Then the answer is
        no only where it can be read: a ``DefaultRequestHandler`` with no sender never
        posts, and one with a config store is asked directly. Anything else fails closed.
        """
        handler = self.request_handler
        listing = ListTaskPushNotificationConfigsRequest(tenant=tenant, task_id=task_id)
        try:
            return bool((await handler.on_list_task_push_notification_configs(listing, ctx)).configs)
        except sdk_errors.TaskNotFoundError:
            return False
        except sdk_errors.A2AError:
            pass
        if not isinstance(handler, DefaultRequestHandler):
            return True
        if getattr(handler, "_push_sender", True) is None:
            return False
        store = getattr(handler, "_push_config_store", None)
        if not isinstance(store, PushNotificationConfigStore):
            return True
        return bool(await store.get_info_for_dispatch(task_id))  # what the sender would read

    async def _invoke(self, method: str, request: Any, ctx: ServerCallContext) -> Any:
        """Call the handler for a unary method; the JSON result, as the SDK's JSON-RPC sends it."""
        h = self.request_handler
        try:
            if method == "SendMessage":
                answer = await h.on_message_send(request, ctx)
                if isinstance(answer, Task):
                    return MessageToDict(SendMessageResponse(task=answer))
                return MessageToDict(SendMessageResponse(message=answer))
            if method in ("GetTask", "CancelTask"):
                call = h.on_get_task if method == "GetTask" else h.on_cancel_task
                task = await call(request, ctx)
                if task is None:
                    raise TaskNotFound()
                return MessageToDict(task)
            if method == "ListTasks":
                page = await h.on_list_tasks(request, ctx)
                result: dict[str, Any] = MessageToDict(page, always_print_fields_with_no_presence=True)
                if not request.include_artifacts:
                    for task in result.get("tasks", []):
                        task.pop("artifacts", None)
                return result
            if method == "CreateTaskPushNotificationConfig":
                return MessageToDict(await h.on_create_task_push_notification_config(request, ctx))
            if method == "GetTaskPushNotificationConfig":
                return MessageToDict(await h.on_get_task_push_notification_config(request, ctx))
            if method == "ListTaskPushNotificationConfigs":
                return MessageToDict(await h.on_list_task_push_notification_configs(request, ctx))
            if method == "DeleteTaskPushNotificationConfig":
                await h.on_delete_task_push_notification_config(request, ctx)
                return None
            if method == "GetExtendedAgentCard":
                return MessageToDict(await h.on_get_extended_agent_card(request, ctx))
        except sdk_errors.A2AError as exc:
            raise from_sdk_error(exc) from None
        raise InternalError(f"unhandled A2A method {method}")  # pragma: no cover - guarded in __init__

    def _timeout_seconds(self, context: IntentContext) -> float:
        assert self._server is not None
        ceiling = self._server.limits.max_handler_timeout_ms
        asked = context.constraints.get("timeout_ms", ceiling)
        return float(min(asked, ceiling)) / 1000

    def _unary_handler(self, method: str) -> Callable[[Any, IntentContext], Awaitable[Any]]:
        async def handle(inputs: Any, context: IntentContext) -> Any:
            request, ctx = self._prepare(method, inputs, context)
            await self._refuse_push_when_sealed(method, request, context, ctx)
            return await self._run_unary(method, request, ctx, self._timeout_seconds(context))

        return handle

    async def _run_unary(self, method: str, request: Any, ctx: ServerCallContext, wait_s: float) -> Any:
        # The handler runs in a task of its own and is never cancelled by the core: the SDK
        # swallows a cancellation inside SendMessage (it then returns the task as it stands),
        # which would make the core's timeout report a half-done task as a success or hang.
        # The bridge stops waiting a little before the core would and answers the task as it
        # stands (like return_immediately); other methods get a signed -32049.
        margin = min(0.5, wait_s * 0.2)
        work = asyncio.create_task(self._invoke(method, request, ctx))
        try:
            done, _ = await asyncio.wait({work}, timeout=wait_s - margin)
        except asyncio.CancelledError:
            work.cancel()
            raise
        if done:
            return work.result()
        if method == "SendMessage":
            # Cancelling the wait makes the SDK answer with the task in its current state;
            # the agent itself keeps running in the background.
            work.cancel()
            done, _ = await asyncio.wait({work}, timeout=margin / 2)
            if done and not work.cancelled() and work.exception() is None:
                result = work.result()
                if isinstance(result, dict) and "task" in result:
                    return result
        else:
            work.cancel()
        self._background.add(work)
        work.add_done_callback(self._discard)
        raise IntentTimeout(f"{method} did not finish within {int(wait_s * 1000)} ms")

    def _discard(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved

    def _stream_handler(self, method: str) -> Callable[[Any, IntentContext], AsyncIterator[Any]]:
        def open_stream(inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
            return self._stream(method, inputs, context)

        return open_stream

    async def _stream(self, method: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        request, ctx = self._prepare(method, inputs, context)
        await self._refuse_push_when_sealed(method, request, context, ctx)
        # The SDK's generator runs in a pump task of its own and hands events over a queue:
        # the core's timeout between events then cancels only the wait on the queue, never
        # the SDK (which would end its stream quietly, as if it were complete).
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(method, request, ctx, queue))
        try:
            while True:
                kind, value = await queue.get()
                if kind == "event":
                    yield value
                elif kind == "end":
                    return
                else:
                    raise value
        finally:
            if not pump.done():
                pump.cancel()
                self._background.add(pump)
                pump.add_done_callback(self._discard)

    async def _pump(
        self, method: str, request: Any, ctx: ServerCallContext, queue: asyncio.Queue[tuple[str, Any]]
    ) -> None:
        h = self.request_handler
        if method == "SendStreamingMessage":
            stream = h.on_message_send_stream(request, ctx)
        else:
            stream = h.on_subscribe_to_task(request, ctx)
        try:
            async for event in stream:
                queue.put_nowait(("event", MessageToDict(to_stream_response(event))))
            queue.put_nowait(("end", None))
        except sdk_errors.A2AError as exc:
            queue.put_nowait(("error", from_sdk_error(exc)))
        except A2AError as exc:
            queue.put_nowait(("error", exc))
        except Exception:
            queue.put_nowait(("error", InternalError("the A2A request handler failed")))
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
