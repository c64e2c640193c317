"""A real local Redis Cluster for the tests: three primaries, three replicas, loopback.

:class:`LocalCluster` starts six ``redis-server --cluster-enabled yes`` processes on free
ports in a temporary directory, joins them with ``redis-cli --cluster create
--cluster-replicas 1``, and waits for ``cluster_state:ok`` on every node. Without
``redis-server``/``redis-cli`` the tests that need it SKIP with the reason (FAIL under
``A2A_SECURE_REQUIRE_REDIS=1``, as for the single Redis, see redis_helpers.py).

The session-scoped ``redis_cluster`` fixture (registered in conftest.py) is shared by every
test that only reads and writes; a test that kills nodes starts its own ``LocalCluster``.

:func:`register_marking` is an ``A2A_SECURE_APP`` target for server subprocesses: an ``echo``
whose every execution counts ``inputs["marker"]`` in a Redis hash, so a test can tell how
many times each intent ran.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_helpers import redis_server_binary, skip_or_fail

NODE_TIMEOUT_MS = 1000


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (+10000) is free too; below 55536, as Redis needs."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 45000)
        if port not in taken and port + 10000 not in taken and _free(port) and _free(port + 10000):
            return port
    raise AssertionError("no free port pair for a cluster node")


def redis_cli_binary() -> str:
    """The ``redis-cli`` executable, or skip/fail."""
    path = shutil.which("redis-cli")
    if path is None:
        skip_or_fail("redis-cli is not on PATH")
    return path


class LocalCluster:
    """Six ``redis-server`` processes as one cluster: start, kill a node, stop."""

    def __init__(self, workdir: Path, *, primaries: int = 3, replicas: int = 1) -> None:
        self.server = redis_server_binary()
        self.cli = redis_cli_binary()
        self.workdir = workdir
        self.count = primaries * (1 + replicas)
        self.replicas = replicas
        self.ports: list[int] = []
        for _ in range(self.count):
            self.ports.append(cluster_port({q for p in self.ports for q in (p, p + 10000)}))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.frozen: set[int] = set()  # stopped (SIGSTOP): not queried until thawed

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _start_node(self, port: int) -> None:
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [
            self.server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(node_dir / "nodes.conf"),
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(node_dir),
            "--logfile",
            str(node_dir / "redis.log"),
            "--daemonize",
            "no",
        ]
        self.procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _cli(self, port: int, *args: str, timeout: float = 5.0) -> str:
        out = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return out.stdout + out.stderr

    def info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of one node as a dict ({} when it does not answer)."""
        try:
            text = self._cli(port, "cluster", "info", timeout=2.0)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)

    def start(self, timeout: float = 30.0) -> None:
        for port in self.ports:
            self._start_node(port)
        deadline = time.monotonic() + timeout
        while any("PONG" not in self._cli(p, "ping") for p in self.ports):
            if time.monotonic() > deadline or len(self.live_ports()) < self.count:
                self.stop()
                skip_or_fail(f"cluster nodes did not start (logs in {self.workdir})")
            time.sleep(0.05)
        out = subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            self.stop()
            skip_or_fail(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        self.wait_ok(deadline - time.monotonic())

    def live_ports(self) -> list[int]:
        """The nodes running and not frozen."""
        return [p for p, proc in self.procs.items() if proc.poll() is None and p not in self.frozen]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and they agree on the primaries."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [self.info(p) for p in self.live_ports()]
            if all(i.get("cluster_state") == "ok" for i in infos) and self._replicas_in_sync():
                return
            time.sleep(0.05)
        raise AssertionError(
            f"cluster not ok after {timeout:.0f} s: {[self.info(p) for p in self.live_ports()]}"
        )

    def _replicas_in_sync(self) -> bool:
        # cluster create returns before the replicas have done their first sync.
        for port in self.live_ports():
            text = self._cli(port, "info", "replication")
            if "role:slave" in text and "master_link_status:up" not in text:
                return False
        return True

    def wait_replica_in_sync(self, port: int, timeout: float = 20.0) -> None:
        """Until node ``port`` is a replica whose link to its primary is up (synced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._cli(port, "info", "replication")
            if "role:slave" in text and "master_link_status:up" in text:
                return
            time.sleep(0.05)
        raise AssertionError(f"node {port} is not a replica in sync after {timeout:.0f} s")

    def primaries(self) -> list[int]:
        """The ports of the live primaries, in slot order."""
        nodes = []
        for port in self.live_ports():
            if "role:master" in self._cli(port, "info", "replication"):
                nodes.append(port)
        return sorted(nodes, key=self._first_slot)

    def _first_slot(self, port: int) -> int:
        for line in self._cli(port, "cluster", "nodes").splitlines():
            if "myself" in line:
                parts = line.split()
                slots = [p for p in parts[8:] if p[0].isdigit()]
                return int(slots[0].split("-")[0]) if slots else 1 << 20
        return 1 << 20

    def primary_of_slot(self, slot: int) -> int:
        """The port of the primary that serves ``slot`` now."""
        for port in self.live_ports():
            for line in self._cli(port, "cluster", "nodes").splitlines():
                parts = line.split()
                if "master" not in parts[2] or "fail" in parts[2]:
                    continue
                for rng in parts[8:]:
                    if not rng[0].isdigit():
                        continue
                    lo, _, hi = rng.partition("-")
                    if int(lo) <= slot <= int(hi or lo):
                        return int(parts[1].split(":")[1].split("@")[0])
            break
        raise AssertionError(f"no primary serves slot {slot}")

    def replica_of(self, primary: int) -> int:
        """The port of a replica of ``primary``."""
        text = self._cli(primary, "info", "replication")
        for line in text.splitlines():
            if line.startswith("slave0:"):
                fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split(","))
                return int(fields["port"])
        raise AssertionError(f"{primary} has no replica: {text}")

    def freeze(self, port: int) -> None:
        """SIGSTOP one node: it keeps its connections and answers nothing."""
        self.frozen.add(port)
        os.kill(self.procs[port].pid, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        """SIGCONT a frozen node: it goes on where it stopped, until gossip tells it otherwise."""
        os.kill(self.procs[port].pid, signal.SIGCONT)
        self.frozen.discard(port)

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The body of the session-scoped ``redis_cluster`` fixture (conftest.py)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` on every primary of the cluster at ``url``."""
    from redis.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(h, int(p)) for h, p in (hp.split(":") for hp in url.split("://", 1)[1].split(","))]
    client = RedisCluster(startup_nodes=nodes, socket_timeout=2.0)
    deleted = 0
    try:
        for node in client.get_primaries():
            keys = list(client.scan_iter(match=prefix + "*", count=1000, target_nodes=node))
            for key in keys:
                deleted += int(client.delete(key))
        return deleted
    finally:
        client.close()


def keys_per_primary(cluster: LocalCluster, prefix: str) -> dict[int, int]:
    """How many keys under ``prefix`` each live primary holds, by port (in slot order)."""
    import redis

    counts = {}
    for port in cluster.primaries():
        r = redis.Redis(port=port, socket_timeout=5.0)
        try:
            counts[port] = sum(1 for _ in r.scan_iter(match=prefix + "*", count=1000))
        finally:
            r.close()
    return counts


# -- an A2A_SECURE_APP target for server subprocesses ------------------------------------------------
MARKS_URL_ENV = "A2A_TEST_MARKS_URL"
MARKS_KEY_ENV = "A2A_TEST_MARKS_KEY"


def register_marking(server: Any) -> None:
    """Register ``echo`` (result = inputs) that counts ``inputs["marker"]`` per execution."""
    import redis.asyncio as redis_asyncio
    from redis.maint_notifications import MaintNotificationsConfig

    # A handler whose count times out answers -32603 ("the intent handler failed"): on a
    # loaded machine that is not the store's failover under test, so the count waits long.
    client = redis_asyncio.Redis.from_url(
        os.environ[MARKS_URL_ENV],
        socket_timeout=30.0,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    key = os.environ[MARKS_KEY_ENV]

    @server.intent("echo")
    async def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        await client.hincrby(key, str(inputs.get("marker", "")), 1)
        return inputs
