"""The stream pump: streamed answers (PROTOCOL.md §6.4).

An accepted intent asked with ``stream: true`` (or a goal that always streams) is run by a
pump task that signs each partial result as an event (typ ``a2a-event+jws``) and publishes
it to a :class:`StreamRecord`, whoever is still listening; the request that started it
and any byte-identical retry read the record. Failures before the first event are an
ordinary signed JSON error; after it, a final error event. At the end the kept events are
stored for retries (§6.1 step 7) and the audit record is written with the final status.

State: the live streams by (session id, sequence), how many each client DID has open
(bounded by ``ServerLimits.max_streams_total`` / ``max_streams_per_did``), and the pump
tasks, kept so that they are not collected while running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from a2a_secure.errors import A2AError, IntentTimeout, InternalError, SessionUnknown
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import SignerFailed
from a2a_secure.protocol.priority import INTERRUPTED_MESSAGE
from a2a_secure.protocol.sealing import record_sealer
from a2a_secure.protocol.server.auditing import AuditFields, AuditWriter
from a2a_secure.protocol.server.common import Clock, Reply, ServerConfig
from a2a_secure.protocol.server.deadlines import SessionDeadlines
from a2a_secure.protocol.server.dispatcher import IntentContext
from a2a_secure.protocol.server.events import EventSigner
from a2a_secure.runtime.gate import IntentGate, Slot
from a2a_secure.runtime.runner import check_result, handler_error
from a2a_secure.runtime.signing import finish_event, may_pend
from a2a_secure.runtime.stream_record import MAX_EVENT_BYTES, StreamRecord, result_size
from a2a_secure.store.base import SessionRecord, StoredReply

if TYPE_CHECKING:
    from a2a_secure.runtime.exactly_once import ExactlyOnce

__all__ = ["StreamPump"]


class StreamPump:
    """Starts, runs and tracks the streamed answers of one server."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        deadlines: SessionDeadlines,
        audit: AuditWriter,
        clock: Clock,
        events: EventSigner,
        gate: IntentGate | None = None,
    ) -> None:
        self._config = config
        # Signing is the core's (protocol/server/events.py); the pump publishes what it signs.
        self.event = events.event
        self.overflow = events.overflow
        self._gate = gate if gate is not None else IntentGate(config)
        self._deadlines = deadlines
        self._audit = audit
        self._clock = clock
        # Live streamed answers by (session, sequence), and how many each DID has open.
        self._streams: dict[tuple[str, int], StreamRecord] = {}
        self._streams_by_did: dict[str, int] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        # The intent_id room, told when a stream it claimed has ended (set by the router).
        self.exactly_once: ExactlyOnce | None = None

    def live(self, session_id: str, sequence: int) -> StreamRecord | None:
        """The stream answering (``session_id``, ``sequence``) while it runs."""
        return self._streams.get((session_id, sequence))

    def has_room(self, session_id: str, sequence: int, did: str) -> bool:
        """Whether a stream for (``session_id``, ``sequence``) may go on or start for ``did``."""
        if (session_id, sequence) in self._streams:  # a retry of a live stream is no new one
            return True
        limits = self._config.limits
        return (
            len(self._streams) < limits.max_streams_total
            and self._streams_by_did.get(did, 0) < limits.max_streams_per_did
        )

    async def start(
        self,
        session: SessionRecord,
        sequence: int,
        req_hash: str,
        goal: str,
        inputs: Any,
        context: IntentContext,
        timeout_ms: int,
        audit: AuditFields,
    ) -> Reply:
        """Start the pump of an accepted intent; the reply once its first event exists."""
        dispatcher = self._config.dispatcher
        stream = dispatcher.open_stream(goal, inputs, context)
        single = not dispatcher.is_streaming(goal)
        # §12.3: a place in the queue (or 503) before anything starts; the pump waits in it.
        # Nothing between here and the pump's creation can fail, so the slot cannot leak.
        slot = self._gate.enter(context.priority, None) if self._gate.active else None
        rec = StreamRecord(session.session_id, sequence)
        # The request that starts the stream subscribes before the first event exists.
        reader = rec.reader(replay=False)
        first_event: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (session.session_id, sequence)
        self._streams[key] = rec
        did = session.client_did
        self._streams_by_did[did] = self._streams_by_did.get(did, 0) + 1
        pump = asyncio.create_task(
            self._pump(rec, stream, first_event, session, req_hash, timeout_ms, single, audit, slot)
        )
        if slot is not None:
            slot.task = pump
        rec.pump = pump
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        try:
            await asyncio.shield(first_event)
        except A2AError:
            # Failures up to the first event are ordinary signed JSON errors (stored as such).
            await reader.aclose()
            raise
        audit.deferred = True
        return Reply(200, stream=reader, abort=rec.abort)

    async def _pump(
        self,
        rec: StreamRecord,
        stream: AsyncIterator[Any],
        first_event: asyncio.Future[None],
        session: SessionRecord,
        req_hash: str,
        timeout_ms: int,
        single: bool,
        audit: AuditFields,
        slot: Slot | None = None,
    ) -> None:
        """Run the handler to its end, publishing signed events, whoever is still listening."""
        sid, seq = session.session_id, rec.sequence
        sealer = record_sealer(session)  # §12.6: each partial result sealed
        index = 0
        final_error: A2AError | None = None

        async def publish(event: dict[str, Any]) -> None:
            if may_pend(self._config):  # a remote key: kept and sent signed (runtime/signing.py)
                await publish_signed(event)
            payload = event.get("result") if "result" in event else event.get("error")
            rec.publish(event, result_size(payload))
            if not first_event.done():
                first_event.set_result(None)

        async def publish_signed(event: dict[str, Any]) -> None:
            try:
                await finish_event(event)
            except SignerFailed as exc:
                if not first_event.done():
                    first_event.set_exception(exc)
                rec.end()
                raise

        try:
            if slot is not None:
                await self._wait_for_slot(slot, timeout_ms)
            while True:
                try:
                    item = await asyncio.wait_for(anext(stream), timeout_ms / 1000)
                except StopAsyncIteration:
                    if single:
                        raise InternalError("the intent handler produced no result") from None
                    await publish(self.event(sid, seq, req_hash, index, True, result=None))
                    break
                check_result(item)
                now = self._clock()
                if self.exactly_once is not None and self.exactly_once.running:
                    await self.exactly_once.renew(sid, seq, now)  # its intent_id's lease
                if (
                    session.expired(now)
                    or self._deadlines.past(sid)
                    or await self._config.store.get_session(sid, now) is None
                ):
                    raise SessionUnknown("the session ended during the stream")
                await self._config.key_guard.check_stream(self._config.store, self._config.resolver, session)
                if sealer is not None:
                    item = sealer.seal_event(seq, req_hash, index, single, item)
                event = self.event(sid, seq, req_hash, index, single, result=item, sealed=sealer is not None)
                if may_pend(self._config):
                    await publish_signed(event)
                # §6.4: an event is at most 1 MiB (the result travels twice: in the event and
                # base64url-encoded in its signature). A bigger one ends the stream instead.
                if len(encoding.dumps(event)) > MAX_EVENT_BYTES - 256:
                    raise InternalError("a partial result is too large for one event")
                await publish(event)
                index += 1
                if single:
                    break
        except asyncio.CancelledError:
            interrupted = slot is not None and slot.interrupted
            if interrupted:  # §12.3: a priority-5 intent took the slot
                final_error = IntentTimeout(INTERRUPTED_MESSAGE)
            else:
                final_error = InternalError("server shutting down")
            if first_event.done():
                await publish(self.event(sid, seq, req_hash, index, True, error=final_error))
            else:
                first_event.set_exception(final_error)
            if not interrupted:
                raise
            assert slot is not None
            slot.uncancel_interrupt()
        except SignerFailed:
            # The stream ended without a final event (publish_signed). A retry gets the events
            # kept and then, signed when it asks, the -32048 of events that were not kept.
            rec.overflow = True
        except Exception as exc:
            if slot is not None and slot.interrupted:  # the handler turned it into an error
                slot.uncancel_interrupt()
                final_error = IntentTimeout(INTERRUPTED_MESSAGE)
            else:
                final_error = handler_error(exc, timeout_ms)
            if first_event.done():
                await publish(self.event(sid, seq, req_hash, index, True, error=final_error))
            else:
                first_event.set_exception(final_error)
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
            if slot is not None:
                self._gate.leave(slot)
            self._streams.pop((sid, seq), None)
            left = self._streams_by_did.get(session.client_did, 1) - 1
            if left > 0:
                self._streams_by_did[session.client_did] = left
            else:
                self._streams_by_did.pop(session.client_did, None)
        if first_event.done() and first_event.exception() is None:
            stored = StoredReply(200, events=tuple(rec.kept), truncated=rec.overflow)
            with contextlib.suppress(Exception):
                await self._config.store.finish_request(sid, seq, stored)
            if self.exactly_once is not None and self.exactly_once.running:
                await self.exactly_once.finish(sid, seq, stored)
            self._audit.write_stream_end(audit, final_error.code if final_error is not None else None)

    @staticmethod
    async def _wait_for_slot(slot: Slot, timeout_ms: int) -> None:
        # §12.3: time in the queue counts against the deadline; past it, the handler never runs.
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await slot.wait()
        except TimeoutError:
            raise IntentTimeout(f"intent waited to run past its deadline of {timeout_ms} ms") from None
