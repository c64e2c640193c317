#!/usr/bin/env python3
"""Throughput of the sans-I/O protocol core, next to the Ed25519 work it cannot avoid.

Runs ``ServerProtocol`` against ``ClientHandshake`` / ``ClientSession`` in one process (an
in-memory ``MemoryStore``, asyncio, no HTTP) and reports:

* handshakes/s: HELLO → CHALLENGE → PROOF → POLICY → ACCEPT_POLICY → SESSION, both sides;
* intents/s: prepare + sign, server checks + handler + sign, client verify, on one session;
* the cost of the raw Ed25519 operations those contain, measured in the same run with
  libsodium directly (the engine the SDK uses) over the very signing inputs the protocol
  produced: a handshake is 4 signs (client: proof, accept; server: policy, session) and
  4 verifies (server: proof, accept; client: policy, session); an intent is 2 signs
  (request, response) and 2 verifies;
* the ratio total time / crypto time, so the non-crypto overhead (JSON, JCS, hashing,
  base64url, checks, store) is visible.

Every figure is the median of ``--rounds`` rounds. ``--json PATH`` also writes them.

    python scripts/bench_core.py [--rounds 7] [--handshakes 300] [--intents 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import nacl
import nacl.bindings

from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, ServerLimits
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.store.memory import MemoryStore

INTENT = {"goal": "echo", "domain": "bench", "inputs": {"text": "Hello world", "target_language": "es"}}


async def _echo(inputs: Any, ctx: IntentContext) -> Any:
    return inputs


def make_server(server_id: Identity, *, sessions: int, sealed: bool = False, **extra: Any) -> ServerProtocol:
    """An in-memory ``echo`` server for ``sessions`` handshakes (``extra``: more of its options,
    such as ``delegation``; ``sealed``: it declares sealed intents)."""
    dispatcher = IntentDispatcher()
    dispatcher.add("echo", _echo)
    return ServerProtocol(
        server_id,
        Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600),
        store=MemoryStore(),
        resolver=DIDResolver(),
        dispatcher=dispatcher,
        manifest_hash=encoding.hash_of({"name": "bench", "did": server_id.did}),
        limits=ServerLimits(
            max_sessions=sessions + 10, max_pending_total=sessions + 10, sealed_intents=sealed
        ),
        **extra,
    )


async def handshake(
    server: ServerProtocol, client_id: Identity, server_did: str
) -> tuple[ClientSession, dict[str, str]]:
    """One full handshake; returns the session and the tokens it produced."""
    hs = ClientHandshake(client_id, resolve_did_key(server_did))
    r = await server.handle("hello", hs.hello())
    assert r.error is None, r.error
    challenge = r.result
    proof = hs.receive_challenge(challenge)
    r = await server.handle("proof", proof)
    assert r.error is None, r.error
    accept = hs.receive_policy(r.result)
    r = await server.handle("accept_policy", accept)
    assert r.error is None, r.error
    sess = hs.receive_session(r.result)
    tokens = {
        "policy": challenge["policy_signature"],
        "proof": proof["proof_jws"],
        "accept": accept["accept_jws"],
        "session": r.result["session_jws"],
    }
    return sess, tokens


async def intent(server: ServerProtocol, sess: ClientSession) -> dict[str, str]:
    req = sess.prepare_intent(INTENT)
    r = await server.handle("intent", req.params)
    assert r.error is None, r.error
    sess.verify_result(req, r.result)
    return {"request": req.params["request_jws"], "response": r.result["response_jws"]}


def _split(token: str) -> tuple[bytes, bytes]:
    signing_input, _, sig = token.rpartition(".")
    return signing_input.encode("ascii"), encoding.b64u_decode(sig)


def time_crypto(
    tokens: dict[str, str], keys: dict[str, tuple[bytes, bytes]], reps: int
) -> dict[str, dict[str, float]]:
    """Seconds per raw sign and verify of each token's signing input (libsodium directly)."""
    out: dict[str, dict[str, float]] = {}
    sign, open_ = nacl.bindings.crypto_sign, nacl.bindings.crypto_sign_open
    for name, token in tokens.items():
        msg, sig = _split(token)
        sk, pk = keys[name]
        assert sign(msg, sk)[:64] == sig  # Ed25519 is deterministic: the same signature
        signed = sig + msg
        t0 = time.perf_counter()
        for _ in range(reps):
            sign(msg, sk)
        t1 = time.perf_counter()
        for _ in range(reps):
            open_(signed, pk)
        t2 = time.perf_counter()
        out[name] = {"sign": (t1 - t0) / reps, "verify": (t2 - t1) / reps}
    return out


async def one_round(n_handshakes: int, n_intents: int, crypto_reps: int) -> dict[str, float]:
    server_id = Identity.generate("bench-server")
    client_id = Identity.generate("bench-client")
    server = make_server(server_id, sessions=n_handshakes + 1)

    # Warm up (did:key decoding caches, imports, allocator) and collect real tokens.
    sess, hs_tokens = await handshake(server, client_id, server_id.did)
    in_tokens = await intent(server, sess)

    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n_handshakes):
        await handshake(server, client_id, server_id.did)
    t_hs = (time.perf_counter() - t0) / n_handshakes

    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n_intents):
        await intent(server, sess)
    t_in = (time.perf_counter() - t0) / n_intents

    sk_server = server_id._signing._signing_key
    sk_client = client_id._signing._signing_key
    keys = {
        "policy": (sk_server, server_id.public_key),
        "session": (sk_server, server_id.public_key),
        "response": (sk_server, server_id.public_key),
        "proof": (sk_client, client_id.public_key),
        "accept": (sk_client, client_id.public_key),
        "request": (sk_client, client_id.public_key),
    }
    c = time_crypto({**hs_tokens, **in_tokens}, keys, crypto_reps)
    crypto_hs = sum(c[k]["sign"] + c[k]["verify"] for k in ("policy", "proof", "accept", "session"))
    crypto_in = sum(c[k]["sign"] + c[k]["verify"] for k in ("request", "response"))
    signs = [v["sign"] for v in c.values()]
    verifies = [v["verify"] for v in c.values()]
    return {
        "handshake_s": t_hs,
        "intent_s": t_in,
        "handshake_crypto_s": crypto_hs,
        "intent_crypto_s": crypto_in,
        "sign_s": statistics.mean(signs),
        "verify_s": statistics.mean(verifies),
        "request_sign_s": c["request"]["sign"],
        "request_verify_s": c["request"]["verify"],
        "signing_input_bytes_request": len(_split(in_tokens["request"])[0]),
        "signing_input_bytes_proof": len(_split(hs_tokens["proof"])[0]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--handshakes", type=int, default=300, help="handshakes per round")
    ap.add_argument("--intents", type=int, default=2000, help="intents per round")
    ap.add_argument("--crypto-reps", type=int, default=2000, help="repetitions per raw sign/verify")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args(argv)

    rounds = [
        asyncio.run(one_round(args.handshakes, args.intents, args.crypto_reps)) for _ in range(args.rounds)
    ]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    hs, hs_c = med["handshake_s"], med["handshake_crypto_s"]
    it, it_c = med["intent_s"], med["intent_crypto_s"]
    results = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "pynacl": getattr(nacl, "__version__", "?"),
        "rounds": args.rounds,
        "handshakes_per_round": args.handshakes,
        "intents_per_round": args.intents,
        "handshakes_per_s": 1 / hs,
        "handshake_us": hs * 1e6,
        "handshake_crypto_us": hs_c * 1e6,
        "handshake_ratio_total_over_crypto": hs / hs_c,
        "intents_per_s": 1 / it,
        "intent_us": it * 1e6,
        "intent_crypto_us": it_c * 1e6,
        "intent_ratio_total_over_crypto": it / it_c,
        "ed25519_sign_us": med["sign_s"] * 1e6,
        "ed25519_verify_us": med["verify_s"] * 1e6,
        "request_signing_input_bytes": int(med["signing_input_bytes_request"]),
        "proof_signing_input_bytes": int(med["signing_input_bytes_proof"]),
        "per_round": rounds,
    }

    print(
        f"a2a_secure core benchmark  (Python {results['python']} {results['machine']}, "
        f"PyNaCl {results['pynacl']}, median of {args.rounds} rounds)"
    )
    print()
    print(f"{'':26}{'per second':>12}{'µs each':>11}{'of which Ed25519':>19}{'total/crypto':>14}")
    for label, total, crypto in (
        ("handshake (4 sign+4 ver)", hs, hs_c),
        ("intent    (2 sign+2 ver)", it, it_c),
    ):
        print(f"{label:26}{1 / total:12.0f}{total * 1e6:11.1f}{crypto * 1e6:16.1f} µs{total / crypto:13.2f}x")
    print()
    print(
        f"raw Ed25519 (libsodium) on the protocol's signing inputs: sign {med['sign_s'] * 1e6:.1f} µs, "
        f"verify {med['verify_s'] * 1e6:.1f} µs"
    )
    print(
        f"non-crypto overhead: handshake {(hs - hs_c) * 1e6:.1f} µs ({100 * (hs - hs_c) / hs:.0f}%), "
        f"intent {(it - it_c) * 1e6:.1f} µs ({100 * (it - it_c) / it:.0f}%)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
