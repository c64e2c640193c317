"""Memory per open session in ``MemoryStore`` (RSS delta in a fresh process), and the store
records the memory cases fill stores with.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from a2abench.common import ENTRY, HOST, INTENT
from a2abench.runner import Bench, rss_bytes


def _fake_pending(i: int, policy: Any, server_did: str, now: int) -> tuple[Any, Any]:
    """A pending handshake and the session it opens, with fresh values like real ones."""
    from a2a_secure.identity import encoding
    from a2a_secure.identity.did import did_key_from_public_key, key_id_for_did_key
    from a2a_secure.store.base import PendingHandshake, SessionRecord

    key = os.urandom(32)
    did = did_key_from_public_key(key)
    kid = key_id_for_did_key(did)

    def h() -> str:
        return encoding.hash_bytes(os.urandom(16))

    pending = PendingHandshake(
        nonce_b=encoding.b64u_encode(os.urandom(32)),
        nonce_a=encoding.b64u_encode(os.urandom(32)),
        client_did=did,
        client_agent_id=f"bench-client-{i}",
        client_keys={kid: key},
        client_manifest_hash=h(),
        server_manifest_hash=h(),
        hello_hash=h(),
        challenge_hash=h(),
        policy=policy,
        policy_hash=h(),
        policy_signature=encoding.b64u_encode(os.urandom(180)),
        created_at=now,
        expires_at=now + 60,
        source=HOST,
    )
    record = SessionRecord(
        session_id=encoding.b64u_encode(os.urandom(32)),
        session_commitment=h(),
        client_did=did,
        server_did=server_did,
        client_kid=kid,
        client_key=key,
        policy=policy,
        created_at=now,
        expires_at=now + 3600,
        client_agent_id=f"bench-client-{i}",
    )
    return pending, record


def _fake_reply(i: int) -> Any:
    """The stored answer of an echo intent, as ServerProtocol keeps it (a distinct copy each).

    The engine keeps an answered request's result and signing time, not its signed token: a
    byte-identical retry gets the same token signed again (``Reply.stored``).
    """
    from a2a_secure.store.base import StoredReply

    result = json.loads(json.dumps(INTENT["inputs"]))
    return StoredReply(200, result, signed_at=int(time.time()) + i % 7)


def probe_memory(n: int) -> dict[str, Any]:
    """Entry point of ``--probe-memory N`` (a fresh process, so that RSS is not polluted)."""
    import gc

    from a2a_secure.identity import encoding
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.store.memory import MemoryStore

    store = MemoryStore()
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)  # shared, as in a server
    server_did = Identity.generate("bench-server").did
    now = int(time.time())
    big = 10**9

    async def fill() -> list[tuple[str, str]]:
        ids = []
        for i in range(n):
            pending, record = _fake_pending(i, policy, server_did, now)
            await store.add_pending(pending, max_per_source=big, max_total=big, now=now)
            await store.mark_proven(pending.nonce_b, record.client_kid, now)
            await store.open_session(pending.nonce_b, record, max_sessions=big, now=now)
            ids.append((record.session_id, record.client_did))
        return ids

    async def one_intent(ids: list[tuple[str, str]]) -> None:
        for i, (sid, did) in enumerate(ids):
            rh = encoding.hash_bytes(os.urandom(16))
            await store.begin_request(sid, did, 1, rh, rate_limit=1000, rate_period=3600, now=now)
            await store.finish_request(sid, 1, _fake_reply(i))

    gc.collect()
    rss0 = rss_bytes()
    ids = asyncio.run(fill())
    gc.collect()
    rss1 = rss_bytes()
    # The list of ids kept for the second step shares its strings with the store: only the
    # list and its tuples are this probe's own.
    ids_bytes = sys.getsizeof(ids) + sum(sys.getsizeof(t) for t in ids)
    asyncio.run(one_intent(ids))
    gc.collect()
    rss2 = rss_bytes()
    assert store.counts()["sessions"] == n
    return {
        "sessions": n,
        "rss_before": rss0,
        "bytes_per_session": (rss1 - rss0 - ids_bytes) / n,
        "bytes_per_session_after_one_intent": (rss2 - rss0 - ids_bytes) / n,
        "ids_bytes_subtracted": ids_bytes,
    }


def run_memory(bench: Bench) -> None:
    bench.log(f"memory: {bench.s.memory_sessions} sessions in MemoryStore")
    out = subprocess.run(
        [sys.executable, str(ENTRY), "--probe-memory", str(bench.s.memory_sessions)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        bench.results["memory"] = {"error": out.stderr[-500:]}
    else:
        bench.results["memory"] = json.loads(out.stdout.strip().splitlines()[-1])
