"""The trace goes on through the bridges: MCP ``_meta`` in, a2a-sdk handlers out.

* ``a2a-secure mcp`` (a subprocess over stdio, configured by ``OTEL_EXPORTER_OTLP_*`` to
  export its spans over OTLP/HTTP to a receiver in this test) is called by the MCP SDK's
  client, which puts its span's ``traceparent`` in the tool call's ``_meta``: the bridge's
  spans and the agent's server span (in this process, in-memory exporter) are in that
  trace, each the child of the one before.
* An a2a-sdk ``AgentExecutor`` behind :class:`~a2a_secure.a2a_binding.A2ABridge` runs
  inside the server span of the intent that carried its call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is in the dev extra")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from telemetry_helpers import decode_spans, otlp_attributes, otlp_receiver, sdk_provider


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    with sdk_provider(SimpleSpanProcessor(memory)):
        yield memory


async def test_mcp_tool_call_continues_the_trace_in_its_meta(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    pytest.importorskip("mcp")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from tests.test_mcp_server import ROOT, registry_agents

    with otlp_receiver() as (endpoint, received):
        async with registry_agents(tmp_path) as args:
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
                "OTEL_SERVICE_NAME": "mcp-bridge",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
            params = StdioServerParameters(command=sys.executable, args=args, env=env)
            with (tmp_path / "stderr.log").open("w") as errlog:
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as mcp,
                ):
                    await mcp.initialize()
                    await mcp.list_tools()  # a call goes only to a card the last listing showed
                    result = await mcp.call_tool("beta__echo", {"text": "traced"})
                    assert not result.is_error
            # the MCP server exits when its stdin closes, flushing its spans (atexit)
    agent_spans = [
        s
        for s in exporter.get_finished_spans()
        if s.kind == SpanKind.SERVER and s.attributes.get("a2a_secure.goal") == "echo"
    ]
    assert len(agent_spans) == 1
    agent_span = agent_spans[0]
    # The MCP client (this process) put its span's traceparent in the call's _meta.
    (caller,) = [s for s in exporter.get_finished_spans() if s.name == "MCP send tools/call beta__echo"]
    trace_id = format(caller.context.trace_id, "032x")
    assert format(agent_span.context.trace_id, "032x") == trace_id

    bridge = {s.span_id: s for s in decode_spans(received)}
    assert bridge, (tmp_path / "stderr.log").read_text()
    # From the agent's server span up through the bridge's spans to the caller's parent.
    chain = []
    parent_id = agent_span.parent.span_id.to_bytes(8, "big")
    while parent_id in bridge:
        span = bridge[parent_id]
        assert span.trace_id.hex() == trace_id
        chain.append((span.name, otlp_attributes(span).get("a2a_secure.goal")))
        parent_id = span.parent_span_id
    assert int.from_bytes(parent_id, "big") == caller.context.span_id
    assert chain[0] == ("a2a_secure/intent", "echo")  # the bridge's client call
    assert "a2a_secure/intent" not in [name for name, _ in chain[1:]]


async def test_a2a_sdk_executor_runs_inside_the_intent_server_span(exporter: InMemorySpanExporter) -> None:
    pytest.importorskip("a2a")
    from opentelemetry import trace

    from tests.test_a2a_binding import running, send_request, text_of

    seen: list[Any] = []
    async with running() as env, env.a2a_client() as client:
        original = env.executor.execute

        async def execute(context: Any, queue: Any) -> None:
            seen.append(trace.get_current_span().get_span_context())
            await original(context, queue)

        env.executor.execute = execute  # type: ignore[method-assign]
        sdk = env.sdk_client(client, streaming=False)
        with trace.get_tracer("test").start_as_current_span("caller") as caller:
            kinds, _task = await text_of(sdk, send_request("one two"))
        assert kinds == ["task"]
    spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
    (executor_ctx,) = seen
    assert executor_ctx.trace_id == caller.get_span_context().trace_id
    # The executor's span is the intent's server span, or a span of the SDK's inside it.
    span = spans.get(executor_ctx.span_id)
    while span is not None and not (span.kind == SpanKind.SERVER and span.name == "a2a_secure/intent"):
        span = spans.get(span.parent.span_id) if span.parent is not None else None
    assert span is not None
    assert span.attributes["a2a_secure.goal"] == "SendMessage"
    assert span.attributes["a2a_secure.caller_did"] == client.identity.did
