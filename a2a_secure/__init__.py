"""a2a_secure: DID-authenticated handshakes and signed, sequenced intents between agents.

Importing this package needs no server extras: the FastAPI adapter loads only when
``a2a_secure.server`` (or ``A2AAgent.app``) is used. The public names below load on first
use (PEP 562), so ``import a2a_secure.identity`` does not pull in the HTTP client.
"""

from typing import TYPE_CHECKING

from a2a_secure._lazy import attach

if TYPE_CHECKING:
    from a2a_secure.agent import A2AAgent
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
    from a2a_secure.protocol.approval import NeedsApproval
    from a2a_secure.registry import AgentRegistry

from a2a_secure.version import __version__

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

__getattr__, __dir__ = attach(
    __name__,
    {
        "A2AAgent": "a2a_secure.agent",
        "A2AClient": "a2a_secure.client.http",
        "A2AError": "a2a_secure.errors",
        "AgentRegistry": "a2a_secure.registry",
        "DIDResolver": "a2a_secure.identity",
        "Identity": "a2a_secure.identity",
        "NeedsApproval": "a2a_secure.protocol.approval",
        "hash_of": "a2a_secure.identity",
        "jws_sign": "a2a_secure.identity",
        "jws_verify": "a2a_secure.identity",
        "verify_signature": "a2a_secure.identity",
    },
)
