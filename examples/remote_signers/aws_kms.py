"""An agent key held by AWS KMS: an asymmetric key of KeySpec ``ECC_NIST_EDWARDS25519``.

    from examples.remote_signers.aws_kms import AwsKmsKey
    key = AwsKmsKey("arn:aws:kms:eu-west-1:111122223333:key/…",
                    mac_key_id="arn:aws:kms:eu-west-1:111122223333:key/…")   # optional
    identity = Identity(key, "my-agent")          # did:key of the KMS key's public key

Signing is ``Sign`` with ``SigningAlgorithm="ED25519_SHA_512"`` and ``MessageType="RAW"``:
pure Ed25519 (RFC 8032) over the message itself, which is what the protocol's EdDSA tokens
verify. KMS takes at most 4096 bytes of RAW message, and a token's signing input (base64url
header and payload) can be longer: an answer or stream event that carries its result, in a
session without sealing (a sealed one binds the result by hash and stays under 1 KB). Such a
signature fails closed here, before any call, with
:class:`~examples.remote_signers.common.SigningInputTooLarge` (a 503 that a retry does not
cure); serve with ``require_sealed=True`` (README.md, "AWS KMS").

``ED25519_PH_SHA_512`` with ``MessageType="DIGEST"`` would take a SHA-512 digest of any
length, but it makes Ed25519ph signatures (RFC 8032's pre-hashed variant, another
algorithm): no peer accepts them as the agent's EdDSA signatures, so this adapter never
uses it.

The public key comes from ``GetPublicKey`` (DER SubjectPublicKeyInfo), which also tells the
key's ARN: every later ``Sign`` names that ARN, so an alias moved to another key afterwards
does not change the key that signs under the DID. ``derive_key`` is ``GenerateMac``
(``HMAC_SHA_256``) under a separate KMS key of KeySpec ``HMAC_256`` (``mac_key_id``); without
one, what needs a derived key fails closed naming it.

boto3 blocks and its clients are thread-safe: ``sign_async`` runs ``sign`` in a bounded pool
of threads (``max_workers``), and a client made here gets as many pooled connections.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from a2a_secure.identity.keys import KeyFileError, SignerFailed

from .common import (
    PooledKey,
    SigningInputTooLarge,
    mac_bytes,
    raw_public_key,
    service_failed,
    signature_bytes,
)

__all__ = ["KEY_SPEC", "MAC_ALGORITHM", "MAX_MESSAGE", "SIGNING_ALGORITHM", "AwsKmsKey"]

KEY_SPEC: Final = "ECC_NIST_EDWARDS25519"
SIGNING_ALGORITHM: Final = "ED25519_SHA_512"
MESSAGE_TYPE: Final = "RAW"
MAC_ALGORITHM: Final = "HMAC_SHA_256"
MAX_MESSAGE: Final = 4096
"""KMS ``Sign`` and ``GenerateMac`` take messages of 0 to 4096 bytes."""


def _client(region: str | None, max_workers: int, timeout: float) -> Any:
    try:  # optional: only an agent whose key is in AWS KMS needs boto3
        boto3 = importlib.import_module("boto3")
        botocore_config = importlib.import_module("botocore.config")
    except ImportError:
        raise KeyFileError("AWS KMS support needs boto3: pip install boto3") from None
    config = botocore_config.Config(
        connect_timeout=min(timeout, 2.0),
        read_timeout=timeout,
        retries={"mode": "standard", "max_attempts": 2},
        max_pool_connections=max_workers,
    )
    return boto3.client("kms", region_name=region, config=config)


class AwsKmsKey(PooledKey):
    """An Ed25519 key in AWS KMS: a remote :class:`~a2a_secure.identity.keys.KeyHolder`.

    ``key_id``: the key's ARN, id or alias (resolved once to its ARN). ``mac_key_id``: an
    ``HMAC_256`` key for ``derive_key``, by ARN (an alias could be moved, and every derived
    key with it). ``client``: a boto3 KMS client (or anything with its ``get_public_key``,
    ``sign`` and ``generate_mac``); made from ``region`` and the default credentials
    otherwise. ``probe``: sign once at start and verify it.
    """

    service = "AWS KMS"

    def __init__(
        self,
        key_id: str,
        *,
        mac_key_id: str | None = None,
        client: Any = None,
        region: str | None = None,
        max_workers: int = 8,
        timeout: float = 5.0,
        probe: bool = True,
    ) -> None:
        super().__init__(max_workers=max_workers)
        self._client = client if client is not None else _client(region, max_workers, timeout)
        self._mac_key_id = mac_key_id
        try:
            answer = self._client.get_public_key(KeyId=key_id)
        except Exception as exc:
            raise KeyFileError(
                f"AWS KMS key {key_id!r}: {service_failed(self.service, exc, 'gave no public key').message}"
            ) from None
        self._key_arn = self._check_key(key_id, answer)
        self._set_public_key(raw_public_key(answer.get("PublicKey", b""), what=f"AWS KMS key {key_id!r}"))
        if probe:
            self._probe()

    @staticmethod
    def _check_key(key_id: str, answer: Any) -> str:
        if not isinstance(answer, dict):
            raise KeyFileError(f"AWS KMS key {key_id!r}: GetPublicKey answered no object")
        spec = answer.get("KeySpec")
        if spec != KEY_SPEC:
            raise KeyFileError(f"AWS KMS key {key_id!r} is of KeySpec {spec!r}, not {KEY_SPEC}")
        if answer.get("KeyUsage") != "SIGN_VERIFY":
            raise KeyFileError(f"AWS KMS key {key_id!r} is not a SIGN_VERIFY key")
        algorithms = answer.get("SigningAlgorithms") or []
        if SIGNING_ALGORITHM not in algorithms:
            raise KeyFileError(f"AWS KMS key {key_id!r} does not offer {SIGNING_ALGORITHM}")
        arn = answer.get("KeyId")
        if not isinstance(arn, str) or not arn.startswith("arn:"):
            raise KeyFileError(f"AWS KMS key {key_id!r}: GetPublicKey did not name the key's ARN")
        return arn

    @property
    def key_arn(self) -> str:
        """The ARN of the key that signs (what ``key_id`` named when the holder was made)."""
        return self._key_arn

    def sign(self, message: bytes) -> bytes:
        data = bytes(message)
        if len(data) > MAX_MESSAGE:
            raise SigningInputTooLarge(
                f"AWS KMS signs at most {MAX_MESSAGE} bytes in RAW mode; this signing input has"
                f" {len(data)} (the digest mode signs Ed25519ph, which peers do not accept)"
            )
        try:
            answer = self._client.sign(
                KeyId=self._key_arn,
                Message=data,
                MessageType=MESSAGE_TYPE,
                SigningAlgorithm=SIGNING_ALGORITHM,
            )
        except Exception as exc:
            raise service_failed(self.service, exc) from None
        if not isinstance(answer, dict):
            raise SignerFailed("AWS KMS answered Sign with no object")
        if answer.get("KeyId") != self._key_arn or answer.get("SigningAlgorithm") != SIGNING_ALGORITHM:
            raise SignerFailed(f"AWS KMS signed with another key or algorithm than {self._key_arn}")
        return signature_bytes(answer.get("Signature"), what="AWS KMS")

    def derive_key(self, info: bytes) -> bytes:
        if self._mac_key_id is None:
            raise KeyFileError(
                f"the AWS KMS key {self._key_arn} has no MAC key for derived keys: pass mac_key_id"
                " (an HMAC_256 KMS key)"
            )
        data = bytes(info)
        if len(data) > MAX_MESSAGE:
            raise SignerFailed(f"AWS KMS computes MACs of at most {MAX_MESSAGE} bytes")
        try:
            answer = self._client.generate_mac(
                KeyId=self._mac_key_id, Message=data, MacAlgorithm=MAC_ALGORITHM
            )
        except Exception as exc:
            raise service_failed(self.service, exc, "gave no MAC") from None
        if not isinstance(answer, dict) or answer.get("MacAlgorithm") != MAC_ALGORITHM:
            raise SignerFailed(f"AWS KMS answered GenerateMac without {MAC_ALGORITHM}")
        arn = answer.get("KeyId")
        if self._mac_key_id.startswith("arn:") and arn != self._mac_key_id:
            raise SignerFailed(f"AWS KMS computed the MAC with another key than {self._mac_key_id}")
        return mac_bytes(answer.get("Mac"), what="AWS KMS")

    def __repr__(self) -> str:
        return f"AwsKmsKey({self._key_arn!r})"
