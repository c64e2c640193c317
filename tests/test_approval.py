"""Human approval before an action runs (PROTOCOL.md §12), over real HTTP.

A real ``AgentServer`` under uvicorn on 127.0.0.1 (``approval_helpers.start_desk``), raw
sessions signed by the core client, and the high-level ``A2AAgent``. Every refusal is checked
for its status and code, its signature, and that no stored action changed and nothing ran.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from approval_helpers import CALLER, MAIL_OFFICER, MARKER, PERSON, actions, approval, ask, refused, start_desk
from attack_helpers import Wire

from a2a_secure import A2AAgent, NeedsApproval
from a2a_secure.agent import AgentRegistry, RegistryEntry
from a2a_secure.audit import Auditor, JsonlAuditLog, verify_chain
from a2a_secure.client.approval import ActionDetails, RequestResult, as_result
from a2a_secure.errors import A2AError, ActionNotPending, AuthenticationFailed, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.approval import AUDIT_EVENTS, ApprovalSettings
from a2a_secure.store.actions import ActionState


@pytest_asyncio.fixture
async def w() -> AsyncIterator[Wire]:
    async with start_desk() as wire:
        yield wire


def events(w: Wire, prefix: str = "action_") -> list[tuple[str, str | None, int | None]]:
    return [(e.event, e.intent_goal, e.error_code) for e in w.sink.events if e.event.startswith(prefix)]


# -- creating ---------------------------------------------------------------------------------------
async def test_needs_approval_is_a_signed_result_and_the_action_is_stored_not_run(w: Wire) -> None:
    sess = await w.open_session(CALLER)
    inputs = {"title": MARKER, "guests": ["ana@example.com"]}
    result = await ask(w, sess, **inputs)
    assert set(result) == {"needs_approval", "action_id", "action_hash", "preview", "expires_at"}
    assert result["action_hash"] == encoding.hash_of(inputs)
    assert len(encoding.b64u_decode(result["action_id"])) == 16
    assert result["expires_at"] == int(w.clock()) + 900
    assert result["preview"] == f"Create {MARKER!r}"
    stored = actions(w)[result["action_id"]]
    assert stored.state is ActionState.PENDING
    assert stored.caller_did == CALLER.did and stored.action == "create_event"
    assert w.calls["create_event"] == 1 and w.calls["run:create_event"] == 0
    assert events(w) == [("action_created", "create_event", None)]
    # Neither the action's data nor its preview reach the audit log.
    assert all(MARKER not in e.to_json() for e in w.sink.events)


async def test_an_action_without_executor_fails_closed_and_stores_nothing(w: Wire) -> None:
    sess = await w.open_session(CALLER)
    req = sess.prepare_intent({"goal": "orphan", "inputs": {"x": 1}})
    resp = await w.send(req)
    assert resp.status_code == 500
    assert sess.error_from_reply(req, resp.json()["error"]).code == -32603
    assert w.calls["orphan"] == 1 and actions(w) == {} and events(w) == []


# -- approving --------------------------------------------------------------------------------------
async def test_the_approver_runs_the_stored_action_once_and_gets_its_result(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    person = await w.open_session(PERSON)
    created = await ask(w, caller, title="review")
    req = approval(person, created["action_id"], created["action_hash"])
    resp = await w.send(req)
    assert resp.status_code == 200, resp.text
    answer = person.verify_result(req, resp.json()["result"]).result
    assert answer == {
        "action_id": created["action_id"],
        "action_hash": created["action_hash"],
        "approved": True,
        "result": {"created": {"title": "review"}, "approver": PERSON.did, "caller": CALLER.did},
    }
    assert w.calls["run:create_event"] == 1
    assert actions(w)[created["action_id"]].state is ActionState.APPROVED
    assert events(w) == [
        ("action_created", "create_event", None),
        ("action_approved", "create_event", None),
        ("action_executed", "create_event", None),
    ]
    # The byte-identical retry gets the stored answer (§6.1 step 7), not a second run.
    again = await w.send(req)
    assert again.status_code == 200 and again.json()["result"] == resp.json()["result"]
    # A new approval of the same action, and a rejection after it, are refused, signed.
    inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
    error = await refused(w, person, "tool.approve", inputs, 409, -32050)
    assert error["message"] == "action is approved"
    await refused(w, person, "tool.approve", {**inputs, "approved": False}, 409, -32050)
    assert w.calls["run:create_event"] == 1


async def test_a_rejection_never_runs_and_is_final(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    person = await w.open_session(PERSON)
    created = await ask(w, caller, title="no")
    answer = await w.intent(
        person,
        "tool.approve",
        action_id=created["action_id"],
        action_hash=created["action_hash"],
        approved=False,
    )
    assert answer.result == {
        "action_id": created["action_id"],
        "action_hash": created["action_hash"],
        "approved": False,
    }
    assert actions(w)[created["action_id"]].state is ActionState.REJECTED
    inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
    error = await refused(w, person, "tool.approve", inputs, 409, -32050)
    assert error["message"] == "action is rejected"
    assert w.calls["run:create_event"] == 0
    assert ("action_rejected", "create_event", None) in events(w)


# -- bad approvals change nothing ------------------------------------------------------------------
async def test_a_wrong_hash_is_refused_and_does_not_consume_the_action(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    person = await w.open_session(PERSON)
    created = await ask(w, caller, title="real")
    other = encoding.hash_of({"title": "substituted"})
    inputs = {"action_id": created["action_id"], "action_hash": other, "approved": True}
    error = await refused(w, person, "tool.approve", inputs, 400, -32602)
    assert "action_hash" in error["message"]
    assert ("action_refused", "create_event", -32602) in events(w)
    # The person can still approve the real action.
    answer = await w.intent(
        person,
        "tool.approve",
        action_id=created["action_id"],
        action_hash=created["action_hash"],
        approved=True,
    )
    assert answer.result["approved"] is True and w.calls["run:create_event"] == 1


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"approved": "true"}, "approved"),
        ({"approved": 1}, "approved"),
        ({"approved": None}, "approved"),
        ({"extra": True}, "unexpected member"),
        ({"action_hash": "sha256:ABC"}, "action_hash"),
        ({"action_hash": 5}, "action_hash"),
        ({"action_id": "not base64url!"}, "base64url"),
        ({"action_id": "AAAA"}, "action_id"),
        ({"action_id": 7}, "action_id"),
    ],
)
async def test_malformed_approval_inputs_are_refused_and_change_nothing(
    w: Wire, change: dict[str, Any], what: str
) -> None:
    caller = await w.open_session(CALLER)
    person = await w.open_session(PERSON)
    created = await ask(w, caller, title="x")
    inputs = {
        "action_id": created["action_id"],
        "action_hash": created["action_hash"],
        "approved": True,
        **change,
    }
    error = await refused(w, person, "tool.approve", inputs, 400, -32602)
    assert what in error["message"]
    for missing in ("action_id", "action_hash", "approved"):
        partial = {k: v for k, v in inputs.items() if k != missing and k not in change}
        await refused(w, person, "tool.approve", partial, 400, -32602)
    assert actions(w)[created["action_id"]].state is ActionState.PENDING


async def test_an_unknown_action_id_is_refused(w: Wire) -> None:
    person = await w.open_session(PERSON)
    unknown = encoding.b64u_encode(bytes(16))
    inputs = {"action_id": unknown, "action_hash": encoding.hash_of({}), "approved": True}
    error = await refused(w, person, "tool.approve", inputs, 409, -32050)
    assert error["message"] == "unknown action"
    await refused(w, person, "tool.pending", {"action_id": unknown}, 409, -32050)


async def test_an_expired_action_is_refused_and_shown_expired() -> None:
    async with start_desk(settings=ApprovalSettings(ttl=60, retain=600)) as w:
        caller = await w.open_session(CALLER)
        person = await w.open_session(PERSON)
        created = await ask(w, caller, title="late")
        assert created["expires_at"] == int(w.clock()) + 60
        w.clock.advance(59)
        pending = await w.intent(person, "tool.pending", action_id=created["action_id"])
        assert pending.result["state"] == "pending"
        w.clock.advance(1)  # expires_at itself is past the offer
        inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
        error = await refused(w, person, "tool.approve", inputs, 409, -32050)
        assert error["message"] == "action is expired"
        pending = await w.intent(person, "tool.pending", action_id=created["action_id"])
        assert pending.result["state"] == "expired"
        w.clock.advance(600)  # past the time it is kept: forgotten, hence unknown
        req = approval(person, created["action_id"], created["action_hash"])
        error = await w.expect(w.send(req), 409, -32050, signed=True, state=False, records=2)
        assert error["message"] == "unknown action"
        assert actions(w) == {}
        assert w.calls["run:create_event"] == 0


async def test_only_configured_approvers_may_approve(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    created = await ask(w, caller, title="mine")
    inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
    # The caller is not an approver: its own action stays pending.
    error = await refused(w, caller, "tool.approve", inputs, 403, -32042)
    assert "approver" in error["message"]
    await refused(w, caller, "tool.pending", {"action_id": created["action_id"]}, 403, -32042)
    # An approver of another action only (send_mail's) cannot approve create_event.
    officer = await w.open_session(MAIL_OFFICER)
    await refused(w, officer, "tool.approve", inputs, 403, -32042)
    # ... and the desk's approver cannot approve send_mail, which names its own approvers.
    mail = await ask(w, caller, "send_mail", to="bob@example.com")
    person = await w.open_session(PERSON)
    mail_inputs = {"action_id": mail["action_id"], "action_hash": mail["action_hash"], "approved": True}
    await refused(w, person, "tool.approve", mail_inputs, 403, -32042)
    answer = await w.intent(officer, "tool.approve", **mail_inputs)
    assert answer.result["result"] == {"sent": True}
    assert w.calls["run:mail.send"] == 1 and w.calls["run:create_event"] == 0


async def test_pending_shows_the_stored_action_to_approvers(w: Wire) -> None:
    caller = await w.open_session(CALLER)
    person = await w.open_session(PERSON)
    created = await ask(w, caller, title="show me")
    details = (await w.intent(person, "tool.pending", action_id=created["action_id"])).result
    assert details == {
        "action_id": created["action_id"],
        "action": "create_event",
        "action_data": {"title": "show me"},
        "action_hash": created["action_hash"],
        "preview": "Create 'show me'",
        "caller_did": CALLER.did,
        "created_at": int(w.clock()),
        "expires_at": created["expires_at"],
        "state": "pending",
    }
    checked = ActionDetails.from_result(details, created["action_id"])
    assert checked.action_hash == encoding.hash_of(checked.action_data)
    lying = {**details, "action_data": {"title": "something else"}}
    with pytest.raises(AuthenticationFailed):
        ActionDetails.from_result(lying, created["action_id"])
    await refused(w, person, "tool.pending", {"action_id": created["action_id"], "x": 1}, 400, -32602)


async def test_pending_actions_are_bounded_per_caller_and_in_total() -> None:
    async with start_desk(settings=ApprovalSettings(max_per_caller=2, max_total=3)) as w:
        caller = await w.open_session(CALLER)
        other = await w.open_session(Identity.generate("other-caller"))
        person = await w.open_session(PERSON)
        first = await ask(w, caller, title="1")
        await ask(w, caller, title="2")
        error = await refused(w, caller, "create_event", {"title": "3"}, 503, -32048, ran="create_event")
        assert "too many" in error["message"]
        await ask(w, other, title="o1")
        await refused(w, other, "create_event", {"title": "o2"}, 503, -32048, ran="create_event")  # total
        # Deciding one frees its place.
        await w.intent(
            person,
            "tool.approve",
            action_id=first["action_id"],
            action_hash=first["action_hash"],
            approved=False,
        )
        await ask(w, other, title="o2")


def test_needs_approval_refuses_what_it_cannot_store() -> None:
    with pytest.raises(ValueError, match="I-JSON"):
        NeedsApproval({"x": float("nan")}, preview="")
    with pytest.raises(ValueError, match="larger"):
        NeedsApproval({"x": "a" * 70_000}, preview="")
    with pytest.raises(ValueError, match="larger"):
        NeedsApproval({}, preview="p" * 9000)
    with pytest.raises(ValueError, match="action"):
        NeedsApproval({}, preview="", action="")
    with pytest.raises(ValueError, match="positive"):
        ApprovalSettings(ttl=0)


# -- tools ------------------------------------------------------------------------------------------
async def test_card_and_tool_list_describe_the_intents(w: Wire) -> None:
    card = w.server.card
    assert card["intent_schemas"]["create_event"]["description"] == "Create an event and invite guests"
    assert card["intent_schemas"]["create_event"]["input_schema"]["required"] == ["title"]
    assert {"tool.approve", "tool.pending", "tool.list", "tool.execute"} <= set(card["intents"])
    sess = await w.open_session(CALLER)
    tools = (await w.intent(sess, "tool.list")).result["tools"]
    names = [t["name"] for t in tools]
    # Only what this session may execute: no blocked goal, no tool.* goal.
    assert names == ["create_event", "echo", "orphan", "post", "refuse", "send_mail"]
    by_name = {t["name"]: t for t in tools}
    assert by_name["create_event"]["input_schema"] == card["intent_schemas"]["create_event"]["input_schema"]
    assert by_name["echo"] == {
        "name": "echo",
        "description": "Echo the inputs",
        "input_schema": {"type": "object"},
    }
    await refused(w, sess, "tool.list", {"x": 1}, 400, -32602, records=1)


async def test_tool_execute_runs_a_tool_as_a_direct_intent(w: Wire) -> None:
    sess = await w.open_session(CALLER)
    direct = await w.intent(sess, "echo", a=1)
    via = await w.intent(sess, "tool.execute", tool="echo", arguments={"a": 1})
    assert via.result == direct.result
    created = (await w.intent(sess, "tool.execute", tool="create_event", arguments={"title": "t"})).result
    assert created["needs_approval"] is True and created["action_hash"] == encoding.hash_of({"title": "t"})


@pytest.mark.parametrize(
    ("inputs", "status", "code"),
    [
        ({"tool": "blocked", "arguments": {}}, 403, -32042),  # the session policy blocks it
        ({"tool": "tool.approve", "arguments": {}}, 403, -32042),  # never a tool.* goal
        ({"tool": "tool.execute", "arguments": {"tool": "echo", "arguments": {}}}, 403, -32042),
        ({"tool": "missing", "arguments": {}}, 404, -32601),
        ({"tool": "echo"}, 400, -32602),
        ({"tool": "echo", "arguments": {}, "extra": 1}, 400, -32602),
        ({"tool": "echo", "arguments": []}, 400, -32602),
        ({"tool": "", "arguments": {}}, 400, -32602),
    ],
)
async def test_tool_execute_refusals(w: Wire, inputs: dict[str, Any], status: int, code: int) -> None:
    sess = await w.open_session(CALLER)
    await refused(w, sess, "tool.execute", inputs, status, code, records=1)


async def test_tool_list_and_execute_follow_the_served_goals_and_the_policy() -> None:
    # PROTOCOL.md §12.2: listed = served and allowed; an undescribed goal has an empty
    # description; execute checks the policy before the handler; a streaming goal answers the
    # array of its partials.
    from a2a_secure.client.http import A2AClient
    from a2a_secure.errors import MethodNotFound
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore
    from a2a_secure.testing import serve_app

    allowed = ["plain", "ghost", "ticks", "tool.list", "tool.execute"]
    server = AgentServer(
        Identity.generate("tools"), Policy.build(allowed=allowed), store=MemoryStore(), serve_tools=True
    )
    ran: list[str] = []

    @server.intent("plain")
    async def plain(inputs: Any) -> Any:
        ran.append("plain")
        return {"got": inputs}

    @server.intent("hidden", description="served, not allowed")
    async def hidden(inputs: Any) -> Any:  # pragma: no cover - the policy forbids it
        ran.append("hidden")
        return {}

    async def ticks(inputs: Any, ctx: Any) -> AsyncIterator[Any]:
        for i in range(inputs["n"]):
            yield {"i": i}

    server.add_stream("ticks", ticks)
    async with serve_app(server.app()) as url, A2AClient(CALLER) as client:
        did = server.identity.did

        async def call(goal: str, **inputs: Any) -> Any:
            return (await client.request(did, {"goal": goal, "inputs": inputs}, endpoint=url)).result

        assert (await call("tool.list"))["tools"] == [
            {"name": "plain", "description": "", "input_schema": {"type": "object"}},
            {"name": "ticks", "description": "", "input_schema": {"type": "object"}},
        ]  # "ghost" is allowed but served by nobody, "hidden" served but not allowed
        assert await call("tool.execute", tool="plain", arguments={"a": 1}) == {"got": {"a": 1}}
        assert await call("tool.execute", tool="ticks", arguments={"n": 3}) == [{"i": 0}, {"i": 1}, {"i": 2}]
        for tool, error in (
            ("nowhere", PolicyViolation),
            ("hidden", PolicyViolation),
            ("ghost", MethodNotFound),
        ):
            with pytest.raises(error) as caught:
                await call("tool.execute", tool=tool, arguments={})
            assert caught.value.signed
    assert ran == ["plain"]


async def test_the_session_policy_must_allow_the_tool_goals_themselves() -> None:
    async with start_desk(policy=Policy.build(allowed=["echo", "create_event"])) as w:
        caller = await w.open_session(CALLER)
        person = await w.open_session(PERSON)
        created = await ask(w, caller, title="policy")
        with pytest.raises(PolicyViolation):  # the honest client does not even send it
            caller.prepare_intent({"goal": "tool.list", "inputs": {}})
        # A client that does not check: the server refuses, from the policy it signed.
        caller.policy = person.policy = Policy()
        await refused(w, caller, "tool.list", {}, 403, -32042, records=1)
        await refused(w, caller, "tool.execute", {"tool": "echo", "arguments": {}}, 403, -32042, records=1)
        inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
        await refused(w, person, "tool.approve", inputs, 403, -32042, records=1)


# -- the high-level client --------------------------------------------------------------------------
async def test_agent_request_and_approve() -> None:
    async with start_desk() as w:
        registry = AgentRegistry([RegistryEntry("desk", w.did, w.url)])
        w.clock.now = __import__("time").time()  # A2AAgent signs with the real clock
        async with (
            A2AAgent("assistant", CALLER, registry=registry) as assistant,
            A2AAgent("person", PERSON, registry=registry) as person,
        ):
            plain = await assistant.request("desk", {"goal": "echo", "inputs": {"k": "v"}})
            assert plain == {"echo": {"k": "v"}} and not plain.needs_approval and plain.action_id is None
            result = await assistant.request("desk", {"goal": "create_event", "inputs": {"title": "t"}})
            assert isinstance(result, RequestResult) and result.needs_approval
            assert result["action_id"] == result.action_id and result.preview == "Create 't'"
            assert result.action_hash == encoding.hash_of({"title": "t"})
            assert result.expires_at == result["expires_at"]
            details = await person.pending_action("desk", result.action_id)
            assert details.action_data == {"title": "t"} and details.state == "pending"
            outcome = await person.approve("desk", result.action_id)
            assert outcome.approved and outcome.details == details
            assert outcome.result == {"created": {"title": "t"}, "approver": PERSON.did, "caller": CALLER.did}
            with pytest.raises(ActionNotPending) as info:
                await person.approve("desk", result.action_id, action_hash=result.action_hash)
            assert info.value.signed and info.value.code == -32050
            with pytest.raises(PolicyViolation):
                await assistant.approve("desk", result.action_id, action_hash=result.action_hash)
            second = await assistant.request("desk", {"goal": "create_event", "inputs": {"title": "u"}})
            rejected = await person.approve(
                "desk", second.action_id, approved=False, action_hash=second.action_hash
            )
            assert not rejected.approved and rejected.result is None and rejected.details is None
        assert w.calls["run:create_event"] == 1


def test_as_result_keeps_other_values() -> None:
    assert as_result("text") == "text" and as_result([1]) == [1] and as_result(None) is None
    fake = as_result({"needs_approval": "yes", "action_id": "x"})
    assert not fake.needs_approval and fake.action_id is None


def test_approval_events_are_valid_audit_records(tmp_path: Path) -> None:
    ident = Identity.generate("desk")
    log = JsonlAuditLog(tmp_path / "a.jsonl", ident)
    auditor = Auditor([log], role="server")
    for event in AUDIT_EVENTS:
        auditor.record(event=event, status="success", verified=True, intent_goal="create_event")  # type: ignore[arg-type]
    auditor.close()
    assert verify_chain(tmp_path / "a.jsonl", public_key=ident.public_key).ok


def test_approvers_are_dids() -> None:
    from a2a_secure.server.app import AgentServer

    with pytest.raises(A2AError):
        AgentServer(Identity.generate("x"), approvers=["not a did"]).approvals  # noqa: B018
    with pytest.raises(TypeError):
        AgentServer(Identity.generate("x"), approvers="did:key:z6Mk").approvals  # noqa: B018


CALENDAR_ID = Identity.from_seed(bytes(range(32)), "calendar")


def _calendar() -> A2AAgent:
    from a2a_secure.examples import calendar_agent

    return calendar_agent.build_agent(CALENDAR_ID, approvers=[PERSON.did])


CALENDAR = _calendar()


async def test_serving_an_agent_object_keeps_its_approvals_on_the_served_store() -> None:
    from a2a_secure.protocol.server import IntentContext
    from a2a_secure.server.run import build_server
    from a2a_secure.store.memory import MemoryStore

    store = MemoryStore()
    server = build_server(CALENDAR_ID, store=store, app="test_approval:CALENDAR")
    assert server.approvals.actions == ["create_event"] and server.approvals.store is store
    assert server.approvals.approvers == {PERSON.did}
    assert {"tool.approve", "tool.pending", "create_event"} <= set(server.goals)
    assert server.card["intent_schemas"] == CALENDAR.server.card["intent_schemas"]
    event = {"title": "t", "start": "2026-03-02T10:00Z", "participants": ["a@example.com"]}
    ctx = IntentContext(CALLER.did, "sid", 1, "create_event", None, {})
    result = await server.run("create_event", event, ctx)
    assert result["needs_approval"] is True
    assert [a.action_data for a in store._actions.values()] == [event]


# -- the a2a-secure approve command ----------------------------------------------------------------
async def _cli(*argv: str, stdin: bytes | int | str | None = None) -> tuple[int, str, str]:
    """Run ``a2a-secure`` in a subprocess; stdin is /dev/null, a pipe holding ``stdin`` (bytes),
    a file descriptor (a terminal), or ``"closed"``."""
    import asyncio

    if stdin is None or stdin == "closed":
        source: Any = asyncio.subprocess.DEVNULL
    elif isinstance(stdin, bytes):
        source = asyncio.subprocess.PIPE
    else:
        source = stdin
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "a2a_secure",
        *argv,
        stdin=source,
        preexec_fn=(lambda: os.close(0)) if stdin == "closed" else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin if isinstance(stdin, bytes) else None), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _cli_on_a_terminal(*argv: str, answer: str) -> tuple[int, str, str]:
    """Run ``a2a-secure`` with a terminal (a pty) on stdin, where a person types ``answer``."""
    import pty

    person, terminal = pty.openpty()
    try:
        os.write(person, answer.encode() + b"\n")  # the line waits in the terminal until read
        return await _cli(*argv, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(person)


def _approver_argv(tmp_path: Path, w: Wire) -> list[str]:
    key = tmp_path / "person.key"
    PERSON.save(key, overwrite=True)
    return ["approve", "--key-file", str(key), "--to", w.did, "--endpoint", w.url]


def _decisions(w: Wire) -> list[str]:
    """The audit events of approvals and rejections the desk received."""
    return [e.event for e in w.sink.events if e.event in ("action_approved", "action_rejected")]


async def test_cli_approve_prints_the_preview_and_the_outcome(tmp_path: Path) -> None:
    async with start_desk() as w:
        caller = await w.open_session(CALLER)
        first = await ask(w, caller, title="from the command line")
        second = await ask(w, caller, title="not this one")
        base = [*_approver_argv(tmp_path, w), "--yes"]
        code, out, err = await _cli(*base, "--action-id", first["action_id"])
        assert code == 0, err
        assert "preview:  Create 'from the command line'" in out
        assert first["action_hash"] in out and "approved; the action ran once" in out
        assert '"title": "from the command line"' in out
        code, out, err = await _cli(*base, "--action-id", second["action_id"], "--reject")
        assert code == 0, err
        assert "rejected; the action will not run" in out
        # Errors: one clear line, exit 1, no traceback.
        code, out, err = await _cli(*base, "--action-id", first["action_id"])
        assert code == 1 and "Traceback" not in err
        assert err.strip() == "a2a-secure: error: action is approved"
        other = tmp_path / "caller.key"
        CALLER.save(other)
        code, out, err = await _cli(
            "approve", "--key-file", str(other), "--to", w.did, "--endpoint", w.url, "--action-id", "AAAA"
        )
        assert code == 1 and "Traceback" not in err and err.startswith("a2a-secure: error:")
        assert w.calls["run:create_event"] == 1


async def test_cli_approve_without_a_terminal_signs_nothing_unless_told_to(tmp_path: Path) -> None:
    # Nobody sees the action when stdin is /dev/null or a pipe: an answer in a pipe is not a
    # person's, so only --yes signs there.
    async with start_desk() as w:
        caller = await w.open_session(CALLER)
        created = await ask(w, caller, title="unseen")
        argv = [*_approver_argv(tmp_path, w), "--action-id", created["action_id"]]
        for stdin in (None, b"y\n", b"n\n", b"yes\n"):
            for extra in ([], ["--reject"]):
                code, out, err = await _cli(*argv, *extra, stdin=stdin)
                assert code == 1, (stdin, extra, out, err)
                assert err.strip() == (
                    "a2a-secure: error: stdin is not a terminal, so nobody can confirm: nothing signed"
                    " (--yes signs without asking)"
                )
                assert "Traceback" not in err
        # No stdin at all (closed): the same refusal, no traceback.
        code, out, err = await _cli(*argv, stdin="closed")
        assert code == 1 and "stdin is not a terminal" in err and "Traceback" not in err, err
        assert _decisions(w) == [] and w.calls["run:create_event"] == 0
        assert w.store._actions[created["action_id"]].state is ActionState.PENDING
        code, out, err = await _cli(*argv, "--yes")
        assert code == 0, err
        assert "approved; the action ran once" in out and '"title": "unseen"' in out
        assert _decisions(w) == ["action_approved"] and w.calls["run:create_event"] == 1


async def test_cli_approve_asks_on_the_terminal_and_signs_only_a_yes(tmp_path: Path) -> None:
    async with start_desk() as w:
        caller = await w.open_session(CALLER)
        created = await ask(w, caller, title="asked")
        argv = [*_approver_argv(tmp_path, w), "--action-id", created["action_id"]]
        for answer in ("n", "", "no", "yess", "approve"):
            code, out, err = await _cli_on_a_terminal(*argv, answer=answer)
            assert code == 1, (answer, out, err)
            assert err.strip() == "a2a-secure: error: not confirmed: nothing signed"
            # The data was shown before the question.
            shown = out.index('data:     {"title": "asked"}')
            assert shown < out.index("Approve and run this action, with the data shown above? [y/N]")
        code, out, err = await _cli_on_a_terminal(*argv, "--reject", answer="n")
        assert code == 1 and "Reject this action, with the data shown above? [y/N]" in out
        assert _decisions(w) == [] and w.calls["run:create_event"] == 0
        assert w.store._actions[created["action_id"]].state is ActionState.PENDING

        code, out, err = await _cli_on_a_terminal(*argv, answer="y")
        assert code == 0, err
        assert "approved; the action ran once" in out
        assert _decisions(w) == ["action_approved"] and w.calls["run:create_event"] == 1
        second = await ask(w, caller, title="turned down")
        code, out, err = await _cli_on_a_terminal(
            *_approver_argv(tmp_path, w), "--action-id", second["action_id"], "--reject", answer="Y"
        )
        assert code == 0, err
        assert "rejected; the action will not run" in out
        assert _decisions(w) == ["action_approved", "action_rejected"]


async def test_cli_approve_shows_what_a_caller_wrote_with_its_controls_escaped(tmp_path: Path) -> None:
    # The caller writes the preview's words (the desk quotes them as they are) and the data:
    # ESC[8m would hide the data line, CR and ESC[2K rewrite it, a newline forges a line,
    # U+202E reverses the text after it, and zero-width and tag characters hide words.
    hostile = "ok\x1b[8m\r\x1b[2K\ndata:     {}\u202e\u200b\U000e0041\x9b8m\u2028"
    to = "\u202emoc.elpmaxe@eve"
    async with start_desk() as w:
        caller = await w.open_session(CALLER)
        created = await ask(w, caller, "post", text=hostile, to=to)
        argv = [*_approver_argv(tmp_path, w), "--action-id", created["action_id"]]
        code, out, err = await _cli_on_a_terminal(*argv, answer="n")
        assert code == 1, err
        for char in ("\x1b", "\r", "\x9b", "\u202e", "\u200b", "\U000e0041", "\u2028"):
            assert char not in out, repr(char)
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines[:5]] == ["action", "preview", "data", "hash", "state"]
        assert lines[1].startswith("preview:  Post ok\\x1b[8m\\r\\x1b[2K\\ndata:     {}\\u202e\\u200b")
        # The data line is JSON that reads back to exactly the stored data.
        data = json.loads(lines[2].removeprefix("data:     "))
        assert data == {"text": hostile, "to": to}
        assert "\\u202emoc.elpmaxe@eve" in lines[2]
        assert w.calls["run:post"] == 0


async def test_cli_call_output_and_peer_error_messages_are_escaped(tmp_path: Path) -> None:
    # The agent's answer and its error messages are the peer's text.
    async with start_desk() as w:
        key = tmp_path / "caller.key"
        CALLER.save(key)
        base = ["call", "--key-file", str(key), "--to", w.did, "--endpoint", w.url]
        inputs = json.dumps({"text": "a\u009b8m\u202eb\u200bc", "\u202ekey": "\u00e9"})
        code, out, err = await _cli(*base, "--goal", "echo", "--inputs", inputs)
        assert code == 0, err
        assert not any(c in out for c in ("\x9b", "\u202e", "\u200b"))
        assert "\\u009b8m\\u202eb\\u200bc" in out and "\u00e9" in out  # readable text stays readable
        assert json.loads(out) == {"echo": json.loads(inputs)}
        # The desk's error messages quote the caller's words as they are.
        hostile = "\u202e\x1b[8m\nforged line"
        code, out, err = await _cli(*base, "--goal", "refuse", "--inputs", json.dumps({"why": hostile}))
        assert code == 1 and "Traceback" not in err
        assert err == "a2a-secure: error: refused: \\u202e\\x1b[8m\\nforged line\n"


def test_an_action_id_never_starts_with_a_dash() -> None:
    # A person types it after --action-id: a leading "-" would be read as an option.
    from a2a_secure.identity import encoding
    from a2a_secure.protocol.approval import ACTION_ID_BYTES, new_action_id

    ids = set()
    for first in range(256):
        rest = bytes(range(1, ACTION_ID_BYTES))
        action_id = new_action_id(lambda n, first=first, rest=rest: bytes([first]) + rest[: n - 1])
        assert not action_id.startswith("-"), first
        assert len(encoding.b64u_decode(action_id)) == ACTION_ID_BYTES
        ids.add(action_id)
    assert len(ids) == 256 - 4  # only the four first bytes that encode "-" meet another id
