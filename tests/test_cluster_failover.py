"""A primary of the cluster dies (SIGKILL) under load: 503 with Retry-After, then service again.

Two uvicorn processes serve one identity on a local Redis Cluster of their own (three
primaries, three replicas, ``cluster-node-timeout`` 1 s) through
``A2A_SECURE_REDIS_URL=redis+cluster://…``. Their ``echo`` counts each execution by the
``marker`` of its inputs in a separate Redis (``cluster_helpers:register_marking``). Six
clients send intents to both processes in turn; the primary that serves the first client's
session is killed mid-run. Each request that gets 503 is retried byte for byte for a while,
then given up (the client has seen an error) and the client moves to the next sequence.
The same run, against Sentinel, is in test_sentinel_failover.py.

A primary frozen (SIGSTOP) until its replica takes over, then resumed, is run twice: with
the workers' defaults, and with ``A2A_SECURE_REDIS_WAIT_REPLICAS=1`` (Redis ``WAIT``, as
``a2a-secure serve --redis-wait-replicas 1`` sets it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from cluster_helpers import MARKS_KEY_ENV, MARKS_URL_ENV, LocalCluster
from redis.crc import key_slot
from redis_helpers import OwnedRedis
from test_multiworker import client_identity, error_of, handshake, send
from worker_helpers import serve_workers

from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.client import ClientSession

CLIENTS = 6
WAIT_ONE = {"A2A_SECURE_REDIS_WAIT_REPLICAS": "1", "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS": "100"}
PROBE = "probe-"  # markers of the wait_replicas test's own requests, outside the load


@dataclass
class Setup:
    urls: list[str]
    server: Identity
    cluster: LocalCluster
    marks: OwnedRedis
    prefix: str


@contextlib.contextmanager
def marking_workers(
    tmp: Path, store_url: str, prefix: str, marks: OwnedRedis, store_env: Mapping[str, str] | None = None
) -> Iterator[tuple[list[str], Identity]]:
    """Two uvicorn processes serving one identity on the store at ``store_url``: (URLs, identity).

    Their ``echo`` counts each execution of a marker in ``marks`` (hash ``marks``);
    ``store_env`` adds settings of their store (``A2A_SECURE_REDIS_WAIT_REPLICAS``…).
    """
    server = Identity.generate("failover-server")
    with serve_workers(
        tmp,
        server,
        {"rate_limit": 100_000, "rate_period": 3600},
        store_url=store_url,
        prefix=prefix,
        app="cluster_helpers:register_marking",
        extra_env={MARKS_URL_ENV: marks.url, MARKS_KEY_ENV: "marks", **(store_env or {})},
    ) as (urls, _procs):
        yield urls, server


def marks_counts(marks: OwnedRedis) -> dict[str, int]:
    """How many times each marker ran."""
    r = redis_sync.Redis.from_url(marks.url, socket_timeout=2.0)
    try:
        return {k.decode(): int(v) for k, v in r.hgetall("marks").items()}
    finally:
        r.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _setup(tmp_path_factory)


@pytest.fixture(scope="module")
def frozen_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """A cluster and workers of their own, for the test that freezes a primary."""
    yield from _setup(tmp_path_factory)


@pytest.fixture(scope="module")
def frozen_wait_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """As ``frozen_setup``, with workers that WAIT for one replica (wait_replicas=1)."""
    yield from _setup(tmp_path_factory, WAIT_ONE)


def _setup(
    tmp_path_factory: pytest.TempPathFactory, store_env: Mapping[str, str] | None = None
) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("failover")
    (tmp / "cluster").mkdir()
    (tmp / "marks").mkdir()
    cluster = LocalCluster(tmp / "cluster")
    marks = OwnedRedis(tmp / "marks")
    try:
        cluster.start()
        marks.start()
        prefix = f"fo:{uuid.uuid4().hex[:8]}:"
        with marking_workers(tmp, cluster.url, prefix, marks, store_env) as (urls, server):
            yield Setup(urls, server, cluster, marks, prefix)
    finally:
        marks.kill()
        cluster.stop()


@dataclass
class Outcomes:
    sent: list[str] = field(default_factory=list)  # markers, in order
    ok: set[str] = field(default_factory=set)  # a verified, signed result came back
    failed: set[str] = field(default_factory=set)  # the client saw only errors
    unavailable: int = 0  # 503 answers, every one with Retry-After
    after_recovery_ok: int = 0
    resumed_at: float | None = None  # the first answer to a request sent after an outage was seen


async def run_client(
    http: httpx.AsyncClient,
    urls: list[str],
    sess: ClientSession,
    name: str,
    out: Outcomes,
    state: dict[str, Any],
) -> None:
    """Intents with markers ``name-1``, ``name-2``… to ``urls`` in turn, until ``state["stop"]``.

    A request answered 503 is retried byte for byte for 3 s, then given up (the client saw
    the error) and the next sequence is used. ``state["outage_seen"]`` is the time of the
    first 503; ``state["recovered"]`` is set by the test once the deployment failed over.
    """
    k = 0
    while not state["stop"]:
        k += 1
        marker = f"{name}-{k}"
        req = sess.prepare_intent({"goal": "echo", "inputs": {"marker": marker}})
        out.sent.append(marker)
        deadline = time.monotonic() + 3.0
        while True:
            sent_at = time.monotonic()
            try:
                resp = await send(http, urls[k % 2], req)
            except httpx.HTTPError:
                resp = None
            if resp is not None and resp.status_code == 200:
                assert sess.verify_result(req, resp.json()["result"]).result == {"marker": marker}
                out.ok.add(marker)
                seen = state.get("outage_seen")
                if out.resumed_at is None and seen is not None and sent_at > seen:
                    out.resumed_at = time.monotonic()
                if state["recovered"]:
                    out.after_recovery_ok += 1
                break
            if resp is not None:
                status, code = error_of(resp)
                assert (status, code) == (503, -32048), resp.text  # nothing else may happen
                assert int(resp.headers["Retry-After"]) >= 1
                out.unavailable += 1
                state.setdefault("outage_seen", time.monotonic())
            if time.monotonic() > deadline:
                out.failed.add(marker)  # given up: the client saw the error
                break
            await asyncio.sleep(0.1)  # sooner than Retry-After, to keep the test short
        await asyncio.sleep(0.01)


async def failover_under_load(
    http: httpx.AsyncClient,
    urls: list[str],
    server_did: str,
    outage: Callable[[list[ClientSession]], Awaitable[None]],
    counts: Callable[[], dict[str, int]],
) -> str:
    """Clients under load while ``outage`` kills a primary and waits for the failover; checks.

    Returns a line of measurements: from the kill to the failover, to the first answer
    again, to every client answered again; intents answered, given up, 503 answers.
    """
    sessions = [await handshake(http, urls, client_identity(f"fo{i}"), server_did) for i in range(CLIENTS)]
    outs = [Outcomes() for _ in sessions]
    state: dict[str, Any] = {"stop": False, "recovered": False}
    tasks = [
        asyncio.create_task(run_client(http, urls, s, f"c{i}", o, state))
        for i, (s, o) in enumerate(zip(sessions, outs, strict=True))
    ]
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    await outage(sessions)
    failed_over = time.monotonic() - killed_at
    await asyncio.sleep(0.5)
    state["recovered"] = True
    # A request whose sequence the dead primary consumed without an answer stays "in
    # progress" (503) until its client gives up on it and moves to the next sequence:
    # wait until every client has been served again, for a bounded time.
    await asyncio.sleep(1.0)
    for _ in range(100):  # at most 10 s more
        if all(o.after_recovery_ok for o in outs):
            break
        await asyncio.sleep(0.1)
    state["stop"] = True
    await asyncio.gather(*tasks)

    done = counts()
    sent = [m for o in outs for m in o.sent]
    # No intent ran twice.
    assert all(n == 1 for n in done.values()), {m: n for m, n in done.items() if n != 1}
    assert sum(o.unavailable for o in outs) > 0  # the outage was seen, as 503 + Retry-After
    for o in outs:
        # None lost silently: every intent got its result or the client saw the error.
        assert o.ok | o.failed == set(o.sent) and not (o.ok & o.failed)
        # A result means it ran (once).
        assert all(done.get(m) == 1 for m in o.ok)
        # Service resumed for every client after the replica took over.
        assert o.after_recovery_ok > 0 and o.resumed_at is not None
    assert set(done) <= set(sent)

    # Both processes agree on every session's sequence state after the failover.
    a, b = urls
    for sess in sessions:
        first = sess.prepare_intent({"goal": "echo", "inputs": {"marker": f"final-{sess.session_id}"}})
        resp = await send(http, a, first)
        assert resp.status_code == 200, resp.text
        again = await send(http, b, first)  # the retry at the other process: the stored answer
        assert again.status_code == 200 and again.json()["result"] == resp.json()["result"]
        sess.last_sequence -= 1
        older = sess.prepare_intent({"goal": "echo", "inputs": {"marker": "stale"}})
        assert error_of(await send(http, b, older)) == (409, -32044)
    done = counts()
    assert "stale" not in done and all(n == 1 for n in done.values())
    resumed = [o.resumed_at - killed_at for o in outs if o.resumed_at is not None]
    return (
        f"failed over {failed_over:.1f} s after the kill, first answer again after "
        f"{min(resumed):.1f} s, every client answered again after {max(resumed):.1f} s; "
        f"{len(sent)} intents, {sum(len(o.ok) for o in outs)} answered, "
        f"{sum(len(o.failed) for o in outs)} given up, {sum(o.unavailable for o in outs)} answers 503"
    )


async def test_failover_under_load(setup: Setup) -> None:
    async def kill_the_first_sessions_primary(sessions: list[ClientSession]) -> None:
        victim_slot = key_slot(f"{setup.prefix}{{s:{sessions[0].session_id}}}".encode())
        victim = setup.cluster.primary_of_slot(victim_slot)
        setup.cluster.kill(victim)
        await asyncio.to_thread(setup.cluster.wait_ok, 20.0)
        assert setup.cluster.primary_of_slot(victim_slot) != victim

    async with httpx.AsyncClient(timeout=10) as http:
        report = await failover_under_load(
            http,
            setup.urls,
            setup.server.did,
            kill_the_first_sessions_primary,
            functools.partial(marks_counts, setup.marks),
        )
        print(f"cluster failover: {report}")


async def test_frozen_primary_resumed_after_the_failover(frozen_setup: Setup) -> None:
    """SIGSTOP a primary until its replica takes over, then SIGCONT it.

    The old primary comes back sure that it still serves its slots; gossip tells it at once
    that a newer epoch owns them, and it follows the promoted replica (cluster-node-timeout
    1 s: the failover takes about 2 s). The same run and checks as for a kill: no marker
    runs twice, 503 + Retry-After during the outage, service again for every client, and
    both processes agree on every session afterwards.
    """
    setup = frozen_setup

    async def freeze_the_first_sessions_primary(sessions: list[ClientSession]) -> None:
        await freeze_until_failed_over(setup, session_slot(setup, sessions[0]))

    async with httpx.AsyncClient(timeout=10) as http:
        report = await failover_under_load(
            http,
            setup.urls,
            setup.server.did,
            freeze_the_first_sessions_primary,
            functools.partial(marks_counts, setup.marks),
        )
        print(f"cluster frozen primary: {report}")


def session_slot(setup: Setup, sess: ClientSession) -> int:
    """The slot of the session's key (its sequence state) in the cluster."""
    return key_slot(f"{setup.prefix}{{s:{sess.session_id}}}".encode())


async def freeze_until_failed_over(
    setup: Setup, slot: int, while_frozen: Callable[[], Awaitable[None]] | None = None
) -> None:
    """SIGSTOP the primary of ``slot`` until its replica serves it, run ``while_frozen``, SIGCONT.

    Returns once the old primary is back as a replica of the node that took its slots, in sync.
    """
    victim = setup.cluster.primary_of_slot(slot)
    setup.cluster.freeze(victim)
    try:
        # The others still say "ok" until they mark it failed: wait for its slots to move.
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(AssertionError):  # no primary for a moment
                if setup.cluster.primary_of_slot(slot) != victim:
                    break
            assert time.monotonic() < deadline, "the frozen primary's replica did not take over"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(setup.cluster.wait_ok, 20.0)
        if while_frozen is not None:
            await while_frozen()
    finally:
        setup.cluster.thaw(victim)
    # cluster_state is "ok" again at once: wait for the old primary to be a replica, synced.
    await asyncio.to_thread(setup.cluster.wait_replica_in_sync, victim, 20.0)
    await asyncio.to_thread(setup.cluster.wait_ok, 20.0)
    assert victim not in setup.cluster.primaries()


async def test_frozen_primary_with_wait_replicas(frozen_wait_setup: Setup) -> None:
    """The frozen-primary run with workers started with ``A2A_SECURE_REDIS_WAIT_REPLICAS=1``.

    Each primary has one replica, so the promoted replica has none until the old primary,
    thawed, has synced from it. SECURITY.md ("Replication is asynchronous"): an intent runs
    only once a replica holds its consumed sequence, so in that window a request to the
    victim's slots is refused with 503 + Retry-After before it runs, and on a cluster its
    sequence is given back: the same bytes sent again once a replica is back run, once.
    Checked with a probe session of its own on the victim's slots, besides the load's checks
    (no marker runs twice, 503 then service again for every client, both workers agree).
    """
    setup = frozen_wait_setup
    a, b = setup.urls
    async with httpx.AsyncClient(timeout=10) as http:

        async def freeze_with_a_probe(sessions: list[ClientSession]) -> None:
            slot = session_slot(setup, sessions[0])
            victim = setup.cluster.primary_of_slot(slot)
            for i in range(50):  # a session whose sequence state is on the victim
                probe = await handshake(http, [a], client_identity(f"probe{i}"), setup.server.did)
                if setup.cluster.primary_of_slot(session_slot(setup, probe)) == victim:
                    break
            else:
                raise AssertionError("no probe session on the victim's slots")
            before = probe.prepare_intent({"goal": "echo", "inputs": {"marker": f"{PROBE}before"}})
            resp = await send(http, a, before)  # a replica acknowledges: it runs
            assert resp.status_code == 200, resp.text
            refused = probe.prepare_intent({"goal": "echo", "inputs": {"marker": f"{PROBE}refused"}})
            refusals = 0

            async def probe_while_the_promoted_replica_has_none() -> None:
                nonlocal refusals
                # The replica took over; the old primary is still frozen. For 1.5 s, on
                # both workers, the same request bytes: never run, always 503.
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline:
                    for url in (a, b):
                        resp = await send(http, url, refused)
                        assert error_of(resp) == (503, -32048), resp.text
                        assert int(resp.headers["Retry-After"]) >= 1
                        refusals += 1
                    await asyncio.sleep(0.1)

            await freeze_until_failed_over(setup, slot, probe_while_the_promoted_replica_has_none)
            assert refusals > 0
            probed = marks_counts(setup.marks)
            assert probed.get(f"{PROBE}before") == 1 and f"{PROBE}refused" not in probed, probed
            # The old primary is a replica again: the same bytes run now (a worker may
            # still answer 503 for a moment, until it has read the new slot map), once.
            deadline = time.monotonic() + 5
            while (resp := await send(http, b, refused)).status_code != 200:
                assert error_of(resp) == (503, -32048), resp.text
                assert time.monotonic() < deadline, "the refused request never ran"
                await asyncio.sleep(0.1)
            assert probe.verify_result(refused, resp.json()["result"]).result == {"marker": f"{PROBE}refused"}
            again = await send(http, a, refused)
            assert again.status_code == 200 and again.json()["result"] == resp.json()["result"]
            assert marks_counts(setup.marks).get(f"{PROBE}refused") == 1

        def load_counts() -> dict[str, int]:
            return {m: n for m, n in marks_counts(setup.marks).items() if not m.startswith(PROBE)}

        report = await failover_under_load(
            http, setup.urls, setup.server.did, freeze_with_a_probe, load_counts
        )
        print(f"cluster frozen primary, wait_replicas=1: {report}")
    assert all(n == 1 for n in marks_counts(setup.marks).values())
