"""Audit records, sinks, a hash-chained JSON Lines log and its verifier (PROTOCOL.md §8).

Every handshake step, intent, close and rejection becomes one :class:`AuditEvent`: a fixed,
keyword-only set of members. There is no member for intent inputs, results, tokens or
credentials, and :meth:`Auditor.record` takes only the §8 members, so none of those can be
recorded by mistake (an unknown keyword is a ``TypeError``)::

    auditor = Auditor([JsonlAuditLog("audit.jsonl", identity)], role="server")
    auditor.record(event="intent", status="success", verified=True, session_id=sid,
                   client_did=client, server_did=me, intent_goal="translate", sequence=3,
                   duration_ms=12.5)
    auditor.close()

Sinks (:class:`AuditSink`): :class:`JsonlAuditLog` (the default, chained and checkpointed),
:class:`LoggingAuditSink` (one JSON string per record through :mod:`logging`, no chain) and
:class:`MemoryAuditSink` (for tests).

**Failure policy.** A sink that fails (disk full, permissions, closed file) does not fail the
protocol exchange: :class:`Auditor` logs the failure on the logger ``a2a_secure.audit_errors``
(rate limited), counts it (:attr:`Auditor.failures`) and goes on with the other sinks. An
agent that must not act without an audit trail passes ``fail_closed=True``: then
:meth:`Auditor.record` raises :class:`AuditWriteError` (an ``InternalError``, -32603) after
trying every sink. The default favours availability because a broken log disk would
otherwise turn into a denial of service of every peer, and because the failure stays visible
(counter, error log) rather than silent.

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

import argparse
import errno
import json
import logging
import math
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from a2a_secure.errors import A2AError, InternalError
from a2a_secure.identity import encoding
from a2a_secure.identity.did import MAX_DID_LENGTH, key_id_for_did_key, public_key_from_did_key
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign, jws_verify
from a2a_secure.identity.keys import Identity

if sys.platform != "win32":
    import fcntl

__all__ = [
    "AUDIT_JWS_TYP",
    "EVENTS",
    "MAX_UNVERIFIED_LENGTH",
    "RECORD_MEMBERS",
    "ZERO_HASH",
    "AuditEvent",
    "AuditRecord",
    "AuditSink",
    "AuditVerifyResult",
    "AuditWriteError",
    "Auditor",
    "JsonlAuditLog",
    "LoggingAuditSink",
    "MemoryAuditSink",
    "audit_verify_main",
    "run_audit_verify",
    "verify_chain",
]

AUDIT_JWS_TYP = "a2a-audit+jws"
ZERO_HASH = "sha256:" + "0" * 64
MAX_UNVERIFIED_LENGTH = 256
# Authenticated strings are already bounded by the protocol (DIDs <= 2048, goals <= 128);
# this cap only keeps a bug elsewhere from writing megabyte lines.
MAX_VERIFIED_LENGTH = MAX_DID_LENGTH
MAX_INT = encoding.MAX_SAFE_INT

Role = Literal["client", "server"]
EventName = Literal[
    "hello",
    "proof",
    "accept_policy",
    "intent",
    "close",
    "reject",
    # Key lifecycle (docs/PROTOCOL.md §12): client_did holds the DID or key id concerned,
    # server_did the successor DID of a followed rotation or the rotated agent's new DID.
    "rotate",
    "revoke",
    "unrevoke",
    "follow_rotation",
]
Status = Literal["success", "error"]

EVENTS: frozenset[str] = frozenset(
    (
        "hello",
        "proof",
        "accept_policy",
        "intent",
        "close",
        "reject",
        "rotate",
        "revoke",
        "unrevoke",
        "follow_rotation",
    )
)
_ROLES = frozenset(("client", "server"))
_STATUSES = frozenset(("success", "error"))
_STRING_FIELDS = ("session_id", "client_did", "server_did", "intent_goal")

#: The members of a record line, in the order they are written.
RECORD_MEMBERS: tuple[str, ...] = (
    "timestamp",
    "event",
    "role",
    "session_id",
    "client_did",
    "server_did",
    "intent_goal",
    "sequence",
    "status",
    "duration_ms",
    "error_code",
    "verified",
    "prev_hash",
)
_CHECKPOINT_MEMBERS = frozenset((*RECORD_MEMBERS, "checkpoint"))
_RECORD_MEMBER_SET = frozenset(RECORD_MEMBERS)
_CHECKPOINT_PAYLOAD = frozenset(("line", "hash", "timestamp"))
# Structural marker of a checkpoint line as this module writes it (compact JSON, so inside a
# string value the quotes would be escaped and the marker cannot occur).
_CP_MARKER = b'"event":"checkpoint"'
_CHUNK = 1 << 16
_SURROGATE_RE = re.compile("[\ud800-\udfff]")

_errlog = logging.getLogger("a2a_secure.audit_errors")


# -- records ------------------------------------------------------------------------------


def _clean_string(value: object, limit: int) -> str | None:
    """``value`` cut to ``limit`` code points, lone surrogates replaced; None for a non-string."""
    if not isinstance(value, str):
        return None
    value = value[:limit]
    # A lone surrogate cannot be written as UTF-8 and is refused by I-JSON readers.
    return _SURROGATE_RE.sub("\ufffd", value)


def _number(value: object, name: str, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite non-negative number")
    return number


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One audit record of PROTOCOL.md §8: only these members exist, keyword-only.

    Members that come from the SDK itself (``event``, ``role``, ``status``, ``verified``,
    ``timestamp``, ``duration_ms``, ``error_code``) are checked and a wrong value is a
    ``TypeError``/``ValueError`` (a bug). Members that may come from a peer (``session_id``,
    the DIDs, ``intent_goal``, ``sequence``) are sanitized instead, so hostile input cannot
    make auditing fail: a value of the wrong type becomes ``None``, a ``sequence`` outside
    0…2^53−1 becomes ``None``, lone surrogates become U+FFFD, and when ``verified`` is false
    every string is cut to 256 characters (2048 when verified).
    """

    timestamp: float
    event: EventName
    role: Role
    status: Status
    verified: bool = False
    session_id: str | None = None
    client_did: str | None = None
    server_did: str | None = None
    intent_goal: str | None = None
    sequence: int | None = None
    duration_ms: float | None = None
    error_code: int | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        if self.event not in EVENTS:
            raise ValueError(f"audit event must be one of {sorted(EVENTS)}")
        if self.role not in _ROLES:
            raise ValueError("audit role must be 'client' or 'server'")
        if self.status not in _STATUSES:
            raise ValueError("audit status must be 'success' or 'error'")
        if type(self.verified) is not bool:
            raise TypeError("verified must be a bool")
        put(self, "timestamp", _number(self.timestamp, "timestamp", optional=False))
        duration = _number(self.duration_ms, "duration_ms", optional=True)
        put(self, "duration_ms", None if duration is None else round(duration, 3))
        if self.error_code is not None and (
            type(self.error_code) is not int or not -MAX_INT <= self.error_code <= MAX_INT
        ):
            raise TypeError("error_code must be an int or None")
        limit = MAX_VERIFIED_LENGTH if self.verified else MAX_UNVERIFIED_LENGTH
        for name in _STRING_FIELDS:
            put(self, name, _clean_string(getattr(self, name), limit))
        seq = self.sequence
        if type(seq) is not int or not 0 <= seq <= MAX_INT:
            put(self, "sequence", None)

    def to_dict(self) -> dict[str, Any]:
        """The record's members in the order of :data:`RECORD_MEMBERS` (without ``prev_hash``)."""
        return {
            "timestamp": self.timestamp,
            "event": self.event,
            "role": self.role,
            "session_id": self.session_id,
            "client_did": self.client_did,
            "server_did": self.server_did,
            "intent_goal": self.intent_goal,
            "sequence": self.sequence,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "error_code": self.error_code,
            "verified": self.verified,
        }

    def to_json(self) -> str:
        """The record as one line of compact ASCII JSON."""
        return _json_text(self.to_dict())


#: The builder of §8 records is :class:`AuditEvent` itself (frozen, keyword-only).
AuditRecord = AuditEvent


def _json_text(obj: Mapping[str, Any]) -> str:
    # ASCII keeps every line free of raw control or separator characters.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


# -- sinks --------------------------------------------------------------------------------


@runtime_checkable
class AuditSink(Protocol):
    """Where audit records go. ``write`` may raise; :class:`Auditor` handles that."""

    def write(self, event: AuditEvent) -> None: ...

    def close(self) -> None: ...


class MemoryAuditSink:
    """Keeps records in a list (tests, debugging)."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self.closed = False
        self._lock = threading.Lock()

    def write(self, event: AuditEvent) -> None:
        with self._lock:
            self.events.append(event)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records as dictionaries."""
        with self._lock:
            return [e.to_dict() for e in self.events]

    def close(self) -> None:
        self.closed = True


class LoggingAuditSink:
    """Emits each record as one JSON string through :mod:`logging` (no chain, no checkpoints)."""

    def __init__(self, logger_name: str = "a2a_secure.audit", level: int = logging.INFO) -> None:
        self.logger = logging.getLogger(logger_name)
        self.level = level

    def write(self, event: AuditEvent) -> None:
        self.logger.log(self.level, "%s", event.to_json())

    def close(self) -> None:
        return None


def _parse_object(line: bytes) -> dict[str, Any] | None:
    """The line as a JSON object, or None when it is not one (a torn line)."""
    try:
        value = encoding.loads(line)
    except A2AError:
        return None
    return value if isinstance(value, dict) else None


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
        clock: Callable[[], float] = time.time,
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


# -- the facade ---------------------------------------------------------------------------


class AuditWriteError(InternalError):
    """A sink failed and the auditor is fail-closed (-32603 to the peer)."""

    default_message = "audit log unavailable"


class Auditor:
    """What the server and the client call: builds §8 records and hands them to the sinks.

    ``role`` is the default role of the records; ``clock`` gives their timestamps. See the
    module documentation for ``fail_closed``. ``on_error(sink, exc)``, if given, is called
    for every sink failure (after counting it).
    """

    def __init__(
        self,
        sinks: Iterable[AuditSink] = (),
        *,
        role: Role | None = None,
        clock: Callable[[], float] = time.time,
        fail_closed: bool = False,
        on_error: Callable[[AuditSink, Exception], None] | None = None,
    ) -> None:
        self.sinks: list[AuditSink] = list(sinks)
        self.role: Role | None = role
        self.clock = clock
        self.fail_closed = fail_closed
        self._on_error = on_error
        self._lock = threading.Lock()
        self._failures = 0
        self._last_failure: str | None = None
        self._last_logged = -math.inf
        self._suppressed = 0

    @property
    def failures(self) -> int:
        """How many sink writes (or closes) failed so far."""
        return self._failures

    @property
    def last_failure(self) -> str | None:
        """A short description of the most recent failure."""
        return self._last_failure

    def record(
        self,
        *,
        event: EventName,
        status: Status,
        verified: bool = False,
        role: Role | None = None,
        session_id: str | None = None,
        client_did: str | None = None,
        server_did: str | None = None,
        intent_goal: str | None = None,
        sequence: int | None = None,
        duration_ms: float | None = None,
        error_code: int | None = None,
    ) -> AuditEvent:
        """Build one record (timestamp from the clock) and write it to every sink."""
        chosen = role if role is not None else self.role
        if chosen is None:
            raise ValueError("audit role not given and the auditor has no default role")
        ev = AuditEvent(
            timestamp=self.clock(),
            event=event,
            role=chosen,
            status=status,
            verified=verified,
            session_id=session_id,
            client_did=client_did,
            server_did=server_did,
            intent_goal=intent_goal,
            sequence=sequence,
            duration_ms=duration_ms,
            error_code=error_code,
        )
        self.write(ev)
        return ev

    def write(self, event: AuditEvent) -> None:
        """Hand a ready record to every sink (so an Auditor is itself a sink)."""
        failed: Exception | None = None
        for sink in self.sinks:
            try:
                sink.write(event)
            except Exception as exc:
                self._failed(sink, exc, f"write a {event.event} record")
                failed = failed or exc
        if failed is not None and self.fail_closed:
            raise AuditWriteError() from failed

    def close(self) -> None:
        """Close every sink (closing checkpoints are written here)."""
        failed: Exception | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                self._failed(sink, exc, "close")
                failed = failed or exc
        if failed is not None and self.fail_closed:
            raise AuditWriteError() from failed

    def _failed(self, sink: AuditSink, exc: Exception, what: str) -> None:
        desc = f"audit sink {type(sink).__name__} failed to {what}: {type(exc).__name__}: {exc}"[:300]
        now = time.monotonic()
        with self._lock:
            self._failures += 1
            self._last_failure = desc
            log_now = now - self._last_logged >= 60.0
            if log_now:
                suppressed, self._suppressed, self._last_logged = self._suppressed, 0, now
            else:
                self._suppressed += 1
        if log_now:
            more = f" ({suppressed} more failures since the last report)" if suppressed else ""
            _errlog.error("%s%s", desc, more)
        if self._on_error is not None:
            try:
                self._on_error(sink, exc)
            except Exception:
                _errlog.exception("audit on_error callback failed")


# -- verification -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditVerifyResult:
    """What :func:`verify_chain` found.

    ``lines`` counts the lines read (torn ones included), ``records`` the chained records
    (checkpoints included), ``checkpoints`` the checkpoint records. On failure
    ``first_bad_line`` is the first line at which the chain does not hold: a changed line
    ``k`` shows at ``k + 1`` (the record whose ``prev_hash`` no longer matches; lines before
    ``k`` are intact), a removed, inserted or reordered line at its own position.
    ``last_hash`` and ``last_checkpoint`` (a token) are what to keep elsewhere to detect
    truncation later.
    """

    ok: bool
    lines: int
    first_bad_line: int | None
    reason: str | None
    last_checkpoint_line: int | None
    records: int = 0
    checkpoints: int = 0
    torn_lines: tuple[int, ...] = ()
    last_hash: str = ZERO_HASH
    last_checkpoint: str | None = None
    signatures_checked: bool = False

    def message(self) -> str:
        """One line for people: ``OK: …`` or ``BROKEN at line L: …``."""
        if not self.ok:
            return f"BROKEN at line {self.first_bad_line}: {self.reason}"
        where = (
            f"last checkpoint at line {self.last_checkpoint_line}"
            if self.last_checkpoint_line is not None
            else "no checkpoint"
        )
        cps = f" ({self.checkpoints} checkpoints)" if self.checkpoints else ""
        text = f"OK: {self.records} records{cps}, chain intact, {where}"
        if self.checkpoints and not self.signatures_checked:
            text += " (checkpoint signatures not checked: no key given)"
        if self.torn_lines:
            shown = ", ".join(str(n) for n in self.torn_lines[:10])
            more = ", …" if len(self.torn_lines) > 10 else ""
            text += f"; WARNING: torn line(s) from a crash skipped at line {shown}{more}"
        return text


class _Bad(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _check_members(obj: dict[str, Any], lineno: int) -> bool:
    """Check a record's members; True when it is a checkpoint."""
    is_cp = obj.get("event") == "checkpoint"
    expected = _CHECKPOINT_MEMBERS if is_cp else _RECORD_MEMBER_SET
    if obj.keys() != expected:
        extra = sorted(obj.keys() - expected)
        missing = sorted(expected - obj.keys())
        detail = f"unexpected member {extra[0]!r}" if extra else f"missing member {missing[0]!r}"
        raise _Bad(lineno, f"not an audit record ({detail})")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise _Bad(lineno, "not an audit record (timestamp is not a number)")
    if not encoding.is_hash_string(obj["prev_hash"]):
        raise _Bad(lineno, "not an audit record (prev_hash is not a hash string)")
    if is_cp:
        others = [k for k in RECORD_MEMBERS if k not in ("timestamp", "event", "prev_hash")]
        if any(obj[k] is not None for k in others) or not isinstance(obj["checkpoint"], str):
            raise _Bad(lineno, "malformed checkpoint record")
        return True
    if obj["event"] not in EVENTS or obj["role"] not in _ROLES or obj["status"] not in _STATUSES:
        raise _Bad(lineno, "not an audit record (event, role or status)")
    verified = obj["verified"]
    if type(verified) is not bool:
        raise _Bad(lineno, "not an audit record (verified is not a bool)")
    limit = MAX_VERIFIED_LENGTH if verified else MAX_UNVERIFIED_LENGTH
    for name in _STRING_FIELDS:
        value = obj[name]
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise _Bad(lineno, f"not an audit record ({name})")
    for name in ("sequence", "error_code"):
        if obj[name] is not None and type(obj[name]) is not int:
            raise _Bad(lineno, f"not an audit record ({name})")
    duration = obj["duration_ms"]
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int | float)):
        raise _Bad(lineno, "not an audit record (duration_ms)")
    return False


class _Keys:
    """The verification keys the caller gave; a JWS header's kid only picks among them."""

    def __init__(self, public_key: bytes | None, kid: str | None, keys: Mapping[str, bytes] | None) -> None:
        self._map: dict[str, bytes] = dict(keys or {})
        self._any: bytes | None = None
        if public_key is not None:
            if kid is not None:
                self._map[kid] = public_key
            else:
                self._any = public_key
        self.active = bool(self._map) or self._any is not None

    def verify(self, token: str) -> dict[str, Any]:
        """The verified payload of an audit JWS; raises ``ValueError`` with a short reason."""
        try:
            header = jws_decode_unverified(token)[0]
        except A2AError:
            raise ValueError("not a well-formed JWS") from None
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise ValueError("JWS has no kid")
        key = self._map.get(kid, self._any)
        if key is None:
            raise ValueError("signed by a key that was not given")
        try:
            return jws_verify(token, key, typ=AUDIT_JWS_TYP, kid=kid)
        except A2AError as exc:
            raise ValueError(exc.message) from None


def _checkpoint_payload(token: str, keys: _Keys) -> dict[str, Any]:
    """The payload of a checkpoint token: signature checked if keys were given, form always."""
    if keys.active:
        payload = keys.verify(token)
    else:
        try:
            header, payload, _, _ = jws_decode_unverified(token)
        except A2AError:
            raise ValueError("not a well-formed JWS") from None
        if header.get("typ") != AUDIT_JWS_TYP or header.get("alg") != "EdDSA":
            raise ValueError(f"JWS is not an EdDSA {AUDIT_JWS_TYP}")
    if payload.keys() != _CHECKPOINT_PAYLOAD:
        raise ValueError("payload must have exactly line, hash and timestamp")
    if type(payload["line"]) is not int or type(payload["timestamp"]) is not int:
        raise ValueError("payload line and timestamp must be integers")
    if not encoding.is_hash_string(payload["hash"]):
        raise ValueError("payload hash is not a hash string")
    return payload


def _iter_lines(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The file's lines without their newlines (the last one may lack it)."""
    with open(path, "rb") as fh:
        for raw in fh:
            yield raw[:-1] if raw.endswith(b"\n") else raw


def verify_chain(
    path: str | os.PathLike[str],
    *,
    public_key: bytes | None = None,
    kid: str | None = None,
    keys: Mapping[str, bytes] | None = None,
    anchor: str | None = None,
    strict: bool = False,
) -> AuditVerifyResult:
    """Re-compute the chain of the audit log at ``path`` and report the first broken link.

    Checked: every record's ``prev_hash`` (changed, removed, inserted, reordered lines),
    every record's member set (nothing beyond §8, so no inputs or results), every checkpoint
    (form, ``typ``, ``line`` and ``hash`` equal to the record it follows) and, when a key is
    given, its signature. Keys come only from the caller, never from the file: ``keys`` maps
    key ids to raw Ed25519 keys and the JWS header's ``kid`` only picks among them;
    ``public_key`` with ``kid`` adds one; ``public_key`` alone is used whatever the ``kid``.

    ``anchor`` is a checkpoint token kept elsewhere (e.g. an earlier
    :attr:`AuditVerifyResult.last_checkpoint`): the file must still hold the line it covers,
    with that hash, which exposes cut-off or re-written tails. Torn lines (module docs) are
    skipped and listed unless ``strict``. Raises ``OSError`` if the file cannot be read and
    ``ValueError`` if ``anchor`` is not a valid checkpoint token.
    """
    vkeys = _Keys(public_key, kid, keys)
    anchor_line: int | None = None
    anchor_hash: str | None = None
    if anchor is not None:
        try:
            anchor_payload = _checkpoint_payload(anchor, vkeys)
        except ValueError as exc:
            raise ValueError(f"anchor checkpoint: {exc}") from None
        anchor_line, anchor_hash = anchor_payload["line"], anchor_payload["hash"]

    head, head_line = ZERO_HASH, 0
    lineno = records = checkpoints = 0
    last_cp_line: int | None = None
    last_cp: str | None = None
    torn: list[int] = []
    pending: list[int] = []  # torn lines since the last record
    anchor_seen = anchor_line == 0 and anchor_hash == ZERO_HASH

    def result(bad: _Bad | None) -> AuditVerifyResult:
        return AuditVerifyResult(
            ok=bad is None,
            lines=lineno,
            first_bad_line=None if bad is None else bad.line,
            reason=None if bad is None else bad.reason,
            last_checkpoint_line=last_cp_line,
            records=records,
            checkpoints=checkpoints,
            torn_lines=tuple(torn),
            last_hash=head,
            last_checkpoint=last_cp,
            signatures_checked=vkeys.active,
        )

    try:
        for lineno, body in enumerate(_iter_lines(path), 1):
            obj = _parse_object(body)
            if obj is None:
                if strict:
                    raise _Bad(lineno, "not a JSON record")
                pending.append(lineno)
                continue
            if obj.get("prev_hash") != head:
                if pending:
                    raise _Bad(
                        pending[0],
                        f"not a JSON record, and line {lineno} does not chain over it"
                        " (a record was changed or removed)",
                    )
                where = f"line {head_line}" if head_line else "the start of the file"
                raise _Bad(
                    lineno,
                    f"prev_hash does not match {where} (that line changed, or lines were"
                    " removed, inserted or reordered)",
                )
            if _check_members(obj, lineno):
                token = obj["checkpoint"]
                try:
                    payload = _checkpoint_payload(token, vkeys)
                except ValueError as exc:
                    raise _Bad(lineno, f"checkpoint: {exc}") from None
                if payload["line"] != head_line or payload["hash"] != head:
                    raise _Bad(
                        lineno,
                        f"checkpoint covers line {payload['line']} but follows line {head_line}"
                        " or names another hash",
                    )
                checkpoints += 1
                last_cp_line, last_cp = lineno, token
            torn.extend(pending)
            pending.clear()
            head, head_line = encoding.hash_bytes(body), lineno
            records += 1
            if lineno == anchor_line:
                if head != anchor_hash:
                    raise _Bad(lineno, "line differs from the kept checkpoint (the log was rewritten)")
                anchor_seen = True
        torn.extend(pending)
        if anchor_line is not None and not anchor_seen:
            if lineno < anchor_line:
                raise _Bad(
                    lineno + 1,
                    f"the file ends at line {lineno} but the kept checkpoint covers line"
                    f" {anchor_line} (the log was truncated)",
                )
            raise _Bad(anchor_line, "the kept checkpoint covers this line but it is not a record")
    except _Bad as bad:
        return result(bad)
    return result(None)


# -- command line -------------------------------------------------------------------------


def run_audit_verify(path: str, did: str | None, *, anchor: str | None = None) -> tuple[int, str]:
    """``a2a-secure audit verify FILE [--did DID] [--checkpoint TOKEN]``: (exit code, message).

    0 with ``OK: …`` when the chain holds, 1 with ``BROKEN at line L: …`` when not, 2 when
    the check cannot run (unreadable file, a DID whose key is not available offline).
    Checkpoint signatures are checked when ``did`` is a did:key.
    """
    public_key: bytes | None = None
    kid: str | None = None
    if did is not None:
        if not did.startswith("did:key:"):
            return 2, "error: only a did:key can be checked offline; give the agent's did:key"
        try:
            public_key = public_key_from_did_key(did)
            kid = key_id_for_did_key(did)
        except A2AError as exc:
            return 2, f"error: {exc.message}"
    try:
        res = verify_chain(path, public_key=public_key, kid=kid, anchor=anchor)
    except OSError as exc:
        return 2, f"error: cannot read {path}: {exc.strerror or exc}"
    except (ValueError, A2AError) as exc:
        return 2, f"error: {exc}"
    return (0 if res.ok else 1), res.message()


def audit_verify_main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m a2a_secure.audit FILE [--did DID]``."""
    parser = argparse.ArgumentParser(prog="a2a-secure audit verify", description="Verify an audit log.")
    parser.add_argument("file")
    parser.add_argument("--did", default=None, help="the writing agent's did:key (checks checkpoints)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint token kept elsewhere")
    args = parser.parse_args(argv)
    code, text = run_audit_verify(args.file, args.did, anchor=args.checkpoint)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(audit_verify_main())
