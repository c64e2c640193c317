"""Audit records, sinks, the chained JSON Lines log and its verifier (PROTOCOL.md §8)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from a2a_secure.audit import (
    AUDIT_JWS_TYP,
    DELEGATION_MEMBERS,
    RECORD_MEMBERS,
    ZERO_HASH,
    AuditEvent,
    Auditor,
    AuditSink,
    AuditWriteError,
    JsonlAuditLog,
    LoggingAuditSink,
    MemoryAuditSink,
    audit_verify_main,
    run_audit_verify,
    verify_chain,
)
from a2a_secure.errors import InternalError
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign, jws_verify
from a2a_secure.identity.keys import Identity

SEED = bytes(range(32))
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ident() -> Identity:
    return Identity.from_seed(SEED, "auditor")


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def _h(line: bytes) -> str:
    return "sha256:" + hashlib.sha256(line).hexdigest()


def _fill(path: Path, n: int, identity: Identity | None = None, **kw: Any) -> None:
    log = JsonlAuditLog(path, identity, **kw)
    auditor = Auditor([log], role="server")
    for i in range(n):
        auditor.record(
            event="intent",
            status="success",
            verified=True,
            session_id="s" * 43,
            client_did="did:key:zclient",
            server_did="did:key:zserver",
            intent_goal="translate",
            sequence=i + 1,
            duration_ms=1.5,
        )
    auditor.close()
    assert auditor.failures == 0


# -- the chain ----------------------------------------------------------------------------


def test_chain_valid_after_n_records(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 50)
    lines = _lines(path)
    assert len(lines) == 50
    prev = ZERO_HASH
    for line in lines:
        obj = json.loads(line)
        assert list(obj) == list(RECORD_MEMBERS)
        assert obj["prev_hash"] == prev
        prev = _h(line)
    res = verify_chain(path)
    assert res.ok and res.lines == 50 and res.records == 50
    assert res.first_bad_line is None and res.reason is None
    assert res.last_checkpoint_line is None and res.last_hash == prev
    assert res.message() == "OK: 50 records, chain intact, no checkpoint"


def test_empty_file_verifies(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    JsonlAuditLog(path).close()
    assert path.read_bytes() == b""
    res = verify_chain(path)
    assert res.ok and res.lines == 0 and res.records == 0


def _changed(lines: list[bytes], k: int) -> list[bytes]:
    obj = json.loads(lines[k - 1])
    obj["intent_goal"] = "something-else"
    out = list(lines)
    out[k - 1] = json.dumps(obj, separators=(",", ":")).encode()
    return out


def _removed(lines: list[bytes], k: int) -> list[bytes]:
    return lines[: k - 1] + lines[k:]


def _reordered(lines: list[bytes], k: int) -> list[bytes]:
    out = list(lines)
    out[k - 1], out[k] = out[k], out[k - 1]
    return out


def _inserted(lines: list[bytes], k: int) -> list[bytes]:
    return [*lines[: k - 1], lines[4], *lines[k - 1 :]]


def _garbled(lines: list[bytes], k: int) -> list[bytes]:
    out = list(lines)
    out[k - 1] = out[k - 1][:40]
    return out


def _prev_changed(lines: list[bytes], k: int) -> list[bytes]:
    obj = json.loads(lines[k - 1])
    obj["prev_hash"] = "sha256:" + "1" * 64
    out = list(lines)
    out[k - 1] = json.dumps(obj, separators=(",", ":")).encode()
    return out


def _extra_member(lines: list[bytes], k: int) -> list[bytes]:
    obj = json.loads(lines[k - 1])
    obj["inputs"] = {"text": "secret"}
    out = list(lines)
    out[k - 1] = json.dumps(obj, separators=(",", ":")).encode()
    return out


@pytest.mark.parametrize(
    ("tamper", "k", "bad"),
    [
        (_changed, 10, 11),  # the changed line's successor no longer chains to it
        (_changed, 1, 2),
        (_removed, 10, 10),
        (_removed, 1, 1),
        (_reordered, 10, 10),
        (_inserted, 10, 10),
        (_inserted, 1, 1),
        (_garbled, 10, 10),  # a record turned into a non-JSON line
        (_prev_changed, 10, 10),
        (_extra_member, 10, 10),  # caught even if the attacker fixed nothing else
    ],
)
def test_verify_reports_first_bad_line(tmp_path: Path, tamper: Any, k: int, bad: int) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 30)
    _write_lines(path, tamper(_lines(path), k))
    res = verify_chain(path)
    assert not res.ok
    assert res.first_bad_line == bad, res.reason
    assert res.message().startswith(f"BROKEN at line {bad}: ")


def test_inserted_junk_line_is_reported_as_torn_and_refused_when_strict(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 20)
    lines = _lines(path)
    _write_lines(path, [*lines[:9], b"not json at all", *lines[9:]])
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (10,) and res.records == 20 and res.lines == 21
    assert "torn line(s)" in res.message() and "line 10" in res.message()
    strict = verify_chain(path, strict=True)
    assert not strict.ok and strict.first_bad_line == 10


def test_restart_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 5)
    _fill(path, 7)
    lines = _lines(path)
    assert len(lines) == 12
    assert json.loads(lines[5])["prev_hash"] == _h(lines[4])
    res = verify_chain(path)
    assert res.ok and res.records == 12


# -- torn tails ---------------------------------------------------------------------------


def test_torn_tail_is_kept_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 5)
    before = path.read_bytes()
    fragment = b'{"timestamp":1763700000.5,"event":"inte'
    with open(path, "ab") as fh:
        fh.write(fragment)
    # Right after the crash: the fragment is the torn tail.
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (6,) and res.records == 5
    # Restart: the fragment is kept byte for byte, and the chain skips it.
    _fill(path, 2)
    data = path.read_bytes()
    assert data.startswith(before + fragment + b"\n")
    lines = _lines(path)
    assert len(lines) == 8 and lines[5] == fragment
    assert json.loads(lines[6])["prev_hash"] == _h(lines[4])
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (6,) and res.records == 7 and res.lines == 8
    assert not verify_chain(path, strict=True).ok


def test_torn_zero_filled_tail(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 3)
    with open(path, "ab") as fh:
        fh.write(b"\x00" * 4096)
    _fill(path, 1)
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (4,) and res.records == 4


def test_two_crashes_in_a_row(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 3)
    with open(path, "ab") as fh:
        fh.write(b'{"timestamp":1')
    log = JsonlAuditLog(path)  # opened, never written: nothing changes
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'\n{"timestamp":2')  # a second crash after the newline
    _fill(path, 2)
    lines = _lines(path)
    assert json.loads(lines[5])["prev_hash"] == _h(lines[2])
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (4, 5) and res.records == 5


def test_tail_scans_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from a2a_secure.audit import log

    monkeypatch.setattr(log, "_CHUNK", 5)  # lines span many reads, forwards and backwards
    path = tmp_path / "audit.jsonl"
    _fill(path, 4)
    with open(path, "ab") as fh:
        fh.write(b"torn-one-" * 7 + b"\n" + b"torn-two-" * 3)
    a = JsonlAuditLog(path)
    b = JsonlAuditLog(path)
    ev = AuditEvent(timestamp=1.0, event="close", role="server", status="success")
    a.write(ev)
    b.write(ev)
    a.write(ev)
    a.close()
    b.close()
    lines = _lines(path)
    assert len(lines) == 9
    assert json.loads(lines[6])["prev_hash"] == _h(lines[3])
    res = verify_chain(path)
    assert res.ok and res.torn_lines == (5, 6) and res.records == 7


def test_record_missing_only_its_newline_is_completed(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 3)
    path.write_bytes(path.read_bytes()[:-1])
    assert verify_chain(path).ok
    _fill(path, 2)
    lines = _lines(path)
    assert len(lines) == 5
    assert json.loads(lines[3])["prev_hash"] == _h(lines[2])
    res = verify_chain(path)
    assert res.ok and res.torn_lines == () and res.records == 5


# -- checkpoints --------------------------------------------------------------------------


def test_checkpoints_every_100_and_at_close(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 250, ident)
    lines = _lines(path)
    assert len(lines) == 253
    cps = [i + 1 for i, line in enumerate(lines) if json.loads(line)["event"] == "checkpoint"]
    assert cps == [101, 202, 253]
    for n in cps:
        obj = json.loads(lines[n - 1])
        assert obj.keys() == {*RECORD_MEMBERS, "checkpoint"}
        assert all(obj[k] is None for k in RECORD_MEMBERS if k not in ("timestamp", "event", "prev_hash"))
        payload = jws_verify(obj["checkpoint"], ident.public_key, typ=AUDIT_JWS_TYP, kid=ident.kid)
        assert payload.keys() == {"line", "hash", "timestamp"}
        assert payload["line"] == n - 1  # the number of lines before it
        assert payload["hash"] == _h(lines[n - 2]) == obj["prev_hash"]
        assert type(payload["timestamp"]) is int
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert res.ok and res.signatures_checked and res.checkpoints == 3
    assert res.last_checkpoint_line == 253
    assert res.message() == "OK: 253 records (3 checkpoints), chain intact, last checkpoint at line 253"
    # The kid in the file only picks among keys the caller gave.
    assert verify_chain(path, keys={ident.kid: ident.public_key}).ok
    assert verify_chain(path, public_key=ident.public_key).ok
    unchecked = verify_chain(path)
    assert unchecked.ok and not unchecked.signatures_checked
    assert "signatures not checked" in unchecked.message()


def test_no_checkpoint_without_identity_and_none_twice(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "a.jsonl"
    _fill(path, 150)
    assert all(json.loads(line)["event"] != "checkpoint" for line in _lines(path))
    path2 = tmp_path / "b.jsonl"
    _fill(path2, 100, ident)  # the 100th record's checkpoint doubles as the closing one
    lines = _lines(path2)
    assert len(lines) == 101
    log = JsonlAuditLog(path2, ident)
    assert log.checkpoint() is False
    log.close()
    assert len(_lines(path2)) == 101
    empty = tmp_path / "c.jsonl"
    JsonlAuditLog(empty, ident).close()
    assert empty.read_bytes() == b""


def test_checkpoint_counts_records_of_every_writer(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    a = JsonlAuditLog(path, ident, checkpoint_every=10)
    b = JsonlAuditLog(path, ident, checkpoint_every=10)
    ev = AuditEvent(timestamp=1.0, event="hello", role="server", status="success")
    for _ in range(15):
        a.write(ev)
        b.write(ev)
    a.close()
    b.close()
    lines = _lines(path)
    cps = [i + 1 for i, line in enumerate(lines) if json.loads(line)["event"] == "checkpoint"]
    assert cps == [11, 22, 33]  # counted over both writers' records
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert res.ok and res.records == len(lines)


def test_truncation_is_evident_against_a_kept_checkpoint(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 250, ident)
    kept = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert kept.last_checkpoint is not None
    anchor = kept.last_checkpoint
    assert verify_chain(path, public_key=ident.public_key, kid=ident.kid, anchor=anchor).ok
    # Cut the tail: on its own the shorter file still verifies ...
    _write_lines(path, _lines(path)[:150])
    alone = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert alone.ok and alone.last_checkpoint_line == 101
    # ... but not against the checkpoint kept elsewhere.
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid, anchor=anchor)
    assert not res.ok and res.first_bad_line == 151
    assert "truncated" in (res.reason or "")
    assert not verify_chain(path, anchor=anchor).ok  # also without checking signatures
    code, text = run_audit_verify(str(path), ident.did, anchor=anchor)
    assert code == 1 and text.startswith("BROKEN at line 151")


def test_rewritten_log_is_evident_against_a_kept_checkpoint(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 120, ident)
    anchor = verify_chain(path).last_checkpoint
    assert anchor is not None
    # An attacker without the key rebuilds a consistent chain without checkpoints.
    path.unlink()
    _fill(path, 130)
    assert verify_chain(path).ok
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid, anchor=anchor)
    assert not res.ok and res.first_bad_line == 121 and "rewritten" in (res.reason or "")


def test_anchor_must_verify(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 10, ident)
    other = Identity.generate("other")
    forged = jws_sign({"line": 1, "hash": ZERO_HASH, "timestamp": 1}, other, AUDIT_JWS_TYP)
    with pytest.raises(ValueError, match="anchor"):
        verify_chain(path, public_key=ident.public_key, kid=ident.kid, anchor=forged)
    code, text = run_audit_verify(str(path), ident.did, anchor=forged)
    assert code == 2 and text.startswith("error:")


def _cp_line(path: Path) -> int:
    for i, line in enumerate(_lines(path)):
        if json.loads(line)["event"] == "checkpoint":
            return i + 1
    raise AssertionError("no checkpoint")


def _replace_checkpoint(path: Path, token: str) -> int:
    lines = _lines(path)
    n = _cp_line(path)
    obj = json.loads(lines[n - 1])
    obj["checkpoint"] = token
    lines[n - 1] = json.dumps(obj, separators=(",", ":")).encode()
    _write_lines(path, lines[:n])  # later lines would no longer chain; keep the test focused
    return n


def test_tampered_checkpoint_signature(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 5, ident, checkpoint_every=3)
    token = json.loads(_lines(path)[_cp_line(path) - 1])["checkpoint"]
    h, p, s = token.split(".")
    flipped = s[:10] + ("A" if s[10] != "A" else "B") + s[11:]
    n = _replace_checkpoint(path, f"{h}.{p}.{flipped}")
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert not res.ok and res.first_bad_line == n and "signature" in (res.reason or "")


def test_checkpoint_by_another_key(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    other = Identity.generate("other")
    _fill(path, 5, other, checkpoint_every=3)
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert not res.ok and res.first_bad_line == 4 and "not given" in (res.reason or "")
    res = verify_chain(path, public_key=ident.public_key)  # any kid: the signature fails
    assert not res.ok and res.first_bad_line == 4
    code, text = run_audit_verify(str(path), ident.did)
    assert code == 1 and text.startswith("BROKEN at line 4: checkpoint")
    assert verify_chain(path).ok  # no key: only the form is checked


@pytest.mark.parametrize(
    ("payload", "typ"),
    [
        ({"line": 2, "hash": "HEAD", "timestamp": 1}, AUDIT_JWS_TYP),  # wrong line
        ({"line": 3, "hash": ZERO_HASH, "timestamp": 1}, AUDIT_JWS_TYP),  # wrong hash
        ({"line": 3, "hash": "HEAD", "timestamp": 1, "x": 1}, AUDIT_JWS_TYP),  # extra member
        ({"line": 3, "hash": "HEAD", "timestamp": 1.5}, AUDIT_JWS_TYP),  # float timestamp
        ({"line": 3, "hash": "HEAD", "timestamp": 1}, "a2a-response+jws"),  # wrong typ
    ],
)
def test_signed_but_wrong_checkpoint(
    tmp_path: Path, ident: Identity, payload: dict[str, Any], typ: str
) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 5, ident, checkpoint_every=3)
    head = _h(_lines(path)[2])
    payload = {k: head if v == "HEAD" else v for k, v in payload.items()}
    n = _replace_checkpoint(path, jws_sign(payload, ident, typ))
    for kw in ({"public_key": ident.public_key, "kid": ident.kid}, {}):
        res = verify_chain(path, **kw)  # type: ignore[arg-type]
        assert not res.ok and res.first_bad_line == n, res.reason


# -- several writers ----------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from a2a_secure.audit import Auditor, JsonlAuditLog
    from a2a_secure.identity.keys import Identity

    path, go, who = sys.argv[1], sys.argv[2], sys.argv[3]
    ident = Identity.from_seed(bytes(range(32)), "auditor")
    auditor = Auditor([JsonlAuditLog(path, ident)], role="server")
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.001)
    for i in range(200):
        auditor.record(event="intent", status="success", verified=True,
                       session_id=who, intent_goal="g" * (i % 97), sequence=i + 1)
        time.sleep(0.0005)  # let the four writers interleave
    auditor.close()
    sys.exit(1 if auditor.failures else 0)
    """
)


def test_several_processes_share_one_file(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(go), f"writer-{w}"],
            env=env,
            cwd=str(tmp_path),
        )
        for w in range(4)
    ]
    try:
        time.sleep(0.5)
        go.touch()
        codes = [p.wait(timeout=100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0, 0, 0]
    data = path.read_bytes()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in _lines(path)]  # every line is whole JSON
    events = [r for r in records if r["event"] != "checkpoint"]
    assert len(events) == 800
    for w in range(4):
        seqs = [r["sequence"] for r in events if r["session_id"] == f"writer-{w}"]
        assert seqs == list(range(1, 201))
    owners = [r["session_id"] for r in events]
    switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    cps = len(records) - 800
    assert cps >= 8
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert res.ok, res.reason
    assert res.records == len(records) and res.checkpoints == cps and res.torn_lines == ()
    # Not a correctness condition, but the test is only meaningful if writers interleaved.
    assert switches > 50


def test_threads_and_two_instances_in_one_process(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    logs = [JsonlAuditLog(path, ident, checkpoint_every=50) for _ in range(2)]
    auditor = Auditor(logs[:1], role="client")
    auditor2 = Auditor(logs[1:], role="client")

    def work(a: Auditor) -> None:
        for i in range(100):
            a.record(event="proof", status="error", error_code=-32040, sequence=i)

    threads = [threading.Thread(target=work, args=(a,)) for a in (auditor, auditor2) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    auditor.close()
    auditor2.close()
    res = verify_chain(path, public_key=ident.public_key, kid=ident.kid)
    assert res.ok and res.records - res.checkpoints == 600 and res.checkpoints >= 12


def test_forked_child_reopens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit.jsonl"
    log = JsonlAuditLog(path)
    ev = AuditEvent(timestamp=1.0, event="hello", role="server", status="success")
    log.write(ev)
    fd = log._fd
    real = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real + 1)
    log.write(ev)
    assert log._fd != fd  # a new open file description, hence its own flock
    os.close(fd)
    log.close()
    assert verify_chain(path).records == 2


def test_write_after_close_and_bad_path(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "a.jsonl")
    log.close()
    log.close()
    assert log.closed
    with pytest.raises(ValueError, match="closed"):
        log.write(AuditEvent(timestamp=1.0, event="hello", role="server", status="success"))
    with pytest.raises(OSError):
        JsonlAuditLog(tmp_path)  # a directory
    with pytest.raises(ValueError):
        JsonlAuditLog(tmp_path / "b.jsonl", checkpoint_every=0)
    assert (tmp_path / "a.jsonl").stat().st_mode & 0o777 == 0o600


def test_file_shrunk_by_someone_else(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = JsonlAuditLog(path)
    ev = AuditEvent(timestamp=1.0, event="hello", role="server", status="success")
    for _ in range(5):
        log.write(ev)
    with open(path, "r+b") as fh:
        fh.truncate(0)
    log.write(ev)
    log.close()
    lines = _lines(path)
    assert len(lines) == 1 and json.loads(lines[0])["prev_hash"] == ZERO_HASH


# -- what a record may hold ---------------------------------------------------------------


def test_record_has_only_the_section_8_members() -> None:
    names = [f.name for f in dataclasses.fields(AuditEvent)]
    # (and the two of an intent under a delegation chain, PROTOCOL.md §12.7)
    assert set(names) == set(RECORD_MEMBERS) - {"prev_hash"} | set(DELEGATION_MEMBERS)
    for banned in ("inputs", "input", "result", "results", "token", "tokens", "credentials", "jws"):
        assert banned not in names
    auditor = Auditor([MemoryAuditSink()], role="server")
    with pytest.raises(TypeError):
        auditor.record(event="intent", status="success", inputs={"a": 1})  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        auditor.record(event="intent", status="success", result="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        auditor.record("intent", "success")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        AuditEvent(  # type: ignore[call-arg]
            timestamp=1.0, event="intent", role="server", status="success", request_jws="x"
        )
    with pytest.raises(TypeError):
        AuditEvent(1.0, "intent", "server", "success")  # type: ignore[call-arg]
    ev = AuditEvent(timestamp=1.0, event="intent", role="server", status="success")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.intent_goal = "x"  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        ev.inputs = {}  # type: ignore[attr-defined]


def test_unverified_strings_are_cut_and_marked() -> None:
    sink = MemoryAuditSink()
    auditor = Auditor([sink], role="server", clock=lambda: 1234.5)
    long = "x" * 5000
    ev = auditor.record(
        event="reject",
        status="error",
        error_code=-32602,
        session_id=long,
        client_did="did:web:" + long,
        server_did=long,
        intent_goal=long,
    )
    assert ev.verified is False and ev.timestamp == 1234.5
    for name in ("session_id", "client_did", "server_did", "intent_goal"):
        assert len(getattr(ev, name)) == 256
    rec = sink.records[0]
    assert rec["verified"] is False and rec["event"] == "reject" and rec["role"] == "server"
    assert rec["sequence"] is None and rec["duration_ms"] is None
    # Authenticated strings are not cut to 256 (a did:web may be longer).
    ok = auditor.record(event="intent", status="success", verified=True, client_did="d" * 300)
    assert ok.client_did == "d" * 300


def test_hostile_values_are_sanitized_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = JsonlAuditLog(path)
    auditor = Auditor([log], role="server")
    ev = auditor.record(
        event="reject",
        status="error",
        session_id=12345,  # type: ignore[arg-type]
        client_did="did:key:\ud800\nline\u2028break",
        intent_goal=["not", "a", "string"],  # type: ignore[arg-type]
        sequence=2**60,
        error_code=-32700,
    )
    assert ev.session_id is None and ev.intent_goal is None and ev.sequence is None
    assert ev.client_did is not None and "\ud800" not in ev.client_did
    for seq in (True, "3", -1, 1.0):
        assert auditor.record(event="intent", status="error", sequence=seq).sequence is None  # type: ignore[arg-type]
    auditor.close()
    raw = path.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 5
    assert verify_chain(path).ok


@pytest.mark.parametrize(
    "kw",
    [
        {"event": "checkpoint"},
        {"event": "bogus"},
        {"role": "peer"},
        {"status": "ok"},
        {"verified": 1},
        {"timestamp": float("nan")},
        {"timestamp": "now"},
        {"duration_ms": -1},
        {"error_code": "x"},
        {"error_code": True},
    ],
)
def test_sdk_supplied_members_are_checked(kw: dict[str, Any]) -> None:
    base: dict[str, Any] = {"timestamp": 1.0, "event": "intent", "role": "server", "status": "success"}
    with pytest.raises((TypeError, ValueError)):
        AuditEvent(**{**base, **kw})


def test_role_is_required() -> None:
    with pytest.raises(ValueError, match="role"):
        Auditor([MemoryAuditSink()]).record(event="hello", status="success")
    ev = Auditor([MemoryAuditSink()]).record(event="hello", status="success", role="client")
    assert ev.role == "client"


# -- other sinks and failures -------------------------------------------------------------


def test_sinks_satisfy_the_protocol(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "a.jsonl")
    for sink in (MemoryAuditSink(), LoggingAuditSink(), log, Auditor()):
        assert isinstance(sink, AuditSink)
    log.close()


def test_logging_sink_emits_one_json_string(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="a2a_secure.audit")
    auditor = Auditor([LoggingAuditSink()], role="client", clock=lambda: 5.0)
    ev = auditor.record(event="hello", status="success", server_did="did:key:zS", duration_ms=2)
    recs = [r for r in caplog.records if r.name == "a2a_secure.audit"]
    assert len(recs) == 1 and recs[0].levelno == logging.INFO
    msg = recs[0].getMessage()
    assert "\n" not in msg
    assert json.loads(msg) == ev.to_dict()
    assert json.loads(msg)["duration_ms"] == 2.0 and "prev_hash" not in json.loads(msg)


class _Broken:
    def __init__(self) -> None:
        self.closed = False

    def write(self, event: AuditEvent) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.closed = True
        raise OSError(5, "I/O error")


def test_sink_failure_does_not_propagate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="a2a_secure.audit_errors")
    mem = MemoryAuditSink()
    seen: list[tuple[object, Exception]] = []
    auditor = Auditor([_Broken(), mem], role="server", on_error=lambda s, e: seen.append((s, e)))
    auditor.record(event="intent", status="success")
    auditor.record(event="close", status="success")
    assert len(mem.events) == 2  # the other sink still gets every record
    assert auditor.failures == 2 and len(seen) == 2
    assert auditor.last_failure is not None and "No space left" in auditor.last_failure
    errors = [r for r in caplog.records if r.name == "a2a_secure.audit_errors"]
    assert len(errors) == 1  # rate limited: one report per minute
    assert "_Broken" in errors[0].getMessage() and "intent" in errors[0].getMessage()
    auditor.close()
    assert auditor.failures == 3 and mem.closed


def test_fail_closed_raises_after_trying_every_sink() -> None:
    mem = MemoryAuditSink()
    auditor = Auditor([_Broken(), mem], role="server", fail_closed=True)
    with pytest.raises(AuditWriteError) as info:
        auditor.record(event="intent", status="success")
    assert isinstance(info.value, InternalError) and info.value.code == -32603
    assert isinstance(info.value.__cause__, OSError)
    assert len(mem.events) == 1 and auditor.failures == 1
    with pytest.raises(AuditWriteError):
        auditor.close()


def test_closed_jsonl_sink_is_a_counted_failure(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "a.jsonl")
    auditor = Auditor([log], role="server")
    log.close()
    auditor.record(event="hello", status="success")
    assert auditor.failures == 1


def test_memory_sink() -> None:
    mem = MemoryAuditSink()
    Auditor([mem], role="server", clock=lambda: 7.0).record(event="proof", status="success")
    assert mem.records == [
        {
            "timestamp": 7.0,
            "event": "proof",
            "role": "server",
            "session_id": None,
            "client_did": None,
            "server_did": None,
            "intent_goal": None,
            "sequence": None,
            "status": "success",
            "duration_ms": None,
            "error_code": None,
            "verified": False,
        }
    ]


# -- command line -------------------------------------------------------------------------


def test_run_audit_verify(tmp_path: Path, ident: Identity, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 120, ident)
    code, text = run_audit_verify(str(path), ident.did)
    assert (code, text) == (0, "OK: 122 records (2 checkpoints), chain intact, last checkpoint at line 122")
    code, text = run_audit_verify(str(path), None)
    assert code == 0 and "signatures not checked" in text
    code, text = run_audit_verify(str(path), "did:web:example.com")
    assert code == 2 and text.startswith("error:")
    code, text = run_audit_verify(str(path), "did:key:zNotAKey")
    assert code == 2 and text.startswith("error:")
    code, text = run_audit_verify(str(tmp_path / "missing.jsonl"), None)
    assert code == 2 and "cannot read" in text
    assert audit_verify_main([str(path), "--did", ident.did]) == 0
    assert capsys.readouterr().out.startswith("OK: 122 records")
    _write_lines(path, _removed(_lines(path), 7))
    code, text = run_audit_verify(str(path), ident.did)
    assert code == 1 and text.startswith("BROKEN at line 7: ")
    assert audit_verify_main([str(path)]) == 1
    assert capsys.readouterr().err.startswith("BROKEN at line 7")


def test_checkpoint_header_is_the_profiled_one(tmp_path: Path, ident: Identity) -> None:
    path = tmp_path / "audit.jsonl"
    _fill(path, 1, ident)
    token = json.loads(_lines(path)[-1])["checkpoint"]
    header, payload, _, _ = jws_decode_unverified(token)
    assert header == {"alg": "EdDSA", "typ": AUDIT_JWS_TYP, "kid": ident.kid}
    assert payload["line"] == 1
