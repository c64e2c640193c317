"""Redis Cluster: two workers on a local 3-primary cluster against two on one Redis, and the
keys per primary after N sessions.

The cluster is the tests' own (``tests/cluster_helpers.LocalCluster``: three primaries,
three replicas, ``redis-server`` processes on free loopback ports). ``a2a-secure serve
--workers 2 --redis-url redis+cluster://...`` runs beside the one-Redis 2-worker server of
``redis_cases`` and is measured in the same rounds, right after it (``Beside``), with the
same key, policy and load (wrk replaying signed intents, or Python clients without wrk).
The store CPU of the cluster row is that of all six nodes (the replicas replay every write).
Then ``--cluster-sessions`` sessions are opened through ``RedisStore`` under a fresh prefix
(add, prove, open, as a server does) and the keys under it counted on each primary.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a2abench.common import CONCURRENCY, SCRIPTS, WRK_THREADS, _f
from a2abench.redis_cases import SessionFiller, redis_unavailable
from a2abench.runner import Bench, Proc, _proc_stat, drive, paired_ratio, start_cli_server
from a2abench.signed import SignedClients, open_sessions, sign_bodies

if TYPE_CHECKING:
    from a2a_secure.protocol.client import ClientSession

TESTS = SCRIPTS.parent / "tests"
PRIMARIES, REPLICAS = 3, 3
# The cluster case under wrk, or with Python clients when wrk is absent; and the one-Redis
# 2-worker case of redis_cases it is compared with.
PAIRS = {
    "wrk": ("wrk_cluster_2w", "wrk_redis_2w", "a2a_secure intent, Redis Cluster, 2w"),
    "e2e": ("e2e_cluster_2w", "e2e_redis_2w", "a2a_secure intent, Cluster 2w, 32 sessions"),
}


def cluster_unavailable(bench: Bench) -> str:
    """Why the cluster case cannot run here ("" when it can)."""
    if bench.args.no_cluster:
        return "skipped: --no-cluster"
    why = redis_unavailable(bench)
    if why:
        return why
    if shutil.which("redis-cli") is None:
        return "skipped: redis-cli not on PATH (apt-get install -y redis-tools)"
    return ""


def _cluster_helpers() -> Any:
    """The tests' ``cluster_helpers`` module (the local cluster and its key count)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import cluster_helpers

    return cluster_helpers


class ClusterRow:
    """The cluster server (``Beside`` the one-Redis 2 workers) and the spread of the keys."""

    def __init__(self, bench: Bench, cluster: Any, keys_per_primary: Any) -> None:
        self.bench = bench
        self.cluster = cluster
        self.keys_per_primary = keys_per_primary
        self.proc: Proc | None = None
        self.sessions: list[ClientSession] = []
        self.clients: SignedClients | None = None
        self.rate_guess = 4000.0
        kind = "wrk" if bench.have_wrk else "e2e"
        self.key, _, self.name = PAIRS[kind]
        self.out: dict[str, Any] = {"primaries": PRIMARIES, "replicas": REPLICAS, "workers": 2}
        wrk = f"wrk -t{WRK_THREADS} -c{CONCURRENCY}"
        self.out["load"] = wrk if bench.have_wrk else f"{CONCURRENCY} Python clients"
        self.out["case"] = self.key

    def store_cpu(self) -> float:
        """CPU seconds of every node of the cluster so far."""
        return sum(st[1] for p in self.cluster.procs.values() if (st := _proc_stat(p.pid)) is not None)

    def serve(self, key_file: Path, policy: Path, server_did: str) -> None:
        bench = self.bench
        bench.log("redis cluster: a2a-secure serve --workers 2")
        try:
            url = self.cluster.url
            name = "serve-cluster-2w"
            self.proc = start_cli_server(bench.workdir, key_file, policy, workers=2, redis_url=url, name=name)
        except RuntimeError as exc:
            bench.case(self.key, self.name).note = f"error: {str(exc)[-300:]}"
            return
        bench.procs.append(self.proc)
        run = bench.runner.run
        if bench.have_wrk:
            self.sessions = run(open_sessions(server_did, self.proc.url, bench.s.wrk_sessions))
        else:
            self.clients = SignedClients(server_did, self.proc.url)
            run(self.clients.open(CONCURRENCY))

    def round(self) -> None:
        if self.proc is None:
            return
        bench = self.bench
        case = bench.case(self.key, self.name)
        if self.clients is not None:
            case.note = "wrk not on PATH: Python clients, client-bound"
            try:
                loop = drive(self.clients.calls(), bench.s.e2e_seconds, self.proc)
                case.loops.append(bench.runner.run(loop))
            except Exception as exc:
                case.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            return
        bench.log("redis cluster, 2 workers: wrk round")
        bodies = sign_bodies(self.sessions, int(self.rate_guess * bench.s.wrk_seconds * 1.25) + 1000)
        url = self.proc.url + "/a2a/intent"
        res = bench.wrk(self.key, self.name, url, bodies, self.proc, once=True, extra_cpu=self.store_cpu)
        if res is not None and res.answered:
            self.rate_guess = max(1000.0, res.rate)

    def spread(self, n: int) -> None:
        """Open ``n`` sessions under a fresh prefix; count the keys on each primary."""
        from a2a_secure.store.redis import RedisStore

        prefix = f"bench-spread:{uuid.uuid4().hex[:8]}:"
        store = RedisStore(self.cluster.url, prefix=prefix)
        filler = SessionFiller(store)  # 32 at once: more is slower with the cluster client

        async def fill() -> None:
            try:
                await filler.fill(0, n)
            finally:
                await store.aclose()

        self.bench.log(f"redis cluster: opening {n} sessions through RedisStore")
        t = time.monotonic()
        try:
            self.bench.runner.run(fill())
        except Exception as exc:
            self.out["spread"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            return
        took = time.monotonic() - t
        counts = self.keys_per_primary(self.cluster, prefix)
        mean = sum(counts.values()) / len(counts)
        self.out["spread"] = {
            "sessions": n,
            "open_seconds": round(took, 1),
            "keys_per_primary": {f"127.0.0.1:{port}": c for port, c in counts.items()},
            "keys_mean": mean,
            "max_deviation_pct": max(abs(c - mean) for c in counts.values()) / mean * 100,
        }

    def close(self) -> None:
        if self.clients is not None:
            with contextlib.suppress(Exception):
                self.bench.runner.run(self.clients.aclose())
        if self.proc is not None:
            self.proc.stop()
            self.bench.procs.remove(self.proc)
        elif self.key not in self.bench.cases:
            self.out["not_run"] = "not run: the one-Redis 2-worker case did not run"
        self.cluster.stop()
        self.bench.results["cluster"] = self.out


@contextlib.contextmanager
def cluster_row(bench: Bench) -> Iterator[ClusterRow | None]:
    """A started local cluster as a ``ClusterRow``, or None (the reason in the results)."""
    why = cluster_unavailable(bench)
    row: ClusterRow | None = None
    if not why:
        bench.log(f"starting a local Redis Cluster ({PRIMARIES} primaries, {REPLICAS} replicas)")
        try:
            import pytest

            helpers = _cluster_helpers()
            workdir = bench.workdir / "cluster"
            workdir.mkdir()
            cluster = helpers.LocalCluster(workdir)
            # The helpers skip (or fail) a test when the cluster does not come up.
            try:
                cluster.start()
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                raise RuntimeError(str(exc)) from None
            row = ClusterRow(bench, cluster, helpers.keys_per_primary)
        except Exception as exc:
            why = f"skipped: the local cluster did not start ({type(exc).__name__}: {str(exc)[:300]})"
    if row is None:
        bench.results["cluster"] = {"skipped": why}
        yield None
        return
    try:
        yield row
    finally:
        row.close()


def cluster_ratios(cases: dict[str, dict[str, Any]], cluster: dict[str, Any]) -> None:
    """Add to ``cluster`` the ratios cluster / one Redis (medians of the round-by-round ratios)."""
    for num, den, _ in PAIRS.values():
        a, b = cases.get(num), cases.get(den)
        if not a or not b or "skipped" in a or "skipped" in b:
            continue
        rate, rate_rounds = paired_ratio(a, b, "rate")
        cpu, cpu_rounds = paired_ratio(a, b, "server_cpu_us")
        cluster["vs_one_redis"] = {
            "cases": [num, den],
            "rate_ratio": rate,
            "rate_ratio_rounds": rate_rounds,
            "server_cpu_ratio": cpu,
            "server_cpu_ratio_rounds": cpu_rounds,
        }


def print_cluster(out: dict[str, Any]) -> None:
    """The Redis Cluster lines of the report."""
    cluster = out.get("cluster")
    if not cluster:
        return
    print()
    if "skipped" in cluster:
        print(f"Redis Cluster: {cluster['skipped']}")
        return
    cases = out["cases"]
    vs = cluster.get("vs_one_redis")
    print(
        f"Redis Cluster ({cluster['primaries']} primaries + {cluster['replicas']} replicas, local)"
        f" against one Redis: a2a-secure serve --workers 2, {cluster['load']}, same rounds:"
    )
    hdr = f"  {'':<30} {'intents/s':>10} {'srv µs/intent':>14} {'redis µs/intent':>16}"
    print(hdr)
    if vs is None:
        print(f"  {cluster.get('not_run') or cases.get(cluster['case'], {}).get('note') or 'not measured'}")
    else:
        num, den = vs["cases"]
        for label, key in (("2 workers, one Redis", den), ("2 workers, 3-primary cluster", num)):
            c = cases[key]
            print(
                f"  {label:<30} {_f(c.get('rate')):>10} {_f(c.get('server_cpu_us')):>14}"
                f" {_f(c.get('store_cpu_us')):>16}" + (f"  {c['note']}" if c.get("note") else "")
            )
        rounds = " ".join(f"{r:.2f}" for r in vs["rate_ratio_rounds"])
        cpu_rounds = " ".join(f"{r:.2f}" for r in vs["server_cpu_ratio_rounds"])
        print(
            f"  {'cluster / one Redis':<30} {_f(vs['rate_ratio'], '.2f'):>10}"
            f" {_f(vs['server_cpu_ratio'], '.2f'):>14}"
            + (f"  (rounds: {rounds} / {cpu_rounds})" if rounds else "  (medians)")
        )
    print("  (redis µs: every redis-server process's CPU per intent; the cluster's replicas included)")
    spread = cluster.get("spread", {})
    if "keys_per_primary" in spread:
        counts = ", ".join(f"{node} {c}" for node, c in spread["keys_per_primary"].items())
        print(
            f"  keys per primary after {spread['sessions']} sessions"
            f" (opened in {spread['open_seconds']:.0f} s): {counts}; mean {spread['keys_mean']:.0f},"
            f" max deviation from the mean {spread['max_deviation_pct']:.2f} %"
        )
    else:
        print(f"  keys per primary: {spread.get('error', 'not measured')}")
