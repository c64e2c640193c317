#!/usr/bin/env python3
"""What the store settings that keep intent_id claims through faults cost, per intent.

Through ``RedisStore`` itself (the scripts the server runs), one intent is: with an
``intent_id``, ``begin_intent`` (the claim), ``start_intent`` (the start) and
``finish_intent`` (the answer kept before it is sent, with the session's answer); without
one, ``begin_request`` and ``finish_request``. Measured against redis-servers this script
starts on free ports in a temporary directory (never the machine's Redis):

* ``none``      no AOF (what a kill loses: everything since the start)
* ``everysec``  ``appendonly yes``, ``appendfsync everysec`` (a process kill loses nothing;
  an OS crash up to about a second)
* ``always``    ``appendonly yes``, ``appendfsync always`` (an acknowledged write is on disk)
* ``wait1``     ``everysec`` with one replica and ``wait_replicas=1`` (``WAIT 1 800`` after
  each claim and answer: a failover keeps every claim an intent ran under)

Rounds of ``--ops`` intents per setting, interleaved (the machine's noise hits every setting
alike); the median per-intent time of each and its ratio to ``none`` without an id.

    python scripts/bench_durability.py [--rounds 5] [--ops 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_exactly_once import open_bench_session  # noqa: E402

from a2a_secure.identity import encoding  # noqa: E402
from a2a_secure.identity.keys import Identity  # noqa: E402
from a2a_secure.policy import Policy  # noqa: E402
from a2a_secure.store.base import SessionRecord, StoredReply  # noqa: E402
from a2a_secure.store.intents import ClaimRequest  # noqa: E402
from a2a_secure.store.redis import RedisStore  # noqa: E402

NOW = 1_763_700_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: Path, name: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    d = workdir / name
    d.mkdir()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", ""]
    proc = subprocess.Popen([*args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    for _ in range(200):
        try:
            if redis.Redis(port=port).ping():
                return proc, port
        except redis.RedisError:
            time.sleep(0.02)
    raise RuntimeError(f"redis-server {name} did not start")


def synced(primary: int) -> None:
    """Wait for the replica of ``primary`` to be online (its first sync done)."""
    import redis

    for _ in range(1000):
        slave = redis.Redis(port=primary).info("replication").get("slave0")
        if isinstance(slave, dict) and slave.get("state") == "online":
            return
        time.sleep(0.02)
    raise RuntimeError("the replica did not sync")


async def session(store: RedisStore, client: Identity, server: Identity) -> SessionRecord:
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    rec: SessionRecord = await open_bench_session(
        store, client, server, policy, secrets.randbelow(2**31), NOW
    )
    return rec


class Bench:
    def __init__(self, store: RedisStore, rec: SessionRecord, client: Identity, server: Identity) -> None:
        self.store, self.rec, self.client, self.server = store, rec, client, server
        self.seq = 0
        self.reply = StoredReply(200, result={"text": "x" * 200}, signed_at=NOW)

    async def intents(self, n: int, *, with_id: bool) -> float:
        store, did, agent = self.store, self.client.did, self.server.did
        t = time.perf_counter()
        for _ in range(n):
            self.seq += 1
            rh = encoding.hash_of({"r": self.seq})
            if with_id:
                iid = encoding.b64u_encode(secrets.token_bytes(18))
                owner = secrets.token_bytes(16)
                ih = encoding.hash_of({"i": iid})
                claim = ClaimRequest(iid, ih, NOW + 100, NOW + 86_400, 10**9, 10**9, owner=owner)
                await store.begin_intent(
                    self.rec.session_id, did, self.seq, rh, rate_limit=None, rate_period=3600, now=NOW,
                    claim=claim, agent=agent,
                )  # fmt: skip
                assert await store.start_intent(did, iid, ih, owner, agent=agent)
                await store.finish_request(self.rec.session_id, self.seq, self.reply)
                await store.finish_intent(did, iid, ih, self.reply, agent=agent)
            else:
                await store.begin_request(
                    self.rec.session_id,
                    did,
                    self.seq,
                    rh,
                    rate_limit=None,
                    rate_period=3600,
                    now=NOW,
                    agent=agent,
                )
                await store.finish_request(self.rec.session_id, self.seq, self.reply)
        return (time.perf_counter() - t) / n


async def main_async(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-durability-"))
    procs: list[subprocess.Popen[bytes]] = []
    stores: list[RedisStore] = []
    try:
        ports: dict[str, int] = {}
        for name, extra in {
            "none": ["--appendonly", "no"],
            "everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
            "always": ["--appendonly", "yes", "--appendfsync", "always"],
        }.items():
            proc, ports[name] = start_redis(workdir, name, extra)
            procs.append(proc)
        everysec = ["--appendonly", "yes", "--appendfsync", "everysec", "--repl-diskless-sync-delay", "0"]
        proc, primary = start_redis(workdir, "primary", everysec)
        procs.append(proc)
        replica = ["--appendonly", "yes", "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1"]
        proc, _ = start_redis(workdir, "replica", [*replica, str(primary)])
        procs.append(proc)
        ports["wait1"] = primary

        await asyncio.to_thread(synced, primary)
        client, server = Identity.generate("bench-client"), Identity.generate("bench-server")
        benches: dict[str, Bench] = {}
        for name, port in ports.items():
            store = RedisStore(
                f"redis://127.0.0.1:{port}/0",
                prefix=f"bench-dur:{uuid.uuid4().hex}:",
                wait_replicas=1 if name == "wait1" else 0,
                wait_timeout_ms=800,
            )
            stores.append(store)
            benches[name] = Bench(store, await session(store, client, server), client, server)
        times: dict[tuple[str, bool], list[float]] = {(n, w): [] for n in benches for w in (False, True)}
        for _ in range(args.rounds):
            for name, bench in benches.items():
                for with_id in (False, True):
                    times[(name, with_id)].append(await bench.intents(args.ops, with_id=with_id))
        base = statistics.median(times[("none", False)])
        print(f"{args.rounds} rounds of {args.ops} intents per setting, interleaved; median per intent")
        print(f"{'setting':10s} {'no id (us)':>11s} {'ratio':>6s} {'with id (us)':>13s} {'ratio':>6s}")
        for name in benches:
            plain = statistics.median(times[(name, False)])
            with_id = statistics.median(times[(name, True)])
            row = f"{name:10s} {plain * 1e6:11.0f} {plain / base:6.2f}"
            print(f"{row} {with_id * 1e6:13.0f} {with_id / base:6.2f}")
    finally:
        for store in stores:
            await store.aclose()
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("needs redis-server on PATH")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
