#!/usr/bin/env python3
"""Before/after: the same measurements on two source trees, alternating, in one run.

An optimisation is judged against the tree it changed, on the same machine at the same
time: shared machines drift by tens of percent between runs, so each round measures tree A
then tree B, and the report gives the minimum and the median of the rounds per tree.

    python scripts/bench_ab.py OLD_TREE NEW_TREE [--rounds 5]

A tree is a directory holding ``a2a_secure/`` (a ``git worktree add /tmp/old <commit>``).
Each measurement runs in a fresh interpreter whose ``PYTHONPATH`` is the tree, through only
the public API both trees have:

* ``server``: server CPU µs per signed intent through ``AgentServer.app()`` called as ASGI
  (no socket), 200-intent batches, the fastest and the median batch;
* ``server_handshake``: server CPU µs per full handshake (its three POSTs to
  ``/a2a/handshake``) the same way, 50-handshake batches; the client's steps run between
  the POSTs and are not counted;
* ``client``: client CPU µs per ``A2AClient.request`` and intents/s, one session against a
  uvicorn server of the same tree in its own process;
* ``handshake``: client CPU µs per ``A2AClient.handshake`` against that server;
* ``memory``: the bytes one real intent through ``ServerProtocol`` adds to each open session
  in ``MemoryStore`` (RSS delta over 5000 sessions, one client DID each).

``--instructions`` counts instead of timing (valgrind's callgrind: the same count for the
same work, whatever else the machine does), per operation, in one process: ``server`` (a
signed intent through the ASGI app), ``intent`` (the same with the client's prepare and
verify around it) and ``handshake`` (both sides of a full handshake, the same way). Each is run
for two counts of operations and the difference divided, so start-up and imports cancel.
Python's own instructions only: no HTTP server, no kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

INTENT = {"goal": "echo", "domain": "bench", "inputs": {"text": "Hello world", "target_language": "es"}}
KINDS = ("server", "server_handshake", "client", "handshake", "memory")

# This script's own bench.py (it imports a2a_secure only inside its functions).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import _asgi_post, intent_body, open_in_process  # noqa: E402


# -- child side: runs inside the tree under test ------------------------------------------------
def _server(identity: Any, sessions: int = 100) -> Any:
    from a2a_secure.policy import Policy
    from a2a_secure.protocol.server import ServerLimits
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore

    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    limits = ServerLimits(max_sessions=sessions + 10, max_pending_total=sessions + 10)
    server = AgentServer(identity, policy, store=MemoryStore(), limits=limits)

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    return server


async def _open(server: Any, client_id: Any) -> Any:
    resolved = await server.resolver.resolve(server.identity.did)
    return await open_in_process(server.protocol, client_id, resolved)


async def measure_server(batches: int = 30, size: int = 200) -> dict[str, float]:
    from a2a_secure.identity.keys import Identity

    server = _server(Identity.generate("ab-server"))
    session = await _open(server, Identity.generate("ab-client"))
    app = server.app()
    bodies = [intent_body(session, i, INTENT) for i in range((batches + 1) * size)]
    for body in bodies[:size]:  # warm-up
        assert await _asgi_post(app, "/a2a/intent", body) == 200
    per: list[float] = []
    for b in range(1, batches + 1):
        t = time.process_time()
        for body in bodies[b * size : (b + 1) * size]:
            assert await _asgi_post(app, "/a2a/intent", body) == 200
        per.append((time.process_time() - t) / size * 1e6)
    return {"us_min": min(per), "us_median": statistics.median(per)}


COUNTED = ("server", "intent", "handshake")
COUNTS = {"server": (10, 110), "intent": (10, 60), "handshake": (5, 30)}


async def _asgi_call(app: Any, method: str, params: Any, path: str, cpu: list[float] | None = None) -> Any:
    """One JSON-RPC call through the ASGI app; its result. ``cpu`` gets the call's CPU time."""
    from a2a_secure.identity import encoding

    body = encoding.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
    reply: list[bytes] = []
    t = time.process_time()
    assert await _asgi_post(app, path, body, reply) == 200
    if cpu is not None:
        cpu.append(time.process_time() - t)
    return encoding.loads(b"".join(reply))["result"]


async def _asgi_handshake(app: Any, client_id: Any, resolved: Any, cpu: list[float] | None = None) -> Any:
    """A full handshake through the ASGI app; the client's session."""
    from a2a_secure.protocol.client import ClientHandshake

    hs = ClientHandshake(client_id, resolved)
    path = "/a2a/handshake"
    challenge = await _asgi_call(app, "hello", hs.hello(), path, cpu)
    policy = await _asgi_call(app, "proof", hs.receive_challenge(challenge), path, cpu)
    return hs.receive_session(await _asgi_call(app, "accept_policy", hs.receive_policy(policy), path, cpu))


async def counted_work(kind: str, n: int) -> None:
    """``n`` operations of ``kind`` (and what both counts share), for callgrind to count."""
    from a2a_secure.identity.keys import Identity

    most = max(COUNTS[kind])
    server = _server(Identity.generate("ab-server"), sessions=most + 20)
    app = server.app()
    client_id = Identity.generate("ab-client")
    resolved = await server.resolver.resolve(server.identity.did)
    session = await _asgi_handshake(app, client_id, resolved)
    if kind == "server":
        # Signed beforehand, as many in both runs: only the server's work differs.
        bodies = [intent_body(session, i, INTENT) for i in range(most + 10)]
        for body in bodies[: 10 + n]:  # 10 to warm up
            assert await _asgi_post(app, "/a2a/intent", body) == 200
    elif kind == "intent":
        for _ in range(10 + n):
            req = session.prepare_intent(INTENT)
            session.verify_result(req, await _asgi_call(app, "intent", req.params, "/a2a/intent"))
    else:
        for _ in range(5 + n):
            await _asgi_handshake(app, client_id, resolved)


def _callgrind(tree: Path, kind: str, n: int) -> int:
    """Instructions callgrind counts for a whole process doing ``n`` operations of ``kind``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, __file__, "--count", kind, str(n)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{kind} in {tree} failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def report_instructions(trees: dict[str, Path]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    # The counts do not depend on the machine's load: the runs go side by side.
    jobs = [(name, kind, n) for kind in COUNTED for name in trees for n in COUNTS[kind]]
    print(f"[{time.strftime('%H:%M:%S')}] {len(jobs)} runs under callgrind", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: _callgrind(trees[j[0]], j[1], j[2]), jobs), strict=True))
    per: dict[str, dict[str, float]] = {}
    for kind in COUNTED:
        low, high = COUNTS[kind]
        for name in trees:
            diff = counts[(name, kind, high)] - counts[(name, kind, low)]
            per.setdefault(kind, {})[name] = diff / (high - low)
    print(f"old: {trees['old']}\nnew: {trees['new']}\ninstructions per operation (callgrind)\n")
    print(f"{'measure':52s} {'old':>10s} {'new':>10s} {'new/old':>8s}")
    for kind, by_tree in per.items():
        o, n = by_tree["old"], by_tree["new"]
        print(f"{kind + ': instructions':52s} {o:10.0f} {n:10.0f} {n / o:8.2f}")
    o, n = (per["handshake"][t] / per["intent"][t] for t in ("old", "new"))
    print(f"{'handshake / intent (both sides), instructions':52s} {o:10.2f} {n:10.2f} {n / o:8.2f}")


async def measure_server_handshake(batches: int = 20, size: int = 50) -> dict[str, float]:
    from a2a_secure.identity.keys import Identity

    server = _server(Identity.generate("ab-server"), sessions=(batches + 1) * size)
    app = server.app()
    client_id = Identity.generate("ab-client")
    resolved = await server.resolver.resolve(server.identity.did)
    for _ in range(size):  # warm-up
        await _asgi_handshake(app, client_id, resolved)
    per: list[float] = []
    for _ in range(batches):
        cpu: list[float] = []  # the three POSTs of each handshake, not the client's steps
        for _ in range(size):
            await _asgi_handshake(app, client_id, resolved, cpu)
        per.append(sum(cpu) / size * 1e6)
    return {"us_min": min(per), "us_median": statistics.median(per)}


def serve_child() -> None:
    """``--serve``: an echo agent under uvicorn on an ephemeral port; prints READY <url> <did>."""
    import uvicorn

    from a2a_secure.identity.keys import Identity

    server = _server(Identity.generate("ab-server"), sessions=100_000)
    config = uvicorn.Config(server.app(), host="127.0.0.1", port=0, log_level="warning", access_log=False)
    userver = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(userver.serve())
        while not userver.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)
        port = userver.servers[0].sockets[0].getsockname()[1]
        print(f"READY http://127.0.0.1:{port} {server.identity.did}", flush=True)
        await task

    asyncio.run(main())


async def measure_client(kind: str, batches: int = 12, size: int = 100) -> dict[str, float]:
    from a2a_secure.client.http import A2AClient
    from a2a_secure.identity.keys import Identity

    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        _ready, url, did = (await proc.stdout.readline()).decode().split()
        async with A2AClient(Identity.generate("ab-client")) as client:

            async def one() -> None:
                if kind == "handshake":
                    await client.handshake(did, url)
                else:
                    await client.request(did, INTENT, endpoint=url)

            for _ in range(size):
                await one()
            cpu: list[float] = []
            rate: list[float] = []
            n = size // 4 if kind == "handshake" else size
            for _ in range(batches):
                t, w = time.process_time(), time.perf_counter()
                for _ in range(n):
                    await one()
                cpu.append((time.process_time() - t) / n * 1e6)
                rate.append(n / (time.perf_counter() - w))
        return {
            "us_min": min(cpu),
            "us_median": statistics.median(cpu),
            "per_s_median": statistics.median(rate),
        }
    finally:
        proc.terminate()
        await proc.wait()


def measure_memory(n: int = 5000) -> dict[str, float]:
    """What one intent adds to each open session's memory (the stored answer, its rate window)."""
    import gc

    from a2a_secure.identity.keys import Identity

    server = _server(Identity.generate("ab-server"), sessions=n)

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    async def run() -> None:
        # One client DID per session, as many callers would have; requests signed beforehand,
        # so that only what the server keeps lies between the two readings.
        sessions = [await _open(server, Identity.generate(f"ab-{i}")) for i in range(n)]
        reqs = [s.prepare_intent(INTENT) for s in sessions]
        gc.collect()
        before = rss()
        for r in reqs:
            reply = await server.protocol.handle(r.method, r.params)
            assert reply.error is None, reply.error
        gc.collect()
        out["bytes_added_per_session_by_one_intent"] = (rss() - before) / n

    out: dict[str, float] = {}
    asyncio.run(run())
    return out


def child(kind: str) -> None:
    if kind == "server":
        out = asyncio.run(measure_server())
    elif kind == "server_handshake":
        out = asyncio.run(measure_server_handshake())
    elif kind in ("client", "handshake"):
        out = asyncio.run(measure_client(kind))
    else:
        out = measure_memory()
    print(json.dumps(out))


# -- parent side ------------------------------------------------------------------------------------
def run_in(tree: Path, kind: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} in {tree} failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path, nargs="?")
    p.add_argument("new", type=Path, nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", choices=KINDS, action="append")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--instructions", action="store_true", help="count instructions (valgrind) instead")
    p.add_argument("--count", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve_child()
        return
    if args.count:
        asyncio.run(counted_work(args.count[0], int(args.count[1])))
        return
    if args.child:
        child(args.child)
        return
    if args.old is None or args.new is None:
        p.error("give the old and the new tree")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for name, tree in trees.items():
        if not (tree / "a2a_secure").is_dir():
            p.error(f"{name} tree {tree} has no a2a_secure/")
    if args.instructions:
        report_instructions(trees)
        return
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for kind in args.only or KINDS:
        for r in range(args.rounds):
            for name, tree in trees.items():
                print(
                    f"[{time.strftime('%H:%M:%S')}] {kind} round {r + 1}/{args.rounds}: {name}",
                    file=sys.stderr,
                )
                results.setdefault(kind, {}).setdefault(name, []).append(run_in(tree, kind))
    print(f"old: {trees['old']}\nnew: {trees['new']}\n{args.rounds} rounds, alternating old/new\n")
    print(f"{'measure':52s} {'old':>10s} {'new':>10s} {'new/old':>8s}")
    for kind, by_tree in results.items():
        for metric in by_tree["old"][0]:
            old = [m[metric] for m in by_tree["old"]]
            new = [m[metric] for m in by_tree["new"]]
            pick = min if metric.endswith("_min") else statistics.median
            o, n = pick(old), pick(new)
            print(f"{kind + ': ' + metric:52s} {o:10.1f} {n:10.1f} {n / o:8.2f}")
    parts = ("handshake", "server_handshake", "client", "server")
    if all(k in results for k in parts):
        # A sequential handshake or intent costs about the client's CPU plus the server's.
        ratio = {}
        for name in trees:
            best = {k: min(m["us_min"] for m in results[k][name]) for k in parts}
            ratio[name] = (best["handshake"] + best["server_handshake"]) / (best["client"] + best["server"])
        label = "handshake / intent, client + ASGI server CPU"
        print(f"{label:52s} {ratio['old']:10.2f} {ratio['new']:10.2f} {ratio['new'] / ratio['old']:8.2f}")


if __name__ == "__main__":
    main()
