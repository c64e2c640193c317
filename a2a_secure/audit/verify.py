"""The verifier of a chained audit log and its command line (``a2a-secure audit verify``).

It reads a file written by :class:`~a2a_secure.audit.log.JsonlAuditLog` line by line,
checks every record's members and chain link, the checkpoint signatures when it has the key,
and an anchor checkpoint kept elsewhere; see :mod:`a2a_secure.audit.log` for the torn-line
rule it applies.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from a2a_secure.audit.records import (
    _ROLES,
    _STATUSES,
    _STRING_FIELDS,
    AUDIT_JWS_TYP,
    DELEGATION_MEMBERS,
    EVENTS,
    MAX_UNVERIFIED_LENGTH,
    MAX_VERIFIED_LENGTH,
    RECORD_MEMBERS,
    ZERO_HASH,
    _parse_object,
)
from a2a_secure.errors import A2AError
from a2a_secure.identity import encoding
from a2a_secure.identity.did import key_id_for_did_key, public_key_from_did_key
from a2a_secure.identity.jws import jws_decode_unverified, jws_verify
from a2a_secure.terminal import printable

__all__ = ["AuditVerifyResult", "audit_verify_main", "run_audit_verify", "verify_chain"]

_CHECKPOINT_MEMBERS = frozenset((*RECORD_MEMBERS, "checkpoint"))
_RECORD_MEMBER_SET = frozenset(RECORD_MEMBERS)
_DELEGATION_MEMBER_SET = frozenset(DELEGATION_MEMBERS)
_CHECKPOINT_PAYLOAD = frozenset(("line", "hash", "timestamp"))


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
    if not is_cp and "principal" in obj:  # an intent under a delegation chain (§12.7)
        expected = _RECORD_MEMBER_SET | _DELEGATION_MEMBER_SET
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
    for name in (*_STRING_FIELDS, *(DELEGATION_MEMBERS if "principal" in obj else ())):
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
    print(printable(text), file=sys.stdout if code == 0 else sys.stderr)
    return code
