"""The test agent of PROTOCOL.md §11, served by ``a2a-secure serve`` with no ``--app``.

Independent implementations test each other against these intents:

- ``echo``: not streaming; the result is the ``inputs`` object unchanged.
- ``count``: streaming; ``inputs`` exactly ``{"n": 1…50, "delay_ms": 0…1000}`` (``delay_ms``
  optional, default 0); yields ``{"i": 0}`` … ``{"i": n-1}``, waiting ``delay_ms`` between two
  of them. Asked without ``stream: true``, its result is the array of those objects.
- each goal a ``delegation`` member reserves to principals (PROTOCOL.md §12.7) other than
  those two: like ``echo``, so that delegation chains can be tested with no app of one's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from a2a_secure.errors import InvalidParams
from a2a_secure.protocol.server import IntentDispatcher

__all__ = ["count", "echo", "register_test_agent"]


async def echo(inputs: Any) -> Any:
    """The inputs, unchanged."""
    return inputs


async def count(inputs: Any) -> AsyncIterator[dict[str, int]]:
    """``{"i": 0}`` … ``{"i": n-1}``, ``delay_ms`` apart; bad inputs are -32602 before any event."""
    if not isinstance(inputs, dict) or not {"n"} <= inputs.keys() <= {"n", "delay_ms"}:
        raise InvalidParams("count takes exactly n and optionally delay_ms")
    n = inputs["n"]
    delay_ms = inputs.get("delay_ms", 0)
    if type(n) is not int or not 1 <= n <= 50:
        raise InvalidParams("count n must be an integer in 1..50")
    if type(delay_ms) is not int or not 0 <= delay_ms <= 1000:
        raise InvalidParams("count delay_ms must be an integer in 0..1000")
    for i in range(n):
        if i and delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        yield {"i": i}


def register_test_agent(server: IntentDispatcher, *, echo_goals: Iterable[str] = ()) -> None:
    """Serve ``echo`` and ``count`` on ``server``, and each of ``echo_goals`` like ``echo``."""

    async def echo_handler(inputs: Any, _context: Any) -> Any:
        return await echo(inputs)

    def count_handler(inputs: Any, _context: Any) -> AsyncIterator[dict[str, int]]:
        return count(inputs)

    for goal in sorted(set(echo_goals) - {"echo", "count"}):
        server.add(goal, echo_handler)
    server.add("echo", echo_handler)
    server.add_stream("count", count_handler)
