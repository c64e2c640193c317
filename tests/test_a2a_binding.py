"""The binding for the official A2A protocol (PROTOCOL.md §10), end to end over real uvicorn.

An a2a-sdk agent (a ``DefaultRequestHandler`` around an ``AgentExecutor`` that counts its
calls) runs behind ``A2ABridge``; a2a-sdk clients reach it through the secure transport.
Nothing is mocked: the card is signed and verified with the SDK's own signer, verifier and
resolver, and the man in the middle rewrites real event streams on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import httpx
import pytest

# The SDK's OpenTelemetry spans are on by default (BASELINES.md); read at import time.
os.environ["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = "false"

pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a.client import A2ACardResolver, BaseClient, ClientCallContext, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, new_text_message
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryPushNotificationConfigStore, InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    InvalidParamsError,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    PushNotificationNotSupportedError,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from a2a.utils.signing import ProtectedHeader, SignatureVerificationError, create_agent_card_signer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from starlette.applications import Starlette

from a2a_secure.a2a_binding import (
    BINDING_URI,
    EXTENSION_URI,
    A2ABridge,
    CardVerificationError,
    PushUrlPolicy,
    SecureA2ATransport,
    SecureTransportError,
    build_agent_card,
    card_json,
    card_manifest_hash,
    card_verifier,
    extension_params,
    fetch_agent_card,
    register_secure_transport,
    secure_client_config,
    sign_agent_card,
    verify_card_json,
)
from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import AddressPolicy
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app

# The servers here run on 127.0.0.1: endpoints read from a document need the explicit opt-in.
LOOPBACK = AddressPolicy.build(dev_allow_loopback=True)

JSON = {"Content-Type": "application/json"}
FAST_RETRY = RetryPolicy(attempts=2, base=0.01, cap=0.02)
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def seed(name: str) -> bytes:
    return hashlib.sha256(b"a2a-binding-tests:" + name.encode()).digest()


def ident(name: str) -> Identity:
    """A fixed identity per name."""
    return Identity.from_seed(seed(name), name)


SERVER = ident("a2a-echo")


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# The example's executor (examples/a2a_echo_agent.py) counts its calls, which the tests use.
CountingEcho = load_example("a2a_echo_agent").EchoExecutor


def template_card(*, push: bool = False, extended: bool = False) -> AgentCard:
    return AgentCard(
        name="a2a-echo",
        # Replaced by the bridge; given so that the SDK does not log the card as incomplete.
        supported_interfaces=[
            AgentInterface(url="http://127.0.0.1", protocol_binding=BINDING_URI, protocol_version="1.0")
        ],
        description="Echoes words back as artifact chunks",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True, push_notifications=push, extended_agent_card=extended),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echo", tags=["echo"])],
    )


def send_request(text: str = "hello secure world", **config: Any) -> SendMessageRequest:
    request = SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))
    if config:
        request.configuration.CopyFrom(SendMessageConfiguration(**config))
    return request


def message_inputs(text: str = "hello secure world") -> dict[str, Any]:
    return MessageToDict(send_request(text))


@dataclass
class Env:
    url: str
    server: AgentServer
    bridge: A2ABridge
    handler: DefaultRequestHandler
    executor: CountingEcho

    @property
    def did(self) -> str:
        return self.server.identity.did

    def a2a_client(self, name: str = "alice", **kwargs: Any) -> A2AClient:
        kwargs.setdefault("addresses", LOOPBACK)  # the card names this test's loopback server
        return A2AClient(ident(name), **kwargs)

    def sdk_client(self, client: A2AClient, *, streaming: bool = True) -> BaseClient:
        factory = ClientFactory(secure_client_config(streaming=streaming))
        register_secure_transport(factory, client, expected_did=self.did)
        return cast(BaseClient, factory.create(self.bridge.agent_card))


@contextlib.asynccontextmanager
async def running(
    *,
    policy: Policy | None = None,
    delay: float = 0.0,
    push: bool = False,
    push_url_validator: Callable[[str], Any] | None = None,
    extended_card: AgentCard | None = None,
) -> AsyncIterator[Env]:
    executor = CountingEcho(delay)
    card = template_card(push=push, extended=extended_card is not None)
    handler = DefaultRequestHandler(
        agent_executor=executor,
        task_store=InMemoryTaskStore(),
        agent_card=card,
        push_config_store=InMemoryPushNotificationConfigStore() if push else None,
        push_url_validator=push_url_validator,
        extended_agent_card=extended_card,
    )
    # The binding of §10 on sessions of the base contract: this server turned sealing (on by
    # default) off. tests/test_a2a_sealed.py runs the binding sealed.
    server = AgentServer(
        SERVER, policy or Policy(), name="a2a-echo", limits=ServerLimits(sealed_intents=False)
    )
    bridge = A2ABridge(handler, agent_card=card)
    bridge.mount(server)
    try:
        async with serve_app(server.app()) as url:
            server.url = url  # before the card is first built
            yield Env(url, server, bridge, handler, executor)
    finally:
        await handler.aclose()


async def text_of(client: BaseClient, request: SendMessageRequest) -> tuple[list[str], Any]:
    """Send ``request``; the kinds of the events seen, and the last task."""
    kinds: list[str] = []
    task = None
    async for event in client.send_message(request):
        kind = event.WhichOneof("payload")
        kinds.append(kind)
        if kind == "task":
            task = event.task
    return kinds, task


# -- the card ----------------------------------------------------------------------------------


async def test_sdk_card_resolver_accepts_the_signed_card() -> None:
    async with running() as env, httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, env.url).get_agent_card(signature_verifier=card_verifier(env.did))
    assert [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces] == [
        (BINDING_URI, env.url, "1.0")
    ]
    (extension,) = [e for e in card.capabilities.extensions if e.uri == EXTENSION_URI]
    assert extension.required is True
    params = extension_params(card)
    assert params == {
        "did": env.did,
        "protocol": "a2a-secure/1.0",
        "endpoints": {"handshake": "/a2a/handshake", "intent": "/a2a/intent"},
        "intents": env.server.goals,
        "public_keys": [SERVER.public_key_entry()],
        # the server's declared extensions (PROTOCOL.md §12), signed with the rest
        "a2a_secure_extensions": ["intent_id", "priority"],
    }
    assert {"SendMessage", "SendStreamingMessage", "GetTask", "CancelTask", "SubscribeToTask"} <= set(
        params["intents"]
    )
    (signature,) = card.signatures
    header = json.loads(base64.urlsafe_b64decode(signature.protected + "=="))
    assert header == {"alg": "EdDSA", "kid": SERVER.kid, "typ": "JOSE"}  # no HS256, no "jku": null
    assert card.skills[0].id == "echo" and card.capabilities.streaming


async def test_card_hash_is_the_manifest_hash_of_the_handshake() -> None:
    async with running() as env, env.a2a_client() as client:
        raw = (await client.http.get(env.url + "/.well-known/agent-card.json")).json()
        verified = await fetch_agent_card(env.url, env.did, http=client.http)
        session = await client.session_for(env.did, env.url)
    assert encoding.hash_of(raw) == session.server_manifest_hash == env.server.manifest_hash
    assert verified.manifest_hash == card_manifest_hash(verified.card) == session.server_manifest_hash
    assert card_json(verified.card) == raw  # the served JSON is a function of the signed card
    for member in ("did", "protocol", "endpoints", "intents", "public_keys"):
        assert raw[member] == extension_params(verified.card)[member]
    assert raw["url"] == env.url


async def test_a_card_cannot_point_the_client_at_loopback_without_the_opt_in() -> None:
    # The SDK takes the transport's URL from the card: the card's word, so it passes the
    # client's address policy like a did:web service endpoint (SECURITY.md).
    async with running() as env, env.a2a_client(addresses=AddressPolicy()) as client:
        factory = ClientFactory(secure_client_config(streaming=False))
        register_secure_transport(factory, client, expected_did=env.did)
        with pytest.raises(SecureTransportError) as info:
            factory.create(env.bridge.agent_card)
        assert info.value.code == -32602 and "interface URL" in str(info.value)
        with pytest.raises(SecureTransportError):
            SecureA2ATransport(client, env.bridge.agent_card, expected_did=env.did)
        assert client._peers == {}  # nothing was sent
        # A URL the caller passes itself is its own choice, as an endpoint argument is.
        SecureA2ATransport(client, env.bridge.agent_card, env.url, expected_did=env.did)


async def test_fetching_a_card_has_one_deadline_for_the_whole_card(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_didweb import DocServer, Req, send

    async def drip(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, headers={"Content-Length": "100", "Content-Type": "application/json"})
        for _ in range(100):  # each read is quick; only an overall deadline stops it
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    monkeypatch.setattr("a2a_secure.client.extensions.CARD_FETCH_TIMEOUT", 0.5)
    slow = await DocServer(None, routes={"/.well-known/agent-card.json": drip}).start()
    try:
        began = time.monotonic()
        with pytest.raises(CardVerificationError, match="did not arrive within"):
            await fetch_agent_card(f"http://127.0.0.1:{slow.port}", SERVER.did)
        assert time.monotonic() - began < 2
    finally:
        await slow.close()


async def test_a_validly_signed_card_that_is_not_the_served_one_is_refused_by_the_transport() -> None:
    async with running() as env, env.a2a_client() as client:
        stale = env.bridge.agent_card
        stale.skills[0].description = "an older card, still signed by the agent's key"
        stale = sign_agent_card(stale, SERVER)
        card_verifier(env.did)(stale)  # its signature is fine …
        factory = ClientFactory(secure_client_config(streaming=False))
        register_secure_transport(factory, client, expected_did=env.did)
        sdk = factory.create(stale)
        with pytest.raises(SecureTransportError) as info:  # … but the handshake names another card
            await sdk.get_task(GetTaskRequest(id="x"))
    assert info.value.code == -32040 and "handshake" in str(info.value)


async def test_tampered_params_did_is_refused() -> None:
    async with running() as env, httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, env.url).get_agent_card()
    mallory = ident("mallory")
    for ext in card.capabilities.extensions:
        if ext.uri == EXTENSION_URI:
            ext.params["did"] = mallory.did
    with pytest.raises(CardVerificationError):
        card_verifier(env.did)(card)  # the pinned DID is not the card's
    with pytest.raises(CardVerificationError):
        card_verifier(mallory.did)(card)  # and the keys and signature are not mallory's


async def test_card_signed_by_another_key_is_refused() -> None:
    async with running() as env:
        genuine = env.bridge.agent_card
    mallory = ident("mallory")
    by_mallory = sign_agent_card(genuine, mallory)  # mallory's kid
    with pytest.raises(CardVerificationError):
        card_verifier(SERVER.did)(by_mallory)
    # Mallory's key under the server's kid: the signature does not verify.
    forged = AgentCard()
    forged.CopyFrom(genuine)
    del forged.signatures[:]
    header = cast(ProtectedHeader, {"alg": "EdDSA", "kid": SERVER.kid, "typ": "JOSE"})
    create_agent_card_signer(Ed25519PrivateKey.from_private_bytes(seed("mallory")), header)(forged)
    with pytest.raises(CardVerificationError):
        card_verifier(SERVER.did)(forged)
    card_verifier(SERVER.did)(genuine)


@pytest.mark.parametrize(
    "header",
    [
        {"alg": "EdDSA", "kid": SERVER.kid, "typ": "JOSE", "jku": "https://attacker.example/jwks.json"},
        {"alg": "EdDSA", "kid": SERVER.kid, "typ": "JOSE", "jku": None},  # the signer's default
        {"alg": "EdDSA", "kid": SERVER.kid},
        {"alg": "EdDSA", "kid": SERVER.kid, "typ": "JWT"},
    ],
)
async def test_a_signature_with_jku_or_another_header_is_refused(header: dict[str, Any]) -> None:
    async with running() as env:
        card = env.bridge.agent_card
    del card.signatures[:]
    key = Ed25519PrivateKey.from_private_bytes(seed("a2a-echo"))  # the genuine key
    create_agent_card_signer(key, cast(ProtectedHeader, header))(card)
    with pytest.raises(CardVerificationError):
        card_verifier(SERVER.did)(card)


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("did", ident("mallory").did),
        ("intents", ["SendMessage"]),
        ("public_keys", [ident("mallory").public_key_entry()]),
        ("endpoints", {"handshake": "/evil/handshake", "intent": "/a2a/intent"}),
        ("url", "https://attacker.example"),
        ("streaming_intents", ["SendStreamingMessage"]),  # an unsigned extra
        ("a2a_secure_extensions", ["intent_id", "priority", "sealed"]),  # signed in the params
    ],
)
async def test_top_level_members_that_differ_from_params_are_refused(member: str, value: Any) -> None:
    async with running() as env, httpx.AsyncClient() as http:
        raw = (await http.get(env.url + "/.well-known/agent-card.json")).json()
    verify_card_json(raw, env.did)
    raw[member] = value
    with pytest.raises(CardVerificationError):
        verify_card_json(raw, env.did)


def test_pitfall_numbers_in_extension_params_become_doubles() -> None:
    struct = Struct()
    struct.update({"n": 1})
    assert MessageToDict(struct) == {"n": 1.0} and isinstance(MessageToDict(struct)["n"], float)
    assert encoding.dumps(MessageToDict(struct)) != encoding.dumps({"n": 1})  # "1.0" on the wire
    core = {
        "name": "x",
        "description": "x",
        "version": "1",
        "url": "http://127.0.0.1:1",
        "did": SERVER.did,
        "protocol": "a2a-secure/1.0",
        "endpoints": {"handshake": "/a2a/handshake", "intent": "/a2a/intent"},
        "intents": ["SendMessage"],
        "public_keys": [SERVER.public_key_entry()],
    }
    build_agent_card(template_card(), core)
    with pytest.raises(ValueError, match="no numbers"):
        build_agent_card(template_card(), {**core, "intents": ["SendMessage", 7]})
    card = sign_agent_card(build_agent_card(template_card(), core), SERVER)
    for ext in card.capabilities.extensions:
        ext.params["intents"] = [1]
    with pytest.raises(CardVerificationError):
        card_verifier(SERVER.did)(card)


# -- who may reach the agent --------------------------------------------------------------------


async def test_a_plain_a2a_sdk_client_finds_no_compatible_transport() -> None:
    async with running() as env:
        card = env.bridge.agent_card
    for config in (ClientConfig(), ClientConfig(supported_protocol_bindings=["JSONRPC", "HTTP+JSON"])):
        with pytest.raises(ValueError, match="no compatible transports"):
            ClientFactory(config).create(card)
    assert env.executor.calls == 0


async def test_plain_json_rpc_calls_are_refused_and_never_reach_the_executor() -> None:
    rpc = {
        "jsonrpc": "2.0",
        "method": "SendMessage",
        "params": message_inputs(),
        "id": 1,
    }
    headers = {**JSON, "A2A-Version": "1.0"}
    async with running() as env, httpx.AsyncClient() as http:
        intent = await http.post(env.url + "/a2a/intent", json=rpc, headers=headers)
        assert intent.status_code == 404 and intent.json()["error"]["code"] == -32601
        rpc["method"] = "intent"
        unsigned = await http.post(env.url + "/a2a/intent", json=rpc, headers=headers)
        assert unsigned.status_code == 400 and unsigned.json()["error"]["code"] == -32602
        for path in ("/", "/v1/message:send", "/a2a/v1"):  # the SDK's own routes are not mounted
            assert (await http.post(env.url + path, json=rpc, headers=headers)).status_code in (404, 405)
    assert env.executor.calls == 0


# -- calls through the secure transport ------------------------------------------------------------


async def test_send_message_get_task_and_list_tasks() -> None:
    async with running() as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        kinds, task = await text_of(sdk, send_request("one two three"))
        assert kinds == ["task"]
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_artifact_text(task.artifacts[0], " ") == "one two three"
        got = await sdk.get_task(GetTaskRequest(id=task.id))
        assert got.id == task.id and got.status.state == TaskState.TASK_STATE_COMPLETED
        listed = await sdk.list_tasks(ListTasksRequest())
        assert [t.id for t in listed.tasks] == [task.id]
    assert env.executor.calls == 1


async def test_streaming_task_status_and_artifact_events_each_verified() -> None:
    async with running() as env, env.a2a_client() as client:
        sdk = env.sdk_client(client)
        kinds, _task = await text_of(sdk, send_request("alpha beta gamma"))
        sequence = (await client.session_for(env.did, env.url)).last_sequence
    assert kinds == [
        "task",
        "status_update",
        "artifact_update",
        "artifact_update",
        "artifact_update",
        "status_update",
    ]
    assert sequence == 1  # one signed request; six signed events


async def test_cancel_task_gets_a_signed_task_not_cancelable_error() -> None:
    async with running() as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        _kinds, task = await text_of(sdk, send_request("done already"))
        with pytest.raises(TaskNotCancelableError) as info:
            await sdk.cancel_task(CancelTaskRequest(id=task.id))
        # A streamed method failing before its first event: a signed JSON error, mapped alike.
        with pytest.raises(UnsupportedOperationError) as subscribed:
            async for _event in env.sdk_client(client).subscribe(SubscribeToTaskRequest(id=task.id)):
                pass
    cause = info.value.__cause__
    assert cause is not None and getattr(cause, "signed", False) is True
    assert getattr(cause, "code", None) == -32002
    assert getattr(subscribed.value.__cause__, "code", None) == -32004
    assert getattr(subscribed.value.__cause__, "signed", False) is True


async def test_cancel_and_subscribe_to_a_running_task() -> None:
    async with running(delay=0.15) as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        _kinds, task = await text_of(sdk, send_request("a b c d", return_immediately=True))
        assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
        streaming = env.sdk_client(client)
        seen = [
            e.WhichOneof("payload") async for e in streaming.subscribe(SubscribeToTaskRequest(id=task.id))
        ]
        assert seen[0] == "task" and "artifact_update" in seen and seen[-1] == "status_update"
        assert (await sdk.get_task(GetTaskRequest(id=task.id))).status.state == TaskState.TASK_STATE_COMPLETED
        _kinds, second = await text_of(sdk, send_request("w x y z", return_immediately=True))
        canceled = await sdk.cancel_task(CancelTaskRequest(id=second.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED


async def test_another_did_gets_task_not_found() -> None:
    async with running() as env, env.a2a_client("alice") as alice, env.a2a_client("bob") as bob:
        _kinds, task = await text_of(env.sdk_client(alice, streaming=False), send_request())
        bob_sdk = env.sdk_client(bob, streaming=False)
        with pytest.raises(TaskNotFoundError) as info:
            await bob_sdk.get_task(GetTaskRequest(id=task.id))
        assert getattr(info.value.__cause__, "signed", False) is True
        assert getattr(info.value.__cause__, "code", None) == -32001
        assert list((await bob_sdk.list_tasks(ListTasksRequest())).tasks) == []


async def test_push_notification_configs_create_get_list_delete_per_caller() -> None:
    # The four push-notification methods go through the DID session like the others, and
    # the SDK scopes them by the caller's DID: another caller cannot see or delete them.
    async with (
        running(push=True) as env,
        env.a2a_client("alice") as alice,
        env.a2a_client("bob") as bob,
    ):
        sdk = env.sdk_client(alice, streaming=False)
        _kinds, task = await text_of(sdk, send_request())
        config = TaskPushNotificationConfig(
            task_id=task.id, id="hook-1", url="https://hooks.example.com/a2a", token="t-1"
        )
        created = await sdk.create_task_push_notification_config(config)
        assert (created.task_id, created.id, created.url, created.token) == (
            task.id,
            "hook-1",
            "https://hooks.example.com/a2a",
            "t-1",
        )
        got = await sdk.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
        )
        assert got.url == "https://hooks.example.com/a2a"
        listed = await sdk.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        assert [c.id for c in listed.configs] == ["hook-1"]
        bob_sdk = env.sdk_client(bob, streaming=False)
        with pytest.raises(TaskNotFoundError) as info:
            await bob_sdk.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
        assert getattr(info.value.__cause__, "signed", False) is True
        with pytest.raises(TaskNotFoundError):
            await bob_sdk.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
            )
        await sdk.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
        )
        listed = await sdk.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        assert list(listed.configs) == []


async def test_push_url_policy_refuses_private_receivers_with_a_signed_error() -> None:
    async with running(push=True, push_url_validator=PushUrlPolicy()) as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        _kinds, task = await text_of(sdk, send_request())
        for url in ("https://127.0.0.1/hook", "https://169.254.169.254/latest", "http://93.184.216.34/x"):
            with pytest.raises(InvalidParamsError) as info:
                await sdk.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task.id, id="h", url=url)
                )
            assert getattr(info.value.__cause__, "signed", False) is True, url
        ok = await sdk.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task.id, id="h", url="https://93.184.216.34/hook")
        )
        assert ok.url == "https://93.184.216.34/hook"


async def test_push_notifications_on_an_agent_without_them_get_a_signed_error() -> None:
    async with running() as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        _kinds, task = await text_of(sdk, send_request())
        with pytest.raises(PushNotificationNotSupportedError) as info:
            await sdk.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, id="h", url="https://hooks.example.com/x")
            )
        assert getattr(info.value.__cause__, "signed", False) is True


async def test_extended_agent_card_comes_over_the_session() -> None:
    extended = template_card(extended=True)
    extended.name = "a2a-echo (for callers with a session)"
    extended.skills.append(AgentSkill(id="secret", name="Secret", description="Only here", tags=["x"]))
    async with running(extended_card=extended) as env, env.a2a_client() as client:
        assert env.bridge.agent_card.capabilities.extended_agent_card
        sdk = env.sdk_client(client, streaming=False)
        card = await sdk.get_extended_agent_card(GetExtendedAgentCardRequest())
        assert card.name == "a2a-echo (for callers with a session)"
        assert [s.id for s in card.skills] == ["echo", "secret"]
        # The public card, signed and served to anyone, does not have the extra skill.
        assert [s.id for s in env.bridge.agent_card.skills] == ["echo"]


async def test_a_blocked_a2a_method_gets_32042() -> None:
    policy = Policy.build(blocked=["CancelTask"])
    async with running(policy=policy) as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        with pytest.raises(SecureTransportError) as info:  # the client checks the agreed policy first
            await sdk.cancel_task(CancelTaskRequest(id="t-1"))
        assert info.value.code == -32042 and info.value.signed is False
        # A client that ignores the policy is refused by the server, signed.
        session = await client.session_for(env.did, env.url)
        session.policy = Policy()
        req = session.prepare_intent({"goal": "CancelTask", "domain": "a2a", "inputs": {"id": "t-1"}})
        body = encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": req.params, "id": 7})
        resp = await client.http.post(env.url + "/a2a/intent", content=body, headers=JSON)
        assert resp.status_code == 403
        error = session.error_from_reply(req, resp.json()["error"])
        assert error.code == -32042 and error.signed


async def test_a_byte_identical_retry_does_not_run_the_executor_again() -> None:
    async with running() as env, env.a2a_client() as client:
        session = await client.session_for(env.did, env.url)
        req = session.prepare_intent({"goal": "SendMessage", "domain": "a2a", "inputs": message_inputs()})
        body = encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": req.params, "id": "r"})
        first = await client.http.post(env.url + "/a2a/intent", content=body, headers=JSON)
        again = await client.http.post(env.url + "/a2a/intent", content=body, headers=JSON)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    verified = session.verify_result(req, again.json()["result"])
    assert verified.result["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert env.executor.calls == 1


async def test_service_parameters_a2a_version() -> None:
    async with running() as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        await sdk.list_tasks(
            ListTasksRequest(), context=ClientCallContext(service_parameters={"A2A-Version": "1.1"})
        )
        for version in ("2.0", "0.3", "not-a-version"):
            ctx = ClientCallContext(service_parameters={"A2A-Version": version})
            with pytest.raises(VersionNotSupportedError) as info:
                await sdk.list_tasks(ListTasksRequest(), context=ctx)
            assert getattr(info.value.__cause__, "code", None) == -32009
        for bad in ({"a2a-service-parameters": ["1.0"]}, {"a2a-service-parameters": {"A2A-Version": 1}}):
            with pytest.raises(Exception) as caught:
                await client.request(env.did, {"goal": "ListTasks", "domain": "a2a", "inputs": bad})
            assert getattr(caught.value, "code", None) == -32602 and getattr(caught.value, "signed", False)
        with pytest.raises(Exception) as caught:
            await client.request(env.did, {"goal": "ListTasks", "domain": "nlp", "inputs": {}})
        assert getattr(caught.value, "code", None) == -32602


async def test_a2a_streaming_methods_are_always_streamed() -> None:
    async with running() as env, env.a2a_client() as client:
        session = await client.session_for(env.did, env.url)
        intent = {"goal": "SendStreamingMessage", "domain": "a2a", "inputs": message_inputs("x y")}
        req = session.prepare_intent(intent)  # no stream member at all
        body = encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": req.params, "id": 1})
        resp = await client.http.post(env.url + "/a2a/intent", content=body, headers=JSON)
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.count("\ndata: ") == 6  # task, working, 2 artifacts, completed, final
        with pytest.raises(Exception) as caught:
            await client.request(env.did, {**intent, "constraints": {"stream": False}})
        assert getattr(caught.value, "code", None) == -32602 and getattr(caught.value, "signed", False)


async def test_a2a_agent_request_for_our_own_users() -> None:
    async with running() as env:
        registry = AgentRegistry([RegistryEntry("echo", env.did, env.url)])
        async with A2AAgent("alice", ident("alice"), registry=registry) as agent:
            inputs = {**message_inputs("hi there"), "a2a-service-parameters": {"A2A-Version": "1.0"}}
            result = await agent.request("echo", {"goal": "SendMessage", "domain": "a2a", "inputs": inputs})
            assert result["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            events = [
                e
                async for e in agent.stream(
                    "echo", {"goal": "SendStreamingMessage", "domain": "a2a", "inputs": inputs}
                )
            ]
            assert "task" in events[0] and "artifactUpdate" in events[2]


# -- pitfalls found with a2a-sdk 1.3.0 -----------------------------------------------------------------


async def test_pitfall_timeout_answers_the_in_progress_task() -> None:
    # The SDK swallows the cancellation of SendMessage and returns the task as it stands;
    # the bridge relies on neither and answers the running task before the core's timeout.
    async with running(delay=0.3) as env, env.a2a_client() as client:
        sdk = env.sdk_client(client, streaming=False)
        ctx = ClientCallContext(timeout=0.5)
        _kinds, task = await text_of_ctx(sdk, send_request("slow words here"), ctx)
        assert task.status.state == TaskState.TASK_STATE_WORKING
        for _ in range(50):
            got = await sdk.get_task(GetTaskRequest(id=task.id))
            if got.status.state == TaskState.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.1)
        assert got.status.state == TaskState.TASK_STATE_COMPLETED  # the agent ran on
        assert get_artifact_text(got.artifacts[0], " ") == "slow words here"


async def test_pitfall_the_sdk_swallows_the_cancellation_of_send_message() -> None:
    # Why the bridge never lets the core's timeout cancel the SDK: the cancelled call returns.
    handler = DefaultRequestHandler(
        agent_executor=CountingEcho(delay=0.2), task_store=InMemoryTaskStore(), agent_card=template_card()
    )
    try:
        from a2a.server.context import ServerCallContext

        from a2a_secure.a2a_binding import DIDUser

        call = asyncio.create_task(
            handler.on_message_send(send_request("a b c"), ServerCallContext(user=DIDUser("did:key:zx")))
        )
        await asyncio.sleep(0.1)
        call.cancel()
        task = await call  # no CancelledError: the task as it stands
        assert task.status.state == TaskState.TASK_STATE_WORKING
    finally:
        await handler.aclose()


async def test_pitfall_a_stream_timeout_is_a_signed_32049_not_a_quiet_end() -> None:
    # Cancelled between events, the SDK's stream would end as if complete; the bridge keeps
    # the SDK out of the core's reach, so a gap longer than the timeout is a signed -32049.
    async with running(delay=0.6) as env, env.a2a_client() as client:
        sdk = env.sdk_client(client)
        kinds: list[str] = []
        with pytest.raises(SecureTransportError) as info:
            async for event in sdk.send_message(
                send_request("slow words"), context=ClientCallContext(timeout=0.2)
            ):
                kinds.append(event.WhichOneof("payload"))
    assert info.value.code == -32049 and info.value.signed
    assert kinds == ["task", "status_update"]


async def text_of_ctx(
    client: BaseClient, request: SendMessageRequest, ctx: ClientCallContext
) -> tuple[list[str], Any]:
    kinds: list[str] = []
    task = None
    async for event in client.send_message(request, context=ctx):
        kinds.append(event.WhichOneof("payload"))
        task = event.task if event.HasField("task") else task
    return kinds, task


async def test_pitfall_the_sequence_belongs_to_the_session_not_the_transport() -> None:
    async with running() as env, env.a2a_client() as client:
        first, second = env.sdk_client(client, streaming=False), env.sdk_client(client)
        registry = AgentRegistry([RegistryEntry("echo", env.did, env.url)])
        agent = A2AAgent("alice", ident("alice"), registry=registry)
        agent.client = client  # our own users share the very same sessions

        async def own() -> Any:
            return await agent.request("echo", {"goal": "ListTasks", "domain": "a2a", "inputs": {}})

        calls = [text_of(first, send_request("a")), text_of(second, send_request("b")), own()]
        calls += [first.list_tasks(ListTasksRequest()), second.list_tasks(ListTasksRequest()), own()]
        await asyncio.gather(*calls)
        sequence = (await client.session_for(env.did, env.url)).last_sequence
    assert sequence == 6  # one session, one counter, no -32044
    assert env.executor.calls == 2


async def test_pitfall_sdk_json_rpc_errors_use_http_200_ours_use_real_statuses() -> None:
    sdk_handler = DefaultRequestHandler(
        agent_executor=CountingEcho(), task_store=InMemoryTaskStore(), agent_card=template_card()
    )
    rpc = {"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "missing"}, "id": 1}
    try:
        sdk_app = Starlette(routes=create_jsonrpc_routes(sdk_handler, "/"))
        async with serve_app(sdk_app) as sdk_url, httpx.AsyncClient() as http:
            plain = await http.post(sdk_url + "/", json=rpc, headers={"A2A-Version": "1.0"})
    finally:
        await sdk_handler.aclose()
    assert plain.status_code == 200 and plain.json()["error"]["code"] == -32001
    async with running() as env, env.a2a_client() as client:
        session = await client.session_for(env.did, env.url)
        for inputs, status, code in (
            ({"id": "missing"}, 404, -32001),
            ({"id": "missing", "a2a-service-parameters": {"A2A-Version": "2.0"}}, 400, -32009),
        ):
            req = session.prepare_intent({"goal": "GetTask", "domain": "a2a", "inputs": inputs})
            body = encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": req.params, "id": 2})
            resp = await client.http.post(env.url + "/a2a/intent", content=body, headers=JSON)
            assert resp.status_code == status
            error = session.error_from_reply(req, resp.json()["error"])
            assert error.code == code and error.signed
        # A signed A2A error is not mistaken for a transient failure: the SDK client gets it once.
        with pytest.raises(TaskNotFoundError):
            await env.sdk_client(client, streaming=False).get_task(GetTaskRequest(id="missing"))


# -- a man in the middle on the event stream --------------------------------------------------------


class StreamMitm:
    """A transparent HTTP proxy that rewrites event streams (and remembers an honest one)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.mode: str | None = None
        self.honest: list[bytes] = []

    def rewrite(self, events: list[bytes]) -> list[bytes]:
        if self.mode is None:
            self.honest = list(events)
        elif self.mode == "drop":
            del events[1]
        elif self.mode == "reorder":
            events[1], events[2] = events[2], events[1]
        elif self.mode == "duplicate":
            events.insert(2, events[1])
        elif self.mode == "truncate":
            events = events[:-1]
        elif self.mode == "splice":
            events[1] = self.honest[1]  # a genuine event, signed by the agent, of another request
        return events

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        assert scope["type"] == "http"
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with httpx.AsyncClient() as http:
            upstream = await http.request(
                scope["method"], self.upstream + scope["path"], content=body, headers=JSON
            )
        content = upstream.content
        ctype = upstream.headers.get("content-type", "application/json")
        status = upstream.status_code
        if self.mode == "forge_error" and scope["path"] == "/a2a/intent":
            # What anyone on the path can send: an A2A error without the agent's signature.
            rid = json.loads(body)["id"]
            error = {"code": -32001, "message": "Task not found"}
            content = json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode()
            ctype, status = "application/json", 404
        elif ctype.startswith("text/event-stream"):
            events = [e for e in content.split(b"\n\n") if e and not e.startswith(b":")]
            content = b"".join(e + b"\n\n" for e in self.rewrite(events))
        headers = [(b"content-type", ctype.encode())]
        if "retry-after" in upstream.headers:
            headers.append((b"retry-after", upstream.headers["retry-after"].encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


async def test_a_man_in_the_middle_on_a_stream_makes_the_client_raise_every_time() -> None:
    async with running() as env:
        mitm = StreamMitm(env.url)
        async with serve_app(mitm) as proxy, env.a2a_client(retry=FAST_RETRY) as client:
            card = env.bridge.agent_card
            transport = SecureA2ATransport(client, card, proxy, expected_did=env.did)
            sdk = BaseClient(card, secure_client_config(), transport, [])
            kinds, _ = await text_of(sdk, send_request("one two three"))  # honest, through the proxy
            assert len(kinds) == 6 and len(mitm.honest) == 7
            for mode in ("drop", "reorder", "duplicate", "truncate", "splice"):
                mitm.mode = mode
                for _ in range(2):
                    with pytest.raises(SecureTransportError) as info:
                        await text_of(sdk, send_request("one two three"))
                    assert info.value.code == -32040 and not info.value.signed, mode
            mitm.mode = None
            kinds, _ = await text_of(sdk, send_request("still fine"))
            assert kinds[-1] == "status_update"


async def test_an_unsigned_a2a_error_never_becomes_an_a2a_domain_error() -> None:
    async with running() as env:
        mitm = StreamMitm(env.url)
        async with serve_app(mitm) as proxy, env.a2a_client(retry=FAST_RETRY) as client:
            card = env.bridge.agent_card
            transport = SecureA2ATransport(client, card, proxy, expected_did=env.did)
            sdk = BaseClient(card, secure_client_config(streaming=False), transport, [])
            _kinds, task = await text_of(sdk, send_request("mine"))
            mitm.mode = "forge_error"
            with pytest.raises(SecureTransportError) as info:
                await sdk.get_task(GetTaskRequest(id=task.id))
            assert not isinstance(info.value, TaskNotFoundError)
            assert info.value.code == -32001 and info.value.signed is False
            with pytest.raises(SecureTransportError):  # streamed methods alike
                await text_of(BaseClient(card, secure_client_config(), transport, []), send_request())


# -- the example -------------------------------------------------------------------------------------


async def test_the_example_agent_and_client(capsys: pytest.CaptureFixture[str]) -> None:
    agent_mod, client_mod = load_example("a2a_echo_agent"), load_example("a2a_client")
    server, handler, executor = agent_mod.build_server(ident("example-echo"))
    try:
        async with serve_app(server.app()) as url:
            server.url = url
            lines = await client_mod.run(
                url, server.identity.did, "hello secure world", ident("example-client")
            )
            with pytest.raises(SignatureVerificationError):  # the agent is not the one expected
                await client_mod.run(url, ident("mallory").did, "hi", ident("example-client"))
    finally:
        await handler.aclose()
    assert lines[0].startswith("task")
    assert lines[-1] == "get_task  TASK_STATE_COMPLETED 'hello secure world'"
    assert sum(line.startswith("artifact") for line in lines) == 3
    assert executor.calls == 1
    assert "get_task" in capsys.readouterr().out
