"""An a2a-sdk ``ClientTransport`` for the signed-intent binding (PROTOCOL.md §10).

An a2a-sdk client calls a secured agent unchanged, handshake included: register the
transport in a ``ClientFactory`` under :data:`BINDING_URI` and ask the factory for that
binding. Unary methods go through :meth:`A2AClient.request`, streaming ones through
:meth:`A2AClient.stream`, so every answer and every streamed event is verified against the
agent's DID key before the SDK sees it. Interceptors cannot do this (they never see the
signatures); a transport is needed.

    card = (await fetch_agent_card(url, did)).card          # verified, DID pinned
    factory = ClientFactory(secure_client_config())
    register_secure_transport(factory, a2a_client, expected_did=did)
    client = factory.create(card)
    async for event in client.send_message(SendMessageRequest(message=...)):
        ...

The card lists the extensions the agent declares (``a2a_secure_extensions``, PROTOCOL.md
§12): once verified, the transport hands that list to the :class:`A2AClient`, which then
seals the session when the agent declares ``sealed`` (``A2AClient(sealed=True)`` requires
it), names every call with an ``intent_id`` when it declares ``intent_id`` (so a call resent
on a new session runs once), and sends the delegation chain ``on_behalf_of`` only to an agent
that declares ``delegation``.

Errors: a signed A2A error becomes the SDK's exception for its code (``TaskNotFoundError``
for -32001 …); an unsigned error, a verification failure or an a2a-secure protocol error
(-32040 … -32049) is a :class:`SecureTransportError`, never an A2A domain error.

The sequence belongs to the session, not to the transport: transports made from one
:class:`A2AClient` share its session with the agent (and its lock), so any number of
clients, and ``A2AAgent.request`` on the same ``A2AClient``, interleave safely. While a
stream is open the session is held for it (§6.4: a resumable stream needs its session to
itself), so other calls to that agent through the same ``A2AClient`` wait for its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Collection
from typing import Any, TypeVar

from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.client.errors import A2AClientError
from a2a.client.transports.base import ClientTransport
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    SendMessageRequest,
    SendMessageResponse,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.signing import SignatureVerificationError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import Message as ProtoMessage

from a2a_secure.a2a_binding.card import (
    A2A_PROTOCOL_VERSION,
    BINDING_URI,
    binding_interface,
    card_json,
    card_verifier,
    extension_params,
    fetch_agent_card,
)
from a2a_secure.a2a_binding.errors import SecureTransportError, to_sdk_error
from a2a_secure.a2a_binding.server import A2A_DOMAIN, SERVICE_PARAMETERS
from a2a_secure.client.http import A2AClient
from a2a_secure.delegation import Chain
from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import Reach, url_reach
from a2a_secure.protocol.client import ClientSession

__all__ = [
    "SecureA2ATransport",
    "create_secure_client",
    "register_secure_transport",
    "secure_client_config",
]

_R = TypeVar("_R", bound=ProtoMessage)
ExpectedDID = str | Collection[str] | Callable[[str], bool] | None


def _did_allowed(did: str, expected: ExpectedDID) -> bool:
    if expected is None:
        return True
    if isinstance(expected, str):
        return did == expected
    if callable(expected):
        return bool(expected(did))
    return did in expected


class SecureA2ATransport(ClientTransport):
    """The a2a-sdk transport of the signed-intent binding, built on :class:`A2AClient`.

    ``card`` is the agent's A2A card; ``url`` its binding interface's URL (the agent's base
    URL; None: the card's, which must pass the client's address policy, ``client.addresses``).
    ``expected_did`` pins the agent: a DID, a collection of DIDs or a predicate. On
    first use the card is verified against the DID's resolution (:func:`card_verifier`),
    and before every call the handshake's ``manifest_hash`` must be the card's hash, so the
    card the SDK reads is the one the authenticated agent serves. The extensions the
    verified card declares are the client's to use from then on (no second fetch of it).

    ``on_behalf_of``: a delegation chain (PROTOCOL.md §12.7) every call acts under; an agent
    whose card does not declare ``delegation`` is refused (-32602) before anything is sent.
    """

    def __init__(
        self,
        client: A2AClient,
        card: AgentCard,
        url: str | None = None,
        *,
        expected_did: ExpectedDID = None,
        owns_client: bool = False,
        on_behalf_of: Chain | None = None,
    ) -> None:
        try:
            did = extension_params(card)["did"]
            card_url = binding_interface(card).url
            self._card_json = card_json(card)
            self._manifest_hash = encoding.hash_of(self._card_json)
        except (SignatureVerificationError, KeyError) as exc:
            raise SecureTransportError(AuthenticationFailed(f"not a secured A2A card: {exc}")) from None
        # A URL read from the card is the card's word, not the caller's: it passes the
        # client's address policy like any endpoint taken from a document.
        self.url = url if url is not None else _card_url(client, card_url)
        if not isinstance(did, str) or not _did_allowed(did, expected_did):
            raise SecureTransportError(
                AuthenticationFailed("the card names a DID that is not the expected one")
            )
        self.did = did
        self.client = client
        self.agent_card = card
        self.on_behalf_of = on_behalf_of
        self._owns_client = owns_client
        self._verified = False
        self._lock = asyncio.Lock()

    # -- plumbing ---------------------------------------------------------------------------------
    async def _ready(self) -> None:
        if not self._verified:
            async with self._lock:
                if not self._verified:
                    resolved = await self.client.resolver.resolve(self.did)
                    try:
                        card_verifier(self.did, resolved)(self.agent_card)
                    except SignatureVerificationError as exc:
                        raise AuthenticationFailed(f"agent card refused: {exc}"[:200]) from None
                    # The declared extensions, kept under the card's hash: a handshake whose
                    # CHALLENGE signs that hash reads them. A card that declares ``sealed``
                    # also makes every session with the agent sealed from now on, one
                    # opened before (while its card could not be fetched, say) included.
                    self.client.trust_card(self.did, self._card_json)
                    self._verified = True

    def _check_session(self, session: ClientSession) -> None:
        """Every session a call goes on (a new one after -32043 too) commits to this card."""
        if session.server_manifest_hash != self._manifest_hash:
            raise AuthenticationFailed("the agent card is not the one the agent's handshake names")

    @staticmethod
    def _intent(method: str, request: ProtoMessage, context: ClientCallContext | None) -> dict[str, Any]:
        inputs: dict[str, Any] = MessageToDict(request)
        service = {"A2A-Version": A2A_PROTOCOL_VERSION}
        if context is not None and context.service_parameters:
            service.update(context.service_parameters)
        inputs[SERVICE_PARAMETERS] = service
        intent: dict[str, Any] = {"goal": method, "domain": A2A_DOMAIN, "inputs": inputs}
        if context is not None and context.timeout is not None:
            intent["constraints"] = {"timeout_ms": max(1, int(context.timeout * 1000))}
        return intent

    @staticmethod
    def _parse(value: Any, message: _R) -> _R:
        if not isinstance(value, dict):
            raise A2AClientError(f"the agent's signed answer is not a {type(message).__name__}")
        try:
            ParseDict(value, message, ignore_unknown_fields=True)
        except Exception as exc:
            raise A2AClientError(f"the agent's signed answer is not a {type(message).__name__}") from exc
        return message

    async def _unary(self, method: str, request: ProtoMessage, context: ClientCallContext | None) -> Any:
        intent = self._intent(method, request, context)
        try:
            await self._ready()
            answer = await self.client.request(
                self.did,
                intent,
                endpoint=self.url,
                on_behalf_of=self.on_behalf_of,
                session_check=self._check_session,
            )
        except A2AError as exc:
            raise to_sdk_error(exc) from exc
        return answer.result

    async def _stream(
        self, method: str, request: ProtoMessage, context: ClientCallContext | None
    ) -> AsyncGenerator[StreamResponse]:
        intent = self._intent(method, request, context)
        try:
            await self._ready()
            events = self.client.stream_events(
                self.did,
                intent,
                endpoint=self.url,
                on_behalf_of=self.on_behalf_of,
                session_check=self._check_session,
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    # The closing event of a streaming handler carries no partial result.
                    if event.result is None and event.final:
                        continue
                    yield self._parse(event.result, StreamResponse())
        except A2AError as exc:
            raise to_sdk_error(exc) from exc

    # -- ClientTransport ----------------------------------------------------------------------------
    async def send_message(
        self, request: SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> SendMessageResponse:
        """SendMessage."""
        return self._parse(await self._unary("SendMessage", request, context), SendMessageResponse())

    async def send_message_streaming(
        self, request: SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[StreamResponse]:
        """SendStreamingMessage: every event verified (signature, index, order, final)."""
        async for event in self._stream("SendStreamingMessage", request, context):
            yield event

    async def get_task(self, request: GetTaskRequest, *, context: ClientCallContext | None = None) -> Task:
        """GetTask."""
        return self._parse(await self._unary("GetTask", request, context), Task())

    async def list_tasks(
        self, request: ListTasksRequest, *, context: ClientCallContext | None = None
    ) -> ListTasksResponse:
        """ListTasks."""
        return self._parse(await self._unary("ListTasks", request, context), ListTasksResponse())

    async def cancel_task(
        self, request: CancelTaskRequest, *, context: ClientCallContext | None = None
    ) -> Task:
        """CancelTask."""
        return self._parse(await self._unary("CancelTask", request, context), Task())

    async def create_task_push_notification_config(
        self, request: TaskPushNotificationConfig, *, context: ClientCallContext | None = None
    ) -> TaskPushNotificationConfig:
        """CreateTaskPushNotificationConfig."""
        result = await self._unary("CreateTaskPushNotificationConfig", request, context)
        return self._parse(result, TaskPushNotificationConfig())

    async def get_task_push_notification_config(
        self, request: GetTaskPushNotificationConfigRequest, *, context: ClientCallContext | None = None
    ) -> TaskPushNotificationConfig:
        """GetTaskPushNotificationConfig."""
        result = await self._unary("GetTaskPushNotificationConfig", request, context)
        return self._parse(result, TaskPushNotificationConfig())

    async def list_task_push_notification_configs(
        self, request: ListTaskPushNotificationConfigsRequest, *, context: ClientCallContext | None = None
    ) -> ListTaskPushNotificationConfigsResponse:
        """ListTaskPushNotificationConfigs."""
        result = await self._unary("ListTaskPushNotificationConfigs", request, context)
        return self._parse(result, ListTaskPushNotificationConfigsResponse())

    async def delete_task_push_notification_config(
        self, request: DeleteTaskPushNotificationConfigRequest, *, context: ClientCallContext | None = None
    ) -> None:
        """DeleteTaskPushNotificationConfig."""
        await self._unary("DeleteTaskPushNotificationConfig", request, context)

    async def subscribe(
        self, request: SubscribeToTaskRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[StreamResponse]:
        """SubscribeToTask: every event verified."""
        async for event in self._stream("SubscribeToTask", request, context):
            yield event

    async def get_extended_agent_card(
        self, request: GetExtendedAgentCardRequest, *, context: ClientCallContext | None = None
    ) -> AgentCard:
        """GetExtendedAgentCard (the public card when the agent has no extended one)."""
        if not self.agent_card.capabilities.extended_agent_card:
            return self.agent_card
        return self._parse(await self._unary("GetExtendedAgentCard", request, context), AgentCard())

    async def close(self) -> None:
        """Close the :class:`A2AClient` if this transport owns it (a shared one stays open)."""
        if self._owns_client:
            await self.client.aclose()


def _card_url(client: A2AClient, url: str, origin: Reach = Reach.PUBLIC) -> str:
    # The card's word: no more private than the network the card came from (unknown: public).
    try:
        return client.accept_endpoint(url, what="the card's interface URL", origin=origin)
    except A2AError as exc:
        raise SecureTransportError(exc) from None


def secure_client_config(**options: Any) -> ClientConfig:
    """A ``ClientConfig`` that asks for the signed-intent binding."""
    options.setdefault("supported_protocol_bindings", [BINDING_URI])
    return ClientConfig(**options)


def register_secure_transport(
    factory: ClientFactory,
    client: A2AClient,
    *,
    expected_did: ExpectedDID = None,
    on_behalf_of: Chain | None = None,
    card_origin: Reach = Reach.PUBLIC,
) -> None:
    """Register the secure transport in ``factory`` under :data:`BINDING_URI`.

    Every transport the factory makes shares ``client`` (and so its sessions); ``client``
    stays open when an SDK client is closed. ``expected_did`` pins the agents it may reach;
    ``on_behalf_of``: the delegation chain their calls act under (see :class:`SecureA2ATransport`).
    ``card_origin``: the network the cards came from (their URLs may point no further in);
    by default public, the strictest.
    """

    def produce(card: AgentCard, url: str, config: ClientConfig) -> ClientTransport:
        # The SDK picked ``url`` from the card's interfaces: the card's word, so it passes
        # the client's address policy (a card must not point this client at loopback).
        return SecureA2ATransport(
            client,
            card,
            _card_url(client, url, card_origin),
            expected_did=expected_did,
            on_behalf_of=on_behalf_of,
        )

    factory.register(BINDING_URI, produce)


async def create_secure_client(
    client: A2AClient,
    base_url: str,
    expected_did: str,
    *,
    config: ClientConfig | None = None,
    on_behalf_of: Chain | None = None,
) -> Client:
    """An a2a-sdk ``Client`` for the agent at ``base_url`` with DID ``expected_did``.

    The card is fetched and verified exactly as served (:func:`fetch_agent_card`) before
    the SDK client is made with the secure transport. ``on_behalf_of``: see
    :class:`SecureA2ATransport`.
    """
    verified = await fetch_agent_card(base_url, expected_did, http=client.http, resolver=client.resolver)
    factory = ClientFactory(config or secure_client_config())
    register_secure_transport(
        factory,
        client,
        expected_did=expected_did,
        on_behalf_of=on_behalf_of,
        card_origin=url_reach(base_url),  # the card came from there
    )
    return factory.create(verified.card)
