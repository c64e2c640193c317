"""Human approval before an action runs (PROTOCOL.md §12), over real HTTP.

A real ``AgentServer`` under uvicorn on 127.0.0.1 (``approval_helpers.start_desk``), raw
sessions signed by the core client, and the high-level ``A2AAgent``. Every refusal is checked
for its status and code, its signature, and that no stored action changed and nothing ran.
"""

from __future__ import annotations

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
    assert names == ["create_event", "echo", "orphan", "send_mail"]
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
async def _cli(*argv: str) -> tuple[int, str, str]:
    import asyncio
    import os
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "a2a_secure",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_approve_prints_the_preview_and_the_outcome(tmp_path: Path) -> None:
    key = tmp_path / "person.key"
    PERSON.save(key)
    async with start_desk() as w:
        caller = await w.open_session(CALLER)
        first = await ask(w, caller, title="from the command line")
        second = await ask(w, caller, title="not this one")
        base = ["approve", "--key-file", str(key), "--to", w.did, "--endpoint", w.url]
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
