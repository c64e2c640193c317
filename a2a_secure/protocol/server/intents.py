"""The intent processor: §6.1 steps 1-10 of an intent, and the close of §6.3.

Steps in the order of PROTOCOL.md §6.1: (1) shapes, (2) the session, (3) the session
commitment, (4) the signature with the client key pinned by the handshake, (5) the signed
payload equal to the params, (6) freshness, (7-8) sequence and rate limit in one atomic
store update, (9) the session's policy, (10) a handler. Up to step 4 a refusal is an
unsigned error; from step 5 on, every answer is signed (:mod:`.replies`). Once step 8 has
consumed the sequence, whatever happens is the stored answer a byte-identical retry gets
again (:mod:`a2a_secure.runtime.replay`). Step 11 is the runner's
(:mod:`a2a_secure.runtime.runner`), or the stream pump's for a streamed answer
(:mod:`a2a_secure.runtime.stream_pump`): the runtime, handed in through :mod:`.ports`.

The common intent (no extension member but sealed inputs, a store that never suspends)
takes the flat path of :mod:`.common_intent`, a subclass of this processor that answers it
with the same steps 2-4 (:meth:`IntentProcessor._check_signed`), 9-10, refusals and signed
answers, sealed or not (:meth:`IntentProcessor._result_reply`, :meth:`~IntentProcessor._error_reply`),
and hands anything else to :meth:`IntentProcessor.handle` or, once the signature is
verified, to its steps 5-11 (:meth:`IntentProcessor._verified`).

State: none of its own. It reads sessions and consumes sequences in the :class:`Store` of
the :class:`ServerConfig`, and ends sessions (§6.3) there and in the
:class:`SessionDeadlines`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from a2a_secure.delegation import DELEGATION
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InternalError,
    InvalidParams,
    SequenceError,
    SessionUnknown,
    Unavailable,
)
from a2a_secure.frozen import builder
from a2a_secure.identity.jws import jws_check
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.models import (
    ClosePayload,
    CloseRequest,
    Intent,
    IntentRequest,
    RequestPayload,
)
from a2a_secure.protocol.priority import DEFAULT_PRIORITY
from a2a_secure.protocol.sealed_claims import ClaimBox, claim_intent, from_claim, to_claim
from a2a_secure.protocol.sealing import (
    CHAIN_MEMBER,
    SessionSealer,
    open_intent_delegation,
    open_intent_inputs,
    record_sealer,
    seal_error_data,
)
from a2a_secure.protocol.server.admission import admit_goal
from a2a_secure.protocol.server.auditing import AuditFields
from a2a_secure.protocol.server.common import (
    Clock,
    RandomSource,
    Reply,
    ServerConfig,
    log_unexpected,
    stale,
)
from a2a_secure.protocol.server.deadlines import SessionDeadlines
from a2a_secure.protocol.server.delegation import (
    NO_DELEGATION,
    DelegationGuard,
    Verdict,
    as_told,
    claim_form,
)
from a2a_secure.protocol.server.dispatcher import IntentContext
from a2a_secure.protocol.server.ports import Claims, PendingClaim, Replay, Runner, Streams
from a2a_secure.protocol.server.replies import SignedReplies, result_json
from a2a_secure.protocol.validate import ct_equal, is_fresh
from a2a_secure.store.base import (
    Begin,
    BeginKind,
    SessionRecord,
    Store,
    StoredReply,
    SyncForms,
    replaced_on_instance,
    sync_forms,
)
from a2a_secure.store.intents import ClaimKind
from a2a_secure.system import WallSeconds

__all__ = ["IntentProcessor", "begin_refusal", "keep_answer", "parse_intent"]

_log = logging.getLogger("a2a_secure.server")
_build_context = builder(IntentContext)


def parse_intent(value: Any) -> dict[str, Any]:
    """Shape of the ``intent`` object of §6.1 (-32602 for any deviation); returns it as given.

    The typed form is :class:`a2a_secure.protocol.models.Intent`.
    """
    Intent.parse(value)
    return value  # type: ignore[no-any-return]


class IntentProcessor:
    """Checks an ``intent`` or ``close`` request and answers it, signed from step 5 on."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        deadlines: SessionDeadlines,
        replies: SignedReplies,
        replayer: Replay,
        runner: Runner,
        streams: Streams,
        clock: Clock,
        exactly_once: Claims,
        random_bytes: RandomSource,
        delegation: DelegationGuard | None = None,
    ) -> None:
        self._config = config
        self._random = random_bytes  # a kept answer's nonces (ClaimBox)
        self._exactly_once = exactly_once
        self._delegation = delegation or DelegationGuard(config)
        self._deadlines = deadlines
        self._past_deadline = deadlines.past
        self._signed_error = replies.error
        self._success_reply = replies.success
        self._result_token = replies.result_token
        self._replay = replayer.answer
        self._start = runner.start
        self._has_room = runner.gate.has_room
        self._streams = streams
        self._clock = clock
        # The store's synchronous forms, looked up again whenever the store is replaced.
        self._forms_of: object = None
        self._forms: SyncForms | None = None

    async def handle(self, method: str, params: Any, audit: AuditFields) -> Reply:
        """The reply to an ``intent`` or ``close`` call (raises only before step 5)."""
        cfg = self._config
        is_close = method == "close"
        # Step 1: shapes.
        req: IntentRequest | CloseRequest
        req = CloseRequest.parse(params) if is_close else IntentRequest.parse(params)
        session_id = req.session_id
        params_seq = req.sequence
        intent = req.intent
        if intent is not None:
            audit.intent_goal = intent.goal[:256]
            if intent.intent_id is not None:
                self._exactly_once.check(intent)
            if (intent.sealed is not None or intent.sealed_key is not None) and not cfg.limits.sealed_intents:
                # §12.6: as any unknown member of intent at a server without the extension.
                raise InvalidParams("intent: unexpected member 'sealed' (this server does not seal)")
            if intent.delegation is not None or intent.sealed_delegation is not None:
                self._delegation.check_member(intent)
        audit.sequence = params_seq
        # Step 2: the session. A store that never suspends (MemoryStore) is called without a
        # coroutine here and at steps 7-8 and the finish: nothing is awaited but real I/O.
        now = self._clock()
        store = cfg.store
        forms = self._forms_for(store)
        if forms is not None:
            session = forms.get_session(session_id, now)
        else:
            session = await store.get_session(session_id, now)
        if session is None or self._past_deadline(session_id):
            raise SessionUnknown("unknown, expired or closed session")
        header, payload, signing_input, signature = req.decoded
        self._check_signed(
            session,
            session_id,
            req.session_commitment,
            header,
            signing_input,
            signature,
            is_close,
            now,
            audit,
        )
        return await self._verified(req, session, payload, now, audit, store, forms)

    def _forms_for(self, store: Store) -> SyncForms | None:
        """The synchronous forms of ``store`` (:func:`sync_forms`), looked up once per store."""
        if store is not self._forms_of:
            self._forms_of, self._forms = store, sync_forms(store)
        forms = self._forms
        if forms is not None and replaced_on_instance(store):
            return None
        return forms

    def _check_signed(
        self,
        session: SessionRecord,
        session_id: str,
        commitment: str,
        header: Mapping[str, Any],
        signing_input: bytes,
        signature: bytes,
        is_close: bool,
        now: float,
        audit: AuditFields,
    ) -> None:
        """Steps 2 (``session``, found and within its deadline) to 4, of a token split into its
        ``header``, ``signing_input`` and ``signature``; raises the refusal."""
        cfg = self._config
        audit.session_id = session_id
        audit.client_did = session.client_did
        signer = cfg.key_guard.signer_for(cfg.identity, session, now)  # -32043 once it is gone
        # A session opened with another agent sharing this store (one Redis, one prefix) is
        # unknown here: its client agreed to that agent's policy and card, not to this one's.
        # (A did:key rotation changes this agent's DID: the retired key keeps its sessions.)
        if session.server_did != signer.did:
            raise SessionUnknown("unknown, expired or closed session")
        if signer is not cfg.identity:
            cfg.retired_signers[session_id] = signer
        # Step 3: commitment (not a secret, compared in constant time all the same).
        if not ct_equal(commitment, session.session_commitment):
            raise AuthenticationFailed("session_commitment does not match the session")
        # Step 4: signature with the client key pinned by the handshake.
        typ = m.Typ.CLOSE if is_close else m.Typ.REQUEST
        jws_check(header, signing_input, signature, session.client_key, typ=typ, kid=session.client_kid)
        audit.verified = True

    async def _verified(
        self,
        req: IntentRequest | CloseRequest,
        session: SessionRecord,
        payload: dict[str, Any],
        now: WallSeconds,
        audit: AuditFields,
        store: Store,
        forms: SyncForms | None,
    ) -> Reply:
        """Steps 5 to 11 of a request whose signature ``payload`` is verified."""
        cfg = self._config
        session_id = req.session_id
        params_seq = req.sequence
        intent = req.intent
        is_close = intent is None
        req_hash = m.request_hash(req.request_jws)
        now_i = int(now)
        # Step 5: payload exact and equal to params; from here on errors are signed.
        try:
            expected: dict[str, Any] = {
                "session_id": session_id,
                "session_commitment": session.session_commitment,
                "sequence": params_seq,
            }
            signed: RequestPayload | ClosePayload
            intent_obj: dict[str, Any] | None = None
            if intent is None:
                signed = ClosePayload.parse(payload, expected=expected)
            else:
                expected["intent"] = intent_obj = intent.to_dict()
                if intent.sealed is not None:  # §12.6: the payload signs the sealed values' digests
                    signed_intent = {**intent_obj, "sealed": m.sealed_digest(intent.sealed)}
                    expected["intent"] = signed_intent
                    if intent.sealed_delegation is not None:
                        signed_intent[CHAIN_MEMBER] = m.sealed_digest(intent.sealed_delegation)
                signed = RequestPayload.parse(payload, expected=expected)
            sequence, ts = signed.sequence, signed.timestamp
            sealer = record_sealer(session)
            inputs: dict[str, Any] | None = None
            answer_key: bytes | None = None
            chain_value: tuple[str, ...] | str | None = None  # the chain, opened when sealed
            if intent is not None:
                inputs, answer_key = open_intent_inputs(sealer, intent, sequence)
                chain_value = open_intent_delegation(sealer, intent, sequence)
        except A2AError as exc:
            return self._signed_error(exc, session_id, params_seq, req_hash, now_i)
        audit.sequence = sequence
        try:
            # Step 6: freshness.
            if not is_fresh(ts, now):
                raise stale("request", ts, now)
            wants_stream = intent is not None and self._wants_stream(intent)
            if wants_stream and not self._streams.has_room(session_id, sequence, session.client_did):
                # Checked before the sequence is consumed, so the same request may come back.
                raise Unavailable("too many open streams", retry_after=1)
            key_guard = cfg.key_guard
            if not key_guard.session_checked_now(cfg.resolver, session):
                await key_guard.check_session(store, cfg.resolver, session)  # revoked, dropped keys
            if (
                intent is not None
                and cfg.limits.max_concurrent_intents is not None  # §12.3 off: nothing to ask
                and not self._has_room(intent.priority or DEFAULT_PRIORITY)
            ):
                # §12.3: the queue is full; likewise before the sequence is consumed.
                raise Unavailable("too many intents are waiting to run", retry_after=1)
            # §12.7: the chain is checked now, its refusal given at step 9 (and claims no id).
            delegated = NO_DELEGATION
            if intent is not None and chain_value is not None:
                # One Redis reads the deny list's epoch with steps 7-8 (not with a claim of
                # §12.5, which a refused chain must not make): a kept chain then costs no
                # round trip of its own.
                epoch_later = intent.intent_id is None and getattr(store, "epoch_in_begin", False)
                delegated = await self._delegation.verdict(
                    session, intent, now, chain_value, epoch_later=epoch_later
                )
            # Steps 9 and 10, decided once, here: §12.5 checks them before an intent_id is
            # claimed, so that a refused intent does not use its id up (its refusal would be
            # the id's answer for the whole retention window, and the corrected intent a 409).
            # The refusal itself is given after steps 7-8, as for any intent.
            priority, refusal = DEFAULT_PRIORITY, None
            if intent is not None and inputs is not None:
                priority, refusal = self._admission(
                    session, intent.goal, intent.priority, intent.stream, inputs, delegated
                )
            # Steps 7-8, one atomic check-and-update (with an intent_id, and its claim).
            once: PendingClaim | None = None
            if (
                intent is not None
                and intent_obj is not None
                and intent.intent_id is not None
                and inputs is not None
                and refusal is None
            ):
                # The form a claim hashes: the same for every resend of this intent, whether it
                # carries its chain in full or by hash (§12.7), sealed for one session or another.
                claimed: Mapping[str, Any] = intent_obj
                if chain_value is not None:
                    claimed = claim_form({**intent_obj, DELEGATION: _as_json(chain_value)})
                if answer_key is not None:  # §12.6: the claim keeps its answer sealed, keyless
                    claimed = claim_intent(claimed, inputs, answer_key)
                once = self._exactly_once.prepare(session, intent, claimed, wants_stream, now)
                if once is not None and answer_key is not None:
                    assert sealer is not None
                    box = ClaimBox(answer_key, intent.intent_id, self._random)
                    once.to_claim = functools.partial(
                        to_claim, sealer=sealer, sequence=sequence, request_hash=req_hash, box=box
                    )
                    once.from_claim = functools.partial(from_claim, box=box, sealer=sealer)
            if once is None and forms is not None:
                begin = forms.begin_request(
                    session_id,
                    session.client_did,
                    sequence,
                    req_hash,
                    rate_limit=None if is_close else session.policy.rate_limit,
                    rate_period=session.policy.rate_period,
                    now=now,
                    agent=session.server_did,
                )
            elif once is None and delegated.recheck is not None:
                begin, epoch = await store.begin_request_reading_epoch(  # type: ignore[attr-defined]
                    session_id,
                    session.client_did,
                    sequence,
                    req_hash,
                    rate_limit=session.policy.rate_limit,
                    rate_period=session.policy.rate_period,
                    now=now,
                    agent=session.server_did,
                )
                if begin.kind is BeginKind.NEW:  # revoked since it was found clean: step 9
                    delegated = await self._delegation.recheck(delegated, epoch)
                    if refusal is None and delegated.refusal is not None:
                        refusal = as_told(delegated.refusal, session)  # §12.7 on a sealed session
            elif once is None:
                begin = await store.begin_request(
                    session_id,
                    session.client_did,
                    sequence,
                    req_hash,
                    rate_limit=None if is_close else session.policy.rate_limit,
                    rate_period=session.policy.rate_period,
                    now=now,
                    agent=session.server_did,
                )
            else:
                begin = await self._exactly_once.begin(
                    once, session, sequence, req_hash, rate_limit=session.policy.rate_limit, now=now
                )
            refused = begin_refusal(begin, sequence)
            if refused is not None:
                raise refused
            if begin.kind in (BeginKind.REPLAY, BeginKind.IN_PROGRESS):
                if once is not None and self._exactly_once.is_resumable(begin.reply):
                    return await self._exactly_once.resume(once, session_id, sequence, req_hash, audit)
                sealed = sealer is not None and not is_close
                return await self._replay(session_id, sequence, req_hash, begin.reply, audit, sealed=sealed)
            if once is not None and once.claim is not None and once.claim.kind is not ClaimKind.NEW:
                return await self._exactly_once.answer(once, session_id, sequence, req_hash, audit)
            if once is not None and once.claim is not None:  # NEW: record the start, or not run
                taken = await self._exactly_once.start(once, session_id, sequence, req_hash, audit)
                if taken is not None:
                    return taken
        except A2AError as exc:
            return self._signed_error(exc, session_id, sequence, req_hash, now_i)
        # The sequence is consumed: whatever happens now is the stored answer.
        try:
            if is_close:
                reply = await self._close(session, sequence, req_hash)
            else:
                assert intent is not None
                assert inputs is not None
                goal = intent.goal
                if refusal is not None:  # steps 9 and 10
                    raise refusal
                context, timeout_ms = self._context(
                    session,
                    sequence,
                    goal,
                    intent.domain,
                    intent.constraints_dict,
                    intent.intent_id,
                    audit,
                    delegated,
                    priority,
                )
                if wants_stream:
                    reply = await self._streams.start(
                        session, sequence, req_hash, goal, inputs, context, timeout_ms, audit
                    )
                else:
                    # Step 11: one await, and only if the handler suspends.
                    result, rest = self._start(goal, inputs, context, timeout_ms)
                    if rest is not None:
                        result = await rest
                    reply = self._result_reply(session_id, sequence, req_hash, result, sealer)
        except A2AError as exc:
            reply = self._error_reply(exc, session_id, sequence, req_hash, sealer)
        except Exception as exc:
            log_unexpected(_log, "internal error after the sequence was consumed", exc)
            reply = self._signed_error(InternalError(), session_id, sequence, req_hash, int(self._clock()))
        if not is_close and reply.stored is not None:  # a stream stores its events itself
            # The intent ran: its answer goes out even if the store cannot keep it (a shared
            # store down). A byte-identical retry then finds no stored answer and gets 503.
            if forms is not None:
                keep_answer(forms, session_id, sequence, reply.stored)
            else:
                try:  # (not contextlib.suppress, which costs a context manager on every intent)
                    await store.finish_request(session_id, sequence, reply.stored)
                except Exception as exc:
                    _not_kept(sequence, exc)
            if once is not None:
                await self._exactly_once.finish(session_id, sequence, reply.stored)
        return reply

    def _result_reply(
        self, session_id: str, sequence: int, req_hash: str, result: Any, sealer: SessionSealer | None
    ) -> Reply:
        """The signed success carrying a handler's ``result`` (step 11), on both paths.

        On a sealed session (``sealer``) the result is checked as I-JSON and written once,
        then sealed, and the signature covers the sealed form by its digest (§12.6).
        """
        if sealer is None:
            return self._success_reply(session_id, sequence, req_hash, result, int(self._clock()))
        sealed = sealer.seal_result_json(sequence, req_hash, result_json(result))
        return self._success_reply(session_id, sequence, req_hash, sealed, int(self._clock()), sealed=True)

    def _error_reply(
        self, exc: A2AError, session_id: str, sequence: int, req_hash: str, sealer: SessionSealer | None
    ) -> Reply:
        """The signed refusal ``exc`` once the sequence is consumed, on both paths: its
        ``data`` sealed on a sealed session (§12.6)."""
        exc = seal_error_data(sealer, exc, sequence, req_hash)
        return self._signed_error(exc, session_id, sequence, req_hash, int(self._clock()))

    def _admission(
        self,
        session: SessionRecord,
        goal: str,
        requested: int | None,
        stream: bool | None,
        inputs: dict[str, Any],
        delegated: Verdict,
    ) -> tuple[int, A2AError | None]:
        """Steps 9 and 10 (:func:`~.admission.admit_goal`) as a value: (the priority the intent
        runs at, None), or (the default, the refusal).

        ``requested``: the intent's priority (§12.3) and ``stream`` its constraint, None when
        absent; ``inputs``: the intent's inputs as the handler will see them (opened, when
        sealed); ``delegated``: the verdict on the chain the intent acts under (§12.7).
        """
        try:
            priority = admit_goal(
                self._config, session, goal, inputs, requested=requested, stream=stream, delegated=delegated
            )
        except A2AError as exc:
            return DEFAULT_PRIORITY, exc
        return priority, None

    def _wants_stream(self, intent: Intent) -> bool:
        flag = intent.stream
        return flag is True or (flag is None and self._config.dispatcher.is_always_streamed(intent.goal))

    async def _close(self, session: SessionRecord, sequence: int, req_hash: str) -> Reply:
        # §6.3: the session ends here and in every store that shares it.
        await self._config.store.close_session(session.session_id)
        self._deadlines.forget(session.session_id)
        self._delegation.forget(session.session_id)
        result = {"type": "closed", "session_id": session.session_id}
        token = self._result_token(session.session_id, sequence, req_hash, result, int(self._clock()))
        return Reply(200, {**result, "response_jws": token})

    def _context(
        self,
        session: SessionRecord,
        sequence: int,
        goal: str,
        domain: str | None,
        constraints: dict[str, Any],
        intent_id: str | None,
        audit: AuditFields,
        delegated: Verdict,
        priority: int,
    ) -> tuple[IntentContext, int]:
        """What the handler of an admitted intent is told, and its deadline in ms (step 11).

        ``constraints``: the intent's, as ``Intent.constraints_dict`` gives them.
        """
        chain = delegated.chain
        if chain is not None:
            audit.principal, audit.delegation = chain.principal, chain.hash
        # Step 11 (the runner's): within min(timeout_ms, server maximum).
        max_ms = self._config.limits.max_handler_timeout_ms
        timeout_ms = min(constraints.get("timeout_ms", max_ms), max_ms)
        # Every field, in order, each already checked: built as the parsed models are,
        # without the frozen dataclass's __init__ (half the cost, on every intent).
        context = _build_context(
            session.client_did,  # caller_did
            session.session_id,
            sequence,
            goal,
            domain,
            constraints,
            session.client_agent_id,
            priority,
            intent_id,
            None if chain is None else chain.principal,  # principal
            chain,  # delegation
            bool(session.seal_keys),  # sealed
        )
        return context, timeout_ms


def _as_json(chain: tuple[str, ...] | str) -> list[str] | str:
    """A chain as the ``delegation`` member has it on the wire (an array, or a name)."""
    return chain if isinstance(chain, str) else list(chain)


def begin_refusal(begin: Begin, sequence: int) -> A2AError | None:
    """The refusal of steps 7-8 that ``begin`` decided for ``sequence``, or None."""
    kind = begin.kind
    if kind is BeginKind.GONE:
        return SessionUnknown("unknown, expired or closed session")
    if kind is BeginKind.REVOKED:
        return SessionUnknown("session ended: the client's DID or key id is revoked")
    if kind is BeginKind.STALE:
        return SequenceError(f"sequence {sequence} is not greater than {begin.last_sequence}")
    if kind is BeginKind.RATE_LIMITED:
        return Unavailable("rate limit reached", retry_after=begin.retry_after)
    return None


def keep_answer(forms: SyncForms, session_id: str, sequence: int, stored: StoredReply) -> None:
    """Keep the answer to ``sequence`` for a byte-identical retry, if the store can."""
    try:  # (not contextlib.suppress, which costs a context manager on every intent)
        forms.finish_request(session_id, sequence, stored)
    except Exception as exc:
        _not_kept(sequence, exc)


def _not_kept(sequence: int, exc: Exception) -> None:
    _log.warning("answer to sequence %d not stored: %s", sequence, type(exc).__name__)
