"""Signed events of a streamed answer (PROTOCOL.md §6.4), and the final -32048 of a replay.

Each partial result of a streamed answer goes out as an event whose ``response_jws`` (typ
``a2a-event+jws``) signs the session, sequence, request hash, index, finality, the result
or error, and the time of signing. The stream pump signs live events with it; a
byte-identical retry (§6.1 step 7) and a resend under an ``intent_id`` (§12.5) sign with
it what the first run kept.

State: none; the key is the :class:`ServerConfig`'s signer for the session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from a2a_secure.errors import A2AError, Unavailable
from a2a_secure.identity.jws import jws_token
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.server.common import Clock, ServerConfig

__all__ = ["EventSigner"]


class EventSigner:
    """Signs the events of one server's streamed answers."""

    def __init__(self, config: ServerConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock

    def event(
        self,
        session_id: str,
        sequence: int,
        req_hash: str,
        index: int,
        final: bool,
        *,
        result: Any = None,
        error: A2AError | None = None,
        sealed: bool = False,
    ) -> dict[str, Any]:
        """One signed event's JSON-RPC ``result`` object (typ ``a2a-event+jws``).

        ``sealed``: ``result`` is a sealed value, which the payload signs by its digest (§12.6).
        """
        payload: dict[str, Any] = {
            "session_id": session_id,
            "sequence": sequence,
            "request_hash": req_hash,
            "index": index,
            "final": final,
        }
        if error is not None:
            body: dict[str, Any] = {
                "status": "error",
                "error": {"code": error.code, "message": error.message},
            }
        else:
            body = {"status": "success", "result": result}
        payload.update(body)
        if sealed and isinstance(result, str) and error is None:
            payload["result"] = m.sealed_digest(result)
        payload["timestamp"] = int(self._clock())
        token = jws_token(payload, self._config.signer(session_id), m.Typ.EVENT)
        out: dict[str, Any] = {"status": body["status"], "sequence": sequence, "index": index, "final": final}
        out.update({k: v for k, v in body.items() if k != "status"})
        out["response_jws"] = token
        return out

    def overflow(self, session_id: str, sequence: int, req_hash: str) -> Callable[[int], Mapping[str, Any]]:
        """Signs the final -32048 a retry gets past the events that were kept."""

        def make(index: int) -> Mapping[str, Any]:
            exc = Unavailable("stream events past the replay bound were not kept", retry_after=1)
            return self.event(session_id, sequence, req_hash, index, True, error=exc)

        return make
