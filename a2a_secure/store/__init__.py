"""Server state: the store interface and the embedded in-memory store."""

from a2a_secure.store.base import (
    Begin,
    BeginKind,
    OpenResult,
    PendingHandshake,
    SessionRecord,
    Store,
    StoredReply,
)
from a2a_secure.store.memory import MemoryStore

__all__ = [
    "Begin",
    "BeginKind",
    "MemoryStore",
    "OpenResult",
    "PendingHandshake",
    "SessionRecord",
    "Store",
    "StoredReply",
]
