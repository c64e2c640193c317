"""A seeded fault campaign against real processes on loopback, checked against a ledger.

Each run starts its own Redis deployment (a ``redis-server`` on a free port with its own data
directory; never the machine's Redis), ``a2a-secure serve --workers N --redis-url …`` serving
``scripts/chaos_app.py`` (whose handlers append every run to a ledger file outside the
system), a small asyncio TCP fault proxy in front of it, and several concurrent clients
(``A2AClient``, every intent with an ``intent_id``; some sealed, some streamed, some asking
for an approval that another identity gives). Faults are drawn from the run's seed:

=========================  ==================================================================
kind                       what is done
=========================  ==================================================================
kill_before_commit         a worker dies (SIGKILL) inside the handler, before any answer is
                           stored
kill_after_commit          a worker dies (SIGKILL) right after the claim's answer is stored,
                           before it is sent
stop_past_lease            a worker stops itself (SIGSTOP) inside the handler; the client
                           resends meanwhile; SIGCONT once the claim's lease is over
proxy_cut                  a connection is cut after the request went through and before the
                           answer is read
proxy_delay                an answer is held 0.2-1.5 s (the client may time out and resend)
clock_step                 a worker's wall clock steps (``A2A_SECURE_TEST_CLOCK_DIR``) by up
                           to 240 s either way, within the 300 s of freshness (in runs whose
                           handler faults leave no claim running: a lease read on a clock
                           off by more than its margin is off by that much)
redis_kill_aof             the Redis primary (``appendfsync always``) is killed (SIGKILL) and
                           restarted from its AOF
redis_kill_everysec        the same with ``appendfsync everysec``
redis_kill_no_aof          the same with no AOF (and no snapshot): it restarts empty
failover_wait_replicas     Sentinel fails over to the replica (the primary killed) under
                           ``--redis-wait-replicas 1``; the old primary rejoins as a replica
failover_async             the same without ``--redis-wait-replicas``
=========================  ==================================================================

After every run the invariants are checked from the ledger, the clients' answers, the audit
log and the store: no intent_id ran twice; no acknowledged answer lacks its run; no two
different answers for one id (every answered id is asked again, on a new session, once the
faults are over); no sequence accepted twice on a session; no approved action ran twice;
the audit chain verifies; nothing stays locked (every id ends answered, or refused with a
clear code: -32049 "outcome unknown", -32044, -32050; a signed error is an answer too). Runs
whose deployment does not give
the guarantee (``failover_async``, ``redis_kill_no_aof``: SECURITY.md, "Faults the campaign
measures") report what they break as measured losses, not violations.

Scenarios (one deployment each): ``aof`` (every handler fault, Redis killed and restarted
from its AOF), ``clock`` (clock steps, ``everysec`` Redis killed), ``sentinel-wait``,
``everysec`` (every handler fault), ``no-aof``, ``sentinel-async``; plus in every run the
proxy's cuts and delays. ``--quick`` runs five of them, once each; the long form runs every
scenario once and then draws them from the seed.

Usage::

    python scripts/chaos.py --quick --seed 7        # CI form: < 2 min, every kind once
    python scripts/chaos.py --runs 500 --seed 1     # long form
    python scripts/chaos.py --seed 1 --only-run 17  # replay one run of a campaign

Needs ``redis-server`` (7.x) on PATH. Prints one report; ``--json FILE`` writes it as JSON.
Exit status 1 when a violation was found.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis as redis_sync

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(SCRIPTS)]

from a2a_secure.audit.verify import verify_chain  # noqa: E402
from a2a_secure.client.http import A2AClient, RetryPolicy  # noqa: E402
from a2a_secure.errors import A2AError  # noqa: E402
from a2a_secure.identity.keys import Identity  # noqa: E402

KINDS = (
    "kill_before_commit",
    "kill_after_commit",
    "stop_past_lease",
    "proxy_cut",
    "proxy_delay",
    "clock_step",
    "redis_kill_aof",
    "redis_kill_everysec",
    "redis_kill_no_aof",
    "failover_wait_replicas",
    "failover_async",
)
# Directives of chaos_app.py for a fault inside a handler.
DIRECTIVES = {
    "kill_before": "kill_before_commit",
    "kill_after": "kill_after_commit",
    "stop": "stop_past_lease",
}
# Server timing of the campaign: a lease of ceil(now + 1.5) + 1 s, a short wait on a running
# claim (the client resends instead).
HANDLER_TIMEOUT_MS = 1500
LEASE_MARGIN = 1
LEASE = HANDLER_TIMEOUT_MS / 1000 + LEASE_MARGIN + 1
STOP_FOR = LEASE + 0.7  # past the lease, below uvicorn's 5 s health check
# Errors after which the client sends the same intent_id again: unavailable or still running,
# session or handshake gone, a sequence refused (a retry overtaken). Refusals that end an id:
# "outcome unknown", the id used for another intent, an approval already decided.
RETRY_CODES = {-32048, -32043, -32041}


def classify(exc: A2AError) -> str:
    """``retry``, ``refused`` (the id ends without an answer) or ``answer`` (a signed error
    answer, the id's answer)."""
    text = str(exc)
    if exc.code in RETRY_CODES or (exc.code == -32049 and "did not answer" in text):
        return "retry"
    if exc.code == -32044:
        return "refused" if "intent_id already used" in text else "retry"
    if (exc.code == -32049 and "outcome unknown" in text) or exc.code == -32050:
        return "refused"
    # An unsigned error is no answer of the server's (anyone on the path can send one, and
    # a server failing before it could sign sends one): the client tries again.
    return "answer" if exc.signed else "retry"


NOT_SUCCESS = {"refused", "failed", "error"}  # members of a recorded outcome that is no success


def error_answer(exc: A2AError) -> dict[str, Any]:
    return {"error": exc.code, "message": str(exc)[:200]}


SERVICE = "chaos"


# -- scenarios -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    name: str
    redis: str  # "always", "everysec", "none" (no AOF), "sentinel"
    wait_replicas: int
    store_fault: str | None  # the store fault kind of this scenario
    directives: tuple[str, ...]  # faults inside handlers (chaos_app.py), each forced once
    guarantee: bool  # whether SECURITY.md promises the invariants under this store fault
    clock: bool = False  # step the workers' clocks (then no fault leaves a claim running:
    # a worker whose clock is off by more than the lease margin sees a lease that much off)


ALL = ("kill_before", "kill_after", "stop", "slow")
KEEPS = ("kill_after", "slow")  # faults that leave no claim of their own running
SCENARIOS = {
    "aof": Scenario("aof", "always", 0, "redis_kill_aof", ALL, True),
    "clock": Scenario("clock", "everysec", 0, "redis_kill_everysec", ("slow",), True, clock=True),
    "sentinel-wait": Scenario("sentinel-wait", "sentinel", 1, "failover_wait_replicas", KEEPS, True),
    "everysec": Scenario("everysec", "everysec", 0, "redis_kill_everysec", ALL, True),
    "no-aof": Scenario("no-aof", "none", 0, "redis_kill_no_aof", (), False),
    "sentinel-async": Scenario("sentinel-async", "sentinel", 0, "failover_async", (), False),
}
# The CI form: every fault kind in five runs (the long form draws from every scenario).
QUICK = ["aof", "clock", "sentinel-wait", "no-aof", "sentinel-async"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise SystemExit("chaos.py needs redis-server on PATH")
    return found


# -- Redis deployments -----------------------------------------------------------------------------
class RedisNode:
    """One redis-server on its own port and data directory, killed and restarted at will."""

    def __init__(self, workdir: Path, name: str, persistence: str, replica_of: int | None = None) -> None:
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persistence = persistence
        self.replica_of = replica_of
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--save", "", "--protected-mode", "no", "--repl-diskless-sync-delay", "0"]
        if self.persistence == "none":
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", self.persistence]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        return args

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(redis_sync.RedisError, OSError):
                if redis_sync.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        self.kill()

    def client(self) -> redis_sync.Redis:
        return redis_sync.Redis(port=self.port, socket_timeout=1.0)


class Deployment:
    """The store of one run: one primary, or a primary, a replica and a Sentinel."""

    def __init__(self, workdir: Path, scenario: Scenario) -> None:
        self.scenario = scenario
        persistence = "always" if scenario.redis == "sentinel" else scenario.redis
        self.primary = RedisNode(workdir, "primary", persistence)
        self.replica: RedisNode | None = None
        self.sentinel: subprocess.Popen[bytes] | None = None
        self.sentinel_port = 0
        self.workdir = workdir
        if scenario.redis == "sentinel":
            self.replica = RedisNode(workdir, "replica", persistence, replica_of=self.primary.port)

    @property
    def url(self) -> str:
        if self.replica is None:
            return f"redis://127.0.0.1:{self.primary.port}/0"
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}"

    def start(self) -> None:
        self.primary.start()
        if self.replica is None:
            return
        self.replica.start()
        wait_until(lambda: _linked(self.primary), 10, "the replica did not sync")
        self.sentinel_port = free_port()
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 400\n"
            f"sentinel failover-timeout {SERVICE} 2000\n"
        )
        self.sentinel = subprocess.Popen(
            [redis_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(self._sentinel_sees_replica, 10, "sentinel did not see the replica")

    def _sentinel(self) -> redis_sync.Redis:
        return redis_sync.Redis(port=self.sentinel_port, socket_timeout=0.5)

    def _sentinel_sees_replica(self) -> bool:
        with contextlib.suppress(redis_sync.RedisError, OSError):
            return bool(self._sentinel().execute_command("SENTINEL", "REPLICAS", SERVICE))
        return False

    def master_port(self) -> int | None:
        with contextlib.suppress(redis_sync.RedisError, OSError):
            addr = self._sentinel().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            return int(addr[1])
        return None

    def current_primary(self) -> RedisNode:
        if self.replica is not None and self.master_port() == self.replica.port:
            return self.replica
        return self.primary

    def stop(self) -> None:
        if self.sentinel is not None and self.sentinel.poll() is None:
            self.sentinel.kill()
            self.sentinel.wait(5)
        for node in (self.primary, self.replica):
            if node is not None:
                node.stop()


def _linked(primary: RedisNode) -> bool:
    with contextlib.suppress(redis_sync.RedisError, OSError):
        info = primary.client().info("replication")
        return int(info.get("connected_slaves", 0)) >= 1 and "slave0" in info
    return False


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(what)


# -- the fault proxy -------------------------------------------------------------------------------
class FaultProxy:
    """A TCP proxy to the server: per connection, pass, cut the answer, or delay it."""

    def __init__(self, upstream: int, rng: random.Random, cut: float, delay: float) -> None:
        self.upstream = upstream
        self.rng = rng
        self.cut = cut
        self.delay = delay
        self.port = 0
        self.counts: Counter[str] = Counter()
        self.enabled = True
        self.forced = ["cut", "delay"]  # the first connections: every kind at least once
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await self._pipe(reader, writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mode = "pass"
        if self.enabled and self.forced:
            mode = self.forced.pop(0)
        elif self.enabled:
            x = self.rng.random()
            mode = "cut" if x < self.cut else "delay" if x < self.cut + self.delay else "pass"
        hold = self.rng.uniform(0.2, 1.5)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return

        async def to_server() -> None:
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    up_w.write(data)
                    await up_w.drain()
            with contextlib.suppress(Exception):
                up_w.write_eof()

        async def to_client() -> None:
            nonlocal mode
            with contextlib.suppress(Exception, asyncio.CancelledError):
                while data := await up_r.read(65536):
                    if mode == "cut":  # the request went through; the answer is dropped
                        self.counts["proxy_cut"] += 1
                        break
                    if mode == "delay":
                        self.counts["proxy_delay"] += 1
                        await asyncio.sleep(hold)
                        mode = "pass"
                    writer.write(data)
                    await writer.drain()

        up = asyncio.ensure_future(to_server())
        await to_client()
        up.cancel()
        for w in (writer, up_w):
            with contextlib.suppress(Exception):
                w.close()


# -- the server ------------------------------------------------------------------------------------
class Server:
    def __init__(
        self, workdir: Path, deployment: Deployment, workers: int, identity: Identity, approver: str
    ):
        self.workdir = workdir
        self.port = free_port()
        self.ledger = workdir / "ledger.jsonl"
        self.plan = workdir / "plan"
        self.clocks = workdir / "clocks"
        self.audit = workdir / "audit.jsonl"
        self.prefix = "chaos:"
        for d in (self.plan, self.clocks):
            d.mkdir()
        key = workdir / "server.key"
        identity.save(key)
        policy = workdir / "policy.json"
        policy.write_text(
            json.dumps(
                {
                    "rate_limit": 100_000,
                    "rate_period": 3600,
                    "sealed_intents": True,
                    "max_handler_timeout_ms": HANDLER_TIMEOUT_MS,
                    "replay_wait_seconds": 0.5,
                }
            )
        )
        args = [sys.executable, "-m", "a2a_secure", "serve", "--key-file", str(key), "--port", str(self.port)]
        args += ["--workers", str(workers), "--redis-url", deployment.url, "--redis-prefix", self.prefix]
        args += ["--policy", str(policy), "--audit-log", str(self.audit), "--app", "chaos_app:register"]
        args += ["--claim-lease-margin", str(LEASE_MARGIN)]
        if deployment.scenario.wait_replicas:
            args += ["--redis-wait-replicas", str(deployment.scenario.wait_replicas)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)]),
            "CHAOS_LEDGER": str(self.ledger),
            "CHAOS_PLAN": str(self.plan),
            "CHAOS_APPROVER": approver,
            "A2A_SECURE_TEST_CLOCK_DIR": str(self.clocks),
        }
        self.log = (workdir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            args, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.did = identity.did
        self.public_key = identity.public_key  # checks the audit log's signed checkpoints

    def wait_healthy(self, workers: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.workdir / 'server.log').read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                healthy = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200
                if healthy and len(self.workers()) >= workers:
                    return
            time.sleep(0.1)
        raise RuntimeError("server not healthy after 60 s")

    def workers(self) -> list[int]:
        """The worker processes (children of uvicorn's supervisor that serve requests)."""
        out = []
        for pid in _children(self.proc.pid):
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
                    out.append(pid)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            for child in map(int, text):
                out.append(child)
                out += _children(child)
    return out


# -- clients and their history ---------------------------------------------------------------------
@dataclass
class Outcome:
    iid: str
    did: str
    op: str
    answers: list[Any] = field(default_factory=list)  # every success answer seen (first + re-read)
    refusal: int | None = None  # the final refusal code, when refused
    errors: Counter[str] = field(default_factory=Counter)  # non-final failures (resent)
    final: bool = False
    action_id: str | None = None
    sends: int = 0
    intent: dict[str, Any] = field(default_factory=dict)


def new_id(rng: random.Random) -> str:
    return "".join(
        rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(24)
    )


def client_for(identity: Identity, *, sealed: bool) -> A2AClient:
    return A2AClient(
        identity,
        exactly_once=True,
        sealed=sealed,
        timeout=2.5,
        retry=RetryPolicy(attempts=2, base=0.05, cap=0.3, max_wait=1.0),
    )


class Clients:
    def __init__(
        self, server_did: str, endpoint: str, rng: random.Random, workload_end: float, deadline: float
    ) -> None:
        self.workload_end = workload_end  # no new intent after it
        self.server_did = server_did
        self.endpoint = endpoint
        self.rng = rng
        self.deadline = deadline
        self.outcomes: list[Outcome] = []
        self.forced: list[tuple[float, str]] = []  # (not before, directive), spread over the run
        self.directives: tuple[str, ...] = ()

    async def send(
        self, holder: list[A2AClient], identity: Identity, sealed: bool, out: Outcome, intent: dict[str, Any]
    ) -> Any:
        """Send until answered or finally refused (same intent_id), or the deadline."""
        while time.monotonic() < self.deadline:
            out.sends += 1
            try:
                if out.op == "tally":
                    items = []
                    async for item in holder[0].stream(
                        self.server_did, intent, endpoint=self.endpoint, intent_id=out.iid
                    ):
                        items.append(item)
                    answer: Any = items
                else:
                    answer = (
                        await holder[0].request(
                            self.server_did, intent, endpoint=self.endpoint, intent_id=out.iid
                        )
                    ).result
            except A2AError as exc:
                verdict = classify(exc)
                if verdict == "refused":
                    out.refusal, out.final = exc.code, True
                    return None
                if verdict == "answer":  # a signed error answer: the id's answer
                    out.answers.append(error_answer(exc))
                    out.final = True
                    return None
                out.errors[f"{exc.code} {str(exc)[:70]}"] += 1
            except Exception as exc:
                out.errors[type(exc).__name__] += 1
            else:
                out.answers.append(answer)
                out.final = True
                return answer
            await asyncio.sleep(self.rng.uniform(0.05, 0.3))
            if self.rng.random() < 0.2:  # the resend on a new session
                with contextlib.suppress(Exception):
                    await holder[0].aclose(close_sessions=False)
                holder[0] = client_for(identity, sealed=sealed)
        return None

    async def run_client(
        self, identity: Identity, sealed: bool, approver: Identity, count: int, plan: Path, plan_p: float
    ) -> None:
        holder = [client_for(identity, sealed=sealed)]
        approver_holder = [client_for(approver, sealed=False)]
        try:
            for n in range(count):
                now = time.monotonic()
                # Past the workload's end, only to give a directive not yet given (each kind
                # of the scenario is injected once at least), while there is time to settle.
                late = now >= self.workload_end
                if late and (not self.forced or now >= self.deadline - 2 * LEASE - 2):
                    break
                x = self.rng.random()
                op = "work" if late or x < 0.6 or (sealed and x >= 0.8) else "tally" if x < 0.8 else "book"
                out = Outcome(new_id(self.rng), identity.did, op)
                self.outcomes.append(out)
                due = bool(self.forced) and self.forced[0][0] <= time.monotonic()
                if op == "work" and (due or (self.directives and self.rng.random() < plan_p)):
                    directive = self.forced.pop(0)[1] if due else self.rng.choice(self.directives)
                    (plan / out.iid).write_text(directive)
                out.intent = {"goal": op, "inputs": {"n": n, "what": f"thing {n}"}}
                answer = await self.send(holder, identity, sealed, out, out.intent)
                if op != "book" or not isinstance(answer, dict) or not answer.get("needs_approval"):
                    continue
                out.action_id = answer["action_id"]
                approve = Outcome(new_id(self.rng), approver.did, "approve", action_id=out.action_id)
                self.outcomes.append(approve)
                inputs = {
                    "action_id": answer["action_id"],
                    "action_hash": answer["action_hash"],
                    "approved": True,
                }
                approve.intent = {"goal": "tool.approve", "inputs": inputs}
                await self.send(approver_holder, approver, False, approve, approve.intent)
        finally:
            for h in (holder, approver_holder):
                with contextlib.suppress(Exception):
                    await h[0].aclose()

    async def reread(self, identities: dict[str, tuple[Identity, bool]], deadline: float) -> None:
        """Ask every answered id again, on a new session: the answer must be the same.

        A transient refusal (the store still recovering: 503) is asked again until
        ``deadline``; what is recorded is the first answer or final refusal.
        """
        fresh: dict[str, A2AClient] = {}
        try:
            for out in self.outcomes:
                if not out.answers:
                    continue
                if out.did not in fresh:
                    identity, sealed = identities[out.did]
                    fresh[out.did] = client_for(identity, sealed=sealed)
                out.answers.append(await self._ask_again(fresh[out.did], out, deadline))
        finally:
            for client in fresh.values():
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _ask_again(self, client: A2AClient, out: Outcome, deadline: float) -> Any:
        last: Any = None
        while True:
            try:
                if out.op == "tally":
                    stream = client.stream(
                        self.server_did, out.intent, endpoint=self.endpoint, intent_id=out.iid
                    )
                    return [item async for item in stream]
                got = await client.request(
                    self.server_did, out.intent, endpoint=self.endpoint, intent_id=out.iid
                )
                return got.result
            except A2AError as exc:
                verdict = classify(exc)
                if verdict != "retry":
                    return error_answer(exc) if verdict == "answer" else {"refused": exc.code}
                last = {"refused": exc.code, "message": str(exc)[:120]}
            except Exception as exc:
                last = {"failed": type(exc).__name__}
            if time.monotonic() >= deadline:
                return last
            await asyncio.sleep(0.2)


# -- one run ---------------------------------------------------------------------------------------
@dataclass
class RunResult:
    run: int
    scenario: str
    faults: Counter[str] = field(default_factory=Counter)
    intents: int = 0
    runs: int = 0
    answers: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)  # outside the guarantee (measured)
    seconds: float = 0.0


class Faults:
    """The run's faults outside the handlers, at times drawn from its seed."""

    def __init__(self, rng: random.Random, deployment: Deployment, server: Server, result: RunResult) -> None:
        self.rng = rng
        self.deployment = deployment
        self.server = server
        self.result = result
        self.conts: list[asyncio.Task[None]] = []

    async def store_fault(self, at: float) -> None:
        await asyncio.sleep(at)
        kind = self.deployment.scenario.store_fault
        if kind is None:
            return
        loop = asyncio.get_running_loop()
        if self.deployment.replica is None:
            node = self.deployment.primary
            node.kill()
            self.result.faults[kind] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            await loop.run_in_executor(None, node.start)  # from its AOF (or empty)
            return
        old = self.deployment.current_primary()
        old.kill()
        self.result.faults[kind] += 1
        # Sentinel promotes the replica (down-after 400 ms); the old primary then comes back
        # from its AOF as a replica of the new one.
        await loop.run_in_executor(
            None,
            lambda: wait_until(
                lambda: self.deployment.master_port() not in (None, old.port), 15, "no failover"
            ),
        )
        await asyncio.sleep(self.rng.uniform(0.1, 0.8))
        # It comes back as a replica of the new primary (as an operator's supervisor starts
        # it; Sentinel alone would convert it too, seconds later).
        old.replica_of = self.deployment.master_port()
        await loop.run_in_executor(None, old.start)

    async def clock_steps(self, until: float) -> None:
        """Step one worker's clock now and then, by up to 240 s either way (within the 300 s
        of freshness)."""
        while time.monotonic() < until - 1:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            workers = self.server.workers()
            if not workers:
                continue
            pid = self.rng.choice(workers)
            step = self.rng.choice([-1, 1]) * self.rng.uniform(1, 240)
            (self.server.clocks / str(pid)).write_text(f"{step:.3f}")
            self.result.faults["clock_step"] += 1

    def restore_clocks(self) -> None:
        for f in self.server.clocks.iterdir():
            f.write_text("0")

    async def watch_stops(self, until: float) -> None:
        """SIGCONT every worker that stopped itself, once the claim's lease is over."""
        seen: set[str] = set()
        while time.monotonic() < until:
            for f in self.server.plan.glob("*.stopped"):
                if f.name in seen:
                    continue
                seen.add(f.name)
                with contextlib.suppress(ValueError, OSError):
                    pid = int(f.read_text() or 0)
                    self.conts.append(asyncio.ensure_future(self._cont(pid)))
            await asyncio.sleep(0.05)

    async def _cont(self, pid: int) -> None:
        await asyncio.sleep(STOP_FOR)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def one_run(run: int, seed: int, scenario: Scenario, args: argparse.Namespace, base: Path) -> RunResult:
    rng = random.Random(f"{seed}:{run}")
    result = RunResult(run, scenario.name)
    started = time.monotonic()
    workdir = base / f"run-{run:04d}-{scenario.name}"
    workdir.mkdir(parents=True)
    deployment = Deployment(workdir, scenario)
    server_id = Identity.generate("chaos-agent")
    approver = Identity.generate("chaos-approver")
    server: Server | None = None
    proxy: FaultProxy | None = None
    try:
        await asyncio.get_running_loop().run_in_executor(None, deployment.start)
        server = Server(workdir, deployment, args.workers, server_id, approver.did)
        await asyncio.get_running_loop().run_in_executor(None, server.wait_healthy, args.workers)
        proxy = FaultProxy(server.port, random.Random(rng.random()), cut=0.08, delay=0.1)
        await proxy.start()
        endpoint = f"http://127.0.0.1:{proxy.port}"
        workload_end = time.monotonic() + args.duration
        deadline = workload_end + args.settle
        clients = Clients(server.did, endpoint, random.Random(rng.random()), workload_end, deadline)
        faults = Faults(random.Random(rng.random()), deployment, server, result)
        identities: dict[str, tuple[Identity, bool]] = {approver.did: (approver, False)}
        tasks = []
        # Each directive of the scenario once, spread over the workload (a worker killed or
        # stopped takes seconds to come back), then more at random.
        step = args.duration / (len(scenario.directives) + 1)
        clients.forced = [(time.monotonic() + step * (i + 0.5), d) for i, d in enumerate(scenario.directives)]
        clients.directives = scenario.directives
        plan_p = args.handler_faults if scenario.directives else 0.0
        for i in range(args.clients):
            identity = Identity.generate(f"chaos-client-{i}")
            sealed = i % 2 == 1
            identities[identity.did] = (identity, sealed)
            tasks.append(clients.run_client(identity, sealed, approver, args.intents, server.plan, plan_p))
        background = [
            asyncio.ensure_future(faults.store_fault(rng.uniform(0.3, 0.7) * args.duration)),
            asyncio.ensure_future(faults.watch_stops(deadline + STOP_FOR)),
        ]
        if scenario.clock:
            background.append(asyncio.ensure_future(faults.clock_steps(workload_end)))
        await asyncio.gather(*tasks)
        # The faults are over: clocks back, stopped workers resumed, then every answered id
        # is asked again through a quiet proxy.
        background[2:] and background[2].cancel()
        faults.restore_clocks()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(background[0], 30)
        for t in faults.conts:
            with contextlib.suppress(Exception):
                await t
        background[1].cancel()
        proxy.enabled = False
        await clients.reread(identities, time.monotonic() + args.settle)
        result.faults.update(proxy.counts)
        check(result, clients.outcomes, server, deployment)
    except Exception as exc:
        result.violations.append(f"run failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        if proxy is not None:
            await proxy.close()
        if server is not None:
            server.stop()
        deployment.stop()
        result.seconds = time.monotonic() - started
    if not args.keep and not result.violations:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


# -- the invariants --------------------------------------------------------------------------------
def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def check(result: RunResult, outcomes: list[Outcome], server: Server, deployment: Deployment) -> None:
    """The invariants, from the ledger, the answers, the audit log and the store."""
    ledger = read_ledger(server.ledger)
    runs = [r for r in ledger if r["kind"] == "run"]
    actions = [r for r in ledger if r["kind"] == "action"]
    for r in runs:
        if r.get("fault") in DIRECTIVES:
            result.faults[DIRECTIVES[r["fault"]]] += 1
    result.intents = len(outcomes)
    result.runs = len(runs) + len(actions)
    result.answers = sum(1 for o in outcomes if o.answers)
    problems: list[str] = []
    by_id = Counter((r["did"], r["intent_id"]) for r in runs)
    problems += [f"intent_id {iid} ran {n} times" for (_, iid), n in by_id.items() if n > 1]
    by_seq = Counter((r["session"], r["sequence"]) for r in runs)
    problems += [
        f"sequence {seq} of session {sid[:12]} accepted {n} times"
        for (sid, seq), n in by_seq.items()
        if n > 1
    ]
    by_action = Counter(r["action_id"] for r in actions)
    problems += [f"approved action {a} ran {n} times" for a, n in by_action.items() if n > 1]
    for o in outcomes:
        answered = [
            a for a in o.answers if not (isinstance(a, dict) and ({"refused", "failed", "error"} & set(a)))
        ]
        if o.op == "approve":
            if answered and o.action_id not in by_action:
                problems.append(f"approval {o.iid} answered, action {o.action_id} never ran")
        elif answered and (o.did, o.iid) not in by_id:
            problems.append(f"intent_id {o.iid} answered without a run in the ledger")
        if o.answers:
            first = json.dumps(o.answers[0], sort_keys=True)
            for later in o.answers[1:]:
                if json.dumps(later, sort_keys=True) != first:
                    problems.append(
                        f"intent_id {o.iid} ({o.op}): two answers: {first[:120]} / {json.dumps(later)[:120]}"
                    )
        if not o.final:
            problems.append(f"intent_id {o.iid} ({o.op}) still unanswered at the deadline: {dict(o.errors)}")
        elif o.refusal is not None:
            result.refused[str(o.refusal)] += 1
    verdict = verify_chain(server.audit, public_key=server.public_key)
    if not verdict.ok:
        problems.append(f"audit chain broken: {verdict.message}")
    problems += store_problems(outcomes, server, deployment)
    if deployment.scenario.guarantee:
        result.violations += problems
    else:
        result.losses += problems


def store_problems(outcomes: list[Outcome], server: Server, deployment: Deployment) -> list[str]:
    """Every id answered with a success has its answer kept with its claim."""
    node = deployment.current_primary()
    r = node.client()
    out = []
    with contextlib.suppress(redis_sync.RedisError):
        for o in outcomes:
            if o.answers and o.refusal is None:
                key = f"{server.prefix}i:{server.did}|{o.did}:{o.iid}"
                if not r.hexists(key, "y"):
                    out.append(f"intent_id {o.iid} answered but its claim holds no answer")
    return out


# -- the campaign ----------------------------------------------------------------------------------
def schedule(args: argparse.Namespace) -> list[tuple[int, Scenario]]:
    if args.quick:
        names = QUICK
    else:
        rng = random.Random(f"{args.seed}:schedule")
        every = list(SCENARIOS)
        names = [every[i] if i < len(every) else rng.choice(every) for i in range(args.runs)]
    plan = list(enumerate((SCENARIOS[n] for n in names), start=1))
    if args.scenario:
        plan = [(run, SCENARIOS[args.scenario]) for run, _ in plan]
    if args.only_run is not None:
        plan = [p for p in plan if p[0] == args.only_run]
    return plan


def report(results: list[RunResult], seed: int, elapsed: float) -> dict[str, Any]:
    faults: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
        refused.update(r.refused)
    return {
        "seed": seed,
        "runs": len(results),
        "seconds": round(elapsed, 1),
        "faults": {k: faults.get(k, 0) for k in KINDS},
        "kinds_injected": sum(1 for k in KINDS if faults.get(k)),
        "intents": sum(r.intents for r in results),
        "handler_runs": sum(r.runs for r in results),
        "answered": sum(r.answers for r in results),
        "refused": dict(refused),
        "violations": [
            {"run": r.run, "scenario": r.scenario, "what": v, "replay": f"--seed {seed} --only-run {r.run}"}
            for r in results
            for v in r.violations
        ],
        "losses_by_kind": losses_by_kind(results),
        "losses_outside_guarantee": [
            {"run": r.run, "scenario": r.scenario, "what": v} for r in results for v in r.losses
        ],
    }


LOSS_KINDS = {
    "ran": "an intent_id ran twice",
    "answers": "two answers for one id",
    "without": "an answer without its run",
    "holds": "an answer not kept in the store",
    "still": "an id left unanswered",
    "sequence": "a sequence accepted twice",
    "approved": "an approved action ran twice",
}


def losses_by_kind(results: list[RunResult]) -> dict[str, dict[str, int]]:
    """What the runs outside the guarantee broke, per scenario and kind (measured)."""
    out: dict[str, Counter[str]] = {}
    for r in results:
        for loss in r.losses:
            kind = next((v for k, v in LOSS_KINDS.items() if k in loss), "other")
            out.setdefault(r.scenario, Counter())[kind] += 1
    return {scenario: dict(c) for scenario, c in out.items()}


def print_report(rep: dict[str, Any]) -> None:
    print(f"chaos: seed {rep['seed']}, {rep['runs']} runs in {rep['seconds']} s")
    print("faults injected:")
    for k, n in rep["faults"].items():
        print(f"  {k:24s} {n}")
    print(
        f"intents sent {rep['intents']}, handler runs {rep['handler_runs']}, answered {rep['answered']}, "
        f"refused {rep['refused']}"
    )
    losses = rep["losses_outside_guarantee"]
    print(f"measured losses outside the guarantee (SECURITY.md): {len(losses)}")
    for scenario, kinds in rep["losses_by_kind"].items():
        print(f"  {scenario}: {kinds}")
    print(f"violations: {len(rep['violations'])}")
    for v in rep["violations"][:50]:
        print(f"  run {v['run']} ({v['scenario']}): {v['what']}  [replay: {v['replay']}]")


async def campaign(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    started = time.monotonic()
    results = []
    for run, scenario in schedule(args):
        result = await one_run(run, args.seed, scenario, args, base)
        results.append(result)
        if args.verbose:
            print(
                f"run {run} {scenario.name}: intents={result.intents} answered={result.answers} "
                f"{dict(result.faults)} violations={len(result.violations)} "
                f"losses={len(result.losses)} {result.seconds:.1f}s",
                flush=True,
            )
            for v in result.violations:
                print(f"  violation: {v}", flush=True)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return report(results, args.seed, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the CI form: one run per scenario")
    parser.add_argument("--runs", type=int, default=20, help="runs of the long form")
    parser.add_argument("--only-run", type=int, help="replay one run of the campaign")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="every run in this scenario")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument(
        "--intents", type=int, default=40, help="at most this many intents per client per run"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of workload and faults per run")
    parser.add_argument("--settle", type=float, default=12.0, help="seconds an id may take to end")
    parser.add_argument(
        "--handler-faults", type=float, default=0.05, help="share of unary intents given a handler fault"
    )
    parser.add_argument("--keep", metavar="DIR", help="keep every run's files (ledger, logs) in DIR")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    base = Path(args.keep or tempfile.mkdtemp(prefix="a2a-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    rep = asyncio.run(campaign(args, base))
    print_report(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
    return 1 if rep["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
