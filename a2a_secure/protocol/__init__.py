"""The sans-I/O protocol core: messages, handshake state machines, intents, policy.

Nothing here opens a socket, reads the clock or draws randomness on its own: the clock, the
random source, the store and the DID resolver are parameters. The HTTP server and client
are thin adapters around these classes.
"""

from a2a_secure.protocol.client import (
    ClientHandshake,
    ClientSession,
    HandshakeState,
    IntentResult,
    PreparedRequest,
)
from a2a_secure.protocol.messages import PROTOCOL_NAME, PROTOCOL_VERSION, Typ
from a2a_secure.protocol.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.server import (
    IntentContext,
    IntentDispatcher,
    Reply,
    ServerLimits,
    ServerProtocol,
)

__all__ = [
    "DEFAULT_POLICY",
    "PROTOCOL_NAME",
    "PROTOCOL_VERSION",
    "ClientHandshake",
    "ClientSession",
    "HandshakeState",
    "IntentContext",
    "IntentDispatcher",
    "IntentResult",
    "Policy",
    "PreparedRequest",
    "Reply",
    "ServerLimits",
    "ServerProtocol",
    "Typ",
]
