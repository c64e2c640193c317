"""Key rotation: key rings with an overlap window, did:web retired keys, did:key statements.

did:web documents come from a local TLS server (test_didweb's DocServer, trustme CA,
agent.test → 127.0.0.1 allowed only by the test resolver); agents run under uvicorn on
127.0.0.1; clocks are injected.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import JSON, AuditLog, build_server, envelope, identity, open_env
from test_didweb import DocServer, ca, client_ctx, json_route, resolver_for, server, servers, start  # noqa: F401

from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.cli import main
from a2a_secure.errors import A2AError, AuthenticationFailed, InvalidParams, StaleTimestamp
from a2a_secure.identity.encoding import b64u_decode
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.identity.rotation import (
    ROTATION_TYP,
    KeyRing,
    RotationFollower,
    sign_rotation_statement,
    verify_rotation_statement,
)
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

T0 = 1_800_000_000


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the key file ----------------------------------------------------------------------------
def test_rotate_keeps_the_old_key_and_old_readers_load_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.key"
    old = Identity.generate("rotating")
    old.save(path)  # the format before rotation: a ring of one key
    assert KeyRing.load(path).retired == ()
    assert main(["key", "rotate", "--key-file", str(path), "--overlap", "2h"]) == 0
    out = capsys.readouterr().out
    assert old.private_key_b64u() not in out and "private" not in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = KeyRing.load(path)
    assert ring.current.did != old.did and Identity.load(path).did == ring.current.did
    (retired,) = ring.retired
    assert retired.identity.did == old.did and retired.overlap_until - retired.retired_at == 7200
    chain = json.loads((tmp_path / "agent.key.rotation.json").read_text())["statements"]
    st = verify_rotation_statement(chain[0], now=retired.retired_at)
    assert (st.did, st.successor) == (old.did, ring.current.did)
    assert main(["key", "rotate", "--key-file", str(path), "--overlap", "100d"]) == 2


async def test_server_answers_old_sessions_with_their_key_until_the_window_ends() -> None:
    ring = KeyRing(identity("rotating-server"))
    clock = Clock()
    store = MemoryStore()
    before = build_server(ring.current, store=store, clock=clock, audit=AuditLog())
    before.key_ring = ring
    async with serve_app(before.app()) as url, httpx.AsyncClient(timeout=10) as http:
        env = await open_env(before, url, http, client=identity("rot-client"), clock=clock)
    rotated = ring.rotate(overlap=600, now=clock.t)
    after = build_server(rotated.current, store=store, clock=clock, audit=AuditLog())
    after.key_ring = rotated
    async with serve_app(after.app()) as url, httpx.AsyncClient(timeout=10) as http:
        env.url, env.http, env.server = url, http, after
        # The client pinned the old key: the answer must verify against it.
        assert (await env.honest(n=1)).result == {"echo": {"n": 1}}
        clock.t += 600
        resp = await env.send(env.prepare(n=2))
        err = resp.json()["error"]
        assert err["code"] == -32043 and "retired server key" in err["message"]
        assert "data" not in err or "response_jws" not in err.get("data", {})  # unsigned


# -- did:web: a retired key works in its window and is refused after -------------------------------
async def test_did_web_retired_key_is_accepted_until_its_window_ends(
    server: DocServer,  # noqa: F811
    client_ctx: Any,  # noqa: F811
) -> None:
    old = Identity.generate("web-client").with_did_web(server.did, f"{server.did}#key-1")
    ring = KeyRing(old).rotate(overlap=600, now=T0)
    server.routes["/.well-known/did.json"] = json_route(ring.did_document(now=T0))
    clock = Clock(T0 + 10)
    mono = Clock(0)
    agent = build_server(clock=clock, audit=AuditLog())
    agent.resolver = resolver_for(client_ctx, clock=mono)
    async with serve_app(agent.app()) as url, httpx.AsyncClient(timeout=10) as http:
        env = await open_env(agent, url, http, client=old, clock=clock)  # the retired key, in its window
        await env.honest(n=1)
        new = await open_env(agent, url, http, client=ring.current, clock=clock)
        await new.honest(n=1)
        clock.t = T0 + 600  # the window is over: a new handshake with the old kid is refused
        hs = ClientHandshake(old, resolve_did_key(agent.identity.did), clock=clock)
        resp = await http.post(url + "/a2a/handshake", content=envelope("hello", hs.hello()), headers=JSON)
        err = resp.json()["error"]
        assert resp.status_code == 401 and err["code"] == -32040
        assert old.kid in err["message"] and "retired" in err["message"]
        # Sessions opened with it stay valid until they expire.
        await env.honest(n=2)
        # The controller drops the old key: once the cached document is stale (cache_ttl),
        # the next intent of a session opened with that key ends it.
        server.routes["/.well-known/did.json"] = json_route(
            ring.rotate(overlap=0, now=T0 + 600).did_document()
        )
        await env.honest(n=3)  # still the cached document
        mono.t += 301
        resp = await env.send(env.prepare(n=4))
        err = resp.json()["error"]
        assert err["code"] == -32043 and old.kid in err["message"]


# -- did:key: rotation statements ----------------------------------------------------------------
OLD = identity("dk-old")
NEW = identity("dk-new")
THIRD = identity("dk-third")


def statement(old: Identity = OLD, new: Identity = NEW, **over: Any) -> str:
    payload = {
        "did": old.did,
        "successor": new.did,
        "successor_kid": new.kid,
        "issued_at": T0,
        "overlap_until": T0 + 3600,
    }
    payload.update(over)
    return jws_sign(payload, old, ROTATION_TYP)


def registry() -> AgentRegistry:
    return AgentRegistry([RegistryEntry("peer", OLD.did, "https://peer.example")])


def test_statement_is_followed_once() -> None:
    reg = registry()
    (changed,) = reg.follow_rotation(statement(), now=T0 + 1)
    assert changed.did == NEW.did and reg.find("peer").did == NEW.did
    assert reg.rotations.history == {OLD.did: NEW.did}
    with pytest.raises(AuthenticationFailed, match="no registry entry"):
        reg.follow_rotation(statement(), now=T0 + 2)  # replayed
    follower = RotationFollower(clock=lambda: T0)
    follower.follow(OLD.did, statement())
    with pytest.raises(AuthenticationFailed, match="already followed"):
        follower.follow(OLD.did, statement())


def test_a_chain_is_followed_to_its_end_and_a_loop_is_refused() -> None:
    chain = [statement(NEW, THIRD), statement()]
    reg = registry()
    reg.follow_rotation(chain, now=T0 + 1)
    assert reg.find("peer").did == THIRD.did
    looping = [statement(), statement(NEW, OLD)]
    reg = registry()
    with pytest.raises(AuthenticationFailed, match="loops"):
        reg.follow_rotation(looping, now=T0 + 1)
    assert reg.find("peer").did == OLD.did


@pytest.mark.parametrize(
    ("token", "error", "text"),
    [
        (jws_sign({"did": OLD.did, "successor": NEW.did, "successor_kid": NEW.kid, "issued_at": T0,
                   "overlap_until": T0 + 60}, OLD, "a2a-session+jws"), AuthenticationFailed, "typ"),
        (jws_sign({"did": OLD.did, "successor": NEW.did, "successor_kid": NEW.kid, "issued_at": T0,
                   "overlap_until": T0 + 60}, THIRD, ROTATION_TYP), AuthenticationFailed, "kid"),
        (statement(successor="did:key:zNOTAKEY", successor_kid="did:key:zNOTAKEY#zNOTAKEY"), InvalidParams,
         "successor is malformed"),
        (statement(successor="not a did"), InvalidParams, "successor is malformed"),
        (statement(successor_kid=THIRD.kid), InvalidParams, "successor_kid"),
        (statement(extra=1), InvalidParams, "exactly"),
        (statement(overlap_until=T0 - 1), InvalidParams, "overlap_until"),
        (statement(issued_at=T0 + 10_000, overlap_until=T0 + 20_000), StaleTimestamp, "future"),
        (statement(issued_at=T0 - 7200, overlap_until=T0 - 3600), StaleTimestamp, "expired"),
        ("not.a.jws", InvalidParams, "JSON|base64"),
    ],
)  # fmt: skip
def test_bad_statements_change_nothing(token: str, error: type[A2AError], text: str) -> None:
    reg = registry()
    with pytest.raises(error, match=text):
        reg.follow_rotation(token, now=T0 + 1)
    assert reg.find("peer").did == OLD.did and reg.rotations.history == {}


def test_a_statement_signed_by_another_key_under_the_old_kid_is_refused() -> None:
    forged = sign_rotation_statement(OLD, NEW, issued_at=T0, overlap_until=T0 + 60)
    head, body, _ = forged.split(".")
    other = jws_sign(json.loads(b64u_decode(body)), THIRD, ROTATION_TYP)
    with pytest.raises(AuthenticationFailed):
        verify_rotation_statement(f"{head}.{body}.{other.split('.')[2]}", now=T0)


async def test_agent_follows_the_statement_its_peer_serves(tmp_path: Path) -> None:
    ring = KeyRing(identity("served-old")).rotate(overlap=3600)
    peer = build_server(ring.current, audit=AuditLog())
    peer.key_ring = ring
    audit = AuditLog()
    async with serve_app(peer.app()) as url:
        reg = AgentRegistry([RegistryEntry("peer", ring.retired[0].identity.did, url)])
        async with A2AAgent(
            "follower", identity("follower"), registry=reg, audit=audit, verify=False
        ) as agent:
            assert await agent.follow_rotation("peer") == ring.current.did
            with pytest.raises(A2AError):
                await agent.follow_rotation("peer")  # nothing left to follow: refused, audited
    assert [(r["event"], r["client_did"], r.get("server_did")) for r in audit if r["event"] != "reject"] == [
        ("follow_rotation", ring.retired[0].identity.did, ring.current.did)
    ]
    assert audit.tally("reject", "error") == 1


async def test_fetching_a_rotation_chain_has_one_deadline(
    start: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that sends a byte before each read times out holds a per-read timeout open
    # forever; the whole fetch has one deadline instead (raising=False: the test also runs
    # where the deadline does not exist, and then fails on the time it took).
    import asyncio
    import time

    from test_didweb import Req, send

    async def drip(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, headers={"Content-Length": "100", "Content-Type": "application/json"})
        for _ in range(100):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    monkeypatch.setattr("a2a_secure.agent.ROTATION_FETCH_TIMEOUT", 0.5, raising=False)
    slow: DocServer = await start(None)
    slow.routes["/.well-known/a2a-rotation.json"] = drip
    reg = AgentRegistry([RegistryEntry("peer", OLD.did, f"http://127.0.0.1:{slow.port}")])
    async with A2AAgent("follower", identity("follower"), registry=reg) as agent:
        began = time.monotonic()
        with pytest.raises(InvalidParams, match=r"did not arrive within 0\.5 s"):
            await agent.follow_rotation("peer")
        assert time.monotonic() - began < 2
    assert reg.find("peer").did == OLD.did  # nothing changed
