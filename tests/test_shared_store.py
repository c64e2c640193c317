"""Agents sharing one store: each serves only what was opened or created with it.

Several agents may share one store (one Redis, one key prefix). A session is then visible to
all of them, and so is a pending action; neither may be used at an agent other than the
one the client shook hands with (its policy and card) or the one that created the action
(its approvers and executor). Both servers run under uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Callable

import pytest
from approval_helpers import CALLER, PERSON, POLICY, actions, approval, ask, start_desk
from attack_helpers import Wire
from protocol_helpers import resign
from redis_helpers import redis_prefix, redis_url  # noqa: F401

from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.policy import Policy
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore


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


# -- two agents on one store, over HTTP: what each key space of the store belongs to ---------------
# Each test runs on one MemoryStore shared by both servers, and on one Redis (one prefix, a
# RedisStore per server, as two processes would have). Agent A is permissive; agent B blocks
# the goal "blocked" and is the one under attack.
PERMISSIVE = Policy.build(rate_limit=100_000, session_timeout=900)
IID = "shared-store-intent-id-0001"


@pytest.fixture(params=["memory", "redis"])
def one_store(request: pytest.FixtureRequest) -> Callable[[], Store]:
    """Makes the store of each agent: the same MemoryStore, or RedisStores on one prefix."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda: shared
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    return lambda: RedisStore(url, prefix=prefix)


@contextlib.asynccontextmanager
async def two_agents(
    one_store: Callable[[], Store], limits: ServerLimits | None = None, policy: Policy = POLICY
) -> AsyncIterator[tuple[Wire, Wire]]:
    stores = [one_store(), one_store()]
    try:
        async with (
            start_desk(
                identity=Identity.generate("agent-a"), store=stores[0], policy=PERMISSIVE, limits=limits
            ) as a,
            start_desk(
                identity=Identity.generate("agent-b"), store=stores[1], policy=policy, limits=limits
            ) as b,
        ):
            yield a, b
    finally:
        for store in {id(s): s for s in stores}.values():
            await store.aclose()


async def test_a_handshake_begun_at_one_agent_cannot_be_proven_at_another(
    one_store: Callable[[], Store],
) -> None:
    async with two_agents(one_store) as (a, b):
        hs = a.handshake(CALLER)
        challenge = (await a.rpc("hello", hs.hello())).json()["result"]
        proof = hs.receive_challenge(copy.deepcopy(challenge))
        # Every value B compares is one the client signs: only the pending handshake's owner
        # tells that B never sent this CHALLENGE.
        forged = {**proof, "proof_jws": resign(proof["proof_jws"], CALLER, server_did=b.did)}
        resp = await b.rpc("proof", forged)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["code"] == -32041
        # A still completes its own handshake, and B opened nothing.
        policy = (await a.rpc("proof", proof)).json()["result"]
        accept = hs.receive_policy(copy.deepcopy(policy))
        forged_accept = {**accept, "accept_jws": resign(accept["accept_jws"], CALLER, server_did=b.did)}
        resp = await b.rpc("accept_policy", forged_accept)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == -32041, resp.text
        session = (await a.rpc("accept_policy", accept)).json()["result"]
        assert session["server_did"] == a.did
        assert sum(b.calls.values()) == 0


async def test_a_handshake_with_one_agent_cannot_open_a_session_under_another_agents_key(
    one_store: Callable[[], Store],
) -> None:
    # The attack end to end: HELLO to the permissive A; PROOF and ACCEPT_POLICY to B (signed
    # for B's DID), then the goal B's policy blocks, at B. Every step that B accepts is taken.
    async with two_agents(one_store) as (a, b):
        hs = a.handshake(CALLER)
        challenge = (await a.rpc("hello", hs.hello())).json()["result"]
        proof = hs.receive_challenge(copy.deepcopy(challenge))
        steps = [
            await b.rpc("proof", {**proof, "proof_jws": resign(proof["proof_jws"], CALLER, server_did=b.did)})
        ]
        if steps[-1].status_code == 200:
            accept = hs.receive_policy(copy.deepcopy(steps[-1].json()["result"]))
            forged = {**accept, "accept_jws": resign(accept["accept_jws"], CALLER, server_did=b.did)}
            steps.append(await b.rpc("accept_policy", forged))
        if steps[-1].status_code == 200 and len(steps) == 2:
            opened = steps[-1].json()["result"]
            session = ClientSession(
                identity=CALLER,
                server_did=b.did,
                server_kid=b.server.identity.kid,
                server_key=b.server.identity.public_key,
                session_id=opened["session_id"],
                session_commitment=opened["session_commitment"],
                policy=PERMISSIVE,
                created_at=opened["created_at"],
                expires_at=opened["expires_at"],
                clock=b.clock,
            )
            steps.append(await b.send(session.prepare_intent({"goal": "blocked", "inputs": {}})))
        assert [r.status_code for r in steps] == [401], [r.text[:200] for r in steps]
        assert steps[0].json()["error"]["code"] == -32041
        assert b.calls["blocked"] == 0, "B ran a goal its own policy blocks"


async def test_an_intent_id_used_at_one_agent_runs_at_another(one_store: Callable[[], Store]) -> None:
    async with two_agents(one_store) as (a, b):
        intent = {"goal": "echo", "inputs": {"text": "book room 4"}, "intent_id": IID}
        at_a = await a.open_session(CALLER)
        assert (await a.send(at_a.prepare_intent(intent))).status_code == 200
        at_b = await b.open_session(CALLER)
        req = at_b.prepare_intent(intent)
        resp = await b.send(req)
        assert resp.status_code == 200, resp.text
        assert at_b.verify_result(req, resp.json()["result"]).result == {"echo": {"text": "book room 4"}}
        # B's own handler ran: it did not sign A's answer as its own.
        assert a.calls["echo"] == 1 and b.calls["echo"] == 1
        # ... and the id stays exactly once at each agent.
        again = await b.open_session(CALLER)
        assert (await b.send(again.prepare_intent(intent))).status_code == 200
        assert b.calls["echo"] == 1


async def test_each_agent_keeps_its_own_rate_window_for_a_did(one_store: Callable[[], Store]) -> None:
    limited = Policy.build(blocked=["blocked"], rate_limit=2, rate_period=3600, session_timeout=900)
    async with two_agents(one_store, policy=limited) as (a, b):
        at_a = await a.open_session(CALLER)
        for n in range(3):  # A's policy allows 100 000 an hour
            await a.intent(at_a, "echo", n=n)
        at_b = await b.open_session(CALLER)
        for n in range(2):  # B's own two are still there
            await b.intent(at_b, "echo", n=n)
        req = at_b.prepare_intent({"goal": "echo", "inputs": {"n": 2}})
        resp = await b.send(req)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == -32048
        assert b.calls["echo"] == 2


async def test_each_agent_keeps_its_own_bound_of_intent_ids_per_did(one_store: Callable[[], Store]) -> None:
    async with two_agents(one_store, limits=ServerLimits(max_intent_ids_per_did=1)) as (a, b):
        at_a = await a.open_session(CALLER)
        resp = await a.send(at_a.prepare_intent({"goal": "echo", "inputs": {}, "intent_id": IID}))
        assert resp.status_code == 200
        at_b = await b.open_session(CALLER)
        other = {"goal": "echo", "inputs": {}, "intent_id": "another-intent-id-00002"}
        resp = await b.send(at_b.prepare_intent(other))
        assert resp.status_code == 200, resp.text
        assert b.calls["echo"] == 1
