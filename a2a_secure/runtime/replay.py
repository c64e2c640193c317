"""Stored answers and byte-identical replay (PROTOCOL.md §6.1 step 7, §6.4).

A request whose sequence was already accepted with the very same ``request_jws`` (same
request hash) is a retry: it gets the answer the original got, byte for byte, and the
handler does not run again. The answer comes from the :class:`StoredReply` kept in the
store (re-signed with its original timestamp: Ed25519 is deterministic, so the token is
the same), or, for a stream still running, from the live :class:`StreamRecord`. While the
original is still running and has nothing to show yet, the retry waits up to
``ServerLimits.replay_wait_seconds``, then gets 503.

State: none of its own; it reads the store and the stream pump's live streams. The wait
is why it lives in the runtime; :meth:`Replayer.from_stored` is a pure decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from a2a_secure.errors import SequenceError, Unavailable
from a2a_secure.protocol.server.auditing import AuditFields, AuditWriter
from a2a_secure.protocol.server.common import Clock, Reply, ServerConfig
from a2a_secure.protocol.server.events import EventSigner
from a2a_secure.protocol.server.replies import SignedReplies
from a2a_secure.runtime.stream_record import StreamRecord
from a2a_secure.store.base import BeginKind, StoredReply

__all__ = ["Replayer"]


class Replayer:
    """Answers a byte-identical retry with the original's answer."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        replies: SignedReplies,
        events: EventSigner,
        live: Callable[[str, int], StreamRecord | None],
        audit: AuditWriter,
        clock: Clock,
    ) -> None:
        self._config = config
        self._replies = replies
        self._events = events
        # The stream pump's live streams (StreamPump.live): a retry may join one.
        self._live = live
        self._audit = audit
        self._clock = clock

    async def answer(
        self,
        session_id: str,
        sequence: int,
        req_hash: str,
        stored: StoredReply | None,
        audit: AuditFields,
        *,
        sealed: bool = False,
    ) -> Reply:
        """The original's answer; ``stored`` is None while the original is still running.

        ``sealed``: the session is sealed, so a stored success's result is sealed (§12.6).
        """
        audit.extra["replay"] = True  # telemetry tells replays apart
        # Waiting is measured on the event loop's monotonic clock, not the protocol clock.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.limits.replay_wait_seconds
        while stored is None:
            live = self._live(session_id, sequence)
            # Only once it has its first event: until then the stream may still end as an
            # ordinary JSON error (§6.4), which the retry then gets from the store.
            if live is not None and live.count > 0:
                reader = live.reader(
                    replay=True, overflow_event=self._events.overflow(session_id, sequence, req_hash)
                )
                audit.deferred = True
                return Reply(200, stream=self._audit.audited(reader, audit), abort=live.abort)
            if loop.time() >= deadline:
                raise Unavailable("the original request is still running", retry_after=1)
            await asyncio.sleep(0.01)
            begin = await self._config.store.begin_request(
                session_id, "", sequence, req_hash, rate_limit=None, rate_period=1, now=self._clock()
            )
            if begin.kind is BeginKind.REPLAY:
                stored = begin.reply
            elif begin.kind is BeginKind.NEW:
                # The store lost the original's begin (a failover to a replica it had not
                # reached) and this look-up took the sequence again, with the same request
                # hash. Nothing runs here: the original is running (or ran) elsewhere, and
                # its answer, when it comes, is kept for this sequence, where this wait and
                # later retries find it. Refusing would tell the client its intent did not
                # run when it may have.
                continue
            elif begin.kind is not BeginKind.IN_PROGRESS:
                raise SequenceError(f"sequence {sequence} is no longer the last accepted")
        if stored.events is not None:
            replayed = self._replay_stored(stored, session_id, sequence, req_hash)
            audit.deferred = True
            return Reply(200, stream=self._audit.audited(replayed, audit))
        return self.from_stored(stored, session_id, sequence, req_hash, sealed=sealed)

    def from_stored(
        self, stored: StoredReply, session_id: str, sequence: int, req_hash: str, *, sealed: bool = False
    ) -> Reply:
        """The answer a byte-identical retry gets (§6.1 step 7)."""
        # A stored 503 (a handler that raised Unavailable) keeps its Retry-After on replay.
        data = stored.error.get("data") if stored.error is not None else None
        retry = data.get("retry_after") if isinstance(data, Mapping) else None
        retry = retry if type(retry) is int else None
        if stored.signed_at is None:  # kept as sent (written by an older version)
            return Reply(stored.http_status, stored.result, stored.error, retry)
        # Kept without its signature: Ed25519 is deterministic, so signing the same payload
        # again gives the same token, and the store holds a fraction of the bytes.
        if stored.error is None:
            return self._replies.success(
                session_id, sequence, req_hash, stored.result, stored.signed_at, sealed=sealed
            )
        return self._replies.error_reply(
            stored.http_status, stored.error, retry, session_id, sequence, req_hash, stored.signed_at
        )

    async def _replay_stored(
        self, stored: StoredReply, session_id: str, sequence: int, req_hash: str
    ) -> AsyncIterator[Mapping[str, Any]]:
        events = stored.events or ()
        for ev in events:
            yield ev
        if stored.truncated:
            yield self._events.overflow(session_id, sequence, req_hash)(len(events))
