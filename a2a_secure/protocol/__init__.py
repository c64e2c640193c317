"""The sans-I/O protocol core: messages, handshake state machines, intents, policy.

Nothing here opens a socket, reads the clock, draws randomness or waits on its own: the
clock, the random source, the store and the DID resolver are parameters (a caller that
passes no clock or random source gets those of :mod:`a2a_secure.system`). What this
package does not do: wait. Handler deadlines, the priority queue's slots, stream pumps and
waiting on a retry's original or an ``intent_id`` claim are :mod:`a2a_secure.runtime`'s,
the layer above, which drives this one; no module here imports it (``ServerProtocol``, which
the runtime assembles, is named below for convenience and loads from there). The HTTP
server and client are thin adapters around both. The names below load on first use
(PEP 562), so a client that imports the message layer does not load the server side.
"""

from typing import TYPE_CHECKING

from a2a_secure._lazy import attach

if TYPE_CHECKING:
    from a2a_secure.policy import DEFAULT_POLICY, Policy
    from a2a_secure.protocol.client import (
        ClientHandshake,
        ClientSession,
        HandshakeState,
        IntentResult,
        PreparedRequest,
    )
    from a2a_secure.protocol.messages import PROTOCOL_NAME, PROTOCOL_VERSION, Typ
    from a2a_secure.protocol.priority import PriorityRights
    from a2a_secure.protocol.server import (
        IntentContext,
        IntentDispatcher,
        Reply,
        ServerLimits,
    )
    from a2a_secure.runtime.router import ServerProtocol

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
    "PriorityRights",
    "Reply",
    "ServerLimits",
    "ServerProtocol",
    "Typ",
]

__getattr__, __dir__ = attach(
    __name__,
    {
        "DEFAULT_POLICY": "a2a_secure.policy",
        "PROTOCOL_NAME": "a2a_secure.protocol.messages",
        "PROTOCOL_VERSION": "a2a_secure.protocol.messages",
        "ClientHandshake": "a2a_secure.protocol.client",
        "ClientSession": "a2a_secure.protocol.client",
        "HandshakeState": "a2a_secure.protocol.client",
        "IntentContext": "a2a_secure.protocol.server",
        "IntentDispatcher": "a2a_secure.protocol.server",
        "IntentResult": "a2a_secure.protocol.client",
        "Policy": "a2a_secure.policy",
        "PreparedRequest": "a2a_secure.protocol.client",
        "PriorityRights": "a2a_secure.protocol.priority",
        "Reply": "a2a_secure.protocol.server",
        "ServerLimits": "a2a_secure.protocol.server",
        "ServerProtocol": "a2a_secure.runtime.router",
        "Typ": "a2a_secure.protocol.messages",
    },
)
