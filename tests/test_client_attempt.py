"""The client's attempt machine (protocol/client_attempt.py): one call's decisions, no sockets.

The first half drives :class:`Call` alone with a fake clock: which session a call goes on,
what each answer leads to, and that a unary and a streamed call decide alike. The second
half runs one table of answers through the real ``A2AClient``'s unary and stream paths
(and the A2A transport, which is built on them), against a real ``AgentServer`` behind an
ASGI front that answers chosen intents itself, signed with the server's key: still no
socket (httpx's ``ASGITransport``), and each path must end the same way after the same
sends.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from http_helpers import read_body, replaying
from test_client_decisions import FakeClock, session, signed

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import CHAIN_UNKNOWN, Chain, DelegationRules
from a2a_secure.errors import (
    A2AError,
    InvalidParams,
    PolicyViolation,
    SessionUnknown,
    Unavailable,
    error_for_code,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client_attempt import HANDSHAKE, Call, CallOptions, LearnCard, Resend, Send
from a2a_secure.protocol.client_decisions import PeerState
from a2a_secure.protocol.client_session import ClientSession
from a2a_secure.protocol.intent_id import INTENT_ID, ids_full_message
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer

NOW = 1_800_000_000.0
SERVER_ID = Identity.from_seed(hashlib.sha256(b"attempt-server").digest(), "attempt-server")
CLIENT = Identity.from_seed(hashlib.sha256(b"attempt-client").digest(), "attempt-client")
PERSON = Identity.from_seed(hashlib.sha256(b"attempt-person").digest(), "attempt-person")
SERVER = SERVER_ID.did
ALL = frozenset({INTENT_ID, "priority", "delegation"})


def chain(now: float = NOW) -> Chain:
    return PERSON.delegate(CLIENT.did, goals=["echo", "ticks"], ttl=3600, now=now)  # type: ignore[no-any-return]


def peer_with(s: ClientSession | None, extensions: frozenset[str] = ALL) -> PeerState:
    peer = PeerState()
    peer.session = s
    peer.extensions = extensions
    return peer


def call(peer: PeerState, *, streamed: bool = False, **kw: Any) -> Call:
    kw.setdefault("options", CallOptions())
    return Call(
        peer,
        {"goal": "echo", "inputs": {}},
        client_did=CLIENT.did,
        server_did=SERVER,
        streamed=streamed,
        random_bytes=lambda n: b"\x07" * n,
        **kw,
    )


# -- which session ----------------------------------------------------------------------------
def test_a_call_opens_a_session_when_there_is_none_or_it_expired() -> None:
    clock = FakeClock(NOW)
    peer = peer_with(None)
    c = call(peer)
    assert c.next(clock.now, 0.0) is HANDSHAKE
    peer.session = session(clock, lifetime=10)
    assert isinstance(c.next(clock.now, 0.0), Send)
    c2 = call(peer)
    assert c2.next(clock.now + 10, 0.0) is HANDSHAKE


def test_an_unsealed_session_is_replaced_once_a_verified_card_declares_sealed() -> None:
    # A session opened while the card could not be had is unsealed; once a verified card
    # of that server declares "sealed", no call goes on it any more (a blocked card must
    # not downgrade).
    clock = FakeClock(NOW)
    peer = peer_with(session(clock))
    assert isinstance(call(peer).next(clock.now, 0.0), Send)
    peer.card_verified(frozenset({"sealed"}))
    c = call(peer)
    assert c.next(clock.now, 0.0) is HANDSHAKE
    peer.session = session(clock, sealed=True)
    step = c.next(clock.now, 0.0)
    assert isinstance(step, Send) and step.session.sealed
    # A handshake that still gave an unsealed session: refused, not sent in the clear.
    peer.session = session(clock)
    c = call(peer)
    assert c.next(clock.now, 0.0) is HANDSHAKE and c.next(clock.now, 0.0) is HANDSHAKE
    with pytest.raises(InvalidParams, match="refusing to send intents in the clear"):
        c.next(clock.now, 0.0)
    # sealed=False is the caller's own choice: never sealed, never refused for it.
    assert isinstance(call(peer, options=CallOptions(sealed=False)).next(clock.now, 0.0), Send)


def test_a_pinned_session_is_never_replaced_and_never_used_in_the_clear_after_a_sealed_card() -> None:
    clock = FakeClock(NOW)
    s = session(clock, lifetime=10)
    peer = peer_with(s)
    assert isinstance(call(peer, pinned=s).next(clock.now, 0.0), Send)
    with pytest.raises(SessionUnknown):
        call(peer, pinned=s).next(clock.now + 10, 0.0)
    peer.card_verified(frozenset({"sealed"}))
    with pytest.raises(InvalidParams, match="in the clear"):
        call(peer, pinned=s).next(clock.now, 0.0)


def test_a_pinned_session_names_no_intent_id_of_its_own() -> None:
    clock = FakeClock(NOW)
    s = session(clock)
    step = call(peer_with(s), pinned=s).next(clock.now, 0.0)
    assert isinstance(step, Send) and INTENT_ID not in step.intent
    step = call(peer_with(s)).next(clock.now, 0.0)
    assert isinstance(step, Send) and step.intent[INTENT_ID] == step.intent_id


def test_the_callers_check_sees_every_session_before_anything_is_signed() -> None:
    clock = FakeClock(NOW)
    seen: list[ClientSession] = []

    def refuse(s: ClientSession) -> None:
        seen.append(s)
        raise PolicyViolation("not the card shown")

    peer = peer_with(session(clock))
    with pytest.raises(PolicyViolation):
        call(peer, check=refuse).next(clock.now, 0.0)
    assert seen == [peer.session]


def test_an_undeclared_member_asks_for_the_card_once_then_is_refused() -> None:
    clock = FakeClock(NOW)
    peer = peer_with(session(clock), frozenset())
    c = call(peer, chain=chain())
    step = c.next(clock.now, 0.0)
    assert isinstance(step, LearnCard)
    c.learnt(None)  # the card could not be had: nothing known, 503 (try again), nothing sent
    with pytest.raises(Unavailable, match="could not be checked for the delegation extension"):
        c.next(clock.now, 0.0)
    c = call(peer, chain=chain())
    assert isinstance(c.next(clock.now, 0.0), LearnCard)
    c.learnt(frozenset())  # a verified card without it: the server's final word
    with pytest.raises(InvalidParams, match="does not declare the delegation extension"):
        c.next(clock.now, 0.0)
    c = call(peer, chain=chain())
    assert isinstance(c.next(clock.now, 0.0), LearnCard)
    c.learnt(frozenset({"delegation"}))
    step = c.next(clock.now, 0.0)
    assert isinstance(step, Send) and isinstance(step.intent["delegation"], list)


# -- what an answer leads to ------------------------------------------------------------------------
def chain_unknown_by_data(ref: str) -> A2AError:
    return signed(PolicyViolation("delegation refused: chain not held here", data={"chain_unknown": ref}))


def chain_unknown_by_text(ref: str) -> A2AError:
    return signed(PolicyViolation(f"delegation refused: chain {ref} {CHAIN_UNKNOWN}"))


@dataclass(frozen=True)
class Row:
    """One answer to a call's first send, and what must come of it."""

    name: str
    answer: Callable[[str], A2AError]  # from the chain's name
    outcome: Resend | type[A2AError]
    pool: str | None = None


TABLE = [
    Row("chain unknown, data member", chain_unknown_by_data, Resend.CHAIN_UNKNOWN),
    Row("chain unknown, older message text", chain_unknown_by_text, Resend.CHAIN_UNKNOWN),
    Row(
        "chain unknown, unsigned",
        lambda ref: PolicyViolation("x", data={"chain_unknown": ref}),
        PolicyViolation,
    ),
    Row(
        "chain unknown naming another chain",
        lambda ref: chain_unknown_by_data("sha256:" + "0" * 64),
        PolicyViolation,
    ),
    Row("ids full", lambda ref: signed(Unavailable(ids_full_message(5), retry_after=7)), Resend.IDS_FULL),
    Row("another signed refusal", lambda ref: signed(PolicyViolation("goal refused")), PolicyViolation),
    Row(
        "503, own quota full",
        lambda ref: signed(error_for_code(-32048, "busy", {"retry_after": 2, "pool": "own"})),
        Unavailable,
        "own",
    ),
    Row(
        "503, shared pool full",
        lambda ref: error_for_code(-32048, "busy", {"retry_after": 2, "pool": "shared"}),
        Unavailable,
        "shared",
    ),
    Row("session unknown", lambda ref: SessionUnknown(), Resend.SESSION_UNKNOWN),
]


def _decide(row: Row, *, streamed: bool) -> tuple[Any, Any]:
    clock = FakeClock(NOW)
    peer = peer_with(session(clock))
    ch = chain()
    peer.chains_sent.add(ch.hash)  # sent in full earlier on this session: named by hash now
    c = call(peer, streamed=streamed, chain=ch)
    first = c.next(clock.now, 100.0)
    assert isinstance(first, Send) and first.intent["delegation"] == ch.hash
    try:
        why = c.failed(row.answer(ch.hash), mono=100.0)
    except A2AError as exc:
        return type(exc), getattr(exc, "pool", None)
    if why is Resend.SESSION_UNKNOWN:
        assert c.next(clock.now, 100.0) is HANDSHAKE
        peer.new_session()
        peer.session, peer.extensions = session(clock), ALL
    again = c.next(clock.now, 100.0)
    assert isinstance(again, Send)
    return why, (type(again.intent["delegation"]).__name__, again.intent.get(INTENT_ID) is None)


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_a_unary_and_a_streamed_call_decide_alike(row: Row) -> None:
    unary, stream = _decide(row, streamed=False), _decide(row, streamed=True)
    assert unary == stream
    outcome, detail = unary
    assert outcome == row.outcome
    if outcome is Unavailable:
        assert detail == row.pool
    elif outcome is Resend.CHAIN_UNKNOWN:
        assert detail == ("list", False)  # the chain in full, the same intent_id
    elif outcome is Resend.IDS_FULL:
        assert detail == ("str", True)  # no id, the chain kept


def test_a_stream_that_gave_an_item_is_never_resent() -> None:
    clock = FakeClock(NOW)
    for answer in (chain_unknown_by_data, lambda ref: SessionUnknown()):
        peer = peer_with(session(clock))
        ch = chain()
        peer.chains_sent.add(ch.hash)
        c = call(peer, streamed=True, chain=ch)
        assert isinstance(c.next(clock.now, 0.0), Send)
        with pytest.raises(A2AError):
            c.failed(answer(ch.hash), yielded=True)


def test_a_chain_is_resent_in_full_once_per_call() -> None:
    clock = FakeClock(NOW)
    peer = peer_with(session(clock))
    ch = chain()
    peer.chains_sent.add(ch.hash)
    c = call(peer, chain=ch)
    c.next(clock.now, 0.0)
    assert c.failed(chain_unknown_by_data(ch.hash)) is Resend.CHAIN_UNKNOWN
    c.next(clock.now, 0.0)
    with pytest.raises(PolicyViolation):
        c.failed(chain_unknown_by_text(ch.hash))


def test_the_ids_full_pause_runs_on_the_monotonic_clock_the_caller_passes() -> None:
    clock = FakeClock(NOW)
    peer = peer_with(session(clock))
    c = call(peer)
    c.next(clock.now, 50.0)
    assert c.failed(signed(Unavailable(ids_full_message(3), retry_after=7)), mono=50.0) is Resend.IDS_FULL
    assert peer.ids_paused(56.9) and not peer.ids_paused(57.0)
    step = call(peer).next(clock.now, 56.0)
    assert isinstance(step, Send) and INTENT_ID not in step.intent


def test_a_503s_pool_is_read_only_from_its_two_values() -> None:
    assert error_for_code(-32048, "busy", {"pool": "own"}).pool == "own"  # type: ignore[attr-defined]
    assert error_for_code(-32048, "busy", {"pool": "everyone"}).pool is None  # type: ignore[attr-defined]
    assert error_for_code(-32048, "busy", None).pool is None  # type: ignore[attr-defined]
    assert Unavailable("busy").pool is None


# -- the same table through the client's paths -----------------------------------------------------
ECHO = {"goal": "echo", "inputs": {"n": 1}}


def build_app() -> Any:
    # Not sealed: the front forges its answers in the clear (a sealed session's error data
    # is read only from data.sealed; tests/test_sealed_default.py covers that side).
    plain = ServerLimits(sealed_intents=False)
    server = AgentServer(SERVER_ID, delegation=DelegationRules(), name="attempt", limits=plain)

    @server.intent("echo")
    async def echo(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        return {"echo": inputs, "for": ctx.principal}

    async def ticks(inputs: dict[str, Any], ctx: IntentContext) -> AsyncIterator[dict[str, Any]]:
        for i in range(2):
            yield {"i": i, "for": ctx.principal}

    server.add_stream("ticks", ticks)
    return server.app()


class Front:
    """An ASGI front of a real server: answers the next armed intents itself, with the
    error given (signed with the server's key, over the very request, when it says so),
    and lets everything else through. Every intent sent is kept."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.armed: list[tuple[int, A2AError]] = []  # (HTTP status, error)
        self.intents: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/a2a/intent":
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        request = json.loads(body)
        if request["method"] == "intent":
            self.intents.append(request["params"]["intent"])
            if self.armed:
                status, exc = self.armed.pop(0)
                return await self._answer(send, request, status, exc)
        await self.app(scope, replaying(body), send)

    async def _answer(self, send: Any, request: dict[str, Any], status: int, exc: A2AError) -> None:
        params = request["params"]
        error: dict[str, Any] = {"code": exc.code, "message": exc.message, "data": dict(exc.data or {})}
        if exc.signed:
            payload = {
                "session_id": params["session_id"],
                "sequence": params["sequence"],
                "request_hash": m.request_hash(params["request_jws"]),
                "status": "error",
                "error": {"code": exc.code, "message": exc.message},
                "timestamp": int(time.time()),  # the server's own wall clock
            }
            error["data"]["response_jws"] = jws_sign(payload, SERVER_ID, m.Typ.RESPONSE)
        body = encoding.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


STATUS = {PolicyViolation: 403, Unavailable: 503, SessionUnknown: 401}


async def _through(path: str, row: Row) -> tuple[Any, int, Any]:
    """Run ``row`` through ``path``; (outcome, sends after the armed one, delegation form)."""
    front = Front(build_app())
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://127.0.0.1:9")
    ch = PERSON.delegate(CLIENT.did, goals=["echo", "ticks"], ttl=3600, targets=[SERVER])
    async with http, A2AClient(CLIENT, http=http, retry=RetryPolicy(attempts=1)) as client:
        url = "http://127.0.0.1:9"
        goal = "ticks" if path == "stream" else "echo"
        intent = {"goal": goal, "inputs": {}}

        async def run() -> Any:
            if path == "stream":
                return [i async for i in client.stream(SERVER, intent, endpoint=url, on_behalf_of=ch)]
            return (await client.request(SERVER, intent, endpoint=url, on_behalf_of=ch)).result

        await run()  # the chain goes in full on this session; named by hash from now on
        exc = row.answer(ch.hash)
        front.armed.append((STATUS.get(type(exc), 403), exc))
        before = len(front.intents)
        try:
            got = await run()
        except A2AError as raised:
            return (type(raised), getattr(raised, "pool", None)), len(front.intents) - before, None
        last = front.intents[-1]
        outcome = ("ok", got[0]["for"] if path == "stream" else got["for"])
        return outcome, len(front.intents) - before, type(last.get("delegation")).__name__


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
async def test_the_table_ends_alike_through_the_unary_and_the_stream_paths(row: Row) -> None:
    unary = await _through("unary", row)
    stream = await _through("stream", row)
    assert unary == stream
    outcome, sends, form = unary
    if isinstance(row.outcome, Resend):
        assert outcome == ("ok", PERSON.did) and sends == 2
        if row.outcome is Resend.CHAIN_UNKNOWN:
            assert form == "list"
    else:
        assert outcome == (row.outcome, row.pool) and sends == 1
