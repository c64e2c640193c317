"""PROTOCOL.md, section by section, over the wire (real uvicorn, raw httpx).

Each test sends raw bytes with httpx to the §11 test agent (``register_test_agent`` on an
``AgentServer`` with a fake clock, or ``a2a_secure.server.run.build_server``) under real uvicorn
and checks the exact status, code, id, members and signatures an independent implementation
would see. Streamed answers (§6.4) are in tests/test_streaming.py.

Rules of PROTOCOL.md and the tests covering them. C = this file, S = test_streaming.py,
E = test_http_errors.py, PH = test_protocol_handshake.py, PI = test_protocol_intents.py,
E2E = test_http_e2e.py; other files by name.

§1   base64url strict (padding, alphabet, length ≡ 1 mod 4, trailing bits)
       → test_encoding; E test_invalid_intent_params_are_400_and_unsigned (padded-session-id); C
         test_s3_malformed_token_is_32602_unsigned
     nonce 32 bytes / 43 characters; hash strings
       → C test_s1_nonce_and_hash_strings_on_the_wire; PH test_hello_bad_nonce
     equality of JSON values = JCS (1 == 1.0, true != 1)
       → C test_s1_equality_is_jcs_1_equals_1_0_but_not_true
     integers 0 … 2^53−1; 2^53 in a body is not I-JSON (-32700)
       → C test_s1_s9_largest_integer_passes_and_2_53_is_a_parse_error; E
         test_parse_error_is_400_32700_with_null_id, test_parse_limits_are_exact
     freshness abs(now − timestamp) <= 300
       → PH test_hello_stale_or_future_timestamp, test_hello_timestamp_at_the_boundary_passes; PI
         test_intent_stale_or_future_timestamp; E test_stale_*
     I-JSON bodies (BOM, duplicates, NaN, lone surrogates, depth 32)
       → E test_parse_error_is_400_32700_with_null_id, test_parse_limits_are_exact
     I-JSON JWS headers and payloads (-32602)
       → C test_s3_malformed_token_is_32602_unsigned

§2   did:key Ed25519 only, ASCII, <= 2048 characters; did:web bounds
       → test_keys; test_didweb; C test_s9_did_errors_32602_vs_32047
     public_keys 1–8 entries, kid of the sender's DID, key = the resolved one (-32040)
       → PH test_hello_public_keys_*; C test_s5_1_hello_check_order (key-binding rows)

§3   protected header exactly alg/typ/kid; typ per step; kid = the resolved key id (-32040)
       → C test_s3_header_signature_and_typ_failures_are_32040_unsigned; PI
         test_header_with_extra_member_is_refused; test_jws
     signature of 64 bytes over the received bytes
       → C test_s3_header_signature_and_typ_failures_are_32040_unsigned; test_jws
     payload members exact: missing or extra is -32040
       → C test_s5_3_proof_check_order, test_s6_1_signed_members_of_the_wrong_type_are_32040
     not three canonical segments whose first two are JSON objects: -32602
       → C test_s3_malformed_token_is_32602_unsigned

§4   methods per endpoint, unknown method: -32601
       → E test_method_unknown_or_on_wrong_endpoint_is_404
     id: a string of <= 128 code points or an integer; null when it cannot be read
       → C test_s4_id_length_counts_code_points, test_s4_unreadable_id_is_answered_with_null; E
         test_invalid_request_is_400_32600, test_ids_are_echoed_exactly
     batches and notifications: -32600
       → E test_invalid_request_is_400_32600
     handshake params carry type = the method name, else -32602
       → C test_s4_handshake_params_type_must_equal_the_method; E test_invalid_hello_params_are_400,
         test_invalid_proof_params_are_400
     intent and close params carry no type; unknown params members: -32602
       → C test_s4_intent_and_close_params_carry_no_type; E test_invalid_intent_params_are_400_and_unsigned
     responses: same id; error is {code, message[, data]}; the HTTP status of §7
       → every test here and in S (conformance_helpers.error_of)
     Content-Type application/json, bare or with charset=utf-8, else 415 -32600
       → C test_s4_content_type_with_charset_accepted_on_both_endpoints; E
         test_wrong_or_missing_content_type_is_415, test_json_content_type_variants_are_accepted
     body limit 1 MiB enforced while reading (413 -32600)
       → E test_body_over_1_mib_is_413, test_chunked_body_over_limit_without_content_length_is_413,
         test_body_of_exactly_1_mib_is_read
     clients: a 30 s timeout at most; plain http only to loopback
       → C test_s4_client_timeout_is_at_most_30_s; E2E test_plain_http_to_a_remote_host_is_refused
     card members, protocol, endpoints, intents, public_keys; manifest_hash = hash_of(card)
       → C test_s4_s11_card_members_and_manifest_hash_of_the_test_agent; E2E
         test_agent_card_health_and_did_document
     a client's manifest_hash without a card
       → C test_s4_client_manifest_hash_without_a_card

§5   pending handshakes and sessions bounded: 503 -32048 + Retry-After, nothing valid evicted
       → E test_pending_handshakes_full_is_503_with_retry_after,
         test_sessions_full_is_503_and_keeps_the_pending_handshake; PH test_hello_capacity_*
     a pending handshake lives 60 s from its CHALLENGE, for PROOF and ACCEPT_POLICY
       → C test_s5_pending_handshake_lives_60_s_from_its_challenge; E test_expired_pending_handshake_is_401
     a failed PROOF or ACCEPT_POLICY leaves the pending handshake unchanged
       → C test_s5_3_proof_check_order; E test_handshake_authentication_failures_are_401
     cheap checks before signature checks, both before any did:web fetch
       → C test_s5_cheap_checks_come_before_any_did_web_fetch

§5.1 HELLO checks in order: strings, version, other shapes, freshness, DID syntax, resolution, key binding,
     capacity
       → C test_s5_1_hello_check_order, test_s5_1_key_binding_comes_before_capacity; PH
         test_hello_version_is_checked_before_other_shapes, test_hello_freshness_comes_before_did_syntax
     agent_id 1–128 code points
       → C test_s5_1_agent_id_length_counts_code_points; PH test_hello_agent_id_*
     -32046 with data.supported = ["1.0"]
       → C test_s5_1_hello_check_order; E test_unsupported_version_is_400_with_supported
     a replayed HELLO opens a new pending handshake
       → C test_s5_1_replayed_hello_opens_a_new_pending_handshake; PH
         test_replayed_hello_opens_a_new_pending_that_cannot_complete

§5.2 CHALLENGE members; policy_signature typ and payload exactly
       → C test_s5_2_challenge_and_policy_signature_members; PH test_client_rejects_tampered_challenge

§5.3 PROOF checks in order: -32041, -32040 (JWS), -32040 (payload), -32045
       → C test_s5_3_proof_check_order; PH test_proof_*

§5.4 POLICY members, the policy's five members, policy_hash, the CHALLENGE's signature
       → C test_s5_2_challenge_and_policy_signature_members; PH test_client_rejects_policy_*
     a session keeps the policy it agreed to
       → C test_s5_4_a_session_keeps_the_policy_it_agreed_to; PI test_session_keeps_its_policy

§5.5 ACCEPT_POLICY checks in order: -32041, -32040, -32040, -32045, -32048
       → C test_s5_5_accept_check_order; PH test_accept_*

§5.6 SESSION members, commitment, expires_at, session_jws payload; the pending handshake is consumed
       → C test_s5_2_challenge_and_policy_signature_members; E
         test_unknown_unproven_or_used_handshake_is_401
     expired when now >= expires_at
       → E test_expired_session_is_401; PI test_session_expires_at_expires_at

§6.1 intent members: goal 1–128 code points, inputs, domain, constraints (timeout_ms, max_tokens, stream),
     else -32602
       → C test_s6_1_intent_member_shapes, test_s9_lengths_count_code_points_for_goals
     steps 1–10 in order, the first failure answering
       → C test_s6_1_check_order
     step 5: payload exact and equal to params, signed error with the params' sequence
       → C test_s6_1_signed_members_of_the_wrong_type_are_32040; E
         test_params_differing_from_signed_payload_is_signed_401
     step 7: byte-identical retry gets the stored answer under its own id; anything else -32044
       → C test_s6_1_check_order; E test_out_of_order_and_replayed_sequence_is_signed_409,
         test_handler_timeout_is_signed_504_and_stored; E2E
         test_byte_identical_request_twice_runs_the_handler_once
     step 7: a retry while the original runs waits for it or gets 503
       → PI test_retry_while_the_original_still_runs, test_retry_while_running_gives_up_after_the_wait; E2E
         test_client_timeout_retry_waits_for_the_running_handler
     step 8: per DID across sessions; 503 + Retry-After + data.retry_after; not consumed; the very same
     request succeeds after Retry-After
       → E test_rate_limited_is_signed_503_with_retry_after_and_not_consumed; C
         test_s6_1_rate_limit_is_per_did_across_sessions
     step 8: ... while its timestamp is still fresh
       → C test_s6_1_rate_limited_request_may_be_resent_only_while_fresh
     steps 9–11 consume the sequence and store their answer
       → C test_s6_1_check_order; E test_handler_timeout_is_signed_504_and_stored,
         test_handler_exception_is_signed_generic_500
     step 11: -32049 timeout, -32602 rejected inputs, -32603 generic
       → E test_handler_timeout_is_signed_504_and_stored, test_handler_rejecting_inputs_is_signed_400,
         test_handler_exception_is_signed_generic_500

§6.2 result and response_jws payload exactly; request_hash; signed errors from steps 5–11
       → C test_s6_2_result_and_signed_error_members; E test_signed_errors_carry_the_request_sequence
     the client verifies every response_jws; an unsigned error is unauthenticated
       → PI test_mitm_edits_of_a_signed_error, test_edited_result_fails_verification; S
         test_client_treats_an_unsigned_error_instead_of_a_stream_as_unauthenticated

§6.3 close params and payload exactly, typ a2a-close+jws
       → C test_s6_3_close_payload_and_token_rules, test_s4_intent_and_close_params_carry_no_type
     close result and its payload
       → C test_s6_3_close_result_members_and_payload
     close shares the sequence counter (old sequence -32044)
       → C test_s6_3_close_payload_and_token_rules; PI test_close_with_an_old_sequence
     close is not rate limited and consumes a new sequence
       → C test_s6_3_close_is_not_rate_limited_and_consumes_a_new_sequence
     after close the session is unknown, a retried close included
       → C test_s6_3_close_result_members_and_payload; E test_unknown_and_closed_session_is_401

§6.4 200 text/event-stream only after the first event; failures up to it are signed JSON errors
       → S test_streamed_count_framing_members_and_signatures,
         test_count_bad_inputs_are_a_signed_json_error_not_a_stream,
         test_timeout_before_the_first_event_is_a_signed_json_32049,
         test_handler_rejecting_inputs_at_the_first_event_is_a_signed_json_32602,
         test_session_closed_before_the_first_event_is_a_signed_json_32043
     framing, JSON-RPC id, event and payload members, index 0, 1, 2 …, the final rule
       → S test_streamed_count_framing_members_and_signatures,
         test_a_stream_without_partials_is_one_final_event
     a non-streaming goal with stream: true is one final event
       → S test_non_streaming_goal_with_stream_true_is_exactly_one_final_event
     a streaming goal without stream: true is one result, the array
       → S test_streaming_goal_without_stream_true_is_one_result_array
     keep-alive comments (at least every 15 s), ignored by clients
       → S test_keepalive_comments_between_events
     error events are final: -32049 between events, -32043 close or expiry
       → S test_timeout_between_events_ends_the_stream_with_a_final_32049_event,
         test_session_closed_on_another_connection_ends_the_stream_with_32043,
         test_session_expiring_mid_stream_ends_the_stream_with_32043
     server shutdown: a final -32603
       → S test_server_shutdown_ends_a_live_stream_with_a_final_32603_event
     an event is at most 1 MiB
       → S test_no_event_is_larger_than_1_mib
     the client checks every event (index, final rule, nothing after it), retries a truncated stream, skips
     replayed events
       → S test_client_refuses_every_rewritten_stream,
         test_client_refuses_an_event_spliced_from_another_stream,
         test_client_retries_a_truncated_stream_byte_identically_then_raises,
         test_client_resumes_a_stream_cut_by_the_network,
         test_client_refuses_a_duplicate_after_the_replay_of_a_resumed_stream,
         test_client_receives_results_with_unicode_line_separators
     the 30 s client bound applies to each gap, not the whole stream; Last-Event-ID not used
       → S test_client_timeout_bounds_each_gap_not_the_whole_stream,
         test_client_resumes_a_stream_cut_by_the_network
     the stored answer is the stream: retries before, during and after it
       → S test_retry_during_and_after_a_live_stream_replays_the_same_bytes,
         test_retry_after_a_stored_stream_does_not_run_the_handler_again,
         test_retry_before_the_first_event_waits_for_it,
         test_retry_before_a_first_event_that_fails_gets_the_stored_json_error
     replay bound: 256 events and 1 MiB of results, then a newly signed final -32048
       → S test_replay_keeps_256_events_then_a_newly_signed_final_32048,
         test_replay_stops_keeping_at_the_first_event_past_1_mib,
         test_client_resume_past_the_replay_bound_ends_with_the_signed_32048
     the handler runs to its end whether or not a client listens
       → S test_handler_runs_to_its_end_when_the_client_goes_away
     streams bounded per DID and in total: 503 -32048 + Retry-After, not consumed
       → S test_stream_capacity_per_did_is_503_and_does_not_consume_the_sequence,
         test_stream_capacity_in_total_is_503, test_retry_of_a_live_stream_at_the_stream_limit_is_replayed
     a stream counts once against the rate limit
       → S test_a_stream_counts_once_against_the_rate_limit
     one audit record per stream at its final event; a replay is a record of its own
       → S test_retry_during_and_after_a_live_stream_replays_the_same_bytes,
         test_timeout_between_events_ends_the_stream_with_a_final_32049_event,
         test_count_bad_inputs_are_a_signed_json_error_not_a_stream
     ... with that event's status and code, for a replay too
       → S test_replay_record_carries_the_status_of_its_final_event (XFAIL)
     A2A goals always streamed, stream: false -32602
       → test_a2a_binding (§10, maintained elsewhere)

§7   every code with its HTTP status
       → E (one test per row of the §7 table)

§8   record members exactly; event = method once recognised, else reject; verified only after a verified
     signature; no inputs recorded
       → C test_s8_record_members_events_and_verified_flags, test_s8_client_records; test_audit
         test_record_has_only_the_section_8_members
     strings from unauthenticated input cut to 256
       → C test_s8_unauthenticated_strings_are_cut_to_256; test_audit
         test_unverified_strings_are_cut_and_marked
     JSON Lines chain, prev_hash, checkpoints, restart
       → test_audit

§9   DID errors: -32602 (not did:<method>:<id>) vs -32047 (unusable)
       → C test_s9_did_errors_32602_vs_32047; E test_unresolvable_did_is_401_32047; PH
         test_hello_did_syntax, test_hello_did_not_resolvable
     a signed member of the wrong type -32040; a duplicate payload member -32602
       → C test_s6_1_signed_members_of_the_wrong_type_are_32040, test_s5_3_proof_check_order,
         test_s3_malformed_token_is_32602_unsigned
     2^53 in a body -32700; depth counts containers from 1; lengths in code points
       → C test_s1_s9_largest_integer_passes_and_2_53_is_a_parse_error,
         test_s9_depth_counts_containers_with_the_outermost_as_1, test_s4_id_length_counts_code_points,
         test_s5_1_agent_id_length_counts_code_points, test_s9_lengths_count_code_points_for_goals
     Content-Type checked before the body is read
       → C test_s9_content_type_is_checked_before_the_body_is_read
     extra envelope members -32600; unknown constraints -32602
       → E test_invalid_request_is_400_32600 (extra-member); C test_s6_1_intent_member_shapes
     a step-5 failure signs the params' sequence
       → E test_params_differing_from_signed_payload_is_signed_401; C
         test_s6_1_signed_members_of_the_wrong_type_are_32040
     default bounds 256 / 10 000; at least 50 HELLO/s per source
       → C test_s9_default_bounds, test_s5_hello_rate_allows_at_least_50_per_second_per_source

§10  A2A binding
       → test_a2a_binding (maintained elsewhere; not covered here)

§11  the test agent: exactly echo and count, under the policy it is given
       → C test_s4_s11_card_members_and_manifest_hash_of_the_test_agent,
         test_s11_echo_returns_the_inputs_unchanged; test_multiworker test_app_from_env_serves; S
         test_count_bounds_are_accepted, test_count_bad_inputs_are_a_signed_json_error_not_a_stream

Rules once found not implemented, since fixed: a server shutdown now ends a live stream with a
final -32603 event (the adapter stops the handler when uvicorn gives up waiting, and sends the
event its pump signs); an event bigger than 1 MiB ends the stream with a final -32603 event;
a replayed stream is one audit record written at its final event with that event's status.

Fixed while writing these tests: §5.1 order (type == "hello" was checked before the version);
a byte-identical retry of a live stream refused for stream capacity; a retry before the first
event of a stream whose first event then failed, left waiting forever on keep-alives; the client
splitting event lines at U+2028 and the other str.splitlines separators; the client accepting a
duplicated event right after the replayed part of a resumed stream.

Left as it is (no test asserts either way): a HELLO whose agent_did is longer than 2048
characters is refused at the "other shapes" step (-32602) even when its timestamp is stale; if
that bound counts as "DID syntax" (§2), -32045 would come first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import base58
import httpx
import pytest
import pytest_asyncio

from a2a_secure.audit import Auditor, MemoryAuditSink
from a2a_secure.client.http import A2AClient
from a2a_secure.errors import InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_verify
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID, resolve_did_key
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientHandshake, PreparedRequest
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.run import build_server
from a2a_secure.testing import FakeClock, serve_app
from tests.conformance_helpers import (
    JSON,
    Shared,
    Stack,
    envelope,
    error_of,
    identity,
    open_stack,
    serve_shared,
    serve_stack,
)
from tests.http_helpers import AuditLog
from tests.protocol_helpers import DROP, forge_request, sign_raw

MAX_INT = 2**53 - 1
SECRET = "SECRET-inputs-never-audited"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[Shared]:
    async with serve_shared() as sh:
        yield sh


@pytest_asyncio.fixture(loop_scope="module")
async def stack(shared: Shared) -> Stack:
    return await open_stack(shared)


def signed(stack: Stack, req: PreparedRequest, error: dict[str, Any], sequence: int | None = None) -> bool:
    """Whether ``error`` carries a valid response_jws over ``req`` (for ``sequence``, if given)."""
    if sequence is not None:
        req = PreparedRequest(req.method, req.params, sequence, req.request_hash, req.timestamp, req.goal)
    return stack.session.error_from_reply(req, error).signed


def handshake(stack: Stack, client: Identity | None = None, clock: Any = None) -> ClientHandshake:
    return ClientHandshake(
        client or Identity.generate("hs"),
        resolve_did_key(stack.server.identity.did),
        clock=clock or stack.clock,
    )


async def hello(stack: Stack, params: Any, rid: Any = "h") -> httpx.Response:
    return await stack.call("/a2a/handshake", "hello", params, rid)


def stale(stack: Stack) -> int:
    return int(stack.clock()) - 301


# -- §1 encodings ------------------------------------------------------------------------------------------


async def test_s1_equality_is_jcs_1_equals_1_0_but_not_true(stack: Stack) -> None:
    # Signed {"x": 1}, sent {"x": 1.0}: equal (same JCS form), so accepted.
    req = forge_request(
        stack.session,
        {"goal": "echo", "inputs": {"x": 1.0}},
        payload_changes={"intent": {"goal": "echo", "inputs": {"x": 1}}},
    )
    body = envelope("intent", req.params, 1)
    assert b'"x":1.0' in body
    resp = await stack.post("/a2a/intent", body)
    assert resp.status_code == 200, resp.text
    # Signed {"x": true}, sent {"x": 1}: different, so a (signed) authentication failure.
    req = forge_request(
        stack.session,
        {"goal": "echo", "inputs": {"x": 1}},
        payload_changes={"intent": {"goal": "echo", "inputs": {"x": True}}},
    )
    error = error_of(await stack.send(req, 2), 401, -32040, 2)
    assert signed(stack, req, error)


async def test_s1_s9_largest_integer_passes_and_2_53_is_a_parse_error(stack: Stack) -> None:
    req = forge_request(stack.session, {"goal": "echo", "inputs": {}}, sequence=MAX_INT)
    resp = await stack.send(req, 1)
    assert stack.session.verify_result(req, resp.json()["result"]).sequence == MAX_INT
    for value in (b"9007199254740992", b"-9007199254740992", b"18446744073709551616"):
        body = envelope("intent", {**req.params, "sequence": 0}, 2).replace(
            b'"sequence":0', b'"sequence":' + value
        )
        error_of(await stack.post("/a2a/intent", body), 400, -32700, None)
        body = envelope("echo", {}, 3).replace(b'"params":{}', b'"params":{"x":[' + value + b"]}")
        error_of(await stack.post("/a2a/handshake", body), 400, -32700, None)


async def test_s1_nonce_and_hash_strings_on_the_wire(stack: Stack) -> None:
    challenge = (await hello(stack, handshake(stack).hello())).json()["result"]
    assert len(challenge["nonce_b"]) == 43
    assert len(encoding.b64u_decode(challenge["nonce_b"])) == 32
    for name in ("manifest_hash", "policy_hash"):
        assert encoding.is_hash_string(challenge[name]), challenge[name]
    assert len(encoding.b64u_decode(stack.session.session_id)) == 32


# -- §3 JWS ----------------------------------------------------------------------------------------------


def _segments(token: str) -> tuple[str, str, str]:
    h, p, s = token.split(".")
    return h, p, s


def _b64(obj_bytes: bytes) -> str:
    return encoding.b64u_encode(obj_bytes)


async def test_s3_malformed_token_is_32602_unsigned(stack: Stack) -> None:
    req = stack.prepare("echo", {"x": 1})
    h, p, s = _segments(req.params["request_jws"])
    payload = jws_decode_unverified(req.params["request_jws"])[1]
    dup_payload = encoding.dumps(payload)[:-1] + b',"timestamp":1}'
    big_payload = encoding.dumps(payload)[:-1] + b',"big":9007199254740992}'
    nested = json.loads("[" * 30 + "]" * 30)  # payload 1, intent 2, inputs 3, then 30: depth 33
    deep = encoding.dumps({**payload, "intent": {**payload["intent"], "inputs": {"d": nested}}})
    dup_header = b'{"alg":"EdDSA","alg":"EdDSA","typ":"a2a-request+jws","kid":"k"}'
    cases = {
        "two-segments": h + "." + p,
        "four-segments": ".".join((h, p, s, s)),
        "padding": ".".join((h, p, s + "==")),
        "bad-alphabet": ".".join((h, p + "+", s)),
        "trailing-bits": ".".join((h, p, s[:-1] + ("C" if s[-1] == "B" else "B"))),
        "header-array": ".".join((_b64(b"[1]"), p, s)),
        "payload-not-json": ".".join((h, _b64(b"not json"), s)),
        "payload-string": ".".join((h, _b64(b'"x"'), s)),
        "header-duplicate-member": ".".join((_b64(dup_header), p, s)),
        "payload-duplicate-member": ".".join((h, _b64(dup_payload), s)),
        "payload-depth-33": ".".join((h, _b64(deep), s)),
        "payload-int-2^53": ".".join((h, _b64(big_payload), s)),
        "payload-bom": ".".join((h, _b64(b"\xef\xbb\xbf" + encoding.dumps(payload)), s)),
        "payload-nan": ".".join((h, _b64(encoding.dumps(payload)[:-1] + b',"n":NaN}'), s)),
        "payload-lone-surrogate": ".".join((h, _b64(encoding.dumps(payload)[:-1] + b',"u":"\\ud800"}'), s)),
        "payload-not-utf8": ".".join((h, _b64(encoding.dumps(payload)[:-1] + b',"u":"\xff"}'), s)),
    }
    for name, token in cases.items():
        params = {**req.params, "request_jws": token}
        error = error_of(await stack.call("/a2a/intent", "intent", params, name), 400, -32602, name)
        assert "response_jws" not in (error.get("data") or {}), name
    resp = await stack.send(req)  # nothing was consumed
    assert stack.session.verify_result(req, resp.json()["result"]).result == {"x": 1}


async def test_s3_header_signature_and_typ_failures_are_32040_unsigned(stack: Stack) -> None:
    req = stack.prepare("echo", {"x": 1})
    payload = jws_decode_unverified(req.params["request_jws"])[1]
    client = stack.client
    h, p, s = _segments(req.params["request_jws"])
    short_sig = encoding.b64u_encode(encoding.b64u_decode(s)[:63])
    cases = {
        **{
            f"header-{extra}": sign_raw(payload, client, typ=m.Typ.REQUEST, extra_header={extra: value})
            for extra, value in (
                ("crit", ["b64"]),
                ("jwk", client.public_key_entry()),
                ("jku", "https://x"),
                ("x5u", "https://x"),
                ("x5c", []),
                ("b64", False),
            )
        },
        "alg-none": ".".join(
            (_b64(encoding.dumps({"alg": "none", "typ": m.Typ.REQUEST, "kid": client.kid})), p, s)
        ),
        "typ-close": sign_raw(payload, client, typ=m.Typ.CLOSE),
        "typ-response": sign_raw(payload, client, typ=m.Typ.RESPONSE),
        "kid-other": sign_raw(payload, client, typ=m.Typ.REQUEST, kid=client.did + "#other"),
        "signature-63-bytes": f"{h}.{p}.{short_sig}",
        "other-key": sign_raw(payload, identity("mallory"), typ=m.Typ.REQUEST, kid=client.kid),
    }
    for name, token in cases.items():
        params = {**req.params, "request_jws": token}
        error = error_of(await stack.call("/a2a/intent", "intent", params, name), 401, -32040, name)
        assert "response_jws" not in (error.get("data") or {}), name
    resp = await stack.send(req)
    assert resp.status_code == 200


# -- §4 transport ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["é", "😀", "a"], ids=["latin", "astral", "ascii"])
async def test_s4_id_length_counts_code_points(stack: Stack, char: str) -> None:
    ok = char * 128
    error_of(await stack.post("/a2a/intent", envelope("intent", [], ok)), 400, -32602, ok)
    error_of(await stack.post("/a2a/intent", envelope("intent", [], char * 129)), 400, -32600, None)


async def test_s4_unreadable_id_is_answered_with_null(stack: Stack) -> None:
    for body in (b"[]", b'{"jsonrpc":"2.0","method":"intent","params":{}}', envelope("intent", {}, 1.5)):
        error_of(await stack.post("/a2a/intent", body), 400, -32600, None)
    # A readable id is echoed even when the rest of the envelope is wrong.
    body = encoding.dumps({"jsonrpc": "2.0", "method": "intent", "params": {}, "id": "x", "more": 1})
    error_of(await stack.post("/a2a/intent", body), 400, -32600, "x")


async def test_s4_handshake_params_type_must_equal_the_method(stack: Stack) -> None:
    hs = handshake(stack)
    challenge = (await hello(stack, hs.hello())).json()["result"]
    proof = hs.receive_challenge(challenge)
    for method, params in (
        ("proof", {**proof, "type": "accept_policy"}),
        ("proof", {k: v for k, v in proof.items() if k != "type"}),
        ("accept_policy", {"type": "proof", "nonce_b": proof["nonce_b"], "accept_jws": proof["proof_jws"]}),
    ):
        error_of(await stack.call("/a2a/handshake", method, params, "t"), 400, -32602, "t")
    # The untouched PROOF still completes the step.
    assert (await stack.call("/a2a/handshake", "proof", proof)).status_code == 200


async def test_s4_intent_and_close_params_carry_no_type(stack: Stack) -> None:
    req = stack.prepare("echo")
    error_of(await stack.call("/a2a/intent", "intent", {**req.params, "type": "intent"}, 1), 400, -32602, 1)
    close = stack.session.prepare_close()
    for params in ({**close.params, "type": "close"}, {**close.params, "intent": req.params["intent"]}):
        error_of(await stack.call("/a2a/intent", "close", params, 2), 400, -32602, 2)
    resp = await stack.send(close)
    stack.session.verify_closed(close, resp.json()["result"])


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8"]
)
async def test_s4_content_type_with_charset_accepted_on_both_endpoints(
    stack: Stack, content_type: str
) -> None:
    resp = await stack.post(
        "/a2a/handshake", envelope("hello", handshake(stack).hello()), headers={"Content-Type": content_type}
    )
    assert resp.status_code == 200, resp.text
    req = stack.prepare("echo", {"ct": content_type})
    resp = await stack.post(
        "/a2a/intent", envelope("intent", req.params), headers={"Content-Type": content_type}
    )
    assert stack.session.verify_result(req, resp.json()["result"]).result == {"ct": content_type}


async def _raw_http(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a raw socket; return what comes back within 3 s."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(head + body)
        await writer.drain()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await asyncio.wait_for(reader.read(65536), 3)
            if not chunk:
                break
            data += chunk
        header, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in header.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += await asyncio.wait_for(reader.read(65536), 3)
        return header + b"\r\n\r\n" + rest
    finally:
        writer.close()
        await writer.wait_closed()


async def test_s9_content_type_is_checked_before_the_body_is_read(stack: Stack) -> None:
    # Only the headers are sent: the 415 must come without the server waiting for the body.
    for path in (b"/a2a/intent", b"/a2a/handshake"):
        for declared in (b"100", b"5000000"):  # 5 MB declared: still 415, not 413
            head = (
                b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                b"Content-Length: " + declared + b"\r\n\r\n"
            )
            answer = await _raw_http(stack.url, head)
            assert answer.startswith(b"HTTP/1.1 415"), answer[:100]
            body = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert body["id"] is None and body["error"]["code"] == -32600


async def test_s4_s11_card_members_and_manifest_hash_of_the_test_agent() -> None:
    # The test agent exactly as `a2a-secure serve` builds it with no --app.
    server_id = identity("serve")
    policy = Policy.build(allowed=["echo", "count"], rate_limit=7)
    server = build_server(server_id, policy=policy)
    assert server.goals == ["count", "echo"]
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        resp = await http.get(url + "/.well-known/agent-card.json")
        assert resp.status_code == 200
        card = encoding.loads(resp.content)
        assert {
            "name",
            "description",
            "version",
            "url",
            "did",
            "protocol",
            "endpoints",
            "intents",
            "public_keys",
        } <= set(card)
        assert card["protocol"] == "a2a-secure/1.0"
        assert card["did"] == server_id.did
        assert card["endpoints"] == {"handshake": "/a2a/handshake", "intent": "/a2a/intent"}
        assert card["intents"] == ["count", "echo"]
        assert card["streaming_intents"] == ["count"]
        assert card["public_keys"] == [server_id.public_key_entry()]
        hs = ClientHandshake(identity("card-reader"), resolve_did_key(server_id.did))
        challenge = (
            await http.post(url + "/a2a/handshake", content=envelope("hello", hs.hello()), headers=JSON)
        ).json()
        challenge = challenge["result"]
        assert challenge["manifest_hash"] == encoding.hash_of(card)
        payload = jws_decode_unverified(challenge["policy_signature"])[1]
        assert payload["server_manifest_hash"] == encoding.hash_of(card)
        # ... under the policy it is given.
        proof = hs.receive_challenge(challenge)
        policy_msg = (
            await http.post(url + "/a2a/handshake", content=envelope("proof", proof), headers=JSON)
        ).json()
        assert policy_msg["result"]["policy"] == policy.to_dict()


async def test_s4_client_manifest_hash_without_a_card(stack: Stack) -> None:
    client = identity("no-card")
    hello_msg = handshake(stack, client).hello()
    assert hello_msg["manifest_hash"] == encoding.hash_of({"agent_id": client.agent_id, "did": client.did})
    challenge = (await hello(stack, hello_msg)).json()["result"]
    payload = jws_decode_unverified(challenge["policy_signature"])[1]
    assert payload["client_manifest_hash"] == hello_msg["manifest_hash"]


async def test_s4_client_timeout_is_at_most_30_s() -> None:
    async with A2AClient(identity("patient"), timeout=120) as client:
        timeout = client.http.timeout
        assert max(timeout.connect or 0, timeout.read or 0, timeout.write or 0, timeout.pool or 0) <= 30


# -- §5 handshake ----------------------------------------------------------------------------------------


def _x25519_did() -> str:
    return "did:key:z" + base58.b58encode(b"\xec\x01" + bytes(range(32))).decode()


def _hello_order_cases(stack: Stack) -> dict[str, tuple[dict[str, Any], int]]:
    h = handshake(stack).hello()
    other = identity("third").public_key_entry()
    old = stale(stack)
    return {
        "type-not-string+version": ({**h, "type": 1, "protocol_version": "2.0"}, -32602),
        "version-missing+bad-agent-id": ({**h, "protocol_version": None, "agent_id": ""}, -32602),
        "version+type-value": ({**h, "protocol_version": "2.0", "type": "proof"}, -32046),
        "version+extra+agent-id+stale": (
            {**h, "protocol_version": "2.0", "extra": 1, "agent_id": "", "timestamp": old},
            -32046,
        ),
        "agent-id-129+stale": ({**h, "agent_id": "a" * 129, "timestamp": old}, -32602),
        "nonce+stale": ({**h, "nonce": "AAAA", "timestamp": old}, -32602),
        "public-keys-shape+stale": ({**h, "public_keys": [], "timestamp": old}, -32602),
        "stale+did-syntax": ({**h, "timestamp": old, "agent_did": "not-a-did"}, -32045),
        "stale+unresolvable": ({**h, "timestamp": old, "agent_did": _x25519_did()}, -32045),
        "did-syntax+key-binding": ({**h, "agent_did": "did:key", "public_keys": [other]}, -32602),
        "unresolvable+key-binding": ({**h, "agent_did": "did:example:123", "public_keys": [other]}, -32047),
        "key-binding": ({**h, "public_keys": [other]}, -32040),
    }


async def test_s5_1_hello_check_order(stack: Stack) -> None:
    # Each HELLO fails two checks (or one, last row); the earlier check of §5.1 must win.
    before = stack.store.counts()["pending"]
    for name, (params, code) in _hello_order_cases(stack).items():
        status = {-32602: 400, -32046: 400, -32045: 401, -32047: 401, -32040: 401}[code]
        error = error_of(await hello(stack, params, name), status, code, name)
        if code == -32046:
            assert error["data"] == {"supported": ["1.0"]}
    assert stack.store.counts()["pending"] == before  # no rejected HELLO opened anything


async def test_s5_1_key_binding_comes_before_capacity() -> None:
    async with serve_stack(limits=ServerLimits(max_pending_total=1)) as stack:
        assert (await hello(stack, handshake(stack).hello())).status_code == 200  # now full
        h = handshake(stack).hello()
        error_of(
            await hello(stack, {**h, "public_keys": [identity("x").public_key_entry()]}, 1), 401, -32040, 1
        )
        resp = await hello(stack, h, 2)
        error_of(resp, 503, -32048, 2)
        assert resp.headers["retry-after"].isdigit()


@pytest.mark.parametrize("char", ["é", "😀"], ids=["latin", "astral"])
async def test_s5_1_agent_id_length_counts_code_points(stack: Stack, char: str) -> None:
    # 128 non-ASCII code points (256 or 512 UTF-8 bytes) are a valid agent_id ...
    session = await stack.new_session(Identity.generate(char * 128))
    assert session.session_id
    # ... 129 are not.
    h = handshake(stack).hello()
    error_of(await hello(stack, {**h, "agent_id": char * 129}, "long"), 400, -32602, "long")


async def test_s5_1_replayed_hello_opens_a_new_pending_handshake(stack: Stack) -> None:
    h = handshake(stack).hello()
    first = (await hello(stack, h, 1)).json()["result"]
    second = (await hello(stack, h, 2)).json()["result"]
    assert first["nonce_b"] != second["nonce_b"]


async def test_s5_pending_handshake_lives_60_s_from_its_challenge() -> None:
    async with serve_stack() as stack:
        hs, _challenge, proof = await _to_proof(stack)
        stack.clock.advance(59)
        accept = hs.receive_policy((await stack.call("/a2a/handshake", "proof", proof)).json()["result"])
        stack.clock.advance(2)  # 61 s after the CHALLENGE, 2 s after the PROOF
        error_of(await stack.call("/a2a/handshake", "accept_policy", accept, "late"), 401, -32041, "late")


async def test_s5_4_a_session_keeps_the_policy_it_agreed_to(stack: Stack) -> None:
    protocol = stack.server.protocol
    agreed = protocol.policy
    protocol.policy = Policy.build(blocked=["echo"])  # the configuration changes
    try:
        req = stack.prepare("echo", {"still": "allowed"})
        assert stack.session.verify_result(req, (await stack.send(req)).json()["result"]).result == {
            "still": "allowed"
        }
        later = await stack.new_session(Identity.generate("later"))
        assert later.policy.blocked_intents == ("echo",)
    finally:
        protocol.policy = agreed


async def test_s5_cheap_checks_come_before_any_did_web_fetch() -> None:
    fetched: list[str] = []

    async def web(did: str) -> ResolvedDID:
        fetched.append(did)
        raise OSError("no network in this test")

    resolver = DIDResolver()
    resolver.register("web", web)
    async with serve_shared(resolver=resolver) as shared:
        stack = await open_stack(shared)
        h = {**handshake(stack).hello(), "agent_did": "did:web:agent.example"}
        for params, code in (
            ({**h, "timestamp": stale(stack)}, -32045),
            ({**h, "nonce": "AAAA"}, -32602),
            ({**h, "agent_id": ""}, -32602),
            ({**h, "protocol_version": "9"}, -32046),
        ):
            error_of(await hello(stack, params), 400 if code != -32045 else 401, code, "h")
        assert fetched == []
        error_of(await hello(stack, h), 401, -32047, "h")
        assert fetched == ["did:web:agent.example"]


async def test_s5_hello_rate_allows_at_least_50_per_second_per_source(stack: Stack) -> None:
    hellos = [handshake(stack).hello() for _ in range(60)]
    answers = await asyncio.gather(*(hello(stack, h, i) for i, h in enumerate(hellos)))
    assert [a.status_code for a in answers] == [200] * 60


async def test_s9_default_bounds() -> None:
    limits = ServerLimits()
    assert limits.max_pending_per_source == 256
    assert limits.max_pending_total == 10_000


async def test_s5_2_challenge_and_policy_signature_members(stack: Stack) -> None:
    hs = handshake(stack)
    h = hs.hello()
    challenge = (await hello(stack, h)).json()["result"]
    assert set(challenge) == {
        "type", "protocol_version", "nonce_b", "server_did", "manifest_hash", "public_keys",
        "policy_hash", "policy_signature", "timestamp",
    }  # fmt: skip
    assert challenge["type"] == "challenge" and challenge["protocol_version"] == "1.0"
    assert challenge["server_did"] == stack.server.identity.did
    assert challenge["public_keys"] == [stack.server.identity.public_key_entry()]
    assert challenge["timestamp"] == int(stack.clock())
    token = challenge["policy_signature"]
    header = jws_decode_unverified(token)[0]
    assert header == {"alg": "EdDSA", "typ": "a2a-policy+jws", "kid": stack.server.identity.kid}
    payload = jws_verify(
        token, stack.server.identity.public_key, typ=m.Typ.POLICY, kid=stack.server.identity.kid
    )
    assert payload == {
        "protocol_version": "1.0",
        "hello_hash": encoding.hash_of(h),
        "client_did": h["agent_did"],
        "server_did": stack.server.identity.did,
        "nonce_a": h["nonce"],
        "nonce_b": challenge["nonce_b"],
        "client_manifest_hash": h["manifest_hash"],
        "server_manifest_hash": challenge["manifest_hash"],
        "policy_hash": challenge["policy_hash"],
        "timestamp": challenge["timestamp"],
    }
    assert challenge["manifest_hash"] == stack.server.manifest_hash
    proof = hs.receive_challenge(challenge)
    # §5.4: POLICY members, the policy's five members, its hash, the very same signature.
    policy_msg = (await stack.call("/a2a/handshake", "proof", proof)).json()["result"]
    assert set(policy_msg) == {"type", "policy", "policy_hash", "policy_signature"}
    assert policy_msg["type"] == "policy"
    assert set(policy_msg["policy"]) == {
        "rate_limit", "rate_period", "allowed_intents", "blocked_intents", "session_timeout",
    }  # fmt: skip
    assert policy_msg["policy_hash"] == challenge["policy_hash"] == encoding.hash_of(policy_msg["policy"])
    assert policy_msg["policy_signature"] == token
    # §5.5/§5.6: SESSION members, the commitment, expires_at, the signed payload.
    accept = hs.receive_policy(policy_msg)
    session_msg = (await stack.call("/a2a/handshake", "accept_policy", accept)).json()["result"]
    assert set(session_msg) == {
        "type", "session_id", "server_did", "client_did", "session_commitment", "created_at",
        "expires_at", "public_keys", "session_jws",
    }  # fmt: skip
    commitment = (
        "sha256:"
        + hashlib.sha256(
            f"{h['nonce']}|{challenge['nonce_b']}|{challenge['policy_hash']}".encode()
        ).hexdigest()
    )
    assert session_msg["session_commitment"] == commitment
    assert session_msg["expires_at"] == session_msg["created_at"] + policy_msg["policy"]["session_timeout"]
    assert len(encoding.b64u_decode(session_msg["session_id"])) == 32
    s_token = session_msg["session_jws"]
    assert jws_decode_unverified(s_token)[0]["typ"] == "a2a-session+jws"
    s_payload = jws_verify(
        s_token, stack.server.identity.public_key, typ=m.Typ.SESSION, kid=stack.server.identity.kid
    )
    assert s_payload == {
        k: session_msg[k]
        for k in ("session_id", "session_commitment", "client_did", "server_did", "created_at", "expires_at")
    }
    hs.receive_session(session_msg)
    # The pending handshake was consumed.
    error_of(await stack.call("/a2a/handshake", "accept_policy", accept, "again"), 401, -32041, "again")
    error_of(await stack.call("/a2a/handshake", "proof", proof, "again"), 401, -32041, "again")


async def _to_proof(
    stack: Stack, client: Identity | None = None
) -> tuple[ClientHandshake, dict[str, Any], dict[str, Any]]:
    hs = handshake(stack, client)
    challenge = (await hello(stack, hs.hello())).json()["result"]
    return hs, challenge, hs.receive_challenge(challenge)


async def test_s5_3_proof_check_order(stack: Stack) -> None:
    client = Identity.generate("order")
    hs, _challenge, proof = await _to_proof(stack, client)
    payload = jws_decode_unverified(proof["proof_jws"])[1]
    garbage = sign_raw(payload, identity("mallory"), typ=m.Typ.PROOF, kid=client.kid)
    # Unknown nonce_b with a bad signature: -32041 first.
    unknown = {**proof, "nonce_b": encoding.b64u_encode(os.urandom(32)), "proof_jws": garbage}
    error_of(await stack.call("/a2a/handshake", "proof", unknown, 1), 401, -32041, 1)
    # Bad signature with a stale timestamp: -32040.
    stale_garbage = sign_raw(
        {**payload, "timestamp": stale(stack)}, identity("mallory"), typ=m.Typ.PROOF, kid=client.kid
    )
    error_of(
        await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": stale_garbage}, 2), 401, -32040, 2
    )
    # Payload not equal (challenge_hash) with a stale timestamp: -32040.
    wrong = sign_raw(
        {**payload, "challenge_hash": "sha256:" + "0" * 64, "timestamp": stale(stack)},
        client,
        typ=m.Typ.PROOF,
    )
    error_of(await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": wrong}, 3), 401, -32040, 3)
    # A signed member of the wrong type (§9): -32040.
    typed = sign_raw({**payload, "timestamp": str(payload["timestamp"])}, client, typ=m.Typ.PROOF)
    error_of(await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": typed}, 4), 401, -32040, 4)
    # Missing and extra payload members: -32040.
    for changed in ({k: v for k, v in payload.items() if k != "challenge_hash"}, {**payload, "extra": 1}):
        token = sign_raw(changed, client, typ=m.Typ.PROOF)
        error_of(
            await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": token}, 5), 401, -32040, 5
        )
    # Only freshness wrong: -32045.
    only_stale = sign_raw({**payload, "timestamp": stale(stack)}, client, typ=m.Typ.PROOF)
    error_of(
        await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": only_stale}, 6), 401, -32045, 6
    )
    # Every failure left the pending handshake as it was: the honest PROOF completes it.
    policy_msg = (await stack.call("/a2a/handshake", "proof", proof)).json()["result"]
    accept = hs.receive_policy(policy_msg)
    # Proven already, with a bad signature: -32041 (not yet -32040).
    error_of(await stack.call("/a2a/handshake", "proof", {**proof, "proof_jws": garbage}, 7), 401, -32041, 7)
    assert (await stack.call("/a2a/handshake", "accept_policy", accept)).status_code == 200


async def test_s5_5_accept_check_order() -> None:
    async with serve_stack(limits=ServerLimits(max_sessions=1)) as stack:  # the stack's session fills it
        client = Identity.generate("accept")
        hs, _challenge, proof = await _to_proof(stack, client)
        accept_payload = {
            "policy_hash": "sha256:" + "0" * 64,
            "session_commitment": "sha256:" + "0" * 64,
            "nonce_a": hs.nonce_a,
            "nonce_b": hs.nonce_b,
            "client_did": client.did,
            "server_did": stack.server.identity.did,
            "timestamp": stale(stack),
        }
        bad = {
            "type": "accept_policy",
            "nonce_b": hs.nonce_b,
            "accept_jws": sign_raw(accept_payload, client, typ=m.Typ.ACCEPT),
        }
        # Not proven yet, with a wrong payload and a stale timestamp: -32041.
        error_of(await stack.call("/a2a/handshake", "accept_policy", bad, 1), 401, -32041, 1)
        accept = hs.receive_policy((await stack.call("/a2a/handshake", "proof", proof)).json()["result"])
        good_payload = jws_decode_unverified(accept["accept_jws"])[1]
        # Wrong commitment with a stale timestamp: -32040.
        error_of(await stack.call("/a2a/handshake", "accept_policy", bad, 2), 401, -32040, 2)
        # Stale with the sessions full: -32045.
        stale_token = sign_raw({**good_payload, "timestamp": stale(stack)}, client, typ=m.Typ.ACCEPT)
        error_of(
            await stack.call("/a2a/handshake", "accept_policy", {**accept, "accept_jws": stale_token}, 3),
            401,
            -32045,
            3,
        )
        # Everything right, sessions full: -32048 with Retry-After, the pending handshake kept.
        resp = await stack.call("/a2a/handshake", "accept_policy", accept, 4)
        error_of(resp, 503, -32048, 4)
        assert resp.headers["retry-after"].isdigit()
        assert stack.store.counts()["pending"] == 1


# -- §6.1 intents ------------------------------------------------------------------------------------------


async def test_s6_1_intent_member_shapes(stack: Stack) -> None:
    base: dict[str, Any] = {"goal": "echo", "inputs": {}}
    bad: dict[str, dict[str, Any]] = {
        "goal-129-code-points": {**base, "goal": "é" * 129},
        "domain-number": {**base, "domain": 5},
        "constraints-array": {**base, "constraints": []},
        "timeout-true": {**base, "constraints": {"timeout_ms": True}},
        "timeout-float": {**base, "constraints": {"timeout_ms": 1.5}},
        "max-tokens-0": {**base, "constraints": {"max_tokens": 0}},
        "stream-string": {**base, "constraints": {"stream": "yes"}},
        "stream-1": {**base, "constraints": {"stream": 1}},
        "unknown-constraint": {**base, "constraints": {"temperature": 1}},
        "inputs-null": {**base, "inputs": None},
        "goal-missing": {"inputs": {}},
        "unknown-member": {**base, "urgency": 1},
    }
    for name, intent in bad.items():
        req = forge_request(stack.session, intent, sequence=stack.session.last_sequence + 1)
        error = error_of(await stack.send(req, name), 400, -32602, name)
        assert "response_jws" not in (error.get("data") or {}), name
    # A goal of 128 code points passes the shape checks (and then has no handler: signed -32601).
    req = forge_request(stack.session, {"goal": "😀" * 128, "inputs": {}})
    assert signed(stack, req, error_of(await stack.send(req, "g128"), 404, -32601, "g128"))
    # All optional members at once are fine.
    full = {
        "goal": "echo",
        "domain": "d",
        "inputs": {"a": 1},
        "constraints": {"timeout_ms": 5, "max_tokens": 1, "stream": False},
    }
    req = stack.session.prepare_intent(full)
    assert stack.session.verify_result(req, (await stack.send(req)).json()["result"]).result == {"a": 1}


async def test_s6_1_check_order() -> None:
    policy = Policy.build(blocked=["blocked", "blocked-and-unserved"], rate_limit=3, rate_period=60)
    async with serve_stack(policy=policy) as stack:
        s = stack.session
        echo = {"goal": "echo", "inputs": {}}
        rnd = encoding.b64u_encode(os.urandom(32))
        # Step 1 before step 2: a bad shape on an unknown session is -32602.
        req = stack.prepare("echo")
        s.last_sequence -= 1
        error_of(
            await stack.call("/a2a/intent", "intent", {**req.params, "session_id": rnd, "x": 1}, 1),
            400,
            -32602,
            1,
        )
        # Step 2 before step 3: unknown session with a wrong commitment is -32043.
        params = {**req.params, "session_id": rnd, "session_commitment": "sha256:" + "0" * 64}
        error_of(await stack.call("/a2a/intent", "intent", params, 2), 401, -32043, 2)
        # Step 4 before step 5: a foreign signature over a payload that differs is unsigned -32040.
        forged = forge_request(
            s,
            {"goal": "echo", "inputs": {"a": 1}},
            signer=identity("mallory"),
            payload_changes={"intent": echo},
        )
        error = error_of(await stack.send(forged, 3), 401, -32040, 3)
        assert not signed(stack, forged, error)
        # Step 5 before step 6: a payload that differs, signed long ago, is signed -32040.
        old = int(stack.clock()) - 400
        forged = forge_request(
            s,
            {"goal": "echo", "inputs": {"a": 1}},
            timestamp=old,
            sequence=1,
            payload_changes={"intent": echo},
        )
        assert signed(stack, forged, error_of(await stack.send(forged, 4), 401, -32040, 4))
        # Step 6 before step 7: stale and an old sequence is signed -32045.
        assert (await stack.send(stack.prepare("echo"))).status_code == 200  # sequence 1 (counts 1)
        forged = forge_request(s, echo, timestamp=old, sequence=1)
        assert signed(stack, forged, error_of(await stack.send(forged, 5), 401, -32045, 5))
        # Steps 9 and 10: a blocked goal without a handler is -32042, and it consumes the sequence.
        blocked = forge_request(s, {"goal": "blocked-and-unserved", "inputs": {}})  # counts 2
        error = error_of(await stack.send(blocked, 6), 403, -32042, 6)
        assert signed(stack, blocked, error)
        assert error_of(await stack.send(blocked, 7), 403, -32042, 7) == error  # the stored answer
        other = forge_request(s, {"goal": "echo", "inputs": {"other": 1}}, sequence=blocked.sequence)
        error_of(await stack.send(other, 8), 409, -32044, 8)
        # Step 10: no handler, signed -32601, consumes the sequence too.
        unserved = forge_request(s, {"goal": "unserved", "inputs": {}})  # counts 3: the limit
        assert signed(stack, unserved, error_of(await stack.send(unserved, 9), 404, -32601, 9))
        # Step 7 before step 8: over the limit, an old sequence is still -32044.
        forged = forge_request(s, {"goal": "echo", "inputs": {"late": 1}}, sequence=2)
        assert signed(stack, forged, error_of(await stack.send(forged, 10), 409, -32044, 10))
        # Step 8 before step 9: over the limit, a blocked goal is -32048.
        forged = forge_request(s, {"goal": "blocked", "inputs": {}})
        resp = await stack.send(forged, 11)
        assert signed(stack, forged, error_of(resp, 503, -32048, 11))
        assert resp.headers["retry-after"].isdigit()
        assert stack.calls["echo"] == 1


async def test_s6_1_signed_members_of_the_wrong_type_are_32040(stack: Stack) -> None:
    s = stack.session
    echo = {"goal": "echo", "inputs": {}}
    for changes in (
        {"timestamp": str(int(stack.clock()))},
        {"timestamp": float(int(stack.clock()))},
        {"sequence": str(s.last_sequence + 1)},
        {"sequence": True},
        {"session_id": None},
        {"intent": DROP},
        {"extra": 1},
    ):
        req = forge_request(s, echo, payload_changes=changes)
        error = error_of(await stack.send(req, "w"), 401, -32040, "w")
        # Signed, with the sequence of params (§9).
        assert signed(stack, req, error), changes
        assert jws_decode_unverified(error["data"]["response_jws"])[1]["sequence"] == req.sequence


async def test_s6_1_rate_limit_is_per_did_across_sessions() -> None:
    async with serve_stack(policy=Policy.build(rate_limit=2, rate_period=60)) as stack:
        second = await stack.new_session()
        assert (await stack.send(stack.prepare("echo"))).status_code == 200
        assert (await stack.send(stack.prepare("echo", session=second))).status_code == 200
        req = stack.prepare("echo", session=second)
        resp = await stack.send(req, "rl")
        error = error_of(resp, 503, -32048, "rl")
        assert int(resp.headers["retry-after"]) == error["data"]["retry_after"] == 60


async def test_s6_1_rate_limited_request_may_be_resent_only_while_fresh() -> None:
    async with serve_stack(policy=Policy.build(rate_limit=1, rate_period=600)) as stack:
        assert (await stack.send(stack.prepare("echo"))).status_code == 200
        req = stack.prepare("echo", {"x": 1})
        resp = await stack.send(req, 1)
        error_of(resp, 503, -32048, 1)
        assert resp.headers["retry-after"] == "600"
        stack.clock.advance(600)  # Retry-After has passed, but the request is now 600 s old
        assert signed(stack, req, error_of(await stack.send(req, 2), 401, -32045, 2))


# -- §6.2 results ------------------------------------------------------------------------------------------


async def test_s6_2_result_and_signed_error_members(stack: Stack) -> None:
    key, kid = stack.server.identity.public_key, stack.server.identity.kid
    req = stack.prepare("echo", {"x": [1, "é"]})
    body = (await stack.send(req, "r")).json()
    assert set(body) == {"jsonrpc", "id", "result"}
    result = body["result"]
    assert set(result) == {"status", "sequence", "result", "response_jws"}
    assert result["status"] == "success" and result["sequence"] == req.sequence
    assert result["result"] == {"x": [1, "é"]}  # the §11 echo: the inputs unchanged
    assert jws_decode_unverified(result["response_jws"])[0] == {
        "alg": "EdDSA",
        "typ": "a2a-response+jws",
        "kid": kid,
    }
    payload = jws_verify(result["response_jws"], key, typ=m.Typ.RESPONSE, kid=kid)
    assert payload == {
        "session_id": stack.session.session_id,
        "sequence": req.sequence,
        "request_hash": "sha256:" + hashlib.sha256(req.params["request_jws"].encode("ascii")).hexdigest(),
        "status": "success",
        "result": {"x": [1, "é"]},
        "timestamp": int(stack.clock()),
    }
    # A signed error (step 10 here): error.data.response_jws with status "error" and the error.
    req = stack.prepare("no-such-goal")
    error = error_of(await stack.send(req, "e"), 404, -32601, "e")
    assert set(error) == {"code", "message", "data"} and set(error["data"]) == {"response_jws"}
    payload = jws_verify(error["data"]["response_jws"], key, typ=m.Typ.RESPONSE, kid=kid)
    assert set(payload) == {"session_id", "sequence", "request_hash", "status", "error", "timestamp"}
    assert payload["status"] == "error"
    assert payload["error"] == {"code": error["code"], "message": error["message"]}


# -- §6.3 close --------------------------------------------------------------------------------------------


async def test_s6_3_close_result_members_and_payload(stack: Stack) -> None:
    key, kid = stack.server.identity.public_key, stack.server.identity.kid
    close = stack.session.prepare_close()
    assert jws_decode_unverified(close.params["request_jws"])[0]["typ"] == "a2a-close+jws"
    result = (await stack.send(close, "c")).json()["result"]
    assert set(result) == {"type", "session_id", "response_jws"}
    assert result["type"] == "closed" and result["session_id"] == stack.session.session_id
    payload = jws_verify(result["response_jws"], key, typ=m.Typ.RESPONSE, kid=kid)
    assert set(payload) == {"session_id", "sequence", "request_hash", "status", "result", "timestamp"}
    assert payload["status"] == "success" and payload["sequence"] == close.sequence
    assert payload["result"] == {"type": "closed", "session_id": stack.session.session_id}
    # After close the session is unknown, a retried close included.
    error_of(await stack.send(close, "again"), 401, -32043, "again")


async def test_s6_3_close_payload_and_token_rules(stack: Stack) -> None:
    s = stack.session
    close = s.prepare_close()
    payload = jws_decode_unverified(close.params["request_jws"])[1]
    for changed, typ in (
        ({**payload, "close": 1}, m.Typ.CLOSE),
        ({**payload, "close": False}, m.Typ.CLOSE),
        ({**payload, "intent": {}}, m.Typ.CLOSE),
    ):
        token = sign_raw(changed, stack.client, typ=typ)
        req = PreparedRequest(
            "close", {**close.params, "request_jws": token}, close.sequence, m.request_hash(token), 0
        )
        assert signed(stack, req, error_of(await stack.send(req, "p"), 401, -32040, "p"))
    # A close token in an intent, an intent token in a close: the typ separates them.
    token = sign_raw(payload, stack.client, typ=m.Typ.REQUEST)
    req = PreparedRequest(
        "close", {**close.params, "request_jws": token}, close.sequence, m.request_hash(token), 0
    )
    error_of(await stack.send(req, "t"), 401, -32040, "t")
    # The honest close of that sequence after a later intent: signed -32044, the session stays open.
    assert (await stack.send(stack.prepare("echo"))).status_code == 200
    assert signed(stack, close, error_of(await stack.send(close, "old"), 409, -32044, "old"))
    assert (await stack.send(stack.prepare("echo"))).status_code == 200


async def test_s6_3_close_is_not_rate_limited_and_consumes_a_new_sequence() -> None:
    async with serve_stack(policy=Policy.build(rate_limit=1, rate_period=60)) as stack:
        assert (await stack.send(stack.prepare("echo"))).status_code == 200
        error_of(await stack.send(stack.prepare("echo"), "rl"), 503, -32048, "rl")
        stack.session.last_sequence += 5  # gaps are allowed
        close = stack.session.prepare_close()
        resp = await stack.send(close, "c")
        assert resp.status_code == 200, resp.text
        payload = jws_decode_unverified(resp.json()["result"]["response_jws"])[1]
        assert payload["sequence"] == close.sequence
        assert stack.store.counts()["sessions"] == 0


# -- §8 audit ----------------------------------------------------------------------------------------------

AUDIT_MEMBERS = {
    "timestamp", "event", "role", "session_id", "client_did", "server_did", "intent_goal",
    "sequence", "status", "duration_ms", "error_code", "verified",
}  # fmt: skip


async def test_s8_record_members_events_and_verified_flags() -> None:
    sink = MemoryAuditSink()
    clock = FakeClock()
    auditor = Auditor([sink], role="server", clock=clock)
    async with serve_stack(audit=auditor, clock=clock) as stack:
        s = stack.session
        sid, did, server_did = s.session_id, stack.client.did, stack.server.identity.did
        ok = stack.prepare("echo", {"secret": SECRET})
        assert (await stack.send(ok)).status_code == 200
        assert (await stack.send(stack.prepare("no-handler"))).status_code == 404
        bad_sig = forge_request(s, {"goal": "echo", "inputs": {}}, signer=identity("mallory"))
        assert (await stack.send(bad_sig)).status_code == 401
        mismatch = forge_request(
            s, {"goal": "echo", "inputs": {}}, payload_changes={"intent": {"goal": "x", "inputs": {}}}
        )
        assert (await stack.send(mismatch)).status_code == 401
        assert (await stack.call("/a2a/intent", "frobnicate", {})).status_code == 404
        assert (await stack.call("/a2a/intent", "hello", {})).status_code == 404
        assert (await stack.call("/a2a/handshake", "proof", [])).status_code == 400
        assert (await stack.post("/a2a/intent", b"{")).status_code == 400
        assert (
            await stack.post("/a2a/intent", b"{}", headers={"Content-Type": "text/plain"})
        ).status_code == 415
        close = s.prepare_close()
        assert (await stack.send(close)).status_code == 200
        records = sink.records
    for r in records:
        assert set(r) == AUDIT_MEMBERS, r
        assert r["role"] == "server" and r["server_did"] == server_did
        assert r["timestamp"] == clock() and r["duration_ms"] == 0
    assert SECRET not in json.dumps(records)
    rows = [(r["event"], r["status"], r["error_code"], r["verified"]) for r in records]
    assert rows == [
        ("hello", "success", None, False),  # a HELLO carries no signature
        ("proof", "success", None, True),
        ("accept_policy", "success", None, True),
        ("intent", "success", None, True),
        ("intent", "error", -32601, True),
        ("intent", "error", -32040, False),  # the signature did not verify
        ("intent", "error", -32040, True),  # step 5: the signature did verify
        ("reject", "error", -32601, False),  # an unknown method
        ("reject", "error", -32601, False),  # a method on the other endpoint
        ("proof", "error", -32602, False),  # recognised method, params not an object
        ("reject", "error", -32700, False),
        ("reject", "error", -32600, False),
        ("close", "success", None, True),
    ]
    hs, _pf, _ac, ok_r, nh, _bs, mm, *_rest, close_r = records
    assert hs["client_did"] == did and hs["session_id"] is None and hs["sequence"] is None
    assert ok_r["session_id"] == sid and ok_r["intent_goal"] == "echo" and ok_r["sequence"] == ok.sequence
    assert nh["intent_goal"] == "no-handler"
    assert mm["sequence"] == mismatch.sequence
    assert close_r["intent_goal"] is None and close_r["sequence"] == close.sequence
    reject = records[7]
    assert reject["session_id"] is None and reject["client_did"] is None and reject["intent_goal"] is None


async def test_s8_unauthenticated_strings_are_cut_to_256(stack: Stack) -> None:
    long_did = "did:key:z" + "1" * 1000  # valid syntax, cannot be resolved
    h = {**handshake(stack).hello(), "agent_did": long_did}
    error_of(await hello(stack, h, "long"), 401, -32047, "long")
    record = stack.audit[-1]
    assert record["event"] == "hello" and record["verified"] is False
    assert record["client_did"] == long_did[:256]
    # Through the Auditor the record itself enforces the cut (and keeps verified strings whole).
    sink = MemoryAuditSink()
    Auditor([sink], role="server").record(event="hello", status="error", verified=False, client_did=long_did)
    assert len(sink.records[0]["client_did"]) == 256


async def test_s8_client_records(stack: Stack) -> None:
    log = AuditLog()
    async with A2AClient(identity("audited"), clock=stack.clock, audit=log) as client:
        await client.request(
            stack.server.identity.did, {"goal": "echo", "inputs": {"s": SECRET}}, endpoint=stack.url
        )
    assert [r["event"] for r in log] == ["hello", "proof", "accept_policy", "intent", "close"]
    assert all(r["role"] == "client" and r["status"] == "success" for r in log)
    assert SECRET not in repr(log)


# -- §9 details --------------------------------------------------------------------------------------------


async def test_s9_did_errors_32602_vs_32047(stack: Stack) -> None:
    h = handshake(stack).hello()
    syntax = [
        "not-a-did",
        "did:",
        "did:key",
        "did:key:",
        "DID:key:z6Mk",
        "did:KEY:z6Mk",
        "did:key:zé",
        "did:key:z 6",
        "did:key:" + "z" * 2041,
    ]
    unusable = [
        "did:example:123",  # unsupported method
        "did:key:f" + "ab" * 34,  # not z-base58btc
        "did:key:z" + base58.b58encode(b"\xec\x01" + bytes(range(32))).decode(),  # multicodec
        "did:key:z" + base58.b58encode(b"\xed\x01" + bytes(31)).decode(),  # key length
        "did:key:z" + base58.b58encode(b"\xed\x01" + bytes(32)).decode(),  # small order
        "did:key:z0OIl",  # not base58
        "did:web:127.0.0.1",  # no did:web resolver here / loopback
    ]
    for did in syntax:
        error_of(await hello(stack, {**h, "agent_did": did}, "s"), 400, -32602, "s")
    for did in unusable:
        error_of(await hello(stack, {**h, "agent_did": did}, "u"), 401, -32047, "u")
    assert len("did:key:" + "z" * 2040) == 2048  # the longest allowed is syntactically valid
    error_of(await hello(stack, {**h, "agent_did": "did:key:" + "z" * 2040}, "max"), 401, -32047, "max")


async def test_s9_depth_counts_containers_with_the_outermost_as_1(stack: Stack) -> None:
    # Body: envelope 1, params 2, intent 3, inputs 4, then 28 more levels = 32.
    inner: Any = {}
    for _ in range(27):
        inner = {"a": inner}
    req = stack.prepare("echo", {"d": inner})
    body = envelope("intent", req.params)
    resp = await stack.post("/a2a/intent", body)
    assert resp.status_code == 200, resp.text
    # An honest client refuses to sign it; a forged request shows what the server does.
    with pytest.raises(InvalidParams, match="nested deeper than 29 levels"):
        stack.prepare("echo", {"d": {"a": inner}})
    deeper = forge_request(stack.session, {"goal": "echo", "inputs": {"d": {"a": inner}}})
    error_of(await stack.post("/a2a/intent", envelope("intent", deeper.params, 3)), 400, -32700, None)


async def test_s9_lengths_count_code_points_for_goals(stack: Stack) -> None:
    req = forge_request(stack.session, {"goal": "é" * 128, "inputs": {}})
    error_of(await stack.send(req, 1), 404, -32601, 1)
    req = forge_request(stack.session, {"goal": "é" * 129, "inputs": {}})
    error_of(await stack.send(req, 2), 400, -32602, 2)


# -- §11 the test agent ----------------------------------------------------------------------------------


async def test_s11_echo_returns_the_inputs_unchanged(stack: Stack) -> None:
    for inputs in (
        {},
        {"text": "Hello"},
        {"n": [1, 2.5, -0.0, None, True, "é😀"], "o": {"k": {}}},
        {"a\u2028b": "x\u0000y"},
    ):
        req = stack.prepare("echo", inputs)
        resp = await stack.send(req)
        assert stack.session.verify_result(req, resp.json()["result"]).result == inputs


# -- §4: the card's url -------------------------------------------------------------------------
async def test_s4_card_url_is_the_configured_public_base_url(tmp_path: Any) -> None:
    from a2a_secure.server.run import app_from_env, default_url

    key_file = tmp_path / "k.key"
    identity("url").save(key_file)
    env = {"A2A_SECURE_KEY_FILE": str(key_file), "A2A_SECURE_URL": "https://agent.example/base/"}
    async with serve_app(app_from_env(env)) as url, httpx.AsyncClient(timeout=10) as http:
        card = (await http.get(url + "/.well-known/agent-card.json", headers={"Host": "elsewhere"})).json()
        # The configured URL (its trailing "/" dropped), whatever Host the request names.
        assert card["url"] == "https://agent.example/base"
    # `serve` without --url: the address it binds, none for a wildcard address.
    assert default_url("127.0.0.1", 8000, tls=False) == "http://127.0.0.1:8000"
    assert default_url("agent.example", 443, tls=True) == "https://agent.example:443"
    assert default_url("::1", 8443, tls=True) == "https://[::1]:8443"
    assert default_url("0.0.0.0", 8000, tls=False) == ""
    assert default_url("::", 8000, tls=False) == ""


@pytest.mark.parametrize(
    "url",
    [
        "agent.example",
        "ftp://agent.example",
        "https://agent.example/?q=1",
        "https://a.example/#f",
        "https://",
    ],
)
async def test_s4_card_url_of_another_form_is_refused(url: str) -> None:
    from a2a_secure.server.app import AgentServer

    with pytest.raises(ValueError, match="absolute http"):
        AgentServer(identity("url"), Policy(), url=url)
