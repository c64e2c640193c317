#!/usr/bin/env python3
"""Cost per intent under a depth-3 delegation chain (PROTOCOL.md §12.7), next to a plain one.

Runs ``ServerProtocol`` against ``ClientSession`` in one process (``MemoryStore``, asyncio,
no HTTP), as ``bench_core.py`` does, on a server that accepts chains, and reports µs per
intent (client prepare + sign, server checks + handler + sign, client verify):

* plain: an intent without a chain;
* first use: the first intent of a session, carrying the chain (3 links to parse, 3 issuer
  keys to resolve, 3 signatures to verify, the deny list to read);
* later uses: the next intents of the session, naming the chain by its hash (expiry,
  targets, scope and the deny list are checked again, nothing is verified again);

and the bytes of each request. Plain and delegated intents alternate in batches, each kind
keeps its fastest batch, and every figure is the median of ``--rounds`` rounds.

    python scripts/bench_delegation.py [--rounds 5] [--intents 2000] [--first 300]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from bench_core import make_server

from a2a_secure.delegation import Chain, DelegationRules, issue
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.runtime.router import ServerProtocol

INTENT = {"goal": "echo", "domain": "bench", "inputs": {"text": "Hello world", "target_language": "es"}}


async def open_session(server: ServerProtocol, client_id: Identity, server_did: str) -> ClientSession:
    hs = ClientHandshake(client_id, resolve_did_key(server_did))
    challenge = (await server.handle("hello", hs.hello())).result
    policy = (await server.handle("proof", hs.receive_challenge(challenge))).result
    session = (await server.handle("accept_policy", hs.receive_policy(policy))).result
    return hs.receive_session(session)


def depth_3_chain(client: Identity, server_did: str) -> Chain:
    person, first, second = (Identity.generate(n) for n in ("person", "hop-1", "hop-2"))
    now = time.time()
    chain = issue(person, to=first.did, goals=["echo", "other"], ttl=3600, now=now, targets=[server_did])
    chain = chain.further(first, to=second.did, goals=["echo"], now=now)
    return chain.further(second, to=client.did, now=now)


async def one(server: ServerProtocol, session: ClientSession, intent: dict[str, Any]) -> int:
    req = session.prepare_intent(intent)
    reply = await server.handle("intent", req.params)
    assert reply.error is None, reply.error
    session.verify_result(req, reply.result)
    return len(encoding.dumps(req.params))


async def one_round(n_intents: int, n_first: int) -> dict[str, float]:
    server_id, client_id = Identity.generate("bench-server"), Identity.generate("bench-client")
    server = make_server(server_id, sessions=2 * n_first + 2, delegation=DelegationRules())
    chain = depth_3_chain(client_id, server_id.did)
    full = {**INTENT, "delegation": chain.tokens}
    named = {**INTENT, "delegation": chain.hash}
    session = await open_session(server, client_id, server_id.did)
    sizes = {"plain": await one(server, session, INTENT), "first": await one(server, session, full)}
    sizes["later"] = await one(server, session, named)

    out: dict[str, float] = {f"{k}_bytes": float(v) for k, v in sizes.items()}
    # Plain and later uses alternate in batches on the same session, and each keeps its
    # fastest batch: a shared machine's drift then hits both alike.
    best = {"plain": float("inf"), "later": float("inf")}
    batch = max(n_intents // 10, 1)
    for _ in range(10):
        for name, intent in (("plain", INTENT), ("later", named)):
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(batch):
                await one(server, session, intent)
            best[name] = min(best[name], (time.perf_counter() - t0) / batch * 1e6)
    out["plain_us"], out["later_us"] = best["plain"], best["later"]
    # A first use needs a session that has not seen the chain: a handshake each, not timed;
    # the plain intent is timed the same way, as the first intent of a fresh session.
    best = {"plain_first": float("inf"), "first": float("inf")}
    batch = max(n_first // 5, 1)
    for _ in range(5):
        for name, intent in (("plain_first", INTENT), ("first", full)):
            sessions = [await open_session(server, client_id, server_id.did) for _ in range(batch)]
            gc.collect()
            t0 = time.perf_counter()
            for s in sessions:
                await one(server, s, intent)
            best[name] = min(best[name], (time.perf_counter() - t0) / batch * 1e6)
    out["first_us"], out["plain_first_us"] = best["first"], best["plain_first"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--intents", type=int, default=2000, help="later uses (and plain intents) per round")
    ap.add_argument("--first", type=int, default=300, help="first uses per round (a session each)")
    args = ap.parse_args(argv)
    rounds = [asyncio.run(one_round(args.intents, args.first)) for _ in range(args.rounds)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    plain, plain_first = med["plain_us"], med["plain_first_us"]
    print(f"median of {args.rounds} rounds; µs per intent, client and server in one process")
    print(f"  plain intent                {plain:8.1f} µs   {med['plain_bytes']:6.0f} bytes")
    print(
        f"  depth-3 chain, later uses   {med['later_us']:8.1f} µs   {med['later_bytes']:6.0f} bytes"
        f"   {med['later_us'] / plain - 1:+.1%} vs plain"
    )
    print(f"  plain, first of a session   {plain_first:8.1f} µs")
    print(
        f"  depth-3 chain, first use    {med['first_us']:8.1f} µs   {med['first_bytes']:6.0f} bytes"
        f"   {med['first_us'] / plain_first - 1:+.1%} vs plain first"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
