"""Intent priority (PROTOCOL.md §12.3): the ``priority`` member and who may use which.

An intent may carry ``priority``, an integer from 1 to 5 (3 when absent), as a member of the
``intent`` object: it is inside the signed ``request_jws`` payload and cannot be changed on
the path. It is a scheduling hint bounded by the server's :class:`PriorityRights`, which is
server configuration, not a member of the negotiated policy of §5.4 (whose five members the
base contract fixes: a peer would refuse a sixth).

A server that serves this lists :data:`EXTENSION` in its card's ``a2a_secure_extensions``
(PROTOCOL.md §12); a base-contract server does not, and refuses an unknown member of
``intent`` (-32602). So a client sends ``priority`` only to a server whose authenticated card
lists it, and only when the caller asks for one other than the default.

Pure: values and checks, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from a2a_secure.checks import ErrorType, require_int, require_object
from a2a_secure.errors import InvalidParams, PolicyViolation
from a2a_secure.identity.did import check_did_syntax

__all__ = [
    "DEFAULT_PRIORITY",
    "EXTENSION",
    "INTERRUPTED_MESSAGE",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PREEMPTING_PRIORITY",
    "PriorityRights",
    "check_priority",
    "with_priority",
]

MIN_PRIORITY: Final = 1
MAX_PRIORITY: Final = 5
DEFAULT_PRIORITY: Final = 3
# An intent of this priority interrupts running intents of lower priority when no slot is free.
PREEMPTING_PRIORITY: Final = 5
# The message of the -32049 an interrupted intent's caller gets (§7, §12.3).
INTERRUPTED_MESSAGE: Final = "interrupted by a priority-5 intent"
# The name of this extension in the agent card's list of extensions.
EXTENSION: Final = "priority"

_RIGHTS_MEMBERS = frozenset(("default", "per_did"))
_MAX_PER_DID = 10_000


def check_priority(value: Any, error: ErrorType = InvalidParams) -> int:
    """A priority: a JSON integer from 1 to 5 (not a boolean, not ``5.0``, not ``"5"``)."""
    return require_int(value, "intent priority", minimum=MIN_PRIORITY, maximum=MAX_PRIORITY, error=error)


def with_priority(intent: Mapping[str, Any], priority: int | None) -> Mapping[str, Any]:
    """``intent`` asking for ``priority`` (None: as it is).

    The member is added only for a priority other than the default 3, so that a request
    that asks for nothing special stays a base-contract intent. An ``intent`` that already
    names another priority is refused rather than silently overridden.
    """
    if priority is None:
        return intent
    check_priority(priority)
    if "priority" in intent:
        held = intent["priority"]
        if type(held) is not int or held != priority:
            raise InvalidParams(f"the intent has priority {held!r}, the call asks for {priority}")
        return intent
    if priority == DEFAULT_PRIORITY:
        return intent
    return {**intent, "priority": priority}


@dataclass(frozen=True, slots=True)
class PriorityRights:
    """The highest priority each caller may use: ``default``, or ``per_did[caller DID]``.

    An intent that asks for more is refused with -32042 at §6.1 step 9. An intent that asks
    for nothing runs at ``min(3, the caller's highest)``: a caller that did not ask for a
    priority is not refused for one.
    """

    default: int = DEFAULT_PRIORITY
    per_did: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_priority(self.default, InvalidParams)
        if not isinstance(self.per_did, Mapping):
            raise InvalidParams("priority rights per_did must be a mapping of DID to priority")
        if len(self.per_did) > _MAX_PER_DID:
            raise InvalidParams(f"priority rights per_did holds more than {_MAX_PER_DID} DIDs")
        for did, highest in self.per_did.items():
            if not isinstance(did, str):
                raise InvalidParams("priority rights per_did keys must be DIDs")
            check_did_syntax(did)
            check_priority(highest, InvalidParams)
        # A read-only copy: the rights cannot change behind the server's back.
        object.__setattr__(self, "per_did", MappingProxyType(dict(self.per_did)))

    def highest(self, did: str) -> int:
        """The highest priority ``did`` may ask for."""
        return self.per_did.get(did, self.default)

    def effective(self, requested: int | None, did: str) -> int:
        """The priority an intent of ``did`` runs at; -32042 above the caller's highest."""
        highest = self.per_did.get(did, self.default)
        if requested is None:
            return DEFAULT_PRIORITY if highest >= DEFAULT_PRIORITY else highest
        if requested > highest:
            raise PolicyViolation(f"priority {requested} is above this caller's highest, {highest}")
        return requested

    @classmethod
    def from_dict(cls, obj: Any) -> PriorityRights:
        """Rights from their configuration form ``{"default": 3, "per_did": {DID: 5}}``.

        Both members are optional (``default`` 3, ``per_did`` empty); any other member, a
        value that is not a priority or a key that is not a DID is refused (-32602).
        """
        rights = require_object(obj, "priority rights")
        extra = rights.keys() - _RIGHTS_MEMBERS
        if extra:
            raise InvalidParams(f"priority rights: unexpected member {sorted(extra)[0][:64]!r}")
        default = rights.get("default", DEFAULT_PRIORITY)
        per_did = require_object(rights.get("per_did", {}), "priority rights per_did")
        return cls(default, dict(per_did))

    def to_dict(self) -> dict[str, Any]:
        """The configuration form."""
        return {"default": self.default, "per_did": dict(self.per_did)}
