"""Agents sharing one store: each serves only what was opened or created with it.

Several agents may share one store (one Redis, one key prefix). A session is then visible to
all of them, and so is a pending action; neither may be used at an agent other than the
one the client shook hands with (its policy and card) or the one that created the action
(its approvers and executor). Both servers run under uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import cluster_helpers
import pytest
from approval_helpers import CALLER, PERSON, POLICY, actions, approval, ask, start_desk
from attack_helpers import Wire
from protocol_helpers import resign
from redis_helpers import redis_prefix, redis_url  # noqa: F401
from test_store_contract import (  # noqa: F401
    BIG,
    CLIENT,
    SERVER,
    T0,
    StoreFactory,
    add,
    identity,
    pending,
    session,
    store_factory,
)

from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.store.base import BeginKind, OpenResult, SessionRecord, Store, StoredReply
from a2a_secure.store.intents import ClaimKind, ClaimRequest
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore
from a2a_secure.store.revocation import Revocation


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
        # As unknown as any other id: B says nothing of the session or of A's keys.
        assert resp.json()["error"] == {"code": -32043, "message": "unknown, expired or closed session"}
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
# Each test runs on one MemoryStore shared by both servers, on one Redis and on a Redis
# Cluster (one prefix, a RedisStore per server, as two processes would have). Agent A is
# permissive; agent B blocks the goal "blocked" and is the one under attack.
PERMISSIVE = Policy.build(rate_limit=100_000, session_timeout=900)
IID = "shared-store-intent-id-0001"


@pytest.fixture(params=["memory", "redis", "cluster"])
def one_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Store]]:
    """Makes the store of each agent: the same MemoryStore, or RedisStores on one prefix (of
    one Redis, or spread over a local Redis Cluster, tests/cluster_helpers.py)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        yield lambda: RedisStore(url, prefix=prefix)
    else:
        url = request.getfixturevalue("redis_cluster").url
        prefix = f"a2a-test:{uuid.uuid4().hex}:"
        yield lambda: RedisStore(url, prefix=prefix)
        cluster_helpers.delete_prefix(url, prefix)


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


# -- every key space of a store, with two agents on one store -----------------------------------------
# What each key space belongs to (SECURITY.md, "Agents sharing one store"): named by the
# agent (the server DID) so that another agent never finds it, or shared on purpose.
AGENT_A, AGENT_B = SERVER.did, identity("store-server-b").did
# MemoryStore's attributes: every one is in this table, so a new key space must be placed.
MEMORY_KEY_SPACES = {
    "_pending": "agent",  # (agent, nonce_b)
    "_rates": "agent",  # (agent, client DID, period)
    "_claims": "agent",  # (agent, client DID, intent_id)
    "_claims_by_did": "agent",  # (agent, client DID): the per-DID bound
    "_sessions": "record",  # random id; the record names its agent, checked at §6.1 step 2
    "_seq": "record",  # the session's
    "_actions": "record",  # random id; the record names its agent, checked before any use
    "_actions_pending": "capacity",  # per caller DID, store-wide: it only refuses
    "_pending_by_source": "capacity",
    "_claims_by_expiry": "capacity",  # the store's bound on claims
    "_revoked": "deny list",  # the operator's, for every agent of the store: it only refuses
    "_revoked_epoch": "deny list",  # moves whenever the deny list does: it names no one
    "_rates_sweep_at": "bookkeeping",
    "_by_expiry": "capacity",  # sessions by expiry: the store's bound on sessions, and the sweep
    "_pending_by_expiry": "capacity",  # pending handshakes by expiry: the store's bound on them
    "_actions_by_expiry": "capacity",  # pending actions by expiry: the store's bound on them
    "_actions_pending_total": "capacity",  # their count, store-wide: it only refuses
    "_actions_by_keep": "bookkeeping",  # when each decided action's record may be forgotten
}
# Redis keys (after the prefix) that are shared on purpose; any other key names an agent.
SHARED_REDIS_KEYS = [
    (r"\{?s:[^}]*\}?", "session: the record names its agent"),
    (r"\{?(ps:[^}]*|pa(:\d+)?|sa(:\d+)?|ix(:\d+)?)\}?", "a capacity bound of the store"),
    (r"(rv:.*|\{d:[^}]*\}:rv|rva|(\{[^}]*\}:)?rve)", "the deny list and its epoch"),
    (r"(\{act\}:)?(act:.*|actc:.*|acta)", "approval actions: the record names its agent"),
]


def claim_request(iid: str, *, per_did: int = BIG, total: int = 3) -> ClaimRequest:
    return ClaimRequest(iid, "sha256:" + iid, T0 + 100, T0 + 3600, per_did, total)


async def begin_with_id(store: Any, rec: SessionRecord, seq: int, iid: str, agent: str, **bounds: Any) -> Any:
    return await store.begin_intent(
        rec.session_id,
        rec.client_did,
        seq,
        f"sha256:{iid}-{seq}",
        rate_limit=BIG,
        rate_period=60,
        now=T0,
        claim=claim_request(iid, **bounds),
        agent=agent,
    )


async def test_every_key_space_names_its_agent_or_is_shared_on_purpose(store_factory: StoreFactory) -> None:  # noqa: F811
    store: Any = await store_factory()
    # Pending handshakes: made at A, unknown at B (get, prove, open), whole at A.
    p = dataclasses.replace(pending(1), server_did=AGENT_A)
    assert await add(store, p)
    assert await store.get_pending(p.nonce_b, T0, agent=AGENT_B) is None
    assert not await store.mark_proven(p.nonce_b, CLIENT.kid, T0, agent=AGENT_B)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0, agent=AGENT_A)
    rec_a = session(1)
    assert await store.open_session(p.nonce_b, rec_a, max_sessions=BIG, now=T0, agent=AGENT_B) is (
        OpenResult.HANDSHAKE_GONE
    )
    assert (
        await store.open_session(p.nonce_b, rec_a, max_sessions=BIG, now=T0, agent=AGENT_A)
        is OpenResult.OPENED
    )
    # One left pending at B, for the walk of the keys below.
    assert await add(store, dataclasses.replace(pending(2), server_did=AGENT_B))
    # Sessions: found by their random id everywhere; the record names the agent (§6.1 step 2).
    found = await store.get_session(rec_a.session_id, T0)
    assert found is not None and found.server_did == AGENT_A
    rec_b = dataclasses.replace(session(2), server_did=AGENT_B)
    q = dataclasses.replace(pending(3), server_did=AGENT_B)
    assert await add(store, q) and await store.mark_proven(q.nonce_b, CLIENT.kid, T0, agent=AGENT_B)
    assert (
        await store.open_session(q.nonce_b, rec_b, max_sessions=BIG, now=T0, agent=AGENT_B)
        is OpenResult.OPENED
    )
    # Rate windows: the DID's one request an hour at A leaves its one at B.
    kinds = []
    for rec, agent, seq in ((rec_a, AGENT_A, 1), (rec_a, AGENT_A, 2), (rec_b, AGENT_B, 1)):
        begun = await store.begin_request(
            rec.session_id,
            CLIENT.did,
            seq,
            f"sha256:r{seq}",
            rate_limit=1,
            rate_period=3600,
            now=T0,
            agent=agent,
        )
        kinds.append(begun.kind)
    assert kinds == [BeginKind.NEW, BeginKind.RATE_LIMITED, BeginKind.NEW]
    # Intent ids: the same id is new at each agent, and each agent's answer is its own.
    began, claimed = await begin_with_id(store, rec_a, 3, "X" * 22, AGENT_A)
    assert began.kind is BeginKind.NEW and claimed.kind is ClaimKind.NEW
    await store.finish_intent(
        CLIENT.did, "X" * 22, "sha256:" + "X" * 22, StoredReply(200, {"at": "A"}), agent=AGENT_A
    )
    began, claimed = await begin_with_id(store, rec_b, 3, "X" * 22, AGENT_B)
    assert began.kind is BeginKind.NEW and claimed.kind is ClaimKind.NEW
    seen_b = await store.get_claim(CLIENT.did, "X" * 22, "sha256:" + "X" * 22, T0, agent=AGENT_B)
    assert seen_b.kind is ClaimKind.RUNNING
    flush = getattr(store, "flush", None)
    if flush is not None:
        await flush()
    seen_a = await store.get_claim(CLIENT.did, "X" * 22, "sha256:" + "X" * 22, T0, agent=AGENT_A)
    assert seen_a.kind is ClaimKind.DONE and seen_a.reply is not None and seen_a.reply.result == {"at": "A"}
    # The per-DID bound is each agent's: A is full at one id, B still takes its second.
    _, full = await begin_with_id(store, rec_a, 4, "Y" * 22, AGENT_A, per_did=1)
    assert full.kind is ClaimKind.FULL
    _, second = await begin_with_id(store, rec_b, 4, "Y" * 22, AGENT_B, per_did=2)
    assert second.kind is ClaimKind.NEW
    # The store's bound is the store's: three claims in all, whichever agent made them.
    _, total = await begin_with_id(store, rec_a, 5, "Z" * 22, AGENT_A, total=3)
    assert total.kind is ClaimKind.TOTAL_FULL
    # The deny list is the store's: a revoked DID is refused at every agent sharing it.
    assert await store.add_revocation(Revocation(CLIENT.did))
    for rec, agent in ((rec_a, AGENT_A), (rec_b, AGENT_B)):
        begun = await store.begin_request(
            rec.session_id, CLIENT.did, 9, "sha256:rv", rate_limit=None, rate_period=60, now=T0, agent=agent
        )
        assert begun.kind is BeginKind.REVOKED
    await store.remove_revocation(CLIENT.did)
    # The walk: every key space the store holds is one of the table's.
    if isinstance(store, MemoryStore):
        assert set(vars(store)) == set(MEMORY_KEY_SPACES)
        for name, kind in MEMORY_KEY_SPACES.items():
            if kind == "agent":
                held = getattr(store, name)
                assert held and all(key[0] in (AGENT_A, AGENT_B) for key in held), name
        return
    if getattr(store, "_flushes", None):
        await asyncio.gather(*store._flushes)
    keys = await redis_keys(store)
    assert keys
    for key in keys:
        rest = key[len(store.prefix) :]
        if any(re.fullmatch(pattern, rest) for pattern, _ in SHARED_REDIS_KEYS):
            continue
        assert AGENT_A in rest or AGENT_B in rest, f"a key that names no agent: {rest}"


async def redis_keys(store: Any) -> list[str]:
    """Every key under the store's prefix, on every primary."""
    from redis.asyncio.cluster import RedisCluster

    client = store.client
    out: list[str] = []
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            out += [k.decode() async for k in client.scan_iter(match=store.prefix + "*", target_nodes=node)]
    else:
        out = [k.decode() async for k in client.scan_iter(match=store.prefix + "*")]
    return sorted(set(out))
