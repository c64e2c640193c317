"""The worked remote-key adapters of examples/remote_signers/, without any cloud library.

Each adapter is given a fake client: a small class with the method names and answer shapes
of boto3's KMS client, google-cloud-kms's ``KeyManagementServiceClient`` and hvac's transit
API, backed by a real Ed25519 key made here (PyNaCl) and a real HMAC key. Nothing is mocked
on the adapter's side: the key and signature conversions, the checks of each answer (AWS's
4096-byte limit, Google's CRC32C fields, Vault's ``vault:v<N>:`` values) and, under a real
AgentServer and A2AClient over uvicorn, the signatures of every answer, error and stream
event, verified by the client.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import hmac
import pickle
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import nacl.signing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import InvalidParams, Unavailable
from a2a_secure.identity.ed25519 import verify_signature
from a2a_secure.identity.keys import Identity, KeyFileError, SignerFailed
from a2a_secure.identity.remote import RemoteKeyHolder
from a2a_secure.identity.rotation import KeyRing, RetiredKey, verify_rotation_statement
from a2a_secure.server.app import AgentServer
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app
from examples.remote_signers.aws_kms import AwsKmsKey
from examples.remote_signers.common import (
    SigningInputTooLarge,
    crc32c,
    crc32c_fallback,
    mac_bytes,
    raw_public_key,
    signature_bytes,
)
from examples.remote_signers.gcp_kms import GcpKmsKey
from examples.remote_signers.vault_transit import VaultTransitKey, parse_vault_value
from tests.http_helpers import identity
from tests.test_remote_signer import server_with

REPO = Path(__file__).resolve().parents[1]
FAST = RetryPolicy(attempts=1, base=0.01, cap=0.02, max_wait=2)


def signing_key(name: str) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(hashlib.sha256(b"remote-signer-examples:" + name.encode()).digest())


def spki(raw: bytes, encoding: serialization.Encoding) -> bytes:
    key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    return key.public_bytes(encoding, serialization.PublicFormat.SubjectPublicKeyInfo)


class FakeService:
    """What the three fakes share: a real key, call counts, the threads that called, an
    injected latency, failure or wrong key."""

    def __init__(self, name: str, latency: float = 0.0) -> None:
        self.key = signing_key(name)
        self.mac_secret = hashlib.sha256(b"mac:" + name.encode()).digest()
        self.latency = latency
        self.calls: Counter[str] = Counter()
        self.threads: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail: Exception | None = None
        self.wrong: nacl.signing.SigningKey | None = None
        self._lock = threading.Lock()

    @property
    def public(self) -> bytes:
        return bytes(self.key.verify_key)

    def _signature(self, message: bytes, key: nacl.signing.SigningKey | None = None) -> bytes:
        with self._lock:
            self.calls["sign"] += 1
            self.threads.append(threading.current_thread().name)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.latency:
                time.sleep(self.latency)
            if self.fail is not None:
                raise self.fail
            signer = self.wrong or key or self.key
            return bytes(signer.sign(bytes(message)).signature)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _mac(self, message: bytes) -> bytes:
        self.calls["mac"] += 1
        if self.fail is not None:
            raise self.fail
        return hmac.new(self.mac_secret, message, hashlib.sha256).digest()


# -- AWS KMS (boto3's client: keyword arguments, dict answers, ClientError) ---------------------


class ClientError(Exception):
    """botocore.exceptions.ClientError's shape: ``response["Error"]["Code"]``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"An error occurred ({code}): {message}")
        self.response = {"Error": {"Code": code, "Message": message}}


class FakeKms(FakeService):
    ARN = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    MAC_ARN = "arn:aws:kms:eu-west-1:111122223333:key/0987dcba-09ab-87cd-65ef-0987654321ba"

    def __init__(self, name: str = "aws", latency: float = 0.0) -> None:
        super().__init__(name, latency)
        self.key_spec = "ECC_NIST_EDWARDS25519"
        self.answer_key_id: str | None = None
        self.messages: list[int] = []

    def get_public_key(self, *, KeyId: str) -> dict[str, Any]:
        if KeyId not in (self.ARN, "alias/agent", self.ARN.rsplit("/", 1)[1]):
            raise ClientError("NotFoundException", f"Key '{KeyId}' does not exist")
        return {
            "KeyId": self.ARN,
            "PublicKey": spki(self.public, serialization.Encoding.DER),
            "CustomerMasterKeySpec": self.key_spec,
            "KeySpec": self.key_spec,
            "KeyUsage": "SIGN_VERIFY",
            "SigningAlgorithms": ["ED25519_SHA_512", "ED25519_PH_SHA_512"],
        }

    def sign(self, *, KeyId: str, Message: bytes, MessageType: str, SigningAlgorithm: str) -> dict[str, Any]:
        if KeyId != self.ARN:
            raise ClientError("NotFoundException", "no such key")
        if MessageType != "RAW" or SigningAlgorithm != "ED25519_SHA_512":
            raise ClientError("ValidationException", "ED25519_SHA_512 requires MessageType RAW")
        if len(Message) > 4096:
            raise ClientError("ValidationException", "Message must have length less than or equal to 4096")
        self.messages.append(len(Message))
        return {
            "KeyId": self.answer_key_id or self.ARN,
            "Signature": self._signature(Message),
            "SigningAlgorithm": SigningAlgorithm,
        }

    def generate_mac(self, *, KeyId: str, Message: bytes, MacAlgorithm: str) -> dict[str, Any]:
        if KeyId != self.MAC_ARN or MacAlgorithm != "HMAC_SHA_256":
            raise ClientError("InvalidKeyUsageException", "not an HMAC key")
        return {"Mac": self._mac(Message), "MacAlgorithm": MacAlgorithm, "KeyId": self.MAC_ARN}


# -- Google Cloud KMS (request dicts, proto-plus answers with attributes) ------------------------


class Algorithm(enum.IntEnum):
    """The proto-plus enum's shape: an IntEnum whose member names are the API's."""

    EC_SIGN_ED25519 = 40
    EC_SIGN_P256_SHA256 = 12
    HMAC_SHA256 = 32


class FakeGcp(FakeService):
    VERSION = "projects/p/locations/europe-west1/keyRings/agents/cryptoKeys/agent/cryptoKeyVersions/1"
    MAC = "projects/p/locations/europe-west1/keyRings/agents/cryptoKeys/agent-derive/cryptoKeyVersions/1"

    def __init__(self, name: str = "gcp", latency: float = 0.0) -> None:
        super().__init__(name, latency)
        self.algorithm = Algorithm.EC_SIGN_ED25519
        self.corrupt: str | None = None  # "signature", "name", "unverified", "pem", "mac"
        self.timeouts: list[float] = []

    def get_public_key(self, *, request: dict[str, Any], timeout: float) -> Any:
        pem = spki(self.public, serialization.Encoding.PEM).decode("ascii")
        return SimpleNamespace(
            name=request["name"],
            pem=pem,
            pem_crc32c=crc32c_fallback(pem.encode()) ^ (1 if self.corrupt == "pem" else 0),
            algorithm=self.algorithm,
        )

    def _check_data(self, request: dict[str, Any]) -> bool:
        given = request.get("data_crc32c")
        if given is not None and given != crc32c_fallback(request["data"]):
            raise ClientError("InvalidArgument", "data_crc32c does not match")  # what the service does
        return given is not None

    def asymmetric_sign(self, *, request: dict[str, Any], timeout: float) -> Any:
        self.timeouts.append(timeout)
        assert set(request) <= {"name", "data", "data_crc32c"}, "digest is not for EC_SIGN_ED25519"
        verified = self._check_data(request)
        signature = self._signature(request["data"])
        return SimpleNamespace(
            name="projects/p/other" if self.corrupt == "name" else request["name"],
            signature=signature,
            signature_crc32c=crc32c_fallback(signature) ^ (1 if self.corrupt == "signature" else 0),
            verified_data_crc32c=verified and self.corrupt != "unverified",
            verified_digest_crc32c=False,
        )

    def mac_sign(self, *, request: dict[str, Any], timeout: float) -> Any:
        verified = self._check_data(request)
        mac = self._mac(request["data"])
        return SimpleNamespace(
            name=request["name"],
            mac=mac,
            mac_crc32c=crc32c_fallback(mac) ^ (1 if self.corrupt == "mac" else 0),
            verified_data_crc32c=verified,
        )


# -- Vault transit (hvac: client.secrets.transit.*, dict answers) --------------------------------


class FakeTransit:
    def __init__(self, service: FakeVault) -> None:
        self._s = service

    def read_key(self, name: str, mount_point: str = "transit") -> dict[str, Any]:
        s = self._s
        if name == "agent-derive":
            return {"data": {"type": "hmac", "latest_version": 1, "keys": {"1": 1_700_000_000}}}
        if name != "agent":
            raise ClientError("InvalidPath", "no such key")
        keys = {
            str(v): {
                "creation_time": "2026-01-01T00:00:00Z",
                "name": "ed25519",
                "public_key": base64.b64encode(bytes(k.verify_key)).decode(),
            }
            for v, k in s.versions.items()
        }
        return {
            "data": {
                "type": s.key_type,
                "derived": s.derived,
                "exportable": False,
                "latest_version": max(s.versions),
                "min_encryption_version": 0,
                "keys": keys,
            }
        }

    def sign_data(
        self, name: str, hash_input: str, key_version: int | None = None, mount_point: str = "transit"
    ) -> dict[str, Any]:
        s = self._s
        version = key_version or max(s.versions)
        signature = s._signature(base64.b64decode(hash_input, validate=True), s.versions[version])
        shown = s.answer_version or version
        value = s.tamper(f"vault:v{shown}:" + base64.b64encode(signature).decode())
        return {"data": {"signature": value, "key_version": shown}}

    def generate_hmac(
        self,
        name: str,
        hash_input: str,
        key_version: int | None = None,
        algorithm: str | None = None,
        mount_point: str = "transit",
    ) -> dict[str, Any]:
        assert name == "agent-derive" and algorithm == "sha2-256"
        mac = self._s._mac(base64.b64decode(hash_input, validate=True))
        return {"data": {"hmac": f"vault:v{key_version}:" + base64.b64encode(mac).decode()}}


class FakeVault(FakeService):
    def __init__(self, name: str = "vault", latency: float = 0.0) -> None:
        super().__init__(name, latency)
        self.versions = {1: self.key, 2: signing_key(name + "-v2")}
        self.key_type = "ed25519"
        self.derived = False
        self.answer_version: int | None = None
        self.tamper: Any = lambda value: value
        self.secrets = SimpleNamespace(transit=FakeTransit(self))


def aws_key(fake: FakeKms | None = None, **kw: Any) -> tuple[AwsKmsKey, FakeKms]:
    fake = fake or FakeKms()
    kw.setdefault("mac_key_id", FakeKms.MAC_ARN)
    return AwsKmsKey("alias/agent", client=fake, **kw), fake


def gcp_key(fake: FakeGcp | None = None, **kw: Any) -> tuple[GcpKmsKey, FakeGcp]:
    fake = fake or FakeGcp()
    kw.setdefault("mac_version", FakeGcp.MAC)
    return GcpKmsKey(FakeGcp.VERSION, client=fake, **kw), fake


def vault_key(fake: FakeVault | None = None, **kw: Any) -> tuple[VaultTransitKey, FakeVault]:
    fake = fake or FakeVault()
    kw.setdefault("mac_key", "agent-derive")
    return VaultTransitKey("agent", client=fake, **kw), fake


MAKERS = {"aws": aws_key, "gcp": gcp_key, "vault": vault_key}
FAKES: dict[str, Any] = {"aws": FakeKms, "gcp": FakeGcp, "vault": FakeVault}


# -- the pure helpers ---------------------------------------------------------------------------


def test_the_raw_key_is_read_from_der_and_pem_subject_public_key_infos() -> None:
    raw = bytes(signing_key("k").verify_key)
    der = spki(raw, serialization.Encoding.DER)
    pem = spki(raw, serialization.Encoding.PEM)
    assert raw_public_key(der, what="k") == raw
    assert raw_public_key(pem, what="k") == raw
    assert raw_public_key(pem.decode("ascii"), what="k") == raw  # Google's pem is a str
    assert len(der) == 44 and der.startswith(bytes.fromhex("302a300506032b6570032100"))


def test_a_public_key_that_is_not_a_usable_ed25519_key_is_refused() -> None:
    p256 = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        raw_public_key(
            p256.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo),
            what="k",
        )
    with pytest.raises(KeyFileError, match="not a SubjectPublicKeyInfo"):
        raw_public_key(b"\x30\x03\x02\x01\x00", what="k")
    with pytest.raises(KeyFileError, match="not a SubjectPublicKeyInfo"):
        raw_public_key("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n", what="k")
    # A small-order point (the identity) wrapped as an Ed25519 SPKI: OpenSSL loads it,
    # libsodium's check refuses it (ATTACKS.md A3).
    small_order = bytes([1]) + bytes(31)
    with pytest.raises(KeyFileError, match="prime-order"):
        raw_public_key(bytes.fromhex("302a300506032b6570032100") + small_order, what="k")


def test_signature_and_mac_shapes_are_checked() -> None:
    assert signature_bytes(bytearray(64), what="s") == bytes(64)
    assert mac_bytes(memoryview(bytes(32)), what="s") == bytes(32)
    for bad in (bytes(63), bytes(65), "x" * 64, None):
        with pytest.raises(SignerFailed):
            signature_bytes(bad, what="s")
    for bad in (bytes(31), bytes(64), None):
        with pytest.raises(SignerFailed):
            mac_bytes(bad, what="s")


def test_crc32c_matches_the_published_check_values() -> None:
    # RFC 3720 B.4 and the CRC catalogue's check value ("123456789").
    assert crc32c_fallback(b"123456789") == 0xE3069283
    assert crc32c_fallback(bytes(32)) == 0x8A9136AA
    assert crc32c_fallback(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_fallback(bytes(range(32))) == 0x46DD794E
    assert crc32c_fallback(b"") == 0
    assert crc32c("123456789") == 0xE3069283  # a str as UTF-8, as for a PEM


def test_the_native_crc32c_agrees_with_the_fallback() -> None:
    native = pytest.importorskip("google_crc32c", reason="google-crc32c is not installed here")
    for data in (
        b"",
        b"a",
        bytes(range(256)) * 17,
        spki(bytes(signing_key("x").verify_key), serialization.Encoding.PEM),
    ):
        assert native.value(data) == crc32c_fallback(data) == crc32c(data)


_SIG = bytes(range(64))
_B64 = base64.b64encode(_SIG).decode()


def test_a_vault_value_of_the_pinned_version_is_parsed() -> None:
    assert parse_vault_value("vault:v3:" + _B64, version=3) == _SIG
    assert parse_vault_value("vault:v12:" + _B64, version=12) == _SIG


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("vault:v2:" + _B64, "key version 2, not the pinned 3", id="wrong version"),
        pytest.param(_B64, "not of the form", id="no prefix"),
        pytest.param("vaultx:v3:" + _B64, "not of the form", id="other prefix"),
        pytest.param("VAULT:v3:" + _B64, "not of the form", id="upper case"),
        pytest.param("vault:v03:" + _B64, "not of the form", id="leading zero"),
        pytest.param("vault:v0:" + _B64, "not of the form", id="version 0"),
        pytest.param("vault::" + _B64, "not of the form", id="no version"),
        pytest.param(
            "vault:v3:" + base64.urlsafe_b64encode(b"\xfb\xff" * 32).decode(),
            "not of the form",
            id="url-safe",
        ),
        pytest.param("vault:v3:" + _B64.rstrip("=") + "=", "malformed", id="bad padding"),
        pytest.param("vault:v3:AB==", "not canonical", id="non-canonical"),
        pytest.param("vault:v3:" + _B64 + " ", "not of the form", id="trailing text"),
        pytest.param(None, "no vault", id="not a string"),
    ],
)
def test_a_malformed_vault_value_is_refused(value: object, message: str) -> None:
    with pytest.raises(SignerFailed, match=message):
        parse_vault_value(value, version=3)


# -- AWS KMS ------------------------------------------------------------------------------------


def test_aws_resolves_the_alias_once_and_signs_with_the_key_arn() -> None:
    key, fake = aws_key()
    assert key.key_arn == FakeKms.ARN
    assert key.public_key == fake.public
    assert isinstance(key, RemoteKeyHolder)
    ident = Identity(key, "agent")
    assert ident.remote and ident.public_key == fake.public
    assert verify_signature(fake.public, b"m", ident.sign(b"m"))
    assert fake.calls["sign"] == 2  # the start-up probe, then this one
    assert repr(key) == f"AwsKmsKey({FakeKms.ARN!r})"


def test_aws_refuses_more_than_4096_bytes_before_calling_the_service() -> None:
    key, fake = aws_key()
    ident = Identity(key, "agent")
    assert verify_signature(fake.public, bytes(4096), ident.sign(bytes(4096)))
    before = fake.calls["sign"]
    with pytest.raises(
        SigningInputTooLarge, match=r"at most 4096 bytes in RAW mode; this signing input has 4097"
    ) as info:
        ident.sign(bytes(4097))
    assert "Ed25519ph" in info.value.message
    assert info.value.code == -32048  # a SignerFailed: fails closed as a 503
    with pytest.raises(SigningInputTooLarge):
        asyncio.run(ident.sign_async(bytes(10_000)))
    assert fake.calls["sign"] == before


def test_aws_refuses_a_key_of_another_spec_and_answers_of_another_key() -> None:
    fake = FakeKms()
    fake.key_spec = "ECC_NIST_P256"
    with pytest.raises(KeyFileError, match="KeySpec 'ECC_NIST_P256', not ECC_NIST_EDWARDS25519"):
        aws_key(fake)
    with pytest.raises(KeyFileError, match="NotFoundException"):
        AwsKmsKey("alias/missing", client=FakeKms())
    key, fake = aws_key()
    fake.answer_key_id = FakeKms.MAC_ARN
    with pytest.raises(SignerFailed, match="another key or algorithm"):
        key.sign(b"m")
    fake.answer_key_id = None
    fake.fail = ClientError("ThrottlingException", "Rate exceeded for the message 'secret'")
    with pytest.raises(SignerFailed) as info:
        Identity(key, "agent").sign(b"m")
    assert "ThrottlingException" in info.value.message and "secret" not in info.value.message


def test_aws_start_up_probe_catches_a_service_signing_with_another_key() -> None:
    fake = FakeKms()
    fake.wrong = signing_key("impostor")
    with pytest.raises(KeyFileError, match="does not verify with its public key"):
        aws_key(fake)
    aws_key(fake, probe=False)  # without the probe, Identity's check catches it at first use


def test_aws_derives_with_generate_mac_on_the_separate_hmac_key() -> None:
    key, fake = aws_key()
    info = b"a2a-secure action key|did:key:z|a1"
    assert Identity(key, "agent").derive_key(info) == hmac.new(fake.mac_secret, info, hashlib.sha256).digest()
    bare, _ = aws_key(mac_key_id=None)
    with pytest.raises(KeyFileError, match="pass mac_key_id"):
        bare.derive_key(info)


# -- Google Cloud KMS ---------------------------------------------------------------------------


def test_gcp_signs_data_with_its_crc32c_and_checks_every_integrity_field() -> None:
    key, fake = gcp_key(timeout=2.5)
    assert key.public_key == fake.public
    assert verify_signature(fake.public, b"m" * 5000, Identity(key, "agent").sign(b"m" * 5000))
    assert fake.timeouts[-1] == 2.5
    for corrupt, message in (
        ("signature", "CRC32C does not match"),
        ("name", "another key version"),
        ("unverified", "did not check the data's CRC32C"),
    ):
        fake.corrupt = corrupt
        with pytest.raises(SignerFailed, match=message):
            key.sign(b"m")
    fake.corrupt = "mac"
    with pytest.raises(SignerFailed, match="CRC32C does not match"):
        key.derive_key(b"i")
    fake.corrupt = None
    assert key.derive_key(b"i") == hmac.new(fake.mac_secret, b"i", hashlib.sha256).digest()


def test_gcp_refuses_a_key_that_is_not_an_ed25519_version() -> None:
    fake = FakeGcp()
    fake.algorithm = Algorithm.EC_SIGN_P256_SHA256
    with pytest.raises(KeyFileError, match="EC_SIGN_P256_SHA256, not EC_SIGN_ED25519"):
        gcp_key(fake)
    fake = FakeGcp()
    fake.corrupt = "pem"
    with pytest.raises(KeyFileError, match="CRC32C"):
        gcp_key(fake)
    with pytest.raises(KeyFileError, match="must name a key version"):
        GcpKmsKey(FakeGcp.VERSION.rsplit("/cryptoKeyVersions", 1)[0], client=FakeGcp())
    with pytest.raises(KeyFileError, match="pass mac_version"):
        gcp_key(mac_version=None)[0].derive_key(b"i")


# -- Vault transit ------------------------------------------------------------------------------


def test_vault_pins_a_key_version_and_refuses_answers_of_another() -> None:
    latest, fake = vault_key()
    assert latest.version == 2 and latest.public_key == bytes(fake.versions[2].verify_key)
    first, _ = vault_key(fake, version=1)
    assert first.public_key == fake.public
    assert Identity(first, "a").did != Identity(latest, "a").did  # a new version is a new did:key
    assert verify_signature(fake.public, b"m", first.sign(b"m"))
    fake.answer_version = 2
    with pytest.raises(SignerFailed, match="key version 2, not the pinned 1"):
        first.sign(b"m")
    fake.answer_version = None
    fake.tamper = lambda value: value.replace("vault:", "vault-")
    with pytest.raises(SignerFailed, match="not of the form"):
        first.sign(b"m")
    fake.tamper = lambda value: value[:-4] + "!!=="
    with pytest.raises(SignerFailed):
        first.sign(b"m")
    with pytest.raises(KeyFileError, match="no version 3"):
        vault_key(fake, version=3)


def test_vault_refuses_keys_that_are_not_plain_ed25519() -> None:
    fake = FakeVault()
    fake.key_type = "ecdsa-p256"
    with pytest.raises(KeyFileError, match="type 'ecdsa-p256', not ed25519"):
        vault_key(fake)
    fake = FakeVault()
    fake.derived = True
    with pytest.raises(KeyFileError, match="derived key"):
        vault_key(fake)


def test_vault_derives_with_the_hmac_of_a_separate_key_at_a_pinned_version() -> None:
    key, fake = vault_key()
    assert key.derive_key(b"i") == hmac.new(fake.mac_secret, b"i", hashlib.sha256).digest()
    with pytest.raises(KeyFileError, match="pass mac_key"):
        vault_key(mac_key=None)[0].derive_key(b"i")


# -- what the three share ----------------------------------------------------------------------


@pytest.mark.parametrize("service", sorted(MAKERS))
def test_a_remote_key_never_leaves_and_is_not_pickled(service: str) -> None:
    key, _ = MAKERS[service]()
    ident = Identity(key, "agent")
    with pytest.raises(KeyFileError, match="never leaves"):
        ident.private_key_b64u()
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(key)


def test_the_modules_import_no_cloud_library() -> None:
    code = (
        "import sys\n"
        "import examples.remote_signers.aws_kms, examples.remote_signers.gcp_kms\n"
        "import examples.remote_signers.vault_transit\n"
        "loaded = {'boto3', 'botocore', 'hvac', 'grpc', 'google.cloud.kms'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize(
    ("library", "make"),
    [
        ("boto3", lambda: AwsKmsKey("alias/agent")),
        ("google.cloud.kms", lambda: GcpKmsKey(FakeGcp.VERSION)),
        ("hvac", lambda: VaultTransitKey("agent")),
    ],
)
def test_without_its_library_an_adapter_says_what_to_install(
    library: str, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, library, None)  # its import raises ImportError
    with pytest.raises(KeyFileError, match="pip install"):
        make()


@pytest.mark.parametrize("service", sorted(MAKERS))
async def test_signatures_run_in_a_bounded_pool_of_threads(service: str) -> None:
    maker = MAKERS[service]
    fake = FAKES[service](latency=0.03)
    key, _ = maker(fake, max_workers=3, probe=False)
    ident = Identity(key, "agent")
    loop_thread = threading.current_thread().name
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        sigs = await asyncio.gather(*(ident.sign_async(b"m%d" % i) for i in range(9)))
    finally:
        ticker.cancel()
        key.close()
    assert all(verify_signature(key.public_key, b"m%d" % i, s) for i, s in enumerate(sigs))
    assert fake.most_in_flight == 3  # bounded by max_workers, and used
    assert loop_thread not in fake.threads and all(t.startswith("a2a-sign") for t in fake.threads)
    assert ticks >= 5  # nine 30 ms signatures three at a time: the loop ran meanwhile


async def test_rotation_to_a_new_service_key_is_signed_by_the_old_one_and_served() -> None:
    old_key, fake = vault_key(version=1)
    new_key, _ = vault_key(fake, version=2)
    old, new = Identity(old_key, "agent"), Identity(new_key, "agent")
    t = int(time.time())
    rotated = KeyRing(old).rotate(overlap=3600, now=t, fresh=new)
    assert rotated.current is new and rotated.retired[0].identity is old
    # What README.md keeps across restarts: the window and the (public) statements.
    kept = rotated.retired[0]
    ring = KeyRing(new, (RetiredKey(old, kept.retired_at, kept.overlap_until),), tuple(rotated.statements))
    server = AgentServer(ring.current, key_ring=ring, store=MemoryStore())
    async with serve_app(server.app()) as url, httpx.AsyncClient() as http:
        served = (await http.get(url + "/.well-known/a2a-rotation.json")).json()["statements"]
    statement = verify_rotation_statement(served[-1], now=t + 10)
    assert (statement.did, statement.successor) == (old.did, new.did)
    assert ring.signer(old.kid, t + 10) is old and ring.signer(old.kid, t + 3600) is None


# -- end to end: a real server signing with each adapter ---------------------------------------


@pytest.mark.parametrize("service", sorted(MAKERS))
async def test_a_server_whose_key_is_in_the_service_answers_signed(service: str) -> None:
    fake = FAKES[service](latency=0.002)
    key, _ = MAKERS[service](fake)
    ident = Identity(key, "kms-agent")
    calls: Counter[str] = Counter()
    server = server_with(ident, calls=calls)
    try:
        async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
            before = fake.calls["sign"]
            answer = await client.request(ident.did, {"goal": "echo", "inputs": {"x": 1}}, endpoint=url)
            assert answer.result == {"echo": {"x": 1}}
            with pytest.raises(InvalidParams, match=r"inputs\.x") as refused:
                await client.request(ident.did, {"goal": "reject", "inputs": {}}, endpoint=url)
            assert refused.value.signed  # a signed error, verified by the client
            items = [
                i async for i in client.stream(ident.did, {"goal": "count", "inputs": {"n": 3}}, endpoint=url)
            ]
            assert items == [{"i": 0}, {"i": 1}, {"i": 2}]
            served = fake.threads[before:]
            await client.close_session(ident.did)
    finally:
        key.close()
    # Handshake (policy and session), two answers, four stream events: each signed by the
    # service, from the pool's threads, never from the event loop.
    assert fake.calls["sign"] - before >= 2 + 2 + 4
    assert served and all(t.startswith("a2a-sign") for t in served)


async def test_an_aws_answer_over_4096_bytes_is_an_unsigned_503_and_the_intent_runs_once() -> None:
    # Without sealing, the answer's token carries the result: a large one cannot be signed.
    key, fake = aws_key()
    ident = Identity(key, "kms-agent")
    calls: Counter[str] = Counter()
    server = server_with(ident, calls=calls, sealed=False)
    try:
        async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
            await client.session_for(ident.did, endpoint=url)
            with pytest.raises(Unavailable) as info:
                await client.request(
                    ident.did, {"goal": "echo", "inputs": {"blob": "x" * 4000}}, endpoint=url
                )
            assert info.value.code == -32048 and not info.value.signed
            assert calls["echo"] == 1
            answer = await client.request(
                ident.did, {"goal": "echo", "inputs": {"blob": "x" * 100}}, endpoint=url
            )
            assert answer.result == {"echo": {"blob": "x" * 100}}
    finally:
        key.close()
    assert max(fake.messages) <= 4096


async def test_a_sealed_answer_signs_the_same_small_input_whatever_the_result_size() -> None:
    # Sealed (§12.6, the default), the token binds the sealed result by its hash: a 20 KB
    # result is signed within AWS's 4096 bytes.
    key, fake = aws_key()
    ident = Identity(key, "kms-agent")
    server = server_with(ident, calls=Counter(), sealed=True)
    sizes = []
    try:
        async with serve_app(server.app()) as url, A2AClient(identity("cli"), retry=FAST) as client:
            await client.session_for(ident.did, endpoint=url)
            for n in (10, 20_000):
                del fake.messages[:]
                answer = await client.request(
                    ident.did, {"goal": "echo", "inputs": {"b": "x" * n}}, endpoint=url
                )
                assert answer.result == {"echo": {"b": "x" * n}}
                sizes.append(fake.messages[:])
    finally:
        key.close()
    assert sizes[0] == sizes[1] and max(sizes[1]) < 1024
