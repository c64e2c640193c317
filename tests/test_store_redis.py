"""The Store contract, run against RedisStore and MemoryStore alike, plus Redis specifics.

Time is a fake ``now`` (T0 and offsets), passed consistently: expiry decisions use it, and
Redis TTLs (relative to it) only reclaim memory. Each Redis test gets its own key prefix,
deleted afterwards (``redis_prefix``). Without a reachable Redis the Redis half skips, or
fails under ``A2A_SECURE_REQUIRE_REDIS=1`` (see ``redis_helpers``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
from protocol_helpers import make_world
from redis_helpers import OwnedRedis, delete_prefix, redis_prefix, redis_url  # noqa: F401

from a2a_secure.errors import Unavailable
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.store.base import (
    Begin,
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    Store,
    StoredReply,
)
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore

T0 = 1_763_700_000.0
POLICY = Policy.build(allowed=["echo", "translate"], blocked=["boom"], rate_limit=5, rate_period=60)


def ident(name: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"store:" + name.encode()).digest(), name)


CLIENT = ident("client")
OTHER = ident("other")
SERVER = ident("server")


def b64(tag: str) -> str:
    return encoding.b64u_encode(hashlib.sha256(tag.encode()).digest())


def h(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


def pending(
    tag: str, *, source: str = "10.0.0.1", now: float = T0, client: Identity = CLIENT
) -> PendingHandshake:
    return PendingHandshake(
        nonce_b=b64("nb:" + tag),
        nonce_a=b64("na:" + tag),
        client_did=client.did,
        client_agent_id=client.agent_id,
        client_keys={client.kid: client.public_key},
        client_manifest_hash=h("cm"),
        server_manifest_hash=h("sm"),
        hello_hash=h("hello:" + tag),
        challenge_hash=h("challenge:" + tag),
        policy=POLICY,
        policy_hash=POLICY.hash,
        policy_signature="eyJ.eyJ.sig-" + tag,
        created_at=int(now),
        expires_at=int(now) + 60,
        source=source,
    )


def session(
    tag: str, *, now: float = T0, lifetime: int = 3600, client: Identity = CLIENT, kid: str | None = None
) -> SessionRecord:
    return SessionRecord(
        session_id=b64("sid:" + tag),
        session_commitment=h("commit:" + tag),
        client_did=client.did,
        server_did=SERVER.did,
        client_kid=kid or client.kid,
        client_key=client.public_key,
        policy=POLICY,
        created_at=int(now),
        expires_at=int(now) + lifetime,
        client_agent_id=client.agent_id,
    )


async def open_one(store: Store, tag: str, *, now: float = T0, **kw: Any) -> SessionRecord:
    """A full add → prove → open for ``tag``; the session record."""
    p = pending(tag, now=now, client=kw.get("client", CLIENT))
    assert await store.add_pending(p, max_per_source=256, max_total=10_000, now=now)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, now)
    s = session(tag, now=now, **kw)
    assert await store.open_session(p.nonce_b, s, max_sessions=100, now=now) is OpenResult.OPENED
    return s


async def begin(
    store: Store,
    s: SessionRecord,
    seq: int,
    rh: str,
    *,
    now: float = T0,
    limit: int | None = 5,
    period: int = 60,
    did: str | None = None,
) -> Begin:
    return await store.begin_request(
        s.session_id, did or s.client_did, seq, rh, rate_limit=limit, rate_period=period, now=now
    )


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    st = RedisStore(url, prefix=prefix)
    try:
        yield st
    finally:
        await st.aclose()


@pytest.fixture
async def rstore(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisStore]:  # noqa: F811
    st = RedisStore(redis_url, prefix=redis_prefix)
    try:
        yield st
    finally:
        await st.aclose()


# -- pending handshakes ---------------------------------------------------------------------------
async def test_pending_round_trip_and_expiry(store: Store) -> None:
    p = pending("a")
    assert await store.add_pending(p, max_per_source=4, max_total=10, now=T0)
    assert await store.get_pending(p.nonce_b, T0) == p
    assert await store.get_pending(p.nonce_b, T0 + 59.999) == p
    assert await store.get_pending(p.nonce_b, T0 + 60) is None  # expires_at <= now
    assert await store.get_pending(p.nonce_b, T0 + 1) is None  # gone for good
    assert not await store.mark_proven(p.nonce_b, CLIENT.kid, T0 + 1)
    assert await store.get_pending(b64("unknown"), T0) is None


async def test_pending_duplicate_nonce_refused(store: Store) -> None:
    p = pending("dup")
    assert await store.add_pending(p, max_per_source=4, max_total=10, now=T0)
    assert not await store.add_pending(p, max_per_source=4, max_total=10, now=T0 + 1)
    assert await store.get_pending(p.nonce_b, T0) == p


async def test_pending_bound_per_source_never_evicts_live(store: Store) -> None:
    for i in range(3):
        assert await store.add_pending(
            pending(f"s{i}", now=T0 + i), max_per_source=3, max_total=100, now=T0 + i
        )
    # Full for this source: refused, and every live entry is still there.
    assert not await store.add_pending(pending("s3", now=T0 + 3), max_per_source=3, max_total=100, now=T0 + 3)
    for i in range(3):
        assert await store.get_pending(pending(f"s{i}").nonce_b, T0 + 3) is not None
    assert await store.get_pending(pending("s3").nonce_b, T0 + 3) is None
    # Another source is not affected.
    other = pending("o0", source="10.0.0.2", now=T0 + 3)
    assert await store.add_pending(other, max_per_source=3, max_total=100, now=T0 + 3)
    # The first entry expires at T0+60: exactly one slot frees, no earlier.
    assert not await store.add_pending(
        pending("s4", now=T0 + 59), max_per_source=3, max_total=100, now=T0 + 59.5
    )
    assert await store.add_pending(pending("s4", now=T0 + 60), max_per_source=3, max_total=100, now=T0 + 60)
    assert not await store.add_pending(
        pending("s5", now=T0 + 60), max_per_source=3, max_total=100, now=T0 + 60
    )
    assert await store.get_pending(pending("s1").nonce_b, T0 + 60) is not None


async def test_pending_bound_total(store: Store) -> None:
    for i in range(4):
        src = f"10.1.0.{i}"
        assert await store.add_pending(pending(f"t{i}", source=src), max_per_source=10, max_total=4, now=T0)
    assert not await store.add_pending(
        pending("t4", source="10.1.0.9"), max_per_source=10, max_total=4, now=T0
    )
    assert await store.add_pending(
        pending("t4", source="10.1.0.9", now=T0 + 60), max_per_source=10, max_total=4, now=T0 + 60
    )


async def test_mark_proven_is_a_cas(store: Store) -> None:
    p = pending("prove")
    assert await store.add_pending(p, max_per_source=4, max_total=10, now=T0)
    assert not await store.mark_proven(b64("nope"), CLIENT.kid, T0)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0 + 1)
    assert not await store.mark_proven(p.nonce_b, "did:key:other#k", T0 + 2)
    got = await store.get_pending(p.nonce_b, T0 + 2)
    assert got is not None
    assert got.proven_kid == CLIENT.kid
    assert got == p.proven(CLIENT.kid)
    late = pending("late")
    assert await store.add_pending(late, max_per_source=4, max_total=10, now=T0)
    assert not await store.mark_proven(late.nonce_b, CLIENT.kid, T0 + 60)


async def test_concurrent_mark_proven_only_one_wins(store: Store) -> None:
    p = pending("race-prove")
    assert await store.add_pending(p, max_per_source=4, max_total=10, now=T0)
    results = await asyncio.gather(*(store.mark_proven(p.nonce_b, f"kid-{i}", T0) for i in range(20)))
    assert sum(results) == 1


# -- open_session ------------------------------------------------------------------------------------
async def test_open_session_requires_proven_live_pending(store: Store) -> None:
    p = pending("open")
    s = session("open")
    assert await store.open_session(p.nonce_b, s, max_sessions=10, now=T0) is OpenResult.HANDSHAKE_GONE
    assert await store.add_pending(p, max_per_source=1, max_total=10, now=T0)
    # Unproven: refused and the pending handshake is left unchanged.
    assert await store.open_session(p.nonce_b, s, max_sessions=10, now=T0) is OpenResult.HANDSHAKE_GONE
    assert await store.get_pending(p.nonce_b, T0) == p
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    assert await store.open_session(p.nonce_b, s, max_sessions=10, now=T0 + 1) is OpenResult.OPENED
    assert await store.get_session(s.session_id, T0 + 1) == s
    # Consumed: a second open fails, the pending is gone and its source slot is free again.
    assert await store.open_session(p.nonce_b, s, max_sessions=10, now=T0 + 1) is OpenResult.HANDSHAKE_GONE
    assert await store.get_pending(p.nonce_b, T0 + 1) is None
    p2 = pending("open2")
    assert await store.add_pending(p2, max_per_source=1, max_total=10, now=T0 + 1)
    # Proven but expired meanwhile.
    assert await store.mark_proven(p2.nonce_b, CLIENT.kid, T0 + 59)
    s2 = session("open2")
    assert await store.open_session(p2.nonce_b, s2, max_sessions=10, now=T0 + 60) is OpenResult.HANDSHAKE_GONE
    assert await store.get_session(s2.session_id, T0 + 60) is None


async def test_concurrent_open_session_only_one_wins(store: Store) -> None:
    p = pending("race-open")
    assert await store.add_pending(p, max_per_source=4, max_total=10, now=T0)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    results = await asyncio.gather(
        *(store.open_session(p.nonce_b, session(f"race-{i}"), max_sessions=100, now=T0) for i in range(20))
    )
    assert results.count(OpenResult.OPENED) == 1
    assert results.count(OpenResult.HANDSHAKE_GONE) == 19


async def test_session_bound_never_evicts_live(store: Store) -> None:
    s1 = await open_one(store, "b1", lifetime=100)
    s2 = await open_one(store, "b2", lifetime=200)
    p = pending("b3")
    assert await store.add_pending(p, max_per_source=10, max_total=10, now=T0)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    s3 = session("b3")
    assert await store.open_session(p.nonce_b, s3, max_sessions=2, now=T0 + 50) is OpenResult.FULL
    # FULL consumes nothing and evicts nothing.
    assert (await store.get_pending(p.nonce_b, T0 + 50)) is not None
    assert await store.get_session(s1.session_id, T0 + 50) == s1
    assert await store.get_session(s2.session_id, T0 + 50) == s2
    # s1 expires at T0+100: room for exactly one.
    assert await store.open_session(p.nonce_b, s3, max_sessions=2, now=T0 + 59) is OpenResult.FULL
    with_room = await store.open_session(p.nonce_b, session("b3", now=T0 + 59), max_sessions=2, now=T0 + 100)
    assert with_room is OpenResult.HANDSHAKE_GONE  # the pending handshake itself expired at T0+60
    p4 = pending("b4", now=T0 + 100)
    assert await store.add_pending(p4, max_per_source=10, max_total=10, now=T0 + 100)
    assert await store.mark_proven(p4.nonce_b, CLIENT.kid, T0 + 100)
    s4 = session("b4", now=T0 + 100)
    assert await store.open_session(p4.nonce_b, s4, max_sessions=2, now=T0 + 100) is OpenResult.OPENED
    assert await store.get_session(s2.session_id, T0 + 100) == s2
    p5 = pending("b5", now=T0 + 100)
    assert await store.add_pending(p5, max_per_source=10, max_total=10, now=T0 + 100)
    assert await store.mark_proven(p5.nonce_b, CLIENT.kid, T0 + 100)
    assert (
        await store.open_session(p5.nonce_b, session("b5", now=T0 + 100), max_sessions=2, now=T0 + 100)
        is OpenResult.FULL
    )


# -- sessions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kid", [None, "did:key:z6MkSomethingElse#key-1", "#frag-only"])
async def test_get_session_round_trip_and_expiry(store: Store, kid: str | None) -> None:
    s = await open_one(store, "g", lifetime=30, kid=None if kid is None else kid)
    assert await store.get_session(s.session_id, T0 + 29.9) == s
    assert await store.get_session(s.session_id, T0 + 30) is None  # now >= expires_at
    assert await store.get_session(s.session_id, T0 + 1) is None  # gone for good
    assert (await begin(store, s, 1, h("1"), now=T0 + 1)).kind is BeginKind.GONE
    assert await store.get_session(b64("unknown"), T0) is None


async def test_get_session_kid_with_did_prefix(store: Store) -> None:
    s = await open_one(store, "kid", kid=CLIENT.did + "#key-7")
    assert await store.get_session(s.session_id, T0) == s


async def test_close_session(store: Store) -> None:
    s = await open_one(store, "close")
    assert (await begin(store, s, 1, h("r1"))).kind is BeginKind.NEW
    await store.close_session(s.session_id)
    assert await store.get_session(s.session_id, T0) is None
    assert (await begin(store, s, 2, h("r2"))).kind is BeginKind.GONE
    assert (await begin(store, s, 1, h("r1"))).kind is BeginKind.GONE
    await store.close_session(s.session_id)  # idempotent
    await store.close_session(b64("never"))
    await store.finish_request(s.session_id, 1, StoredReply(200, {"x": 1}))
    assert await store.get_session(s.session_id, T0) is None


# -- begin_request / finish_request -----------------------------------------------------------------
async def test_begin_request_every_kind(store: Store) -> None:
    s = await open_one(store, "kinds")
    assert await begin(store, s, 1, h("r1")) == Begin(BeginKind.NEW, 1)
    assert await begin(store, s, 1, h("r1")) == Begin(BeginKind.IN_PROGRESS, 1)
    reply = StoredReply(200, {"status": "success", "sequence": 1, "result": {"ü": [1, 2.5, None]}})
    await store.finish_request(s.session_id, 1, reply)
    assert await begin(store, s, 1, h("r1")) == Begin(BeginKind.REPLAY, 1, reply)
    assert await begin(store, s, 1, h("other")) == Begin(BeginKind.STALE, 1)
    assert await begin(store, s, 0, h("r0")) == Begin(BeginKind.STALE, 1)
    assert await begin(store, s, 5, h("r5")) == Begin(BeginKind.NEW, 5)  # gaps are fine
    assert await begin(store, s, 3, h("r3")) == Begin(BeginKind.STALE, 5)
    assert await begin(store, s, 1, h("r1")) == Begin(BeginKind.STALE, 5)  # no longer the last
    # A new request clears the stored answer; a late finish for an older sequence is ignored.
    await store.finish_request(s.session_id, 1, reply)
    assert await begin(store, s, 5, h("r5")) == Begin(BeginKind.IN_PROGRESS, 5)
    err = StoredReply(504, None, {"code": -32049, "message": "late", "data": {"response_jws": "t"}})
    await store.finish_request(s.session_id, 5, err)
    assert await begin(store, s, 5, h("r5")) == Begin(BeginKind.REPLAY, 5, err)
    big = 2**53 - 1
    assert await begin(store, s, big, h("big")) == Begin(BeginKind.NEW, big)
    assert await begin(store, s, big, h("big")) == Begin(BeginKind.IN_PROGRESS, big)
    assert await begin(store, s, big - 1, h("x")) == Begin(BeginKind.STALE, big)
    assert (await begin(store, s, 9, h("r9"), now=T0 + 3600)).kind is BeginKind.GONE  # expired
    assert (await begin(store, s, 9, h("r9"))).kind is BeginKind.GONE  # and forgotten
    assert (
        await store.begin_request(b64("none"), CLIENT.did, 1, h("x"), rate_limit=None, rate_period=1, now=T0)
    ).kind is BeginKind.GONE


async def test_rate_limit_fixed_window_per_did(store: Store) -> None:
    a = await open_one(store, "ra")
    b = await open_one(store, "rb")  # same DID: shares the counter
    c = await open_one(store, "rc", client=OTHER)
    now = 1_763_700_030.0  # window [..00, ..60) for period 60: 30 s left
    assert (await begin(store, a, 1, h("a1"), now=now, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, b, 1, h("b1"), now=now, limit=3)).kind is BeginKind.NEW
    # Retries, stale and in-progress answers do not count.
    assert (await begin(store, a, 1, h("a1"), now=now, limit=3)).kind is BeginKind.IN_PROGRESS
    assert (await begin(store, a, 1, h("zz"), now=now, limit=3)).kind is BeginKind.STALE
    assert (await begin(store, a, 2, h("a2"), now=now + 10, limit=3)).kind is BeginKind.NEW
    limited = await begin(store, b, 2, h("b2"), now=now + 10.5, limit=3)
    assert limited == Begin(BeginKind.RATE_LIMITED, 1, retry_after=20)
    # Nothing consumed: the same request is still new after the window.
    assert (await begin(store, b, 2, h("b2"), now=now + 29, limit=3)).retry_after == 1
    assert (await begin(store, b, 2, h("b2"), now=now + 30, limit=3)) == Begin(BeginKind.NEW, 2)
    # Another DID has its own counter; rate_limit None (close) is never counted or refused.
    assert (await begin(store, c, 1, h("c1"), now=now + 10, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, a, 3, h("a3"), now=now + 31, limit=None)).kind is BeginKind.NEW
    for i in range(4, 6):
        assert (await begin(store, a, i, h(f"a{i}"), now=now + 31, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, a, 6, h("a6"), now=now + 31, limit=3)).kind is BeginKind.RATE_LIMITED
    assert (await begin(store, a, 6, h("a6"), now=now + 31, limit=None)).kind is BeginKind.NEW
    # Periods are separate counters.
    assert (await begin(store, a, 7, h("a7"), now=now + 31, limit=1, period=3600)).kind is BeginKind.NEW


async def test_50_concurrent_begins_exactly_one_new(store: Store) -> None:
    s = await open_one(store, "race")
    results = await asyncio.gather(*(begin(store, s, 1, h("same")) for _ in range(50)))
    kinds = [r.kind for r in results]
    assert kinds.count(BeginKind.NEW) == 1
    assert kinds.count(BeginKind.IN_PROGRESS) == 49
    # Same sequence, different requests: one wins, the others are stale.
    results = await asyncio.gather(*(begin(store, s, 2, h(f"d{i}")) for i in range(50)))
    kinds = [r.kind for r in results]
    assert kinds.count(BeginKind.NEW) == 1
    assert kinds.count(BeginKind.STALE) == 49


async def test_concurrent_begins_respect_the_rate_limit(store: Store) -> None:
    sessions = [await open_one(store, f"rl{i}") for i in range(10)]
    results = await asyncio.gather(*(begin(store, s, 1, h(s.session_id), limit=4) for s in sessions))
    kinds = [r.kind for r in results]
    assert kinds.count(BeginKind.NEW) == 4
    assert kinds.count(BeginKind.RATE_LIMITED) == 6


# -- Redis specifics ----------------------------------------------------------------------------------
def _keys(url: str, prefix: str) -> dict[bytes, int]:
    r = redis_sync.Redis.from_url(url)
    try:
        return {k: int(r.pttl(k)) for k in r.scan_iter(match=prefix + "*")}
    finally:
        r.close()


async def test_redis_keys_and_ttls(rstore: RedisStore, redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    now = time.time()
    p = dataclasses.replace(pending("ttl", now=now), server_did=SERVER.did)
    assert await rstore.add_pending(p, max_per_source=4, max_total=10, now=now)
    ttls = _keys(redis_url, redis_prefix)
    assert set(ttls) == {
        f"{redis_prefix}p:{p.nonce_b}:{SERVER.did}".encode(),  # the agent's handshake
        f"{redis_prefix}ps:{p.source}".encode(),
        f"{redis_prefix}pa".encode(),
    }
    # Every key is reclaimed a little after its logical expiry, none lives forever.
    assert all(0 < t <= 61_000 + 1_000 for t in ttls.values()), ttls
    assert await rstore.mark_proven(p.nonce_b, CLIENT.kid, now, agent=SERVER.did)
    s = session("ttl", now=now, lifetime=120)
    opened = await rstore.open_session(p.nonce_b, s, max_sessions=10, now=now, agent=SERVER.did)
    assert opened is OpenResult.OPENED
    ttls = _keys(redis_url, redis_prefix)
    # The pending handshake and its set memberships are gone; the source's empty set with it.
    assert set(ttls) == {f"{redis_prefix}s:{s.session_id}".encode(), f"{redis_prefix}sa".encode()}
    # Measured from ``now``: under load (pytest -n) seconds may pass between open and read.
    waited_ms = (time.time() - now) * 1000
    assert all(119_000 - waited_ms < t <= 121_000 for t in ttls.values()), ttls
    assert (await begin(rstore, s, 1, h("x"), now=now, limit=5, period=60)).kind is BeginKind.NEW
    rate = [k for k in _keys(redis_url, redis_prefix) if b":r:" in k]
    assert len(rate) == 1
    assert 0 < _keys(redis_url, redis_prefix)[rate[0]] <= 61_000
    await rstore.close_session(s.session_id)
    assert set(_keys(redis_url, redis_prefix)) == set(rate)


async def test_redis_logical_expiry_ignores_wall_clock(rstore: RedisStore) -> None:
    # A fake now far in the future: the keys are alive in Redis, the answers still expire.
    far = time.time() + 10 * 365 * 86400
    s = await open_one(rstore, "far", now=far, lifetime=10)
    assert await rstore.get_session(s.session_id, far + 9) == s
    assert await rstore.get_session(s.session_id, far + 10) is None
    assert (await begin(rstore, s, 1, h("x"), now=far + 10)).kind is BeginKind.GONE


async def test_redis_memory_per_session(rstore: RedisStore, redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    s = await open_one(rstore, "mem", kid=None)
    r = redis_sync.Redis.from_url(redis_url)
    try:
        key = f"{redis_prefix}s:{s.session_id}"
        session_bytes = int(r.memory_usage(key, samples=0) or 0)
        assert 0 < session_bytes <= 1024, session_bytes
    finally:
        r.close()


async def test_redis_get_session_cache_and_close_elsewhere(redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    a = RedisStore(redis_url, prefix=redis_prefix)
    b = RedisStore(redis_url, prefix=redis_prefix)
    uncached = RedisStore(redis_url, prefix=redis_prefix, session_cache_ttl=0)
    try:
        s = await open_one(a, "cache")
        assert await b.get_session(s.session_id, T0) == s  # fetched once ...
        trips = b.round_trips
        assert await b.get_session(s.session_id, T0) == s  # ... then served from the cache
        assert b.round_trips == trips
        assert (await begin(b, s, 1, h("1"))).kind is BeginKind.NEW
        await b.finish_request(s.session_id, 1, StoredReply(200, {"ok": True}))
        assert b.round_trips == trips + 1  # the answer goes with the next command
        # Closed on another worker: b's cache still knows the record, the begin script does not.
        await a.close_session(s.session_id)
        assert await uncached.get_session(s.session_id, T0) is None
        assert await b.get_session(s.session_id, T0) == s
        assert (await begin(b, s, 2, h("2"))).kind is BeginKind.GONE
        assert await b.get_session(s.session_id, T0) is None  # GONE evicted it
        # The cache never outlives the session's own expiry.
        s2 = await open_one(a, "cache2", lifetime=10)
        assert await b.get_session(s2.session_id, T0) == s2
        assert await b.get_session(s2.session_id, T0 + 10) is None
    finally:
        for st in (a, b, uncached):
            await st.aclose()


async def test_redis_ttl_ends_a_session_for_a_worker_whose_clock_stepped_back(rstore: RedisStore) -> None:
    """ATTACKS.md G12 across workers: Redis's own clock ends the session key.

    A worker whose wall clock stepped back still believes the session is open (its ``now`` is
    before ``expires_at``), but the key's TTL, counted by Redis from the session's lifetime,
    has run out: the authoritative check answers GONE, about a second of slack late at most.
    """
    now = float(int(time.time()))  # whole seconds, as created_at and expires_at are
    s = await open_one(rstore, "g12", now=now, lifetime=1)
    assert (await begin(rstore, s, 1, h("1"), now=now)).kind is BeginKind.NEW
    await asyncio.sleep(2.3)  # lifetime + the TTL's one second of slack, on the real clock
    stepped_back = now + 0.5  # this worker's clock: the session looks half a second old
    assert not s.expired(stepped_back)
    assert (await begin(rstore, s, 2, h("2"), now=stepped_back)).kind is BeginKind.GONE
    assert await rstore.get_session(s.session_id, stepped_back) is None


# -- answers sent with the next command (finish_linger) --------------------------------------------------
Pair = tuple[RedisStore, RedisStore]


@asynccontextmanager
async def workers(url: str, prefix: str, linger: float | None) -> AsyncIterator[Pair]:
    """Worker ``a`` with ``finish_linger=linger``, and another worker ``b``."""
    a = RedisStore(url, prefix=prefix, finish_linger=linger)
    b = RedisStore(url, prefix=prefix)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


@pytest.fixture
async def two_workers(redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:  # noqa: F811
    # ``a`` holds its answers until its next command (or a flush).
    async with workers(redis_url, redis_prefix, 60) as pair:
        yield pair


async def test_redis_answer_rides_with_the_next_command(two_workers: tuple[RedisStore, RedisStore]) -> None:
    a, b = two_workers
    s = await open_one(a, "ride")
    assert (await begin(a, s, 1, h("1"))).kind is BeginKind.NEW
    trips, commands = a.round_trips, a.commands
    reply = StoredReply(200, {"ok": 1}, signed_at=1_800_000_000)
    await a.finish_request(s.session_id, 1, reply)
    assert (a.round_trips, a.commands) == (trips, commands)  # nothing sent yet
    # Another worker sees the request still running: a retry there waits for the answer.
    assert (await begin(b, s, 1, h("1"))).kind is BeginKind.IN_PROGRESS
    # The same worker's next command carries the answer first: one round trip, two commands.
    again = await begin(a, s, 1, h("1"))
    assert again.kind is BeginKind.REPLAY and again.reply == reply
    assert (a.round_trips, a.commands) == (trips + 1, commands + 2)
    replayed = await begin(b, s, 1, h("1"))
    assert replayed.kind is BeginKind.REPLAY and replayed.reply == reply


async def test_redis_sequential_intents_cost_one_round_trip_each(
    two_workers: tuple[RedisStore, RedisStore],
) -> None:
    a, b = two_workers
    s = await open_one(a, "seq")
    trips, commands = a.round_trips, a.commands
    for seq in range(1, 21):
        assert (await begin(a, s, seq, h(str(seq)), limit=None)).kind is BeginKind.NEW
        # The begin carried the answer before it: that answer's timer had nothing left to send.
        assert a._flush_timer is None
        await a.finish_request(s.session_id, seq, StoredReply(200, {"n": seq}, signed_at=seq))
        assert a._flush_timer is not None
    assert a.round_trips - trips == 20  # each begin carried the answer before it
    assert a.commands - commands == 20 + 19
    await a.flush()  # the last answer, on its own
    assert (a.round_trips - trips, a.commands - commands) == (21, 40)
    last = await begin(b, s, 20, h("20"), limit=None)
    assert last.kind is BeginKind.REPLAY and last.reply == StoredReply(200, {"n": 20}, signed_at=20)


async def test_redis_answer_is_sent_after_the_linger(redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    async with workers(redis_url, redis_prefix, 0.01) as (a, b):
        s = await open_one(a, "linger")
        assert (await begin(a, s, 1, h("1"))).kind is BeginKind.NEW
        trips = a.round_trips
        await a.finish_request(s.session_id, 1, StoredReply(200, {"late": False}))
        deadline = time.monotonic() + 5
        while (await begin(b, s, 1, h("1"))).kind is BeginKind.IN_PROGRESS:
            assert time.monotonic() < deadline, "the answer never reached Redis"
            await asyncio.sleep(0.005)
        assert (await begin(b, s, 1, h("1"))).reply == StoredReply(200, {"late": False})
        assert a.round_trips == trips + 1


def slow_pipelines(store: RedisStore, delay: float) -> tuple[asyncio.Event, list[int]]:
    """Make ``store``'s pipelines (its answers' round trips) leave ``delay`` late, as on a slow
    link; its single commands are untouched. Returns (set when one starts, pipelines done)."""
    started = asyncio.Event()
    done: list[int] = []
    real = store._r.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real(*args, **kwargs)
        execute = pipe.execute

        async def late_execute(*a: Any, **k: Any) -> Any:
            started.set()
            await asyncio.sleep(delay)
            out = await execute(*a, **k)
            done.append(1)
            return out

        pipe.execute = late_execute
        return pipe

    store._r.pipeline = pipeline  # type: ignore[method-assign]
    return started, done


async def test_redis_a_command_does_not_overtake_an_answer_on_its_way(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    # The linger's send is on its way (on one pooled connection) when the same worker's next
    # command about that session starts: it must not reach Redis first on another connection.
    # The worker has given that answer, so a retry it gets must replay it, not see "running".
    async with workers(redis_url, redis_prefix, 0.0) as (a, b):
        s, other = await open_one(a, "inflight"), await open_one(a, "inflight-other")
        started, done = slow_pipelines(a, 0.05)
        for n in range(1, 4):
            assert (await begin(a, s, n, h(str(n)), limit=None)).kind is BeginKind.NEW
            await a.finish_request(s.session_id, n, StoredReply(200, {"n": n}, signed_at=n))
            await asyncio.wait_for(started.wait(), 5)  # the background send leaves
            started.clear()
            # A command about another session does not wait for it; one about this session does.
            assert (await begin(a, other, n, h(str(n)), limit=None)).kind is BeginKind.NEW
            assert len(done) == n - 1
            again = await begin(a, s, n, h(str(n)), limit=None)
            assert len(done) == n
            assert again.kind is BeginKind.REPLAY and again.reply == StoredReply(200, {"n": n}, signed_at=n)
        assert (await begin(b, s, 3, h("3"), limit=None)).kind is BeginKind.REPLAY


async def test_redis_without_linger_stores_before_returning(redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    async with workers(redis_url, redis_prefix, None) as (a, b):
        s = await open_one(a, "sync")
        assert (await begin(a, s, 1, h("1"))).kind is BeginKind.NEW
        trips = a.round_trips
        await a.finish_request(s.session_id, 1, StoredReply(200, {"now": True}))
        assert a.round_trips == trips + 1
        assert (await begin(b, s, 1, h("1"))).reply == StoredReply(200, {"now": True})


async def test_redis_aclose_sends_what_is_left(two_workers: tuple[RedisStore, RedisStore]) -> None:
    a, b = two_workers
    s = await open_one(a, "closing")
    assert (await begin(a, s, 1, h("1"))).kind is BeginKind.NEW
    await a.finish_request(s.session_id, 1, StoredReply(200, {"kept": True}))
    await a.aclose()
    assert (await begin(b, s, 1, h("1"))).reply == StoredReply(200, {"kept": True})


async def test_redis_pipelined_answer_survives_a_script_flush(
    two_workers: tuple[RedisStore, RedisStore],
    redis_url: str,  # noqa: F811
) -> None:
    # After SCRIPT FLUSH (as after a Redis restart) both commands of the round trip are
    # refused with NOSCRIPT: each is sent again once, after its script is loaded.
    a, b = two_workers
    s1, s2 = await open_one(a, "flush-1"), await open_one(a, "flush-2")
    assert (await begin(a, s1, 1, h("1"))).kind is BeginKind.NEW
    await a.finish_request(s1.session_id, 1, StoredReply(200, {"s": 1}))
    r = redis_sync.Redis.from_url(redis_url)
    try:
        r.script_flush()
    finally:
        r.close()
    assert (await begin(a, s2, 1, h("1"))).kind is BeginKind.NEW
    assert (await begin(b, s1, 1, h("1"))).reply == StoredReply(200, {"s": 1})
    assert (await begin(b, s2, 1, h("1"))).kind is BeginKind.IN_PROGRESS  # ran exactly once


async def test_redis_an_answer_that_fails_does_not_fail_the_command_it_rode_with(
    two_workers: Pair,
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    # A queued answer whose script fails (here its session key holds a string) is lost and
    # logged; the begin_request sent in the same round trip did run, and its outcome stands:
    # reporting 503 for it would tell the client that a consumed sequence was not.
    a, b = two_workers
    s = await open_one(a, "rides")
    broken = session("broken")
    r = redis_sync.Redis.from_url(redis_url)
    try:
        r.set(f"{redis_prefix}s:{broken.session_id}", b"not a hash")
    finally:
        r.close()
    await a.finish_request(broken.session_id, 1, StoredReply(200, {}))
    assert (await begin(a, s, 1, h("1"))).kind is BeginKind.NEW
    assert (await begin(b, s, 1, h("1"))).kind is BeginKind.IN_PROGRESS  # consumed, for everyone


async def test_redis_background_send_failure_is_quiet(tmp_path: Path) -> None:
    with OwnedRedis(tmp_path, persist=False) as server:
        st = RedisStore(server.url, prefix="bg:", socket_timeout=0.3, finish_linger=0.01)
        try:
            s = await open_one(st, "bg")
            assert (await begin(st, s, 1, h("1"))).kind is BeginKind.NEW
            server.kill()
            await st.finish_request(s.session_id, 1, StoredReply(200, {}))
            await asyncio.sleep(0.3)  # the background send fails: logged, nothing raised
            assert not st._unsent and not st._flushes
            server.start()
            s2 = await open_one(st, "bg-after")
            assert (await begin(st, s2, 1, h("1"))).kind is BeginKind.NEW
        finally:
            await st.aclose()


async def test_redis_store_from_a_given_client(redis_url: str, redis_prefix: str) -> None:  # noqa: F811
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_url)
    st = RedisStore(client=client, prefix=redis_prefix)
    try:
        s = await open_one(st, "given")
        assert (await begin(st, s, 1, h("1"))).kind is BeginKind.NEW
        await st.aclose()
        assert await client.ping()  # a given client is left open
    finally:
        await client.aclose()


# -- Redis unavailable ----------------------------------------------------------------------------------
async def _every_method(st: RedisStore, tag: str) -> list[str]:
    """Call every Store method once; the names of those that raised Unavailable."""
    failed: list[str] = []
    p = pending(tag)
    s = session(tag)
    calls: dict[str, Any] = {
        "add_pending": lambda: st.add_pending(p, max_per_source=4, max_total=10, now=T0),
        "get_pending": lambda: st.get_pending(p.nonce_b, T0),
        "mark_proven": lambda: st.mark_proven(p.nonce_b, CLIENT.kid, T0),
        "open_session": lambda: st.open_session(p.nonce_b, s, max_sessions=10, now=T0),
        "get_session": lambda: st.get_session(b64("uncached-" + tag), T0),
        "begin_request": lambda: begin(st, s, 1, h("1")),
        "finish_request": lambda: st.finish_request(s.session_id, 1, StoredReply(200, {})),
        "close_session": lambda: st.close_session(s.session_id),
    }
    for name, call in calls.items():
        try:
            await call()
        except Unavailable as exc:
            assert exc.code == -32048
            assert exc.http_status == 503
            assert exc.retry_after == 1
            assert exc.message == "shared store unavailable"
            failed.append(name)
    return failed


async def test_redis_down_then_back(tmp_path: Path) -> None:
    with OwnedRedis(tmp_path, persist=False) as server:
        st = RedisStore(server.url, prefix="down:", socket_timeout=0.5)
        try:
            assert await _every_method(st, "up") == []
            server.kill()
            started = time.monotonic()
            failed = await _every_method(st, "down")
            # finish_request only queues its answer; the next command carries it, and fails.
            assert failed == [
                "add_pending",
                "get_pending",
                "mark_proven",
                "open_session",
                "get_session",
                "begin_request",
                "close_session",
            ]
            assert time.monotonic() - started < 5  # no retry loops with backoff
            server.start()  # an empty Redis: no data, no loaded scripts (NOSCRIPT → reload)
            assert await _every_method(st, "back") == []
            s = await open_one(st, "after")
            assert (await begin(st, s, 1, h("1"))).kind is BeginKind.NEW
        finally:
            await st.aclose()


async def test_redis_hung_times_out_as_unavailable(tmp_path: Path) -> None:
    with OwnedRedis(tmp_path, persist=False) as server:
        st = RedisStore(server.url, prefix="hung:", socket_timeout=0.3, session_cache_ttl=0)
        try:
            s = await open_one(st, "hung")
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    await begin(st, s, 1, h("1"))
                with pytest.raises(Unavailable):
                    await st.get_session(s.session_id, T0)
                assert time.monotonic() - started < 3
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            # The state is intact (the timed-out begin did reach Redis or did not: either way
            # the sequence is now new or in progress, never executed twice).
            assert await st.get_session(s.session_id, T0) == s
            kind = (await begin(st, s, 1, h("1"))).kind
            assert kind in (BeginKind.NEW, BeginKind.IN_PROGRESS)
            assert (await begin(st, s, 2, h("2"))).kind is BeginKind.NEW
        finally:
            await st.aclose()


# -- the engine over an unavailable store -----------------------------------------------------------
class _FlakyStore(MemoryStore):
    """A MemoryStore whose chosen methods raise Unavailable."""

    def __init__(self) -> None:
        super().__init__()
        self.down: set[str] = set()

    def _check(self, name: str) -> None:
        if name in self.down:
            raise Unavailable("shared store unavailable", retry_after=1)

    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        self._check("get_session")
        return await super().get_session(session_id, now)

    async def begin_request(self, *args: Any, **kw: Any) -> Begin:
        self._check("begin_request")
        return await super().begin_request(*args, **kw)

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        self._check("finish_request")
        await super().finish_request(session_id, sequence, reply)

    async def add_pending(self, *args: Any, **kw: Any) -> bool:
        self._check("add_pending")
        return await super().add_pending(*args, **kw)


async def test_engine_answers_503_when_the_store_is_down() -> None:
    w = make_world()
    flaky = _FlakyStore()
    w.store = flaky
    w.server.store = flaky
    sess, hs = await w.open_session()
    # Handshake step: unsigned 503 with Retry-After.
    flaky.down = {"add_pending"}
    r = await w.call("hello", w.handshake().hello())
    assert (r.http_status, r.error and r.error["code"], r.retry_after) == (503, -32048, 1)
    assert "response_jws" not in (r.error or {}).get("data", {})
    # Step 2 (session look-up): unsigned 503.
    flaky.down = {"get_session"}
    req = sess.prepare_intent({"goal": "echo", "inputs": {"a": 1}})
    r = await w.call("intent", req.params)
    assert (r.http_status, r.error and r.error["code"], r.retry_after) == (503, -32048, 1)
    # Steps 7-8: a signed 503, nothing consumed.
    flaky.down = {"begin_request"}
    r = await w.call("intent", req.params)
    assert (r.http_status, r.error and r.error["code"], r.retry_after) == (503, -32048, 1)
    assert "response_jws" in r.error["data"]
    assert w.handlers.count("echo") == 0
    # finish_request fails after the handler ran: the answer is still sent.
    flaky.down = {"finish_request"}
    r = await w.call("intent", req.params)
    assert r.http_status == 200, r.error
    assert sess.verify_result(req, r.result)["result"]["echo"] == {"a": 1}
    assert w.handlers.count("echo") == 1
    # Nothing was stored: a byte-identical retry is "in progress" until the engine gives up.
    flaky.down = set()
    w.server.limits = dataclasses.replace(w.server.limits, replay_wait_seconds=0.0)
    r = await w.call("intent", req.params)
    assert (r.http_status, r.error and r.error["code"]) == (503, -32048)
    assert w.handlers.count("echo") == 1
    del hs


async def test_cleanup_helper_deletes_prefix(redis_url: str) -> None:  # noqa: F811
    r = redis_sync.Redis.from_url(redis_url)
    try:
        r.set("a2a-test:cleanup-check:x", b"1")
        assert delete_prefix(redis_url, "a2a-test:cleanup-check:") == 1
        assert not r.exists("a2a-test:cleanup-check:x")
    finally:
        r.close()


# -- URLs with a password ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://default:s3cr/et@localhost:6379/0",  # an unencoded "/" ends the host part early
        "redis://:s3cr3t#x@localhost:6379",
        "rediss://u:s3cr3t?@localhost:6379",
        "redis://u:pw@localhost:6379/s3cr3t",
        "redis://u:pw@localhost:99999",
        "redis://u:s3cr3t@[::1",
        "redis://u:pw@localhost:6379/0?socket_timeout=s3cr3t",
    ],
)
def test_a_plain_redis_url_error_never_quotes_its_text(url: str) -> None:
    from a2a_secure.store.redis import RedisStore

    with pytest.raises(ValueError) as info:
        RedisStore(url)
    assert "s3cr" not in str(info.value) and "cannot be read" in str(info.value)


def test_revoke_with_a_malformed_redis_url_is_one_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    from a2a_secure.cli import main

    code = main(["revoke", "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
                 "--redis-url", "redis://default:s3cr/et@localhost:6379/0"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("a2a-secure: error: the Redis URL cannot be read") and err.count("\n") == 1
    assert "s3cr" not in err and "Traceback" not in err
