"""The binding for the official A2A protocol (PROTOCOL.md §10): the ``a2a`` extra.

Run any a2a-sdk agent so that only callers that completed the DID handshake reach it, every
call is signed and sequenced, and every answer, streamed ones included, is signed:

- :class:`A2ABridge` mounts an a2a-sdk ``RequestHandler`` into an ``AgentServer``, one goal
  per A2A method, calling it in-process for the caller's DID;
- :func:`build_agent_card`, :func:`sign_agent_card`, :func:`card_verifier`,
  :func:`fetch_agent_card`: the agent card as a valid, signed A2A ``AgentCard`` whose hash is
  the handshake's ``manifest_hash``;
- :class:`SecureA2ATransport` and :func:`register_secure_transport`: the a2a-sdk client
  transport, so an a2a-sdk client calls a secured agent unchanged;
- :class:`PushUrlPolicy`: the ``push_url_validator`` that keeps push notifications away
  from loopback, private and metadata addresses.

This subpackage needs ``pip install 'a2a-secure[a2a]'``; the core never imports ``a2a``.
"""

from __future__ import annotations

try:
    import a2a.types  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("a2a_secure.a2a_binding needs the a2a-sdk: pip install 'a2a-secure[a2a]'") from exc

from a2a_secure.a2a_binding.card import (
    A2A_PROTOCOL_VERSION,
    BINDING_URI,
    EXTENSION_URI,
    CardVerificationError,
    VerifiedCard,
    build_agent_card,
    card_json,
    card_manifest_hash,
    card_verifier,
    extension_params,
    fetch_agent_card,
    resolve_card_verifier,
    sign_agent_card,
    verify_card_json,
)
from a2a_secure.a2a_binding.client import (
    SecureA2ATransport,
    create_secure_client,
    register_secure_transport,
    secure_client_config,
)
from a2a_secure.a2a_binding.errors import A2AProtocolError, SecureTransportError
from a2a_secure.a2a_binding.push import PushUrlPolicy
from a2a_secure.a2a_binding.server import (
    A2A_DOMAIN,
    SERVICE_PARAMETERS,
    STREAMING_METHODS,
    UNARY_METHODS,
    A2ABridge,
    DIDUser,
)

__all__ = [
    "A2A_DOMAIN",
    "A2A_PROTOCOL_VERSION",
    "BINDING_URI",
    "EXTENSION_URI",
    "SERVICE_PARAMETERS",
    "STREAMING_METHODS",
    "UNARY_METHODS",
    "A2ABridge",
    "A2AProtocolError",
    "CardVerificationError",
    "DIDUser",
    "PushUrlPolicy",
    "SecureA2ATransport",
    "SecureTransportError",
    "VerifiedCard",
    "build_agent_card",
    "card_json",
    "card_manifest_hash",
    "card_verifier",
    "create_secure_client",
    "extension_params",
    "fetch_agent_card",
    "register_secure_transport",
    "resolve_card_verifier",
    "secure_client_config",
    "sign_agent_card",
    "verify_card_json",
]
