"""RedisStore on Redis Cluster: spread, round trips, replication wait, URLs, Sentinel.

The store contract itself runs on the cluster in test_store_contract.py; failover under
load is in test_cluster_failover.py. These use the session's local cluster (three
primaries, three replicas; tests/cluster_helpers.py) with a fresh key prefix each.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
from cluster_helpers import LocalCluster, delete_prefix, keys_per_primary
from protocol_helpers import make_world
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis_helpers import OwnedRedis, free_port
from sentinel_helpers import start_sentinel
from test_store_contract import CLIENT, T0, pending, session

from a2a_secure.errors import Unavailable
from a2a_secure.protocol.server.common import ServerLimits
from a2a_secure.store.base import BeginKind, OpenResult, SessionRecord, StoredReply
from a2a_secure.store.redis import RedisStore
from a2a_secure.store.redis_connect import Deployment, client_from_url, deployment_of

BIG = 1_000_000


@pytest.fixture
async def cstore(redis_cluster: LocalCluster) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_cluster.url, prefix=f"a2a-test:{uuid.uuid4().hex}:")
    try:
        yield store
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, store.prefix)


async def open_n(store: RedisStore, n: int, *, first: int = 1, batch: int = 200) -> list[SessionRecord]:
    """``n`` sessions opened through the full path (add, prove, open)."""

    async def one(i: int) -> SessionRecord:
        p = pending(i, source=f"10.0.{i % 250}.{i % 7}")
        assert await store.add_pending(p, max_per_source=BIG, max_total=100_000, now=T0)
        assert await store.mark_proven(p.nonce_b, CLIENT.kid, T0)
        rec = session(i)
        assert await store.open_session(p.nonce_b, rec, max_sessions=100_000, now=T0) is OpenResult.OPENED
        return rec

    out: list[SessionRecord] = []
    for start in range(first, first + n, batch):
        out += await asyncio.gather(*(one(i) for i in range(start, min(first + n, start + batch))))
    return out


# -- layout ------------------------------------------------------------------------------------------
async def test_sessions_spread_evenly_over_the_primaries(
    cstore: RedisStore, redis_cluster: LocalCluster
) -> None:
    await open_n(cstore, 3000)
    counts = keys_per_primary(redis_cluster, cstore.prefix)
    assert len(counts) == 3 and sum(counts.values()) >= 3000
    mean = sum(counts.values()) / 3
    assert max(abs(c - mean) for c in counts.values()) <= 0.10 * mean, counts
    assert (await cstore.counts(T0))["sessions"] == 3000


async def test_each_script_touches_one_key_in_its_owners_slot(cstore: RedisStore) -> None:
    sid, did = session(1).session_id, CLIENT.did
    assert key_slot(cstore._k_session(sid).encode()) == key_slot(cstore._k_session_tag(sid).encode() + b"x")
    assert key_slot(cstore._k_rate("", did, 60, 0).encode()) == key_slot(
        cstore._k_did_tag(did).encode() + b"i:abc"
    )
    assert key_slot(cstore._k_session(sid).encode()) != key_slot(
        cstore._k_session(session(2).session_id).encode()
    )


async def test_a_prefix_with_a_hash_tag_keeps_every_key_in_one_slot(redis_cluster: LocalCluster) -> None:
    prefix = f"{{a2a-test-{uuid.uuid4().hex}}}:"
    store = RedisStore(redis_cluster.url, prefix=prefix)
    try:
        recs = await open_n(store, 20)
        assert (
            await store.begin_request(
                recs[0].session_id, CLIENT.did, 1, "sha256:" + "ab" * 32, rate_limit=5, rate_period=60, now=T0
            )
        ).kind is BeginKind.NEW
        counts = keys_per_primary(redis_cluster, prefix)
        assert sorted(counts.values())[:2] == [0, 0]  # all on one node
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, prefix)


async def test_memory_per_session_on_the_cluster(cstore: RedisStore, redis_cluster: LocalCluster) -> None:
    (rec,) = await open_n(cstore, 1)
    h = "sha256:" + "cd" * 32
    assert (
        await cstore.begin_request(rec.session_id, CLIENT.did, 1, h, rate_limit=9, rate_period=60, now=T0)
    ).kind is BeginKind.NEW
    await cstore.finish_request(rec.session_id, 1, StoredReply(200, {"ok": True}, signed_at=T0))
    await cstore.flush()
    key = cstore._k_session(rec.session_id)
    r = redis_sync.Redis(port=redis_cluster.primary_of_slot(key_slot(key.encode())), socket_timeout=2.0)
    try:
        used = int(r.memory_usage(key, samples=0) or 0)
    finally:
        r.close()
    assert 0 < used <= 2048, used


# -- round trips --------------------------------------------------------------------------------------
async def test_an_intent_is_one_round_trip_on_the_cluster(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    await cstore.get_session(rec.session_id, T0)
    trips = cstore.round_trips
    for seq in range(1, 21):
        h = f"sha256:{seq:064x}"
        b = await cstore.begin_request(
            rec.session_id, CLIENT.did, seq, h, rate_limit=100, rate_period=60, now=T0
        )
        assert b.kind is BeginKind.NEW
        assert await cstore.get_session(rec.session_id, T0) == rec  # from the cache
        await cstore.finish_request(rec.session_id, seq, StoredReply(200, {"seq": seq}))
    assert cstore.round_trips - trips == 20  # each begin carried the answer before it
    b = await cstore.begin_request(
        rec.session_id, CLIENT.did, 20, f"sha256:{20:064x}", rate_limit=100, rate_period=60, now=T0
    )
    assert b.kind is BeginKind.REPLAY and b.reply == StoredReply(200, {"seq": 20})


async def test_rate_limited_on_the_cluster_consumes_nothing_and_keeps_the_answer(cstore: RedisStore) -> None:
    (rec,) = await open_n(cstore, 1)
    h1, h2 = "sha256:" + "11" * 32, "sha256:" + "22" * 32
    assert (
        await cstore.begin_request(rec.session_id, CLIENT.did, 1, h1, rate_limit=1, rate_period=60, now=T0)
    ).kind is BeginKind.NEW
    await cstore.finish_request(rec.session_id, 1, StoredReply(200, {"one": 1}))
    b = await cstore.begin_request(rec.session_id, CLIENT.did, 2, h2, rate_limit=1, rate_period=60, now=T0)
    assert b.kind is BeginKind.RATE_LIMITED and b.last_sequence == 1
    # The refused request changed nothing: the retry of 1 still gets its answer.
    b = await cstore.begin_request(rec.session_id, CLIENT.did, 1, h1, rate_limit=1, rate_period=60, now=T0)
    assert b.kind is BeginKind.REPLAY and b.reply == StoredReply(200, {"one": 1})


# -- a failure inside redis-py --------------------------------------------------------------------------
# While a cluster fails over, redis-py's cluster client closes connections that other calls
# are using: all of them when a node answers CLUSTERDOWN (RedisCluster.aclose), a node's
# idle ones after a timeout or a lost connection (which another call may take meanwhile).
# A call that then writes on such a connection fails with an AttributeError (the writer
# already dropped) or, on uvloop, a RuntimeError (the transport closed): no Redis error.
# Seen under a failover (test_cluster_failover.py) as a 500 from a compensation of
# begin_request; made certain here by running that very aclose just before the write.
LOOPS = {"asyncio": ("AttributeError", False), "uvloop": ("RuntimeError", True)}


def run_on(loop: str, main: Coroutine[Any, Any, None]) -> None:
    factory = pytest.importorskip("uvloop").new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def close_before_the_next_write(
    monkeypatch: pytest.MonkeyPatch, client: Any, *, closing: bool, sha: str | None = None
) -> list[asyncio.Future[None]]:
    """The next write (of the script ``sha``, if given) meets the client closing its connections.

    ``closing``: the write goes while ``aclose`` is under way (the transport closed, the
    writer not yet dropped: a RuntimeError on uvloop, a ConnectionError on asyncio's own
    loop); otherwise once it is done (no writer: an AttributeError). Returns the
    ``aclose`` it started, once it has.
    """
    real = AbstractConnection._send_packed_command
    closers: list[asyncio.Future[None]] = []

    async def racing(self: AbstractConnection, command: Any) -> None:
        if not closers and (sha is None or any(sha.encode() in bytes(part) for part in command)):
            closers.append(asyncio.ensure_future(client.aclose()))
            if closing:
                # One step of the loop at a time, until the transport is closed (its reader
                # saw the end) while aclose still waits to drop the writer.
                while self._writer is not None and not self._reader.at_eof():  # noqa: ASYNC110
                    await asyncio.sleep(0)
            else:
                await closers[0]
        await real(self, command)

    monkeypatch.setattr(AbstractConnection, "_send_packed_command", racing)
    return closers


def unexpected_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The ERROR lines of the store: failures that were no Redis error."""
    mine = [r for r in caplog.records if r.name == "a2a_secure.store.redis"]
    return [r.getMessage() for r in mine if r.levelno == logging.ERROR]


async def test_a_connection_closed_under_a_call_is_unavailable_and_consumes_nothing(
    cstore: RedisStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="a2a_secure.store.redis")
    (rec,) = await open_n(cstore, 1)
    h1 = "sha256:" + "31" * 32
    begin = functools.partial(
        cstore.begin_request, rec.session_id, CLIENT.did, 1, h1, rate_limit=9, rate_period=60, now=T0
    )
    closers = close_before_the_next_write(monkeypatch, cstore.client, closing=False)
    with pytest.raises(Unavailable) as info:
        await begin()
    assert closers and info.value.retry_after == 1
    # Logged as what it is, a failure inside the client, by type and place, not its text.
    (line,) = unexpected_records(caplog)
    assert ": AttributeError at " in line and "in _send_packed_command" in line
    assert "NoneType" not in line and CLIENT.did not in line
    # It never reached Redis: once the client reconnects, the sequence is still new.
    assert (await begin()).kind is BeginKind.NEW


async def test_a_bug_of_the_store_is_not_taken_for_an_outage(
    cstore: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Raised by the store's own code, never inside redis-py: it goes up as the bug it is
    # (the server answers -32603 and logs it), it is not hidden behind a 503.
    (rec,) = await open_n(cstore, 1)

    async def broken() -> None:
        raise KeyError("scripts")

    monkeypatch.setattr(cstore, "_loaded", False)
    monkeypatch.setattr(cstore, "_load_all", broken)
    with pytest.raises(KeyError):
        await cstore.begin_request(
            rec.session_id, CLIENT.did, 1, "sha256:" + "32" * 32, rate_limit=9, rate_period=60, now=T0
        )


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_compensation_that_meets_a_closed_connection_answers_503_and_runs_nothing(
    loop: str, redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The DID's rate window fails (here a key of the wrong type; under a failover, its node
    # timed out) after the session's script consumed the sequence: begin_request gives the
    # sequence back (UNBEGIN), and that write meets a connection the client is closing.
    kind, closing = LOOPS[loop]
    caplog.set_level(logging.WARNING)

    async def main() -> None:
        w = make_world(limits=ServerLimits(replay_wait_seconds=0.0))
        store = RedisStore(redis_cluster.url, prefix=f"a2a-test:{uuid.uuid4().hex}:")
        w.server.store = store
        try:
            sess, _ = await w.open_session()
            policy = w.server.policy
            t = int(w.clock())
            rate_key = store._k_rate(
                w.server_id.did, w.client_id.did, policy.rate_period, t - t % policy.rate_period
            )
            await store.client.hset(rate_key, "not", "a counter")
            req = sess.prepare_intent({"goal": "echo", "inputs": {"n": 1}})
            unbegin = store._c_unbegin.sha
            closers = close_before_the_next_write(monkeypatch, store.client, closing=closing, sha=unbegin)
            r = await w.call("intent", req.params)
            assert closers
            await closers[0]
            assert (r.http_status, r.error and r.error["code"], r.retry_after) == (503, -32048, 1), r.error
            assert w.handlers.count("echo") == 0
            assert not [m for m in caplog.messages if m.startswith("internal error")]  # no -32603
            (line,) = unexpected_records(caplog)
            assert f": {kind} at " in line and "in _send_packed_command" in line
            # Its sequence stays consumed without an answer (the compensation was lost): the
            # same request keeps getting 503, and never runs; the next sequence does, once.
            await store.client.delete(rate_key)
            r = await w.call("intent", req.params)
            assert (r.http_status, r.error and r.error["code"]) == (503, -32048), r.error
            assert w.handlers.count("echo") == 0
            nxt = sess.prepare_intent({"goal": "echo", "inputs": {"n": 2}})
            r = await w.call("intent", nxt.params)
            assert r.http_status == 200, r.error
            assert sess.verify_result(nxt, r.result)["result"]["echo"] == {"n": 2}
            assert w.handlers.count("echo") == 1
        finally:
            await store.aclose()
            delete_prefix(redis_cluster.url, store.prefix)

    run_on(loop, main())


# -- WAIT ------------------------------------------------------------------------------------------------
async def test_wait_replicas_puts_the_sequence_on_the_replica(
    redis_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="a2a_secure.store.redis")
    prefix = f"a2a-test:{uuid.uuid4().hex}:"
    store = RedisStore(redis_cluster.url, prefix=prefix, wait_replicas=1, wait_timeout_ms=300)
    try:
        (rec,) = await open_n(store, 1)
        key = store._k_session(rec.session_id)
        primary = redis_cluster.primary_of_slot(key_slot(key.encode()))
        replica = redis_cluster.replica_of(primary)
        h1 = "sha256:" + "31" * 32
        # The replica is frozen: the write is not confirmed, so the request is refused
        # before its intent runs, and its sequence is given back.
        os.kill(redis_cluster.procs[replica].pid, signal.SIGSTOP)
        try:
            t = time.monotonic()
            with pytest.raises(Unavailable):
                await store.begin_request(
                    rec.session_id, CLIENT.did, 1, h1, rate_limit=9, rate_period=60, now=T0
                )
            assert 0.25 <= time.monotonic() - t < 0.9
            # An outage like any other, logged as one, not as a failure inside the client.
            assert not unexpected_records(caplog)
            assert any("_NotReplicated" in m for m in caplog.messages)
        finally:
            os.kill(redis_cluster.procs[replica].pid, signal.SIGCONT)
        b = await store.begin_request(rec.session_id, CLIENT.did, 1, h1, rate_limit=9, rate_period=60, now=T0)
        assert b.kind is BeginKind.NEW
        # Read from the replica itself, right after the call returned.
        r = redis_sync.Redis(port=replica, socket_timeout=2.0)
        try:
            r.execute_command("READONLY")
            assert r.hget(key, "l") == b"1"
            await store.finish_request(rec.session_id, 1, StoredReply(200, {"w": 1}))
            await store.flush()
            assert r.hget(key, "y") is not None
        finally:
            r.close()
    finally:
        await store.aclose()
        delete_prefix(redis_cluster.url, prefix)


async def test_wait_replicas_on_one_redis_with_a_replica(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "r").mkdir()
    with OwnedRedis(tmp_path / "p") as primary:
        replica = OwnedRedis(tmp_path / "r")
        replica.start()
        try:
            p = redis_sync.Redis(port=primary.port, socket_timeout=2.0)
            p.config_set("repl-diskless-sync-delay", 0)  # the first sync at once, not in 5 s
            p.close()
            r = redis_sync.Redis(port=replica.port, socket_timeout=2.0)
            r.replicaof("127.0.0.1", primary.port)
            deadline = time.monotonic() + 10
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            # Room for a loaded machine: a replica that answers late is not the case under test.
            store = RedisStore(
                primary.url,
                prefix="w:",
                wait_replicas=1,
                wait_timeout_ms=3000,
                socket_timeout=5.0,
                finish_linger=None,
            )
            try:
                (rec,) = await open_n(store, 1)
                h1 = "sha256:" + "41" * 32
                assert (
                    await store.begin_request(
                        rec.session_id, CLIENT.did, 1, h1, rate_limit=9, rate_period=60, now=T0
                    )
                ).kind is BeginKind.NEW
                assert r.hget(store._k_session(rec.session_id), "l") == b"1"
                await store.finish_request(rec.session_id, 1, StoredReply(200, {"w": 1}))
                assert r.hget(store._k_session(rec.session_id), "y") is not None
                os.kill(replica.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                try:
                    with pytest.raises(Unavailable):
                        await store.begin_request(
                            rec.session_id,
                            CLIENT.did,
                            2,
                            "sha256:" + "42" * 32,
                            rate_limit=9,
                            rate_period=60,
                            now=T0,
                        )
                finally:
                    os.kill(replica.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            finally:
                await store.aclose()
                r.close()
        finally:
            replica.kill()


# -- URLs and Sentinel ------------------------------------------------------------------------------------
def test_url_forms() -> None:
    assert deployment_of("redis://h:1/0") is Deployment.SINGLE
    assert deployment_of("unix:///tmp/r.sock") is Deployment.SINGLE
    assert deployment_of("redis+cluster://a:1,b:2") is Deployment.CLUSTER
    assert deployment_of("rediss+sentinel://a:1/svc") is Deployment.SENTINEL
    with pytest.raises(ValueError, match="unsupported Redis URL scheme"):
        deployment_of("http://h:1")
    with pytest.raises(ValueError, match="no database number"):
        client_from_url("redis+cluster://h:1/2", socket_timeout=1.0)
    with pytest.raises(ValueError, match="service name"):
        client_from_url("redis+sentinel://h:1", socket_timeout=1.0)
    cluster, kind = client_from_url("redis+cluster://u:p%40ss@10.0.0.1:7000,[::1]:7001", socket_timeout=1.0)
    assert kind is Deployment.CLUSTER
    assert sorted(n.name for n in cluster.startup_nodes) == ["10.0.0.1:7000", "::1:7001"]
    assert cluster.connection_kwargs["password"] == "p@ss"
    assert cluster.retry.get_retries() == 0


async def test_sentinel_url_follows_the_primary(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    with OwnedRedis(tmp_path / "p") as primary:
        port = free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor a2a 127.0.0.1 {primary.port} 1\n"
            "sentinel down-after-milliseconds a2a 1000\n"
        )
        proc = start_sentinel(conf)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    s = redis_sync.Redis(port=port, socket_timeout=1.0)
                    if s.execute_command("SENTINEL", "get-master-addr-by-name", "a2a"):
                        s.close()
                        break
                    s.close()
                except redis_sync.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "sentinel did not start"
                await asyncio.sleep(0.05)
            store = RedisStore(
                f"redis+sentinel://127.0.0.1:{port}/a2a", prefix=f"a2a-test:{uuid.uuid4().hex}:"
            )
            try:
                assert store.deployment is Deployment.SENTINEL
                (rec,) = await open_n(store, 1)
                b = await store.begin_request(
                    rec.session_id, CLIENT.did, 1, "sha256:" + "51" * 32, rate_limit=9, rate_period=60, now=T0
                )
                assert b.kind is BeginKind.NEW
                r = redis_sync.Redis(port=primary.port)
                assert r.hget(store._k_session(rec.session_id), "l") == b"1"  # on the primary Sentinel named
                r.close()
            finally:
                await store.aclose()
        finally:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://:s3cr/et@h:7000",  # a "/" left unencoded ends the host part early
        "redis+sentinel://:s3cr/et@h:26379/svc",
        "redis+cluster://u:s3cret@h:s3cret",
        "redis+sentinel://u:pw@h:1/svc/s3cret",
    ],
)
def test_a_malformed_url_error_never_quotes_its_text(url: str) -> None:
    # Startup errors are logged: a password fragment must not ride in one.
    with pytest.raises(ValueError) as info:
        client_from_url(url, socket_timeout=1.0)
    assert "s3cr" not in str(info.value)


@pytest.mark.parametrize("bad", [{"wait_replicas": 0.5}, {"wait_replicas": True}, {"wait_timeout_ms": 1.5}])
def test_wait_settings_must_be_integers(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="integers"):
        RedisStore("redis://127.0.0.1:6379/0", **bad)
