"""OpenTelemetry traces across agents: one trace, right parents, nothing secret exported.

Real uvicorn servers on 127.0.0.1 and the real client; spans go to the SDK's in-memory
exporter, or through the real OTLP/HTTP exporter to a receiver in this test that decodes
the protobuf it is sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is in the dev extra")

from http_helpers import JSON, envelope, identity
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from telemetry_helpers import (
    SECRET,
    decode_spans,
    otlp_attributes,
    otlp_receiver,
    sdk_provider,
    span_text,
    three_agents,
)

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import A2AError
from a2a_secure.policy import Policy
from a2a_secure.server.app import AgentServer
from a2a_secure.telemetry import session_hash
from a2a_secure.testing import serve_app


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    with sdk_provider(SimpleSpanProcessor(memory)):
        yield memory


def _by_name(spans: Any, name: str, kind: SpanKind | None = None) -> list[Any]:
    return [s for s in spans if s.name == name and (kind is None or s.kind == kind)]


async def test_three_agents_share_one_trace_with_the_right_parents(exporter: InMemorySpanExporter) -> None:
    from opentelemetry import trace

    async with three_agents() as agents:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("user request") as root:
            result = await agents.client.request(
                agents.orchestrator.identity.did,
                {"goal": "plan", "inputs": {"text": "hello"}},
                endpoint=agents.orchestrator_url,
            )
    assert result.result == {"plan": {"text": "[es] hello"}}
    trace_id = root.get_span_context().trace_id
    # The sessions closed when the agents stopped are traces of their own (and FastAPI's own
    # spans of the agent-card GETs are not this SDK's).
    spans = [
        s
        for s in exporter.get_finished_spans()
        if "close" not in s.name and s.instrumentation_scope.name in ("a2a_secure", "test")
    ]
    assert {s.context.trace_id for s in spans} == {trace_id}

    client_intents = _by_name(spans, "a2a_secure/intent", SpanKind.CLIENT)
    server_intents = _by_name(spans, "a2a_secure/intent", SpanKind.SERVER)
    top = next(s for s in client_intents if s.attributes["a2a_secure.goal"] == "plan")
    inner = next(s for s in client_intents if s.attributes["a2a_secure.goal"] == "translate")
    orch = next(s for s in server_intents if s.attributes["a2a_secure.goal"] == "plan")
    trans = next(s for s in server_intents if s.attributes["a2a_secure.goal"] == "translate")
    # user -> client intent -> orchestrator server -> its client call -> translator server
    assert top.parent.span_id == root.get_span_context().span_id
    assert orch.parent.span_id == top.context.span_id
    assert inner.parent.span_id == orch.context.span_id
    assert trans.parent.span_id == inner.context.span_id

    assert orch.attributes["a2a_secure.caller_did"] == agents.client_id.did
    assert trans.attributes["a2a_secure.caller_did"] == agents.orchestrator.identity.did
    assert trans.attributes["a2a_secure.session_hash"] == session_hash(agents.seen["sessions"][-1])
    for span in (top, inner, orch, trans):
        assert span.attributes["a2a_secure.outcome"] == "success"
        assert span.attributes["a2a_secure.sequence"] >= 1
        assert span.attributes["rpc.system"] == "jsonrpc"

    # Each client's handshake is a child of its intent span, its steps are events; the
    # server answers each step in a span of its own, the child of that handshake span.
    handshakes = _by_name(spans, "a2a_secure/handshake", SpanKind.CLIENT)
    assert {h.parent.span_id for h in handshakes} == {top.context.span_id, inner.context.span_id}
    for handshake in handshakes:
        assert [e.name for e in handshake.events] == [
            "a2a_secure.hello",
            "a2a_secure.proof",
            "a2a_secure.accept_policy",
        ]
        steps = [s for s in spans if s.parent is not None and s.parent.span_id == handshake.context.span_id]
        assert sorted(s.name for s in steps) == [
            "a2a_secure/accept_policy",
            "a2a_secure/hello",
            "a2a_secure/proof",
        ]
        assert all(s.kind == SpanKind.SERVER for s in steps)


async def test_spans_never_hold_inputs_results_tokens_nonces_or_keys(exporter: InMemorySpanExporter) -> None:
    async with three_agents() as agents:
        did = agents.orchestrator.identity.did
        result = await agents.client.request(
            did, {"goal": "plan", "inputs": {"text": SECRET}}, endpoint=agents.orchestrator_url
        )
        session = await agents.client.session_for(did)
        # a refused intent too: its error path must not quote anything either
        with pytest.raises(A2AError, match=r"not allowed|no handler"):
            await agents.client.request(did, {"goal": "nope", "inputs": {"text": SECRET}})
    spans = exporter.get_finished_spans()
    assert len(spans) >= 14
    forbidden = [
        SECRET,
        "hunter2",
        result.response_jws,
        result.response_jws.split(".")[2],
        session.session_id,
        session.session_commitment,
        *agents.seen["sessions"],
        "eyJ",  # the start of any JWS header or base64url JSON
    ]
    for ident in (agents.client_id, identity("orchestrator"), identity("translator")):
        seed = ident.private_key_b64u()
        forbidden += [seed, base64.urlsafe_b64decode(seed + "=" * (-len(seed) % 4)).hex()]
    for span in spans:
        text = span_text(span)
        for item in forbidden:
            assert item not in text, (span.name, item)
        for key in span.attributes:
            assert key.startswith(("a2a_secure.", "rpc.", "http.", "error.")), key


async def test_streams_replays_and_rehandshakes_show(exporter: InMemorySpanExporter) -> None:
    async with three_agents() as agents:
        did = agents.translator.identity.did
        items = [
            x
            async for x in agents.client.stream(
                did, {"goal": "count", "inputs": {"text": "x"}}, endpoint=agents.translator_url
            )
        ]
        assert len(items) == 3
        # A byte-identical resend gets the stored answer: the server says it was a replay.
        session = await agents.client.session_for(did)
        req = session.prepare_intent({"goal": "translate", "inputs": {"text": "again"}})
        async with httpx.AsyncClient() as raw:
            for _ in range(2):
                resp = await raw.post(
                    f"{agents.translator_url}/a2a/intent",
                    content=envelope("intent", req.params),
                    headers=JSON,
                )
                assert resp.status_code == 200
        # The server forgets the session: the client handshakes again and resends.
        await agents.translator.store.close_session(session.session_id)
        await agents.client.request(did, {"goal": "translate", "inputs": {"text": "after"}})
    spans = exporter.get_finished_spans()
    stream_client = next(
        s for s in spans if s.kind == SpanKind.CLIENT and s.attributes.get("a2a_secure.goal") == "count"
    )
    assert stream_client.attributes["a2a_secure.stream"] is True
    assert stream_client.attributes["a2a_secure.outcome"] == "success"
    stream_server = next(
        s for s in spans if s.kind == SpanKind.SERVER and s.attributes.get("a2a_secure.goal") == "count"
    )
    assert stream_server.attributes["a2a_secure.stream"] is True
    assert stream_server.parent.span_id == stream_client.context.span_id

    replays = [s for s in spans if s.attributes.get("a2a_secure.replay")]
    assert len(replays) == 1 and replays[0].attributes["a2a_secure.goal"] == "translate"

    resent = next(
        s for s in spans if s.kind == SpanKind.CLIENT and any(e.name == "a2a_secure.resend" for e in s.events)
    )
    assert resent.attributes["a2a_secure.outcome"] == "success"
    children = [s for s in spans if s.parent is not None and s.parent.span_id == resent.context.span_id]
    assert [s.name for s in children if s.kind == SpanKind.CLIENT] == ["a2a_secure/handshake"]
    refused = [s for s in children if s.kind == SpanKind.SERVER and s.attributes.get("a2a_secure.error_code")]
    assert [s.attributes["a2a_secure.error_code"] for s in refused] == [-32043]


async def test_a_retry_is_an_event_of_the_intent_span(exporter: InMemorySpanExporter) -> None:
    # One intent a second: the second within the second is refused with 503 and Retry-After,
    # and the client's retry of the byte-identical request is recorded on its span.
    server = AgentServer(identity("limited"), Policy.build(rate_limit=1, rate_period=1))

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    retry = RetryPolicy(attempts=3, base=0.01)
    async with serve_app(server.app()) as url, A2AClient(identity("client"), retry=retry) as client:
        for i in range(2):
            await client.request(server.identity.did, {"goal": "echo", "inputs": {"i": i}}, endpoint=url)
    spans = exporter.get_finished_spans()
    client_intents = _by_name(spans, "a2a_secure/intent", SpanKind.CLIENT)
    retries = [e for s in client_intents for e in s.events if e.name == "a2a_secure.retry"]
    assert retries and retries[0].attributes["http.response.status_code"] == 503
    limited = [s for s in spans if s.attributes.get("a2a_secure.reason") == "rate_limited"]
    assert limited and all(s.attributes["a2a_secure.error_code"] == -32048 for s in limited)


async def test_a_traceparent_header_is_continued_and_a_bad_one_ignored(
    exporter: InMemorySpanExporter,
) -> None:
    server = AgentServer(identity("solo"))
    async with serve_app(server.app()) as url, httpx.AsyncClient() as raw:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        for header in (parent, "00-zz-not-a-trace-context-01"):
            body = envelope("hello", {"bad": True})
            resp = await raw.post(
                f"{url}/a2a/handshake", content=body, headers={**JSON, "traceparent": header}
            )
            assert resp.status_code == 400
    good, bad = _by_name(exporter.get_finished_spans(), "a2a_secure/hello")
    assert format(good.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert good.parent.span_id == int("b7ad6b7169203331", 16)
    assert bad.parent is None  # a malformed header starts a new trace, nothing fails
    assert good.attributes["a2a_secure.error_code"] == -32602


async def test_an_sdk_configured_while_serving_gets_each_request_s_fields() -> None:
    # Without metrics, log lines or a tracer nothing is told of a request (no observe hook);
    # a tracer configured while the server runs gets the fields on the next request's span.
    server = AgentServer(identity("late"))

    @server.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    async with serve_app(server.app()) as url, A2AClient(identity("client")) as client:
        await client.request(server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        assert server.protocol.observe is None
        memory = InMemorySpanExporter()
        with sdk_provider(SimpleSpanProcessor(memory)):
            await client.request(server.identity.did, {"goal": "echo", "inputs": {}}, endpoint=url)
        assert server.protocol.observe is not None
    (span,) = _by_name(memory.get_finished_spans(), "a2a_secure/intent", SpanKind.SERVER)
    assert span.attributes["a2a_secure.goal"] == "echo"
    assert span.attributes["a2a_secure.verified"] is True


# -- the real OTLP/HTTP exporter ---------------------------------------------------------------
async def test_otlp_http_export_of_three_agents_decodes_as_one_trace() -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    with otlp_receiver() as (endpoint, received):
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))
        with sdk_provider(processor) as provider:
            async with three_agents() as agents:
                with trace.get_tracer("test").start_as_current_span("user request"):
                    await agents.client.request(
                        agents.orchestrator.identity.did,
                        {"goal": "plan", "inputs": {"text": SECRET}},
                        endpoint=agents.orchestrator_url,
                    )
            assert provider.force_flush(10_000)
    assert all(SECRET.encode() not in body for body in received)
    # The sessions closed at the end are traces of their own; FastAPI's spans are not ours.
    spans = [s for s in decode_spans(received, ("a2a_secure", "test")) if "close" not in s.name]
    assert len({s.trace_id for s in spans}) == 1
    by_id = {s.span_id: s for s in spans}

    attrs = otlp_attributes
    chain = []
    span = next(
        s
        for s in spans
        if s.name == "a2a_secure/intent"
        and attrs(s).get("a2a_secure.goal") == "translate"
        and s.kind == s.SPAN_KIND_SERVER
    )
    while span is not None:
        chain.append((span.name, span.kind, attrs(span).get("a2a_secure.goal")))
        span = by_id.get(span.parent_span_id)
    assert chain == [
        ("a2a_secure/intent", 2, "translate"),  # translator, server
        ("a2a_secure/intent", 3, "translate"),  # orchestrator, client
        ("a2a_secure/intent", 2, "plan"),  # orchestrator, server
        ("a2a_secure/intent", 3, "plan"),  # the client
        ("user request", 1, None),
    ]


def test_an_mcp_meta_traceparent_becomes_the_parent_when_no_span_is_current(
    exporter: InMemorySpanExporter,
) -> None:
    from opentelemetry import trace

    from a2a_secure.telemetry import tracing

    meta = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "progress_token": 1}
    with tracing.continue_trace(meta):
        ctx = trace.get_current_span().get_span_context()
        assert format(ctx.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
        other = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        with trace.get_tracer("test").start_as_current_span("inner") as inner, tracing.continue_trace(other):
            assert trace.get_current_span() is inner  # a current span is never replaced
    assert not trace.get_current_span().get_span_context().is_valid
    for bad in (None, {}, {"traceparent": "garbage"}, ["traceparent"]):
        with tracing.continue_trace(bad):
            assert not trace.get_current_span().get_span_context().is_valid


async def test_demo_trace_shows_one_trace_tree_metrics_and_json_lines(tmp_path: Path) -> None:
    import io
    import json

    from a2a_secure.demo import run_demo
    from a2a_secure.telemetry.view import SpanCollector

    collector = SpanCollector()
    out = io.StringIO()
    with sdk_provider(collector):
        assert await run_demo(out, tmp_path, trace=collector) == 0
    text = out.getvalue()
    tree = text.split("trace tree (OpenTelemetry spans of every agent, one trace):\n")[1]
    traces = [line for line in tree.splitlines() if line.startswith("trace ")]
    assert len(traces) == 2  # the demo, and the attacker's forged request (no traceparent)
    first = tree.split(traces[1])[0]
    for agent in ("translator", "summarizer", "sentiment", "calendar"):
        assert f"to={agent}" in first
    assert "a2a_secure/intent [server]" in first and "events=hello,proof,accept_policy" in first
    assert "translator  translate success: 2; translate error -32040: 1" in text
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert {r["event"] for r in records} >= {"hello", "proof", "accept_policy", "intent", "close"}
    assert all(len(r["trace_id"]) == 32 and len(r["span_id"]) == 16 for r in records)
