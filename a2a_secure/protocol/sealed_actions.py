"""Actions asked on a sealed session, kept sealed at rest (PROTOCOL.md §12.1, §12.6). Pure.

An action waiting for approval lives in the store (memory or Redis) for up to its TTL plus
the retention window, longer than the session that asked for it. When that session was
sealed, its inputs crossed every proxy as ciphertext; the action they became must not then
sit in the clear in Redis. So the engine keeps such an action sealed:

- Key: HKDF-SHA256 (no salt) of the agent's Ed25519 seed, with info
  ``"a2a-secure/sealed/v1 action key|" + agent DID + "|" + action_id``: one key per action,
  which every worker holding the agent's key file derives, and nobody else (the store holds
  neither the seed nor the key). The key id of the seed is kept with the record
  (``sealed_kid``), so that after a key rotation the retired key, while its overlap window
  lasts, still opens the actions it sealed.
- AEAD: ChaCha20-Poly1305 over the JSON of ``{"action_data", "preview"}``, with a random
  12-byte nonce kept before the ciphertext, and associated data
  ``"a2a-secure/sealed/v1|action|" + agent DID + "|" + action_id + "|" + action + "|" +
  caller DID``: a record copied to another action id, another agent, another executor or
  another caller does not open.
- The hash: the approver still signs ``hash_of(action_data)`` of the plaintext (§12.1 is
  unchanged), but the store keeps only ``"hmac-sha256:" + hex(HMAC-SHA256(action key, that
  hash))``, so that whoever reads the store cannot test a guess of the data against it (as
  the §12.5 claim hash of a sealed intent). The store's atomic compare runs on that form.

Every failure to open (the key id no longer held, a record that does not open, or opens to
data whose hash is not the one kept) is -32050 (:class:`~a2a_secure.errors.ActionNotPending`):
the action cannot be acted on, and nothing runs.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from a2a_secure.errors import ActionNotPending
from a2a_secure.identity import encoding
from a2a_secure.protocol.sealing import KEY_BYTES, LABEL
from a2a_secure.store.actions import PendingAction

__all__ = ["ACTION_KEY_INFO", "HASH_PREFIX", "derive_action_key", "open_action", "seal_action"]

ACTION_KEY_INFO: Final = LABEL + " action key"
HASH_PREFIX: Final = "hmac-sha256:"
_NONCE_BYTES: Final = 12
_MEMBERS: Final = frozenset(("action_data", "preview"))


def derive_action_key(derive_key: Callable[[bytes], bytes], agent_did: str, action_id: str) -> bytes:
    """The key an action of ``agent_did`` is sealed under at rest, derived by the holder of
    the agent's key (``Identity.derive_key``: HKDF of a key file's seed, an HMAC in a token)."""
    key = derive_key(f"{ACTION_KEY_INFO}|{agent_did}|{action_id}".encode())
    if len(key) != KEY_BYTES:
        raise ValueError("a derived key must be 32 bytes")
    return key


def _aad(action: PendingAction) -> bytes:
    return "|".join(
        (LABEL, "action", action.server_did, action.action_id, action.action, action.caller_did)
    ).encode()


def _kept_hash(key: bytes, action_hash: str) -> str:
    return HASH_PREFIX + hmac.new(key, action_hash.encode("ascii"), hashlib.sha256).hexdigest()


def seal_action(
    action: PendingAction,
    *,
    kid: str,
    derive_key: Callable[[bytes], bytes],
    random_bytes: Callable[[int], bytes],
) -> PendingAction:
    """``action`` as it is stored when it was asked on a sealed session: nothing in the clear.

    ``kid`` names the key whose holder's ``derive_key`` is used (kept with the record).
    """
    key = derive_action_key(derive_key, action.server_did, action.action_id)
    nonce = random_bytes(_NONCE_BYTES)
    if len(nonce) != _NONCE_BYTES:
        raise ValueError("the random source gave a short nonce")
    plaintext = encoding.dumps({"action_data": action.action_data, "preview": action.preview})
    box = nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, _aad(action))
    return replace(
        action,
        action_data=None,
        preview=None,
        action_hash=_kept_hash(key, action.action_hash),
        sealed=encoding.b64u_encode(box),
        sealed_kid=kid,
    )


def open_action(action: PendingAction, derive_key: Callable[[bytes], bytes] | None) -> PendingAction:
    """The stored ``action`` with its data, preview and the hash the approver signs, opened.

    An action kept in the clear comes back as it is. ``derive_key``: that of the key
    ``action.sealed_kid``, None when this agent no longer holds it. Raises -32050 when it
    cannot be opened.
    """
    if action.sealed is None:
        return action
    if derive_key is None:
        raise ActionNotPending(
            "this action is sealed at rest under a key this agent no longer holds"
            " (a retired key past its overlap window)"
        )
    key = derive_action_key(derive_key, action.server_did, action.action_id)
    moved = ActionNotPending("the stored action does not open with this agent's key: it was altered or moved")
    box = encoding.b64u_decode(action.sealed, error=ActionNotPending)
    if len(box) < _NONCE_BYTES + 16:
        raise moved
    try:
        plaintext = ChaCha20Poly1305(key).decrypt(box[:_NONCE_BYTES], box[_NONCE_BYTES:], _aad(action))
    except InvalidTag:
        raise moved from None
    value: Any = encoding.loads(plaintext, error=ActionNotPending)
    if not isinstance(value, dict) or value.keys() != _MEMBERS:
        raise moved
    action_hash = encoding.hash_of(value["action_data"])
    if not hmac.compare_digest(_kept_hash(key, action_hash), action.action_hash):
        raise moved
    return replace(
        action, action_data=value["action_data"], preview=value["preview"], action_hash=action_hash
    )
