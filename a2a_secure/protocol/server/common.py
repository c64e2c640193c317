"""What every room of the server core shares: its bounds, its reply value, its methods.

Implements the routing table of PROTOCOL.md §4 (which endpoint serves which method), the
bounds of §9 (:class:`ServerLimits`, and the -32045 of a stale timestamp). :class:`Reply`
is what any room hands back to the adapter: a JSON-RPC ``result`` or ``error`` member, its
HTTP status, and for §6.4 the stream of events. :class:`ServerConfig` is what one server
is configured with; the rooms share it and own no copy of it. No state lives here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from a2a_secure.checks import require_did
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import StaleTimestamp, log_unexpected
from a2a_secure.frozen import quick_init
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import Policy
from a2a_secure.protocol.capacity import DEFAULT_RESERVED_SHARE, Reserved, limit_for
from a2a_secure.protocol.keyguard import KeyGuard
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server.dispatcher import IntentDispatcher
from a2a_secure.store.base import Store, StoredReply
from a2a_secure.system import MonoClock, WallClock

__all__ = [
    "HANDSHAKE_METHODS",
    "INTENT_METHODS",
    "AuditHook",
    "Clock",
    "MonoClock",
    "RandomSource",
    "Reply",
    "ServerConfig",
    "ServerLimits",
    "endpoint_of",
    "log_unexpected",
    "stale",
]

HANDSHAKE_METHODS = frozenset(("hello", "proof", "accept_policy"))
INTENT_METHODS = frozenset(("intent", "close"))

AuditHook = Callable[..., object]
Clock = WallClock  # Unix seconds; the monotonic clock is a MonoClock (a2a_secure.system)
RandomSource = Callable[[int], bytes]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Capacity and timing bounds; the defaults are those of PROTOCOL.md §9."""

    max_pending_per_source: int = 256
    max_pending_total: int = 10_000
    max_sessions: int = 100_000
    max_handler_timeout_ms: int = 30_000
    replay_wait_seconds: float = 5.0
    max_streams_total: int = 1000
    max_streams_per_did: int = 32
    allow_self_handshake: bool = False
    # Failed PROOF / ACCEPT_POLICY steps that cost a signature verification, per source
    # address: a bucket of ``burst`` failures that
    # refills at ``per_second``; when empty, further PROOFs and ACCEPTs from that source get
    # 503 before any signature check (ATTACKS.md H4). Honest clients rarely fail, so the
    # throughput of valid handshakes from one host is not limited.
    failed_handshake_burst: int = 100
    failed_handshake_per_second: float = 50.0
    # The intent_id extension (runtime/exactly_once.py): how long (s) the answer to an
    # intent_id is remembered after its first request (0 = the extension is off), and how
    # many unexpired intent_ids one client DID may hold (then 503, never an eviction).
    intent_id_retention: int = 86_400
    max_intent_ids_per_did: int = 10_000
    # How long (s) past the handler timeout a claim whose run started and never reported
    # stays RUNNING (a resend waits) before it is LOST (a resend is told "outcome unknown"):
    # the answer's way to the store and the clock differences between workers must fit in
    # it. Lower, an unanswerable id is told so sooner; too low, a slow answer is not waited for.
    claim_lease_margin: int = 60
    # ... and how many the store keeps in all, for every DID and every agent sharing it (its
    # memory, as ``max_sessions`` bounds the sessions'): past it, 503 for a new id, nothing
    # consumed. A DID costs nothing (did:key), so the per-DID bound alone bounds nothing.
    max_intent_ids_total: int = 100_000
    # Intent priority (PROTOCOL.md §12.3): at most this many handlers of this agent run at
    # once in this process, the others wait in one priority queue of at most
    # ``max_queued_intents``. None: no limit, hence no queue, and nothing to pay for it.
    max_concurrent_intents: int | None = None
    max_queued_intents: int = 100
    # Sealed intents (PROTOCOL.md §12.6, protocol/sealing.py): declared in the card, and a
    # client that brings a seal_key gets session keys; on unless turned off. A client that
    # brings none (a base-contract peer) gets an unsealed session, unless ``require_sealed``:
    # then its ACCEPT_POLICY is refused with a signed -32042.
    sealed_intents: bool = True
    require_sealed: bool = False
    # Reserved capacity (protocol/capacity.py): DIDs the operator names, besides the
    # principals, priority-rights holders and approvers the agent names already, for whom
    # ``reserved_share`` of every shared bound is kept back from strangers.
    reserved_callers: frozenset[str] = frozenset()
    reserved_share: float = DEFAULT_RESERVED_SHARE
    # How often (s) the server forgets the sessions that expired (runtime/sweeper.py), their
    # sealing keys with them, in a store that holds them in process memory; 0: only when
    # looked up again (or when the store is full).
    session_sweep_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.require_sealed and not self.sealed_intents:
            raise ValueError("require_sealed needs sealed_intents: a server that does not seal opens nothing")
        if not 0 <= self.session_sweep_seconds < float("inf"):
            raise ValueError("session_sweep_seconds must be a finite number of seconds, at least 0")
        if self.max_concurrent_intents is not None and self.max_concurrent_intents < 1:
            raise ValueError("max_concurrent_intents must be None or at least 1")
        if self.max_queued_intents < 0:
            raise ValueError("max_queued_intents must be at least 0")
        if type(self.claim_lease_margin) is not int or self.claim_lease_margin < 1:
            raise ValueError("claim_lease_margin must be an integer of at least 1 (seconds)")
        if not 0.0 <= self.reserved_share < 1.0:
            raise ValueError("reserved_share must be at least 0 and below 1")
        named = frozenset(require_did(d, "reserved caller") for d in self.reserved_callers)
        object.__setattr__(self, "reserved_callers", named)


@dataclass(slots=True)
class ServerConfig:
    """What one server is configured with, shared by all its rooms.

    Rooms read it at each use rather than copying it, so that replacing a member on a live
    ``ServerProtocol`` (a new policy offered to new handshakes, another store) reaches all
    of them. Clocks and the random source are bound by each room once instead: they are
    parameters of the protocol, not configuration.
    """

    identity: Identity
    policy: Policy
    store: Store
    resolver: DIDResolver
    dispatcher: IntentDispatcher
    manifest_hash: str
    limits: ServerLimits
    # Key lifecycle (a2a_secure.protocol.keyguard): revocations, retired keys.
    key_guard: KeyGuard = field(default_factory=KeyGuard)
    # Session id -> the retired server key that still answers it (empty unless rotated).
    retired_signers: dict[str, Identity] = field(default_factory=dict)

    def signer(self, session_id: str) -> Identity:
        """The key answering on ``session_id``: the identity, or the retired key it was opened with."""
        return self.retired_signers.get(session_id, self.identity)

    priority_rights: PriorityRights = field(default_factory=PriorityRights)
    # The delegation extension (PROTOCOL.md §12.7); None: not served (and not declared).
    delegation: DelegationRules | None = None
    # Further DIDs the application names (its approvers), read at each use.
    named_callers: Callable[[], Iterable[str]] | None = None

    def reserved(self) -> Reserved:
        """The callers for whom a share of every shared bound is kept (protocol/capacity.py)."""
        rules = self.delegation
        rights = self.priority_rights
        return Reserved(
            self.limits.reserved_callers,
            rules.required_principals if rules is not None else {},
            rights.per_did,
            rights.default,
            self.named_callers,
        )

    def limit_for(self, total: int, did: str) -> int:
        """The bound ``did`` is held to, of a shared bound of ``total`` (protocol/capacity.py)."""
        return limit_for(total, did, self.reserved(), self.limits.reserved_share)


@quick_init  # built for every answer
@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back: a JSON-RPC ``result`` or ``error`` member and the HTTP status."""

    http_status: int
    result: Any = None
    error: Mapping[str, Any] | None = None
    retry_after: int | None = None
    # A streamed answer (§6.4): the events' JSON-RPC ``result`` objects, in order.
    stream: AsyncIterator[Mapping[str, Any]] | None = None
    # Called by the adapter when the server shuts down in the middle of the stream.
    abort: Callable[[int], AsyncIterator[Mapping[str, Any]]] | None = None
    # What a byte-identical retry needs to give this very answer again (§6.1 step 7).
    stored: StoredReply | None = None
    # ``result`` written as compact JSON already (a signed success): the adapter sends it.
    result_json: bytes | None = None

    @property
    def is_error(self) -> bool:
        """True for an error reply."""
        return self.error is not None


def endpoint_of(method: str) -> Literal["handshake", "intent"] | None:
    """Which endpoint serves ``method`` (PROTOCOL.md §4), or None."""
    if method in HANDSHAKE_METHODS:
        return "handshake"
    if method in INTENT_METHODS:
        return "intent"
    return None


def stale(what: str, ts: int, now: float) -> StaleTimestamp:
    """The -32045 error for a ``what`` timestamp outside the window of §9."""
    return StaleTimestamp(f"{what} timestamp {ts} is not within 300 s of {int(now)}")
