"""An agent key held by Google Cloud KMS: a key version of algorithm ``EC_SIGN_ED25519``.

    from examples.remote_signers.gcp_kms import GcpKmsKey
    key = GcpKmsKey("projects/p/locations/europe-west1/keyRings/agents/cryptoKeys/agent/cryptoKeyVersions/1",
                    mac_version="projects/p/…/cryptoKeys/agent-derive/cryptoKeyVersions/1")  # optional
    identity = Identity(key, "my-agent")

Signing is ``AsymmetricSign`` with ``data`` (the message itself: Ed25519 in pure mode, what the
protocol's EdDSA tokens verify; ``digest`` is for the hash-then-sign algorithms). The public
key is ``GetPublicKey``'s PEM SubjectPublicKeyInfo; ``derive_key`` is ``MacSign`` on an
``HMAC_SHA256`` key version (``mac_version``).

Integrity (Google's "data integrity guidelines"): each request carries the CRC32C of its
data (``data_crc32c``), and each answer is used only if the service says it checked it
(``verified_data_crc32c``), names the key version asked for (``name``), and its own checksum
matches what came back (``signature_crc32c``, ``mac_crc32c``, ``pem_crc32c``). A mismatch is
a :class:`~a2a_secure.identity.keys.SignerFailed` (503): the client retries, as Google
advises for a corrupted answer. The signature is then verified against the public key by the
``Identity``, as every remote signature is.

A key *version* is named, never a key: a new version is a new key pair, so a new DID for a
did:key agent (README.md, "Rotation").

The client blocks (gRPC), and is thread-safe: ``sign_async`` runs ``sign`` in a bounded pool of
threads. (``KeyManagementServiceAsyncClient`` exists, but it is bound to the event loop it was
made in, and a server process with workers has one loop per worker; threads need no care.)
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Final

from a2a_secure.identity.keys import KeyFileError, SignerFailed

from .common import PooledKey, crc32c, mac_bytes, raw_public_key, service_failed, signature_bytes

__all__ = ["ALGORITHM", "MAC_ALGORITHM", "GcpKmsKey", "check_crc32c"]

ALGORITHM: Final = "EC_SIGN_ED25519"
MAC_ALGORITHM: Final = "HMAC_SHA256"
_VERSION_NAME: Final = re.compile(
    r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+/cryptoKeyVersions/[^/]+"
)


def _client() -> Any:
    try:  # optional: only an agent whose key is in Google Cloud KMS needs it
        kms = importlib.import_module("google.cloud.kms")
    except ImportError:
        raise KeyFileError(
            "Google Cloud KMS support needs google-cloud-kms: pip install google-cloud-kms"
        ) from None
    return kms.KeyManagementServiceClient()


def _version_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _VERSION_NAME.fullmatch(name):
        raise KeyFileError(
            f"{what} must name a key version: projects/…/locations/…/keyRings/…/cryptoKeys/…"
            f"/cryptoKeyVersions/N (got {name!r})"
        )
    return name


def check_crc32c(data: bytes | str, checksum: object, *, what: str) -> None:
    """Refuse ``data`` unless ``checksum`` (an answer's ``*_crc32c``) is its CRC32C."""
    if type(checksum) is not int or checksum != crc32c(data):
        raise SignerFailed(f"{what}: the answer's CRC32C does not match (corrupted in transit)")


def _algorithm_name(value: object) -> str:
    """An enum member's name (proto-plus enums are IntEnums), or the value as given."""
    name = getattr(value, "name", value)
    return name if isinstance(name, str) else repr(value)


class GcpKmsKey(PooledKey):
    """An Ed25519 key version in Google Cloud KMS: a remote
    :class:`~a2a_secure.identity.keys.KeyHolder`.

    ``version``: the full CryptoKeyVersion name. ``mac_version``: an ``HMAC_SHA256`` key
    version for ``derive_key`` (a version, so that the derived keys never change under the
    agent). ``client``: a ``KeyManagementServiceClient`` (or anything with its
    ``get_public_key``, ``asymmetric_sign``, ``mac_sign``); made with the default credentials
    otherwise. ``timeout``: seconds per call.
    """

    service = "Google Cloud KMS"

    def __init__(
        self,
        version: str,
        *,
        mac_version: str | None = None,
        client: Any = None,
        max_workers: int = 8,
        timeout: float = 5.0,
        probe: bool = True,
    ) -> None:
        super().__init__(max_workers=max_workers)
        self._version = _version_name(version, "version")
        self._mac_version = None if mac_version is None else _version_name(mac_version, "mac_version")
        self._timeout = timeout
        self._client = client if client is not None else _client()
        what = f"Google Cloud KMS key {version}"
        try:
            answer = self._client.get_public_key(request={"name": self._version}, timeout=timeout)
        except Exception as exc:
            raise KeyFileError(
                f"{what}: {service_failed(self.service, exc, 'gave no public key').message}"
            ) from None
        if getattr(answer, "name", None) != self._version:
            raise KeyFileError(f"{what}: GetPublicKey answered for another key version")
        algorithm = _algorithm_name(getattr(answer, "algorithm", None))
        if algorithm != ALGORITHM:
            raise KeyFileError(f"{what} is of algorithm {algorithm}, not {ALGORITHM}")
        pem = getattr(answer, "pem", None)
        if not isinstance(pem, str):
            raise KeyFileError(f"{what}: GetPublicKey answered no PEM")
        try:
            check_crc32c(pem, getattr(answer, "pem_crc32c", None), what=what)
        except SignerFailed as exc:
            raise KeyFileError(exc.message) from None
        self._set_public_key(raw_public_key(pem, what=what))
        if probe:
            self._probe()

    @property
    def version(self) -> str:
        """The key version that signs."""
        return self._version

    def sign(self, message: bytes) -> bytes:
        data = bytes(message)
        request = {"name": self._version, "data": data, "data_crc32c": crc32c(data)}
        try:
            answer = self._client.asymmetric_sign(request=request, timeout=self._timeout)
        except Exception as exc:
            raise service_failed(self.service, exc) from None
        what = f"Google Cloud KMS ({self._version})"
        if getattr(answer, "name", None) != self._version:
            raise SignerFailed(f"{what} answered for another key version")
        if getattr(answer, "verified_data_crc32c", None) is not True:
            raise SignerFailed(f"{what} did not check the data's CRC32C (corrupted in transit?)")
        signature = signature_bytes(getattr(answer, "signature", None), what=what)
        check_crc32c(signature, getattr(answer, "signature_crc32c", None), what=what)
        return signature

    def derive_key(self, info: bytes) -> bytes:
        if self._mac_version is None:
            raise KeyFileError(
                f"the Google Cloud KMS key {self._version} has no MAC key for derived keys: pass"
                f" mac_version (a {MAC_ALGORITHM} key version)"
            )
        data = bytes(info)
        request = {"name": self._mac_version, "data": data, "data_crc32c": crc32c(data)}
        try:
            answer = self._client.mac_sign(request=request, timeout=self._timeout)
        except Exception as exc:
            raise service_failed(self.service, exc, "gave no MAC") from None
        what = f"Google Cloud KMS ({self._mac_version})"
        if getattr(answer, "name", None) != self._mac_version:
            raise SignerFailed(f"{what} answered for another key version")
        if getattr(answer, "verified_data_crc32c", None) is not True:
            raise SignerFailed(f"{what} did not check the data's CRC32C (corrupted in transit?)")
        mac = mac_bytes(getattr(answer, "mac", None), what=what)
        check_crc32c(mac, getattr(answer, "mac_crc32c", None), what=what)
        return mac

    def __repr__(self) -> str:
        return f"GcpKmsKey({getattr(self, '_version', '?')!r})"
