"""Agents sharing one store: each serves only what was opened or created with it.

Several agents may share one store (one Redis, one key prefix). A session is then visible to
all of them, and so is a pending action; neither may be used at an agent other than the
one the client shook hands with (its policy and card) or the one that created the action
(its approvers and executor). Both servers run under uvicorn on 127.0.0.1.
"""

from __future__ import annotations

from approval_helpers import CALLER, PERSON, actions, approval, ask, start_desk

from a2a_secure.identity.keys import Identity
from a2a_secure.store.memory import MemoryStore


async def test_a_session_opened_with_one_agent_is_unknown_at_another_sharing_its_store() -> None:
    store = MemoryStore()
    async with (
        start_desk(identity=Identity.generate("desk-a"), store=store) as a,
        start_desk(identity=Identity.generate("desk-b"), store=store) as b,
    ):
        sess = await a.open_session(CALLER)
        req = sess.prepare_intent({"goal": "create_event", "inputs": {"title": "standup"}})
        resp = await b.send(req)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["code"] == -32043
        assert b.calls == a.calls == {}, "an intent ran at an agent the client never shook hands with"
        # The session itself is untouched: its agent still serves it, with that very sequence.
        assert (await a.send(req)).status_code == 200
        assert a.calls["create_event"] == 1


async def test_an_action_created_at_one_agent_cannot_be_approved_at_another() -> None:
    store = MemoryStore()
    async with (
        start_desk(identity=Identity.generate("desk-a"), store=store) as a,
        start_desk(identity=Identity.generate("desk-b"), store=store) as b,
    ):
        asked = await ask(a, await a.open_session(CALLER), title="standup")
        before = actions(a)
        at_b = await b.open_session(PERSON)
        req = approval(at_b, asked["action_id"], asked["action_hash"])
        resp = await b.send(req)
        assert resp.status_code == 409, resp.text
        error = resp.json()["error"]
        assert error["code"] == -32050 and "unknown action" in error["message"]
        assert at_b.error_from_reply(req, error).signed
        assert actions(a) == before, "the other agent's refusal changed the action"
        assert sum(b.calls.values()) == 0
        # Its own agent still takes the approval and runs it once.
        at_a = await a.open_session(PERSON)
        done = await a.intent(
            at_a,
            "tool.approve",
            **{"action_id": asked["action_id"], "action_hash": asked["action_hash"], "approved": True},
        )
        assert done.result["approved"] is True
