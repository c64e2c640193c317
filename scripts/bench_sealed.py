#!/usr/bin/env python3
"""Server CPU per sealed intent next to a plain one (PROTOCOL.md §12.6).

Two measurements, each with two sessions of one client, one sealed and one not, and 1 KB of
JSON inputs to the test agent's ``echo`` (so the result is 1 KB too):

* HTTP: ``a2a-secure serve`` in its own process (uvicorn, one worker, MemoryStore) and the
  real ``A2AClient``; the figure is the server process's CPU time (user + system, from
  /proc, in clock ticks: use enough ``--intents`` per round) divided by the intents it
  answered: what a deployment pays per intent.
* core: ``ServerProtocol.handle_now`` (what the ASGI adapter calls: the common intent's
  flat path, sealed or not) alone in this process (no HTTP, no JSON body), timed
  around each intent (shapes, session, signature check, opening the inputs, the handler,
  sealing the result, signing the answer); the client's work is outside the timed part.
  This isolates the sealing work: the AEAD, base64url of the ciphertext (which travels
  once: the signed payloads carry its SHA-256 digest) and the JSON of inputs and result.

Rounds alternate plain and sealed batches so that both meet the same machine state; each
figure is the median of ``--rounds``. A sealed intent does no public-key work: the X25519
exchange happens once per handshake (reported too).

``--instructions`` adds a third figure that does not depend on what else the machine does:
the instructions valgrind's callgrind counts per intent in the core measurement's work
(200 intents minus 0, each in its own process), plain and sealed.

    python scripts/bench_sealed.py [--rounds 7] [--intents 2000] [--size 1024] [--instructions]
                                   [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_core import make_server

from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.protocol.server import Reply
from a2a_secure.runtime.router import ServerProtocol


async def handshake(
    server: ServerProtocol, client: Identity, server_did: str, *, seal: bool
) -> ClientSession:
    hs = ClientHandshake(client, resolve_did_key(server_did))
    challenge = await server.handle("hello", hs.hello(), source="bench")
    policy = await server.handle("proof", hs.receive_challenge(challenge.result))
    hs.seal = seal
    session = await server.handle("accept_policy", hs.receive_policy(policy.result))
    return hs.receive_session(session.result)


async def server_seconds(
    server: ServerProtocol, session: ClientSession, inputs: dict[str, Any], n: int
) -> float:
    """Seconds the server spent on ``n`` intents (its handling only), each answer verified."""
    total = 0.0
    for _ in range(n):
        req = session.prepare_intent({"goal": "echo", "inputs": inputs})
        start = time.process_time()  # CPU time: other processes on the machine do not count
        reply = await _answer(server, req.params)
        total += time.process_time() - start
        if session.verify_result(req, reply.result).result != inputs:
            raise SystemExit("a result did not come back intact")
    return total


async def _answer(server: ServerProtocol, params: Any) -> Reply:
    """The reply to an ``intent`` as the ASGI adapter gets it (awaited only if it must be)."""
    pending = server.handle_now("intent", params)
    return pending if isinstance(pending, Reply) else await pending


async def handshake_seconds(
    server: ServerProtocol, client: Identity, did: str, n: int, *, seal: bool
) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await handshake(server, client, did, seal=seal)
    return (time.perf_counter() - start) / n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def run_http(rounds: int, n: int, size: int) -> dict[str, Any]:
    """Server process CPU per intent over HTTP, plain and sealed."""
    from a2a_secure.client.http import A2AClient

    with tempfile.TemporaryDirectory() as tmp:
        server_id = Identity.generate("bench-server")
        key = Path(tmp) / "server.key"
        server_id.save(key)
        policy = Path(tmp) / "policy.json"
        # Sealing is the default: a plain serve, whose sessions are sealed or not as the client asks.
        policy.write_text(json.dumps({"rate_limit": 10**9}))
        port = _free_port()
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "a2a_secure", "serve", "--key-file", str(key)],
            *["--policy", str(policy), "--port", str(port)],
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                await asyncio.sleep(0.05)
            inputs = {"text": "x" * (size - len('{"text":""}'))}
            intent = {"goal": "echo", "inputs": inputs}
            per: dict[bool, list[float]] = {False: [], True: []}
            async with (
                # exactly_once=False: intent_id is not used on a sealed session, so the plain
                # one must not pay for it either.
                A2AClient(Identity.generate("bench-plain"), sealed=False, exactly_once=False) as plain,
                A2AClient(Identity.generate("bench-sealed"), sealed=True, exactly_once=False) as sealed,
            ):
                clients = {False: plain, True: sealed}
                for client in clients.values():  # handshake and warm-up
                    for _ in range(100):
                        await client.request(server_id.did, intent, endpoint=url)
                for _ in range(rounds):
                    for is_sealed, client in clients.items():
                        before = _cpu_seconds(proc.pid)
                        for _ in range(n):
                            res = await client.request(server_id.did, intent)
                        per[is_sealed].append((_cpu_seconds(proc.pid) - before) / n * 1e6)
                        if res.result != inputs:
                            raise SystemExit("a result did not come back intact")
                assert (await sealed.session_for(server_id.did)).sealed
        finally:
            proc.terminate()
            await proc.wait()
    p, s = statistics.median(per[False]), statistics.median(per[True])
    return {
        "http_server_cpu_us_per_plain_intent": round(p, 1),
        "http_server_cpu_us_per_sealed_intent": round(s, 1),
        "http_sealed_over_plain": round(s / p, 3),
    }


async def run(rounds: int, n: int, size: int) -> dict[str, Any]:
    server_id, client = Identity.generate("bench-server"), Identity.generate("bench-client")
    server = make_server(server_id, sessions=10_000, sealed=True)
    plain = await handshake(server, client, server_id.did, seal=False)
    sealed = await handshake(server, client, server_id.did, seal=True)
    assert sealed.sealed and not plain.sealed
    inputs = {"text": "x" * (size - len('{"text":""}'))}
    await server_seconds(server, plain, inputs, 200)  # warm-up
    await server_seconds(server, sealed, inputs, 200)
    plain_us: list[float] = []
    sealed_us: list[float] = []
    gc.disable()
    try:
        for _ in range(rounds):
            plain_us.append(await server_seconds(server, plain, inputs, n) / n * 1e6)
            sealed_us.append(await server_seconds(server, sealed, inputs, n) / n * 1e6)
    finally:
        gc.enable()
    hs_plain = await handshake_seconds(server, client, server_id.did, 50, seal=False)
    hs_sealed = await handshake_seconds(server, client, server_id.did, 50, seal=True)
    p, s = statistics.median(plain_us), statistics.median(sealed_us)
    return {
        "input_bytes": size,
        "intents_per_round": n,
        "rounds": rounds,
        "server_us_per_plain_intent": round(p, 1),
        "server_us_per_sealed_intent": round(s, 1),
        "sealed_over_plain": round(s / p, 3),
        "handshake_ms_plain_both_sides": round(hs_plain * 1e3, 3),
        "handshake_ms_sealed_both_sides": round(hs_sealed * 1e3, 3),
        "python": platform.python_version(),
    }


async def counted_work(mode: str, n: int, size: int) -> None:
    """``n`` intents on a ``mode`` (plain or sealed) session after 20 to warm up: for callgrind."""
    server_id, client = Identity.generate("bench-server"), Identity.generate("bench-client")
    server = make_server(server_id, sessions=100, sealed=True)
    session = await handshake(server, client, server_id.did, seal=mode == "sealed")
    inputs = {"text": "x" * (size - len('{"text":""}'))}
    # Signed beforehand, as many in both runs: only the server's work differs.
    reqs = [session.prepare_intent({"goal": "echo", "inputs": inputs}) for _ in range(220)]
    for req in reqs[: 20 + n]:
        await _answer(server, req.params)


def _callgrind(mode: str, n: int, size: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    cmd += ["--count", mode, str(n), "--size", str(size)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind {mode} {n} failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def run_instructions(size: int) -> dict[str, Any]:
    """Instructions per intent in the core, plain and sealed (callgrind, 200 minus 0)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(mode, n) for mode in ("plain", "sealed") for n in (0, 200)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: _callgrind(j[0], j[1], size), jobs), strict=True))
    plain = (counts[("plain", 200)] - counts[("plain", 0)]) / 200
    sealed = (counts[("sealed", 200)] - counts[("sealed", 0)]) / 200
    return {
        "instructions_per_plain_intent": round(plain),
        "instructions_per_sealed_intent": round(sealed),
        "instructions_sealed_over_plain": round(sealed / plain, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--intents", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024, help="bytes of JSON inputs")
    parser.add_argument("--instructions", action="store_true", help="also count instructions (valgrind)")
    parser.add_argument("--json", type=Path, metavar="PATH")
    parser.add_argument("--count", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count is not None:  # one process under callgrind
        asyncio.run(counted_work(args.count[0], int(args.count[1]), args.size))
        return 0
    out = asyncio.run(run_http(args.rounds, args.intents, args.size))
    out.update(asyncio.run(run(args.rounds, args.intents, args.size)))
    print(f"server CPU per intent, {out['input_bytes']} B of inputs (median of {out['rounds']} rounds):")
    print(
        f"  HTTP (a2a-secure serve):  plain {out['http_server_cpu_us_per_plain_intent']:8.1f} µs,"
        f" sealed {out['http_server_cpu_us_per_sealed_intent']:8.1f} µs"
        f"   ({out['http_sealed_over_plain']:.3f} × plain)"
    )
    print(
        f"  core (ServerProtocol):    plain {out['server_us_per_plain_intent']:8.1f} µs,"
        f" sealed {out['server_us_per_sealed_intent']:8.1f} µs   ({out['sealed_over_plain']:.3f} × plain)"
    )
    if args.instructions:
        out.update(run_instructions(args.size))
        print(
            f"  core, instructions:       plain {out['instructions_per_plain_intent']:>8,},"
            f" sealed {out['instructions_per_sealed_intent']:>8,}"
            f"   ({out['instructions_sealed_over_plain']:.3f} × plain, callgrind)"
        )
    print(
        f"handshake, both sides: plain {out['handshake_ms_plain_both_sides']:.3f} ms,"
        f" sealed {out['handshake_ms_sealed_both_sides']:.3f} ms (one X25519 exchange per side)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
