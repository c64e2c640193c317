"""Contract tests of the ``Store`` interface (a2a_secure/store/base.py).

Every store implementation must pass the same suite: the tests use only the interface (no
internals), and each one creates its stores through the ``store_factory`` fixture, which
is parametrised over ``STORE_FACTORIES`` (the memory store, RedisStore on one Redis, on a
local Redis Cluster, tests/cluster_helpers.py, and on a primary found through local
sentinels, tests/sentinel_helpers.py): an async callable
that returns a fresh, empty store; the fixture closes every store it made and deletes the
Redis keys of its prefix.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import cluster_helpers
import pytest
import redis_helpers
from protocol_helpers import identity

from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.store.base import (
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    Store,
    StoredReply,
)
from a2a_secure.store.memory import MemoryStore

StoreFactory = Callable[[], Awaitable[Store]]


async def _memory_store() -> Store:
    return MemoryStore()


async def _redis_store() -> Store:
    # Skips with the reason when Redis is absent, fails instead under A2A_SECURE_REQUIRE_REDIS=1.
    why = redis_helpers.ping(redis_helpers.REDIS_URL)
    if why is not None:
        redis_helpers.skip_or_fail(f"Redis at {redis_helpers.REDIS_URL} is unreachable: {why}")
    from a2a_secure.store.redis import RedisStore

    return RedisStore(redis_helpers.REDIS_URL, prefix=f"a2a-test:{uuid.uuid4().hex}:")


async def _cluster_store() -> Store:
    raise AssertionError("made by store_factory, which needs the redis_cluster fixture")


async def _sentinel_store() -> Store:
    raise AssertionError("made by store_factory, which needs the redis_sentinel fixture")


# One entry per implementation: the same contract holds for every store.
STORE_FACTORIES: list[Any] = [
    pytest.param(_memory_store, id="memory"),
    pytest.param(_redis_store, id="redis"),
    pytest.param(_cluster_store, id="cluster"),
    pytest.param(_sentinel_store, id="sentinel"),
]

T0 = 1_763_700_000  # a multiple of 60 and of 3600
CLIENT = identity("store-client")
OTHER = identity("store-other")
SERVER = identity("store-server")
BIG = 1_000_000


@pytest.fixture(params=STORE_FACTORIES)
async def store_factory(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    made: list[Store] = []
    factory: StoreFactory = request.param
    # Deletes the keys of a prefix wherever the stores of this param keep them.
    delete_prefix: Callable[[str], int] = functools.partial(
        redis_helpers.delete_prefix, redis_helpers.REDIS_URL
    )
    if factory is _cluster_store or factory is _sentinel_store:
        from a2a_secure.store.redis import RedisStore

        if factory is _cluster_store:
            # A local Redis Cluster (tests/cluster_helpers.py), started once per test session.
            url = request.getfixturevalue("redis_cluster").url
            delete_prefix = functools.partial(cluster_helpers.delete_prefix, url)
        else:
            # A primary, its replica and three sentinels (tests/sentinel_helpers.py), once per
            # session; nothing kills its primary, so keys are deleted there directly.
            sentinels = request.getfixturevalue("redis_sentinel")
            url = sentinels.url
            delete_prefix = functools.partial(
                redis_helpers.delete_prefix, sentinels.url_of(sentinels.first_primary)
            )
        prefix = f"a2a-test:{uuid.uuid4().hex}:"

        async def on_deployment() -> Store:
            return RedisStore(url, prefix=prefix)

        factory = on_deployment

    async def make() -> Store:
        store = await factory()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()
        prefix = getattr(store, "prefix", None)
        if isinstance(prefix, str) and prefix.startswith("a2a-test:"):
            delete_prefix(prefix)


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    return await store_factory()


def _n(i: int) -> str:
    """A distinct 32-byte base64url value."""
    return encoding.b64u_encode(i.to_bytes(4, "big") * 8)


def pending(
    i: int = 1, *, source: str = "s", created_at: int = T0, proven_kid: str | None = None
) -> PendingHandshake:
    return PendingHandshake(
        nonce_b=_n(i),
        nonce_a=_n(10_000 + i),
        client_did=CLIENT.did,
        client_agent_id="store-client",
        client_keys={CLIENT.kid: CLIENT.public_key},
        client_manifest_hash=encoding.hash_of({"c": i}),
        server_manifest_hash=encoding.hash_of({"s": 1}),
        hello_hash=encoding.hash_of({"h": i}),
        challenge_hash=encoding.hash_of({"ch": i}),
        policy=Policy.build(allowed=["echo"], rate_limit=10, rate_period=60, session_timeout=600),
        policy_hash=Policy.build(allowed=["echo"], rate_limit=10, rate_period=60, session_timeout=600).hash,
        policy_signature="e30.e30.AAAA",
        created_at=created_at,
        expires_at=created_at + 60,
        source=source,
        proven_kid=proven_kid,
    )


def session(i: int = 1, *, did: str = CLIENT.did, created_at: int = T0, timeout: int = 600) -> SessionRecord:
    return SessionRecord(
        session_id=_n(50_000 + i),
        session_commitment=encoding.hash_of({"commit": i}),
        client_did=did,
        server_did=SERVER.did,
        client_kid=CLIENT.kid,
        client_key=CLIENT.public_key,
        policy=Policy.build(session_timeout=timeout),
        created_at=created_at,
        expires_at=created_at + timeout,
        client_agent_id="store-client",
    )


async def add(
    store: Store, p: PendingHandshake, *, per_source: int = BIG, total: int = BIG, now: float = T0
) -> bool:
    return await store.add_pending(p, max_per_source=per_source, max_total=total, now=now)


async def opened(
    store: Store,
    i: int = 1,
    *,
    did: str = CLIENT.did,
    now: float = T0,
    max_sessions: int = BIG,
    lifetime: int = 600,
) -> SessionRecord:
    """A session opened through the full path: add, prove, open."""
    p = pending(10 * i + 7, created_at=int(now))
    assert await add(store, p, now=now)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, now)
    rec = session(i, did=did, created_at=int(now), timeout=lifetime)
    assert await store.open_session(p.nonce_b, rec, max_sessions=max_sessions, now=now) is OpenResult.OPENED
    return rec


async def begin(
    store: Store,
    rec: SessionRecord,
    seq: int,
    h: str = "h",
    *,
    now: float = T0,
    limit: int | None = BIG,
    period: int = 60,
) -> Any:
    return await store.begin_request(
        rec.session_id, rec.client_did, seq, "sha256:" + h, rate_limit=limit, rate_period=period, now=now
    )


# -- the interface ---------------------------------------------------------------------------
async def test_implements_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


# -- pending handshakes -------------------------------------------------------------------------
async def test_add_and_get_pending(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.get_pending(p.nonce_b, T0) == p
    assert await store.get_pending(_n(999), T0) is None


async def test_add_pending_never_overwrites(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    clash = pending(1, source="elsewhere")
    assert not await add(store, clash)
    got = await store.get_pending(p.nonce_b, T0)
    assert got is not None and got.proven_kid == CLIENT.kid and got.source == "s"


async def test_pending_per_source_bound(store: Store) -> None:
    assert await add(store, pending(1, source="a"), per_source=2)
    assert await add(store, pending(2, source="a"), per_source=2)
    assert not await add(store, pending(3, source="a"), per_source=2)
    assert await store.get_pending(_n(3), T0) is None
    assert await add(store, pending(4, source="b"), per_source=2)
    for i in (1, 2, 4):  # nothing was evicted
        assert await store.get_pending(_n(i), T0) is not None


async def test_pending_total_bound(store: Store) -> None:
    for i in range(3):
        assert await add(store, pending(i, source=f"src{i}"), total=3)
    assert not await add(store, pending(9, source="new"), total=3)
    for i in range(3):
        assert await store.get_pending(_n(i), T0) is not None


async def test_pending_expiry(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.get_pending(p.nonce_b, p.expires_at - 1) == p
    assert await store.get_pending(p.nonce_b, p.expires_at) is None
    assert await store.get_pending(p.nonce_b, p.expires_at - 1) is None  # gone for good


async def test_expired_pendings_free_their_place(store: Store) -> None:
    assert await add(store, pending(1, source="a"), per_source=1, total=2)
    assert await add(store, pending(2, source="b"), per_source=1, total=2)
    assert not await add(
        store, pending(3, source="a", created_at=T0 + 59), per_source=1, total=2, now=T0 + 59
    )
    assert await add(store, pending(3, source="a", created_at=T0 + 60), per_source=1, total=2, now=T0 + 60)
    assert await store.get_pending(_n(3), T0 + 60) is not None


async def test_concurrent_adds_respect_the_bound(store: Store) -> None:
    results = await asyncio.gather(*(add(store, pending(i, source="x"), per_source=5) for i in range(20)))
    assert sum(map(bool, results)) == 5
    present = [await store.get_pending(_n(i), T0) for i in range(20)]
    assert sum(p is not None for p in present) == 5


# -- mark_proven ---------------------------------------------------------------------------------
async def test_mark_proven_is_compare_and_set(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    got = await store.get_pending(p.nonce_b, T0)
    assert got is not None and got.proven_kid == CLIENT.kid
    assert got == p.proven(CLIENT.kid)
    assert not await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    assert not await store.mark_proven(p.nonce_b, OTHER.kid, T0)
    got = await store.get_pending(p.nonce_b, T0)
    assert got is not None and got.proven_kid == CLIENT.kid


async def test_mark_proven_unknown_or_expired(store: Store) -> None:
    assert not await store.mark_proven(_n(5), CLIENT.kid, T0)
    p = pending(1)
    assert await add(store, p)
    assert not await store.mark_proven(p.nonce_b, CLIENT.kid, p.expires_at)


async def test_concurrent_mark_proven_succeeds_once(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    results = await asyncio.gather(*(store.mark_proven(p.nonce_b, CLIENT.kid, T0) for _ in range(10)))
    assert sum(results) == 1


# -- open_session -------------------------------------------------------------------------------
async def test_open_session_consumes_the_proven_pending(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    rec = session(1)
    assert await store.open_session(p.nonce_b, rec, max_sessions=BIG, now=T0) is OpenResult.OPENED
    assert await store.get_pending(p.nonce_b, T0) is None
    assert await store.get_session(rec.session_id, T0) == rec
    again = await store.open_session(p.nonce_b, session(2), max_sessions=BIG, now=T0)
    assert again is OpenResult.HANDSHAKE_GONE
    assert await store.get_session(session(2).session_id, T0) is None


async def test_open_session_needs_a_proven_unexpired_pending(store: Store) -> None:
    rec = session(1)
    assert await store.open_session(_n(1), rec, max_sessions=BIG, now=T0) is OpenResult.HANDSHAKE_GONE
    p = pending(1)
    assert await add(store, p)
    assert await store.open_session(p.nonce_b, rec, max_sessions=BIG, now=T0) is OpenResult.HANDSHAKE_GONE
    assert await store.get_pending(p.nonce_b, T0) == p  # unproven: left as it was
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    late = await store.open_session(p.nonce_b, rec, max_sessions=BIG, now=p.expires_at)
    assert late is OpenResult.HANDSHAKE_GONE
    assert await store.get_session(rec.session_id, T0) is None


async def test_open_session_full_evicts_nothing(store: Store) -> None:
    first = await opened(store, 1, max_sessions=2)
    second = await opened(store, 2, max_sessions=2)
    p = pending(3)
    assert await add(store, p)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    full = await store.open_session(p.nonce_b, session(3), max_sessions=2, now=T0)
    assert full is OpenResult.FULL
    assert await store.get_session(first.session_id, T0) == first
    assert await store.get_session(second.session_id, T0) == second
    assert await store.get_session(session(3).session_id, T0) is None
    # The pending handshake is still there, still proven: it opens once there is room.
    got = await store.get_pending(p.nonce_b, T0)
    assert got is not None and got.proven_kid == CLIENT.kid
    await store.close_session(first.session_id)
    assert await store.open_session(p.nonce_b, session(3), max_sessions=2, now=T0) is OpenResult.OPENED


async def test_open_session_full_only_counts_unexpired_sessions(store: Store) -> None:
    short = await opened(store, 1, max_sessions=2, lifetime=30)
    long = await opened(store, 2, max_sessions=2, lifetime=600)
    p = pending(3, created_at=T0 + 30)
    assert await add(store, p, now=T0 + 30)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0 + 30)
    rec = session(3, created_at=T0 + 30)
    assert await store.open_session(p.nonce_b, rec, max_sessions=2, now=T0 + 30) is OpenResult.OPENED
    assert await store.get_session(short.session_id, T0 + 30) is None
    assert await store.get_session(long.session_id, T0 + 30) == long
    assert await store.get_session(rec.session_id, T0 + 30) == rec


async def test_concurrent_open_session_opens_once(store: Store) -> None:
    p = pending(1)
    assert await add(store, p)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
    results = await asyncio.gather(
        *(store.open_session(p.nonce_b, session(i), max_sessions=BIG, now=T0) for i in range(10))
    )
    assert results.count(OpenResult.OPENED) == 1
    assert results.count(OpenResult.HANDSHAKE_GONE) == 9


# -- sessions -----------------------------------------------------------------------------------
async def test_get_session_expiry(store: Store) -> None:
    rec = await opened(store, 1, lifetime=600)
    assert await store.get_session(rec.session_id, rec.expires_at - 1) == rec
    assert await store.get_session(rec.session_id, rec.expires_at) is None
    assert await store.get_session(_n(12345), T0) is None


async def test_close_session(store: Store) -> None:
    rec = await opened(store, 1)
    other = await opened(store, 2)
    await store.close_session(rec.session_id)
    assert await store.get_session(rec.session_id, T0) is None
    assert (await begin(store, rec, 1)).kind is BeginKind.GONE
    await store.close_session(rec.session_id)  # idempotent
    await store.close_session(_n(4242))  # unknown: no error
    assert await store.get_session(other.session_id, T0) == other


# -- begin_request / finish_request ---------------------------------------------------------------
async def test_begin_request_kinds(store: Store) -> None:
    rec = await opened(store, 1)
    b = await begin(store, rec, 1, "a")
    assert b.kind is BeginKind.NEW and b.last_sequence == 1
    b = await begin(store, rec, 1, "a")
    assert b.kind is BeginKind.IN_PROGRESS and b.reply is None
    reply = StoredReply(200, {"status": "success", "result": {"x": 1}})
    await store.finish_request(rec.session_id, 1, reply)
    b = await begin(store, rec, 1, "a")
    assert b.kind is BeginKind.REPLAY and b.reply == reply
    b = await begin(store, rec, 1, "other-bytes")
    assert b.kind is BeginKind.STALE and b.last_sequence == 1
    b = await begin(store, rec, 5, "e")  # a gap is allowed
    assert b.kind is BeginKind.NEW and b.last_sequence == 5
    for seq, h in ((4, "d"), (1, "a"), (2, "b")):
        b = await begin(store, rec, seq, h)
        assert b.kind is BeginKind.STALE and b.last_sequence == 5
    # Only the last request is kept: the answer to 1 is gone, 5 is in progress.
    assert (await begin(store, rec, 5, "e")).kind is BeginKind.IN_PROGRESS
    # An answer kept unsigned, to be signed again on a retry, comes back whole.
    unsigned = StoredReply(200, {"x": [1, 2.5, "é"]}, signed_at=1_800_000_123)
    await store.finish_request(rec.session_id, 5, unsigned)
    b = await begin(store, rec, 5, "e")
    assert b.kind is BeginKind.REPLAY and b.reply == unsigned


async def test_begin_request_sequence_zero_is_not_a_replay(store: Store) -> None:
    rec = await opened(store, 1)
    b = await begin(store, rec, 1, "")
    assert b.kind is BeginKind.NEW


async def test_finish_request_only_for_the_last_sequence(store: Store) -> None:
    rec = await opened(store, 1)
    assert (await begin(store, rec, 1, "a")).kind is BeginKind.NEW
    assert (await begin(store, rec, 2, "b")).kind is BeginKind.NEW
    await store.finish_request(rec.session_id, 1, StoredReply(200, {"late": True}))
    assert (await begin(store, rec, 2, "b")).kind is BeginKind.IN_PROGRESS
    error = StoredReply(403, None, {"code": -32042, "message": "no", "data": {"response_jws": "x.y.z"}})
    await store.finish_request(rec.session_id, 2, error)
    b = await begin(store, rec, 2, "b")
    assert b.kind is BeginKind.REPLAY and b.reply == error
    await store.finish_request(_n(777), 1, error)  # unknown session: ignored


async def test_begin_request_gone(store: Store) -> None:
    rec = await opened(store, 1, lifetime=100)
    assert (await begin(store, session(99), 1)).kind is BeginKind.GONE
    assert (await begin(store, rec, 1, now=rec.expires_at)).kind is BeginKind.GONE
    assert (await begin(store, rec, 1, now=rec.expires_at - 1)).kind is BeginKind.GONE  # expired for good


async def test_concurrent_begin_request_accepts_once(store: Store) -> None:
    rec = await opened(store, 1)
    results = await asyncio.gather(*(begin(store, rec, 1, f"h{i}") for i in range(10)))
    kinds = [b.kind for b in results]
    assert kinds.count(BeginKind.NEW) == 1
    assert kinds.count(BeginKind.STALE) == 9


# -- rate limit -----------------------------------------------------------------------------------
async def test_rate_limit_fixed_window(store: Store) -> None:
    rec = await opened(store, 1)
    now = T0 + 10
    assert (await begin(store, rec, 1, now=now, limit=2)).kind is BeginKind.NEW
    assert (await begin(store, rec, 2, now=now, limit=2)).kind is BeginKind.NEW
    b = await begin(store, rec, 3, now=now, limit=2)
    assert b.kind is BeginKind.RATE_LIMITED
    assert 1 <= b.retry_after <= 60 and b.last_sequence == 2
    # Nothing consumed: the same sequence is still new, and lower ones still stale.
    assert (await begin(store, rec, 2, "x", now=now, limit=2)).kind is BeginKind.STALE
    later = now + b.retry_after - 1
    assert (await begin(store, rec, 3, now=later, limit=2)).kind is BeginKind.RATE_LIMITED
    assert (await begin(store, rec, 3, now=now + b.retry_after, limit=2)).kind is BeginKind.NEW


async def test_rate_limit_is_per_did_across_sessions(store: Store) -> None:
    one = await opened(store, 1)
    two = await opened(store, 2)
    other = await opened(store, 3, did=OTHER.did)
    assert (await begin(store, one, 1, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, two, 1, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, one, 2, limit=3)).kind is BeginKind.NEW
    assert (await begin(store, two, 2, limit=3)).kind is BeginKind.RATE_LIMITED
    assert (await begin(store, one, 3, limit=3)).kind is BeginKind.RATE_LIMITED
    assert (await begin(store, other, 1, limit=3)).kind is BeginKind.NEW


async def test_uncounted_requests_and_retries_pass_the_limit(store: Store) -> None:
    rec = await opened(store, 1)
    assert (await begin(store, rec, 1, "a", limit=1)).kind is BeginKind.NEW
    assert (await begin(store, rec, 1, "a", limit=1)).kind is BeginKind.IN_PROGRESS  # a retry is free
    assert (await begin(store, rec, 2, "b", limit=1)).kind is BeginKind.RATE_LIMITED
    assert (await begin(store, rec, 2, "b", limit=None)).kind is BeginKind.NEW  # close: not counted
    assert (await begin(store, rec, 1, "z", limit=1)).kind is BeginKind.STALE  # order: step 7 first


async def test_rate_limit_retry_after_lands_in_the_next_window(store: Store) -> None:
    rec = await opened(store, 1, lifetime=10**6)
    for offset in (0, 1, 30, 59):
        now = T0 + 120 * (offset + 1) + offset
        seq = 10 * (offset + 1)
        assert (await begin(store, rec, seq, now=now, limit=1, period=60)).kind is BeginKind.NEW
        b = await begin(store, rec, seq + 1, now=now, limit=1, period=60)
        assert b.kind is BeginKind.RATE_LIMITED
        assert (
            await begin(store, rec, seq + 1, now=now + b.retry_after, limit=1, period=60)
        ).kind is BeginKind.NEW


# -- serialisation --------------------------------------------------------------------------------
def _json_round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(obj, allow_nan=False)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@pytest.mark.parametrize("proven", [None, CLIENT.kid])
def test_pending_round_trip(proven: str | None) -> None:
    p = pending(3, source="10.0.0.1", proven_kid=proven)
    assert PendingHandshake.from_dict(p.to_dict()) == p
    assert PendingHandshake.from_dict(_json_round_trip(p.to_dict())) == p
    two_keys = PendingHandshake.from_dict({**p.to_dict(), "client_keys": {"a#1": "AAAA", "a#2": "AQID"}})
    assert dict(two_keys.client_keys) == {"a#1": b"\x00\x00\x00", "a#2": b"\x01\x02\x03"}


def test_session_round_trip() -> None:
    rec = session(4)
    assert SessionRecord.from_dict(rec.to_dict()) == rec
    assert SessionRecord.from_dict(_json_round_trip(rec.to_dict())) == rec
    assert rec.expired(rec.expires_at) and not rec.expired(rec.expires_at - 1)


@pytest.mark.parametrize(
    "reply",
    [
        StoredReply(
            200, {"status": "success", "sequence": 1, "result": [1, "x", None], "response_jws": "a.b.c"}
        ),
        StoredReply(409, None, {"code": -32044, "message": "m", "data": {"response_jws": "a.b.c"}}),
        StoredReply(503, None, {"code": -32048, "message": "m", "data": {"retry_after": 5}}),
        StoredReply(200),
        StoredReply(200, {"echo": [1, 2.5, None]}, signed_at=1_800_000_000),
        StoredReply(200, None, signed_at=1_800_000_000),  # a handler that returned null
        StoredReply(503, error={"code": -32048, "message": "m", "data": {"retry_after": 5}}, signed_at=7),
    ],
)
def test_stored_reply_round_trip(reply: StoredReply) -> None:
    assert StoredReply.from_dict(reply.to_dict()) == reply
    assert StoredReply.from_dict(_json_round_trip(reply.to_dict())) == reply


# -- MemoryStore specifics (not part of the contract) ---------------------------------------------
async def test_memory_store_forgets_ended_rate_windows() -> None:
    """H6: one rate window per DID that ever sent a request must not pile up forever."""
    store = MemoryStore()
    rec = await opened(store, 1, lifetime=10**6)
    for i in range(5000):
        did = f"did:key:zmany{i}"
        b = await store.begin_request(
            rec.session_id, did, i + 1, f"h{i}", rate_limit=10, rate_period=60, now=T0 + i
        )
        assert b.kind is BeginKind.NEW
        assert store.counts()["rates"] <= 1024
    assert store.counts()["sessions"] == 1
