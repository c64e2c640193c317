"""The runner: one accepted intent's handler, run within its deadline (PROTOCOL.md §6.1 step 11).

The intent processor has done every check of §6.1 up to step 10 and consumed the sequence;
the runner calls the handler, bounds it by ``min(timeout_ms, ServerLimits.max_handler_timeout_ms)``
(-32049 past it), cancels it then, and turns whatever it raised into the error of step 11
without the text of a foreign exception. The result must be I-JSON (§1), or the answer is
-32603. Scheduling policy (who runs when) belongs here too: with
``ServerLimits.max_concurrent_intents`` set, the handler runs only once the
:class:`IntentGate` gives it a slot (§12.3); time spent waiting counts against the
deadline, and an intent interrupted by a priority-5 one answers -32049 "interrupted by a
priority-5 intent".

State: none; the handlers are the :class:`IntentDispatcher`'s. The stream pump (§6.4) runs
streamed answers with the same error mapping and result check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any

from a2a_secure.errors import A2AError, IntentTimeout, InternalError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.protocol.priority import INTERRUPTED_MESSAGE
from a2a_secure.protocol.server.common import ServerConfig, log_unexpected
from a2a_secure.protocol.server.dispatcher import IntentContext
from a2a_secure.protocol.server.replies import NOT_IJSON
from a2a_secure.runtime.gate import IntentGate

__all__ = ["IntentRunner", "check_result", "handler_error"]

_log = logging.getLogger("a2a_secure.server")


def handler_error(exc: BaseException, timeout_ms: int) -> A2AError:
    """The §6.1 step 11 error for what a handler raised (no text of a foreign exception)."""
    if isinstance(exc, TimeoutError):
        return IntentTimeout(f"intent did not finish within {timeout_ms} ms")
    if isinstance(exc, InvalidParams):
        return InvalidParams(exc.message[:200])
    if isinstance(exc, A2AError):
        return exc
    log_unexpected(_log, "an intent handler failed", exc)
    return InternalError("the intent handler failed")


def check_result(result: Any) -> None:
    """Refuse (-32603) a handler result that is not I-JSON."""
    # The result sits two containers deep in the reply the client parses (§6.2).
    if encoding.ijson_problem(result, max_depth=encoding.MAX_DEPTH - 2) is not None:
        raise InternalError(NOT_IJSON)


class _Deadline:
    """Await ``work`` within ``delay`` seconds: ``asyncio.timeout``, entered only if the work
    suspends.

    A handler that answers without suspending (an in-memory lookup, an echo) then costs no
    timeout context and no timer: entering and leaving one, and scheduling and cancelling its
    timer, is about 5 µs, a tenth of what the runner adds to an intent. The deadline is the
    same either way, counted from the start of the work: a handler that suspends after it is
    already past is cancelled at that suspension, as a timer that came due during its first
    step would have done; one that never suspends cannot be interrupted by asyncio in either
    case.
    """

    __slots__ = ("_delay", "_work")

    def __init__(self, work: Awaitable[Any], delay: float) -> None:
        self._work = work
        self._delay = delay

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._work.__await__()
        deadline = asyncio.get_running_loop().time() + self._delay
        try:
            suspended = steps.send(None)
        except StopIteration as done:
            return done.value
        return (yield from _within(steps, suspended, deadline))


class _Suspended:
    """The rest of a work that suspended at its first step, within ``deadline`` (loop time)."""

    __slots__ = ("_deadline", "_steps", "_suspended")

    def __init__(self, steps: Generator[Any, Any, Any], suspended: Any, deadline: float) -> None:
        self._steps = steps
        self._suspended = suspended
        self._deadline = deadline

    def __await__(self) -> Generator[Any, Any, Any]:
        return _within(self._steps, self._suspended, self._deadline)


def _within(steps: Generator[Any, Any, Any], suspended: Any, deadline: float) -> Generator[Any, Any, Any]:
    """Go on with ``steps`` under ``asyncio.timeout_at(deadline)``."""
    # Entered in the task running the work, as `async with` would (neither call suspends).
    timeout = asyncio.timeout_at(deadline)
    yield from timeout.__aenter__().__await__()
    try:
        result = yield from _resume(steps, suspended)
    except BaseException as exc:
        # Turns the deadline's own CancelledError into TimeoutError; anything else goes on.
        yield from timeout.__aexit__(type(exc), exc, exc.__traceback__).__await__()
        raise
    yield from timeout.__aexit__(None, None, None).__await__()
    return result


def _resume(steps: Generator[Any, Any, Any], suspended: Any) -> Generator[Any, Any, Any]:
    """Go on with ``steps`` after it yielded ``suspended``: pass values, throws and close."""
    while True:
        try:
            sent = yield suspended
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:  # CancelledError (the deadline's included): the work's to handle
            try:
                suspended = steps.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                suspended = steps.send(sent)
            except StopIteration as done:
                return done.value


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


class IntentRunner:
    """Runs the handler of an accepted, non-streamed intent to its result."""

    def __init__(self, config: ServerConfig, gate: IntentGate | None = None) -> None:
        self._config = config
        self.gate = gate if gate is not None else IntentGate(config)

    def _work(self, goal: str, inputs: Any, context: IntentContext) -> Awaitable[Any]:
        dispatcher = self._config.dispatcher
        if dispatcher.is_streaming(goal):
            # A streaming goal asked without stream: one result, the array of its partials.
            return _collect(dispatcher.open_stream(goal, inputs, context))
        return dispatcher.run(goal, inputs, context)

    def start(
        self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int
    ) -> tuple[Any, Awaitable[Any] | None]:
        """Run the handler as far as it goes without suspending: ``(result, None)`` when it
        finished, ``(None, rest)`` when it waits on something, ``rest`` awaiting it within
        the deadline (counted from now). Raises the :class:`A2AError` of step 11, but for
        the I-JSON check of the result, which the caller makes as it writes the result
        (:func:`a2a_secure.protocol.server.replies.result_json`).

        A handler that answers without suspending (an in-memory lookup, an echo) then costs
        no coroutine of ours, no timeout context and no timer; one that never suspends cannot
        be interrupted by asyncio either way (:class:`_Deadline`).
        """
        if self.gate.active:
            return None, self._run_in_slot(goal, inputs, context, timeout_ms)
        steps = self._work(goal, inputs, context).__await__()
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        try:
            suspended = steps.send(None)
        except StopIteration as done:
            result = done.value
        except Exception as exc:
            raise handler_error(exc, timeout_ms) from None
        else:
            return None, self._rest(steps, suspended, deadline, timeout_ms)
        return result, None

    async def _rest(
        self, steps: Generator[Any, Any, Any], suspended: Any, deadline: float, timeout_ms: int
    ) -> Any:
        try:
            return await _Suspended(steps, suspended, deadline)
        except Exception as exc:
            raise handler_error(exc, timeout_ms) from None

    async def run(self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int) -> Any:
        """The handler's result, or the :class:`A2AError` of step 11."""
        if self.gate.active:
            return await self._run_in_slot(goal, inputs, context, timeout_ms)
        work = self._work(goal, inputs, context)
        # asyncio.timeout runs the handler in this task: no task is created per intent; the
        # deadline's timer is scheduled only if the handler suspends (_Deadline).
        try:
            result = await _Deadline(work, timeout_ms / 1000)
        except Exception as exc:
            raise handler_error(exc, timeout_ms) from None
        check_result(result)
        return result

    # -- §12.3: a handler within the concurrency limit ------------------------------------------
    async def _run_in_slot(self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int) -> Any:
        """Wait for a slot, then run; the deadline covers both. Interruptible by priority 5."""
        slot = self.gate.enter(context.priority, asyncio.current_task())
        ran = False
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await slot.wait()
                ran = True
                # The coroutine is made only now: an intent that never gets a slot never
                # calls its handler.
                result = await self._work(goal, inputs, context)
        except asyncio.CancelledError:
            if not slot.interrupted:
                raise  # the server is stopping: not ours to answer
            slot.uncancel_interrupt()
            raise IntentTimeout(INTERRUPTED_MESSAGE) from None
        except Exception as exc:
            if slot.interrupted:  # a handler that turned the cancellation into an error
                slot.uncancel_interrupt()
                raise IntentTimeout(INTERRUPTED_MESSAGE) from None
            if not ran and isinstance(exc, TimeoutError):
                raise IntentTimeout(f"intent waited to run past its deadline of {timeout_ms} ms") from None
            raise handler_error(exc, timeout_ms) from None
        finally:
            self.gate.leave(slot)
        if slot.interrupted:
            # The handler swallowed the cancellation and returned: its slot was given away,
            # and its caller is told it was interrupted all the same.
            slot.uncancel_interrupt()
            raise IntentTimeout(INTERRUPTED_MESSAGE)
        check_result(result)
        return result
