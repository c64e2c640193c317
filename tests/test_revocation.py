"""Revocation: a revoked DID or key id cannot start a handshake, and its live sessions end.

Real servers on 127.0.0.1 (``serve_env``) and the real stores: MemoryStore, RedisStore and
the file-backed list. The two-worker case is in test_multiworker.py.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_helpers import delete_prefix as delete_cluster_prefix
from http_helpers import JSON, AuditLog, build_server, envelope, identity, open_env, serve_env
from redis_helpers import redis_prefix, redis_url  # noqa: F401
from test_store_redis import CLIENT, T0, open_one

from a2a_secure.cli import main
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.store.base import BeginKind, Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.redis import RedisStore
from a2a_secure.store.revocation import FileRevocations, Revocation, StoreRevocations, check_target
from a2a_secure.testing import serve_app

OTHER_DID = "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"


async def hello_error(http: httpx.AsyncClient, url: str, client: Any, server_did: str) -> dict[str, Any]:
    hs = ClientHandshake(client, resolve_did_key(server_did))
    resp = await http.post(url + "/a2a/handshake", content=envelope("hello", hs.hello()), headers=JSON)
    assert resp.status_code == 401, resp.text
    return resp.json()["error"]  # type: ignore[no-any-return]


# -- the HTTP server with the in-process store --------------------------------------------------------
async def test_revoked_did_session_ends_at_its_next_intent_and_hello_is_refused() -> None:
    async with serve_env(client=identity("revoked-client")) as env:
        await env.honest(n=1)
        revocations = StoreRevocations(env.store)
        assert await revocations.revoke(env.client.did, reason="key leaked")
        before = env.calls["echo"]
        req = env.prepare(n=2)
        resp = await env.send(req)
        assert resp.status_code == 401
        err = resp.json()["error"]
        assert err["code"] == -32043 and "revoked" in err["message"]
        assert env.calls["echo"] == before  # not run
        # The session is gone for good: a retry is -32043 too.
        assert (await env.send(req)).json()["error"]["code"] == -32043
        err = await hello_error(env.http, env.url, env.client, env.server.identity.did)
        assert err["code"] == -32040 and err["message"] == f"DID revoked: {env.client.did}"
        assert any(r["event"] == "hello" and r["error_code"] == -32040 for r in env.audit)
        assert any(r["event"] == "intent" and r["error_code"] == -32043 for r in env.audit)
        # Undone: a new handshake works again.
        assert await revocations.unrevoke(env.client.did)
        again = await open_env(env.server, env.url, env.http, client=env.client)
        env.session = again.session
        await env.honest(n=3)


async def test_revoked_kid_refuses_that_key_only() -> None:
    async with serve_env(client=identity("kid-client")) as env:
        other = identity("unrevoked-client")
        await StoreRevocations(env.store).revoke(env.client.kid)
        err = await hello_error(env.http, env.url, env.client, env.server.identity.did)
        assert err["message"] == f"key id revoked: {env.client.kid}"
        await open_env(env.server, env.url, env.http, client=other)  # another DID is unaffected


async def test_revocation_file_is_read_on_the_next_intent(tmp_path: Path) -> None:
    path = tmp_path / "revoked.json"
    server = build_server(audit=AuditLog())
    server.revocations = (FileRevocations(path),)
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        env = await open_env(server, url, http, client=identity("file-client"))
        await env.honest(n=1)
        # Another process's writer: a separate object on the same file.
        assert await FileRevocations(path).revoke(env.client.did, reason="test")
        resp = await env.send(env.prepare(n=2))
        assert resp.json()["error"]["code"] == -32043
        err = await hello_error(http, url, env.client, server.identity.did)
        assert err["code"] == -32040
        # A deny list that exists but cannot be parsed fails closed (never a 500).
        path.write_text("{not json")
        other = identity("file-other")
        hs = ClientHandshake(other, resolve_did_key(server.identity.did))
        resp = await http.post(url + "/a2a/handshake", content=envelope("hello", hs.hello()), headers=JSON)
        assert resp.status_code == 500 and resp.json()["error"]["code"] == -32603
        assert "revocation list" in resp.json()["error"]["message"]


# -- the list itself --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "target",
    [
        "not-a-did",
        "did:key:zBAD",
        "did:web:127.0.0.1",
        "did:key:z6Mk#x",
        f"{OTHER_DID}#other",
        "",
        "did:web:a.com#",
    ],
)
def test_malformed_targets_are_refused(target: str) -> None:
    with pytest.raises(InvalidParams):
        check_target(target)


async def test_file_revocations_add_list_undo(tmp_path: Path) -> None:
    rv = FileRevocations(tmp_path / "rv.json")
    assert await rv.lookup(OTHER_DID) is None  # no file yet: nothing revoked
    assert await rv.revoke(OTHER_DID, reason="r", now=T0)
    assert not await rv.revoke(OTHER_DID, reason="again", now=T0)
    assert await rv.lookup(OTHER_DID) == Revocation(OTHER_DID, "r", int(T0))
    assert [e.target for e in await rv.entries()] == [OTHER_DID]
    with pytest.raises(InvalidParams):
        await rv.revoke("did:nope")
    assert await rv.unrevoke(OTHER_DID)
    assert not await rv.unrevoke(OTHER_DID)
    assert await rv.lookup(OTHER_DID) is None


@pytest.fixture(params=["memory", "redis", "cluster"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "cluster":  # every key in its own slot: the session and the DID apart
        cluster = request.getfixturevalue("redis_cluster")
        store = RedisStore(cluster.url, prefix=f"a2a-test:{uuid.uuid4().hex}:")
        yield store
        await store.aclose()
        delete_cluster_prefix(cluster.url, store.prefix)
        return
    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    store = RedisStore(url, prefix=prefix)
    yield store
    await store.aclose()


async def test_store_begin_request_answers_revoked(any_store: Store) -> None:
    store = any_store
    s = await open_one(store, "revoked")
    kept = await open_one(store, "kept", client=identity("kept-client"))
    rv = StoreRevocations(store)  # type: ignore[arg-type]
    assert (
        await store.begin_request(
            s.session_id, s.client_did, 1, "sha256:" + "a" * 64, rate_limit=None, rate_period=60, now=T0
        )
    ).kind is BeginKind.NEW
    assert await rv.revoke(CLIENT.kid, reason="kid", now=T0)
    assert (await rv.lookup(CLIENT.did, [CLIENT.kid])) == Revocation(CLIENT.kid, "kid", int(T0))
    assert await rv.lookup(CLIENT.did, []) is None
    begin = await store.begin_request(
        s.session_id, s.client_did, 2, "sha256:" + "b" * 64, rate_limit=None, rate_period=60, now=T0
    )
    assert begin.kind is BeginKind.REVOKED
    assert await store.get_session(s.session_id, T0) is None  # forgotten at once
    begin = await store.begin_request(
        kept.session_id, kept.client_did, 1, "sha256:" + "c" * 64, rate_limit=5, rate_period=60, now=T0
    )
    assert begin.kind is BeginKind.NEW
    assert [e.target for e in await rv.entries()] == [CLIENT.kid]
    assert await rv.unrevoke(CLIENT.kid)
    assert await rv.entries() == []


# -- the command --------------------------------------------------------------------------
def test_cli_revoke_list_undo_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(tmp_path / "rv.json")
    assert main(["revoke", "not-a-did", "--file", f]) == 2
    assert "is not a DID or a key id" in capsys.readouterr().err
    assert main(["revoke", "did:key:zBAD", "--file", f]) == 2
    assert not os.path.exists(f)
    # Well-formed but unknown here (a did:web that does not resolve): revoked, and said so.
    assert main(["revoke", "did:web:unknown.invalid", "--file", f, "--reason", "preempt"]) == 0
    out = capsys.readouterr()
    assert "revoked: did:web:unknown.invalid" in out.out and "revoked preemptively" in out.err
    assert main(["revoke", OTHER_DID, "--file", f, "--audit-log", str(tmp_path / "audit.jsonl")]) == 0
    capsys.readouterr()
    assert main(["revoke", "--list", "--file", f]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["target"] for e in listed] == sorted([OTHER_DID, "did:web:unknown.invalid"])
    assert main(["revoke", OTHER_DID, "--undo", "--file", f]) == 0
    assert "no longer revoked" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["event"], r["client_did"]) for r in records if "checkpoint" not in r] == [
        ("revoke", OTHER_DID)
    ]


def test_cli_revoke_on_redis(redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    args = ["--redis-url", redis_url, "--redis-prefix", redis_prefix]
    assert main(["revoke", OTHER_DID, *args]) == 0
    assert main(["revoke", OTHER_DID, *args]) == 0
    assert "already revoked" in capsys.readouterr().out
    assert main(["revoke", "--list", *args]) == 0
    assert [e["target"] for e in json.loads(capsys.readouterr().out)] == [OTHER_DID]


def test_concurrent_revoke_processes_lose_no_revocation(tmp_path: Path) -> None:
    # Each process reads the list, adds its entry and replaces the file: without a lock over
    # the three steps, most of the entries each process reported as "revoked" were lost.
    import subprocess
    import sys

    from a2a_secure.identity.keys import Identity

    path = tmp_path / "revoked.json"
    dids = [Identity.generate(f"r{i}").did for i in range(12)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "a2a_secure", "revoke", did, "--file", str(path), "--reason", "race"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for did in dids
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(dids)
    assert all(out.decode().startswith("revoked: ") for out, _ in outs)
    listed = json.loads(path.read_text())["revoked"]
    assert sorted(e["target"] for e in listed) == sorted(dids)
