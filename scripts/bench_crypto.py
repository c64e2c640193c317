#!/usr/bin/env python3
"""Ed25519 and JWS micro-benchmark: PyNaCl (libsodium) against cryptography (OpenSSL).

Prints operations per second and microseconds per operation, the median of several rounds
(the machines are shared and noisy: compare the ratios within one run, as BASELINES.md
says). Standalone; not a test.

    python scripts/bench_crypto.py [--rounds 7] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import nacl.bindings
import nacl.signing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from a2a_secure.identity import Identity, jws_sign, jws_verify
from a2a_secure.identity.encoding import dumps

TYP = "a2a-request+jws"


def _payload(target: int = 500) -> dict[str, object]:
    """A JSON-RPC-like intent payload whose JSON is about ``target`` bytes."""
    inputs: dict[str, object] = {"text": "", "target_language": "es"}
    payload: dict[str, object] = {
        "session_id": "q" * 43,
        "session_commitment": "sha256:" + "0" * 64,
        "sequence": 1,
        "timestamp": 1763700000,
        "intent": {
            "goal": "translate",
            "domain": "nlp",
            "inputs": inputs,
            "constraints": {"max_tokens": 100, "timeout_ms": 30000},
        },
    }
    inputs["text"] = "x" * max(0, target - len(dumps(payload)))
    return payload


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Operations per second of ``fn`` over at least ``seconds``."""
    batch = 1
    while True:  # size a batch so that timer overhead does not matter
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 10:
            break
        batch *= 2
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(batch):
            fn()
        count += batch
    return count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per case (median is shown)")
    parser.add_argument("--seconds", type=float, default=0.3, help="duration of one round")
    args = parser.parse_args()

    message = b"m" * 500
    identity = Identity.generate("bench")
    nacl_key = nacl.signing.SigningKey.generate()
    nacl_verify_key = nacl_key.verify_key
    nacl_sig = nacl_key.sign(message).signature
    ossl_key = Ed25519PrivateKey.generate()
    ossl_public = ossl_key.public_key()
    ossl_sig = ossl_key.sign(message)
    payload = _payload()
    token = jws_sign(payload, identity, TYP)
    pk, kid = identity.public_key, identity.kid
    raw_public = bytes(nacl_verify_key)

    cases: list[tuple[str, Callable[[], object]]] = [
        ("PyNaCl sign (SigningKey.sign)", lambda: nacl_key.sign(message)),
        ("PyNaCl verify (VerifyKey.verify)", lambda: nacl_verify_key.verify(message, nacl_sig)),
        (
            "PyNaCl verify (bindings.crypto_sign_open)",
            lambda: nacl.bindings.crypto_sign_open(nacl_sig + message, raw_public),
        ),
        ("cryptography sign", lambda: ossl_key.sign(message)),
        ("cryptography verify", lambda: ossl_public.verify(ossl_sig, message)),
        ("Identity.sign", lambda: identity.sign(message)),
        (f"jws_sign ({len(dumps(payload))} B payload)", lambda: jws_sign(payload, identity, TYP)),
        (f"jws_verify ({len(token)} B token)", lambda: jws_verify(token, pk, typ=TYP, kid=kid)),
    ]

    print(f"{args.rounds} rounds of {args.seconds:.2f} s each; median shown; message {len(message)} B\n")
    width = max(len(name) for name, _ in cases)
    print(f"{'operation':<{width}}  {'ops/s':>10}  {'µs/op':>8}  {'spread':>7}")
    print(f"{'-' * width}  {'-' * 10}  {'-' * 8}  {'-' * 7}")
    for name, fn in cases:
        rates = [_rate(fn, args.seconds) for _ in range(args.rounds)]
        median = statistics.median(rates)
        spread = (max(rates) - min(rates)) / median
        print(f"{name:<{width}}  {median:>10,.0f}  {1e6 / median:>8.1f}  {spread:>6.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
