"""The report: targets (ratios against their limits), the printed tables, the latency plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from a2abench.a2asdk import print_session_cost
from a2abench.beyond import table as beyond_table
from a2abench.cluster_cases import print_cluster
from a2abench.common import _f
from a2abench.runner import paired_ratio

TARGETS = {
    "cpu_signed_vs_plain": 1.15,
    "cpu_signed_vs_floor": 1.30,
    "signed_vs_a2a_sdk": 2.0,
    "handshake_vs_intent": 3.0,
    "memory_bytes_per_session": 2048,
    "redis_bytes_per_session": 1024,
    "redis_round_trips_per_intent": 1.0,
    "cluster_keys_spread_pct": 10.0,
}


def build_targets(cases: dict[str, dict[str, Any]], results: dict[str, Any]) -> list[dict[str, Any]]:
    def get(key: str, metric: str) -> Any:
        return cases.get(key, {}).get(metric)

    targets = []

    def add(name: str, value: float | None, limit: float, better: str, detail: str) -> None:
        met = None if value is None else (value <= limit if better == "<=" else value >= limit)
        targets.append(
            {"target": name, "value": value, "limit": f"{better} {limit:g}", "met": met, "detail": detail}
        )

    def add_paired(name: str, num: str, den: str, metric: str, unit: str, target: str, better: str) -> None:
        """Add the median of the round-by-round ratios num/den of ``metric`` (``paired_ratio``)."""
        value, rounds = paired_ratio(cases.get(num, {}), cases.get(den, {}), metric)
        detail = f"{_f(get(num, metric))} / {_f(get(den, metric))} {unit}"
        detail += ("; rounds " + " ".join(f"{r:.2f}" for r in rounds)) if rounds else " (medians)"
        add(name, value, TARGETS[target], better, detail)

    add_paired(
        "server CPU per signed intent / plain echo (wrk)",
        "wrk_signed", "wrk_plain", "server_cpu_us", "µs", "cpu_signed_vs_plain", "<=",
    )  # fmt: skip
    add_paired(
        "server CPU per signed intent / floor (wrk)",
        "wrk_signed", "wrk_floor", "server_cpu_us", "µs", "cpu_signed_vs_floor", "<=",
    )  # fmt: skip
    for name, num, den, metric in (
        ("signed intents/s / a2a-sdk, sequential client", "signed_seq", "a2a_seq", "rate"),
        ("same, a2a-sdk driven through the same pool", "signed_seq", "a2a_pool_seq", "rate"),
        ("signed intents/s / a2a-sdk, 32 clients", "signed_conc", "a2a_conc", "rate"),
        ("signed intents/s / a2a-sdk, server capacity (wrk)", "wrk_signed", "wrk_a2a", "rate"),
    ):
        add_paired(name, num, den, metric, "req/s", "signed_vs_a2a_sdk", ">=")
    add_paired(
        "handshake time / intent time, sequential client",
        "signed_seq", "handshake_seq", "rate", "per s (intents / handshakes)", "handshake_vs_intent", "<=",
    )  # fmt: skip
    add_paired(
        "server CPU per handshake / per intent",
        "handshake_seq", "signed_seq", "server_cpu_us", "µs", "handshake_vs_intent", "<=",
    )  # fmt: skip
    mem = results.get("memory", {})
    add(
        "bytes per open session, MemoryStore",
        mem.get("bytes_per_session"),
        TARGETS["memory_bytes_per_session"],
        "<=",
        f"after one intent: {_f(mem.get('bytes_per_session_after_one_intent'))} B",
    )
    rmem = results.get("redis_memory", {})
    add(
        "bytes per open session, Redis used_memory",
        rmem.get("bytes_per_session"),
        TARGETS["redis_bytes_per_session"],
        "<=",
        f"after one intent: {_f(rmem.get('bytes_per_session_after_one_intent'))} B",
    )
    redis = results.get("redis", {})
    one_worker_commands = redis.get("redis_1w", {}).get("top_level_commands", {})
    add(
        "Redis round trips per intent (1 worker, warmed session)",
        redis.get("redis_1w", {}).get("round_trips_per_intent"),
        TARGETS["redis_round_trips_per_intent"],
        "<=",
        "commands: " + ", ".join(f"{k} {v:.2f}" for k, v in one_worker_commands.items()),
    )
    cluster = results.get("cluster", {})
    spread = cluster.get("spread", {})
    add(
        "keys per node, spread from the mean (%)",
        spread.get("max_deviation_pct"),
        TARGETS["cluster_keys_spread_pct"],
        "<=",
        f"Redis Cluster, {spread['sessions']} sessions: "
        + " ".join(str(c) for c in spread["keys_per_primary"].values())
        if "keys_per_primary" in spread
        else cluster.get("skipped") or spread.get("error", "not measured"),
    )
    return targets


def print_report(out: dict[str, Any]) -> None:
    cases: dict[str, dict[str, Any]] = out["cases"]
    meta = out["meta"]
    print()
    print(
        f"a2a_secure benchmark: {meta['rounds']} round(s), median shown; {meta['cpus']} CPUs, "
        f"Python {meta['python']}, event loop {meta['loop']}, {meta['date']};"
        f" other processes used {meta['other_load_cores']} cores on average meanwhile"
    )
    print()
    hdr = (
        f"{'end to end, Python clients':<42} {'rate':>10} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'srv µs':>8} {'cli µs':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for key in (
        "plain_seq",
        "plain_pool_seq",
        "plain_conc",
        "signed_seq",
        "signed_conc",
        "handshake_seq",
        "a2a_seq",
        "a2a_pool_seq",
        "a2a_conc",
        "a2a_direct_seq",
        "a2a_secured_seq",
        "e2e_redis_1w",
        "e2e_redis_2w",
        "e2e_cluster_2w",
    ):
        c = cases.get(key)
        if c is None:
            continue
        if "skipped" in c:
            print(f"{c['name']:<42} {c['skipped']}")
            continue
        rate = f"{_f(c['rate'])} {'hs/s' if c['unit'] == 'hs/s' else '/s'}"
        line = (
            f"{c['name']:<42} {rate:>10} {_f(c['p50_ms'], '.2f'):>8} {_f(c['p99_ms'], '.2f'):>8}"
            f" {_f(c['server_cpu_us']):>8} {_f(c['client_cpu_us']):>8}"
        )
        print(line + (f"  {c['note']}" if c.get("note") else ""))
    print("(srv µs / cli µs: CPU time per request of the server process / of this client process;")
    print(" echo and a2a-sdk rows: an httpx.AsyncClient each, except the 'pool' rows, which send")
    print(" through a2a_secure.client.pool, the HTTP/1.1 pool A2AClient itself sends with)")
    print()
    bodies = out.get("bodies", {})
    hdr = (
        f"{'server capacity, wrk -t2 -c32, 1 worker':<42} {'req/s':>8} {'µs CPU':>8} {'p50 ms':>8}"
        f" {'p99 ms':>8} {'200s':>7}"
    )
    print(hdr)
    print("-" * len(hdr))
    for key in (
        "wrk_plain",
        "wrk_signed",
        "wrk_floor",
        "wrk_a2a",
        "wrk_a2a_direct",
        "wrk_a2a_secured",
        "wrk_redis_1w",
        "wrk_redis_2w",
        "wrk_cluster_2w",
    ):
        c = cases.get(key)
        if c is None:
            continue
        if "skipped" in c:
            print(f"{c['name']:<42} {c['skipped']}")
            continue
        line = (
            f"{c['name']:<42} {_f(c.get('rate')):>8} {_f(c.get('server_cpu_us')):>8}"
            f" {_f(c.get('p50_ms'), '.2f'):>8} {_f(c.get('p99_ms'), '.2f'):>8}"
            f" {_f(c.get('ok_fraction', float('nan')) * 100, '.1f'):>6}%"
        )
        if c.get("store_cpu_us") is not None:
            line += f"  (+{_f(c['store_cpu_us'])} µs redis-server CPU)"
        print(line + (f"  {c['note']}" if c.get("note") else ""))
    print(
        f"(µs CPU: server process tree CPU per answered request; requests "
        f"{_f(bodies.get('plain_request_bytes'))} B plain,"
        f" {_f(bodies.get('signed_request_bytes'))} B signed"
        f" (answer {_f(bodies.get('signed_response_bytes'))} B),"
        f" {_f(bodies.get('a2a_request_bytes'))} B a2a-sdk"
        + (
            f", {bodies['a2a_secured_request_bytes']} B SendMessage intent behind a2a_secure)"
            if bodies.get("a2a_secured_request_bytes")
            else ")"
        )
    )
    if "wrk_floor" in cases:
        print(
            "(floor: a raw ASGI app, served as the others, that parses the signed intent request,"
            " verifies its JWS (Ed25519, PyNaCl)\n and answers a signed response JWS; no protocol"
            " checks, no store; it replays the signed bodies of the same round)"
        )
    if out.get("a2a_session_cost"):
        print_session_cost(out["a2a_session_cost"])
    core = out.get("core")
    if core:
        wrk_signed = cases.get("wrk_signed", {}).get("server_cpu_us")
        wrk_plain = cases.get("wrk_plain", {}).get("server_cpu_us")
        rows = [
            ("whole server process under wrk (CPU)", wrk_signed, wrk_plain),
            ("FastAPI app called directly (ASGI, no socket)", core["asgi_signed_us"], core["asgi_plain_us"]),
            ("  parse_request (body → envelope)", core["parse_request_us"], None),
            ("  ServerProtocol.handle (the core)", core["protocol_handle_us"], None),
            ("    jws_decode_unverified (split, base64url, JSON)", core["jws_decode_unverified_us"], None),
            (
                "    jws_verify, given that decode"
                if core.get("jws_verify_given_decode")
                else "    jws_verify (decodes the token again)",
                core["jws_verify_request_us"],
                None,
            ),
            ("      Ed25519 verify alone (libsodium)", core["ed25519_verify_us"], None),
            ("    signed payload == params (check_payload_matches)", core["check_payload_matches_us"], None),
            ("    jws_sign of the response", core["jws_sign_response_us"], None),
            ("      Ed25519 sign alone (libsodium)", core["ed25519_sign_us"], None),
            ("  encode_result (reply → body)", core["encode_result_us"], None),
            (
                "HTTP server + kernel (wrk CPU − ASGI)",
                wrk_signed - core["asgi_signed_us"] if wrk_signed else None,
                wrk_plain - core["asgi_plain_us"] if wrk_plain else None,
            ),
        ]
        print()
        hdr = f"{'where one request’s server CPU goes (µs)':<56} {'signed':>8} {'plain':>8}"
        print(hdr)
        print("-" * len(hdr))
        for label, signed_us, plain_us in rows:
            print(f"{label:<56} {_f(signed_us, '.1f'):>8} {_f(plain_us, '.1f'):>8}")
    if out.get("beyond_floor"):
        print("\n".join(beyond_table(out["beyond_floor"])))
    print()
    mem, rmem = out.get("memory", {}), out.get("redis_memory", {})
    print("memory per open session:")
    if "bytes_per_session" in mem:
        print(
            f"  MemoryStore, {mem['sessions']} sessions: {mem['bytes_per_session']:.0f} B idle,"
            f" {mem['bytes_per_session_after_one_intent']:.0f} B after one intent (RSS delta)"
        )
    else:
        print(f"  MemoryStore: {mem.get('error', 'not measured')}")
    if "bytes_per_session" in rmem:
        print(
            f"  Redis, {rmem['sessions']} sessions: {rmem['bytes_per_session']:.0f} B idle,"
            f" {rmem['bytes_per_session_after_one_intent']:.0f} B after one intent (used_memory delta;"
            f" dataset {rmem['dataset_bytes_per_session']:.0f}"
            f" / {rmem['dataset_bytes_per_session_after_one_intent']:.0f} B)"
        )
        print(
            f"  RedisStore calls, sequential: begin_request {rmem['begin_request_cpu_us']:.0f} µs CPU"
            f" ({rmem['begin_request_wall_us']:.0f} µs wall), finish_request"
            f" {rmem['finish_request_cpu_us']:.0f} µs CPU ({rmem['finish_request_wall_us']:.0f} µs wall)"
            " in the calling process"
        )
    else:
        print(f"  Redis: {rmem.get('error') or out.get('redis', {}).get('skipped', 'not measured')}")
    redis = out.get("redis", {})
    if redis and "skipped" not in redis:
        print()
        print(
            "Redis round trips (INFO stats total_reads_processed: batches of commands clients sent)"
            " and commands (INFO commandstats, not those run inside scripts):"
        )
        for label in ("redis_1w", "redis_2w"):
            r = redis.get(label, {})
            if "round_trips_per_intent" in r:
                cmds = ", ".join(f"{k} {v:.2f}" for k, v in r["top_level_commands"].items())
                wrk_rt = r.get("wrk_round_trips_per_request")
                wrk_cmds = r.get("wrk_commands_per_request")
                print(
                    f"  {label[-2:]}: {r['round_trips_per_intent']:.2f} round trips per intent"
                    f" (sequential, warmed session; commands: {cmds})"
                    + (
                        f"; under wrk {wrk_rt:.2f} round trips, {wrk_cmds:.2f} commands per request"
                        if wrk_rt is not None and wrk_cmds is not None
                        else ""
                    )
                )
            if "error" in r:
                print(f"  {label[-2:]}: error: {r['error']}")
    elif redis:
        print()
        print(f"Redis: {redis['skipped']}")
    print_cluster(out)
    prof = out.get("profile")
    if prof:
        print()
        print(
            f"cProfile of the signed server under wrk ({prof['requests']} requests;"
            " cProfile inflates Python calls):"
        )
        for row in prof["by_tottime"][:15]:
            print(
                f"  {row['tottime_us_per_req']:7.1f} µs/req self"
                f" {row['share'] * 100:5.1f}%  {row['function']}"
            )
    print()
    hdr = f"{'target':<56} {'value':>8} {'limit':>8}  met"
    print(hdr)
    print("-" * len(hdr))
    for t in out["targets"]:
        met = {True: "yes", False: "NO", None: "n/a"}[t["met"]]
        print(f"{t['target']:<56} {_f(t['value'], '.2f'):>8} {t['limit']:>8}  {met:<4} {t['detail']}")


def plot(out: dict[str, Any], path: Path) -> str:
    """A small latency plot, if matplotlib is importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib not installed"
    rows = [
        (("wrk: " if key.startswith("wrk_") else "") + c["name"], c)
        for key, c in out["cases"].items()
        if "p50_ms" in c and "skipped" not in c
    ][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    names = [name for name, _ in rows]
    ax.barh(names, [c["p99_ms"] for _, c in rows], color="#f4a582", label="p99")
    ax.barh(names, [c["p50_ms"] for _, c in rows], color="#2166ac", label="p50")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale); wrk: 32 connections, otherwise Python clients")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot: {path}"
