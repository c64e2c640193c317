"""The agent card of the A2A binding (PROTOCOL.md §4, §10): build, sign, serve, verify.

The card is a valid A2A ``AgentCard`` built with the SDK's types:

- ``supportedInterfaces`` names the binding :data:`BINDING_URI` (so an A2A client without
  the secure transport finds no compatible interface);
- ``capabilities.extensions`` holds the required extension :data:`EXTENSION_URI` whose
  ``params`` are exactly ``{did, protocol, endpoints, intents, public_keys}``, and
  ``a2a_secure_extensions`` when the server declares extensions (PROTOCOL.md §12: sealed
  intents, intent_id, delegation, priority), with no numbers (A2A carries ``params`` as a
  protobuf ``Struct``, whose numbers are doubles);
- it is signed with the SDK's Agent Card signer by the agent's Ed25519 DID key, protected
  header exactly ``{"alg": "EdDSA", "kid": <DID key id>, "typ": "JOSE"}`` (the signer's
  defaults, HS256 and ``"jku": null``, are both wrong here).

The JSON served at ``/.well-known/agent-card.json`` is :func:`card_json`: the SDK's JSON
form of the signed card plus the §4 members at the top level (``url`` and the params).
It is a function of the signed ``AgentCard`` alone, so a client holding only the parsed card
recomputes the very bytes the server hashed: ``hash_of(card_json(card))`` is the
``manifest_hash`` the server signs in its CHALLENGE (:func:`card_manifest_hash`).

Verifiers pin the DID the caller expects, refuse ``jku`` (and any header member but
``alg``, ``kid``, ``typ``), and take keys only from the DID's resolution.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx
from a2a.client.card_resolver import parse_agent_card
from a2a.types import AgentCard, AgentExtension, AgentInterface
from a2a.utils.signing import (
    InvalidSignaturesError,
    ProtectedHeader,
    create_agent_card_signer,
    create_signature_verifier,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.json_format import MessageToDict, ParseError
from jwt.exceptions import InvalidKeyError

from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID, resolve_did_key
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.intent_id import CARD_MEMBER as EXTENSIONS_MEMBER
from a2a_secure.protocol.validate import json_equal

__all__ = [
    "A2A_PROTOCOL_VERSION",
    "BINDING_URI",
    "EXTENSION_URI",
    "CardVerificationError",
    "VerifiedCard",
    "binding_interface",
    "build_agent_card",
    "card_json",
    "card_manifest_hash",
    "card_verifier",
    "extension_params",
    "fetch_agent_card",
    "resolve_card_verifier",
    "sign_agent_card",
    "verify_card_json",
]

BINDING_URI = "https://w3id.org/a2a-secure/binding/signed-intent/v1"
EXTENSION_URI = "https://w3id.org/a2a-secure/ext/did-session/v1"
A2A_PROTOCOL_VERSION = "1.0"
PARAMS_MEMBERS = ("did", "protocol", "endpoints", "intents", "public_keys")
# The declared extensions (PROTOCOL.md §12) travel in the params too, so that the A2A
# signature covers them as well as the handshake's manifest_hash; absent when none.
OPTIONAL_PARAMS = (EXTENSIONS_MEMBER,)
ENDPOINTS = {"handshake": "/a2a/handshake", "intent": "/a2a/intent"}
_HEADER_MEMBERS = frozenset(("alg", "kid", "typ"))
MAX_CARD_BYTES = 256 * 1024


class CardVerificationError(InvalidSignaturesError):
    """The agent card is not a valid, correctly signed card of the expected DID."""


# -- building and signing -------------------------------------------------------------------


def _reject_numbers(value: Any, where: str) -> None:
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, int | float):
            raise ValueError(f"{where} must hold no numbers (A2A carries them as doubles)")
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            raise ValueError(f"{where} holds a value that is not JSON")


def build_agent_card(template: AgentCard, core: Mapping[str, Any]) -> AgentCard:
    """The unsigned A2A card: ``template`` with the binding and the extension of ``core``.

    ``core`` is the PROTOCOL.md §4 card of the a2a_secure server (``url``, ``did``,
    ``protocol``, ``endpoints``, ``intents``, ``public_keys``, the declared
    ``a2a_secure_extensions`` if any, and ``name``, ``description``, ``version`` used where
    the template leaves them empty). The template's interfaces and signatures are dropped,
    and so is any earlier copy of the extension; everything else (skills, modes,
    capabilities, provider…) is kept.
    """
    url = core.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError("the server needs its public base URL (AgentServer.url) for the A2A card")
    params = {name: copy.deepcopy(core[name]) for name in PARAMS_MEMBERS}
    for name in OPTIONAL_PARAMS:
        if name in core:
            params[name] = copy.deepcopy(core[name])
    _reject_numbers(params, "the did-session extension params")
    card = AgentCard()
    card.CopyFrom(template)
    del card.supported_interfaces[:]
    del card.signatures[:]
    card.supported_interfaces.append(
        AgentInterface(url=url, protocol_binding=BINDING_URI, protocol_version=A2A_PROTOCOL_VERSION)
    )
    for member in ("name", "description", "version"):
        if not getattr(card, member) and isinstance(core.get(member), str):
            setattr(card, member, core[member])
    kept = [ext for ext in card.capabilities.extensions if ext.uri != EXTENSION_URI]
    del card.capabilities.extensions[:]
    card.capabilities.extensions.extend(kept)
    extension = AgentExtension(
        uri=EXTENSION_URI,
        description="Calls need an a2a-secure DID session (PROTOCOL.md §10): signed, sequenced intents.",
        required=True,
    )
    extension.params.update(params)
    card.capabilities.extensions.append(extension)
    return card


class _IdentityKey(Ed25519PrivateKey):
    """An ``Ed25519PrivateKey`` for PyJWT that signs through :class:`Identity`.

    The private key never leaves the ``Identity`` (Ed25519 is deterministic, so libsodium
    gives the very signature OpenSSL would).
    """

    def __init__(self, identity: Identity) -> None:
        self._identity = identity

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self._identity.public_key)

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        return self._identity.sign(bytes(data))

    def private_bytes(
        self,
        encoding: serialization.Encoding,
        format: serialization.PrivateFormat,
        encryption_algorithm: serialization.KeySerializationEncryption,
    ) -> bytes:
        raise TypeError("this key cannot be exported")

    def private_bytes_raw(self) -> bytes:
        raise TypeError("this key cannot be exported")

    def __copy__(self) -> _IdentityKey:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _IdentityKey:
        return self


def sign_agent_card(card: AgentCard, identity: Identity) -> AgentCard:
    """``card`` signed by ``identity`` with the SDK's signer (EdDSA, header alg/kid/typ JOSE)."""
    if not identity.kid.startswith(identity.did + "#"):
        raise ValueError("the identity's key id is not a key id of its DID")
    # No ``jku`` member at all: the TypedDict lists it, and ``None`` would be sent as null.
    header = cast(ProtectedHeader, {"alg": "EdDSA", "kid": identity.kid, "typ": "JOSE"})
    signed = AgentCard()
    signed.CopyFrom(card)
    del signed.signatures[:]
    # The SDK types the key as PyJWK | str | bytes; PyJWT takes a cryptography key as well.
    key: Any = _IdentityKey(identity)
    create_agent_card_signer(key, header)(signed)
    protected = encoding.loads(encoding.b64u_decode(signed.signatures[0].protected))
    if protected != {"alg": "EdDSA", "kid": identity.kid, "typ": "JOSE"}:  # pragma: no cover - SDK drift
        raise RuntimeError("the A2A signer produced an unexpected protected header")
    return signed


# -- reading a card ---------------------------------------------------------------------------


def extension_params(card: AgentCard) -> dict[str, Any]:
    """The ``params`` of the card's did-session extension (exactly one, required)."""
    found = [ext for ext in card.capabilities.extensions if ext.uri == EXTENSION_URI]
    if len(found) != 1:
        raise CardVerificationError("the card must carry the did-session extension exactly once")
    if not found[0].required:
        raise CardVerificationError("the did-session extension must be required")
    params = MessageToDict(found[0].params)
    if not isinstance(params, dict):  # pragma: no cover - a Struct is always an object
        raise CardVerificationError("the did-session extension params must be an object")
    return params


def binding_interface(card: AgentCard) -> AgentInterface:
    """The card's interface for the signed-intent binding."""
    interface: AgentInterface
    for interface in card.supported_interfaces:
        if interface.protocol_binding == BINDING_URI:
            return interface
    raise CardVerificationError("the card names no signed-intent binding interface")


def card_json(card: AgentCard) -> dict[str, Any]:
    """The JSON served for ``card``: its A2A form plus the §4 members at the top level."""
    out: dict[str, Any] = MessageToDict(card)
    out["url"] = binding_interface(card).url
    out.update(extension_params(card))
    return out


def card_manifest_hash(card: AgentCard) -> str:
    """``hash_of`` the served card: the server's ``manifest_hash`` in the handshake."""
    return encoding.hash_of(card_json(card))


def _check_params(params: dict[str, Any], expected_did: str, resolved: ResolvedDID) -> None:
    if not set(PARAMS_MEMBERS) <= set(params) <= {*PARAMS_MEMBERS, *OPTIONAL_PARAMS}:
        raise CardVerificationError(
            "the did-session params must be exactly did, protocol, endpoints, intents and public_keys,"
            " and a2a_secure_extensions if the agent declares extensions"
        )
    try:
        _reject_numbers(params, "the did-session params")
    except ValueError as exc:
        raise CardVerificationError(str(exc)) from None
    if params["did"] != expected_did:
        raise CardVerificationError("the card names another DID than the one expected")
    if params["protocol"] != m.PROTOCOL_NAME:
        raise CardVerificationError(f"the card's protocol is not {m.PROTOCOL_NAME}")
    if not json_equal(params["endpoints"], ENDPOINTS):
        raise CardVerificationError("the card's endpoints are not those of PROTOCOL.md §4")
    intents = params["intents"]
    if not isinstance(intents, list) or not all(isinstance(i, str) and 1 <= len(i) <= 128 for i in intents):
        raise CardVerificationError("the card's intents must be goal names")
    try:
        m.bind_public_keys(m.parse_public_keys(params["public_keys"], AuthenticationFailed), resolved)
    except A2AError as exc:
        raise CardVerificationError(f"the card's public_keys: {exc.message}") from None
    if EXTENSIONS_MEMBER in params:
        declared = params[EXTENSIONS_MEMBER]
        # PROTOCOL.md §12: a sorted array of distinct names, present only when not empty.
        if (
            not isinstance(declared, list)
            or not declared
            or not all(isinstance(x, str) for x in declared)
            or declared != sorted(set(declared))
        ):
            raise CardVerificationError(
                f"the card's {EXTENSIONS_MEMBER} must be a sorted list of distinct names"
            )


def _strict_signature(protected: str, resolved: ResolvedDID) -> bool:
    try:
        header = encoding.loads(encoding.b64u_decode(protected))
    except A2AError:
        return False
    return (
        isinstance(header, dict)
        and header.keys() == _HEADER_MEMBERS
        and header["alg"] == "EdDSA"
        and header["typ"] == "JOSE"
        and isinstance(header["kid"], str)
        and resolved.key_for(header["kid"]) is not None
    )


def card_verifier(expected_did: str, resolved: ResolvedDID | None = None) -> Callable[[AgentCard], None]:
    """A ``signature_verifier`` for the SDK's card resolver and clients.

    It pins ``expected_did``: the card's extension must name it, its ``public_keys`` must
    bind to its resolution, and one signature must verify with the SDK's verifier under a
    key of that resolution, with the protected header exactly ``alg`` EdDSA, ``kid``, ``typ``
    JOSE (a ``jku``, or any other member, makes a signature count for nothing), and no
    unprotected header. ``resolved`` is the DID's resolution (needed for did:web: see
    :func:`resolve_card_verifier`); a did:key resolves offline. Raises
    :class:`CardVerificationError` (an ``a2a.utils.signing.SignatureVerificationError``).
    """
    if resolved is None:
        if not expected_did.startswith("did:key:"):
            raise ValueError("resolve the DID first (resolve_card_verifier) for methods other than did:key")
        resolved = resolve_did_key(expected_did)
    if resolved.did != expected_did:
        raise ValueError("the resolution given is not the expected DID's")
    pinned = resolved

    def key_provider(kid: str | None, jku: str | None) -> Any:  # an Ed25519PublicKey for PyJWT
        if jku is not None:
            raise InvalidKeyError("jku is refused: keys come only from DID resolution")
        key = pinned.key_for(kid) if isinstance(kid, str) else None
        if key is None:
            raise InvalidKeyError("kid is not a key of the expected DID")
        return Ed25519PublicKey.from_public_bytes(key)

    sdk_verify = create_signature_verifier(key_provider, ["EdDSA"])

    def verify(card: AgentCard) -> None:
        _check_params(extension_params(card), expected_did, pinned)
        binding_interface(card)
        strict = [
            sig
            for sig in card.signatures
            if not sig.HasField("header") and _strict_signature(sig.protected, pinned)
        ]
        if not strict:
            raise CardVerificationError("no signature by the expected DID's key with header alg/kid/typ JOSE")
        candidate = AgentCard()
        candidate.CopyFrom(card)
        del candidate.signatures[:]
        candidate.signatures.extend(strict)
        try:
            sdk_verify(candidate)
        except InvalidSignaturesError as exc:
            raise CardVerificationError(f"the card's signature does not verify: {exc}") from None

    return verify


async def resolve_card_verifier(
    expected_did: str, resolver: DIDResolver | None = None
) -> Callable[[AgentCard], None]:
    """:func:`card_verifier` for ``expected_did``, resolved first (did:web included)."""
    resolved = await (resolver or DIDResolver()).resolve(expected_did)
    return card_verifier(expected_did, resolved)


def verify_card_json(raw: Any, expected_did: str, resolved: ResolvedDID | None = None) -> AgentCard:
    """Verify the card exactly as served (``raw``, its parsed JSON) and return the A2A card.

    Besides :func:`card_verifier`, every top-level member must be the one the signed card
    implies (:func:`card_json`): the §4 members equal to the extension's ``params``, ``url``
    the binding interface's, and nothing unsigned added.
    """
    if not isinstance(raw, dict):
        raise CardVerificationError("the agent card must be a JSON object")
    try:
        card = parse_agent_card(copy.deepcopy(raw))
    except (ParseError, ValueError, TypeError) as exc:
        raise CardVerificationError(f"not an A2A agent card: {str(exc)[:120]}") from None
    card_verifier(expected_did, resolved)(card)
    expected = card_json(card)
    for name in sorted(raw.keys() | expected.keys()):
        if name not in raw or name not in expected or not json_equal(raw[name], expected[name]):
            raise CardVerificationError(f"card member {name!r} differs from the signed card")
    return card


@dataclass(frozen=True, slots=True)
class VerifiedCard:
    """A card fetched and verified: the A2A card, its JSON, and its manifest hash."""

    card: AgentCard
    raw: dict[str, Any]
    manifest_hash: str

    @property
    def did(self) -> str:
        """The DID the card names (the one that was expected)."""
        return str(extension_params(self.card)["did"])


async def fetch_agent_card(
    base_url: str,
    expected_did: str,
    *,
    http: httpx.AsyncClient | None = None,
    resolver: DIDResolver | None = None,
    path: str = "/.well-known/agent-card.json",
) -> VerifiedCard:
    """GET the agent card at ``base_url`` and verify it (:func:`verify_card_json`).

    The fetch has one deadline for the whole card (``CARD_FETCH_TIMEOUT``) and the size
    cap is counted while reading (``client.extensions.fetch_card``): a server dripping a
    byte at a time, or sending without end, cannot hold or fill the caller.
    """
    from a2a_secure.client.extensions import CARD_FETCH_TIMEOUT, fetch_card  # noqa: PLC0415

    resolved = await (resolver or DIDResolver()).resolve(expected_did)
    client = http or httpx.AsyncClient(timeout=httpx.Timeout(CARD_FETCH_TIMEOUT), follow_redirects=False)
    try:
        raw = await fetch_card(
            client, base_url.rstrip("/") + path, deadline=CARD_FETCH_TIMEOUT, error=CardVerificationError
        )
    except httpx.HTTPError:
        raise CardVerificationError("the agent card could not be fetched") from None
    finally:
        if http is None:
            await client.aclose()
    card = verify_card_json(raw, expected_did, resolved)
    return VerifiedCard(card, raw, encoding.hash_of(raw))
