"""The runner: server processes, CPU accounting, client loops, wrk, and a run's cases.

Servers run in their own process (``bench.py --serve KIND``), as does a private redis-server
(:class:`RedisProc`); their CPU time is read from ``/proc/<pid>/stat`` over the process
tree. A case is a list of rounds (``Loop`` for Python
clients, ``WrkResult`` for wrk) summarised by medians; ``paired_ratio`` takes the median of
the round-by-round ratios of two cases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a2abench.common import CONCURRENCY, ENTRY, HOST, REPLAY_LUA, Settings, _ratio, median, pct

if TYPE_CHECKING:
    import httpx


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
            [python, str(ENTRY), "--serve", kind],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    return Starting(kind, proc, log)


def start_cli_server(
    workdir: Path, key_file: Path, policy: Path, *, workers: int, redis_url: str, name: str = ""
) -> Proc:
    """``a2a-secure serve --workers N --redis-url URL`` on a free port, once /health answers.

    ``name`` names its log and ``Proc`` (``serve-Nw`` by default).
    """
    import httpx

    port = free_port()
    name = name or f"serve-{workers}w"
    log = workdir / f"{name}.log"
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
                return Proc(name, proc, url, log)
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


def serve_child(make_app: Callable[[], Any]) -> None:
    """Entry point of ``--serve KIND``: serve ``make_app()`` on an ephemeral port, print ``READY <url>``.

    Every server case is served so: one uvicorn worker, httptools when installed, uvloop when
    installed, access log and lifespan off.
    """
    import uvicorn

    app = make_app()
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
    """Holds the servers, clients and results of one run; the cases add to ``cases`` and ``results``."""

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

    def wrk(
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
        """One wrk run added to case ``key`` (its error kept as the case's note)."""
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


def paired_ratio(num: dict[str, Any], den: dict[str, Any], metric: str) -> tuple[float | None, list[float]]:
    """The median of the round-by-round ratios num/den of ``metric`` (``rate`` or CPU), and them.

    Both cases ran in each round, a few seconds apart: a ratio taken within a round is not
    moved by the machine slowing down between rounds, as a ratio of the two medians is (a
    fast round of one case beside a slow round of the other). Without a ratio for every round
    (a case skipped or failed in one), the ratio of the medians and no rounds.
    """
    field = "rounds" if metric == "rate" else "cpu_rounds"
    a, b = num.get(field) or [], den.get(field) or []
    ratios = [_ratio(x, y) for x, y in zip(a, b, strict=False)] if len(a) == len(b) else []
    if ratios and None not in ratios:
        rounds = [r for r in ratios if r is not None]
        return median(rounds), rounds
    return _ratio(num.get(metric), den.get(metric)), []
