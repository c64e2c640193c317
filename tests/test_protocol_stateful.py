"""Stateful property test: two honest clients, one server, and an attacker on the path.

Hypothesis interleaves honest handshake steps, intents, retries and closes of two clients
(different identities) with what an attacker on the path can do: hold back an honest
message and deliver it late (reordering), send any recorded message again to any method,
move a message of one handshake or session into another, re-sign a payload it has seen
with the *other* honest client's key or with its own, edit unsigned members, and move the
clock. Invariants, checked after every step:

* the server holds a session only if the client with that DID completed that very
  handshake (same session id and commitment) through its own ``ClientHandshake``;
* a handler never runs twice for one (session, sequence), and only for requests an honest
  client signed on that session;
* a handler never runs at or after the session's ``expires_at``, and always for the DID
  that owns the session;
* liveness: the attacker's messages never consume a pending handshake, a sequence or a
  session of an honest client, so every honest step succeeds exactly when the protocol
  says it must (the pending handshake within 60 s, a request fresh, its sequence above the
  last accepted one, the session unexpired).
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from protocol_helpers import FakeClock, FakeRandom, identity, payload_of, sign_raw

from a2a_secure.errors import SessionUnknown
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.messages import Typ
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, Reply
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.store.memory import MemoryStore

NAMES = ("A", "B")
METHODS = ("hello", "proof", "accept_policy", "intent", "close")
SESSION_TIMEOUT = 600
JWS_MEMBER = {
    "proof": "proof_jws",
    "accept_policy": "accept_jws",
    "intent": "request_jws",
    "close": "request_jws",
}
OTHER_TYP = {Typ.PROOF: Typ.ACCEPT, Typ.ACCEPT: Typ.PROOF, Typ.REQUEST: Typ.CLOSE, Typ.CLOSE: Typ.REQUEST}
FORGERIES = ("other-client-own-kid", "other-client-victim-kid", "mallory", "other-typ", "edit-unsigned")
MALLORY = identity("mallory")


@dataclass
class InFlight:
    """An honest handshake between two steps: the next message and when HELLO was sent."""

    hs: ClientHandshake
    stage: str  # "proof" or "accept_policy"
    message: dict[str, Any]
    started: float


@dataclass
class Sent:
    """A message an honest client sent or is about to send (the attacker sees all of them)."""

    client: str
    method: str
    params: dict[str, Any]


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.store = MemoryStore()
        self.ids = {name: identity(f"client-{name}") for name in NAMES}
        self.server_id = identity("server")
        dispatcher = IntentDispatcher()
        dispatcher.add("echo", self._echo)
        self.server = ServerProtocol(
            self.server_id,
            Policy.build(session_timeout=SESSION_TIMEOUT, rate_limit=10**6),
            store=self.store,
            resolver=DIDResolver(clock=self.clock),
            dispatcher=dispatcher,
            manifest_hash=encoding.hash_of({"name": "server"}),
            clock=self.clock,
            random_bytes=FakeRandom(b"server"),
        )
        self.client_rand = {name: FakeRandom(name.encode()) for name in NAMES}
        self.inflight: dict[str, InFlight | None] = dict.fromkeys(NAMES)
        self.sessions: dict[str, list[ClientSession]] = {name: [] for name in NAMES}
        self.held: dict[str, tuple[ClientSession, PreparedRequest]] = {}  # by client: not yet delivered
        self.last_request: dict[str, tuple[PreparedRequest, Reply]] = {}  # by session id
        self.accepted_max: Counter[str] = Counter()  # by session id: the server's last accepted sequence
        self.completed: set[tuple[str, str, str]] = set()  # (client DID, session id, commitment)
        self.signed_requests: set[tuple[str, int]] = set()  # (session id, sequence) an honest client signed
        self.executions: Counter[tuple[str, int]] = Counter()
        self.violations: list[str] = []
        self.recorded: list[Sent] = []

    def teardown(self) -> None:
        self.loop.close()

    # -- plumbing -----------------------------------------------------------------------------
    async def _echo(self, inputs: Any, ctx: IntentContext) -> Any:
        self.executions[(ctx.session_id, ctx.sequence)] += 1
        rec = self.store._sessions.get(ctx.session_id)
        if rec is None:
            self.violations.append(f"handler ran for unknown session {ctx.session_id}")
        elif self.clock() >= rec.expires_at:
            self.violations.append(f"handler ran at {self.clock()} >= expires_at {rec.expires_at}")
        elif ctx.caller_did != rec.client_did:
            self.violations.append("handler ran with another caller DID than the session's")
        if (ctx.session_id, ctx.sequence) not in self.signed_requests:
            self.violations.append(f"handler ran for a request no honest client signed: {ctx.sequence}")
        return {"echo": inputs}

    def call(self, method: str, params: Any) -> Reply:
        reply = self.loop.run_until_complete(self.server.handle(method, copy.deepcopy(params)))
        assert isinstance(reply, Reply)
        assert (reply.error is None) != (reply.result is None)
        return reply

    def send(self, client: str, method: str, params: dict[str, Any]) -> Reply:
        self.recorded.append(Sent(client, method, copy.deepcopy(params)))
        return self.call(method, params)

    def _owner(self, session_id: str) -> tuple[str, ClientSession] | None:
        for name in NAMES:
            for sess in self.sessions[name]:
                if sess.session_id == session_id:
                    return name, sess
        return None

    def _deliver_request(self, name: str, sess: ClientSession, req: PreparedRequest) -> Reply:
        """Send an honest request and check the answer is exactly the one §6.1 prescribes."""
        reply = self.send(name, "intent", req.params)
        sid = sess.session_id
        if self.clock() >= sess.expires_at:
            assert reply.error is not None and reply.error["code"] == -32043, reply.error
        elif abs(int(self.clock()) - req.timestamp) > 300:
            assert reply.error is not None and reply.error["code"] == -32045, reply.error
            assert sess.error_from_reply(req, reply.error).signed
        elif req.sequence <= self.accepted_max[sid]:
            assert reply.error is not None and reply.error["code"] == -32044, reply.error
            assert sess.error_from_reply(req, reply.error).signed
        else:
            assert reply.error is None, reply.error
            assert sess.verify_result(req, reply.result).result == {"echo": req.params["intent"]["inputs"]}
            assert reply.result["result"] == {"echo": req.params["intent"]["inputs"]}
            self.accepted_max[sid] = req.sequence
            self.last_request[sid] = (req, reply)
        return reply

    def _forge(self, sent: Sent, how: str) -> dict[str, Any]:
        """A variant of an honest message that only its client could have produced."""
        params = copy.deepcopy(sent.params)
        if sent.method == "hello":
            other = next(i for n, i in self.ids.items() if n != sent.client)
            params["agent_did"] = other.did if how != "mallory" else MALLORY.did
            return params
        member = JWS_MEMBER[sent.method]
        token = params[member]
        header = jws_decode_unverified(token)[0]
        other = next(i for n, i in self.ids.items() if n != sent.client)
        signer: Identity
        kid = header["kid"]
        typ = header["typ"]
        if how == "other-client-own-kid":
            signer, kid = other, other.kid
        elif how == "other-client-victim-kid":
            signer = other
        elif how == "mallory":
            signer, kid = MALLORY, MALLORY.kid
        elif how == "other-typ":
            signer, kid = other, other.kid
            typ = OTHER_TYP[typ]
        else:  # edit an unsigned member, keep the honest signature
            if sent.method == "intent":
                params["intent"] = {"goal": "echo", "inputs": {"edited": True}}
            elif sent.method == "close":
                params["sequence"] = params["sequence"] + 1
            else:
                params["nonce_b"] = encoding.b64u_encode(bytes(range(1, 33)))
            return params
        params[member] = sign_raw(payload_of(token), signer, typ=typ, kid=kid)
        return params

    # -- honest clients -------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES))
    def hello(self, name: str) -> None:
        hs = ClientHandshake(
            self.ids[name],
            resolve_did_key(self.server_id.did),
            clock=self.clock,
            random_bytes=self.client_rand[name],
        )
        started = self.clock()
        reply = self.send(name, "hello", hs.hello())
        assert reply.error is None, reply.error
        proof = hs.receive_challenge(reply.result)
        self.inflight[name] = InFlight(hs, "proof", proof, started)

    @precondition(lambda self: any(f is not None for f in self.inflight.values()))
    @rule(name=st.sampled_from(NAMES))
    def continue_handshake(self, name: str) -> None:
        flight = self.inflight[name]
        if flight is None:
            return
        reply = self.send(name, flight.stage, flight.message)
        if self.clock() >= flight.started + 60:
            # The pending handshake lived 60 s; nothing else may have ended it.
            assert reply.error is not None and reply.error["code"] == -32041, reply.error
            self.inflight[name] = None
            return
        assert reply.error is None, (flight.stage, reply.error)
        if flight.stage == "proof":
            flight.message = flight.hs.receive_policy(reply.result)
            flight.stage = "accept_policy"
            return
        sess = flight.hs.receive_session(reply.result)
        self.completed.add((self.ids[name].did, sess.session_id, sess.session_commitment))
        self.sessions[name].append(sess)
        self.inflight[name] = None

    @rule(name=st.sampled_from(NAMES))
    def full_handshake(self, name: str) -> None:
        """HELLO to SESSION in one go (so that sessions are common in short runs)."""
        self.hello(name)
        self.continue_handshake(name)
        self.continue_handshake(name)

    @precondition(lambda self: any(self.sessions.values()))
    @rule(
        name=st.sampled_from(NAMES),
        pick=st.integers(0, 7),
        count=st.integers(1, 3),
        gap=st.booleans(),
        hold=st.booleans(),
    )
    def intent(self, name: str, pick: int, count: int, gap: bool, hold: bool) -> None:
        """Send ``count`` intents; with ``hold``, keep the last one back (the attacker delays it)."""
        if not self.sessions[name]:
            return
        sess = self.sessions[name][pick % len(self.sessions[name])]
        for x in range(count):
            if sess.expired():
                try:
                    sess.prepare_intent({"goal": "echo", "inputs": {}})
                except SessionUnknown:
                    return
                raise AssertionError("the client signed an intent for an expired session")
            if gap:
                sess.last_sequence += 2  # gaps are allowed (PROTOCOL.md §6.1 step 7)
            req = sess.prepare_intent({"goal": "echo", "inputs": {"x": x}})
            self.signed_requests.add((sess.session_id, req.sequence))
            if hold and x == count - 1:
                self.held[name] = (sess, req)  # the attacker has it (see _visible), the server not
                return
            self._deliver_request(name, sess, req)

    @precondition(lambda self: bool(self.held))
    @rule(name=st.sampled_from(NAMES))
    def deliver_held(self, name: str) -> None:
        """The held request finally arrives (possibly after later ones: reordering)."""
        if name not in self.held:
            return
        sess, req = self.held.pop(name)
        if sess.closed:
            reply = self.send(name, "intent", req.params)
            assert reply.error is not None and reply.error["code"] == -32043
            return
        self._deliver_request(name, sess, req)

    @precondition(lambda self: bool(self.last_request))
    @rule(pick=st.integers(0, 7))
    def retry_last(self, pick: int) -> None:
        """The client resends its last request byte for byte (it lost the answer)."""
        sid = sorted(self.last_request)[pick % len(self.last_request)]
        req, first = self.last_request[sid]
        owner = self._owner(sid)
        assert owner is not None
        name, sess = owner
        reply = self.send(name, "intent", req.params)
        if sess.expired():
            assert reply.error is not None and reply.error["code"] == -32043
        elif abs(int(self.clock()) - req.timestamp) > 300:
            # Freshness (step 6) comes before the replay check (step 7).
            assert reply.error is not None and reply.error["code"] == -32045
        elif self.accepted_max[sid] == req.sequence:
            # A byte-identical retry of the last accepted request: the stored answer.
            assert reply.error is None and reply.result == first.result
        else:
            assert reply.error is not None and reply.error["code"] == -32044

    @precondition(lambda self: any(self.sessions.values()))
    @rule(name=st.sampled_from(NAMES), pick=st.integers(0, 7))
    def close(self, name: str, pick: int) -> None:
        live = [s for s in self.sessions[name] if not s.expired()]
        if not live:
            return
        sess = live[pick % len(live)]
        req = sess.prepare_close()
        reply = self.send(name, "close", req.params)
        assert reply.error is None, reply.error
        sess.verify_closed(req, reply.result)
        self.sessions[name].remove(sess)
        self.last_request.pop(sess.session_id, None)

    @rule(seconds=st.sampled_from([1, 10, 30, 59, 61, 120, 299, 301, 599, 601]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- the attacker -------------------------------------------------------------------------
    def _visible(self) -> list[Sent]:
        """Everything on the wire: sent messages, plus honest messages not delivered yet."""
        out = list(self.recorded)
        for name, flight in self.inflight.items():
            if flight is not None:
                out.append(Sent(name, flight.stage, copy.deepcopy(flight.message)))
        for name, (_, req) in self.held.items():
            out.append(Sent(name, "intent", copy.deepcopy(req.params)))
        return out

    @precondition(lambda self: bool(self.recorded))
    @rule(pick=st.integers(0, 10**6), method=st.sampled_from(METHODS))
    def replay_anywhere(self, pick: int, method: str) -> None:
        """Any recorded message, sent again to any method."""
        sent = self.recorded[pick % len(self.recorded)]
        reply = self.call(method, sent.params)
        if method in ("proof", "accept_policy", "close"):
            # A handshake step or a close succeeds once, when its client sends it.
            assert reply.error is not None, (sent.method, method)
        if method == "intent" and reply.error is None:
            # Only a byte-identical retry of the last accepted request of its session.
            assert sent.method == "intent"
            req, first = self.last_request[sent.params["session_id"]]
            assert sent.params["request_jws"] == req.params["request_jws"]
            assert reply.result == first.result

    @precondition(lambda self: bool(self.recorded))
    @rule(back=st.integers(0, 7))
    def replay_recent(self, back: int) -> None:
        """One of the last messages seen, sent again to its own method."""
        sent = self.recorded[-1 - back % min(8, len(self.recorded))]
        if sent.method == "hello":
            return  # a replayed HELLO only opens a pending handshake nobody can complete
        reply = self.call(sent.method, sent.params)
        if sent.method == "intent" and reply.error is None:
            req, first = self.last_request[sent.params["session_id"]]
            assert sent.params["request_jws"] == req.params["request_jws"]
            assert reply.result == first.result
        elif sent.method != "intent":
            assert reply.error is not None, sent.method

    @precondition(lambda self: bool(self.recorded))
    @rule(pick=st.integers(0, 10**6), other=st.integers(0, 10**6))
    def substitute(self, pick: int, other: int) -> None:
        """A message moved into another handshake or session."""
        visible = self._visible()
        sent = visible[pick % len(visible)]
        params = copy.deepcopy(sent.params)
        if sent.method in ("proof", "accept_policy"):
            targets = [f.hs.nonce_b for f in self.inflight.values() if f is not None]
            targets += [s.params["nonce_b"] for s in visible if s.method in ("proof", "accept_policy")]
            targets = sorted({t for t in targets if t != params["nonce_b"]})
            if not targets:
                return
            params["nonce_b"] = targets[other % len(targets)]
        elif sent.method in ("intent", "close"):
            others = [s for n in NAMES for s in self.sessions[n] if s.session_id != params["session_id"]]
            if not others:
                return
            target = others[other % len(others)]
            params["session_id"] = target.session_id
            params["session_commitment"] = target.session_commitment
        else:
            params = self._forge(sent, "other-client-own-kid")
        reply = self.call(sent.method, params)
        assert reply.error is not None, sent.method

    @precondition(lambda self: bool(self.recorded))
    @rule(pick=st.integers(0, 10**6), how=st.sampled_from(FORGERIES), latest=st.booleans())
    def forge(self, pick: int, how: str, latest: bool) -> None:
        """A message re-signed by someone else, or edited outside its signature.

        With ``latest``, the target is a message not delivered yet (held intent or the next
        handshake step), so the forgery arrives first and the honest one must still work.
        """
        visible = self._visible()
        if latest and len(visible) > len(self.recorded):
            visible = visible[len(self.recorded) :]
        sent = visible[pick % len(visible)]
        reply = self.call(sent.method, self._forge(sent, how))
        assert reply.error is not None, (sent.method, how)

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def sessions_only_for_completed_handshakes(self) -> None:
        honest = {i.did for i in self.ids.values()}
        for sid, rec in self.store._sessions.items():
            assert rec.client_did in honest
            assert (rec.client_did, sid, rec.session_commitment) in self.completed, sid

    @invariant()
    def each_sequence_runs_at_most_once(self) -> None:
        assert all(n == 1 for n in self.executions.values()), self.executions

    @invariant()
    def no_handler_violation(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def server_sequence_is_the_last_accepted_one(self) -> None:
        for sid, st_ in self.store._seq.items():
            assert st_.last == self.accepted_max[sid]


TestProtocolStateMachine = ProtocolMachine.TestCase
TestProtocolStateMachine.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,  # the same examples on every run (deterministic CI)
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
