"""HTTPS: a real uvicorn server with a certificate from a throw-away CA (trustme).

A client that trusts the CA completes the handshake and intents over https; a client that
does not is refused, and the failure surfaces as an ``A2AError`` (``Unavailable``, -32048),
never as a raw httpx or ssl exception. Plain http is only allowed to loopback hosts.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from a2a_secure.client.http import A2AClient, RetryPolicy, check_endpoint
from a2a_secure.errors import A2AError, InvalidParams, Unavailable
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app
from tests.http_helpers import AuditLog, build_server, identity

FAST = RetryPolicy(attempts=2, base=0.01, cap=0.02)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


@pytest.fixture
def trusting(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@pytest.fixture
async def https_server(server_ssl: ssl.SSLContext) -> AsyncIterator[tuple[AgentServer, str]]:
    server = build_server(audit=AuditLog())
    async with serve_app(server.app(), ssl_context=server_ssl) as url:
        assert url.startswith("https://127.0.0.1:")
        yield server, url


async def test_handshake_and_intents_over_https(
    https_server: tuple[AgentServer, str], trusting: ssl.SSLContext
) -> None:
    server, url = https_server
    async with A2AClient(identity("client"), verify=trusting) as client:
        did = server.identity.did
        first = await client.request(did, {"goal": "echo", "inputs": {"tls": True}}, endpoint=url)
        second = await client.request(did, {"goal": "whoami", "inputs": {}})
        assert first.result == {"echo": {"tls": True}}
        assert second.result["caller"] == client.identity.did and second.sequence == 2
        await client.close_session(did)
    assert server.store.counts()["sessions"] == 0  # type: ignore[attr-defined]


async def test_localhost_name_matches_the_certificate(
    https_server: tuple[AgentServer, str], trusting: ssl.SSLContext
) -> None:
    server, url = https_server
    url = url.replace("127.0.0.1", "localhost")
    async with httpx.AsyncClient(verify=trusting) as http:
        resp = await http.get(url + "/health")
        assert resp.json()["did"] == server.identity.did


@pytest.mark.parametrize("verify", [True, "system-default"])
async def test_client_not_trusting_the_ca_is_refused_with_an_a2a_error(
    https_server: tuple[AgentServer, str], verify: Any
) -> None:
    server, url = https_server
    verify = ssl.create_default_context() if verify == "system-default" else verify
    audit = AuditLog()
    async with A2AClient(identity("client"), verify=verify, retry=FAST, audit=audit) as client:
        with pytest.raises(Unavailable) as exc:
            await client.request(server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url)
    assert isinstance(exc.value, A2AError) and exc.value.code == -32048
    assert not exc.value.signed
    assert exc.value.message.startswith("TLS certificate verification failed: ")
    assert not isinstance(exc.value, httpx.HTTPError | ssl.SSLError)
    assert [(r["event"], r["error_code"]) for r in audit] == [("hello", -32048)]
    server_audit: AuditLog = server._audit  # type: ignore[assignment]
    assert server_audit == []  # no request ever reached the application


async def test_certificate_for_another_name_is_refused(ca: trustme.CA, trusting: ssl.SSLContext) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("agent.example").configure_cert(ctx)  # trusted CA, wrong name
    server = build_server()
    async with (
        serve_app(server.app(), ssl_context=ctx) as url,
        A2AClient(identity("client"), verify=trusting, retry=FAST) as client,
    ):
        with pytest.raises(Unavailable, match=r"TLS certificate verification failed: .*mismatch"):
            await client.request(server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url)
    assert server.calls == {}  # type: ignore[attr-defined]


async def test_plain_http_client_to_https_server_fails_cleanly(https_server: tuple[AgentServer, str]) -> None:
    server, url = https_server
    async with A2AClient(identity("client"), retry=FAST) as client:
        with pytest.raises(Unavailable):
            await client.request(
                server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url.replace("https", "http")
            )


def test_check_endpoint_allows_https_and_loopback_http_only() -> None:
    assert check_endpoint("https://agent.example.com/") == "https://agent.example.com"
    assert check_endpoint("https://10.1.2.3:8443") == "https://10.1.2.3:8443"
    for ok in ("http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:80", "http://127.9.9.9"):
        assert check_endpoint(ok) == ok
    refused = (
        "http://example.com",
        "http://10.0.0.1:8000",
        "http://127.0.0.1.example.com",
        "http://localhost.example.com",
        "http://[::2]",
        "ws://127.0.0.1",
        "https://",
        "agent.example.com",
    )
    for url in refused:
        with pytest.raises(InvalidParams):
            check_endpoint(url)


async def test_client_refuses_plain_http_to_a_remote_endpoint() -> None:
    async with A2AClient(identity("client")) as client:
        with pytest.raises(InvalidParams, match="https"):
            await client.request(
                identity("server").did, {"goal": "echo", "inputs": {}}, endpoint="http://a.example"
            )
        with pytest.raises(InvalidParams):
            await client.handshake(identity("server").did, "http://192.168.1.20:8000")


async def test_a_ca_bundle_path_is_trusted_without_deprecation_warnings(
    https_server: tuple[AgentServer, str], ca: trustme.CA, tmp_path: Path
) -> None:
    # The CLI's --ca-bundle gives a path; httpx deprecates its own str form, and the suite
    # turns every warning into an error: a path (str or Path) must work and warn nothing.
    server, url = https_server
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    for verify in (str(bundle), bundle):
        async with A2AClient(identity("bundle-client"), verify=verify) as client:
            got = await client.request(
                server.identity.did, {"goal": "echo", "inputs": {"p": 1}}, endpoint=url
            )
            assert got.result == {"echo": {"p": 1}}
