"""The client's attempt machine: one call, from the intent to what to send or raise (sans-I/O).

Every kind of call a client makes goes through one :class:`Call`: a unary request, a
streamed one (its events and its resumption), an intent on a session the caller holds
(``send_intent``), the A2A secure transport's calls and the MCP bridge's tool calls. Given
the intent, what the client knows of the server (:class:`PeerState`: its session, the
extensions its authenticated card declares, whether a verified card of it declared
``sealed``, the chains sent on the session, the ids-full pause) and the last answer, it
says what comes next. The adapter only performs the I/O it is told and feeds back what came
of it, in a loop that reads the same for every kind of call::

    call = Call(peer, intent, client_did=..., options=..., streamed=...)
    while True:
        step = call.next(now, mono)          # wall-clock now, monotonic mono
        if step is HANDSHAKE:                # no session, expired, forgotten, or not sealed
            peer.session = <a new session>   #   when it must be: open one
        elif isinstance(step, LearnCard):    # a member the card is not yet known to declare
            call.learnt(<the verified card's extensions, or None>)
        else:                                # Send: sign step.intent on step.session, send it
            try: return <the verified answer>
            except A2AError as exc:
                call.failed(exc, yielded=..., mono=mono)   # raises, or says why it goes again

Rule: every decision between two sends lives here, once (retry of the byte-identical
request is below, in :mod:`a2a_secure.protocol.client_decisions`, and is the same for every
call too). A rule added here applies to every kind of call by construction; tests drive
the machine with no socket and a fake clock (tests/test_client_attempt.py).

The decisions, in the order :meth:`Call.next` makes them:

* session: a new one when there is none, it expired, the server forgot it (-32043), or it
  is not sealed while a verified card of this server declares ``sealed`` (§12.6: a blocked
  or altered card cannot downgrade). On a session the caller holds (``pinned``) nothing is
  opened: the call is refused instead;
* ``check``: the caller's own test of each session before anything is signed on it (the
  card the A2A transport verified, the card the MCP bridge showed a model);
* priority (§12.3), ``intent_id`` (§12.5) and delegation (§12.7): a member the
  authenticated card does not declare is refused before anything is signed; one look-up of
  the card is asked for first (:class:`LearnCard`);
* delegation: the chain in full the first time on a session, its name after that, in full
  again after the server's signed "chain unknown" (``data.chain_unknown``, or the older
  message text).

And what an answer leads to, in :meth:`Call.failed`: the chain in full once more; the
intent once more without this client's own ``intent_id`` after "ids full" (and none for a
while); a new session and one resend after -32043 (a stream only before its first item and
with an ``intent_id``); anything else is raised as it came (a 503's ``data.pool`` is the
raised error's ``.pool``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from a2a_secure import system
from a2a_secure.delegation import DELEGATION, Chain
from a2a_secure.errors import A2AError, InvalidParams, SessionUnknown
from a2a_secure.frozen import quick_init
from a2a_secure.protocol.client_decisions import (
    IdNeed,
    PeerState,
    chain_unknown,
    ids_full_pause,
    intent_id_need,
    resend_after_session_unknown,
    undeclared,
)
from a2a_secure.protocol.client_session import ClientSession
from a2a_secure.protocol.intent_id import INTENT_ID, check_intent_id, new_intent_id
from a2a_secure.protocol.priority import EXTENSION as PRIORITY
from a2a_secure.system import MonoSeconds, WallSeconds

__all__ = [
    "HANDSHAKE",
    "Call",
    "CallOptions",
    "LearnCard",
    "Resend",
    "Send",
    "given_intent_id",
]


class _Open(enum.Enum):
    HANDSHAKE = "handshake"


#: Open a new session with the server (and set ``peer.session``), then ask again.
HANDSHAKE: Final = _Open.HANDSHAKE
# How many sessions one call may open: one, and one more after -32043.
_MAX_HANDSHAKES: Final = 2


@dataclass(frozen=True, slots=True)
class LearnCard:
    """Look up the verified card of ``session``'s server, then :meth:`Call.learnt` its
    extensions (None when it could not be had or did not verify)."""

    session: ClientSession


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class Send:
    """Sign ``intent`` on ``session`` and send it; ``intent_id`` is the id it carries."""

    session: ClientSession
    intent: Mapping[str, Any]
    intent_id: str | None


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class CallOptions:
    """The client's settings that shape a call (see ``A2AClient``'s arguments)."""

    exactly_once: bool | None = None
    resend_on_unknown_session: bool = True
    sealed: bool | None = None


class Resend(enum.Enum):
    """Why a call goes again after an answer (for traces and logs)."""

    CHAIN_UNKNOWN = "chain_unknown"
    IDS_FULL = "ids_full"
    SESSION_UNKNOWN = "session_unknown"


def given_intent_id(intent: Mapping[str, Any], intent_id: str | None) -> str | None:
    """The ``intent_id`` the caller gives (argument or member), checked; None for none."""
    given = intent_id if intent_id is not None else intent.get(INTENT_ID)
    if given is not None:
        check_intent_id(given)
        if intent_id is not None and intent.get(INTENT_ID, intent_id) != intent_id:
            raise InvalidParams("intent_id differs from the intent's own intent_id")
    return given


def _clear_session(server_did: str) -> InvalidParams:
    return InvalidParams(
        f"{server_did[:128]} declares the sealed extension in its authenticated agent card:"
        " refusing to send intents in the clear on a session that is not sealed"
    )


class Call:
    """One call's decisions, from its first session to its last answer (see the module doc).

    ``streamed``: a streamed request (§6.4); ``yielded`` in :meth:`failed` then says whether
    an item reached the caller. ``pinned``: the caller's own session, the only one the call
    may use (no handshake, no own ``intent_id``). ``check``: called with each session before
    anything is signed on it; what it raises ends the call. ``random_bytes``: the source of
    this client's own intent_ids.
    """

    __slots__ = (
        "_asked",
        "_check",
        "_handshakes",
        "_random",
        "_server_did",
        "attempt",
        "chain",
        "chosen",
        "client_did",
        "intent",
        "options",
        "own_id",
        "peer",
        "pinned",
        "reference",
        "streamed",
    )

    def __init__(
        self,
        peer: PeerState,
        intent: Mapping[str, Any],
        *,
        client_did: str,
        server_did: str,
        options: CallOptions,
        streamed: bool = False,
        intent_id: str | None = None,
        chain: Chain | None = None,
        pinned: ClientSession | None = None,
        check: Callable[[ClientSession], None] | None = None,
        random_bytes: Callable[[int], bytes] = system.random_bytes,
    ) -> None:
        self.peer = peer
        self.intent = intent
        self.client_did = client_did
        self.options = options
        self.streamed = streamed
        self.chain = chain
        self.pinned = pinned
        self._check = check
        self._random = random_bytes
        self.chosen = given_intent_id(intent, intent_id)
        self.own_id = self.chosen is None  # an id this client picks, not the caller's
        self.attempt = 0  # sends so far
        self.reference: str | None = None  # the chain's name, when the last send named it so
        self._handshakes = 0
        self._asked: ClientSession | None = None  # the session whose card was looked up
        self._server_did = server_did

    # -- what to do next ------------------------------------------------------------------------
    def session_step(self, now: WallSeconds) -> _Open | ClientSession:
        """The session this call goes on at wall-clock ``now``, or :data:`HANDSHAKE` first."""
        peer = self.peer
        must_seal = peer.sealed_seen and self.options.sealed is not False
        if self.pinned is not None:
            session = self.pinned
            if session.expired(now):
                raise SessionUnknown("session expired or closed")
            if must_seal and not session.sealed:
                raise _clear_session(self._server_did)
            if self.chain is not None and session is not peer.session:
                raise InvalidParams("a delegated intent goes on the open session with its server only")
            return session
        current = peer.session
        if current is not None and not current.expired(now) and (current.sealed or not must_seal):
            return current
        if self._handshakes >= _MAX_HANDSHAKES:
            if current is not None and must_seal and not current.sealed:
                raise _clear_session(self._server_did)
            raise SessionUnknown("no usable session")
        self._handshakes += 1
        return HANDSHAKE

    def next(self, now: WallSeconds, mono: MonoSeconds) -> _Open | LearnCard | Send:
        """The next step at wall-clock ``now`` and monotonic ``mono`` (see the module doc)."""
        session = self.session_step(now)
        if session is HANDSHAKE:
            return HANDSHAKE
        assert isinstance(session, ClientSession)
        peer = self.peer
        if self._check is not None:
            self._check(session)
        intent = self.intent
        asked = self._asked is session
        if PRIORITY in intent and not peer.declares(PRIORITY):
            if not asked:
                return self._learn(session)
            raise undeclared(self._server_did, PRIORITY, card_checked=peer.card_known)
        need = intent_id_need(
            chosen=self.chosen,
            exactly_once=False if self.pinned is not None else self.options.exactly_once,
            paused=peer.ids_paused(mono),
        )
        chosen: str | None = None
        if need is not IdNeed.NONE:
            required = need is IdNeed.REQUIRED
            if not peer.declares(INTENT_ID) and required and not asked:
                return self._learn(session)  # a failed look-up is tried again when it matters
            if peer.declares(INTENT_ID):
                chosen = self.chosen = self.chosen or new_intent_id(self._random)
                intent = {**intent, INTENT_ID: chosen}
            elif required:
                raise undeclared(self._server_did, INTENT_ID, card_checked=peer.card_known)
        self.reference = None
        if self.chain is not None:
            if not peer.declares(DELEGATION):
                if not asked:
                    return self._learn(session)
                raise undeclared(self._server_did, DELEGATION, card_checked=peer.card_known)
            refused = self.chain.refusal(
                now=now,
                client_did=self.client_did,
                server_did=self._server_did,
                goal=str(intent.get("goal", "")),
                priority=intent.get(PRIORITY, 3),
            )
            if refused is not None:
                raise InvalidParams(f"not sent: {refused.message}")
            member = peer.delegation_member(self.chain)
            if isinstance(member, str):
                self.reference = member
            intent = {**intent, DELEGATION: member}
        self.attempt += 1
        return Send(session, intent, chosen)

    def _learn(self, session: ClientSession) -> LearnCard:
        self._asked = session
        return LearnCard(session)

    def learnt(self, extensions: frozenset[str] | None) -> None:
        """The verified card's extensions after :class:`LearnCard` (None: not had or not verified)."""
        if extensions is not None:
            self.peer.extensions = extensions
            self.peer.card_verified(extensions)

    # -- what an answer leads to -----------------------------------------------------------------
    def failed(self, exc: A2AError, *, yielded: bool = False, mono: MonoSeconds | None = None) -> Resend:
        """Why the call goes again after ``exc`` answered the last send; else ``exc`` is raised.

        ``yielded``: a stream already gave the caller an item (nothing is resent then, but
        the last answer is raised). ``mono``: the monotonic time of the answer.
        """
        peer = self.peer
        first = self.attempt == 1 and not yielded
        if first and self.chain is not None and chain_unknown(exc, self.reference):
            # The worker that answered has not seen the chain (another worker, a restart):
            # nothing ran and the sequence is used; the next send carries it in full.
            peer.chain_unknown(self.chain)
            return Resend.CHAIN_UNKNOWN
        pause = ids_full_pause(
            exc,
            exactly_once=self.options.exactly_once if self.pinned is None else False,
            own_id=self.own_id,
            attempt=self.attempt,
            yielded=yielded,
        )
        if pause is not None:
            # Nothing ran: once more without this client's own id (the rest of the intent as
            # it was, its chain above all), and no own ids for a while.
            peer.pause_ids(system.mono_now() if mono is None else mono, pause)
            self.chosen = None
            return Resend.IDS_FULL
        if isinstance(exc, SessionUnknown) and self.pinned is None:
            peer.session = None  # the server no longer holds it
            if resend_after_session_unknown(
                attempt=self.attempt,
                enabled=self.options.resend_on_unknown_session,
                streamed=self.streamed,
                yielded=yielded,
                intent_id=self.chosen,
            ):
                return Resend.SESSION_UNKNOWN
        raise exc
