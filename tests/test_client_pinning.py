"""The client's pool dials the address that was checked, for a name a remote document gave.

A did:web service endpoint or an A2A card's URL passes the address policy by its name; the
pool then resolves the name once, refuses it unless every address the answer holds meets
the rule the endpoint was taken under, and connects to a checked address, TLS still for the
name (``a2a_secure.client.pinning``). DNS is the test's: an injected resolver for the pool's
plan, and the same answers from the event loop's ``getaddrinfo`` (what dialling by name
asks), so a client that dials by name is seen doing it. Servers and listeners are real, on
127.0.0.1; TLS uses a throw-away CA (trustme).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.client.pinning import DialPlan
from a2a_secure.errors import A2AError
from a2a_secure.identity.addresses import AddressPolicy, Reach, check_address
from a2a_secure.testing import serve_app
from tests.http_helpers import Rebinding, build_server, identity, system_dns

FAST = RetryPolicy(attempts=2, base=0.01, cap=0.02)
NAME = "agent.example.com"
SERVER_DID = identity("server").did


@contextlib.asynccontextmanager
async def loopback_listener() -> AsyncIterator[tuple[int, list[str]]]:
    """A real TCP listener on 127.0.0.1 that records each connection made to it."""
    connected: list[str] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(writer.get_extra_info("peername")[0])
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], connected
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["93.184.216.34", "127.0.0.1"]])
async def test_a_document_endpoint_whose_name_resolves_to_loopback_is_never_dialled(
    answer: list[str],
) -> None:
    async with loopback_listener() as (port, connected):
        url = f"https://{NAME}:{port}"
        with system_dns({NAME: ["127.0.0.1"]}):
            # The operator's own endpoint: dialled by name, as before (the listener is there).
            async with A2AClient(identity("client"), retry=FAST) as client:
                with pytest.raises(A2AError):
                    await client.handshake(SERVER_DID, url)
            assert connected and set(connected) == {"127.0.0.1"}
            connected.clear()
            # The same URL from a public document: a public name, but loopback in its answer.
            dns = Rebinding(answer, answer)
            async with A2AClient(identity("client"), retry=FAST, dial=DialPlan(resolve=dns)) as client:
                endpoint = client.accept_endpoint(url, what="the service endpoint", origin=Reach.PUBLIC)
                with pytest.raises(A2AError, match="could not connect"):
                    await client.handshake(SERVER_DID, endpoint)
                # The client's own httpx client (agent cards) follows the same plan.
                with pytest.raises(httpx.ConnectError, match="may not be dialled"):
                    await client.http.get(endpoint + "/.well-known/agent-card.json")
        assert dns.asked >= 2 and connected == []


async def test_the_pool_dials_the_address_it_checked_not_a_second_answer() -> None:
    # The checked answer is 127.0.0.2 (opted in), where the agent is; a second question
    # (what a dial by name asks) would get 127.0.0.1, where nothing listens on that port.
    policy = AddressPolicy.build(allow_addresses=["127.0.0.2/32"])
    server = build_server()
    async with serve_app(server.app(), host="127.0.0.2") as base:
        port = int(base.rsplit(":", 1)[1])
        dns = Rebinding(["127.0.0.2"], ["127.0.0.2"])
        with system_dns({"agent.localhost": ["127.0.0.1"]}):
            async with A2AClient(
                identity("client"), retry=FAST, addresses=policy, dial=DialPlan(resolve=dns), sealed=False
            ) as client:
                # Plain http from a loopback document (the only case plain http is allowed).
                endpoint = client.accept_endpoint(
                    f"http://agent.localhost:{port}", what="the card's URL", origin=Reach.LOOPBACK
                )
                first = await client.request(
                    SERVER_DID, {"goal": "echo", "inputs": {"n": 1}}, endpoint=endpoint
                )
                assert first.result == {"echo": {"n": 1}}
    assert dns.asked >= 1


@pytest.fixture(scope="module")
def ca() -> Any:
    trustme = pytest.importorskip("trustme")
    return trustme.CA()


async def test_a_document_endpoint_with_a_stable_answer_works_end_to_end_and_tls_checks_the_name(
    ca: Any,
) -> None:
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(NAME).configure_cert(server_ssl)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    policy = AddressPolicy.build(allow_addresses=["127.0.0.1/32"])  # the private agent's address
    server = build_server()
    async with serve_app(server.app(), ssl_context=server_ssl) as base:
        port = int(base.rsplit(":", 1)[1])
        dns = Rebinding(["127.0.0.1"], ["127.0.0.1"])
        with system_dns({NAME: ["127.0.0.1"], "other.example.com": ["127.0.0.1"]}):
            async with A2AClient(
                identity("client"), verify=trusting, retry=FAST, addresses=policy, dial=DialPlan(resolve=dns)
            ) as client:
                endpoint = client.accept_endpoint(
                    f"https://{NAME}:{port}", what="endpoint", origin=Reach.PUBLIC
                )
                first = await client.request(
                    SERVER_DID, {"goal": "echo", "inputs": {"tls": 1}}, endpoint=endpoint
                )
                second = await client.request(SERVER_DID, {"goal": "whoami", "inputs": {}})
                assert first.result == {"echo": {"tls": 1}} and second.sequence == 2
                assert dns.asked >= 1
            # The same address under another name: the certificate is checked for the NAME.
            async with A2AClient(
                identity("client"), verify=trusting, retry=FAST, addresses=policy, dial=DialPlan(resolve=dns)
            ) as client:
                other = client.accept_endpoint(
                    f"https://other.example.com:{port}", what="endpoint", origin=Reach.PUBLIC
                )
                with pytest.raises(A2AError, match="TLS certificate verification failed"):
                    await client.request(SERVER_DID, {"goal": "echo", "inputs": {}}, endpoint=other)
    assert server.calls == {"echo": 1, "whoami": 1}  # type: ignore[attr-defined]


ADDRESSES = [
    "93.184.216.34",
    "127.0.0.1",
    "10.1.2.3",
    "169.254.169.254",
    "::1",
    "::ffff:127.0.0.1",
    "fd00::1",
]
POLICIES = [
    AddressPolicy(),
    AddressPolicy.build(dev_allow_loopback=True),
    AddressPolicy.build(allow_addresses=["10.0.0.0/8"]),
]


@pytest.mark.parametrize("origin", [Reach.PUBLIC, Reach.PRIVATE, Reach.LOOPBACK])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_dns_answer_is_judged_by_the_rule_of_an_ip_literal(origin: Reach, policy: AddressPolicy) -> None:
    """One rule: an address in a name's DNS answer is allowed exactly when the same address
    written as the URL's host would be."""
    for text in ADDRESSES:
        addr = ipaddress.ip_address(text)
        host = f"[{addr}]" if addr.version == 6 else str(addr)
        try:
            check_address(f"https://{host}:8443", origin=origin, policy=policy)
            literal = True
        except A2AError:
            literal = False
        assert policy.answer_rule(NAME, origin)(addr) is literal, (text, origin, policy)


async def test_an_endpoint_of_a_registry_from_elsewhere_is_dialled_at_a_checked_address() -> None:
    from a2a_secure.agent import A2AAgent
    from a2a_secure.registry import AgentRegistry

    async with loopback_listener() as (port, connected):
        data = {"peer": {"did": SERVER_DID, "endpoint": f"https://{NAME}:{port}"}}
        # The system's DNS (the default resolver of the agent's plan) answers loopback.
        with system_dns({NAME: ["127.0.0.1"]}):
            for origin, reached in ((None, True), (Reach.PUBLIC, False)):
                registry = AgentRegistry.from_dict(data, origin=origin)
                async with A2AAgent("caller", identity("client"), registry=registry, retry=FAST) as agent:
                    with pytest.raises(A2AError, match="did not answer"):
                        await agent.request("peer", {"goal": "echo", "inputs": {}})
                assert bool(connected) is reached, origin  # the operator's file: by name, as before
                connected.clear()
