"""The attempt machine's table run through the A2A secure transport too (PROTOCOL.md §10).

The transport's unary and streaming calls go through ``A2AClient.request`` and
``A2AClient.stream_events``, so the one machine decides for them: each answer of the table
in tests/test_client_attempt.py must end the same way after the same sends through an
a2a-sdk client over the transport as through ``A2AClient.request``. No socket: the bridge
runs behind the same signing ASGI front, through httpx's ``ASGITransport``.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

os.environ["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = "false"
pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a.client import BaseClient
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from test_a2a_binding import CountingEcho, send_request, template_card, text_of
from test_client_attempt import CLIENT, PERSON, SERVER, SERVER_ID, STATUS, TABLE, Front, Row, _through

from a2a_secure.a2a_binding import A2ABridge, SecureA2ATransport, secure_client_config
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import A2AError
from a2a_secure.policy import Policy
from a2a_secure.protocol.client_attempt import Resend
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer

URL = "http://127.0.0.1:9"


def _a2a_error(exc: BaseException) -> A2AError | None:
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, A2AError):
        seen = seen.__cause__
    return seen


async def _through_transport(row: Row, *, streaming: bool) -> tuple[Any, int, Any]:
    card = template_card()
    handler = DefaultRequestHandler(
        agent_executor=CountingEcho(0.0), task_store=InMemoryTaskStore(), agent_card=card
    )
    # Not sealed: the front forges its answers in the clear (see test_client_attempt.build_app).
    plain = ServerLimits(sealed_intents=False)
    server = AgentServer(SERVER_ID, Policy(), name="attempt-a2a", delegation=DelegationRules(), limits=plain)
    bridge = A2ABridge(handler, agent_card=card)
    bridge.mount(server)
    server.url = URL
    front = Front(server.app())
    goals = ["SendMessage", "SendStreamingMessage"]
    chain = PERSON.delegate(CLIENT.did, goals=goals, ttl=3600, targets=[SERVER])
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url=URL)
    try:
        async with http, A2AClient(CLIENT, http=http, retry=RetryPolicy(attempts=1)) as client:
            transport = SecureA2ATransport(
                client, bridge.agent_card, URL, expected_did=SERVER, on_behalf_of=chain
            )
            sdk = BaseClient(bridge.agent_card, secure_client_config(streaming=streaming), transport, [])
            await text_of(sdk, send_request())  # the chain in full on this session; by name from now on
            exc = row.answer(chain.hash)
            front.armed.append((STATUS.get(type(exc), 403), exc))
            before = len(front.intents)
            try:
                kinds, _task = await text_of(sdk, send_request())
            except Exception as raised:  # the SDK's error for it, caused by the A2AError
                cause = _a2a_error(raised)
                assert cause is not None, raised
                return (type(cause), getattr(cause, "pool", None)), len(front.intents) - before, None
            assert kinds[0] == "task"
            last = front.intents[-1]
            return ("ok",), len(front.intents) - before, type(last.get("delegation")).__name__
    finally:
        await handler.aclose()


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
async def test_the_table_ends_alike_through_the_a2a_transport(row: Row, streaming: bool) -> None:
    transport = await _through_transport(row, streaming=streaming)
    outcome, sends, form = await _through("unary", row)
    if isinstance(row.outcome, Resend):
        assert transport == (("ok",), sends, form) and sends == 2
    else:
        assert transport == (outcome, sends, None) and sends == 1
