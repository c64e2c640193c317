"""A server whose key is held by a remote signing service (identity/remote.py).

The service is :class:`a2a_secure.testing.LatencyKey`: real Ed25519 signatures, each awaited
and taking an injected latency. Over real HTTP (uvicorn on 127.0.0.1) the server must answer
every kind of call signed by that key, never block its event loop on it, sign many answers at
once, verify what the service returns, and fail closed (unsigned 503, nothing run twice)
when the service is down or answers with another key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import A2AError, InvalidParams, Unavailable
from a2a_secure.identity.jws import PendingJWS, jws_token
from a2a_secure.identity.keys import Identity, SeedKey, SignerFailed
from a2a_secure.identity.remote import RemoteKeyHolder, ThreadedKey
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.server.common import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import LatencyKey, serve_app
from tests.cli_helpers import run_cli, serve_cli
from tests.http_helpers import identity

FAST = RetryPolicy(attempts=1, base=0.01, cap=0.02, max_wait=2)


def remote_identity(name: str, latency: float = 0.02) -> tuple[Identity, LatencyKey]:
    local = identity(name)
    key = LatencyKey(local.holder, latency)
    return Identity(key, name), key


def server_with(ident: Identity, *, sealed: bool = True, calls: Counter[str] | None = None) -> AgentServer:
    calls = calls if calls is not None else Counter()
    server = AgentServer(
        ident,
        Policy(rate_limit=10_000),
        name="remote-key",
        description="a server whose key is remote",
        url="http://127.0.0.1",
        store=MemoryStore(),
        limits=ServerLimits(sealed_intents=sealed),
    )

    @server.intent("echo")
    def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["echo"] += 1
        return {"echo": inputs}

    @server.intent("reject")
    def reject(inputs: dict[str, Any]) -> Any:
        raise InvalidParams("inputs.x must be a string")

    async def count(inputs: dict[str, Any], ctx: Any) -> Any:
        for i in range(int(inputs.get("n", 3))):
            yield {"i": i}

    server.add_stream("count", count)
    return server


def test_an_identity_with_a_remote_holder_says_so_and_a_local_one_does_not() -> None:
    ident, key = remote_identity("r")
    assert isinstance(key, RemoteKeyHolder)
    assert ident.remote is True
    assert identity("local").remote is False
    assert not isinstance(SeedKey.__new__(SeedKey), RemoteKeyHolder)
    # The core leaves the token to the runtime; a local key signs in place.
    assert type(jws_token({"a": 1}, ident, "x+jws")) is PendingJWS
    assert type(jws_token({"a": 1}, identity("local"), "x+jws")) is str


async def test_a_remote_signature_is_checked_against_the_public_key() -> None:
    ident, key = remote_identity("r", latency=0)
    good = await ident.sign_async(b"m")
    assert good == identity("r").sign(b"m")
    key.wrong = identity("someone-else").holder
    with pytest.raises(SignerFailed, match="does not verify"):
        await ident.sign_async(b"m")
    with pytest.raises(SignerFailed, match="does not verify"):
        ident.sign(b"m")
    key.wrong, key.fail = None, ConnectionError
    with pytest.raises(SignerFailed, match="did not sign"):
        await ident.sign_async(b"m")


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
async def test_every_kind_of_call_is_answered_signed_by_the_remote_key(sealed: bool) -> None:
    ident, key = remote_identity("srv", latency=0.005)
    server = server_with(ident, sealed=sealed)
    async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
        answer = await client.request(ident.did, {"goal": "echo", "inputs": {"x": 1}}, endpoint=url)
        assert answer.result == {"echo": {"x": 1}}
        with pytest.raises(InvalidParams, match=r"inputs\.x"):  # a signed error, verified
            await client.request(ident.did, {"goal": "reject", "inputs": {}}, endpoint=url)
        count = {"goal": "count", "inputs": {"n": 4}}
        items = [item async for item in client.stream(ident.did, count, endpoint=url)]
        assert items == [{"i": i} for i in range(4)]
        await client.close_session(ident.did)
    # Handshake (policy, session), three answers, five stream events: all from the service,
    # none by blocking the event loop.
    assert key.calls >= 2 + 2 + 5
    assert key.blocking_calls == 0


async def test_answers_are_signed_concurrently_not_one_after_another() -> None:
    latency = 0.02  # what a KMS in the same region answers in
    ident, key = remote_identity("srv", latency=latency)
    server = server_with(ident, sealed=False)
    async with serve_app(server.app()) as url:
        clients = [A2AClient(identity(f"c{i}"), retry=FAST) for i in range(32)]
        try:
            await asyncio.gather(*(c.session_for(ident.did, endpoint=url) for c in clients))
            key.most_in_flight = 0
            started = time.monotonic()
            echo = {"goal": "echo", "inputs": {}}
            await asyncio.gather(*(c.request(ident.did, echo, endpoint=url) for c in clients))
            took = time.monotonic() - started
        finally:
            for c in clients:
                await c.aclose()
    # 32 answers, each 20 ms to sign: one at a time would take 640 ms.
    assert key.most_in_flight >= 16
    assert took < 32 * latency / 2


async def test_the_event_loop_runs_while_the_service_signs() -> None:
    ident, _key = remote_identity("srv", latency=0.2)
    server = server_with(ident, sealed=False)
    async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
        await client.session_for(ident.did, endpoint=url)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            await client.request(ident.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        finally:
            ticker.cancel()
    assert ticks >= 10  # the loop (server and client share it here) went on during 200 ms


async def test_a_service_down_or_signing_with_another_key_gets_unsigned_503s_and_runs_nothing_twice() -> None:
    ident, key = remote_identity("srv", latency=0)
    calls: Counter[str] = Counter()
    server = server_with(ident, sealed=False, calls=calls)
    async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
        await client.session_for(ident.did, endpoint=url)
        for broken in ("down", "wrong key"):
            if broken == "down":
                key.fail = ConnectionError
            else:
                key.fail, key.wrong = None, identity("impostor").holder
            with pytest.raises(Unavailable) as info:
                await client.request(ident.did, {"goal": "echo", "inputs": {"n": broken}}, endpoint=url)
            assert info.value.code == -32048
            assert "response_jws" not in (info.value.data or {})
        key.fail = key.wrong = None
        before = calls["echo"]
        answer = await client.request(ident.did, {"goal": "echo", "inputs": {"n": 3}}, endpoint=url)
        assert answer.result == {"echo": {"n": 3}}
        assert calls["echo"] == before + 1


async def test_a_handshake_with_the_service_down_is_refused_503_and_no_token_leaves_unsigned() -> None:
    ident, key = remote_identity("srv", latency=0)
    server = server_with(ident, sealed=False)
    key.fail = TimeoutError
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=5) as http:
        from a2a_secure.protocol.client import ClientHandshake

        hs = ClientHandshake(identity("cli"), resolve_did_key(ident.did))
        body = {"jsonrpc": "2.0", "id": 1, "method": "hello", "params": hs.hello()}
        resp = await http.post(url + "/a2a/handshake", json=body)
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == -32048
        assert "PendingJWS" not in resp.text


async def test_a_threaded_key_signs_off_the_event_loop() -> None:
    slow = LatencyKey(identity("t").holder, latency=0.05)
    threaded = ThreadedKey(slow, max_workers=4)
    try:
        ident = Identity(threaded, "t")
        assert ident.remote
        loop_free = asyncio.create_task(asyncio.sleep(0.01))
        sigs = await asyncio.gather(*(ident.sign_async(b"m%d" % i) for i in range(4)))
        assert loop_free.done()
        assert slow.blocking_calls == 4
        assert all(len(s) == 64 for s in sigs)
    finally:
        threaded.close()


def test_a_remote_identity_cannot_be_exported() -> None:
    ident, _ = remote_identity("r")
    with pytest.raises((A2AError, TypeError)):
        ident.private_key_b64u()


_REMOTE_APP = """
import hashlib
from a2a_secure.identity.keys import Identity
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import LatencyKey

seed = hashlib.sha256(b"remote-app").digest()
key = LatencyKey(Identity.from_seed(seed, "remote-app").holder, 0.005)
server = AgentServer(Identity(key, "remote-app"), url="http://127.0.0.1")


@server.intent("signed_by")
def signed_by(inputs, ctx):
    return {"calls_so_far": key.calls, "blocking": key.blocking_calls}
"""


def test_serve_app_with_a_remote_key_needs_no_key_file_and_signs_through_the_service(tmp_path: Path) -> None:
    (tmp_path / "remote_app.py").write_text(_REMOTE_APP)
    expected = Identity.from_seed(hashlib.sha256(b"remote-app").digest(), "remote-app").did
    with serve_cli(tmp_path, "--app", "remote_app:server", cwd=tmp_path) as served:
        assert f"serving {expected}" in served.output()
        client_key = tmp_path / "client.json"
        identity("cli").save(client_key)
        done = run_cli(
            "call", "--key-file", str(client_key), "--to", expected, "--endpoint", served.url,
            "--goal", "signed_by", "--inputs", "{}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        # The handshake's two signatures (and more) were awaited from the service; none blocked.
        assert answer["calls_so_far"] >= 2
        assert answer["blocking"] == 0
    refused = run_cli("serve", "--port", "9")
    assert refused.returncode == 2
    assert "serve needs --key-file or --key-uri" in refused.stderr


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
async def test_a_client_whose_key_is_remote_awaits_every_signature_it_makes(sealed: bool) -> None:
    server_ident = identity("srv-local")
    server = server_with(server_ident, sealed=sealed)
    client_ident, key = remote_identity("cli-remote", latency=0.005)
    async with serve_app(server.app()) as url, A2AClient(client_ident, retry=FAST) as client:
        answer = await client.request(server_ident.did, {"goal": "echo", "inputs": {"x": 2}}, endpoint=url)
        assert answer.result == {"echo": {"x": 2}}
        count = {"goal": "count", "inputs": {"n": 2}}
        assert [i async for i in client.stream(server_ident.did, count, endpoint=url)] == [{"i": 0}, {"i": 1}]
        await client.close_session(server_ident.did)
        # PROOF, ACCEPT_POLICY, two intents and the close: awaited, none made by blocking.
        assert key.calls == 5
        assert key.blocking_calls == 0
        key.wrong = identity("impostor").holder  # a service signing with another key
        with pytest.raises(Unavailable):
            await client.request(server_ident.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        key.wrong = None
        answer = await client.request(server_ident.did, {"goal": "echo", "inputs": {"y": 1}}, endpoint=url)
        assert answer.result == {"echo": {"y": 1}}
