"""Intent ids on a RedisStore spread over Redis Cluster: the compensations of its decision table.

The claim contract itself runs on the cluster in test_store_intents.py. These check what
only the spread layout has (redis_cluster.py, "Intent with an intent_id"): the claim in the
DID's slot, one round trip per intent, a claim given back when its request does not run (and
only by that request: the owner token), the sequence given back when the claim is refused,
and the race where a waiting request sees a claim given back.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis as redis_sync
from cluster_helpers import LocalCluster, delete_prefix
from redis.crc import key_slot
from test_store_cluster import open_n
from test_store_contract import CLIENT, T0

from a2a_secure.errors import Unavailable
from a2a_secure.store.base import BeginKind, StoredReply
from a2a_secure.store.intents import ClaimKind, ClaimRequest, supports_intent_ids
from a2a_secure.store.redis import RedisStore

H1 = "sha256:" + "1" * 64
H2 = "sha256:" + "2" * 64
X = "X" * 22


def claim(iid: str = X, h: str = H1, *, cap: int = 100) -> ClaimRequest:
    return ClaimRequest(iid, h, T0 + 100, T0 + 1000, cap, owner=secrets.token_bytes(16))


@pytest.fixture
async def cstore(redis_cluster: LocalCluster) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_cluster.url, prefix=f"a2a-test:{uuid.uuid4().hex}:")
    assert store._spread and supports_intent_ids(store)
    try:
        yield store
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, store.prefix)


async def begin(
    store: RedisStore,
    sid: str,
    seq: int,
    c: ClaimRequest | None = None,
    *,
    rate: int | None = 1000,
    rh: str = "",
) -> Any:
    """A begin, and the start of a claim made NEW, as the server records it before it runs."""
    c = c or claim()
    b, got = await store.begin_intent(
        sid,
        CLIENT.did,
        seq,
        rh or f"sha256:{seq:064x}",
        rate_limit=rate,
        rate_period=3600,
        now=T0,
        claim=c,
    )
    if b.kind is BeginKind.NEW and got is not None and got.kind is ClaimKind.NEW:
        assert await store.start_intent(CLIENT.did, c.intent_id, c.intent_hash, c.owner)
    return b, got


async def kind_of(store: RedisStore, iid: str = X, h: str = H1) -> ClaimKind:
    return (await store.get_claim(CLIENT.did, iid, h, T0)).kind


async def rate_count(store: RedisStore) -> int:
    return int(await store.client.get(store._k_rate("", CLIENT.did, 3600, T0 - T0 % 3600)) or 0)


async def test_claims_live_in_the_dids_slot_with_its_rate_window(cstore: RedisStore) -> None:
    slot = key_slot(cstore._k_rate("", CLIENT.did, 3600, T0).encode())
    assert key_slot(cstore._k_intent("", CLIENT.did, X).encode()) == slot
    assert key_slot(cstore._k_intents("", CLIENT.did).encode()) == slot
    assert key_slot(cstore._k_revoked(CLIENT.did).encode()) == slot


async def test_an_intent_with_an_intent_id_is_a_begin_and_a_kept_answer(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    await cstore.get_session(rec.session_id, T0)
    trips = cstore.round_trips
    for seq in range(1, 21):
        iid = f"{seq:022d}"
        b, c = await begin(cstore, rec.session_id, seq, claim(iid))
        assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
        assert await cstore.get_session(rec.session_id, T0) == rec  # from the cache
        answer = StoredReply(200, {"seq": seq})
        await cstore.finish_request(rec.session_id, seq, answer)
        await cstore.finish_intent(CLIENT.did, iid, H1, answer)
    # Each begin is one round trip, and the start one (recorded before the handler runs);
    # the claim's answer is kept before finish_intent returns (the server sends the answer
    # only then), with the session's answer in the same round trip.
    assert cstore.round_trips - trips == 60
    await cstore.flush()
    got = await cstore.get_claim(CLIENT.did, f"{20:022d}", H1, T0)
    assert got.kind is ClaimKind.DONE and got.reply == StoredReply(200, {"seq": 20})
    assert await rate_count(cstore) == 20


@pytest.mark.parametrize("case", ["stale", "in_progress", "gone"])
async def test_a_request_that_does_not_run_gives_its_claim_and_count_back(
    cstore: RedisStore, case: str
) -> None:
    (rec,) = await open_n(cstore, 1)
    sid = rec.session_id
    b, c = await begin(cstore, sid, 2, claim("Y" * 22), rh=H2)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
    assert await rate_count(cstore) == 1
    if case == "stale":
        b, c = await begin(cstore, sid, 1)
    elif case == "in_progress":  # a byte-identical retry of 2, with (in a forgery) another id
        b, c = await begin(cstore, sid, 2, rh=H2)
    else:
        b, c = await begin(cstore, "g" * 43, 1)
    expected = {"stale": BeginKind.STALE, "in_progress": BeginKind.IN_PROGRESS, "gone": BeginKind.GONE}
    assert b.kind is expected[case]
    assert c is None
    assert await kind_of(cstore) is ClaimKind.UNKNOWN  # the claim made NEW is gone
    assert await rate_count(cstore) == 1  # and the count given back
    # The id is free: the client's resend claims it afresh.
    b, c = await begin(cstore, sid, 3)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW


async def test_a_request_that_does_not_run_leaves_a_claim_it_did_not_make(cstore: RedisStore) -> None:
    recs = await open_n(cstore, 2)
    b, c = await begin(cstore, recs[0].session_id, 1)
    assert c.kind is ClaimKind.NEW  # running
    b, c = await begin(cstore, recs[1].session_id, 1)
    await cstore.finish_request(recs[1].session_id, 1, StoredReply(200, {"n": 1}))
    b, c = await begin(cstore, recs[1].session_id, 1)  # replay: the claim it saw was RUNNING
    assert b.kind is BeginKind.REPLAY
    b, c = await begin(cstore, recs[1].session_id, 0)  # stale
    assert b.kind is BeginKind.STALE
    assert await kind_of(cstore) is ClaimKind.RUNNING


async def test_unclaim_deletes_only_the_owners_unanswered_claim(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    await begin(cstore, rec.session_id, 1)
    keys = [cstore._k_intent("", CLIENT.did, X), cstore._k_intents("", CLIENT.did)]
    owner = await cstore.client.hget(keys[0], "o")
    assert isinstance(owner, bytes) and len(owner) == 16

    async def unclaim(token: bytes, h: str = H1) -> int:
        args = [X, bytes.fromhex(h[7:]), token]
        return int(await cstore._script(cstore._c_unclaim, keys, args))

    # Another request's token (a retry of the same session and sequence draws its own).
    assert await unclaim(bytes(16)) == 0
    assert await unclaim(owner[:-1] + bytes([owner[-1] ^ 1])) == 0
    assert await unclaim(owner, H2) == 0
    assert await kind_of(cstore) is ClaimKind.RUNNING
    # Once the run has answered, not even its owner can take it back.
    await cstore.finish_intent(CLIENT.did, X, H1, StoredReply(200, {"ran": True}))
    await cstore.flush()
    assert await unclaim(owner) == 0
    assert await kind_of(cstore) is ClaimKind.DONE
    # Unanswered, the owner's own token deletes it, and its place in the DID's bound.
    await begin(cstore, rec.session_id, 2, claim("Z" * 22))
    owner = await cstore.client.hget(cstore._k_intent("", CLIENT.did, "Z" * 22), "o")
    keys[0] = cstore._k_intent("", CLIENT.did, "Z" * 22)
    args = ["Z" * 22, bytes.fromhex(H1[7:]), owner]
    assert await cstore._script(cstore._c_unclaim, keys, args) == 1
    assert await kind_of(cstore, "Z" * 22) is ClaimKind.UNKNOWN
    assert await cstore.client.zscore(keys[1], "Z" * 22) is None


async def test_full_gives_the_sequence_and_its_answer_back(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    sid = rec.session_id
    b, c = await begin(cstore, sid, 1, claim(cap=1))
    await cstore.finish_request(sid, 1, StoredReply(200, {"one": 1}))
    b, c = await begin(cstore, sid, 2, claim("W" * 22, cap=1))
    assert b.kind is BeginKind.RATE_LIMITED and b.last_sequence == 1
    assert c.kind is ClaimKind.FULL and c.retry_after == 1000
    assert await rate_count(cstore) == 1  # not counted
    b, _ = await begin(cstore, sid, 1)  # the previous request's answer was restored
    assert b.kind is BeginKind.REPLAY and b.reply == StoredReply(200, {"one": 1})
    b, c = await begin(cstore, sid, 2, claim(cap=1))  # and 2 is still new
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING


async def test_over_the_rate_limit_claims_nothing_and_consumes_nothing(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    assert (await begin(cstore, rec.session_id, 1, claim("V" * 22), rate=1))[1].kind is ClaimKind.NEW
    b, c = await begin(cstore, rec.session_id, 2, rate=1)
    assert b.kind is BeginKind.RATE_LIMITED and c is None
    assert await kind_of(cstore) is ClaimKind.UNKNOWN
    b, c = await begin(cstore, rec.session_id, 2, rate=2)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW


async def test_a_failed_session_script_gives_the_claim_back(cstore: RedisStore) -> None:
    # A key of the wrong type makes the session's script fail (as a node failing would):
    # the DID's script made the claim, but the request does not run.
    sid = "f" * 43
    await cstore.client.set(cstore._k_session(sid), b"not a hash")
    with pytest.raises(Unavailable):
        await begin(cstore, sid, 1)
    assert await kind_of(cstore) is ClaimKind.UNKNOWN
    assert await rate_count(cstore) == 0


async def test_a_failed_claim_script_gives_the_sequence_back(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    await cstore.client.set(cstore._k_intents("", CLIENT.did), b"not a zset")
    with pytest.raises(Unavailable):
        await begin(cstore, rec.session_id, 1)
    await cstore.client.delete(cstore._k_intents("", CLIENT.did))
    b, c = await begin(cstore, rec.session_id, 1)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW


async def test_a_revoked_did_claims_nothing(cstore: RedisStore) -> None:
    from a2a_secure.store.revocation import Revocation

    (rec,) = await open_n(cstore, 1)
    assert await cstore.add_revocation(Revocation(CLIENT.did))
    b, c = await begin(cstore, rec.session_id, 1)
    assert b.kind is BeginKind.REVOKED and c is None
    assert await kind_of(cstore) is ClaimKind.UNKNOWN
    assert await rate_count(cstore) == 0


async def test_a_request_finding_a_claim_being_given_back_takes_it_over(cstore: RedisStore) -> None:
    """A claims X NEW on a stale sequence (never started); B (another session) finds it not
    started and takes it over (NEW: B runs X); A's give-back then leaves B's claim alone."""
    s1, s2 = (r.session_id for r in await open_n(cstore, 2))
    await begin(cstore, s1, 5, claim("Q" * 22))
    reached, release = asyncio.Event(), asyncio.Event()
    quietly = cstore._quietly

    async def paused(calls: list[Any]) -> list[Any]:
        if any(script is cstore._c_unclaim for script, _, _ in calls):
            reached.set()
            await release.wait()
        return await quietly(calls)

    cstore._quietly = paused  # type: ignore[method-assign]
    a = asyncio.ensure_future(begin(cstore, s1, 3))  # stale
    await asyncio.wait_for(reached.wait(), 5)
    b, c = await begin(cstore, s2, 1)  # (the helper records B's start, as the server does)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW  # A's claim, never started
    release.set()
    b, c = await a
    assert b.kind is BeginKind.STALE and c is None
    assert await kind_of(cstore) is ClaimKind.RUNNING  # B's, started: not given back
    b, c = await begin(cstore, s2, 2)
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING


async def test_wait_replicas_refuses_an_unconfirmed_claim(redis_cluster: LocalCluster) -> None:
    prefix = f"a2a-test:{uuid.uuid4().hex}:"
    store = RedisStore(
        redis_cluster.url, prefix=prefix, wait_replicas=1, wait_timeout_ms=2000, socket_timeout=5.0
    )
    try:
        (rec,) = await open_n(store, 1)
        key = store._k_intent("", CLIENT.did, X)
        primary = redis_cluster.primary_of_slot(key_slot(key.encode()))
        replica = redis_cluster.replica_of(primary)
        # The replica of the DID's slot is frozen: the claim is not confirmed, so the
        # request is refused before its intent runs, and gives back all it wrote.
        os.kill(redis_cluster.procs[replica].pid, signal.SIGSTOP)
        try:
            with pytest.raises(Unavailable):
                await begin(store, rec.session_id, 1)
        finally:
            os.kill(redis_cluster.procs[replica].pid, signal.SIGCONT)
        assert await kind_of(store) is ClaimKind.UNKNOWN
        assert await rate_count(store) == 0
        b, c = await begin(store, rec.session_id, 1)  # the sequence was given back too
        assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
        r = redis_sync.Redis(port=replica, socket_timeout=2.0)
        try:
            r.execute_command("READONLY")
            assert r.hget(key, "h") == bytes.fromhex(H1[7:])  # on the replica when begin returned
        finally:
            r.close()
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, prefix)


# -- the store's bound on claims (ServerLimits.max_intent_ids_total) -----------------------------------
def capped(iid: str, total: int, h: str = H1) -> ClaimRequest:
    return ClaimRequest(iid, h, T0 + 100, T0 + 1000, 100, total, owner=secrets.token_bytes(16))


async def reservations(store: RedisStore) -> int:
    return int(await store.client.zcard(store._k_intents_shard(0)))


async def test_a_full_store_gives_the_sequence_count_and_claim_back(cstore: RedisStore) -> None:
    s1, s2 = (r.session_id for r in await open_n(cstore, 2))
    b, c = await begin(cstore, s1, 1, capped("A" * 22, 1))
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
    await cstore.finish_request(s1, 1, StoredReply(200, {"one": 1}))
    assert await reservations(cstore) == 1
    # The CLAIM script made "B" NEW before the reservation was refused: all of it goes back.
    b, c = await begin(cstore, s1, 2, capped("B" * 22, 1))
    assert b.kind is BeginKind.RATE_LIMITED and b.last_sequence == 1
    assert c.kind is ClaimKind.TOTAL_FULL and c.retry_after == 60
    assert await kind_of(cstore, "B" * 22) is ClaimKind.UNKNOWN
    assert await rate_count(cstore) == 1 and await reservations(cstore) == 1
    b, _ = await begin(cstore, s1, 1)  # the previous request's answer was restored
    assert b.kind is BeginKind.REPLAY and b.reply == StoredReply(200, {"one": 1})
    # An id the store holds is answered while it is full, and takes no second place.
    b, c = await begin(cstore, s2, 1, capped("A" * 22, 1))
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING
    assert await reservations(cstore) == 1


async def test_a_place_reserved_for_a_request_that_does_not_run_is_released(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    assert (await begin(cstore, rec.session_id, 3, capped("C" * 22, 5)))[0].kind is BeginKind.NEW
    b, c = await begin(cstore, rec.session_id, 2, capped("D" * 22, 5))  # stale
    assert b.kind is BeginKind.STALE and c is None
    assert await kind_of(cstore, "D" * 22) is ClaimKind.UNKNOWN
    assert await reservations(cstore) == 1  # only C's


async def test_a_failed_reservation_runs_nothing(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    await cstore.client.set(cstore._k_intents_shard(0), b"not a zset")
    with pytest.raises(Unavailable):
        await begin(cstore, rec.session_id, 1, capped("E" * 22, 5))
    assert await kind_of(cstore, "E" * 22) is ClaimKind.UNKNOWN
    assert await rate_count(cstore) == 0
    await cstore.client.delete(cstore._k_intents_shard(0))
    b, c = await begin(cstore, rec.session_id, 1, capped("E" * 22, 5))
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
