#!/usr/bin/env python3
"""a2a_secure end to end and server capacity, beside a plain FastAPI echo and a2a-sdk.

One command, one run, every case side by side on 127.0.0.1; every figure is the median of
``--rounds`` rounds (rounds interleave the cases, so that drift on a shared machine hits them
alike), and every target ratio the median of the ratios taken within each round. Servers
run in their own process (uvicorn, one worker, uvloop + httptools when installed, access
log off); their CPU time is read from ``/proc/<pid>/stat``.

1. baseline: FastAPI JSON echo (``body: dict``), ~500-byte JSON-RPC body, one httpx client
   sequential, and 32 clients concurrently (one httpx client each); and, to tell the client's
   share from the server's, one client sequential through a2a_secure's own HTTP/1.1 pool
   (``a2a_secure.client.pool``, what ``A2AClient`` sends with);
2. a2a_secure signed intents through ``A2AClient.request`` to an ``AgentServer`` serving
   ``echo``: one session sequential; 32 sessions concurrently (32 identities, one client each);
3. a2a-sdk echo agent, JSON-RPC ``SendMessage`` driven by the same httpx loop: only if ``a2a``
   is importable here, or ``--a2a-python`` names an interpreter that has a2a-sdk (the agent
   then runs under that interpreter; the client side is plain httpx); OpenTelemetry as the
   environment leaves it (on by default); and one client sequential through a2a_secure's
   pool, so that the intents/s ratio can also be read with the same client on both sides;
   3b. what the DID session costs per a2a-sdk call: the same echo executor served by a2a-sdk
   directly (A: its JSON-RPC ``SendMessage`` route) and behind a2a_secure (B: ``A2ABridge``
   in an ``AgentServer``), both with OpenTelemetry off (as in BASELINES.md), back to back in
   each round: one httpx client for A, ``A2AClient.request`` on one session for B, then wrk
   (plain bodies for A, pre-signed ``SendMessage`` intents for B); ratios B / A of server CPU
   per call and of calls per second. Needs ``a2a`` importable by this interpreter;
4. full handshakes per second (``A2AClient.handshake``, a fresh session each time);
5. server capacity with wrk (when on PATH) replaying requests prepared in advance: the plain
   echo, and signed intents each sent once (many sessions, increasing sequences, signed just
   before each round); server CPU µs per request and the ratio signed / plain;
6. memory per open session: ``MemoryStore`` (RSS delta in a fresh process) and ``RedisStore``
   (``used_memory`` delta), idle and after one intent (the stored reply);
7. Redis: network round trips per intent (INFO stats ``total_reads_processed``) and commands
   per intent (INFO commandstats), and capacity with ``a2a-secure serve
   --redis-url`` at 1 and 2 workers.

Plus an in-process breakdown of one intent (envelope parse, protocol core, reply encoding),
and with ``--profile`` a cProfile of the signed server under wrk.

    python scripts/bench.py [--quick] [--rounds N] [--json bench-results.json]
                            [--a2a-python /path/to/python] [--profile] [--no-redis] [--no-wrk]

The default run takes about three minutes on 2 cores, ``--quick`` under 40 s. wrk
replays bodies with ``scripts/wrk/replay.lua``; a latency plot is written beside the JSON
when matplotlib is importable. Rates move with whatever else the machine runs (the header
says how many cores other processes used meanwhile): compare ratios from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from a2a_secure.client.http import A2AClient
    from a2a_secure.protocol.client import ClientSession

HOST = "127.0.0.1"
SCRIPTS = Path(__file__).resolve().parent
REPLAY_LUA = SCRIPTS / "wrk" / "replay.lua"
CONCURRENCY = 32
WRK_THREADS = 2
JSON_HEADERS = {"Content-Type": "application/json"}
PLAIN_POOL_NAME = "FastAPI echo, 1 client, pool"
A2A_POOL_NAME = "a2a-sdk SendMessage, 1 client, pool"
A2A_HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}
# The intent every signed case sends (the echo handler returns the inputs unchanged).
INTENT: dict[str, Any] = {
    "goal": "echo",
    "domain": "bench",
    "inputs": {"text": "Hello world", "target_language": "es"},
}
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
TARGETS = {
    "cpu_signed_vs_plain": 1.15,
    "signed_vs_a2a_sdk": 2.0,
    "handshake_vs_intent": 3.0,
    "memory_bytes_per_session": 2048,
    "redis_bytes_per_session": 1024,
    "redis_round_trips_per_intent": 1.0,
}


def _plain_body() -> bytes:
    """A JSON-RPC request of 499 bytes, the size BASELINES.md used."""
    pad = 0
    while True:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "echo",
                "params": {"goal": "echo", "domain": "bench", "inputs": {"text": "x" * pad}},
                "id": 1,
            },
            separators=(",", ":"),
        ).encode()
        if len(body) >= 499:
            return body
        pad += 1


PLAIN_BODY = _plain_body()


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


@dataclass(frozen=True)
class Settings:
    """How long and how big each case is."""

    rounds: int
    e2e_seconds: float
    wrk_seconds: float
    wrk_sessions: int
    memory_sessions: int
    redis_sessions: int
    round_trip_intents: int


FULL = Settings(3, 2.0, 4.0, 256, 100_000, 10_000, 300)
QUICK = Settings(1, 0.7, 1.0, 128, 30_000, 2_000, 100)


# -- processes ----------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of ``pid``, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every live descendant (uvicorn workers)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _proc_stat(int(entry.name))
            if st is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = st
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo.extend(c for c, pp in parents.items() if pp == p)
    return total


def self_cpu() -> float:
    """CPU seconds used by this process (the Python clients)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def machine_busy() -> float:
    """CPU seconds all processes of the machine have used since boot (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def own_cpu() -> float:
    """CPU seconds of this process and its children that have been waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_cpu() + children.ru_utime + children.ru_stime


def rss_bytes() -> int:
    """Resident set size of this process."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A server process of this benchmark."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-1500:]
    return ""


@dataclass
class Starting:
    """A ``bench.py --serve KIND`` process that has not printed its URL yet."""

    kind: str
    proc: subprocess.Popen[bytes]
    log: Path

    def wait(self, timeout: float = 60) -> Proc:
        """Its URL, once it prints ``READY <url>``."""
        proc = self.proc
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                line = proc.stdout.readline().decode().strip()
                if line.startswith("READY "):
                    return Proc(self.kind, proc, line.split(" ", 1)[1], self.log)
                if not line and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"server {self.kind} did not start:\n{_log_tail(self.log)}")


def spawn_child(
    kind: str, workdir: Path, *, python: str = sys.executable, env: dict[str, str] | None = None
) -> Starting:
    """Start ``bench.py --serve KIND`` in its own process (``.wait()`` for its URL)."""
    log = workdir / f"server-{kind}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--serve", kind],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    return Starting(kind, proc, log)


def start_cli_server(workdir: Path, key_file: Path, policy: Path, *, workers: int, redis_url: str) -> Proc:
    """``a2a-secure serve --workers N --redis-url URL`` on a free port, once /health answers."""
    import httpx

    port = free_port()
    log = workdir / f"serve-{workers}w.log"
    cmd = [
        sys.executable,
        "-m",
        "a2a_secure",
        "serve",
        "--key-file",
        str(key_file),
        "--policy",
        str(policy),
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--redis-url",
        redis_url,
    ]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            healthy = httpx.get(url + "/health", timeout=1).status_code == 200
            # Every worker must be up before timing: wait until the tree has them all.
            if healthy and (workers == 1 or _descendants(proc.pid) >= workers):
                return Proc(f"serve-{workers}w", proc, url, log)
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    raise RuntimeError(f"a2a-secure serve did not start:\n{_log_tail(log)}")


def _descendants(pid: int) -> int:
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _proc_stat(int(entry.name))
            if st is not None:
                parents[int(entry.name)] = st[0]
    count, todo = 0, [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        count += len(kids)
        todo.extend(kids)
    return count


# -- the servers (child processes) ----------------------------------------------------------------
def _plain_app() -> Any:
    from fastapi import FastAPI

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    return app


def _signed_app() -> Any:
    from a2a_secure.identity.keys import Identity
    from a2a_secure.protocol.policy import Policy
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
    from a2a_secure.protocol.policy import Policy
    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.memory import MemoryStore

    identity = Identity.from_seed(bytes.fromhex(os.environ["BENCH_SEED"]), "bench-a2a-secured")
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    server = AgentServer(identity, policy, store=MemoryStore())
    executor, card = _a2a_echo()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    A2ABridge(handler, agent_card=card).mount(server)
    return server.app()


def serve_child(kind: str) -> None:
    """Entry point of ``--serve KIND``: serve on an ephemeral port, print ``READY <url>``."""
    import uvicorn

    apps: dict[str, Callable[[], Any]] = {
        "plain": _plain_app,
        "signed": _signed_app,
        "a2a": _a2a_app,
        "a2a_direct": _a2a_app,
        "a2a_secured": _a2a_secured_app,
    }
    app = apps[kind]()
    options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "off"}
    with contextlib.suppress(ImportError):
        import httptools  # noqa: F401

        options["http"] = "httptools"
    # Let uvicorn bind port 0 itself: its own listener gets TCP_NODELAY (see a2a_secure.testing).
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=0, **options))
    profile_out = os.environ.get("BENCH_PROFILE_OUT")

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server did not start")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        agent = getattr(app, "agent_server", None)
        if agent is not None and not agent.url:
            # The A2A card names the server's base URL (known only now); built on first use.
            agent.url = f"http://{HOST}:{port}"
        print(f"READY http://{HOST}:{port}", flush=True)
        await task

    profiler = None
    if profile_out:
        import cProfile

        # Profiling starts on SIGUSR1, once the parent has opened its sessions: the profile
        # then holds the intents only, not the handshakes.
        profiler = cProfile.Profile()
        signal.signal(signal.SIGUSR1, lambda _sig, _frame: profiler.enable())
    try:
        _run_loop(main())
    finally:
        if profiler is not None and profile_out:
            profiler.disable()
            profiler.dump_stats(profile_out)


def _run_loop(coro: Awaitable[None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)  # type: ignore[arg-type]


def make_runner() -> asyncio.Runner:
    """The event loop of the clients: uvloop when installed, as on the server side."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


# -- end to end: Python clients -----------------------------------------------------------------
@dataclass
class Loop:
    """One timed window of client calls."""

    count: int
    seconds: float
    latencies: list[float]
    errors: int
    server_cpu: float
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        """Server CPU µs per answered call."""
        return self.server_cpu / self.count * 1e6 if self.count else float("nan")


Call = Callable[[], Awaitable[object]]


async def drive(calls: Sequence[Call], seconds: float, server: Proc, *, warmup: int = 5) -> Loop:
    """Run each call in its own task, back to back, for ``seconds``; time every call."""
    for _ in range(warmup):
        await asyncio.gather(*(c() for c in calls))
    latencies: list[float] = []
    errors = 0
    cpu0, self0 = server.cpu(), self_cpu()
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def worker(call: Call) -> float:
        nonlocal errors
        end = time.perf_counter()
        while end < deadline:
            start = time.perf_counter()
            try:
                await call()
            except Exception:
                errors += 1
                if errors > 50:
                    raise
            end = time.perf_counter()
            latencies.append(end - start)
        return end

    ends = await asyncio.gather(*(worker(c) for c in calls))
    elapsed = max(ends) - t0
    count = len(latencies) - errors
    return Loop(count, elapsed, latencies, errors, server.cpu() - cpu0, self_cpu() - self0)


def new_http(connections: int = 16) -> httpx.AsyncClient:
    """An httpx client configured as A2AClient configures its own (TCP_NODELAY, small pool)."""
    import httpx

    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=8),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )
    return httpx.AsyncClient(transport=transport, timeout=10.0)


def pool_call(pool: Any, url: str, body: Callable[[], bytes], headers: dict[str, str] | None = None) -> Call:
    """POST a JSON body through a2a_secure's ConnectionPool and parse the JSON answer.

    ``headers``: request headers beyond the pool's own (Host, Content-Type, Accept,
    Accept-Encoding, Content-Length), such as a2a-sdk's ``A2A-Version``.
    """
    own = {"host", "content-type", "accept", "accept-encoding", "content-length"}
    more = [(k.encode(), v.encode()) for k, v in (headers or {}).items() if k.lower() not in own]

    async def call() -> None:
        status, content, _ = await pool.post(url, body(), limit=1 << 22, too_large=RuntimeError, headers=more)
        _check_json_reply(status, content)

    return call


def json_call(http: httpx.AsyncClient, url: str, body: Callable[[], bytes], headers: dict[str, str]) -> Call:
    """POST a JSON body and parse the JSON answer, as a JSON-RPC client would."""

    async def call() -> None:
        resp = await http.post(url, content=body(), headers=headers)
        _check_json_reply(resp.status_code, resp.content)

    return call


def _check_json_reply(status: int, content: bytes) -> None:
    """A 200 whose JSON body is not a JSON-RPC error, or RuntimeError (counted as an error)."""
    if status != 200:
        raise RuntimeError(f"HTTP {status}")
    obj = json.loads(content)
    if isinstance(obj, dict) and "error" in obj:
        raise RuntimeError(str(obj["error"])[:200])


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


# -- wrk ----------------------------------------------------------------------------------------
@dataclass
class WrkResult:
    """One wrk run and the server CPU it cost."""

    ok: int
    other: int
    span: float
    server_cpu: float
    p50_ms: float
    p99_ms: float
    socket_errors: str
    store_cpu: float = 0.0

    @property
    def answered(self) -> int:
        return self.ok + self.other

    @property
    def rate(self) -> float:
        return self.answered / self.span if self.span > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        return self.server_cpu / self.answered * 1e6 if self.answered else float("nan")


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def run_wrk(
    url: str,
    bodies: Sequence[Sequence[bytes]],
    seconds: float,
    server: Proc,
    workdir: Path,
    *,
    once: bool,
    header: str = "",
    extra_cpu: Callable[[], float] | None = None,
) -> WrkResult:
    """Replay ``bodies[t]`` from wrk thread ``t`` (32 connections) and read the server's CPU."""
    prefix = workdir / "bodies"
    for t, lines in enumerate(bodies):
        with open(f"{prefix}.{t}", "wb") as f:
            for body in lines:
                f.write(body + b"\n")
    env = {**os.environ, "BENCH_BODIES": str(prefix), "BENCH_MODE": "once" if once else "cycle"}
    if header:
        env["BENCH_HEADER"] = header
    cmd = [
        "wrk",
        f"-t{len(bodies)}",
        f"-c{CONCURRENCY}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "--timeout",
        "5s",
        "-s",
        str(REPLAY_LUA),
        url,
    ]
    cpu0 = server.cpu()
    extra0 = extra_cpu() if extra_cpu else 0.0
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False)
    server_cpu = server.cpu() - cpu0
    store_cpu = (extra_cpu() - extra0) if extra_cpu else 0.0
    m = re.search(r"BENCH ok=(\d+) other=(\d+) sent=(\d+) span=([\d.]+)", out.stdout)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-800:]} {out.stderr[-800:]}")
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out.stdout, re.MULTILINE))
    errs = re.search(r"Socket errors: (.*)", out.stdout)
    return WrkResult(
        int(m.group(1)),
        int(m.group(2)),
        float(m.group(4)),
        server_cpu,
        _ms(pct.get("50", "")),
        _ms(pct.get("99", "")),
        errs.group(1) if errs else "",
        store_cpu,
    )


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


# -- Redis --------------------------------------------------------------------------------------
@dataclass
class RedisProc:
    """A private redis-server on a free loopback port (no persistence)."""

    proc: subprocess.Popen[bytes]
    port: int
    client: Any

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_redis(workdir: Path) -> RedisProc:
    import redis

    port = free_port()
    cmd = [
        "redis-server",
        "--bind",
        HOST,
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
    ]
    log = workdir / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    client = redis.Redis(host=HOST, port=port, socket_timeout=5)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            if client.ping():
                return RedisProc(proc, port, client)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"redis-server did not start:\n{_log_tail(log)}")


def _inner_commands() -> set[str]:
    """Commands that RedisStore's Lua scripts call (commandstats counts them too)."""
    import a2a_secure.store.redis as module

    source = Path(module.__file__ or "").read_text()
    return {c.lower() for c in re.findall(r"redis\.call\('(\w+)'", source)}


def network_reads(client: Any) -> int:
    """Redis's count of read events (INFO stats ``total_reads_processed``, this call's included).

    Each batch of commands a client sends at once (one command, or a pipeline) is one read:
    the number of network round trips clients made.
    """
    return int(client.info("stats")["total_reads_processed"])


def top_level_calls(stats: dict[str, Any], inner: set[str]) -> dict[str, int]:
    """Commands sent by clients (not from inside scripts), by name, from INFO commandstats."""
    own = {"info", "config|resetstat", "ping"}  # the benchmark's own probes
    out: dict[str, int] = {}
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        calls = (
            value["calls"] if isinstance(value, dict) else int(str(value).split("calls=")[1].split(",")[0])
        )
        if name in inner or name in own:
            continue
        out[name] = int(calls)
    return out


# -- cases --------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


def pct(latencies: Sequence[float], q: float) -> float:
    if not latencies:
        return float("nan")
    s = sorted(latencies)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


@dataclass
class Case:
    """A case's rounds, and how to summarise them."""

    name: str
    unit: str = "req/s"
    loops: list[Loop] = field(default_factory=list)
    wrks: list[WrkResult] = field(default_factory=list)
    skipped: str = ""
    note: str = ""

    def summary(self) -> dict[str, Any]:
        if self.skipped:
            return {"name": self.name, "skipped": self.skipped}
        if self.loops:
            return {
                "name": self.name,
                "unit": self.unit,
                "rate": median([x.rate for x in self.loops]),
                "p50_ms": median([pct(x.latencies, 0.5) for x in self.loops]),
                "p99_ms": median([pct(x.latencies, 0.99) for x in self.loops]),
                "server_cpu_us": median([x.cpu_us for x in self.loops]),
                "client_cpu_us": median([x.client_cpu / x.count * 1e6 for x in self.loops if x.count]),
                "errors": sum(x.errors for x in self.loops),
                "rounds": [round(x.rate, 1) for x in self.loops],
                "cpu_rounds": [round(x.cpu_us, 1) if x.count else None for x in self.loops],
                "note": self.note,
            }
        if self.wrks:
            answered = sum(w.answered for w in self.wrks)
            out = {
                "name": self.name,
                "unit": self.unit,
                "rate": median([w.rate for w in self.wrks]),
                "server_cpu_us": median([w.cpu_us for w in self.wrks]),
                "p50_ms": median([w.p50_ms for w in self.wrks]),
                "p99_ms": median([w.p99_ms for w in self.wrks]),
                "ok_fraction": sum(w.ok for w in self.wrks) / answered if answered else float("nan"),
                "answered": answered,
                "rounds": [round(w.rate, 1) for w in self.wrks],
                "cpu_rounds": [round(w.cpu_us, 1) if w.answered else None for w in self.wrks],
                "socket_errors": sorted({w.socket_errors for w in self.wrks if w.socket_errors}),
                "note": self.note,
            }
            if any(w.store_cpu for w in self.wrks):
                out["store_cpu_us"] = median(
                    [w.store_cpu / w.answered * 1e6 for w in self.wrks if w.answered]
                )
            return out
        return {"name": self.name, "skipped": self.skipped or "no data"}


class Bench:
    """Holds the servers, clients and results of one run."""

    def __init__(self, args: argparse.Namespace, settings: Settings, workdir: Path) -> None:
        self.args = args
        self.s = settings
        self.workdir = workdir
        self.runner = make_runner()
        self.procs: list[Proc] = []
        self.spawned: list[subprocess.Popen[bytes]] = []  # started, maybe never ready
        self.redis: RedisProc | None = None
        self.cases: dict[str, Case] = {}
        self.results: dict[str, Any] = {}
        self.have_wrk = shutil.which("wrk") is not None and not args.no_wrk
        self.a2a_python = self._find_a2a_python()
        self.a2a_pair_skip = "" if importlib.util.find_spec("a2a") is not None else A2A_PAIR_SKIP

    def _find_a2a_python(self) -> str | None:
        if self.args.a2a_python:
            return str(self.args.a2a_python)
        try:
            import a2a  # noqa: F401
        except ImportError:
            return None
        return sys.executable

    def case(self, key: str, name: str, unit: str = "req/s") -> Case:
        if key not in self.cases:
            self.cases[key] = Case(name, unit)
        return self.cases[key]

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.stop()
        for proc in self.spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if self.redis is not None:
            self.redis.stop()
        self.runner.close()

    # -- 1-5: the in-memory servers -------------------------------------------------------------
    def run_main_cases(self) -> None:
        from a2a_secure.identity.keys import Identity

        seed = os.urandom(32)
        server_did = Identity.from_seed(seed, "bench-server").did
        self.log("starting servers")
        # Started together (their imports overlap), then waited for one by one.
        starting = [spawn_child("plain", self.workdir)]
        starting.append(spawn_child("signed", self.workdir, env={"BENCH_SEED": seed.hex()}))
        if self.a2a_python is not None:
            starting.append(spawn_child("a2a", self.workdir, python=self.a2a_python))
        # A2A over the DID session: a2a-sdk direct (A) and the same executor behind a2a_secure (B).
        pair_seed = os.urandom(32)
        pair_starting: list[Starting] = []
        if not self.a2a_pair_skip:
            pair_starting.append(spawn_child("a2a_direct", self.workdir, env=OTEL_OFF))
            pair_env = {**OTEL_OFF, "BENCH_SEED": pair_seed.hex()}
            pair_starting.append(spawn_child("a2a_secured", self.workdir, env=pair_env))
        self.spawned += [st.proc for st in starting + pair_starting]
        plain = starting[0].wait()
        self.procs.append(plain)
        signed = starting[1].wait()
        self.procs.append(signed)
        a2a: Proc | None = None
        if self.a2a_python is None:
            self.case("a2a_seq", "a2a-sdk SendMessage, 1 client").skipped = A2A_SKIP
            self.case("a2a_conc", f"a2a-sdk SendMessage, {CONCURRENCY} clients").skipped = A2A_SKIP
            self.case("wrk_a2a", "a2a-sdk SendMessage").skipped = A2A_SKIP
        else:
            try:
                a2a = starting[2].wait()
                self.procs.append(a2a)
            except RuntimeError as exc:
                msg = f"skipped: a2a-sdk server failed: {str(exc)[-300:]}"
                for key, name in (
                    ("a2a_seq", "a2a-sdk SendMessage, 1 client"),
                    ("a2a_conc", f"a2a-sdk SendMessage, {CONCURRENCY} clients"),
                    ("wrk_a2a", "a2a-sdk SendMessage"),
                ):
                    self.case(key, name).skipped = msg
        run = self.runner.run
        pair = self._open_a2a_pair(pair_starting, Identity.from_seed(pair_seed, "bench-a2a-secured").did)

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

        plain_calls = [
            json_call(h, plain.url + "/echo", lambda: PLAIN_BODY, JSON_HEADERS) for h in plain_http
        ]
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
        if self.have_wrk:
            self.log(f"opening {self.s.wrk_sessions} sessions for wrk")
            wrk_sessions = run(open_sessions(server_did, signed.url, self.s.wrk_sessions))
        else:
            why = "--no-wrk" if self.args.no_wrk else "wrk not on PATH (apt-get install -y wrk)"
            for key, name in (
                ("wrk_plain", "FastAPI echo"),
                ("wrk_signed", "a2a_secure intent"),
                ("wrk_a2a", "a2a-sdk SendMessage"),
            ):
                if key not in self.cases:
                    self.case(key, name).skipped = f"skipped: {why}"

        secs = self.s.e2e_seconds
        signed_rate_guess = 6000.0
        for r in range(self.s.rounds):
            self.log(f"round {r + 1}/{self.s.rounds}: end to end")
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
                case = self.case(key, name, unit)
                try:
                    case.loops.append(run(drive(calls, secs, proc)))
                except Exception as exc:
                    case.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            if not self.have_wrk:
                continue
            self.log(f"round {r + 1}/{self.s.rounds}: wrk")
            wsecs = self.s.wrk_seconds
            plain_bodies = [[PLAIN_BODY]] * WRK_THREADS
            self._wrk("wrk_plain", "FastAPI echo", plain.url + "/echo", plain_bodies, plain, once=False)
            n = int(signed_rate_guess * wsecs * 1.25) + 1000
            bodies = sign_bodies(wrk_sessions, n)
            res = self._wrk(
                "wrk_signed", "a2a_secure intent", signed.url + "/a2a/intent", bodies, signed, once=True
            )
            if res is not None:
                signed_rate_guess = max(1000.0, res.rate)
            if a2a is not None:
                a2a_bodies = [[_a2a_body(A2A_TEXT) for _ in range(2000)] for _ in range(WRK_THREADS)]
                self._wrk(
                    "wrk_a2a",
                    "a2a-sdk SendMessage",
                    a2a.url + "/",
                    a2a_bodies,
                    a2a,
                    once=False,
                    header="A2A-Version: 1.0",
                )
            if pair is not None:
                self._wrk_a2a_pair(pair)
        self.results["bodies"] = {
            "plain_request_bytes": len(PLAIN_BODY),
            "a2a_request_bytes": len(_a2a_body(A2A_TEXT)),
        }
        if pair is not None and pair.signed_bytes:
            self.results["bodies"]["a2a_secured_request_bytes"] = pair.signed_bytes

        if self.args.profile and self.have_wrk:
            self.profile_signed(seed, server_did)

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

    def _open_a2a_pair(self, starting: Sequence[Starting], secured_did: str) -> A2APair | None:
        """Wait for servers A and B, open their clients; mark the pair's cases skipped if not."""
        why = self.a2a_pair_skip
        pair: A2APair | None = None
        if not why:
            try:
                direct = starting[0].wait()
                self.procs.append(direct)
                secured = starting[1].wait()
                self.procs.append(secured)
                pair = A2APair(direct, secured, secured_did)
                self.runner.run(pair.open(self.s.wrk_sessions if self.have_wrk else 0))
            except Exception as exc:
                if pair is not None:
                    self.runner.run(pair.aclose())
                pair = None
                why = f"skipped: a2a-sdk pair failed: {type(exc).__name__}: {str(exc)[-300:]}"
        if pair is None:
            for key, name in A2A_PAIR.items():
                self.case(key, name).skipped = why
        elif not self.have_wrk:
            for key in ("wrk_a2a_direct", "wrk_a2a_secured"):
                self.case(key, A2A_PAIR[key]).skipped = "skipped: " + (
                    "--no-wrk" if self.args.no_wrk else "wrk not on PATH"
                )
        return pair

    def _wrk_a2a_pair(self, pair: A2APair) -> None:
        """wrk on A (plain SendMessage bodies, cycled), then on B (pre-signed intents, once each)."""
        bodies = [[_a2a_body(A2A_TEXT) for _ in range(2000)] for _ in range(WRK_THREADS)]
        direct, secured = pair.direct, pair.secured
        key = "wrk_a2a_direct"
        self._wrk(key, A2A_PAIR[key], direct.url + "/", bodies, direct, once=False, header="A2A-Version: 1.0")
        n = int(pair.rate_guess * self.s.wrk_seconds * 1.25) + 1000
        signed = sign_bodies(pair.sessions, n, lambda: _a2a_intent(A2A_TEXT))
        pair.signed_bytes = len(signed[0][0])
        key = "wrk_a2a_secured"
        res = self._wrk(key, A2A_PAIR[key], secured.url + "/a2a/intent", signed, secured, once=True)
        if res is not None:
            pair.rate_guess = max(500.0, res.rate)

    def _wrk(
        self,
        key: str,
        name: str,
        url: str,
        bodies: Sequence[Sequence[bytes]],
        proc: Proc,
        *,
        once: bool,
        header: str = "",
        extra_cpu: Callable[[], float] | None = None,
    ) -> WrkResult | None:
        case = self.case(key, name)
        try:
            res = run_wrk(
                url,
                bodies,
                self.s.wrk_seconds,
                proc,
                self.workdir,
                once=once,
                header=header,
                extra_cpu=extra_cpu,
            )
        except Exception as exc:
            case.note = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            return None
        case.wrks.append(res)
        return res

    def profile_signed(self, seed: bytes, server_did: str) -> None:
        """Run the signed server under cProfile for one wrk run; keep the top functions."""
        import pstats

        self.log("profiling the signed server under wrk")
        out = self.workdir / "signed.prof"
        proc = spawn_child(
            "signed", self.workdir, env={"BENCH_SEED": seed.hex(), "BENCH_PROFILE_OUT": str(out)}
        ).wait()
        try:
            sessions = self.runner.run(open_sessions(server_did, proc.url, 128))
            bodies = sign_bodies(sessions, 8000)
            proc.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            res = run_wrk(proc.url + "/a2a/intent", bodies, 3, proc, self.workdir, once=True)
        finally:
            proc.stop()
        stats = pstats.Stats(str(out))
        total = stats.total_tt  # type: ignore[attr-defined]
        rows = []
        for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            rows.append((tt, ct, nc, f"{Path(file).name}:{line}({func})"))
        rows.sort(reverse=True)
        self.results["profile"] = {
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

    # -- in-process breakdown -------------------------------------------------------------------
    def run_core_breakdown(self) -> None:
        """One intent's server work without HTTP: envelope, core, reply (µs, in this process)."""
        core = self.runner.run(_core_breakdown(1000 if self.args.quick else 4000))
        self.results["core"] = core
        bodies = self.results.setdefault("bodies", {})
        bodies["signed_request_bytes"] = core.pop("request_bytes")
        bodies["signed_response_bytes"] = core.pop("response_bytes")

    # -- 6, 7: memory and Redis -----------------------------------------------------------------
    def run_memory(self) -> None:
        self.log(f"memory: {self.s.memory_sessions} sessions in MemoryStore")
        out = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--probe-memory", str(self.s.memory_sessions)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if out.returncode != 0:
            self.results["memory"] = {"error": out.stderr[-500:]}
        else:
            self.results["memory"] = json.loads(out.stdout.strip().splitlines()[-1])

    def run_redis(self) -> None:
        why = self._redis_unavailable()
        if why:
            self.results["redis"] = {"skipped": why}
            return
        self.redis = start_redis(self.workdir)
        self.log(f"redis: {self.s.redis_sessions} sessions in RedisStore")
        try:
            self.results["redis_memory"] = self.runner.run(
                _redis_memory(self.redis, self.s.redis_sessions, self.s.redis_sessions * 2 // 10)
            )
        except Exception as exc:
            self.results["redis_memory"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        try:
            import a2a_secure.server.run  # noqa: F401
        except Exception as exc:
            self.results["redis"] = {"skipped": f"skipped: a2a_secure.server.run unavailable ({exc})"}
            return
        self.run_redis_serve()

    def _redis_unavailable(self) -> str:
        if self.args.no_redis:
            return "skipped: --no-redis"
        if shutil.which("redis-server") is None:
            return "skipped: redis-server not on PATH (apt-get install -y redis-server)"
        try:
            from a2a_secure.store.redis import RedisStore  # noqa: F401
        except Exception as exc:
            return f"skipped: a2a_secure.store.redis.RedisStore unavailable ({type(exc).__name__}: {exc})"
        return ""

    def run_redis_serve(self) -> None:
        from a2a_secure.client.http import A2AClient
        from a2a_secure.identity.keys import Identity

        assert self.redis is not None
        redis = self.redis
        key_file = self.workdir / "server.key"
        identity = Identity.generate("bench-server")
        identity.save(key_file)
        policy = self.workdir / "policy.json"
        policy.write_text(json.dumps({"rate_limit": 10**9, "rate_period": 3600, "session_timeout": 3600}))
        inner = _inner_commands()
        out: dict[str, Any] = {"inner_script_commands": sorted(inner)}
        run = self.runner.run
        for workers in (1, 2):
            redis.client.flushall()
            label = f"redis_{workers}w"
            try:
                proc = start_cli_server(self.workdir, key_file, policy, workers=workers, redis_url=redis.url)
            except RuntimeError as exc:
                out[label] = {"error": str(exc)[-500:]}
                continue
            self.procs.append(proc)
            try:
                # Round trips of one intent: a warmed session (its record cached by the worker),
                # sequential intents, INFO commandstats before and after.
                client = A2AClient(Identity.generate("bench-rt"))
                run(client.request(identity.did, INTENT, endpoint=proc.url))
                # Warm: the session cached by the worker, and its Redis pool grown to the
                # connections a sequential client keeps busy (a pipelined answer may overlap
                # the next request's script), so that no connection set-up is counted.
                for _ in range(50):
                    run(client.request(identity.did, INTENT))
                redis.client.config_resetstat()
                reads0 = network_reads(redis.client)
                n = self.s.round_trip_intents

                async def intents(c: A2AClient = client, count: int = n) -> None:
                    for _ in range(count):
                        await c.request(identity.did, INTENT)

                run(intents())
                reads = network_reads(redis.client) - reads0 - 1
                calls = top_level_calls(redis.client.info("commandstats"), inner)
                run(client.aclose(close_sessions=False))
                out[label] = {
                    "round_trips_per_intent": reads / n,
                    "commands_per_intent": sum(calls.values()) / n,
                    "top_level_commands": {k: v / n for k, v in calls.items()},
                }
                if self.have_wrk:
                    sessions = run(open_sessions(identity.did, proc.url, self.s.wrk_sessions))
                    guess = 4000.0
                    wrk_rt: list[float] = []
                    wrk_cmds: list[float] = []
                    for r in range(self.s.rounds):
                        self.log(f"redis {workers} worker(s): wrk round {r + 1}/{self.s.rounds}")
                        bodies = sign_bodies(sessions, int(guess * self.s.wrk_seconds * 1.25) + 1000)
                        redis.client.config_resetstat()
                        reads0 = network_reads(redis.client)
                        res = self._wrk(
                            f"wrk_{label}",
                            f"a2a_secure intent, Redis, {workers} worker{'s' if workers > 1 else ''}",
                            proc.url + "/a2a/intent",
                            bodies,
                            proc,
                            once=True,
                            extra_cpu=redis.cpu,
                        )
                        if res is not None and res.answered:
                            guess = max(1000.0, res.rate)
                            reads = network_reads(redis.client) - reads0 - 1
                            c = top_level_calls(redis.client.info("commandstats"), inner)
                            wrk_rt.append(reads / res.answered)
                            wrk_cmds.append(sum(c.values()) / res.answered)
                    out[label]["wrk_round_trips_per_request"] = median(wrk_rt)
                    out[label]["wrk_commands_per_request"] = median(wrk_cmds)
                else:
                    clients = SignedClients(identity.did, proc.url)
                    run(clients.open(CONCURRENCY))
                    case = self.case(f"e2e_{label}", f"a2a_secure intent, Redis, {workers}w, 32 sessions")
                    case.note = "wrk not on PATH: Python clients, client-bound"
                    for _ in range(self.s.rounds):
                        case.loops.append(run(drive(clients.calls(), self.s.e2e_seconds, proc)))
                    run(clients.aclose())
            except Exception as exc:
                out.setdefault(label, {})["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                proc.stop()
                self.procs.remove(proc)
        self.results["redis"] = out


def _per_call(fn: Callable[[], object], k: int) -> float:
    """Mean CPU µs of ``fn()`` over ``k`` calls (CPU time: other processes do not count)."""
    fn()
    t = time.process_time()
    for _ in range(k):
        fn()
    return (time.process_time() - t) / k * 1e6


async def _asgi_post(app: Any, path: str, body: bytes, reply: list[bytes] | None = None) -> int:
    """Call an ASGI app directly with one POST (no server, no socket); return the status.

    ``reply``, when given, receives the body's chunks.
    """
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", HOST.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": (HOST, 40000),
        "server": (HOST, 8000),
        "state": {},
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif reply is not None and message["type"] == "http.response.body":
            reply.append(message.get("body", b""))

    await app(scope, receive, send)
    return status


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
    from a2a_secure.protocol.jsonrpc import encode_result, parse_request
    from a2a_secure.protocol.policy import Policy
    from a2a_secure.protocol.validate import check_payload_matches
    from a2a_secure.server.app import AgentServer

    server_id = Identity.generate("bench-server")
    server = AgentServer(server_id, Policy.build(rate_limit=10**9, session_timeout=3600))

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

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


def _fake_pending(i: int, policy: Any, server_did: str, now: int) -> tuple[Any, Any]:
    """A pending handshake and the session it opens, with fresh values like real ones."""
    from a2a_secure.identity import encoding
    from a2a_secure.identity.did import did_key_from_public_key, key_id_for_did_key
    from a2a_secure.store.base import PendingHandshake, SessionRecord

    key = os.urandom(32)
    did = did_key_from_public_key(key)
    kid = key_id_for_did_key(did)

    def h() -> str:
        return encoding.hash_bytes(os.urandom(16))

    pending = PendingHandshake(
        nonce_b=encoding.b64u_encode(os.urandom(32)),
        nonce_a=encoding.b64u_encode(os.urandom(32)),
        client_did=did,
        client_agent_id=f"bench-client-{i}",
        client_keys={kid: key},
        client_manifest_hash=h(),
        server_manifest_hash=h(),
        hello_hash=h(),
        challenge_hash=h(),
        policy=policy,
        policy_hash=h(),
        policy_signature=encoding.b64u_encode(os.urandom(180)),
        created_at=now,
        expires_at=now + 60,
        source=HOST,
    )
    record = SessionRecord(
        session_id=encoding.b64u_encode(os.urandom(32)),
        session_commitment=h(),
        client_did=did,
        server_did=server_did,
        client_kid=kid,
        client_key=key,
        policy=policy,
        created_at=now,
        expires_at=now + 3600,
        client_agent_id=f"bench-client-{i}",
    )
    return pending, record


def _fake_reply(i: int) -> Any:
    """The stored answer of an echo intent, as ServerProtocol keeps it (a distinct copy each).

    The engine keeps an answered request's result and signing time, not its signed token: a
    byte-identical retry gets the same token signed again (``Reply.stored``).
    """
    from a2a_secure.store.base import StoredReply

    result = json.loads(json.dumps(INTENT["inputs"]))
    return StoredReply(200, result, signed_at=int(time.time()) + i % 7)


def probe_memory(n: int) -> dict[str, Any]:
    """Entry point of ``--probe-memory N`` (a fresh process, so that RSS is not polluted)."""
    import gc

    from a2a_secure.identity import encoding
    from a2a_secure.identity.keys import Identity
    from a2a_secure.protocol.policy import Policy
    from a2a_secure.store.memory import MemoryStore

    store = MemoryStore()
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)  # shared, as in a server
    server_did = Identity.generate("bench-server").did
    now = int(time.time())
    big = 10**9

    async def fill() -> list[tuple[str, str]]:
        ids = []
        for i in range(n):
            pending, record = _fake_pending(i, policy, server_did, now)
            await store.add_pending(pending, max_per_source=big, max_total=big, now=now)
            await store.mark_proven(pending.nonce_b, record.client_kid, now)
            await store.open_session(pending.nonce_b, record, max_sessions=big, now=now)
            ids.append((record.session_id, record.client_did))
        return ids

    async def one_intent(ids: list[tuple[str, str]]) -> None:
        for i, (sid, did) in enumerate(ids):
            rh = encoding.hash_bytes(os.urandom(16))
            await store.begin_request(sid, did, 1, rh, rate_limit=1000, rate_period=3600, now=now)
            await store.finish_request(sid, 1, _fake_reply(i))

    gc.collect()
    rss0 = rss_bytes()
    ids = asyncio.run(fill())
    gc.collect()
    rss1 = rss_bytes()
    # The list of ids kept for the second step shares its strings with the store: only the
    # list and its tuples are this probe's own.
    ids_bytes = sys.getsizeof(ids) + sum(sys.getsizeof(t) for t in ids)
    asyncio.run(one_intent(ids))
    gc.collect()
    rss2 = rss_bytes()
    assert store.counts()["sessions"] == n
    return {
        "sessions": n,
        "rss_before": rss0,
        "bytes_per_session": (rss1 - rss0 - ids_bytes) / n,
        "bytes_per_session_after_one_intent": (rss2 - rss0 - ids_bytes) / n,
        "ids_bytes_subtracted": ids_bytes,
    }


async def _redis_memory(redis: RedisProc, n: int, warm: int) -> dict[str, Any]:
    from a2a_secure.identity import encoding
    from a2a_secure.identity.keys import Identity
    from a2a_secure.protocol.policy import Policy
    from a2a_secure.store.redis import RedisStore

    redis.client.flushall()
    store = RedisStore(redis.url, prefix="bench:")
    policy = Policy.build(rate_limit=10**9, rate_period=3600, session_timeout=3600)
    server_did = Identity.generate("bench-server").did
    now = int(time.time())
    big = 10**9
    batch = 32

    async def open_one(i: int) -> tuple[str, str]:
        pending, record = _fake_pending(i, policy, server_did, now)
        await store.add_pending(pending, max_per_source=big, max_total=big, now=now)
        await store.mark_proven(pending.nonce_b, record.client_kid, now)
        result = await store.open_session(pending.nonce_b, record, max_sessions=big, now=now)
        if result.value != "opened":
            raise RuntimeError(f"open_session: {result}")
        return record.session_id, record.client_did

    async def intent_one(i: int, sid: str, did: str) -> None:
        rh = encoding.hash_bytes(os.urandom(16))
        await store.begin_request(sid, did, 1, rh, rate_limit=1000, rate_period=3600, now=now)
        await store.finish_request(sid, 1, _fake_reply(i))

    async def fill(start: int, count: int) -> list[tuple[str, str]]:
        ids: list[tuple[str, str]] = []
        for b in range(start, start + count, batch):
            ids += await asyncio.gather(*(open_one(i) for i in range(b, min(start + count, b + batch))))
        return ids

    def mem() -> tuple[int, int]:
        info = redis.client.info("memory")
        return int(info["used_memory"]), int(info.get("used_memory_dataset", 0))

    try:
        # Warm-up: scripts loaded, the pool's connections open (their buffers count in
        # used_memory), the sorted sets created; then measure from there.
        warm_ids = await fill(0, warm)
        for b in range(0, len(warm_ids), batch):
            await asyncio.gather(
                *(intent_one(i, *warm_ids[i]) for i in range(b, min(len(warm_ids), b + batch)))
            )
        m0, d0 = mem()
        t = time.perf_counter()
        ids = await fill(warm, n)
        open_s = time.perf_counter() - t
        m1, d1 = mem()
        for b in range(0, n, batch):
            await asyncio.gather(*(intent_one(warm + i, *ids[i]) for i in range(b, min(n, b + batch))))
        m2, d2 = mem()
        # What one store call costs the server process (redis-py, asyncio): sequential calls.
        sample = ids[: min(n, 1000)]
        c, t = self_cpu(), time.perf_counter()
        for sid, did in sample:
            rh = encoding.hash_bytes(os.urandom(16))
            await store.begin_request(sid, did, 2, rh, rate_limit=1000, rate_period=3600, now=now)
        begin_cpu, begin_wall = self_cpu() - c, time.perf_counter() - t
        c, t = self_cpu(), time.perf_counter()
        for i, (sid, _did) in enumerate(sample):
            await store.finish_request(sid, 2, _fake_reply(i))
        finish_cpu, finish_wall = self_cpu() - c, time.perf_counter() - t
        k = len(sample)
        return {
            "begin_request_cpu_us": begin_cpu / k * 1e6,
            "begin_request_wall_us": begin_wall / k * 1e6,
            "finish_request_cpu_us": finish_cpu / k * 1e6,
            "finish_request_wall_us": finish_wall / k * 1e6,
            "sessions": n,
            "bytes_per_session": (m1 - m0) / n,
            "bytes_per_session_after_one_intent": (m2 - m0) / n,
            "dataset_bytes_per_session": (d1 - d0) / n,
            "dataset_bytes_per_session_after_one_intent": (d2 - d0) / n,
            "store_ops_per_s_opening": 3 * n / open_s,
        }
    finally:
        await store.aclose()
        redis.client.flushall()


# -- report -------------------------------------------------------------------------------------
def _f(value: Any, fmt: str = ".0f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return float(a) / float(b)


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
        """Add the median of the round-by-round ratios num/den of ``metric``.

        Both cases ran in each round, a few seconds apart: a ratio taken within a round is
        not moved by the machine slowing down between rounds, as a ratio of the two
        medians is (a fast round of one case beside a slow round of the other).
        """
        field = "rounds" if metric == "rate" else "cpu_rounds"
        a, b = get(num, field) or [], get(den, field) or []
        detail = f"{_f(get(num, metric))} / {_f(get(den, metric))} {unit}"
        ratios = [_ratio(x, y) for x, y in zip(a, b, strict=False)] if len(a) == len(b) else []
        if ratios and None not in ratios:
            value = median([r for r in ratios if r is not None])
            detail += "; rounds " + " ".join(f"{r:.2f}" for r in ratios if r is not None)
        else:
            value = _ratio(get(num, metric), get(den, metric))
            detail += " (medians)"
        add(name, value, TARGETS[target], better, detail)

    add_paired(
        "server CPU per signed intent / plain echo (wrk)",
        "wrk_signed", "wrk_plain", "server_cpu_us", "µs", "cpu_signed_vs_plain", "<=",
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
        "wrk_a2a",
        "wrk_a2a_direct",
        "wrk_a2a_secured",
        "wrk_redis_1w",
        "wrk_redis_2w",
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


# -- main ---------------------------------------------------------------------------------------
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, help="rounds per case (median reported); default 3, --quick 1")
    p.add_argument("--quick", action="store_true", help="short run (under 40 s)")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--a2a-python", metavar="PY", help="an interpreter with a2a-sdk[http-server] for case 3")
    p.add_argument("--profile", action="store_true", help="also cProfile the signed server under wrk")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis cases")
    p.add_argument("--no-wrk", action="store_true", help="skip the wrk cases")
    p.add_argument(
        "--serve", choices=["plain", "signed", "a2a", "a2a_direct", "a2a_secured"], help=argparse.SUPPRESS
    )
    p.add_argument("--probe-memory", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="a2a-bench-") as d:
        yield Path(d)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve_child(args.serve)
        return 0
    if args.probe_memory:
        print(json.dumps(probe_memory(args.probe_memory)))
        return 0
    base = QUICK if args.quick else FULL
    settings = Settings(**{**base.__dict__, "rounds": args.rounds or base.rounds})
    started = time.monotonic()
    busy0, own0 = machine_busy(), own_cpu()
    with _workdir() as workdir:
        bench = Bench(args, settings, workdir)
        try:
            bench.run_main_cases()
            bench.log("in-process breakdown")
            bench.run_core_breakdown()
            bench.run_memory()
            bench.run_redis()
        finally:
            bench.close()
    cases = {k: c.summary() for k, c in bench.cases.items()}
    out: dict[str, Any] = {"meta": _meta(args, settings), "cases": cases, **bench.results}
    out["a2a_session_cost"] = a2a_session_cost(bench.cases)
    out["targets"] = build_targets(cases, bench.results)
    elapsed = time.monotonic() - started
    out["meta"]["seconds"] = round(elapsed, 1)
    # Other processes on a shared machine skew rates more than CPU per request: say how busy.
    out["meta"]["other_load_cores"] = round((machine_busy() - busy0 - (own_cpu() - own0)) / elapsed, 2)
    print_report(out)
    args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nresults: {args.json}; {plot(out, args.json.with_suffix('.png'))}; {out['meta']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
