"""The principal of a delegation chain as an approver (PROTOCOL.md §12.1 with §12.7), over HTTP.

An orchestrator (``CALLER``) asks the desk to create an event on the owner's behalf under a
chain the owner signed; the desk stores the action with the owner as its principal, and the
approvers entry ``"principal"`` lets the owner, on a session of its own, approve it. The
orchestrator, another person with a chain of their own, and (in "principal only") the
desk's configured approver are refused with a signed -32042, and nothing runs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from approval_helpers import CALLER, PERSON, actions, approval, fixed_identity, refused, start_desk
from attack_helpers import Wire
from redis_helpers import redis_prefix, redis_url  # noqa: F401 - fixtures

from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.cli_approve import show_action
from a2a_secure.client.approval import approve, pending_action
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import Chain, DelegationRules
from a2a_secure.errors import ActionNotPending, PolicyViolation
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.approval import PRINCIPAL
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer
from a2a_secure.store.actions import ActionState
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import StoreRevocations
from a2a_secure.testing import serve_app

DESK = fixed_identity("principal-desk")
OWNER = fixed_identity("owner")  # the person on whose behalf the orchestrator asks
OTHER = fixed_identity("other-person")  # a principal too, of their own actions
GOALS = ["create_event"]
# A principal approves only where the goal is reserved to named principals (§12.1).
RESERVED = DelegationRules.build({"create_event": [OWNER.did, OTHER.did]})


def chain_of(principal: Identity, goals: list[str] = GOALS) -> Chain:
    """``principal`` delegates ``goals`` at the desk to the orchestrator."""
    chain: Chain = principal.delegate(CALLER.did, goals=goals, ttl=3600, targets=[DESK.did])
    return chain


async def ask_for(
    w: Wire, sess: ClientSession, chain: Chain | None, title: str = "dentist"
) -> dict[str, Any]:
    """The orchestrator's request for an event, under ``chain``: its verified result."""
    intent: dict[str, Any] = {"goal": "create_event", "inputs": {"title": title}}
    if chain is not None:
        intent["delegation"] = chain.tokens
    req = sess.prepare_intent(intent)
    resp = await w.send(req)
    assert resp.status_code == 200, resp.text
    result = sess.verify_result(req, resp.json()["result"]).result
    assert result["needs_approval"] is True, result
    return dict(result)


async def approved(w: Wire, sess: ClientSession, created: dict[str, Any]) -> dict[str, Any]:
    req = approval(sess, created["action_id"], created["action_hash"])
    resp = await w.send(req)
    assert resp.status_code == 200, resp.text
    return dict(sess.verify_result(req, resp.json()["result"]).result)


def inputs_of(created: dict[str, Any]) -> dict[str, Any]:
    return {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_the_principal_approves_what_was_asked_on_their_behalf_and_it_runs_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    store: Any = MemoryStore()
    second: Any = None  # another worker's store object, on the same Redis
    if backend == "redis":
        from a2a_secure.store.redis import RedisStore

        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        store, second = RedisStore(url, prefix=prefix), RedisStore(url, prefix=prefix)
    try:
        await principal_approves(store, second)
    finally:
        if second is not None:
            await store.aclose()
            await second.aclose()


async def principal_approves(store: Any, second: Any) -> None:
    chain = chain_of(OWNER)
    async with start_desk(
        identity=DESK, store=store, approvers=(PRINCIPAL, PERSON.did), delegation=RESERVED
    ) as w:
        created = await ask_for(w, await w.open_session(CALLER), chain)
        # The store keeps on whose behalf, for whichever worker receives the approval.
        stored = await store.get_action(created["action_id"], w.clock())
        assert (stored.principal, stored.delegation) == (OWNER.did, chain.hash)
        if second is not None:
            assert await second.get_action(created["action_id"], w.clock()) == stored
        owner = await w.open_session(OWNER)
        answer = await approved(w, owner, created)
        assert answer["result"]["approver"] == OWNER.did and answer["result"]["caller"] == CALLER.did
        assert w.calls["run:create_event"] == 1
        again = approval(owner, created["action_id"], created["action_hash"])
        await w.expect(w.send(again), 409, ActionNotPending.code, signed=True, state=False, records=2)
        assert w.calls["run:create_event"] == 1
        decided = await store.get_action(created["action_id"], w.clock())
        assert decided.state is ActionState.APPROVED and decided.decided_by == OWNER.did
        assert decided.principal == OWNER.did
        # Every record of the action's life names the principal and the chain.
        records = [e for e in w.sink.events if e.event.startswith("action_")]
        assert [e.event for e in records] == [
            "action_created",
            "action_approved",
            "action_executed",
            "action_refused",
        ]
        assert all((e.principal, e.delegation) == (OWNER.did, chain.hash) for e in records)
        assert [e.client_did for e in records] == [CALLER.did, OWNER.did, OWNER.did, OWNER.did]


async def test_the_orchestrator_another_principal_and_unknown_ids_are_refused() -> None:
    async with start_desk(identity=DESK, approvers=(PRINCIPAL, PERSON.did), delegation=RESERVED) as w:
        orch = await w.open_session(CALLER)
        created = await ask_for(w, orch, chain_of(OWNER))
        theirs = await ask_for(w, orch, chain_of(OTHER), title="their own")
        assert actions(w)[theirs["action_id"]].principal == OTHER.did
        # The agent that asked is no approver, whoever it acts for.
        await refused(w, orch, "tool.approve", inputs_of(created), 403, -32042)
        await refused(w, orch, "tool.pending", {"action_id": created["action_id"]}, 403, -32042)
        # Another principal approves only their own actions.
        other = await w.open_session(OTHER)
        await refused(w, other, "tool.approve", inputs_of(created), 403, -32042)
        await refused(w, other, "tool.pending", {"action_id": created["action_id"]}, 403, -32042)
        # A DID listed nowhere learns nothing: an unknown id is refused as another's is.
        unknown = dict(inputs_of(created), action_id="A" * 22)
        error = await refused(w, other, "tool.approve", unknown, 403, -32042)
        assert error["message"] == "this DID is not an approver of this action"
        assert w.calls["run:create_event"] == 0
        assert actions(w)[created["action_id"]].state is ActionState.PENDING
        # "principal" is besides the listed approvers here: the desk's approver still decides.
        person = await w.open_session(PERSON)
        assert (await approved(w, person, theirs))["result"]["approver"] == PERSON.did
        owner = await w.open_session(OWNER)
        assert (await approved(w, owner, created))["result"]["approver"] == OWNER.did
        assert w.calls["run:create_event"] == 2


async def test_the_delegate_cannot_approve_by_acting_under_the_principals_chain() -> None:
    # The owner even delegated tool.approve to the orchestrator: the approver is still the
    # session's own DID, never the principal a chain names.
    chain = chain_of(OWNER, ["create_event", "tool.approve", "tool.pending"])
    async with start_desk(identity=DESK, approvers=(PRINCIPAL,), delegation=RESERVED) as w:
        orch = await w.open_session(CALLER)
        created = await ask_for(w, orch, chain)
        for goal, inputs in (
            ("tool.approve", inputs_of(created)),
            ("tool.pending", {"action_id": created["action_id"]}),
        ):
            req = orch.prepare_intent({"goal": goal, "inputs": inputs, "delegation": chain.hash})
            error = await w.expect(w.send(req), 403, -32042, signed=True, state=False, records=2)
            assert "not an approver" in error["message"]
        assert w.calls["run:create_event"] == 0
        assert actions(w)[created["action_id"]].state is ActionState.PENDING


async def test_principal_only_refuses_the_configured_approver_and_chainless_requests() -> None:
    # PERSON approves every action of the desk but create_event, which only its principal does.
    async with start_desk(
        identity=DESK, approvers=(PERSON.did,), event_approvers=[PRINCIPAL], delegation=RESERVED
    ) as w:
        orch = await w.open_session(CALLER)
        created = await ask_for(w, orch, chain_of(OWNER))
        person = await w.open_session(PERSON)
        error = await refused(w, person, "tool.approve", inputs_of(created), 403, -32042)
        assert error["message"] == "this DID is not an approver of this action"
        await refused(w, person, "tool.pending", {"action_id": created["action_id"]}, 403, -32042)
        # Without a chain nobody could approve it: refused before anything runs or is stored
        # (the goal is reserved to named principals, so the chain's scope refuses it first).
        error = await refused(w, orch, "create_event", {"title": "alone"}, 403, -32042, records=1)
        assert "principal" in error["message"]
        assert w.calls["run:create_event"] == 0
        owner = await w.open_session(OWNER)
        details = await w.intent(owner, "tool.pending", action_id=created["action_id"])
        assert details.result["principal"] == OWNER.did and details.result["caller_did"] == CALLER.did
        assert (await approved(w, owner, created))["result"]["approver"] == OWNER.did
        assert w.calls["run:create_event"] == 1


async def test_a_principal_the_caller_made_up_is_refused_where_the_goal_names_its_principals() -> None:
    # The caller mints a DID, delegates to itself and would approve through it: the goal is
    # reserved to the owner, so the intent is refused before the handler and nothing is stored.
    minted = fixed_identity("minted-by-the-caller")
    rules = DelegationRules.build({"create_event": [OWNER.did]})
    async with start_desk(identity=DESK, approvers=(PRINCIPAL,), delegation=rules) as w:
        orch = await w.open_session(CALLER)
        req = orch.prepare_intent(
            {"goal": "create_event", "inputs": {"title": "x"}, "delegation": chain_of(minted).tokens}
        )
        await w.expect(w.send(req), 403, -32042, signed=True, state=False, records=1)
        assert actions(w) == {} and w.calls["create_event"] == 0
        created = await ask_for(w, orch, chain_of(OWNER))
        assert actions(w)[created["action_id"]].principal == OWNER.did


async def test_an_action_asked_without_a_chain_is_approved_as_before() -> None:
    async with start_desk(
        identity=DESK, approvers=(PRINCIPAL, PERSON.did), delegation=DelegationRules()
    ) as w:
        orch = await w.open_session(CALLER)
        created = await ask_for(w, orch, None)
        assert actions(w)[created["action_id"]].principal is None
        await refused(w, await w.open_session(OWNER), "tool.approve", inputs_of(created), 403, -32042)
        await refused(w, orch, "tool.approve", inputs_of(created), 403, -32042)
        details = await w.intent(await w.open_session(PERSON), "tool.pending", action_id=created["action_id"])
        assert "principal" not in details.result
        assert (await approved(w, await w.open_session(PERSON), created))["result"]["approver"] == PERSON.did
        assert all(e.principal is None for e in w.sink.events)


async def test_a_link_revoked_after_the_request_leaves_the_principals_approval_valid() -> None:
    chain = chain_of(OWNER)
    async with start_desk(identity=DESK, approvers=(PRINCIPAL,), delegation=RESERVED) as w:
        orch = await w.open_session(CALLER)
        created = await ask_for(w, orch, chain)
        await StoreRevocations(w.store).revoke("delegation:" + chain.links[0].jti)
        # The chain no longer lets the orchestrator ask anything...
        req = orch.prepare_intent(
            {"goal": "create_event", "inputs": {"title": "x"}, "delegation": chain.hash}
        )
        await w.expect(w.send(req), 403, -32042, signed=True, state=False, records=1)
        # ...but the owner's own signature is the approval of what was asked before.
        owner = await w.open_session(OWNER)
        assert (await approved(w, owner, created))["result"]["approver"] == OWNER.did
        assert w.calls["run:create_event"] == 1


async def test_the_person_approves_with_the_client_what_an_orchestrator_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's example: real clients on both sides, the chain sent by ``on_behalf_of``."""
    runs: list[tuple[Any, str | None]] = []
    server = AgentServer(
        DESK,
        Policy.build(rate_limit=1000),
        store=MemoryStore(),
        delegation=RESERVED,
        approvers=["principal"],
        audit=Auditor([MemoryAuditSink()], role="server"),
    )

    @server.intent("create_event")
    def create_event(inputs: dict[str, Any], ctx: IntentContext) -> Any:
        from a2a_secure import NeedsApproval

        return NeedsApproval(inputs, preview=f"Create {inputs['title']!r} for {ctx.principal}")

    @server.approved_action("create_event")
    def run_create(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
        runs.append((data, ctx.principal))
        return {"created": data["title"]}

    no_retry = RetryPolicy(attempts=1)
    async with (
        serve_app(server.app()) as url,
        A2AClient(CALLER, retry=no_retry) as orchestrator,
        A2AClient(OWNER, retry=no_retry) as person,
        A2AClient(OTHER, retry=no_retry) as other,
    ):
        asked = await orchestrator.request(
            DESK.did,
            {"goal": "create_event", "inputs": {"title": "dentist"}},
            endpoint=url,
            on_behalf_of=chain_of(OWNER),
        )
        action_id = asked.result["action_id"]
        for who in (orchestrator, other):
            with pytest.raises(PolicyViolation, match="not an approver"):
                await approve(who, DESK.did, action_id, endpoint=url)
        details = await pending_action(person, DESK.did, action_id, endpoint=url)
        assert details.principal == OWNER.did and details.caller_did == CALLER.did
        show_action(details)  # what `a2a-secure approve` prints before it asks
        assert f"for:      {OWNER.did} (the chain's principal)" in capsys.readouterr().out
        outcome = await approve(person, DESK.did, action_id, endpoint=url)
        assert outcome.result == {"created": "dentist"}
        assert runs == [({"title": "dentist"}, OWNER.did)]
        assert time.time() < details.expires_at


async def test_a_principal_of_an_open_goal_approves_nothing() -> None:
    # Anyone can make a DID and delegate to their own agent: on a goal not reserved to named
    # principals, the chain's principal is no approver (the action names the chain only).
    minted = fixed_identity("minted-person")
    async with start_desk(
        identity=DESK, approvers=(PRINCIPAL, PERSON.did), delegation=DelegationRules()
    ) as w:
        orch = await w.open_session(CALLER)
        chain = chain_of(minted)
        created = await ask_for(w, orch, chain)
        stored = actions(w)[created["action_id"]]
        assert stored.principal is None and stored.delegation == chain.hash
        by_minted = await w.open_session(minted)
        await refused(w, by_minted, "tool.approve", inputs_of(created), 403, -32042)
        assert w.calls.get("run:create_event", 0) == 0
        assert actions(w)[created["action_id"]].state is ActionState.PENDING
