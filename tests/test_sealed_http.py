"""Sealed intents end to end (PROTOCOL.md §12.6): a real uvicorn server, real clients.

Every attack here is made with real keys: where an attacker would need the client's
identity key to get past the signature (which is checked first), the test signs with it, to
show the AEAD refuses on its own. Each refusal leaves the handler unrun.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import nacl.bindings
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from http_helpers import JSON, SECRET, AuditLog, build_server, envelope, identity

from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient
from a2a_secure.errors import (
    A2AError,
    InvalidParams,
    PolicyViolation,
    SequenceError,
    Unavailable,
    error_for_code,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import sealing
from a2a_secure.protocol.client import ClientHandshake, ClientSession, PreparedRequest
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app

SEALED = ServerLimits(sealed_intents=True)
PLAIN = ServerLimits(sealed_intents=False)  # a server that turned sealing off
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


def sealed_server(limits: ServerLimits = SEALED, name: str = "sealed-server") -> AgentServer:
    server = build_server(identity(name), limits=limits, audit=AuditLog())

    @server.intent("leaky")
    def leaky(inputs: dict[str, Any]) -> Any:
        server.calls["leaky"] += 1  # type: ignore[attr-defined]
        raise PolicyViolation("not for you", data={"detail": SECRET})

    @server.intent("count")
    async def count(inputs: dict[str, Any]) -> AsyncIterator[Any]:
        server.calls["count"] += 1  # type: ignore[attr-defined]
        for i in range(inputs["n"]):
            yield {"i": i, "secret": SECRET}

    return server


class Wire:
    """An HTTP client that records every body it sends and receives (a passive tap)."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.recorded: list[bytes] = []

    async def post(self, path: str, body: bytes) -> httpx.Response:
        self.recorded.append(body)
        resp = await self.http.post(self.url + path, content=body, headers=JSON)
        self.recorded.append(resp.content)
        return resp

    async def call(self, method: str, params: Any, rid: int = 1) -> httpx.Response:
        path = "/a2a/intent" if method in ("intent", "close") else "/a2a/handshake"
        return await self.post(path, envelope(method, params, rid))

    def holds(self, needle: str) -> bool:
        return any(needle.encode() in chunk for chunk in self.recorded)


async def handshake(
    wire: Wire,
    client: Identity,
    server_did: str,
    *,
    seal: bool = True,
    accept: Callable[[dict[str, Any]], Any] | None = None,
) -> ClientSession:
    """The handshake over the wire, bringing a seal_key when ``seal`` (§12.6)."""
    hs = ClientHandshake(client, resolve_did_key(server_did))
    msg = hs.hello()
    for method in ("hello", "proof", "accept_policy"):
        if method == "accept_policy" and accept is not None:
            msg = accept(msg)
        resp = await wire.call(method, msg)
        body = resp.json()
        if "error" in body:
            raise error_for_code(body["error"]["code"], body["error"]["message"])
        result = body["result"]
        if method == "hello":
            msg = hs.receive_challenge(result)
            hs.seal = seal
        elif method == "proof":
            msg = hs.receive_policy(result)
        else:
            return hs.receive_session(result)
    raise AssertionError("unreachable")


def forged(session: ClientSession, sequence: int, intent: dict[str, Any]) -> dict[str, Any]:
    """Params for ``intent`` at ``sequence``, signed with the client's own identity key."""
    common = {
        "session_id": session.session_id,
        "session_commitment": session.session_commitment,
        "sequence": sequence,
    }
    signed = dict(intent)
    if isinstance(intent.get("sealed"), str):  # §12.6: the payload signs the sealed inputs' digest
        signed["sealed"] = m.sealed_digest(intent["sealed"])
    payload = {**common, "timestamp": int(time.time()), "intent": signed}
    return {**common, "intent": intent, "request_jws": jws_sign(payload, session.identity, m.Typ.REQUEST)}


def resigned_accept(client: Identity, **changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An ACCEPT_POLICY whose signed payload has ``changes``, signed again by ``client``."""

    def change(msg: dict[str, Any]) -> dict[str, Any]:
        payload = jws_decode_unverified(msg["accept_jws"])[1]
        payload.update(changes)
        return {**msg, "accept_jws": jws_sign(payload, client, m.Typ.ACCEPT)}

    return change


@contextlib.asynccontextmanager
async def running(server: AgentServer) -> AsyncIterator[Wire]:
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        yield Wire(http, url)


async def sealed_env(server: AgentServer, wire: Wire, name: str = "client") -> ClientSession:
    session = await handshake(wire, identity(name), server.identity.did)
    assert session.sealed
    return session


def error_of(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert "error" in body, body
    return body["error"]  # type: ignore[no-any-return]


# -- the extension and the handshake --------------------------------------------------------
async def test_the_card_declares_sealed_only_when_it_is_on() -> None:
    assert "sealed" in sealed_server().card["a2a_secure_extensions"]
    assert "sealed" not in build_server(identity("plain"), limits=PLAIN).card["a2a_secure_extensions"]


async def test_a_sealed_session_hides_inputs_and_results_from_the_wire() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await wire.call("intent", req.params)
        assert resp.status_code == 200
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": {"text": SECRET}}
        assert not wire.holds(SECRET) and not wire.holds("hunter2")
        # The signed payloads carry the sealed form, not the plaintext.
        assert isinstance(jws_decode_unverified(req.params["request_jws"])[1]["intent"]["sealed"], str)
        assert isinstance(resp.json()["result"]["result"], str)


async def test_without_sealing_the_same_traffic_shows_the_secret() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await handshake(wire, identity("client"), server.identity.did, seal=False)
        assert not session.sealed
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await wire.call("intent", req.params)
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": {"text": SECRET}}
        assert wire.holds(SECRET)


async def test_a_seal_key_to_a_server_that_does_not_declare_sealing_is_refused() -> None:
    server = build_server(identity("plain"), limits=PLAIN, audit=AuditLog())
    async with running(server) as wire:
        with pytest.raises(A2AError, match="unexpected member 'seal_key'") as info:
            await handshake(wire, identity("client"), server.identity.did)
        assert info.value.code == -32040
        assert isinstance(server.store, MemoryStore) and not server.store._sessions


@pytest.mark.parametrize("length", [16, 31, 33])
async def test_a_seal_key_of_the_wrong_length_is_refused_at_accept(length: int) -> None:
    server = sealed_server()
    client = identity("client")
    async with running(server) as wire:
        change = resigned_accept(client, seal_key=encoding.b64u_encode(b"\x09" * length))
        with pytest.raises(A2AError, match="seal_key") as info:
            await handshake(wire, client, server.identity.did, accept=change)
        assert info.value.code == -32040


async def test_a_low_order_seal_key_is_refused_at_accept() -> None:
    server = sealed_server()
    client = identity("client")
    async with running(server) as wire:
        change = resigned_accept(client, seal_key=encoding.b64u_encode(bytes(32)))
        with pytest.raises(A2AError, match="X25519") as info:
            await handshake(wire, client, server.identity.did, accept=change)
        assert info.value.code == -32040


# -- attacks on the intent path -------------------------------------------------------------------
async def test_tampered_ciphertext_is_refused_and_nothing_runs() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        intent = dict(req.params["intent"])
        raw = bytearray(encoding.b64u_decode(intent["sealed"]))
        raw[3] ^= 0x20
        intent["sealed"] = encoding.b64u_encode(bytes(raw))
        # Unsigned tampering breaks the signature ...
        resp = await wire.call("intent", {**req.params, "intent": intent})
        assert resp.status_code == 401 and error_of(resp)["code"] == -32040
        # ... and tampering signed again with the client's own key does not open.
        resp = await wire.call("intent", forged(session, req.sequence, intent))
        err = error_of(resp)
        assert resp.status_code == 401 and err["code"] == -32040 and "does not open" in err["message"]
        assert "response_jws" in err["data"]  # a signed refusal: from step 5 on
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]
        # The sequence was not used up: the honest request at it still runs.
        resp = await wire.call("intent", req.params)
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": {"text": SECRET}}


async def test_a_sealed_body_moved_to_another_sequence_is_refused() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        first = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await wire.call("intent", forged(session, first.sequence + 1, first.params["intent"]))
        assert error_of(resp)["code"] == -32040 and "does not open" in error_of(resp)["message"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_a_sealed_body_moved_to_another_session_is_refused() -> None:
    server = sealed_server()
    async with running(server) as wire:
        one = await sealed_env(server, wire)
        two = await sealed_env(server, wire)
        req = one.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await wire.call("intent", forged(two, req.sequence, req.params["intent"]))
        assert error_of(resp)["code"] == -32040 and "does not open" in error_of(resp)["message"]
        # The whole request replayed into the other session: refused before its signature.
        resp = await wire.call("intent", {**req.params, "session_id": two.session_id})
        assert error_of(resp)["code"] in (-32040, -32043)
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_a_sealed_result_reflected_as_inputs_is_refused() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        answer = (await wire.call("intent", req.params)).json()["result"]
        assert server.calls["echo"] == 1  # type: ignore[attr-defined]
        reflected = {"goal": "echo", "inputs": {}, "sealed": answer["result"]}
        resp = await wire.call("intent", forged(session, req.sequence + 1, reflected))
        assert error_of(resp)["code"] == -32040 and "does not open" in error_of(resp)["message"]
        assert server.calls["echo"] == 1  # type: ignore[attr-defined]


async def test_a_replayed_sealed_request_gets_the_stored_sealed_answer_and_runs_once() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        first = await wire.call("intent", req.params, rid=1)
        again = await wire.call("intent", req.params, rid=1)
        assert first.content == again.content  # byte for byte
        assert server.calls["echo"] == 1  # type: ignore[attr-defined]
        # What the store keeps for that retry is the sealed form, never the plaintext.
        assert SECRET not in repr(server.store.__dict__)
        assert not wire.holds(SECRET)


async def test_a_result_moved_to_another_request_does_not_open_at_the_client() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        one = session.prepare_intent({"goal": "echo", "inputs": {"text": "one"}})
        answer = (await wire.call("intent", one.params)).json()["result"]
        two = session.prepare_intent({"goal": "echo", "inputs": {"text": "two"}})
        with pytest.raises(A2AError) as info:  # its signature names the other request first
            session.verify_result(two, answer)
        assert info.value.code == -32040


# -- what the signatures cover: a sealed value by its digest -----------------------------------
async def test_the_signed_payloads_carry_digests_and_the_ciphertext_travels_once() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        inputs = {"text": SECRET * 400}
        req = session.prepare_intent({"goal": "echo", "inputs": inputs})
        sealed_inputs = req.params["intent"]["sealed"]
        signed = jws_decode_unverified(req.params["request_jws"])[1]
        assert signed["intent"] == {**req.params["intent"], "sealed": m.sealed_digest(sealed_inputs)}
        # The signed request does not grow with the inputs: they are in params only.
        assert len(req.params["request_jws"]) < 1200 < len(sealed_inputs)
        answer = (await wire.call("intent", req.params)).json()["result"]
        payload = jws_decode_unverified(answer["response_jws"])[1]
        assert payload["result"] == m.sealed_digest(answer["result"])
        assert len(answer["response_jws"]) < 1200 < len(answer["result"])
        assert session.verify_result(req, answer).result == {"echo": inputs}


async def test_a_payload_signing_the_ciphertext_instead_of_its_digest_is_refused() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        common = {k: req.params[k] for k in ("session_id", "session_commitment", "sequence")}
        payload = {**common, "timestamp": int(time.time()), "intent": req.params["intent"]}
        token = jws_sign(payload, session.identity, m.Typ.REQUEST)
        resp = await wire.call("intent", {**common, "intent": req.params["intent"], "request_jws": token})
        err = error_of(resp)
        assert resp.status_code == 401 and err["code"] == -32040 and "does not match" in err["message"]
        assert "response_jws" in err["data"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]
        resp = await wire.call("intent", req.params)  # the sequence was not used up
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": {"text": SECRET}}


async def test_ciphertext_swapped_under_a_signed_digest_is_refused_and_nothing_runs() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        assert session.sealer is not None
        # Sealed inputs that would open at this very place, but are not the ones signed.
        other = session.sealer.seal_inputs(req.sequence, "echo", {"text": "swapped"})
        resp = await wire.call("intent", {**req.params, "intent": {**req.params["intent"], "sealed": other}})
        err = error_of(resp)
        assert resp.status_code == 401 and err["code"] == -32040 and "does not match" in err["message"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_a_result_or_event_swapped_for_another_sealed_value_is_refused_by_the_client() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        assert session.sealer is not None
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        answer = (await wire.call("intent", req.params)).json()["result"]
        # A value that opens at this place: only the signed digest tells it from the real one.
        swapped = session.sealer.seal_result(req.sequence, req.request_hash, {"echo": {"text": "swapped"}})
        for result in (swapped, {"echo": {"text": "swapped"}}, None):
            with pytest.raises(A2AError) as info:
                session.verify_result(req, {**answer, "result": result})
            assert info.value.code == -32040 and "differs from the signed result" in info.value.message
        assert session.verify_result(req, answer).result == {"echo": {"text": SECRET}}

        req = session.prepare_intent({"goal": "count", "inputs": {"n": 2}, "constraints": {"stream": True}})
        resp = await wire.call("intent", req.params)
        lines = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
        events = [encoding.loads(line)["result"] for line in lines]
        swapped = session.sealer.seal_event(req.sequence, req.request_hash, 1, False, {"i": 1, "secret": "x"})
        with pytest.raises(A2AError) as info:
            session.verify_event(req, {**events[1], "result": swapped}, 1)
        assert info.value.code == -32040 and "differs from the signed one" in info.value.message
        assert session.verify_event(req, events[1], 1).result == {"i": 1, "secret": SECRET}


async def test_sealed_inputs_as_large_as_plain_ones_go_through() -> None:
    from a2a_secure.protocol.client import MAX_INPUT_BYTES

    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        inputs = {"text": "s" * (MAX_INPUT_BYTES - len('{"text":""}'))}
        req = session.prepare_intent({"goal": "echo", "inputs": inputs})
        resp = await wire.call("intent", req.params)
        assert resp.status_code == 200
        assert session.verify_result(req, resp.json()["result"]).result == {"echo": inputs}


async def test_a_plain_intent_on_a_sealed_session_is_refused_signed() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        resp = await wire.call("intent", forged(session, 1, {"goal": "echo", "inputs": {"text": SECRET}}))
        err = error_of(resp)
        assert resp.status_code == 400 and err["code"] == -32602 and "session is sealed" in err["message"]
        assert "response_jws" in err["data"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_sealed_inputs_on_a_session_without_keys_are_refused() -> None:
    server = sealed_server()
    async with running(server) as wire:
        plain = await handshake(wire, identity("client"), server.identity.did, seal=False)
        intent = {"goal": "echo", "inputs": {}, "sealed": encoding.b64u_encode(b"\x01" * 40)}
        resp = await wire.call("intent", forged(plain, 1, intent))
        err = error_of(resp)
        assert resp.status_code == 400 and err["code"] == -32602 and "no sealing keys" in err["message"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_sealed_members_to_a_server_that_does_not_declare_the_extension_are_refused() -> None:
    server = build_server(identity("plain"), limits=PLAIN, audit=AuditLog())
    async with running(server) as wire:
        plain = await handshake(wire, identity("client"), server.identity.did, seal=False)
        intent = {"goal": "echo", "inputs": {}, "sealed": encoding.b64u_encode(b"\x01" * 40)}
        resp = await wire.call("intent", forged(plain, 1, intent))
        err = error_of(resp)
        # Step 1, as any unknown member of intent: unsigned, and the sequence is not used up.
        assert resp.status_code == 400 and err["code"] == -32602 and "sealed" in err["message"]
        assert "data" not in err or "response_jws" not in err["data"]
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_error_data_travels_sealed_and_opens_for_the_client() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "leaky", "inputs": {}})
        resp = await wire.call("intent", req.params)
        assert not wire.holds(SECRET)
        exc = session.error_from_reply(req, error_of(resp))
        assert exc.signed and exc.code == -32042 and exc.data == {"detail": SECRET}


async def test_stream_events_travel_sealed() -> None:
    server = sealed_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "count", "inputs": {"n": 3}, "constraints": {"stream": True}})
        resp = await wire.call("intent", req.params)
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert not wire.holds(SECRET)
        events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
        got = [session.verify_event(req, encoding.loads(e)["result"], i) for i, e in enumerate(events)]
        assert [e.result for e in got] == [
            {"i": 0, "secret": SECRET},
            {"i": 1, "secret": SECRET},
            {"i": 2, "secret": SECRET},
            None,
        ]
        # An event moved to another index does not verify (its signature, then its seal).
        with pytest.raises(A2AError):
            session.verify_event(req, encoding.loads(events[1])["result"], 0)


# -- the real client: default, downgrade, streams ---------------------------------------------
async def test_the_client_seals_by_default_when_the_server_declares_it() -> None:
    server = sealed_server()
    async with serve_app(server.app()) as url, A2AClient(identity("alice")) as alice:
        res = await alice.request(
            server.identity.did, {"goal": "echo", "inputs": {"x": SECRET}}, endpoint=url
        )
        assert res.result == {"echo": {"x": SECRET}}
        session = await alice.session_for(server.identity.did)
        assert session.sealed
        items = [
            item async for item in alice.stream(server.identity.did, {"goal": "count", "inputs": {"n": 2}})
        ]
        assert items == [{"i": 0, "secret": SECRET}, {"i": 1, "secret": SECRET}]
        with pytest.raises(PolicyViolation) as info:
            await alice.request(server.identity.did, {"goal": "leaky", "inputs": {}})
        assert info.value.signed and info.value.data == {"detail": SECRET}


async def test_sealed_true_refuses_a_server_that_does_not_declare_it() -> None:
    server = build_server(identity("plain"), limits=PLAIN, audit=AuditLog())
    async with serve_app(server.app()) as url, A2AClient(identity("alice"), sealed=True) as alice:
        with pytest.raises(InvalidParams, match="does not declare the sealed extension"):
            await alice.request(server.identity.did, {"goal": "echo", "inputs": {"x": SECRET}}, endpoint=url)
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]
        assert isinstance(server.store, MemoryStore) and not server.store._sessions  # no session opened


async def test_sealed_true_refuses_a_card_stripped_of_the_extension() -> None:
    # An attacker on the path serves the card without "sealed": it no longer hashes to the
    # manifest hash the CHALLENGE signed, so nothing is known of it, and sealed=True refuses
    # (503: no card checked; the honest card, once it comes, is taken).
    server = sealed_server()
    honest = server.card_endpoint

    async def stripped(request: Any) -> Any:
        from starlette.responses import JSONResponse

        card = dict(server.card)
        card["a2a_secure_extensions"] = [x for x in card["a2a_secure_extensions"] if x != "sealed"]
        return JSONResponse(card)

    server.card_endpoint = stripped  # type: ignore[method-assign]
    async with serve_app(server.app()) as url, A2AClient(identity("alice"), sealed=True) as alice:
        with pytest.raises(Unavailable, match="could not be checked for the sealed extension"):
            await alice.request(server.identity.did, {"goal": "echo", "inputs": {"x": SECRET}}, endpoint=url)
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]
    server.card_endpoint = honest  # type: ignore[method-assign]


async def test_sealed_false_never_seals() -> None:
    server = sealed_server()
    async with serve_app(server.app()) as url, A2AClient(identity("alice"), sealed=False) as alice:
        await alice.request(server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        assert not (await alice.session_for(server.identity.did)).sealed


# -- forward secrecy ---------------------------------------------------------------------------
def _try_open(keys: sealing.SessionKeys, session_id: str, req: PreparedRequest, sealed: str) -> Any:
    goal = jws_decode_unverified(req.params["request_jws"])[1]["intent"]["goal"]
    return sealing.SessionSealer(keys, session_id).open_inputs(req.sequence, goal, sealed)


async def test_forward_secrecy_identity_keys_do_not_open_recorded_traffic() -> None:
    server = sealed_server()
    client = identity("client")
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
        resp = await wire.call("intent", req.params)
        answer = resp.json()["result"]
        record = server.store._sessions[session.session_id]  # the keys as the server holds them
        session_keys = sealing.SessionKeys.from_bytes(record.seal_keys)
        close = session.prepare_close()
        closed = await wire.call("close", close.params)
        session.verify_closed(close, closed.json()["result"])
        # The keys are gone from the server's store and from the client's session.
        assert session.session_id not in server.store._sessions and session.sealer is None
    assert not wire.holds(SECRET)

    # The attacker holds the recorded bytes and, later, both identity keys.
    accept = next(encoding.loads(c) for c in wire.recorded if b'"accept_policy"' in c)
    accept_payload = jws_decode_unverified(accept["params"]["accept_jws"])[1]
    session_msg = next(encoding.loads(c)["result"] for c in wire.recorded if b'"session_jws"' in c)
    session_payload = jws_decode_unverified(session_msg["session_jws"])[1]
    # Both seal_keys are public: signed payloads of the recorded handshake.
    client_seal, server_seal = accept_payload["seal_key"], session_payload["seal_key"]
    sealed_inputs = req.params["intent"]["sealed"]
    the_transcript = sealing.transcript(
        client_did=client.did,
        server_did=server.identity.did,
        nonce_a=accept_payload["nonce_a"],
        nonce_b=accept_payload["nonce_b"],
        session_id=session.session_id,
        session_commitment=session.session_commitment,
        client_seal_key=client_seal,
        server_seal_key=server_seal,
    )
    stolen = [encoding.b64u_decode(who.private_key_b64u()) for who in (client, server.identity)]
    for seed in stolen:
        # Every way the identity keys could enter the key schedule: as key material, as X25519
        # scalars (the seed, and its birational Curve25519 form) against either seal_key.
        ed_secret = nacl.bindings.crypto_sign_seed_keypair(seed)[1]
        curve = nacl.bindings.crypto_sign_ed25519_sk_to_curve25519(ed_secret)
        candidates = [seed, curve]
        for private in (seed, curve):
            for public in (client_seal, server_seal):
                candidates.append(
                    X25519PrivateKey.from_private_bytes(private).exchange(
                        X25519PublicKey.from_public_bytes(encoding.b64u_decode(public))
                    )
                )
        for secret in candidates:
            keys = sealing.derive_keys(secret, the_transcript)
            with pytest.raises(A2AError, match="does not open"):
                _try_open(keys, session.session_id, req, sealed_inputs)
            with pytest.raises(A2AError, match="does not open"):
                sealing.SessionSealer(keys, session.session_id).open_result(
                    req.sequence, req.request_hash, answer["result"]
                )
    # The same recorded traffic with the session's keys (had they been kept) opens.
    assert _try_open(session_keys, session.session_id, req, sealed_inputs) == {"text": SECRET}
    assert sealing.SessionSealer(session_keys, session.session_id).open_result(
        req.sequence, req.request_hash, answer["result"]
    ) == {"echo": {"text": SECRET}}


# -- the command line ------------------------------------------------------------------------------
async def _call_cli(tmp_path: Path, url: str, did: str, *extra: str) -> tuple[int, str, str]:
    key = tmp_path / "caller.key"
    if not key.exists():
        identity("cli-caller").save(key)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "a2a_secure", "call", "--key-file", str(key), "--endpoint", url],
        *["--to", did, "--goal", "echo", "--inputs", json.dumps({"text": SECRET}), *extra],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_call_sealed_seals_with_a_server_that_declares_it_and_refuses_one_that_does_not(
    tmp_path: Path,
) -> None:
    sealed, plain = sealed_server(), build_server(identity("plain"), limits=PLAIN, audit=AuditLog())
    async with serve_app(sealed.app()) as sealed_url, serve_app(plain.app()) as plain_url:
        code, out, err = await _call_cli(tmp_path, sealed_url, sealed.identity.did, "--sealed")
        assert code == 0, err
        assert json.loads(out) == {"echo": {"text": SECRET}}
        code, out, err = await _call_cli(tmp_path, plain_url, plain.identity.did, "--sealed")
        assert code != 0 and "does not declare the sealed extension" in err and "Traceback" not in err
    assert sealed.calls["echo"] == 1 and plain.calls["echo"] == 0  # type: ignore[attr-defined]


def test_serve_seals_by_default_and_a_policy_file_turns_it_off_or_requires_it(tmp_path: Path) -> None:
    from a2a_secure.server.run import load_policy, load_scheduling

    assert load_scheduling(None)[1].sealed_intents is True  # no policy file: sealed
    path = tmp_path / "policy.json"
    path.write_text("{}")
    limits = load_scheduling(path)[1]
    assert limits.sealed_intents is True and limits.require_sealed is False
    path.write_text('{"sealed_intents": false, "allowed_intents": ["echo"]}')
    assert load_scheduling(path)[1].sealed_intents is False
    assert load_policy(path).allowed_intents == ("echo",)  # a server member, not a policy one
    path.write_text('{"require_sealed": true}')
    assert load_scheduling(path)[1].require_sealed is True
    assert "require_sealed" not in load_policy(path).to_dict()
    path.write_text('{"sealed_intents": "yes"}')
    with pytest.raises(ValueError, match="sealed_intents must be true or false"):
        load_scheduling(path)
    path.write_text('{"require_sealed": 1}')
    with pytest.raises(ValueError, match="require_sealed must be true or false"):
        load_scheduling(path)
    path.write_text('{"require_sealed": true, "sealed_intents": false}')
    with pytest.raises(ValueError, match="require_sealed needs sealed_intents"):
        load_scheduling(path)


# -- approvals over sealed sessions (PROTOCOL.md §12.1) -------------------------------------------
class RecordingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that keeps every request and response body it carried."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(await request.aread())
        resp = await self.inner.handle_async_request(request)
        body = await resp.aread()
        await resp.aclose()
        self.seen.append(body)
        return httpx.Response(resp.status_code, headers=resp.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_an_approval_travels_sealed_from_the_request_to_the_approver() -> None:
    # The caller's action data, the preview and data tool.pending shows the approver, and
    # the action's result all cross the wire sealed, each to its own session.
    from approval_helpers import CALLER, MAIL_OFFICER, PERSON, register_actions

    from a2a_secure.client.approval import approve, pending_action
    from a2a_secure.policy import Policy

    calls: Counter[str] = Counter()
    desk = AgentServer(
        identity("sealed-desk"),
        Policy.build(rate_limit=1000),
        name="desk",
        store=MemoryStore(),
        approvers=(PERSON.did,),
        serve_tools=True,
        limits=SEALED,
    )
    register_actions(desk, calls, mail_approvers=[MAIL_OFFICER.did])
    wire = RecordingTransport()
    title = "Board meeting: " + SECRET
    async with serve_app(desk.app()) as url, httpx.AsyncClient(transport=wire, timeout=10) as http:
        caller = A2AClient(CALLER, http=http, sealed=True)
        person = A2AClient(PERSON, http=http, sealed=True)
        asked = await caller.request(
            desk.identity.did, {"goal": "create_event", "inputs": {"title": title}}, endpoint=url
        )
        assert asked.result["needs_approval"] is True and title in asked.result["preview"]
        shown = await pending_action(person, desk.identity.did, asked.result["action_id"], endpoint=url)
        assert shown.action_data == {"title": title} and shown.caller_did == CALLER.did
        outcome = await approve(person, desk.identity.did, asked.result["action_id"], endpoint=url)
        assert outcome.approved and outcome.result["created"] == {"title": title}
        for client in (caller, person):
            assert (await client.session_for(desk.identity.did)).sealed
            await client.aclose()
    assert calls["run:create_event"] == 1
    assert len(wire.seen) > 10 and not any(SECRET.encode() in chunk for chunk in wire.seen)


# -- intent_id on sealed sessions (PROTOCOL.md §12.5 with §12.6) ---------------------------------
def exactly_once_server() -> AgentServer:
    server = sealed_server(name="sealed-eo")

    @server.intent("book")
    async def book(inputs: dict[str, Any]) -> Any:
        server.calls["book"] += 1  # type: ignore[attr-defined]
        return {"booked": inputs, "run": server.calls["book"]}  # type: ignore[attr-defined]

    return server


async def test_a_sealed_intent_with_an_intent_id_runs_once_across_sessions_and_restarts() -> None:
    server = exactly_once_server()
    did = server.identity.did
    intent = {"goal": "book", "inputs": {"room": SECRET}}
    async with serve_app(server.app()) as url:
        async with A2AClient(identity("alice"), sealed=True) as alice:
            first = await alice.request(did, intent, endpoint=url)
            assert first.intent_id is not None and first.result == {"booked": {"room": SECRET}, "run": 1}
            await alice.close_session(did)  # the resend goes on a new session, with new keys
            again = await alice.request(did, intent, intent_id=first.intent_id)
            assert again.result == first.result and again.sequence == 1
            with pytest.raises(SequenceError) as info:  # another intent under the same id
                await alice.request(
                    did, {"goal": "book", "inputs": {"room": "other"}}, intent_id=first.intent_id
                )
            assert info.value.signed
            # A stream, resent on a new session, gets the first run's events again.
            streamed = [
                x async for x in alice.stream(did, {"goal": "count", "inputs": {"n": 2}}, intent_id="S" * 22)
            ]
            await alice.close_session(did)
            replayed = [
                x async for x in alice.stream(did, {"goal": "count", "inputs": {"n": 2}}, intent_id="S" * 22)
            ]
            assert replayed == streamed and len(streamed) == 2
        # A new process of the same agent derives the same answer key from its identity.
        async with A2AClient(identity("alice"), sealed=True) as restarted:
            after = await restarted.request(did, intent, endpoint=url, intent_id=first.intent_id)
            assert after.result == first.result
    assert server.calls["book"] == 1 and server.calls["count"] == 1  # type: ignore[attr-defined]
    assert SECRET not in repr(server.store.__dict__)  # the kept answers are sealed, keyless


async def test_an_intent_id_without_its_sealed_key_is_refused_and_nothing_runs() -> None:
    server = exactly_once_server()
    async with running(server) as wire:
        session = await sealed_env(server, wire)
        req = session.prepare_intent({"goal": "book", "inputs": {"room": SECRET}, "intent_id": "K" * 22})
        intent = {k: v for k, v in req.params["intent"].items() if k != "sealed_key"}
        resp = await wire.call("intent", forged(session, req.sequence, intent))
        err = error_of(resp)
        assert resp.status_code == 400 and err["code"] == -32602 and "sealed_key" in err["message"]
        # A sealed_key moved to another intent_id does not open.
        moved = {**req.params["intent"], "intent_id": "L" * 22}
        resp = await wire.call("intent", forged(session, req.sequence, moved))
        assert error_of(resp)["code"] == -32040 and "does not open" in error_of(resp)["message"]
        assert server.calls["book"] == 0  # type: ignore[attr-defined]


async def test_a_sealed_key_to_a_server_that_does_not_declare_sealing_is_refused_unsigned() -> None:
    server = build_server(identity("plain"), limits=PLAIN, audit=AuditLog())
    async with running(server) as wire:
        plain = await handshake(wire, identity("client"), server.identity.did, seal=False)
        member = encoding.b64u_encode(b"\x02" * 48)
        intent = {
            "goal": "echo",
            "inputs": {},
            "sealed": encoding.b64u_encode(b"\x01" * 40),
            "sealed_key": member,
        }
        resp = await wire.call("intent", forged(plain, 1, intent))
        err = error_of(resp)
        assert resp.status_code == 400 and err["code"] == -32602 and "data" not in err
        assert server.calls["echo"] == 0  # type: ignore[attr-defined]


async def test_agents_as_tools_call_over_a_sealed_session() -> None:
    # The tools (and the MCP bridge over them) call through the agent's A2AClient, which
    # seals with an agent that declares it (A2AAgent(sealed=True) requires it).
    from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry

    server = sealed_server(name="tool-target")
    async with serve_app(server.app()) as url:
        registry = AgentRegistry()
        registry.add(RegistryEntry("target", server.identity.did, url))
        async with A2AAgent(
            "orchestrator", identity("orchestrator"), registry=registry, sealed=True
        ) as agent:
            echoed = await agent.call_tool("target__echo", {"text": SECRET})
            counted = await agent.call_tool("target__count", {"n": 2})
            assert (await agent.client.session_for(server.identity.did)).sealed
    assert echoed.status == counted.status == "success", (echoed, counted)
    assert SECRET in json.dumps(echoed.content) and SECRET in json.dumps(counted.content)
    assert server.calls["echo"] == 1 and server.calls["count"] == 1  # type: ignore[attr-defined]


async def test_a_blocked_card_fetch_speaks_for_one_client_and_one_server_only() -> None:
    # One client's handshake could not fetch the card (blocked once on the way): its
    # session is not sealed. That failure is not kept for the whole process: another
    # client handshaking a moment later fetches the card and seals.
    server = build_server(limits=ServerLimits(sealed_intents=True))
    app = server.app()
    blocked = [1]

    async def front(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/.well-known/agent-card.json" and blocked[0]:
            blocked[0] -= 1
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    async with serve_app(front) as url:
        async with A2AClient(identity("blocked-once")) as first:
            assert (await first.session_for(server.identity.did, url)).sealed is False
        async with A2AClient(identity("came-later")) as second:
            assert (await second.session_for(server.identity.did, url)).sealed is True


def _kept_token(store: MemoryStore) -> str:
    """The one claim's kept answer (its sealed result) as the store holds it."""
    from a2a_secure.store.base import StoredReply

    (state,) = store._claims.values()
    assert state.reply is not None
    token = StoredReply.from_dict(encoding.loads(state.reply)).result
    assert isinstance(token, str)
    return token


async def test_an_intent_id_that_runs_again_never_seals_under_the_same_key_and_nonce() -> None:
    # The answer key is the same for every run of an intent_id (the client derives it): a
    # claim the store forgot (its retention ended) runs again, and its answer must not be
    # sealed under the nonce of the first, or the two ciphertexts XOR to the two answers'.
    server = exactly_once_server()
    did, store = server.identity.did, server.store
    assert isinstance(store, MemoryStore)
    intent = {"goal": "book", "inputs": {"room": SECRET}}
    async with serve_app(server.app()) as url, A2AClient(identity("alice"), sealed=True) as alice:
        first = await alice.request(did, intent, endpoint=url, intent_id="T" * 22)
        kept_first = _kept_token(store)
        for key in list(store._claims):
            store._drop_claim(key)  # what the end of its retention does
        await alice.close_session(did)
        second = await alice.request(did, intent, intent_id="T" * 22)
        kept_second = _kept_token(store)
    assert first.result["run"] == 1 and second.result["run"] == 2
    assert kept_first != kept_second
    # Each carries its own nonce: the ciphertexts do not XOR to the answers' XOR (a shared
    # nonce, the two-time pad, would leave it so: the same keystream on both).
    bodies = [_sealed_body(t) for t in (kept_first, kept_second)]
    plain = [encoding.dumps(r.result) for r in (first, second)]
    xor_c = bytes(a ^ b for a, b in zip(*bodies, strict=False))
    xor_p = bytes(a ^ b for a, b in zip(*plain, strict=False))
    assert xor_c[: len(xor_p)] != xor_p


def _sealed_body(token: str) -> bytes:
    """A kept answer's ciphertext, without the nonce kept in front of it (ClaimBox)."""
    if token.startswith("2."):
        return encoding.b64u_decode(token[2:])[12:]
    return encoding.b64u_decode(token)  # a claim kept with a fixed nonce
