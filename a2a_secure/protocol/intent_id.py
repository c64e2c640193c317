"""The ``intent_id`` extension's wire form (PROTOCOL.md §12.5): pure, no I/O.

An intent may carry ``intent_id``, a client-chosen random name (22-64 base64url characters,
128 random bits or more) that a server declaring the extension remembers with the one
answer of that intent, across sessions. The server's side is
:mod:`a2a_secure.runtime.exactly_once`, the client's discovery
:mod:`a2a_secure.client.extensions`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from a2a_secure.errors import A2AError, InvalidParams, Unavailable
from a2a_secure.identity import encoding

__all__ = [
    "CARD_MEMBER",
    "INTENT_ID",
    "INTENT_ID_MAX_LEN",
    "INTENT_ID_MIN_LEN",
    "check_intent_id",
    "ids_full_message",
    "is_ids_full",
    "new_intent_id",
    "store_full_message",
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


_IDS_FULL = "this DID already has {} intent_ids remembered"
_STORE_FULL = "this server already has {} intent_ids remembered"
_IDS_FULL_RE = re.compile(r"this (?:DID|server) already has \d+ intent_ids remembered")


def ids_full_message(limit: int) -> str:
    """The message of the 503 that refuses a new id when the DID holds ``limit`` of them."""
    return _IDS_FULL.format(limit)


def store_full_message(limit: int) -> str:
    """The message of the 503 that refuses a new id when the store holds ``limit`` in all."""
    return _STORE_FULL.format(limit)


def is_ids_full(exc: A2AError) -> bool:
    """Whether ``exc`` is the server's signed refusal of a new id for a full DID or store.

    That refusal consumes nothing and runs nothing (PROTOCOL.md §12.5), so a client that
    chose no id itself may send the intent again without one.
    """
    return (
        isinstance(exc, Unavailable)
        and getattr(exc, "signed", False) is True
        and _IDS_FULL_RE.fullmatch(exc.message) is not None
    )
