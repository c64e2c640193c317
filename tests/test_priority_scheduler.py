"""Intent priority without a network (PROTOCOL.md §12.3): the member, the rights, the queue's rules.

The scheduler is pure: each rule of §12.3 (order of the queue, the bound, who a priority-5
intent interrupts) is checked here on its decisions alone. The in-memory server core then
shows the rights and the shape checks end to end, with no socket.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from protocol_helpers import forge_request, make_world

from a2a_secure.errors import InvalidParams, PolicyViolation, Unavailable
from a2a_secure.protocol.models import Intent
from a2a_secure.protocol.priority import (
    INTERRUPTED_MESSAGE,
    PriorityRights,
    check_priority,
    with_priority,
)
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.protocol.server import scheduler as scheduler_module
from a2a_secure.protocol.server.scheduler import Scheduler, Ticket, TicketState

DID_A = "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
DID_B = "did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG"
BAD_PRIORITIES: list[Any] = [0, 6, -1, "5", 3.5, 5.0, True, False, None, [5], {"p": 5}]


# -- the member ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", BAD_PRIORITIES, ids=repr)
def test_a_priority_is_an_integer_from_1_to_5_and_nothing_else(value: Any) -> None:
    with pytest.raises(InvalidParams):
        check_priority(value)
    with pytest.raises(InvalidParams):
        Intent.parse({"goal": "echo", "inputs": {}, "priority": value})


@pytest.mark.parametrize("value", [1, 2, 3, 4, 5])
def test_priority_is_an_intent_member_that_round_trips(value: int) -> None:
    intent = Intent.parse({"goal": "echo", "inputs": {}, "priority": value})
    assert intent.priority == value
    assert intent.to_dict() == {"goal": "echo", "inputs": {}, "priority": value}


def test_an_intent_without_priority_stays_a_base_contract_intent() -> None:
    intent = Intent.parse({"goal": "echo", "inputs": {}})
    assert intent.priority is None
    assert "priority" not in intent.to_dict()


def test_the_client_sends_the_member_only_for_a_priority_other_than_3() -> None:
    base = {"goal": "echo", "inputs": {}}
    assert with_priority(base, None) is base
    assert with_priority(base, 3) is base
    assert with_priority(base, 5) == {**base, "priority": 5}
    assert with_priority(base, 1) == {**base, "priority": 1}
    # The intent already names one: the same is fine, another is refused, not overridden.
    assert with_priority({**base, "priority": 4}, 4) == {**base, "priority": 4}
    with pytest.raises(InvalidParams, match="the call asks for 5"):
        with_priority({**base, "priority": 4}, 5)
    for bad in BAD_PRIORITIES:
        if bad is not None:
            with pytest.raises(InvalidParams):
                with_priority(base, bad)


# -- rights ---------------------------------------------------------------------------------------
def test_rights_default_to_3_for_everyone() -> None:
    rights = PriorityRights()
    assert rights.highest(DID_A) == 3
    assert [rights.effective(p, DID_A) for p in (None, 1, 2, 3)] == [3, 1, 2, 3]
    for p in (4, 5):
        with pytest.raises(PolicyViolation, match=f"priority {p} is above this caller's highest, 3"):
            rights.effective(p, DID_A)


def test_rights_per_did_raise_or_lower_a_callers_highest() -> None:
    rights = PriorityRights(default=3, per_did={DID_A: 5, DID_B: 1})
    assert rights.effective(5, DID_A) == 5
    assert rights.effective(None, DID_A) == 3  # asking for nothing is 3, not the highest
    # A caller whose highest is below 3 is not refused for a priority it did not ask for.
    assert rights.effective(None, DID_B) == 1
    with pytest.raises(PolicyViolation):
        rights.effective(2, DID_B)


def test_rights_cannot_be_changed_behind_the_servers_back() -> None:
    per_did = {DID_A: 5}
    rights = PriorityRights(per_did=per_did)
    per_did[DID_B] = 5
    assert rights.highest(DID_B) == 3
    with pytest.raises(TypeError):
        rights.per_did[DID_B] = 5  # type: ignore[index]


@pytest.mark.parametrize(
    "config",
    [
        {"default": 6},
        {"default": "5"},
        {"default": True},
        {"per_did": {DID_A: 0}},
        {"per_did": {DID_A: 5.0}},
        {"per_did": {"not-a-did": 5}},
        {"per_did": [DID_A]},
        {"max": 5},
        [],
    ],
    ids=repr,
)
def test_bad_rights_configuration_is_refused(config: Any) -> None:
    with pytest.raises(InvalidParams):
        PriorityRights.from_dict(config)


def test_rights_configuration_round_trips() -> None:
    config = {"default": 2, "per_did": {DID_A: 5}}
    assert PriorityRights.from_dict(config).to_dict() == config
    assert PriorityRights.from_dict({}) == PriorityRights()


def test_queue_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        ServerLimits(max_concurrent_intents=0)
    with pytest.raises(ValueError):
        ServerLimits(max_queued_intents=-1)
    assert ServerLimits().max_concurrent_intents is None  # off by default


# -- the queue ------------------------------------------------------------------------------------
class Queue:
    """A scheduler with fixed bounds, tickets named by strings."""

    def __init__(self, limit: int, max_queued: int = 100) -> None:
        self.s = Scheduler()
        self.limit = limit
        self.max_queued = max_queued
        self.tickets: dict[str, Ticket] = {}

    def enter(self, name: str, priority: int) -> list[str]:
        ticket, victims = self.s.enter(priority, name, self.limit, self.max_queued)
        self.tickets[name] = ticket
        return [v.handle for v in victims]

    def leave(self, name: str) -> list[str]:
        return [t.handle for t in self.s.leave(self.tickets[name], self.limit)]

    def state(self, name: str) -> TicketState:
        return self.tickets[name].state

    def drain(self, first: str) -> list[str]:
        """Finish ``first``, then each ticket as it gets its slot: the order they ran in."""
        order: list[str] = []
        pending = [first]
        while pending:
            name = pending.pop(0)
            granted = self.leave(name)
            order.extend(granted)
            pending.extend(granted)
        return order


def test_the_scheduler_is_pure() -> None:
    tree = ast.parse(Path(scheduler_module.__file__).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "asyncio" not in names and "time" not in names


def test_with_a_free_slot_an_intent_runs_at_once() -> None:
    q = Queue(limit=2)
    assert q.enter("a", 1) == [] and q.state("a") is TicketState.RUNNING
    assert q.enter("b", 3) == [] and q.state("b") is TicketState.RUNNING
    assert q.enter("c", 4) == [] and q.state("c") is TicketState.QUEUED
    assert (q.s.running, q.s.queued) == (2, 1)


def test_waiting_intents_run_higher_priority_first_and_fifo_within_a_priority() -> None:
    q = Queue(limit=1)
    q.enter("blocker", 3)
    for name, priority in [("p2-1", 2), ("p4-1", 4), ("p1", 1), ("p2-2", 2), ("p4-2", 4), ("p3", 3)]:
        assert q.enter(name, priority) == []
    assert q.drain("blocker") == ["p4-1", "p4-2", "p3", "p2-1", "p2-2", "p1"]


def test_a_freed_slot_goes_to_the_head_of_the_queue_not_to_a_newcomer() -> None:
    q = Queue(limit=1)
    q.enter("a", 3)
    q.enter("b", 1)
    assert q.leave("a") == ["b"]
    q.enter("c", 4)  # b holds the slot now: c waits even though it outranks b
    assert q.state("c") is TicketState.QUEUED


def test_a_full_queue_refuses_and_interrupts_nothing() -> None:
    q = Queue(limit=1, max_queued=2)
    q.enter("run", 1)
    q.enter("w1", 2)
    q.enter("w2", 2)
    assert not q.s.has_room(4, q.limit, q.max_queued)
    with pytest.raises(Unavailable) as caught:
        q.enter("w3", 4)
    assert caught.value.retry_after == 1
    assert q.state("run") is TicketState.RUNNING and q.s.queued == 2


def test_a_waiting_intent_that_gives_up_leaves_the_queue() -> None:
    q = Queue(limit=1)
    q.enter("run", 3)
    q.enter("w1", 2)
    q.enter("w2", 2)
    assert q.leave("w1") == []  # its deadline passed while it waited
    assert q.state("w1") is TicketState.DONE and q.s.queued == 1
    assert q.drain("run") == ["w2"]
    assert q.leave("w1") == []  # leaving twice is harmless


def test_priority_5_interrupts_the_lowest_priority_most_recently_started() -> None:
    q = Queue(limit=3)
    q.enter("p2-old", 2)
    q.enter("p1-old", 1)
    q.enter("p1-new", 1)
    assert q.enter("five-1", 5) == ["p1-new"]
    assert q.state("p1-new") is TicketState.INTERRUPTED
    assert q.enter("five-2", 5) == ["p1-old"]
    assert q.enter("five-3", 5) == ["p2-old"]
    # The interrupted ones give their slots back once unwound, to the priority-5 intents in order.
    assert q.leave("p1-old") == ["five-1"]
    assert q.leave("p1-new") == ["five-2"]
    assert q.leave("p2-old") == ["five-3"]


def test_priority_5_interrupts_one_intent_per_priority_5_intent_waiting() -> None:
    q = Queue(limit=2)
    q.enter("low-1", 1)
    q.enter("low-2", 1)
    assert q.enter("five", 5) == ["low-2"]
    # Until low-2 has unwound, its slot counts: nothing else runs in the meantime.
    assert q.enter("p4", 4) == [] and q.state("p4") is TicketState.QUEUED
    assert q.leave("low-2") == ["five"]
    assert q.state("low-1") is TicketState.RUNNING


def test_priority_5_never_interrupts_priority_5() -> None:
    q = Queue(limit=1)
    q.enter("five-running", 5)
    assert q.enter("five-waiting", 5) == []
    assert q.state("five-running") is TicketState.RUNNING
    assert q.state("five-waiting") is TicketState.QUEUED
    assert q.drain("five-running") == ["five-waiting"]


def test_priority_5_is_let_in_past_a_full_queue_only_when_a_slot_is_freed_for_it() -> None:
    q = Queue(limit=1, max_queued=1)
    q.enter("low", 1)
    q.enter("waiting", 2)  # the queue is full
    assert q.s.has_room(5, q.limit, q.max_queued)
    assert q.enter("five-1", 5) == ["low"]
    # Nothing left to interrupt: a second priority-5 intent finds the queue full.
    assert not q.s.has_room(5, q.limit, q.max_queued)
    with pytest.raises(Unavailable):
        q.enter("five-2", 5)
    assert q.drain("low") == ["five-1", "waiting"]


# -- the server core, in memory -------------------------------------------------------------------
async def test_a_priority_above_the_callers_right_is_a_signed_policy_error_before_anything_runs() -> None:
    w = make_world(limits=ServerLimits(max_concurrent_intents=2))
    sess, _ = await w.open_session()
    req = sess.prepare_intent({"goal": "echo", "inputs": {"a": 1}, "priority": 4})
    reply = await w.call("intent", req.params)
    assert reply.http_status == 403 and reply.error is not None
    assert reply.error["code"] == -32042
    assert sess.error_from_reply(req, reply.error).signed
    assert w.handlers.calls == []
    # The sequence was used up (step 8 precedes step 9): the same request gets the same answer.
    again = await w.call("intent", req.params)
    assert again.error == reply.error


async def test_rights_set_on_a_live_server_reach_step_9() -> None:
    w = make_world()

    async def priority_of(inputs: Any, ctx: IntentContext) -> Any:
        return ctx.priority

    w.handlers.dispatcher.add("priority", priority_of)
    sess, _ = await w.open_session()
    req = sess.prepare_intent({"goal": "priority", "inputs": {}, "priority": 5})
    assert (await w.call("intent", req.params)).error["code"] == -32042  # type: ignore[index]
    w.server.priority_rights = PriorityRights(per_did={w.client_id.did: 5})
    for asked, runs_at in [(5, 5), (4, 4), (None, 3)]:
        req = sess.prepare_intent(with_priority({"goal": "priority", "inputs": {}}, asked))
        reply = await w.call("intent", req.params)
        assert reply.error is None, reply.error
        assert sess.verify_result(req, reply.result).result == runs_at


@pytest.mark.parametrize("value", BAD_PRIORITIES, ids=repr)
async def test_a_bad_priority_is_an_unsigned_shape_error_and_uses_nothing(value: Any) -> None:
    w = make_world()
    sess, _ = await w.open_session()
    bad = forge_request(sess, {"goal": "echo", "inputs": {}, "priority": value}, sequence=1)
    reply = await w.call("intent", bad.params)
    assert reply.http_status == 400 and reply.error is not None
    assert reply.error["code"] == -32602 and "data" not in reply.error
    # The same sequence still carries a good request.
    good = forge_request(sess, {"goal": "echo", "inputs": {"ok": 1}, "priority": 2}, sequence=1)
    reply = await w.call("intent", good.params)
    assert reply.error is None and reply.result["result"]["echo"] == {"ok": 1}


def test_the_interruption_message_is_the_documented_one() -> None:
    assert INTERRUPTED_MESSAGE == "interrupted by a priority-5 intent"
    doc = (Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    assert f"`{INTERRUPTED_MESSAGE}`" in doc
    assert "### 12.3 Intent priority" in doc
