"""JSON-RPC 2.0 envelopes, built and read without writing raw dicts.

Builders return the envelope as a ``dict`` ready for any JSON encoder, with its members in
the order the SDK writes them on the wire, and check their arguments (``TypeError`` for a
wrong type, ``ValueError`` for a wrong value)::

    request("intent", params, "req-1")        {"jsonrpc","method","params","id"}
    success("req-1", result)                  {"jsonrpc","id","result"}
    error("req-1", ErrorCodes.INVALID_PARAMS, "text is required")
                                              {"jsonrpc","id","error":{"code","message"[,"data"]}}
    partial("req-1", result, remaining=2)     {"jsonrpc","id","result","remaining"}

Readers take anything (a parsed body, or garbage) and never raise: they answer ``False`` or
``None`` for whatever is not a well-formed JSON-RPC 2.0 response of their kind. A ``result``
or ``hints`` of ``null`` reads as ``None`` too: ask :func:`is_success` first when that
matters::

    if is_success(body):
        result, hints = get_result(body), get_hints(body)
    elif is_error(body):
        err = get_error(body)                 # {"code": int, "message": str[, "data": …]}

Where the additions go, and why
-------------------------------
PROTOCOL.md fixes every member of a request: a server refuses an unknown member of the
envelope (-32600) and of ``params`` (-32602), and the handshake and intent results have exact
member sets that a client checks. The only place a PROTOCOL.md-only peer ignores is the top
level of a (not streamed) *response*, so the optional members live there:

- ``hints`` (a JSON object) and ``agent_card`` (the agent's card, a JSON object) are top-level
  members of a success response, beside ``result``: advisory and unsigned, a client must not
  trust them more than any unsigned byte (the signed answer is ``result``). Some gateways
  put them under a top-level ``metadata`` object instead, as
  ``metadata.context_hints`` and ``metadata.agent_card``: :func:`get_hints` and
  :func:`get_agent_card` read that form too, when the top-level member is absent (a top-level
  member, even a malformed one, is what the response says). The builders write the top-level
  form only.
- ``remaining`` (an integer >= 0: how many more parts follow) is a top-level member of a
  :func:`partial` response, whose ``result`` is one part.
- ``metadata`` of a request is a top-level member of the request envelope. No PROTOCOL.md
  server accepts one, so :func:`request` refuses it for the protocol's own methods
  (``hello``, ``proof``, ``accept_policy``, ``intent``, ``close``); it is for other JSON-RPC
  methods a gateway forwards.

Events of a streamed answer (PROTOCOL.md §6.4) are exactly ``{"jsonrpc","id","result"}``:
write them with :func:`success` and no optional member.

``ErrorCodes`` are the codes of PROTOCOL.md §7 and JSON-RPC 2.0; each equals the ``code`` of
the class of the same name in :mod:`a2a_secure.errors` (``INVALID_PARAMS`` and
``InvalidParams``), which stays the one place that maps codes to HTTP statuses.

This module imports nothing beyond the standard library and :mod:`a2a_secure.errors`. The
bytes of the protocol's own two endpoints are parsed and written by
:mod:`a2a_secure.protocol.wire`, from the builders here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, cast

__all__ = [
    "JSONRPC_VERSION",
    "PROTOCOL_METHODS",
    "ErrorCodes",
    "JsonRpcId",
    "error",
    "get_agent_card",
    "get_error",
    "get_hints",
    "get_remaining",
    "get_result",
    "is_error",
    "is_success",
    "partial",
    "request",
    "success",
]

JSONRPC_VERSION = "2.0"
JsonRpcId = str | int | None
# The methods PROTOCOL.md §4 serves; their envelopes and params admit no member it does not list.
PROTOCOL_METHODS = frozenset(("hello", "proof", "accept_policy", "intent", "close"))
# PROTOCOL.md §1 and §4: ids are I-JSON integers, or strings of at most 128 characters.
_MAX_INT = 2**53 - 1
_MAX_REQUEST_ID_LENGTH = 128


class ErrorCodes(enum.IntEnum):
    """JSON-RPC 2.0 error codes, those of PROTOCOL.md §7 (-32040 … -32049), and -32050 of
    the approval extension (§12.1)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    AUTHENTICATION_FAILED = -32040
    HANDSHAKE_UNKNOWN = -32041
    POLICY_VIOLATION = -32042
    SESSION_UNKNOWN = -32043
    SEQUENCE_ERROR = -32044
    STALE_TIMESTAMP = -32045
    UNSUPPORTED_VERSION = -32046
    DID_RESOLUTION_ERROR = -32047
    UNAVAILABLE = -32048
    INTENT_TIMEOUT = -32049
    ACTION_NOT_PENDING = -32050


# -- unchecked builders: the SDK's own hot paths, whose arguments the core already checked ---------
# They fix the member order, and so the bytes on the wire.


def _request(method: str, params: Any, request_id: JsonRpcId) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "method": method, "params": params, "id": request_id}


def _success(request_id: JsonRpcId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result}


def _error(request_id: JsonRpcId, error_object: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error_object}


def _head(request_id: JsonRpcId) -> dict[str, Any]:
    """A response's envelope without its ``result`` or ``error`` (for a body written in parts)."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id}


def _request_json(method: str, params: bytes, request_id: int) -> bytes:
    """The JSON of ``_request`` for ``params`` already written, a plain-ASCII method name and
    an integer id (every request this library's client sends)."""
    ascii_method = method.encode("ascii")
    return b'{"jsonrpc":"2.0","method":"%s","params":%s,"id":%d}' % (ascii_method, params, request_id)


def _head_int(request_id: int) -> bytes:
    """The JSON of ``_head(request_id)`` for an integer id, without its closing brace: the start
    of a body written in parts (the id of every request this library's client sends)."""
    return b'{"jsonrpc":"2.0","id":%d' % request_id


# -- checked builders ------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_id(request_id: object, *, in_request: bool) -> JsonRpcId:
    if request_id is None:
        if in_request:
            raise ValueError("a request needs an id: PROTOCOL.md servers refuse null ids and notifications")
        return None
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        value = int(request_id)
        if not -_MAX_INT <= value <= _MAX_INT:
            raise ValueError("an integer id must lie within ±(2**53 - 1) (I-JSON)")
        return value
    if isinstance(request_id, str):
        if in_request and len(request_id) > _MAX_REQUEST_ID_LENGTH:
            raise ValueError(f"a string id has at most {_MAX_REQUEST_ID_LENGTH} characters")
        return str(request_id)
    raise TypeError(f"id must be a str, an int or None, not {type(request_id).__name__}")


_INF = float("inf")
_MAX_DEPTH = 128  # containers inside containers, far more than any protocol value needs


def _check_json(value: object, what: str) -> None:
    """Raise unless ``value`` is JSON: None, bool, int, finite float, str, and lists, tuples
    and str-keyed mappings of those, at most ``_MAX_DEPTH`` deep. Iterative: a deep value
    gets a ValueError, never a RecursionError; an encoder would otherwise write a key ``1``
    as ``"1"``, or fail only when the envelope is sent."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, bool | int | str):
            continue
        if isinstance(item, float):
            if not -_INF < item < _INF:  # False for NaN too
                raise ValueError(f"{what} holds a non-finite number")
            continue
        if depth >= _MAX_DEPTH:
            raise ValueError(f"{what} is nested deeper than {_MAX_DEPTH} levels")
        if isinstance(item, Mapping):
            for key, member in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"{what} member names must be str, not {type(key).__name__}")
                stack.append((member, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((member, depth + 1) for member in item)
        else:
            raise TypeError(f"{what} holds a {type(item).__name__}, which is not a JSON value")


def _check_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a JSON object (a mapping), not {type(value).__name__}")
    _check_json(value, what)
    return dict(value)


def request(method: str, params: Any, id: JsonRpcId, metadata: Any = None) -> dict[str, Any]:
    """A JSON-RPC 2.0 request envelope.

    Args:
        method: The method name, a non-empty string.
        params: The params: a JSON object (mapping) or array (list or tuple).
        id: A string (at most 128 characters) or an integer; PROTOCOL.md has no notifications.
        metadata: A JSON object, written as the top-level member ``metadata``; refused for the
            methods of PROTOCOL.md, whose servers refuse any member they do not know.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an empty method, an id out of range, metadata for a protocol method.
    """
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, not {type(method).__name__}")
    if not method:
        raise ValueError("method must not be empty")
    if isinstance(params, Mapping):
        params = _check_object(params, "params")
    elif isinstance(params, list | tuple):
        _check_json(params, "params")
        params = list(params)
    else:
        raise TypeError(f"params must be a JSON object or array, not {type(params).__name__}")
    envelope = _request(method, params, _check_id(id, in_request=True))
    if metadata is not None:
        if method in PROTOCOL_METHODS:
            raise ValueError(
                f"metadata cannot travel with {method!r}: PROTOCOL.md servers refuse unknown members"
                " in the envelope (-32600) and in params (-32602)"
            )
        envelope["metadata"] = _check_object(metadata, "metadata")
    return envelope


def success(
    id: JsonRpcId,
    result: Any,
    hints: Mapping[str, Any] | None = None,
    agent_card: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON-RPC 2.0 success response envelope.

    Args:
        id: The id of the request it answers (``None`` only when that id could not be read).
        result: The result, any JSON value.
        hints: Optional advisory JSON object, the top-level member ``hints``.
        agent_card: Optional agent card (a JSON object), the top-level member ``agent_card``.

    Raises:
        TypeError: an id, ``hints`` or ``agent_card`` of the wrong type.
        ValueError: an integer id out of range.
    """
    _check_json(result, "result")
    envelope = _success(_check_id(id, in_request=False), result)
    if hints is not None:
        envelope["hints"] = _check_object(hints, "hints")
    if agent_card is not None:
        envelope["agent_card"] = _check_object(agent_card, "agent_card")
    return envelope


def error(id: JsonRpcId, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC 2.0 error response envelope.

    Args:
        id: The id of the request it answers, or ``None`` when it could not be read.
        code: An integer code (an :class:`ErrorCodes` member, or an application's own).
        message: A short message for the peer (never a secret or a stack trace).
        data: Optional JSON value, the member ``data`` of the error object.

    Raises:
        TypeError: an id, code or message of the wrong type.
        ValueError: an integer out of range.
    """
    if not _is_int(code):
        raise TypeError(f"code must be an int, not {type(code).__name__}")
    if not -_MAX_INT <= code <= _MAX_INT:
        raise ValueError("code must lie within ±(2**53 - 1) (I-JSON)")
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, not {type(message).__name__}")
    error_object: dict[str, Any] = {"code": int(code), "message": str(message)}
    if data is not None:
        _check_json(data, "data")
        error_object["data"] = data
    return _error(_check_id(id, in_request=False), error_object)


def partial(id: JsonRpcId, result: Any, remaining: int) -> dict[str, Any]:
    """A success response carrying one part of an answer, with ``remaining`` parts to follow.

    Raises:
        TypeError: an id or ``remaining`` of the wrong type.
        ValueError: a negative ``remaining``, or an integer out of range.
    """
    if not _is_int(remaining):
        raise TypeError(f"remaining must be an int, not {type(remaining).__name__}")
    if not 0 <= remaining <= _MAX_INT:
        raise ValueError("remaining must lie within 0 … 2**53 - 1")
    _check_json(result, "result")
    envelope = _success(_check_id(id, in_request=False), result)
    envelope["remaining"] = int(remaining)
    return envelope


# -- readers: never raise ---------------------------------------------------------------------------
# A body may be anything a caller holds, hostile objects included. ``dict.get`` (unbound) reads
# what a dict really stores whatever a subclass overrides; only values of exact built-in types
# are compared, so no foreign ``__eq__`` runs. A key whose hash collides with a member name can
# still run its ``__eq__`` inside the lookup: that, and anything else a hostile object raises,
# reads as "not well formed".

_MISSING: Any = object()


def _member(body: object, name: str) -> Any:
    """``body[name]``, or ``_MISSING`` when ``body`` is not a dict or has no such member."""
    try:
        if not issubclass(type(body), dict):
            return _MISSING
        return dict.get(cast("dict[str, Any]", body), name, _MISSING)
    except Exception:  # a hostile key: the reader answers "not well formed"
        return _MISSING


def _is_a(value: object, cls: type) -> bool:
    # issubclass on the type, not isinstance: isinstance may ask the object for __class__.
    return issubclass(type(value), cls) and type(value) is not bool


def _valid_id(value: Any) -> bool:
    return value is None or _is_a(value, str) or _is_a(value, int)


def _envelope_ok(body: object) -> bool:
    version = _member(body, "jsonrpc")
    return type(version) is str and version == JSONRPC_VERSION and _valid_id(_member(body, "id"))


def is_success(body: object) -> bool:
    """True when ``body`` is a JSON-RPC 2.0 success: ``jsonrpc`` "2.0", an id, ``result``, no ``error``."""
    return (
        _envelope_ok(body) and _member(body, "result") is not _MISSING and _member(body, "error") is _MISSING
    )


def _error_object(body: object) -> dict[str, Any] | None:
    if not _envelope_ok(body) or _member(body, "result") is not _MISSING:
        return None
    obj = _member(body, "error")
    code, message = _member(obj, "code"), _member(obj, "message")
    if not (_is_a(code, int) and _is_a(message, str)):
        return None
    # A fresh dict of what was read: the caller never gets the (maybe hostile) original.
    error_object: dict[str, Any] = {"code": code, "message": message}
    data = _member(obj, "data")
    if data is not _MISSING:
        error_object["data"] = data
    return error_object


def is_error(body: object) -> bool:
    """True when ``body`` is a JSON-RPC 2.0 error: ``jsonrpc`` "2.0", an id, and an ``error``
    object with an integer ``code`` and a string ``message`` (and no ``result``)."""
    return _error_object(body) is not None


def get_result(body: object) -> Any:
    """The ``result`` of a success response, else ``None``."""
    return _member(body, "result") if is_success(body) else None


def get_error(body: object) -> dict[str, Any] | None:
    """The ``error`` object of an error response (a new dict of ``code``, ``message`` and, if
    present, ``data``), else ``None``."""
    return _error_object(body)


# Where such a gateway puts each optional member, under the top-level ``metadata``.
_IN_METADATA = {"hints": "context_hints", "agent_card": "agent_card"}


def _optional_object(body: object, name: str) -> dict[str, Any] | None:
    if not is_success(body):
        return None
    value = _member(body, name)
    if value is _MISSING:
        value = _member(_member(body, "metadata"), _IN_METADATA[name])
    return value if type(value) is dict else None


def get_hints(body: object) -> dict[str, Any] | None:
    """The ``hints`` object of a success response (or its ``metadata.context_hints``), else
    ``None`` (see the module docstring)."""
    return _optional_object(body, "hints")


def get_agent_card(body: object) -> dict[str, Any] | None:
    """The ``agent_card`` object of a success response (or its ``metadata.agent_card``), else
    ``None``."""
    return _optional_object(body, "agent_card")


def get_remaining(body: object) -> int | None:
    """The ``remaining`` count of a :func:`partial` response, else ``None``."""
    if not is_success(body):
        return None
    value = _member(body, "remaining")
    return value if type(value) is int and value >= 0 else None  # exact int: no foreign __ge__
