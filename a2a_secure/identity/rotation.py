"""Key rotation: a key ring with an overlap window, and did:key rotation statements.

**The key ring.** ``a2a-secure key rotate`` replaces the key of a key file by a new one and
keeps the old one, with the time it was retired and the end of its overlap window, in the
file's optional ``retired`` member (a reader that predates rotation ignores it and loads the
new key). During the window the agent still holds the old key:

* for did:web the DID stays, the new key gets a new key id, and the DID document lists both
  verification methods, the retired one with ``"expires": "<RFC 3339>"`` (the end of its
  window); a peer accepts the old key id until then and refuses it afterwards (-32040);
* sessions opened with the old key keep their answers signed by it while the window lasts,
  and end (-32043) once the old key is gone.

**did:key rotation.** A did:key DID *is* its key, so a new key is a new DID. The old key
signs a rotation statement, a compact JWS with ``typ`` ``a2a-rotation+jws`` over::

    {"did": old DID, "successor": new DID, "successor_kid": new key id,
     "issued_at": Unix seconds, "overlap_until": Unix seconds}

A peer that pinned the old DID verifies the statement with the OLD DID's key and follows it
once (:class:`RotationFollower`): it is refused, changing nothing, if its ``typ`` or
signature is wrong, its members are not exactly these, the successor is not a usable
did:key, it was issued in the future or its overlap window has ended, the old DID was
followed already (a replay), or following it would come back to a DID seen before (a loop).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from a2a_secure.errors import AuthenticationFailed, DIDResolutionError, InvalidParams, StaleTimestamp
from a2a_secure.identity import encoding
from a2a_secure.identity.did import (
    check_did_syntax,
    did_key_from_public_key,
    did_web_document,
    key_id_for_did_key,
    public_key_from_did_key,
    split_key_id,
)
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign, jws_verify
from a2a_secure.identity.keys import KEY_FILE_VERSION, Identity, KeyFileError
from a2a_secure.identity.rfc3339 import format_rfc3339
from a2a_secure.system import wall_now

__all__ = [
    "DEFAULT_OVERLAP",
    "MAX_OVERLAP",
    "ROTATION_TYP",
    "WELL_KNOWN_ROTATION",
    "KeyRing",
    "RetiredKey",
    "RotationFollower",
    "RotationStatement",
    "parse_duration",
    "sign_rotation_statement",
    "verify_rotation_statement",
]

ROTATION_TYP: Final = "a2a-rotation+jws"
WELL_KNOWN_ROTATION: Final = "/.well-known/a2a-rotation.json"
DEFAULT_OVERLAP: Final = 24 * 3600
MAX_OVERLAP: Final = 90 * 24 * 3600
# A statement "issued" further ahead than the protocol's clock skew is refused.
MAX_SKEW: Final = 300
# A key file keeps at most this many statements (the chain a pinned peer may have to follow).
MAX_STATEMENTS: Final = 16
_STATEMENT_MEMBERS: Final = frozenset(("did", "successor", "successor_kid", "issued_at", "overlap_until"))
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds of ``"90s"``, ``"30m"``, ``"24h"``, ``"7d"`` or a plain number of seconds."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], None)
    digits = value[:-1] if unit is not None else value
    if not digits.isdigit() or len(digits) > 9:
        raise ValueError(f"not a duration: {text!r} (use e.g. 3600, 30m, 24h, 7d)")
    seconds = int(digits) * (unit or 1)
    if not 0 <= seconds <= MAX_OVERLAP:
        raise ValueError(f"the overlap must be at most {MAX_OVERLAP // 86400} days")
    return seconds


# -- the key ring ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetiredKey:
    """A key that was replaced: it still signs for its sessions until ``overlap_until``."""

    identity: Identity
    retired_at: int
    overlap_until: int

    def active(self, now: float) -> bool:
        """True while the overlap window lasts."""
        return now < self.overlap_until


@dataclass(frozen=True, slots=True)
class KeyRing:
    """An agent's current key, its retired keys and its did:key rotation statements."""

    current: Identity
    retired: tuple[RetiredKey, ...] = ()
    statements: tuple[str, ...] = field(default=())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Read a key file (one without ``retired`` is a ring of one key)."""
        current = Identity.load(path)
        data = encoding.loads(Path(path).read_bytes(), error=KeyFileError)
        retired: list[RetiredKey] = []
        items = data.get("retired", [])
        if not isinstance(items, list):
            raise KeyFileError("key file member retired must be an array")
        for item in items:
            if not isinstance(item, dict):
                raise KeyFileError("a retired key is an object")
            seed, did, kid = item.get("private_key"), item.get("did"), item.get("kid")
            at, until = item.get("retired_at"), item.get("overlap_until")
            if not (isinstance(seed, str) and isinstance(did, str) and isinstance(kid, str)):
                raise KeyFileError("a retired key needs private_key, did and kid")
            if type(at) is not int or type(until) is not int:
                raise KeyFileError("a retired key needs integer retired_at and overlap_until")
            old = Identity.from_private_key(seed, current.agent_id)
            if did.startswith("did:key:"):
                if did != old.did:
                    raise KeyFileError("retired key DID does not match its private key")
            else:
                old = old.with_did_web(did, kid)
            retired.append(RetiredKey(old, at, until))
        statements = data.get("rotations", [])
        if not isinstance(statements, list) or not all(isinstance(t, str) for t in statements):
            raise KeyFileError("key file member rotations must be an array of strings")
        return cls(current, tuple(retired), tuple(statements))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ring atomically (a new 0600 file renamed over the old one)."""
        p = Path(path)
        body: dict[str, Any] = {
            "version": KEY_FILE_VERSION,
            "agent_id": self.current.agent_id,
            "did": self.current.did,
            "kid": self.current.kid,
            "private_key": self.current.private_key_b64u(),
        }
        if self.retired:
            body["retired"] = [
                {
                    "did": r.identity.did,
                    "kid": r.identity.kid,
                    "private_key": r.identity.private_key_b64u(),
                    "retired_at": r.retired_at,
                    "overlap_until": r.overlap_until,
                }
                for r in self.retired
            ]
        if self.statements:
            body["rotations"] = list(self.statements)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(tmp, flags, 0o600)
        except OSError as exc:
            raise KeyFileError(f"key file cannot be written: {p} ({exc.strerror})") from None
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, encoding.dumps(body) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, p)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise KeyFileError(f"key file cannot be replaced: {p} ({exc.strerror})") from None

    def rotate(
        self, *, overlap: int = DEFAULT_OVERLAP, now: float | None = None, fresh: Identity | None = None
    ) -> KeyRing:
        """A ring with a new current key; the current one retired for ``overlap`` seconds.

        Retired keys whose window has ended are dropped (their private keys are forgotten).
        For did:key the old key signs a rotation statement naming the new DID. ``fresh``: the
        new key when it was made elsewhere (inside a token); else one is generated here.
        """
        if not 0 <= overlap <= MAX_OVERLAP:
            raise ValueError(f"the overlap must be 0 to {MAX_OVERLAP} seconds")
        t = int(wall_now() if now is None else now)
        old = self.current
        fresh = Identity.generate(old.agent_id) if fresh is None else fresh
        if not old.did.startswith("did:key:"):
            taken = {old.kid, *(r.identity.kid for r in self.retired)}
            fresh = fresh.with_did_web(old.did, _next_kid(old.did, taken))
        kept = tuple(r for r in self.retired if r.active(t))
        statements = self.statements
        if old.did.startswith("did:key:"):
            statement = sign_rotation_statement(old, fresh, issued_at=t, overlap_until=t + overlap)
            statements = (*statements, statement)[-MAX_STATEMENTS:]
        return KeyRing(fresh, (*kept, RetiredKey(old, t, t + overlap)), statements)

    def signer(self, kid: str, now: float) -> Identity | None:
        """The identity that signs as ``kid`` now: the current key or a retired key in its window."""
        if kid == self.current.kid:
            return self.current
        for r in self.retired:
            if r.identity.kid == kid and r.active(now):
                return r.identity
        return None

    def did_document(self, *, endpoint: str | None = None, now: float | None = None) -> dict[str, Any]:
        """The did:web document listing the current key and the retired keys still in their window.

        A retired key's verification method carries ``expires`` (RFC 3339): the end of its
        overlap window, after which peers refuse it.
        """
        t = wall_now() if now is None else now
        did = self.current.did
        fragment = self.current.kid.split("#", 1)[1]
        doc = did_web_document(did, self.current.public_key, fragment=fragment, endpoint=endpoint)
        for r in self.retired:
            if not r.active(t) or r.identity.did != did:
                continue
            kid = r.identity.kid
            multibase = did_key_from_public_key(r.identity.public_key)[len("did:key:") :]
            doc["verificationMethod"].append(
                {
                    "id": kid,
                    "type": "Multikey",
                    "controller": did,
                    "publicKeyMultibase": multibase,
                    "expires": format_rfc3339(r.overlap_until),
                }
            )
            doc["authentication"].append(kid)
            doc["assertionMethod"].append(kid)
        return doc


def _next_kid(did: str, taken: set[str]) -> str:
    n = 1
    while f"{did}#key-{n}" in taken:
        n += 1
    return f"{did}#key-{n}"


# -- rotation statements ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RotationStatement:
    """A verified did:key rotation statement."""

    did: str
    successor: str
    successor_kid: str
    issued_at: int
    overlap_until: int
    token: str = field(repr=False, compare=False)


def sign_rotation_statement(old: Identity, new: Identity, *, issued_at: int, overlap_until: int) -> str:
    """The statement, signed by ``old``, that ``new`` succeeds it."""
    payload = {
        "did": old.did,
        "successor": new.did,
        "successor_kid": new.kid,
        "issued_at": issued_at,
        "overlap_until": overlap_until,
    }
    return jws_sign(payload, old, ROTATION_TYP)


def verify_rotation_statement(token: object, *, now: float) -> RotationStatement:
    """Check a rotation statement against the key of the DID it rotates away from.

    Raises:
        InvalidParams: Not a compact JWS of JSON objects, members not exactly those of a
            statement, or a ``did``/``successor`` that is not a usable did:key.
        AuthenticationFailed: Wrong ``typ``, header, key id or signature (not signed by the
            old DID's key).
        StaleTimestamp: Issued in the future or its overlap window has ended.
    """
    decoded = jws_decode_unverified(token)
    payload = decoded[1]
    if payload.keys() != _STATEMENT_MEMBERS:
        raise InvalidParams(
            "a rotation statement has exactly did, successor, successor_kid, issued_at, overlap_until"
        )
    did, successor, successor_kid = payload["did"], payload["successor"], payload["successor_kid"]
    issued, until = payload["issued_at"], payload["overlap_until"]
    if not all(isinstance(v, str) for v in (did, successor, successor_kid)):
        raise InvalidParams("rotation statement DIDs must be strings")
    if type(issued) is not int or type(until) is not int:
        raise InvalidParams("rotation statement times must be integers")
    check_did_syntax(did)
    if not did.startswith("did:key:"):
        raise InvalidParams("rotation statements are for did:key DIDs")
    key = _did_key_or_invalid(did, "did")
    # The signature is checked before anything the statement claims is believed.
    jws_verify(str(token), key, typ=ROTATION_TYP, kid=key_id_for_did_key(did), decoded=decoded)
    _did_key_or_invalid(successor, "successor")
    if successor_kid != key_id_for_did_key(successor):
        split_key_id(successor_kid)
        raise InvalidParams("rotation statement successor_kid is not the successor's key id")
    if successor == did:
        raise InvalidParams("a rotation statement names another DID as successor")
    if not issued <= until <= issued + MAX_OVERLAP:
        raise InvalidParams("rotation statement overlap_until is not within 90 days after issued_at")
    if issued > now + MAX_SKEW:
        raise StaleTimestamp("rotation statement is issued in the future")
    if now >= until:
        raise StaleTimestamp(f"rotation statement expired at {until}: pin the successor by hand")
    return RotationStatement(did, successor, successor_kid, issued, until, str(token))


def _did_key_or_invalid(did: str, what: str) -> bytes:
    try:
        return public_key_from_did_key(did)
    except (InvalidParams, DIDResolutionError) as exc:
        raise InvalidParams(f"rotation statement {what} is malformed: {exc.message}") from None


FollowAudit = Callable[[RotationStatement], None]


class RotationFollower:
    """Follows did:key rotation statements for DIDs pinned by a registry or an agent, once each.

    ``history`` (old DID → successor) is what was followed so far; a statement for a DID in
    it is a replay, and a statement whose successor is any DID seen in it would loop.
    """

    def __init__(self, *, audit: FollowAudit | None = None, clock: Callable[[], float] = wall_now) -> None:
        self.history: dict[str, str] = {}
        self._audit = audit
        self.clock = clock

    def plan(
        self, pinned: str, tokens: Sequence[object] | object, *, now: float | None = None
    ) -> list[RotationStatement]:
        """The statements that take ``pinned`` to its newest successor, all checked; no change.

        ``tokens`` is one statement or a chain in any order (as served at
        ``/.well-known/a2a-rotation.json``). Raises on the first statement that does not
        check out, or when none applies to ``pinned``.
        """
        now = self.clock() if now is None else now
        items = list(tokens) if isinstance(tokens, list | tuple) else [tokens]
        verified = [verify_rotation_statement(t, now=now) for t in items]
        by_did: dict[str, RotationStatement] = {}
        for st in verified:
            if st.did in by_did and by_did[st.did].successor != st.successor:
                raise AuthenticationFailed(f"two rotation statements for {st.did[:80]} disagree")
            by_did[st.did] = st
        if pinned in self.history:
            raise AuthenticationFailed(f"the rotation of {pinned[:80]} was already followed (replay)")
        if pinned not in by_did:
            raise AuthenticationFailed(f"no rotation statement is signed by the pinned DID {pinned[:80]}")
        seen = {pinned, *self.history, *self.history.values()}
        chain: list[RotationStatement] = []
        cur = pinned
        while cur in by_did:
            st = by_did[cur]
            if st.successor in seen:
                raise AuthenticationFailed(f"the rotation chain of {pinned[:80]} loops")
            seen.add(st.successor)
            chain.append(st)
            cur = st.successor
        return chain

    def commit(self, chain: Iterable[RotationStatement]) -> str:
        """Record a planned chain (audited statement by statement); the newest DID."""
        last = ""
        for st in chain:
            self.history[st.did] = st.successor
            if self._audit is not None:
                self._audit(st)
            last = st.successor
        return last

    def follow(self, pinned: str, tokens: Sequence[object] | object) -> str:
        """Check and follow the statements for ``pinned``; the DID to pin from now on."""
        return self.commit(self.plan(pinned, tokens))
