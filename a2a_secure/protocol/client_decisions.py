"""The client's decisions around the wire, sans-I/O: what to retry, resend, name and declare.

The HTTP adapter (:mod:`a2a_secure.client.http`) sends, waits and applies what these
return; the rules themselves live here, as pure functions and one small state object per
server (:class:`PeerState`), in the manner of h11's state machine beside its I/O. Each takes
values (an error, an attempt number, the extensions the authenticated card declares, a
clock reading, a random fraction) and returns a verdict, so every rule runs in memory with
an injected clock (tests/test_client_decisions.py).

* retry: which replies and transport failures are tried again with the byte-identical
  request, and for how long to wait (``Retry-After`` is unauthenticated: bounded);
* re-handshake: when -32043 leads to a new session and one resend, and when not;
* ``intent_id`` (§12.5): when the client names one, and the "ids full" fallback;
* extensions (§12): a member the authenticated card does not declare is refused before
  anything is signed;
* sealing (§12.6): ``sealed=None/True/False`` against the card;
* delegation (§12.7): the chain in full the first time on a session, its hash later, in
  full again after "chain unknown";
* closed sessions: when a close is worth sending.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

from a2a_secure.delegation import CHAIN_UNKNOWN, DELEGATION, Chain
from a2a_secure.errors import A2AError, InvalidParams, PolicyViolation, Unavailable
from a2a_secure.protocol.client_session import ClientSession
from a2a_secure.protocol.intent_id import INTENT_ID, is_ids_full
from a2a_secure.protocol.priority import EXTENSION as PRIORITY
from a2a_secure.protocol.sealing import SEALED
from a2a_secure.system import MonoSeconds

__all__ = [
    "CARD_FAILURE_PAUSE",
    "IDS_FULL_PAUSE",
    "RETRYABLE_STATUSES",
    "IdNeed",
    "PeerState",
    "Retry",
    "backoff",
    "chain_unknown",
    "gives_up",
    "ids_full_pause",
    "intent_id_need",
    "parse_retry_after",
    "reply_retry",
    "resend_after_session_unknown",
    "seal",
    "send_close",
    "stream_reply_retried",
    "transport_failure_retried",
    "undeclared",
]

# Statuses of a reply that may be transient: the server, or a proxy before it, failed.
RETRYABLE_STATUSES: Final = frozenset({500, 502, 503, 504})
# Seconds: the longest a client goes without its own intent_ids after a full DID's refusal.
IDS_FULL_PAUSE: Final = 60.0
# Seconds: how long one server's failed card look-up is remembered before it is tried again.
CARD_FAILURE_PAUSE: Final = 300.0


# -- retry -------------------------------------------------------------------------------------
def parse_retry_after(header: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header in delta-seconds form, else None."""
    # ASCII digits only: str.isdigit() is also true for "²" (a latin-1 header byte), which
    # float() refuses; an attacker on the path must not turn that into a raw ValueError.
    return float(header) if header is not None and header.isascii() and header.isdigit() else None


def backoff(attempt: int, retry_after: float | None, *, base: float, cap: float, fraction: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): full jitter, at least ``retry_after``.

    ``fraction`` is a random draw in [0, 1] (the caller's source): the wait is that share of
    ``min(cap, base * 2 ** (attempt - 1))``.
    """
    jitter = fraction * min(cap, base * 2.0 ** (attempt - 1))
    return max(retry_after, jitter) if retry_after is not None else jitter


def gives_up(attempt: int, attempts: int, retry_after: float | None = None, max_wait: float = 0.0) -> bool:
    """Whether attempt number ``attempt`` was the last: ``attempts`` spent, or a ``Retry-After``
    longer than ``max_wait`` (unauthenticated: a forged one must not park the client)."""
    return attempt >= attempts or (retry_after is not None and retry_after > max_wait)


class Retry(enum.Enum):
    """What to do with a reply: keep it, send the request again, or send again unless signed."""

    NO = "no"
    YES = "yes"
    # A signed 500/504 is the stored, final answer for this sequence; an unsigned one is a
    # proxy's or a crash's. Telling them apart needs the session's check of the signature.
    UNLESS_SIGNED = "unless_signed"


def reply_retry(
    status: int, *, is_error: bool, retry_after: float | None, max_wait: float, signed_request: bool
) -> Retry:
    """Whether a JSON-RPC reply with HTTP ``status`` is tried again (attempts aside, see :func:`gives_up`).

    A 503 is always transient (rate limit, overload: nothing consumed). A 500/502/504 to a
    signed request may be the server's stored answer, retried only when unsigned.
    """
    if status not in RETRYABLE_STATUSES or not is_error:
        return Retry.NO
    if retry_after is not None and retry_after > max_wait:
        return Retry.NO
    if status != 503 and signed_request:
        return Retry.UNLESS_SIGNED
    return Retry.YES


def stream_reply_retried(status: int, *, signed: bool) -> bool:
    """Whether a streamed request answered with a plain error is resumed (same rule as a reply)."""
    return status in RETRYABLE_STATUSES and not (signed and status != 503)


def transport_failure_retried(attempt: int, attempts: int, *, certificate_refused: bool) -> bool:
    """Whether a request that got no reply is sent again: not when the certificate did not
    verify (it will not verify on a retry either), else while attempts remain."""
    return not certificate_refused and attempt < attempts


# -- re-handshake --------------------------------------------------------------------------------
def resend_after_session_unknown(
    *,
    attempt: int,
    enabled: bool,
    streamed: bool = False,
    yielded: bool = False,
    intent_id: str | None = None,
) -> bool:
    """Whether -32043 on attempt ``attempt`` leads to a new session and one resend.

    Once only, and only when the caller allows it (``resend_on_unknown_session``). A stream
    is resent only before its first item and only with an ``intent_id``: the server then
    replays the one run's events instead of running it again.
    """
    if attempt != 1 or not enabled:
        return False
    return not streamed or (intent_id is not None and not yielded)


# -- intent_id ---------------------------------------------------------------------------------
class IdNeed(enum.Enum):
    """Whether an intent carries an ``intent_id`` (§12.5)."""

    NONE = "none"  # sent without one; the card is not consulted
    IF_DECLARED = "if_declared"  # one the client picks, when the server declares the extension
    REQUIRED = "required"  # refused (-32602) rather than sent without one


def intent_id_need(*, chosen: str | None, exactly_once: bool | None, paused: bool) -> IdNeed:
    """The need for an ``intent_id``: ``chosen`` is the id already given or used (kept across
    retries and re-handshakes), ``paused`` whether the server lately refused new ids."""
    if chosen is not None or exactly_once is True:
        return IdNeed.REQUIRED
    if exactly_once is False or paused:
        return IdNeed.NONE
    return IdNeed.IF_DECLARED


def ids_full_pause(
    exc: A2AError, *, exactly_once: bool | None, own_id: bool, attempt: int, yielded: bool = False
) -> float | None:
    """Seconds to go without this client's own intent_ids, if ``exc`` refused one (else None).

    With ``exactly_once=None`` the id is this client's own addition: the server refused it
    before anything was consumed or run, so the intent goes again without one, and so do the
    next ones for a while (the refusal's Retry-After, 1 s to a minute), rather than failing
    an intent the base protocol would carry. With ``exactly_once=True``, or an id the caller
    gave, the refusal stands.
    """
    if not own_id or attempt != 1 or yielded or exactly_once is not None or not is_ids_full(exc):
        return None
    return min(max(float(getattr(exc, "retry_after", 1) or 1), 1.0), IDS_FULL_PAUSE)


# -- extensions ----------------------------------------------------------------------------------
_UNDECLARED: Final[Mapping[str, str]] = {
    INTENT_ID: "does not declare the intent_id extension: the intent cannot be sent exactly once",
    PRIORITY: "does not declare the priority extension: send the intent without a priority",
    DELEGATION: "does not declare the delegation extension",
    SEALED: "does not declare the sealed extension in its authenticated agent card: "
    "refusing to send intents in the clear",
}


def undeclared(server_did: str, extension: str, *, card_checked: bool = True) -> A2AError:
    """The refusal (-32602) of a member ``server_did``'s authenticated card does not declare.

    A server that implements only the base contract would refuse the unknown member only
    after the request is signed and sent; the card says so before anything leaves.
    ``card_checked=False``: no card that hashes to the signed manifest could be had (the
    fetch failed, or another card came): nothing is known, so the refusal is 503 -32048 with
    ``Retry-After`` (try again), not a -32602 that reads as the server's final word. Either
    way nothing is sent.
    """
    if not card_checked:
        return Unavailable(
            f"{server_did[:128]}: its agent card could not be checked for the {extension} extension",
            retry_after=1,
        )
    return InvalidParams(f"{server_did[:128]} {_UNDECLARED[extension]}")


def seal(
    server_did: str, sealed: bool | None, declared: frozenset[str] | None, *, seen: bool = False
) -> bool:
    """Whether the session is sealed (§12.6), given the extensions its CHALLENGE's card declares.

    ``declared`` is None when that card could not be had or did not hash to the signed
    manifest hash (blocked or altered on the way: how an attacker would downgrade). Then,
    with ``sealed=True``, or after a verified card of this server declared ``sealed``
    (``seen``), the handshake ends before any session exists: a blocked or altered card
    cannot downgrade. ``None`` seals when declared; ``False`` never (the card is then not
    fetched).
    """
    if sealed is False:
        return False
    if declared is None:
        if sealed is True or seen:
            raise undeclared(server_did, SEALED, card_checked=False)
        return False
    if SEALED not in declared and sealed is True:
        raise undeclared(server_did, SEALED)
    return SEALED in declared


# -- delegation ----------------------------------------------------------------------------------
def chain_unknown(exc: A2AError, reference: str | None = None) -> bool:
    """Whether ``exc`` is the server's signed "send the chain in full" (§12.7); nothing ran.

    Its ``data.chain_unknown`` names the reference the client sent (``reference``, the
    chain's ``sha256:`` name, when known); an older server says so only at the end of its
    message. Unsigned, it may come from anyone on the path, and is not followed.
    """
    if getattr(exc, "signed", False) is not True or exc.code != PolicyViolation.code:
        return False
    named = exc.data.get("chain_unknown") if isinstance(exc.data, dict) else None
    if isinstance(named, str):
        return reference is None or named == reference
    return exc.message.endswith(CHAIN_UNKNOWN)


# -- one server ------------------------------------------------------------------------------------
class PeerState:
    """What the client keeps about one server: its open session, the extensions its card
    declares, the delegation chains sent on the session, whether a verified card of it ever
    declared ``sealed``, its failed card look-ups and a pause on new intent_ids. Monotonic
    times (``mono``) are on a clock the caller reads, never compared with wall-clock ones."""

    def __init__(self) -> None:
        # The open session (None: none yet, or dropped after -32043).
        self.session: ClientSession | None = None
        # The extensions the server of the current session declares in its authenticated card.
        self.extensions: frozenset[str] = frozenset()
        # Until then (monotonic), intents this client names no id for go without one: the
        # server refused a new id because this DID holds as many as it keeps (§12.5).
        self.ids_full_until = MonoSeconds(0.0)
        # The delegation chains (by hash) sent in full on the current session.
        self.chains_sent: set[str] = set()
        # A card of this server, verified (its hash signed in a CHALLENGE, or its A2A card
        # signature checked), declared ``sealed``: every session used from then on is sealed.
        # Cleared only by a verified card that no longer declares it (the server changed).
        self.sealed_seen = False
        # manifest hash -> monotonic time until which a failed card look-up is not retried.
        # Per server, never process-wide: one blocked fetch must not decide for other peers.
        self.card_failures: dict[str, MonoSeconds] = {}
        # Whether a verified card was had for the current session (else its extensions are
        # unknown, not absent: a refusal for want of one is 503, see undeclared()).
        self.card_known = False

    def card_verified(self, extensions: frozenset[str]) -> None:
        """A verified card of this server declares ``extensions``."""
        self.sealed_seen = SEALED in extensions
        self.card_known = True

    def card_failed(self, manifest_hash: str, mono: MonoSeconds, pause: float = CARD_FAILURE_PAUSE) -> None:
        """The card for ``manifest_hash`` could not be had (or did not verify) at ``mono``."""
        if len(self.card_failures) >= 16:
            self.card_failures.clear()
        self.card_failures[manifest_hash] = MonoSeconds(mono + pause)

    def card_failure_fresh(self, manifest_hash: str, mono: MonoSeconds) -> bool:
        """Whether a look-up of ``manifest_hash``'s card failed lately (not retried yet)."""
        return mono < self.card_failures.get(manifest_hash, MonoSeconds(0.0))

    def new_session(self) -> None:
        """A new session: nothing is known of its card, and no chain was sent on it."""
        self.extensions = frozenset()
        self.card_known = False
        self.chains_sent.clear()

    def declares(self, extension: str) -> bool:
        """Whether the server's card, as last learnt, declares ``extension``."""
        return extension in self.extensions

    def ids_paused(self, now: MonoSeconds) -> bool:
        """Whether intents this client names no id for go without one at monotonic ``now``."""
        return now < self.ids_full_until

    def pause_ids(self, now: MonoSeconds, pause: float) -> None:
        """No own intent_ids for ``pause`` seconds from monotonic ``now`` (:func:`ids_full_pause`)."""
        self.ids_full_until = MonoSeconds(now + pause)

    def needs_priority_check(self, intent: Mapping[str, Any]) -> bool:
        """Whether ``intent`` asks for a priority (§12.3) the card is not yet known to declare."""
        return PRIORITY in intent and PRIORITY not in self.extensions

    def delegation_member(self, chain: Chain) -> str | list[str]:
        """The ``delegation`` member for ``chain``: its tokens the first time on this session,
        its hash after that (the server keeps the chain for the session)."""
        if chain.hash in self.chains_sent:
            return chain.hash
        self.chains_sent.add(chain.hash)
        return chain.tokens

    def chain_unknown(self, chain: Chain) -> None:
        """The server's worker has not seen ``chain``: the next intent sends it in full."""
        self.chains_sent.discard(chain.hash)


# -- closed sessions -----------------------------------------------------------------------------
def send_close(session: ClientSession | None, now: float | None = None) -> bool:
    """Whether closing ``session`` needs a signed close: not when none is open or it expired
    at ``now`` (the session's clock when None): the server no longer holds it, the client
    just forgets it."""
    return session is not None and not session.expired(now)
