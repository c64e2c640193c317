"""What the three remote-key adapters share, free of any cloud library.

* :func:`raw_public_key` turns the SubjectPublicKeyInfo a service hands out (DER from AWS,
  PEM from Google) into the raw 32 bytes an :class:`~a2a_secure.identity.keys.Identity` takes,
  refusing any key that is not a usable Ed25519 key.
* :func:`signature_bytes` and :func:`mac_bytes` check the shape of what a service answered
  (64 bytes, 32 bytes). The signature itself is verified by the ``Identity`` against the
  public key, for every signature of a remote holder, before it is used.
* :func:`crc32c` is the checksum Google Cloud KMS asks its callers to check (the
  ``google-crc32c`` package when installed, else a table-driven fallback).
* :class:`PooledKey` is the base of the adapters: blocking ``sign``/``derive_key`` calls to
  the service, and ``sign_async`` running them in a bounded pool of worker threads
  (:class:`a2a_secure.identity.remote.ThreadedKey`), since the three client libraries block.

Errors: a service that cannot be used at start (wrong key type, missing key, no MAC key
configured) raises :class:`~a2a_secure.identity.keys.KeyFileError`; a service that answers
badly while serving raises :class:`~a2a_secure.identity.keys.SignerFailed` (503 -32048, the
client retries). Messages name the service and the key, never the signed bytes.
"""

from __future__ import annotations

import abc
import importlib
import logging
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from a2a_secure.errors import DIDResolutionError
from a2a_secure.identity.ed25519 import PUBLIC_KEY_LEN, SIGNATURE_LEN, check_public_key, verify_signature
from a2a_secure.identity.keys import KeyFileError, SignerFailed
from a2a_secure.identity.remote import ThreadedKey

__all__ = [
    "MAC_LEN",
    "PooledKey",
    "SigningInputTooLarge",
    "checked_raw_key",
    "crc32c",
    "mac_bytes",
    "raw_public_key",
    "service_failed",
    "signature_bytes",
]

_log = logging.getLogger(__name__)

MAC_LEN: Final = 32
"""HMAC-SHA256's output: what ``derive_key`` returns."""
PROBE: Final = b"a2a-secure remote key check"
"""Signed once at start, and verified, so that a key whose service signs with another key
(or not at all) stops the agent from starting instead of failing every answer."""


class SigningInputTooLarge(SignerFailed):
    """The service signs no message this long (AWS KMS: 4096 bytes in RAW mode).

    A 503 like every signer failure, but a retry gets the same answer: the agent's answers
    must stay under the service's limit (see README.md, "AWS KMS")."""

    default_message = "the signing input is larger than the signing service accepts"


def raw_public_key(spki: bytes | str, *, what: str) -> bytes:
    """The raw 32-byte Ed25519 key of a SubjectPublicKeyInfo (RFC 8410), DER or PEM.

    Refuses another key type and an Ed25519 key libsodium would not accept (small order,
    non-canonical): :class:`KeyFileError` naming ``what``.
    """
    data = spki.encode("ascii") if isinstance(spki, str) else bytes(spki)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError, UnicodeEncodeError):
        raise KeyFileError(f"{what}: the public key is not a SubjectPublicKeyInfo") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{what}: the public key is not an Ed25519 key ({type(key).__name__})")
    return checked_raw_key(
        key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw), what=what
    )


def checked_raw_key(raw: bytes, *, what: str) -> bytes:
    """``raw`` if it is a usable raw Ed25519 public key (32 bytes, canonical, prime order),
    else :class:`KeyFileError` naming ``what``."""
    try:
        return check_public_key(bytes(raw))
    except DIDResolutionError as exc:
        raise KeyFileError(f"{what}: {exc.message}") from None


def signature_bytes(value: object, *, what: str) -> bytes:
    """``value`` as the 64 bytes of an Ed25519 signature, or :class:`SignerFailed`."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise SignerFailed(f"{what} answered no signature ({type(value).__name__})")
    signature = bytes(value)
    if len(signature) != SIGNATURE_LEN:
        raise SignerFailed(f"{what} answered a {len(signature)}-byte signature, not an Ed25519 one (64)")
    return signature


def mac_bytes(value: object, *, what: str) -> bytes:
    """``value`` as the 32 bytes of an HMAC-SHA256, or :class:`SignerFailed`."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise SignerFailed(f"{what} answered no MAC ({type(value).__name__})")
    mac = bytes(value)
    if len(mac) != MAC_LEN:
        raise SignerFailed(f"{what} answered a {len(mac)}-byte MAC, not an HMAC-SHA256 (32)")
    return mac


def service_failed(what: str, exc: BaseException, action: str = "did not sign") -> SignerFailed:
    """The :class:`SignerFailed` for a client library's exception: its class and, for AWS, its
    error code (``ThrottlingException``, ``AccessDeniedException``, ...), never its text,
    which may quote the request."""
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        if isinstance(error, dict) and isinstance(error.get("Code"), str):
            code = f": {error['Code'][:64]}"
    return SignerFailed(f"{what} {action} ({type(exc).__name__}{code})")


# -- CRC32C (Castagnoli), for Google Cloud KMS's integrity fields ------------------------------


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE: Final = _crc32c_table()


def crc32c_fallback(data: bytes) -> int:
    """CRC32C of ``data`` computed here (about 0.2 µs a byte here, 0.8 ms for 4 KiB: for the tests and a
    machine without ``google-crc32c``; install that in production)."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_native() -> Any:
    try:  # optional: the C implementation Google's libraries use
        return importlib.import_module("google_crc32c").value
    except ImportError:
        return None


_native = _crc32c_native()


def crc32c(data: bytes | str) -> int:
    """The CRC32C of ``data`` (a str is taken as UTF-8, as Google's samples do for a PEM)."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if _native is not None:
        return int(_native(raw))
    return crc32c_fallback(raw)


# -- the adapters' base -------------------------------------------------------------------------


class PooledKey(abc.ABC):
    """A remote Ed25519 key whose blocking client calls run in a bounded pool of threads.

    Subclasses set ``_public`` (the raw public key, read from the service at start) and
    implement :meth:`sign` and :meth:`derive_key`. ``max_workers`` bounds the signatures in
    flight at once: set it to what the service's quota allows (README.md). Calls beyond it
    wait in the pool's queue, never on the event loop.
    """

    service: str = "the signing service"

    def __init__(self, *, max_workers: int) -> None:
        self._public = b""
        self._threads = ThreadedKey(self, max_workers=max_workers)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key (read once from the service)."""
        return self._public

    @abc.abstractmethod
    def sign(self, message: bytes) -> bytes:
        """The service's Ed25519 signature of ``message`` (blocks for a round trip)."""

    @abc.abstractmethod
    def derive_key(self, info: bytes) -> bytes:
        """HMAC-SHA256 of ``info`` computed by the service under the MAC key."""

    async def sign_async(self, message: bytes) -> bytes:
        """:meth:`sign` in a worker thread: the event loop goes on while the service answers."""
        return await self._threads.sign_async(message)

    def export_seed(self) -> bytes:
        raise KeyFileError(f"the key is held by {self.service} and never leaves it")

    def close(self) -> None:
        """Stop the worker threads (signatures already started finish)."""
        self._threads.close()

    def _set_public_key(self, raw: bytes) -> None:
        if len(raw) != PUBLIC_KEY_LEN:  # raw_public_key made it; kept as a guard
            raise KeyFileError(f"{self.service}: the public key is not 32 bytes")
        self._public = raw

    def _probe(self) -> None:
        """Sign :data:`PROBE` once and verify it: the service's key is the one it published."""
        try:
            signature = self.sign(PROBE)
        except SignerFailed as exc:
            raise KeyFileError(f"{self!r} cannot sign: {exc.message}") from None
        except Exception as exc:
            raise KeyFileError(f"{self!r} cannot sign: {service_failed(self.service, exc).message}") from None
        if not verify_signature(self._public, PROBE, signature):
            raise KeyFileError(f"{self!r}: the service's signature does not verify with its public key")

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} objects are not picklable (they hold a service client)")
