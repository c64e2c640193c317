"""The settings ``serve`` reads besides its flags: the policy file and the checked numbers.

A policy file holds the negotiated policy (§9) and, in :data:`SERVER_MEMBERS`, this server's
own settings, never sent to peers: scheduling (§12.3), sealed intents (§12.6) and the
timing bounds of :class:`~a2a_secure.protocol.server.ServerLimits`. The WAIT and claim lease
settings are checked here too, so that the command line and the environment agree.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import ServerLimits

__all__ = [
    "LEASE_ENV",
    "SERVER_MEMBERS",
    "WAIT_BOUNDS",
    "lease_setting",
    "load_policy",
    "load_scheduling",
    "wait_setting",
    "with_lease",
]

LEASE_ENV = "A2A_SECURE_CLAIM_LEASE_MARGIN"

# Lowest and highest value of the RedisStore's WAIT settings that serve accepts. The store
# gives each round trip 1 s (its socket timeout): a WAIT longer than that would end in a
# timeout (the connection dropped) instead of a reply saying how many replicas acknowledged,
# and 0 ms would make Redis wait without end.
WAIT_BOUNDS = {"redis_wait_replicas": (0, 1000), "redis_wait_timeout_ms": (1, 800)}


def wait_setting(name: str, text: str) -> int:
    """The value of the WAIT setting ``name`` (a key of :data:`WAIT_BOUNDS`) written ``text``.

    Raises ``ValueError("must be an integer from LOW to HIGH, not 'TEXT'")``: plain decimal
    digits only, so that "1.5", "-1", "+1" or " 1" are refused rather than read as something.
    """
    low, high = WAIT_BOUNDS[name]
    if not re.fullmatch(r"[0-9]{1,6}", text) or not low <= int(text) <= high:
        raise ValueError(f"must be an integer from {low} to {high}, not {text!r}")
    return int(text)


# Members of a policy file that configure this server, not the negotiated policy (§12.3).
SERVER_MEMBERS = (
    "priority_rights",
    "max_concurrent_intents",
    "max_queued_intents",
    "sealed_intents",
    "max_handler_timeout_ms",
    "replay_wait_seconds",
    "claim_lease_margin",
)
# Timing members of a policy file (ServerLimits): positive integers (the wait may be a number).
_TIMING_MEMBERS = ("max_handler_timeout_ms", "replay_wait_seconds", "claim_lease_margin")


def _read_policy_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a policy file holds one JSON object")
    return data


def load_policy(path: str | os.PathLike[str] | None) -> Policy:
    """The policy in the JSON file ``path`` (missing members take their defaults)."""
    if not path:
        return DEFAULT_POLICY
    data = _read_policy_file(path)
    return Policy.load({k: v for k, v in data.items() if k not in SERVER_MEMBERS})


def load_scheduling(path: str | os.PathLike[str] | None) -> tuple[PriorityRights, ServerLimits]:
    """The priority rights and concurrency limits in the policy file ``path`` (§12.3)."""
    if not path:
        return PriorityRights(), ServerLimits()
    data = _read_policy_file(path)
    rights = PriorityRights.from_dict(data.get("priority_rights", {}))
    bounds: dict[str, Any] = {}
    for name in ("max_concurrent_intents", "max_queued_intents"):
        if name in data:
            value = data[name]
            if not (value is None and name == "max_concurrent_intents") and type(value) is not int:
                raise ValueError(f"{path}: {name} must be an integer")
            bounds[name] = value
    if "sealed_intents" in data:  # PROTOCOL.md §12.6
        if type(data["sealed_intents"]) is not bool:
            raise ValueError(f"{path}: sealed_intents must be true or false")
        bounds["sealed_intents"] = data["sealed_intents"]
    for name in _TIMING_MEMBERS:
        if name in data:
            value = data[name]
            number = (int, float) if name == "replay_wait_seconds" else (int,)
            if type(value) not in number or value <= 0:
                raise ValueError(f"{path}: {name} must be a positive number")
            bounds[name] = value
    return rights, ServerLimits(**bounds)


def lease_setting(text: str) -> int:
    """``claim_lease_margin`` written ``text``: plain decimal digits, 1 to 86400 seconds."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 86_400:
        raise ValueError(f"must be an integer from 1 to 86400 (seconds), not {text!r}")
    return int(text)


def with_lease(limits: ServerLimits, text: str | None) -> ServerLimits:
    if not text:
        return limits
    try:
        return dataclasses.replace(limits, claim_lease_margin=lease_setting(text))
    except ValueError as exc:
        raise ValueError(f"{LEASE_ENV} {exc}") from None
