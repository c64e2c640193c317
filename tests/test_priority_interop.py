"""Priority between the SDK and a peer written from docs/PROTOCOL.md alone (§12, §12.3).

The rule of §12: a server that serves ``priority`` lists it in its card's
``a2a_secure_extensions``; a client sends the member only to a server whose card,
authenticated by the CHALLENGE's ``manifest_hash``, lists it. Both directions run over real
HTTP (uvicorn on loopback) against :mod:`docpeer_helpers`, which uses none of the SDK's
protocol code.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from docpeer_helpers import DocClient, DocServer

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app


def _seed(name: str) -> bytes:
    return hashlib.sha256(b"docpeer:" + name.encode()).digest()


async def test_a_document_only_client_sends_a_priority_the_sdk_server_accepts() -> None:
    async with httpx.AsyncClient() as http:
        doc = DocClient(http, _seed("client"))
        server = AgentServer(
            Identity.from_seed(_seed("sdk-server"), "sdk-server"),
            Policy(),
            store=MemoryStore(),
            priority_rights=PriorityRights(per_did={doc.did: 5}),
        )

        @server.intent("work")
        async def work(inputs: Any, ctx: IntentContext) -> dict[str, Any]:
            return {"priority": ctx.priority}

        async with serve_app(server.app()) as url:
            session = await doc.handshake(url, server.identity.did)
            # The SDK's server declares the extension in the card the CHALLENGE authenticated.
            assert "priority" in session.extensions
            resp = await doc.intent(url, session, {"goal": "work", "inputs": {}, "priority": 5})
            assert resp.status_code == 200, resp.text
            assert resp.json()["result"]["result"] == {"priority": 5}
            # Without the member the intent runs at 3 (§12.3).
            resp = await doc.intent(url, session, {"goal": "work", "inputs": {}})
            assert resp.json()["result"]["result"] == {"priority": 3}


async def test_the_sdk_client_sends_a_priority_to_a_document_only_server() -> None:
    server = DocServer(_seed("doc-server"), ["priority"])
    async with (
        serve_app(server) as url,
        A2AClient(
            Identity.from_seed(_seed("sdk-client"), "sdk-client"), retry=RetryPolicy(attempts=1)
        ) as client,
    ):
        result = await client.request(
            server.did, {"goal": "echo", "inputs": {"x": 1}}, endpoint=url, priority=5
        )
        assert result.result == {"inputs": {"x": 1}, "priority": 5}
        assert server.received == [{"goal": "echo", "inputs": {"x": 1}, "priority": 5}]
        # Priority 3 is the default: the member is left out (§12.3).
        await client.request(server.did, {"goal": "echo", "inputs": {}}, endpoint=url, priority=3)
        assert server.received[-1] == {"goal": "echo", "inputs": {}}


async def test_the_sdk_client_asks_no_priority_of_a_document_only_server_that_does_not_declare_it() -> None:
    server = DocServer(_seed("plain-doc-server"), [])
    async with (
        serve_app(server) as url,
        A2AClient(
            Identity.from_seed(_seed("sdk-client"), "sdk-client"), retry=RetryPolicy(attempts=1)
        ) as client,
    ):
        with pytest.raises(InvalidParams, match="does not declare the priority extension") as caught:
            await client.request(server.did, {"goal": "echo", "inputs": {}}, endpoint=url, priority=5)
        assert not caught.value.signed
        assert server.received == []  # refused before anything was signed or sent
        result = await client.request(server.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        assert result.result == {"inputs": {}, "priority": 3}
