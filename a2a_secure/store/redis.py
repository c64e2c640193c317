"""A shared store on Redis, so that several server processes serve one agent.

Every :class:`~a2a_secure.store.base.Store` method is ONE round trip and atomic: a Lua
script run with ``EVALSHA`` (registered with redis-py's ``register_script``, re-loaded by
redis-py on ``NOSCRIPT`` after a Redis restart). Semantics are those of
:class:`~a2a_secure.store.memory.MemoryStore`:

* **Logical time is the ``now`` argument.** Every expiry decision compares the stored
  ``expires_at`` with ``now``; Redis TTLs (``expires_at - now`` plus one second of slack)
  only reclaim memory, so a wall clock that differs from ``now`` never changes an answer.
* **Expired is gone for good.** A call that finds an entry expired deletes it, as
  ``MemoryStore`` forgets it, so a caller whose clock is behind does not revive it.
* **Bounds never evict a live entry.** Pending handshakes sit in sorted sets scored by
  ``expires_at`` (one per source, one global); sessions in one sorted set. A script first
  drops members with ``score <= now`` and then counts, so a bound is exact and an expired
  entry stops counting as soon as it expires, without a sweeper.
* **A session is one hash** ``s:<session_id>``: ``r`` its compact record, ``e`` its
  ``expires_at``, ``l`` the last accepted sequence, ``h`` that request's hash (32 raw
  bytes), ``y`` the stored reply once the request finished. About 0.6 KiB in Redis.
* **Rate counters** are fixed windows per (agent, client DID, period):
  ``r:<agent>|<did>:<period>:<window start>``, checked before the increment, expiring with
  the window.
* **Agents sharing a prefix.** A key of a pending handshake (``p:<nonce_b>:<agent>``), a
  rate window or an ``intent_id`` claim names its agent (the server DID), so that another
  agent never finds it; a session is found by its random id and its record names the agent,
  which the engine checks. Capacity bounds (``ps:``, ``pa``, ``sa``, ``ix``) and the deny
  list (``rv:``) are the store's. The table is in SECURITY.md ("Agents sharing one store").

**Failures.** Any Redis error (connection refused or reset, timeout, loading, OOM, read-only
replica, a script error) raises :class:`~a2a_secure.errors.Unavailable` (-32048, HTTP 503,
``Retry-After: 1``), and so does any other exception raised inside redis-py (while a
cluster fails over, its cluster client can fail with an ``AttributeError``, or on uvloop a
``RuntimeError``, on a connection it closed under the call): the outcome of that call is
unknown, as after a lost connection, and it is logged at ERROR by type and place. An
exception of this module's own code is a bug and goes up as one. A script either runs
whole or not at all, so there is never a half-written state. After a connection error the
pool's idle connections are dropped too, and redis-py connects afresh on the next call: the
store works again as soon as Redis is back, without a restart (scripts are re-loaded on
``NOSCRIPT``). The client is built WITHOUT command retries on purpose: re-sending a script
after a timeout whose first attempt did run would, for ``begin_request``, turn a new
request into a retry of itself. The one ambiguous case left is a timeout on a
``begin_request`` that did run: its sequence is then consumed without an answer, its
retries get 503 until the engine's replay wait ends, and the client must move on to a new
sequence; the intent itself never runs twice.

**Round trips per intent.** ``get_session`` is served from a small per-process cache of the
session records (they never change once opened); ``begin_request``'s script re-checks that
the session still exists, so a close or an expiry seen by another worker still wins (the
answer is then a signed -32043 instead of an unsigned one). ``session_cache_ttl=0`` turns
the cache off. ``finish_request`` does not wait for Redis: the answer is queued and sent in
one pipeline with this process's next command (by SHA; a command refused with NOSCRIPT did
not run and is sent again alone), or on its own after ``finish_linger`` (20 ms) when no
command comes first. An intent therefore costs one round trip (``begin_request``, carrying
the answer to the request before it), two on a worker's first request of a session or
after a pause; one with an ``intent_id`` three (its claim, its start, and its answer kept
before it is sent: ``finish_intent`` does not linger). Until its answer is sent, a retry
that reaches another worker finds the request still running and waits (§6.1 step 7); a
worker that dies in those milliseconds loses the session's answer, as a failed
``finish_request`` did before. ``finish_linger=None`` stores
every answer before ``finish_request`` returns.

**Cluster and Sentinel.** ``redis+cluster://host:port[,host:port…]`` (or a
``redis.asyncio.cluster.RedisCluster`` client) spreads the state over the cluster: every
script touches one slot, each key carries the hash tag of its session, client DID, pending
handshake or source address, and the global bounds are sharded; the layout, the order of
the scripts of an operation that spans slots, and what a failure between them leaves are
in :mod:`a2a_secure.store.redis_cluster`. An intent is still one round trip (its session's
script and its DID's rate window, with the claim of its ``intent_id`` if it has one, go in
one pipeline, to two nodes in parallel when needed).
A prefix with its own hash tag (``"{a2a}:"``) keeps the older layout: every key in that one
slot. ``redis+sentinel://host:port[,host:port…]/service`` follows the primary that Sentinel
names. The URL forms are in :mod:`a2a_secure.store.redis_connect`. A cluster that is down
or failing over (``CLUSTERDOWN``, a primary unreachable, ``TRYAGAIN`` past redis-py's own
retries) is an outage like any other: 503 with ``Retry-After``; the slot map is read again
in the background so that the promoted replica is used as soon as it takes over.

**Replication.** Redis replicates asynchronously: a write the primary acknowledged can be
lost when it fails before its replicas have it (a consumed sequence, a stored answer).
``wait_replicas=N`` sends ``WAIT N wait_timeout_ms`` on the same connection, in the same
round trip, after each ``begin_request`` and each stored answer: a request whose sequence
the replicas did not confirm is refused with 503 before its intent runs.

**Layout.** This module holds the connection, the pipelining of queued answers and the
outage handling; :class:`RedisStore` composes one mixin per family of keys, each module
owning its key space, its scripts and its methods: :mod:`~a2a_secure.store.redis_keys`
(key names and prefix rules, shared encodings), :mod:`~a2a_secure.store.redis_handshakes`,
:mod:`~a2a_secure.store.redis_sessions` (sessions, sequences, stored answers, rate
windows), :mod:`~a2a_secure.store.redis_intents` (with
:mod:`~a2a_secure.store.redis_claims`), :mod:`~a2a_secure.store.redis_actions`,
:mod:`~a2a_secure.store.redis_revocations`; the cluster layout is in
:mod:`~a2a_secure.store.redis_cluster`, the URL forms in
:mod:`~a2a_secure.store.redis_connect`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from a2a_secure.store import redis_claims as rcl
from a2a_secure.store import redis_cluster as rc
from a2a_secure.store.base import SessionRecord
from a2a_secure.store.expiry import ExpiryIndex
from a2a_secure.store.redis_actions import _ADD_ACTION, _DECIDE_ACTION, _GET_ACTION, RedisActions
from a2a_secure.store.redis_connect import Deployment, client_from_url, shown_url
from a2a_secure.store.redis_handshakes import _ADD_PENDING, _GET_PENDING, _MARK_PROVEN, RedisHandshakes
from a2a_secure.store.redis_intents import _BEGIN_INTENT, RedisIntents
from a2a_secure.store.redis_keys import _has_hash_tag, _num
from a2a_secure.store.redis_link import RedisLink
from a2a_secure.store.redis_revocations import (
    _ADD_REVOCATION,
    _BEGIN_READING_EPOCH,
    _REMOVE_REVOCATION,
    _REVOCATION_GUARD,
    _REVOKED_FIELDS,
    RedisRevocations,
)
from a2a_secure.store.redis_sessions import (
    _BEGIN_REQUEST,
    _CLOSE_SESSION,
    _FINISH_REQUEST,
    _GET_SESSION,
    _OPEN_SESSION,
    RedisSessions,
)
from a2a_secure.system import wall_now

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.commands.core import AsyncScript

__all__ = ["RedisStore"]

_log = logging.getLogger("a2a_secure.store.redis")


def _import_redis() -> Any:
    try:
        import redis.asyncio as redis_asyncio  # noqa: PLC0415 - optional extra
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("RedisStore needs the redis extra: pip install 'a2a-secure[redis]'") from exc
    return redis_asyncio


class RedisStore(RedisSessions, RedisIntents, RedisHandshakes, RedisActions, RedisRevocations, RedisLink):
    """:class:`~a2a_secure.store.base.Store` on Redis, shared by every worker of one agent.

    ``url`` is one Redis (``redis://``, ``rediss://``, ``unix://``), a Redis Cluster
    (``redis+cluster://host:port[,host:port…]``) or a primary behind Sentinel
    (``redis+sentinel://host:port[,host:port…]/service``); the forms are in
    :mod:`a2a_secure.store.redis_connect`. ``prefix`` starts every key, so several agents
    can share one Redis. ``socket_timeout`` bounds connecting and each command (seconds):
    past it the call answers 503. ``client`` is a ready ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster`` (bytes replies, ideally without command retries,
    see the module documentation); the store does not close a client it was given.

    ``wait_replicas`` (0 = off) and ``wait_timeout_ms``: after each ``begin_request`` and
    each stored answer, ``WAIT`` for that many replicas in the same round trip; a new
    request the replicas did not confirm in time is refused (503) before its intent runs.
    It costs the replication delay on every intent, and up to ``wait_timeout_ms`` when a
    replica lags or is down.

    ``session_cache_ttl`` (seconds, 0 = off) and ``session_cache_size`` bound the
    per-process cache of session records used by :meth:`get_session`.

    ``finish_linger`` (seconds): :meth:`finish_request` does not wait for Redis. The answer
    goes in the same round trip as this process's next command (so an intent costs one
    round trip), or on its own after ``finish_linger`` if no command comes first. Until
    then, a retry that reaches another worker finds the request still running and waits
    for the answer (§6.1 step 7). ``None`` stores each answer before ``finish_request``
    returns, in a round trip of its own.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "a2a:",
        socket_timeout: float = 1.0,
        client: Redis | RedisCluster | None = None,
        session_cache_ttl: float = 30.0,
        session_cache_size: int = 10_000,
        finish_linger: float | None = 0.02,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
    ) -> None:
        _import_redis()
        if any(type(v) is not int or v < 0 for v in (wait_replicas, wait_timeout_ms)):
            # A float or a bool would reach WAIT and fail every intent (503) at run time.
            raise ValueError("wait_replicas and wait_timeout_ms must be integers, not negative")
        if client is None:
            client, deployment = client_from_url(url, socket_timeout=socket_timeout)
            self._owns_client = True
        else:
            from redis.asyncio.cluster import RedisCluster as _Cluster  # noqa: PLC0415

            deployment = Deployment.CLUSTER if isinstance(client, _Cluster) else Deployment.SINGLE
            self._owns_client = False
        self.deployment = deployment
        # Where the store connects, as an operator may read it (no password): named by check().
        self.shown_url = shown_url(url) if self._owns_client else f"a given {type(client).__name__} client"
        self._cluster = deployment is Deployment.CLUSTER
        # On a cluster, every key carries its own hash tag (redis_cluster.py), unless the
        # prefix has one: then the older layout (every key in that one slot) is kept.
        self._spread = self._cluster and not _has_hash_tag(prefix)
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms
        self.prefix = prefix
        self._r: Any = client
        self._add_pending = client.register_script(_ADD_PENDING)
        self._get_pending = client.register_script(_GET_PENDING)
        self._get_session = client.register_script(_GET_SESSION)
        self._mark_proven = client.register_script(_MARK_PROVEN)
        self._open_session = client.register_script(_OPEN_SESSION)
        self._begin_request = client.register_script(_BEGIN_REQUEST)
        self._begin_request_guarded = client.register_script(_REVOCATION_GUARD + _BEGIN_REQUEST)
        self._begin_reading_epoch = client.register_script(_BEGIN_READING_EPOCH)
        self._add_revocation = client.register_script(_ADD_REVOCATION)
        self._remove_revocation = client.register_script(_REMOVE_REVOCATION)
        self._c_revoked = client.register_script(_REVOKED_FIELDS)
        self._finish_request = client.register_script(_FINISH_REQUEST)
        self._close_session = client.register_script(_CLOSE_SESSION)
        self._begin_intent = client.register_script(_BEGIN_INTENT)
        self._get_claim = client.register_script(rcl.GET_CLAIM)
        self._finish_intent = client.register_script(rcl.FINISH_INTENT)
        self._start_intent = client.register_script(rcl.START_INTENT)
        self._renew_intent = client.register_script(rcl.RENEW_INTENT)
        self._add_action = client.register_script(_ADD_ACTION)
        self._get_action = client.register_script(_GET_ACTION)
        self._decide_action = client.register_script(_DECIDE_ACTION)
        self._c_reserve = client.register_script(rc.RESERVE)
        self._c_release = client.register_script(rc.RELEASE)
        self._c_add_pending = client.register_script(rc.ADD_PENDING)
        self._c_get_pending = client.register_script(rc.GET_PENDING)
        self._c_mark_proven = client.register_script(rc.MARK_PROVEN)
        self._c_take_pending = client.register_script(rc.TAKE_PENDING)
        self._c_open = client.register_script(rc.OPEN)
        self._c_get_session = client.register_script(rc.GET_SESSION)
        self._c_begin = client.register_script(rc.BEGIN)
        self._c_unbegin = client.register_script(rc.UNBEGIN)
        self._c_rate = client.register_script(rc.RATE)
        self._c_unrate = client.register_script(rc.UNRATE)
        self._c_finish = client.register_script(rc.FINISH)
        self._c_close_session = client.register_script(rc.CLOSE_SESSION)
        self._c_claim = client.register_script(rcl.CLAIM)
        self._c_unclaim = client.register_script(rcl.UNCLAIM)
        self._scripts_in_use = (
            [
                self._c_reserve,
                self._c_release,
                self._c_add_pending,
                self._c_get_pending,
                self._c_mark_proven,
                self._c_take_pending,
                self._c_open,
                self._c_get_session,
                self._c_begin,
                self._c_unbegin,
                self._c_rate,
                self._c_unrate,
                self._c_finish,
                self._c_close_session,
                self._c_revoked,
                self._c_claim,
                self._c_unclaim,
            ]
            if self._spread
            else [
                self._add_pending,
                self._get_pending,
                self._get_session,
                self._mark_proven,
                self._open_session,
                self._begin_request,
                self._begin_request_guarded,
                self._begin_reading_epoch,
                self._finish_request,
                self._close_session,
                self._begin_intent,
            ]
        ) + [
            self._add_action,
            self._get_action,
            self._decide_action,
            self._add_revocation,
            self._remove_revocation,
            self._get_claim,
            self._finish_intent,
            self._start_intent,
            self._renew_intent,
        ]
        self._loaded = False
        self._loading: asyncio.Future[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._last_refresh = -math.inf
        self._cache_ttl = session_cache_ttl
        self._cache_size = session_cache_size
        # Session id -> (monotonic end of its cache entry, record), in order of that end
        # (a put moves it last), and the same ids by the sessions' own Unix expiry.
        self._cache: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()
        self._cache_expiry = ExpiryIndex()
        self._last_logged = -math.inf
        self._unexpected_logged: dict[str, float] = {}
        # Answers not yet sent to Redis: key -> (the script that stores it, its arguments);
        # a session's answer (sequence, reply JSON) or an intent_id's (intent hash, JSON).
        self._finish_linger = finish_linger
        self._unsent: dict[str, tuple[AsyncScript, list[Any]]] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        # Answers on their way to Redis: session key -> done when their round trip ends. A
        # command about that session waits for it (it would overtake them on another
        # connection of the pool, and miss the answer this process has already given).
        self._sending: dict[str, asyncio.Future[None]] = {}
        self.round_trips = 0  # network round trips to Redis (tests and metrics)
        self.commands = 0  # commands sent to Redis, several per round trip when pipelined

    @property
    def client(self) -> Redis | RedisCluster:
        """The redis-py client in use (a ``RedisCluster`` on a cluster)."""
        client: Redis | RedisCluster = self._r
        return client

    async def check(self) -> None:
        """Whether Redis answers now; ``ConnectionError`` naming :attr:`shown_url` if not.

        What a server runs at start, so that a Redis that is down is said once, naming the
        URL, instead of every request failing with -32048 "shared store unavailable".
        """
        try:
            await self._r.ping()
        except Exception as exc:  # any failure to reach it: the store cannot be used
            reason = str(exc).strip() or type(exc).__name__
            raise ConnectionError(f"Redis at {self.shown_url} does not answer ({reason[:200]})") from None

    # -- introspection (tests, metrics) ---------------------------------------------------------
    async def counts(self, now: float | None = None) -> dict[str, int]:
        """Live pending handshakes and sessions (members of the sorted sets not yet expired)."""
        t = _num(wall_now() if now is None else now)
        if self._spread:
            pending_keys = [self._k_pending_shard(i) for i in range(rc.MAX_SHARDS)]
            session_keys = [self._k_session_shard(i) for i in range(rc.MAX_SHARDS)]
        else:
            pending_keys, session_keys = [self._k_pending_all()], [self._k_sessions()]
        async with self._outage():
            pipe = self._r.pipeline(transaction=False)
            for key in (*pending_keys, *session_keys):
                pipe.zcount(key, f"({t}", "+inf")
            out = [int(n) for n in await pipe.execute()]
        return {"pending": sum(out[: len(pending_keys)]), "sessions": sum(out[len(pending_keys) :])}
