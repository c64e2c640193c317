"""An agent key held by Vault's transit secrets engine: a key of type ``ed25519``.

    from examples.remote_signers.vault_transit import VaultTransitKey
    key = VaultTransitKey("agent", mac_key="agent-derive")   # VAULT_ADDR / VAULT_TOKEN, or client=
    identity = Identity(key, "my-agent")

Signing is ``POST /transit/sign/:name`` (hvac ``secrets.transit.sign_data``) with the message
base64-encoded as ``input``: Vault signs it with pure Ed25519 (it ignores ``hash_algorithm``
for ed25519 keys; ``prehashed`` is not sent). The answer is ``vault:v<N>:<base64>``:
:func:`parse_vault_value` checks the prefix, that ``N`` is the pinned key version, and the
base64, and the ``Identity`` then verifies the signature against the public key.

A transit key has versions (``vault write -f transit/keys/NAME/rotate`` adds one), each its
own key pair. This holder pins one: the version given, else the latest when it starts. It
asks Vault to sign with that version (``key_version``) and refuses an answer of another, so a
rotation in Vault never silently changes the key behind the agent's DID (a new version is a
new DID for did:key; README.md, "Rotation"). Raising the key's ``min_encryption_version``
above the pinned version stops it from signing.

The public key is ``GET /transit/keys/:name`` (``read_key``): ``keys[<version>]["public_key"]``,
the raw key in base64. A key made with ``derived=true`` signs under a per-context key and is
refused. ``derive_key`` is ``POST /transit/hmac/:name`` (``generate_hmac``, ``algorithm``
``sha2-256``) under a separate transit key (``mac_key``), pinned to a version too.

hvac blocks (requests): ``sign_async`` runs ``sign`` in a bounded pool of threads. A
``requests`` session keeps 10 connections per host by default; more workers than that open
and drop extra connections (pass a client whose session mounts a larger pool).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import re
from typing import Any, Final

from a2a_secure.identity.keys import KeyFileError, SignerFailed

from .common import PooledKey, checked_raw_key, mac_bytes, service_failed, signature_bytes

__all__ = ["HMAC_ALGORITHM", "KEY_TYPE", "VaultTransitKey", "parse_vault_value"]

KEY_TYPE: Final = "ed25519"
HMAC_ALGORITHM: Final = "sha2-256"
_VALUE: Final = re.compile(r"vault:v([1-9][0-9]{0,9}):([A-Za-z0-9+/]*={0,2})")


def parse_vault_value(value: object, *, version: int, what: str = "Vault transit") -> bytes:
    """The bytes of a transit answer ``vault:v<version>:<base64>`` (a signature, an HMAC).

    Raises :class:`SignerFailed` if it is not such a string, names another key version, or its
    base64 is not canonical standard base64.
    """
    if not isinstance(value, str):
        raise SignerFailed(f"{what} answered no vault:v… value ({type(value).__name__})")
    found = _VALUE.fullmatch(value)
    if found is None:
        raise SignerFailed(f"{what} answered a value not of the form vault:v<version>:<base64>")
    if int(found.group(1)) != version:
        raise SignerFailed(f"{what} answered with key version {found.group(1)}, not the pinned {version}")
    try:
        raw = base64.b64decode(found.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise SignerFailed(f"{what} answered a value whose base64 is malformed") from None
    if base64.b64encode(raw).decode("ascii") != found.group(2):
        raise SignerFailed(f"{what} answered a value whose base64 is not canonical")
    return raw


def _client(url: str | None, token: str | None, timeout: float) -> Any:
    try:  # optional: only an agent whose key is in Vault needs hvac
        hvac = importlib.import_module("hvac")
    except ImportError:
        raise KeyFileError("Vault transit support needs hvac: pip install hvac") from None
    return hvac.Client(url=url, token=token, timeout=timeout)


def _data(answer: object, what: str) -> dict[str, Any]:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict):
        raise SignerFailed(f"{what} answered no data object")
    return data


def _pick_version(keys: dict[str, Any], latest: object, version: int | None, what: str) -> int:
    if version is None:
        if type(latest) is not int or latest < 1:
            raise KeyFileError(f"{what}: read_key gave no latest_version")
        version = latest
    if type(version) is not int or version < 1 or str(version) not in keys:
        raise KeyFileError(f"{what} has no version {version!r} (versions: {', '.join(sorted(keys))})")
    return version


class VaultTransitKey(PooledKey):
    """An ed25519 key in Vault's transit engine: a remote
    :class:`~a2a_secure.identity.keys.KeyHolder`.

    ``name``: the transit key; ``version``: the key version to pin (default: the latest at
    start). ``mac_key`` / ``mac_version``: the transit key whose HMAC ``derive_key`` returns.
    ``mount_point``: where the engine is mounted. ``client``: an ``hvac.Client`` already
    authenticated (or anything with ``secrets.transit.read_key``, ``sign_data``,
    ``generate_hmac``); else one is made from ``url``/``token`` (or ``VAULT_ADDR`` /
    ``VAULT_TOKEN``).
    """

    service = "Vault transit"

    def __init__(
        self,
        name: str,
        *,
        version: int | None = None,
        mac_key: str | None = None,
        mac_version: int | None = None,
        mount_point: str = "transit",
        client: Any = None,
        url: str | None = None,
        token: str | None = None,
        max_workers: int = 8,
        timeout: float = 5.0,
        probe: bool = True,
    ) -> None:
        super().__init__(max_workers=max_workers)
        self._name = name
        self._mount = mount_point
        self._client = client if client is not None else _client(url, token, timeout)
        self._transit = self._client.secrets.transit
        what = f"Vault transit key {mount_point}/{name}"
        data = self._read(name, what)
        if data.get("type") != KEY_TYPE:
            raise KeyFileError(f"{what} is of type {data.get('type')!r}, not {KEY_TYPE}")
        if data.get("derived"):
            raise KeyFileError(f"{what} is a derived key (derived=true): each context would be another key")
        keys = data.get("keys")
        if not isinstance(keys, dict):
            raise KeyFileError(f"{what}: read_key gave no keys")
        self._version = _pick_version(keys, data.get("latest_version"), version, what)
        entry = keys[str(self._version)]
        public = entry.get("public_key") if isinstance(entry, dict) else None
        try:
            raw = base64.b64decode(public if isinstance(public, str) else "", validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"{what} v{self._version}: its public_key is not base64") from None
        self._set_public_key(checked_raw_key(raw, what=f"{what} v{self._version}"))
        self._mac_key = mac_key
        self._mac_version: int | None = None
        if mac_key is not None:
            mac_what = f"Vault transit key {mount_point}/{mac_key}"
            mac_data = self._read(mac_key, mac_what)
            mac_keys = mac_data.get("keys")
            if not isinstance(mac_keys, dict):
                raise KeyFileError(f"{mac_what}: read_key gave no keys")
            self._mac_version = _pick_version(mac_keys, mac_data.get("latest_version"), mac_version, mac_what)
        if probe:
            self._probe()

    def _read(self, name: str, what: str) -> dict[str, Any]:
        try:
            answer = self._transit.read_key(name=name, mount_point=self._mount)
        except Exception as exc:
            raise KeyFileError(
                f"{what}: {service_failed(self.service, exc, 'could not be read').message}"
            ) from None
        try:
            return _data(answer, what)
        except SignerFailed as exc:
            raise KeyFileError(exc.message) from None

    @property
    def version(self) -> int:
        """The pinned key version that signs."""
        return self._version

    def sign(self, message: bytes) -> bytes:
        what = f"Vault transit ({self._mount}/{self._name})"
        try:
            answer = self._transit.sign_data(
                name=self._name,
                hash_input=base64.b64encode(bytes(message)).decode("ascii"),
                key_version=self._version,
                mount_point=self._mount,
            )
        except Exception as exc:
            raise service_failed(self.service, exc) from None
        value = _data(answer, what).get("signature")
        return signature_bytes(parse_vault_value(value, version=self._version, what=what), what=what)

    def derive_key(self, info: bytes) -> bytes:
        if self._mac_key is None or self._mac_version is None:
            raise KeyFileError(
                f"the Vault transit key {self._mount}/{self._name} has no MAC key for derived keys:"
                " pass mac_key (a transit key used for nothing else)"
            )
        what = f"Vault transit ({self._mount}/{self._mac_key})"
        try:
            answer = self._transit.generate_hmac(
                name=self._mac_key,
                hash_input=base64.b64encode(bytes(info)).decode("ascii"),
                key_version=self._mac_version,
                algorithm=HMAC_ALGORITHM,
                mount_point=self._mount,
            )
        except Exception as exc:
            raise service_failed(self.service, exc, "gave no MAC") from None
        value = _data(answer, what).get("hmac")
        return mac_bytes(parse_vault_value(value, version=self._mac_version, what=what), what=what)

    def __repr__(self) -> str:
        return f"VaultTransitKey({getattr(self, '_mount', '?')}/{getattr(self, '_name', '?')})"
