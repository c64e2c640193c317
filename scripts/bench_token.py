#!/usr/bin/env python3
"""Server CPU per signed intent with the agent's key in a PKCS#11 token vs in a key file.

Two in-memory ``echo`` servers in this process (``ServerProtocol.handle``, the same core the
HTTP server runs), one whose identity is a key file's seed (libsodium signs) and one whose
key was generated inside a SoftHSM2 token (the token signs, ``CKM_EDDSA``). Rounds
alternate between them; each figure is the median of ``--rounds`` of ``--intents`` intents,
counted in this process's CPU time around ``handle`` alone (the client's signing and
verification are outside). Also: the time of one signature by each holder.

SoftHSM2 is software: a network HSM or a cloud KMS adds its round trip to every answer
(see SECURITY.md, "Keys in a token").

    SOFTHSM2_CONF=… python scripts/bench_token.py --uri 'pkcs11:token=…;object=…?pin-value=…&module-path=…'
    python scripts/bench_token.py --make-token   # a throw-away SoftHSM2 token in a temporary folder
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_core import make_server
from bench_sealed import handshake, server_seconds

from a2a_secure.identity.keys import Identity

SOFTHSM_MODULE = "/usr/lib/softhsm/libsofthsm2.so"


def throwaway_token(folder: Path) -> str:
    """A SoftHSM2 token in ``folder`` with a new key; its URI (SOFTHSM2_CONF set here)."""
    (folder / "tokens").mkdir()
    conf = folder / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {folder / 'tokens'}\nobjectstore.backend = file\n")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    util = shutil.which("softhsm2-util")
    if util is None:
        raise SystemExit("softhsm2-util not found (Debian package softhsm2)")
    subprocess.run(
        [util, "--init-token", "--free", "--label", "bench", "--pin", "1234", "--so-pin", "5678"],
        check=True, capture_output=True,
    )  # fmt: skip
    uri = f"pkcs11:token=bench;object=server?pin-value=1234&module-path={SOFTHSM_MODULE}"
    from a2a_secure.identity.pkcs11 import generate_token_identity

    generate_token_identity(uri)
    return uri


def sign_us(ident: Identity, n: int = 500) -> float:
    start = time.process_time()
    for i in range(n):
        ident.sign(b"x" * 200 + i.to_bytes(4, "big"))
    return (time.process_time() - start) / n * 1e6


async def run(uri: str, rounds: int, n: int) -> dict[str, Any]:
    from a2a_secure.identity.pkcs11 import load_token_identity

    holders = {"file": Identity.generate("bench-file"), "token": load_token_identity(uri)}
    client = Identity.generate("bench-client")
    servers = {k: make_server(ident, sessions=100) for k, ident in holders.items()}
    sessions = {k: await handshake(servers[k], client, holders[k].did, seal=False) for k in holders}
    inputs = {"text": "x" * 100}
    for k in holders:
        await server_seconds(servers[k], sessions[k], inputs, 100)  # warm-up
    per: dict[str, list[float]] = {k: [] for k in holders}
    gc.disable()
    try:
        for _ in range(rounds):
            for k in holders:
                per[k].append(await server_seconds(servers[k], sessions[k], inputs, n) / n * 1e6)
    finally:
        gc.enable()
    f, t = statistics.median(per["file"]), statistics.median(per["token"])
    return {
        "intents_per_round": n,
        "rounds": rounds,
        "server_cpu_us_per_intent_file_key": round(f, 1),
        "server_cpu_us_per_intent_token_key": round(t, 1),
        "token_over_file": round(t / f, 3),
        "sign_us_file_key": round(sign_us(holders["file"]), 1),
        "sign_us_token_key": round(sign_us(holders["token"]), 1),
        "rounds_file_us": [round(x, 1) for x in per["file"]],
        "rounds_token_us": [round(x, 1) for x in per["token"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--uri", help="the token key to serve with (a pkcs11: URI)")
    group.add_argument("--make-token", action="store_true", help="use a throw-away SoftHSM2 token")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--intents", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uri = throwaway_token(Path(tmp)) if args.make_token else args.uri
        print(json.dumps(asyncio.run(run(uri, args.rounds, args.intents)), indent=2))


if __name__ == "__main__":
    main()
