"""The session policy of PROTOCOL.md §5.4 and its evaluation.

A plain value type below the protocol core, which uses it from here: the stores persist it
without importing the protocol. ``a2a_secure.protocol`` also names ``Policy`` and
``DEFAULT_POLICY`` (loaded from here on first use).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from a2a_secure.checks import exact_members, require_int
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding

__all__ = ["DEFAULT_POLICY", "Policy"]

_MEMBERS = frozenset(("rate_limit", "rate_period", "allowed_intents", "blocked_intents", "session_timeout"))


def _intent_list(value: Any, what: str, error: type[A2AError]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and 1 <= len(v) <= 128 for v in value):
        raise error(f"policy {what} must be an array of strings")
    if len(set(value)) != len(value):
        raise error(f"policy {what} must hold distinct strings")
    if len(value) > 1024:
        raise error(f"policy {what} is too long")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Policy:
    """What a session may do: rate limit, allowed and blocked goals, absolute lifetime."""

    rate_limit: int = 1000
    rate_period: int = 3600
    allowed_intents: tuple[str, ...] = ("*",)
    blocked_intents: tuple[str, ...] = ()
    session_timeout: int = 3600

    def __post_init__(self) -> None:
        # Re-validate so a Policy can never exist in a shape the wire would refuse.
        Policy.from_dict(self.to_dict())

    @classmethod
    def from_dict(cls, obj: Any, *, error: type[A2AError] = InvalidParams) -> Policy:
        """Parse the exact five-member policy object."""
        exact_members(obj, _MEMBERS, "policy", error)
        values = {
            name: require_int(obj[name], f"policy {name}", minimum=1, error=error)
            for name in ("rate_limit", "rate_period", "session_timeout")
        }
        allowed = _intent_list(obj["allowed_intents"], "allowed_intents", error)
        blocked = _intent_list(obj["blocked_intents"], "blocked_intents", error)
        policy = object.__new__(cls)
        for name, value in (
            ("rate_limit", values["rate_limit"]),
            ("rate_period", values["rate_period"]),
            ("session_timeout", values["session_timeout"]),
            ("allowed_intents", allowed),
            ("blocked_intents", blocked),
        ):
            object.__setattr__(policy, name, value)
        return policy

    @classmethod
    def build(
        cls,
        *,
        allowed: Iterable[str] = ("*",),
        blocked: Iterable[str] = (),
        rate_limit: int = 1000,
        rate_period: int = 3600,
        session_timeout: int = 3600,
    ) -> Policy:
        """A policy from keyword arguments (validated)."""
        return cls(rate_limit, rate_period, tuple(allowed), tuple(blocked), session_timeout)

    def to_dict(self) -> dict[str, Any]:
        """The wire form (exactly five members)."""
        return {
            "rate_limit": self.rate_limit,
            "rate_period": self.rate_period,
            "allowed_intents": list(self.allowed_intents),
            "blocked_intents": list(self.blocked_intents),
            "session_timeout": self.session_timeout,
        }

    @property
    def hash(self) -> str:
        """``hash_of`` the policy object."""
        return encoding.hash_of(self.to_dict())

    def allows(self, goal: str) -> bool:
        """Blocked wins; ``*`` matches every goal; an empty allow-list allows nothing."""
        if "*" in self.blocked_intents or goal in self.blocked_intents:
            return False
        return "*" in self.allowed_intents or goal in self.allowed_intents

    @classmethod
    def load(cls, obj: Mapping[str, Any]) -> Policy:
        """A policy from a configuration mapping (all members optional, defaults applied)."""
        merged = DEFAULT_POLICY.to_dict()
        merged.update(obj)
        return cls.from_dict(merged)


DEFAULT_POLICY = Policy()
