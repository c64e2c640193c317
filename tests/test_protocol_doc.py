"""docs/PROTOCOL.md is the code's contract: every documented message is checked against the code.

Each tagged example of the document is parsed by the receiving side's own models, every
token in it verifies with the key the document shows, the documented client messages are
replayed against a fresh ``ServerProtocol`` (same keys, clock and random source as the
generator, ``scripts/protocol_examples.py``) that must answer with exactly the documented
replies, and the documented replies are fed to a fresh client state machine that must
accept them and produce exactly the documented requests. A member renamed, added or dropped
on either side fails here. The §12 extension examples (priority, intent_id on two more
sessions) go through the same checks, and their replay shows the handler ran once for an
intent sent twice under one ``intent_id``. The §7 table must list every error class with its code and HTTP
status, and every section that SECURITY.md, the README or a docstring cites must exist.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from a2a_secure import errors
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_verify
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol import models
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.messages import Typ, request_hash
from a2a_secure.protocol.server import Reply
from a2a_secure.protocol.wire import encode_error, encode_result, parse_request
from a2a_secure.runtime.router import ServerProtocol
from a2a_secure.testing import FakeClock

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "PROTOCOL.md"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "protocol_examples", REPO / "scripts" / "protocol_examples.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("protocol_examples", module)
    spec.loader.exec_module(module)
    return module


pe = _load_generator()
TEXT = DOC.read_text(encoding="utf-8")
Examples = dict[str, tuple[str, int | None, str]]
DOCUMENTED: Examples = pe.examples_in(TEXT)

# (request example, endpoint, answer example, server model of the params)
REQUESTS: list[tuple[str, str, str, Callable[..., Any]]] = [
    ("hello", "handshake", "challenge", models.Hello.parse),
    ("proof", "handshake", "policy", models.Proof.parse),
    ("accept-policy", "handshake", "session", models.AcceptPolicy.parse),
    ("intent-request", "intent", "intent-result", models.IntentRequest.parse),
    ("error-request", "intent", "error-result", models.IntentRequest.parse),
    ("stream-request", "intent", "stream-body", models.IntentRequest.parse),
    ("close-request", "intent", "closed-result", models.CloseRequest.parse),
]
# §12: (request example, answer example, session of the replay, step time). Sessions 2 and 3
# are opened by undocumented handshakes (pe.open_session), as the generator opens them.
EXT_REQUESTS: list[tuple[str, str, int, str]] = [
    ("intent-id-request", "intent-id-result", 2, "intent_id"),
    ("priority-request", "priority-result", 2, "priority"),
    ("intent-id-resend-request", "intent-id-resend-result", 3, "intent_id_resend"),
    ("intent-id-conflict-request", "intent-id-conflict-error", 3, "intent_id_conflict"),
]
# (answer example, its response payload example, the request it answers)
EXT_PAYLOADS: list[tuple[str, str, str]] = [
    ("intent-id-result", "intent-id-payload", "intent-id-request"),
    ("intent-id-resend-result", "intent-id-resend-payload", "intent-id-resend-request"),
    ("intent-id-conflict-error", "intent-id-conflict-payload", "intent-id-conflict-request"),
]
STEP_TIME = {
    "hello": "challenge",
    "proof": "proof",
    "accept-policy": "accept_policy",
    "intent-request": "intent",
    "error-request": "error",
    "stream-request": "stream",
    "close-request": "close",
}


def value(examples: Examples, name: str) -> Any:
    """The JSON value of a documented example (a deep copy)."""
    lang, _http, body = examples[name]
    assert lang == "json", name
    return json.loads(body)


def http_of(examples: Examples, name: str) -> int | None:
    return examples[name][1]


def sse_events(body: str) -> list[dict[str, Any]]:
    """The events of a documented stream body, read by the framing rules of §6.4."""
    wire = body + "\n"
    assert wire.endswith("\n\n")
    out = []
    for index, frame in enumerate(wire[:-2].split("\n\n")):
        lines = frame.split("\n")
        assert len(lines) == 2, frame[:80]
        assert lines[0] == f"id: {index}"
        assert lines[1].startswith("data: ")
        out.append(encoding.loads(lines[1][len("data: ") :].encode()))
    return out


def same_json(a: Any, b: Any) -> bool:
    return encoding.jcs(a) == encoding.jcs(b)


def answer_body(request_id: Any, reply: Reply) -> Any:
    body = (
        encode_result(request_id, reply.result)
        if reply.error is None
        else encode_error(request_id, reply.error)
    )
    return encoding.loads(body)


# -- the checks (functions of the examples, so a test can feed them a drifted document) ---------
def check_requests_parse(ex: Examples) -> None:
    """Each documented request passes the envelope parser and the server's model of its params."""
    for name, endpoint, _answer, parse in REQUESTS:
        body = value(ex, name)
        env = parse_request(encoding.dumps(body), endpoint)
        assert env.method == body["method"]
        if parse is models.Hello.parse:
            parse(env.params, now=pe.AT["challenge"])
        else:
            parse(env.params)
    for name, _answer, _session, _step in EXT_REQUESTS:
        body = value(ex, name)
        env = parse_request(encoding.dumps(body), "intent")
        assert env.method == body["method"] == "intent"
        models.IntentRequest.parse(env.params)


def _response_jws(answer: Any) -> str:
    """The ``response_jws`` of a documented intent answer, a result or a signed error."""
    if "result" in answer:
        return answer["result"]["response_jws"]  # type: ignore[no-any-return]
    return answer["error"]["data"]["response_jws"]  # type: ignore[no-any-return]


def check_answers_parse(ex: Examples) -> None:
    """Each documented answer passes the client's model of it, with the documented status."""
    server_did = value(ex, "challenge")["result"]["server_did"]
    models.Challenge.parse(value(ex, "challenge")["result"], server_did=server_did)
    models.PolicyMessage.parse(value(ex, "policy")["result"])
    models.SessionMessage.parse(value(ex, "session")["result"])
    models.IntentResultMessage.parse(value(ex, "intent-result")["result"])
    models.ClosedMessage.parse(value(ex, "closed-result")["result"])
    for name in ("stream-event-first", "stream-event-final"):
        models.EventMessage.parse(value(ex, name)["result"])
    for event in sse_events(ex["stream-body"][2]):
        models.EventMessage.parse(event["result"])
    for name, status in (("error-result", 400), ("unsigned-error", 401)):
        error = value(ex, name)["error"]
        models.ErrorObject.parse({k: error[k] for k in ("code", "message")})
        assert (
            errors.error_for_code(error["code"], error["message"]).http_status == status == http_of(ex, name)
        )
    assert "data" not in value(ex, "unsigned-error")["error"]
    for _request, answer, _session, _step in EXT_REQUESTS:
        if "result" in value(ex, answer):
            models.IntentResultMessage.parse(value(ex, answer)["result"])
            assert http_of(ex, answer) == 200, answer
    conflict = value(ex, "intent-id-conflict-error")["error"]
    models.ErrorObject.parse({k: conflict[k] for k in ("code", "message")})
    assert conflict["code"] == -32044
    assert errors.error_for_code(conflict["code"], conflict["message"]).http_status == 409
    assert http_of(ex, "intent-id-conflict-error") == 409


def _key(ex: Examples, side: str) -> tuple[str, bytes]:
    entry = value(ex, "hello")["params"] if side == "client" else value(ex, "challenge")["result"]
    key = entry["public_keys"][0]
    return key["kid"], encoding.b64u_decode(key["key"])


def _tokens(ex: Examples) -> list[tuple[str, str, str, str, Callable[..., Any]]]:
    """(token, signer, typ, payload example, payload model) for every documented token."""
    events = sse_events(ex["stream-body"][2])
    first, final = events[0]["result"]["response_jws"], events[-1]["result"]["response_jws"]
    challenge, policy = value(ex, "challenge")["result"], value(ex, "policy")["result"]
    proof, accept = value(ex, "proof")["params"], value(ex, "accept-policy")["params"]
    session = value(ex, "session")["result"]
    request, close = value(ex, "intent-request")["params"], value(ex, "close-request")["params"]
    result, closed = value(ex, "intent-result")["result"], value(ex, "closed-result")["result"]
    error = value(ex, "error-result")["error"]["data"]
    event_first, event_final = (
        value(ex, "stream-event-first")["result"],
        value(ex, "stream-event-final")["result"],
    )
    return [
        (challenge["policy_signature"], "server", Typ.POLICY, "policy-payload", models.PolicyPayload.parse),
        (policy["policy_signature"], "server", Typ.POLICY, "policy-payload", models.PolicyPayload.parse),
        (proof["proof_jws"], "client", Typ.PROOF, "proof-payload", models.ProofPayload.parse),
        (accept["accept_jws"], "client", Typ.ACCEPT, "accept-payload", models.AcceptPayload.parse),
        (session["session_jws"], "server", Typ.SESSION, "session-payload", models.SessionPayload.parse),
        (request["request_jws"], "client", Typ.REQUEST, "request-payload", models.RequestPayload.parse),
        (result["response_jws"], "server", Typ.RESPONSE, "response-payload", models.ResponsePayload.parse),
        (error["response_jws"], "server", Typ.RESPONSE, "error-payload", models.ResponsePayload.parse),
        (event_first["response_jws"], "server", Typ.EVENT, "event-payload-first", models.EventPayload.parse),
        (first, "server", Typ.EVENT, "event-payload-first", models.EventPayload.parse),
        (event_final["response_jws"], "server", Typ.EVENT, "event-payload-final", models.EventPayload.parse),
        (final, "server", Typ.EVENT, "event-payload-final", models.EventPayload.parse),
        (close["request_jws"], "client", Typ.CLOSE, "close-payload", models.ClosePayload.parse),
        (closed["response_jws"], "server", Typ.RESPONSE, "closed-payload", models.ResponsePayload.parse),
    ]


def check_tokens_verify(ex: Examples) -> None:
    """Every documented token verifies with the documented key and carries the documented payload."""
    assert value(ex, "jws-header") == {"alg": "EdDSA", "typ": Typ.POLICY, "kid": _key(ex, "server")[0]}
    for token, signer, typ, payload_name, parse in _tokens(ex):
        kid, key = _key(ex, signer)
        payload = jws_verify(token, key, typ=typ, kid=kid)
        assert same_json(payload, value(ex, payload_name)), payload_name
        parse(payload)
    # §12: every request and answer token verifies; a documented payload is what it carries.
    documented_payloads = {answer: payload for answer, payload, _request in EXT_PAYLOADS}
    for request, answer, _session, _step in EXT_REQUESTS:
        params = value(ex, request)["params"]
        kid, key = _key(ex, "client")
        signed = jws_verify(params["request_jws"], key, typ=Typ.REQUEST, kid=kid)
        models.RequestPayload.parse(signed)
        assert same_json(signed["intent"], params["intent"]), request
        kid, key = _key(ex, "server")
        payload = jws_verify(_response_jws(value(ex, answer)), key, typ=Typ.RESPONSE, kid=kid)
        models.ResponsePayload.parse(payload)
        assert payload["sequence"] == params["sequence"] and payload["session_id"] == params["session_id"]
        if answer in documented_payloads:
            assert same_json(payload, value(ex, documented_payloads[answer])), answer


def check_intent_id_resend(ex: Examples) -> None:
    """§12.5: the resend is the same intent on a new session, answered with the first result."""
    first, resend = value(ex, "intent-id-request")["params"], value(ex, "intent-id-resend-request")["params"]
    assert "intent_id" in first["intent"] and same_json(first["intent"], resend["intent"])
    assert first["session_id"] != resend["session_id"]
    conflict = value(ex, "intent-id-conflict-request")["params"]
    assert conflict["intent"]["intent_id"] == first["intent"]["intent_id"]
    assert not same_json(conflict["intent"], first["intent"])
    # The first run's result, signed again over the resend's session, sequence and hash.
    old, new = value(ex, "intent-id-payload"), value(ex, "intent-id-resend-payload")
    assert same_json(old["result"], new["result"]) and old["status"] == new["status"] == "success"
    assert (new["session_id"], new["sequence"]) == (resend["session_id"], resend["sequence"])
    assert new["request_hash"] != old["request_hash"]
    assert value(ex, "priority-request")["params"]["intent"]["priority"] == 2


def check_hashes(ex: Examples) -> None:
    """The hashes the document shows are those §5 and §6.2 define."""
    hello = value(ex, "hello")["params"]
    challenge = value(ex, "challenge")["result"]
    assert value(ex, "policy-payload")["hello_hash"] == encoding.hash_of(hello)
    assert value(ex, "proof-payload")["challenge_hash"] == encoding.hash_of(challenge)
    policy = value(ex, "policy")["result"]
    assert policy["policy_hash"] == encoding.hash_of(policy["policy"]) == challenge["policy_hash"]
    assert challenge["manifest_hash"] == encoding.hash_of(pe.server_card(pe.server_identity()))
    for request, payload in (
        ("intent-request", "response-payload"),
        ("error-request", "error-payload"),
        ("stream-request", "event-payload-first"),
        ("close-request", "closed-payload"),
    ):
        assert value(ex, payload)["request_hash"] == request_hash(value(ex, request)["params"]["request_jws"])
    for _answer, payload, request in EXT_PAYLOADS:
        assert value(ex, payload)["request_hash"] == request_hash(value(ex, request)["params"]["request_jws"])


async def replay_server(ex: Examples) -> None:
    """The documented client messages, sent to a fresh server, get exactly the documented answers."""
    clock = FakeClock(float(pe.T0))
    runs: list[Any] = []
    server: ServerProtocol = pe.make_server(clock, runs)
    for name, _endpoint, answer, _parse in REQUESTS:
        body = value(ex, name)
        clock.now = pe.AT[STEP_TIME[name]]
        reply = await server.handle(body["method"], copy.deepcopy(body["params"]))
        assert reply.http_status == http_of(ex, answer), (name, reply.http_status, reply.error)
        if reply.stream is not None:
            frames = [
                f"id: {i}\ndata: {encode_result(body['id'], event).decode()}\n"
                for i, event in enumerate([e async for e in reply.stream])
            ]
            assert "\n".join(frames) == ex[answer][2], f"{answer} differs from the server's"
            continue
        assert same_json(answer_body(body["id"], reply), value(ex, answer)), (
            f"{answer} differs from the server's"
        )
    # The same close again: the session is gone, an unsigned -32043.
    close = value(ex, "close-request")
    clock.now = pe.AT["unsigned"]
    reply = await server.handle("close", close["params"])
    assert reply.http_status == http_of(ex, "unsigned-error")
    assert same_json(answer_body(close["id"], reply), value(ex, "unsigned-error"))

    # §12 on two more sessions, opened as the generator opens them. A real client signs the
    # documented intents into exactly the documented requests and accepts the answers.
    sessions = {
        2: await pe.open_session(server, clock, pe.AT["handshake_2"], b"a2a-secure example client random 2"),
        3: await pe.open_session(server, clock, pe.AT["handshake_3"], b"a2a-secure example client random 3"),
    }
    for name, answer, number, step in EXT_REQUESTS:
        body, session = value(ex, name), sessions[number]
        clock.now = pe.AT[step]
        req = session.prepare_intent(body["params"]["intent"])
        assert same_json(req.params, body["params"]), name
        reply = await server.handle(body["method"], copy.deepcopy(body["params"]))
        assert reply.http_status == http_of(ex, answer), (name, reply.http_status, reply.error)
        assert same_json(answer_body(body["id"], reply), value(ex, answer)), (
            f"{answer} differs from the server's"
        )
        documented = value(ex, answer)
        if "result" in documented:
            session.verify_result(req, documented["result"])
        else:
            err = session.error_from_reply(req, documented["error"])
            assert err.signed and err.code == -32044
    # The intent sent twice under one intent_id ran once; the priority-2 intent ran at 2.
    intent_id = value(ex, "intent-id-request")["params"]["intent"]["intent_id"]
    assert [(r.goal, r.sequence) for r in runs if r.intent_id == intent_id] == [("echo", 1)]
    priority = value(ex, "priority-request")["params"]
    assert [r.priority for r in runs if (r.session_id, r.sequence) == (priority["session_id"], 2)] == [2]
    assert [r.goal for r in runs] == ["echo", "count", "count", "echo", "echo"]


def replay_client(ex: Examples) -> None:
    """The documented server answers, fed to a fresh client, give exactly the documented requests."""
    clock = FakeClock(float(pe.T0))
    server_did = value(ex, "challenge")["result"]["server_did"]
    hs = ClientHandshake(
        pe.client_identity(), resolve_did_key(server_did), clock=clock, random_bytes=pe.client_random()
    )
    clock.now = pe.AT["hello"]
    assert same_json(hs.hello(), value(ex, "hello")["params"])
    clock.now = pe.AT["proof"]
    assert same_json(hs.receive_challenge(value(ex, "challenge")["result"]), value(ex, "proof")["params"])
    clock.now = pe.AT["accept_policy"]
    assert same_json(hs.receive_policy(value(ex, "policy")["result"]), value(ex, "accept-policy")["params"])
    session: ClientSession = hs.receive_session(value(ex, "session")["result"])

    def prepare(name: str, step: str) -> PreparedRequest:
        clock.now = pe.AT[step]
        documented = value(ex, name)["params"]
        req = session.prepare_intent(documented["intent"])
        assert same_json(req.params, documented), name
        return req

    req = prepare("intent-request", "intent")
    result = session.verify_result(req, value(ex, "intent-result")["result"])
    assert result.result == value(ex, "intent-request")["params"]["intent"]["inputs"]  # echo (§11)

    req = prepare("error-request", "error")
    err = session.error_from_reply(req, value(ex, "error-result")["error"])
    assert err.signed and isinstance(err, InvalidParams)

    req = prepare("stream-request", "stream")
    events = sse_events(ex["stream-body"][2])
    verified = [session.verify_event(req, e["result"], i) for i, e in enumerate(events)]
    assert [v.result for v in verified] == [{"i": 0}, {"i": 1}, None]
    assert [v.final for v in verified] == [False, False, True]
    assert events[0] == value(ex, "stream-event-first") and events[-1] == value(ex, "stream-event-final")

    clock.now = pe.AT["close"]
    close = session.prepare_close()
    assert same_json(close.params, value(ex, "close-request")["params"])
    session.verify_closed(close, value(ex, "closed-result")["result"])
    assert session.closed

    clock.now = pe.AT["unsigned"]
    unsigned = session.error_from_reply(close, value(ex, "unsigned-error")["error"])
    assert unsigned.code == -32043 and not unsigned.signed


# -- the tests --------------------------------------------------------------------------------
def test_every_message_kind_is_documented_once() -> None:
    expected = set(asyncio.run(pe.generate()))
    assert set(DOCUMENTED) == expected
    assert TEXT.count("<!-- example:") == len(DOCUMENTED)


def test_examples_are_what_the_code_produces_today() -> None:
    generated = asyncio.run(pe.generate())
    for name, example in generated.items():
        assert example.render() in TEXT, f"{name}: run scripts/protocol_examples.py --update docs/PROTOCOL.md"


def test_documented_requests_pass_the_server_models() -> None:
    check_requests_parse(DOCUMENTED)


def test_documented_answers_pass_the_client_models() -> None:
    check_answers_parse(DOCUMENTED)


def test_documented_tokens_verify_with_the_documented_keys() -> None:
    check_tokens_verify(DOCUMENTED)


def test_intent_id_resend_carries_the_first_result_for_the_new_request() -> None:
    check_intent_id_resend(DOCUMENTED)


def test_documented_hashes_follow_the_definitions() -> None:
    check_hashes(DOCUMENTED)


async def test_server_answers_the_documented_requests_exactly() -> None:
    await replay_server(DOCUMENTED)


def test_client_accepts_the_documented_answers_and_sends_the_documented_requests() -> None:
    replay_client(DOCUMENTED)


def _drift(name: str, edit: Callable[[Any], None]) -> Examples:
    """The documented examples with one edited."""
    ex = dict(DOCUMENTED)
    lang, http, _body = ex[name]
    obj = value(ex, name)
    edit(obj)
    ex[name] = (lang, http, json.dumps(obj, indent=2))
    return ex


def _rename(path: list[str], old: str, new: str) -> Callable[[Any], None]:
    def edit(obj: Any) -> None:
        for part in path:
            obj = obj[part]
        obj[new] = obj.pop(old)

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "check"),
    [
        ("hello", _rename(["params"], "nonce", "nonce_a"), check_requests_parse),
        ("intent-request", _rename(["params", "intent"], "inputs", "input"), check_requests_parse),
        ("session", _rename(["result"], "expires_at", "expiry"), check_answers_parse),
        ("request-payload", _rename([], "timestamp", "iat"), check_tokens_verify),
        ("challenge", _rename(["result"], "policy_hash", "policy_digest"), replay_client),
        ("intent-id-request", _rename(["params", "intent"], "intent_id", "intentId"), check_requests_parse),
        ("priority-request", _rename(["params", "intent"], "priority", "prio"), check_requests_parse),
        ("intent-id-resend-result", _rename(["result"], "response_jws", "response"), check_answers_parse),
        ("intent-id-resend-payload", _rename([], "request_hash", "hash"), check_tokens_verify),
    ],
)
def test_a_drifted_document_fails_the_checks(name: str, edit: Callable[[Any], None], check: Any) -> None:
    with pytest.raises((A2AError, AssertionError, KeyError)):
        check(_drift(name, edit))


@pytest.mark.parametrize(
    ("name", "path", "old", "new"),
    [
        ("policy", ["result"], "policy_signature", "signature"),
        ("intent-id-conflict-error", ["error"], "message", "reason"),
    ],
)
async def test_a_drifted_answer_fails_the_server_replay(
    name: str, path: list[str], old: str, new: str
) -> None:
    drifted = _drift(name, _rename(path, old, new))
    with pytest.raises(AssertionError):
        await replay_server(drifted)


# -- §7 and citations ---------------------------------------------------------------------------
def _section(number: str) -> str:
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", TEXT, re.MULTILINE | re.DOTALL)
    assert match is not None, f"no section {number}"
    return match[0]


def _table_rows(section: str) -> set[tuple[int, int, str]]:
    return {
        (int(code), int(http), name)
        for code, http, name in re.findall(r"^\| (-\d+) \| (\d{3}) \| `?(\w+)`? \|", section, re.MULTILINE)
    }


def test_the_error_table_lists_every_error_class_with_its_status() -> None:
    rows = _table_rows(_section("7"))
    classes = {
        (cls.code, cls.http_status, cls.__name__)
        for name in errors.__all__
        if inspect.isclass(cls := getattr(errors, name)) and issubclass(cls, A2AError) and cls is not A2AError
    }
    assert rows == classes


def test_the_a2a_error_table_matches_the_binding() -> None:
    binding = pytest.importorskip("a2a_secure.a2a_binding.errors")
    rows = _table_rows(_section("10"))
    classes = {
        (cls.code, cls.http_status, cls.reason)
        for name in binding.__all__
        if inspect.isclass(cls := getattr(binding, name))
        and issubclass(cls, binding.A2AProtocolError)
        and cls is not binding.A2AProtocolError
    }
    assert classes and rows == classes


HEADINGS = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", TEXT, re.MULTILINE))
# A section number, not one of an RFC ("RFC 4648 §5").
CITATION = re.compile(r"(?<!RFC \d{4} )§(\d+(?:\.\d+)?)")


def test_sections_are_numbered_as_the_base_contract() -> None:
    expected = (
        {str(n) for n in range(1, 13)} | {f"5.{n}" for n in range(1, 7)} | {f"6.{n}" for n in range(1, 5)}
    )
    assert expected <= HEADINGS
    assert "Extensions of this implementation (additive, optional)" in _section("12")


@pytest.mark.parametrize("path", ["SECURITY.md", "README.md"])
def test_sections_cited_in_the_project_docs_exist(path: str) -> None:
    cited = set(CITATION.findall((REPO / path).read_text(encoding="utf-8")))
    assert cited, path
    assert cited <= HEADINGS, sorted(cited - HEADINGS)


def test_sections_cited_in_the_code_exist() -> None:
    cited: dict[str, str] = {}
    for source in sorted((REPO / "a2a_secure").rglob("*.py")):
        for number in CITATION.findall(source.read_text(encoding="utf-8")):
            cited.setdefault(number, str(source.relative_to(REPO)))
    missing = {n: where for n, where in cited.items() if n not in HEADINGS}
    assert not missing


def test_the_readme_and_security_point_to_the_document() -> None:
    assert "docs/PROTOCOL.md" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/PROTOCOL.md" in (REPO / "SECURITY.md").read_text(encoding="utf-8").split("\n\n")[1]


# -- §12: the names a card's a2a_secure_extensions may hold ------------------------------------
def test_the_extension_table_names_every_extension_the_code_declares_or_reads() -> None:
    from a2a_secure.client.extensions import parse_extensions
    from a2a_secure.protocol.intent_id import CARD_MEMBER, INTENT_ID
    from a2a_secure.protocol.priority import EXTENSION as PRIORITY
    from a2a_secure.protocol.sealing import SEALED
    from a2a_secure.protocol.server import ServerLimits
    from a2a_secure.runtime.exactly_once import server_extensions
    from a2a_secure.store.memory import MemoryStore

    table = dict(re.findall(r"^\| `(\w+)` \| (§12\.\d) \|", _section("12"), re.MULTILINE))
    assert {INTENT_ID: "§12.5", PRIORITY: "§12.3"}.items() <= table.items()
    # What a server of this implementation lists, with intent_id on and off, as the text says.
    # Sealing is on by default (§12.6), so the defaults list it.
    listed = server_extensions(ServerLimits(), MemoryStore())
    assert {INTENT_ID, PRIORITY, SEALED} <= set(listed) <= set(table)
    assert server_extensions(ServerLimits(intent_id_retention=0), MemoryStore()) == [
        x for x in listed if x != INTENT_ID
    ]
    plain = server_extensions(ServerLimits(sealed_intents=False), MemoryStore())
    assert plain == [x for x in listed if x != SEALED]
    assert f"`{json.dumps(listed)}`" in _section("12")
    # The examples of sections 5 to 11 are those of a server that turned sealing off.
    assert value(DOCUMENTED, "agent-card")[CARD_MEMBER] == plain
    # A client ignores a name it does not know: it is read, and never taken for one it knows.
    assert parse_extensions({CARD_MEMBER: ["later-extension", PRIORITY]}) == {"later-extension", PRIORITY}
    # §12.6: a server that seals lists it too, under the name the table gives it.
    assert table[SEALED] == "§12.6"
    assert SEALED in server_extensions(ServerLimits(sealed_intents=True), MemoryStore())


def test_the_documented_card_is_the_one_the_challenge_signs() -> None:
    card = value(DOCUMENTED, "agent-card")
    assert http_of(DOCUMENTED, "agent-card") == 200
    assert encoding.hash_of(card) == value(DOCUMENTED, "challenge")["result"]["manifest_hash"]
    assert card["url"] == pe.server_card(pe.server_identity())["url"]


# -- §1, §5.6, §9: rules a second implementation needs, checked against the code -----------------
def test_the_did_examples_of_section_9_are_what_the_code_accepts() -> None:
    from a2a_secure.identity.did import check_did_syntax

    match = re.search(r"So (.*?) are DIDs;\n?\s*(.*?) are\s+not\.", _section("9"), re.DOTALL)
    assert match is not None
    valid, invalid = (re.findall(r"`([^`]+)`", part) for part in match.groups())
    assert valid and invalid
    for did in valid:
        assert check_did_syntax(did.replace("…", "abc")) == did.replace("…", "abc")
    for did in invalid:
        with pytest.raises(InvalidParams):
            check_did_syntax(did.replace("…", "abc"))


def test_a_timestamp_exactly_300_s_off_is_still_fresh() -> None:
    from a2a_secure.checks import is_fresh

    assert "exactly 300 s off, in either direction, is still fresh; 301 s is not" in _section("1")
    assert is_fresh(1000, 1300) and is_fresh(1300, 1000) and is_fresh(1000, 1300.99)
    assert not is_fresh(1000, 1301) and not is_fresh(1301, 1000)


@pytest.mark.parametrize(
    "session_id",
    [
        "zASjY71qIwW82QI3XK44gj_EioObc8g7YJ8Zz4fAYHw=",
        "zASjY71qIwW82QI3XK44gj_EioObc8g7YJ8Zz4fAYH",
        "zASjY71qIwW82QI3XK44gj_EioObc8g7YJ8Zz4fAYHx",
    ],
    ids=["padded", "short", "non-canonical"],
)
def test_a_session_id_of_another_form_is_32602(session_id: str) -> None:
    params = value(DOCUMENTED, "intent-request")["params"]
    assert models.IntentRequest.parse(params).session_id == params["session_id"]
    with pytest.raises(InvalidParams):
        models.IntentRequest.parse({**params, "session_id": session_id})
