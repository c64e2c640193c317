"""The runner: one accepted intent's handler, run within its deadline (PROTOCOL.md §6.1 step 11).

The intent processor has done every check of §6.1 up to step 10 and consumed the sequence;
the runner calls the handler, bounds it by ``min(timeout_ms, ServerLimits.max_handler_timeout_ms)``
(-32049 past it), cancels it then, and turns whatever it raised into the error of step 11
without the text of a foreign exception. The result must be I-JSON (§1), or the answer is
-32603. Scheduling policy (who runs when) belongs here too.

State: none; the handlers are the :class:`IntentDispatcher`'s. The stream pump (§6.4) runs
streamed answers with the same error mapping and result check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from a2a_secure.errors import A2AError, IntentTimeout, InternalError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.protocol.server.common import ServerConfig
from a2a_secure.protocol.server.dispatcher import IntentContext

__all__ = ["IntentRunner", "check_result", "handler_error"]


def handler_error(exc: BaseException, timeout_ms: int) -> A2AError:
    """The §6.1 step 11 error for what a handler raised (no text of a foreign exception)."""
    if isinstance(exc, TimeoutError):
        return IntentTimeout(f"intent did not finish within {timeout_ms} ms")
    if isinstance(exc, InvalidParams):
        return InvalidParams(exc.message[:200])
    if isinstance(exc, A2AError):
        return exc
    return InternalError("the intent handler failed")


def check_result(result: Any) -> None:
    """Refuse (-32603) a handler result that is not I-JSON."""
    # The result sits two containers deep in the reply the client parses (§6.2).
    if encoding.ijson_problem(result, max_depth=encoding.MAX_DEPTH - 2) is not None:
        raise InternalError("the intent handler returned a value that is not I-JSON")


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


class IntentRunner:
    """Runs the handler of an accepted, non-streamed intent to its result."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config

    async def run(self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int) -> Any:
        """The handler's result, or the :class:`A2AError` of step 11."""
        dispatcher = self._config.dispatcher
        work: Awaitable[Any]
        if dispatcher.is_streaming(goal):
            # A streaming goal asked without stream: one result, the array of its partials.
            work = _collect(dispatcher.open_stream(goal, inputs, context))
        else:
            work = dispatcher.run(goal, inputs, context)
        # asyncio.timeout runs the handler in this task: no task is created per intent.
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                result = await work
        except Exception as exc:
            raise handler_error(exc, timeout_ms) from None
        check_result(result)
        return result
