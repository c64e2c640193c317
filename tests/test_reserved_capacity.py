"""Capacity strangers cannot exhaust (a2a_secure/protocol/capacity.py, SECURITY.md "Reserved
capacity"), on a real server over HTTP, with the MemoryStore and with Redis.

Fresh did:keys cost nothing, so a flood of them fills every bound the callers share:
pending handshakes, sessions, remembered intent_ids, actions waiting for approval. A share
of each is kept for the callers the operator names; the strangers' refusals say which pool
is full (``data.pool``: "shared", or "own" for a caller over its own quota), and a named
caller still opens a session, claims an intent_id and asks for an approval.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis_helpers
from approval_helpers import PERSON, start_desk
from attack_helpers import Wire, WireFlow
from redis_helpers import redis_url  # noqa: F401  (fixture)

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import Unavailable
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.approval import ApprovalSettings
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.run import load_scheduling
from a2a_secure.store.memory import MemoryStore

RESERVED = Identity.generate("reserved-caller")
# Each shared bound is 8; half of it is kept for the named callers: strangers share 4.
LIMITS = ServerLimits(
    max_pending_total=8,
    max_pending_per_source=100,
    max_sessions=8,
    max_intent_ids_total=8,
    max_intent_ids_per_did=3,
    reserved_callers=frozenset({RESERVED.did}),
    reserved_share=0.5,
)
SETTINGS = ApprovalSettings(max_total=8, max_per_caller=2)


@pytest.fixture(params=["memory", "redis"])
async def desk(request: pytest.FixtureRequest) -> AsyncIterator[Wire]:
    if request.param == "memory":
        async with start_desk(store=MemoryStore(), limits=LIMITS, settings=SETTINGS) as w:
            yield w
        return
    url: str = request.getfixturevalue("redis_url")
    from a2a_secure.store.redis import RedisStore

    prefix = f"a2a-test:{uuid.uuid4().hex}:"
    store = RedisStore(url, prefix=prefix, finish_linger=None)
    try:
        async with start_desk(store=store, limits=LIMITS, settings=SETTINGS) as w:
            yield w
    finally:
        await store.aclose()
        redis_helpers.delete_prefix(url, prefix)


def stranger(i: int) -> Identity:
    return Identity.generate(f"stranger-{i}")


def full(resp: Any, pool: str) -> None:
    """A 503 -32048 whose data names ``pool`` beside a retry_after."""
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == -32048
    assert error["data"]["pool"] == pool, error
    assert error["data"]["retry_after"] >= 1


async def with_id(w: Wire, sess: ClientSession) -> Any:
    req = sess.prepare_intent({"goal": "echo", "inputs": {}, "intent_id": uuid.uuid4().hex})
    return await w.send(req)


async def ask(w: Wire, sess: ClientSession) -> Any:
    return await w.send(sess.prepare_intent({"goal": "create_event", "inputs": {"title": "x"}}))


async def test_a_flood_of_strangers_leaves_the_named_callers_their_share(desk: Wire) -> None:
    w = desk
    # Sessions: four strangers fill the shared pool; the fifth is refused at ACCEPT_POLICY.
    sessions = [await w.open_session(stranger(i)) for i in range(4)]
    fifth = await (await WireFlow(w, stranger(4)).start()).prove()
    full(await w.rpc("accept_policy", fifth.accept_msg), "shared")
    # Pending handshakes: the fifth one's is still held; three more fill the pool of four.
    for i in range(5, 8):
        await WireFlow(w, stranger(i)).start()
    full(await w.rpc("hello", w.handshake(stranger(8)).hello()), "shared")
    # Intent ids: a stranger over its own quota of 3, then the shared pool of 4.
    for _ in range(3):
        assert (await with_id(w, sessions[0])).status_code == 200
    full(await with_id(w, sessions[0]), "own")
    assert (await with_id(w, sessions[1])).status_code == 200
    full(await with_id(w, sessions[2]), "shared")
    # Actions waiting for approval: a caller's own 2, then the shared pool of 4.
    for _ in range(2):
        assert (await ask(w, sessions[0])).status_code == 200
    full(await ask(w, sessions[0]), "own")
    for _ in range(2):
        assert (await ask(w, sessions[1])).status_code == 200
    full(await ask(w, sessions[2]), "shared")

    # The named caller still gets through every bound.
    mine = await w.open_session(RESERVED)
    resp = await with_id(w, mine)
    assert resp.status_code == 200, resp.text
    resp = await ask(w, mine)
    assert resp.status_code == 200, resp.text
    assert resp.json()["result"]["status"] == "success"
    # So does an approver the agent names, and it approves the named caller's action.
    approver = await w.open_session(PERSON)
    assert (await w.intent(approver, "echo")).result == {"echo": {}}
    # A stranger is still refused; the client's error names the pool.
    full(await w.rpc("hello", w.handshake(stranger(10)).hello()), "shared")
    async with A2AClient(stranger(11), retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(Unavailable) as refused:
            await client.handshake(w.did, endpoint=w.url)
    assert refused.value.pool == "shared" and refused.value.retry_after >= 1


def test_the_policy_file_names_reserved_callers(tmp_path: Any) -> None:
    path = tmp_path / "policy.json"
    path.write_text(f'{{"reserved_callers": ["{RESERVED.did}"], "reserved_share": 0.25}}')
    _, limits = load_scheduling(path)
    assert limits.reserved_callers == frozenset({RESERVED.did}) and limits.reserved_share == 0.25
    path.write_text('{"reserved_callers": ["not a did"]}')
    with pytest.raises(ValueError, match="reserved caller is not a DID"):
        load_scheduling(path)
    path.write_text('{"reserved_share": 1}')
    with pytest.raises(ValueError, match="reserved_share"):
        load_scheduling(path)


def test_a_strangers_share_is_split_in_shards_as_the_whole_bound() -> None:
    # On a spread Redis Cluster a bound is split in shards by its size: a stranger's share
    # must land in the same shards as a named caller's entries, holding less of each.
    from a2a_secure.protocol.capacity import Reserved, limit_for
    from a2a_secure.store import redis_cluster as rc

    reserved = Reserved(frozenset({RESERVED.did}), {}, {}, 3, None)
    share = limit_for(10_000, stranger(0).did, reserved, 0.1)
    assert share == 9_000 and limit_for(10_000, RESERVED.did, reserved, 0.1) == 10_000
    assert rc.shards_for(share) == rc.shards_for(10_000) == 10
    assert sum(rc.shard_limit(share, 10, i) for i in range(10)) == 9_000
    assert limit_for(10_000, stranger(0).did, Reserved(frozenset(), {}, {}, 3, None), 0.1) == 10_000
