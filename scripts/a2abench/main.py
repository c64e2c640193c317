"""The run: which servers start, the rounds that interleave the cases, and ``main``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import a2abench
from a2abench.a2asdk import (
    A2A_HEADERS,
    A2A_PAIR,
    A2A_POOL_NAME,
    A2A_SKIP,
    A2A_TEXT,
    OTEL_OFF,
    _a2a_app,
    _a2a_body,
    _a2a_secured_app,
    a2a_pair_skip,
    a2a_session_cost,
    find_a2a_python,
    open_a2a_pair,
    wrk_a2a_pair,
)
from a2abench.beyond import beyond_the_floor
from a2abench.cluster_cases import cluster_ratios, cluster_row
from a2abench.common import CONCURRENCY, FULL, JSON_HEADERS, QUICK, WRK_THREADS, Settings
from a2abench.echo import PLAIN_BODY, PLAIN_POOL_NAME, _plain_app
from a2abench.floor import FLOOR_NAME, floor_app, start_floor, wrk_floor
from a2abench.memory import probe_memory, run_memory
from a2abench.redis_cases import run_redis
from a2abench.report import build_targets, plot, print_report
from a2abench.runner import (
    Bench,
    Call,
    Proc,
    Starting,
    drive,
    json_call,
    machine_busy,
    new_http,
    own_cpu,
    pool_call,
    serve_child,
    spawn_child,
)
from a2abench.signed import (
    SignedClients,
    _core_breakdown,
    _signed_app,
    open_sessions,
    profile_signed,
    sign_bodies,
)

if TYPE_CHECKING:
    from a2a_secure.protocol.client import ClientSession

# ``--serve KIND``: the app each server child serves (all with the same uvicorn settings).
SERVERS: dict[str, Callable[[], Any]] = {
    "plain": _plain_app,
    "signed": _signed_app,
    "floor": floor_app,
    "a2a": _a2a_app,
    "a2a_direct": _a2a_app,
    "a2a_secured": _a2a_secured_app,
}


def run_main_cases(bench: Bench) -> None:
    from a2a_secure.identity.keys import Identity

    seed = os.urandom(32)
    server_did = Identity.from_seed(seed, "bench-server").did
    bench.log("starting servers")
    # Started together (their imports overlap), then waited for one by one.
    starting = [spawn_child("plain", bench.workdir)]
    starting.append(spawn_child("signed", bench.workdir, env={"BENCH_SEED": seed.hex()}))
    a2a_python = find_a2a_python(bench.args)
    if a2a_python is not None:
        starting.append(spawn_child("a2a", bench.workdir, python=a2a_python))
    floor_starting = spawn_child("floor", bench.workdir) if bench.have_wrk else None
    # A2A over the DID session: a2a-sdk direct (A) and the same executor behind a2a_secure (B).
    pair_seed = os.urandom(32)
    pair_starting: list[Starting] = []
    pair_skip = a2a_pair_skip()
    if not pair_skip:
        pair_starting.append(spawn_child("a2a_direct", bench.workdir, env=OTEL_OFF))
        pair_env = {**OTEL_OFF, "BENCH_SEED": pair_seed.hex()}
        pair_starting.append(spawn_child("a2a_secured", bench.workdir, env=pair_env))
    bench.spawned += [st.proc for st in [*starting, *pair_starting]]
    if floor_starting is not None:
        bench.spawned.append(floor_starting.proc)
    plain = starting[0].wait()
    bench.procs.append(plain)
    signed = starting[1].wait()
    bench.procs.append(signed)
    floor = start_floor(bench, floor_starting)
    a2a: Proc | None = None
    if a2a_python is None:
        bench.case("a2a_seq", "a2a-sdk SendMessage, 1 client").skipped = A2A_SKIP
        bench.case("a2a_conc", f"a2a-sdk SendMessage, {CONCURRENCY} clients").skipped = A2A_SKIP
        bench.case("wrk_a2a", "a2a-sdk SendMessage").skipped = A2A_SKIP
    else:
        try:
            a2a = starting[2].wait()
            bench.procs.append(a2a)
        except RuntimeError as exc:
            msg = f"skipped: a2a-sdk server failed: {str(exc)[-300:]}"
            for key, name in (
                ("a2a_seq", "a2a-sdk SendMessage, 1 client"),
                ("a2a_conc", f"a2a-sdk SendMessage, {CONCURRENCY} clients"),
                ("wrk_a2a", "a2a-sdk SendMessage"),
            ):
                bench.case(key, name).skipped = msg
    run = bench.runner.run
    pair_did = Identity.from_seed(pair_seed, "bench-a2a-secured").did
    pair = open_a2a_pair(bench, pair_starting, pair_did, pair_skip)

    # Clients, made once and kept across rounds (on the one event loop of the runner).
    plain_http = [new_http() for _ in range(CONCURRENCY)]
    a2a_http = [new_http() for _ in range(CONCURRENCY)]
    seq_signed = SignedClients(server_did, signed.url)
    conc_signed = SignedClients(server_did, signed.url)
    run(seq_signed.open(1))
    run(conc_signed.open(CONCURRENCY))
    from a2a_secure.client.http import A2AClient

    hs_client = A2AClient(Identity.generate("bench-handshaker"))

    async def handshake() -> None:
        await hs_client.handshake(server_did, signed.url)

    plain_calls = [json_call(h, plain.url + "/echo", lambda: PLAIN_BODY, JSON_HEADERS) for h in plain_http]
    from a2a_secure.client.pool import ConnectionPool

    plain_pool = ConnectionPool(timeout=10.0)
    plain_pool_call = pool_call(plain_pool, plain.url + "/echo", lambda: PLAIN_BODY)
    a2a_pool_call = (
        pool_call(plain_pool, a2a.url + "/", lambda: _a2a_body(A2A_TEXT), A2A_HEADERS)
        if a2a is not None
        else None
    )
    a2a_calls = (
        [json_call(h, a2a.url + "/", lambda: _a2a_body(A2A_TEXT), A2A_HEADERS) for h in a2a_http]
        if a2a is not None
        else []
    )
    wrk_sessions: list[ClientSession] = []
    if bench.have_wrk:
        bench.log(f"opening {bench.s.wrk_sessions} sessions for wrk")
        wrk_sessions = run(open_sessions(server_did, signed.url, bench.s.wrk_sessions))
    else:
        why = "--no-wrk" if bench.args.no_wrk else "wrk not on PATH (apt-get install -y wrk)"
        for key, name in (
            ("wrk_plain", "FastAPI echo"),
            ("wrk_signed", "a2a_secure intent"),
            ("wrk_floor", FLOOR_NAME),
            ("wrk_a2a", "a2a-sdk SendMessage"),
        ):
            if key not in bench.cases:
                bench.case(key, name).skipped = f"skipped: {why}"

    secs = bench.s.e2e_seconds
    signed_rate_guess = 6000.0
    for r in range(bench.s.rounds):
        bench.log(f"round {r + 1}/{bench.s.rounds}: end to end")
        e2e: list[tuple[str, str, list[Call], Proc, str]] = [
            ("plain_seq", "FastAPI echo, 1 client", plain_calls[:1], plain, "req/s"),
            ("plain_pool_seq", PLAIN_POOL_NAME, [plain_pool_call], plain, "req/s"),
            ("plain_conc", f"FastAPI echo, {CONCURRENCY} clients", plain_calls, plain, "req/s"),
            ("signed_seq", "a2a_secure intent, 1 session", seq_signed.calls(), signed, "req/s"),
            (
                "signed_conc",
                f"a2a_secure intent, {CONCURRENCY} sessions",
                conc_signed.calls(),
                signed,
                "req/s",
            ),
            ("handshake_seq", "a2a_secure handshake, sequential", [handshake], signed, "hs/s"),
        ]
        if a2a is not None:
            e2e += [
                ("a2a_seq", "a2a-sdk SendMessage, 1 client", a2a_calls[:1], a2a, "req/s"),
                ("a2a_conc", f"a2a-sdk SendMessage, {CONCURRENCY} clients", a2a_calls, a2a, "req/s"),
            ]
            if a2a_pool_call is not None:
                e2e.append(("a2a_pool_seq", A2A_POOL_NAME, [a2a_pool_call], a2a, "req/s"))
        if pair is not None:  # back to back: A, then B
            for key, call, proc in (
                ("a2a_direct_seq", pair.direct_call(), pair.direct),
                ("a2a_secured_seq", pair.secured_call(), pair.secured),
            ):
                e2e.append((key, A2A_PAIR[key], [call], proc, "req/s"))
        for key, name, calls, proc, unit in e2e:
            case = bench.case(key, name, unit)
            try:
                case.loops.append(run(drive(calls, secs, proc)))
            except Exception as exc:
                case.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
        if not bench.have_wrk:
            continue
        bench.log(f"round {r + 1}/{bench.s.rounds}: wrk")
        wsecs = bench.s.wrk_seconds
        plain_bodies = [[PLAIN_BODY]] * WRK_THREADS
        bench.wrk("wrk_plain", "FastAPI echo", plain.url + "/echo", plain_bodies, plain, once=False)
        n = int(signed_rate_guess * wsecs * 1.25) + 1000
        bodies = sign_bodies(wrk_sessions, n)
        res = bench.wrk(
            "wrk_signed", "a2a_secure intent", signed.url + "/a2a/intent", bodies, signed, once=True
        )
        if res is not None:
            signed_rate_guess = max(1000.0, res.rate)
        if floor is not None:
            floor = wrk_floor(bench, floor, bodies)
        if a2a is not None:
            a2a_bodies = [[_a2a_body(A2A_TEXT) for _ in range(2000)] for _ in range(WRK_THREADS)]
            bench.wrk(
                "wrk_a2a",
                "a2a-sdk SendMessage",
                a2a.url + "/",
                a2a_bodies,
                a2a,
                once=False,
                header="A2A-Version: 1.0",
            )
        if pair is not None:
            wrk_a2a_pair(bench, pair)
    bench.results["bodies"] = {
        "plain_request_bytes": len(PLAIN_BODY),
        "a2a_request_bytes": len(_a2a_body(A2A_TEXT)),
    }
    if pair is not None and pair.signed_bytes:
        bench.results["bodies"]["a2a_secured_request_bytes"] = pair.signed_bytes

    if bench.args.profile and bench.have_wrk:
        profile_signed(bench, seed, server_did)

    async def close_clients() -> None:
        for h in plain_http + a2a_http:
            await h.aclose()
        await plain_pool.aclose()
        if pair is not None:
            await pair.aclose()
        await seq_signed.aclose()
        await conc_signed.aclose()
        await hs_client.aclose(close_sessions=False)

    run(close_clients())


def run_core_breakdown(bench: Bench) -> None:
    """One intent's server work without HTTP: envelope, core, reply (µs, in this process)."""
    core = bench.runner.run(_core_breakdown(1000 if bench.args.quick else 4000))
    bench.results["core"] = core
    bench.results["beyond_floor"] = bench.runner.run(beyond_the_floor(1000 if bench.args.quick else 4000))
    bodies = bench.results.setdefault("bodies", {})
    bodies["signed_request_bytes"] = core.pop("request_bytes")
    bodies["signed_response_bytes"] = core.pop("response_bytes")


def _meta(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loop": loop,
        "rounds": s.rounds,
        "quick": bool(args.quick),
        "settings": s.__dict__,
        "wrk": shutil.which("wrk"),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=a2abench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, help="rounds per case (median reported); default 3, --quick 1")
    p.add_argument("--quick", action="store_true", help="short run (about a minute)")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--a2a-python", metavar="PY", help="an interpreter with a2a-sdk[http-server] for case 3")
    p.add_argument("--profile", action="store_true", help="also cProfile the signed server under wrk")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis cases")
    p.add_argument("--no-wrk", action="store_true", help="skip the wrk cases")
    p.add_argument("--no-cluster", action="store_true", help="skip the Redis Cluster case")
    p.add_argument(
        "--cluster-sessions",
        type=int,
        metavar="N",
        help="sessions opened on the Redis Cluster before counting its keys per primary;"
        " default 100000 (about 100 s on 2 cores), --quick 10000",
    )
    p.add_argument("--serve", choices=sorted(SERVERS), help=argparse.SUPPRESS)
    p.add_argument("--probe-memory", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="a2a-bench-") as d:
        yield Path(d)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve_child(SERVERS[args.serve])
        return 0
    if args.probe_memory:
        print(json.dumps(probe_memory(args.probe_memory)))
        return 0
    base = QUICK if args.quick else FULL
    settings = Settings(
        **{
            **base.__dict__,
            "rounds": args.rounds or base.rounds,
            "cluster_sessions": args.cluster_sessions or base.cluster_sessions,
        }
    )
    started = time.monotonic()
    busy0, own0 = machine_busy(), own_cpu()
    with _workdir() as workdir:
        bench = Bench(args, settings, workdir)
        try:
            run_main_cases(bench)
            bench.log("in-process breakdown")
            run_core_breakdown(bench)
            run_memory(bench)
            with cluster_row(bench) as cluster:
                run_redis(bench, beside=cluster)
                if cluster is not None:
                    cluster.spread(settings.cluster_sessions)
        finally:
            bench.close()
    cases = {k: c.summary() for k, c in bench.cases.items()}
    out: dict[str, Any] = {"meta": _meta(args, settings), "cases": cases, **bench.results}
    out["a2a_session_cost"] = a2a_session_cost(bench.cases)
    if "skipped" not in out.get("cluster", {"skipped": ""}):
        cluster_ratios(cases, out["cluster"])
    out["targets"] = build_targets(cases, bench.results)
    elapsed = time.monotonic() - started
    out["meta"]["seconds"] = round(elapsed, 1)
    # Other processes on a shared machine skew rates more than CPU per request: say how busy.
    out["meta"]["other_load_cores"] = round((machine_busy() - busy0 - (own_cpu() - own0)) / elapsed, 2)
    print_report(out)
    args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nresults: {args.json}; {plot(out, args.json.with_suffix('.png'))}; {out['meta']['seconds']} s")
    return 0
