"""The agent the fault campaign serves (scripts/chaos.py): every run is written down outside it.

``register`` is an ``A2A_SECURE_APP`` target (``chaos_app:register``, with ``scripts/`` on
``PYTHONPATH``). Its handlers append one JSON line per run to the ledger file
``CHAOS_LEDGER`` (``O_APPEND``, one ``write`` per line, so lines of several worker processes
never interleave and a line written survives the process's death):

* ``work`` (unary, sealed or not): ``{"kind": "run", ...}``, then it answers
  ``{"pid", "nonce"}`` (a random nonce: two runs of one id give two different answers);
* ``tally`` (streamed): the same line, then three partial results carrying one nonce;
* ``book``: the same line, then ``NeedsApproval``; its executor (approved by the DID in
  ``CHAOS_APPROVER``) appends ``{"kind": "action", "action_id", ...}``.

Each line holds the caller DID, ``intent_id``, session id and sequence of the run. A fault
the campaign planned for an intent is a file ``CHAOS_PLAN/<intent_id>`` taken (renamed) by
the worker that runs it, so it happens once: ``kill_before`` (the handler dies by SIGKILL
after its ledger line, before anything is stored), ``kill_after`` (the worker dies by SIGKILL
right after the claim's answer is stored, before it is sent), ``stop`` (the handler writes
``<intent_id>.stopped`` with its pid and stops itself with SIGSTOP; the campaign resends,
then sends SIGCONT past the claim's lease), ``slow`` (the handler sleeps 300 ms).
FOR THE FAULT CAMPAIGN ONLY.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from collections.abc import AsyncIterator
from typing import Any

from a2a_secure import NeedsApproval
from a2a_secure.protocol.approval import ActionContext
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer

LEDGER_ENV = "CHAOS_LEDGER"
PLAN_ENV = "CHAOS_PLAN"
APPROVER_ENV = "CHAOS_APPROVER"


def _append(path: str, record: dict[str, Any]) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _append_text(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _take(plan: str, intent_id: str | None) -> str:
    """The fault planned for ``intent_id`` (taken by this worker, once), or ``""``."""
    if not intent_id:
        return ""
    path = os.path.join(plan, intent_id)
    taken = f"{path}.taken.{os.getpid()}"
    try:
        os.rename(path, taken)
    except OSError:
        return ""
    with open(taken, encoding="ascii") as f:
        return f.read().strip()


def register(server: AgentServer) -> None:
    """Serve ``work``, ``tally`` and ``book`` on ``server`` (see the module documentation)."""
    ledger = os.environ[LEDGER_ENV]
    plan = os.environ[PLAN_ENV]
    approver = os.environ[APPROVER_ENV]
    kill_after: set[str] = set()

    store = server.store
    finish = getattr(store, "finish_intent", None)
    if finish is not None:

        async def finish_then_maybe_die(client_did: str, intent_id: str, *args: Any, **kw: Any) -> None:
            await finish(client_did, intent_id, *args, **kw)
            if intent_id in kill_after:  # the answer is stored and not sent: die now
                os.kill(os.getpid(), signal.SIGKILL)

        store.finish_intent = finish_then_maybe_die  # type: ignore[method-assign]

    async def ran(goal: str, context: IntentContext) -> None:
        fault = _take(plan, context.intent_id)
        _append(
            ledger,
            {
                "kind": "run",
                "goal": goal,
                "did": context.caller_did,
                "intent_id": context.intent_id,
                "session": context.session_id,
                "sequence": context.sequence,
                "pid": os.getpid(),
                "fault": fault,
            },
        )
        if fault == "kill_before":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "kill_after" and context.intent_id:
            kill_after.add(context.intent_id)
        elif fault == "stop":
            _append_text(os.path.join(plan, f"{context.intent_id}.stopped"), str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault == "slow":
            await asyncio.sleep(0.3)

    @server.intent("work")
    async def work(inputs: dict[str, Any], context: IntentContext) -> dict[str, Any]:
        await ran("work", context)
        return {"pid": os.getpid(), "nonce": secrets.token_hex(8), "n": inputs.get("n")}

    async def tally(inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        await ran("tally", context)
        nonce = secrets.token_hex(8)
        for i in range(3):
            yield {"i": i, "nonce": nonce}

    server.add_stream("tally", tally)

    @server.intent("book")
    async def book(inputs: dict[str, Any], context: IntentContext) -> NeedsApproval:
        await ran("book", context)
        return NeedsApproval({"what": inputs.get("what"), "nonce": secrets.token_hex(8)}, preview="book it")

    @server.approved_action("book", approvers=[approver])
    async def booked(data: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        _append(
            ledger,
            {"kind": "action", "action_id": ctx.action_id, "pid": os.getpid(), "approver": ctx.approver_did},
        )
        return {"booked": data, "pid": os.getpid()}
