"""One admission for the goal that runs: the same table through every path that runs a goal.

Each case is (whether the session's policy blocks the goal, the chain the intent acts under,
whether the goal is reserved to its owner). Every path that runs a goal must decide it as a
direct intent for that goal does, with the same code:

* ``intent``: a direct intent for ``act``;
* ``tool.execute``: ``tool.execute`` running ``act`` (its chain also grants ``tool.execute``);
* ``a2a``: the A2A method ``ListTasks`` served by the binding (an intent in domain ``a2a``);
* ``approval``: an approved action of goal ``act``, stored as it would have been when asked
  (the chain's principal when the chain covered the goal), approved by a listed approver on
  a session of its own: the goal is admitted again when it runs, on the approver's session,
  with the stored principal standing for the chain (which is not at hand then).

All over real HTTP, one server per (policy, reservation), real signed sessions.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from approval_helpers import CALLER, PERSON, fixed_identity
from attack_helpers import ExampleMethod, Wire

from a2a_secure import NeedsApproval
from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.delegation import Chain, DelegationRules
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientSession
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app

os.environ["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = "false"
pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from test_a2a_binding import template_card

from a2a_secure.a2a_binding import A2ABridge

DESK = fixed_identity("table-desk")
OWNER = fixed_identity("table-owner")
MINTED = fixed_identity("table-minted")
GOALS = ("act", "ListTasks")
CHAINS = ("none", "owner", "owner-other-goal", "minted")
Decision = str | tuple[int, int]  # "ran", or (HTTP status, JSON-RPC code)


class _Idle(AgentExecutor):
    async def execute(self, context: Any, event_queue: Any) -> None:  # pragma: no cover - not sent
        raise NotImplementedError

    async def cancel(self, context: Any, event_queue: Any) -> None:  # pragma: no cover
        raise NotImplementedError


@contextlib.asynccontextmanager
async def desk(blocked: bool, reserved: bool) -> AsyncIterator[Wire]:
    clock = FakeClock(float(int(time.time())))
    sink = MemoryAuditSink()
    calls: Counter[str] = Counter()
    policy = Policy.build(blocked=list(GOALS) if blocked else [], rate_limit=100_000)
    rules = DelegationRules.build({g: [OWNER.did] for g in GOALS}) if reserved else DelegationRules()
    server = AgentServer(
        DESK,
        policy,
        url="http://127.0.0.1",
        store=MemoryStore(),
        audit=Auditor([sink], role="server"),
        clock=clock,
        monotonic=clock.monotonic,
        delegation=rules,
        serve_tools=True,
        approvers=[PERSON.did],
    )

    @server.intent("act")
    def act(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["act"] += 1
        return {"ran": True}

    @server.approved_action("act")
    def run_act(data: dict[str, Any]) -> dict[str, Any]:
        calls["run:act"] += 1
        return {"ran": True}

    handler = DefaultRequestHandler(
        agent_executor=_Idle(), task_store=InMemoryTaskStore(), agent_card=template_card()
    )
    A2ABridge(handler, agent_card=template_card(), methods=["ListTasks"]).mount(server)
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=15) as http:
        yield Wire(server, url, http, clock, sink, calls, ExampleMethod())


def chain_for(kind: str, goal: str) -> Chain | None:
    if kind == "none":
        return None
    principal = MINTED if kind == "minted" else OWNER
    goals = ["other" if kind == "owner-other-goal" else goal, "tool.execute"]
    made: Chain = principal.delegate(CALLER.did, goals=goals, ttl=3600, targets=[DESK.did])
    return made


def expected(blocked: bool, kind: str, reserved: bool) -> Decision:
    """What PROTOCOL.md §5.4 and §12.7 say of a direct intent: the table's reference."""
    if blocked or kind == "owner-other-goal" or (reserved and kind in ("none", "minted")):
        return (403, -32042)
    return "ran"


async def decide(w: Wire, sess: ClientSession, intent: dict[str, Any], chain: Chain | None) -> Decision:
    if chain is not None:
        intent = {**intent, "delegation": chain.tokens}
    # Signed as a client that skips its own policy check would (the server must refuse).
    req = sess._sign_request("intent", {"intent": intent}, m.Typ.REQUEST, intent["goal"])
    resp = await w.send(req)
    body = resp.json()
    if "error" in body:
        assert sess.error_from_reply(req, body["error"]).signed, body
        return (resp.status_code, body["error"]["code"])
    assert resp.status_code == 200, resp.text
    sess.verify_result(req, body["result"])
    return "ran"


async def by_intent(w: Wire, sess: ClientSession, kind: str) -> Decision:
    before = w.calls["act"]
    decision = await decide(w, sess, {"goal": "act", "inputs": {}}, chain_for(kind, "act"))
    assert (w.calls["act"] == before + 1) is (decision == "ran")
    return decision


async def by_tool_execute(w: Wire, sess: ClientSession, kind: str) -> Decision:
    before = w.calls["act"]
    intent = {"goal": "tool.execute", "inputs": {"tool": "act", "arguments": {}}}
    decision = await decide(w, sess, intent, chain_for(kind, "act"))
    assert (w.calls["act"] == before + 1) is (decision == "ran")
    return decision


async def by_a2a_method(w: Wire, sess: ClientSession, kind: str) -> Decision:
    intent = {"goal": "ListTasks", "domain": "a2a", "inputs": {}}
    return await decide(w, sess, intent, chain_for(kind, "ListTasks"))


async def by_approval(w: Wire, approver: ClientSession, kind: str) -> Decision:
    chain = chain_for(kind, "act")
    covers = chain is not None and chain.leaf.allows_goal("act")
    created = await w.server.approvals.create(
        NeedsApproval({"n": 1}, preview="act"),
        goal="act",
        caller_did=CALLER.did,
        session_id="asked-earlier",
        sequence=1,
        principal=chain.principal if covers and chain is not None else None,
        delegation=None if chain is None else chain.hash,
    )
    before = w.calls["run:act"]
    inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
    decision = await decide(w, approver, {"goal": "tool.approve", "inputs": inputs}, None)
    assert (w.calls["run:act"] == before + 1) is (decision == "ran")
    return decision


@pytest.mark.parametrize("reserved", [False, True], ids=["open", "reserved"])
@pytest.mark.parametrize("blocked", [False, True], ids=["allowed", "blocked"])
async def test_every_path_that_runs_a_goal_decides_it_as_a_direct_intent(
    blocked: bool, reserved: bool
) -> None:
    async with desk(blocked, reserved) as w:
        caller = await w.open_session(CALLER)
        approver = await w.open_session(PERSON)
        table: dict[str, dict[str, Decision]] = {}
        for kind in CHAINS:
            want = expected(blocked, kind, reserved)
            row = {
                "intent": await by_intent(w, caller, kind),
                "tool.execute": await by_tool_execute(w, caller, kind),
                "a2a": await by_a2a_method(w, caller, kind),
            }
            # The approval runs without the chain at hand: the principal stored with the
            # action stands for it, which a chain that does not cover the goal never gives.
            row["approval"] = await by_approval(w, approver, kind)
            approval_want = expected(blocked, "none" if kind == "owner-other-goal" else kind, reserved)
            table[kind] = row
            assert row == {"intent": want, "tool.execute": want, "a2a": want, "approval": approval_want}, (
                kind,
                row,
            )
        assert table  # every case was driven through every path
