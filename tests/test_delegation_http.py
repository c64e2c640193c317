"""Delegation chains over real HTTP (PROTOCOL.md §12.7): a person, three agents, uvicorn.

The person (a did:key only) delegates to an assistant, which asks an orchestrator, which asks
a calendar that runs ``create_event`` only on the person's behalf. Each attack is sent by a
real client over a real session with the raw ``delegation`` member (the client API refuses
to send most of them), and each must come back as a signed -32042 with nothing run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from http_helpers import identity
from redis_helpers import redis_prefix, redis_url  # noqa: F401

from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.cli import main
from a2a_secure.cli_delegate import read_chain
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import TYP, Chain, DelegationRules, load_chain
from a2a_secure.errors import A2AError, InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import StoreRevocations
from a2a_secure.testing import serve_app

NO_RETRY = RetryPolicy(attempts=1)
PERSON = identity("deleg-person")
ASSISTANT = identity("deleg-assistant")
ORCH = identity("deleg-orchestrator")
CAL = identity("deleg-calendar")
MALLORY = identity("deleg-mallory")


@dataclass
class World:
    cal_url: str
    orch_url: str
    cal_store: MemoryStore
    calls: Counter[str] = field(default_factory=Counter)
    seen: list[dict[str, Any]] = field(default_factory=list)


def calendar(world_calls: Counter[str], seen: list[dict[str, Any]], store: MemoryStore) -> AgentServer:
    server = AgentServer(
        CAL, store=store, delegation=DelegationRules.build({"create_event": [PERSON.did]}), name="calendar"
    )

    @server.intent("create_event")
    async def create_event(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        world_calls["create_event"] += 1
        chain = ctx.delegation
        seen.append({"principal": ctx.principal, "caller": ctx.caller_did, "hops": chain.hops})
        return {"created": inputs.get("title"), "for": ctx.principal}

    async def watch(inputs: dict[str, Any], ctx: IntentContext) -> AsyncIterator[dict[str, Any]]:
        world_calls["watch"] += 1
        for i in range(2):
            yield {"i": i, "for": ctx.principal}

    server.add_stream("watch", watch)

    @server.intent("list_events")
    async def list_events(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        world_calls["list_events"] += 1
        return {"events": [], "for": ctx.principal}

    return server


def orchestrator(cal_url: str, calls: Counter[str], onward: A2AClient) -> AgentServer:
    server = AgentServer(ORCH, delegation=DelegationRules(), name="orchestrator")

    @server.intent("plan")
    async def plan(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        calls["plan"] += 1
        # The assistant hands over the chain extended to this agent; it must be for the same
        # principal as the one this intent runs under.
        mine = load_chain(encoding.dumps(inputs["chain"]))
        assert ctx.principal is not None and mine.principal == ctx.principal
        result = await onward.request(
            CAL.did, {"goal": "create_event", "inputs": {"title": inputs["title"]}},
            endpoint=cal_url, on_behalf_of=mine,
        )  # fmt: skip
        return {"calendar": result.result, "principal": ctx.principal}

    return server


@contextlib.asynccontextmanager
async def world() -> AsyncIterator[World]:
    calls: Counter[str] = Counter()
    seen: list[dict[str, Any]] = []
    store = MemoryStore()
    async with contextlib.AsyncExitStack() as stack:
        cal_url = await stack.enter_async_context(serve_app(calendar(calls, seen, store).app()))
        onward = await stack.enter_async_context(A2AClient(ORCH, retry=NO_RETRY))
        orch_url = await stack.enter_async_context(serve_app(orchestrator(cal_url, calls, onward).app()))
        yield World(cal_url, orch_url, store, calls, seen)


def person_chain(to: Identity = ASSISTANT, **kw: Any) -> Chain:
    opts: dict[str, Any] = {"goals": ["plan", "create_event"], "ttl": 3600, "targets": [ORCH.did, CAL.did]}
    opts.update(kw)
    return PERSON.delegate(to.did, **opts)  # type: ignore[no-any-return]


def to_orch(chain: Chain | None = None, **kw: Any) -> Chain:
    """The person's chain, delegated on by the assistant to the orchestrator."""
    kw.setdefault("goals", ["create_event"])
    return (chain or person_chain()).further(ASSISTANT, to=ORCH.did, now=time.time(), **kw)


async def raw(client: A2AClient, url: str, delegation: Any, goal: str = "create_event") -> Any:
    """Send ``delegation`` as it is, on the client's session with the calendar."""
    session = await client.session_for(CAL.did, url)
    intent: dict[str, Any] = {"goal": goal, "inputs": {"title": "x"}}
    if delegation is not None:
        intent["delegation"] = delegation
    return await client.send_intent(session, intent)


async def refused_signed(client: A2AClient, w: World, delegation: Any, match: str) -> None:
    before = sum(w.calls.values())
    with pytest.raises(PolicyViolation, match=match) as info:
        await raw(client, w.cal_url, delegation)
    assert info.value.signed is True and info.value.code == -32042
    assert sum(w.calls.values()) == before  # nothing ran


def link(signer: Identity, parent: Chain | None, **members: Any) -> str:
    now = int(time.time())
    payload: dict[str, Any] = {
        "iss": signer.did, "aud": ORCH.did, "sub": PERSON.did, "jti": encoding.b64u_encode(b"j" * 16),
        "nbf": now, "exp": now + 600, "goals": ["create_event"], "max_priority": 3,
    }  # fmt: skip
    if parent is not None:
        payload["parent"] = parent.hash
        if parent.leaf.targets is not None:
            payload["targets"] = list(parent.leaf.targets)
    typ = members.pop("typ", TYP)
    payload.update(members)
    return jws_sign(payload, signer, typ)


# -- the honest path -----------------------------------------------------------------------------
async def test_person_assistant_orchestrator_calendar_end_to_end() -> None:
    async with world() as w, A2AClient(ASSISTANT, retry=NO_RETRY) as assistant:
        chain = person_chain()
        onward = to_orch(chain)
        for title in ("standup", "retro"):
            result = await assistant.request(
                ORCH.did, {"goal": "plan", "inputs": {"title": title, "chain": onward.tokens}},
                endpoint=w.orch_url, on_behalf_of=chain,
            )  # fmt: skip
            assert result.result == {
                "calendar": {"created": title, "for": PERSON.did},
                "principal": PERSON.did,
            }
        assert w.calls == Counter(plan=2, create_event=2)
        hops = w.seen[0]["hops"]
        assert [(h["issuer"], h["audience"]) for h in hops] == [
            (PERSON.did, ASSISTANT.did),
            (ASSISTANT.did, ORCH.did),
        ]
        assert hops[1]["goals"] == ["create_event"] and w.seen[0]["caller"] == ORCH.did


async def test_later_intents_name_the_chain_by_hash_only_on_its_session() -> None:
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        chain = to_orch()
        assert (await raw(orch, w.cal_url, chain.tokens)).result["for"] == PERSON.did
        assert (await raw(orch, w.cal_url, chain.hash)).result["for"] == PERSON.did
        # On another session (or at a worker that has not seen it) the hash names nothing.
        await orch.close_session(CAL.did)
        await refused_signed(orch, w, chain.hash, "unknown on this session; send it in full")
        # The client API recovers: it sends the chain in full once more.
        peer = orch._peers[CAL.did]
        peer.chains_sent.add(chain.hash)
        result = await orch.request(CAL.did, {"goal": "create_event", "inputs": {}}, on_behalf_of=chain)
        assert result.result["for"] == PERSON.did and w.calls["create_event"] == 3


async def test_a_goal_that_needs_a_principal_is_refused_without_one() -> None:
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        await refused_signed(orch, w, None, "runs only on behalf of a principal")
        other = MALLORY.delegate(ASSISTANT.did, ["*"], ttl=600).further(
            ASSISTANT, to=ORCH.did, now=time.time()
        )
        await refused_signed(orch, w, other.tokens, "may not run on behalf of")
        # A goal without the requirement runs with or without a chain.
        assert (await raw(orch, w.cal_url, None, goal="list_events")).result == {"events": [], "for": None}


# -- the attacks ---------------------------------------------------------------------------------
async def test_each_attack_is_a_signed_refusal_and_nothing_runs() -> None:
    root = person_chain()
    expired = PERSON.delegate(ASSISTANT.did, ["create_event"], ttl=60, now=time.time() - 120)
    other_root = PERSON.delegate(ASSISTANT.did, ["create_event"], ttl=600)
    spliced = [*root.tokens, to_orch(other_root).tokens[1]]
    six = person_chain(goals=["*"])
    hops = [ASSISTANT, MALLORY, identity("d1"), identity("d2"), identity("d3"), identity("d4")]
    for signer, nxt in itertools.pairwise(hops):
        six = six.further(signer, to=nxt.did, now=time.time()) if len(six.links) < 5 else six
    depth_bomb = [*six.tokens, link(six.audience and identity("d4"), six, aud=ORCH.did)]
    header = encoding.b64u_encode(encoding.dumps({"alg": "EdDSA", "typ": TYP, "kid": PERSON.kid}))
    body = link(PERSON, None, iss=PERSON.did).split(".")[1]
    not_persons_key = f"{header}.{body}.{encoding.b64u_encode(MALLORY.sign(f'{header}.{body}'.encode()))}"
    web = Identity.from_seed(b"w" * 32, "web").with_did_web(
        "did:web:unresolvable.invalid", "did:web:unresolvable.invalid#k1"
    )
    cases: list[tuple[Any, str]] = [
        ([*root.tokens, link(ASSISTANT, root, goals=["create_event", "delete_all"])], "link 1: goals widen"),
        ([*root.tokens, link(ASSISTANT, root, exp=int(root.exp) + 60)], "link 1: the window is not inside"),
        (expired.further(ASSISTANT, to=ORCH.did, now=time.time() - 110).tokens, "link 0: expired at"),
        (spliced, "link 1: parent is not the hash"),
        (root.tokens, "delegated to another DID than this session's client"),  # the assistant's, replayed
        (to_orch(person_chain(targets=[ORCH.did])).tokens, "this agent is not among the link's targets"),
        ([*root.tokens, link(ASSISTANT, root, aud=PERSON.did)], "a DID appears twice"),
        (depth_bomb, "a chain has 1 to 5 links"),
        (["A" * 5000], "a link is at most 4096 characters"),
        ([*root.tokens, link(ASSISTANT, root, typ=m.Typ.REQUEST)], r"link 1: JWS typ must be a2a-deleg"),
        ([link(MALLORY, None, iss=PERSON.did, sub=PERSON.did)], "kid does not belong to the issuer's DID"),
        ([not_persons_key], "link 0: JWS signature does not verify"),
        ([link(web, None, iss=web.did, sub=web.did)], "issuer did:web:unresolvable.invalid cannot be"),
    ]  # fmt: skip
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        for delegation, match in cases:
            await refused_signed(orch, w, delegation, match)
        assert w.calls == Counter()
        # The same session still works with an honest chain: each refusal was one step 9.
        assert (await raw(orch, w.cal_url, to_orch().tokens)).result["for"] == PERSON.did


async def test_a_revoked_link_ends_the_chain_mid_session() -> None:
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        deny = StoreRevocations(w.cal_store)
        chain = to_orch()
        assert (await raw(orch, w.cal_url, chain.tokens)).status == "success"
        await deny.revoke("delegation:" + chain.links[0].jti)  # the person's own link
        await refused_signed(orch, w, chain.hash, "token id revoked: delegation:" + chain.links[0].jti)
        await deny.unrevoke("delegation:" + chain.links[0].jti)
        assert (await raw(orch, w.cal_url, chain.hash)).status == "success"
        # Revoking a hop's DID (not the session's client) ends every chain through it.
        await deny.revoke(ASSISTANT.did)
        await refused_signed(orch, w, chain.hash, "DID revoked: " + ASSISTANT.did)
        assert w.calls["create_event"] == 2


async def test_the_client_refuses_before_sending() -> None:
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        with pytest.raises(InvalidParams, match=r"not sent: .*delegated to another DID"):
            await orch.request(
                CAL.did,
                {"goal": "create_event", "inputs": {}},
                endpoint=w.cal_url,
                on_behalf_of=person_chain(),
            )
        with pytest.raises(InvalidParams, match=r"not sent: .*outside the delegated goals"):
            await orch.request(
                CAL.did, {"goal": "list_events", "inputs": {}}, endpoint=w.cal_url, on_behalf_of=to_orch()
            )
        assert w.calls == Counter()


@pytest.mark.parametrize(
    ("sealed", "member"), [(True, "sealed_delegation"), (False, "delegation")], ids=["sealed", "plain"]
)
async def test_a_server_without_the_extension_refuses_the_member_unsigned(sealed: bool, member: str) -> None:
    # The chain crosses as sealed_delegation on a sealed session (§12.6), in the clear on
    # another: a server without the extension refuses either as an unknown member.
    limits = ServerLimits(sealed_intents=sealed)
    plain = AgentServer(CAL, store=MemoryStore(), name="plain", limits=limits)

    @plain.intent("create_event")
    async def create_event(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        raise AssertionError("must not run")

    assert "delegation" not in plain.card.get("a2a_secure_extensions", [])
    async with serve_app(plain.app()) as url, A2AClient(ORCH, retry=NO_RETRY) as orch:
        with pytest.raises(InvalidParams, match="does not declare the delegation extension"):
            await orch.request(
                CAL.did, {"goal": "create_event", "inputs": {}}, endpoint=url, on_behalf_of=to_orch()
            )
        with pytest.raises(A2AError, match=f"unexpected member '{member}'") as info:
            await raw(orch, url, to_orch().tokens)
        assert info.value.code == -32602 and not info.value.signed


async def test_an_agent_acts_for_the_person_it_was_set_up_with() -> None:
    async with world() as w:
        registry = AgentRegistry([RegistryEntry("calendar", CAL.did, w.cal_url)])
        agent = A2AAgent("orch", ORCH, registry=registry, on_behalf_of=to_orch())
        async with agent:
            assert (await agent.request("calendar", {"goal": "create_event", "inputs": {"title": "t"}}))[
                "for"
            ] == PERSON.did
            narrower = agent.delegate_further(agent.on_behalf_of, MALLORY.did, ["create_event"], ttl=60)
            assert narrower.audience == MALLORY.did and narrower.exp <= agent.on_behalf_of.exp


async def test_cli_delegate_then_call_on_behalf_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = {}
    for who in (PERSON, ASSISTANT, ORCH):
        keys[who.did] = str(tmp_path / f"{who.agent_id}.key")
        who.save(keys[who.did])
    first, second = str(tmp_path / "person.chain"), str(tmp_path / "orch.chain")
    targets = ["--target", ORCH.did, "--target", CAL.did]
    argv = ["delegate", "--key-file", keys[PERSON.did], "--to", ASSISTANT.did, "--goals", "plan,create_event"]
    assert main([*argv, "--ttl", "8h", *targets, "--out", first]) == 0
    assert os.stat(first).st_mode & 0o777 == 0o600
    further = ["delegate", "--key-file", keys[ASSISTANT.did], "--to", ORCH.did, "--parent", first]
    assert main([*further, "--goals", "delete_all", "--out", second]) == 1
    assert "goals widen" in capsys.readouterr().err
    assert main([*further, "--goals", "create_event", "--out", second]) == 0
    chain = read_chain(second)
    assert (
        chain.principal == PERSON.did
        and chain.audience == ORCH.did
        and chain.exp - chain.links[0].nbf <= 8 * 3600
    )
    async with world() as w:
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "a2a_secure", "call", "--key-file", keys[ORCH.did], "--to", CAL.did],
            *["--endpoint", w.cal_url, "--goal", "create_event", "--inputs", '{"title": "cli"}'],
            *["--on-behalf-of", second],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out) == {"created": "cli", "for": PERSON.did}
        assert w.calls["create_event"] == 1


async def test_mcp_offers_only_the_tools_the_chain_covers_and_calls_them_on_its_behalf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import a2a_secure

    # Leave the package as it was (another test makes the mcp extra look missing, and an
    # a2a_secure.mcp_server attribute left here would hide that).
    monkeypatch.setattr(a2a_secure, "mcp_server", None, raising=False)
    monkeypatch.delitem(sys.modules, "a2a_secure.mcp_server", raising=False)
    from a2a_secure.mcp_server import in_scope

    async with world() as w:
        registry = AgentRegistry([RegistryEntry("calendar", CAL.did, w.cal_url)])
        async with A2AAgent("orch", ORCH, registry=registry, on_behalf_of=to_orch()) as agent:
            every = await agent.tools.refresh()
            assert {s.intent for s in every} == {"create_event", "list_events", "watch"}
            offered = in_scope(agent, every)
            assert [s.intent for s in offered] == ["create_event"]
            result = await agent.tools.call(offered[0].name, {"title": "from a model"})
            assert not result.is_error
            assert result.content["result"] == {"created": "from a model", "for": PERSON.did}
            outside = next(s for s in every if s.intent == "list_events")
            refused = await agent.tools.call(outside.name, {})
            assert refused.is_error and "outside the delegated goals" in refused.text
            assert w.calls == Counter(create_event=1)


def test_the_demo_books_on_a_persons_behalf_and_refuses_a_widening(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--keep-logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert '"booked":"Dentist","for":"did:key:' in out
    assert "widening the chain at the next hop is refused before signing: " in out
    assert "goals widen the previous link's" in out
    assert "cancel_all under the same chain: signed code -32042: delegation refused: goal 'cancel_all'" in out


async def test_the_audit_record_names_the_principal_and_the_chain(tmp_path: Path) -> None:
    from a2a_secure.audit import Auditor, JsonlAuditLog, run_audit_verify

    log = tmp_path / "cal.audit.jsonl"
    auditor = Auditor([JsonlAuditLog(log, CAL)], role="server")
    calls: Counter[str] = Counter()
    server = calendar(calls, [], MemoryStore())
    server._audit = auditor.record
    chain = to_orch()
    async with serve_app(server.app()) as url, A2AClient(ORCH, retry=NO_RETRY) as orch:
        await orch.request(CAL.did, {"goal": "create_event", "inputs": {}}, endpoint=url, on_behalf_of=chain)
        await orch.request(CAL.did, {"goal": "list_events", "inputs": {}}, endpoint=url)
    auditor.close()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    intents = [r for r in records if r["event"] == "intent"]
    assert [(r["intent_goal"], r.get("principal"), r.get("delegation")) for r in intents] == [
        ("create_event", PERSON.did, chain.hash),
        ("list_events", None, None),
    ]
    assert "principal" not in intents[1]  # a record without a chain is the base record
    code, message = run_audit_verify(str(log), CAL.did)
    assert code == 0, message
    # The members are covered by the hash chain like the others.
    tampered = log.read_text().replace(PERSON.did, MALLORY.did, 1)
    log.write_text(tampered)
    assert run_audit_verify(str(log), CAL.did)[0] != 0


async def test_an_a2a_sdk_handler_behind_the_session_sees_the_principal() -> None:
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.tasks import InMemoryTaskStore
    from test_a2a_binding import CountingEcho, send_request, template_card

    from a2a_secure.a2a_binding import A2ABridge, SecureA2ATransport

    seen: list[dict[str, Any]] = []

    class Recording(AgentExecutor):
        def __init__(self) -> None:
            self.echo = CountingEcho()

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.call_context is not None
            seen.append(dict(context.call_context.state["a2a_secure"]))
            await self.echo.execute(context, event_queue)

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            await self.echo.cancel(context, event_queue)

    card = template_card()
    handler = DefaultRequestHandler(
        agent_executor=Recording(), task_store=InMemoryTaskStore(), agent_card=card
    )
    server = AgentServer(CAL, delegation=DelegationRules(), name="a2a-calendar")
    bridge = A2ABridge(handler, agent_card=card)
    bridge.mount(server)
    chain = PERSON.delegate(ORCH.did, ["SendMessage"], ttl=600, targets=[CAL.did])
    # The A2A method as the secure transport sends it, under the chain (sent as it is: the
    # A2A card has no a2a_secure_extensions member to declare the extension, see §10).
    intent = SecureA2ATransport._intent("SendMessage", send_request("for the person"), None)
    try:
        async with serve_app(server.app()) as url, A2AClient(ORCH, retry=NO_RETRY) as client:
            server.url = url
            session = await client.session_for(CAL.did, url)
            for member in (chain.tokens, chain.hash):
                answer = await client.send_intent(session, {**intent, "delegation": member})
                assert answer.status == "success"
            await client.send_intent(session, intent)
    finally:
        await handler.aclose()
    assert [s["principal"] for s in seen] == [PERSON.did, PERSON.did, None]
    assert seen[0]["caller_did"] == ORCH.did and seen[2]["delegation"] is None
    assert [(h["issuer"], h["audience"]) for h in seen[1]["delegation"]] == [(PERSON.did, ORCH.did)]


async def test_a_stream_acts_under_the_chain_too() -> None:
    async with world() as w, A2AClient(ORCH, retry=NO_RETRY) as orch:
        chain = to_orch(person_chain(goals=["create_event", "watch"]), goals=None)
        items = [
            item
            async for item in orch.stream(
                CAL.did, {"goal": "watch", "inputs": {}}, endpoint=w.cal_url, on_behalf_of=chain
            )
        ]
        assert items == [{"i": 0, "for": PERSON.did}, {"i": 1, "for": PERSON.did}]
        with pytest.raises(InvalidParams, match="outside the delegated goals"):
            async for _ in orch.stream(CAL.did, {"goal": "watch", "inputs": {}}, on_behalf_of=to_orch()):
                pass
        assert w.calls["watch"] == 1


async def test_a_token_id_revoked_with_the_cli_in_a_revocation_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from a2a_secure.store.revocation import FileRevocations

    deny = tmp_path / "revoked.json"
    server = AgentServer(CAL, revocations=[FileRevocations(deny)], delegation=DelegationRules(), name="cal")
    calls: Counter[str] = Counter()

    @server.intent("create_event")
    async def create_event(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        calls["create_event"] += 1
        return {"for": ctx.principal}

    chain = to_orch()
    async with serve_app(server.app()) as url, A2AClient(ORCH, retry=NO_RETRY) as orch:
        intent = {"goal": "create_event", "inputs": {}}
        assert (await orch.request(CAL.did, intent, endpoint=url, on_behalf_of=chain)).result == {
            "for": PERSON.did
        }
        target = "delegation:" + chain.leaf.jti  # the assistant's hop to the orchestrator
        assert (
            await asyncio.to_thread(main, ["revoke", target, "--file", str(deny), "--reason", "lost laptop"])
            == 0
        )
        with pytest.raises(PolicyViolation, match="token id revoked: " + target) as info:
            await orch.request(CAL.did, intent, endpoint=url, on_behalf_of=chain)
        assert info.value.signed
        assert await asyncio.to_thread(main, ["revoke", "delegation:short", "--file", str(deny)]) == 2
    assert "not known here" not in capsys.readouterr().err  # a token id is not resolved as a DID
    assert calls["create_event"] == 1


async def test_two_workers_on_redis_share_the_sessions_and_the_deny_list(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    from a2a_secure.store.redis import RedisStore

    stores = [RedisStore(redis_url, prefix=redis_prefix) for _ in range(3)]
    calls: Counter[str] = Counter()
    try:
        urls = []
        async with contextlib.AsyncExitStack() as stack:
            for store in stores[:2]:  # two workers of one agent
                urls.append(await stack.enter_async_context(serve_app(calendar(calls, [], store).app())))  # type: ignore[arg-type]
            orch = await stack.enter_async_context(A2AClient(ORCH, retry=NO_RETRY))
            chain, intent = to_orch(), {"goal": "create_event", "inputs": {}}
            for url in (urls[0], urls[1], urls[0]):
                # The second worker has not seen the chain: it asks for it, the client sends it.
                result = await orch.request(CAL.did, intent, endpoint=url, on_behalf_of=chain)
                assert result.result["for"] == PERSON.did
            assert result.sequence == 4  # one session throughout; one sequence went to the ask
            await StoreRevocations(stores[2]).revoke(ASSISTANT.did)  # the operator, elsewhere
            for url in urls:  # worker 0 holds the chain verified, and still sees the revocation
                with pytest.raises(PolicyViolation, match="DID revoked: " + ASSISTANT.did):
                    await orch.request(CAL.did, intent, endpoint=url, on_behalf_of=chain)
        assert calls["create_event"] == 3
    finally:
        for store in stores:
            await store.aclose()


async def test_an_intent_resent_without_its_id_after_a_full_store_keeps_its_chain() -> None:
    # A store that holds all the intent_ids it may answers 503 and the client sends the intent
    # once more without an id: still on the person's behalf, never as the agent on its own.
    calls: Counter[str] = Counter()
    seen: list[dict[str, Any]] = []
    store = MemoryStore()
    server = calendar(calls, seen, store)
    server.limits = dataclasses.replace(server.limits, max_intent_ids_total=1)
    chain = to_orch()
    async with serve_app(server.app()) as url:
        async with A2AClient(ORCH, retry=NO_RETRY) as first:
            done = await first.request(
                CAL.did, {"goal": "create_event", "inputs": {"title": "a"}}, endpoint=url, on_behalf_of=chain
            )
            assert done.intent_id is not None  # the one place the store keeps
        async with A2AClient(ORCH, retry=NO_RETRY) as second:
            done = await second.request(
                CAL.did, {"goal": "create_event", "inputs": {"title": "b"}}, endpoint=url, on_behalf_of=chain
            )
            assert done.intent_id is None and done.result == {"created": "b", "for": PERSON.did}
    assert calls["create_event"] == 2
    assert [s["principal"] for s in seen] == [PERSON.did, PERSON.did]


async def test_a_delegated_stream_sends_its_chain_in_full_when_another_worker_asks() -> None:
    # Two workers of one agent share a store: the session is known to both, the verified
    # chain only to the worker that saw it. A stream, like a unary request, answers the
    # second worker's signed "send it in full" by sending it in full, on the same session.
    calls: Counter[str] = Counter()
    store = MemoryStore()
    chain = to_orch(person_chain(goals=["create_event", "watch"]), goals=None)
    async with contextlib.AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(serve_app(calendar(calls, [], store).app())) for _ in range(2)
        ]
        orch = await stack.enter_async_context(A2AClient(ORCH, retry=NO_RETRY))
        for url in (urls[0], urls[1], urls[0], urls[1]):
            items = [
                item
                async for item in orch.stream(
                    CAL.did, {"goal": "watch", "inputs": {}}, endpoint=url, on_behalf_of=chain
                )
            ]
            assert items == [{"i": 0, "for": PERSON.did}, {"i": 1, "for": PERSON.did}]
        session = await orch.session_for(CAL.did)
        assert session.last_sequence == 5  # one session throughout; one sequence went to the ask
    assert calls["watch"] == 4
