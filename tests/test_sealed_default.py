"""Sealed by default (PROTOCOL.md §12.6): what a plain ``a2a-secure serve`` gives a client.

The server is the one ``a2a-secure serve`` runs (its uvicorn factory, ``app_from_env``,
configured as the command line configures it), on a real uvicorn; the clients are the real
ones, their traffic kept by a recording relay (an httpx transport that keeps every body).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import SECRET, identity
from test_sealed_http import RecordingTransport

from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import PolicyViolation, SequenceError
from a2a_secure.identity import encoding
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.protocol.refusal import MEMBER as REFUSAL_MEMBER
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import app_from_env
from a2a_secure.server.test_agent import register_test_agent
from a2a_secure.testing import serve_app

SERVER = identity("sealed-default-server")
PERSON = identity("sealed-default-person")
NO_RETRY = RetryPolicy(attempts=1)


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


class Relay(RecordingTransport):
    """The recording relay of tests/test_sealed_http.py, asked whether a text crossed it."""

    def holds(self, text: str) -> bool:
        return any(text.encode() in body for body in self.seen)


def accepting_chains(server: AgentServer) -> None:
    """``serve --app`` target: the test agent, accepting delegation chains (§12.7)."""
    register_test_agent(server)
    server.delegation = DelegationRules()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, policy: dict[str, Any] | None = None, app: str = "") -> AsyncIterator[str]:
    """``a2a-secure serve`` as its workers build it: no flag but the key (and ``policy``, ``app``)."""
    key_file = tmp_path / "server.key"
    if not key_file.exists():
        SERVER.save(key_file)
    env = {"A2A_SECURE_KEY_FILE": str(key_file)}
    if policy is not None:
        policy_file = tmp_path / "policy.json"
        policy_file.write_text(json.dumps(policy))
        env["A2A_SECURE_POLICY"] = str(policy_file)
    if app:
        env["A2A_SECURE_APP"] = app
    async with serve_app(app_from_env(env)) as url:
        yield url


@contextlib.asynccontextmanager
async def client_via(relay: Relay, name: str, **options: Any) -> AsyncIterator[A2AClient]:
    async with httpx.AsyncClient(transport=relay, timeout=10) as http:
        client = A2AClient(identity(name), http=http, retry=NO_RETRY, **options)
        try:
            yield client
        finally:
            await client.aclose()


async def test_a_plain_serve_seals_every_intent_a_current_client_sends(tmp_path: Path) -> None:
    relay = Relay()
    async with serving(tmp_path) as url, client_via(relay, "current") as client:
        answer = await client.request(SERVER.did, {"goal": "echo", "inputs": {"text": SECRET}}, endpoint=url)
        assert answer.result == {"text": SECRET}
        events = [e async for e in client.stream(SERVER.did, {"goal": "count", "inputs": {"n": 2}})]
        assert events == [{"i": 0}, {"i": 1}]
        assert (await client.session_for(SERVER.did)).sealed is True
    assert relay.holds('"sealed":') and not relay.holds(SECRET)  # the inputs went sealed, the result too
    assert not relay.holds("hunter2")


async def test_a_base_contract_client_still_works_on_a_plain_serve(tmp_path: Path) -> None:
    relay = Relay()
    async with serving(tmp_path) as url, client_via(relay, "base", sealed=False) as client:
        answer = await client.request(SERVER.did, {"goal": "echo", "inputs": {"text": SECRET}}, endpoint=url)
        assert answer.result == {"text": SECRET}
        assert (await client.session_for(SERVER.did)).sealed is False
    # The extension is additive: this session is the base contract's, in the clear (so the
    # relay above could have seen a secret, had one crossed unsealed).
    assert relay.holds(SECRET) and not relay.holds('"sealed":')


async def test_the_chain_crosses_a_plain_serve_sealed_full_then_by_name(tmp_path: Path) -> None:
    client_identity = identity("on-behalf")
    chain = PERSON.delegate(client_identity.did, ["echo"], ttl=600)
    relay = Relay()
    app = f"{__name__}:accepting_chains"
    async with serving(tmp_path, app=app) as url, httpx.AsyncClient(transport=relay, timeout=10) as http:
        client = A2AClient(client_identity, http=http, retry=NO_RETRY)
        try:
            for text in ("first", "second"):  # the chain in full, then its name (§12.7)
                intent = {"goal": "echo", "inputs": {"text": f"{text} {SECRET}"}}
                answer = await client.request(SERVER.did, intent, endpoint=url, on_behalf_of=chain)
                assert answer.result == intent["inputs"]
            assert (await client.session_for(SERVER.did)).sealed is True
        finally:
            await client.aclose()
    assert relay.holds('"sealed_delegation":') and not relay.holds('"delegation":')
    hidden = [*chain.tokens, chain.hash, PERSON.did, *(link.jti for link in chain.links), SECRET]
    assert [x for x in hidden if relay.holds(x)] == []


# -- require_sealed: every door that opens a session refuses one without seal keys -------------
def required(limits_only: bool = False) -> AgentServer:
    """An AgentServer that requires sealing, through the constructor or its limits."""
    if limits_only:
        server = AgentServer(SERVER, limits=ServerLimits(require_sealed=True))
    else:
        server = AgentServer(SERVER, require_sealed=True)
    register_test_agent(server)
    return server


REQUIRING = AgentServer(SERVER, name="requiring", limits=ServerLimits(require_sealed=True))
register_test_agent(REQUIRING)


@contextlib.asynccontextmanager
async def door(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """A server that requires sealing, reached through ``kind`` of configuration."""
    if kind == "serve --policy":
        async with serving(tmp_path, policy={"require_sealed": True}) as url:
            yield url
    elif kind == "serve --app":
        async with serving(tmp_path, app=f"{__name__}:REQUIRING") as url:
            yield url
    else:
        async with serve_app(required(limits_only=kind == "ServerLimits").app()) as url:
            yield url


DOORS = ["serve --policy", "serve --app", "AgentServer(require_sealed)", "ServerLimits"]


@pytest.mark.parametrize("kind", DOORS)
async def test_require_sealed_refuses_a_client_without_seal_keys_signed(kind: str, tmp_path: Path) -> None:
    relay = Relay()
    async with door(kind, tmp_path) as url:
        async with client_via(relay, "base", sealed=False) as base:
            with pytest.raises(PolicyViolation, match="sealed intents required") as info:
                await base.request(SERVER.did, {"goal": "echo", "inputs": {"text": "x"}}, endpoint=url)
            assert info.value.code == -32042 and info.value.signed is True  # the server's own refusal
        async with client_via(relay, "current") as current:  # a client that seals is served
            answer = await current.request(
                SERVER.did, {"goal": "echo", "inputs": {"text": "y"}}, endpoint=url
            )
            assert answer.result == {"text": "y"} and (await current.session_for(SERVER.did)).sealed


async def test_the_refusal_is_bound_to_the_handshake_and_a_forged_one_is_unsigned() -> None:
    from a2a_secure.identity.resolver import resolve_did_key

    async with serve_app(required().app()) as url, httpx.AsyncClient(timeout=10) as http:

        async def call(method: str, params: Any) -> dict[str, Any]:
            resp = await http.post(
                f"{url}/a2a/handshake", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            )
            return resp.json()  # type: ignore[no-any-return]

        hs = ClientHandshake(identity("raw"), resolve_did_key(SERVER.did))
        challenge = await call("hello", hs.hello())
        policy = await call("proof", hs.receive_challenge(challenge["result"]))
        accept = hs.receive_policy(policy["result"])
        error = (await call("accept_policy", accept))["error"]
        assert error["code"] == -32042 and set(error["data"]) == {REFUSAL_MEMBER}
        assert hs.refusal_is_signed(error, accept) is True
        payload = encoding.loads(encoding.b64u_decode(error["data"][REFUSAL_MEMBER].split(".")[1]))
        assert payload["accept_hash"] == m.request_hash(accept["accept_jws"])
        assert payload["error"] == {"code": error["code"], "message": error["message"]}
        # Moved to another message, another error text, or stripped: not the server's refusal.
        assert hs.refusal_is_signed({**error, "message": "something else"}, accept) is False
        token = accept["accept_jws"]
        other = {**accept, "accept_jws": token[:-3] + ("B" if token[-3] != "B" else "C") + token[-2:]}
        assert hs.refusal_is_signed(error, other) is False
        assert hs.refusal_is_signed({k: v for k, v in error.items() if k != "data"}, accept) is False
        # The pending handshake is not used up (a used one would be -32041): the same
        # refusal again, signed again.
        again = (await call("accept_policy", accept))["error"]
        assert again["code"] == -32042 and hs.refusal_is_signed(again, accept) is True


def test_require_sealed_without_sealing_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="require_sealed needs sealed_intents"):
        ServerLimits(require_sealed=True, sealed_intents=False)
    with pytest.raises(ValueError, match="require_sealed needs sealed_intents"):
        AgentServer(SERVER, limits=ServerLimits(sealed_intents=False), require_sealed=True)


async def test_a_sealed_chain_in_the_wrong_form_for_its_session_is_refused_signed_and_nothing_runs() -> None:
    client_identity = identity("wrong-form")
    chain = PERSON.delegate(client_identity.did, ["echo"], ttl=600)
    calls: list[str] = []
    server = AgentServer(SERVER, delegation=DelegationRules())

    @server.intent("echo")
    def echo(inputs: dict[str, Any]) -> Any:
        calls.append("echo")
        return inputs

    async with serve_app(server.app()) as url, A2AClient(client_identity, retry=NO_RETRY) as client:
        session = await client.session_for(SERVER.did, url)
        assert session.sealed
        # A clear chain on a sealed session: signed -32602, the sequence not used up.
        req = session.prepare_intent({"goal": "echo", "inputs": {}})
        params = _resigned(
            session, req.params, lambda intent: {**intent, "delegation": chain.tokens}, client_identity
        )
        error = await _post(url, params)
        assert error["code"] == -32602 and "travels as sealed_delegation" in error["message"]
        assert "response_jws" in error["data"]  # signed (after step 5)
        # A sealed chain that does not open (sealed for another goal): signed -32040.
        other = session.sealer.seal_delegation(req.sequence, "not-echo", chain.tokens)  # type: ignore[union-attr]
        params = _resigned(
            session, req.params, lambda intent: {**intent, "sealed_delegation": other}, client_identity
        )
        error = await _post(url, params)
        assert error["code"] == -32040 and "response_jws" in error["data"]
        # One that opens to something a delegation member may not be: signed -32040.
        bad = session.sealer.seal_delegation(req.sequence, "echo", {"not": "a chain"})  # type: ignore[union-attr]
        params = _resigned(
            session, req.params, lambda intent: {**intent, "sealed_delegation": bad}, client_identity
        )
        error = await _post(url, params)
        assert error["code"] == -32040
        # Both members at once: -32602 at step 1, unsigned.
        both = _resigned(
            session,
            req.params,
            lambda intent: {**intent, "sealed_delegation": bad, "delegation": chain.hash},
            client_identity,
        )
        error = await _post(url, both)
        assert error["code"] == -32602 and "response_jws" not in (error.get("data") or {})
        # None of them used the sequence up: the request as the client made it runs.
        good = await client.request(SERVER.did, {"goal": "echo", "inputs": {"a": 1}}, on_behalf_of=chain)
        assert good.result == {"a": 1}
    assert calls == ["echo"]


def _resigned(session: Any, params: dict[str, Any], change: Any, signer: Any) -> dict[str, Any]:
    """``params`` with its intent changed and signed again (digests for the sealed members)."""
    from a2a_secure.identity.jws import jws_decode_unverified, jws_sign

    intent = change(dict(params["intent"]))
    payload = jws_decode_unverified(params["request_jws"])[1]
    signed = dict(intent)
    for member in ("sealed", "sealed_delegation"):
        if member in signed:
            signed[member] = m.sealed_digest(signed[member])
    payload["intent"] = signed
    return {**params, "intent": intent, "request_jws": jws_sign(payload, signer, m.Typ.REQUEST)}


async def _post(url: str, params: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as http:
        body = {"jsonrpc": "2.0", "id": 7, "method": "intent", "params": params}
        resp = await http.post(f"{url}/a2a/intent", json=body)
    error = resp.json().get("error")
    assert isinstance(error, dict), resp.text
    return error


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
async def test_a_refusal_of_the_chain_names_nothing_of_it_on_a_sealed_session(
    sealed: bool, tmp_path: Path
) -> None:
    # A refusal of a chain (here a goal reserved to another principal, decided at the
    # admission, whose message names the chain's principal) says only "delegation refused"
    # on a sealed session; the client reads the detail from the sealed data. On a plain
    # session the message has it, as before.
    client_identity = identity("refused-" + ("sealed" if sealed else "plain"))
    chain = PERSON.delegate(client_identity.did, ["count"], ttl=600)
    rules = DelegationRules.build({"count": [identity("someone-else").did]})
    server = AgentServer(SERVER, delegation=rules, limits=ServerLimits(sealed_intents=sealed))
    register_test_agent(server)
    relay = Relay()
    async with serve_app(server.app()) as url, httpx.AsyncClient(transport=relay, timeout=10) as http:
        client = A2AClient(client_identity, http=http, retry=NO_RETRY)
        try:
            with pytest.raises(PolicyViolation) as refused:
                intent = {"goal": "count", "inputs": {"n": 1}, "constraints": {"stream": False}}
                await client.request(SERVER.did, intent, endpoint=url, on_behalf_of=chain)
            assert refused.value.signed and PERSON.did in refused.value.message  # the detail, opened
            assert (await client.session_for(SERVER.did)).sealed is sealed
        finally:
            await client.aclose()
    wire_messages = [
        json.loads(body)["error"]["message"]
        for body in relay.seen
        if body.startswith(b"{") and b'"error"' in body and b"-32042" in body
    ]
    assert wire_messages, "the refusal crossed the relay"
    if sealed:
        assert set(wire_messages) == {"delegation refused"}
        assert [x for x in (chain.hash, PERSON.did) if relay.holds(x)] == []
    else:
        assert all(PERSON.did in msg for msg in wire_messages)


async def test_an_intent_id_under_a_sealed_chain_runs_once_across_sessions() -> None:
    # §12.5 with §12.6: a sealed chain counts as its name in the intent_hash, so the resend
    # on a new session (its chain sealed under other keys, sent in full again) is the same
    # intent, answered from the first run.
    client_identity = identity("once-under-chain")
    chain = PERSON.delegate(client_identity.did, ["book"], ttl=600)
    runs: list[Any] = []
    server = AgentServer(SERVER, delegation=DelegationRules())

    @server.intent("book")
    def book(inputs: dict[str, Any]) -> Any:
        runs.append(inputs)
        return {"booked": inputs["room"], "run": len(runs)}

    intent = {"goal": "book", "inputs": {"room": 4}}
    async with serve_app(server.app()) as url, A2AClient(client_identity, retry=NO_RETRY) as client:
        first = await client.request(SERVER.did, intent, endpoint=url, on_behalf_of=chain, intent_id="r" * 22)
        assert (await client.session_for(SERVER.did)).sealed
        await client.close_session(SERVER.did)
        again = await client.request(SERVER.did, intent, endpoint=url, on_behalf_of=chain, intent_id="r" * 22)
        assert again.result == first.result == {"booked": 4, "run": 1}
        # The same id and inputs under another chain: another intent (its name differs).
        someone = identity("once-other-principal").delegate(client_identity.did, ["book"], ttl=600)
        with pytest.raises(SequenceError) as conflict:
            await client.request(SERVER.did, intent, on_behalf_of=someone, intent_id="r" * 22)
        assert conflict.value.code == -32044 and conflict.value.signed
        other = await client.request(
            SERVER.did, {"goal": "book", "inputs": {"room": 5}}, on_behalf_of=chain, intent_id="s" * 22
        )
        assert other.result == {"booked": 5, "run": 2}
    assert runs == [{"room": 4}, {"room": 5}]
