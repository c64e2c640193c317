"""The ``intent_id`` extension's wire form (PROTOCOL.md §12.5): pure, no I/O.

An intent may carry ``intent_id``, a client-chosen random name (22-64 base64url characters,
128 random bits or more) that a server declaring the extension remembers with the one
answer of that intent, across sessions. The server's side is
:mod:`a2a_secure.protocol.server.exactly_once`, the client's discovery
:mod:`a2a_secure.client.extensions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding

__all__ = [
    "CARD_MEMBER",
    "INTENT_ID",
    "INTENT_ID_MAX_LEN",
    "INTENT_ID_MIN_LEN",
    "check_intent_id",
    "new_intent_id",
]

INTENT_ID: Final = "intent_id"
CARD_MEMBER: Final = "a2a_secure_extensions"
"""The agent card member listing the extensions a server serves (sorted strings)."""
# 22 base64url characters carry 132 bits: the least that holds 128 random bits.
INTENT_ID_MIN_LEN: Final = 22
INTENT_ID_MAX_LEN: Final = 64
_B64U: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def check_intent_id(value: Any, error: type[A2AError] = InvalidParams) -> str:
    """``value`` if it is a valid ``intent_id`` (22-64 base64url characters), else ``error``."""
    if not isinstance(value, str):
        raise error("intent_id must be a string")
    if not INTENT_ID_MIN_LEN <= len(value) <= INTENT_ID_MAX_LEN:
        raise error(f"intent_id must be {INTENT_ID_MIN_LEN} to {INTENT_ID_MAX_LEN} characters")
    if not _B64U.issuperset(value):
        raise error("intent_id must use only the base64url alphabet [A-Za-z0-9_-]")
    return value


def new_intent_id(random_bytes: Callable[[int], bytes]) -> str:
    """A fresh ``intent_id``: 16 bytes of ``random_bytes(n)`` (a CSPRNG) in base64url."""
    return encoding.b64u_encode(random_bytes(16))
