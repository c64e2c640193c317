"""The timing settings ``serve`` reads besides the policy: the claim lease, the policy file's
timing members, and the wall clock a worker runs on.

* ``claim_lease_margin`` (``ServerLimits``; ``--claim-lease-margin``,
  ``A2A_SECURE_CLAIM_LEASE_MARGIN``): how long past the handler timeout an ``intent_id``
  whose run started and never answered is waited for before resends are told "outcome
  unknown" (runtime/exactly_once.py).
* A policy file may set ``max_handler_timeout_ms``, ``replay_wait_seconds`` and
  ``claim_lease_margin`` (:data:`TIMING_MEMBERS`), this server's own, never sent to peers.
* ``A2A_SECURE_TEST_CLOCK_DIR``, FOR TESTING ONLY (fault campaigns, scripts/chaos.py): each
  worker's wall clock is ``time.time()`` plus the seconds written in ``<dir>/<pid>``
  (:class:`a2a_secure.testing.SteppedClock`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from a2a_secure.protocol.server import ServerLimits
from a2a_secure.system import WallClock, wall_clock_of, wall_now

__all__ = [
    "LEASE_ENV",
    "TEST_CLOCK_ENV",
    "TIMING_MEMBERS",
    "lease_setting",
    "test_clock",
    "timing_bounds",
    "with_lease",
]

LEASE_ENV = "A2A_SECURE_CLAIM_LEASE_MARGIN"
TEST_CLOCK_ENV = "A2A_SECURE_TEST_CLOCK_DIR"
# Timing members of a policy file (ServerLimits): positive integers (the wait may be a number).
TIMING_MEMBERS = ("max_handler_timeout_ms", "replay_wait_seconds", "claim_lease_margin")


def timing_bounds(data: Mapping[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``ServerLimits`` members of :data:`TIMING_MEMBERS` a policy file sets, checked."""
    bounds: dict[str, Any] = {}
    for name in TIMING_MEMBERS:
        if name in data:
            value = data[name]
            number = (int, float) if name == "replay_wait_seconds" else (int,)
            if type(value) not in number or value <= 0:
                raise ValueError(f"{os.fspath(path)}: {name} must be a positive number")
            bounds[name] = value
    return bounds


def lease_setting(text: str) -> int:
    """``claim_lease_margin`` written ``text``: plain decimal digits, 1 to 86400 seconds."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 86_400:
        raise ValueError(f"must be an integer from 1 to 86400 (seconds), not {text!r}")
    return int(text)


def with_lease(limits: ServerLimits, text: str | None) -> ServerLimits:
    """``limits`` with the claim lease margin written ``text`` (None or empty: unchanged)."""
    if not text:
        return limits
    try:
        return dataclasses.replace(limits, claim_lease_margin=lease_setting(text))
    except ValueError as exc:
        raise ValueError(f"{LEASE_ENV} {exc}") from None


def test_clock(env: Mapping[str, str]) -> WallClock:
    """The wall clock of this worker: ``wall_now``, or a :class:`SteppedClock` (testing only)."""
    directory = env.get(TEST_CLOCK_ENV)
    if not directory:
        return wall_now
    from a2a_secure.testing import SteppedClock  # noqa: PLC0415

    return wall_clock_of(SteppedClock(Path(directory) / str(os.getpid())))
