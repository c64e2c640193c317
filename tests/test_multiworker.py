"""Two server processes, one identity, one Redis: the state is shared, each intent runs once.

Two ``python -m uvicorn --factory a2a_secure.server.run:app_from_env`` processes on two ports
share one key file and one Redis key prefix (a ``redis-server`` owned by this module, with
an fsync'd append-only file so that it can be killed and restarted without losing state).
Their app (``A2A_SECURE_APP=redis_helpers:register_counting``) serves ``echo`` and INCRs a
Redis key per execution, so executions are counted across processes.

Every test uses its own client identity, hence its own rate counter.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from redis_helpers import COUNTER_KEY_ENV, COUNTER_URL_ENV, OwnedRedis, free_port
from worker_helpers import TESTS_DIR, serve_workers, stop_group, wait_healthy

from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest

JSON = {"Content-Type": "application/json"}
RATE_LIMIT = 8
_ids = itertools.count(1)


@dataclass
class Cluster:
    urls: list[str]
    server: Identity
    redis: OwnedRedis
    counter_key: str
    procs: list[subprocess.Popen[bytes]]

    def count(self) -> int:
        r = redis_sync.Redis.from_url(self.redis.url, socket_timeout=2.0)
        try:
            return int(r.get(self.counter_key) or 0)
        finally:
            r.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from _cluster(tmp_path_factory, RATE_LIMIT)


@pytest.fixture(scope="module")
def busy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two processes whose policy lets one DID send hundreds of requests."""
    yield from _cluster(tmp_path_factory, 1000)


def _cluster(tmp_path_factory: pytest.TempPathFactory, rate_limit: int) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("multiworker")
    owned = OwnedRedis(tmp, persist=True)
    owned.start()
    try:
        server = Identity.generate("mw-server")
        prefix = f"mw:{uuid.uuid4().hex}:"
        with serve_workers(
            tmp,
            server,
            {"rate_limit": rate_limit, "rate_period": 3600},
            store_url=owned.url,
            prefix=prefix,
            app="redis_helpers:register_counting",
            extra_env={COUNTER_URL_ENV: owned.url, COUNTER_KEY_ENV: prefix + "executions"},
        ) as (urls, procs):
            yield Cluster(urls, server, owned, prefix + "executions", procs)
    finally:
        owned.kill()


# -- a raw client ---------------------------------------------------------------------------------
def envelope(method: str, params: Any) -> bytes:
    return encoding.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": next(_ids)})


async def post(http: httpx.AsyncClient, url: str, path: str, method: str, params: Any) -> httpx.Response:
    return await http.post(url + path, content=envelope(method, params), headers=JSON)


async def handshake(
    http: httpx.AsyncClient, urls: list[str], client: Identity, server_did: str
) -> ClientSession:
    """HELLO, PROOF and ACCEPT_POLICY, each to the next URL of ``urls`` (cycled)."""
    hs = ClientHandshake(client, resolve_did_key(server_did))
    msg = hs.hello()
    targets = itertools.cycle(urls)
    for method in ("hello", "proof", "accept_policy"):
        resp = await post(http, next(targets), "/a2a/handshake", method, msg)
        assert resp.status_code == 200, resp.text
        result = resp.json()["result"]
        if method == "hello":
            msg = hs.receive_challenge(result)
        elif method == "proof":
            msg = hs.receive_policy(result)
        else:
            return hs.receive_session(result)
    raise AssertionError("unreachable")


async def send(http: httpx.AsyncClient, url: str, req: PreparedRequest) -> httpx.Response:
    return await post(http, url, "/a2a/intent", req.method, req.params)


def error_of(resp: httpx.Response) -> tuple[int, int]:
    body = resp.json()
    assert "error" in body, body
    return resp.status_code, body["error"]["code"]


def client_identity(name: str) -> Identity:
    return Identity.generate(f"{name}-{uuid.uuid4().hex[:8]}")


# -- tests ----------------------------------------------------------------------------------------------
async def test_session_opened_on_one_is_used_on_the_other(cluster: Cluster) -> None:
    a, b = cluster.urls
    async with httpx.AsyncClient(timeout=10) as http:
        # The handshake itself hops between processes: HELLO on A, PROOF on B, ACCEPT on A.
        sess = await handshake(http, [a, b], client_identity("shared"), cluster.server.did)
        for i, url in enumerate([b, a, b]):
            req = sess.prepare_intent({"goal": "echo", "inputs": {"i": i}})
            resp = await send(http, url, req)
            assert resp.status_code == 200, resp.text
            assert sess.verify_result(req, resp.json()["result"]).result == {"i": i}


async def test_sequence_accepted_on_one_is_a_replay_on_the_other(cluster: Cluster) -> None:
    a, b = cluster.urls
    async with httpx.AsyncClient(timeout=10) as http:
        sess = await handshake(http, [a], client_identity("replay"), cluster.server.did)
        first = sess.prepare_intent({"goal": "echo", "inputs": {"n": 1}})
        resp = await send(http, a, first)
        assert resp.status_code == 200, resp.text
        before = cluster.count()
        # Another request with the same sequence, on the other process: -32044, signed.
        sess.last_sequence = 0
        other = sess.prepare_intent({"goal": "echo", "inputs": {"n": 2}})
        assert other.sequence == first.sequence
        resp = await send(http, b, other)
        assert error_of(resp) == (409, -32044)
        err = sess.error_from_reply(other, resp.json()["error"])
        assert err.signed
        # The byte-identical retry on the other process gets the stored answer, not a re-run.
        resp_retry = await send(http, b, first)
        assert resp_retry.status_code == 200
        assert resp_retry.json()["result"] == (await send(http, a, first)).json()["result"]
        assert cluster.count() == before


async def test_rate_limit_counts_across_processes(cluster: Cluster) -> None:
    a, b = cluster.urls
    async with httpx.AsyncClient(timeout=10) as http:
        client = client_identity("rate")
        s1 = await handshake(http, [a], client, cluster.server.did)
        s2 = await handshake(http, [b], client, cluster.server.did)  # the limit is per DID
        for i in range(RATE_LIMIT):
            sess, url = (s1, a) if i % 2 else (s2, b)
            resp = await send(http, url, sess.prepare_intent({"goal": "echo", "inputs": {"i": i}}))
            assert resp.status_code == 200, (i, resp.text)
        for sess, url in ((s1, a), (s2, b), (s1, b)):
            req = sess.prepare_intent({"goal": "echo", "inputs": {}})
            resp = await send(http, url, req)
            assert error_of(resp) == (503, -32048)
            assert int(resp.headers["Retry-After"]) >= 1
            assert sess.error_from_reply(req, resp.json()["error"]).signed


async def test_close_on_one_ends_the_session_on_both(cluster: Cluster) -> None:
    a, b = cluster.urls
    async with httpx.AsyncClient(timeout=10) as http:
        sess = await handshake(http, [a], client_identity("close"), cluster.server.did)
        for url in (a, b):  # both processes have seen (and cached) the session
            req = sess.prepare_intent({"goal": "echo", "inputs": {}})
            assert (await send(http, url, req)).status_code == 200
        close = sess.prepare_close()
        resp = await send(http, a, close)
        assert resp.status_code == 200, resp.text
        sess.verify_closed(close, resp.json()["result"])
        sess.closed = False  # keep signing, to probe the server
        for url in (b, a):
            resp = await send(http, url, sess.prepare_intent({"goal": "echo", "inputs": {}}))
            assert error_of(resp) == (401, -32043)
        assert error_of(await send(http, b, close)) == (401, -32043)  # a retried close too


async def test_50_identical_retries_over_both_run_once(cluster: Cluster) -> None:
    a, b = cluster.urls
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=15, limits=limits) as http:
        sess = await handshake(http, [a, b], client_identity("retries"), cluster.server.did)
        before = cluster.count()
        # The handler sleeps 0.3 s: most copies arrive while the original still runs.
        req = sess.prepare_intent({"goal": "echo", "inputs": {"sleep": 0.3, "tag": "once"}})
        resps = await asyncio.gather(*(send(http, (a, b)[i % 2], req) for i in range(50)))
        assert [r.status_code for r in resps] == [200] * 50, [r.text for r in resps if r.status_code != 200]
        results = [r.json()["result"] for r in resps]
        assert all(r == results[0] for r in results)  # the same signed response, byte for byte
        assert sess.verify_result(req, results[0]).result == {"sleep": 0.3, "tag": "once"}
        assert cluster.count() == before + 1


async def test_redis_outage_answers_503_then_recovers(cluster: Cluster) -> None:
    a, b = cluster.urls
    async with httpx.AsyncClient(timeout=15) as http:
        client = client_identity("outage")
        sess = await handshake(http, [a], client, cluster.server.did)
        fresh = ClientHandshake(client, resolve_did_key(cluster.server.did))
        before = cluster.count()
        for url in (a, b):
            resp = await send(http, url, sess.prepare_intent({"goal": "echo", "inputs": {"url": url}}))
            assert resp.status_code == 200
        pending = sess.prepare_intent({"goal": "echo", "inputs": {"during": "outage"}})

        cluster.redis.kill()
        try:
            for url in (a, b, a):
                resp = await send(http, url, pending)
                assert error_of(resp) == (503, -32048), resp.text
                assert resp.headers["Retry-After"] == "1"
                assert resp.json()["error"]["data"]["retry_after"] == 1
            resp = await post(http, b, "/a2a/handshake", "hello", fresh.hello())
            assert error_of(resp) == (503, -32048)
            assert resp.headers["Retry-After"] == "1"
        finally:
            cluster.redis.start()  # same port, same append-only file: the state is back

        # The very request refused during the outage now runs, once; its retry is a replay.
        resp = await send(http, b, pending)
        assert resp.status_code == 200, resp.text
        assert sess.verify_result(pending, resp.json()["result"]).result == {"during": "outage"}
        assert (await send(http, a, pending)).json()["result"] == resp.json()["result"]
        nxt = sess.prepare_intent({"goal": "echo", "inputs": {"after": True}})
        assert (await send(http, a, nxt)).status_code == 200
        assert cluster.count() == before + 4
        # Handshakes work again too.
        await handshake(http, [b, a], client, cluster.server.did)


# -- a2a_secure.server.run without Redis ------------------------------------------------------------
RUN_SERVER_ID = Identity.from_seed(bytes(range(32)), "run-app")


def register_upper(server: Any) -> None:
    """An ``A2A_SECURE_APP`` callable target."""

    @server.intent("upper")
    def upper(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"text": str(inputs.get("text", "")).upper()}


def register_pid(server: Any) -> None:
    """``pid``: which worker process ran the intent."""

    @server.intent("pid")
    async def pid(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid()}


def _app_server() -> Any:
    from a2a_secure.server.app import AgentServer

    server = AgentServer(RUN_SERVER_ID, name="from-instance", description="an AgentServer instance")
    register_upper(server)
    return server


APP_SERVER = _app_server()


def test_serve_refuses_workers_without_redis(tmp_path: Path) -> None:
    from a2a_secure.server.run import WORKERS_NEED_REDIS, serve

    key_file = tmp_path / "k.key"
    RUN_SERVER_ID.save(key_file)
    with pytest.raises(ValueError, match="--workers > 1 needs --redis-url") as info:
        serve(key_file, workers=2)
    assert str(info.value) == WORKERS_NEED_REDIS
    with pytest.raises(ValueError, match="go together"):
        serve(key_file, tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="at least 1"):
        serve(key_file, workers=0)


def test_app_from_env_refuses_bad_settings(tmp_path: Path) -> None:
    from a2a_secure.errors import A2AError
    from a2a_secure.server.run import app_from_env

    key_file = tmp_path / "k.key"
    RUN_SERVER_ID.save(key_file)
    with pytest.raises(ValueError, match="A2A_SECURE_KEY_FILE"):
        app_from_env({})
    with pytest.raises(A2AError):
        app_from_env({"A2A_SECURE_KEY_FILE": str(tmp_path / "missing.key")})
    with pytest.raises(ValueError, match="module:attribute"):
        app_from_env({"A2A_SECURE_KEY_FILE": str(key_file), "A2A_SECURE_APP": "no_colon"})
    other = tmp_path / "other.key"
    Identity.generate("other").save(other)
    with pytest.raises(ValueError, match="DID"):
        app_from_env({"A2A_SECURE_KEY_FILE": str(other), "A2A_SECURE_APP": "test_multiworker:APP_SERVER"})
    bad_policy = tmp_path / "policy.json"
    bad_policy.write_text("[]")
    with pytest.raises(ValueError, match="one JSON object"):
        app_from_env({"A2A_SECURE_KEY_FILE": str(key_file), "A2A_SECURE_POLICY": str(bad_policy)})


@pytest.mark.parametrize(
    ("app", "goals", "goal", "inputs", "expected"),
    [
        # No app: the test agent of PROTOCOL.md §11 (echo, and the streaming count).
        (
            None,
            ["count", "echo"],
            "echo",
            {"text": "hi", "n": [1, 2.5, None]},
            {"text": "hi", "n": [1, 2.5, None]},
        ),
        ("test_multiworker:register_upper", ["upper"], "upper", {"text": "hi"}, {"text": "HI"}),
        ("test_multiworker:APP_SERVER", ["upper"], "upper", {"text": "ho"}, {"text": "HO"}),
    ],
)
async def test_app_from_env_serves(
    tmp_path: Path, app: str | None, goals: list[str], goal: str, inputs: dict[str, Any], expected: Any
) -> None:
    from a2a_secure.audit import verify_chain
    from a2a_secure.server.run import app_from_env
    from a2a_secure.testing import serve_app

    key_file = tmp_path / "k.key"
    RUN_SERVER_ID.save(key_file)
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"rate_limit": 3}))
    audit = tmp_path / "audit.jsonl"
    env = {
        "A2A_SECURE_KEY_FILE": str(key_file),
        "A2A_SECURE_POLICY": str(policy_file),
        "A2A_SECURE_AUDIT_LOG": str(audit),
    }
    if app:
        env["A2A_SECURE_APP"] = app
    fastapi_app = app_from_env(env)
    server = fastapi_app.state.agent_server
    assert server.goals == goals
    async with serve_app(fastapi_app, lifespan="on") as url, httpx.AsyncClient(timeout=10) as http:
        card = (await http.get(url + "/.well-known/agent-card.json")).json()
        assert card["intents"] == goals
        sess = await handshake(http, [url], client_identity("run"), RUN_SERVER_ID.did)
        assert sess.policy.rate_limit == 3
        req = sess.prepare_intent({"goal": goal, "inputs": inputs})
        resp = await send(http, url, req)
        assert resp.status_code == 200, resp.text
        assert sess.verify_result(req, resp.json()["result"]).result == expected
    # The lifespan closed the audit log: it holds every step and verifies.
    lines = audit.read_text().splitlines()
    assert [json.loads(line).get("event") for line in lines][:4] == [
        "hello",
        "proof",
        "accept_policy",
        "intent",
    ]
    assert verify_chain(audit, public_key=RUN_SERVER_ID.public_key, kid=RUN_SERVER_ID.kid).ok


def _run_python(code: str, log: Path) -> subprocess.Popen[bytes]:
    """``python -c code`` in its own process group, with ``tests/`` importable."""
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": path},
        )


async def test_serve_with_two_uvicorn_workers(cluster: Cluster, tmp_path: Path) -> None:
    """``serve(workers=2, redis_url=...)`` end to end: one port, two worker processes."""

    key_file = tmp_path / "k.key"
    RUN_SERVER_ID.save(key_file)
    port = free_port()
    code = (
        "from a2a_secure.server.run import serve; "
        f"serve({str(key_file)!r}, port={port}, workers=2, redis_url={cluster.redis.url!r}, "
        f"redis_prefix={'serve:' + uuid.uuid4().hex + ':'!r}, app='test_multiworker:register_pid', "
        "log_level='warning')"
    )
    log = tmp_path / "serve.log"
    proc = _run_python(code, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, RUN_SERVER_ID.did)
        pids: set[int] = set()
        async with httpx.AsyncClient(timeout=10) as http:
            sess = await handshake(http, [url], client_identity("serve"), RUN_SERVER_ID.did)
        # New connections land on either worker; the session works on all of them.
        for _ in range(60):
            if len(pids) == 2:
                break
            async with httpx.AsyncClient(timeout=10) as http:
                req = sess.prepare_intent({"goal": "pid", "inputs": {}})
                resp = await send(http, url, req)
                assert resp.status_code == 200, resp.text
                pids.add(sess.verify_result(req, resp.json()["result"]).result["pid"])
        assert len(pids) == 2, pids  # both workers served the one session
        assert proc.pid not in pids
    finally:
        stop_group(proc)


async def test_revoked_did_session_is_refused_on_the_other_worker_at_once(cluster: Cluster) -> None:
    a, b = cluster.urls
    prefix = cluster.counter_key[: -len("executions")]
    client = client_identity("revoked")
    async with httpx.AsyncClient(timeout=10) as http:
        sess = await handshake(http, [a], client, cluster.server.did)
        req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 1}})
        assert (await send(http, a, req)).status_code == 200
        req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 2}})
        assert (await send(http, b, req)).status_code == 200  # both workers know it now
        executed = cluster.count()
        # Revoked through the shared store, as an operator does it.
        argv = [
            sys.executable, "-m", "a2a_secure", "revoke", client.did, "--reason", "leaked",
            "--redis-url", cluster.redis.url, "--redis-prefix", prefix,
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, stderr
        # The very next intent, on either worker, ends the session without running.
        req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 3}})
        resp = await send(http, b, req)
        assert error_of(resp) == (401, -32043)
        assert "revoked" in resp.json()["error"]["message"]
        req = sess.prepare_intent({"goal": "echo", "inputs": {"i": 4}})
        assert error_of(await send(http, a, req)) == (401, -32043)
        assert cluster.count() == executed
        # And no new handshake on any worker.
        for url in (a, b):
            hs = ClientHandshake(client, resolve_did_key(cluster.server.did))
            resp = await post(http, url, "/a2a/handshake", "hello", hs.hello())
            assert error_of(resp) == (401, -32040)
            assert resp.json()["error"]["message"] == f"DID revoked: {client.did}"


# -- the intent_id extension across both processes ----------------------------------------------------
async def test_50_concurrent_resends_with_one_intent_id_run_once(busy_cluster: Cluster) -> None:
    """50 requests of one intent with one intent_id, each on its own session (so with its own
    sequence and request hash), half to each process, all at once: one run, and every one
    gets that run's result (a "still running" 503 is resolved by its byte-identical retry)."""
    cluster = busy_cluster
    a, b = cluster.urls
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    client = client_identity("resend")
    async with httpx.AsyncClient(timeout=15, limits=limits) as http:
        sessions = await asyncio.gather(
            *(handshake(http, [(a, b)[i % 2]], client, cluster.server.did) for i in range(50))
        )
        before = cluster.count()
        intent = {"goal": "echo", "inputs": {"sleep": 0.3, "tag": "one-id"}, "intent_id": "R" * 22}
        reqs = [s.prepare_intent(intent) for s in sessions]
        assert len({r.request_hash for r in reqs}) == 50

        async def until_answered(i: int) -> Any:
            for _ in range(40):
                resp = await send(http, (a, b)[(i + 1) % 2], reqs[i])
                if resp.status_code != 503:
                    break
                assert resp.json()["error"]["code"] == -32048
                await asyncio.sleep(0.1)
            assert resp.status_code == 200, resp.text
            return sessions[i].verify_result(reqs[i], resp.json()["result"])

        results = await asyncio.gather(*(until_answered(i) for i in range(50)))
        assert cluster.count() == before + 1
        assert all(r.result == {"sleep": 0.3, "tag": "one-id"} for r in results)
        assert all(r.intent_id == "R" * 22 for r in results)
