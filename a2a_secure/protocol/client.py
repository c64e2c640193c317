"""The client side of the protocol (PROTOCOL.md §5, §6): no sockets, no HTTP.

Three modules, read in the order a call goes through them:

* :mod:`~a2a_secure.protocol.client_handshake`: ``ClientHandshake``, the four-step
  handshake as a state machine (errors are sticky), which hands over to
* :mod:`~a2a_secure.protocol.client_session`: ``ClientSession``, which allocates sequence
  numbers, signs requests and verifies every answer;
* :mod:`~a2a_secure.protocol.client_attempt`: the attempt machine, which decides what an
  answer leads to (send again, open a new session, send the chain in full, raise).

This module gathers the first two's public names, as callers have always imported them.
"""

from __future__ import annotations

from a2a_secure.protocol.client_handshake import ClientHandshake, HandshakeState
from a2a_secure.protocol.client_session import (
    MAX_INPUT_BYTES,
    MAX_INPUT_DEPTH,
    ClientSession,
    IntentResult,
    PreparedRequest,
    StreamEvent,
    check_intent_inputs,
)

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_INPUT_DEPTH",
    "ClientHandshake",
    "ClientSession",
    "HandshakeState",
    "IntentResult",
    "PreparedRequest",
    "StreamEvent",
    "check_intent_inputs",
]
