"""The A2A binding (PROTOCOL.md §10) with the declared extensions (§12): sealed, intent_id,
delegation, and what push notifications may carry. Real uvicorn servers, real clients.

The bridge's card declares the extensions of the ``AgentServer`` it is mounted on, inside the
signed A2A card and under the handshake's ``manifest_hash``; the secure transport hands the
verified card's list to its ``A2AClient``. A recording relay between client and server shows
what crosses the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

os.environ["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = "false"
pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a.client import BaseClient, ClientCallContext
from a2a.helpers import get_artifact_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types import (
    GetTaskRequest,
    ListTasksRequest,
    PushNotificationNotSupportedError,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from http_helpers import read_body
from nginx_helpers import Tap
from test_a2a_binding import SERVER, CountingEcho, Env, ident, send_request, template_card, text_of

from a2a_secure.a2a_binding import (
    EXTENSION_URI,
    A2ABridge,
    CardVerificationError,
    PushUrlPolicy,
    SecureA2ATransport,
    SecureTransportError,
    build_agent_card,
    card_json,
    card_verifier,
    create_secure_client,
    extension_params,
    fetch_agent_card,
    secure_client_config,
    sign_agent_card,
)
from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import Unavailable
from a2a_secure.policy import Policy
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app

SEALED = ServerLimits(sealed_intents=True)
PLAIN = ServerLimits(sealed_intents=False)  # a server that turned sealing off
CARD_PATH = "/.well-known/agent-card.json"
FAST_RETRY = RetryPolicy(attempts=2, base=0.01, cap=0.02)
# What the caller asks and what the agent answers: distinct words, so each is looked for.
ASKED = "merger closes friday"
ANSWERED = "MERGER CLOSES FRIDAY"
PERSON = ident("a2a-person")


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


class Shout(CountingEcho):
    """Answers the message's words in capitals, one artifact chunk per word; records the
    principal of each call (PROTOCOL.md §12.7) from the bridge's ``ServerCallContext``."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.principals: list[str | None] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.calls += 1
        self.principals.append(context.call_context.state["a2a_secure"]["principal"])
        assert context.message is not None
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        words = context.get_user_input().split() or [""]
        for i, word in enumerate(words):
            if self.delay:
                await asyncio.sleep(self.delay)
            await updater.add_artifact(
                [new_text_part(word.upper())],
                artifact_id="shout",
                name="shout",
                append=i > 0,
                last_chunk=i == len(words) - 1,
            )
        await updater.complete()


class Front:
    """An HTTP proxy in front of the agent: records every request, and may alter the card or
    replace an intent's answer (after the agent ran it) with an unsigned -32043."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, bytes]] = []  # (path, body)
        self.card: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None  # None: 404
        self.forge_unknown = 0

    def methods(self) -> list[str]:
        """The JSON-RPC methods posted, in order."""
        return [json.loads(body)["method"] for path, body in self.requests if path.startswith("/a2a/")]

    def intents(self) -> list[dict[str, Any]]:
        """The ``intent`` objects posted, in order (closes left out)."""
        bodies = [json.loads(body) for path, body in self.requests if path == "/a2a/intent"]
        return [b["params"]["intent"] for b in bodies if b["method"] == "intent"]

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path = scope["path"]
        self.requests.append((path, body))
        headers = {"Content-Type": "application/json"} if body else {}
        async with httpx.AsyncClient() as http:
            upstream = await http.request(
                scope["method"], self.upstream + path, content=body, headers=headers
            )
        content, status = upstream.content, upstream.status_code
        ctype = upstream.headers.get("content-type", "application/json")
        if path == CARD_PATH and self.card is not None:
            altered = self.card(json.loads(content))
            content = b"{}" if altered is None else json.dumps(altered).encode()
            status = 404 if altered is None else status
        elif path == "/a2a/intent" and self.forge_unknown and json.loads(body)["method"] == "intent":
            # What anyone on the path can send once the agent has answered (PROTOCOL.md §12.5).
            self.forge_unknown -= 1
            error = {"code": -32043, "message": "unknown, expired or closed session"}
            content = json.dumps({"jsonrpc": "2.0", "id": json.loads(body)["id"], "error": error}).encode()
            ctype, status = "application/json", 401
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype.encode())]}
        )
        await send({"type": "http.response.body", "body": content})


def declaring(names: Callable[[list[str]], list[str]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A card rewrite that changes the declared extensions consistently: at the top level and
    in the did-session params (so the card looks whole; only its signature and hash tell)."""

    def rewrite(card: dict[str, Any]) -> dict[str, Any]:
        card = copy.deepcopy(card)
        card["a2a_secure_extensions"] = names(card.get("a2a_secure_extensions", []))
        for ext in card["capabilities"]["extensions"]:
            if ext["uri"] == EXTENSION_URI:
                ext["params"]["a2a_secure_extensions"] = card["a2a_secure_extensions"]
        return card

    return rewrite


@dataclass
class Site(Env):
    tap: Tap | None = None
    front: Front | None = None
    webhook: list[dict[str, Any]] = field(default_factory=list)  # what push notifications carried
    hook_url: str = ""


@contextlib.asynccontextmanager
async def bridged(
    *,
    limits: ServerLimits = SEALED,
    via: str = "",
    delay: float = 0.0,
    delegation: DelegationRules | None = None,
    push: bool = False,
    push_when_sealed: bool = False,
    card_push: bool | None = None,
) -> AsyncIterator[Site]:
    """A sealing (by default) AgentServer with the A2A bridge on uvicorn, reached directly, or
    ``via`` a recording TCP relay ("tap") or an HTTP proxy ("front"). With ``push``, the
    agent sends push notifications (the SDK's sender) to a webhook on loopback; ``card_push``
    sets the card's ``capabilities.push_notifications`` apart (default: ``push``)."""
    executor = Shout(delay)
    card = template_card(push=push if card_push is None else card_push)
    received: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        sender = configs = None
        hook_url = ""
        validator = PushUrlPolicy(allow_hosts=["127.0.0.1"], allow_http=True)
        if push:

            async def hook(
                scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
            ) -> None:
                if scope["type"] != "http":
                    return
                received.append(json.loads(await read_body(receive)))
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})

            hook_url = await stack.enter_async_context(serve_app(hook))
            configs = InMemoryPushNotificationConfigStore()
            http = await stack.enter_async_context(validator.client())
            sender = BasePushNotificationSender(http, configs, push_url_validator=validator)
        handler = DefaultRequestHandler(
            agent_executor=executor,
            task_store=InMemoryTaskStore(),
            agent_card=card,
            push_config_store=configs,
            push_sender=sender,
            push_url_validator=validator if push else None,
        )
        stack.push_async_callback(handler.aclose)
        server = AgentServer(SERVER, Policy(), name="a2a-echo", limits=limits, delegation=delegation)
        bridge = A2ABridge(handler, agent_card=card, push_when_sealed=push_when_sealed)
        bridge.mount(server)
        url = await stack.enter_async_context(serve_app(server.app()))
        tap = front = None
        if via == "tap":
            tap = await stack.enter_async_context(Tap(("127.0.0.1", int(url.rsplit(":", 1)[1]))))
            url = f"http://127.0.0.1:{tap.port}"
        elif via == "front":
            front = Front(url)
            url = await stack.enter_async_context(serve_app(front))
        server.url = url  # the card's interface URL: the SDK's calls go through the relay
        yield Site(
            url, server, bridge, handler, executor, tap, front, received, hook_url + "/hook" if push else ""
        )


def hooked(site: Site, task_id: str = "") -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(task_id=task_id, id="hook-1", url=site.hook_url, token="t-1")


async def wait_for(condition: Callable[[], bool], seconds: float = 3.0) -> bool:
    """Whether ``condition`` holds within ``seconds`` (push notifications arrive after the answer)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # noqa: ASYNC110 - the webhook appends as it receives
        await asyncio.sleep(0.02)
    return condition()


async def every_method(site: Site, client: A2AClient) -> None:
    """SendMessage, SendStreamingMessage, SubscribeToTask, GetTask and ListTasks, each checked."""
    unary, streaming = site.sdk_client(client, streaming=False), site.sdk_client(client)
    kinds, task = await text_of(unary, send_request(ASKED))
    assert kinds == ["task"] and task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(task.artifacts[0], " ") == ANSWERED
    kinds, streamed = await text_of(streaming, send_request(ASKED))
    assert kinds == ["task", "status_update", *["artifact_update"] * 3, "status_update"]
    _kinds, running = await text_of(unary, send_request(ASKED, return_immediately=True))
    seen = [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=running.id))]
    assert seen[0].WhichOneof("payload") == "task" and seen[-1].status_update.status.state == (
        TaskState.TASK_STATE_COMPLETED
    )
    chunks = [p.text for e in seen if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts]
    assert " ".join(chunks).endswith("FRIDAY")
    got = await unary.get_task(GetTaskRequest(id=running.id))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(got.artifacts[0], " ") == ANSWERED
    assert got.history[0].parts[0].text == ASKED
    listed = await unary.list_tasks(ListTasksRequest())
    assert {t.id for t in listed.tasks} == {task.id, running.id, streamed.id}


# -- (a) every A2A method, sealed end to end --------------------------------------------------------


async def test_a_sealed_server_behind_the_bridge_declares_sealed_and_serves_every_method_sealed() -> None:
    async with bridged(delay=0.05) as site:
        assert site.server.card["a2a_secure_extensions"] == ["intent_id", "priority", "sealed"]
        assert extension_params(site.bridge.agent_card)["a2a_secure_extensions"] == [
            "intent_id",
            "priority",
            "sealed",
        ]
        async with site.a2a_client(sealed=True) as client:
            await every_method(site, client)
            session = await client.session_for(site.did, site.url)
            assert session.sealed is True and session.sealer is not None
        async with site.a2a_client("bob") as client:  # the default seals too
            kinds, _task = await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert kinds == ["task"] and (await client.session_for(site.did, site.url)).sealed is True
    assert site.executor.calls == 4


# -- (b) what crosses the wire ---------------------------------------------------------------------------


async def test_sealed_a2a_inputs_and_results_never_cross_the_wire_and_unsealed_ones_do() -> None:
    async with bridged(via="tap", delay=0.05) as site:
        assert site.tap is not None
        async with site.a2a_client(sealed=True) as client:
            await every_method(site, client)
        sealed_wire = site.tap
        assert b"POST /a2a/intent" in sealed_wire.to_server and b"text/event-stream" in sealed_wire.to_proxy
        assert b'"sealed":' in sealed_wire.to_server  # the intents went sealed …
        for word in (*ASKED.split(), *ANSWERED.split()):  # … and no input or answer in the clear
            assert not sealed_wire.holds(word), word
    async with bridged(via="tap", delay=0.05) as site:
        assert site.tap is not None
        async with site.a2a_client(sealed=False) as client:
            await every_method(site, client)
            assert (await client.session_for(site.did, site.url)).sealed is False
        # The same exchange unsealed: the relay reads both (so the check above can fail).
        assert site.tap.holds(ASKED) and site.tap.holds("MERGER") and site.tap.holds("FRIDAY")


# -- (c) a bridge that does not seal -------------------------------------------------------------------


async def test_sealed_true_refuses_a_bridge_whose_server_does_not_seal_before_any_intent() -> None:
    async with bridged(limits=PLAIN, via="front") as site:
        assert site.front is not None
        # The card declares what this server serves, and sealing is not part of it.
        assert site.server.card["a2a_secure_extensions"] == ["intent_id", "priority"]
        async with site.a2a_client(sealed=True) as client:
            with pytest.raises(SecureTransportError, match="does not declare the sealed extension") as info:
                await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert info.value.code == -32602 and info.value.signed is False
        assert site.front.methods() == ["hello"]  # the handshake stopped before PROOF
        assert site.executor.calls == 0
        async with site.a2a_client() as client:  # the default goes on, unsealed, with an intent_id
            kinds, _task = await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert kinds == ["task"] and (await client.session_for(site.did, site.url)).sealed is False
        (intent,) = site.front.intents()
        assert "intent_id" in intent and intent["inputs"]["message"]["parts"][0]["text"] == ASKED
    assert site.executor.calls == 1


# -- (d) a declaration altered on the way ---------------------------------------------------------------


async def test_a_bridge_card_whose_declaration_was_altered_in_transit_is_not_trusted() -> None:
    async with bridged(via="front") as site, site.a2a_client(sealed=True) as client:
        assert site.front is not None
        # Honest: the card fetched through the proxy verifies and the session is sealed.
        sdk = await create_secure_client(
            client, site.url, site.did, config=secure_client_config(streaming=False)
        )
        kinds, _task = await text_of(sdk, send_request(ASKED))
        assert kinds == ["task"] and (await client.session_for(site.did)).sealed is True
    card_extensions.forget()
    async with bridged(via="front") as site:
        assert site.front is not None
        # "sealed" taken out on the way, at the top level and in the params alike.
        site.front.card = declaring(lambda names: [n for n in names if n != "sealed"])
        with pytest.raises(CardVerificationError):
            await fetch_agent_card(site.url, site.did)
        async with site.a2a_client(sealed=True) as client:
            intent = {"goal": "SendMessage", "domain": "a2a", "inputs": {}}
            with pytest.raises(Unavailable, match="could not be checked for the sealed extension"):
                await client.request(site.did, intent, endpoint=site.url)
        assert site.front.methods() == ["hello"] and site.executor.calls == 0
    card_extensions.forget()
    async with bridged(limits=PLAIN, via="front") as site:
        assert site.front is not None
        # "sealed" added on the way to a server that does not seal: trusting it, the client
        # would send a seal_key in its ACCEPT_POLICY. It does not trust it, and stops first.
        site.front.card = declaring(lambda names: sorted({*names, "sealed"}))
        async with site.a2a_client(sealed=True) as client:
            intent = {"goal": "SendMessage", "domain": "a2a", "inputs": {}}
            with pytest.raises(Unavailable, match="could not be checked for the sealed extension"):
                await client.request(site.did, intent, endpoint=site.url)
        assert site.front.methods() == ["hello"]
    async with bridged() as site, site.a2a_client(sealed=True) as client:
        # The A2A card handed to the transport, altered: its signature no longer verifies.
        altered = site.bridge.agent_card
        for ext in altered.capabilities.extensions:
            if ext.uri == EXTENSION_URI:
                ext.params["a2a_secure_extensions"] = ["intent_id", "priority"]
        with pytest.raises(CardVerificationError):
            card_verifier(site.did)(altered)
        transport = SecureA2ATransport(client, altered, site.url, expected_did=site.did)
        sdk = BaseClient(altered, secure_client_config(streaming=False), transport, [])
        with pytest.raises(SecureTransportError, match="agent card refused") as info:
            await text_of(sdk, send_request(ASKED))
        assert info.value.code == -32040 and client._peers == {}  # no handshake even began
    assert site.executor.calls == 0


async def test_a_transport_holding_the_verified_card_is_not_downgraded_by_a_card_blocked_on_the_way() -> None:
    # The transport reads the declaration from the A2A card it verified: an attacker who
    # blocks or strips the card on the way cannot talk its default client out of sealing.
    for rewrite in (lambda card: None, declaring(lambda names: ["intent_id", "priority"])):
        card_extensions.forget()
        async with bridged(via="front") as site, site.a2a_client() as client:
            assert site.front is not None
            site.front.card = rewrite
            kinds, _task = await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert kinds == ["task"] and (await client.session_for(site.did)).sealed is True
            assert [path for path, _ in site.front.requests if path == CARD_PATH] == []  # never fetched


def test_the_declared_extensions_are_signed_and_checked_like_the_other_params() -> None:
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
    plain = sign_agent_card(build_agent_card(template_card(), core), SERVER)
    card_verifier(SERVER.did)(plain)
    assert "a2a_secure_extensions" not in card_json(plain)  # a server that declares none
    listed = sign_agent_card(
        build_agent_card(template_card(), {**core, "a2a_secure_extensions": ["sealed"]}), SERVER
    )
    card_verifier(SERVER.did)(listed)
    assert card_json(listed)["a2a_secure_extensions"] == ["sealed"]
    for bad in (["sealed", "intent_id"], ["sealed", "sealed"], [], "sealed", [True]):
        card = sign_agent_card(
            build_agent_card(template_card(), {**core, "a2a_secure_extensions": bad}), SERVER
        )
        with pytest.raises(CardVerificationError):  # validly signed, but not a declaration of §12
            card_verifier(SERVER.did)(card)


def test_a_card_builder_may_declare_only_what_the_server_serves() -> None:
    plain = AgentServer(SERVER, Policy(), limits=ServerLimits(intent_id_retention=0, sealed_intents=False))
    assert plain.card["a2a_secure_extensions"] == ["priority"]
    for claimed in (["priority", "sealed"], ["sealed"], ["priority", "priority"], [], "priority", [1]):
        plain.set_card_builder(lambda card, claimed=claimed: {**card, "a2a_secure_extensions": claimed})
        with pytest.raises(ValueError, match="a2a_secure_extensions"):  # e.g. sealing it does not serve
            _ = plain.card
    server = AgentServer(SERVER, Policy(), limits=SEALED)
    server.set_card_builder(lambda card: {**card, "extra": "kept"})
    assert server.card["a2a_secure_extensions"] == ["intent_id", "priority", "sealed"]
    # Fewer names, or none (as a server of the base contract), is a promise it keeps.
    server.set_card_builder(lambda card: {**card, "a2a_secure_extensions": ["priority"]})
    assert server.card["a2a_secure_extensions"] == ["priority"]
    server.set_card_builder(lambda card: {k: v for k, v in card.items() if k != "a2a_secure_extensions"})
    assert "a2a_secure_extensions" not in server.card


# -- what the declaration turns on: intent_id, delegation ---------------------------------------------------


async def test_an_a2a_call_resent_after_a_forged_unknown_session_runs_once_sealed() -> None:
    async with bridged(via="front") as site, site.a2a_client(sealed=True, retry=FAST_RETRY) as client:
        assert site.front is not None
        unary, streaming = site.sdk_client(client, streaming=False), site.sdk_client(client)
        site.front.forge_unknown = 1  # the agent runs SendMessage; its answer is replaced
        kinds, task = await text_of(unary, send_request(ASKED))
        assert kinds == ["task"] and get_artifact_text(task.artifacts[0], " ") == ANSWERED
        assert site.executor.calls == 1  # the resend on a new session got the first run's answer
        assert site.front.methods().count("hello") == 2
        site.front.forge_unknown = 1  # the same for a stream: its kept events, sealed again
        kinds, streamed = await text_of(streaming, send_request(ASKED))
        assert kinds == ["task", "status_update", *["artifact_update"] * 3, "status_update"]
        assert site.executor.calls == 2 and site.front.methods().count("hello") == 3
        intents = site.front.intents()
        assert len(intents) == 4 and intents[0]["intent_id"] == intents[1]["intent_id"]
        assert intents[2]["intent_id"] == intents[3]["intent_id"] != intents[0]["intent_id"]
        assert all("sealed" in i and "sealed_key" in i for i in intents)
        assert (await client.session_for(site.did)).sealed is True
        got = await unary.get_task(GetTaskRequest(id=streamed.id))
        assert get_artifact_text(got.artifacts[0], " ") == ANSWERED


async def test_a2a_calls_act_on_behalf_of_a_principal_through_the_transport() -> None:
    alice = ident("alice")
    chain = PERSON.delegate(alice.did, ["SendMessage", "SendStreamingMessage", "GetTask"], ttl=600)
    rules = DelegationRules.build({"SendMessage": [PERSON.did]})
    async with bridged(delegation=rules) as site, site.a2a_client(sealed=True) as client:
        assert site.server.card["a2a_secure_extensions"] == ["delegation", "intent_id", "priority", "sealed"]
        sdk = await create_secure_client(
            client, site.url, site.did, config=secure_client_config(streaming=False), on_behalf_of=chain
        )
        kinds, task = await text_of(sdk, send_request(ASKED))
        assert kinds == ["task"] and get_artifact_text(task.artifacts[0], " ") == ANSWERED
        streamed = await create_secure_client(client, site.url, site.did, on_behalf_of=chain)
        kinds, _task = await text_of(streamed, send_request(ASKED))
        assert kinds[-1] == "status_update"
        # SendMessage is reserved to the person: the same call without the chain is refused.
        bare = await create_secure_client(
            client, site.url, site.did, config=secure_client_config(streaming=False)
        )
        with pytest.raises(SecureTransportError) as info:
            await text_of(bare, send_request(ASKED))
        assert info.value.code == -32042 and info.value.signed is True
    assert site.executor.principals == [PERSON.did, PERSON.did]
    async with bridged() as site, site.a2a_client() as client:  # a server without delegation
        sdk = await create_secure_client(
            client, site.url, site.did, config=secure_client_config(streaming=False), on_behalf_of=chain
        )
        with pytest.raises(SecureTransportError, match="does not declare the delegation extension") as info:
            await text_of(sdk, send_request(ASKED))
        assert info.value.code == -32602 and info.value.signed is False
        assert (await client.session_for(site.did)).last_sequence == 0  # nothing was sent
    assert site.executor.calls == 0


async def test_on_a_default_server_the_chain_of_an_a2a_call_crosses_the_relay_sealed() -> None:
    # Sealing is on by default (§12.6), and on a sealed session the chain travels sealed too.
    chain = PERSON.delegate(ident("alice").did, ["SendMessage"], ttl=600)
    async with bridged(limits=ServerLimits(), via="tap", delegation=DelegationRules()) as site:
        assert site.tap is not None
        async with site.a2a_client() as client:  # the defaults: seal with a server that declares it
            sdk = await create_secure_client(
                client, site.url, site.did, config=secure_client_config(streaming=False), on_behalf_of=chain
            )
            for _ in range(2):  # the chain in full, then its name
                _kinds, task = await text_of(sdk, send_request(ASKED))
                assert get_artifact_text(task.artifacts[0], " ") == ANSWERED
            assert (await client.session_for(site.did)).sealed is True
        tap = site.tap
        assert b'"sealed_delegation":' in tap.to_server and b'"delegation":' not in tap.to_server
        hidden = [*chain.tokens, chain.hash, PERSON.did, *(link.jti for link in chain.links), ASKED, ANSWERED]
        assert [x for x in hidden if tap.holds(x)] == []
    assert site.executor.principals == [PERSON.did, PERSON.did]


async def test_require_sealed_refuses_an_a2a_caller_without_seal_keys_signed() -> None:
    # The A2A binding opens its sessions through the same handshake: the same refusal.
    async with bridged(limits=ServerLimits(require_sealed=True)) as site:
        async with site.a2a_client(sealed=False) as client:
            with pytest.raises(SecureTransportError, match="sealed intents required") as info:
                await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert info.value.code == -32042 and info.value.signed is True
        async with site.a2a_client() as client:
            kinds, _task = await text_of(site.sdk_client(client, streaming=False), send_request(ASKED))
            assert kinds == ["task"] and (await client.session_for(site.did)).sealed is True
    assert site.executor.calls == 1


# -- push notifications leave the session ---------------------------------------------------------------


async def test_a_sealed_session_sets_up_no_push_notifications() -> None:
    async with (
        bridged(push=True, delay=0.1) as site,
        site.a2a_client("alice", sealed=True) as sealed,
        site.a2a_client("alice", sealed=False) as plain,
    ):
        sealed_sdk = site.sdk_client(sealed, streaming=False)
        plain_sdk = site.sdk_client(plain, streaming=False)
        _kinds, task = await text_of(sealed_sdk, send_request(ASKED))
        # A webhook for a sealed session's task: refused, signed.
        with pytest.raises(PushNotificationNotSupportedError) as info:
            await sealed_sdk.create_task_push_notification_config(hooked(site, task.id))
        cause = info.value.__cause__
        assert getattr(cause, "code", None) == -32003 and getattr(cause, "signed", False) is True
        assert "sealed session" in str(cause)
        # A message that carries a webhook: refused before the agent runs, unary or streamed.
        with_hook = send_request(ASKED, task_push_notification_config=hooked(site))
        for sdk in (sealed_sdk, site.sdk_client(sealed)):
            with pytest.raises(PushNotificationNotSupportedError):
                await text_of(sdk, with_hook)
        assert site.executor.calls == 1
        # A running task given a webhook on an unsealed session: a sealed message to it would
        # be run, and its answer pushed in the clear.
        _kinds, hooked_task = await text_of(plain_sdk, send_request("plain words", return_immediately=True))
        assert hooked_task.status.state != TaskState.TASK_STATE_COMPLETED
        await plain_sdk.create_task_push_notification_config(hooked(site, hooked_task.id))
        follow_up = send_request(ASKED)
        follow_up.message.task_id = hooked_task.id
        follow_up.message.context_id = hooked_task.context_id
        with pytest.raises(PushNotificationNotSupportedError):
            await text_of(sealed_sdk, follow_up)
        # Unsealed, a webhook works and gets the task in the clear: what sealing keeps away.
        await text_of(plain_sdk, send_request("other words", task_push_notification_config=hooked(site)))
        assert await wait_for(lambda: any("OTHER" in json.dumps(b) for b in site.webhook))
        assert await wait_for(lambda: any("PLAIN" in json.dumps(b) for b in site.webhook))
        assert (await sealed.session_for(site.did)).sealed and not (await plain.session_for(site.did)).sealed
    assert site.executor.calls == 3
    assert not any("MERGER" in json.dumps(b) or "merger" in json.dumps(b) for b in site.webhook)


async def test_a_sealed_message_is_refused_when_the_sdk_will_not_say_whether_its_task_has_a_webhook() -> None:
    # A card without capabilities.push_notifications: the SDK refuses to list a task's
    # configs, yet still stores a config sent with a message and still posts to it.
    async with (
        bridged(push=True, card_push=False, delay=0.1) as site,
        site.a2a_client("alice", sealed=True) as sealed,
        site.a2a_client("alice", sealed=False) as plain,
    ):
        plain_sdk = site.sdk_client(plain, streaming=False)
        asked = send_request(
            "plain words", return_immediately=True, task_push_notification_config=hooked(site)
        )
        _kinds, hooked_task = await text_of(plain_sdk, asked)
        assert await wait_for(lambda: any("PLAIN" in json.dumps(b) for b in site.webhook))
        follow_up = send_request(ASKED)
        follow_up.message.task_id = hooked_task.id
        follow_up.message.context_id = hooked_task.context_id
        for sdk in (site.sdk_client(sealed, streaming=False), site.sdk_client(sealed)):
            with pytest.raises(PushNotificationNotSupportedError) as info:
                await text_of(sdk, follow_up)
            assert getattr(info.value.__cause__, "signed", False) is True
        assert (await sealed.session_for(site.did)).sealed
    assert site.executor.calls == 1
    assert not any("MERGER" in json.dumps(b) or "merger" in json.dumps(b) for b in site.webhook)


async def test_a_sealed_follow_up_to_an_agent_that_never_pushes_still_runs() -> None:
    # No sender at all (a card without push, the SDK given no push machinery): nothing can
    # reach a webhook, so a sealed conversation goes on.
    async with bridged(delay=0.2) as site, site.a2a_client("alice", sealed=True) as sealed:
        sdk = site.sdk_client(sealed, streaming=False)
        _kinds, task = await text_of(sdk, send_request("plain words", return_immediately=True))
        follow_up = send_request(ASKED)
        follow_up.message.task_id = task.id
        follow_up.message.context_id = task.context_id
        await text_of(sdk, follow_up)
    assert site.executor.calls == 2 and not site.webhook


async def test_an_operator_may_allow_push_notifications_on_sealed_sessions() -> None:
    async with bridged(push=True, push_when_sealed=True) as site, site.a2a_client(sealed=True) as client:
        sdk = site.sdk_client(client, streaming=False)
        kinds, _task = await text_of(sdk, send_request(ASKED, task_push_notification_config=hooked(site)))
        assert kinds == ["task"] and (await client.session_for(site.did)).sealed
        # Allowed, the webhook gets the sealed session's task as the SDK sends it: in the clear.
        assert await wait_for(lambda: any("MERGER" in json.dumps(b) for b in site.webhook))


async def test_a_client_context_timeout_still_applies_sealed() -> None:
    # ClientCallContext travels as constraints (visible by design), the rest sealed.
    async with bridged(delay=0.3, via="front") as site, site.a2a_client(sealed=True) as client:
        assert site.front is not None
        sdk = site.sdk_client(client, streaming=False)
        task = None
        async for event in sdk.send_message(send_request(ASKED), context=ClientCallContext(timeout=0.5)):
            task = event.task
        assert task is not None and task.status.state == TaskState.TASK_STATE_WORKING
        (intent,) = site.front.intents()
        assert intent["inputs"] == {} and intent["constraints"] == {"timeout_ms": 500}


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_session_opened_while_the_card_was_blocked_is_not_used_after_a_sealed_card_is_verified(
    streaming: bool,
) -> None:
    # The default client (sealed=None) opens its session while the card is blocked on the
    # way: unsealed. The transport then verifies the A2A card, which declares "sealed": no
    # call may go out in the clear on that session; a sealed one replaces it.
    async with bridged(via="front") as site, site.a2a_client() as client:
        assert site.front is not None
        site.front.card = lambda card: None
        assert (await client.session_for(site.did, site.url)).sealed is False
        kinds, task = await text_of(site.sdk_client(client, streaming=streaming), send_request(ASKED))
        assert kinds[0] == "task" and kinds[-1] in ("task", "status_update")
        assert streaming or get_artifact_text(task.artifacts[0], " ") == ANSWERED
        assert (await client.session_for(site.did)).sealed is True
        posted = [body for path, body in site.front.requests if path == "/a2a/intent"]
        assert posted and not any(ASKED.encode() in body for body in posted)
        assert all("sealed" in intent for intent in site.front.intents())
