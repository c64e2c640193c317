"""Redis: memory per session (``used_memory``), network round trips and commands per intent,
and capacity of ``a2a-secure serve --redis-url`` at 1 and 2 workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from a2abench.common import CONCURRENCY, HOST, INTENT, median
from a2abench.memory import _fake_pending, _fake_reply
from a2abench.runner import (
    Bench,
    RedisProc,
    _log_tail,
    drive,
    free_port,
    self_cpu,
    start_cli_server,
)
from a2abench.signed import SignedClients, open_sessions, sign_bodies


def start_redis(workdir: Path) -> RedisProc:
    import redis

    port = free_port()
    cmd = [
        "redis-server",
        "--bind",
        HOST,
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
    ]
    log = workdir / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    client = redis.Redis(host=HOST, port=port, socket_timeout=5)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            if client.ping():
                return RedisProc(proc, port, client)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"redis-server did not start:\n{_log_tail(log)}")


def _inner_commands() -> set[str]:
    """Commands that RedisStore's Lua scripts call (commandstats counts them too)."""
    import a2a_secure.store.redis as module

    # The scripts are in the store's redis*.py modules, one per family of keys.
    source = "".join(p.read_text() for p in sorted(Path(module.__file__ or "").parent.glob("redis*.py")))
    return {c.lower() for c in re.findall(r"redis\.call\('(\w+)'", source)}


def network_reads(client: Any) -> int:
    """Redis's count of read events (INFO stats ``total_reads_processed``, this call's included).

    Each batch of commands a client sends at once (one command, or a pipeline) is one read:
    the number of network round trips clients made.
    """
    return int(client.info("stats")["total_reads_processed"])


def top_level_calls(stats: dict[str, Any], inner: set[str]) -> dict[str, int]:
    """Commands sent by clients (not from inside scripts), by name, from INFO commandstats."""
    own = {"info", "config|resetstat", "ping"}  # the benchmark's own probes
    out: dict[str, int] = {}
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        calls = (
            value["calls"] if isinstance(value, dict) else int(str(value).split("calls=")[1].split(",")[0])
        )
        if name in inner or name in own:
            continue
        out[name] = int(calls)
    return out


class SessionFiller:
    """Opens sessions in a store as a server does (add the pending handshake, prove, open).

    Each session has its own client DID and fresh ids (``_fake_pending``); ``batch`` store
    calls run at once.
    """

    def __init__(self, store: Any, *, batch: int = 32) -> None:
        from a2a_secure.identity.keys import Identity
        from a2a_secure.policy import Policy

        self.store = store
        self.batch = batch
        self.policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
        self.server_did = Identity.generate("bench-server").did
        self.now = int(time.time())

    async def open_one(self, i: int) -> tuple[str, str]:
        """Session ``i``: its (session id, client DID)."""
        big, now = 10**9, self.now
        pending, record = _fake_pending(i, self.policy, self.server_did, now)
        await self.store.add_pending(pending, max_per_source=big, max_total=big, now=now)
        await self.store.mark_proven(pending.nonce_b, record.client_kid, now)
        result = await self.store.open_session(pending.nonce_b, record, max_sessions=big, now=now)
        if result.value != "opened":
            raise RuntimeError(f"open_session: {result}")
        return record.session_id, record.client_did

    async def fill(self, start: int, count: int) -> list[tuple[str, str]]:
        """Sessions ``start`` .. ``start + count - 1``."""
        ids: list[tuple[str, str]] = []
        end = start + count
        for b in range(start, end, self.batch):
            ids += await asyncio.gather(*(self.open_one(i) for i in range(b, min(end, b + self.batch))))
        return ids


async def _redis_memory(redis: RedisProc, n: int, warm: int) -> dict[str, Any]:
    from a2a_secure.identity import encoding
    from a2a_secure.store.redis import RedisStore

    redis.client.flushall()
    store = RedisStore(redis.url, prefix="bench:")
    filler = SessionFiller(store)
    fill, now, batch = filler.fill, filler.now, filler.batch

    async def intent_one(i: int, sid: str, did: str) -> None:
        rh = encoding.hash_bytes(os.urandom(16))
        await store.begin_request(sid, did, 1, rh, rate_limit=1000, rate_period=3600, now=now)
        await store.finish_request(sid, 1, _fake_reply(i))

    def mem() -> tuple[int, int]:
        info = redis.client.info("memory")
        return int(info["used_memory"]), int(info.get("used_memory_dataset", 0))

    try:
        # Warm-up: scripts loaded, the pool's connections open (their buffers count in
        # used_memory), the sorted sets created; then measure from there.
        warm_ids = await fill(0, warm)
        for b in range(0, len(warm_ids), batch):
            await asyncio.gather(
                *(intent_one(i, *warm_ids[i]) for i in range(b, min(len(warm_ids), b + batch)))
            )
        m0, d0 = mem()
        t = time.perf_counter()
        ids = await fill(warm, n)
        open_s = time.perf_counter() - t
        m1, d1 = mem()
        for b in range(0, n, batch):
            await asyncio.gather(*(intent_one(warm + i, *ids[i]) for i in range(b, min(n, b + batch))))
        m2, d2 = mem()
        # What one store call costs the server process (redis-py, asyncio): sequential calls.
        sample = ids[: min(n, 1000)]
        c, t = self_cpu(), time.perf_counter()
        for sid, did in sample:
            rh = encoding.hash_bytes(os.urandom(16))
            await store.begin_request(sid, did, 2, rh, rate_limit=1000, rate_period=3600, now=now)
        begin_cpu, begin_wall = self_cpu() - c, time.perf_counter() - t
        c, t = self_cpu(), time.perf_counter()
        for i, (sid, _did) in enumerate(sample):
            await store.finish_request(sid, 2, _fake_reply(i))
        finish_cpu, finish_wall = self_cpu() - c, time.perf_counter() - t
        k = len(sample)
        return {
            "begin_request_cpu_us": begin_cpu / k * 1e6,
            "begin_request_wall_us": begin_wall / k * 1e6,
            "finish_request_cpu_us": finish_cpu / k * 1e6,
            "finish_request_wall_us": finish_wall / k * 1e6,
            "sessions": n,
            "bytes_per_session": (m1 - m0) / n,
            "bytes_per_session_after_one_intent": (m2 - m0) / n,
            "dataset_bytes_per_session": (d1 - d0) / n,
            "dataset_bytes_per_session_after_one_intent": (d2 - d0) / n,
            "store_ops_per_s_opening": 3 * n / open_s,
        }
    finally:
        await store.aclose()
        redis.client.flushall()


class Beside(Protocol):
    """A server measured in the rounds of the 2-worker one, back to back with it."""

    def serve(self, key_file: Path, policy: Path, server_did: str) -> None:
        """Start, with the 2-worker server's key and policy (before its first round)."""

    def round(self) -> None:
        """One round, right after the 2-worker server's."""


def run_redis(bench: Bench, beside: Beside | None = None) -> None:
    why = redis_unavailable(bench)
    if why:
        bench.results["redis"] = {"skipped": why}
        return
    bench.redis = start_redis(bench.workdir)
    bench.log(f"redis: {bench.s.redis_sessions} sessions in RedisStore")
    try:
        bench.results["redis_memory"] = bench.runner.run(
            _redis_memory(bench.redis, bench.s.redis_sessions, bench.s.redis_sessions * 2 // 10)
        )
    except Exception as exc:
        bench.results["redis_memory"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        import a2a_secure.server.run  # noqa: F401
    except Exception as exc:
        bench.results["redis"] = {"skipped": f"skipped: a2a_secure.server.run unavailable ({exc})"}
        return
    run_redis_serve(bench, beside)


def redis_unavailable(bench: Bench) -> str:
    if bench.args.no_redis:
        return "skipped: --no-redis"
    if shutil.which("redis-server") is None:
        return "skipped: redis-server not on PATH (apt-get install -y redis-server)"
    try:
        from a2a_secure.store.redis import RedisStore  # noqa: F401
    except Exception as exc:
        return f"skipped: a2a_secure.store.redis.RedisStore unavailable ({type(exc).__name__}: {exc})"
    return ""


def run_redis_serve(bench: Bench, beside: Beside | None = None) -> None:
    from a2a_secure.client.http import A2AClient
    from a2a_secure.identity.keys import Identity

    assert bench.redis is not None
    redis = bench.redis
    key_file = bench.workdir / "server.key"
    identity = Identity.generate("bench-server")
    identity.save(key_file)
    policy = bench.workdir / "policy.json"
    policy.write_text(json.dumps({"rate_limit": 10**9, "rate_period": 3600, "session_timeout": 3600}))
    inner = _inner_commands()
    out: dict[str, Any] = {"inner_script_commands": sorted(inner)}
    run = bench.runner.run
    for workers in (1, 2):
        redis.client.flushall()
        label = f"redis_{workers}w"
        try:
            proc = start_cli_server(bench.workdir, key_file, policy, workers=workers, redis_url=redis.url)
        except RuntimeError as exc:
            out[label] = {"error": str(exc)[-500:]}
            continue
        bench.procs.append(proc)
        try:
            # Round trips of one intent: a warmed session (its record cached by the worker),
            # sequential intents, INFO commandstats before and after.
            client = A2AClient(Identity.generate("bench-rt"))
            run(client.request(identity.did, INTENT, endpoint=proc.url))
            # Warm: the session cached by the worker, and its Redis pool grown to the
            # connections a sequential client keeps busy (a pipelined answer may overlap
            # the next request's script), so that no connection set-up is counted.
            for _ in range(50):
                run(client.request(identity.did, INTENT))
            redis.client.config_resetstat()
            reads0 = network_reads(redis.client)
            n = bench.s.round_trip_intents

            async def intents(c: A2AClient = client, count: int = n) -> None:
                for _ in range(count):
                    await c.request(identity.did, INTENT)

            run(intents())
            reads = network_reads(redis.client) - reads0 - 1
            calls = top_level_calls(redis.client.info("commandstats"), inner)
            run(client.aclose(close_sessions=False))
            out[label] = {
                "round_trips_per_intent": reads / n,
                "commands_per_intent": sum(calls.values()) / n,
                "top_level_commands": {k: v / n for k, v in calls.items()},
            }
            with_beside = beside if workers == 2 else None
            if with_beside is not None:
                with_beside.serve(key_file, policy, identity.did)
            if bench.have_wrk:
                sessions = run(open_sessions(identity.did, proc.url, bench.s.wrk_sessions))
                guess = 4000.0
                wrk_rt: list[float] = []
                wrk_cmds: list[float] = []
                for r in range(bench.s.rounds):
                    bench.log(f"redis {workers} worker(s): wrk round {r + 1}/{bench.s.rounds}")
                    bodies = sign_bodies(sessions, int(guess * bench.s.wrk_seconds * 1.25) + 1000)
                    redis.client.config_resetstat()
                    reads0 = network_reads(redis.client)
                    res = bench.wrk(
                        f"wrk_{label}",
                        f"a2a_secure intent, Redis, {workers} worker{'s' if workers > 1 else ''}",
                        proc.url + "/a2a/intent",
                        bodies,
                        proc,
                        once=True,
                        extra_cpu=redis.cpu,
                    )
                    if res is not None and res.answered:
                        guess = max(1000.0, res.rate)
                        reads = network_reads(redis.client) - reads0 - 1
                        c = top_level_calls(redis.client.info("commandstats"), inner)
                        wrk_rt.append(reads / res.answered)
                        wrk_cmds.append(sum(c.values()) / res.answered)
                    if with_beside is not None:
                        with_beside.round()
                out[label]["wrk_round_trips_per_request"] = median(wrk_rt)
                out[label]["wrk_commands_per_request"] = median(wrk_cmds)
            else:
                clients = SignedClients(identity.did, proc.url)
                run(clients.open(CONCURRENCY))
                case = bench.case(f"e2e_{label}", f"a2a_secure intent, Redis, {workers}w, 32 sessions")
                case.note = "wrk not on PATH: Python clients, client-bound"
                for _ in range(bench.s.rounds):
                    case.loops.append(run(drive(clients.calls(), bench.s.e2e_seconds, proc)))
                    if with_beside is not None:
                        with_beside.round()
                run(clients.aclose())
        except Exception as exc:
            out.setdefault(label, {})["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            proc.stop()
            bench.procs.remove(proc)
    bench.results["redis"] = out
