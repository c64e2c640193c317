"""Every bound answers without walking what it bounds (SECURITY.md, "What a caller can make
the server spend").

A full table must not make each refusal dearer: a caller who fills it with fresh did:keys
would otherwise buy a walk of every entry per request. These tests fill each bound of the
memory store (and the process's session deadlines) and count the walks of its tables while
requests are refused at the bound: there must be none. Time-based measurements are left to
``scripts/bench_bounds.py``; a count of walks is exact and does not depend on the machine.
They also check that entries past their expiry still give their room back.
"""

from __future__ import annotations

from typing import Any

from test_approval_store import action
from test_store_contract import CLIENT, SERVER, T0, opened, pending, session

from a2a_secure.protocol.server.deadlines import SessionDeadlines
from a2a_secure.store.base import OpenResult
from a2a_secure.store.intents import ClaimKind, ClaimRequest
from a2a_secure.store.memory import MemoryStore

N = 2000


class Watched(dict[Any, Any]):
    """A dict that counts the entries read by every walk over it (items, values, keys)."""

    walks = 0  # entries visited by walks, over every Watched

    def _counted(self, it: Any) -> Any:
        for x in it:
            type(self).walks += 1
            yield x

    def items(self) -> Any:
        return self._counted(super().items())

    def values(self) -> Any:
        return self._counted(super().values())

    def keys(self) -> Any:
        return self._counted(super().keys())

    def __iter__(self) -> Any:
        return self._counted(super().__iter__())


def watch(obj: Any, *names: str) -> None:
    Watched.walks = 0
    for name in names:
        setattr(obj, name, Watched(getattr(obj, name)))


async def test_a_refused_session_at_the_limit_walks_nothing_and_expired_ones_free_room() -> None:
    store = MemoryStore()
    for i in range(N):
        await opened(store, i, now=T0 + i % 7, lifetime=600 + i % 5)
    watch(store, "_sessions", "_seq")
    for j in range(50):
        p = pending(900_000 + j)
        assert await store.add_pending(p, max_per_source=10**6, max_total=10**6, now=T0 + 10)
        assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0 + 10)
        rec = session(900_000 + j, created_at=T0 + 10)
        assert await store.open_session(p.nonce_b, rec, max_sessions=N, now=T0 + 10) is OpenResult.FULL
    assert Watched.walks == 0
    # Past the first expiries, the earliest sessions give their room back (and only they).
    p = pending(990_001, created_at=T0 + 600)
    assert await store.add_pending(p, max_per_source=10**6, max_total=10**6, now=T0 + 600)
    assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0 + 600)
    rec = session(990_001, created_at=T0 + 600)
    assert await store.open_session(p.nonce_b, rec, max_sessions=N, now=T0 + 600) is OpenResult.OPENED
    assert Watched.walks == 0
    left = store.counts()["sessions"]
    assert left == N + 1 - sum(1 for i in range(N) if T0 + i % 7 + 600 + i % 5 <= T0 + 600)
    assert await store.get_session(rec.session_id, T0 + 600) == rec


async def test_closed_sessions_leave_no_index_behind() -> None:
    store = MemoryStore()
    for i in range(5 * N):
        rec = await opened(store, i, now=T0)
        await store.close_session(rec.session_id)
    assert store.counts()["sessions"] == 0
    assert len(store._by_expiry) <= 64 + 1


async def test_a_refused_hello_at_the_limit_walks_nothing_and_expired_ones_free_room() -> None:
    store = MemoryStore()
    for i in range(N):
        assert await store.add_pending(pending(i, source=f"s{i % 3}"), max_per_source=N, max_total=N, now=T0)
    watch(store, "_pending", "_pending_by_source")
    for j in range(50):
        refused = pending(N + j, source="fresh")
        assert not await store.add_pending(refused, max_per_source=N, max_total=N, now=T0 + 59)
    assert Watched.walks == 0
    late = pending(N + 99, source="fresh", created_at=T0 + 60)
    assert await store.add_pending(late, max_per_source=N, max_total=N, now=T0 + 60)
    assert Watched.walks == 0
    assert store.counts()["pending"] == 1


async def test_a_refused_action_at_the_limit_walks_nothing_and_expired_ones_free_room() -> None:
    store = MemoryStore()
    for i in range(N):
        assert await store.add_action(action(i, f"did:key:c{i}"), max_per_caller=1, max_total=N, now=T0)
    watch(store, "_actions", "_actions_pending")
    for j in range(50):
        a = action(N + j, "did:key:fresh")
        assert not await store.add_action(a, max_per_caller=1, max_total=N, now=T0 + 1)
    assert Watched.walks == 0
    # A decided action stops counting at once; a pending one past its expiry, at the next add.
    first = action(0, "did:key:c0")
    decision = await store.decide_action(
        first.action_id,
        caller_did=first.caller_did,
        action_hash=first.action_hash,
        approve=True,
        decided_by="did:key:person",
        now=T0 + 1,
    )
    assert decision.action is not None
    bounds = {"max_per_caller": 1, "max_total": N}
    assert await store.add_action(action(N + 100, "did:key:fresh"), **bounds, now=T0 + 1)
    assert not await store.add_action(action(N + 101, "did:key:new"), **bounds, now=T0 + 2)
    assert await store.add_action(action(N + 102, "did:key:new"), **bounds, now=T0 + 61)
    assert Watched.walks == 0


async def test_a_refused_intent_id_at_either_bound_walks_nothing() -> None:
    store = MemoryStore()
    rec = await opened(store, 1, now=T0)
    seq = 0

    async def claim(did: str, i: int, *, per_did: int, total: int, now: float) -> ClaimKind:
        nonlocal seq
        seq += 1
        request = ClaimRequest(f"id-{i}", f"h{i}", int(now) + 30, int(now) + 3600, per_did, total)
        _, got = await store.begin_intent(
            rec.session_id,
            did,
            seq,
            f"r{seq}",
            rate_limit=None,
            rate_period=60,
            now=now,
            claim=request,
            agent=SERVER.did,
        )
        assert got is not None
        return got.kind

    for i in range(N):
        assert await claim(CLIENT.did, i, per_did=N, total=2 * N, now=T0 + i % 3) is ClaimKind.NEW
    for i in range(N):
        assert await claim(f"did:key:z{i}", i, per_did=N, total=2 * N, now=T0) is ClaimKind.NEW
    watch(store, "_claims", "_claims_by_did")
    store._claims_by_did[(SERVER.did, CLIENT.did)] = Watched(store._claims_by_did[(SERVER.did, CLIENT.did)])
    Watched.walks = 0
    for j in range(50):
        assert await claim(CLIENT.did, N + j, per_did=N, total=10 * N, now=T0 + 5) is ClaimKind.FULL
        assert await claim("did:key:fresh", j, per_did=N, total=2 * N, now=T0 + 5) is ClaimKind.TOTAL_FULL
    assert Watched.walks <= 50  # the DID's oldest claim, read once per refusal


def test_noting_a_session_at_the_limit_walks_no_deadline() -> None:
    now = [0.0]
    deadlines = SessionDeadlines(None, lambda: now[0])  # type: ignore[arg-type]
    for i in range(N):
        deadlines.note(f"s{i}", 600 + i % 5)
    watch(deadlines, "_deadlines")
    for j in range(50):
        now[0] = 1.0 + j
        deadlines.note(f"t{j}", 600)
    assert Watched.walks == 0
    now[0] = 602.5
    deadlines.note("late", 600)
    assert Watched.walks == 0
    gone = sum(1 for i in range(N) if 600 + i % 5 <= 602.5) + sum(1 for j in range(50) if 601 + j <= 602.5)
    assert len(deadlines) == N + 51 - gone
    assert deadlines.past("s0") is False  # forgotten when its deadline passed
    assert deadlines.past("t0") is False
