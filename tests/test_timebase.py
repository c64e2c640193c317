"""Wall-clock and monotonic seconds cannot be compared by mistake (a2a_secure.system).

``mypy --strict a2a_secure`` is what refuses a mix: every function that compares a time with
a Unix timestamp (a key's ``expires``, a link's ``exp``) takes ``WallSeconds``, every cache or
budget clock gives ``MonoSeconds``, and passing one where the other is expected is an
``arg-type`` error. These tests keep those signatures what mypy reads, and the clocks free.
"""

from __future__ import annotations

import time
import typing

from a2a_secure import system
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.protocol.keyguard import KeyGuard
from a2a_secure.protocol.server.chain_cache import ChainCache, Kept
from a2a_secure.protocol.server.delegation import DelegationGuard


def hints(fn: object) -> dict[str, object]:
    return typing.get_type_hints(fn)


def test_the_comparisons_with_unix_timestamps_take_wall_seconds() -> None:
    assert hints(ResolvedDID.check_key_current)["now"] is system.WallSeconds
    assert hints(KeyGuard.check_hello)["now"] is system.WallSeconds
    assert hints(DelegationGuard.verdict)["now"] is system.WallSeconds
    assert hints(DelegationGuard._resolve_keys)["now"] is system.WallSeconds
    assert hints(Kept.refusal)["now"] is system.WallSeconds


def test_the_cache_and_budget_clocks_give_monotonic_seconds() -> None:
    assert hints(DIDResolver.clock)["return"] is system.MonoSeconds
    assert hints(DIDResolver.fresh_until)["return"] == system.MonoSeconds | None
    assert hints(ChainCache.spend)["now"] is system.MonoSeconds
    assert system.WallSeconds is not system.MonoSeconds


def test_the_typed_clocks_are_the_system_clocks_themselves() -> None:
    # Typed by a cast: a clock read costs no extra frame on the intent path.
    assert system.wall_now is time.time and system.mono_now is time.monotonic
    resolver = DIDResolver()
    assert abs(resolver.clock() - time.monotonic()) < 5
