"""A sealed session's keys leave memory on time (SECURITY.md, "Forward secrecy").

A real uvicorn server (lifespan on, so its sweep runs) and the real client exchange one
sealed intent on a session that lives one second; the test records the sealed answer on the
wire. A moment after the session's end, nothing this process holds opens that answer: not
the store (MemoryStore, or a RedisStore's local cache and Redis itself), not the sealer cached
on the record, not the client's session, though nobody looked the session up again. Before,
each kept the keys until a look-up that never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import SECRET, AuditLog, build_server, identity
from redis_helpers import redis_prefix, redis_url  # noqa: F401

from a2a_secure.client.http import A2AClient
from a2a_secure.errors import AuthenticationFailed
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import sealing
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.runtime.sweeper import SessionSweeper
from a2a_secure.server.app import AgentServer
from a2a_secure.store.base import SessionRecord
from a2a_secure.store.expiry import ExpiryIndex
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

SWEPT = ServerLimits(sealed_intents=True, session_sweep_seconds=0.05)
SHORT = Policy(session_timeout=1)


class Recording(httpx.AsyncBaseTransport):
    """The client's transport, keeping every request and answer body (a passive tap)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[tuple[bytes, bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = await request.aread()
        resp = await self.inner.handle_async_request(request)
        body = await resp.aread()
        self.seen.append((sent, body))
        return httpx.Response(resp.status_code, headers=resp.headers, stream=httpx.ByteStream(body))

    async def aclose(self) -> None:
        await self.inner.aclose()


def sealed_answer(tap: Recording) -> tuple[str, int, str, str]:
    """The recorded intent's session id, sequence, request hash and sealed result."""
    for sent, got in tap.seen:
        request = json.loads(sent) if sent else {}  # the card's GET has no body
        if request.get("method") == "intent":
            params, result = request["params"], json.loads(got)["result"]
            assert SECRET not in got.decode() and isinstance(result["result"], str)
            return (
                params["session_id"],
                params["sequence"],
                m.request_hash(params["request_jws"]),
                result["result"],
            )
    raise AssertionError("no intent was recorded")


def openers(session_id: str) -> list[sealing.SessionSealer]:
    """Every sealer of ``session_id`` this process can still reach, and one from each record
    that still holds its keys (client or server side, cached or not)."""
    gc.collect()
    found: list[sealing.SessionSealer] = []
    for obj in gc.get_objects():
        # type(), not isinstance(): another test may leave an object whose __class__ raises.
        kind = type(obj)
        if issubclass(kind, sealing.SessionSealer) and obj.session_id == session_id:
            found.append(obj)
        elif issubclass(kind, SessionRecord) and obj.session_id == session_id and obj.seal_keys:
            sealer = sealing.sealer_for(obj.seal_keys, session_id)
            assert sealer is not None
            found.append(sealer)
    return found


def opened_by(session_id: str, sequence: int, request_hash: str, token: str) -> list[Any]:
    out = []
    for sealer in openers(session_id):
        with contextlib.suppress(AuthenticationFailed):
            out.append(sealer.open_result(sequence, request_hash, token))
    return out


async def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # noqa: ASYNC110 - the sweep runs on its timer
        await asyncio.sleep(0.05)
    return condition()


async def exchange_and_outlive(server: AgentServer, extra: float = 0.0) -> tuple[A2AClient, str]:
    """One sealed intent over HTTP, then wait past the session's end; the keys must be gone."""
    tap = Recording()
    did = server.identity.did
    async with (
        serve_app(server.app(), lifespan="on") as url,
        httpx.AsyncClient(transport=tap, timeout=10) as http,
    ):
        client = A2AClient(identity("alice"), http=http, sealed=True)
        answer = await client.request(did, {"goal": "echo", "inputs": {"text": SECRET}}, endpoint=url)
        assert answer.result == {"echo": {"text": SECRET}}
        session_id, sequence, req_hash, token = sealed_answer(tap)
        # While the session lives, what the process holds opens the recording (the check can fail).
        assert {"echo": {"text": SECRET}} in opened_by(session_id, sequence, req_hash, token)
        session = client._peers[did].session
        assert session is not None and session.sealed
        ends = session.expires_at
        # Nobody uses the session again: only the timers can drop its keys.
        gone = await until(
            lambda: time.time() > ends + extra and not opened_by(session_id, sequence, req_hash, token),
            seconds=max(0.0, ends - time.time()) + extra + 2.0,
        )
        assert gone, "a sealed session's keys outlived it"
        assert session._sealer is None and session.sealed  # dropped by the timer, not by a use
        with pytest.raises(AuthenticationFailed, match="sealing keys are gone"):
            session._keys()
        await client.aclose(close_sessions=False)
    return client, session_id


async def test_memory_store_forgets_a_sealed_session_and_its_keys_seconds_after_it_ends() -> None:
    store = MemoryStore()
    server = build_server(identity("sweep-memory"), policy=SHORT, limits=SWEPT, store=store, audit=AuditLog())
    _client, session_id = await exchange_and_outlive(server)
    assert session_id not in store._sessions and session_id not in store._seq  # its kept answers too


async def test_redis_store_drops_its_local_copy_and_redis_its_key(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    import redis

    from a2a_secure.store.redis import RedisStore

    store = RedisStore(redis_url, prefix=redis_prefix)
    server = build_server(identity("sweep-redis"), policy=SHORT, limits=SWEPT, store=store, audit=AuditLog())
    try:
        # Redis forgets the key by its TTL (the session's end plus one second).
        _client, session_id = await exchange_and_outlive(server, extra=1.2)
        assert session_id not in store._cache
        raw = redis.Redis.from_url(redis_url)
        try:
            assert not [k for k in raw.scan_iter(match=redis_prefix + "*") if session_id.encode() in k]
        finally:
            raw.close()
    finally:
        await store.aclose()


async def test_a_tick_forgets_an_expired_session_nobody_looked_up() -> None:
    # What the sweep fixes, shown on the store alone: an expired session stays until swept.
    store = MemoryStore()
    server = build_server(identity("sweep-off"), policy=SHORT, limits=SWEPT, store=store, audit=AuditLog())
    async with serve_app(server.app()) as url, A2AClient(identity("bob"), sealed=True) as bob:  # lifespan off
        await bob.request(server.identity.did, {"goal": "echo", "inputs": {"text": SECRET}}, endpoint=url)
        (record,) = store._sessions.values()
        assert record.sealer is not None
        later = record.expires_at + 1
        assert store._sessions  # no timer: still held after its end
        sweeper = SessionSweeper(lambda: store, lambda: 1.0, lambda: later)
        assert sweeper.tick() == 1
        assert not store._sessions and record.sealer is None


def test_a_sweep_tick_costs_the_sessions_due_not_the_sessions_open() -> None:
    index = ExpiryIndex()
    for i in range(50_000):
        index.add(10_000 + i, f"s{i}")
    index.add(5, "early")
    assert index.due(100.0, limit=10) == ["early"]  # one pop, not a walk of 50 001
    assert index.due(10_004.0, limit=3) == ["s0", "s1", "s2"]  # bounded per tick, in order
    assert index.due(10_004.0) == ["s3", "s4"]
    # Stale entries (closed sessions) are dropped once they outnumber the live ones.
    index.compact(live=2, entries=[(1.0, "a"), (2.0, "b")])
    assert len(index) == 2 and index.due(3.0) == ["a", "b"]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_the_sweep_interval_is_a_finite_number_of_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="session_sweep_seconds"):
        ServerLimits(session_sweep_seconds=bad)


def test_a_client_session_never_uses_its_keys_past_its_end() -> None:
    from a2a_secure.errors import SessionUnknown
    from a2a_secure.protocol.client import ClientSession

    now = [1_000.0]
    server = identity("sweep-server")
    session = ClientSession(
        identity=identity("carol"),
        server_did=server.did,
        server_kid=server.kid,
        server_key=server.public_key,
        session_id="s" * 43,
        session_commitment="c" * 43,
        policy=SHORT,
        created_at=1_000,
        expires_at=1_001,
        clock=lambda: now[0],
        seal_keys=sealing.SessionKeys(bytes(32), bytes(range(32))),
    )
    assert session.sealer is not None and session.drop_keys() == 1.0
    now[0] = 1_001.0  # its end, by its own clock: no timer ran, the first use drops them
    assert session.sealer is None and session.sealed
    with pytest.raises(SessionUnknown):
        session.prepare_intent({"goal": "echo", "inputs": {}})
    with pytest.raises(AuthenticationFailed, match="sealing keys are gone"):
        session._keys()


def test_the_expiry_index_stays_bounded_without_a_sweep() -> None:
    pytest.importorskip("redis", reason="the redis extra: pip install 'a2a-secure[redis]'")
    from a2a_secure.store.redis import RedisStore

    store = RedisStore("redis://127.0.0.1:1/0", session_cache_ttl=0.0001)  # never connected here
    record = SessionRecord.from_dict(
        {
            "session_id": "s" * 43,
            "session_commitment": "c" * 43,
            "client_did": "did:key:z6Mk",
            "server_did": "did:key:z6Mk",
            "client_kid": "k",
            "client_key": "AAAA",
            "policy": SHORT.to_dict(),
            "created_at": 0,
            "expires_at": 10**10,
        }
    )
    for _ in range(10_000):  # a long session whose cache entry lapses and is put again
        store._cache_put(record)
    assert len(store._cache) == 1 and len(store._cache_expiry) <= 2 + 64


async def test_serve_runs_the_sweep_in_its_lifespan(tmp_path: Path) -> None:
    # `a2a-secure serve` wraps the app's lifespan with its own (closing the store and the
    # audit log): the sweep still runs inside it.
    from a2a_secure.server.run import app_from_env

    key_file = tmp_path / "k.key"
    identity("sweep-serve").save(key_file)
    fastapi_app = app_from_env({"A2A_SECURE_KEY_FILE": str(key_file)})
    server = fastapi_app.state.agent_server
    server.limits = dataclasses.replace(server.limits, session_sweep_seconds=0.05)
    store = server.store
    assert isinstance(store, MemoryStore)
    record = SessionRecord(
        session_id="e" * 43,
        session_commitment="c" * 43,
        client_did="did:key:z",
        server_did=server.identity.did,
        client_kid="k",
        client_key=bytes(32),
        policy=SHORT,
        created_at=0,
        expires_at=int(time.time()) - 1,
        seal_keys=bytes(64),
    )
    store._sessions[record.session_id] = record
    store._by_expiry.add(record.expires_at, record.session_id)
    async with fastapi_app.router.lifespan_context(fastapi_app):
        assert await until(lambda: not store._sessions, seconds=2.0)
