#!/usr/bin/env python3
"""RedisStore on a 3-primary Redis Cluster against one Redis: throughput, CPU, spread.

    python scripts/bench_cluster.py [--seconds 5] [--rounds 2] [--sessions 100000]

Everything runs on this machine, on loopback: a local cluster (three primaries, three
replicas; tests/cluster_helpers.py) and a single ``redis-server`` (tests/redis_helpers.py).
Prints:

* intents/s and server CPU per intent for two uvicorn workers (one identity, the ``echo``
  intent) on the cluster and on the single Redis, in alternating short rounds, driven by
  ``--clients`` concurrent raw clients (each its own DID and session, requests signed and
  answers verified in this process, to both workers in turn). Server CPU is the workers'
  user+system time from ``/proc/<pid>/stat``; on a small machine the clients, the workers
  and Redis share the cores, so compare the two rows, not the absolute numbers;
* the keys per primary after ``--sessions`` sessions opened through ``RedisStore`` (add,
  prove, open, as a server does), and the largest deviation from the mean.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_workers(
    redis_url: str, prefix: str, tmp: Path
) -> tuple[list[str], list[subprocess.Popen[bytes]], Any]:
    from redis_helpers import free_port

    from a2a_secure.identity.keys import Identity

    server = Identity.generate("bench-cluster")
    key_file = tmp / f"{prefix.strip(':')}.key"
    server.save(key_file)
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"rate_limit": 10_000_000, "rate_period": 3600}))
    env = {
        **os.environ,
        "A2A_SECURE_KEY_FILE": str(key_file),
        "A2A_SECURE_POLICY": str(policy),
        "A2A_SECURE_REDIS_URL": redis_url,
        "A2A_SECURE_REDIS_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    env.pop("A2A_SECURE_AUDIT_LOG", None)
    env.pop("A2A_SECURE_APP", None)
    urls, procs = [], []
    for _ in range(2):
        port = free_port()
        args = [sys.executable, "-m", "uvicorn", "--factory", "a2a_secure.server.run:app_from_env"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    import httpx

    for url in urls:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"worker {url} did not start")
            time.sleep(0.05)
    return urls, procs, server


async def _load(urls: list[str], server_did: str, seconds: float, clients: int) -> tuple[int, float]:
    """(intents answered, seconds measured) after a one-second warm-up."""
    import httpx
    from test_multiworker import client_identity, handshake, send

    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=clients * 2)) as http:
        sessions = [await handshake(http, urls, client_identity(f"b{i}"), server_did) for i in range(clients)]
        state = {"count": False, "stop": False, "n": 0}

        async def one(sess: Any) -> None:
            for k in itertools.count():
                if state["stop"]:
                    return
                req = sess.prepare_intent({"goal": "echo", "inputs": {"k": k}})
                resp = await send(http, urls[k % 2], req)
                assert resp.status_code == 200, resp.text
                sess.verify_result(req, resp.json()["result"])
                if state["count"]:
                    state["n"] += 1

        tasks = [asyncio.create_task(one(s)) for s in sessions]
        await asyncio.sleep(1.0)
        state["count"] = True
        t = time.monotonic()
        await asyncio.sleep(seconds)
        state["count"] = False
        elapsed = time.monotonic() - t
        state["stop"] = True
        await asyncio.gather(*tasks)
        return int(state["n"]), elapsed


def _measure(
    urls: list[str], procs: list[subprocess.Popen[bytes]], did: str, seconds: float, clients: int
) -> tuple[float, float]:
    before = sum(_cpu(p.pid) for p in procs)
    n, elapsed = asyncio.run(_load(urls, did, seconds, clients))
    # The warm-up second is in the CPU window too: scale it out by the share of the run.
    cpu = (sum(_cpu(p.pid) for p in procs) - before) * elapsed / (elapsed + 1.0)
    return n / elapsed, cpu / max(n, 1) * 1e6


async def _open_sessions(url: str, prefix: str, n: int, batch: int = 256) -> None:
    from test_store_contract import CLIENT, T0, pending, session

    from a2a_secure.store.base import OpenResult
    from a2a_secure.store.redis import RedisStore

    store = RedisStore(url, prefix=prefix)

    async def one(i: int) -> None:
        p = pending(i, source=f"10.{i % 200}.{i % 13}.1")
        assert await store.add_pending(p, max_per_source=10**9, max_total=10**6, now=T0)
        assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
        opened = await store.open_session(p.nonce_b, session(i), max_sessions=10**6, now=T0)
        assert opened is OpenResult.OPENED

    try:
        for start in range(1, n + 1, batch):
            await asyncio.gather(*(one(i) for i in range(start, min(n + 1, start + batch))))
    finally:
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round and setup")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args()

    from cluster_helpers import LocalCluster
    from redis_helpers import OwnedRedis
    from test_store_cluster import keys_per_primary

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "cluster").mkdir()
        (tmp / "single").mkdir()
        with LocalCluster(tmp / "cluster") as cluster, OwnedRedis(tmp / "single") as single:
            setups = {}
            all_procs: list[subprocess.Popen[bytes]] = []
            try:
                for name, url in (("one Redis", single.url), ("3-primary cluster", cluster.url)):
                    urls, procs, server = _start_workers(url, f"bench{len(setups)}:", tmp)
                    all_procs += procs
                    setups[name] = (urls, procs, server.did)
                results: dict[str, list[tuple[float, float]]] = {name: [] for name in setups}
                for _ in range(args.rounds):
                    for name, (urls, procs, did) in setups.items():
                        results[name].append(_measure(urls, procs, did, args.seconds, args.clients))
            finally:
                for proc in all_procs:
                    proc.terminate()
                for proc in all_procs:
                    proc.wait(10)
            runs = f"{args.rounds} rounds of {args.seconds:.0f} s"
            print(f"2 uvicorn workers, {args.clients} clients, {runs} (median):")
            print(f"  {'store':<20} {'intents/s':>10} {'server CPU µs/intent':>22}")
            for name, rows in results.items():
                rate = statistics.median(r for r, _ in rows)
                cpu = statistics.median(c for _, c in rows)
                print(f"  {name:<20} {rate:>10.0f} {cpu:>22.0f}")

            prefix = f"spread:{uuid.uuid4().hex[:6]}:"
            t = time.monotonic()
            asyncio.run(_open_sessions(cluster.url, prefix, args.sessions))
            took = time.monotonic() - t
            counts = keys_per_primary(cluster, prefix)
            mean = sum(counts.values()) / len(counts)
            worst = max(abs(c - mean) for c in counts.values()) / mean
            print(f"keys per primary after {args.sessions} sessions (opened in {took:.0f} s):")
            for port, count in counts.items():
                print(f"  127.0.0.1:{port:<6} {count:>8}")
            print(f"  mean {mean:.0f}, max deviation from the mean {worst * 100:.2f} %")


if __name__ == "__main__":
    main()
