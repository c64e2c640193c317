"""The client's decisions (a2a_secure/protocol/client_decisions.py), one test per rule.

In memory: no network, no event loop, a fake clock and a fixed random fraction. The same
rules run end to end through ``A2AClient`` in test_http_e2e.py, test_exactly_once_http.py,
test_streaming.py, test_sealed_http.py and test_delegation_http.py.
"""

from __future__ import annotations

import pytest

from a2a_secure.delegation import CHAIN_UNKNOWN, DELEGATION, issue
from a2a_secure.errors import A2AError, InvalidParams, PolicyViolation, Unavailable
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol import sealing
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.client_decisions import (
    IDS_FULL_PAUSE,
    IdNeed,
    PeerState,
    Retry,
    backoff,
    chain_unknown,
    gives_up,
    ids_full_pause,
    intent_id_need,
    parse_retry_after,
    reply_retry,
    resend_after_session_unknown,
    seal,
    send_close,
    stream_reply_retried,
    transport_failure_retried,
    undeclared,
)
from a2a_secure.protocol.intent_id import INTENT_ID, ids_full_message, store_full_message
from a2a_secure.protocol.priority import EXTENSION as PRIORITY
from a2a_secure.protocol.sealing import SEALED

NOW = 1_800_000_000.0
SERVER = "did:key:z6MkServer"
PERSON = Identity.from_seed(b"\x01" * 32, "person")
CLIENT = Identity.from_seed(b"\x02" * 32, "client")


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def signed(exc: A2AError) -> A2AError:
    """``exc`` as the session's check of a server-signed error leaves it."""
    exc.signed = True
    return exc


def session(clock: FakeClock, *, lifetime: int = 60, sealed: bool = False) -> ClientSession:
    """A session opened at the clock's time (sealed: with two made-up sealing keys)."""
    return ClientSession(
        identity=CLIENT,
        server_did=SERVER,
        server_kid=SERVER + "#key-1",
        server_key=b"\x00" * 32,
        session_id="s" * 22,
        session_commitment="c" * 43,
        policy=Policy(),
        created_at=int(clock.now),
        expires_at=int(clock.now) + lifetime,
        clock=clock,
        seal_keys=sealing.SessionKeys(b"\x01" * 32, b"\x02" * 32) if sealed else None,
    )


# -- retry -------------------------------------------------------------------------------------
def test_retry_after_is_read_only_from_ascii_delta_seconds() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("²") is None  # isdigit() but not a number float() takes
    assert parse_retry_after("1.5") is None
    assert parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None


def test_backoff_is_full_jitter_doubling_up_to_the_cap() -> None:
    assert backoff(1, None, base=0.1, cap=5.0, fraction=1.0) == pytest.approx(0.1)
    assert backoff(3, None, base=0.1, cap=5.0, fraction=1.0) == pytest.approx(0.4)
    assert backoff(3, None, base=0.1, cap=5.0, fraction=0.5) == pytest.approx(0.2)
    assert backoff(20, None, base=0.1, cap=5.0, fraction=1.0) == 5.0
    assert backoff(1, None, base=0.1, cap=5.0, fraction=0.0) == 0.0


def test_backoff_waits_at_least_retry_after() -> None:
    assert backoff(1, 3.0, base=0.1, cap=5.0, fraction=1.0) == 3.0
    assert backoff(10, 1.0, base=0.1, cap=5.0, fraction=1.0) == 5.0


def test_gives_up_when_attempts_are_spent() -> None:
    assert not gives_up(1, 3)
    assert not gives_up(2, 3)
    assert gives_up(3, 3)
    assert gives_up(1, 1)


def test_gives_up_on_a_retry_after_longer_than_max_wait() -> None:
    assert gives_up(1, 3, 31.0, 30.0)
    assert not gives_up(1, 3, 30.0, 30.0)
    assert not gives_up(1, 3, None, 30.0)


def test_only_an_error_reply_with_a_transient_status_is_retried() -> None:
    for status in (500, 502, 503, 504):
        assert (
            reply_retry(status, is_error=True, retry_after=None, max_wait=30, signed_request=False)
            is Retry.YES
        )
    for status in (200, 400, 401, 403, 404, 429):
        assert (
            reply_retry(status, is_error=True, retry_after=None, max_wait=30, signed_request=False)
            is Retry.NO
        )
    assert reply_retry(503, is_error=False, retry_after=None, max_wait=30, signed_request=False) is Retry.NO


def test_a_reply_whose_retry_after_exceeds_max_wait_is_not_retried() -> None:
    assert reply_retry(503, is_error=True, retry_after=31.0, max_wait=30, signed_request=True) is Retry.NO
    assert reply_retry(503, is_error=True, retry_after=30.0, max_wait=30, signed_request=True) is Retry.YES


def test_a_signed_request_answered_500_or_504_is_retried_only_unless_signed() -> None:
    for status in (500, 502, 504):
        got = reply_retry(status, is_error=True, retry_after=None, max_wait=30, signed_request=True)
        assert got is Retry.UNLESS_SIGNED
    # A 503 consumed nothing (rate limit, overload): retried even when signed.
    assert reply_retry(503, is_error=True, retry_after=None, max_wait=30, signed_request=True) is Retry.YES


def test_a_stream_answered_with_a_plain_error_resumes_unless_it_is_a_signed_final_answer() -> None:
    assert stream_reply_retried(503, signed=True)
    assert stream_reply_retried(500, signed=False)
    assert not stream_reply_retried(500, signed=True)
    assert not stream_reply_retried(504, signed=True)
    assert not stream_reply_retried(403, signed=False)


def test_a_transport_failure_is_retried_while_attempts_remain() -> None:
    assert transport_failure_retried(1, 3, certificate_refused=False)
    assert transport_failure_retried(2, 3, certificate_refused=False)
    assert not transport_failure_retried(3, 3, certificate_refused=False)


def test_a_refused_certificate_is_never_retried() -> None:
    assert not transport_failure_retried(1, 3, certificate_refused=True)


# -- re-handshake ---------------------------------------------------------------------------------
def test_session_unknown_leads_to_one_resend_on_a_new_session() -> None:
    assert resend_after_session_unknown(attempt=1, enabled=True)
    assert not resend_after_session_unknown(attempt=2, enabled=True)


def test_session_unknown_is_not_resent_when_the_caller_said_so() -> None:
    assert not resend_after_session_unknown(attempt=1, enabled=False)


def test_a_stream_is_resent_after_session_unknown_only_with_an_intent_id_and_before_its_first_item() -> None:
    iid = "A" * 22
    assert resend_after_session_unknown(attempt=1, enabled=True, streamed=True, intent_id=iid)
    assert not resend_after_session_unknown(attempt=1, enabled=True, streamed=True, intent_id=None)
    assert not resend_after_session_unknown(
        attempt=1, enabled=True, streamed=True, yielded=True, intent_id=iid
    )
    assert not resend_after_session_unknown(attempt=2, enabled=True, streamed=True, intent_id=iid)
    assert not resend_after_session_unknown(attempt=1, enabled=False, streamed=True, intent_id=iid)


# -- intent_id ---------------------------------------------------------------------------------
def test_an_id_given_or_already_used_is_required() -> None:
    for exactly_once in (None, True, False):
        assert intent_id_need(chosen="A" * 22, exactly_once=exactly_once, paused=True) is IdNeed.REQUIRED


def test_exactly_once_true_requires_an_id() -> None:
    assert intent_id_need(chosen=None, exactly_once=True, paused=True) is IdNeed.REQUIRED


def test_exactly_once_false_names_no_id() -> None:
    assert intent_id_need(chosen=None, exactly_once=False, paused=False) is IdNeed.NONE


def test_exactly_once_none_names_an_id_when_declared_unless_paused() -> None:
    assert intent_id_need(chosen=None, exactly_once=None, paused=False) is IdNeed.IF_DECLARED
    assert intent_id_need(chosen=None, exactly_once=None, paused=True) is IdNeed.NONE


@pytest.mark.parametrize("message", [ids_full_message(2), store_full_message(2)])
def test_ids_full_drops_an_own_id_for_the_refusals_retry_after(message: str) -> None:
    exc = signed(Unavailable(message, retry_after=7))
    assert ids_full_pause(exc, exactly_once=None, own_id=True, attempt=1) == 7.0


def test_ids_full_pause_is_one_second_to_a_minute() -> None:
    short = signed(Unavailable(ids_full_message(2), retry_after=0))
    long = signed(Unavailable(ids_full_message(2), retry_after=3600))
    assert ids_full_pause(short, exactly_once=None, own_id=True, attempt=1) == 1.0
    assert ids_full_pause(long, exactly_once=None, own_id=True, attempt=1) == IDS_FULL_PAUSE


def test_ids_full_stands_for_a_callers_id_exactly_once_a_second_attempt_or_a_started_stream() -> None:
    exc = signed(Unavailable(ids_full_message(2), retry_after=7))
    assert ids_full_pause(exc, exactly_once=True, own_id=True, attempt=1) is None
    assert ids_full_pause(exc, exactly_once=False, own_id=True, attempt=1) is None
    assert ids_full_pause(exc, exactly_once=None, own_id=False, attempt=1) is None
    assert ids_full_pause(exc, exactly_once=None, own_id=True, attempt=2) is None
    assert ids_full_pause(exc, exactly_once=None, own_id=True, attempt=1, yielded=True) is None


def test_an_unsigned_or_other_503_is_not_ids_full() -> None:
    unsigned = Unavailable(ids_full_message(2), retry_after=7)
    other = signed(Unavailable("rate limited", retry_after=7))
    assert ids_full_pause(unsigned, exactly_once=None, own_id=True, attempt=1) is None
    assert ids_full_pause(other, exactly_once=None, own_id=True, attempt=1) is None


def test_the_ids_full_pause_ends_on_the_monotonic_clock() -> None:
    clock = FakeClock(100.0)
    peer = PeerState()
    assert not peer.ids_paused(clock())
    peer.pause_ids(clock(), 7.0)
    clock.now = 106.9
    assert peer.ids_paused(clock())
    clock.now = 107.0
    assert not peer.ids_paused(clock())


# -- extensions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("extension", [INTENT_ID, PRIORITY, DELEGATION, SEALED])
def test_an_undeclared_member_is_refused_with_invalid_params_naming_the_server(extension: str) -> None:
    exc = undeclared(SERVER, extension)
    assert isinstance(exc, InvalidParams) and exc.code == -32602
    assert exc.message.startswith(f"{SERVER} does not declare the {extension} extension")


@pytest.mark.parametrize("extension", [INTENT_ID, PRIORITY, DELEGATION, SEALED])
def test_a_card_that_could_not_be_checked_is_a_503_to_try_again(extension: str) -> None:
    """The fault campaign cut a card fetch: exactly_once=True then read "does not declare
    the intent_id extension" (-32602), a final word about a server that does declare it."""
    exc = undeclared(SERVER, extension, card_checked=False)
    assert isinstance(exc, Unavailable) and exc.code == -32048 and exc.retry_after == 1
    assert f"could not be checked for the {extension} extension" in exc.message
    with pytest.raises(Unavailable):
        seal(SERVER, True, None)  # no verified card: unknown, not "does not declare"
    assert not seal(SERVER, None, None)  # None: not sealed, no error


def test_the_refusal_names_at_most_128_characters_of_the_did() -> None:
    did = "did:web:" + "a" * 500
    assert undeclared(did, PRIORITY).message.startswith(did[:128] + " does not")


def test_a_priority_asks_for_the_card_until_it_declares_it() -> None:
    peer = PeerState()
    assert not peer.needs_priority_check({"goal": "g"})
    assert peer.needs_priority_check({"goal": "g", PRIORITY: 1})
    peer.extensions = frozenset({PRIORITY})
    assert not peer.needs_priority_check({"goal": "g", PRIORITY: 1})
    assert peer.declares(PRIORITY) and not peer.declares(INTENT_ID)


def test_a_new_session_forgets_the_card_and_the_chains_sent() -> None:
    peer = PeerState()
    peer.extensions = frozenset({INTENT_ID})
    peer.chains_sent.add("h")
    peer.pause_ids(0.0, 30.0)
    peer.new_session()
    assert peer.extensions == frozenset() and peer.chains_sent == set()
    assert peer.ids_paused(1.0)  # the pause is the DID's at that server, not the session's


# -- sealing -------------------------------------------------------------------------------------
def test_sealed_none_seals_when_the_card_declares_it() -> None:
    assert seal(SERVER, None, frozenset({SEALED}))
    assert not seal(SERVER, None, frozenset({INTENT_ID}))


def test_sealed_true_refuses_a_server_that_does_not_declare_it() -> None:
    assert seal(SERVER, True, frozenset({SEALED}))
    with pytest.raises(InvalidParams, match="does not declare the sealed extension"):
        seal(SERVER, True, frozenset())


def test_sealed_false_never_seals() -> None:
    assert not seal(SERVER, False, frozenset({SEALED}))


# -- delegation ----------------------------------------------------------------------------------
def test_a_chain_goes_in_full_the_first_time_on_a_session_then_by_its_hash() -> None:
    chain = issue(PERSON, to=CLIENT.did, goals=["*"], ttl=600, now=NOW)
    peer = PeerState()
    assert peer.delegation_member(chain) == chain.tokens
    assert peer.delegation_member(chain) == chain.hash
    peer.new_session()
    assert peer.delegation_member(chain) == chain.tokens


def test_chain_unknown_sends_the_chain_in_full_again() -> None:
    chain = issue(PERSON, to=CLIENT.did, goals=["*"], ttl=600, now=NOW)
    peer = PeerState()
    peer.delegation_member(chain)
    peer.chain_unknown(chain)
    assert peer.delegation_member(chain) == chain.tokens


def test_chain_unknown_is_only_the_servers_signed_refusal() -> None:
    message = f"delegation chain {'h' * 43} {CHAIN_UNKNOWN}"
    assert chain_unknown(signed(PolicyViolation(message)))
    assert not chain_unknown(PolicyViolation(message))  # unsigned: anyone on the path
    assert not chain_unknown(signed(PolicyViolation("goal not delegated")))


# -- closed sessions -----------------------------------------------------------------------------
def test_a_close_is_sent_only_for_an_open_unexpired_session() -> None:
    clock = FakeClock(NOW)
    open_session = session(clock, lifetime=60)
    assert not send_close(None)
    assert send_close(open_session)
    clock.now = NOW + 60
    assert not send_close(open_session)
    assert send_close(open_session, NOW + 59)


def test_a_closed_session_is_not_closed_again() -> None:
    closed = session(FakeClock(NOW))
    closed.closed = True
    assert not send_close(closed)
