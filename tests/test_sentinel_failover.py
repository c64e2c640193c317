"""The primary dies (SIGKILL) under load behind Sentinel: 503 with Retry-After, then service again.

Two uvicorn processes serve one identity through
``A2A_SECURE_REDIS_URL=redis+sentinel://…/a2a`` on a Sentinel deployment of their own (a
primary, one replica, three sentinels, quorum 2, ``down-after-milliseconds`` 1000;
tests/sentinel_helpers.py). Six clients send intents with a unique marker each to both
processes in turn, and the primary is killed mid-run; the run and its checks are those of
the cluster (test_cluster_failover.py): no marker runs twice, every intent is answered or
its client saw the error, service resumes on the promoted replica without a restart, and
both processes agree on every session afterwards.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from redis_helpers import OwnedRedis
from sentinel_helpers import LocalSentinel
from test_cluster_failover import failover_under_load, marking_workers, marks_counts

from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.client import ClientSession


@dataclass
class Setup:
    urls: list[str]
    server: Identity
    sentinels: LocalSentinel
    marks: OwnedRedis


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("sentinel-failover")
    (tmp / "sentinel").mkdir()
    (tmp / "marks").mkdir()
    sentinels = LocalSentinel(tmp / "sentinel")
    marks = OwnedRedis(tmp / "marks")
    try:
        sentinels.start()
        marks.start()
        with marking_workers(tmp, sentinels.url, "fo:", marks) as (urls, server):
            yield Setup(urls, server, sentinels, marks)
    finally:
        marks.kill()
        sentinels.stop()


async def test_sentinel_failover_under_load(setup: Setup) -> None:
    async def kill_the_primary(sessions: list[ClientSession]) -> None:
        victim = setup.sentinels.primary()
        assert victim == setup.sentinels.first_primary
        setup.sentinels.kill(victim)
        promoted = await asyncio.to_thread(setup.sentinels.wait_failover, victim, 20.0)
        assert promoted != victim

    async with httpx.AsyncClient(timeout=10) as http:
        report = await failover_under_load(
            http,
            setup.urls,
            setup.server.did,
            kill_the_primary,
            functools.partial(marks_counts, setup.marks),
        )
        print(f"sentinel failover: {report}")
