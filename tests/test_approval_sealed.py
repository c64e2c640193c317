"""Actions asked on a sealed session, kept sealed at rest (PROTOCOL.md §12.1, §12.6).

Two workers of one desk agent (two ``AgentServer``s with one identity, under uvicorn on
127.0.0.1) share one store: a ``MemoryStore`` object, or one prefix of the real Redis
(skipped without it, a failure under ``A2A_SECURE_REQUIRE_REDIS=1``). A caller asks for an
action at one worker; its approver reads and approves it at the other, over real clients.
What the store holds is read as whoever reads Redis would: the raw hash, or the object.

The action's data and preview, and even the hash of its data, are absent from the store
when the action was asked sealed, present when it was asked in the clear (so the tests can
fail); the action runs with its data on the approver's sealed session, and is neither shown
nor decided on one that is not; a sealed record moved to another action, another agent or
another executor does not open (-32050) and nothing runs; records in the clear (the format
before sealing at rest) are served as before.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
import pytest_asyncio
from approval_helpers import CALLER, MAIL_OFFICER, PERSON, fixed_identity, register_actions
from http_helpers import SECRET
from redis_helpers import redis_prefix, redis_url  # noqa: F401 - fixtures
from test_sealed_http import RecordingTransport

from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.approval import approve, pending_action
from a2a_secure.client.http import A2AClient
from a2a_secure.errors import A2AError, ActionNotPending, InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.rotation import KeyRing
from a2a_secure.policy import Policy
from a2a_secure.protocol.approval import NeedsApproval
from a2a_secure.protocol.sealed_actions import HASH_PREFIX
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.actions import ActionState, PendingAction
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app

SEALED = ServerLimits(sealed_intents=True)
DESK = fixed_identity("sealed-desk")
OTHER = fixed_identity("other-desk")  # another agent sharing the store
TITLE = "Board meeting: " + SECRET


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


class Raw:
    """The store as whoever reads it sees it (a MemoryStore's objects, or Redis's raw bytes)."""

    def __init__(self, store: Any, url: str | None = None, prefix: str = "") -> None:
        self.store, self.url, self.prefix = store, url, prefix

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)

    def action(self, action_id: str) -> bytes:
        """Every byte kept for one action."""
        if self.url is None:
            return repr(self.store._actions[action_id]).encode()
        client = self._redis()
        try:
            fields = client.hgetall(self.store._k_action(action_id))
        finally:
            client.close()
        assert fields, "no such action in Redis"
        return b"\n".join(k + b"=" + v for k, v in sorted(fields.items()))

    def everything(self) -> bytes:
        """Every byte the store holds (Redis: every key under the prefix, read by its type)."""
        if self.url is None:
            return repr(self.store.__dict__).encode()
        client = self._redis()
        out: list[bytes] = []
        try:
            for key in client.scan_iter(match=self.prefix + "*"):
                kind = client.type(key)
                if kind == b"string":
                    out.append(client.get(key))
                elif kind == b"hash":
                    out.extend(k + b"=" + v for k, v in client.hgetall(key).items())
                elif kind == b"zset":
                    out.extend(m for m, _ in client.zrange(key, 0, -1, withscores=True))
                elif kind == b"set":
                    out.extend(client.smembers(key))
                elif kind == b"list":
                    out.extend(client.lrange(key, 0, -1))
                out.append(key)
        finally:
            client.close()
        return b"\n".join(out)

    def record(self, action_id: str) -> dict[str, Any]:
        """The action's record as created (its JSON form)."""
        if self.url is None:
            return self.store._actions[action_id].to_dict()  # type: ignore[no-any-return]
        client = self._redis()
        try:
            return encoding.loads(client.hget(self.store._k_action(action_id), "d"))  # type: ignore[no-any-return]
        finally:
            client.close()

    def rewrite(self, source: str, target: str, **changes: Any) -> None:
        """Put ``source``'s record (with ``changes``) where ``target``'s is: what a store writer can."""
        if self.url is None:
            moved = replace(self.store._actions[source], action_id=target, **changes)
            self.store._actions[target] = replace(moved, state=self.store._actions[target].state)
            return
        client = self._redis()
        try:
            src = self.store._k_action(source)
            record = {**encoding.loads(client.hget(src, "d")), "action_id": target, **changes}
            client.hset(
                self.store._k_action(target),
                mapping={"d": encoding.dumps(record), "h": client.hget(src, "h")},
            )
        finally:
            client.close()


@dataclass
class Desks:
    """Two workers of the desk (``one`` and ``two``) and another agent, on one store."""

    one: AgentServer
    two: AgentServer
    other: AgentServer
    urls: dict[str, str]
    calls: Counter[str]
    raw: Raw
    store: Any


def _desk(server_identity: Identity, store: Any, calls: Counter[str]) -> AgentServer:
    server = AgentServer(
        server_identity,
        Policy.build(rate_limit=1000),
        name="desk",
        store=store,
        approvers=(PERSON.did,),
        serve_tools=True,
        limits=SEALED,
    )
    register_actions(server, calls, mail_approvers=[MAIL_OFFICER.did])
    return server


@pytest_asyncio.fixture(params=["memory", "redis"], name="d")
async def desks(request: pytest.FixtureRequest) -> AsyncIterator[Desks]:
    calls: Counter[str] = Counter()
    if request.param == "memory":
        shared = MemoryStore()
        stores: list[Any] = [shared, shared, shared]
        raw = Raw(shared)
    else:
        from a2a_secure.store.redis import RedisStore

        url: str = request.getfixturevalue("redis_url")
        prefix: str = request.getfixturevalue("redis_prefix")
        stores = [RedisStore(url, prefix=prefix) for _ in range(3)]
        raw = Raw(stores[0], url, prefix)
    one, two, other = (
        _desk(who, store, calls) for who, store in zip((DESK, DESK, OTHER), stores, strict=True)
    )
    try:
        async with serve_app(one.app()) as u1, serve_app(two.app()) as u2, serve_app(other.app()) as u3:
            yield Desks(one, two, other, {"one": u1, "two": u2, "other": u3}, calls, raw, one.store)
    finally:
        if request.param != "memory":
            for store in stores:
                await store.aclose()


@contextlib.asynccontextmanager
async def clients(
    *, person_sealed: bool = True
) -> AsyncIterator[tuple[A2AClient, A2AClient, RecordingTransport]]:
    """The caller (sealed) and the approver (sealed or not), the approver's traffic recorded."""
    wire = RecordingTransport()
    async with httpx.AsyncClient(transport=wire, timeout=15) as http:
        caller = A2AClient(CALLER, sealed=True)
        person = A2AClient(PERSON, http=http, sealed=person_sealed)
        try:
            yield caller, person, wire
        finally:
            await caller.aclose()
            await person.aclose()


async def ask(d: Desks, caller: A2AClient, title: str = TITLE, at: str = "one") -> dict[str, Any]:
    answer = await caller.request(
        d.one.identity.did, {"goal": "create_event", "inputs": {"title": title}}, endpoint=d.urls[at]
    )
    assert answer.result["needs_approval"] is True
    return dict(answer.result)


# -- at rest ------------------------------------------------------------------------------------
async def test_an_action_asked_sealed_is_kept_sealed_at_rest_and_one_asked_plain_is_not(d: Desks) -> None:
    async with clients() as (caller, _person, _wire):
        sealed = await ask(d, caller)
        assert (await caller.session_for(d.one.identity.did)).sealed
    plain_title = "Offsite: " + SECRET + " (asked in the clear)"
    async with A2AClient(CALLER, sealed=False) as plain_caller:
        plain = await ask(d, plain_caller, plain_title)
        assert not (await plain_caller.session_for(d.one.identity.did)).sealed
    kept, kept_plain = d.raw.action(sealed["action_id"]), d.raw.action(plain["action_id"])
    # Asked sealed: neither the data, the preview nor the hash the approver signs.
    assert SECRET.encode() not in kept and b"Board meeting" not in kept
    assert sealed["action_hash"].encode() not in kept
    record = d.raw.record(sealed["action_id"])
    assert record["action_data"] is None and record["preview"] is None
    assert record["action_hash"].startswith(HASH_PREFIX) and record["sealed_kid"] == DESK.kid
    # Nowhere else in the store either (the answers kept for retries are the sealed forms).
    assert b"Board meeting" not in d.raw.everything()
    # Asked in the clear: kept as before, readable.
    assert plain_title.encode() in kept_plain and plain["action_hash"].encode() in kept_plain
    assert "sealed" not in d.raw.record(plain["action_id"])


# -- approval --------------------------------------------------------------------------------------
async def test_a_sealed_action_is_shown_and_run_on_the_approvers_sealed_session_at_another_worker(
    d: Desks,
) -> None:
    async with clients() as (caller, person, wire):
        asked = await ask(d, caller, at="one")
        shown = await pending_action(person, d.one.identity.did, asked["action_id"], endpoint=d.urls["two"])
        assert shown.action_data == {"title": TITLE} and shown.preview == f"Create {TITLE!r}"
        assert shown.action_hash == asked["action_hash"]
        outcome = await approve(person, d.one.identity.did, asked["action_id"], endpoint=d.urls["two"])
        assert (await person.session_for(d.one.identity.did)).sealed
    assert outcome.approved and outcome.result["created"] == {"title": TITLE}
    assert d.calls["run:create_event"] == 1
    assert not any(SECRET.encode() in chunk for chunk in wire.seen)
    # Decided, the record is still sealed at rest.
    kept = d.raw.action(asked["action_id"])
    assert SECRET.encode() not in kept and b"approved" in kept


async def test_an_unsealed_approver_session_neither_sees_nor_decides_a_sealed_action(d: Desks) -> None:
    async with clients() as (caller, _p, _w):
        asked = await ask(d, caller)
    async with clients(person_sealed=False) as (_c, person, wire):
        with pytest.raises(InvalidParams) as shown:
            await pending_action(person, d.one.identity.did, asked["action_id"], endpoint=d.urls["two"])
        for approved in (True, False):
            with pytest.raises(InvalidParams) as decided:
                await approve(
                    person,
                    d.one.identity.did,
                    asked["action_id"],
                    approved=approved,
                    action_hash=asked["action_hash"],
                    endpoint=d.urls["two"],
                )
            assert decided.value.signed and "only on a sealed session" in decided.value.message
        assert not (await person.session_for(d.one.identity.did)).sealed
    assert shown.value.signed and shown.value.code == -32602
    assert "asked on a sealed session" in shown.value.message
    assert not any(SECRET.encode() in chunk for chunk in wire.seen)  # nothing left in the clear
    # Nothing changed: still pending, not run; a non-approver is told only that it approves nothing.
    assert d.calls["run:create_event"] == 0
    stored = await d.store.get_action(asked["action_id"], d.one._clock())
    assert stored is not None and stored.state is ActionState.PENDING
    async with A2AClient(CALLER, sealed=False) as stranger:
        with pytest.raises(PolicyViolation):
            await pending_action(stranger, d.one.identity.did, asked["action_id"], endpoint=d.urls["two"])
    # The same approver, sealed, then decides it.
    async with clients() as (_c, person, _w):
        outcome = await approve(person, d.one.identity.did, asked["action_id"], endpoint=d.urls["two"])
    assert outcome.approved and outcome.result["created"] == {"title": TITLE}


# -- a record moved or altered ---------------------------------------------------------------------
async def _refused(person: A2AClient, d: Desks, action_id: str, action_hash: str, at: str) -> A2AError:
    did = d.other.identity.did if at == "other" else d.one.identity.did
    with pytest.raises(ActionNotPending) as shown:
        await pending_action(person, did, action_id, endpoint=d.urls[at])
    with pytest.raises(ActionNotPending) as decided:
        await approve(person, did, action_id, action_hash=action_hash, endpoint=d.urls[at])
    for info in (shown, decided):
        assert info.value.signed and info.value.code == -32050
    return shown.value


async def test_a_sealed_record_moved_to_another_action_agent_or_executor_fails_closed(d: Desks) -> None:
    async with clients() as (caller, person, _w):
        source = await ask(d, caller, title="moved " + SECRET)
        target = await ask(d, caller, title="kept")
        renamed = await ask(d, caller, title="renamed")
        d.raw.rewrite(source["action_id"], target["action_id"])
        moved = await _refused(person, d, target["action_id"], source["action_hash"], "one")
        assert "does not open" in moved.message
        # To another agent sharing the store (the record names that agent now).
        d.raw.rewrite(source["action_id"], source["action_id"], server_did=OTHER.did)
        await _refused(person, d, source["action_id"], source["action_hash"], "other")
        # Another executor: post would run the data under another name.
        d.raw.rewrite(renamed["action_id"], renamed["action_id"], action="post")
        await _refused(person, d, renamed["action_id"], renamed["action_hash"], "two")
        # The records that were left alone still open and run.
        clean = await ask(d, caller, title="clean")
        outcome = await approve(person, d.one.identity.did, clean["action_id"], endpoint=d.urls["two"])
    assert outcome.result["created"] == {"title": "clean"}
    assert d.calls["run:create_event"] == 1 and d.calls["run:post"] == 0
    for action_id in (source["action_id"], target["action_id"], renamed["action_id"]):
        stored = await d.store.get_action(action_id, d.one._clock())
        assert stored is not None and stored.state is ActionState.PENDING


# -- records in the clear ---------------------------------------------------------------------------
async def test_records_kept_in_the_clear_are_served_as_before_next_to_sealed_ones(d: Desks) -> None:
    # A record as an agent before sealing at rest wrote it (no sealed members), asked on a
    # sealed session then: it is still shown and decided on any session.
    now = int(d.one._clock())
    data = {"title": "old " + SECRET}
    old = PendingAction(
        action_id=encoding.b64u_encode(b"\x01" * 16),
        action="create_event",
        goal="create_event",
        caller_did=CALLER.did,
        action_data=data,
        action_hash=encoding.hash_of(data),
        preview="Create old",
        created_at=now,
        expires_at=now + 900,
        keep_until=now + 4500,
        server_did=DESK.did,
    )
    assert await d.store.add_action(old, max_per_caller=16, max_total=100, now=now)
    assert "sealed" not in d.raw.record(old.action_id) and SECRET.encode() in d.raw.action(old.action_id)
    async with clients() as (caller, _p, _w):
        sealed = await ask(d, caller)
    async with clients(person_sealed=False) as (_c, person, _w):
        shown = await pending_action(person, DESK.did, old.action_id, endpoint=d.urls["two"])
        assert shown.action_data == data and shown.action_hash == old.action_hash
        outcome = await approve(person, DESK.did, old.action_id, endpoint=d.urls["two"])
        with pytest.raises(InvalidParams):  # the new one, asked sealed, is not shown here
            await pending_action(person, DESK.did, sealed["action_id"], endpoint=d.urls["two"])
    assert outcome.approved and outcome.result["created"] == data
    assert d.calls["run:create_event"] == 1


# -- key rotation -----------------------------------------------------------------------------------
async def test_a_retired_key_opens_the_actions_it_sealed_during_its_overlap_window_only() -> None:
    clock = FakeClock(1_763_700_000.0)
    web = Identity.from_seed(b"\x07" * 32, "desk").with_did_web(
        "did:web:desk.example", "did:web:desk.example#k1"
    )
    ring = KeyRing(web)
    server = AgentServer(web, key_ring=ring, store=MemoryStore(), approvers=(PERSON.did,), clock=clock)
    ran: list[Any] = []

    @server.approved_action("create_event")
    def run(data: Any) -> Any:
        ran.append(data)
        return {"created": data}

    async def create(title: str) -> dict[str, Any]:
        needs = NeedsApproval({"title": title}, preview="Create")
        return await server.approvals.create(
            needs, goal="create_event", caller_did=CALLER.did, session_id="s", sequence=1, sealed=True
        )

    def decide(asked: dict[str, Any]) -> Any:
        inputs = {"action_id": asked["action_id"], "action_hash": asked["action_hash"], "approved": True}
        return server.approvals.approve(inputs, approver=PERSON.did, session_id="p", sequence=2, sealed=True)

    first, second = await create("before " + SECRET), await create("also before")
    assert server.store._actions[first["action_id"]].sealed_kid == web.kid  # type: ignore[attr-defined]
    rotated = ring.rotate(overlap=60, now=clock())
    server.identity, server.key_ring = rotated.current, rotated
    assert rotated.current.kid != web.kid and rotated.current.did == web.did
    third = await create("after")
    assert server.store._actions[third["action_id"]].sealed_kid == rotated.current.kid  # type: ignore[attr-defined]
    assert (await decide(first))["result"] == {"created": {"title": "before " + SECRET}}
    clock.advance(61)  # the old key's window is over; the actions are still pending
    with pytest.raises(ActionNotPending, match="no longer holds"):
        await decide(second)
    assert (await decide(third))["result"] == {"created": {"title": "after"}}
    assert ran == [{"title": "before " + SECRET}, {"title": "after"}]
