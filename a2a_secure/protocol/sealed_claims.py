"""Sealed intents with an ``intent_id`` (PROTOCOL.md §12.5 with §12.6). Pure, no I/O.

The answer to an ``intent_id`` is kept beyond its session and served again, sealed for a new
one. The client names a per-intent answer key (sealed to the server in ``sealed_key``); the
server keeps the claim's answer sealed under it (:class:`ClaimBox`) and never stores the key,
so the store holds no plaintext and cannot open what it holds. A resend brings the key again.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from a2a_secure.errors import AuthenticationFailed, InternalError
from a2a_secure.identity import encoding
from a2a_secure.protocol.sealing import (
    _PART_NAMES,
    ANSWER_KEY_MEMBER,
    CHAIN_MEMBER,
    KEY_BYTES,
    LABEL,
    SEALED,
    Part,
    SessionSealer,
    nonce,
)

if TYPE_CHECKING:
    from a2a_secure.store.base import StoredReply

__all__ = ["ClaimBox", "claim_intent", "derive_answer_key", "from_claim", "to_claim"]

_ANSWER_INFO: Final = LABEL + " answer key"
# The nonce of a claim kept before nonces were drawn (opened, never sealed again; ClaimBox).
_CLAIM_NONCE_SEQUENCE: Final = 1
_CLAIM_NONCE_BYTES: Final = 12
_CLAIM_V2: Final = "2."  # not base64url: a token kept before it has no such head


def derive_answer_key(derive_key: Callable[[bytes], bytes], server_did: str, intent_id: str) -> bytes:
    """The client's answer key for ``intent_id`` at ``server_did``, derived by its key's holder.

    ``derive_key`` is the identity's (``Identity.derive_key``: HKDF of a key file's seed, an
    HMAC inside a token). Derived rather than drawn so that a caller that restarts and resends
    its own intent_id brings the same key (the server finds the first answer).
    """
    key = derive_key(f"{_ANSWER_INFO}|{server_did}|{intent_id}".encode())
    if len(key) != KEY_BYTES:
        raise ValueError("a derived key must be 32 bytes")
    return key


def claim_intent(intent: Mapping[str, Any], inputs: Any, answer_key: bytes) -> dict[str, Any]:
    """The intent as a claim hashes it (``intent_hash``): the same for every resend of it.

    ``sealed`` and ``sealed_key`` differ per session; the inputs enter as a MAC under the
    answer key instead, so the stored hash says nothing about them to whoever reads the store.
    """
    out = {k: v for k, v in intent.items() if k not in (SEALED, ANSWER_KEY_MEMBER, CHAIN_MEMBER)}
    mac = hmac.new(answer_key, encoding.jcs(inputs), hashlib.sha256).hexdigest()
    out["inputs"] = "hmac-sha256:" + mac
    return out


class ClaimBox:
    """Seals a claim's answer under an intent's answer key, and opens it again.

    The answer key is the same for every run of an ``intent_id`` (the client derives it), and
    a claim that lapsed, or that a store forgot, runs again and is sealed again under it: a
    nonce fixed per (part, index) would then seal two answers under one (key, nonce), which
    gives away their XOR and Poly1305's one-time key. Each seal draws a fresh 96-bit nonce
    from the random source and keeps it beside the ciphertext: ``"2." + base64url(nonce ||
    ciphertext)``; at 2**32 seals under one key the chance of a repeat stays below 2**-32
    (NIST SP 800-38D, 8.3), and one intent_id is sealed once per run. A token without the
    ``"2."`` head (a claim kept before nonces were drawn) opens with the fixed nonce it was
    sealed with, and is never written again.
    """

    __slots__ = ("_aead", "_head", "_random")

    def __init__(self, answer_key: bytes, intent_id: str, random_bytes: Callable[[int], bytes]) -> None:
        self._aead = ChaCha20Poly1305(answer_key)
        self._head = f"{LABEL}|claim|{intent_id}|"
        self._random = random_bytes

    def _aad(self, part: Part, index: int, final: bool) -> bytes:
        return f"{self._head}{_PART_NAMES[part]}|{index}|{'final' if final else 'partial'}".encode()

    def seal(self, part: Part, index: int, final: bool, value: Any) -> str:
        """``value`` sealed for the claim, under a nonce drawn for this seal alone."""
        n = self._random(_CLAIM_NONCE_BYTES)
        if len(n) != _CLAIM_NONCE_BYTES:
            raise InternalError("the random source gave a short nonce")
        sealed = self._aead.encrypt(n, encoding.dumps(value), self._aad(part, index, final))
        return _CLAIM_V2 + encoding.b64u_encode(n + sealed)

    def open(self, part: Part, index: int, final: bool, token: Any) -> Any:
        """The value sealed in ``token``, else -32040."""
        err = AuthenticationFailed
        if not isinstance(token, str):
            raise err("a kept answer is not sealed")
        if token.startswith(_CLAIM_V2):
            data = encoding.b64u_decode(token[len(_CLAIM_V2) :], error=err)
            n, data = data[:_CLAIM_NONCE_BYTES], data[_CLAIM_NONCE_BYTES:]
            if len(n) != _CLAIM_NONCE_BYTES:
                raise err("a kept answer is too short")
        else:  # kept before nonces were drawn: the fixed nonce of its (part, index)
            n, data = nonce(_CLAIM_NONCE_SEQUENCE, part, index), encoding.b64u_decode(token, error=err)
        try:
            plain = self._aead.decrypt(n, data, self._aad(part, index, final))
        except InvalidTag:
            raise err("a kept answer does not open with this intent's answer key") from None
        return encoding.loads(plain, error=err)


def _is_sealed_event(event: Mapping[str, Any]) -> bool:
    return event.get("status") == "success" and not (
        event.get("final") is True and event.get("result") is None
    )


_Open = Callable[[Part, int, bool, Any], Any]
_Seal = Callable[[Part, int, bool, Any], str]


def _reseal(stored: StoredReply, opened: _Open, sealed: _Seal) -> StoredReply:
    # Every sealed value of a kept answer: the result, the error's data, each event's result.
    def again(part: Part, index: int, final: bool, token: Any) -> str:
        return sealed(part, index, final, opened(part, index, final, token))

    if stored.result is not None:
        stored = replace(stored, result=again(Part.RESULT, 0, True, stored.result))
    data = (stored.error or {}).get("data")
    if stored.error is not None and isinstance(data, Mapping) and isinstance(data.get(SEALED), str):
        data = {**data, SEALED: again(Part.ERROR_DATA, 0, True, data[SEALED])}
        stored = replace(stored, error={**stored.error, "data": data})
    if stored.events is not None:
        events = tuple(
            {**ev, "result": again(Part.EVENT, ev["index"], ev["final"], ev["result"])}
            if _is_sealed_event(ev)
            else ev
            for ev in stored.events
        )
        stored = replace(stored, events=events)
    return stored


def to_claim(
    stored: StoredReply, sealer: SessionSealer, sequence: int, request_hash: str, box: ClaimBox
) -> StoredReply:
    """An answer sealed for its session, sealed instead for the claim (nothing in the clear)."""

    def opened(part: Part, index: int, final: bool, token: Any) -> Any:
        if part is Part.RESULT:
            return sealer.open_result(sequence, request_hash, token)
        if part is Part.ERROR_DATA:
            return sealer.open_error_data(sequence, request_hash, token)
        return sealer.open_event(sequence, request_hash, index, final, token)

    return _reseal(stored, opened, box.seal)


def from_claim(
    stored: StoredReply, sequence: int, request_hash: str, box: ClaimBox, sealer: SessionSealer
) -> StoredReply:
    """A claim's answer sealed for another session's request (the inverse of :func:`to_claim`)."""

    def sealed(part: Part, index: int, final: bool, value: Any) -> str:
        if part is Part.RESULT:
            return sealer.seal_result(sequence, request_hash, value)
        if part is Part.ERROR_DATA:
            return sealer.seal_error_data(sequence, request_hash, value)
        return sealer.seal_event(sequence, request_hash, index, final, value)

    return _reseal(stored, box.open, sealed)
