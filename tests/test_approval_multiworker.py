"""Approval across two server processes sharing one Redis: asked on one, approved on the other.

Two ``uvicorn --factory a2a_secure.server.run:app_from_env`` processes with one key file and
one Redis key prefix serve ``approval_helpers:register_desk``: ``create_event`` answers
``NeedsApproval``, and its executor INCRs a Redis key, so runs are counted across processes.
The person's key is another DID than the caller's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis as redis_sync
from approval_helpers import APPROVER_ENV, RUNS_KEY_ENV, RUNS_URL_ENV
from redis_helpers import OwnedRedis
from test_multiworker import client_identity, error_of, handshake, send
from worker_helpers import serve_workers

from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.client import ClientSession


@dataclass
class Pair:
    urls: list[str]
    server: Identity
    person: Identity
    redis: OwnedRedis
    runs_key: str

    def runs(self) -> int:
        r = redis_sync.Redis.from_url(self.redis.url, socket_timeout=2.0)
        try:
            return int(r.get(self.runs_key) or 0)
        finally:
            r.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("approval-multiworker")
    owned = OwnedRedis(tmp)
    owned.start()
    try:
        server = Identity.generate("desk")
        person = Identity.generate("person")
        prefix = f"apmw:{uuid.uuid4().hex}:"
        with serve_workers(
            tmp,
            server,
            {"rate_limit": 10_000, "rate_period": 3600},
            store_url=owned.url,
            prefix=prefix,
            app="approval_helpers:register_desk",
            extra_env={APPROVER_ENV: person.did, RUNS_URL_ENV: owned.url, RUNS_KEY_ENV: prefix + "runs"},
        ) as (urls, _procs):
            yield Pair(urls, server, person, owned, prefix + "runs")
    finally:
        owned.kill()


async def ask(http: httpx.AsyncClient, url: str, sess: ClientSession, title: str) -> dict[str, Any]:
    req = sess.prepare_intent({"goal": "create_event", "inputs": {"title": title}})
    resp = await send(http, url, req)
    assert resp.status_code == 200, resp.text
    result = sess.verify_result(req, resp.json()["result"]).result
    assert result["needs_approval"] is True
    assert result["action_hash"] == encoding.hash_of({"title": title})
    return dict(result)


def approval(sess: ClientSession, created: dict[str, Any]) -> Any:
    inputs = {"action_id": created["action_id"], "action_hash": created["action_hash"], "approved": True}
    return sess.prepare_intent({"goal": "tool.approve", "inputs": inputs})


async def test_asked_on_one_worker_approved_on_the_other_runs_once(pair: Pair) -> None:
    a, b = pair.urls
    async with httpx.AsyncClient(timeout=15) as http:
        caller = await handshake(http, [a], client_identity("caller"), pair.server.did)
        person = await handshake(http, [b], pair.person, pair.server.did)
        before = pair.runs()
        created = await ask(http, a, caller, "cross")
        # The person reads it on B: the action is in the shared store.
        req = person.prepare_intent({"goal": "tool.pending", "inputs": {"action_id": created["action_id"]}})
        resp = await send(http, b, req)
        assert resp.status_code == 200, resp.text
        assert person.verify_result(req, resp.json()["result"]).result["state"] == "pending"
        req = approval(person, created)
        resp = await send(http, b, req)
        assert resp.status_code == 200, resp.text
        answer = person.verify_result(req, resp.json()["result"]).result
        assert answer["result"]["created"] == {"title": "cross"}
        assert pair.runs() == before + 1
        # Approved again, on A this time: refused, signed, and no second run.
        person_a = await handshake(http, [a], pair.person, pair.server.did)
        again = approval(person_a, created)
        resp = await send(http, a, again)
        assert error_of(resp) == (409, -32050)
        assert person_a.error_from_reply(again, resp.json()["error"]).signed
        assert pair.runs() == before + 1


async def test_concurrent_approvals_on_both_workers_run_once(pair: Pair) -> None:
    a, b = pair.urls
    async with httpx.AsyncClient(timeout=15) as http:
        caller = await handshake(http, [a, b], client_identity("caller"), pair.server.did)
        on_a = await handshake(http, [a], pair.person, pair.server.did)
        on_b = await handshake(http, [b], pair.person, pair.server.did)
        before = pair.runs()
        rounds = 8
        for i in range(rounds):
            created = await ask(http, (a, b)[i % 2], caller, f"race {i}")
            req_a, req_b = approval(on_a, created), approval(on_b, created)
            resp_a, resp_b = await asyncio.gather(send(http, a, req_a), send(http, b, req_b))
            statuses = sorted([resp_a.status_code, resp_b.status_code])
            assert statuses == [200, 409], (resp_a.text, resp_b.text)
            loser, loser_sess, loser_req = (
                (resp_b, on_b, req_b) if resp_a.status_code == 200 else (resp_a, on_a, req_a)
            )
            assert loser.json()["error"]["code"] == -32050
            assert loser_sess.error_from_reply(loser_req, loser.json()["error"]).signed
        assert pair.runs() == before + rounds
