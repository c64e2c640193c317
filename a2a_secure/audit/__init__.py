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

The package is split as the code divides: :mod:`~a2a_secure.audit.records` (the record type
and its limits), :mod:`~a2a_secure.audit.sinks` (the sink interface, the simple sinks and the
:class:`Auditor` facade with its failure policy), :mod:`~a2a_secure.audit.log` (the chained
file, its torn-line rule and its locking) and :mod:`~a2a_secure.audit.verify` (the chain
verifier and ``python -m a2a_secure.audit``). Every public name is importable from here.
"""

from a2a_secure.audit.log import JsonlAuditLog
from a2a_secure.audit.records import (
    AUDIT_JWS_TYP,
    DELEGATION_MEMBERS,
    EVENTS,
    MAX_UNVERIFIED_LENGTH,
    RECORD_MEMBERS,
    ZERO_HASH,
    AuditEvent,
    AuditRecord,
)
from a2a_secure.audit.sinks import Auditor, AuditSink, AuditWriteError, LoggingAuditSink, MemoryAuditSink
from a2a_secure.audit.verify import AuditVerifyResult, audit_verify_main, run_audit_verify, verify_chain

__all__ = [
    "AUDIT_JWS_TYP",
    "DELEGATION_MEMBERS",
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
