"""A real local Sentinel deployment for the tests: a primary, a replica, three sentinels.

:class:`LocalSentinel` starts, on free loopback ports in a temporary directory, one
``redis-server`` primary, one replica of it (``--replicaof``) and three sentinels
(``redis-server <conf> --sentinel``) that monitor the primary as service ``a2a`` with quorum
2, ``down-after-milliseconds 1000`` and ``failover-timeout 5000``; nothing is saved to disk.
It waits until every sentinel sees the replica and the two other sentinels, so that a
failover can be authorised as soon as the primary dies. Without ``redis-server`` the tests
that need it SKIP with the reason (FAIL under ``A2A_SECURE_REQUIRE_REDIS=1``, see
redis_helpers.py).

The session-scoped ``redis_sentinel`` fixture (registered in conftest.py) is shared by the
tests that only read and write; a test that kills the primary starts its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis_helpers import OwnedRedis, free_port, redis_server_binary, skip_or_fail

SERVICE = "a2a"
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


def start_sentinel(conf: Path) -> subprocess.Popen[bytes]:
    """``redis-server <conf> --sentinel`` (Sentinel rewrites ``conf``: it must be writable)."""
    return subprocess.Popen(
        [redis_server_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _query(port: int, command: Callable[[redis_sync.Redis], Any], timeout: float = 1.0) -> Any:
    """``command`` on a client of the server at ``port``; None when it does not answer.

    Without retries: a frozen server (SIGSTOP) costs one ``timeout``, not one per retry.
    """
    client = redis_sync.Redis(
        port=port, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    try:
        return command(client)
    except (redis_sync.ConnectionError, redis_sync.TimeoutError, redis_sync.ResponseError):
        return None
    finally:
        client.close()


class LocalSentinel:
    """A primary, its replica and three sentinels: start, kill a server, wait for the failover."""

    def __init__(self, workdir: Path, *, sentinels: int = 3) -> None:
        redis_server_binary()  # skip (or fail) now, before anything is started
        self.workdir = workdir
        self.servers: dict[int, OwnedRedis] = {}
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinel_procs: list[subprocess.Popen[bytes]] = []
        self.first_primary = 0

    @property
    def url(self) -> str:
        """``redis+sentinel://`` with every sentinel, for service ``a2a``."""
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{SERVICE}"

    def _server(self, name: str, args: list[str]) -> OwnedRedis:
        (self.workdir / name).mkdir(exist_ok=True)
        # The replica's first sync at once, not after the default 5 s of diskless delay.
        server = OwnedRedis(self.workdir / name, args=["--repl-diskless-sync-delay", "0", *args])
        server.start()
        self.servers[server.port] = server
        return server

    def start(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            primary = self._server("primary", [])
            self.first_primary = primary.port
            replica = self._server("replica", ["--replicaof", "127.0.0.1", str(primary.port)])
            while self.info(replica.port).get("master_link_status") != "up":
                self._check(deadline, "the replica did not sync")
            # Started after the replica synced: a sentinel reads the primary's INFO (and so
            # finds the replica) as soon as it connects, and only every 10 s afterwards.
            for i, port in enumerate(self.sentinel_ports):
                sdir = self.workdir / f"sentinel-{i}"
                sdir.mkdir(exist_ok=True)
                conf = sdir / "sentinel.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {sdir}\nlogfile {sdir / 'sentinel.log'}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} {QUORUM}\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
                self.sentinel_procs.append(start_sentinel(conf))
            # A failover needs a majority of the sentinels to know each other (they meet
            # through hello messages on the primary, every 2 s) and to know the replica.
            others = len(self.sentinel_ports) - 1
            while not all(
                (m := self.sentinel_view(port)).get("num-slaves") == 1
                and m.get("num-other-sentinels") == others
                for port in self.sentinel_ports
            ):
                if any(p.poll() is not None for p in self.sentinel_procs):
                    skip_or_fail(f"a sentinel exited at start (logs in {self.workdir})")
                self._check(deadline, "the sentinels did not see the replica and each other")
        except BaseException:
            self.stop()
            raise

    def _check(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} in time (logs in {self.workdir})")
        time.sleep(0.05)

    def info(self, port: int) -> dict[str, str]:
        """``INFO replication`` of one server ({} when it does not answer)."""
        info = _query(port, lambda c: c.info("replication"))
        return {k: str(v) for k, v in info.items()} if isinstance(info, dict) else {}

    def sentinel_view(self, port: int) -> dict[str, Any]:
        """``SENTINEL MASTER a2a`` as one sentinel sees it ({} when it does not answer)."""
        view = _query(port, lambda c: c.sentinel_master(SERVICE))
        return view if isinstance(view, dict) else {}

    def named(self) -> int | None:
        """The port of the primary every live sentinel names now, if they agree."""
        named: set[int] = set()
        for port, proc in zip(self.sentinel_ports, self.sentinel_procs, strict=True):
            if proc.poll() is not None:
                continue
            addr = _query(port, lambda c: c.sentinel_get_master_addr_by_name(SERVICE))
            if not isinstance(addr, tuple | list) or len(addr) != 2:
                return None
            named.add(int(addr[1]))
        return named.pop() if len(named) == 1 else None

    def primary(self) -> int | None:
        """The port of the primary every live sentinel names now, if they agree and it says so."""
        port = self.named()
        return port if port is not None and self.info(port).get("role") == "master" else None

    def url_of(self, port: int) -> str:
        """``redis://`` for one server, to read or clean it directly."""
        return self.servers[port].url

    def kill(self, port: int) -> None:
        """SIGKILL one redis-server (the primary or the replica)."""
        self.servers[port].kill()

    def freeze(self, port: int) -> None:
        """SIGSTOP one redis-server: it keeps its connections and answers nothing."""
        proc = self.servers[port].proc
        assert proc is not None and proc.poll() is None
        os.kill(proc.pid, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        """SIGCONT a frozen redis-server: it goes on where it stopped, still sure of its role."""
        proc = self.servers[port].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)

    def wait_failover(self, old: int, timeout: float = 20.0) -> int:
        """Until every sentinel names a primary other than ``old`` that says it is one: its port.

        ``old`` itself is never queried: it may be frozen.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.named()
            if now is not None and now != old and self.info(now).get("role") == "master":
                return now
            time.sleep(0.05)
        raise AssertionError(
            f"no failover from {old} in {timeout:.0f} s: "
            f"{[self.sentinel_view(p) for p in self.sentinel_ports]} (logs in {self.workdir})"
        )

    def wait_replica_of(self, port: int, primary: int, timeout: float = 30.0) -> float:
        """Until ``port`` is a replica of ``primary`` with its link up (a demoted primary synced).

        Returns the last moment (``time.monotonic()``) it was seen not yet synced: stamped
        before the look that saw it so, hence certainly before the sync. The moment this
        returns is later by up to a poll and a thread hand-off, which is no bound on when
        the sync happened.
        """
        deadline = time.monotonic() + timeout
        unsynced = time.monotonic()
        while time.monotonic() < deadline:
            asked = time.monotonic()
            info = self.info(port)
            if (
                info.get("role") == "slave"
                and info.get("master_port") == str(primary)
                and info.get("master_link_status") == "up"
            ):
                return unsynced
            unsynced = asked
            time.sleep(0.05)
        raise AssertionError(
            f"{port} did not become a replica of {primary} in {timeout:.0f} s: {self.info(port)}"
        )

    def stop(self) -> None:
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for server in self.servers.values():
            server.kill()

    def __enter__(self) -> LocalSentinel:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sentinel_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    """The body of the session-scoped ``redis_sentinel`` fixture (conftest.py)."""
    deployment = LocalSentinel(tmp_path_factory.mktemp("redis-sentinel"))
    deployment.start()
    try:
        yield deployment
    finally:
        deployment.stop()
