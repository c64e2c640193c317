"""The ``intent.delegation`` member fuzzed through the server core (PROTOCOL.md §12.7).

Hypothesis signs intents whose ``delegation`` is anything JSON can carry: strings and arrays
of arbitrary unicode (non-ASCII, control characters, look-alike hash strings), huge strings
and arrays, nesting, wrong types, tokens that look like a compact JWS. Each goes through the
real core of a server that declares ``delegation`` (``ServerProtocol.handle``, no sockets),
on a real session. The only answers allowed are those the contract gives for the member: a
malformed member is -32602 at step 1 (unsigned); any chain that is not usable is a signed
-32042 at step 9. Never -32603 (the deny list here is in memory and readable), never an
exception out of the core; and afterwards an honest chain still works on the same session.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_secure.delegation import DelegationRules
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientHandshake, ClientSession
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore

SERVER = Identity.from_seed(b"\x11" * 32, "fuzz-delegation-server")
CLIENT = Identity.from_seed(b"\x22" * 32, "fuzz-delegation-client")
PERSON = Identity.from_seed(b"\x33" * 32, "fuzz-delegation-person")
ALLOWED = {(400, -32602), (403, -32042)}

_text = st.text(max_size=80)
_unicode_token = st.builds(
    lambda a, b, c: f"{a}.{b}.{c}", _text, _text, _text
)  # three segments, any characters
_hashlike = st.builds(lambda s: "sha256:" + s, st.text(min_size=0, max_size=70))
_huge = st.builds(lambda ch, n: ch * n, st.characters(), st.integers(4000, 20_000))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.floats(-1e300, 1e300) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
DELEGATION_VALUES = st.one_of(
    _text,
    _hashlike,
    _huge,
    st.lists(st.one_of(_text, _unicode_token, _hashlike), min_size=0, max_size=8),
    st.lists(_huge, min_size=1, max_size=3),
    st.lists(_unicode_token, min_size=1, max_size=7),
    _json,
)


def _server() -> AgentServer:
    server = AgentServer(
        SERVER, Policy.build(rate_limit=1_000_000), store=MemoryStore(), delegation=DelegationRules()
    )

    @server.intent("echo")
    def echo(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"echo": inputs}

    return server


async def _session(server: AgentServer) -> ClientSession:
    protocol = server.protocol
    hs = ClientHandshake(CLIENT, resolve_did_key(SERVER.did))
    challenge = (await protocol.handle("hello", hs.hello())).result
    policy = (await protocol.handle("proof", hs.receive_challenge(challenge))).result
    session_msg = (await protocol.handle("accept_policy", hs.receive_policy(policy))).result
    return hs.receive_session(session_msg)


async def _send(server: AgentServer, sess: ClientSession, delegation: Any) -> tuple[int, int | None, bool]:
    intent = {"goal": "echo", "inputs": {}, "delegation": delegation}
    # Signed as a client that checks nothing would sign it (the server must refuse it).
    req = sess._sign_request("intent", {"intent": intent}, m.Typ.REQUEST, "echo")
    reply = await server.protocol.handle(req.method, encoding.loads(encoding.dumps(req.params)))
    if reply.error is None:
        return reply.http_status, None, True
    signed = isinstance(reply.error.get("data"), dict) and "response_jws" in reply.error["data"]
    return reply.http_status, reply.error["code"], signed


def test_a_non_ascii_chain_is_a_signed_refusal_not_an_internal_error() -> None:
    async def run() -> None:
        server = _server()
        sess = await _session(server)
        for value in (["é"], ["a.b.ç"], ["x" * 10 + "\u202e"], [PERSON.did, "ü"]):
            assert await _send(server, sess, value) == (403, -32042, True), value
        # A string that is not a hash string is malformed: step 1, unsigned.
        for value in ("é", "sha256:" + "é" * 64, "sha256:" + "A" * 64):
            assert await _send(server, sess, value) == (400, -32602, False), value

    asyncio.run(run())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(DELEGATION_VALUES, min_size=1, max_size=6))
def test_the_delegation_member_gets_only_documented_answers(values: list[Any]) -> None:
    async def run() -> None:
        server = _server()
        sess = await _session(server)
        for value in values:
            status, code, signed = await _send(server, sess, value)
            assert (status, code) in ALLOWED, (status, code, repr(value)[:200])
            assert signed is (code == -32042), (status, code, signed)
        # An honest chain still works on the same session, in full then by name.
        chain = PERSON.delegate(CLIENT.did, ["echo"], ttl=600)
        assert await _send(server, sess, chain.tokens) == (200, None, True)
        assert await _send(server, sess, chain.hash) == (200, None, True)

    asyncio.run(run())
