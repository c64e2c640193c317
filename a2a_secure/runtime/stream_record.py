"""Streamed answers on the server side (PROTOCOL.md §6.4), without any HTTP.

A :class:`StreamRecord` is the life of one streamed answer: the handler's pump appends
signed events; the request that started it and any byte-identical retry read them through
:meth:`StreamRecord.reader`. The first events are kept (at most 256 and 1 MiB of ``result``
JSON) so that a retry can be answered with the very same signed events; a retry past what
was kept gets the kept events and then one newly signed final -32048.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.identity import encoding

__all__ = ["KEEPALIVE", "MAX_EVENT_BYTES", "MAX_KEPT_BYTES", "MAX_KEPT_EVENTS", "StreamRecord"]

MAX_EVENT_BYTES = 1024 * 1024
MAX_KEPT_EVENTS = 256
MAX_KEPT_BYTES = 1024 * 1024
KEEPALIVE_SECONDS = 15.0
# What a reader yields when nothing happened for KEEPALIVE_SECONDS: the adapter writes an
# SSE comment line so that proxies and the client's 30 s gap bound keep the stream open.
KEEPALIVE: Mapping[str, Any] = {}
# What :meth:`StreamRecord.end` puts in each reader's queue: the stream stops there.
_ENDED: Mapping[str, Any] = {}


@dataclass(eq=False)
class StreamRecord:
    """One streamed answer: its events, who is reading them, and whether it has ended."""

    session_id: str
    sequence: int
    kept: list[Mapping[str, Any]] = field(default_factory=list)
    kept_bytes: int = 0
    overflow: bool = False
    done: bool = False
    count: int = 0
    pump: asyncio.Task[None] | None = None
    _queues: list[asyncio.Queue[Mapping[str, Any]]] = field(default_factory=list)

    def abort(self, next_index: int) -> AsyncGenerator[Mapping[str, Any], None]:
        """The server is shutting down: stop the handler, whose pump then signs a final -32603.

        Returns a new reader of the events from ``next_index`` on (the reader that was being
        served died with the cancellation that brought the shutdown).
        """
        queue = None if self.done else self._subscribe()
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
        return self._follow(queue, [], next_index)

    def end(self) -> None:
        """End the stream without a final event (its signature could not be made): readers
        stop, and the client sees a stream cut short."""
        self.done = True
        for q in self._queues:
            q.put_nowait(_ENDED)

    def publish(self, event: Mapping[str, Any], result_json_size: int) -> None:
        """Append a signed event (its JSON-RPC ``result`` object) and wake the readers."""
        self.count += 1
        if not self.overflow:
            if len(self.kept) < MAX_KEPT_EVENTS and self.kept_bytes + result_json_size <= MAX_KEPT_BYTES:
                self.kept.append(event)
                self.kept_bytes += result_json_size
            else:
                self.overflow = True
        if event.get("final") is True:
            self.done = True
        for q in self._queues:
            q.put_nowait(event)

    def reader(
        self, *, replay: bool, overflow_event: Callable[[int], Mapping[str, Any]] | None = None
    ) -> AsyncGenerator[Mapping[str, Any], None]:
        """Events in order; ``replay`` for a retry (kept events first, then live ones).

        The subscription is made here, synchronously, so a reader opened before the first
        event misses nothing. ``overflow_event(index)`` signs the final -32048 sent when a
        retry asks for events that were not kept.
        """
        if not replay:
            return self._follow(self._subscribe(), [], 0)
        snapshot = list(self.kept)
        if self.overflow:
            tail = [overflow_event(len(snapshot))] if overflow_event is not None else []
            return self._follow(None, snapshot + tail, len(snapshot))
        queue = None if self.done else self._subscribe()
        return self._follow(queue, snapshot, len(snapshot))

    def _subscribe(self) -> asyncio.Queue[Mapping[str, Any]]:
        queue: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue()
        self._queues.append(queue)
        return queue

    async def _follow(
        self, queue: asyncio.Queue[Mapping[str, Any]] | None, first: list[Mapping[str, Any]], start: int
    ) -> AsyncGenerator[Mapping[str, Any], None]:
        try:
            for ev in first:
                yield ev
            if queue is None:
                return
            index = start
            while True:
                try:
                    ev = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield KEEPALIVE
                    continue
                if ev is _ENDED:
                    return
                if ev.get("index", -1) < index:
                    continue
                index += 1
                yield ev
                if ev.get("final") is True:
                    return
        finally:
            if queue is not None and queue in self._queues:
                self._queues.remove(queue)


def result_size(value: Any) -> int:
    """UTF-8 length of a JSON value's serialisation (the replay bound counts this)."""
    return len(encoding.dumps(value))
