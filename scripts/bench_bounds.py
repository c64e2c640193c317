#!/usr/bin/env python3
"""What the server spends per request as its tables fill, and at each bound (SECURITY.md).

Runs ``ServerProtocol`` in one process (no HTTP) and times the server's own work only
(``ServerProtocol.handle``; the client's preparing and verifying is not counted), on
``MemoryStore`` or on a ``RedisStore``. Every case runs in every round, interleaved, and
each figure is the median over rounds of the mean per operation, so that a shared
machine's drift hits every case alike. The tables are filled through the store's own
interface (synthetic records, no signatures: filling is not what is measured):

* sessions: an intent and a full handshake on a server holding 1 session and one holding
  ``--fill`` sessions; a handshake refused at the session limit (``max_sessions`` =
  ``--fill``, every session live); a handshake accepted while the process's session
  deadlines hold ``--fill`` live entries (sessions it opened that other workers closed);
* delegation: an intent naming by hash a chain of 1 and of 5 links (later uses), against
  a plain intent on the same session;
* pending handshakes: a HELLO against an empty table and one refused at a full table of
  ``--fill``;
* intent ids: an intent with a new ``intent_id`` with 1 and with ``--fill`` ids
  remembered; refused at the store's bound (``--fill``) and at the DID's (``--fill`` ids
  of that DID);
* actions waiting for approval (store level, ``add_action``): against 1 and ``--fill``
  pending actions, and refused at a full bound of ``--fill``.

Each ratio is printed against its baseline; a bound answered in constant time keeps every
ratio near 1, and a refusal no dearer than an acceptance.

    python scripts/bench_bounds.py [--store memory|redis] [--fill 100000] [--rounds 5] [--ops 200]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from bench_core import make_server

from a2a_secure.delegation import Chain, DelegationRules, issue
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.store.actions import PendingAction
from a2a_secure.store.base import PendingHandshake, SessionRecord
from a2a_secure.store.intents import ClaimRequest
from a2a_secure.store.memory import MemoryStore

INTENT = {"goal": "echo", "domain": "bench", "inputs": {"text": "Hello world", "target_language": "es"}}
REDIS_URL = os.environ.get("A2A_SECURE_REDIS_URL", "redis://127.0.0.1:6379/0")
BIG = 10**9
Timer = Callable[[], Awaitable[float]]


def _rid() -> str:
    return encoding.b64u_encode(os.urandom(32))


def _server(store: Any, identity: Identity | None = None, **limits: Any) -> tuple[ServerProtocol, Identity]:
    server_id = identity or Identity.generate("bench-server")
    server = make_server(server_id, sessions=10, delegation=DelegationRules())
    cfg = server._config
    cfg.store = store
    # Only the bound a case measures is reached: refused handshakes come from one address, and
    # leave their pending handshake behind (its window is 60 s), as a flood's would.
    unbounded = {
        "max_sessions": BIG,
        "max_pending_total": BIG,
        "max_pending_per_source": BIG,
        "failed_handshake_burst": BIG,
    }
    cfg.limits = replace(cfg.limits, **{**unbounded, **limits})
    return server, server_id


async def _handshake(
    server: ServerProtocol, client: Identity, did: str
) -> tuple[ClientSession | None, float]:
    """A full handshake; the session (None when refused) and the server's time in it."""
    hs = ClientHandshake(client, resolve_did_key(did))
    spent = 0.0
    t0 = time.perf_counter()
    r = await server.handle("hello", hs.hello())
    spent += time.perf_counter() - t0
    if r.error is not None:
        return None, spent
    proof = hs.receive_challenge(r.result)
    t0 = time.perf_counter()
    r = await server.handle("proof", proof)
    spent += time.perf_counter() - t0
    accept = hs.receive_policy(r.result)
    t0 = time.perf_counter()
    r = await server.handle("accept_policy", accept)
    spent += time.perf_counter() - t0
    if r.error is not None:
        assert r.http_status == 503, r.error
        return None, spent
    return hs.receive_session(r.result), spent


async def _intent(
    server: ServerProtocol, session: ClientSession, intent: dict[str, Any], status: int = 200
) -> float:
    req = session.prepare_intent(intent)
    t0 = time.perf_counter()
    reply = await server.handle("intent", req.params)
    spent = time.perf_counter() - t0
    assert reply.http_status == status, (reply.http_status, reply.error)
    if status == 200:
        session.verify_result(req, reply.result)
    return spent


# -- filling tables through the store interface --------------------------------------------
def _pending(server_did: str, client: Identity, source: str, now: int) -> PendingHandshake:
    policy = Policy.build(rate_limit=BIG, rate_period=3600, session_timeout=3600)
    return PendingHandshake(
        nonce_b=_rid(),
        nonce_a=_rid(),
        client_did=client.did,
        client_agent_id="filler",
        client_keys={client.kid: client.public_key},
        client_manifest_hash=encoding.hash_of({"c": 1}),
        server_manifest_hash=encoding.hash_of({"s": 1}),
        hello_hash=encoding.hash_of({"h": 1}),
        challenge_hash=encoding.hash_of({"ch": 1}),
        policy=policy,
        policy_hash=policy.hash,
        policy_signature="e30.e30.AAAA",
        created_at=now,
        expires_at=now + 60,
        source=source,
        server_did=server_did,
    )


async def _batches(n: int, make: Callable[[int], Awaitable[Any]], width: int) -> None:
    for start in range(0, n, width):
        await asyncio.gather(*(make(i) for i in range(start, min(n, start + width))))


async def fill_sessions(store: Any, server_did: str, n: int, width: int) -> list[str]:
    filler = Identity.generate("filler")
    now = int(time.time())
    ids: list[str] = []

    async def one(i: int) -> None:
        p = _pending(server_did, filler, f"fill-{i % 64}", now)
        assert await store.add_pending(p, max_per_source=BIG, max_total=BIG, now=now)
        assert await store.mark_proven(p.nonce_b, filler.kid, now, agent=server_did)
        rec = SessionRecord(
            session_id=_rid(),
            session_commitment=encoding.hash_of({"c": i}),
            client_did=filler.did,
            server_did=server_did,
            client_kid=filler.kid,
            client_key=filler.public_key,
            policy=p.policy,
            created_at=now,
            expires_at=now + 3600,
        )
        await store.open_session(p.nonce_b, rec, max_sessions=BIG, now=now, agent=server_did)
        ids.append(rec.session_id)

    await _batches(n, one, width)
    return ids


async def fill_pending(store: Any, server_did: str, n: int, width: int) -> None:
    filler = Identity.generate("filler")
    now = int(time.time()) + 3000  # live for the whole run (HELLO checks use the real clock)

    async def one(i: int) -> None:
        p = replace(_pending(server_did, filler, f"fill-{i % 64}", now), expires_at=now + 3600)
        assert await store.add_pending(p, max_per_source=BIG, max_total=BIG, now=now - 3000)

    await _batches(n, one, width)


async def fill_claims(store: Any, server_did: str, did: str, carriers: list[str], n: int) -> None:
    """``n`` claims of ``did``, made on the ``carriers`` sessions side by side (one each at a
    time, so that each session's sequences arrive in order)."""
    now = int(time.time())
    last = dict.fromkeys(carriers, 0)

    async def one(i: int) -> None:
        claim = ClaimRequest(f"fill-{i:08d}-{uuid.uuid4().hex}", "h" * 43, now + 30, now + 3600, BIG, None)
        sid = carriers[i % len(carriers)]
        last[sid] += 1
        s = last[sid]
        _, got = await store.begin_intent(
            sid, did, s, f"r{s}", rate_limit=None, rate_period=60, now=now, claim=claim, agent=server_did
        )
        assert got is not None

    await _batches(n, one, len(carriers))


def _action(caller: str, now: int) -> PendingAction:
    data = {"n": _rid()}
    return PendingAction(
        action_id=_rid(),
        action="create_event",
        goal="create_event",
        caller_did=caller,
        action_data=data,
        action_hash=encoding.hash_of(data),
        preview="event",
        created_at=now,
        expires_at=now + 3600,
        keep_until=now + 4200,
    )


async def fill_actions(store: Any, n: int, width: int) -> None:
    now = int(time.time())

    async def one(i: int) -> None:
        # Callers of 100 actions each: a flood's DIDs, each at a per-caller bound.
        caller = f"did:key:filler{i // 100}"
        assert await store.add_action(_action(caller, now), max_per_caller=BIG, max_total=BIG, now=now)

    await _batches(n, one, width)


# -- the cases ------------------------------------------------------------------------------
async def build(store_kind: str, fill: int) -> tuple[dict[str, Timer], Callable[[], Awaitable[None]]]:
    """Every case as a coroutine that runs one operation and returns the server's seconds."""
    stores: list[Any] = []

    def new_store() -> Any:
        if store_kind == "memory":
            store: Any = MemoryStore()
        else:
            from a2a_secure.store.redis import RedisStore

            store = RedisStore(REDIS_URL, prefix=f"a2a-bench:{uuid.uuid4().hex}:")
        stores.append(store)
        return store

    width = 1 if store_kind == "memory" else 64
    client = Identity.generate("bench-client")
    cases: dict[str, Timer] = {}

    # Sessions: 1 open, ``fill`` open (room left), at the limit, the deadline table full.
    small, small_id = _server(new_store())
    s_small, _ = await _handshake(small, client, small_id.did)
    big_store = new_store()
    big, big_id = _server(big_store)
    s_big, _ = await _handshake(big, client, big_id.did)
    await fill_sessions(big_store, big_id.did, fill, width)
    full, full_id = _server(big_store)
    count = fill + 1
    full._config.limits = replace(full._config.limits, max_sessions=count)
    dl, dl_id = _server(new_store(), max_sessions=fill)
    deadlines = dl._handshake._deadlines
    for i in range(fill):  # sessions this process opened, closed since by other workers
        deadlines.note(f"elsewhere-{i}", 3600)
    assert s_small is not None and s_big is not None

    async def accepted(server: ServerProtocol, did: str) -> float:
        session, spent = await _handshake(server, client, did)
        assert session is not None
        await server.handle("close", session.prepare_close().params)  # not timed
        return spent

    async def refused_handshake() -> float:
        session, spent = await _handshake(full, client, full_id.did)
        assert session is None
        return spent

    cases["intent, 1 session"] = lambda: _intent(small, s_small, INTENT)
    cases[f"intent, {fill} sessions"] = lambda: _intent(big, s_big, INTENT)
    cases["handshake, 1 session"] = lambda: accepted(small, small_id.did)
    cases[f"handshake, {fill} sessions"] = lambda: accepted(big, big_id.did)
    cases[f"handshake refused at the limit ({fill})"] = refused_handshake
    cases[f"handshake, {fill} deadlines held"] = lambda: accepted(dl, dl_id.did)

    # Delegation, later uses: the chain named by its hash, against a plain intent on the same
    # session of a server of its own (no handshakes beside it).
    chains, chains_id = _server(new_store())
    s_chains, _ = await _handshake(chains, client, chains_id.did)
    assert s_chains is not None
    person = Identity.generate("person")
    hops = [Identity.generate(f"hop-{i}") for i in range(4)]
    now = time.time()
    one_link = issue(person, to=client.did, goals=["echo"], ttl=7200, now=now, targets=[chains_id.did])
    five: Chain = issue(person, to=hops[0].did, goals=["echo"], ttl=7200, now=now, targets=[chains_id.did])
    for a, b in zip(hops, [*hops[1:], client], strict=True):
        five = five.further(a, to=b.did, now=now)
    for chain in (one_link, five):
        await _intent(chains, s_chains, {**INTENT, "delegation": chain.tokens})
    cases["intent, no chain"] = lambda: _intent(chains, s_chains, INTENT)
    cases["intent, chain of 1 (later use)"] = lambda: _intent(
        chains, s_chains, {**INTENT, "delegation": one_link.hash}
    )
    cases["intent, chain of 5 (later use)"] = lambda: _intent(
        chains, s_chains, {**INTENT, "delegation": five.hash}
    )

    # Pending handshakes: a HELLO against an empty table, refused at a full one.
    pend_store = new_store()
    pend, pend_id = _server(pend_store, max_pending_total=fill)
    await fill_pending(pend_store, pend_id.did, fill, width)
    hello_small, hello_small_id = _server(new_store())

    async def hello(server: ServerProtocol, did: str, status: int) -> float:
        hs = ClientHandshake(client, resolve_did_key(did))
        params = hs.hello()
        t0 = time.perf_counter()
        r = await server.handle("hello", params)
        spent = time.perf_counter() - t0
        assert r.http_status == status, r.error
        return spent

    cases["HELLO, empty table"] = lambda: hello(hello_small, hello_small_id.did, 200)
    cases[f"HELLO refused, {fill} pending"] = lambda: hello(pend, pend_id.did, 503)

    # Intent ids: 1 remembered, ``fill`` remembered (room), refused at the store's bound and
    # at the DID's (``fill`` ids of the bench client).
    ids_small, ids_small_id = _server(new_store())
    i_small, _ = await _handshake(ids_small, client, ids_small_id.did)
    ids_store = new_store()
    ids_big, ids_big_id = _server(ids_store, max_intent_ids_per_did=BIG, max_intent_ids_total=BIG)
    i_big, _ = await _handshake(ids_big, client, ids_big_id.did)
    assert i_small is not None and i_big is not None
    carriers = await fill_sessions(ids_store, ids_big_id.did, width, width)  # the fill's own sequences
    await fill_claims(ids_store, ids_big_id.did, client.did, carriers, fill)
    ids_total, ids_total_id = _server(ids_store, max_intent_ids_total=fill)
    other = Identity.generate("bench-other")
    i_total, _ = await _handshake(ids_total, other, ids_total_id.did)
    # The same agent as ids_big (its claims are the agent's), with a DID bound of ``fill``.
    ids_own, _ = _server(ids_store, ids_big_id, max_intent_ids_per_did=fill, max_intent_ids_total=BIG)
    i_own, _ = await _handshake(ids_own, client, ids_big_id.did)
    assert i_total is not None and i_own is not None

    def with_id() -> dict[str, Any]:
        return {**INTENT, "intent_id": uuid.uuid4().hex}

    cases["intent_id, 1 remembered"] = lambda: _intent(ids_small, i_small, with_id())
    cases[f"intent_id, {fill} remembered"] = lambda: _intent(ids_big, i_big, with_id())
    cases[f"intent_id refused, store bound ({fill})"] = lambda: _intent(ids_total, i_total, with_id(), 503)
    cases[f"intent_id refused, DID bound ({fill})"] = lambda: _intent(ids_own, i_own, with_id(), 503)

    # Actions waiting for approval (store level).
    act_small, act_big = new_store(), new_store()
    await fill_actions(act_big, fill, width)
    t_now = int(time.time())

    async def add(store: Any, bound: int, ok: bool) -> float:
        a = _action(f"did:key:{uuid.uuid4().hex}", t_now)
        t0 = time.perf_counter()
        added = await store.add_action(a, max_per_caller=BIG, max_total=bound, now=t_now)
        spent = time.perf_counter() - t0
        assert bool(added) is ok
        return spent

    cases["add_action, 1 pending"] = lambda: add(act_small, BIG, True)
    cases[f"add_action, {fill} pending"] = lambda: add(act_big, BIG, True)
    cases[f"add_action refused, {fill} pending"] = lambda: add(act_big, fill, False)

    async def close() -> None:
        for store in stores:
            prefix = getattr(store, "prefix", None)
            await store.aclose()
            if isinstance(prefix, str) and prefix.startswith("a2a-bench:"):
                from redis.asyncio import Redis

                r = Redis.from_url(REDIS_URL)
                keys = [k async for k in r.scan_iter(match=prefix + "*", count=5000)]
                for i in range(0, len(keys), 5000):
                    await r.delete(*keys[i : i + 5000])
                await r.aclose()

    return cases, close


RATIOS = [
    # (label, case, baseline, bound)
    ("intent: N sessions / 1", "intent, {n} sessions", "intent, 1 session", 1.10),
    ("handshake: N sessions / 1", "handshake, {n} sessions", "handshake, 1 session", 1.10),
    (
        "handshake refused at limit / accepted",
        "handshake refused at the limit ({n})",
        "handshake, 1 session",
        1.00,
    ),
    ("handshake: N deadlines held / 1", "handshake, {n} deadlines held", "handshake, 1 session", 1.10),
    ("chain of 1, later use / plain", "intent, chain of 1 (later use)", "intent, no chain", 1.05),
    ("chain of 5, later use / plain", "intent, chain of 5 (later use)", "intent, no chain", 1.05),
    ("HELLO refused at full table / accepted", "HELLO refused, {n} pending", "HELLO, empty table", 1.00),
    ("intent_id: N remembered / 1", "intent_id, {n} remembered", "intent_id, 1 remembered", 1.10),
    (
        "intent_id refused, store bound / accepted",
        "intent_id refused, store bound ({n})",
        "intent_id, 1 remembered",
        1.00,
    ),
    (
        "intent_id refused, DID bound / accepted",
        "intent_id refused, DID bound ({n})",
        "intent_id, 1 remembered",
        1.00,
    ),
    ("add_action: N pending / 1", "add_action, {n} pending", "add_action, 1 pending", 1.10),
    (
        "add_action refused at full / accepted",
        "add_action refused, {n} pending",
        "add_action, 1 pending",
        1.10,
    ),
]


async def run(store_kind: str, fill: int, rounds: int, ops: int) -> dict[str, float]:
    t0 = time.perf_counter()
    cases, close = await build(store_kind, fill)
    print(f"filled in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    chunk = 10
    try:
        for case in cases.values():
            await case()  # warm
        # Every case runs ``chunk`` operations in turn, round after round: a spell of load
        # from elsewhere on the machine falls on all of them alike, and the median of the
        # single operations leaves out those it hit.
        order = list(cases.items())
        for turn in range(rounds * max(1, ops // chunk)):
            gc.collect()
            gc.disable()
            try:
                # Each turn starts at another case: none is always first after the collection.
                for name, case in order[turn % len(order) :] + order[: turn % len(order)]:
                    samples[name] += [await case() for _ in range(chunk)]
            finally:
                gc.enable()
    finally:
        await close()
    return {name: statistics.median(v) * 1e6 for name, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=("memory", "redis"), default="memory")
    ap.add_argument(
        "--fill", type=int, default=None, help="entries per full table (memory 100000, redis 20000)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=200, help="operations per case per round")
    args = ap.parse_args(argv)
    fill = args.fill or (100_000 if args.store == "memory" else 20_000)
    med = asyncio.run(run(args.store, fill, args.rounds, args.ops))
    many = args.rounds * args.ops
    print(f"{args.store} store, N = {fill}; server µs per operation, median of {many} interleaved")
    for name, us in med.items():
        print(f"  {name:48s} {us:9.1f} µs")
    print("ratios (bound)")
    worst = True
    for label, case, base, bound in RATIOS:
        ratio = med[case.format(n=fill)] / med[base]
        ok = ratio <= bound + (0.05 if bound == 1.0 else 0.0)  # "no dearer": within noise
        worst &= ok
        print(f"  {label:48s} {ratio:6.3f}x  (<= {bound:.2f}) {'ok' if ok else 'OVER'}")
    return 0 if worst else 1


if __name__ == "__main__":
    raise SystemExit(main())
