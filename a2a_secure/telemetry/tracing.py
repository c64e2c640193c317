"""OpenTelemetry spans for handshakes and intents, and the W3C trace context between agents.

The SDK only uses the OpenTelemetry *API* (the ``otel`` extra), and only once the
application has imported it and configured a tracer provider: :func:`tracer` looks
``opentelemetry.trace`` up in ``sys.modules`` and returns None while it is absent or while
no SDK provider is set, so an agent without tracing pays a dictionary look-up per hook and
never imports OpenTelemetry.

Spans (names and attributes follow the RPC semantic conventions for JSON-RPC where they
fit; the SDK's own attributes are under ``a2a_secure.``):

* server: one ``SERVER`` span per POST to ``/a2a/handshake`` or ``/a2a/intent``, named
  ``a2a_secure/<method>`` (``hello``, ``proof``, ``accept_policy``, ``intent``, ``close``),
  the child of the ``traceparent`` header when one came. Handlers run inside it, so a
  handler's own calls to other agents join the trace.
* client: one ``CLIENT`` span ``a2a_secure/handshake`` per handshake, its steps as events,
  and one ``a2a_secure/intent`` per intent (``request``, ``stream``), whose HTTP requests
  carry ``traceparent``/``tracestate``. Retries and re-handshakes are events on it.

Attributes: goal, sequence, outcome, error code, the DIDs, a hash of the session id, and
whether the answer was streamed or replayed. Never inputs, results, tokens, signatures,
nonces or keys (SECURITY.md, "Telemetry"). The trace context travels only in HTTP headers,
outside the signed request: a forged one can only mislead a trace, never the protocol.

Without an SDK, a trace context given from outside (:func:`continue_trace`: an MCP
``_meta``, or OpenTelemetry's ``TRACEPARENT``/``TRACESTATE`` environment variables for
``a2a-secure call``) is still carried on unchanged in the requests' headers, and a server
that writes JSON log lines puts the incoming ``traceparent``'s trace id on each
(:func:`remember_request_trace`), so that the logs of several agents correlate.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from a2a_secure.jsonrpc import JSONRPC_VERSION
from a2a_secure.version import __version__

__all__ = [
    "NOOP",
    "ClientTrace",
    "annotate_server",
    "client_span",
    "client_step",
    "configure_from_env",
    "continue_env_trace",
    "continue_trace",
    "event",
    "server_span",
    "remember_request_trace",
    "request_trace_id",
    "start_client_span",
    "trace_headers",
    "tracer",
]

_log = logging.getLogger("a2a_secure.telemetry")
NOOP = contextlib.nullcontext()
# The standard OpenTelemetry variables that ask for traces to be exported over OTLP.
OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROPAGATED = (b"traceparent", b"tracestate")
_RPC = {"rpc.system": "jsonrpc", "rpc.service": "a2a_secure", "rpc.jsonrpc.version": JSONRPC_VERSION}
_cache: list[Any] = [None, None]  # the provider last seen, and its tracer (None: no SDK)
# W3C Trace Context, section 3.2 (traceparent): version (not ff), trace id and parent id
# (neither all zeros), flags.
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_MAX_TRACESTATE = 512
# Without an SDK: the headers of a trace context given from outside, sent on unchanged...
_inherited: ContextVar[tuple[tuple[bytes, bytes], ...]] = ContextVar("a2a_secure_inherited", default=())
# ...and the trace id of the request being answered, for its JSON log line.
_request_trace: ContextVar[str | None] = ContextVar("a2a_secure_request_trace", default=None)


def session_hash(session_id: str) -> str:
    """The first 16 hex digits of SHA-256 of a session id: links records, reveals nothing."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


def tracer() -> Any | None:
    """The SDK's tracer, or None when no OpenTelemetry SDK is configured in this process.

    The first test is a dictionary look-up: without ``opentelemetry.sdk.trace`` imported no
    SDK provider can be set (FastAPI imports the API alone, and asking the API for its
    provider costs a failed ``os.environ`` look-up, an exception, on every request).
    """
    if "opentelemetry.sdk.trace" not in sys.modules:
        return None
    api = sys.modules["opentelemetry.trace"]
    provider = api.get_tracer_provider()
    if provider is not _cache[0]:
        found = None
        if not isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
            found = provider.get_tracer("a2a_secure", __version__)
        _cache[:] = [provider, found]
    return _cache[1]


def _recording_span() -> Any | None:
    if tracer() is None:
        return None
    span = sys.modules["opentelemetry.trace"].get_current_span()
    return span if span.is_recording() else None


class _Api:
    """The OpenTelemetry API names used once a tracer exists (imported then, once)."""

    def __init__(self) -> None:
        from opentelemetry import propagate, trace  # noqa: PLC0415 - only with an SDK configured

        self.extract = propagate.extract
        self.current = trace.get_current_span
        self.server = trace.SpanKind.SERVER
        self.error = trace.StatusCode.ERROR


_api: list[_Api] = []


def _names() -> _Api:
    if not _api:
        _api.append(_Api())
    return _api[0]


# -- server ------------------------------------------------------------------------------------
def remember_request_trace(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Keep the trace id of this request's ``traceparent`` (None: none, or invalid) for its
    log line (:func:`request_trace_id`); for a server with JSON logs and no SDK."""
    found = None
    for name, value in headers:
        if name == b"traceparent":
            match = _TRACEPARENT.fullmatch(value.decode("latin-1"))
            found = match.group(1) if match else None
            break
    _request_trace.set(found)


def request_trace_id() -> str | None:
    """The trace id :func:`remember_request_trace` kept for the request being answered."""
    return _request_trace.get()


def server_span(
    tracer: Any, headers: Sequence[tuple[bytes, bytes]], endpoint: str
) -> contextlib.AbstractContextManager[Any]:
    """The SERVER span of one POST, the child of its ``traceparent`` header if it has one."""
    api = _names()
    carrier = {name.decode(): value.decode("latin-1") for name, value in headers if name in _PROPAGATED}
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        f"a2a_secure/{endpoint}",
        context=api.extract(carrier) if carrier else None,
        kind=api.server,
        attributes=_RPC,
        record_exception=False,  # an exception's text may quote what it was given
        set_status_on_exception=False,
    )


def annotate_server(fields: Mapping[str, Any]) -> None:
    """Name and describe the current server span from one request's telemetry fields.

    Called only while :func:`tracer` is not None.
    """
    span = _names().current()
    if not span.is_recording():
        return
    method = fields["method"]
    span.update_name(f"a2a_secure/{method}")
    attrs: dict[str, Any] = {"rpc.method": method, "a2a_secure.outcome": fields["outcome"]}
    for key in ("goal", "sequence", "caller_did", "session_hash", "reason"):
        if fields.get(key) is not None:
            attrs[f"a2a_secure.{key}"] = fields[key]
    for key in ("verified", "stream", "replay"):
        if fields.get(key):
            attrs[f"a2a_secure.{key}"] = True
    if fields.get("http_status"):
        attrs["http.response.status_code"] = fields["http_status"]
    code = fields.get("code")
    if code is not None:
        attrs["rpc.jsonrpc.error_code"] = code
        attrs["a2a_secure.error_code"] = code
        attrs["error.type"] = str(code)
        span.set_status(_names().error, str(code))
    span.set_attributes(attrs)


# -- client ------------------------------------------------------------------------------------
class ClientTrace:
    """A client span that is not the current one (a stream's, held across its yields)."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self.headers = _inject(span)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """Add an event to the span."""
        self.span.add_event(name, dict(attributes))

    def end(self, error: Any | None) -> None:
        """End the span with the outcome of ``error`` (an ``A2AError`` or None)."""
        _outcome(self.span, error)
        self.span.end()


def _inject(span: Any) -> list[tuple[bytes, bytes]]:
    from opentelemetry import propagate, trace  # noqa: PLC0415

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return [(k.encode(), v.encode("latin-1")) for k, v in carrier.items() if k.encode() in _PROPAGATED]


def _outcome(span: Any, error: Any | None) -> None:
    if error is None:
        span.set_attribute("a2a_secure.outcome", "success")
        return
    from opentelemetry.trace import StatusCode  # noqa: PLC0415

    code = getattr(error, "code", None)
    span.set_attributes(
        {
            "a2a_secure.outcome": "error",
            "a2a_secure.error_code": code if isinstance(code, int) else -32603,
            "rpc.jsonrpc.error_code": code if isinstance(code, int) else -32603,
            "error.type": str(code) if isinstance(code, int) else type(error).__name__,
        }
    )
    span.set_status(StatusCode.ERROR, str(code))


def _client_attributes(what: str, server_did: str, goal: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {**_RPC, "rpc.method": what, "a2a_secure.server_did": server_did[:256]}
    if isinstance(goal, str):
        attrs["a2a_secure.goal"] = goal[:256]
    return attrs


@contextlib.contextmanager
def _current_client_span(tracer: Any, what: str, server_did: str, goal: Any) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    with tracer.start_as_current_span(
        f"a2a_secure/{what}",
        kind=SpanKind.CLIENT,
        attributes=_client_attributes(what, server_did, goal),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _outcome(span, exc)
            raise
        if span.attributes.get("a2a_secure.outcome") is None:
            span.set_attribute("a2a_secure.outcome", "success")


def client_span(what: str, server_did: str, goal: Any = None) -> contextlib.AbstractContextManager[Any]:
    """The current CLIENT span of a handshake or an intent (a shared no-op without an SDK)."""
    found = tracer()
    if found is None:
        return NOOP
    return _current_client_span(found, what, server_did, goal)


def start_client_span(what: str, server_did: str, goal: Any = None) -> ClientTrace | None:
    """A CLIENT span that is not made current (for a generator), or None without an SDK."""
    found = tracer()
    if found is None:
        return None
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    span = found.start_span(
        f"a2a_secure/{what}", kind=SpanKind.CLIENT, attributes=_client_attributes(what, server_did, goal)
    )
    span.set_attribute("a2a_secure.stream", True)
    return ClientTrace(span)


def trace_headers() -> list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]:
    """``traceparent`` (and ``tracestate``) of the current span, for an outgoing request;
    without one, those of a context given from outside (:func:`continue_trace`), if any."""
    span = _recording_span()
    if span is None:
        return _inherited.get()
    return _inject(span)


def event(name: str, attributes: Mapping[str, Any]) -> None:
    """Add an event to the current span, if one is recording."""
    span = _recording_span()
    if span is not None:
        span.add_event(name, dict(attributes))


def client_step(
    step: str, error: Any | None, *, goal: Any = None, sequence: int | None = None, session_id: Any = None
) -> None:
    """A client step ended: an event on the handshake span, or the outcome of an intent span."""
    span = _recording_span()
    if span is None:
        return
    attrs: dict[str, Any] = {"a2a_secure.outcome": "error" if error is not None else "success"}
    if error is not None:
        attrs["a2a_secure.error_code"] = getattr(error, "code", -32603)
    if sequence is not None:
        attrs["a2a_secure.sequence"] = sequence
    if isinstance(session_id, str):
        attrs["a2a_secure.session_hash"] = session_hash(session_id)
    if step in ("hello", "proof", "accept_policy"):
        span.add_event(f"a2a_secure.{step}", attrs)
        if error is not None:
            _outcome(span, error)
        return
    if isinstance(goal, str):
        attrs["a2a_secure.goal"] = goal[:256]
    span.set_attributes(attrs)


def _carrier(meta: Any) -> dict[str, str] | None:
    """The valid W3C ``traceparent`` (and ``tracestate``) in ``meta``, or None."""
    if not isinstance(meta, Mapping):
        return None
    parent = meta.get("traceparent")
    if not isinstance(parent, str) or _TRACEPARENT.fullmatch(parent) is None:
        return None
    carrier = {"traceparent": parent}
    state = meta.get("tracestate")
    if isinstance(state, str) and len(state) <= _MAX_TRACESTATE and state.isascii() and state.isprintable():
        carrier["tracestate"] = state
    return carrier


@contextlib.contextmanager
def _forwarding(carrier: Mapping[str, str]) -> Iterator[None]:
    token = _inherited.set(tuple((k.encode(), v.encode()) for k, v in carrier.items()))
    try:
        yield
    finally:
        _inherited.reset(token)


def continue_env_trace(environ: Mapping[str, str] | None = None) -> contextlib.AbstractContextManager[Any]:
    """:func:`continue_trace` of OpenTelemetry's ``TRACEPARENT``/``TRACESTATE`` variables
    (the environment-variable carrier), so that a script's call joins the script's trace."""
    env = os.environ if environ is None else environ
    return continue_trace({"traceparent": env.get("TRACEPARENT"), "tracestate": env.get("TRACESTATE")})


def continue_trace(meta: Any) -> contextlib.AbstractContextManager[Any]:
    """Continue the trace context in ``meta`` (an MCP ``_meta``, or the environment's),
    unless a span already is current.

    With an SDK it is made the current context: the intent spans are its children (the MCP
    SDK's own middleware usually opened a span from it already; then nothing changes here).
    Without one, the requests sent meanwhile carry it on unchanged. An invalid
    ``traceparent`` is ignored, as W3C Trace Context says.
    """
    carrier = _carrier(meta)
    if carrier is None:
        return NOOP
    if tracer() is None:
        return _forwarding(carrier)
    from opentelemetry import context, propagate, trace  # noqa: PLC0415

    if trace.get_current_span().get_span_context().is_valid:
        return NOOP
    extracted = propagate.extract(carrier)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return NOOP

    @contextlib.contextmanager
    def attached() -> Iterator[None]:
        token = context.attach(extracted)
        try:
            yield
        finally:
            context.detach(token)

    return attached()


def configure_from_env(service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Export traces over OTLP/HTTP when the standard ``OTEL_*`` variables ask for it.

    For the processes the SDK starts itself (``serve`` workers, ``mcp``): with
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (and
    ``OTEL_TRACES_EXPORTER`` unset or ``otlp``), and no tracer provider configured yet, a
    ``TracerProvider`` with a batch OTLP/HTTP exporter becomes the global one. The exporter
    reads the endpoint, headers and timeout from those variables; ``OTEL_SERVICE_NAME``
    names the service (else ``service_name``). Needs ``opentelemetry-sdk`` and
    ``opentelemetry-exporter-otlp-proto-http``; without them a warning says so. Returns
    whether tracing was configured here.
    """
    env = os.environ if environ is None else environ
    if not any(env.get(name) for name in OTLP_ENV) or env.get("OTEL_TRACES_EXPORTER", "otlp") != "otlp":
        return False
    try:
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError:
        _log.warning(
            "OTLP tracing asked for, but opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http "
            "are not installed: no traces are exported"
        )
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application configured its own
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def shutdown() -> None:
    """Flush and stop the global tracer provider, if it is an SDK one (at process exit)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return
    stop = getattr(api.get_tracer_provider(), "shutdown", None)
    if stop is not None:
        stop()
