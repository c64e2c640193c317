"""Real, signed examples of every message of docs/PROTOCOL.md.

Runs one handshake, an intent, a signed error, a streamed answer, a close and an unsigned
error between a real client state machine and a real ``ServerProtocol``, in memory, with
fixed keys, a fixed clock and deterministic randomness, and prints every message (and every
decoded JWS payload) as the JSON the wire carries. Then, on two more sessions, the §12
extensions: an intent with ``priority`` (§12.3), and an intent with ``intent_id`` sent on one
session and again on the next, plus another intent reusing the id (§12.5). Ed25519
signatures are deterministic, so the output is the same on every run.

    python scripts/protocol_examples.py                           # print the examples
    python scripts/protocol_examples.py --update docs/PROTOCOL.md # rewrite them in the doc
    python scripts/protocol_examples.py --check docs/PROTOCOL.md  # exit 1 if the doc drifted

In the document each example is a fenced block preceded by ``<!-- example: NAME -->`` (with
``http=STATUS`` for an HTTP answer). ``tests/test_protocol_doc.py`` replays the documented
messages against the code.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from a2a_secure.delegation import Chain, DelegationRules, issue
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import sealing
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.intent_id import CARD_MEMBER, new_intent_id
from a2a_secure.protocol.messages import PROTOCOL_NAME
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, Reply, ServerLimits
from a2a_secure.protocol.wire import encode_error, encode_result
from a2a_secure.runtime.exactly_once import server_extensions
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.server.test_agent import register_test_agent
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import FakeClock

__all__ = [
    "AT",
    "DELEGATION_AT",
    "EXAMPLE_RE",
    "POLICY",
    "T0",
    "Example",
    "HandlerRun",
    "assistant_identity",
    "client_identity",
    "client_random",
    "delegation_card",
    "example_chain",
    "examples_in",
    "generate",
    "make_delegation_server",
    "make_server",
    "open_session",
    "person_identity",
    "seeded_random",
    "server_card",
    "server_identity",
]

T0: Final = 1_763_700_000
# When each step happens (Unix seconds): the client's message and the server's answer to it.
AT: Final[dict[str, int]] = {
    "hello": T0,
    "challenge": T0 + 1,
    "proof": T0 + 2,
    "accept_policy": T0 + 3,
    "intent": T0 + 10,
    "error": T0 + 11,
    "stream": T0 + 12,
    "close": T0 + 13,
    "unsigned": T0 + 14,
    # §12: two more sessions (the first one is closed by then)
    "handshake_2": T0 + 20,
    "intent_id": T0 + 30,
    "priority": T0 + 31,
    "handshake_3": T0 + 40,
    "intent_id_resend": T0 + 50,
    "intent_id_conflict": T0 + 51,
    # §12.6: a sealed session with a server that declares the extension
    "handshake_4": T0 + 60,
    "sealed": T0 + 70,
}
PLAIN: Final = ServerLimits(sealed_intents=False)  # a server that turned sealing off (§12.6)
POLICY: Final = Policy(
    rate_limit=1000,
    rate_period=3600,
    allowed_intents=("echo", "count"),
    blocked_intents=(),
    session_timeout=3600,
)
# A tagged example: the HTML comment, then a fenced block (json or text).
EXAMPLE_RE: Final = re.compile(
    r"<!-- example: (?P<name>[a-z0-9-]+)(?: http=(?P<http>\d{3}))? -->\n"
    r"```(?P<lang>json|text)\n(?P<body>.*?)\n```",
    re.DOTALL,
)


def seeded_random(label: bytes) -> Callable[[int], bytes]:
    """A deterministic random source: SHA-256 of ``label`` and a counter (never all zero)."""
    counter = 0

    def draw(n: int) -> bytes:
        nonlocal counter
        out = b""
        while len(out) < n:
            counter += 1
            out += hashlib.sha256(label + counter.to_bytes(8, "big")).digest()
        return out[:n]

    return draw


def client_identity() -> Identity:
    """The example client's fixed did:key identity."""
    return Identity.from_seed(hashlib.sha256(b"a2a-secure example client").digest(), "example-client")


def server_identity() -> Identity:
    """The example server's fixed did:key identity."""
    return Identity.from_seed(hashlib.sha256(b"a2a-secure example server").digest(), "example-server")


def client_random() -> Callable[[int], bytes]:
    """The client's random source (it draws ``nonce_a``)."""
    return seeded_random(b"a2a-secure example client random")


def server_card(identity: Identity, limits: ServerLimits | None = None) -> dict[str, Any]:
    """The server's agent card (§4); its hash is the server's ``manifest_hash``.

    ``limits``: the server's (its extensions follow from them); None: those of a server that
    turned sealing off (§12.6), as the examples of sections 5 to 11 and §12.5 are made with.
    """
    return {
        "name": "example-server",
        "description": "The test agent of section 11",
        "version": "1.0.0",
        "url": "https://server.example",
        "did": identity.did,
        "protocol": PROTOCOL_NAME,
        "endpoints": {"handshake": "/a2a/handshake", "intent": "/a2a/intent"},
        "intents": ["count", "echo"],
        "public_keys": [identity.public_key_entry()],
        "streaming_intents": ["count"],
        # What make_server's limits and store serve (§12.3, §12.5), as AgentServer's card says.
        CARD_MEMBER: server_extensions(limits or PLAIN, MemoryStore()),
    }


@dataclass(frozen=True)
class HandlerRun:
    """One run of a test agent handler, as :func:`make_server` records it."""

    goal: str
    intent_id: str | None
    priority: int
    session_id: str
    sequence: int


class _RecordingDispatcher(IntentDispatcher):
    # The test agent, recording each handler run: the intent_id examples show that a resend
    # is answered without running the handler again.
    def __init__(self, runs: list[HandlerRun]) -> None:
        super().__init__()
        self._runs = runs

    def _record(self, goal: str, context: IntentContext) -> None:
        self._runs.append(
            HandlerRun(goal, context.intent_id, context.priority, context.session_id, context.sequence)
        )

    async def run(self, goal: str, inputs: Any, context: IntentContext) -> Any:
        self._record(goal, context)
        return await super().run(goal, inputs, context)

    def open_stream(self, goal: str, inputs: Any, context: IntentContext) -> AsyncIterator[Any]:
        self._record(goal, context)
        return super().open_stream(goal, inputs, context)


def make_server(
    clock: FakeClock,
    runs: list[HandlerRun] | None = None,
    *,
    sealed: bool = False,
    random_bytes: Callable[[int], bytes] | None = None,
    limits: ServerLimits | None = None,
) -> ServerProtocol:
    """A fresh in-memory server serving the test agent (§11) under :data:`POLICY`.

    Each handler run is appended to ``runs`` when it is given. ``sealed``: the server of
    §12.6's examples, which declares sealed intents (another card, so another manifest hash).
    ``limits``: other bounds (then ``sealed`` is theirs).
    """
    identity = server_identity()
    dispatcher = _RecordingDispatcher([] if runs is None else runs)
    register_test_agent(dispatcher)
    limits = limits or ServerLimits(sealed_intents=sealed)
    return ServerProtocol(
        identity,
        POLICY,
        store=MemoryStore(),
        resolver=DIDResolver(clock=clock),
        dispatcher=dispatcher,
        manifest_hash=encoding.hash_of(server_card(identity, limits)),
        clock=clock,
        random_bytes=random_bytes or seeded_random(b"a2a-secure example server random"),
        monotonic=clock.monotonic,
        limits=limits,
    )


class Draws:
    """A random source that remembers what it gave (the §12.6 vector shows the ephemeral keys)."""

    def __init__(self, source: Callable[[int], bytes]) -> None:
        self._source = source
        self.given: list[bytes] = []

    def __call__(self, n: int) -> bytes:
        out = self._source(n)
        self.given.append(out)
        return out


SEALED_CLIENT_RANDOM: Final = b"a2a-secure example client random 4"
SEALED_SERVER_RANDOM: Final = b"a2a-secure example sealed server random"


@dataclass
class Example:
    """One documented message: its JSON value (or text) and, for an answer, its HTTP status."""

    name: str
    value: Any
    http: int | None = None
    text: bool = False

    def render(self) -> str:
        """The tagged block as it stands in the document."""
        tag = f"<!-- example: {self.name}{f' http={self.http}' if self.http else ''} -->"
        if self.text:
            return f"{tag}\n```text\n{self.value}\n```"
        return f"{tag}\n```json\n{json.dumps(self.value, indent=2, ensure_ascii=False)}\n```"


@dataclass
class _Run:
    clock: FakeClock = field(default_factory=lambda: FakeClock(float(T0)))
    examples: dict[str, Example] = field(default_factory=dict)

    def add(self, name: str, value: Any, http: int | None = None, *, text: bool = False) -> None:
        self.examples[name] = Example(name, value, http, text)

    def payload(self, name: str, token: str) -> None:
        self.add(name, jws_decode_unverified(token)[1])


def _request(method: str, request_id: str | int, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "id": request_id, "params": params}


def _answer(request_id: str | int, reply: Reply) -> dict[str, Any]:
    body = (
        encode_result(request_id, reply.result)
        if reply.error is None
        else encode_error(request_id, reply.error)
    )
    return encoding.loads(body)  # type: ignore[no-any-return]


async def _call(server: ServerProtocol, body: dict[str, Any]) -> Reply:
    # A deep copy through the wire form: the server sees what a peer would send.
    return await server.handle(body["method"], encoding.loads(encoding.dumps(body["params"])))


async def _intent(
    run: _Run, server: ServerProtocol, session: ClientSession, name: str, rid: str, intent: dict[str, Any]
) -> tuple[PreparedRequest, dict[str, Any], Reply]:
    req = session.prepare_intent(intent)
    body = _request("intent", rid, req.params)
    run.add(name, body)
    return req, body, await _call(server, body)


async def open_session(
    server: ServerProtocol, clock: FakeClock, start: int, label: bytes, *, seal: bool = False
) -> ClientSession:
    """An undocumented handshake from ``start`` on, as §5's (one second a step), for §12's sessions.

    ``label`` seeds the client's random source, so each session has its own ``nonce_a``;
    ``seal``: the client brings a seal_key (§12.6).
    """
    hs = ClientHandshake(
        client_identity(),
        resolve_did_key(server_identity().did),
        clock=clock,
        random_bytes=seeded_random(label),
    )
    clock.now = start
    hello = hs.hello()
    clock.now = start + 1
    challenge = await _call(server, _request("hello", 1, hello))
    clock.now = start + 2
    policy = await _call(server, _request("proof", 2, hs.receive_challenge(challenge.result)))
    hs.seal = seal
    clock.now = start + 3
    session = await _call(server, _request("accept_policy", 3, hs.receive_policy(policy.result)))
    return hs.receive_session(session.result)


async def generate() -> dict[str, Example]:
    """Run the whole exchange and return every example by name."""
    run = _Run()
    clock = run.clock
    runs: list[HandlerRun] = []
    server = make_server(clock, runs)
    hs = ClientHandshake(
        client_identity(),
        resolve_did_key(server_identity().did),
        clock=clock,
        random_bytes=client_random(),
    )

    # §4: the card whose hash is the CHALLENGE's manifest_hash
    run.add("agent-card", server_card(server_identity()), 200)

    # §5.1-§5.2
    clock.now = AT["hello"]
    hello = _request("hello", 1, hs.hello())
    run.add("hello", hello)
    clock.now = AT["challenge"]
    reply = await _call(server, hello)
    challenge = _answer(1, reply)
    run.add("challenge", challenge, reply.http_status)
    token = challenge["result"]["policy_signature"]
    run.add("jws-header", jws_decode_unverified(token)[0])
    run.payload("policy-payload", token)
    # §5.3-§5.4
    clock.now = AT["proof"]
    proof = _request("proof", 2, hs.receive_challenge(challenge["result"]))
    run.add("proof", proof)
    run.payload("proof-payload", proof["params"]["proof_jws"])
    reply = await _call(server, proof)
    policy = _answer(2, reply)
    run.add("policy", policy, reply.http_status)
    # §5.5-§5.6
    clock.now = AT["accept_policy"]
    accept = _request("accept_policy", 3, hs.receive_policy(policy["result"]))
    run.add("accept-policy", accept)
    run.payload("accept-payload", accept["params"]["accept_jws"])
    reply = await _call(server, accept)
    session_msg = _answer(3, reply)
    run.add("session", session_msg, reply.http_status)
    run.payload("session-payload", session_msg["result"]["session_jws"])
    session = hs.receive_session(session_msg["result"])

    # §6.1-§6.2: a result
    clock.now = AT["intent"]
    intent = {
        "goal": "echo",
        "domain": "test",
        "inputs": {"text": "Hello world", "target_language": "es"},
        "constraints": {"timeout_ms": 5000},
    }
    req, body, reply = await _intent(run, server, session, "intent-request", "req-1", intent)
    run.payload("request-payload", body["params"]["request_jws"])
    result = _answer("req-1", reply)
    run.add("intent-result", result, reply.http_status)
    run.payload("response-payload", result["result"]["response_jws"])
    session.verify_result(req, result["result"])

    # §6.2: a signed error (the handler refuses its inputs)
    clock.now = AT["error"]
    req, body, reply = await _intent(
        run, server, session, "error-request", "req-2", {"goal": "count", "inputs": {"n": 0}}
    )
    error = _answer("req-2", reply)
    run.add("error-result", error, reply.http_status)
    run.payload("error-payload", error["error"]["data"]["response_jws"])
    if not session.error_from_reply(req, error["error"]).signed:
        raise SystemExit("the example error does not verify")

    # §6.4: a stream
    clock.now = AT["stream"]
    stream_intent = {"goal": "count", "inputs": {"n": 2}, "constraints": {"stream": True}}
    req, body, reply = await _intent(run, server, session, "stream-request", "req-3", stream_intent)
    assert reply.stream is not None, reply.error
    events = [event async for event in reply.stream]
    for index, event in enumerate(events):
        session.verify_event(req, event, index)
    # The first (partial) and the final event as JSON; all of them as the wire frames them.
    for name, event in (("first", events[0]), ("final", events[-1])):
        run.add(f"stream-event-{name}", encoding.loads(encode_result("req-3", event)))
        run.payload(f"event-payload-{name}", event["response_jws"])
    frames = [f"id: {i}\ndata: {encode_result('req-3', e).decode()}\n" for i, e in enumerate(events)]
    run.add("stream-body", "\n".join(frames), 200, text=True)

    # §6.3: close
    clock.now = AT["close"]
    close_req = session.prepare_close()
    close = _request("close", "req-4", close_req.params)
    run.add("close-request", close)
    run.payload("close-payload", close["params"]["request_jws"])
    reply = await _call(server, close)
    closed = _answer("req-4", reply)
    run.add("closed-result", closed, reply.http_status)
    run.payload("closed-payload", closed["result"]["response_jws"])
    session.verify_closed(close_req, closed["result"])

    # §6.3, §7: the same close again meets an unknown session, an unsigned error
    clock.now = AT["unsigned"]
    reply = await _call(server, close)
    run.add("unsigned-error", _answer("req-4", reply), reply.http_status)

    # §12.5 on a second session: an intent named by an intent_id runs, and its answer is kept
    second = await open_session(server, clock, AT["handshake_2"], b"a2a-secure example client random 2")
    clock.now = AT["intent_id"]
    booking = {
        "goal": "echo",
        "inputs": {"text": "Book room 4 at 10:00"},
        "intent_id": new_intent_id(seeded_random(b"a2a-secure example intent_id")),
    }
    req, body, reply = await _intent(run, server, second, "intent-id-request", "req-5", booking)
    answer = _answer("req-5", reply)
    run.add("intent-id-result", answer, reply.http_status)
    run.payload("intent-id-payload", answer["result"]["response_jws"])
    second.verify_result(req, answer["result"])

    # §12.3: a priority within the default right (3)
    clock.now = AT["priority"]
    urgent = {"goal": "echo", "inputs": {"text": "Summarize the minutes"}, "priority": 2}
    req, body, reply = await _intent(run, server, second, "priority-request", "req-6", urgent)
    answer = _answer("req-6", reply)
    run.add("priority-result", answer, reply.http_status)
    second.verify_result(req, answer["result"])

    # §12.5 on a third session: the resend gets the first answer signed again, the handler
    # does not run; another intent under the same id is refused.
    third = await open_session(server, clock, AT["handshake_3"], b"a2a-secure example client random 3")
    clock.now = AT["intent_id_resend"]
    req, body, reply = await _intent(run, server, third, "intent-id-resend-request", "req-7", booking)
    answer = _answer("req-7", reply)
    run.add("intent-id-resend-result", answer, reply.http_status)
    run.payload("intent-id-resend-payload", answer["result"]["response_jws"])
    third.verify_result(req, answer["result"])
    clock.now = AT["intent_id_conflict"]
    other = {**booking, "inputs": {"text": "Book room 5 at 10:00"}}
    req, body, reply = await _intent(run, server, third, "intent-id-conflict-request", "req-8", other)
    answer = _answer("req-8", reply)
    run.add("intent-id-conflict-error", answer, reply.http_status)
    run.payload("intent-id-conflict-payload", answer["error"]["data"]["response_jws"])
    if not third.error_from_reply(req, answer["error"]).signed:
        raise SystemExit("the example intent_id conflict does not verify")
    if [r.goal for r in runs if r.intent_id == booking["intent_id"]] != ["echo"]:
        raise SystemExit(f"the intent_id example ran {runs}, not once")
    if [r.priority for r in runs if r.session_id == second.session_id and r.sequence == 2] != [2]:
        raise SystemExit(f"the priority example did not run at priority 2: {runs}")
    await _sealed_examples(run)
    await _delegation_examples(run)
    await _capacity_examples(run)
    return run.examples


async def _capacity_examples(run: _Run) -> None:
    """A 503 for a full bound names the pool that is full: a stranger's HELLO finds the share of
    pending handshakes strangers may hold (half of 2, the other half kept for the person)."""
    clock = FakeClock(float(AT["hello"]))
    limits = ServerLimits(
        max_pending_total=2, reserved_callers=frozenset({person_identity().did}), reserved_share=0.5
    )
    server = make_server(
        clock, random_bytes=seeded_random(b"a2a-secure example full server random"), limits=limits
    )
    replies = []
    for label in (b"a2a-secure example full 1", b"a2a-secure example full 2"):
        server_keys = resolve_did_key(server.identity.did)
        hs = ClientHandshake(client_identity(), server_keys, clock=clock, random_bytes=seeded_random(label))
        replies.append(await _call(server, _request("hello", 1, hs.hello())))
    if replies[0].error is not None or replies[1].http_status != 503:
        raise SystemExit(f"the full-bound example did not fill the pool: {replies}")
    run.add("full-bound-error", _answer(1, replies[1]), replies[1].http_status)


async def _sealed_examples(run: _Run) -> None:
    """§12.6: a handshake that agrees on sealing keys, a sealed intent, and the key schedule."""
    clock = run.clock
    client_draws = Draws(seeded_random(SEALED_CLIENT_RANDOM))
    server_draws = Draws(seeded_random(SEALED_SERVER_RANDOM))
    server = make_server(clock, sealed=True, random_bytes=server_draws)
    hs = ClientHandshake(
        client_identity(), resolve_did_key(server_identity().did), clock=clock, random_bytes=client_draws
    )
    start = AT["handshake_4"]
    clock.now = start
    hello = hs.hello()
    clock.now = start + 1
    challenge = await _call(server, _request("hello", 1, hello))
    clock.now = start + 2
    policy = await _call(server, _request("proof", 2, hs.receive_challenge(challenge.result)))
    hs.seal = True  # the card that hashes to the CHALLENGE's manifest_hash declares "sealed"
    clock.now = start + 3
    accept = _request("accept_policy", 3, hs.receive_policy(policy.result))
    client_private = client_draws.given[-1]  # drawn for the seal_key of this ACCEPT_POLICY
    run.payload("sealed-accept-payload", accept["params"]["accept_jws"])
    reply = await _call(server, accept)
    server_private = server_draws.given[-1]  # drawn for the server's seal_key, last of all
    session_msg = _answer(3, reply)
    run.payload("sealed-session-payload", session_msg["result"]["session_jws"])
    session = hs.receive_session(session_msg["result"])

    clock.now = AT["sealed"]
    secret = {"goal": "echo", "inputs": {"text": "The merger closes on Friday"}}
    req, _body, reply = await _intent(run, server, session, "sealed-intent-request", "req-9", secret)
    answer = _answer("req-9", reply)
    run.payload("sealed-request-payload", req.params["request_jws"])
    run.add("sealed-intent-result", answer, reply.http_status)
    run.payload("sealed-response-payload", answer["result"]["response_jws"])
    if session.verify_result(req, answer["result"]).result != secret["inputs"]:
        raise SystemExit("the sealed example does not open to its inputs")

    accept_payload = jws_decode_unverified(accept["params"]["accept_jws"])[1]
    session_payload = jws_decode_unverified(session_msg["result"]["session_jws"])[1]
    transcript = sealing.transcript(
        client_did=client_identity().did,
        server_did=server_identity().did,
        nonce_a=accept_payload["nonce_a"],
        nonce_b=accept_payload["nonce_b"],
        session_id=session.session_id,
        session_commitment=session.session_commitment,
        client_seal_key=accept_payload[sealing.KEY_MEMBER],
        server_seal_key=session_payload[sealing.KEY_MEMBER],
    )
    shared = X25519PrivateKey.from_private_bytes(client_private).exchange(
        X25519PublicKey.from_public_bytes(sealing.parse_seal_key(session_payload[sealing.KEY_MEMBER]))
    )
    keys = sealing.derive_keys(shared, transcript)
    sequence, goal = req.sequence, secret["goal"]
    run.add(
        "sealed-key-schedule",
        {
            "client_seal_private": client_private.hex(),
            "server_seal_private": server_private.hex(),
            "shared_secret": shared.hex(),
            "transcript": transcript.decode(),
            "salt": hashlib.sha256(transcript).hexdigest(),
            "info": sealing.LABEL + " keys",
            "c2s_key": keys.c2s.hex(),
            "s2c_key": keys.s2c.hex(),
            "inputs_nonce": sealing.nonce(sequence, sealing.Part.INPUTS).hex(),
            "inputs_aad": sealing.aad(
                "c2s", session.session_id, sequence, sealing.Part.INPUTS, 0, goal
            ).decode(),
            "inputs_plaintext": encoding.dumps(secret["inputs"]).decode(),
            "result_nonce": sealing.nonce(sequence, sealing.Part.RESULT).hex(),
            "result_aad": sealing.aad(
                "s2c", session.session_id, sequence, sealing.Part.RESULT, 0, req.request_hash
            ).decode(),
        },
    )


# -- §12.7: delegation, on a server of its own (its card declares the extension) ----------------
DELEGATION_AT: Final[dict[str, int]] = {
    "issued": T0 + 55,
    "handshake": T0 + 60,
    "first": T0 + 70,
    "again": T0 + 71,
    "refused": T0 + 72,
    "unknown": T0 + 73,
    # on a server that also seals (§12.6): the chain travels sealed
    "sealed_handshake": T0 + 80,
    "sealed_first": T0 + 90,
    "sealed_unknown": T0 + 91,
}


UNHELD: Final = "sha256:" + hashlib.sha256(b"a chain the example server never saw").hexdigest()
"""The name of a chain the example server does not hold (it answers: send it in full)."""


def person_identity() -> Identity:
    """The example person (the principal), a did:key."""
    return Identity.from_seed(hashlib.sha256(b"a2a-secure example person").digest(), "example-person")


def assistant_identity() -> Identity:
    """The example assistant, the chain's middle hop."""
    return Identity.from_seed(hashlib.sha256(b"a2a-secure example assistant").digest(), "example-assistant")


def delegation_card(identity: Identity, limits: ServerLimits = PLAIN) -> dict[str, Any]:
    """:func:`server_card` of a server that also serves delegation chains (§12.7)."""
    extensions = server_extensions(limits, MemoryStore(), delegation=True)
    return {**server_card(identity), CARD_MEMBER: extensions}


def make_delegation_server(
    clock: FakeClock, runs: list[HandlerRun] | None = None, *, sealed: bool = False
) -> ServerProtocol:
    """The test agent under :data:`POLICY`, where ``echo`` runs only on the person's behalf.

    ``sealed``: a server that also seals (§12.6: the chain then travels sealed).
    """
    identity = server_identity()
    dispatcher = _RecordingDispatcher([] if runs is None else runs)
    register_test_agent(dispatcher)
    limits = ServerLimits(sealed_intents=sealed)
    label = b"a2a-secure example delegation server random" + (b" sealed" if sealed else b"")
    return ServerProtocol(
        identity,
        POLICY,
        store=MemoryStore(),
        resolver=DIDResolver(clock=clock),
        dispatcher=dispatcher,
        manifest_hash=encoding.hash_of(delegation_card(identity, limits)),
        clock=clock,
        random_bytes=seeded_random(label),
        monotonic=clock.monotonic,
        delegation=DelegationRules.build({"echo": [person_identity().did]}),
        limits=limits,
    )


def example_chain() -> Chain:
    """Person → assistant → the example client: ``echo`` only, at the example server only."""
    at = DELEGATION_AT["issued"]
    root = issue(
        person_identity(),
        to=assistant_identity().did,
        goals=["echo", "count"],
        ttl=8 * 3600,
        now=at,
        targets=[server_identity().did],
        max_priority=3,
        random_bytes=seeded_random(b"a2a-secure example delegation person"),
    )
    return root.further(
        assistant_identity(),
        to=client_identity().did,
        goals=["echo"],
        now=at,
        ttl=3600,
        random_bytes=seeded_random(b"a2a-secure example delegation assistant"),
    )


async def _delegation_examples(run: _Run) -> None:
    clock = run.clock
    runs: list[HandlerRun] = []
    server = make_delegation_server(clock, runs)
    chain = example_chain()
    run.add("delegation-header", jws_decode_unverified(chain.tokens[1])[0])
    run.payload("delegation-root-payload", chain.tokens[0])
    run.payload("delegation-hop-payload", chain.tokens[1])
    session = await open_session(
        server, clock, DELEGATION_AT["handshake"], b"a2a-secure example client random 4"
    )
    steps = (
        ("first", "delegation-request", "delegation-result", "req-9", "echo", chain.tokens),
        ("again", "delegation-again-request", "delegation-again-result", "req-10", "echo", chain.hash),
        ("refused", "delegation-refused-request", "delegation-refused-error", "req-11", "count", chain.hash),
        ("unknown", "delegation-unknown-request", "delegation-unknown-error", "req-12", "echo", UNHELD),
    )
    for step, name, answer_name, rid, goal, member in steps:
        clock.now = DELEGATION_AT[step]
        intent = {"goal": goal, "inputs": {"text": "Add the dentist on Friday"}, "delegation": member}
        if goal == "count":
            intent["inputs"] = {"n": 1}
        req, _body, reply = await _intent(run, server, session, name, rid, intent)
        answer = _answer(rid, reply)
        run.add(answer_name, answer, reply.http_status)
        if "result" in answer:
            session.verify_result(req, answer["result"])
        elif not session.error_from_reply(req, answer["error"]).signed:
            raise SystemExit("the example delegation refusal does not verify")
    if [(r.goal, r.sequence) for r in runs] != [("echo", 1), ("echo", 2)]:
        raise SystemExit(f"the delegation examples ran {runs}")
    await _sealed_delegation_examples(run, chain)


async def _sealed_delegation_examples(run: _Run, chain: Chain) -> None:
    """§12.6 with §12.7: the chain sealed on a sealed session, and a refusal naming nothing of it."""
    clock = run.clock
    runs: list[HandlerRun] = []
    server = make_delegation_server(clock, runs, sealed=True)
    session = await open_session(
        server, clock, DELEGATION_AT["sealed_handshake"], b"a2a-secure example client random 5", seal=True
    )
    clock.now = DELEGATION_AT["sealed_first"]
    intent = {"goal": "echo", "inputs": {"text": "Add the dentist on Friday"}, "delegation": chain.tokens}
    req, _body, reply = await _intent(run, server, session, "sealed-delegation-request", "req-3", intent)
    run.payload("sealed-delegation-payload", req.params["request_jws"])
    answer = _answer("req-3", reply)
    if session.verify_result(req, answer["result"]).result != intent["inputs"]:
        raise SystemExit("the sealed delegation example did not run")
    record = await server.store.get_session(session.session_id, clock())
    assert record is not None
    keys = sealing.SessionKeys.from_bytes(record.seal_keys)
    sealed = req.params["intent"][sealing.CHAIN_MEMBER]
    run.add(
        "sealed-delegation-vector",
        {
            "c2s_key": keys.c2s.hex(),
            "delegation_nonce": sealing.nonce(req.sequence, sealing.Part.DELEGATION).hex(),
            "delegation_aad": sealing.aad(
                "c2s", session.session_id, req.sequence, sealing.Part.DELEGATION, 0, "echo"
            ).decode(),
            "delegation_plaintext": encoding.dumps(chain.tokens).decode(),
            "sealed_delegation": sealed,
            "digest": m.sealed_digest(sealed),
        },
    )
    # A name this server does not hold (a chain never sent on this session): the refusal's
    # message names nothing of the chain; its data, sealed, says which one to send in full.
    clock.now = DELEGATION_AT["sealed_unknown"]
    intent = {"goal": "echo", "inputs": {"text": "Add the dentist on Friday"}, "delegation": UNHELD}
    req, _body, reply = await _intent(run, server, session, "sealed-chain-unknown-request", "req-4", intent)
    answer = _answer("req-4", reply)
    run.add("sealed-chain-unknown-error", answer, reply.http_status)
    refused = session.error_from_reply(req, answer["error"])
    if not refused.signed or (refused.data or {}).get("chain_unknown") != UNHELD:
        raise SystemExit("the sealed chain-unknown example does not open to its name")
    run.add("sealed-chain-unknown-data", refused.data)
    if [(r.goal, r.sequence) for r in runs] != [("echo", 1)]:
        raise SystemExit(f"the sealed delegation examples ran {runs}")


def examples_in(text: str) -> dict[str, tuple[str, int | None, str]]:
    """The tagged examples of a document: name -> (language, HTTP status, block text)."""
    found: dict[str, tuple[str, int | None, str]] = {}
    for match in EXAMPLE_RE.finditer(text):
        if match["name"] in found:
            raise ValueError(f"example {match['name']!r} appears twice")
        http = int(match["http"]) if match["http"] else None
        found[match["name"]] = (match["lang"], http, match["body"])
    return found


def _update(text: str, examples: dict[str, Example]) -> str:
    missing = set(examples) - set(examples_in(text))
    if missing:
        raise SystemExit(f"the document has no block for {sorted(missing)}")

    def replace(match: re.Match[str]) -> str:
        example = examples.get(match["name"])
        return match[0] if example is None else example.render()

    return EXAMPLE_RE.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    """Print the examples, or update / check them in a document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--update", type=Path, metavar="DOC", help="rewrite the tagged blocks of DOC")
    group.add_argument("--check", type=Path, metavar="DOC", help="exit 1 if DOC's blocks differ")
    args = parser.parse_args(argv)
    examples = asyncio.run(generate())
    if args.update is None and args.check is None:
        print("\n\n".join(e.render() for e in examples.values()))
        return 0
    path: Path = args.update or args.check
    text = path.read_text(encoding="utf-8")
    new = _update(text, examples)
    if args.check is not None:
        if new != text:
            print(f"{path}: examples differ from the code; run --update", file=sys.stderr)
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
