"""The failure budget of the handshake steps that cost a signature check (ATTACKS.md H4).

PROTOCOL.md §5.3 and §5.5 each verify an Ed25519 signature before they can refuse; a
source that keeps failing them would make the server spend that work for free. Each source
address has a bucket of ``ServerLimits.failed_handshake_burst`` failures that refills at
``failed_handshake_per_second``; when it is empty, PROOFs and ACCEPT_POLICYs from that source
get 503 before any signature check.

State: the buckets, by source address, on the monotonic clock (bounded in number).
"""

from __future__ import annotations

from a2a_secure import system
from a2a_secure.errors import Unavailable
from a2a_secure.protocol.server.common import MonoClock, ServerConfig

__all__ = ["FailureBudget"]

_MAX_SOURCES = 10_000
_FORGET = 1000


class FailureBudget:
    """Token buckets of failed, signature-checked handshake steps per source address."""

    def __init__(self, config: ServerConfig, monotonic: MonoClock = system.mono_now) -> None:
        self._config = config
        self._monotonic = monotonic
        self._failures: dict[str, tuple[float, float]] = {}

    def _bucket(self, source: str) -> float:
        """Refill and return the failure budget of ``source``."""
        limits = self._config.limits
        burst = float(limits.failed_handshake_burst)
        now = self._monotonic()
        tokens, last = self._failures.get(source, (burst, now))
        tokens = min(burst, tokens + (now - last) * limits.failed_handshake_per_second)
        self._failures[source] = (tokens, now)
        return tokens

    def check(self, source: str) -> None:
        """Raise 503 when ``source`` has no failure left to spend."""
        if self._bucket(source) < 1.0:
            raise Unavailable("too many failed handshake steps from this address", retry_after=1)

    def spend(self, source: str) -> None:
        """Count one failed step of ``source``."""
        tokens = self._bucket(source)
        self._failures[source] = (tokens - 1.0, self._monotonic())
        if len(self._failures) > _MAX_SOURCES:
            # Bounded: forget the oldest sources (a full bucket is the default anyway).
            for key in list(self._failures)[:_FORGET]:
                del self._failures[key]
