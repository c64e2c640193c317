"""a2a_secure: DID-authenticated handshakes and signed, sequenced intents between agents.

Importing this package needs no server extras: the FastAPI adapter loads only when
``a2a_secure.server`` (or ``A2AAgent.app``) is used.
"""

from a2a_secure.agent import A2AAgent, AgentRegistry
from a2a_secure.approval import NeedsApproval
from a2a_secure.client.http import A2AClient
from a2a_secure.errors import A2AError
from a2a_secure.identity import (
    DIDResolver,
    Identity,
    hash_of,
    jws_sign,
    jws_verify,
    verify_signature,
)

__version__ = "0.1.0"

__all__ = [
    "A2AAgent",
    "A2AClient",
    "A2AError",
    "AgentRegistry",
    "DIDResolver",
    "Identity",
    "NeedsApproval",
    "__version__",
    "hash_of",
    "jws_sign",
    "jws_verify",
    "verify_signature",
]
