"""The two endpoints' bodies on the wire: JSON-RPC 2.0 as PROTOCOL.md §4 and §9 restrict it.

:func:`parse_request` turns the bytes POSTed to ``/a2a/handshake`` or ``/a2a/intent`` into
a checked :class:`Envelope` (or the error to answer); the ``encode_*`` functions turn what
the core hands over into the bytes sent back (pure functions). The HTTP adapters of both
sides use it. The public builders and readers of envelopes, for gateways and other
transports, are :mod:`a2a_secure.jsonrpc`: bodies here are written from its unchecked
builders, the one place that knows the envelope's members and their order, because what the
core hands over is already checked and a reply is on every request's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a_secure.errors import A2AError, InvalidParams, InvalidRequest, MethodNotFound
from a2a_secure.identity import encoding
from a2a_secure.jsonrpc import (
    JSONRPC_VERSION,
    JsonRpcId,
    _error,
    _head,
    _head_int,
    _request,
    _request_json,
    _success,
)

__all__ = [
    "ENDPOINT_METHODS",
    "Envelope",
    "EnvelopeError",
    "encode_error",
    "encode_request",
    "encode_request_json",
    "encode_result",
    "encode_result_json",
    "parse_request",
    "read_request",
]

ENDPOINT_METHODS: dict[str, frozenset[str]] = {
    "handshake": frozenset(("hello", "proof", "accept_policy")),
    "intent": frozenset(("intent", "close")),
}
_ENVELOPE = frozenset(("jsonrpc", "method", "params", "id"))


@dataclass(frozen=True, slots=True)
class Envelope:
    """A valid request envelope."""

    id: str | int
    method: str
    params: dict[str, Any]


class EnvelopeError(Exception):
    """An envelope failure, with the id to answer under and the event to audit."""

    def __init__(self, error: A2AError, request_id: JsonRpcId, event: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.request_id = request_id
        self.event = event


def _valid_id(value: Any) -> bool:
    if type(value) is int:
        return True
    return isinstance(value, str) and len(value) <= 128


def parse_request(body: bytes, endpoint: str) -> Envelope:
    """Parse and check one request body for ``endpoint`` ("handshake" or "intent").

    Raises :class:`EnvelopeError` carrying -32700 (not I-JSON), -32600 (envelope, batch,
    id), -32601 (method not on this endpoint) or -32602 (``params`` not an object).
    """
    return Envelope(*read_request(body, endpoint))


def read_request(body: bytes, endpoint: str) -> tuple[str | int, str, dict[str, Any]]:
    """:func:`parse_request` as a tuple ``(id, method, params)``: what an adapter reads of
    every request, without the :class:`Envelope` around it."""
    try:
        obj = encoding.loads(body)
    except A2AError as exc:
        raise EnvelopeError(exc, None, "reject") from None
    if isinstance(obj, list):
        raise EnvelopeError(InvalidRequest("batches are not supported"), None, "reject")
    if not isinstance(obj, dict):
        raise EnvelopeError(InvalidRequest("request must be a JSON object"), None, "reject")
    rid = obj.get("id")
    if "id" not in obj or not _valid_id(rid):
        raise EnvelopeError(InvalidRequest("id must be a string (<= 128) or an integer"), None, "reject")
    if obj.get("jsonrpc") != JSONRPC_VERSION:
        raise EnvelopeError(InvalidRequest(f"jsonrpc must be {JSONRPC_VERSION!r}"), rid, "reject")
    method = obj.get("method")
    if not isinstance(method, str):
        raise EnvelopeError(InvalidRequest("method must be a string"), rid, "reject")
    if obj.keys() - _ENVELOPE:
        raise EnvelopeError(InvalidRequest("unexpected member in the request envelope"), rid, "reject")
    if method not in ENDPOINT_METHODS[endpoint]:
        raise EnvelopeError(MethodNotFound(f"method {method[:64]!r} is not served here"), rid, "reject")
    params = obj.get("params")
    if not isinstance(params, dict):
        raise EnvelopeError(InvalidParams("params must be an object"), rid, method)
    assert rid is not None
    return rid, method, params


def encode_request(method: str, params: Any, request_id: JsonRpcId) -> bytes:
    """A JSON-RPC request body."""
    return encoding.dumps(_request(method, params, request_id))


def encode_request_json(method: str, params: bytes, request_id: int) -> bytes:
    """:func:`encode_request` of ``params`` already written as compact JSON, an integer id
    and a method name of plain ASCII (as every method the client sends)."""
    return _request_json(method, params, request_id)


def encode_result(request_id: JsonRpcId, result: Any) -> bytes:
    """A JSON-RPC success response body."""
    return encoding.dumps(_success(request_id, result))


def encode_result_json(request_id: JsonRpcId, result: bytes) -> bytes:
    """:func:`encode_result` of a ``result`` already written as compact JSON."""
    head = _head_int(request_id) if type(request_id) is int else encoding.dumps(_head(request_id))[:-1]
    return b'%s,"result":%s}' % (head, result)


def encode_error(request_id: JsonRpcId, error: Any) -> bytes:
    """A JSON-RPC error response body."""
    return encoding.dumps(_error(request_id, error))
