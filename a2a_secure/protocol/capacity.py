"""Capacity strangers cannot exhaust (SECURITY.md, "Reserved capacity").

Every bound the callers of an agent share (pending handshakes, sessions, remembered
intent_ids, actions waiting for approval) keeps a share, ``ServerLimits.reserved_share`` of
it, for the callers the operator names: ``ServerLimits.reserved_callers`` (the policy member
``"reserved_callers"``), the principals the delegation rules require, the holders of
priority rights above the default, and the approvers. Strangers, whose DIDs cost nothing,
share the rest, each within the per-DID (or per-address) quotas as before; a named caller
may use the whole bound. While no one is named, nothing is kept back.

A 503 for a full bound says in its ``data`` which pool is full (:func:`full`): ``"own"``,
the caller's own quota, or ``"shared"``, the pool its kind of caller shares, beside
``retry_after``.

One place decides: :func:`limit_for` gives the bound a caller is held to, wherever a bound
is checked (the handshake responder, the intent_id claim, the approval engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Literal

from a2a_secure.errors import Unavailable
from a2a_secure.store.base import Added, Share

__all__ = ["DEFAULT_RESERVED_SHARE", "OWN", "SHARED", "Pool", "Reserved", "full", "limit_for", "pool_of"]

Pool = Literal["own", "shared"]
OWN: Final[Pool] = "own"
SHARED: Final[Pool] = "shared"
DEFAULT_RESERVED_SHARE: Final = 0.1


class Reserved:
    """Who the operator names, read where it is kept (each set may change on a live server)."""

    __slots__ = ("_listed", "_named", "_principals", "_rights")

    def __init__(
        self,
        listed: frozenset[str],
        principals: Mapping[str, frozenset[str]],
        rights: Mapping[str, int],
        rights_default: int,
        named: Callable[[], Iterable[str]] | None,
    ) -> None:
        self._listed = listed
        self._principals = principals
        self._rights = {did for did, highest in rights.items() if highest > rights_default}
        self._named = named

    def __contains__(self, did: object) -> bool:
        if did in self._listed or did in self._rights:
            return True
        if any(did in dids for dids in self._principals.values()):
            return True
        return self._named is not None and did in frozenset(self._named())

    def __bool__(self) -> bool:
        return bool(
            self._listed
            or self._rights
            or any(self._principals.values())
            or (self._named is not None and any(True for _ in self._named()))
        )


def limit_for(total: int, did: str, reserved: Reserved, share: float) -> int:
    """The bound ``did`` is held to, of a shared bound of ``total``.

    A named caller may fill it; a stranger stops short of the reserved share (rounded down:
    a bound of a few entries keeps nothing back).
    """
    if did in reserved or not reserved:
        return total
    return Share(total - int(total * share), total)


def pool_of(refused: Added) -> Pool:
    """The pool a refused addition found full: the caller's own quota, or the shared bound."""
    return OWN if refused is Added.OWN_FULL else SHARED


def full(message: str, *, retry_after: int, pool: Pool) -> Unavailable:
    """The 503 for a full bound, naming the pool that is full."""
    return Unavailable(message, retry_after=retry_after, data={"pool": pool})
