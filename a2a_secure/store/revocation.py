"""Revoked DIDs and key ids: a deny list shared by every worker of an agent.

A revocation names a DID (every key of it) or one key id (a DID URL ``did#fragment``). A
revoked DID or key cannot start a handshake (HELLO is -32040), and the sessions it has open
end at its next intent or stream event (-32043), on every worker.

Two kinds of :class:`Revocations`:

* :class:`StoreRevocations` keeps the list in the session store (``MemoryStore`` for one
  process, ``RedisStore`` for all workers). The store's ``begin_request`` checks it in the
  same atomic step (for Redis, the same script and round trip) as the sequence check, so a
  revocation is seen by the very next intent, on any worker, at the cost of one hash look-up
  in Redis when nothing is revoked.
* :class:`FileRevocations` reads a JSON file (``{"version": 1, "revoked": [...]}``) and
  re-reads it whenever its size, inode or modification time changes (one ``stat`` per check,
  so also seen by the next intent). Workers on one machine share it; it is written
  atomically (a new file renamed over the old one).

Targets are checked before anything is stored: a string that is neither a DID nor a key id
is ``InvalidParams`` (-32602).

Each list also has an *epoch* (:meth:`StoreRevocations.epoch`, :meth:`FileRevocations.epoch`):
a value that changes whenever the list changes (the store's counter, the file's stamp). A
reader that read the epoch, then found nothing, may take the same epoch later as "still
nothing" without looking again: the delegation guard re-checks a kept chain with one epoch
read per list instead of two look-ups per link.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from a2a_secure.delegation import REVOCATION_PREFIX, check_revocation_target
from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.did import (
    check_did_syntax,
    did_web_host_port,
    key_id_for_did_key,
    public_key_from_did_key,
    split_key_id,
)
from a2a_secure.system import wall_now

__all__ = [
    "DID_FIELD",
    "FileRevocations",
    "Revocation",
    "RevocationStore",
    "Revocations",
    "StoreRevocations",
    "check_target",
]

# The member of a DID's revocation entries that stands for the whole DID.
DID_FIELD = "*"
# ``delegation:<jti>`` (a2a_secure.delegation.REVOCATION_PREFIX) revokes one delegation
# token (PROTOCOL.md §12.7); it is kept as an entry of its own "DID", the whole target.
MAX_REASON = 200
_FILE_VERSION = 1
_MAX_FILE_BYTES = 4 * 1024 * 1024


def check_target(target: object) -> str:
    """Return ``target`` if it is a DID, a key id (``did#fragment``) or a delegation token id
    (``delegation:<jti>``, PROTOCOL.md §12.7), else ``InvalidParams``."""
    if not isinstance(target, str):
        raise InvalidParams("a revocation names a DID or a key id")
    if target.startswith(REVOCATION_PREFIX):
        return check_revocation_target(target)
    did = split_key_id(target)[0] if "#" in target else check_did_syntax(target)
    try:
        # A did:key that is no Ed25519 key, or a did:web no resolver may fetch, names nothing.
        if did.startswith("did:key:"):
            public_key_from_did_key(did)
        elif did.startswith("did:web:"):
            did_web_host_port(did)
    except DIDResolutionError as exc:
        raise InvalidParams(exc.message) from None
    if did.startswith("did:key:") and "#" in target and target != key_id_for_did_key(did):
        raise InvalidParams("a did:key has one key id: the DID, '#', and the DID's key again")
    return target


@dataclass(frozen=True, slots=True)
class Revocation:
    """One entry of the deny list: a DID or key id, why, and when (Unix seconds)."""

    target: str
    reason: str = ""
    revoked_at: int = 0

    @property
    def did(self) -> str:
        """The DID the target belongs to."""
        return self.target.split("#", 1)[0]

    @property
    def field(self) -> str:
        """:data:`DID_FIELD` for a whole DID, else the key id."""
        return self.target if "#" in self.target else DID_FIELD

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"target": self.target, "reason": self.reason, "revoked_at": self.revoked_at}

    @classmethod
    def from_dict(cls, obj: Any) -> Revocation:
        """Inverse of :meth:`to_dict` (``InvalidParams`` for a malformed entry)."""
        if not isinstance(obj, dict):
            raise InvalidParams("a revocation entry is an object")
        reason, at = obj.get("reason", ""), obj.get("revoked_at", 0)
        if not isinstance(reason, str) or type(at) is not int:
            raise InvalidParams("a revocation entry has a string reason and an integer revoked_at")
        return cls(check_target(obj.get("target")), reason[:MAX_REASON], at)


def _match(entries: dict[str, Revocation] | None, kids: Iterable[str]) -> Revocation | None:
    if not entries:
        return None
    hit = entries.get(DID_FIELD)
    if hit is not None:
        return hit
    for kid in kids:
        hit = entries.get(kid)
        if hit is not None:
            return hit
    return None


@runtime_checkable
class Revocations(Protocol):
    """A deny list of DIDs and key ids."""

    async def revoke(self, target: str, *, reason: str = "", now: float | None = None) -> bool:
        """Add ``target``; False when it was already revoked (nothing changes then)."""
        ...

    async def unrevoke(self, target: str) -> bool:
        """Remove ``target``; False when it was not revoked."""
        ...

    async def entries(self) -> list[Revocation]:
        """Every entry, sorted by target."""
        ...

    async def lookup(self, did: str, kids: Sequence[str] = ()) -> Revocation | None:
        """The entry that revokes ``did`` or one of ``kids``, or None."""
        ...


@runtime_checkable
class RevocationStore(Protocol):
    """What a session store implements to hold the deny list and check it in ``begin_request``.

    ``begin_request`` then answers ``BeginKind.REVOKED`` (and forgets the session) when the
    session's client DID or key id is revoked.
    """

    async def add_revocation(self, entry: Revocation) -> bool:
        """Store ``entry``; False if its target is already revoked."""
        ...

    async def remove_revocation(self, target: str) -> bool:
        """Forget ``target``; False if it was not revoked."""
        ...

    async def list_revocations(self) -> list[Revocation]:
        """Every entry."""
        ...

    async def find_revocation(self, did: str, kids: Sequence[str]) -> Revocation | None:
        """The entry revoking ``did`` or one of ``kids``, or None (one round trip)."""
        ...


def _entry(target: str, reason: str, now: float | None) -> Revocation:
    check_target(target)
    if not isinstance(reason, str):
        raise InvalidParams("the reason must be a string")
    return Revocation(target, reason[:MAX_REASON], int(wall_now() if now is None else now))


class StoreRevocations:
    """:class:`Revocations` kept in a session store (shared by all workers with Redis)."""

    def __init__(self, store: RevocationStore) -> None:
        if not isinstance(store, RevocationStore):
            raise TypeError("this store does not keep revocations")
        self.store = store

    async def revoke(self, target: str, *, reason: str = "", now: float | None = None) -> bool:
        """See :meth:`Revocations.revoke`."""
        return await self.store.add_revocation(_entry(target, reason, now))

    async def unrevoke(self, target: str) -> bool:
        """See :meth:`Revocations.unrevoke`."""
        return await self.store.remove_revocation(check_target(target))

    async def entries(self) -> list[Revocation]:
        """See :meth:`Revocations.entries`."""
        return sorted(await self.store.list_revocations(), key=lambda e: e.target)

    async def lookup(self, did: str, kids: Sequence[str] = ()) -> Revocation | None:
        """See :meth:`Revocations.lookup`."""
        return await self.store.find_revocation(did, list(kids))

    async def epoch(self) -> object | None:
        """The list's epoch (module documentation), or None for a store that keeps none."""
        read = getattr(self.store, "revocation_epoch", None)
        return None if read is None else await read()

    def epoch_now(self) -> object | None:
        """:meth:`epoch` without awaiting, for a store in this process (else None)."""
        read = getattr(self.store, "revocation_epoch_now", None)
        return None if read is None else read()


class FileRevocations:
    """:class:`Revocations` in a JSON file, re-read whenever it changes.

    A missing file is an empty list. A file that exists but cannot be parsed makes
    :meth:`lookup_now` raise ``RuntimeError``: a server then fails closed (-32603) rather
    than serve peers that may be revoked, until the file is fixed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._by_did: dict[str, dict[str, Revocation]] = {}

    # -- reading --------------------------------------------------------------------------
    def _read(self) -> dict[str, dict[str, Revocation]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        if len(raw) > _MAX_FILE_BYTES:
            raise RuntimeError(f"revocation file {self.path} is too large")
        try:
            data = encoding.loads(raw, error=InvalidParams)
            if not isinstance(data, dict) or data.get("version") != _FILE_VERSION:
                raise InvalidParams("not a revocation file")
            items = data.get("revoked")
            if not isinstance(items, list):
                raise InvalidParams("a revocation file has a 'revoked' array")
            out: dict[str, dict[str, Revocation]] = {}
            for item in items:
                entry = Revocation.from_dict(item)
                out.setdefault(entry.did, {})[entry.field] = entry
        except InvalidParams as exc:
            raise RuntimeError(f"revocation file {self.path}: {exc.message}") from None
        return out

    def _refresh(self) -> dict[str, dict[str, Revocation]]:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._by_did = self._read()
            self._stamp = stamp
        return self._by_did

    def lookup_now(self, did: str, kids: Iterable[str] = ()) -> Revocation | None:
        """:meth:`lookup` without awaiting: one ``stat``, a re-read only when the file changed.

        Raises ``RuntimeError`` when the file exists but cannot be used (fail closed).
        """
        return _match(self._refresh().get(did), kids)

    async def lookup(self, did: str, kids: Sequence[str] = ()) -> Revocation | None:
        """See :meth:`Revocations.lookup`."""
        return self.lookup_now(did, kids)

    def epoch_now(self) -> object:
        """The file's stamp (module documentation): one ``stat``, a re-read when it changed.

        Raises ``RuntimeError`` when the file exists but cannot be used (fail closed).
        """
        self._refresh()
        return ("file", self._stamp)

    async def epoch(self) -> object:
        """See :meth:`epoch_now`."""
        return self.epoch_now()

    async def entries(self) -> list[Revocation]:
        """See :meth:`Revocations.entries`."""
        return sorted((e for m in self._refresh().values() for e in m.values()), key=lambda e: e.target)

    # -- writing --------------------------------------------------------------------------
    def _write(self, by_did: dict[str, dict[str, Revocation]]) -> None:
        items = sorted((e for m in by_did.values() for e in m.values()), key=lambda e: e.target)
        body = encoding.dumps({"version": _FILE_VERSION, "revoked": [e.to_dict() for e in items]})
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, body + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock (``flock`` on a lock file beside the list) over read-change-write.

        Two ``a2a-secure revoke`` processes that each read the list, add their entry and
        replace the file would both say "revoked" while the second replacement drops the
        first entry. The lock file is separate because the list itself is replaced, not
        rewritten: a lock on the old inode would not exclude a writer of the new one.
        """
        import fcntl  # noqa: PLC0415 - POSIX; only writers need it

        lock = self.path.with_name(f".{self.path.name}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one small read and write
            yield
        finally:
            os.close(fd)  # releases the lock

    async def revoke(self, target: str, *, reason: str = "", now: float | None = None) -> bool:
        """See :meth:`Revocations.revoke`."""
        entry = _entry(target, reason, now)
        with self._locked():
            by_did = {did: dict(m) for did, m in self._read().items()}
            if entry.field in by_did.get(entry.did, {}):
                return False
            by_did.setdefault(entry.did, {})[entry.field] = entry
            self._write(by_did)
        return True

    async def unrevoke(self, target: str) -> bool:
        """See :meth:`Revocations.unrevoke`."""
        check_target(target)
        probe = Revocation(target)
        with self._locked():
            by_did = {did: dict(m) for did, m in self._read().items()}
            if by_did.get(probe.did, {}).pop(probe.field, None) is None:
                return False
            if not by_did[probe.did]:
                del by_did[probe.did]
            self._write(by_did)
        return True
