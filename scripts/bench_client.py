#!/usr/bin/env python3
"""Client CPU per signed intent: ``A2AClient.request`` against the floor client, one run.

    python scripts/bench_client.py [--rounds 7] [--n 400] [--before /work/main] [--json out.json]

A real ``a2a-secure serve`` runs in another process (the test agent of PROTOCOL.md §11, not
sealed, no rate limit). Each client runs in a child process of its own, so that its CPU time
is its own (``time.process_time`` around its loop of sequential intents on one session):

* ``floor``: the least a client of the base contract must do per intent, written plainly:
  build the §6.1 request (orjson, as the SDK writes JSON), sign it with PyNaCl, send one
  keep-alive HTTP/1.1 POST on a socket opened beforehand (blocking), read and parse the
  answer, verify the response token's signature, its ``request_hash``, and the §6.2
  members (session, sequence, status, result, fresh timestamp). No retry, no sealing, no telemetry;
* ``floor-asyncio``: the same floor on asyncio streams (``open_connection``), which says how
  much of the SDK's distance to the floor the event loop itself takes;
* ``sdk``: ``A2AClient.request`` of this tree, its defaults (small ``echo`` intents);
* ``before``: the same ``A2AClient.request`` from the tree named by ``--before`` (its own
  ``PYTHONPATH``), so the before and after figures come from one run, on one server.

The rounds are interleaved (floor, sdk, before, floor, ...): the machine's speed moves
between rounds, a ratio within a round does not move as much. Reported: the median client
CPU µs per intent, sequential intents per second (wall), the ratio to the floor; and, for
each SDK, a step table of where its µs go (each step timed alone, in the child, on the
same session; "the rest" is the request's total less the steps: the event loop, the
adapter's glue, the attempt machine, audit and tracing hooks).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# -- the parent -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Child:
    """A client process answering ``run N`` with its CPU µs per intent and its wall seconds."""

    def __init__(self, kind: str, pythonpath: str, server_did: str, url: str, key_dir: str) -> None:
        env = {**os.environ, "PYTHONPATH": pythonpath}
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind, server_did, url, key_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        self.ask("hello")

    def ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise SystemExit(f"the {self.kind} client ended")
        return json.loads(answer)

    def close(self) -> None:
        self.ask("quit")
        self.proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=400, help="intents per client and round")
    parser.add_argument("--before", default="", help="a source tree whose A2AClient is 'before'")
    parser.add_argument("--json", default="", help="write the figures to this file too")
    parser.add_argument("--uvloop", action="store_true", help="the asyncio clients run on uvloop")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    sys.path.insert(0, str(ROOT))
    from a2a_secure.identity.keys import Identity

    if args.uvloop:
        os.environ["BENCH_CLIENT_UVLOOP"] = "1"  # the children's loops

    with tempfile.TemporaryDirectory() as tmp:
        server_id = Identity.generate("bench-server")
        key = Path(tmp) / "server.key"
        server_id.save(key)
        policy = Path(tmp) / "policy.json"
        policy.write_text(json.dumps({"rate_limit": 10**9, "sealed_intents": False}))
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "a2a_secure", "serve", "--key-file", str(key)]
        command += ["--policy", str(policy), "--port", str(port)]
        server = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        children: list[Child] = []
        try:
            for _ in range(200):
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            children.append(Child("floor", str(ROOT), server_id.did, url, tmp))
            children.append(Child("floor-asyncio", str(ROOT), server_id.did, url, tmp))
            children.append(Child("sdk", str(ROOT), server_id.did, url, tmp))
            if args.before:
                children.append(Child("before", args.before, server_id.did, url, tmp))
            for c in children:  # warm-up
                c.ask("run 200")
            cpu: dict[str, list[float]] = {c.kind: [] for c in children}
            rate: dict[str, list[float]] = {c.kind: [] for c in children}
            ratio: dict[str, list[float]] = {c.kind: [] for c in children}
            for r in range(args.rounds):
                order = children if r % 2 == 0 else children[::-1]
                got = {c.kind: c.ask(f"run {args.n}") for c in order}
                for kind, (us, wall) in got.items():
                    cpu[kind].append(us)
                    rate[kind].append(args.n / wall)
                    ratio[kind].append(us / got["floor"][0])
            steps = {c.kind: c.ask("steps") for c in children if not c.kind.startswith("floor")}
        finally:
            for c in children:
                try:
                    c.close()
                except Exception:
                    c.proc.kill()
            server.terminate()
            server.wait(10)
    report: dict[str, Any] = {"rounds": args.rounds, "intents_per_round": args.n, "clients": {}}
    head = f"{'client':<13} {'CPU µs/intent':>14} {'intents/s':>10} {'× floor':>8}"
    print(f"{head}   (medians of {args.rounds} rounds)")
    for kind, rounds in cpu.items():
        us, per_s, x = (statistics.median(v[kind]) for v in (cpu, rate, ratio))
        report["clients"][kind] = {
            "cpu_us_per_intent": round(us, 1),
            "intents_per_s": round(per_s),
            "over_floor": round(x, 3),
            "cpu_us_rounds": [round(v, 1) for v in rounds],
        }
        print(f"{kind:<13} {us:>14.1f} {per_s:>10.0f} {x:>8.2f}")
    for kind, table in steps.items():
        report["clients"][kind]["steps_us"] = table
        print(f"\nwhere the {kind} client's CPU µs go (steps in order, median of 5 rounds of 300):")
        for name, us in table.items():
            print(f"  {name:<44} {us:>7.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


# -- the children -----------------------------------------------------------------------------------
def child(kind: str, server_did: str, url: str, key_dir: str) -> int:
    ident_path = Path(key_dir) / f"{kind}.key"
    runners = {"floor": FloorClient, "floor-asyncio": AsyncioFloorClient}
    runner = runners.get(kind, SDKClient)(server_did, url, ident_path)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            print(json.dumps("bye"), flush=True)
            runner.close()
            return 0
        if cmd[0] == "hello":
            answer: Any = kind
        elif cmd[0] == "run":
            answer = runner.run(int(cmd[1]))
        else:
            answer = runner.steps()
        print(json.dumps(answer), flush=True)
    return 0


def _new_loop() -> asyncio.AbstractEventLoop:
    """The event loop of a client: asyncio's own, or uvloop's with ``--uvloop``."""
    if os.environ.get("BENCH_CLIENT_UVLOOP") == "1":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _b64u(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64u(text: bytes) -> bytes:
    return base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))


class FloorClient:
    """The floor (see the module doc). The session is opened with the SDK's handshake,
    outside the timed loop; the loop itself uses PyNaCl, hashlib, json and a socket only."""

    def __init__(self, server_did: str, url: str, ident_path: Path) -> None:
        from nacl.signing import SigningKey, VerifyKey

        from a2a_secure.client.http import A2AClient
        from a2a_secure.identity import encoding
        from a2a_secure.identity.keys import Identity

        me = Identity.generate("bench-floor")
        self.loop = _new_loop()

        async def open_session() -> Any:
            client = A2AClient(me, exactly_once=False, sealed=False)
            try:
                return await client.session_for(server_did, url)
            finally:
                await client.aclose(close_sessions=False)  # the session stays the floor's

        session = self.loop.run_until_complete(open_session())
        self.session_id = session.session_id
        self.commitment = session.session_commitment
        self.sequence = 0
        self.server_key = VerifyKey(session.server_key)
        self.server_kid = session.server_kid
        self.signing_key = SigningKey(encoding.b64u_decode(me.private_key_b64u()))
        header = {"alg": "EdDSA", "typ": "a2a-request+jws", "kid": me.kid}
        self.head = _b64u(orjson.dumps(header)) + b"."
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.http_head = (
            f"POST /a2a/intent HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        )
        self.buf = b""
        self.rid = 0

    def _recv_reply(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"floor: {lines[0]!r} {rest[:300]!r}")
        length = next(
            int(v) for k, _, v in (h.partition(b":") for h in lines[1:]) if k.lower() == b"content-length"
        )
        while len(rest) < length:
            rest += self.sock.recv(65536)
        body, self.buf = rest[:length], rest[length:]
        return body

    def one(self, i: int) -> None:
        body, token, intent = self.build(i)
        self.sock.sendall(body)
        self.check(self._recv_reply(), token, intent)

    def build(self, i: int) -> tuple[bytes, bytes, dict[str, Any]]:
        """The request for intent ``i``, whole (head and body), its token and its intent."""
        self.sequence += 1
        self.rid += 1
        intent = {"goal": "echo", "inputs": {"n": i}}
        payload = {
            "session_id": self.session_id,
            "session_commitment": self.commitment,
            "sequence": self.sequence,
            "timestamp": int(time.time()),
            "intent": intent,
        }
        signing_input = self.head + _b64u(orjson.dumps(payload))
        token = signing_input + b"." + _b64u(self.signing_key.sign(signing_input).signature)
        params = {
            "session_id": self.session_id,
            "session_commitment": self.commitment,
            "sequence": self.sequence,
            "intent": intent,
            "request_jws": token.decode(),
        }
        body = orjson.dumps({"jsonrpc": "2.0", "method": "intent", "params": params, "id": self.rid})
        return b"%sContent-Length: %d\r\n\r\n%s" % (self.http_head.encode(), len(body), body), token, intent

    def check(self, raw: bytes, token: bytes, intent: dict[str, Any]) -> None:
        """The checks of the answer ``raw`` to the request whose token is ``token``."""
        reply = orjson.loads(raw)
        if reply.get("jsonrpc") != "2.0" or reply.get("id") != self.rid:
            raise SystemExit("floor: not this request's reply")
        result = reply["result"]
        if result.keys() != {"status", "sequence", "result", "response_jws"}:
            raise SystemExit("floor: §6.2 members")
        h, p, s = result["response_jws"].encode().split(b".")
        header = orjson.loads(_unb64u(h))
        if header != {"alg": "EdDSA", "typ": "a2a-response+jws", "kid": self.server_kid}:
            raise SystemExit("floor: response header")
        self.server_key.verify(h + b"." + p, _unb64u(s))  # raises on a bad signature
        signed = orjson.loads(_unb64u(p))
        if not (
            signed["session_id"] == self.session_id
            and signed["sequence"] == self.sequence == result["sequence"]
            and signed["request_hash"] == "sha256:" + hashlib.sha256(token).hexdigest()
            and signed["status"] == "success" == result["status"]
            and signed["result"] == result["result"] == intent["inputs"]
            and abs(signed["timestamp"] - time.time()) <= 300
        ):
            raise SystemExit("floor: the signed answer does not match")

    def run(self, n: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            self.one(i)
        return (time.process_time() - cpu) / n * 1e6, time.perf_counter() - wall

    def steps(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.sock.close()


class AsyncioFloorClient(FloorClient):
    """The floor with asyncio streams instead of a blocking socket: what asyncio itself costs."""

    def __init__(self, server_did: str, url: str, ident_path: Path) -> None:
        super().__init__(server_did, url, ident_path)
        self.sock.close()
        host, port = url.removeprefix("http://").split(":")
        self.reader, self.writer = self.loop.run_until_complete(asyncio.open_connection(host, int(port)))
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def _loop(self, n: int) -> None:
        for i in range(n):
            body, token, intent = self.build(i)
            self.writer.write(body)
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            if not lines[0].startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"asyncio floor: {lines[0]!r}")
            length = next(
                int(v) for k, _, v in (h.partition(b":") for h in lines[1:]) if k.lower() == b"content-length"
            )
            self.check(await self.reader.readexactly(length), token, intent)

    def run(self, n: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        self.loop.run_until_complete(self._loop(n))
        return (time.process_time() - cpu) / n * 1e6, time.perf_counter() - wall

    def close(self) -> None:
        self.writer.close()


class SDKClient:
    """``A2AClient.request`` of the tree on ``PYTHONPATH``, its defaults."""

    def __init__(self, server_did: str, url: str, ident_path: Path) -> None:
        from a2a_secure.client.http import A2AClient
        from a2a_secure.identity.keys import Identity

        self.loop = _new_loop()
        self.did = server_did
        self.url = url
        self.client = A2AClient(Identity.generate("bench-sdk"))
        self.loop.run_until_complete(
            self.client.request(server_did, {"goal": "echo", "inputs": {"n": 0}}, endpoint=url)
        )

    async def _loop(self, n: int) -> tuple[float, float]:
        request = self.client.request
        did = self.did
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            res = await request(did, {"goal": "echo", "inputs": {"n": i}})
            if res.result != {"n": i}:
                raise SystemExit("sdk: the result did not come back intact")
        return (time.process_time() - cpu) / n * 1e6, time.perf_counter() - wall

    def run(self, n: int) -> tuple[float, float]:
        return self.loop.run_until_complete(self._loop(n))

    def steps(self) -> dict[str, float]:
        return self.loop.run_until_complete(self._steps())

    async def _steps(self) -> dict[str, float]:
        """The request's steps done one after the other by hand, on real answers of the
        server, each step's CPU summed over the loop; "the rest" is the whole request's CPU
        (measured in the same rounds) less the steps."""
        from a2a_secure.identity import encoding
        from a2a_secure.protocol import wire

        session = await self.client.session_for(self.did)
        transport = getattr(self.client, "_transport", None)
        pool = transport.pool if transport is not None else self.client._pool
        url = self.url + "/a2a/intent"
        # A tree whose session reads the common answer from its bytes (and writes the body
        # from the params' JSON) is timed on that path; an older one on the dict path.
        from_bytes = hasattr(session, "verified_reply")
        names = (
            "sign the request (ClientSession.prepare_intent)",
            "JSON-RPC body (encode_request[_json])",
            "one HTTP/1.1 exchange (pool.post, event loop)",
            "parse and verify the answer",
        )
        reps, rounds = 300, 5
        per_round: list[list[float]] = []
        whole: list[float] = []
        clock = time.process_time
        for _ in range(rounds):
            sums = [0.0] * len(names)
            for i in range(reps):
                t0 = clock()
                req = session.prepare_intent({"goal": "echo", "inputs": {"n": i}})
                t1 = clock()
                if from_bytes:
                    body = wire.encode_request_json("intent", req.params_json, i + 1)
                else:
                    body = wire.encode_request("intent", req.params, i + 1)
                t2 = clock()
                _s, content, _ra = await pool.post(url, body, limit=1 << 22, too_large=RuntimeError)
                t3 = clock()
                if from_bytes:
                    if session.verified_reply(req, i + 1, content) is None:
                        raise SystemExit("sdk: the common answer was not read from its bytes")
                else:
                    session.verify_result(req, encoding.loads(content)["result"])
                t4 = clock()
                for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                    sums[k] += b - a
            per_round.append([v / reps * 1e6 for v in sums])
            whole.append((await self._loop(reps))[0])
        table = {name: statistics.median(r[k] for r in per_round) for k, name in enumerate(names)}
        total = statistics.median(whole)
        table["the rest: machine, adapter glue, locks, audit/trace hooks"] = total - sum(table.values())
        table["total per A2AClient.request"] = total
        return {k: round(v, 1) for k, v in table.items()}

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())


if __name__ == "__main__":
    sys.exit(main())
