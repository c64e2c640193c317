"""The ActionStore contract, for MemoryStore and RedisStore alike (store/actions.py).

The pending → decided step is the one that makes an approved action run once: of many
concurrent decisions exactly one wins, on one store object or on two sharing one Redis (two
workers). Bounds count only pending, unexpired actions; a wrong hash changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import cluster_helpers
import pytest
import pytest_asyncio
from redis_helpers import redis_prefix, redis_url  # noqa: F401 - fixtures

from a2a_secure.identity import encoding
from a2a_secure.store.actions import ActionState, ActionStore, DecisionKind, PendingAction
from a2a_secure.store.memory import MemoryStore

T0 = 1_763_700_000.0
StoreFactory = Callable[[], Awaitable[Any]]


@pytest_asyncio.fixture(params=["memory", "redis", "cluster"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Stores sharing one state: the same MemoryStore, or RedisStores on one key prefix
    (on one Redis, or on the local Redis Cluster of tests/cluster_helpers.py)."""
    made: list[Any] = []
    if request.param == "memory":
        shared = MemoryStore()

        async def memory() -> Any:
            return shared

        yield memory
        return
    from a2a_secure.store.redis import RedisStore

    prefix = request.getfixturevalue("redis_prefix")
    if request.param == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    else:
        url = request.getfixturevalue("redis_url")

    async def redis() -> Any:
        store = RedisStore(url, prefix=prefix)
        made.append(store)
        return store

    yield redis
    for store in made:
        await store.aclose()
    if request.param == "cluster":
        cluster_helpers.delete_prefix(url, prefix)


def action(n: int, caller: str = "did:key:caller", *, created: float = T0, ttl: int = 60) -> PendingAction:
    data = {"n": n, "title": f"event {n}"}
    return PendingAction(
        action_id=encoding.b64u_encode(n.to_bytes(16, "big")),
        action="create_event",
        goal="create_event",
        caller_did=caller,
        action_data=data,
        action_hash=encoding.hash_of(data),
        preview=f"event {n}",
        created_at=int(created),
        expires_at=int(created) + ttl,
        keep_until=int(created) + ttl + 600,
    )


async def decide(
    store: Any, a: PendingAction, now: float, *, approve: bool = True, h: str | None = None
) -> Any:
    return await store.decide_action(
        a.action_id,
        caller_did=a.caller_did,
        action_hash=h or a.action_hash,
        approve=approve,
        decided_by="did:key:person",
        now=now,
    )


async def test_add_get_and_decide_once(make_store: StoreFactory) -> None:
    store = await make_store()
    assert isinstance(store, ActionStore)
    a = action(1)
    assert await store.add_action(a, max_per_caller=5, max_total=5, now=T0)
    assert await store.get_action(a.action_id, T0) == a
    wrong = await decide(store, a, T0 + 1, h=encoding.hash_of({"other": 1}))
    assert wrong.kind is DecisionKind.MISMATCH
    assert await store.get_action(a.action_id, T0 + 1) == a  # nothing changed
    won = await decide(store, a, T0 + 2)
    assert won.kind is DecisionKind.DECIDED
    assert won.action.state is ActionState.APPROVED and won.action.decided_by == "did:key:person"
    assert won.action.decided_at == int(T0 + 2) and won.action.action_data == a.action_data
    again = await decide(store, a, T0 + 3, approve=False)
    assert again.kind is DecisionKind.ALREADY and again.action.state is ActionState.APPROVED
    stored = await store.get_action(a.action_id, T0 + 3)
    assert stored.state is ActionState.APPROVED
    unknown = action(99)
    assert (await decide(store, unknown, T0)).kind is DecisionKind.UNKNOWN
    other_caller = await store.decide_action(
        a.action_id, caller_did="did:key:x", action_hash=a.action_hash, approve=True, decided_by="p", now=T0
    )
    assert other_caller.kind is DecisionKind.UNKNOWN


async def test_expiry_and_forgetting(make_store: StoreFactory) -> None:
    store = await make_store()
    a = action(2)
    assert await store.add_action(a, max_per_caller=5, max_total=5, now=T0)
    assert (await store.get_action(a.action_id, a.expires_at)).state_at(a.expires_at) is ActionState.EXPIRED
    expired = await decide(store, a, a.expires_at)
    assert expired.kind is DecisionKind.EXPIRED and expired.action.state is ActionState.EXPIRED
    assert (await decide(store, a, a.expires_at + 1)).kind is DecisionKind.ALREADY
    assert await store.get_action(a.action_id, a.keep_until) is None


async def test_the_principal_is_kept_with_the_action_for_every_worker(make_store: StoreFactory) -> None:
    # The approval check of §12.1's "principal" reads it later, maybe on another worker.
    store, other = await make_store(), await make_store()
    mine = replace(action(7), principal="did:key:person", delegation=encoding.hash_of("chain"))
    plain = action(8)
    for a in (mine, plain):
        assert await store.add_action(a, max_per_caller=5, max_total=5, now=T0)
    assert await other.get_action(mine.action_id, T0) == mine
    assert (await other.get_action(plain.action_id, T0)).principal is None
    won = await decide(other, mine, T0 + 1)
    assert won.kind is DecisionKind.DECIDED
    assert (won.action.principal, won.action.delegation) == (mine.principal, mine.delegation)
    assert (await store.get_action(mine.action_id, T0 + 1)).principal == "did:key:person"
    # An action without a chain is stored as before: a record without the two members.
    assert "principal" not in plain.to_dict() and "delegation" not in plain.to_dict()
    assert PendingAction.from_dict(plain.to_dict()) == plain


async def test_bounds_count_pending_actions_only(make_store: StoreFactory) -> None:
    store = await make_store()
    a1, a2, b1 = action(1, "did:key:a"), action(2, "did:key:a"), action(3, "did:key:b")
    assert await store.add_action(a1, max_per_caller=2, max_total=3, now=T0)
    assert await store.add_action(a2, max_per_caller=2, max_total=3, now=T0)
    assert not await store.add_action(action(4, "did:key:a"), max_per_caller=2, max_total=3, now=T0)
    assert await store.add_action(b1, max_per_caller=2, max_total=3, now=T0)
    assert not await store.add_action(action(5, "did:key:c"), max_per_caller=2, max_total=3, now=T0)
    assert not await store.add_action(a1, max_per_caller=9, max_total=9, now=T0)  # the id exists
    assert (await decide(store, a1, T0 + 1, approve=False)).kind is DecisionKind.DECIDED
    assert await store.add_action(action(6, "did:key:a"), max_per_caller=2, max_total=3, now=T0 + 1)
    # Expired actions stop counting at their expiry.
    late = T0 + 61
    assert await store.add_action(
        action(7, "did:key:a", created=late), max_per_caller=2, max_total=3, now=late
    )


async def test_concurrent_decisions_on_two_store_objects_one_wins(make_store: StoreFactory) -> None:
    one, two = await make_store(), await make_store()
    for n in range(10, 20):
        a = action(n)
        assert await one.add_action(a, max_per_caller=50, max_total=50, now=T0)
        outcomes = await asyncio.gather(
            *(decide(store, a, T0 + 1, approve=i % 3 != 0) for i, store in enumerate([one, two] * 4))
        )
        kinds = [o.kind for o in outcomes]
        assert kinds.count(DecisionKind.DECIDED) == 1, kinds
        assert kinds.count(DecisionKind.ALREADY) == len(kinds) - 1
