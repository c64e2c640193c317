"""Key names, prefix rules and shared encodings of :class:`~a2a_secure.store.redis.RedisStore`.

Every key starts with the store's ``prefix`` (``P`` below; several agents may share one).
Each family of keys has its own module, which owns its scripts and its methods; the names
are all built here (:class:`RedisKeys`), so that one table says where every key lives:

==============================================  ================================================
one Redis (``P{…}`` forms: a spread cluster)    owned by
==============================================  ================================================
``p:<nonce_b>:<agent>``, ``ps:<source>``,       :mod:`~a2a_secure.store.redis_handshakes`
``pa``                                          (pending handshakes and their bounds)
``s:<session_id>``, ``sa``,                     :mod:`~a2a_secure.store.redis_sessions`
``r:<agent>|<did>:<period>:<start>``            (sessions, sequences, answers, rate windows)
``i:<agent>|<did>:<intent_id>``,                :mod:`~a2a_secure.store.redis_intents` and
``ia:<agent>|<did>``, ``ix``                    :mod:`~a2a_secure.store.redis_claims`
``act:<action_id>``, ``actc:<did>``, ``acta``   :mod:`~a2a_secure.store.redis_actions`
``rv:<did>``, ``rva``                           :mod:`~a2a_secure.store.redis_revocations`
==============================================  ================================================

**Prefix rules.** A key of a pending handshake, a rate window or an ``intent_id`` claim
names its agent (the server DID), after a ``|`` that no DID holds (or, for a handshake,
after the base64url nonce, which holds no ``:``), so that another agent sharing the prefix
never finds it; a session and an action are found by their random ids and their records
name the agent, which the engine checks; the bounds and the deny list are the store's
(SECURITY.md, "Agents sharing one store"). On a spread cluster every key carries the hash
tag of what it belongs to (its session, client DID, handshake or source address, or a
fixed shard tag), so that each script touches one slot: the table is in
:mod:`~a2a_secure.store.redis_cluster`. A prefix with its own hash tag (``"{a2a}:"``) keeps
the single-Redis names.

**Shared encodings.** Script arguments carry ``now`` as :func:`_num` writes it (never
Redis' TIME); every TTL is :func:`_ttl_ms` (the logical expiry plus one second of slack:
TTLs only reclaim memory, every expiry decision compares ``expires_at`` with ``now``);
request and intent hashes are stored as 32 raw bytes (:func:`_request_hash_bytes`).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections import OrderedDict
    from collections.abc import Sequence
    from contextlib import AbstractAsyncContextManager

    from redis.commands.core import AsyncScript

    from a2a_secure.errors import Unavailable
    from a2a_secure.store.base import Begin, SessionRecord
    from a2a_secure.store.expiry import ExpiryIndex
    from a2a_secure.store.intents import Claim, ClaimRequest

__all__ = ["RedisKeys"]

# Redis TTLs only reclaim memory; the slack keeps a key alive a little past its logical
# expiry so that a worker whose clock is slightly behind still finds it.
_TTL_SLACK_MS = 1000

# -- scripts ----------------------------------------------------------------------------------
# Conventions: ``now`` is ARGV, never Redis' TIME. Every check comes before the first
# write, and no script stops half-way: Redis refuses a script for OOM only at its first
# write (once a script has written, its later writes are allowed), and the scripts have no
# error path after a write.

_EXTEND = """
local function extend(key, ttl)
  local cur = redis.call('PTTL', key)
  if cur < ttl then redis.call('PEXPIRE', key, ttl) end
end
"""


class _NotReplicated(Exception):
    """The replicas did not acknowledge a write within ``wait_timeout_ms``."""

    def __init__(self, replicas: int) -> None:
        super().__init__(f"WAIT: fewer than {replicas} replica(s) acknowledged in time")


# (script, keys, args): one script call.
_Call = tuple["AsyncScript", list[Any], list[Any]]


# -- compact encodings --------------------------------------------------------------------------
_HASH_PREFIX = "sha256:"


def _pack_hash(value: str) -> str:
    # "sha256:<hex>" loses its constant prefix; anything else is kept, marked with "!".
    return value[len(_HASH_PREFIX) :] if value.startswith(_HASH_PREFIX) else "!" + value


def _unpack_hash(value: str) -> str:
    return value[1:] if value.startswith("!") else _HASH_PREFIX + value


def _request_hash_bytes(value: str) -> bytes:
    """The request hash as stored: 32 raw bytes for ``sha256:<hex>``, else its UTF-8."""
    hexpart = value[len(_HASH_PREFIX) :]
    if value.startswith(_HASH_PREFIX) and len(hexpart) == 64:
        try:
            return bytes.fromhex(hexpart)
        except ValueError:
            pass
    return b"!" + value.encode()


def _pack_kid(kid: str, did: str) -> Any:
    # did:key's kid is "<did>#<method-specific id>": stored as 0; "<did>#x" as "#x".
    if kid == f"{did}#{did.rsplit(':', 1)[-1]}":
        return 0
    if kid.startswith(did + "#"):
        return kid[len(did) :]
    return [kid]


def _unpack_kid(value: Any, did: str) -> str:
    if value == 0:
        return f"{did}#{did.rsplit(':', 1)[-1]}"
    if isinstance(value, str):
        return did + value
    return str(value[0])


def _num(now: float) -> str:
    """A number for a script argument (exact for integers, round-trip for floats)."""
    return str(int(now)) if float(now).is_integer() else repr(float(now))


def _ttl_ms(expires_at: float, now: float) -> int:
    return max(1, math.ceil((expires_at - now) * 1000)) + _TTL_SLACK_MS


def _has_hash_tag(prefix: str) -> bool:
    """Whether keys under ``prefix`` all hash to one slot (a ``{…}`` tag in the prefix)."""
    start = prefix.find("{")
    return start >= 0 and prefix.find("}", start + 2) > start


class RedisKeys:
    """The key names of every family, and what the family mixins share.

    The base of every mixin of :class:`~a2a_secure.store.redis.RedisStore`: its key
    methods read ``prefix`` and the layout (``_spread``); the declarations below (for the
    type checker only) are the state and the calls that ``RedisStore`` provides to them.
    """

    if TYPE_CHECKING:
        prefix: str
        _spread: bool
        _r: Any
        _wait_replicas: int
        _cache_ttl: float
        _cache_size: int
        _cache: OrderedDict[str, tuple[float, SessionRecord]]
        _cache_expiry: ExpiryIndex
        _finish_linger: float | None
        _unsent: dict[str, tuple[AsyncScript, list[Any]]]
        _flush_timer: asyncio.TimerHandle | None
        _flush_loop: asyncio.AbstractEventLoop | None
        _add_pending: AsyncScript
        _get_pending: AsyncScript
        _mark_proven: AsyncScript
        _open_session: AsyncScript
        _get_session: AsyncScript
        _begin_request_guarded: AsyncScript
        _begin_reading_epoch: AsyncScript
        round_trips: int
        _finish_request: AsyncScript
        _close_session: AsyncScript
        _begin_intent: AsyncScript
        _get_claim: AsyncScript
        _finish_intent: AsyncScript
        _start_intent: AsyncScript
        _renew_intent: AsyncScript
        _add_action: AsyncScript
        _get_action: AsyncScript
        _decide_action: AsyncScript
        _add_revocation: AsyncScript
        _remove_revocation: AsyncScript
        _c_revoked: AsyncScript
        _c_reserve: AsyncScript
        _c_release: AsyncScript
        _c_add_pending: AsyncScript
        _c_get_pending: AsyncScript
        _c_mark_proven: AsyncScript
        _c_take_pending: AsyncScript
        _c_open: AsyncScript
        _c_get_session: AsyncScript
        _c_begin: AsyncScript
        _c_unbegin: AsyncScript
        _c_rate: AsyncScript
        _c_unrate: AsyncScript
        _c_finish: AsyncScript
        _c_close_session: AsyncScript
        _c_claim: AsyncScript
        _c_unclaim: AsyncScript

        # RedisStore: the one place that talks to Redis.
        async def _script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any: ...
        async def _run(
            self, calls: list[_Call], *, strict: bool = True, wait: bool = False
        ) -> tuple[list[Any], bool]: ...
        async def _unavailable(self, exc: Exception) -> Unavailable: ...
        async def _quietly(self, calls: list[_Call]) -> list[Any]: ...
        def _outage(self) -> AbstractAsyncContextManager[None]: ...
        async def flush(self) -> None: ...
        def _flush_later(self) -> None: ...

        # The families' calls to one another.
        async def get_session(self, session_id: str, now: float) -> SessionRecord | None: ...
        async def close_session(self, session_id: str) -> None: ...
        def _cache_get(self, session_id: str) -> SessionRecord | None: ...
        def _cache_drop(self, session_id: str) -> None: ...
        def _cache_clear(self) -> None: ...
        def _begin_parts(
            self,
            session_id: str,
            client_did: str,
            sequence: int,
            request_hash: str,
            rate_limit: int | None,
            rate_period: int,
            now: float,
            agent: str,
        ) -> tuple[list[str], list[Any], int, int]: ...
        async def _spread_begin(
            self,
            session_id: str,
            client_did: str,
            sequence: int,
            request_hash: str,
            rate_limit: int | None,
            rate_period: int,
            now: float,
            agent: str,
            claim: ClaimRequest | None = None,
        ) -> tuple[Begin, Claim | None]: ...
        def _begin_from(
            self, out: Any, session_id: str, start: int, rate_period: int, t: int, confirmed: bool
        ) -> Begin: ...
        async def _linger(self) -> None: ...
        @staticmethod
        def _claim_from(out: Any) -> Claim: ...
        async def _revoked_fields(self, fields: Any, session_id: str, now: float) -> bool: ...

    # -- keys ------------------------------------------------------------------------------------
    # On a cluster (the spread layout) every key has the hash tag of what it belongs to; the
    # single-Redis names are unchanged. See redis_cluster.py for the table.
    # Several agents may share one prefix: a key of a pending handshake, a rate window or an
    # intent id names its agent (the server DID, ``agent``), after a '|' that no DID holds,
    # so that another agent never finds it (SECURITY.md, "Agents sharing one store").
    def _k_pending(self, agent: str, nonce_b: str) -> str:
        # nonce_b is base64url (no ':'), so the agent after it cannot change where it ends.
        if self._spread:
            return f"{self.prefix}{{p:{nonce_b}}}:{agent}"
        return f"{self.prefix}p:{nonce_b}:{agent}"

    def _k_source(self, source: str) -> str:
        return f"{self.prefix}{{ps:{source}}}" if self._spread else f"{self.prefix}ps:{source}"

    def _k_pending_all(self) -> str:
        return f"{self.prefix}pa"

    def _k_pending_shard(self, index: int) -> str:
        return f"{self.prefix}{{pa:{index}}}"

    def _k_session(self, session_id: str) -> str:
        return f"{self.prefix}{{s:{session_id}}}" if self._spread else f"{self.prefix}s:{session_id}"

    def _k_session_tag(self, session_id: str) -> str:
        """The start of keys that belong to a session: on a cluster, in the session's slot."""
        return f"{self.prefix}{{s:{session_id}}}:" if self._spread else f"{self.prefix}s:{session_id}:"

    def _k_sessions(self) -> str:
        return f"{self.prefix}sa"

    def _k_session_shard(self, index: int) -> str:
        return f"{self.prefix}{{sa:{index}}}"

    def _k_did_tag(self, did: str) -> str:
        """The start of keys that belong to a client DID: on a cluster, in the DID's slot.

        A script over several of a DID's keys (its rate window, remembered intent ids,
        a revocation entry) stays in one slot when every key is built on this.
        """
        return f"{self.prefix}{{d:{did}}}:" if self._spread else f"{self.prefix}d:{did}:"

    def _k_rate(self, agent: str, client_did: str, period: int, start: int) -> str:
        if self._spread:
            return f"{self._k_did_tag(client_did)}r:{agent}|{period}:{start}"
        return f"{self.prefix}r:{agent}|{client_did}:{period}:{start}"

    def _k_revoked(self, did: str) -> str:
        # The one place a DID's revocation key is named: in the DID's slot on a cluster.
        if self._spread:
            return f"{self._k_did_tag(did)}rv"
        return f"{self.prefix}rv:{did}"

    def _k_revocations(self) -> str:
        return f"{self.prefix}rva"

    def _k_revocation_epoch(self) -> str:
        return f"{self.prefix}rve"

    # The keys of actions waiting for approval: built here only, so a cluster layout can give
    # them hash tags of their own.
    # Creating or deciding an action touches the action, its caller's bound and the global
    # bound in one script. An approver names only the action id, so on a cluster the three
    # share one fixed tag: every action lives in one slot. Actions move at the pace of the
    # people who approve them, so that slot is never the bottleneck sessions would make it.
    def _k_action_tag(self) -> str:
        return f"{self.prefix}{{act}}:" if self._spread else self.prefix

    def _k_action(self, action_id: str) -> str:
        return f"{self._k_action_tag()}act:{action_id}"

    def _k_actions_of(self, caller_did: str) -> str:
        return f"{self._k_action_tag()}actc:{caller_did}"

    def _k_actions(self) -> str:
        return f"{self._k_action_tag()}acta"

    def _action_keys(self, action_id: str, caller_did: str) -> list[str]:
        return [self._k_action(action_id), self._k_actions_of(caller_did), self._k_actions()]

    def _k_intent(self, agent: str, client_did: str, intent_id: str) -> str:
        # A claim and its DID's bound: in the DID's slot on a cluster, with its rate window.
        if self._spread:
            return f"{self._k_did_tag(client_did)}i:{agent}|{intent_id}"
        return f"{self.prefix}i:{agent}|{client_did}:{intent_id}"

    def _k_intents(self, agent: str, client_did: str) -> str:
        if self._spread:
            return f"{self._k_did_tag(client_did)}ia:{agent}"
        return f"{self.prefix}ia:{agent}|{client_did}"

    def _k_intents_all(self) -> str:
        """The store's bound on claims (every agent, every DID): one Redis."""
        return f"{self.prefix}ix"

    def _k_intents_shard(self, index: int) -> str:
        """The store's bound on claims, shard ``index`` (spread cluster)."""
        return f"{self.prefix}{{ix:{index}}}"

    @staticmethod
    def _claim_member(claim_key: str) -> bytes:
        """A claim's member in the store's bound: 16 bytes naming its key."""
        return hashlib.sha256(claim_key.encode()).digest()[:16]
