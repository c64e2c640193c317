"""Sealed intents through a real TLS-terminating reverse proxy (PROTOCOL.md §12.6).

client → nginx (TLS, a trustme certificate) → a recording tap → uvicorn on loopback. The
tap sees what any gateway that terminates TLS sees. With sealing, no input and no result
crosses it in the clear (nor a streamed partial result); without it, they do, which shows
that the test can fail.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from http_helpers import SECRET, AuditLog, build_server, identity
from nginx_helpers import Tap, nginx_binary, nginx_proxy

from a2a_secure.client import extensions as card_extensions
from a2a_secure.client.http import A2AClient
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app

RESULT_SECRET = "RESULT-only-the-caller-may-read"


@pytest.fixture(autouse=True)
def _fresh_card_cache() -> None:
    card_extensions.forget()


def proxied_server() -> AgentServer:
    server = build_server(identity("proxied"), limits=ServerLimits(sealed_intents=True), audit=AuditLog())

    @server.intent("lookup")
    def lookup(inputs: dict[str, Any]) -> Any:
        return {"answer": RESULT_SECRET, "asked": inputs}

    @server.intent("count")
    async def count(inputs: dict[str, Any]) -> AsyncIterator[Any]:
        for i in range(inputs["n"]):
            yield {"i": i, "answer": RESULT_SECRET}

    return server


@contextlib.asynccontextmanager
async def behind_nginx(tmp_path: Path, server: AgentServer) -> AsyncIterator[tuple[str, Tap, ssl.SSLContext]]:
    nginx_binary()  # skip (or fail under A2A_SECURE_REQUIRE_NGINX=1) before starting anything
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain = b"".join(pem.bytes() for pem in cert.cert_chain_pems)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with serve_app(server.app()) as url:
        port = int(url.rsplit(":", 1)[1])
        async with (
            Tap(("127.0.0.1", port)) as tap,
            nginx_proxy(tmp_path / "nginx", chain, cert.private_key_pem.bytes(), tap.port) as front,
        ):
            yield front, tap, client_ctx


async def _exchange(front: str, ctx: ssl.SSLContext, did: str, sealed: bool) -> None:
    async with A2AClient(identity("proxied-caller"), verify=ctx, sealed=sealed) as client:
        res = await client.request(did, {"goal": "lookup", "inputs": {"text": SECRET}}, endpoint=front)
        assert res.result == {"answer": RESULT_SECRET, "asked": {"text": SECRET}}
        items = [item async for item in client.stream(did, {"goal": "count", "inputs": {"n": 2}})]
        assert items == [{"i": 0, "answer": RESULT_SECRET}, {"i": 1, "answer": RESULT_SECRET}]
        session = await client.session_for(did)
        assert session.sealed is sealed


async def test_through_a_tls_terminating_proxy_sealed_inputs_and_results_stay_sealed(tmp_path: Path) -> None:
    server = proxied_server()
    async with behind_nginx(tmp_path, server) as (front, tap, ctx):
        await _exchange(front, ctx, server.identity.did, sealed=True)
    # The inner hop carried the handshake, the card, the intents and their answers ...
    assert b"POST /a2a/intent" in tap.to_server and b"text/event-stream" in tap.to_proxy
    # ... and neither an input nor a result in the clear.
    assert not tap.holds(SECRET) and not tap.holds("hunter2")
    assert not tap.holds(RESULT_SECRET)


async def test_through_the_same_proxy_unsealed_traffic_is_readable(tmp_path: Path) -> None:
    server = proxied_server()
    async with behind_nginx(tmp_path, server) as (front, tap, ctx):
        await _exchange(front, ctx, server.identity.did, sealed=False)
    assert tap.holds(SECRET) and tap.holds(RESULT_SECRET)
