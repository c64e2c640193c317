"""The delegation chains this process verified, kept per session (PROTOCOL.md §12.7).

A chain verified once on a session is kept under its name, so that later intents carry the
name alone. What one caller can make this process do or forget is bounded per session:

* each session keeps at most ``max_cached_chains`` chains (its own oldest go first), and a
  new chain evicts another session's only when the session holds none of its own and the
  process-wide bound is reached: a flood of chains on one session cycles through its own
  slots and leaves every other session's chains in place;
* each session gets at most its policy's ``rate_limit`` full verifications (signatures, DID
  resolutions) per ``rate_period`` on the monotonic clock, counted before the work is done:
  the same number as the requests its rate allows, whether or not those requests then pass
  steps 7-8 (a replayed sequence is refused there, after the chain was verified).

A kept chain remembers the earliest ``expires`` (Unix seconds) of the retired keys that
signed its links: past it, the kept chain is refused as a new one would be.

State: session id → its chains and its verification window, least recently used first,
bounded in sessions too. Pure: the clocks are the caller's.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from a2a_secure.delegation import NBF_SKEW, Chain, DelegationRefused
from a2a_secure.errors import Unavailable
from a2a_secure.policy import Policy
from a2a_secure.system import MonoSeconds, WallSeconds

__all__ = ["MAX_CACHED_CHAINS", "MAX_TRACKED_SESSIONS", "ChainCache", "Kept"]

# Verified chains kept by this process, all sessions together (a chain is at most 16 KiB of
# tokens: 64 MiB at worst).
MAX_CACHED_CHAINS: Final = 4096
# Sessions whose verification window is tracked (an idle one's is forgotten first).
MAX_TRACKED_SESSIONS: Final = 16_384


@dataclass(slots=True)
class Kept:
    """A verified chain, and until when the keys that signed it may (None: no retired key).

    Also what later uses need not work out again (the delegation guard's): every link's
    window as one interval, whether a use on this session passed the checks that do not
    change on it (audience, targets), the deny lists' epochs read before the chain was last
    found clean (None: never), and its verdict.
    """

    chain: Chain
    keys_until: WallSeconds | None = None
    retired: str = ""  # the refusal once ``keys_until`` is past
    not_before: float = field(init=False)
    expires: float = field(init=False)
    scoped: bool = field(default=False, init=False)
    epochs: tuple[object, ...] | None = field(default=None, init=False)
    verdict: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        links = self.chain.links
        self.not_before = max(link.nbf for link in links) - NBF_SKEW
        self.expires = min(link.exp for link in links)

    def refusal(self, now: WallSeconds) -> DelegationRefused | None:
        """The refusal of a kept chain one of whose keys has been retired since, or None."""
        if self.keys_until is not None and now >= self.keys_until:
            return DelegationRefused(self.retired)
        return None


@dataclass(slots=True)
class _Session:
    chains: OrderedDict[str, Kept] = field(default_factory=OrderedDict)
    window: float = -math.inf  # start of the verification window (monotonic)
    verified: int = 0  # full verifications in that window


class ChainCache:
    """Chains kept per session, and each session's budget of verifications."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def get(self, session_id: str, name: str) -> Kept | None:
        """The chain kept under ``name`` for ``session_id``, or None."""
        mine = self._sessions.get(session_id)
        if mine is None:
            return None
        kept = mine.chains.get(name)
        if kept is not None:
            mine.chains.move_to_end(name)
            self._sessions.move_to_end(session_id)
        return kept

    def names(self, session_id: str) -> list[str]:
        """The names kept for ``session_id``, oldest first."""
        mine = self._sessions.get(session_id)
        return [] if mine is None else list(mine.chains)

    def spend(self, session_id: str, policy: Policy, now: MonoSeconds) -> None:
        """Count one full verification for ``session_id`` now, or refuse it (503) beyond its
        policy's ``rate_limit`` per ``rate_period``; before any of the work is done."""
        mine = self._session(session_id)
        if now - mine.window >= policy.rate_period:
            mine.window, mine.verified = now, 0
        if mine.verified >= policy.rate_limit:
            wait = max(1, math.ceil(mine.window + policy.rate_period - now))
            raise Unavailable("too many delegation chains verified on this session", retry_after=wait)
        mine.verified += 1

    def keep(self, session_id: str, kept: Kept, limit: int) -> None:
        """Keep ``kept`` for ``session_id`` (at most ``limit`` per session; see the module)."""
        mine = self._session(session_id)
        name = kept.chain.hash
        if name not in mine.chains:
            self._total += 1
        mine.chains[name] = kept
        mine.chains.move_to_end(name)
        while len(mine.chains) > max(1, limit):
            mine.chains.popitem(last=False)
            self._total -= 1
        if self._total <= MAX_CACHED_CHAINS:
            return
        if len(mine.chains) > 1:  # its own oldest first
            mine.chains.popitem(last=False)
            self._total -= 1
            return
        for other in self._sessions.values():  # least recently used first
            if other is not mine and other.chains:
                other.chains.popitem(last=False)
                self._total -= 1
                return

    def forget(self, session_id: str) -> None:
        """Drop what is kept for a session that ended."""
        mine = self._sessions.pop(session_id, None)
        if mine is not None:
            self._total -= len(mine.chains)

    def _session(self, session_id: str) -> _Session:
        mine = self._sessions.get(session_id)
        if mine is None:
            if len(self._sessions) >= MAX_TRACKED_SESSIONS:
                self.forget(next(iter(self._sessions)))
            mine = self._sessions[session_id] = _Session()
        else:
            self._sessions.move_to_end(session_id)
        return mine
