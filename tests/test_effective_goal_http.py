"""A goal run inside a goal is admitted as the goal itself, over real HTTP (PROTOCOL.md §12.7).

``tool.execute`` runs its inner tool; the delegation rules of §12.7 (the chain's scope, the
goals reserved to named principals) apply to that inner goal exactly as to a direct intent
for it. Two attacks on a desk that serves tools and reserves ``create_event`` to its owner:

* the reserved goal asked through ``tool.execute`` with no chain at all;
* a DID the caller made up delegates ``tool.execute`` (only) to the caller, which asks for
  the reserved action under that chain: were it stored with the made-up DID as principal,
  that DID would approve it as the ``"principal"`` approver and it would run.

Both must be a signed -32042 with nothing run and nothing stored.
"""

from __future__ import annotations

from typing import Any

from approval_helpers import CALLER, PERSON, actions, fixed_identity, start_desk
from attack_helpers import Wire

from a2a_secure.delegation import Chain, DelegationRules
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.approval import PRINCIPAL
from a2a_secure.protocol.client import ClientSession

DESK = fixed_identity("effective-desk")
OWNER = fixed_identity("effective-owner")
MINTED = fixed_identity("minted-by-the-caller")
RESERVED = DelegationRules.build({"create_event": [OWNER.did]})


def chain(principal: Identity, goals: list[str]) -> Chain:
    made: Chain = principal.delegate(CALLER.did, goals=goals, ttl=3600, targets=[DESK.did])
    return made


def execute(sess: ClientSession, tool: str, arguments: dict[str, Any], under: Chain | None = None) -> Any:
    intent: dict[str, Any] = {"goal": "tool.execute", "inputs": {"tool": tool, "arguments": arguments}}
    if under is not None:
        intent["delegation"] = under.tokens
    return sess.prepare_intent(intent)


async def refused(w: Wire, sess: ClientSession, req: Any) -> dict[str, Any]:
    error = await w.expect(w.send(req), 403, -32042, signed=True, state=False, records=1)
    assert sess.error_from_reply(req, error).signed
    assert error["message"].startswith("delegation refused:"), error
    return error


async def test_a_reserved_goal_through_tool_execute_without_a_chain_is_refused() -> None:
    async with start_desk(identity=DESK, approvers=(PRINCIPAL, PERSON.did), delegation=RESERVED) as w:
        orch = await w.open_session(CALLER)
        error = await refused(w, orch, execute(orch, "create_event", {"title": "alone"}))
        assert "runs only on behalf of a principal" in error["message"]
        assert w.calls["create_event"] == 0 and actions(w) == {}
        # The same goal asked directly is refused alike, and under the owner's chain both run.
        direct = orch.prepare_intent({"goal": "create_event", "inputs": {"title": "alone"}})
        assert (await refused(w, orch, direct))["message"] == error["message"]
        owners = chain(OWNER, ["tool.execute", "create_event"])
        ok = execute(orch, "create_event", {"title": "dentist"}, owners)
        resp = await w.send(ok)
        assert resp.status_code == 200, resp.text
        created = orch.verify_result(ok, resp.json()["result"]).result
        assert actions(w)[created["action_id"]].principal == OWNER.did


async def test_a_made_up_principal_cannot_ask_and_approve_a_reserved_action_through_tool_execute() -> None:
    async with start_desk(identity=DESK, approvers=(PRINCIPAL,), delegation=RESERVED) as w:
        orch = await w.open_session(CALLER)
        # M delegates tool.execute alone: the chain does not name the inner goal.
        error = await refused(
            w, orch, execute(orch, "create_event", {"title": "x"}, chain(MINTED, ["tool.execute"]))
        )
        assert "outside the delegated goals" in error["message"]
        # M delegates both: M is not a principal the goal is reserved to.
        both = chain(MINTED, ["tool.execute", "create_event"])
        error = await refused(w, orch, execute(orch, "create_event", {"title": "x"}, both))
        assert f"may not run on behalf of {MINTED.did}" in error["message"]
        assert w.calls["create_event"] == 0 and actions(w) == {}
        assert w.calls["run:create_event"] == 0


async def test_a_chain_for_tool_execute_does_not_cover_an_open_inner_goal_it_does_not_name() -> None:
    # No goal reserved: a chain still narrows what the intent may do, inner goal included.
    async with start_desk(identity=DESK, delegation=DelegationRules()) as w:
        orch = await w.open_session(CALLER)
        only_execute = chain(MINTED, ["tool.execute"])
        error = await refused(w, orch, execute(orch, "echo", {"text": "hi"}, only_execute))
        assert "goal 'echo' is outside the delegated goals" in error["message"]
        assert w.calls["echo"] == 0
        named = chain(MINTED, ["tool.execute", "echo"])
        req = execute(orch, "echo", {"text": "hi"}, named)
        resp = await w.send(req)
        assert resp.status_code == 200, resp.text
        assert orch.verify_result(req, resp.json()["result"]).result == {"echo": {"text": "hi"}}
