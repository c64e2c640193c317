"""a2a-sdk: its echo agent served directly, and the same executor behind a2a_secure.

The direct / secured pair (A, B) tells what the DID session costs per a2a-sdk call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from a2abench.common import HOST, WRK_THREADS, _f, _ratio
from a2abench.runner import Bench, Call, Case, Proc, Starting, json_call, new_http
from a2abench.signed import open_sessions, sign_bodies

if TYPE_CHECKING:
    import argparse

    import httpx

    from a2a_secure.client.http import A2AClient
    from a2a_secure.protocol.client import ClientSession

A2A_POOL_NAME = "a2a-sdk SendMessage, 1 client, pool"
A2A_HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}
A2A_SKIP = "skipped: a2a-sdk not installed (pip install 'a2a-sdk[http-server]')"
A2A_PAIR_SKIP = "skipped: a2a-sdk not importable here (pip install 'a2a-secure[a2a]' 'a2a-sdk[http-server]')"
# a2a-sdk's OpenTelemetry spans off, as in BASELINES.md: the direct / secured pair measures
# the protocol work, not the SDK's tracing.
OTEL_OFF = {"OTEL_INSTRUMENTATION_A2A_SDK_ENABLED": "false"}
# The direct / secured a2a-sdk pair: case keys and row names.
A2A_PAIR = {
    "a2a_direct_seq": "a2a-sdk direct (OTel off), 1 client",
    "a2a_secured_seq": "a2a-sdk behind a2a_secure, 1 session",
    "wrk_a2a_direct": "a2a-sdk direct (OTel off)",
    "wrk_a2a_secured": "a2a-sdk behind a2a_secure",
}


def find_a2a_python(args: argparse.Namespace) -> str | None:
    """The interpreter to serve the a2a-sdk case with (``--a2a-python``, else this one if it has a2a)."""
    if args.a2a_python:
        return str(args.a2a_python)
    try:
        import a2a  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def a2a_pair_skip() -> str:
    """Why the direct / secured pair cannot run (empty when it can: a2a importable here)."""
    return "" if importlib.util.find_spec("a2a") is not None else A2A_PAIR_SKIP


def _a2a_message(text: str) -> dict[str, Any]:
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}]}


def _a2a_body(text: str) -> bytes:
    """A JSON-RPC ``SendMessage`` request, as sent to a2a-sdk's own JSON-RPC route."""
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": _a2a_message(text)}},
        separators=(",", ":"),
    ).encode()


def _a2a_intent(text: str) -> dict[str, Any]:
    """The same ``SendMessage`` as an a2a_secure intent, as ``SecureA2ATransport`` sends it."""
    return {
        "goal": "SendMessage",
        "domain": "a2a",
        "inputs": {"message": _a2a_message(text), "a2a-service-parameters": {"A2A-Version": "1.0"}},
    }


A2A_TEXT = "x" * (499 - len(_a2a_body("")))  # the same 499-byte request size


def _a2a_echo() -> tuple[Any, Any]:
    """The benchmark's a2a-sdk echo ``AgentExecutor`` (one ``Message`` back) and its ``AgentCard``."""
    # Imports only a2a-sdk: this may run under another interpreter.
    from a2a.helpers import new_text_message
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

    class Echo(AgentExecutor):  # type: ignore[misc,unused-ignore]
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            await event_queue.enqueue_event(new_text_message(context.get_user_input()))

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    card = AgentCard(
        name="echo",
        description="echo agent (benchmark)",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"http://{HOST}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
    )
    return Echo(), card


def _a2a_app() -> Any:
    """The echo executor served by a2a-sdk itself: JSON-RPC at ``/``, the card, no auth."""
    # Imports only a2a-sdk and Starlette: this may run under another interpreter.
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore
    from starlette.applications import Starlette

    executor, card = _a2a_echo()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


def _a2a_secured_app() -> Any:
    """The same echo executor behind a2a_secure: ``A2ABridge`` mounted into an ``AgentServer``."""
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.tasks import InMemoryTaskStore

    from a2a_secure.a2a_binding import A2ABridge
    from a2a_secure.identity.keys import Identity
    from a2a_secure.policy import Policy
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore

    identity = Identity.from_seed(bytes.fromhex(os.environ["BENCH_SEED"]), "bench-a2a-secured")
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    server = AgentServer(identity, policy, store=MemoryStore())
    executor, card = _a2a_echo()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    A2ABridge(handler, agent_card=card).mount(server)
    return server.app()


@dataclass
class A2APair:
    """Server A, a2a-sdk serving the echo executor directly, and server B, the same executor
    behind a2a_secure (``A2ABridge`` in an ``AgentServer``), with their clients."""

    direct: Proc
    secured: Proc
    secured_did: str
    http: httpx.AsyncClient | None = None
    client: A2AClient | None = None
    sessions: list[ClientSession] = field(default_factory=list)
    rate_guess: float = 1500.0  # B's wrk rate, to know how many intents to sign in advance
    signed_bytes: int = 0  # size of one pre-signed SendMessage intent request

    async def open(self, wrk_sessions: int) -> None:
        """Clients for both, one checked call each, and ``wrk_sessions`` sessions with B."""
        from a2a_secure.client.http import A2AClient
        from a2a_secure.identity.keys import Identity

        self.http = new_http()
        self.client = A2AClient(Identity.generate("bench-a2a-client"))
        resp = await self.http.post(self.direct.url + "/", content=_a2a_body("ping"), headers=A2A_HEADERS)
        direct = json.loads(resp.content).get("result", {})
        reply = await self.client.request(self.secured_did, _a2a_intent("ping"), endpoint=self.secured.url)
        secured = reply.result
        for name, answer in (("direct", direct), ("secured", secured)):
            try:
                text = answer["message"]["parts"][0]["text"]
            except (KeyError, IndexError, TypeError):
                text = None
            if text != "ping":
                raise RuntimeError(f"the {name} a2a-sdk server did not echo: {str(answer)[:200]}")
        if wrk_sessions:
            self.sessions = await open_sessions(self.secured_did, self.secured.url, wrk_sessions)

    def direct_call(self) -> Call:
        """A: JSON-RPC ``SendMessage`` POSTed with httpx (the a2a-sdk case's loop)."""
        assert self.http is not None
        return json_call(self.http, self.direct.url + "/", lambda: _a2a_body(A2A_TEXT), A2A_HEADERS)

    def secured_call(self) -> Call:
        """B: the same message as a signed intent, ``A2AClient.request`` on one session."""
        client, did = self.client, self.secured_did
        assert client is not None

        async def call() -> None:
            await client.request(did, _a2a_intent(A2A_TEXT))

        return call

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.client is not None:
            await self.client.aclose(close_sessions=False)


def open_a2a_pair(bench: Bench, starting: Sequence[Starting], secured_did: str, why: str) -> A2APair | None:
    """Wait for servers A and B, open their clients; mark the pair's cases skipped (``why``) if not."""
    pair: A2APair | None = None
    if not why:
        try:
            direct = starting[0].wait()
            bench.procs.append(direct)
            secured = starting[1].wait()
            bench.procs.append(secured)
            pair = A2APair(direct, secured, secured_did)
            bench.runner.run(pair.open(bench.s.wrk_sessions if bench.have_wrk else 0))
        except Exception as exc:
            if pair is not None:
                bench.runner.run(pair.aclose())
            pair = None
            why = f"skipped: a2a-sdk pair failed: {type(exc).__name__}: {str(exc)[-300:]}"
    if pair is None:
        for key, name in A2A_PAIR.items():
            bench.case(key, name).skipped = why
    elif not bench.have_wrk:
        for key in ("wrk_a2a_direct", "wrk_a2a_secured"):
            bench.case(key, A2A_PAIR[key]).skipped = "skipped: " + (
                "--no-wrk" if bench.args.no_wrk else "wrk not on PATH"
            )
    return pair


def wrk_a2a_pair(bench: Bench, pair: A2APair) -> None:
    """wrk on A (plain SendMessage bodies, cycled), then on B (pre-signed intents, once each)."""
    bodies = [[_a2a_body(A2A_TEXT) for _ in range(2000)] for _ in range(WRK_THREADS)]
    direct, secured = pair.direct, pair.secured
    key = "wrk_a2a_direct"
    bench.wrk(key, A2A_PAIR[key], direct.url + "/", bodies, direct, once=False, header="A2A-Version: 1.0")
    n = int(pair.rate_guess * bench.s.wrk_seconds * 1.25) + 1000
    signed = sign_bodies(pair.sessions, n, lambda: _a2a_intent(A2A_TEXT))
    pair.signed_bytes = len(signed[0][0])
    key = "wrk_a2a_secured"
    res = bench.wrk(key, A2A_PAIR[key], secured.url + "/a2a/intent", signed, secured, once=True)
    if res is not None:
        pair.rate_guess = max(500.0, res.rate)


def a2a_session_cost(cases: dict[str, Case]) -> dict[str, Any]:
    """What the DID session costs per a2a-sdk call: B (behind a2a_secure) against A (direct).

    Per measurement (the sequential client, wrk): both sides' medians, the ratios B / A of
    server CPU per call and of calls per second, the server CPU B adds per call, and the
    per-round ratios (A and B run back to back in each round).
    """
    out: dict[str, Any] = {
        "direct": "a2a-sdk JSON-RPC SendMessage route, OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=false",
        "secured": "the same executor and DefaultRequestHandler behind A2ABridge in an AgentServer",
    }
    for label, a_key, b_key in (
        ("sequential", "a2a_direct_seq", "a2a_secured_seq"),
        ("wrk", "wrk_a2a_direct", "wrk_a2a_secured"),
    ):
        a, b = cases.get(a_key), cases.get(b_key)
        sa: dict[str, Any] = a.summary() if a is not None else {"skipped": "not run"}
        sb: dict[str, Any] = b.summary() if b is not None else {"skipped": "not run"}
        if "rate" not in sa or "rate" not in sb:
            why = str(sa.get("skipped") or sb.get("skipped") or "no data")
            notes = [c.note for c in (a, b) if c is not None and c.note]
            out[label] = {"skipped": why + (f" ({notes[0]})" if notes and why == "no data" else "")}
            continue
        assert a is not None and b is not None
        if a.loops:
            pairs = [
                (x.rate, y.rate, x.server_cpu / x.count, y.server_cpu / y.count)
                for x, y in zip(a.loops, b.loops, strict=False)
                if x.count and y.count
            ]
        else:
            pairs = [(x.rate, y.rate, x.cpu_us, y.cpu_us) for x, y in zip(a.wrks, b.wrks, strict=False)]
        out[label] = {
            "direct_rate": sa["rate"],
            "secured_rate": sb["rate"],
            "rate_ratio": _ratio(sb["rate"], sa["rate"]),
            "direct_server_cpu_us": sa["server_cpu_us"],
            "secured_server_cpu_us": sb["server_cpu_us"],
            "server_cpu_ratio": _ratio(sb["server_cpu_us"], sa["server_cpu_us"]),
            "server_cpu_added_us": sb["server_cpu_us"] - sa["server_cpu_us"],
            "direct_p50_ms": sa["p50_ms"],
            "secured_p50_ms": sb["p50_ms"],
            "direct_p99_ms": sa["p99_ms"],
            "secured_p99_ms": sb["p99_ms"],
            "rate_ratio_rounds": [round(yr / xr, 3) for xr, yr, _, _ in pairs if xr],
            "server_cpu_ratio_rounds": [round(yc / xc, 3) for _, _, xc, yc in pairs if xc],
        }
        if a.loops:
            out[label]["direct_client_cpu_us"] = sa["client_cpu_us"]
            out[label]["secured_client_cpu_us"] = sb["client_cpu_us"]
    return out


def print_session_cost(cost: dict[str, Any]) -> None:
    """The direct / secured a2a-sdk comparison, one line per figure."""
    print()
    title = "what the DID session costs per a2a-sdk SendMessage (same echo executor, OTel off, this run)"
    skipped = {c["skipped"] for c in (cost.get("sequential", {}), cost.get("wrk", {})) if "skipped" in c}
    if len(skipped) == 1 and all("skipped" in cost.get(k, {}) for k in ("sequential", "wrk")):
        print(f"{title}: {skipped.pop()}")
        return
    print(title + ":")
    hdr = f"{'':<36} {'a2a-sdk':>9} {'behind':>11} {'secured':>8} {'added':>9}"
    print(hdr)
    print(f"{'':<36} {'direct':>9} {'a2a_secure':>11} {'/direct':>8} {'per call':>9}")
    print("-" * len(hdr))
    for label, title in (("sequential", "1 client"), ("wrk", "wrk -c32")):
        c = cost.get(label, {})
        if "skipped" in c:
            print(f"{title:<36} {c['skipped']}")
            continue
        rows = (
            ("server CPU µs per call", "server_cpu_us", "server_cpu_ratio", ".0f", " µs"),
            ("calls/s", "rate", "rate_ratio", ".0f", ""),
            ("p50 ms", "p50_ms", None, ".2f", ""),
            ("p99 ms", "p99_ms", None, ".2f", ""),
            ("client CPU µs per call", "client_cpu_us", None, ".0f", ""),
        )
        for name, metric, ratio, fmt, unit in rows:
            a, b = c.get(f"direct_{metric}"), c.get(f"secured_{metric}")
            if a is None and b is None:
                continue
            r = c.get(ratio) if ratio else _ratio(b, a)
            added = f"+{_f(b - a, fmt)}{unit}" if unit and a is not None and b is not None else ""
            line = f"{f'{title}: {name}':<36} {_f(a, fmt):>9} {_f(b, fmt):>11} {_f(r, '.2f'):>7}x {added:>9}"
            print(line)
    rounds = [
        f"{title} " + " ".join(f"{r:.2f}" for r in cost[label]["server_cpu_ratio_rounds"])
        for label, title in (("sequential", "1 client"), ("wrk", "wrk"))
        if cost.get(label, {}).get("server_cpu_ratio_rounds")
    ]
    if rounds:
        print(f"(server CPU secured / direct, round by round: {'; '.join(rounds)})")
    print("(direct: a2a-sdk's own JSON-RPC route, no authentication; behind a2a_secure: DID session,")
    print(" signed and sequenced intent, signed answer; wrk replays SendMessage bodies / pre-signed intents)")
