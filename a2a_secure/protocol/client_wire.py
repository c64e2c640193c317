"""The common intent as bytes: its request written, and its answer read, in one pass (sans-I/O).

Nearly every request a client signs is an unsealed intent, and nearly every answer to it a
success as this library's server writes it (``protocol/server/replies.py``). Both are
handled here as bytes, the way the server writes its success: the intent's JSON is written
once and the signed payload, the ``params`` and the JSON-RPC body are that text with their
other members around it, byte for byte what writing each of them whole gives; the answer
is taken only when every byte is where that template puts it, and its value is then parsed
once, from the ``result`` text alone.

The reading decides no less than the general path (``ClientSession.verify_result`` after
``Transport``'s JSON-RPC checks), only by comparing bytes: an answer whose bytes are the
template around the request's own session, sequence and request hash, a token of the
server's exact header whose payload holds the very ``result`` text of the answer (bytes
equal: JSON-equal a fortiori), a fresh integer timestamp, and a signature that verifies
with the session's server key, is the answer the general path accepts, and only such an
answer is. Anything else (another server's writing, an error, a forged or altered byte)
gives None: the general path then reads the reply and raises its own precise error.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from a2a_secure.errors import A2AError
from a2a_secure.identity import encoding
from a2a_secure.identity.ed25519 import verify_signature
from a2a_secure.identity.jws import Signer, jws_sign_bytes
from a2a_secure.jsonrpc import _head_int
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.validate import is_fresh

__all__ = ["IntentWire", "intent_json"]

# The request's signed payload and params, members in the order the dicts that wrote them
# had (PROTOCOL.md §6.1), compact.
_PAYLOAD: Final = b'{"session_id":%s,"session_commitment":%s,"sequence":%d,"timestamp":%d,"intent":%s}'
_PARAMS: Final = b'{"session_id":%s,"session_commitment":%s,"sequence":%d,"intent":%s,"request_jws":"%s"}'
# A success as the server writes it: its reply up to the result, and its signed payload.
# (after the envelope's head, which a2a_secure.jsonrpc writes)
_REPLY_HEAD: Final = b',"result":{"status":"success","sequence":%d,"result":'
_REPLY_TOKEN: Final = b',"response_jws":"'
_REPLY_END: Final = b'"}}'
_SIGNED_HEAD: Final = b'{"session_id":%s,"sequence":%d,"request_hash":%s,"status":"success","result":'
# The payload's end: a timestamp no fresh one can lack (a positive integer of I-JSON size).
_SIGNED_END: Final = re.compile(rb',"timestamp":([1-9][0-9]{0,15})\}')
# The result sits three containers deep in the reply (envelope, result, its value).
_RESULT_DEPTH: Final = encoding.MAX_DEPTH - 2


def intent_json(intent: Mapping[str, Any], inputs_json: bytes) -> bytes | None:
    """``encoding.dumps(intent)`` of an intent already checked (``Intent.parse``), whose
    ``inputs`` were written as ``inputs_json`` (by ``encoding.ijson_dumps``); None when a
    member needs the general writer (a lone surrogate in a string)."""
    try:
        return orjson.dumps({**intent, "inputs": orjson.Fragment(inputs_json)})
    except orjson.JSONEncodeError:
        return None


class IntentWire:
    """One session's pieces of the template, written once (see the module doc)."""

    __slots__ = ("_commitment", "_header", "_key", "_session_id")

    def __init__(self, session_id: str, session_commitment: str, server_kid: str, server_key: bytes) -> None:
        # (orjson raises for a lone surrogate, which no session of a server has.)
        self._session_id = orjson.dumps(session_id)
        self._commitment = orjson.dumps(session_commitment)
        header = {"alg": "EdDSA", "typ": m.Typ.RESPONSE, "kid": server_kid}
        self._header = encoding.b64u_encode_bytes(encoding.dumps(header))
        self._key = server_key

    def request(
        self, signer: Signer, sequence: int, timestamp: int, intent: bytes
    ) -> tuple[bytes, bytes, str]:
        """The signed request of ``intent`` (its JSON): (token, params JSON, request hash)."""
        payload = _PAYLOAD % (self._session_id, self._commitment, sequence, timestamp, intent)
        token = jws_sign_bytes(payload, signer, m.Typ.REQUEST)
        params = _PARAMS % (self._session_id, self._commitment, sequence, intent, token)
        return token, params, "sha256:" + hashlib.sha256(token).hexdigest()

    def success(
        self, content: bytes, rid: int, sequence: int, request_hash: str, now: float
    ) -> tuple[Any, str] | None:
        """The verified (result, response_jws) of the reply body ``content`` to the request
        ``rid`` of ``sequence`` and ``request_hash``, at wall-clock ``now``; None for any
        reply that is not such a success, byte for byte (the general path decides)."""
        head = _head_int(rid) + _REPLY_HEAD % sequence
        cut = content.rfind(_REPLY_TOKEN)
        if cut < len(head) or not content.startswith(head) or not content.endswith(_REPLY_END):
            return None
        raw = content[len(head) : cut]
        token = content[cut + len(_REPLY_TOKEN) : -len(_REPLY_END)]
        parts = token.split(b".")
        if len(parts) != 3 or parts[0] != self._header:
            return None
        try:
            # Strict base64url: only its alphabet, so the token is a JSON string as it stands.
            payload = encoding.b64u_decode_bytes(parts[1])
            signature = encoding.b64u_decode_bytes(parts[2])
        except A2AError:
            return None
        signed_head = _SIGNED_HEAD % (self._session_id, sequence, orjson.dumps(request_hash))
        start = len(signed_head)
        end = start + len(raw)
        if not (payload.startswith(signed_head) and payload[start:end] == raw):
            return None
        stamp = _SIGNED_END.fullmatch(payload, end)
        if stamp is None or not is_fresh(int(stamp[1]), now):
            return None
        if not verify_signature(self._key, token[: len(parts[0]) + 1 + len(parts[1])], signature):
            return None
        try:
            # The one value read: strict I-JSON, as the whole reply would have been parsed.
            result = encoding.loads(raw, max_depth=_RESULT_DEPTH)
        except A2AError:
            return None
        return result, token.decode("ascii")
