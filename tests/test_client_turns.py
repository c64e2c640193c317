"""The client's turns (``client/turns.py``): the pool's request slots and each peer's lock."""

from __future__ import annotations

import asyncio

import pytest

from a2a_secure.client.turns import Turns


async def test_one_holder_at_a_time_served_in_order_of_arrival() -> None:
    lock = Turns(1)
    order: list[int] = []
    inside = 0

    async def hold(i: int) -> None:
        nonlocal inside
        async with lock:
            inside += 1
            assert inside == 1
            order.append(i)
            await asyncio.sleep(0.001 * (5 - i))  # the first ones hold longest
            inside -= 1

    await asyncio.gather(*(hold(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]
    assert not lock.locked() and lock.free == 1


async def test_a_waiter_cancelled_while_waiting_takes_nothing_and_blocks_nobody() -> None:
    lock = Turns(1)
    await lock.__aenter__()
    leaving = asyncio.create_task(lock.__aenter__())
    staying = asyncio.create_task(lock.__aenter__())
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await lock.__aexit__(None, None, None)
    await staying  # the turn went to the one still waiting
    assert lock.locked()
    await lock.__aexit__(None, None, None)
    assert not lock.locked()
    async with lock:  # and it is free again for a newcomer
        pass


async def test_an_exception_inside_gives_the_turn_back() -> None:
    lock = Turns(1)
    with pytest.raises(RuntimeError):
        async with lock:
            raise RuntimeError("boom")
    assert lock.take_now()


async def test_a_turn_handed_to_a_waiter_that_was_just_cancelled_is_not_lost() -> None:
    turns = Turns(1)
    assert turns.take_now() and not turns.take_now()
    waiting = asyncio.create_task(turns.take())
    await asyncio.sleep(0)  # it waits for the turn
    turns.release()  # handed to it...
    waiting.cancel()  # ...as it gives up, before it could run
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert turns.take_now()  # the turn came back
