"""A kept delegation chain is re-checked at each later use for revocation and time, at a cost
that does not grow with its length (PROTOCOL.md §12.7, a2a_secure/protocol/server/delegation.py).

The server keeps a chain it verified with the epoch of each deny list, and looks every link
up again only when an epoch has moved. These tests count the deny-list look-ups of later
uses (none while nothing changes), and check that a revocation still ends the chain at its
very next use: in the same process, written by another worker through its own store object
on Redis, and written to a revocation file; and that the chain's window still closes.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import cluster_helpers
import pytest
import redis_helpers
from redis_helpers import redis_url  # noqa: F401  (fixture)

from a2a_secure.delegation import Chain, DelegationRules, issue
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.protocol.keyguard import KeyGuard
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, ServerLimits
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import FileRevocations, StoreRevocations

T0 = 1_763_700_000.0
SERVER = Identity.generate("epoch-server")
CLIENT = Identity.generate("epoch-client")
PERSON = Identity.generate("epoch-person")
HOPS = [Identity.generate(f"epoch-hop-{i}") for i in range(4)]
INTENT = {"goal": "echo", "inputs": {"x": 1}}


async def _echo(inputs: Any, ctx: IntentContext) -> Any:
    return inputs


def five_links(now: float, ttl: int = 3600) -> Chain:
    chain = issue(PERSON, to=HOPS[0].did, goals=["echo"], ttl=ttl, now=now, targets=[SERVER.did])
    for a, b in zip(HOPS, [*HOPS[1:], CLIENT], strict=True):
        chain = chain.further(a, to=b.did, now=now)
    return chain


class World:
    def __init__(self, store: Any, clock: list[float], revocations: list[Any]) -> None:
        dispatcher = IntentDispatcher()
        dispatcher.add("echo", _echo)
        self.store = store
        self.clock = clock
        self.server = ServerProtocol(
            SERVER,
            Policy.build(rate_limit=10**6, rate_period=3600, session_timeout=36_000),
            store=store,
            resolver=DIDResolver(),
            dispatcher=dispatcher,
            manifest_hash=encoding.hash_of({"name": "epoch"}),
            limits=ServerLimits(),
            clock=lambda: clock[0],
            key_guard=KeyGuard(revocations=revocations),
            delegation=DelegationRules(),
        )
        self.lookups = 0
        real = store.find_revocation

        async def counted(did: str, kids: Any) -> Any:
            self.lookups += 1
            return await real(did, kids)

        store.find_revocation = counted

    async def session(self) -> ClientSession:
        hs = ClientHandshake(CLIENT, resolve_did_key(SERVER.did), clock=lambda: self.clock[0])
        challenge = (await self.server.handle("hello", hs.hello())).result
        policy = (await self.server.handle("proof", hs.receive_challenge(challenge))).result
        session = await self.server.handle("accept_policy", hs.receive_policy(policy))
        return hs.receive_session(session.result)

    async def use(self, session: ClientSession, delegation: Any, goal: str = "echo") -> tuple[int, Any]:
        req = session.prepare_intent({**INTENT, "goal": goal, "delegation": delegation})
        reply = await self.server.handle("intent", req.params)
        return reply.http_status, reply.error


StoreMaker = Callable[[], Any]


@pytest.fixture(params=["memory", "redis", "cluster"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
    """Store objects on one shared state: the same MemoryStore, or RedisStores on one prefix
    of one Redis or of a local Redis Cluster (each one as another worker would hold it)."""
    made: list[Any] = []
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
        return
    if request.param == "cluster":
        url: str = request.getfixturevalue("redis_cluster").url
        delete = functools.partial(cluster_helpers.delete_prefix, url)
    else:
        url = request.getfixturevalue("redis_url")
        delete = functools.partial(redis_helpers.delete_prefix, url)
    from a2a_secure.store.redis import RedisStore

    prefix = f"a2a-test:{uuid.uuid4().hex}:"

    def make() -> Any:
        made.append(RedisStore(url, prefix=prefix, finish_linger=None))
        return made[-1]

    yield make
    for store in made:
        await store.aclose()
    delete(prefix)


async def test_later_uses_look_nothing_up_until_the_deny_list_changes(stores: StoreMaker) -> None:
    clock = [T0]
    w = World(stores(), clock, [])
    operator = StoreRevocations(stores())  # another worker's store object on Redis
    chain = five_links(T0)
    session = await w.session()
    w.lookups = 0  # the HELLO's own look-up of the client
    assert (await w.use(session, chain.tokens))[0] == 200
    first = w.lookups
    assert first == 10  # two per link (issuer key, token id), once
    for _ in range(5):
        assert await w.use(session, chain.hash) == (200, None)
    assert w.lookups == first  # later uses: the epoch alone
    # A revocation of the middle link's token id ends the chain at its very next use...
    target = "delegation:" + chain.links[2].jti
    assert await operator.revoke(target)
    status, error = await w.use(session, chain.hash)
    assert status == 403 and error is not None and error["code"] == -32042
    assert "token id revoked: " + target in error["message"]
    # ... as a revoked hop's DID does; removing the entries lets it work again.
    assert await operator.unrevoke(target)
    assert await w.use(session, chain.hash) == (200, None)
    assert await operator.revoke(HOPS[1].did)
    status, error = await w.use(session, chain.hash)
    assert error is not None and "DID revoked: " + HOPS[1].did in error["message"]
    assert await operator.unrevoke(HOPS[1].did)
    assert await w.use(session, chain.hash) == (200, None)
    looked = w.lookups
    assert await w.use(session, chain.hash) == (200, None)
    assert w.lookups == looked


async def test_a_later_use_on_one_redis_costs_no_round_trip_of_its_own(stores: StoreMaker) -> None:
    # One Redis reads the deny list's epoch in the script that takes the sequence; a spread
    # cluster, where they live in two slots, reads it with one more round trip.
    store = stores()
    w = World(store, [T0], [])
    operator = StoreRevocations(stores())
    chain = five_links(T0)
    session = await w.session()
    assert (await w.use(session, chain.tokens))[0] == 200
    trips = getattr(store, "round_trips", None)
    if trips is None:
        pytest.skip("an in-process store makes no round trips")

    async def trips_of(delegation: Any) -> int:
        before = store.round_trips
        req = session.prepare_intent({**INTENT, "delegation": delegation} if delegation else INTENT)
        assert (await w.server.handle("intent", req.params)).error is None
        return int(store.round_trips - before)

    plain, later = await trips_of(None), await trips_of(chain.hash)
    assert later == plain + (0 if store.epoch_in_begin else 1)
    # A revocation by another worker is still seen at the very next use, and nothing runs.
    assert await operator.revoke(HOPS[3].did)
    status, error = await w.use(session, chain.hash)
    assert status == 403 and error is not None and "DID revoked: " + HOPS[3].did in error["message"]
    assert await operator.unrevoke(HOPS[3].did)
    assert await w.use(session, chain.hash) == (200, None)


async def test_the_window_and_the_scope_are_checked_at_every_later_use(stores: StoreMaker) -> None:
    clock = [T0]
    w = World(stores(), clock, [])
    chain = five_links(T0, ttl=600)
    session = await w.session()
    assert (await w.use(session, chain.tokens))[0] == 200
    assert await w.use(session, chain.hash) == (200, None)
    _, error = await w.use(session, chain.hash, goal="other")
    assert error is not None and "outside the delegated goals" in error["message"]
    clock[0] = T0 + 600
    _, error = await w.use(session, chain.hash)
    assert error is not None and "expired at" in error["message"]


async def test_a_revocation_file_is_seen_at_the_next_use(tmp_path: Path) -> None:
    clock = [T0]
    deny = FileRevocations(tmp_path / "revoked.json")
    w = World(MemoryStore(), clock, [deny])
    chain = five_links(T0)
    session = await w.session()
    assert (await w.use(session, chain.tokens))[0] == 200
    assert await w.use(session, chain.hash) == (200, None)
    await FileRevocations(tmp_path / "revoked.json").revoke("delegation:" + chain.links[4].jti)
    _, error = await w.use(session, chain.hash)
    assert error is not None and "token id revoked" in error["message"]
