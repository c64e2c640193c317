"""Shared pieces for the approval tests: a calendar-like agent on a real server, raw sessions.

``start_desk`` serves :func:`build_desk` under uvicorn on 127.0.0.1 with an injected clock,
a ``MemoryStore`` and an ``Auditor`` with a ``MemoryAuditSink`` (so every audit record goes
through the real record checks), and yields the attack suite's ``Wire`` for it: raw
handshakes, signed intents and ``Wire.expect``. ``register_desk`` is an ``A2A_SECURE_APP``
target for server subprocesses: the executor INCRs a Redis key, so runs are counted across
processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
from attack_helpers import ExampleMethod, Wire

from a2a_secure import NeedsApproval
from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.approval import ActionContext, ApprovalSettings
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app

MARKER = "MARKER-approval-data-never-logged"
POLICY = Policy.build(blocked=["blocked"], rate_limit=100_000, session_timeout=900)
EVENT_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "guests": {"type": "array", "items": {"type": "string"}}},
    "required": ["title"],
}


def fixed_identity(name: str) -> Identity:
    """A reproducible identity per name."""
    return Identity.from_seed(hashlib.sha256(b"approval-tests:" + name.encode()).digest(), name)


PERSON = fixed_identity("person")  # approves every action of the desk
MAIL_OFFICER = fixed_identity("mail-officer")  # approves send_mail only
CALLER = fixed_identity("assistant")  # asks for actions, approves nothing


def register_actions(
    server: AgentServer,
    calls: Counter[str],
    *,
    mail_approvers: list[str],
    event_approvers: list[str] | None = None,
) -> None:
    """The desk's goals: create_event, send_mail and post need approval; echo and blocked do not."""

    @server.intent("create_event", description="Create an event and invite guests", input_schema=EVENT_SCHEMA)
    def create_event(inputs: dict[str, Any]) -> NeedsApproval:
        calls["create_event"] += 1
        return NeedsApproval(inputs, preview=f"Create {inputs.get('title')!r}")

    @server.approved_action("create_event", approvers=event_approvers)
    async def run_create(data: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        calls["run:create_event"] += 1
        return {"created": data, "approver": ctx.approver_did, "caller": ctx.caller_did}

    @server.intent("send_mail")
    async def send_mail(inputs: dict[str, Any]) -> NeedsApproval:
        calls["send_mail"] += 1
        return NeedsApproval({"mail": inputs}, preview="Send a mail", action="mail.send")

    @server.approved_action("mail.send", approvers=mail_approvers)
    def run_mail(data: dict[str, Any]) -> dict[str, Any]:
        calls["run:mail.send"] += 1
        return {"sent": True}

    @server.intent("post")
    def post(inputs: dict[str, Any]) -> NeedsApproval:
        # The caller's words as they are: a preview may quote anything a caller sent.
        calls["post"] += 1
        return NeedsApproval(inputs, preview=f"Post {inputs.get('text')}")

    @server.approved_action("post")
    def run_post(data: dict[str, Any]) -> dict[str, Any]:
        calls["run:post"] += 1
        return {"posted": data}

    @server.intent("refuse")
    def refuse(inputs: dict[str, Any]) -> dict[str, Any]:
        raise InvalidParams(f"refused: {inputs.get('why')}")  # the caller's words, as they are

    @server.intent("orphan")
    def orphan(inputs: dict[str, Any]) -> NeedsApproval:
        calls["orphan"] += 1
        return NeedsApproval(inputs, preview="nobody runs this", action="unregistered")

    @server.intent("echo", description="Echo the inputs")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["echo"] += 1
        return {"echo": inputs}

    @server.intent("blocked")
    async def blocked(inputs: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - policy forbids
        calls["blocked"] += 1
        return {}


def build_desk(
    *,
    clock: FakeClock,
    sink: MemoryAuditSink,
    calls: Counter[str],
    policy: Policy = POLICY,
    settings: ApprovalSettings | None = None,
    approvers: tuple[str, ...] = (PERSON.did,),
    identity: Identity | None = None,
    store: Store | None = None,
    limits: ServerLimits | None = None,
    delegation: DelegationRules | None = None,
    event_approvers: list[str] | None = None,
) -> AgentServer:
    """The desk agent: approvals by ``approvers``, tools on, counting handlers and executors
    (delegation chains accepted with ``delegation``; ``event_approvers``: create_event's own)."""
    server = AgentServer(
        identity or Identity.generate("desk"),
        policy,
        name="desk",
        url="http://127.0.0.1",
        store=store if store is not None else MemoryStore(),
        audit=Auditor([sink], role="server"),
        clock=clock,
        monotonic=clock.monotonic,
        approvers=approvers,
        approval=settings,
        serve_tools=True,
        limits=limits,
        delegation=delegation,
    )
    register_actions(server, calls, mail_approvers=[MAIL_OFFICER.did], event_approvers=event_approvers)
    return server


@contextlib.asynccontextmanager
async def start_desk(
    *,
    policy: Policy = POLICY,
    settings: ApprovalSettings | None = None,
    approvers: tuple[str, ...] = (PERSON.did,),
    identity: Identity | None = None,
    store: Store | None = None,
    limits: ServerLimits | None = None,
    delegation: DelegationRules | None = None,
    event_approvers: list[str] | None = None,
) -> AsyncIterator[Wire]:
    """The desk on 127.0.0.1, as a ``Wire`` (its ``calls`` count handlers and executors)."""
    clock = FakeClock(float(int(time.time())))
    sink = MemoryAuditSink()
    calls: Counter[str] = Counter()
    server = build_desk(
        clock=clock,
        sink=sink,
        calls=calls,
        policy=policy,
        settings=settings,
        approvers=approvers,
        identity=identity,
        store=store,
        limits=limits,
        delegation=delegation,
        event_approvers=event_approvers,
    )
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=15) as http:
        yield Wire(server, url, http, clock, sink, calls, ExampleMethod())


def actions(w: Wire) -> dict[str, Any]:
    """The stored actions, comparable."""
    return dict(w.store._actions)


def approval(sess: ClientSession, action_id: str, action_hash: str, approved: Any = True) -> PreparedRequest:
    """A signed ``tool.approve`` request."""
    inputs = {"action_id": action_id, "action_hash": action_hash, "approved": approved}
    return sess.prepare_intent({"goal": "tool.approve", "inputs": inputs})


async def ask(w: Wire, sess: ClientSession, goal: str = "create_event", **inputs: Any) -> dict[str, Any]:
    """An honest request for an action: its verified needs_approval result."""
    result = (await w.intent(sess, goal, **inputs)).result
    assert result["needs_approval"] is True, result
    return dict(result)


async def refused(
    w: Wire,
    sess: ClientSession,
    goal: str,
    inputs: Any,
    status: int,
    code: int,
    *,
    records: int = 2,
    ran: str | None = None,
) -> dict[str, Any]:
    """Send one signed intent that must be refused with a signed error and change nothing.

    Nothing: no stored action changes, no handler or executor runs (but the handler ``ran``,
    when given, which runs once before its answer is refused); the audit log gets the
    refusal's records (``action_refused`` and the intent's own). Returns the error object.
    """
    before = actions(w)
    req = sess.prepare_intent({"goal": goal, "inputs": inputs})
    if ran is None:
        error = await w.expect(w.send(req), status, code, signed=True, state=False, records=records)
    else:
        calls = Counter(w.calls)
        calls[ran] += 1
        resp = await w.send(req)
        assert resp.status_code == status, resp.text
        error = resp.json()["error"]
        assert error["code"] == code, error
        assert w.calls == calls
    assert sess.error_from_reply(req, error).signed
    assert actions(w) == before, "a refused request changed a stored action"
    return error


# -- an A2A_SECURE_APP target for server subprocesses ------------------------------------------------
APPROVER_ENV = "A2A_TEST_APPROVER_DID"
RUNS_URL_ENV = "A2A_TEST_COUNTER_URL"
RUNS_KEY_ENV = "A2A_TEST_COUNTER_KEY"


def register_desk(server: AgentServer) -> None:
    """``create_event`` needs approval by ``$A2A_TEST_APPROVER_DID``; each run INCRs a key."""
    import redis.asyncio as redis_asyncio
    from redis.maint_notifications import MaintNotificationsConfig

    client = redis_asyncio.Redis.from_url(
        os.environ[RUNS_URL_ENV],
        socket_timeout=30.0,  # a loaded machine: a handler's count must not fail the run
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    key = os.environ[RUNS_KEY_ENV]
    server.approvals.approvers = [os.environ[APPROVER_ENV]]

    @server.intent("create_event")
    def create_event(inputs: dict[str, Any]) -> NeedsApproval:
        return NeedsApproval(inputs, preview=f"Create {inputs.get('title')!r}")

    @server.approved_action("create_event")
    async def run_create(data: dict[str, Any]) -> dict[str, Any]:
        runs = await client.incr(key)
        return {"created": data, "pid": os.getpid(), "runs": runs}
