"""The one exception tree of ``a2a_secure``.

Every error the SDK raises on purpose is an :class:`A2AError`. Each class carries the
JSON-RPC code and the HTTP status of PROTOCOL.md §7, so an adapter turns any of them into the
right answer without a lookup table of its own::

    A2AError                         -32603  500
    ├── ParseError                   -32700  400   not JSON / not I-JSON
    ├── InvalidRequest               -32600  400   envelope, id, batch
    │   ├── PayloadTooLarge          -32600  413
    │   ├── UnsupportedMediaType     -32600  415
    │   └── HTTPMethodNotAllowed     -32600  405   an HTTP method the path does not serve
    ├── MethodNotFound               -32601  404   method or intent handler
    ├── InvalidParams                -32602  400   shapes, lengths, base64url, DID syntax
    ├── InternalError                -32603  500
    ├── AuthenticationFailed         -32040  401   signature, typ, kid, payload, DID <-> key
    ├── HandshakeUnknown             -32041  401   unknown, expired, unproven or used handshake
    ├── PolicyViolation              -32042  403
    ├── SessionUnknown               -32043  401   unknown, expired or closed session
    │   └── SessionClosed            -32043  401   (client side) this agent closed the session
    ├── SequenceError                -32044  409   replayed or out of order
    ├── StaleTimestamp               -32045  401
    ├── UnsupportedVersion           -32046  400
    ├── DIDResolutionError           -32047  401
    ├── Unavailable                  -32048  503   rate limited, full, store down (Retry-After)
    │   └── PeerUnreachable          -32048  503   (client side) the peer's endpoint did not answer
    ├── IntentTimeout                -32049  504
    └── ActionNotPending             -32050  409   approval: unknown, expired or decided action

Messages are short and never carry a secret, a key or a stack trace: they are sent to the
peer as they are.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any, ClassVar

__all__ = [
    "A2AError",
    "ActionNotPending",
    "AuthenticationFailed",
    "DIDResolutionError",
    "HTTPMethodNotAllowed",
    "HandshakeUnknown",
    "IntentTimeout",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "ParseError",
    "PayloadTooLarge",
    "PeerUnreachable",
    "PolicyViolation",
    "SequenceError",
    "SessionClosed",
    "SessionUnknown",
    "StaleTimestamp",
    "Unavailable",
    "UnsupportedMediaType",
    "UnsupportedVersion",
    "error_for_code",
    "log_unexpected",
]


class A2AError(Exception):
    """Root of every error the SDK raises; knows its JSON-RPC code and HTTP status."""

    code: ClassVar[int] = -32603
    http_status: ClassVar[int] = 500
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None, *, data: dict[str, Any] | None = None) -> None:
        self.message = message or self.default_message
        self.data = data
        # True when a peer's error came with a valid signature over the request it answers
        # (PROTOCOL.md §6.2); an unsigned error may come from anyone on the path.
        self.signed = False
        super().__init__(self.message)

    def to_error_object(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` member for this error."""
        obj: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            obj["data"] = self.data
        return obj

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code})"


class ParseError(A2AError):
    """The body is not JSON, or not I-JSON (depth, duplicates, NaN, lone surrogates)."""

    code = -32700
    http_status = 400
    default_message = "parse error"


class InvalidRequest(A2AError):
    """The JSON-RPC envelope is wrong (batch, missing or bad id, extra members)."""

    code = -32600
    http_status = 400
    default_message = "invalid request"


class PayloadTooLarge(InvalidRequest):
    """The body exceeds the server's limit."""

    http_status = 413
    default_message = "request body too large"


class UnsupportedMediaType(InvalidRequest):
    """The request's Content-Type is not application/json."""

    http_status = 415
    default_message = "Content-Type must be application/json"


class HTTPMethodNotAllowed(InvalidRequest):
    """The path exists but not for this HTTP method (a GET to ``/a2a/intent``, say)."""

    http_status = 405
    default_message = "HTTP method not allowed"


class MethodNotFound(A2AError):
    """The method is not served on this endpoint, or no handler serves the goal."""

    code = -32601
    http_status = 404
    default_message = "method not found"


class InvalidParams(A2AError):
    """A member is missing, extra, of the wrong type or length, or not canonical."""

    code = -32602
    http_status = 400
    default_message = "invalid params"


class InternalError(A2AError):
    """Something failed inside the agent; the message stays generic."""

    code = -32603
    http_status = 500
    default_message = "internal error"


class AuthenticationFailed(A2AError):
    """A signature, header, payload member or DID <-> key binding did not verify."""

    code = -32040
    http_status = 401
    default_message = "authentication failed"


class HandshakeUnknown(A2AError):
    """The pending handshake is unknown, expired, not yet proven or already used."""

    code = -32041
    http_status = 401
    default_message = "unknown or expired handshake"


class PolicyViolation(A2AError):
    """The agreed policy does not allow this intent."""

    code = -32042
    http_status = 403
    default_message = "intent not allowed by policy"


class SessionUnknown(A2AError):
    """The session is unknown, expired or closed."""

    code = -32043
    http_status = 401
    default_message = "unknown, expired or closed session"


class SessionClosed(SessionUnknown):
    """An intent on a session this agent closed itself: open a new one.

    Raised on the calling side only, never sent (``A2AAgent.send_intent`` after
    ``close_session``), so that the caller learns why, not just that the id is unknown.
    """

    default_message = "session closed by this agent"


class SequenceError(A2AError):
    """The sequence number was replayed or is out of order."""

    code = -32044
    http_status = 409
    default_message = "sequence replayed or out of order"


class StaleTimestamp(A2AError):
    """A timestamp is outside the ±300 s freshness window."""

    code = -32045
    http_status = 401
    default_message = "timestamp not fresh"


class UnsupportedVersion(A2AError):
    """The peer speaks a protocol version this implementation does not."""

    code = -32046
    http_status = 400
    default_message = "unsupported protocol version"


class DIDResolutionError(A2AError):
    """The DID is well formed but cannot be resolved to a usable Ed25519 key."""

    code = -32047
    http_status = 401
    default_message = "DID could not be resolved"


class Unavailable(A2AError):
    """Rate limited, server full, or shared store unavailable; retry after ``retry_after``."""

    code = -32048
    http_status = 503
    default_message = "service unavailable"

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: int = 1,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.retry_after = max(1, int(retry_after))
        merged: dict[str, Any] = {"retry_after": self.retry_after}
        if data:
            merged.update(data)
        # A full bound says which pool is full: "own" (this caller's quota) or "shared".
        pool = merged.get("pool")
        self.pool: str | None = pool if pool in ("own", "shared") else None
        super().__init__(message, data=merged)


class PeerUnreachable(Unavailable):
    """The peer's endpoint did not answer (nothing listens, no route, timed out), after retries.

    Raised on the calling side only, never sent: ``endpoint`` is the URL that was tried and
    ``reason`` a short cause ("could not connect", "timed out"), so the message can name both.
    """

    default_message = "peer unreachable or timed out"

    def __init__(
        self,
        message: str | None = None,
        *,
        endpoint: str | None = None,
        reason: str | None = None,
        retry_after: int = 1,
    ) -> None:
        self.endpoint = endpoint
        self.reason = reason
        super().__init__(message, retry_after=retry_after)


class IntentTimeout(A2AError):
    """The handler did not finish in time; the intent may still have taken effect."""

    code = -32049
    http_status = 504
    default_message = "intent timed out"


class ActionNotPending(A2AError):
    """An approval names an action that is unknown, expired or already approved or rejected.

    An extension of this implementation (PROTOCOL.md §12), outside the protocol's codes.
    """

    code = -32050
    http_status = 409
    default_message = "action is not pending"


_BY_CODE: dict[int, type[A2AError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        AuthenticationFailed,
        HandshakeUnknown,
        PolicyViolation,
        SessionUnknown,
        SequenceError,
        StaleTimestamp,
        UnsupportedVersion,
        DIDResolutionError,
        Unavailable,
        IntentTimeout,
        ActionNotPending,
    )
}


def error_for_code(code: int, message: str, data: dict[str, Any] | None = None) -> A2AError:
    """Rebuild the SDK error for a JSON-RPC error received from a peer.

    Codes outside PROTOCOL.md §7 (A2A errors -32001…-32009, say) become a plain
    :class:`A2AError` that keeps the peer's code.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        err = A2AError(message, data=data)
        err.code = code  # type: ignore[misc]
        return err
    if cls is Unavailable:
        retry = 1
        if data and type(data.get("retry_after")) is int:
            retry = data["retry_after"]
        pool = data.get("pool") if data else None
        kept = {"pool": pool} if pool in ("own", "shared") else None
        return Unavailable(message, retry_after=retry, data=kept)
    return cls(message, data=data)


def log_unexpected(log: logging.Logger, what: str, exc: BaseException) -> None:
    """Log an exception nobody expected: its type and where it was raised, never its text.

    The answer on the wire says only -32603 (or -32048 when it was the store's client that
    failed); the operator needs to find the bug. The message is left out because it may
    quote what the code was working on (an intent's inputs, a token), and so are the
    locals: type names and ``file:line in function``.
    """
    frames = traceback.extract_tb(exc.__traceback__)[-12:]
    where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    cause = exc.__cause__ or exc.__context__
    during = f" (while handling {type(cause).__qualname__})" if cause is not None else ""
    log.error("%s: %s%s at %s", what, type(exc).__qualname__, during, where or "?")
