"""``A2AAgent`` and ``AgentRegistry`` over real HTTP, and the example agents talking.

Every agent here hosts its intents with a real uvicorn server (``serve_app``) and calls its
peers with the real httpx client; registries are JSON files written to ``tmp_path``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from a2a_secure.agent import (
    A2AAgent,
    AgentNotFound,
    AgentRegistry,
    AmbiguousTarget,
    RegistryEntry,
    RegistryError,
)
from a2a_secure.errors import A2AError, InvalidParams, PolicyViolation, SessionClosed, SessionUnknown
from a2a_secure.examples import summarizer, translator
from a2a_secure.identity.addresses import AddressPolicy
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import IntentResult
from a2a_secure.protocol.server import IntentContext
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app
from tests.http_helpers import AuditLog, identity

# The servers here run on 127.0.0.1: endpoints read from a document need the explicit opt-in.
LOOPBACK = AddressPolicy.build(dev_allow_loopback=True)

TRANSLATE = {"goal": "translate", "inputs": {"text": "Hello world", "target_language": "es"}}
TEXT = "Agents talk safely. The report is ready and it is long enough to matter. Short one."


def store_of(agent: A2AAgent) -> MemoryStore:
    store = agent.server.store
    assert isinstance(store, MemoryStore)
    return store


@asynccontextmanager
async def hosting(*agents: A2AAgent) -> AsyncIterator[list[str]]:
    """Serve every agent on its own port; close their clients at the end."""
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_app(agent.app)) for agent in agents]
        for agent in agents:  # closed first (LIFO), while every peer still listens
            stack.push_async_callback(agent.aclose)
        yield urls


def write_registry(path: Path, agents: dict[str, tuple[A2AAgent, str | None, list[str]]]) -> Path:
    data = {
        "agents": {
            name: {"did": agent.did, "endpoint": url, "capabilities": caps}
            for name, (agent, url, caps) in agents.items()
        }
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# -- handshake / send_intent / close_session -----------------------------------------------------


async def test_handshake_send_intent_close_session() -> None:
    host = translator.build_agent(identity("translator"))
    caller = A2AAgent("caller", identity("caller"))
    async with hosting(host) as [url]:
        session_id = await caller.handshake(host.did, url)
        assert isinstance(session_id, str) and len(session_id) == 43
        first = await caller.send_intent(session_id, TRANSLATE)
        assert isinstance(first, IntentResult)
        assert first.status == "success" and first.sequence == 1
        assert first.result == {"translated_text": "Hola mundo", "target_language": "es"}
        assert (first["status"], first["sequence"], first["result"]) == ("success", 1, first.result)
        french = {"goal": "translate", "inputs": {"text": "good morning", "target_language": "fr"}}
        second = await caller.send_intent(session_id, french)
        assert second.sequence == 2 and second.result["translated_text"] == "Bon matin"
        assert store_of(host).counts()["sessions"] == 1
        await caller.close_session(session_id)
        assert store_of(host).counts()["sessions"] == 0
        with pytest.raises(SessionClosed, match="this agent closed that session") as closed:
            await caller.send_intent(session_id, TRANSLATE)
        assert isinstance(closed.value, SessionUnknown) and not closed.value.signed
        with pytest.raises(InvalidParams, match="unknown session id"):
            await caller.send_intent("never-opened", TRANSLATE)
        await caller.close_session(session_id)  # closing twice is a no-op
        await caller.aclose()


async def test_handler_errors_reach_the_caller_signed() -> None:
    host = translator.build_agent(identity("translator"))
    async with hosting(host) as [url], A2AAgent("caller", identity("caller")) as caller:
        session_id = await caller.handshake(host.did, url)
        bad = {"goal": "translate", "inputs": {"text": "hello", "target_language": "de"}}
        with pytest.raises(InvalidParams) as exc:
            await caller.send_intent(session_id, bad)
        assert exc.value.signed and "unsupported target_language" in exc.value.message
        # The failed intent consumed its sequence; the session goes on.
        assert (await caller.send_intent(session_id, TRANSLATE)).sequence == 2


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ({"text": "x" * 5_000_000}, "bytes of JSON, more than the 393216"),
        (_nested(10_000), "nested deeper than 29 levels"),
        ({"n": 2**60}, "integer out of the I-JSON range"),
    ],
    ids=["5MB", "10000-deep", "unsafe-int"],
)
async def test_inputs_no_server_takes_are_refused_before_anything_is_signed_or_sent(
    inputs: Any, words: str
) -> None:
    host = translator.build_agent(identity("translator"))
    async with hosting(host) as [url], A2AAgent("caller", identity("caller")) as caller:
        session_id = await caller.handshake(host.did, url)
        with pytest.raises(InvalidParams, match=words) as exc:
            await caller.send_intent(session_id, {"goal": "translate", "inputs": inputs})
        assert not exc.value.signed  # refused here: nothing reached the server
        # No sequence was used: the next intent is the session's first.
        assert (await caller.send_intent(session_id, TRANSLATE)).sequence == 1


async def test_async_context_manager_closes_sessions_and_client() -> None:
    host = translator.build_agent(identity("translator"))
    async with hosting(host) as [url]:
        async with A2AAgent("caller", identity("caller")) as caller:
            await caller.handshake(host.did, url)
            assert store_of(host).counts()["sessions"] == 1
        assert caller.client.http.is_closed
        assert store_of(host).counts()["sessions"] == 0  # closed with an authenticated close
        assert repr(caller).startswith("A2AAgent(agent_id='caller', did='did:key:z6Mk")


async def test_hosted_handler_sees_the_authenticated_caller_and_sessions_are_reused() -> None:
    audit = AuditLog()
    host = A2AAgent("host", identity("host"), audit=audit, description="context echo")

    @host.intent("whoami")
    async def whoami(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        return {"caller": ctx.caller_did, "agent_id": ctx.client_agent_id, "sequence": ctx.sequence}

    caller = A2AAgent("caller", identity("caller"))
    async with hosting(host, caller) as [url, _]:
        caller.registry.add(RegistryEntry("host", host.did, url, ("whoami",)))
        results = [await caller.request("host", {"goal": "whoami", "inputs": {}}) for _ in range(4)]
        assert [r["sequence"] for r in results] == [1, 2, 3, 4]
        assert {r["caller"] for r in results} == {caller.did}
        assert {r["agent_id"] for r in results} == {"caller"}
        assert audit.tally("hello") == 1  # one handshake for four requests
        assert audit.tally("intent") == 4
        assert host.server.card["description"] == "context echo"
        assert host.server.card["intents"] == ["whoami"]


async def test_hosting_agent_policy_is_enforced() -> None:
    host = translator.build_agent(identity("translator"))
    host.server.policy = Policy.build(allowed=["translate"], blocked=["summarize"])
    async with hosting(host) as [url], A2AAgent("caller", identity("caller")) as caller:
        session_id = await caller.handshake(host.did, url)
        with pytest.raises(PolicyViolation):
            await caller.send_intent(session_id, {"goal": "summarize", "inputs": {"text": "x"}})
        assert (await caller.send_intent(session_id, TRANSLATE)).sequence == 1


# -- registry ------------------------------------------------------------------------------------


async def test_request_by_registry_name_capability_and_did(tmp_path: Path) -> None:
    tr = translator.build_agent(identity("translator"))
    su = summarizer.build_agent(identity("summarizer"))
    async with hosting(tr, su) as [tr_url, su_url]:
        path = write_registry(
            tmp_path / "agent_registry.json",
            {"translator": (tr, tr_url, ["translate"]), "summarizer": (su, su_url, ["summarize"])},
        )
        async with A2AAgent(
            "orchestrator", identity("orchestrator"), registry=path, addresses=LOOPBACK
        ) as orchestrator:
            by_name = await orchestrator.request("translator", TRANSLATE)
            assert by_name == {"translated_text": "Hola mundo", "target_language": "es"}
            by_capability = await orchestrator.request(
                "summarize", {"goal": "summarize", "inputs": {"text": TEXT, "max_sentences": 1}}
            )
            assert by_capability == {
                "summary": "Agents talk safely.",
                "sentences": 1,
                "original_sentences": 3,
            }
            by_did = await orchestrator.request(tr.did, TRANSLATE)
            assert by_did == by_name
            session_id = await orchestrator.handshake("summarizer")  # endpoint from the registry
            done = await orchestrator.send_intent(
                session_id, {"goal": "summarize", "inputs": {"text": "One."}}
            )
            assert done.result["summary"] == "One."
            assert [e.name for e in orchestrator.registry.entries()] == ["summarizer", "translator"]


async def test_registry_lookup_errors(tmp_path: Path) -> None:
    a = A2AAgent("a", identity("a"))
    b = A2AAgent("b", identity("b"))
    path = write_registry(
        tmp_path / "registry.json",
        {
            "first": (a, "http://127.0.0.1:1", ["translate"]),
            "second": (b, "http://127.0.0.1:2", ["translate"]),
        },
    )
    async with A2AAgent("caller", identity("caller"), registry=str(path), addresses=LOOPBACK) as caller:
        with pytest.raises(
            AgentNotFound, match=r"^No agent found matching 'x' \(known agents: first, second\)$"
        ) as missing:
            await caller.request("x", TRANSLATE)
        assert isinstance(missing.value, A2AError) and missing.value.code == -32602
        with pytest.raises(
            AmbiguousTarget, match=r"^Ambiguous target 'translate' \(matches first, second\): "
        ):
            await caller.request("translate", TRANSLATE)
        with pytest.raises(RegistryError, match="No agent found matching 'nobody'"):
            await caller.handshake("nobody")
    await a.aclose()
    await b.aclose()


def test_registry_file_forms_and_errors(tmp_path: Path) -> None:
    did = identity("x").did
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps({"agents": [{"name": "x", "did": did, "capabilities": ["echo"]}]}))
    registry = AgentRegistry.load(as_list)
    assert registry.find("x") == RegistryEntry("x", did, None, ("echo",))
    assert registry.find(did).name == "x"
    assert registry.find("echo").name == "x"
    bad_files = {
        "missing.json": None,
        "not-json.json": "{",
        "no-agents.json": json.dumps({"peers": {}}),
        "no-did.json": json.dumps({"agents": {"x": {"endpoint": "http://127.0.0.1"}}}),
        "bad-endpoint.json": json.dumps({"agents": {"x": {"did": did, "endpoint": 5}}}),
        "bad-caps.json": json.dumps({"agents": {"x": {"did": did, "capabilities": "echo"}}}),
    }
    for name, text in bad_files.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(RegistryError):
            AgentRegistry.load(path)
    with pytest.raises(InvalidParams):
        AgentRegistry([RegistryEntry("y", "not-a-did")])


# -- the example agents talking to each other ---------------------------------------------------


async def test_example_agents_talk_to_each_other(tmp_path: Path) -> None:
    tr = translator.build_agent(identity("translator"))
    su = summarizer.build_agent(identity("summarizer"))
    async with hosting(tr, su) as [tr_url, su_url]:
        tr.registry.add(RegistryEntry("summarizer", su.did, su_url, ("summarize",)))
        su.registry.add(RegistryEntry("translator", tr.did, tr_url, ("translate",)))
        # The summarizer calls the translator, which hosts.
        summary = summarizer.summarize({"text": TEXT, "max_sentences": 1})["summary"]
        translated = await su.request(
            "translator", {"goal": "translate", "inputs": {"text": summary, "target_language": "es"}}
        )
        assert translated["translated_text"] == "Agentes hablan seguro"
        # ... and the translator calls the summarizer, which hosts too.
        back = await tr.request("summarize", {"goal": "summarize", "inputs": {"text": TEXT}})
        assert back["sentences"] == 2 and back["summary"].startswith("Agents talk safely.")
        assert store_of(tr).counts()["sessions"] == 1
        assert store_of(su).counts()["sessions"] == 1
    # Leaving ``hosting`` closed both clients, and with them both sessions.
    assert store_of(tr).counts()["sessions"] == 0
    assert store_of(su).counts()["sessions"] == 0


async def test_did_web_peer_endpoint_comes_from_its_did_document() -> None:
    # The caller knows only the peer's did:web DID: the endpoint is the A2ASecureAgent service
    # of the DID document the peer publishes. The document is the one the server serves at
    # /.well-known/did.json, handed to the caller's resolver through its method registry
    # (the resolver's own HTTPS fetch is covered in test_didweb.py).
    from a2a_secure.identity import encoding
    from a2a_secure.identity.didweb import parse_did_document
    from a2a_secure.identity.resolver import DIDResolver, ResolvedDID

    did = "did:web:translator.example"
    server_identity = identity("web-translator").with_did_web(did, f"{did}#key-1")
    host = A2AAgent("translator", server_identity)
    host.intent("translate")(translator.translate)
    async with serve_app(host.app) as url:
        host.server.url = url  # published as the service endpoint
        async with httpx.AsyncClient() as raw:
            document = encoding.loads((await raw.get(url + "/.well-known/did.json")).content)
        assert document["service"] == [{"id": f"{did}#a2a", "type": "A2ASecureAgent", "serviceEndpoint": url}]
        fetches: list[str] = []

        async def publish(requested: str) -> ResolvedDID:
            fetches.append(requested)
            return parse_did_document(requested, document)

        resolver = DIDResolver()
        resolver.register("web", publish)
        async with A2AAgent(
            "caller", identity("web-caller"), resolver=resolver, addresses=LOOPBACK
        ) as caller:
            result = await caller.request(
                did, {"goal": "translate", "inputs": {"text": "hello", "target_language": "es"}}
            )
            assert result == {"translated_text": "Hola", "target_language": "es"}
        assert fetches == [did]  # resolved once, then cached, for the endpoint and the key
