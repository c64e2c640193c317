"""Sealed intents (PROTOCOL.md §12.6): the key schedule, seal and open. Pure, no I/O.

TLS protects one hop; a TLS-terminating load balancer or gateway reads every intent, and the
signed JWS payloads are plaintext too. A client and a server that both want it agree on
session keys inside the handshake and then carry inputs, results, stream events and error
``data`` as AEAD ciphertext, end to end:

- Each side brings one ephemeral X25519 key (``seal_key``, 32 bytes, base64url), signed by
  its identity key: the client's in the ``accept_jws`` payload (§5.5), the server's in the
  ``session_jws`` payload (§5.6). HKDF-SHA256 over their shared secret, with a salt that
  hashes the transcript (both DIDs, both nonces, the session and its commitment, both
  ``seal_key`` values), gives one 32-byte key per direction. The private halves are dropped
  as soon as the keys exist, so once a session's keys are gone (closed, expired) no identity
  key, stolen later, opens what was recorded: forward secrecy.
- ChaCha20-Poly1305 with a nonce made of the sequence, the part and the event index (unique
  per key: a sender seals one plaintext per (sequence, part, index), and a byte-identical
  resend seals the same one), and associated data that names the direction, the session,
  the sequence, the part, the index and the request (the goal for inputs, the request's
  hash for an answer): nothing can be moved to another message, session or direction, or
  reflected back.

The signed JWS covers the sealed form; a receiver verifies the signature first, then opens.

An intent with an ``intent_id`` (§12.5) also carries its answer key, sealed: the server keeps
that intent's answer sealed under it, never the key (:mod:`.sealed_claims`).
"""

from __future__ import annotations

import copy
import enum
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from a2a_secure.delegation import check_member as check_delegation_member
from a2a_secure.errors import A2AError, AuthenticationFailed, InternalError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.protocol.validate import MAX_SAFE_INT, require_b64u_bytes

if TYPE_CHECKING:
    from a2a_secure.protocol.models import Intent

__all__ = [
    "ANSWER_KEY_MEMBER",
    "CHAIN_MEMBER",
    "KEY_BYTES",
    "KEY_MEMBER",
    "SEALED",
    "EphemeralKey",
    "Part",
    "SessionKeys",
    "SessionSealer",
    "aad",
    "derive_keys",
    "nonce",
    "open_intent_delegation",
    "open_intent_inputs",
    "parse_seal_key",
    "record_sealer",
    "seal_error_data",
    "sealer_for",
    "transcript",
]

SEALED: Final = "sealed"
"""The extension's name in ``a2a_secure_extensions``, and the ``intent`` member it adds."""
KEY_MEMBER: Final = "seal_key"
"""The signed handshake member carrying a side's ephemeral X25519 public key."""
ANSWER_KEY_MEMBER: Final = "sealed_key"
"""The ``intent`` member carrying, sealed, the answer key of an intent with an intent_id."""
CHAIN_MEMBER: Final = "sealed_delegation"
"""The ``intent`` member carrying, sealed, what ``delegation`` would have been (§12.7)."""
KEY_BYTES: Final = 32
LABEL: Final = "a2a-secure/sealed/v1"
_INFO: Final = (LABEL + " keys").encode("ascii")
_MAX_INDEX: Final = 2**32 - 1


class Part(enum.IntEnum):
    """What a ciphertext carries; its number is the nonce's part byte, its name is in the AAD."""

    INPUTS = 1  # client → server: intent.inputs
    RESULT = 2  # server → client: the result of a §6.2 answer
    ERROR_DATA = 3  # server → client: an error's data (besides response_jws, retry_after)
    EVENT = 4  # server → client: a §6.4 event's result
    ANSWER_KEY = 5  # client → server: the answer key of an intent with an intent_id
    DELEGATION = 6  # client → server: intent.delegation, the chain or its name (§12.7)


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The two directional keys of one sealed session (never in ``repr``)."""

    c2s: bytes = field(repr=False)
    s2c: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.c2s) != KEY_BYTES or len(self.s2c) != KEY_BYTES:
            raise ValueError("a sealing key is 32 bytes")

    def to_bytes(self) -> bytes:
        """Both keys, client→server first (how a store keeps them)."""
        return self.c2s + self.s2c

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionKeys:
        """Inverse of :meth:`to_bytes`; ``ValueError`` unless exactly 64 bytes."""
        if len(data) != 2 * KEY_BYTES:
            raise ValueError("sealing keys are 64 bytes")
        return cls(bytes(data[:KEY_BYTES]), bytes(data[KEY_BYTES:]))


def parse_seal_key(value: Any, error: type[A2AError] = AuthenticationFailed) -> bytes:
    """A ``seal_key`` member: canonical base64url of exactly 32 bytes, else ``error``.

    It sits in a signed payload, so a malformed one is -32040 (§9).
    """
    return require_b64u_bytes(value, KEY_MEMBER, KEY_BYTES, error)


def transcript(
    *,
    client_did: str,
    server_did: str,
    nonce_a: str,
    nonce_b: str,
    session_id: str,
    session_commitment: str,
    client_seal_key: str,
    server_seal_key: str,
) -> bytes:
    """The JCS form of what the keys are bound to (its SHA-256 is HKDF's salt)."""
    return encoding.jcs(
        {
            "label": LABEL,
            "client_did": client_did,
            "server_did": server_did,
            "nonce_a": nonce_a,
            "nonce_b": nonce_b,
            "session_id": session_id,
            "session_commitment": session_commitment,
            "client_seal_key": client_seal_key,
            "server_seal_key": server_seal_key,
        }
    )


def derive_keys(shared_secret: bytes, transcript_bytes: bytes) -> SessionKeys:
    """HKDF-SHA256(IKM = the X25519 shared secret, salt = SHA-256(transcript), info = label).

    64 bytes out: the client→server key, then the server→client key.
    """
    salt = hashlib.sha256(transcript_bytes).digest()
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=salt, info=_INFO).derive(shared_secret)
    return SessionKeys(okm[:KEY_BYTES], okm[KEY_BYTES:])


class EphemeralKey:
    """One side's X25519 key for one handshake: made from the random source, used once."""

    __slots__ = ("_private", "public")

    def __init__(self, random_bytes: Callable[[int], bytes]) -> None:
        # From the injected random source (sans-I/O); X25519 clamps any 32 bytes.
        self._private: X25519PrivateKey | None = X25519PrivateKey.from_private_bytes(random_bytes(KEY_BYTES))
        self.public = self._private.public_key().public_bytes_raw()

    def __repr__(self) -> str:
        return "EphemeralKey(<private>)"

    @property
    def public_b64u(self) -> str:
        """The ``seal_key`` member to sign."""
        return encoding.b64u_encode(self.public)

    def exchange(self, peer_public: bytes, error: type[A2AError] = AuthenticationFailed) -> bytes:
        """The shared secret with ``peer_public``; the private key is forgotten afterwards.

        A low-order peer key (the shared secret would be all zeros, known to anyone) is
        ``error``: without the check such a key would give keys an eavesdropper can compute.
        """
        private = self._private
        if private is None:
            raise error("this ephemeral key was already used")
        self._private = None
        try:
            shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:
            raise error("seal_key is not a usable X25519 key") from None
        if not any(shared):
            raise error("seal_key is not a usable X25519 key")
        return shared


def nonce(sequence: int, part: Part, index: int = 0) -> bytes:
    """The 12-byte AEAD nonce: sequence (7 bytes, big-endian), part (1), index (4).

    Each key is used by one sender, which seals one plaintext per (sequence, part, index):
    a nonce never repeats under a key with another plaintext.
    """
    if not 1 <= sequence <= MAX_SAFE_INT or not 0 <= index <= _MAX_INDEX:
        raise InvalidParams("sequence or index out of range for sealing")
    return _NONCE.pack((sequence << 8) | part, index)


def aad(direction: str, session_id: str, sequence: int, part: Part, index: int, binding: str) -> bytes:
    """The associated data: ``label|direction|session_id|sequence|part|index|binding`` (UTF-8).

    ``binding`` is the goal for inputs, the request hash for an answer, and the request hash
    plus ``|final`` or ``|partial`` for an event; it is last, so a ``|`` in a goal is harmless.
    """
    return "|".join(
        (LABEL, direction, session_id, str(sequence), part.name.lower(), str(index), binding)
    ).encode()


_NONCE: Final = struct.Struct(">QI")  # 7 bytes of sequence and the part byte, then the index
# Each part's name in the AAD, at its number (1, 2, ...: Part's values, in order): a tuple
# indexed by the member costs no Python-level Enum.__hash__, as a dict keyed by it would.
_PART_NAMES: Final = ("", *(p.name.lower() for p in Part))


class SessionSealer:
    """Seals and opens the messages of one session, for either side.

    Every ``open_*`` raises ``AuthenticationFailed`` (-32040) when the ciphertext does not
    open under this session's key for that exact place, or the plaintext is not I-JSON of
    the right kind. Errors never say more (no oracle beyond "does not open").
    """

    __slots__ = ("_c2s", "_prefix", "_s2c", "session_id")

    def __init__(self, keys: SessionKeys, session_id: str) -> None:
        self._c2s = ChaCha20Poly1305(keys.c2s)
        self._s2c = ChaCha20Poly1305(keys.s2c)
        self.session_id = session_id
        # The constant head of every AAD of this session, per direction (see aad()).
        self._prefix = {d: f"{LABEL}|{d}|{session_id}|" for d in ("c2s", "s2c")}

    def __repr__(self) -> str:
        return f"SessionSealer(session_id={self.session_id!r})"

    # -- client → server --------------------------------------------------------------------
    def seal_inputs(self, sequence: int, goal: str, inputs: Any) -> str:
        """The ``sealed`` member carrying ``inputs`` of the intent at ``sequence``."""
        return self._seal(self._c2s, "c2s", sequence, Part.INPUTS, 0, goal, inputs)

    def open_inputs(self, sequence: int, goal: str, token: str | bytes) -> dict[str, Any]:
        """The inputs sealed in ``token`` (base64url, or its bytes), an object, else -32040."""
        value = self._open(self._c2s, "c2s", sequence, Part.INPUTS, 0, goal, token, encoding.MAX_DEPTH - 3)
        if not isinstance(value, dict):
            raise AuthenticationFailed("sealed inputs are not an object")
        return value

    def seal_answer_key(self, sequence: int, goal: str, intent_id: str, key: bytes) -> str:
        """The ``sealed_key`` member: the answer key of the intent ``intent_id`` (§12.6)."""
        where = self._aad("c2s", sequence, Part.ANSWER_KEY, 0, f"{goal}|{intent_id}")
        return encoding.b64u_encode(self._c2s.encrypt(nonce(sequence, Part.ANSWER_KEY), key, where))

    def open_answer_key(self, sequence: int, goal: str, intent_id: str, token: str | bytes) -> bytes:
        """The 32-byte answer key sealed in ``token``, else -32040."""
        err = AuthenticationFailed
        data = token if isinstance(token, bytes) else encoding.b64u_decode(token, error=err)
        where = self._aad("c2s", sequence, Part.ANSWER_KEY, 0, f"{goal}|{intent_id}")
        try:
            key = self._c2s.decrypt(nonce(sequence, Part.ANSWER_KEY), data, where)
        except InvalidTag:
            raise err("sealed answer_key does not open for this session and message") from None
        if len(key) != KEY_BYTES:
            raise err("the answer key is not 32 bytes")
        return key

    def seal_delegation(self, sequence: int, goal: str, value: Any) -> str:
        """The ``sealed_delegation`` member: ``value`` (a chain's links, or its name) sealed."""
        return self._seal(self._c2s, "c2s", sequence, Part.DELEGATION, 0, goal, value)

    def open_delegation(self, sequence: int, goal: str, token: str) -> Any:
        """The JSON value sealed in a ``sealed_delegation`` member, else -32040 (types unchecked)."""
        return self._open(self._c2s, "c2s", sequence, Part.DELEGATION, 0, goal, token, 3)

    # -- server → client --------------------------------------------------------------------
    def seal_result(self, sequence: int, request_hash: str, result: Any) -> str:
        """The sealed ``result`` of the answer to the request ``request_hash``."""
        return self._seal(self._s2c, "s2c", sequence, Part.RESULT, 0, request_hash, result)

    def seal_result_json(self, sequence: int, request_hash: str, text: bytes) -> str:
        """:meth:`seal_result` of a result already written: ``text`` is its ``encoding.dumps``
        (as ``result_json`` writes a result it finds I-JSON), sealed without writing it again."""
        return self._seal_text(self._s2c, "s2c", sequence, Part.RESULT, 0, request_hash, text)

    def open_result(self, sequence: int, request_hash: str, token: Any) -> Any:
        """The result sealed in ``token``, else -32040."""
        return self._open(self._s2c, "s2c", sequence, Part.RESULT, 0, request_hash, token, encoding.MAX_DEPTH)

    def seal_error_data(self, sequence: int, request_hash: str, data: Any) -> str:
        """The sealed ``data`` of an error answering ``request_hash``."""
        return self._seal(self._s2c, "s2c", sequence, Part.ERROR_DATA, 0, request_hash, data)

    def open_error_data(self, sequence: int, request_hash: str, token: Any) -> Any:
        """The error data sealed in ``token``, else -32040."""
        return self._open(
            self._s2c, "s2c", sequence, Part.ERROR_DATA, 0, request_hash, token, encoding.MAX_DEPTH
        )

    def seal_event(self, sequence: int, request_hash: str, index: int, final: bool, result: Any) -> str:
        """The sealed ``result`` of event ``index`` of a stream (§6.4)."""
        binding = f"{request_hash}|{'final' if final else 'partial'}"
        return self._seal(self._s2c, "s2c", sequence, Part.EVENT, index, binding, result)

    def open_event(self, sequence: int, request_hash: str, index: int, final: bool, token: Any) -> Any:
        """The result sealed in event ``index``'s ``token``, else -32040."""
        binding = f"{request_hash}|{'final' if final else 'partial'}"
        return self._open(self._s2c, "s2c", sequence, Part.EVENT, index, binding, token, encoding.MAX_DEPTH)

    # -- the one place each way ---------------------------------------------------------------
    def _seal(
        self,
        aead: ChaCha20Poly1305,
        direction: str,
        sequence: int,
        part: Part,
        index: int,
        binding: str,
        value: Any,
    ) -> str:
        return self._seal_text(aead, direction, sequence, part, index, binding, encoding.dumps(value))

    def _seal_text(
        self,
        aead: ChaCha20Poly1305,
        direction: str,
        sequence: int,
        part: Part,
        index: int,
        binding: str,
        plaintext: bytes,
    ) -> str:
        where = self._aad(direction, sequence, part, index, binding)
        return encoding.b64u_encode(aead.encrypt(nonce(sequence, part, index), plaintext, where))

    def _aad(self, direction: str, sequence: int, part: Part, index: int, binding: str) -> bytes:
        # aad() with the session's constant head precomputed: the same bytes, cheaper.
        return f"{self._prefix[direction]}{sequence}|{_PART_NAMES[part]}|{index}|{binding}".encode()

    def _open(
        self,
        aead: ChaCha20Poly1305,
        direction: str,
        sequence: int,
        part: Part,
        index: int,
        binding: str,
        token: Any,
        max_depth: int,
    ) -> Any:
        err = AuthenticationFailed
        if isinstance(token, bytes):  # already decoded by the shape check
            data = token
        elif isinstance(token, str):
            data = encoding.b64u_decode(token, error=err)
        else:
            raise err(f"sealed {part.name.lower()} must be a base64url string")
        where = self._aad(direction, sequence, part, index, binding)
        try:
            plaintext = aead.decrypt(nonce(sequence, part, index), data, where)
        except InvalidTag:
            raise err(f"sealed {part.name.lower()} does not open for this session and message") from None
        return encoding.loads(plaintext, max_depth=max_depth, error=err)


# -- the server's three hooks (§6.1 step 5, step 11, a signed error) ----------------------------
def sealer_for(seal_keys: bytes, session_id: str) -> SessionSealer | None:
    """The sealer of a session whose store record holds ``seal_keys`` (None: not sealed)."""
    if not seal_keys:
        return None
    return SessionSealer(SessionKeys.from_bytes(seal_keys), session_id)


def record_sealer(record: Any) -> SessionSealer | None:
    """:func:`sealer_for` a session record, kept on the record for its next messages.

    The record lives as long as the session in its store, and the store drops this cache
    when it forgets the record (at close, or by the server's sweep soon after expiry:
    ``SessionRecord.drop_sealer``), so the sealer, and the keys in it, go with it.
    """
    if not record.seal_keys:
        return None
    sealer = record.sealer
    if sealer is None:
        try:
            sealer = sealer_for(record.seal_keys, record.session_id)
        except ValueError:  # a damaged store record: the server's fault, answered -32603
            raise InternalError("the session's sealing keys are unusable") from None
        object.__setattr__(record, "sealer", sealer)  # a cache beside the frozen fields
    return sealer  # type: ignore[no-any-return]


def open_intent_inputs(
    sealer: SessionSealer | None, intent: Intent, sequence: int
) -> tuple[dict[str, Any], bytes | None]:
    """The inputs a handler gets, and the intent's answer key if it has an intent_id (§12.6).

    A sealed session takes only sealed intents, and a session without keys none: either
    mismatch is a signed -32602 (the sequence is not used up), and so are a clear chain on a
    sealed session and an intent_id on a sealed session without its ``sealed_key`` (or a
    ``sealed_key`` without an intent_id). Values that do not open are -32040. Called after
    the signature check: what is opened is what the client signed.
    """
    if sealer is None:
        if intent.sealed is not None or intent.sealed_key is not None or intent.sealed_delegation is not None:
            raise InvalidParams("sealed inputs on a session that agreed on no sealing keys")
        return intent.inputs, None
    if intent.sealed is None:
        raise InvalidParams("this session is sealed: its intents carry sealed inputs")
    if intent.delegation is not None:
        raise InvalidParams("this session is sealed: a delegation chain travels as sealed_delegation")
    if (intent.intent_id is None) != (intent.sealed_key is None):
        raise InvalidParams("on a sealed session, an intent has sealed_key exactly when it has an intent_id")
    inputs = sealer.open_inputs(sequence, intent.goal, intent.sealed_bytes)
    if intent.intent_id is None or intent.sealed_key is None:
        return inputs, None
    return inputs, sealer.open_answer_key(sequence, intent.goal, intent.intent_id, intent.sealed_key)


def open_intent_delegation(
    sealer: SessionSealer | None, intent: Intent, sequence: int
) -> tuple[str, ...] | str | None:
    """The chain ``intent`` acts under, as ``intent.delegation`` has it: opened when sealed.

    Called after :func:`open_intent_inputs` (which refuses a chain in the wrong form for the
    session). A sealed chain that does not open, or opens to another type than a clear
    ``delegation`` member may have (a non-empty array of strings, or a hash string), is -32040.
    """
    token = intent.sealed_delegation
    if token is None or sealer is None:
        return intent.delegation
    value = sealer.open_delegation(sequence, intent.goal, token)
    return check_delegation_member(value, AuthenticationFailed)


def seal_error_data(
    sealer: SessionSealer | None, exc: A2AError, sequence: int, request_hash: str
) -> A2AError:
    """``exc`` with its ``data`` sealed (all but ``retry_after``, which the HTTP layer reads).

    A copy: the exception may be a handler's own object, raised again for another request.
    """
    if sealer is None or not exc.data:
        return exc
    data = dict(exc.data)
    retry = data.pop("retry_after", None)
    if not data:
        return exc
    sealed: dict[str, Any] = {SEALED: sealer.seal_error_data(sequence, request_hash, data)}
    if retry is not None:
        sealed["retry_after"] = retry
    try:
        out = copy.copy(exc)
    except Exception:  # a handler's own subclass that cannot be rebuilt: seal it in place
        out = exc
    out.data = sealed
    return out
