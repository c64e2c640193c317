"""A2A errors across the binding (PROTOCOL.md §10), in both directions.

Server side: an exception of the A2A SDK becomes the ``a2a_secure`` error with the same
JSON-RPC code and the A2A HTTP status, which the core then signs like every error after
step 5. Client side: a *signed* error becomes the SDK's exception for its code; anything
unsigned (it may come from anyone on the path), and every ``a2a_secure`` protocol error,
becomes :class:`SecureTransportError`, never an A2A domain error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from a2a.client.errors import A2AClientError
from a2a.utils import errors as sdk_errors

from a2a_secure.errors import (
    A2AError,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    error_for_code,
)

__all__ = [
    "A2AProtocolError",
    "ContentTypeNotSupported",
    "ExtendedAgentCardNotConfigured",
    "ExtensionSupportRequired",
    "InvalidAgentResponse",
    "PushNotificationNotSupported",
    "SecureTransportError",
    "TaskNotCancelable",
    "TaskNotFound",
    "UnsupportedOperation",
    "VersionNotSupported",
    "from_sdk_error",
    "to_sdk_error",
]


class A2AProtocolError(A2AError):
    """An error of the A2A protocol itself (-32001 … -32009), passed through signed."""

    reason: ClassVar[str] = ""


class TaskNotFound(A2AProtocolError):
    """The task does not exist, or belongs to another DID."""

    code = -32001
    http_status = 404
    default_message = "Task not found"
    reason = "TASK_NOT_FOUND"


class TaskNotCancelable(A2AProtocolError):
    """The task cannot be canceled (a terminal state, say)."""

    code = -32002
    http_status = 400
    default_message = "Task cannot be canceled"
    reason = "TASK_NOT_CANCELABLE"


class PushNotificationNotSupported(A2AProtocolError):
    """The agent does not support push notifications."""

    code = -32003
    http_status = 400
    default_message = "Push Notification is not supported"
    reason = "PUSH_NOTIFICATION_NOT_SUPPORTED"


class UnsupportedOperation(A2AProtocolError):
    """The agent does not support this operation."""

    code = -32004
    http_status = 400
    default_message = "This operation is not supported"
    reason = "UNSUPPORTED_OPERATION"


class ContentTypeNotSupported(A2AProtocolError):
    """Incompatible content types."""

    code = -32005
    http_status = 400
    default_message = "Incompatible content types"
    reason = "CONTENT_TYPE_NOT_SUPPORTED"


class InvalidAgentResponse(A2AProtocolError):
    """The agent produced an invalid response."""

    code = -32006
    http_status = 500
    default_message = "Invalid agent response"
    reason = "INVALID_AGENT_RESPONSE"


class ExtendedAgentCardNotConfigured(A2AProtocolError):
    """No extended agent card is configured."""

    code = -32007
    http_status = 400
    default_message = "Authenticated Extended Card is not configured"
    reason = "EXTENDED_AGENT_CARD_NOT_CONFIGURED"


class ExtensionSupportRequired(A2AProtocolError):
    """The agent requires an extension the client did not ask for."""

    code = -32008
    http_status = 400
    default_message = "Extension support required"
    reason = "EXTENSION_SUPPORT_REQUIRED"


class VersionNotSupported(A2AProtocolError):
    """The A2A version asked for is not supported (a major version other than 1)."""

    code = -32009
    http_status = 400
    default_message = "Version not supported"
    reason = "VERSION_NOT_SUPPORTED"


_PROTOCOL_ERRORS: dict[int, type[A2AProtocolError]] = {
    cls.code: cls
    for cls in (
        TaskNotFound,
        TaskNotCancelable,
        PushNotificationNotSupported,
        UnsupportedOperation,
        ContentTypeNotSupported,
        InvalidAgentResponse,
        ExtendedAgentCardNotConfigured,
        ExtensionSupportRequired,
        VersionNotSupported,
    )
}

_SDK_CODES: dict[type[sdk_errors.A2AError], int] = dict(sdk_errors.JSON_RPC_ERROR_CODE_MAP)
_SDK_BY_CODE: dict[int, type[sdk_errors.A2AError]] = {code: cls for cls, code in _SDK_CODES.items()}
_CORE_CODES = frozenset((InvalidParams.code, InvalidRequest.code, MethodNotFound.code, ParseError.code))
MAX_MESSAGE = 200


def _sdk_code(exc: sdk_errors.A2AError) -> int | None:
    for cls in type(exc).__mro__:
        code = _SDK_CODES.get(cls)
        if code is not None:
            return code
    return None


def from_sdk_error(exc: sdk_errors.A2AError) -> A2AError:
    """The ``a2a_secure`` error to sign for an exception raised by the A2A request handler.

    A2A errors keep their code, their message (cut to 200 characters) and get the A2A HTTP
    status; the SDK's own JSON-RPC codes map onto the matching core errors. An internal
    error keeps a generic message (nothing of the agent's internals leaves the server).
    """
    code = _sdk_code(exc)
    message = (exc.message or "")[:MAX_MESSAGE] or None
    protocol_error = _PROTOCOL_ERRORS.get(code) if code is not None else None
    if protocol_error is not None:
        data: dict[str, Any] = {"reason": protocol_error.reason}
        if isinstance(exc.data, dict) and exc.data:
            data["metadata"] = exc.data
        return protocol_error(message, data=data)
    if code in _CORE_CODES:
        return error_for_code(code, message or "invalid request")
    return InternalError("the A2A request handler failed")


class SecureTransportError(A2AClientError):
    """A failure of the secure transport, or an error that was not signed by the agent.

    ``error`` is the ``a2a_secure`` error behind it, ``code`` its code and ``signed``
    whether the agent signed it (a signed -32042 policy refusal, say). An unsigned error is
    never turned into an A2A domain error: it may come from anyone on the path.
    """

    def __init__(self, error: A2AError) -> None:
        self.error = error
        self.code = error.code
        self.signed = bool(error.signed)
        kind = "signed" if self.signed else "unsigned"
        super().__init__(f"a2a-secure error {error.code} ({kind}): {error.message}")


def to_sdk_error(error: A2AError) -> Exception:
    """The exception an a2a-sdk client sees for ``error`` (raise it ``from error``).

    Only a signed error with a code the SDK knows becomes that SDK exception
    (``TaskNotFoundError`` for -32001 …, ``InvalidParamsError`` for -32602 …).
    """
    sdk_cls = _SDK_BY_CODE.get(error.code) if error.signed else None
    if sdk_cls is None:
        return SecureTransportError(error)
    data = error.data if isinstance(error.data, dict) else None
    metadata = data.get("metadata") if data is not None else None
    return sdk_cls(error.message, data=metadata if isinstance(metadata, dict) else None)
