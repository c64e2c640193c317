"""The sans-I/O protocol core: messages, handshake state machines, intents, policy.

Nothing here opens a socket, reads the clock or draws randomness on its own: the clock, the
random source, the store and the DID resolver are parameters. The HTTP server and client
are thin adapters around these classes. The names below load on first use (PEP 562), so a
client that imports the message layer does not load the server side.
"""

from typing import TYPE_CHECKING

from a2a_secure._lazy import attach

if TYPE_CHECKING:
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

__getattr__, __dir__ = attach(
    __name__,
    {
        "DEFAULT_POLICY": "a2a_secure.protocol.policy",
        "PROTOCOL_NAME": "a2a_secure.protocol.messages",
        "PROTOCOL_VERSION": "a2a_secure.protocol.messages",
        "ClientHandshake": "a2a_secure.protocol.client",
        "ClientSession": "a2a_secure.protocol.client",
        "HandshakeState": "a2a_secure.protocol.client",
        "IntentContext": "a2a_secure.protocol.server",
        "IntentDispatcher": "a2a_secure.protocol.server",
        "IntentResult": "a2a_secure.protocol.client",
        "Policy": "a2a_secure.protocol.policy",
        "PreparedRequest": "a2a_secure.protocol.client",
        "Reply": "a2a_secure.protocol.server",
        "ServerLimits": "a2a_secure.protocol.server",
        "ServerProtocol": "a2a_secure.protocol.server",
        "Typ": "a2a_secure.protocol.messages",
    },
)
