"""What the approval engine records when an approved action does not finish (PROTOCOL.md §12).

The engine (a2a_secure.protocol.approval) decides and never waits: the action runs inside
the tool.approve handler, under the runner's deadline. When that deadline (or a shutdown)
cancels the action, its audit record says -32049; when the action raises, -32603.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from a2a_secure.errors import IntentTimeout, InternalError
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.approval import ActionContext, ApprovalEngine, NeedsApproval
from a2a_secure.store.memory import MemoryStore

SERVER = Identity.generate("calendar")
CALLER = Identity.generate("assistant")
PERSON = Identity.generate("person")


async def _approve_running(executor: Any) -> tuple[asyncio.Task[Any], list[dict[str, Any]]]:
    """An engine whose one action, once approved, runs ``executor``; the approval's task."""
    records: list[dict[str, Any]] = []
    engine = ApprovalEngine(
        server_did=SERVER.did,
        store=MemoryStore(),
        approvers=[PERSON.did],
        audit=lambda **record: records.append(record),
    )
    engine.register("create_event", executor)
    offer = await engine.create(
        NeedsApproval({"title": "standup"}, preview="Create standup"),
        goal="create_event",
        caller_did=CALLER.did,
        session_id="s1",
        sequence=1,
    )
    inputs = {"action_id": offer["action_id"], "action_hash": offer["action_hash"], "approved": True}
    task = asyncio.create_task(engine.approve(inputs, approver=PERSON.did, session_id="s2", sequence=1))
    return task, records


def _failures(records: list[dict[str, Any]]) -> list[Any]:
    return [r["error_code"] for r in records if r["event"] == "action_failed"]


async def test_an_action_cancelled_while_it_runs_is_recorded_as_timed_out() -> None:
    started = asyncio.Event()

    async def never_ends(data: Any, context: ActionContext) -> Any:
        started.set()
        await asyncio.Event().wait()

    task, records = await _approve_running(never_ends)
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _failures(records) == [IntentTimeout.code]
    assert [r["event"] for r in records] == ["action_created", "action_approved", "action_failed"]


async def test_an_action_that_raises_is_recorded_as_an_internal_error() -> None:
    async def fails(data: Any, context: ActionContext) -> Any:
        raise RuntimeError("calendar down")

    task, records = await _approve_running(fails)
    with pytest.raises(RuntimeError):
        await task
    assert _failures(records) == [InternalError.code]
