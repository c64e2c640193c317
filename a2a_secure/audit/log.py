"""The hash-chained, checkpointed JSON Lines audit log (PROTOCOL.md §8).

**The chained file.** Each line of a :class:`JsonlAuditLog` carries ``prev_hash`` =
``"sha256:" + hex(SHA-256(previous record line without its newline))``, the first one 64
zeros. Every ``checkpoint_every`` records (100) and at :meth:`~JsonlAuditLog.close`, when the
log has an :class:`~a2a_secure.identity.keys.Identity`, it writes a checkpoint record whose
``checkpoint`` member is a JWS (``typ`` ``a2a-audit+jws``) over
``{"line": n, "hash": h, "timestamp": t}``: ``n`` is the line number of the record it covers
(the line before the checkpoint) and ``h`` that line's hash (also the checkpoint's
``prev_hash``). Keep such a token elsewhere: cutting lines off the end of the file is only
evident against it (:func:`verify_chain` ``anchor=``).

**Torn lines.** A crash can leave the file ending in a partial line without its newline.
Data is never destroyed or rewritten; the rule is:

* a line is a *record* when it parses as a JSON object (I-JSON), else it is *torn*;
* a final line without newline that parses is a complete record that only lost its newline:
  the next writer adds the newline and chains to it;
* a final line without newline that does not parse is a torn fragment: the next writer first
  writes a newline (so the fragment stays in the file, on a line of its own, as evidence) and
  chains its record to the last record *before* the fragment.

:func:`verify_chain` therefore skips a torn line when the next record chains over it, and
reports it in :attr:`AuditVerifyResult.torn_lines` (``ok`` stays true: no complete record was
changed or removed, but a record was lost in a crash, and the CLI says so). A torn line that
the next record does *not* chain over (a record changed into garbage) is the first bad line.
``strict=True`` refuses torn lines altogether.

**Several processes.** Writers may share one file (several workers of one agent): each
append holds an exclusive ``fcntl.flock`` on the file, re-reads only what others appended
since its own last write (normally one line) to learn the chain head and the line count,
then appends the whole line with a single ``os.write`` on an ``O_APPEND`` descriptor. Lines
never interleave and the chain stays linear. A process that forks re-opens the file in the
child. The first write (or the constructor) reads the existing file once to count its lines.
This needs POSIX ``flock`` (Linux, macOS, BSD; on NFS only where the kernel maps ``flock``
to NFS locks); :class:`JsonlAuditLog` is not available on Windows, the other sinks are.
Rotate a log by starting a new file (each file is its own chain), not by renaming it under
running writers.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from a2a_secure.audit.records import (
    AUDIT_JWS_TYP,
    RECORD_MEMBERS,
    ZERO_HASH,
    AuditEvent,
    _json_text,
    _parse_object,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.system import wall_now

if sys.platform != "win32":
    import fcntl

__all__ = ["JsonlAuditLog"]

_errlog = logging.getLogger("a2a_secure.audit_errors")
_CHUNK = 1 << 16
# Structural marker of a checkpoint line as this module writes it (compact JSON, so inside a
# string value the quotes would be escaped and the marker cannot occur).
_CP_MARKER = b'"event":"checkpoint"'


if sys.platform != "win32":

    def _lock_file(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock_file(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

else:  # pragma: no cover

    def _lock_file(fd: int) -> None:
        raise NotImplementedError("JsonlAuditLog needs POSIX flock")

    def _unlock_file(fd: int) -> None:
        raise NotImplementedError("JsonlAuditLog needs POSIX flock")


class JsonlAuditLog:
    """The hash-chained, checkpointed JSON Lines audit log of PROTOCOL.md §8.

    ``identity`` signs the checkpoints (none are written without it). ``checkpoint_every``
    counts records in the whole file, whoever wrote them. ``fsync=True`` also forces each
    line to stable storage (slower; otherwise a line reaches the OS at once and survives a
    process crash, not a power loss). The file is created with ``mode`` (0600). See the
    module documentation for the torn-line rule and for several writers on one file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        identity: Identity | None = None,
        *,
        checkpoint_every: int = 100,
        clock: Callable[[], float] = wall_now,
        fsync: bool = False,
        mode: int = 0o600,
    ) -> None:
        if sys.platform == "win32":  # pragma: no cover
            raise NotImplementedError("JsonlAuditLog needs POSIX flock")
        if type(checkpoint_every) is not int or checkpoint_every < 1:
            raise ValueError("checkpoint_every must be a positive int")
        self.path = os.fspath(path)
        self._identity = identity
        self._every = checkpoint_every
        self._clock = clock
        self._fsync = fsync
        self._mode = mode
        self._lock = threading.Lock()
        self._closed = False
        self._fd = -1
        self._open()
        with self._locked():
            self._sync()

    # -- file state ---------------------------------------------------------------------
    def _open(self) -> None:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags, self._mode)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "audit log must be a regular file", self.path)
        self._fd = fd
        self._pid = os.getpid()
        self._reset_state()

    def _reset_state(self) -> None:
        self._offset = 0  # end of the last complete line seen
        self._lines = 0  # complete lines before _offset
        self._head = ZERO_HASH  # hash of the last record line
        self._head_line = 0
        self._head_is_cp = False
        self._since_cp = 0  # lines since the last checkpoint line

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            # A forked child shares the parent's open file description, and with it the
            # flock: re-open so that parent and child exclude each other again.
            self._lock = threading.Lock()
            self._open()

    def _locked(self) -> _FileLock:
        self._check_fork()
        return _FileLock(self)

    def _sync(self) -> bytes:
        """Catch up with lines appended since our last look; return the unterminated tail."""
        fd = self._fd
        size = os.fstat(fd).st_size
        if size < self._offset:
            _errlog.warning("audit log %s shrank; re-reading it", self.path)
            self._reset_state()
        start = self._offset
        pos = start
        carry = b""
        last: bytes | None = None
        while pos < size:
            chunk = os.pread(fd, min(_CHUNK, size - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
            for line in parts:
                self._lines += 1
                self._offset += len(line) + 1
                self._since_cp = 0 if _CP_MARKER in line else self._since_cp + 1
                last = line
        if last is not None:
            self._find_head(start, last)
        return carry

    def _find_head(self, start: int, last: bytes) -> None:
        """Update the chain head from the complete lines in [start, self._offset)."""
        if _parse_object(last) is not None:
            self._set_head(last, self._lines)
            return
        lineno = self._lines
        for line in _lines_backward(self._fd, start, self._offset):
            if _parse_object(line) is not None:
                self._set_head(line, lineno)
                return
            lineno -= 1
        # No record among the new lines: the previous head stands.

    def _set_head(self, line: bytes, lineno: int) -> None:
        self._head = encoding.hash_bytes(line)
        self._head_line = lineno
        self._head_is_cp = _CP_MARKER in line

    def _append(self, build: Callable[[str, int], dict[str, Any]]) -> None:
        """Append one line under the file lock; ``build(prev_hash, prev_line)`` makes it."""
        tail = self._sync()
        lines, since_cp = self._lines, self._since_cp
        head, head_line = self._head, self._head_line
        prefix = b""
        if tail:
            prefix = b"\n"  # terminate what a crash left, never rewrite it
            lines += 1
            since_cp = 0 if _CP_MARKER in tail else since_cp + 1
            if _parse_object(tail) is not None:  # a whole record that only lost its newline
                head, head_line = encoding.hash_bytes(tail), lines
        obj = build(head, head_line)
        line = _json_text(obj).encode("ascii")
        data = prefix + line + b"\n"
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(errno.EIO, "short write to the audit log", self.path)
        if self._fsync:
            os.fsync(self._fd)
        self._offset = os.lseek(self._fd, 0, os.SEEK_CUR)
        self._lines = lines + 1
        is_cp = obj.get("event") == "checkpoint"
        self._since_cp = 0 if is_cp else since_cp + 1
        self._head, self._head_line, self._head_is_cp = encoding.hash_bytes(line), self._lines, is_cp

    def _checkpoint_record(self, head: str, head_line: int) -> dict[str, Any]:
        assert self._identity is not None
        now = self._clock()
        token = jws_sign(
            {"line": head_line, "hash": head, "timestamp": int(now)}, self._identity, AUDIT_JWS_TYP
        )
        obj: dict[str, Any] = dict.fromkeys(RECORD_MEMBERS)
        obj["timestamp"] = float(now)
        obj["event"] = "checkpoint"
        obj["prev_hash"] = head
        obj["checkpoint"] = token
        return obj

    def _checkpoint_locked(self) -> bool:
        tail = self._sync()
        tail_is_record = bool(tail) and _parse_object(tail) is not None
        if self._head_line == 0 and not tail_is_record:
            return False  # nothing to cover
        if self._head_is_cp and not tail:
            return False  # the last record already is a checkpoint
        self._append(self._checkpoint_record)
        return True

    # -- sink API ------------------------------------------------------------------------
    def write(self, event: AuditEvent) -> None:
        """Append ``event``, and a checkpoint when ``checkpoint_every`` records are due.

        Raises ``OSError`` when the file cannot be written and ``ValueError`` once closed.
        """
        record = event.to_dict()

        def build(head: str, _line: int) -> dict[str, Any]:
            return {**record, "prev_hash": head}

        with self._locked():
            self._append(build)
            if self._identity is not None and self._since_cp >= self._every:
                self._append(self._checkpoint_record)

    def checkpoint(self) -> bool:
        """Write a checkpoint now unless the last record already is one; True if written."""
        if self._identity is None:
            return False
        with self._locked():
            return self._checkpoint_locked()

    def close(self) -> None:
        """Write the closing checkpoint (with an identity) and close the file. Idempotent."""
        self._check_fork()
        with self._lock:
            if self._closed:
                return
            try:
                if self._identity is not None:
                    _lock_file(self._fd)
                    try:
                        self._checkpoint_locked()
                    finally:
                        _unlock_file(self._fd)
            finally:
                self._closed = True
                os.close(self._fd)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def __enter__(self) -> JsonlAuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonlAuditLog({self.path!r})"


class _FileLock:
    """Thread lock plus exclusive flock on the log's descriptor."""

    __slots__ = ("_log",)

    def __init__(self, log: JsonlAuditLog) -> None:
        self._log = log

    def __enter__(self) -> None:
        self._log._lock.acquire()
        try:
            if self._log._closed:
                raise ValueError("audit log is closed")
            _lock_file(self._log._fd)
        except BaseException:
            self._log._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            _unlock_file(self._log._fd)
        finally:
            self._log._lock.release()


def _lines_backward(fd: int, start: int, end: int) -> Iterator[bytes]:
    """The complete lines of [start, end) (which ends with a newline), last first."""
    buf = b""
    pos = end
    while True:
        body_end = len(buf) - 1  # the newline ending the current last line
        idx = buf.rfind(b"\n", 0, body_end) if body_end > 0 else -1
        if idx >= 0:
            yield buf[idx + 1 : body_end]
            buf = buf[: idx + 1]
            continue
        if pos <= start:
            if buf:
                yield buf[:body_end]
            return
        n = min(_CHUNK, pos - start)
        pos -= n
        buf = os.pread(fd, n, pos) + buf
