"""The answers to an intent or a close: signed results and errors (PROTOCOL.md §6.2, §6.3, §7).

Once a request's signature is verified (§6.1 step 4), every answer is signed by the
server (typ ``a2a-response+jws``) over the session, the sequence, the request hash and a
timestamp, so that a man in the middle can neither forge nor move it. Each reply carries
the :class:`StoredReply` a byte-identical retry needs to give the very same answer again
(§6.1 step 7): kept unsigned, with the timestamp it was signed at. Refusals before the
signature check are unsigned JSON-RPC errors (§7).

State: none; it signs with the server identity of the :class:`ServerConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from a2a_secure.errors import A2AError, InternalError, Unavailable
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import PendingJWS, jws_token
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.server.common import Reply, ServerConfig
from a2a_secure.store.base import StoredReply

__all__ = ["NOT_IJSON", "SignedReplies", "result_json", "unsigned_error"]

NOT_IJSON = "the intent handler returned a value that is not I-JSON"

# A success's signed payload, its answer and its stored form, as encoding.dumps writes them
# (members in this order, compact), with the result's JSON written once into each.
_SUCCESS_PAYLOAD = (
    b'{"session_id":%s,"sequence":%d,"request_hash":%s,"status":"success","result":%s,"timestamp":%d}'
)
_SUCCESS_SENT = b'{"status":"success","sequence":%d,"result":%s,"response_jws":"%s"}'
_STORED_SUCCESS = b'{"http_status":200,"result":%s,"signed_at":%d}'


def _json_str(text: str) -> bytes:
    """``encoding.dumps(text)`` of a string."""
    try:
        return orjson.dumps(text)
    except orjson.JSONEncodeError:  # a lone surrogate: what encoding.dumps writes then
        return encoding.dumps(text)


def result_json(result: Any) -> bytes:
    """A handler's ``result`` as compact JSON, or -32603 if it is not I-JSON (§1, §6.1 step 11).

    The result sits two containers deep in the reply the client parses (§6.2).
    """
    if type(result) is str:  # a sealed result (§12.6): no walk; orjson refuses a lone surrogate
        try:
            return orjson.dumps(result)
        except orjson.JSONEncodeError:
            raise InternalError(NOT_IJSON) from None
    raw = encoding.ijson_dumps(result, max_depth=encoding.MAX_DEPTH - 2)
    if raw is None:
        raise InternalError(NOT_IJSON)
    return raw


def unsigned_error(exc: A2AError) -> Reply:
    """The §7 error reply for a request refused before its signature could be checked."""
    retry = exc.retry_after if isinstance(exc, Unavailable) else None
    return Reply(exc.http_status, error=exc.to_error_object(), retry_after=retry)


class SignedReplies:
    """Signs the §6.2 answers of one server identity."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config

    def error(self, exc: A2AError, session_id: str, sequence: int, req_hash: str, now_i: int) -> Reply:
        """The signed error reply for ``exc``."""
        retry = exc.retry_after if isinstance(exc, Unavailable) else None
        error = {"code": exc.code, "message": exc.message, "data": dict(exc.data or {})}
        return self.error_reply(exc.http_status, error, retry, session_id, sequence, req_hash, now_i)

    def error_reply(
        self,
        http_status: int,
        error: Mapping[str, Any],
        retry: int | None,
        session_id: str,
        sequence: int,
        req_hash: str,
        now_i: int,
    ) -> Reply:
        """A signed error; ``error`` is code, message and the data besides ``response_jws``."""
        signed = {"code": error["code"], "message": error["message"]}
        payload = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "status": "error",
            "error": signed,
            "timestamp": now_i,
        }
        data: dict[str, Any] = dict(error["data"])
        data["response_jws"] = jws_token(payload, self._config.signer(session_id), m.Typ.RESPONSE)
        stored = StoredReply(http_status, error=error, signed_at=now_i)
        return Reply(http_status, error={**signed, "data": data}, retry_after=retry, stored=stored)

    def success(
        self, session_id: str, sequence: int, req_hash: str, result: Any, now_i: int, *, sealed: bool = False
    ) -> Reply:
        """The signed success reply carrying ``result`` (-32603 if ``result`` is not I-JSON).

        The result is written as JSON once: the signed payload, the answer sent and the
        answer stored are that text with their other members around it, byte for byte what
        writing each of them whole gives (members in the same order, compact). ``sealed``:
        ``result`` is a sealed value, which the payload signs by its digest (§12.6).
        """
        raw = result_json(result)
        signed = raw
        if sealed:
            if not isinstance(result, str):
                raise InternalError("a sealed session's result is not sealed")
            signed = b'"%s"' % m.sealed_digest(result).encode("ascii")
        # The head as encoding.dumps writes it (the two strings are written by orjson, as
        # they are there; an integer's digits are its digits): not through a dict and a walk.
        payload = _SUCCESS_PAYLOAD % (_json_str(session_id), sequence, _json_str(req_hash), signed, now_i)
        token = jws_token(payload, self._config.signer(session_id), m.Typ.RESPONSE)
        # A remote key's token is finished by the runtime, which then writes the answer whole.
        sent = None
        if not isinstance(token, PendingJWS):
            sent = _SUCCESS_SENT % (sequence, raw, token.encode("ascii"))
        stored = StoredReply(200, result, None, None, False, now_i)
        if result is not None:  # (to_dict leaves out a None result)
            stored.with_json(_STORED_SUCCESS % (raw, now_i))
        answer = {
            "status": "success",
            "sequence": sequence,
            "result": result,
            "response_jws": token,
        }
        return Reply(200, answer, None, None, None, None, stored, sent)

    def result_token(
        self, session_id: str, sequence: int, req_hash: str, result: Any, now_i: int
    ) -> str | PendingJWS:
        """The ``response_jws`` of a success carrying ``result``."""
        payload = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "status": "success",
            "result": result,
            "timestamp": now_i,
        }
        return jws_token(payload, self._config.signer(session_id), m.Typ.RESPONSE)
