"""The store interface of the protocol core.

Everything the server must remember between requests goes through one ``Store``: pending
handshakes, sessions, each session's last accepted sequence with its stored answer, and
rate counters. Each method is one atomic check-and-update, so that a shared store (Redis)
can implement it as one script and several workers stay correct: a nonce is consumed once,
a sequence is accepted once, a rate counter is spent once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol, runtime_checkable

from a2a_secure.frozen import quick_init
from a2a_secure.identity import encoding
from a2a_secure.policy import Policy

__all__ = [
    "Added",
    "Begin",
    "BeginKind",
    "OpenResult",
    "PendingHandshake",
    "SessionRecord",
    "Share",
    "Store",
    "StoredReply",
    "SyncForms",
    "replaced_on_instance",
    "sync_forms",
]


@dataclass(frozen=True, slots=True)
class PendingHandshake:
    """A handshake between CHALLENGE and SESSION, found by the agent that sent the CHALLENGE
    (``server_did``) and the server's nonce ``nonce_b``."""

    nonce_b: str
    nonce_a: str
    client_did: str
    client_agent_id: str
    client_keys: Mapping[str, bytes]
    client_manifest_hash: str
    server_manifest_hash: str
    hello_hash: str
    challenge_hash: str
    policy: Policy
    policy_hash: str
    policy_signature: str
    created_at: int
    expires_at: int
    source: str = ""
    proven_kid: str | None = None
    # The agent that sent the CHALLENGE: the store keys the handshake by it, so that another
    # agent sharing the store never finds it ("" only in a store that serves one agent).
    server_did: str = ""

    def proven(self, kid: str) -> PendingHandshake:
        """The same handshake, proven with the client key ``kid``."""
        return replace(self, proven_kid=kid)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for shared stores."""
        return {
            "nonce_b": self.nonce_b,
            "nonce_a": self.nonce_a,
            "client_did": self.client_did,
            "client_agent_id": self.client_agent_id,
            "client_keys": {k: encoding.b64u_encode(v) for k, v in self.client_keys.items()},
            "client_manifest_hash": self.client_manifest_hash,
            "server_manifest_hash": self.server_manifest_hash,
            "hello_hash": self.hello_hash,
            "challenge_hash": self.challenge_hash,
            "policy": self.policy.to_dict(),
            "policy_hash": self.policy_hash,
            "policy_signature": self.policy_signature,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "source": self.source,
            "proven_kid": self.proven_kid,
            "server_did": self.server_did,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> PendingHandshake:
        """Inverse of :meth:`to_dict`."""
        data = dict(obj)
        data["client_keys"] = {k: encoding.b64u_decode(v) for k, v in data["client_keys"].items()}
        data["policy"] = Policy.from_dict(data["policy"])
        return cls(**data)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """An open session: the keys and policy pinned by its handshake."""

    session_id: str
    session_commitment: str
    client_did: str
    server_did: str
    client_kid: str
    client_key: bytes
    policy: Policy
    created_at: int
    expires_at: int
    client_agent_id: str = ""
    # The server key the session was opened with (its answers are signed with it); "" for
    # a record written before keys could rotate: the server's current key.
    server_kid: str = ""
    # Sealed intents (PROTOCOL.md §12.6): the two directional AEAD keys, 64 bytes, or b""
    # for a session that is not sealed. They live exactly as long as the session.
    seal_keys: bytes = field(default=b"", repr=False)
    # The sealer built from ``seal_keys`` the first time this record is used (its two AEAD
    # contexts cost more than the AEAD itself); it lives and goes with the record.
    sealer: Any = field(default=None, compare=False, repr=False)

    def expired(self, now: float) -> bool:
        """PROTOCOL.md §5.6: expired when ``now >= expires_at`` (absolute lifetime)."""
        return now >= self.expires_at

    def drop_sealer(self) -> None:
        """Forget the sealer cached on this record (its store is forgetting the record).

        A request still running on the session holds its own reference and finishes; a
        later use of this very record builds the sealer again from ``seal_keys``.
        """
        object.__setattr__(self, "sealer", None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for shared stores."""
        return {
            "session_id": self.session_id,
            "session_commitment": self.session_commitment,
            "client_did": self.client_did,
            "server_did": self.server_did,
            "client_kid": self.client_kid,
            "client_key": encoding.b64u_encode(self.client_key),
            "policy": self.policy.to_dict(),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "client_agent_id": self.client_agent_id,
            "server_kid": self.server_kid,
            **({"seal_keys": encoding.b64u_encode(self.seal_keys)} if self.seal_keys else {}),
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> SessionRecord:
        """Inverse of :meth:`to_dict`."""
        data = dict(obj)
        data["client_key"] = encoding.b64u_decode(data["client_key"])
        if "seal_keys" in data:
            data["seal_keys"] = encoding.b64u_decode(data["seal_keys"])
        data["policy"] = Policy.from_dict(data["policy"])
        return cls(**data)


@quick_init  # built for every answer
@dataclass(frozen=True, slots=True)
class StoredReply:
    """The answer to an accepted request, kept for a byte-identical retry (§6.1 step 7).

    With ``signed_at`` set, the answer is kept unsigned: ``result`` is the handler's result,
    or ``error`` the error's code, message and data besides ``response_jws``, and the engine
    signs it again with that timestamp on a retry (Ed25519 signatures are deterministic, so
    the token is the same). Without it, ``result``/``error`` are the reply as sent. For a
    streamed answer (§6.4) ``events`` holds the kept events' ``result`` objects in order,
    and ``truncated`` says that later events did not fit the replay bound.
    """

    http_status: int
    result: Any = None
    error: Mapping[str, Any] | None = None
    events: tuple[Mapping[str, Any], ...] | None = None
    truncated: bool = False
    signed_at: int | None = None
    # ``encoding.dumps(self.to_dict())``, when the reply was written as JSON already (a
    # success carries its result's JSON): the answer is then serialised once per intent.
    # Not an argument: a copy made with ``dataclasses.replace`` has other members, and
    # starts without it.
    encoded: bytes | None = field(default=None, init=False, compare=False, repr=False)

    def with_json(self, encoded: bytes) -> StoredReply:
        """This reply, knowing that ``encoded`` is its :meth:`to_json` (a cache, set once)."""
        object.__setattr__(self, "encoded", encoded)
        return self

    def to_json(self) -> bytes:
        """``encoding.dumps(self.to_dict())``: how every store keeps the answer."""
        return self.encoded if self.encoded is not None else encoding.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for shared stores (members left out when empty)."""
        out: dict[str, Any] = {"http_status": self.http_status}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        if self.events is not None:
            out["events"] = list(self.events)
            out["truncated"] = self.truncated
        if self.signed_at is not None:
            out["signed_at"] = self.signed_at
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> StoredReply:
        """Inverse of :meth:`to_dict`."""
        events = obj.get("events")
        return cls(
            obj["http_status"],
            obj.get("result"),
            obj.get("error"),
            tuple(events) if events is not None else None,
            bool(obj.get("truncated", False)),
            obj.get("signed_at"),
        )


class BeginKind(enum.Enum):
    """The decision of :meth:`Store.begin_request` (§6.1 steps 7 and 8, atomically)."""

    NEW = "new"  # sequence accepted and consumed, rate counted: run the intent
    REPLAY = "replay"  # byte-identical retry of the last request: answer with ``reply``
    IN_PROGRESS = "in_progress"  # byte-identical retry while the original still runs
    STALE = "stale"  # replayed or out of order (-32044)
    RATE_LIMITED = "rate_limited"  # over the limit: nothing consumed (-32048)
    GONE = "gone"  # the session closed or expired meanwhile (-32043)
    REVOKED = "revoked"  # the client DID or key id is revoked: the session is gone (-32043)


@quick_init  # built for every request
@dataclass(frozen=True, slots=True)
class Begin:
    """What :meth:`Store.begin_request` decided, with what the engine needs to answer."""

    kind: BeginKind
    last_sequence: int = 0
    reply: StoredReply | None = None
    retry_after: int = 0


class Share(int):
    """A caller's part of a shared bound (the number of entries it may see there), which
    remembers the ``whole`` bound: a store that splits a bound into shards (a spread Redis
    Cluster) splits it as for every caller, and holds this caller to its part of each."""

    whole: int

    def __new__(cls, value: int, whole: int) -> Share:
        share = super().__new__(cls, value)
        share.whole = whole
        return share


class Added(enum.Enum):
    """The outcome of adding an entry under a bound (``add_pending``, ``add_action``).

    True only for ADDED, so that ``if not added`` reads as before; a refusal says whether the
    caller's own quota (per source address or per caller DID) or the total bound was full.
    """

    ADDED = "added"
    OWN_FULL = "own_full"
    TOTAL_FULL = "total_full"
    TAKEN = "taken"  # the id exists already (a random id: in practice never)

    def __bool__(self) -> bool:
        return self is Added.ADDED


class OpenResult(enum.Enum):
    """The outcome of :meth:`Store.open_session`."""

    OPENED = "opened"
    HANDSHAKE_GONE = "handshake_gone"  # unknown, expired, unproven or already used (-32041)
    FULL = "full"  # too many open sessions (-32048)


@runtime_checkable
class Store(Protocol):
    """Server state, one atomic operation per method. ``now`` is Unix seconds.

    Several agents may share one store. ``agent`` (the server DID) names the agent a call is
    for: a pending handshake, a rate window, an intent id claim is found only by the agent
    it belongs to (SECURITY.md, "Agents sharing one store"). A session is found by its
    random id at every agent, and names its agent in ``server_did``, which the engine
    checks before anything else (§6.1 step 2).
    """

    async def add_pending(
        self, pending: PendingHandshake, *, max_per_source: int, max_total: int, now: float
    ) -> Added:
        """Store a new pending handshake of the agent ``pending.server_did``; a false
        :class:`Added` (nothing stored) when a bound is reached, saying which.

        Entries still inside their 60 s window are never evicted to make room.
        """
        ...

    async def get_pending(self, nonce_b: str, now: float, *, agent: str = "") -> PendingHandshake | None:
        """The pending handshake of ``agent`` for ``nonce_b`` if it exists and has not expired."""
        ...

    async def mark_proven(self, nonce_b: str, kid: str, now: float, *, agent: str = "") -> bool:
        """Mark the handshake proven with ``kid``; False if unknown, expired or already proven."""
        ...

    async def open_session(
        self, nonce_b: str, session: SessionRecord, *, max_sessions: int, now: float, agent: str = ""
    ) -> OpenResult:
        """Consume ``agent``'s proven pending handshake and create ``session``, atomically."""
        ...

    async def get_session(self, session_id: str, now: float) -> SessionRecord | None:
        """The open, unexpired session, or None."""
        ...

    async def begin_request(
        self,
        session_id: str,
        client_did: str,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        rate_period: int,
        now: float,
        agent: str = "",
    ) -> Begin:
        """§6.1 steps 7-8 as one atomic check-and-update (``rate_limit`` None: not counted).

        The rate window is ``agent``'s for ``client_did``: each agent's limit is its own.
        """
        ...

    async def finish_request(self, session_id: str, sequence: int, reply: StoredReply) -> None:
        """Store the answer to the accepted ``sequence`` (if it is still the last one)."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Forget the session: it is unknown from now on."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class SyncForms(NamedTuple):
    """A store's synchronous forms of the three per-intent operations (see :func:`sync_forms`)."""

    get_session: Callable[[str, float], SessionRecord | None]
    begin_request: Callable[..., Begin]
    finish_request: Callable[[str, int, StoredReply], None]


_SYNC_NAMES = ("get_session", "begin_request", "finish_request")
_SYNC_BY_TYPE: dict[type, bool] = {}


def sync_forms(store: object) -> SyncForms | None:
    """``store``'s ``get_session_now``, ``begin_request_now`` and ``finish_request_now``, for a
    store that never suspends (:class:`~a2a_secure.store.memory.MemoryStore`), else None.

    Each ``*_now`` is the whole of its coroutine method, without the coroutine: the intent
    path then awaits nothing for them. A store that waits on I/O (Redis) has none. They are
    used only while the coroutine method is still the one declared beside them: a subclass
    or an instance that replaces ``get_session`` (a test's failing store) is awaited as it says.
    """
    cls = type(store)
    ok = _SYNC_BY_TYPE.get(cls)
    if ok is None:
        ok = all(_declared_together(cls, name) for name in _SYNC_NAMES)
        _SYNC_BY_TYPE[cls] = ok
    if not ok or replaced_on_instance(store):
        return None
    return SyncForms(
        store.get_session_now,  # type: ignore[attr-defined]
        store.begin_request_now,  # type: ignore[attr-defined]
        store.finish_request_now,  # type: ignore[attr-defined]
    )


def replaced_on_instance(store: object) -> bool:
    """Whether one of the per-intent coroutine methods was replaced on ``store`` itself."""
    own = getattr(store, "__dict__", None)
    if not own:
        return False
    return "get_session" in own or "begin_request" in own or "finish_request" in own


def _declared_together(cls: type, name: str) -> bool:
    sync_name = f"{name}_now"
    for klass in cls.__mro__:
        has_async, has_sync = name in vars(klass), sync_name in vars(klass)
        if has_async or has_sync:
            return has_async and has_sync
    return False
