"""Agent keys that never leave a PKCS#11 token (an HSM, a smart card, SoftHSM2).

The token signs (``CKM_EDDSA``) and derives (``CKM_SHA256_HMAC`` with a secret key kept
next to the signing key, see :class:`TokenKey`); this process holds handles, never key
bytes. Keys are generated inside the token (``CKM_EC_EDWARDS_KEY_PAIR_GEN``), sensitive and
not extractable.

Sessions: PKCS#11 logs in an application, not a session, and a second ``C_Login`` fails with
``CKR_USER_ALREADY_LOGGED_IN``. So each process opens one logged-in session per token and
shares it with everything that signs (the identity, its key ring, the audit checkpoints);
operations on it are serialised by a lock (a PKCS#11 session runs one operation at a time).
A process made by ``fork`` (a server worker) opens its own: the registry is keyed by pid.

The curve is checked from the public key's ``CKA_EC_PARAMS``, which names Ed25519 either by
its OID (1.3.101.112) or, as opensc's ``pkcs11-tool`` writes it, by the printable string
``edwards25519``. A key of another curve is refused.

python-pkcs11 is the binding: it is typed, maintained, ships wheels, exposes the Edwards
mechanisms, and releases the GIL while the token works.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from a2a_secure.identity.ed25519 import verify_signature
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.pkcs11_uri import Pkcs11Uri, TokenError

if TYPE_CHECKING:
    pass

__all__ = [
    "DERIVE_SUFFIX",
    "TokenKey",
    "TokenSession",
    "generate_token_identity",
    "load_token_identity",
    "token_session",
]

# The DER of Ed25519's EC_PARAMS, both forms (RFC 8410 OID; PKCS#11 3.0 printable string).
_ED25519_OID: Final = bytes.fromhex("06032b6570")
_ED25519_NAME: Final = b"\x13\x0cedwards25519"
DERIVE_SUFFIX: Final = "#derive"
"""The label of the secret key that derives for a signing key: the signing key's label + this."""
_PROBE: Final = b"a2a-secure/pkcs11 key check"


def _pkcs11() -> Any:
    try:
        import pkcs11  # noqa: PLC0415 - the optional extra, imported when a token is used
    except ImportError:
        raise TokenError("PKCS#11 support is not installed: pip install 'a2a-secure[pkcs11]'") from None
    return pkcs11


def _raw_public_key(ec_point: bytes) -> bytes:
    """The 32 key bytes of ``CKA_EC_POINT``: a DER OCTET STRING (04 20 …) or the raw bytes."""
    if len(ec_point) == 34 and ec_point[:2] == b"\x04\x20":
        return ec_point[2:]
    if len(ec_point) == 32:
        return ec_point
    raise TokenError("the token's public key is not a 32-byte Ed25519 point")


class TokenSession:
    """One logged-in session with one token, shared by this process (see the module's text)."""

    def __init__(self, uri: Pkcs11Uri, session: Any, token_label: str, pin: str | None) -> None:
        self.uri = uri
        self.token_label = token_label
        self._session = session
        self._lock = threading.Lock()
        self._pin_digest = _pin_digest(pin)

    def check_pin(self, pin: str | None) -> None:
        """Refuse a caller whose PIN is not the one this process logged in with.

        The session is shared, so without this a second URI with a wrong PIN would use the
        login of the first. PINs are compared as digests, in constant time.
        """
        if not hmac.compare_digest(self._pin_digest, _pin_digest(pin)):
            raise TokenError(f"wrong PIN for PKCS#11 token {self.token_label!r}")

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        """The session, alone: PKCS#11 runs one operation at a time on a session."""
        with self._lock:
            yield self._session

    def close(self) -> None:
        with self._lock, contextlib.suppress(Exception):
            self._session.close()


def _pin_digest(pin: str | None) -> bytes:
    return hashlib.sha256(b"\x00" if pin is None else b"\x01" + pin.encode()).digest()


_sessions: dict[tuple[int, str, str], TokenSession] = {}
_sessions_lock = threading.Lock()


def _find_token(lib: Any, uri: Pkcs11Uri, p11: Any) -> Any:
    selector: dict[str, Any] = {}
    if uri.token_label is not None:
        selector["token_label"] = uri.token_label
    if "serial" in uri.path:
        selector["token_serial"] = uri.path["serial"].encode()
    if "manufacturer" in uri.path:
        selector["manufacturer_id"] = uri.path["manufacturer"]
    try:
        return lib.get_token(**selector)
    except p11.exceptions.NoSuchToken:
        raise TokenError(f"no PKCS#11 token {uri.token_label or '?'!r} in {uri.module_path()}") from None
    except p11.exceptions.MultipleTokensReturned:
        raise TokenError("the PKCS#11 URI matches several tokens: add token=… or serial=…") from None


def token_session(uri: Pkcs11Uri) -> TokenSession:
    """This process's logged-in session with the token ``uri`` names (opened once)."""
    p11 = _pkcs11()
    module = uri.module_path()
    key = (os.getpid(), module, uri.token_label or uri.path.get("serial", ""))
    with _sessions_lock:
        found = _sessions.get(key)
        if found is not None:
            found.check_pin(uri.pin())
            return found
        try:
            lib = p11.lib(module)
        except Exception as exc:  # a file that is not a PKCS#11 module, a broken one
            raise TokenError(f"PKCS#11 module {module} cannot be loaded ({type(exc).__name__})") from None
        token = _find_token(lib, uri, p11)
        label = str(token.label)
        pin = uri.pin()
        errors = p11.exceptions
        try:
            session = token.open(user_pin=pin, rw=True)
        except (errors.PinIncorrect, errors.PinInvalid, errors.PinLenRange):
            raise TokenError(f"wrong PIN for PKCS#11 token {label!r}") from None
        except errors.PinLocked:
            raise TokenError(f"the PIN of PKCS#11 token {label!r} is locked") from None
        except errors.UserPinNotInitialized:
            raise TokenError(f"PKCS#11 token {label!r} has no user PIN set") from None
        except errors.UserAlreadyLoggedIn:
            raise TokenError(
                f"PKCS#11 token {label!r} is already logged in by this process outside a2a-secure"
            ) from None
        except errors.PKCS11Error as exc:
            raise TokenError(f"PKCS#11 token {label!r} cannot be opened ({type(exc).__name__})") from None
        opened = TokenSession(uri, session, label, pin)
        _sessions[key] = opened
        return opened


def _forget_sessions() -> None:
    """Close every session of this process (tests; a process that rotates keys on exit)."""
    with _sessions_lock:
        for s in _sessions.values():
            s.close()
        _sessions.clear()


@dataclass(frozen=True, slots=True)
class _Handles:
    private: Any
    secret: Any | None
    public_key: bytes


def _find_key(session: Any, uri: Pkcs11Uri, label: str | None, key_id: bytes | None) -> _Handles:
    p11 = _pkcs11()
    attrs = p11.Attribute
    what = uri.describe()
    match: dict[Any, Any] = {attrs.CLASS: p11.ObjectClass.PRIVATE_KEY}
    pub_match: dict[Any, Any] = {attrs.CLASS: p11.ObjectClass.PUBLIC_KEY}
    if label is not None:
        match[attrs.LABEL] = label
        pub_match[attrs.LABEL] = label
    if key_id is not None:
        match[attrs.ID] = key_id
        pub_match[attrs.ID] = key_id
    privates = list(session.get_objects(match))
    if not privates:
        raise TokenError(f"no private key in {what}")
    if len(privates) > 1:
        raise TokenError(f"several private keys match {what}: add id=… to the URI")
    private = privates[0]
    if private[attrs.KEY_TYPE] != p11.KeyType.EC_EDWARDS:
        raise TokenError(f"the key in {what} is not an Edwards-curve key")
    publics = list(session.get_objects(pub_match))
    if len(publics) != 1:
        raise TokenError(f"the public key of {what} is missing from the token (or found twice)")
    params = bytes(publics[0][attrs.EC_PARAMS])
    if params not in (_ED25519_OID, _ED25519_NAME):
        raise TokenError(f"the key in {what} is not Ed25519 (EC_PARAMS {params.hex()})")
    public_key = _raw_public_key(bytes(publics[0][attrs.EC_POINT]))
    secret_label = (label or "") + DERIVE_SUFFIX
    secrets = list(session.get_objects({attrs.CLASS: p11.ObjectClass.SECRET_KEY, attrs.LABEL: secret_label}))
    return _Handles(private, secrets[0] if len(secrets) == 1 else None, public_key)


class TokenKey:
    """An Ed25519 key held by a token: a :class:`~a2a_secure.identity.keys.KeyHolder`.

    ``derive_key`` is HMAC-SHA256, computed inside the token, under the secret key labelled
    with the signing key's label and :data:`DERIVE_SUFFIX` (made with the key pair by
    :func:`generate_token_identity`). A token key without one signs but cannot derive: what
    needs a derived key (an action kept sealed at rest, the answer key of a sealed
    intent_id) then fails closed, naming the missing key.
    """

    __slots__ = ("_handles", "_session", "label")

    def __init__(self, session: TokenSession, handles: _Handles, label: str) -> None:
        self._session = session
        self._handles = handles
        self.label = label

    @property
    def public_key(self) -> bytes:
        return self._handles.public_key

    def sign(self, message: bytes) -> bytes:
        p11 = _pkcs11()
        with self._session.use():
            try:
                signature = self._handles.private.sign(bytes(message), mechanism=p11.Mechanism.EDDSA)
            except p11.exceptions.PKCS11Error as exc:
                raise TokenError(
                    f"PKCS#11 token {self._session.token_label!r} did not sign ({type(exc).__name__})"
                ) from None
        return bytes(signature)

    def derive_key(self, info: bytes) -> bytes:
        p11 = _pkcs11()
        secret = self._handles.secret
        if secret is None:
            raise TokenError(
                f"PKCS#11 token {self._session.token_label!r} holds no derivation key"
                f" {self.label + DERIVE_SUFFIX!r} for this agent key"
            )
        with self._session.use():
            try:
                mac = secret.sign(bytes(info), mechanism=p11.Mechanism.SHA256_HMAC)
            except p11.exceptions.PKCS11Error as exc:
                raise TokenError(
                    f"PKCS#11 token {self._session.token_label!r} did not derive ({type(exc).__name__})"
                ) from None
        return bytes(mac)

    def export_seed(self) -> bytes:
        raise TokenError(
            f"the key {self.label!r} is held by PKCS#11 token {self._session.token_label!r}"
            " and never leaves it"
        )

    def __repr__(self) -> str:
        return f"TokenKey(token={self._session.token_label!r}, label={self.label!r})"


def _checked(holder: TokenKey, what: str) -> TokenKey:
    """The holder after one signature verified with its public key: the pair belongs together."""
    if not verify_signature(holder.public_key, _PROBE, holder.sign(_PROBE)):
        raise TokenError(f"the private and public keys of {what} do not match")
    return holder


def token_key(uri: Pkcs11Uri, label: str | None = None, key_id: bytes | None = None) -> TokenKey:
    """The key ``uri`` names (or the one labelled ``label`` in the same token), checked."""
    session = token_session(uri)
    name = label if label is not None else uri.object_label
    ident = key_id if label is not None else uri.key_id
    with session.use() as s:
        handles = _find_key(s, uri, name, ident)
    return _checked(TokenKey(session, handles, name or ""), uri.describe())


def load_token_identity(uri: str | Pkcs11Uri, agent_id: str | None = None) -> Identity:
    """The did:key identity of the key a ``pkcs11:`` URI names (its agent id: the label)."""
    parsed = uri if isinstance(uri, Pkcs11Uri) else Pkcs11Uri.parse(uri)
    holder = token_key(parsed)
    return Identity(holder, agent_id or (parsed.object_label or "agent")[:128])


def generate_in_token(session: TokenSession, label: str, key_id: bytes) -> None:
    """A new Ed25519 key pair and its derivation key, made in the token, never extractable."""
    p11 = _pkcs11()
    attrs = p11.Attribute
    with session.use() as s:
        try:
            s.generate_keypair(
                p11.KeyType.EC_EDWARDS,
                mechanism=p11.Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
                store=True,
                public_template={
                    attrs.EC_PARAMS: _ED25519_OID,
                    attrs.LABEL: label,
                    attrs.ID: key_id,
                    attrs.VERIFY: True,
                },
                private_template={
                    attrs.LABEL: label,
                    attrs.ID: key_id,
                    attrs.SIGN: True,
                    attrs.SENSITIVE: True,
                    attrs.EXTRACTABLE: False,
                    attrs.PRIVATE: True,
                },
            )
            s.generate_key(
                p11.KeyType.GENERIC_SECRET,
                256,
                label=label + DERIVE_SUFFIX,
                id=key_id,
                store=True,
                template={
                    attrs.SIGN: True,
                    attrs.VERIFY: False,
                    attrs.ENCRYPT: False,
                    attrs.DECRYPT: False,
                    attrs.SENSITIVE: True,
                    attrs.EXTRACTABLE: False,
                    attrs.PRIVATE: True,
                },
            )
        except p11.exceptions.PKCS11Error as exc:
            raise TokenError(
                f"PKCS#11 token {session.token_label!r} cannot generate an Ed25519 key ({type(exc).__name__})"
            ) from None


def generate_token_identity(uri: str | Pkcs11Uri) -> Identity:
    """Generate the key a ``pkcs11:`` URI names inside its token; refuses to shadow one."""
    parsed = uri if isinstance(uri, Pkcs11Uri) else Pkcs11Uri.parse(uri)
    label = parsed.object_label
    if label is None:
        raise TokenError("to generate a key in a token, the URI needs object=… (its label)")
    session = token_session(parsed)
    p11 = _pkcs11()
    with session.use() as s:
        existing = list(s.get_objects({p11.Attribute.LABEL: label}))
        if existing:
            raise TokenError(
                f"{parsed.describe()} exists already: choose another object= label (a token key is"
                " never replaced, delete it with the token's own tools)"
            )
    generate_in_token(session, label, parsed.key_id or os.urandom(16))
    return load_token_identity(parsed)
