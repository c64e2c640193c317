"""Sealed sessions in a shared RedisStore (PROTOCOL.md §12.6, SECURITY.md "Sealed intents").

Two servers with one identity share a Redis prefix, as two workers do: a session sealed at
one opens its messages at the other, because the session's two AEAD keys sit in its Redis
record, under the session's TTL, and are deleted with it at close. Redis never holds an
input or a result in the clear: the answer kept for a retry is the sealed form.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from http_helpers import SECRET, AuditLog, build_server, identity
from redis_helpers import redis_prefix, redis_url  # noqa: F401
from test_sealed_http import SEALED, Wire, handshake

from a2a_secure.identity import encoding
from a2a_secure.store.redis import RedisStore
from a2a_secure.testing import serve_app


def _dump(url: str, prefix: str) -> dict[bytes, Any]:
    import redis

    client = redis.Redis.from_url(url)
    out: dict[bytes, Any] = {}
    try:
        for key in client.scan_iter(match=prefix + "*"):
            kind = client.type(key)
            if kind == b"string":
                out[key] = client.get(key)
            elif kind == b"hash":
                out[key] = client.hgetall(key)
            elif kind == b"zset":
                out[key] = client.zrange(key, 0, -1, withscores=True)
            elif kind == b"set":
                out[key] = client.smembers(key)
            elif kind == b"list":
                out[key] = client.lrange(key, 0, -1)
            else:
                out[key] = kind
    finally:
        client.close()
    return out


def _ttl_ms(url: str, key: bytes) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.pttl(key))
    finally:
        client.close()


async def test_a_sealed_session_opens_at_another_worker_and_its_keys_go_with_it(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    server_id = identity("sealed-redis")
    one = build_server(
        server_id, limits=SEALED, store=RedisStore(redis_url, prefix=redis_prefix), audit=AuditLog()
    )
    two = build_server(
        server_id, limits=SEALED, store=RedisStore(redis_url, prefix=redis_prefix), audit=AuditLog()
    )
    async with (
        serve_app(one.app()) as url_one,
        serve_app(two.app()) as url_two,
        httpx.AsyncClient(timeout=10) as http,
    ):
        at_one, at_two = Wire(http, url_one), Wire(http, url_two)
        session = await handshake(at_one, identity("client"), server_id.did)
        assert session.sealed
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await at_two.call("intent", req.params)  # the other worker
        assert resp.status_code == 200, resp.text
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": {"text": SECRET}}
        # A byte-identical retry at the first worker gets the stored answer, byte for byte.
        again = await at_one.call("intent", req.params)
        assert again.content == resp.content
        assert one.calls["echo"] + two.calls["echo"] == 1  # type: ignore[attr-defined]

        stored = _dump(redis_url, redis_prefix)
        assert SECRET.encode() not in repr(stored).encode()  # no plaintext at rest
        holders = [k for k, v in stored.items() if _has_seal_keys(v)]
        assert holders == [f"{redis_prefix}s:{session.session_id}".encode()], stored.keys()
        ttl = _ttl_ms(redis_url, holders[0])
        assert 0 < ttl <= 3600 * 1000 + 5000  # ... under the session's TTL

        close = session.prepare_close()
        closed = await at_two.call("close", close.params)
        session.verify_closed(close, closed.json()["result"])
        after = _dump(redis_url, redis_prefix)
        assert not any(_has_seal_keys(v) for v in after.values())
        assert f"{redis_prefix}s:{session.session_id}".encode() not in after
    for server in (one, two):
        await server.store.aclose()


def _has_seal_keys(value: Any) -> bool:
    # A session hash whose record ("r") is a JSON array with the base64url of 64 bytes as its
    # 11th member.
    if not isinstance(value, dict) or b"r" not in value:
        return False
    try:
        fields = encoding.loads(value[b"r"])
    except Exception:
        return False
    return (
        isinstance(fields, list)
        and len(fields) >= 11
        and isinstance(fields[10], str)
        and len(encoding.b64u_decode(fields[10])) == 64
    )


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    from a2a_secure.client import extensions

    extensions.forget()


async def test_without_sealing_the_answer_kept_in_redis_is_plaintext(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    # The counterpart of the check above (so that it can fail): a plain session's stored
    # answer holds the result in the clear.
    server = build_server(
        identity("plain-redis"),
        limits=SEALED,
        store=RedisStore(redis_url, prefix=redis_prefix),
        audit=AuditLog(),
    )
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        wire = Wire(http, url)
        session = await handshake(wire, identity("client"), server.identity.did, seal=False)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        first = await wire.call("intent", req.params)
        # The retry waits until the answer has reached Redis (it is written a moment later).
        assert (await wire.call("intent", req.params)).content == first.content
        assert SECRET.encode() in repr(_dump(redis_url, redis_prefix)).encode()
    await server.store.aclose()


async def test_a_sealed_intent_id_is_kept_in_redis_sealed_and_answered_on_another_worker(
    redis_url: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    from a2a_secure.client.http import A2AClient

    server_id = identity("sealed-redis-eo")
    one = build_server(
        server_id, limits=SEALED, store=RedisStore(redis_url, prefix=redis_prefix), audit=AuditLog()
    )
    two = build_server(
        server_id, limits=SEALED, store=RedisStore(redis_url, prefix=redis_prefix), audit=AuditLog()
    )
    intent = {"goal": "echo", "inputs": {"text": SECRET}}
    async with (
        serve_app(one.app()) as url_one,
        serve_app(two.app()) as url_two,
        A2AClient(identity("client"), sealed=True) as client,
    ):
        first = await client.request(server_id.did, intent, endpoint=url_one)
        assert first.intent_id is not None
        await client.close_session(server_id.did)
        again = await client.request(server_id.did, intent, endpoint=url_two, intent_id=first.intent_id)
        assert again.result == first.result == {"echo": {"text": SECRET}}
    assert one.calls["echo"] + two.calls["echo"] == 1  # type: ignore[attr-defined]
    stored = _dump(redis_url, redis_prefix)
    assert any(first.intent_id.encode() in key for key in stored)  # the claim is there ...
    assert SECRET.encode() not in repr(stored).encode()  # ... and holds no plaintext
    for server in (one, two):
        await server.store.aclose()
