"""The a2a_secure signed path: the ``AgentServer`` serving ``echo``, its clients, intent bodies
signed in advance for wrk, the in-process breakdown of one intent, and the cProfile run.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a2abench.common import HOST, INTENT, WRK_THREADS
from a2abench.echo import PLAIN_BODY, _plain_app
from a2abench.runner import Bench, Call, _asgi_post, _per_call, new_http, run_wrk, spawn_child

if TYPE_CHECKING:
    from a2a_secure.client.http import A2AClient
    from a2a_secure.protocol.client import ClientSession


def _signed_app() -> Any:
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore

    identity = Identity.from_seed(bytes.fromhex(os.environ["BENCH_SEED"]), "bench-server")
    # A rate limit out of reach: the benchmark measures the work, not the limiter's refusals.
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    server = AgentServer(identity, policy, store=MemoryStore())

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    return server.app()


@dataclass
class SignedClients:
    """A2AClients with open sessions to one server."""

    did: str
    url: str
    clients: list[A2AClient] = field(default_factory=list)

    async def open(self, n: int) -> None:
        from a2a_secure.client.http import A2AClient
        from a2a_secure.identity.keys import Identity

        for i in range(n):
            self.clients.append(A2AClient(Identity.generate(f"bench-client-{i}")))
        await asyncio.gather(*(c.handshake(self.did, self.url) for c in self.clients))

    def calls(self) -> list[Call]:
        def make(client: A2AClient) -> Call:
            async def call() -> None:
                await client.request(self.did, INTENT)

            return call

        return [make(c) for c in self.clients]

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose(close_sessions=False)


async def open_sessions(did: str, url: str, n: int, parallel: int = 8) -> list[ClientSession]:
    """``n`` sessions opened by real handshakes (``parallel`` clients at a time)."""
    from a2a_secure.client.http import A2AClient
    from a2a_secure.identity.keys import Identity

    http = new_http()
    clients = [A2AClient(Identity.generate(f"bench-wrk-{i}"), http=http) for i in range(parallel)]
    sessions: list[ClientSession] = []

    async def run(client: A2AClient, count: int) -> None:
        for _ in range(count):
            sessions.append(await client.handshake(did, url))

    await asyncio.gather(*(run(c, n // parallel + (i < n % parallel)) for i, c in enumerate(clients)))
    for c in clients:
        await c.aclose(close_sessions=False)
    await http.aclose()
    return sessions


def sign_bodies(
    sessions: Sequence[ClientSession],
    count: int,
    make_intent: Callable[[], dict[str, Any]] | None = None,
) -> list[list[bytes]]:
    """``count`` signed intent requests (``make_intent()``, else INTENT) over the wrk threads.

    Each is sent once. Thread ``t`` owns the sessions ``sessions[t::threads]`` and goes round
    them, so that two requests of one session are as many requests apart as the thread has
    sessions (8x its 16 connections): a session's sequences then reach the server in order.
    """
    out: list[list[bytes]] = []
    for t in range(WRK_THREADS):
        own = sessions[t::WRK_THREADS]
        lines = []
        for j in range(count // WRK_THREADS):
            lines.append(intent_body(own[j % len(own)], j + 1, make_intent() if make_intent else None))
        out.append(lines)
    return out


def intent_body(session: ClientSession, rid: int, intent: dict[str, Any] | None = None) -> bytes:
    """A JSON-RPC ``intent`` request with id ``rid``, signed in ``session`` (INTENT unless told)."""
    from a2a_secure.identity import encoding

    req = session.prepare_intent(intent or INTENT)
    return encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": req.params, "id": rid})


async def open_in_process(protocol: Any, client_id: Any, resolved: Any) -> ClientSession:
    """A session opened by a full handshake with a ``ServerProtocol`` called directly."""
    from a2a_secure.protocol.client import ClientHandshake

    hs = ClientHandshake(client_id, resolved)
    challenge = await protocol.handle("hello", hs.hello())
    policy = await protocol.handle("proof", hs.receive_challenge(challenge.result))
    return hs.receive_session(
        (await protocol.handle("accept_policy", hs.receive_policy(policy.result))).result
    )


def profile_signed(bench: Bench, seed: bytes, server_did: str) -> None:
    """Run the signed server under cProfile for one wrk run; keep the top functions."""
    import pstats

    bench.log("profiling the signed server under wrk")
    out = bench.workdir / "signed.prof"
    proc = spawn_child(
        "signed", bench.workdir, env={"BENCH_SEED": seed.hex(), "BENCH_PROFILE_OUT": str(out)}
    ).wait()
    try:
        sessions = bench.runner.run(open_sessions(server_did, proc.url, 128))
        bodies = sign_bodies(sessions, 8000)
        proc.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        res = run_wrk(proc.url + "/a2a/intent", bodies, 3, proc, bench.workdir, once=True)
    finally:
        proc.stop()
    stats = pstats.Stats(str(out))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    bench.results["profile"] = {
        "requests": res.answered,
        "total_s": total,
        "by_tottime": [
            {
                "function": f,
                "calls": nc,
                "tottime_us_per_req": tt / res.answered * 1e6,
                "share": tt / total,
            }
            for tt, _ct, nc, f in rows[:30]
        ],
        "by_cumtime": [
            {
                "function": f,
                "calls": nc,
                "cumtime_us_per_req": ct / res.answered * 1e6,
                "share": ct / total,
            }
            for _tt, ct, nc, f in sorted(rows, key=lambda x: x[1], reverse=True)[:40]
        ],
    }


def echo_server() -> Any:
    """An in-process ``AgentServer`` serving ``echo`` (result = inputs), rate limit out of reach."""
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.server.app import AgentServer

    server = AgentServer(
        Identity.generate("bench-server"), Policy.build(rate_limit=10**9, session_timeout=3600)
    )

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    return server


async def _core_breakdown(n: int) -> dict[str, Any]:
    """Where one signed intent's server time goes, in this process (CPU µs per call).

    ``asgi_*`` call the FastAPI app directly (no uvicorn, no socket): the difference to the
    wrk figure is the HTTP server (uvicorn, httptools, uvloop) and the kernel.
    """
    import nacl.bindings

    from a2a_secure.errors import AuthenticationFailed
    from a2a_secure.identity.jws import jws_decode_unverified, jws_sign, jws_verify
    from a2a_secure.identity.keys import Identity
    from a2a_secure.protocol import messages as m
    from a2a_secure.protocol.validate import check_payload_matches
    from a2a_secure.protocol.wire import encode_result, parse_request

    server = echo_server()
    server_id = server.identity
    protocol = server.protocol
    resolved = await server.resolver.resolve(server_id.did)
    session = await open_in_process(protocol, Identity.generate("bench-client"), resolved)
    bodies = [intent_body(session, i) for i in range(2 * n)]
    t = time.process_time()
    envelopes = [parse_request(b, "intent") for b in bodies[:n]]
    t_parse = (time.process_time() - t) / n
    t = time.process_time()
    replies = [await protocol.handle(e.method, e.params, source=HOST) for e in envelopes]
    t_core = (time.process_time() - t) / n
    t = time.process_time()
    for e, rep in zip(envelopes, replies, strict=True):
        encode_result(e.id, rep.result)
    t_encode = (time.process_time() - t) / n
    ok = sum(1 for rep in replies if rep.http_status == 200)

    app = server.app()
    t = time.process_time()
    for body in bodies[n:]:
        ok += await _asgi_post(app, "/a2a/intent", body) == 200
    t_asgi = (time.process_time() - t) / n
    plain = _plain_app()
    t = time.process_time()
    for _ in range(n):
        await _asgi_post(plain, "/echo", PLAIN_BODY)
    t_plain = (time.process_time() - t) / n

    # The pieces of the core, on this intent's own token and payloads.
    token = envelopes[0].params["request_jws"]
    _header, payload, signing_input, signature = jws_decode_unverified(token)
    expected = {k: payload[k] for k in ("session_id", "session_commitment", "sequence", "intent")}
    response = {"session_id": session.session_id, "sequence": 1, "request_hash": m.request_hash(token)}
    response |= {"status": "success", "result": INTENT["inputs"], "timestamp": int(time.time())}
    pk = session.identity.public_key
    k = max(1000, n // 2)
    # Newer cores decode the token once and hand the decode to jws_verify: measure it so.
    verify_kw: dict[str, Any] = {}
    if "decoded" in inspect.signature(jws_verify).parameters:
        verify_kw["decoded"] = jws_decode_unverified(token)
    return {
        "request_bytes": len(bodies[0]),
        "response_bytes": len(encode_result(envelopes[0].id, replies[0].result)),
        "intents": n,
        "ok_fraction": ok / (2 * n),
        "parse_request_us": t_parse * 1e6,
        "protocol_handle_us": t_core * 1e6,
        "encode_result_us": t_encode * 1e6,
        "asgi_signed_us": t_asgi * 1e6,
        "asgi_plain_us": t_plain * 1e6,
        "jws_decode_unverified_us": _per_call(lambda: jws_decode_unverified(token), k),
        "jws_verify_given_decode": bool(verify_kw),
        "jws_verify_request_us": _per_call(
            lambda: jws_verify(token, pk, typ=m.Typ.REQUEST, kid=session.identity.kid, **verify_kw), k
        ),
        "ed25519_verify_us": _per_call(
            lambda: nacl.bindings.crypto_sign_open(signature + signing_input, pk), k
        ),
        "check_payload_matches_us": _per_call(
            lambda: check_payload_matches(payload, expected, AuthenticationFailed), k
        ),
        "jws_sign_response_us": _per_call(lambda: jws_sign(response, server_id, m.Typ.RESPONSE), k),
        "ed25519_sign_us": _per_call(lambda: server_id.sign(signing_input), k),
    }
