#!/usr/bin/env python3
"""Bytes in Redis per remembered intent_id (the intent_id extension) and per session.

Through ``RedisStore`` itself (the same scripts the server runs), under a fresh key prefix
that is deleted at the end:

* ``--ids`` intent_ids of one DID, each answered with a result whose JSON is ``--answer``
  bytes: ``MEMORY USAGE`` of each id's hash plus its share of the DID's sorted set, the
  growth of ``used_memory`` per id (which also counts the key table and the expiry table),
  and both minus the answer's own bytes (the overhead);
* ``--sessions`` sessions, each after one answered intent: ``MEMORY USAGE`` per session
  hash and the growth of ``used_memory`` per session.

    python scripts/bench_exactly_once.py [--redis redis://127.0.0.1:6379/0] [--ids 2000] [--answer 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def open_bench_session(store: Any, client: Any, server: Any, policy: Any, i: int, now: int) -> Any:
    """A session of ``client`` at ``server`` opened through the store's own handshake steps."""
    from a2a_secure.identity import encoding
    from a2a_secure.store.base import PendingHandshake, SessionRecord

    nonce_b = encoding.b64u_encode(i.to_bytes(4, "big") * 8)
    pending = PendingHandshake(
        nonce_b=nonce_b,
        nonce_a=encoding.b64u_encode(b"a" * 32),
        client_did=client.did,
        client_agent_id="bench-client",
        client_keys={client.kid: client.public_key},
        client_manifest_hash=encoding.hash_of({"c": 1}),
        server_manifest_hash=encoding.hash_of({"s": 1}),
        hello_hash=encoding.hash_of({"h": i}),
        challenge_hash=encoding.hash_of({"ch": i}),
        policy=policy,
        policy_hash=policy.hash,
        policy_signature="e30.e30.AAAA",
        created_at=now,
        expires_at=now + 60,
        server_did=server.did,
    )
    assert await store.add_pending(pending, max_per_source=10**9, max_total=10**9, now=now)
    assert await store.mark_proven(nonce_b, client.kid, now, agent=server.did)
    rec = SessionRecord(
        session_id=encoding.b64u_encode(uuid.uuid4().bytes * 2),
        session_commitment=encoding.hash_of({"commit": i}),
        client_did=client.did,
        server_did=server.did,
        client_kid=client.kid,
        client_key=client.public_key,
        policy=policy,
        created_at=now,
        expires_at=now + 3600,
        client_agent_id="bench-client",
    )
    await store.open_session(nonce_b, rec, max_sessions=10**9, now=now, agent=server.did)
    return rec


async def measure(url: str, ids: int, sessions: int, answer_bytes: int) -> dict[str, Any]:
    import redis.asyncio as redis_asyncio

    from a2a_secure.identity import encoding
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.protocol.intent_id import new_intent_id
    from a2a_secure.store.base import SessionRecord, StoredReply
    from a2a_secure.store.intents import ClaimRequest
    from a2a_secure.store.redis import RedisStore

    prefix = f"bench-eo:{uuid.uuid4().hex}:"
    store = RedisStore(url, prefix=prefix, finish_linger=None)
    r = redis_asyncio.Redis.from_url(url)
    client = Identity.generate("bench-client")
    server = Identity.generate("bench-server")
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    now = 1_763_700_000

    async def used() -> int:
        return int((await r.info("memory"))["used_memory"])

    async def open_session(i: int) -> SessionRecord:
        return await open_bench_session(store, client, server, policy, i, now)

    result_value = {"text": "x" * (answer_bytes - 11)}  # {"text":"…"} is answer_bytes long
    reply = StoredReply(200, result=result_value, signed_at=now)
    answer_len = len(encoding.dumps(reply.to_dict()))
    try:
        sess = await open_session(0)
        base = await used()
        iids = []
        for seq in range(1, ids + 1):
            iid = new_intent_id(os.urandom)
            iids.append(iid)
            claim = ClaimRequest(iid, encoding.hash_of({"i": iid}), now + 100, now + 86_400, 10**9, 10**9)
            await store.begin_intent(
                sess.session_id,
                client.did,
                seq,
                encoding.hash_of({"r": seq}),
                rate_limit=10**9,
                rate_period=3600,
                now=now,
                claim=claim,
                agent=server.did,
            )
            await store.finish_intent(client.did, iid, claim.intent_hash, reply, agent=server.did)
        grown_ids = (await used()) - base
        per_key = [
            int(await r.memory_usage(store._k_intent(server.did, client.did, iid)) or 0) for iid in iids[:200]
        ]
        zset = int(await r.memory_usage(store._k_intents(server.did, client.did)) or 0)
        zset += int(await r.memory_usage(store._k_intents_all()) or 0)  # the store's bound

        base = await used()
        recs = []
        for i in range(1, sessions + 1):
            rec = await open_session(i)
            await store.begin_request(
                rec.session_id,
                client.did,
                1,
                encoding.hash_of({"s": i}),
                rate_limit=None,
                rate_period=3600,
                now=now,
            )
            await store.finish_request(
                rec.session_id, 1, StoredReply(200, result={"ok": True}, signed_at=now)
            )
            recs.append(rec)
        grown_sessions = (await used()) - base
        per_session = [int(await r.memory_usage(store._k_session(rec.session_id)) or 0) for rec in recs[:200]]
    finally:
        keys = [k async for k in r.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await r.delete(*keys)
        await r.aclose()
        await store.aclose()
    per_id_usage = statistics.mean(per_key) + zset / ids
    return {
        "answer_json_bytes": answer_len,
        "intent_id": {
            "memory_usage_hash": round(statistics.mean(per_key), 1),
            "memory_usage_zset_share": round(zset / ids, 1),
            "memory_usage_total": round(per_id_usage, 1),
            "memory_usage_overhead": round(per_id_usage - answer_len, 1),
            "used_memory_per_id": round(grown_ids / ids, 1),
            "used_memory_overhead": round(grown_ids / ids - answer_len, 1),
        },
        "session": {
            "memory_usage_hash": round(statistics.mean(per_session), 1),
            "used_memory_per_session": round(grown_sessions / sessions, 1),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--ids", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--answer", type=int, default=1024, help="bytes of the answer's JSON")
    args = parser.parse_args()
    out = asyncio.run(measure(args.redis, args.ids, args.sessions, args.answer))
    import json

    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
