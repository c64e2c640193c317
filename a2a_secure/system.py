"""What the operating system supplies: the wall clock, the monotonic clock, the CSPRNG.

The protocol core (:mod:`a2a_secure.protocol`) never reads a clock or draws randomness on
its own: each is a parameter, so that tests pass fakes and every rule runs in memory. A
caller that passes none gets these, the real ones; this module is the one place the core's
defaults come from, and the core imports no clock module itself
(tests/test_import_graph.py).

The two clocks give two types that a type checker keeps apart: :data:`WallSeconds` (Unix
seconds: signed timestamps, a link's ``exp``, a key's ``expires``, a session's
``expires_at``) and :data:`MonoSeconds` (a clock that never goes back, with an arbitrary
origin: cache ages, budgets, deadlines in this process). A function that compares with one
takes that type, so passing the other is an error under ``mypy --strict`` (``Argument 1
has incompatible type "MonoSeconds"; expected "WallSeconds"``), as is passing a bare float
where either is required. Where a caller's own clock enters (a ``clock=`` parameter of a
public class), :func:`wall_clock_of` and :func:`mono_clock_of` name which one it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final, NewType, cast

__all__ = [
    "MonoClock",
    "MonoSeconds",
    "WallClock",
    "WallSeconds",
    "mono_clock_of",
    "mono_now",
    "monotonic_clock",
    "random_bytes",
    "wall_clock",
    "wall_clock_of",
    "wall_now",
]

WallSeconds = NewType("WallSeconds", float)
"""Seconds since the Unix epoch, as a peer's clock reads them too (§9)."""
MonoSeconds = NewType("MonoSeconds", float)
"""Seconds on this process's monotonic clock: comparable only with each other."""
WallClock = Callable[[], WallSeconds]
MonoClock = Callable[[], MonoSeconds]

# Seconds since the epoch: timestamps that are signed and compared with a peer's (§9).
# (The functions themselves, typed: no frame is added to a clock read.)
wall_now: Final[WallClock] = cast(WallClock, time.time)
# Seconds on a clock that never goes back: session lifetimes, budgets, cache ages.
mono_now: Final[MonoClock] = cast(MonoClock, time.monotonic)
# The names this module gave them first.
wall_clock: Final[WallClock] = wall_now
monotonic_clock: Final[MonoClock] = mono_now
# ``n`` bytes from the operating system's CSPRNG: nonces, session ids, action ids.
random_bytes: Final[Callable[[int], bytes]] = os.urandom


def wall_clock_of(clock: Callable[[], float]) -> WallClock:
    """``clock``, a caller's wall clock (Unix seconds), as the type the core takes."""
    return cast(WallClock, clock)


def mono_clock_of(clock: Callable[[], float]) -> MonoClock:
    """``clock``, a caller's monotonic clock, as the type the core takes."""
    return cast(MonoClock, clock)
