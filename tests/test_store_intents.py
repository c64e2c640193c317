"""Contract of the intent-id store methods (a2a_secure/store/intents.py), for every store.

The same tests run on ``MemoryStore`` and ``RedisStore`` on one Redis, behind Sentinel and
spread over a Redis Cluster (``store_factory`` of test_store_contract.py; on the cluster the
claim is made by the DID's script in the same round trip as the session's, with
compensations: test_store_cluster_claims.py): the claim is decided in the same atomic step as the sequence and
the rate limit, a FULL claim consumes nothing, an expired claim is forgotten, a running one
turns LOST past its bound, and an answer is kept only for the claim's own intent hash.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from test_store_contract import BIG, CLIENT, OTHER, T0, StoreFactory, store_factory  # noqa: F401
from test_store_contract import opened as open_session

from a2a_secure.store.base import BeginKind, StoredReply
from a2a_secure.store.intents import ClaimKind, ClaimRequest, IntentStore, supports_intent_ids

H1 = "sha256:" + "1" * 64
H2 = "sha256:" + "2" * 64
IID = "A" * 22


def claim(
    iid: str = IID, h: str = H1, *, running: int = 100, expires: int = 1000, cap: int = 5
) -> ClaimRequest:
    return ClaimRequest(iid, h, T0 + running, T0 + expires, cap, owner=secrets.token_bytes(16))


SID = ""


async def opened(store_factory: StoreFactory) -> Any:  # noqa: F811
    global SID
    store = await store_factory()
    assert supports_intent_ids(store) and isinstance(store, IntentStore)
    SID = (await open_session(store, 1, lifetime=10_000)).session_id
    return store


async def sent(store: Any) -> None:
    """Let a RedisStore send the answers it lingers on (answers reach Redis in order)."""
    flush = getattr(store, "flush", None)
    if flush is not None:
        await flush()


async def begin(
    store: Any, seq: int, c: ClaimRequest, *, sid: str = "", now: float = T0, rh: str = ""
) -> Any:
    """A begin, and the start of a claim made NEW, as the server records it before it runs."""
    b, got = await store.begin_intent(
        sid or SID,
        CLIENT.did,
        seq,
        rh or f"sha256:{seq:064x}",
        rate_limit=BIG,
        rate_period=3600,
        now=now,
        claim=c,
    )
    if b.kind is BeginKind.NEW and got is not None and got.kind is ClaimKind.NEW:
        assert await store.start_intent(CLIENT.did, c.intent_id, c.intent_hash, c.owner)
    return b, got


async def test_new_then_done_for_the_same_hash(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)
    b, c = await begin(store, 1, claim())
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.NEW
    b, c = await begin(store, 2, claim())
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING  # the sequence is consumed
    reply = StoredReply(200, result={"x": 1}, signed_at=T0)
    await store.finish_intent(CLIENT.did, IID, H1, StoredReply(200, result={"x": 2}, signed_at=T0))
    await sent(store)
    await store.finish_intent(CLIENT.did, IID, H1, reply)  # the first answer stays
    await sent(store)
    b, c = await begin(store, 3, claim())
    assert c.kind is ClaimKind.DONE and c.reply == StoredReply(200, result={"x": 2}, signed_at=T0)
    got = await store.get_claim(CLIENT.did, IID, H1, T0)
    assert got.kind is ClaimKind.DONE and got.reply is not None and got.reply.result == {"x": 2}


async def test_another_hash_conflicts_and_cannot_write_the_answer(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)
    await begin(store, 1, claim())
    _, c = await begin(store, 2, claim(h=H2))
    assert c.kind is ClaimKind.CONFLICT
    await store.finish_intent(CLIENT.did, IID, H2, StoredReply(200, result="forged"))
    await sent(store)
    assert (await store.get_claim(CLIENT.did, IID, H1, T0)).kind is ClaimKind.RUNNING
    await store.finish_intent(CLIENT.did, IID, H1, StoredReply(200, result="real"))
    await sent(store)
    assert (await store.get_claim(CLIENT.did, IID, H2, T0)).kind is ClaimKind.CONFLICT
    assert (await store.get_claim(CLIENT.did, IID, H1, T0)).reply == StoredReply(200, result="real")


async def test_running_turns_lost_past_its_bound_then_expires(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)
    await begin(store, 1, claim(running=100, expires=1000))
    assert (await store.get_claim(CLIENT.did, IID, H1, T0 + 99)).kind is ClaimKind.RUNNING
    assert (await store.get_claim(CLIENT.did, IID, H1, T0 + 100)).kind is ClaimKind.LOST
    _, c = await begin(store, 2, claim(), now=T0 + 500)
    assert c.kind is ClaimKind.LOST
    assert (await store.get_claim(CLIENT.did, IID, H1, T0 + 1000)).kind is ClaimKind.UNKNOWN
    # Expired is gone for good, even for a caller whose clock is behind.
    assert (await store.get_claim(CLIENT.did, IID, H1, T0 + 500)).kind is ClaimKind.UNKNOWN
    _, c = await begin(store, 3, claim(running=1200, expires=2000), now=T0 + 1001)
    assert c.kind is ClaimKind.NEW


async def test_only_new_requests_claim(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)
    b, c = await begin(store, 1, claim(), rh="sha256:" + "a" * 64)
    assert c.kind is ClaimKind.NEW
    await store.finish_request(SID, 1, StoredReply(200, result=1))
    b, c = await begin(store, 1, claim(iid="B" * 22), rh="sha256:" + "a" * 64)  # a byte-identical retry
    assert b.kind in (BeginKind.REPLAY, BeginKind.IN_PROGRESS) and c is None
    b, c = await begin(store, 1, claim(iid="B" * 22), rh="sha256:" + "b" * 64)  # a stale sequence
    assert b.kind is BeginKind.STALE and c is None
    b, c = await begin(store, 2, claim(iid="B" * 22), sid="g" * 43)
    assert b.kind is BeginKind.GONE and c is None
    assert (await store.get_claim(CLIENT.did, "B" * 22, H1, T0)).kind is ClaimKind.UNKNOWN


async def test_full_consumes_nothing_and_evicts_nothing(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)
    for i in range(3):
        b, c = await begin(store, i + 1, claim(iid=f"{i}" * 22, cap=3, expires=1000 + i))
        assert c.kind is ClaimKind.NEW
    b, c = await begin(store, 4, claim(iid="x" * 22, cap=3))
    assert c.kind is ClaimKind.FULL and b.kind is BeginKind.RATE_LIMITED
    assert c.retry_after == 1000 and b.last_sequence == 3
    # Not consumed: the same sequence is still new (for a known id, or without a claim).
    b, c = await begin(store, 4, claim(iid="0" * 22, cap=3))
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING
    for i in range(3):  # every claim is still there
        assert (await store.get_claim(CLIENT.did, f"{i}" * 22, H1, T0)).kind is ClaimKind.RUNNING
    # Once the oldest expires there is room.
    _, c = await begin(store, 5, claim(iid="x" * 22, cap=3, expires=3000), now=T0 + 1000)
    assert c.kind is ClaimKind.NEW


async def test_the_stores_bound_counts_every_did_and_consumes_nothing(store_factory: StoreFactory) -> None:  # noqa: F811
    # max_intent_ids_total: DIDs cost nothing, so the store bounds its ids in all.
    store = await opened(store_factory)
    other = (await open_session(store, 2, did=OTHER.did, lifetime=10_000)).session_id

    def total(iid: str, expires: int = 1000) -> ClaimRequest:
        return ClaimRequest(iid, H1, T0 + 100, T0 + expires, BIG, 2, owner=secrets.token_bytes(16))

    assert (await begin(store, 1, total("0" * 22, 1000)))[1].kind is ClaimKind.NEW
    b, c = await store.begin_intent(
        other,
        OTHER.did,
        1,
        "sha256:" + "9" * 64,
        rate_limit=BIG,
        rate_period=3600,
        now=T0,
        claim=total("1" * 22),
    )
    assert c.kind is ClaimKind.NEW
    b, c = await begin(store, 2, total("x" * 22))
    assert c.kind is ClaimKind.TOTAL_FULL and b.kind is BeginKind.RATE_LIMITED
    assert b.last_sequence == 1 and c.retry_after >= 1
    # Not consumed: the same sequence is still new for an id the store holds.
    b, c = await begin(store, 2, total("0" * 22))
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING
    # Once the oldest expires there is room.
    _, c = await begin(store, 3, total("x" * 22, 3000), now=T0 + 1000)
    assert c.kind is ClaimKind.NEW


async def test_full_does_not_count_the_rate(store_factory: StoreFactory) -> None:  # noqa: F811
    store = await opened(store_factory)

    async def go(seq: int, iid: str, c: ClaimRequest | None = None) -> Any:
        return await store.begin_intent(
            SID,
            CLIENT.did,
            seq,
            f"sha256:{seq:064x}",
            rate_limit=2,
            rate_period=3600,
            now=T0,
            claim=c or claim(iid=iid, cap=1),
        )

    first = claim(iid="a" * 22, cap=1)
    assert (await go(1, "a" * 22, first))[1].kind is ClaimKind.NEW
    assert await store.start_intent(CLIENT.did, first.intent_id, first.intent_hash, first.owner)
    assert (await go(2, "b" * 22))[1].kind is ClaimKind.FULL
    b, c = await go(2, "a" * 22)  # the refused claim did not use up the second request
    assert b.kind is BeginKind.NEW and c.kind is ClaimKind.RUNNING
    b, c = await go(3, "a" * 22)
    assert b.kind is BeginKind.RATE_LIMITED and c is None


@pytest.mark.parametrize("events", [True, False])
async def test_answers_round_trip(store_factory: StoreFactory, events: bool) -> None:  # noqa: F811
    store = await opened(store_factory)
    await begin(store, 1, claim())
    if events:
        reply = StoredReply(
            200,
            events=({"status": "success", "index": 0, "final": True, "result": {"é": [1]}},),
            truncated=True,
        )
    else:
        reply = StoredReply(504, error={"code": -32049, "message": "m", "data": {}}, signed_at=T0 + 3)
    await store.finish_intent(CLIENT.did, IID, H1, reply)
    await sent(store)
    _, c = await begin(store, 2, claim())
    assert c.kind is ClaimKind.DONE and c.reply == reply
