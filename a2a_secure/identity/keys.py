"""Ed25519 identity keys (RFC 8032) through libsodium (PyNaCl).

libsodium is the engine on purpose: it signs and verifies faster here than OpenSSL, and its
verification is strict where OpenSSL is lax (it refuses small-order and non-canonical keys
and R values, and S >= L). Nothing here implements a primitive.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import nacl.bindings
import nacl.signing
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from a2a_secure.errors import A2AError, InvalidParams, Unavailable
from a2a_secure.identity import encoding
from a2a_secure.identity.did import did_key_from_public_key, key_id_for_did_key
from a2a_secure.identity.ed25519 import SIGNATURE_LEN, check_public_key, verify_signature
from a2a_secure.system import wall_now

__all__ = [
    "KeyFileError",
    "Identity",
    "KeyHolder",
    "SeedKey",
    "SignerFailed",
    "check_public_key",
    "public_key_entry",
    "verify_signature",
]

_log = logging.getLogger(__name__)

SEED_LEN = 32
KEY_FILE_VERSION = 1


class KeyFileError(A2AError):
    """A key file or key variable could not be used (missing, unsafe permissions, malformed)."""

    default_message = "key file cannot be used"


class SignerFailed(Unavailable):
    """A remote key holder did not give a valid signature (down, slow, wrong key): nothing is
    sent signed; the caller may retry (503, -32048)."""

    default_message = "the signing service is unavailable"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, retry_after=1)


def public_key_entry(kid: str, public_key: bytes) -> dict[str, str]:
    """The public key entry of PROTOCOL.md §2 for ``kid`` and a raw 32-byte key."""
    return {
        "kid": kid,
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "key": encoding.b64u_encode(public_key),
    }


@runtime_checkable
class KeyHolder(Protocol):
    """What holds an agent's Ed25519 private key and uses it without handing it out.

    Every signature an agent makes (handshake, answers, stream events, delegation links,
    approvals, audit checkpoints, rotation statements) goes through ``sign``; every key the
    agent derives from its identity (sealed actions at rest, the answer keys of sealed
    intent_ids) through ``derive_key``. A key file's seed is one holder (:class:`SeedKey`), a
    PKCS#11 token another (:mod:`a2a_secure.identity.pkcs11`): no code path needs the private
    key's bytes.
    """

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        ...

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message`` (RFC 8032, deterministic)."""
        ...

    def derive_key(self, info: bytes) -> bytes:
        """32 secret bytes bound to this key and ``info``, the same on every call.

        Only the key's holder can compute them; they are never sent. A holder that cannot
        derive keys raises :class:`KeyFileError` naming what is missing.
        """
        ...

    def export_seed(self) -> bytes:
        """The 32-byte seed, for a key file; a holder whose key cannot leave it raises
        :class:`KeyFileError`."""
        ...


class SeedKey:
    """A private key held in this process as its 32-byte seed (a key file or variable)."""

    __slots__ = ("_public", "_secret", "_signing")

    def __init__(self, signing_key: nacl.signing.SigningKey) -> None:
        self._signing = signing_key
        self._secret = signing_key._signing_key  # libsodium's 64-byte secret key: seed || public
        self._public = bytes(signing_key.verify_key)

    @property
    def public_key(self) -> bytes:
        return self._public

    def sign(self, message: bytes) -> bytes:
        return nacl.bindings.crypto_sign(bytes(message), self._secret)[:SIGNATURE_LEN]

    def derive_key(self, info: bytes) -> bytes:
        # HKDF-SHA256 of the seed: the derivation sealed records made before holders existed.
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(bytes(self._signing))

    def export_seed(self) -> bytes:
        return bytes(self._signing)

    def __repr__(self) -> str:
        return "SeedKey(<private>)"

    def __reduce__(self) -> Any:
        raise TypeError("SeedKey objects are not picklable (they hold a private key)")


class Identity:
    """An agent's Ed25519 signing identity: its DID, key id and the holder of its private key.

    The private key never appears in ``repr``, ``str`` or a log record; ``sign`` takes only
    the message, so the public key used in the signature is always the one derived from the
    private key (no double-public-key oracle, ATTACKS.md A8). The key itself may live in this
    process (:class:`SeedKey`) or in a token that never lets it out (:class:`KeyHolder`).
    """

    __slots__ = ("__weakref__", "_did", "_holder", "_kid", "_public", "_sign", "agent_id", "remote")

    def __init__(
        self,
        signing_key: nacl.signing.SigningKey | KeyHolder,
        agent_id: str,
        *,
        did: str | None = None,
        kid: str | None = None,
    ) -> None:
        if not isinstance(agent_id, str) or not 1 <= len(agent_id) <= 128:
            raise InvalidParams("agent_id must be 1-128 characters")
        holder: KeyHolder = (
            SeedKey(signing_key) if isinstance(signing_key, nacl.signing.SigningKey) else signing_key
        )
        self._holder = holder
        self._public = bytes(holder.public_key)
        # A holder that answers over the network (a KMS, an HSM reached through a service)
        # has ``sign_async``: the runtime awaits it (identity/remote.py), and every signature
        # it returns is checked against the public key before it is used.
        self.remote: bool = callable(getattr(holder, "sign_async", None))
        self._sign = self._sign_checked if self.remote else holder.sign  # bound once
        self.agent_id = agent_id
        if did is None:
            did = did_key_from_public_key(self._public)
            kid = key_id_for_did_key(did)
        elif kid is None:
            raise InvalidParams("a did:web identity needs the key id from its DID document")
        self._did = did
        self._kid = kid

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def generate(cls, agent_id: str) -> Identity:
        """A new identity with a key from the operating system's CSPRNG."""
        return cls(nacl.signing.SigningKey.generate(), agent_id)

    @classmethod
    def from_seed(cls, seed: bytes, agent_id: str, **kw: Any) -> Identity:
        """An identity from a raw 32-byte Ed25519 seed (the RFC 8032 private key)."""
        if type(seed) is not bytes or len(seed) != SEED_LEN:
            raise KeyFileError("Ed25519 private key must be 32 bytes")
        return cls(nacl.signing.SigningKey(seed), agent_id, **kw)

    @classmethod
    def from_private_key(cls, b64u_seed: str, agent_id: str, **kw: Any) -> Identity:
        """An identity from the base64url (no padding) of a 32-byte seed."""
        try:
            seed = encoding.b64u_decode(b64u_seed.strip(), error=KeyFileError)
        except AttributeError:
            raise KeyFileError("private key must be a base64url string") from None
        return cls.from_seed(seed, agent_id, **kw)

    @classmethod
    def from_env(cls, var: str = "A2A_PRIVATE_KEY", *, agent_id: str) -> Identity:
        """An identity from the environment variable ``var`` (base64url seed)."""
        value = os.environ.get(var)
        if not value:
            raise KeyFileError(f"environment variable {var} is not set")
        return cls.from_private_key(value, agent_id)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, check_permissions: bool = True) -> Identity:
        """Load a key file written by :meth:`save`.

        A file that group or others can read is refused (a key that others could read must
        be treated as stolen).
        """
        p = Path(path)
        try:
            st = p.stat()
        except OSError:
            raise KeyFileError(f"key file not found: {p}") from None
        if st.st_size > 64 * 1024:
            raise KeyFileError(
                f"{p} is not an a2a-secure key file (too large); make one with: a2a-secure keygen"
            )
        # The file is read as a key file before its mode is judged: a file that is no key at
        # all (a note passed by mistake) is named as such, not told to be chmod-ed.
        try:
            data = encoding.loads(p.read_bytes(), error=KeyFileError)
        except OSError:
            raise KeyFileError(f"key file cannot be read: {p}") from None
        except KeyFileError:
            data = None
        if not isinstance(data, dict) or data.get("version") != KEY_FILE_VERSION:
            raise KeyFileError(
                f"{p} is not an a2a-secure key file; make one with: a2a-secure keygen --out FILE"
            )
        if check_permissions and os.name == "posix" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(
                f"key file {p} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):o});"
                f" run: chmod 600 {p}"
            )
        seed = data.get("private_key")
        agent_id = data.get("agent_id")
        if not isinstance(seed, str) or not isinstance(agent_id, str):
            raise KeyFileError(f"key file {p} lacks private_key or agent_id")
        did = data.get("did")
        kid = data.get("kid")
        ident = cls.from_private_key(seed, agent_id)
        if isinstance(did, str) and did.startswith("did:web:"):
            if not isinstance(kid, str):
                raise KeyFileError(f"did:web key file {p} lacks kid")
            ident = cls.from_private_key(seed, agent_id, did=did, kid=kid)
        elif did is not None and did != ident.did:
            raise KeyFileError(f"key file {p}: its DID does not match its private key")
        return ident

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the key file, created with mode 0600; refuses to replace a file unless told."""
        p = Path(path)
        body = encoding.dumps(
            {
                "version": KEY_FILE_VERSION,
                "agent_id": self.agent_id,
                "did": self._did,
                "kid": self._kid,
                "private_key": encoding.b64u_encode(self._holder.export_seed()),
            }
        )
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        flags |= getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(p, flags, 0o600)
        except FileExistsError:
            raise KeyFileError(f"{p} exists; pass overwrite=True to replace it") from None
        except OSError as exc:  # missing directory, a symlink (O_NOFOLLOW), no permission
            raise KeyFileError(f"key file cannot be written: {p} ({exc.strerror})") from None
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, body + b"\n")
        finally:
            os.close(fd)

    def with_did_web(self, did: str, kid: str) -> Identity:
        """The same key presented under a did:web DID whose document lists it as ``kid``."""
        return Identity(self._holder, self.agent_id, did=did, kid=kid)

    # -- public view ---------------------------------------------------------------------
    @property
    def did(self) -> str:
        """The agent's DID."""
        return self._did

    @property
    def kid(self) -> str:
        """The key id (a DID URL) of the signing key."""
        return self._kid

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self._public

    def public_key_entry(self) -> dict[str, str]:
        """The public key entry of PROTOCOL.md §2 for this identity."""
        return public_key_entry(self._kid, self._public)

    @property
    def holder(self) -> KeyHolder:
        """What holds the private key (a :class:`SeedKey`, a token key, ...)."""
        return self._holder

    def private_key_b64u(self) -> str:
        """The base64url seed, for export (``A2A_PRIVATE_KEY``). Handle with care.

        Raises :class:`KeyFileError` for a key that cannot leave its token.
        """
        return encoding.b64u_encode(self._holder.export_seed())

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``, made by the key's holder.

        With a remote holder this waits for the service: the runtime serving requests awaits
        :meth:`sign_async` instead; this is for the command line, start-up and the like.
        """
        return self._sign(data)

    async def sign_async(self, data: bytes) -> bytes:
        """:meth:`sign`, awaited: a remote holder's signature, checked against the public key
        (an answer that does not verify raises :class:`SignerFailed`); a local key signs in place."""
        if not self.remote:
            return self._sign(data)
        try:
            signature = await self._holder.sign_async(data)  # type: ignore[attr-defined]
        except SignerFailed:
            raise
        except Exception as exc:
            raise SignerFailed(self._failed(exc)) from None
        return self._checked(data, signature)

    def _sign_checked(self, data: bytes) -> bytes:
        try:
            signature = self._holder.sign(data)
        except A2AError:
            raise
        except Exception as exc:
            raise SignerFailed(self._failed(exc)) from None
        return self._checked(data, signature)

    def _failed(self, exc: Exception) -> str:
        return f"the key holder {type(self._holder).__name__} did not sign ({type(exc).__name__})"

    def _checked(self, data: bytes, signature: object) -> bytes:
        if type(signature) is not bytes or len(signature) != SIGNATURE_LEN:
            raise SignerFailed(f"the key holder {type(self._holder).__name__} returned no Ed25519 signature")
        if not verify_signature(self._public, bytes(data), signature):
            raise SignerFailed(
                f"the signature from {type(self._holder).__name__} does not verify with {self._kid}"
            )
        return signature

    def derive_key(self, info: bytes) -> bytes:
        """32 secret bytes bound to this identity's key and ``info`` (see :class:`KeyHolder`)."""
        return self._holder.derive_key(info)

    def delegate(
        self,
        to: str,
        goals: list[str] | tuple[str, ...],
        *,
        ttl: int,
        targets: list[str] | tuple[str, ...] | None = None,
        max_priority: int = 5,
        now: float | None = None,
    ) -> Any:
        """A delegation chain (PROTOCOL.md §12.7): this DID, the principal, grants the DID
        ``to`` the ``goals`` for ``ttl`` seconds, at the ``targets`` (agent DIDs) if given.

        Returns an ``a2a_secure.delegation.Chain`` of one link.
        """

        from a2a_secure.delegation import issue  # noqa: PLC0415 - the value layer above

        at = wall_now() if now is None else now
        return issue(self, to=to, goals=goals, ttl=ttl, now=at, targets=targets, max_priority=max_priority)

    def __repr__(self) -> str:
        return f"Identity(agent_id={self.agent_id!r}, did={self._did!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("Identity objects are not picklable (they hold a private key)")
