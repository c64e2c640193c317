"""The one place a :class:`~a2a_secure.store.redis.RedisStore` talks to Redis.

Every family mixin (sessions, intents, handshakes, actions, revocations) asks for its round
trip here: a script run (``_run``, ``_script``), a pipeline of several (``_pipelined``, with
``WAIT`` for the replicas when asked), or an answer kept for the next round trip
(``_send``/``flush``, so that an intent costs one round trip). Whatever fails on the way is
sorted here once: a failure of Redis or of redis-py is ``Unavailable`` (503) and logged at
most once a second; an exception raised by this package's own code goes up as the bug it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from a2a_secure.errors import Unavailable, log_unexpected
from a2a_secure.store.redis_connect import Deployment, close_client
from a2a_secure.store.redis_keys import RedisKeys, _Call, _NotReplicated
from a2a_secure.system import mono_now

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ["RedisLink"]

_log = logging.getLogger("a2a_secure.store.redis")


def _redis_errors() -> tuple[type[Exception], ...]:
    try:
        from redis.exceptions import RedisClusterException, RedisError  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the store cannot be built without redis
        return (OSError,)
    # SlotNotCoveredError (the slot map has a hole while a cluster fails over) is a
    # RedisClusterException, not a RedisError.
    return (RedisError, RedisClusterException, OSError)


_ERRORS = _redis_errors()


def _client_dir() -> str:
    try:
        import redis  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the store cannot be built without redis
        return "\0"
    return os.path.dirname(os.path.abspath(redis.__file__)) + os.sep


_CLIENT_DIR = _client_dir()


def _store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the store (503), rather than a bug of this module.

    A Redis error is one; so is any exception raised inside redis-py itself. Its cluster
    client is not free of races while a cluster fails over: when a node answers
    ``CLUSTERDOWN`` it closes every connection (after a timeout, a node's idle ones),
    including one another call has just taken and is about to write on; that call then
    fails with an ``AttributeError`` (no writer any more) or, on uvloop, a ``RuntimeError``
    (the transport is closed), not a ``ConnectionError``. Whatever its type, the outcome
    of that call is unknown, exactly as after a lost connection. An exception that never
    went through redis-py is this module's own bug, and goes up as one.
    """
    if isinstance(exc, _ERRORS):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_CLIENT_DIR):
            return True
        tb = tb.tb_next
    return False


class RedisLink(RedisKeys):
    """Round trips to Redis for the family mixins of ``RedisStore`` (the module's text)."""

    if TYPE_CHECKING:
        deployment: Deployment
        commands: int
        _cluster: bool
        _owns_client: bool
        _wait_timeout_ms: int
        _loaded: bool
        _loading: asyncio.Future[None] | None
        _refresh: asyncio.Task[None] | None
        _last_refresh: float
        _last_logged: float
        _unexpected_logged: dict[str, float]
        _flushes: set[asyncio.Task[None]]
        _sending: dict[str, asyncio.Future[None]]
        _scripts_in_use: list[AsyncScript]

    # -- the one place that talks to Redis ----------------------------------------------------------
    async def _unavailable(self, exc: Exception) -> Unavailable:
        from redis.exceptions import ClusterError, SlotNotCoveredError  # noqa: PLC0415
        from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415
        from redis.exceptions import TimeoutError as RedisTimeoutError  # noqa: PLC0415

        # Neither a Redis error nor the replicas' silence, so raised inside redis-py (see
        # _store_failure): its client's state is in doubt as after a lost connection, and
        # it is logged as a bug.
        unexpected = not isinstance(exc, _ERRORS) and not isinstance(exc, _NotReplicated)
        if self._cluster:
            if unexpected or isinstance(
                exc, RedisConnectionError | RedisTimeoutError | OSError | ClusterError | SlotNotCoveredError
            ):
                # A node is unreachable or the cluster is failing over: read the slot map
                # again (in the background), so that the promoted replica is used as soon
                # as it takes over. (ClusterDownError is a ClusterError.)
                self._refresh_slots()
        elif unexpected or isinstance(exc, RedisConnectionError | OSError):
            # The idle connections were most likely cut too (Redis restarted, network
            # change, Sentinel failover): drop them, so that the next call connects afresh
            # instead of failing once per stale pooled connection.
            with contextlib.suppress(Exception):
                await self._r.connection_pool.disconnect(inuse_connections=False)
        now = mono_now()
        if unexpected:
            self._log_unexpected(exc, now)
        elif now - self._last_logged >= 10.0:
            self._last_logged = now
            _log.warning("shared store unavailable: %s: %s", type(exc).__name__, str(exc)[:200])
        return Unavailable("shared store unavailable", retry_after=1)

    def _log_unexpected(self, exc: BaseException, now: float) -> None:
        """Log (ERROR) a failure of redis-py that is no Redis error: once a kind and place per 10 s.

        By type and ``file:line in function`` only: its text may quote a command's arguments.
        """
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        place = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        kind = f"{type(exc).__qualname__} {place}"
        if now - self._unexpected_logged.get(kind, -math.inf) < 10.0:
            return
        if len(self._unexpected_logged) >= 64:
            self._unexpected_logged.clear()
        self._unexpected_logged[kind] = now
        log_unexpected(_log, "shared store call failed inside redis-py (taken as an outage)", exc)

    @contextlib.asynccontextmanager
    async def _outage(self) -> AsyncIterator[None]:
        """Around a direct client call: a failure of the store (see ``_store_failure``) raises
        :class:`Unavailable`; anything else, a bug here, goes up as it is."""
        try:
            yield
        except Exception as exc:
            if not _store_failure(exc):
                raise
            raise await self._unavailable(exc) from exc

    def _refresh_slots(self) -> None:
        """Read the cluster's slot map again, at most every 200 ms, one read at a time."""
        now = mono_now()
        if (self._refresh is not None and not self._refresh.done()) or now - self._last_refresh < 0.2:
            return
        self._last_refresh = now
        self._refresh = asyncio.ensure_future(self._read_slots())

    async def _read_slots(self) -> None:
        # Failures are expected while the cluster fails over; the next error tries again.
        with contextlib.suppress(Exception):
            await self._r.nodes_manager.initialize()

    async def _script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script (with the unsent answers): its reply; any failure is Unavailable."""
        out, _ = await self._run([(script, list(keys), list(args))])
        return out[0]

    async def _run(
        self, calls: list[_Call], *, strict: bool = True, wait: bool = False
    ) -> tuple[list[Any], bool]:
        """Run ``calls`` in one round trip, with the unsent answers: (their replies, confirmed).

        ``strict``: a failed call raises Unavailable; otherwise its exception is its reply.
        ``wait``: with ``wait_replicas``, ``WAIT`` follows the calls on each connection, and
        ``confirmed`` says whether the replicas acknowledged (always True without it).
        """
        if self._sending:
            await self._after_sending([k for _, keys, _ in calls for k in keys])
        if not self._loaded:
            try:
                await self._load_scripts()
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                if strict:
                    raise await self._unavailable(exc) from exc
                return [exc] * len(calls), not (wait and self._wait_replicas)
        if not self._unsent and len(calls) == 1 and not (wait and self._wait_replicas):
            from redis.exceptions import NoScriptError  # noqa: PLC0415 - optional extra

            script, keys, args = calls[0]
            self.round_trips += 1
            self.commands += 1
            try:
                try:
                    return [await self._r.evalsha(script.sha, len(keys), *keys, *args)], True
                except NoScriptError:  # it did not run: load every script, send it again
                    await self._load_scripts()
                    self.round_trips += 1
                    self.commands += 1
                    return [await self._r.evalsha(script.sha, len(keys), *keys, *args)], True
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                if strict:
                    raise await self._unavailable(exc) from exc
                return [exc], True
        return await self._pipelined(calls, strict=strict, wait=wait)

    async def _load_scripts(self) -> None:
        """Load every script this layout uses (on every primary of a cluster).

        Loading them all at once, whenever one is missing, means that the scripts of one
        pipeline are either all known or all unknown (a restart, a promoted replica, a
        SCRIPT FLUSH forget them all): when they are all refused, they are sent again in
        the same order, so an answer is never stored after the command behind it ran.
        (Not counted in ``round_trips``: once per process and after each such event.)
        """
        self._loaded = False
        loading = self._loading
        if loading is None or loading.done() or loading.get_loop() is not asyncio.get_running_loop():
            loading = self._loading = asyncio.ensure_future(self._load_all())
        await asyncio.shield(loading)  # one load at a time, shared by every caller

    async def _load_all(self) -> None:
        if self._cluster:  # SCRIPT LOAD goes to every primary
            for script in self._scripts_in_use:
                await self._r.script_load(script.script)
        else:
            pipe = self._r.pipeline(transaction=False)
            for script in self._scripts_in_use:
                pipe.script_load(script.script)
            await pipe.execute()
        self._loaded = True

    async def _pipelined(self, calls: list[_Call], *, strict: bool, wait: bool) -> tuple[list[Any], bool]:
        """The unsent answers, then ``calls``, in one round trip; ``calls``' replies.

        The scripts are called by their SHA. A command refused with NOSCRIPT (Redis restarted,
        its script cache was flushed, or a replica was promoted) did not run: its script is
        loaded and those commands are sent again; the commands that did run are not repeated.
        """
        if self._sending:
            await self._after_sending([k for _, keys, _ in calls for k in keys])
        unsent, self._unsent = self._unsent, {}
        if self._flush_timer is not None:  # nothing left for it to send
            self._flush_timer.cancel()
            self._flush_timer = None
        if not unsent:
            return await self._send(calls, unsent, strict=strict, wait=wait)
        sent = asyncio.get_running_loop().create_future()
        for key in unsent:
            self._sending[key] = sent
        try:
            return await self._send(calls, unsent, strict=strict, wait=wait)
        finally:
            for key in unsent:
                if self._sending.get(key) is sent:
                    del self._sending[key]
            sent.set_result(None)

    async def _after_sending(self, keys: Sequence[str]) -> None:
        """Wait until the answers being sent for any of ``keys`` have reached Redis."""
        for key in keys:
            sent = self._sending.get(key)
            if sent is not None:
                await asyncio.wait((sent,))  # not cancelled with its waiter

    async def _send(
        self,
        calls: list[_Call],
        unsent: dict[str, tuple[AsyncScript, list[Any]]],
        *,
        strict: bool,
        wait: bool,
    ) -> tuple[list[Any], bool]:
        answers: list[_Call] = [(script, [key], args) for key, (script, args) in unsent.items()]
        waiting = bool(self._wait_replicas) and (wait or bool(answers))
        out, confirmed = await self._execute(answers + calls, waiting)
        # The answers that failed are lost (logged), as a failed finish_request loses its own;
        # they must not fail the calls, which did run: their outcome stands.
        lost = [r for r in out[: len(answers)] if isinstance(r, Exception)]
        if not calls:
            if lost:
                raise await self._unavailable(lost[0])
        elif lost:
            _log.warning("%d stored answer(s) lost: %s", len(lost), str(lost[0])[:200])
        if answers and not confirmed:
            _log.warning(
                "%d stored answer(s) not confirmed by %d replica(s)", len(answers), self._wait_replicas
            )
        mine = out[len(answers) :]
        if strict:
            for reply in mine:
                if isinstance(reply, Exception):
                    raise await self._unavailable(reply)
        return mine, confirmed

    async def _execute(
        self, calls: list[_Call], waiting: bool, *, reload: bool = True
    ) -> tuple[list[Any], bool]:
        """``calls`` in one pipeline (and the WAIT commands): replies or exceptions, and confirmed."""

        if not calls:
            return [], True
        from redis.exceptions import NoScriptError  # noqa: PLC0415 - optional extra

        try:
            pipe = self._r.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            waits = await self._add_waits(pipe, calls) if waiting else 0
            self.round_trips += 1
            self.commands += len(calls) + waits
            replies = list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            if not _store_failure(exc):
                raise
            # Nothing is known of any call (some may have run): each one failed.
            return [exc] * len(calls), not waiting
        out, acks = replies[: len(calls)], replies[len(calls) :]
        confirmed = all(isinstance(n, int) and n >= self._wait_replicas for n in acks)
        missing = [i for i, reply in enumerate(out) if isinstance(reply, NoScriptError)]
        if missing and reload:
            try:
                await self._load_scripts()
            except Exception as exc:
                if not _store_failure(exc):
                    raise
                for i in missing:
                    out[i] = exc
                return out, confirmed
            again, confirmed_again = await self._execute([calls[i] for i in missing], waiting, reload=False)
            for i, reply in zip(missing, again, strict=True):
                out[i] = reply
            confirmed = confirmed and confirmed_again
        return out, confirmed

    async def _add_waits(self, pipe: Any, calls: list[_Call]) -> int:
        """Queue ``WAIT`` behind the calls on each connection the pipeline uses; how many."""
        command = ("WAIT", self._wait_replicas, self._wait_timeout_ms)
        if not self._cluster:
            pipe.execute_command(*command)
            return 1
        # One connection per node: WAIT covers the writes sent before it on that connection.
        await self._r.initialize()
        nodes = {}
        for _, keys, _ in calls:
            node = self._r.get_node_from_key(keys[0])
            nodes[node.name] = node
        for node in nodes.values():
            pipe.execute_command(*command, target_nodes=node)
        return len(nodes)

    async def _quietly(self, calls: list[_Call]) -> list[Any]:
        """Compensations: run ``calls``; a failure is logged, its effect lapses by its TTL."""
        out, _ = await self._run(calls, strict=False)
        failed = [r for r in out if isinstance(r, Exception)]
        if failed:
            await self._unavailable(failed[0])  # logs, and reads the slot map again
        return out

    async def flush(self) -> None:
        """Send the answers :meth:`finish_request` has not sent yet (one round trip)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._unsent:
            await self._pipelined([], strict=True, wait=False)

    def _flush_later(self) -> None:
        self._flush_timer = None
        task = asyncio.ensure_future(self._flush_quietly())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush_quietly(self) -> None:
        # In the background nobody waits for the answer: a failure is logged (by
        # _unavailable) and the answers are lost, as a failed finish_request loses its own.
        with contextlib.suppress(Unavailable):
            await self.flush()

    async def aclose(self) -> None:
        """Send the answers not yet sent, then close the pool (if the store built its client)."""
        with contextlib.suppress(Unavailable):
            await self.flush()
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        self._cache_clear()
        if self._refresh is not None:
            with contextlib.suppress(BaseException):
                await self._refresh
        if self._owns_client:
            await close_client(self._r, self.deployment)
