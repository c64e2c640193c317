"""Telemetry tests: an OpenTelemetry SDK for one test, three real agents, secret scans.

* :func:`sdk_provider`: installs a ``TracerProvider`` as the global one for the duration of
  a ``with`` block and removes it after (the API allows one per process; tests need one
  each, so the globals are reset as OpenTelemetry's own test utilities do);
* :func:`three_agents`: a client, an orchestrator server whose ``plan`` handler calls the
  translator with its own ``A2AClient``, and the translator server, each under uvicorn on
  127.0.0.1;
* :func:`span_text`: everything a span exports (name, attributes, events), as text to scan;
* :func:`otlp_receiver`: an OTLP/HTTP trace receiver on 127.0.0.1 keeping the bodies it is
  sent, and :func:`decode_spans` to read them (opentelemetry-proto).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from http_helpers import identity

from a2a_secure.client.http import A2AClient
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app

SECRET = "SECRET-db-password=hunter2"


@contextlib.contextmanager
def sdk_provider(*processors: Any) -> Iterator[Any]:
    """A TracerProvider with ``processors``, global while the block runs."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util._once import Once

    provider = TracerProvider()
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    try:
        yield provider
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


@dataclass
class Agents:
    """The three agents of :func:`three_agents` and what they learned."""

    client: A2AClient
    client_id: Identity
    orchestrator: AgentServer
    orchestrator_url: str
    translator: AgentServer
    translator_url: str
    seen: dict[str, Any]


@contextlib.asynccontextmanager
async def three_agents(**server_options: Any) -> AsyncIterator[Agents]:
    """Client -> orchestrator (``plan``, calls the translator) -> translator (``translate``)."""
    seen: dict[str, Any] = {"sessions": [], "results": []}
    translator = AgentServer(identity("translator"), **server_options)

    @translator.intent("translate")
    async def translate(inputs: Any, context: IntentContext) -> Any:
        seen["sessions"].append(context.session_id)
        return {"text": f"[es] {inputs['text']}"}

    @translator.intent("count")
    async def count(inputs: Any) -> AsyncIterator[Any]:
        for i in range(3):
            yield {"n": i, "echo": inputs["text"]}

    orchestrator = AgentServer(identity("orchestrator"), **server_options)
    orch_client = A2AClient(identity("orchestrator"))

    async with contextlib.AsyncExitStack() as stack:
        translator_url = await stack.enter_async_context(serve_app(translator.app()))

        @orchestrator.intent("plan")
        async def plan(inputs: Any, context: IntentContext) -> Any:
            seen["sessions"].append(context.session_id)
            result = await orch_client.request(
                translator.identity.did,
                {"goal": "translate", "inputs": {"text": inputs["text"]}},
                endpoint=translator_url,
            )
            seen["results"].append(result.result)
            return {"plan": result.result}

        orchestrator_url = await stack.enter_async_context(serve_app(orchestrator.app()))
        stack.push_async_callback(orch_client.aclose)
        client_id = identity("client")
        client = await stack.enter_async_context(A2AClient(client_id))
        yield Agents(client, client_id, orchestrator, orchestrator_url, translator, translator_url, seen)


def span_text(span: Any) -> str:
    """Name, attributes and events of an SDK ``ReadableSpan`` as one JSON text."""
    return json.dumps(
        {
            "name": span.name,
            "attributes": dict(span.attributes or {}),
            "status": span.status.description,
            "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        },
        default=str,
    )


class _Receiver(BaseHTTPRequestHandler):
    received: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf":
            self.received.append(body)
            self.send_response(200)
        else:
            self.send_response(404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[bytes]]]:
    """(the ``/v1/traces`` URL, the protobuf bodies received) of a receiver on 127.0.0.1."""
    received: list[bytes] = []
    httpd = HTTPServer(("127.0.0.1", 0), type("Receiver", (_Receiver,), {"received": received}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces", received
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


def decode_spans(bodies: list[bytes], scopes: tuple[str, ...] | None = None) -> list[Any]:
    """The spans in OTLP ``ExportTraceServiceRequest`` bodies (of the named scopes only)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: list[Any] = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                if scopes is None or scope_spans.scope.name in scopes:
                    spans.extend(scope_spans.spans)
    return spans


def otlp_attributes(span: Any) -> dict[str, Any]:
    """An OTLP span's string and integer attributes."""
    return {a.key: a.value.string_value or a.value.int_value for a in span.attributes}
