"""Attacks on human approval (PROTOCOL.md §12), in the style of tests/test_attacks.py.

Each test sends crafted but validly signed messages to a real server on loopback and checks
the exact refusal, that it is signed, that no stored action changed and that nothing ran
(``approval_helpers.refused``), then that the honest flow still works.

AP1 replay of the same signed approval; AP2 replay under a new session; AP3 substitution of
the approved data or hash; AP4 ``tool.execute`` used to reach what the policy forbids; AP5
cross-caller use: a caller approving its own action, an approver of one agent approving at
another.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from approval_helpers import CALLER, PERSON, actions, approval, ask, refused, start_desk
from attack_helpers import Wire

from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.store.actions import ActionState


@pytest_asyncio.fixture
async def w() -> AsyncIterator[Wire]:
    async with start_desk() as wire:
        yield wire


def inputs_for(created: dict[str, object], approved: bool = True) -> dict[str, object]:
    return {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": approved}


async def test_ap1_the_same_signed_approval_resent_runs_nothing_again(w: Wire) -> None:
    caller, person = await w.open_session(CALLER), await w.open_session(PERSON)
    created = await ask(w, caller, title="once")
    req = approval(person, created["action_id"], created["action_hash"])
    first = await w.send(req)
    assert first.status_code == 200
    for _ in range(3):  # the byte-identical request, with other JSON-RPC ids
        again = await w.send(req)
        assert again.status_code == 200 and again.json()["result"] == first.json()["result"]
    assert w.calls["run:create_event"] == 1
    assert [e.event for e in w.sink.events].count("action_executed") == 1


async def test_ap2_an_approval_replayed_under_a_new_session_is_refused(w: Wire) -> None:
    caller, person = await w.open_session(CALLER), await w.open_session(PERSON)
    created = await ask(w, caller, title="replayed")
    req = approval(person, created["action_id"], created["action_hash"])
    assert (await w.send(req)).status_code == 200
    fresh = await w.open_session(PERSON)
    # The old signed request moved onto the new session: its signature names the old one.
    moved = dict(req.params, session_id=fresh.session_id, session_commitment=fresh.session_commitment)
    before = actions(w)
    await w.expect(w.send(req, params=moved), 401, -32040, state=False)
    assert actions(w) == before
    # The person signing the same approval again on the new session: already decided.
    error = await refused(w, fresh, "tool.approve", inputs_for(created), 409, -32050)
    assert error["message"] == "action is approved"
    assert w.calls["run:create_event"] == 1


async def test_ap3_substituted_data_or_hash_is_refused_and_consumes_nothing(w: Wire) -> None:
    caller, person = await w.open_session(CALLER), await w.open_session(PERSON)
    real = await ask(w, caller, title="lunch with ana")
    evil = await ask(w, caller, title="invite everyone")
    # The approval of one action carrying the hash of another, either way round.
    await refused(
        w, person, "tool.approve", {**inputs_for(real), "action_hash": evil["action_hash"]}, 400, -32602
    )
    await refused(
        w, person, "tool.approve", {**inputs_for(evil), "action_hash": real["action_hash"]}, 400, -32602
    )
    # The data itself sent along (the flow this design replaces): an extra member, refused.
    with_data = {**inputs_for(real), "action_data": {"title": "invite everyone"}}
    await refused(w, person, "tool.approve", with_data, 400, -32602)
    # The hash of the substituted data under the real id.
    forged = {**inputs_for(real), "action_hash": encoding.hash_of({"title": "invite everyone"})}
    await refused(w, person, "tool.approve", forged, 400, -32602)
    stored = actions(w)
    assert stored[real["action_id"]].state is ActionState.PENDING
    assert stored[evil["action_id"]].state is ActionState.PENDING
    # What runs on the honest approval is the stored data, never anything sent with it.
    answer = await w.intent(person, "tool.approve", **inputs_for(real))
    assert answer.result["result"]["created"] == {"title": "lunch with ana"}
    assert w.calls["run:create_event"] == 1


async def test_ap4_tool_execute_cannot_reach_what_the_policy_or_the_namespace_forbids(w: Wire) -> None:
    caller, person = await w.open_session(CALLER), await w.open_session(PERSON)
    created = await ask(w, caller, title="x")
    await refused(w, caller, "tool.execute", {"tool": "blocked", "arguments": {}}, 403, -32042, records=1)
    assert w.calls["blocked"] == 0
    nested = {"tool": "tool.execute", "arguments": {"tool": "blocked", "arguments": {}}}
    await refused(w, caller, "tool.execute", nested, 403, -32042, records=1)
    # Not even an approver may approve through tool.execute (no tool.* goal runs inside it).
    via = {"tool": "tool.approve", "arguments": inputs_for(created)}
    await refused(w, person, "tool.execute", via, 403, -32042, records=1)
    await refused(
        w, caller, "tool.execute", {"tool": "tool.pending", "arguments": {}}, 403, -32042, records=1
    )
    assert actions(w)[created["action_id"]].state is ActionState.PENDING


async def test_ap5_a_caller_cannot_approve_its_own_action(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    created = await ask(w, caller, title="self-approved")
    for approved in (True, False):
        await refused(w, caller, "tool.approve", inputs_for(created, approved), 403, -32042)
    assert actions(w)[created["action_id"]].state is ActionState.PENDING


async def test_ap5_an_approver_of_one_agent_cannot_approve_at_another(w: Wire) -> None:
    stranger = Identity.generate("other-desk-person")
    async with start_desk(approvers=(stranger.did,)) as other:
        # The other desk's approver, at this desk: not an approver here.
        caller = await w.open_session(CALLER)
        created = await ask(w, caller, title="here")
        intruder = await w.open_session(stranger)
        await refused(w, intruder, "tool.approve", inputs_for(created), 403, -32042)
        await refused(w, intruder, "tool.pending", {"action_id": created["action_id"]}, 403, -32042)
        # This desk's action id and hash taken to the other desk, by its own approver: the
        # action does not exist there (each agent keeps its own).
        at_other = await other.open_session(stranger)
        await refused(other, at_other, "tool.approve", inputs_for(created), 409, -32050)
        # And this desk's approver at the other desk, for the other desk's action.
        theirs = await ask(other, await other.open_session(CALLER), title="there")
        person_there = await other.open_session(PERSON)
        await refused(other, person_there, "tool.approve", inputs_for(theirs), 403, -32042)
        assert other.calls["run:create_event"] == 0 and w.calls["run:create_event"] == 0
