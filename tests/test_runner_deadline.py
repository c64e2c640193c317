"""The handler deadline of §6.1 step 11, whose timer is scheduled only when a handler suspends.

``IntentRunner.run`` awaits the handler through ``_Deadline``: a handler that answers
without suspending costs no timer; one that suspends gets the deadline counted from the
start of its work, and everything that passes between the task and the handler (values,
exceptions, cancellation, close) must pass as if the handler were awaited directly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from a2a_secure.errors import IntentTimeout, InternalError
from a2a_secure.protocol.server.common import ServerConfig
from a2a_secure.protocol.server.dispatcher import IntentContext, IntentDispatcher
from a2a_secure.runtime.runner import IntentRunner
from tests.protocol_helpers import make_world


def _runner(**handlers: Any) -> IntentRunner:
    w = make_world()
    dispatcher = IntentDispatcher()
    for goal, fn in handlers.items():
        dispatcher.add(goal, fn)
    config: ServerConfig = w.server._config
    config.dispatcher = dispatcher
    return IntentRunner(config)


def _context(goal: str) -> IntentContext:
    return IntentContext(
        caller_did="did:key:z6Mk", session_id="s", sequence=1, goal=goal, domain=None, constraints={}
    )


def _scheduled() -> int:
    loop: Any = asyncio.get_running_loop()
    return sum(1 for h in loop._scheduled if not h.cancelled())


async def test_a_handler_that_does_not_suspend_schedules_no_timer() -> None:
    seen: list[int] = []

    async def quick(inputs: Any, ctx: IntentContext) -> Any:
        seen.append(_scheduled())
        return {"echo": inputs}

    runner = _runner(quick=quick)
    before = _scheduled()
    assert await runner.run("quick", {"a": 1}, _context("quick"), 50) == {"echo": {"a": 1}}
    assert seen == [before]  # no deadline timer while it ran
    assert _scheduled() == before


async def test_a_handler_that_suspends_gets_its_deadline() -> None:
    seen: list[int] = []

    async def slow(inputs: Any, ctx: IntentContext) -> Any:
        await asyncio.sleep(0)
        seen.append(_scheduled())
        await asyncio.sleep(10)

    runner = _runner(slow=slow)
    before = _scheduled()
    t = time.monotonic()
    with pytest.raises(IntentTimeout, match="within 30 ms"):
        await runner.run("slow", {}, _context("slow"), 30)
    assert time.monotonic() - t < 5
    assert seen and seen[0] >= before + 1  # the deadline, armed at the first suspension
    assert _scheduled() == before  # and gone afterwards


async def test_the_deadline_counts_from_the_start_of_the_work() -> None:
    # 300 ms of synchronous work, then a suspension: the 200 ms deadline has passed already,
    # so the handler is cancelled at that suspension, not 200 ms after it.
    reached: list[str] = []

    async def busy_then_wait(inputs: Any, ctx: IntentContext) -> Any:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
        await asyncio.sleep(10)
        reached.append("after the sleep")

    runner = _runner(busy=busy_then_wait)
    t = time.monotonic()
    with pytest.raises(IntentTimeout):
        await runner.run("busy", {}, _context("busy"), 200)
    assert time.monotonic() - t < 0.45
    assert reached == []


async def test_values_and_exceptions_pass_through_every_suspension() -> None:
    loop = asyncio.get_running_loop()

    async def chatty(inputs: Any, ctx: IntentContext) -> Any:
        got = []
        for i in range(5):
            fut: asyncio.Future[int] = loop.create_future()
            loop.call_soon(fut.set_result, i * 10)
            got.append(await fut)
        failing: asyncio.Future[int] = loop.create_future()
        loop.call_soon(failing.set_exception, KeyError("inner"))
        try:
            await failing
        except KeyError as exc:
            got.append(str(exc))
        return got

    runner = _runner(chatty=chatty)
    assert await runner.run("chatty", {}, _context("chatty"), 1000) == [0, 10, 20, 30, 40, "'inner'"]


async def test_a_handler_may_clean_up_when_its_deadline_cancels_it() -> None:
    cleaned: list[str] = []

    async def careful(inputs: Any, ctx: IntentContext) -> Any:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0)  # awaiting in its own clean-up, as a handler may
            cleaned.append("done")

    runner = _runner(careful=careful)
    with pytest.raises(IntentTimeout):
        await runner.run("careful", {}, _context("careful"), 20)
    assert cleaned == ["done"]


async def test_a_handler_failing_after_a_suspension_is_a_generic_error() -> None:
    async def late_boom(inputs: Any, ctx: IntentContext) -> Any:
        await asyncio.sleep(0)
        raise RuntimeError("SECRET detail")

    async def early_boom(inputs: Any, ctx: IntentContext) -> Any:
        raise RuntimeError("SECRET detail")

    runner = _runner(late=late_boom, early=early_boom)
    for goal in ("late", "early"):
        with pytest.raises(InternalError) as err:
            await runner.run(goal, {}, _context(goal), 1000)
        assert "SECRET" not in err.value.message


async def test_cancelling_the_request_cancels_the_handler() -> None:
    # The server stopping (the request's task cancelled) reaches the handler through the
    # deadline's wrapper, and is not turned into an answer.
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def waits(inputs: Any, ctx: IntentContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    runner = _runner(waits=waits)
    task = asyncio.create_task(runner.run("waits", {}, _context("waits"), 5000))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == [True]
