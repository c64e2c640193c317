"""An open session seen from the client (PROTOCOL.md §6): no sockets, no HTTP.

``ClientSession`` allocates sequence numbers, signs requests (sealing them on a sealed
session, §12.6) and verifies every response, event and error against the server's key
pinned by the handshake. What to do with an answer (retry, resend, raise) is the attempt
machine's (:mod:`a2a_secure.protocol.client_attempt`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from a2a_secure import system
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InvalidParams,
    PolicyViolation,
    SessionUnknown,
    StaleTimestamp,
    error_for_code,
)
from a2a_secure.frozen import quick_init
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import PendingJWS, jws_check, jws_decode_unverified, jws_token, jws_verify
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import sealed_claims, sealing
from a2a_secure.protocol.client_wire import IntentWire, intent_json
from a2a_secure.protocol.intent_id import INTENT_ID, check_intent_id
from a2a_secure.protocol.models import (
    ClosedMessage,
    ErrorObject,
    EventMessage,
    EventPayload,
    Intent,
    IntentResultMessage,
    ResponsePayload,
)
from a2a_secure.protocol.validate import MAX_SAFE_INT, exact_members, is_fresh, json_equal

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_INPUT_DEPTH",
    "ClientSession",
    "IntentResult",
    "PreparedRequest",
    "StreamEvent",
    "check_intent_inputs",
]

Clock = Callable[[], float]
RandomSource = Callable[[int], bytes]
_ERROR_MEMBERS = frozenset(("code", "message"))
# The members of the common intents (§6.1, §12.5).
_GOAL_INPUTS = frozenset(("goal", "inputs"))
_GOAL_INPUTS_ID = frozenset(("goal", "inputs", INTENT_ID))
_REFUSED = "delegation refused"  # how a refusal of a delegation chain begins (§12.7)


#: The most JSON an intent's ``inputs`` may hold: the intent travels twice in a request (in
#: ``params`` and base64url-encoded in ``request_jws``), and a server takes bodies of 1 MiB.
#: Sealed inputs (§12.6) travel once, as base64url of their ciphertext, and fit the same bound.
MAX_INPUT_BYTES = 384 * 1024
#: How deep ``inputs`` may nest: they sit four containers deep in the request (envelope,
#: params, intent, inputs), and a server refuses JSON deeper than ``encoding.MAX_DEPTH``.
MAX_INPUT_DEPTH = encoding.MAX_DEPTH - 3


def check_intent_inputs(inputs: Any, what: str = "intent inputs") -> None:
    """-32602 for ``inputs`` no server takes: not I-JSON, too deep or too large.

    Checked before anything is signed or sent: a 5 MB value would otherwise go out (twice
    over) only to be refused with 413, and one nested thousands of levels deep would exhaust
    the stack of the JSON encoder that signs it. The walk is iterative.
    """
    _inputs_json(inputs, what)


def _inputs_json(inputs: Any, what: str = "intent inputs") -> bytes:
    """:func:`check_intent_inputs`, and the JSON it wrote of ``inputs`` (``encoding.dumps``'s)."""
    written = encoding.ijson_dumps(inputs, max_depth=MAX_INPUT_DEPTH)  # one walk: checked and sized
    if written is None:
        problem = encoding.ijson_problem(inputs, max_depth=MAX_INPUT_DEPTH) or "not I-JSON"
        if problem.startswith("JSON nested deeper"):
            problem = f"nested deeper than {MAX_INPUT_DEPTH} levels"
        raise InvalidParams(f"{what} refused: {problem}")
    size = len(written)
    if size > MAX_INPUT_BYTES:
        raise InvalidParams(
            f"{what} refused: {size} bytes of JSON, more than the {MAX_INPUT_BYTES}"
            " a signed request can carry (an agent takes request bodies of at most 1 MiB)"
        )
    return written


@quick_init  # built for every request
@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A signed request ready to send; resend it byte for byte to retry it."""

    method: str
    params: dict[str, Any]
    sequence: int
    request_hash: str
    timestamp: int
    goal: str | None = None
    intent_id: str | None = None  # the intent_id extension: the id the intent carries
    # ``params`` as compact JSON, written with the token (client_wire.py); None: not written.
    params_json: bytes | None = None
    # The token still to sign (a remote key): the adapter awaits the signature and sends
    # :meth:`signed`'s request; ``params`` then holds it and ``request_hash`` is empty.
    pending: PendingJWS | None = None

    def signed(self, token: str) -> PreparedRequest:
        """This request with its :attr:`pending` token, now signed, in place."""
        params = {**self.params, "request_jws": token}
        req_hash = m.request_hash(token)
        return PreparedRequest(
            self.method, params, self.sequence, req_hash, self.timestamp, self.goal, self.intent_id
        )


@quick_init  # built for every answer
@dataclass(frozen=True, slots=True)
class IntentResult:
    """A verified intent result: ``status``, ``sequence``, ``result`` (and its proof).

    ``intent_id``: the id the intent carried (the intent_id extension), else None.
    """

    status: str
    sequence: int
    result: Any
    response_jws: str
    intent_id: str | None = None

    def __getitem__(self, name: str) -> Any:
        return {"status": self.status, "sequence": self.sequence, "result": self.result}[name]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """A verified streamed event: its index, whether it is final, and its result or error."""

    index: int
    final: bool
    result: Any
    error: A2AError | None
    response_jws: str


class ClientSession:
    """An open session seen from the client: sequence allocation, signing, verification."""

    def __init__(
        self,
        *,
        identity: Identity,
        server_did: str,
        server_kid: str,
        server_key: bytes,
        session_id: str,
        session_commitment: str,
        policy: Policy,
        created_at: int,
        expires_at: int,
        server_manifest_hash: str = "",
        clock: Clock = system.wall_clock,
        seal_keys: sealing.SessionKeys | None = None,
    ) -> None:
        self.identity = identity
        self.server_did = server_did
        self.server_kid = server_kid
        self.server_key = server_key
        self.session_id = session_id
        self.session_commitment = session_commitment
        self.policy = policy
        self.created_at = created_at
        self.expires_at = expires_at
        self.server_manifest_hash = server_manifest_hash
        self.last_sequence = 0
        self.closed = False
        self._clock = clock
        # Sealed intents (§12.6): inputs, results, events and error data travel sealed.
        self._sealed = seal_keys is not None
        self._sealer = sealing.SessionSealer(seal_keys, session_id) if seal_keys is not None else None
        self._wire_pieces: IntentWire | None = None  # made at the first intent
        self._wire_made = False

    @property
    def sealed(self) -> bool:
        """Whether this session agreed on sealing keys (PROTOCOL.md §12.6), even once they are gone."""
        return self._sealed

    @property
    def sealer(self) -> sealing.SessionSealer | None:
        """The session's sealer while it is open; None once closed or expired (the keys are
        dropped at the first use past ``expires_at``, if no timer dropped them before)."""
        if self._sealer is not None and self.expired():
            self._sealer = None
        return self._sealer

    def drop_keys(self) -> float | None:
        """Drop the sealing keys if the session is closed or expired; else the seconds left.

        An adapter calls it when the session should have ended (a timer), so that the keys
        leave memory even if the session is never used again (forward secrecy, §12.6).
        """
        if self.expired():
            self._sealer = None
            return None
        return max(0.0, self.expires_at - self._clock())

    def _keys(self) -> sealing.SessionSealer:
        # A sealed session's keys, never used past the session's end: an answer that comes
        # after it is not opened (nothing of a sealed session is ever read in the clear).
        sealer = self.sealer
        if sealer is None:
            raise AuthenticationFailed("the session ended: its sealing keys are gone, nothing is opened")
        return sealer

    def __repr__(self) -> str:
        return f"ClientSession(server_did={self.server_did!r}, expires_at={self.expires_at})"

    def expired(self, now: float | None = None) -> bool:
        """True once ``now >= expires_at`` (or after close)."""
        return self.closed or (self._clock() if now is None else now) >= self.expires_at

    def _next_sequence(self) -> int:
        if self.expired():
            raise SessionUnknown("session expired or closed")
        if self.last_sequence >= MAX_SAFE_INT:
            raise SessionUnknown("sequence space exhausted; open a new session")
        self.last_sequence += 1
        return self.last_sequence

    def prepare_intent(self, intent: Mapping[str, Any]) -> PreparedRequest:
        """Check ``intent`` against its shape and the session policy, then sign it."""
        body = dict(intent)
        # The §6.1 shape check of the server's parse_intent, without importing the server
        # side (and asyncio with it) into a client. The common intent, a goal and inputs
        # (and an intent_id), passes it without a model being built; any other is parsed.
        keys = body.keys()
        goal = body.get("goal")
        if not (
            keys in (_GOAL_INPUTS, _GOAL_INPUTS_ID)
            and type(goal) is str
            and 0 < len(goal) <= 128
            and type(body["inputs"]) is dict
        ):
            Intent.parse(body)
            if sealing.SEALED in body or sealing.ANSWER_KEY_MEMBER in body or sealing.CHAIN_MEMBER in body:
                raise InvalidParams(
                    "the sealed members are made by a sealed session, not given by the caller"
                )
        elif INTENT_ID in body:
            check_intent_id(body[INTENT_ID])
        inputs = _inputs_json(body["inputs"])
        if not self.policy.allows(body["goal"]):
            raise PolicyViolation(f"intent {body['goal'][:64]!r} is not allowed by the session policy")
        wire = None if self._sealed or self.identity.remote else self._wire()
        written = intent_json(body, inputs) if wire is not None else None
        if wire is None or written is None:
            return self._sign_request("intent", {"intent": body}, m.Typ.REQUEST, body["goal"])
        # The common request: its payload, params and body written from one text of the intent.
        sequence = self._next_sequence()
        ts = int(self._clock())
        token, params_json, request_hash = wire.request(self.identity, sequence, ts, written)
        params = {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "sequence": sequence,
            "intent": body,
            "request_jws": token.decode("ascii"),
        }
        return PreparedRequest(
            "intent", params, sequence, request_hash, ts, body["goal"], body.get("intent_id"), params_json
        )

    def _wire(self) -> IntentWire | None:
        """The session's pieces of the byte templates (client_wire.py), None if it cannot have them."""
        if not self._wire_made:
            self._wire_made = True
            try:
                self._wire_pieces = IntentWire(
                    self.session_id, self.session_commitment, self.server_kid, self.server_key
                )
            except (TypeError, ValueError):  # a lone surrogate (orjson's errors are TypeErrors)
                self._wire_pieces = None
        return self._wire_pieces

    def prepare_close(self) -> PreparedRequest:
        """Sign a close request (§6.3)."""
        return self._sign_request("close", {"close": True}, m.Typ.CLOSE, None)

    def _sign_request(self, method: str, body: dict[str, Any], typ: str, goal: str | None) -> PreparedRequest:
        # The signed payload and the params share session, commitment and sequence; an
        # intent carries its intent in both, a close has "close": true in the payload only.
        sequence = self._next_sequence()
        ts = int(self._clock())
        if self._sealed and "intent" in body:
            sealer = self._keys()
            intent = body["intent"]
            sealed_intent = {
                **intent,
                "inputs": {},
                sealing.SEALED: sealer.seal_inputs(sequence, intent["goal"], intent["inputs"]),
            }
            chain = sealed_intent.pop("delegation", None)
            if chain is not None:  # §12.6: the chain (or its name) crosses sealed, never in the clear
                sealed_chain = sealer.seal_delegation(sequence, intent["goal"], chain)
                sealed_intent[sealing.CHAIN_MEMBER] = sealed_chain
            intent_id = intent.get("intent_id")
            if intent_id is not None:
                # §12.6: the answer key under which the server keeps this intent's answer,
                # the same on every resend (derived from this agent's key and the id).
                key = sealed_claims.derive_answer_key(self.identity.derive_key, self.server_did, intent_id)
                sealed_intent[sealing.ANSWER_KEY_MEMBER] = sealer.seal_answer_key(
                    sequence, intent["goal"], intent_id, key
                )
            body = {"intent": sealed_intent}
        common = {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "sequence": sequence,
        }
        signed = body
        if sealing.SEALED in body.get("intent", ()):
            # §12.6: the payload signs the sealed inputs by their digest; params carry them.
            sealed_intent = body["intent"]
            digest = m.sealed_digest(sealed_intent[sealing.SEALED])
            signed_intent = {**sealed_intent, sealing.SEALED: digest}
            if sealing.CHAIN_MEMBER in sealed_intent:
                signed_intent[sealing.CHAIN_MEMBER] = m.sealed_digest(sealed_intent[sealing.CHAIN_MEMBER])
            signed = {"intent": signed_intent}
        token = jws_token({**common, "timestamp": ts, **signed}, self.identity, typ)
        params = {**common, **({"intent": body["intent"]} if "intent" in body else {}), "request_jws": token}
        intent_id = body["intent"].get("intent_id") if "intent" in body else None
        if isinstance(token, PendingJWS):  # a remote key: the adapter awaits the signature
            return PreparedRequest(method, params, sequence, "", ts, goal, intent_id, None, token)
        return PreparedRequest(method, params, sequence, m.request_hash(token), ts, goal, intent_id)

    def _verify_response(self, token: Any, req: PreparedRequest, *, is_error: bool) -> ResponsePayload:
        if not isinstance(token, str):
            raise AuthenticationFailed("response_jws missing")
        payload = ResponsePayload.parse(
            jws_verify(token, self.server_key, typ=m.Typ.RESPONSE, kid=self.server_kid),
            expected={
                "session_id": self.session_id,
                "sequence": req.sequence,
                "request_hash": req.request_hash,
            },
            is_error=is_error,
        )
        if not is_fresh(payload.timestamp, self._clock()):
            raise StaleTimestamp("response timestamp is not fresh")
        return payload

    def verified_reply(self, req: PreparedRequest, rid: int, content: bytes) -> IntentResult | None:
        """:meth:`verify_result` of the whole JSON-RPC reply body ``content`` (HTTP 200) to
        request ``rid``, when it is the common answer, an unsealed success byte for byte as
        this library's server writes it (client_wire.py); None for anything else: the
        caller then parses the reply and :meth:`verify_result` decides."""
        if self._sealed or req.method != "intent":
            return None
        wire = self._wire()
        if wire is None:
            return None
        got = wire.success(content, rid, req.sequence, req.request_hash, self._clock())
        if got is None:
            return None
        return IntentResult("success", req.sequence, got[0], got[1], req.intent_id)

    def verify_result(self, req: PreparedRequest, result: Any) -> IntentResult:
        """Verify a JSON-RPC ``result`` for ``req`` (§6.2) and return it."""
        if not self._sealed:
            flat = self._verified_flat(req, result)
            if flat is not None:
                return flat
        try:
            msg = IntentResultMessage.parse(result)
            payload = self._verify_response(msg.response_jws, req, is_error=False)
            if payload.status != "success" or msg.status != "success":
                raise AuthenticationFailed("result status is not the signed success")
            if msg.sequence != req.sequence or type(msg.sequence) is not int:
                raise AuthenticationFailed("result sequence differs from the request's")
            result = msg.result
            if self._sealed:  # §12.6: signed by its digest; verified first, opened second
                if not isinstance(result, str) or payload.result != m.sealed_digest(result):
                    raise AuthenticationFailed("result differs from the signed result")
                result = self._keys().open_result(req.sequence, req.request_hash, result)
            elif not json_equal(payload.result, result):
                raise AuthenticationFailed("result differs from the signed result")
        except InvalidParams as exc:  # a malformed token in a reply is the server's fault
            raise AuthenticationFailed(exc.message) from None
        return IntentResult("success", req.sequence, result, msg.response_jws, req.intent_id)

    def _verified_flat(self, req: PreparedRequest, result: Any) -> IntentResult | None:
        """The common answer, an unsealed success, checked in one pass: every check of the
        path below (exact members, signature, typ and kid, the signed session, sequence and
        request hash, a fresh integer timestamp, the signed status and result equal to the
        ones received), in the same order, with no model object between them.

        None for anything else, stricter types included (a sequence written ``1.0``): the
        path below then decides, and raises its own precise error for what is wrong.
        """
        if type(result) is not dict or result.keys() != m.RESULT_MEMBERS:
            return None
        token = result["response_jws"]
        try:
            header, payload, signing_input, signature = jws_decode_unverified(token)
        except InvalidParams:
            return None
        jws_check(header, signing_input, signature, self.server_key, typ=m.Typ.RESPONSE, kid=self.server_kid)
        if payload.keys() != m.RESPONSE_PAYLOAD:
            return None
        ts, sequence = payload["timestamp"], payload["sequence"]
        if not (
            type(ts) is int
            and type(sequence) is int
            and sequence == req.sequence
            and json_equal(payload["session_id"], self.session_id)
            and json_equal(payload["request_hash"], req.request_hash)
            and is_fresh(ts, self._clock())
            and payload["status"] == "success"
            and result["status"] == "success"
            and type(result["sequence"]) is int
            and result["sequence"] == req.sequence
            and json_equal(payload["result"], result["result"])
        ):
            return None
        return IntentResult("success", req.sequence, result["result"], token, req.intent_id)

    def verify_closed(self, req: PreparedRequest, result: Any) -> None:
        """Verify the result of a close (§6.3) and mark the session closed."""
        try:
            msg = ClosedMessage.parse(result)
            payload = self._verify_response(msg.response_jws, req, is_error=False)
            expected = {"type": "closed", "session_id": self.session_id}
            if payload.status != "success" or not json_equal(payload.result, expected):
                raise AuthenticationFailed("close result is not the signed one")
            if msg.type != "closed" or msg.session_id != self.session_id:
                raise AuthenticationFailed("close result differs from the signed one")
        except InvalidParams as exc:
            raise AuthenticationFailed(exc.message) from None
        self.closed = True
        self.drop_keys()  # §12.6: the session's keys go with it (forward secrecy)

    def verify_event(
        self, req: PreparedRequest, event: Any, index: int, *, check_fresh: bool = True
    ) -> StreamEvent:
        """Verify one streamed event (§6.4): signature, members, ``index`` and the final rule.

        A signed error event comes back as a :class:`StreamEvent` whose ``error`` is set (the
        caller raises it); any verification failure raises ``AuthenticationFailed``.
        """
        err = AuthenticationFailed
        try:
            msg = EventMessage.parse(event)
            token = msg.response_jws
            payload = EventPayload.parse(
                jws_verify(token, self.server_key, typ=m.Typ.EVENT, kid=self.server_kid),
                expected={
                    "session_id": self.session_id,
                    "sequence": req.sequence,
                    "request_hash": req.request_hash,
                },
                event=msg,
                index=index,
                sealed=self._sealed,
            )
            ts = payload.timestamp
            if check_fresh and not (req.timestamp - 300 <= ts <= int(self._clock()) + 300):
                raise StaleTimestamp("event timestamp is not fresh")
            result = payload.result
            # §12.6: every partial result is sealed; only the closing null of a stream is not.
            if self._sealed and not payload.is_error and not (payload.final and result is None):
                result = self._keys().open_event(
                    req.sequence, req.request_hash, index, payload.final, msg.result
                )
        except InvalidParams as exc:
            raise err(exc.message) from None
        error: A2AError | None = None
        if payload.is_error:
            # After freshness (§6.4 order): a stale event is -32045 whatever its error holds.
            signed_error = ErrorObject.parse(payload.error)
            error = error_for_code(signed_error.code, signed_error.message[:512])
            error.signed = True
        return StreamEvent(index, payload.final, result, error, token)

    def _open_error_data(self, req: PreparedRequest, data: dict[str, Any], signed: bool) -> dict[str, Any]:
        # Only a signed error's data is opened: the AEAD binds it to this request, and an
        # unsigned error is anyone's (its "sealed" member is dropped unread). Of a signed
        # error, only retry_after is taken from beside "sealed": the rest is anyone's too.
        sealed = data.pop(sealing.SEALED)
        if signed:
            data = {k: v for k, v in data.items() if k == "retry_after"}
            try:
                opened = self._keys().open_error_data(req.sequence, req.request_hash, sealed)
            except A2AError:
                opened = None
            if isinstance(opened, dict):
                data.update({k: v for k, v in opened.items() if k != "response_jws"})
        return data

    def error_from_reply(self, req: PreparedRequest, error: Any) -> A2AError:
        """The SDK error for a JSON-RPC ``error`` answering ``req``.

        A signed error (valid ``data.response_jws`` over this request) comes back with
        ``signed = True``; anything else is unauthenticated (it may come from anyone on the
        path) and comes back with ``signed = False``.
        """
        code = error.get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if type(code) is not int or not isinstance(message, str):
            return AuthenticationFailed("malformed error reply")
        data = error.get("data")
        token = data.get("response_jws") if isinstance(data, dict) else None
        signed = False
        if token is not None:
            try:
                payload = self._verify_response(token, req, is_error=True)
                signed_error = payload.error
                # Members only: the code and message are compared with the outer ones (§1
                # equality), which ErrorObject's type checks would make stricter.
                exact_members(signed_error, _ERROR_MEMBERS, "signed error", AuthenticationFailed)
                signed = (
                    payload.status == "error"
                    and json_equal(signed_error["code"], code)
                    and json_equal(signed_error["message"], message)
                )
            except A2AError:
                signed = False
        plain = {k: v for k, v in data.items() if k != "response_jws"} if isinstance(data, dict) else None
        if self._sealed and plain is not None and sealing.SEALED not in plain and signed:
            # §12.6: a sealed session's server seals all of a signed error's data but
            # retry_after; anything else beside it was added on the way.
            plain = {k: v for k, v in plain.items() if k == "retry_after"}
        elif self._sealed and plain is not None and sealing.SEALED in plain:
            plain = self._open_error_data(req, plain, signed)
            # §12.7: a sealed session's delegation refusal names nothing of the chain in the
            # clear; its full message came sealed, from the server alone (the AEAD's s2c key).
            reason = plain.get("reason") if signed else None
            if isinstance(reason, str) and code == PolicyViolation.code and message.startswith(_REFUSED):
                message = reason
        exc = error_for_code(code, message[:512], plain)
        exc.signed = signed
        return exc
