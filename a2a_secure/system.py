"""What the operating system supplies: the wall clock, the monotonic clock, the CSPRNG.

The protocol core (:mod:`a2a_secure.protocol`) never reads a clock or draws randomness on
its own: each is a parameter, so that tests pass fakes and every rule runs in memory. A
caller that passes none gets these, the real ones; this module is the one place the core's
defaults come from, and the core imports no clock module itself
(tests/test_import_graph.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final

__all__ = ["monotonic_clock", "random_bytes", "wall_clock"]

# Seconds since the epoch: timestamps that are signed and compared with a peer's (§9).
wall_clock: Final[Callable[[], float]] = time.time
# Seconds on a clock that never goes back: session lifetimes, budgets, cache ages.
monotonic_clock: Final[Callable[[], float]] = time.monotonic
# ``n`` bytes from the operating system's CSPRNG: nonces, session ids, action ids.
random_bytes: Final[Callable[[int], bytes]] = os.urandom
