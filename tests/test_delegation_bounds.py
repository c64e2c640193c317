"""Delegation chains against time and against floods (PROTOCOL.md §12.7), over real HTTP.

* A did:web principal's retired key signs no usable link once its ``expires`` (Unix
  seconds) has passed, as the handshake refuses it: the resolver's cache clock is monotonic
  and is never compared with ``expires``. Clocks are fakes: the wall clock moves past the
  window while the resolver's clock stands still (its cached document stays fresh).
* A flood of distinct chains from one session costs at most its rate in verifications (the
  rest get a signed 503 before any verification) and evicts no other session's chains.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from approval_helpers import fixed_identity
from attack_helpers import ExampleMethod, Wire
from test_didweb import DocServer, ca, client_ctx, json_route, resolver_for, server, servers, start  # noqa: F401

from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.delegation import Chain, DelegationRules
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.rotation import KeyRing
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientSession, PreparedRequest
from a2a_secure.protocol.server import delegation as server_side
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock, serve_app

AGENT = fixed_identity("bounds-agent")
CLIENT = fixed_identity("bounds-client")
OTHER = fixed_identity("bounds-other-client")
PERSON = fixed_identity("bounds-person")


@contextlib.asynccontextmanager
async def agent(clock: FakeClock, *, rate_limit: int = 100_000, resolver: Any = None) -> AsyncIterator[Wire]:
    sink = MemoryAuditSink()
    calls: Counter[str] = Counter()
    app_server = AgentServer(
        AGENT,
        Policy.build(rate_limit=rate_limit),
        store=MemoryStore(),
        audit=Auditor([sink], role="app_server"),
        clock=clock,
        monotonic=clock.monotonic,
        delegation=DelegationRules(),
    )
    if resolver is not None:
        app_server.resolver = resolver

    @app_server.intent("echo")
    def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        calls["echo"] += 1
        return {"echo": inputs}

    async with serve_app(app_server.app()) as url, httpx.AsyncClient(timeout=15) as http:
        yield Wire(app_server, url, http, clock, sink, calls, ExampleMethod())


def under(sess: ClientSession, chain: Chain | str, *, sequence: int | None = None) -> PreparedRequest:
    if sequence is not None:
        sess.last_sequence = sequence - 1  # the same sequence again: a replay with another chain
    value = chain if isinstance(chain, str) else chain.tokens
    return sess.prepare_intent({"goal": "echo", "inputs": {}, "delegation": value})


async def answer(w: Wire, sess: ClientSession, req: PreparedRequest) -> tuple[int, int | None, str]:
    resp = await w.send(req)
    body = resp.json()
    if "error" in body:
        assert sess.error_from_reply(req, body["error"]).signed, body
        return resp.status_code, body["error"]["code"], body["error"]["message"]
    sess.verify_result(req, body["result"])
    return resp.status_code, None, ""


# -- wall time and monotonic time ------------------------------------------------------------------
async def test_a_did_web_principals_retired_key_signs_no_link_after_its_expires(
    server: DocServer,  # noqa: F811
    client_ctx: Any,  # noqa: F811
) -> None:
    t0 = float(int(time.time()))
    old = Identity.generate("web-principal").with_did_web(server.did, f"{server.did}#key-1")
    ring = KeyRing(old).rotate(overlap=600, now=t0)
    server.routes["/.well-known/did.json"] = json_route(ring.did_document(now=t0))
    clock = FakeClock(t0 + 10)
    # The resolver's cache clock stands still: its document stays fresh all along.
    resolver = resolver_for(client_ctx, clock=FakeClock(0.0).monotonic)
    chain = old.delegate(CLIENT.did, ["echo"], ttl=7200, now=t0)
    async with agent(clock, resolver=resolver) as w:
        first = await w.open_session(CLIENT)
        assert await answer(w, first, under(first, chain)) == (200, None, "")
        assert await answer(w, first, under(first, chain.hash)) == (200, None, "")
        clock.advance(600)  # now == expires: the retired key's window is over
        # A new session sends the chain in full: the key is resolved and refused ...
        second = await w.open_session(CLIENT)
        status, code, message = await answer(w, second, under(second, chain))
        assert (status, code) == (403, -32042)
        assert (
            old.kid in message and "retired" in message and message.startswith("delegation refused: link 0")
        )
        # ... and the session that verified it before no longer uses it either.
        status, code, again = await answer(w, first, under(first, chain.hash))
        assert (status, code, again) == (403, -32042, message)
        assert w.calls["echo"] == 2
        # The handshake refuses the same key at the same time (the rule the links now share).
        resp = await w.rpc("hello", w.handshake(old).hello())
        assert resp.status_code == 401 and old.kid in resp.json()["error"]["message"]


# -- floods ----------------------------------------------------------------------------------------
async def test_a_flood_of_chains_on_one_session_is_bounded_and_evicts_no_other_sessions_chains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A small process-wide bound, so that a flood would reach it (wherever it is kept).
    monkeypatch.setattr("a2a_secure.protocol.server.chain_cache.MAX_CACHED_CHAINS", 4)
    monkeypatch.setattr(server_side, "MAX_CACHED_CHAINS", 4, raising=False)
    verified: list[str] = []
    real = server_side.verify_signatures

    def counted(chain: Chain, key_for: Any) -> None:
        verified.append(chain.hash)
        real(chain, key_for)

    monkeypatch.setattr(server_side, "verify_signatures", counted)
    rate = 10
    clock = FakeClock(float(int(time.time())))
    async with agent(clock, rate_limit=rate) as w:
        other = await w.open_session(OTHER)
        kept = PERSON.delegate(OTHER.did, ["echo"], ttl=3600, now=clock.now)
        assert await answer(w, other, under(other, kept)) == (200, None, "")
        flooder = await w.open_session(CLIENT)
        verified.clear()
        answers: Counter[tuple[int, int | None]] = Counter()
        for i in range(3 * rate):
            chain = PERSON.delegate(CLIENT.did, ["echo"], ttl=3600 + i, now=clock.now)
            status, code, _ = await answer(w, flooder, under(flooder, chain, sequence=1))
            answers[(status, code)] += 1
        # The other session's chain is still kept: its name alone is enough (not verified again).
        assert await answer(w, other, under(other, kept.hash)) == (200, None, "")
        # At most its rate in verifications; then a signed 503 before any is made.
        assert len(verified) == rate, len(verified)
        assert answers == {(200, None): 1, (409, -32044): rate - 1, (503, -32048): 2 * rate}, answers
