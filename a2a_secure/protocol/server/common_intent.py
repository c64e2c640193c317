"""The common intent, answered in one flat pass (PROTOCOL.md §6.1, every step).

Most intents are alike: ``goal`` and ``inputs``, perhaps ``domain``, ``constraints`` and
``priority``, and on a sealed session (§12.6, the default) ``sealed`` inputs; no
``intent_id``, no delegation chain, not streamed, at a server whose store never suspends
(MemoryStore), with no deny list, no priority queue and no delegation rules.
:class:`CommonIntentProcessor` answers them without a coroutine (unless the handler
suspends) and without the models. :func:`common_intent` makes step 1's shape checks on the
params as the envelope parser gave them, and step 5's rule (the signed payload is the params
with a timestamp, without the token, and with sealed inputs as their digest) in one
comparison, before anything else: the payload's text against the text the params make
(:data:`SIGNED_HEAD`, the intent as signed written by orjson), which is the text a client
of this library signs, so that the payload is neither parsed nor compared member by member;
a payload written otherwise is parsed, and less its timestamp compared with the params less
their token (sorted JSON texts). The general path builds an ``IntentRequest``, an
``Intent``, the ``expected`` members and a ``RequestPayload`` for the same decision.

:func:`common_intent` refuses nothing. It accepts a part of what the models accept, with
the same values, and answers None for all else: a malformed member, a member of another
extension, a payload that differs from the params. The processor then takes the general
path of :class:`~a2a_secure.protocol.server.intents.IntentProcessor` from step 1, which
gives the refusal with its message, or accepts what only differs in form (``1.0`` signed
where the params say ``1``: equal JSON values, §1); and from step 5, once the signature is
verified, for sealed inputs on a session without keys or clear ones on a sealed session
(refusals of §12.6), or a client whose DID document is due to be fetched again. Steps 2-4,
9-10, the refusals of steps 6-8 and §12.6's work (the sealer of the session, opening the
inputs, sealing the result and an error's data) are the general path's own code, so that
both give the same answers, byte for byte (tests/test_common_intent.py,
tests/test_common_intent_sealed.py).

State: none beyond the general processor's.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable
from typing import Any, Final

import orjson

from a2a_secure.errors import A2AError, InternalError, InvalidParams, SessionUnknown
from a2a_secure.identity import encoding
from a2a_secure.identity.encoding import MAX_DEPTH, MAX_SAFE_INT, is_hash_string
from a2a_secure.identity.jws import jws_split
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.models import Intent, IntentRequest
from a2a_secure.protocol.models._base import _make
from a2a_secure.protocol.models.intents import sealed_inputs_bytes
from a2a_secure.protocol.priority import MAX_PRIORITY, MIN_PRIORITY
from a2a_secure.protocol.sealing import SEALED, SessionSealer, record_sealer
from a2a_secure.protocol.server.auditing import AuditFields
from a2a_secure.protocol.server.common import Reply, log_unexpected, stale
from a2a_secure.protocol.server.delegation import NO_DELEGATION
from a2a_secure.protocol.server.intents import IntentProcessor, begin_refusal, keep_answer
from a2a_secure.protocol.validate import is_fresh
from a2a_secure.store.base import BeginKind, StoredReply, SyncForms

__all__ = [
    "COMMON_INTENT_MEMBERS",
    "SIGNED_HEAD",
    "CommonIntent",
    "CommonIntentProcessor",
    "common_intent",
    "signed_timestamp",
]

_log = logging.getLogger("a2a_secure.server")

# The members of a common intent: the base contract's, §12.3's priority and §12.6's sealed
# inputs (``sealed``; not ``sealed_key``, which goes with an intent_id, nor ``sealed_delegation``).
COMMON_INTENT_MEMBERS: Final = frozenset(("goal", "inputs", "domain", "constraints", "priority", SEALED))
# A session id as step 1 accepts it: the canonical base64url of 32 bytes (43 characters,
# the last carrying 4 bits and 2 zero bits: one of the 16 characters whose value is 0 mod 4).
_SESSION_ID: Final = re.compile(r"[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]")
# The signed payload as this library's client writes it (encoding.dumps of its members in
# this order, compact): this head, the timestamp's digits, then ``,"intent":`` + the intent
# + ``}``. The session id and commitment, checked at step 1, need no escaping.
SIGNED_HEAD: Final = b'{"session_id":"%s","session_commitment":"%s","sequence":%d,"timestamp":'
_MAX_DIGITS: Final = len(str(MAX_SAFE_INT))
_ZERO: Final = ord("0")
_STRICT: Final = orjson.OPT_STRICT_INTEGER
_SORTED: Final = orjson.OPT_SORT_KEYS
_CONSTRAINT_ORDER: Final = ("timeout_ms", "max_tokens", "stream")  # Constraints.to_dict's

CommonIntent = tuple[
    str,
    str,
    int,
    dict[str, Any],
    str,
    dict[str, Any],
    bytes | None,
    str,
    dict[str, Any],
    bytes,
    bytes,
    bytes,
    int,
]
"""Session id, commitment, sequence, the intent (as received), its goal and inputs, the bytes
of its sealed inputs (None: not sealed), the token; its header, payload text, signing input
and signature; the signed timestamp."""


def common_intent(params: Any) -> CommonIntent | None:
    """What ``intent`` params hold when they pass step 1 as a common intent and their signed
    payload passes step 5 against them, else None.

    The shape checks are those of ``IntentRequest.parse`` (member for member, the same
    bounds) on exact JSON types; the token is split as ``jws_decode_unverified`` splits it.
    """
    if type(params) is not dict or params.keys() != m.INTENT_PARAMS:
        return None
    session_id = params["session_id"]
    commitment = params["session_commitment"]
    sequence = params["sequence"]
    intent = params["intent"]
    if (
        type(session_id) is not str
        or _SESSION_ID.fullmatch(session_id) is None
        or type(commitment) is not str
        or not is_hash_string(commitment)
        or type(sequence) is not int
        or not 1 <= sequence <= MAX_SAFE_INT
        or type(intent) is not dict
        or not intent.keys() <= COMMON_INTENT_MEMBERS
    ):
        return None
    goal = intent.get("goal")
    inputs = intent.get("inputs")
    if type(goal) is not str or not 1 <= len(goal) <= 128 or type(inputs) is not dict:
        return None
    if len(intent) > 2 and not _optional_members_ok(intent):
        return None
    sealed: bytes | None = None
    signed_intent = intent  # the intent as step 5 finds it in the signed payload
    if SEALED in intent:  # §12.6: inputs {} and sealed, which the payload signs by its digest
        if inputs:
            return None
        try:
            sealed = sealed_inputs_bytes(intent[SEALED])
        except A2AError:
            return None
        signed_intent = {**intent, SEALED: m.sealed_digest(intent[SEALED])}
    token = params["request_jws"]
    split = jws_split(token)
    if split is None:
        return None
    header, text, signing_input, signature = split
    timestamp = _as_written(text, session_id, commitment, sequence, signed_intent)
    if timestamp is None:  # written otherwise (or not equal): parsed, and compared as JSON
        try:
            payload = encoding.loads(text, error=InvalidParams)
        except A2AError:
            return None
        if type(payload) is not dict:
            return None
        timestamp = signed_timestamp(payload, params, signed_intent)
        if timestamp is None:
            return None
    return (
        session_id,
        commitment,
        sequence,
        intent,
        goal,
        inputs,
        sealed,
        token,
        header,
        text,
        signing_input,
        signature,
        timestamp,
    )


def _optional_members_ok(intent: dict[str, Any]) -> bool:
    """``domain``, ``constraints`` and ``priority``, each as ``Intent.parse`` accepts it."""
    if "domain" in intent:
        domain = intent["domain"]
        if type(domain) is not str or len(domain) > 128:
            return False
    if "priority" in intent:
        priority = intent["priority"]
        if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            return False
    if "constraints" in intent:
        constraints = intent["constraints"]
        if type(constraints) is not dict or not constraints.keys() <= m.CONSTRAINT_MEMBERS:
            return False
        for name in ("timeout_ms", "max_tokens"):
            if name in constraints:
                value = constraints[name]
                if type(value) is not int or not 1 <= value <= MAX_SAFE_INT:
                    return False
        if "stream" in constraints and type(constraints["stream"]) is not bool:
            return False
    return True


def _as_written(text: bytes, session_id: str, commitment: str, sequence: int, intent: Any) -> int | None:
    """The signed timestamp when ``text`` is the payload as this library writes it for these
    members (:data:`SIGNED_HEAD`), else None.

    Such a text is I-JSON (orjson writes no duplicate member, no integer beyond ±(2^53-1)
    with OPT_STRICT_INTEGER, no lone surrogate; the nesting is bounded below) and parses to
    exactly the members step 5 asks for, each equal to the params' (a NaN, which orjson
    writes null, is as equal to the null it parses to by the rule of §1 as written): the
    payload passes step 5.
    """
    try:
        written = orjson.dumps(intent, option=_STRICT)
    except (orjson.JSONEncodeError, TypeError):
        return None
    if written.count(b"{") + written.count(b"[") >= MAX_DEPTH:  # the payload is one level more
        return None
    head = SIGNED_HEAD % (session_id.encode(), commitment.encode(), sequence)
    tail = b',"intent":%s}' % written
    end = len(text) - len(tail)
    if end <= len(head):
        return None
    # Compared in constant time as every signed member is (the commitment is in the head).
    if not (hmac.compare_digest(text[: len(head)], head) and hmac.compare_digest(text[end:], tail)):
        return None
    digits = text[len(head) : end]  # a JSON integer from 0 to 2^53-1: no sign, no leading zero
    if not digits.isdigit() or len(digits) > _MAX_DIGITS or (digits[0] == _ZERO and len(digits) > 1):
        return None
    timestamp = int(digits)
    return timestamp if timestamp <= MAX_SAFE_INT else None


def signed_timestamp(payload: dict[str, Any], params: dict[str, Any], intent: dict[str, Any]) -> int | None:
    """The signed timestamp when ``payload`` passes step 5 against ``params``, else None.

    ``intent``: the params' intent as signed (§12.6: sealed values by their digests).
    Step 5 asks for exactly the members of ``REQUEST_PAYLOAD``, a signed sequence and
    timestamp that are I-JSON integers, and each member equal (§1) to the receiver's own
    value: the params' session id, sequence and (signed) intent, and the session's
    commitment, which step 3 finds identical to the params'. Payload less its timestamp and
    params less their token (with that intent) then hold the same members; their JSON texts
    with sorted members are the same exactly when each member's is (one text, parsed, gives
    one member list), and a member's text the same makes it equal by the rule of §1. A text
    that differs may still be an equal value (``1`` and ``1.0``): None, and the general
    check decides.
    """
    if payload.keys() != m.REQUEST_PAYLOAD:
        return None
    timestamp = payload["timestamp"]
    if type(timestamp) is not int or not 0 <= timestamp <= MAX_SAFE_INT:
        return None
    signed = payload.copy()
    del signed["timestamp"]
    sent = params.copy()
    del sent["request_jws"]
    sent["intent"] = intent
    try:
        same = hmac.compare_digest(orjson.dumps(signed, option=_SORTED), orjson.dumps(sent, option=_SORTED))
    except (orjson.JSONEncodeError, TypeError):
        return None
    return timestamp if same else None


def _constraints_dict(constraints: dict[str, Any]) -> dict[str, Any]:
    """``Intent.constraints_dict`` of checked ``constraints``: a copy, members in its order."""
    return {name: constraints[name] for name in _CONSTRAINT_ORDER if name in constraints}


class CommonIntentProcessor(IntentProcessor):
    """:class:`IntentProcessor` with a flat path for the common intent (this module's doc)."""

    def common(self, params: Any) -> CommonIntent | None:
        """What :meth:`answer_now` needs of ``params`` (an ``intent`` call's), or None when the
        general path answers them. Reads nothing but ``params`` and the configuration."""
        cfg = self._config
        if (
            cfg.delegation is not None  # §12.7: the rules may reach an intent without a chain
            or cfg.limits.max_concurrent_intents is not None  # §12.3: the queue
            or cfg.key_guard.revocations  # deny lists of the key guard's own, asked per intent
            or self._forms_for(cfg.store) is None  # a store that may suspend
        ):
            return None
        found = common_intent(params)
        if found is None:
            return None
        if found[6] is not None and not cfg.limits.sealed_intents:
            return None  # §12.6 not served: the general path refuses the member at step 1
        constraints = found[3].get("constraints")
        stream = None if constraints is None else constraints.get("stream")
        if stream is True or (stream is None and cfg.dispatcher.is_always_streamed(found[4])):
            return None  # §6.4: a stream
        return found

    def answer_now(
        self, found: CommonIntent, params: dict[str, Any], audit: AuditFields
    ) -> Reply | Awaitable[Reply]:
        """The reply to the intent :meth:`common` found in ``params``, called right after it.

        A :class:`Reply`, unless something must be awaited: a handler that suspends, a retry
        that waits on its original, the general path from step 5. Raises, as
        :meth:`IntentProcessor.handle` does, only before step 5.
        """
        (session_id, commitment, sequence, intent, goal, inputs, sealed, token) = found[:8]
        header, text, signing_input, signature, timestamp = found[8:]
        cfg = self._config
        audit.intent_goal = goal[:256]
        audit.sequence = sequence
        # Steps 2-4, as the general path takes them.
        now = self._clock()
        store = cfg.store
        forms = self._forms
        assert forms is not None  # common() found them for this store
        session = forms.get_session(session_id, now)
        if session is None or self._past_deadline(session_id):
            raise SessionUnknown("unknown, expired or closed session")
        self._check_signed(
            session, session_id, commitment, header, signing_input, signature, False, now, audit
        )
        # Step 5 was decided by common(). Sealed inputs on a session without keys, or clear
        # ones on a sealed session (both refused), and a client whose DID document is due to
        # be fetched again: the general path, on.
        session_sealed = bool(session.seal_keys)
        if session_sealed is not (sealed is not None) or not cfg.key_guard.session_checked_now(
            cfg.resolver, session
        ):
            payload = encoding.loads(text, error=InvalidParams)  # as jws_decode_unverified did
            decoded = (header, payload, signing_input, signature)
            req = _make(IntentRequest, session_id, commitment, sequence, Intent.parse(intent), token, decoded)
            return self._verified(req, session, payload, now, audit, store, forms)
        req_hash = m.request_hash(token)
        now_i = int(now)
        sealer: SessionSealer | None = None
        if sealed is not None:
            # Step 5, §12.6: the inputs the client signed by their digest, opened (signed
            # refusals, before freshness, the sequence not used up). The other checks of
            # open_intent_inputs hold here: a sealed session, no intent_id, no chain.
            try:
                sealer = record_sealer(session)
                assert sealer is not None  # the session has keys
                inputs = sealer.open_inputs(sequence, goal, sealed)
            except A2AError as exc:
                return self._signed_error(exc, session_id, sequence, req_hash, now_i)
        constraints = intent.get("constraints")
        try:
            # Step 6: freshness.
            if not is_fresh(timestamp, now):
                raise stale("request", timestamp, now)
            # Steps 9 and 10, decided before steps 7-8 as on the general path.
            stream = None if constraints is None else constraints.get("stream")
            priority, refusal = self._admission(
                session, goal, intent.get("priority"), stream, inputs, NO_DELEGATION
            )
            # Steps 7-8.
            policy = session.policy
            begin = forms.begin_request(
                session_id,
                session.client_did,
                sequence,
                req_hash,
                rate_limit=policy.rate_limit,
                rate_period=policy.rate_period,
                now=now,
                agent=session.server_did,
            )
            if begin.kind is not BeginKind.NEW:
                refused = begin_refusal(begin, sequence)
                if refused is not None:
                    raise refused
                return self._replayed(session_id, sequence, req_hash, begin.reply, audit, now_i, sealer)
        except A2AError as exc:
            return self._signed_error(exc, session_id, sequence, req_hash, now_i)
        # The sequence is consumed: whatever happens now is the stored answer.
        try:
            if refusal is not None:  # steps 9 and 10
                raise refusal
            context, timeout_ms = self._context(
                session,
                sequence,
                goal,
                intent.get("domain"),
                {} if constraints is None else _constraints_dict(constraints),
                None,
                audit,
                NO_DELEGATION,
                priority,
            )
            # Step 11: no await, unless the handler suspends.
            result, rest = self._start(goal, inputs, context, timeout_ms)
            if rest is not None:
                return self._finish(rest, forms, session_id, sequence, req_hash, sealer)
            reply = self._result_reply(session_id, sequence, req_hash, result, sealer)
        except A2AError as exc:
            reply = self._error_reply(exc, session_id, sequence, req_hash, sealer)
        except Exception as exc:
            log_unexpected(_log, "internal error after the sequence was consumed", exc)
            reply = self._signed_error(InternalError(), session_id, sequence, req_hash, int(self._clock()))
        if reply.stored is not None:
            keep_answer(forms, session_id, sequence, reply.stored)
        return reply

    async def _replayed(
        self,
        session_id: str,
        sequence: int,
        req_hash: str,
        stored: StoredReply | None,
        audit: AuditFields,
        now_i: int,
        sealer: SessionSealer | None,
    ) -> Reply:
        """A byte-identical retry's answer: the original's (§6.1 step 7), or its refusal."""
        try:
            return await self._replay(
                session_id, sequence, req_hash, stored, audit, sealed=sealer is not None
            )
        except A2AError as exc:
            return self._signed_error(exc, session_id, sequence, req_hash, now_i)

    async def _finish(
        self,
        rest: Awaitable[Any],
        forms: SyncForms,
        session_id: str,
        sequence: int,
        req_hash: str,
        sealer: SessionSealer | None,
    ) -> Reply:
        """The reply once a handler that suspended is done, kept for a retry."""
        try:
            result = await rest
            reply = self._result_reply(session_id, sequence, req_hash, result, sealer)
        except A2AError as exc:
            reply = self._error_reply(exc, session_id, sequence, req_hash, sealer)
        except Exception as exc:
            log_unexpected(_log, "internal error after the sequence was consumed", exc)
            reply = self._signed_error(InternalError(), session_id, sequence, req_hash, int(self._clock()))
        if reply.stored is not None:
            keep_answer(forms, session_id, sequence, reply.stored)
        return reply
