"""The handshake responder (PROTOCOL.md §5): HELLO → CHALLENGE, PROOF → POLICY, ACCEPT → SESSION.

Checks run in the order of the specification, cheap before expensive: shapes, then state
look-ups, then signatures, and a did:web fetch only for a HELLO that passed every check
that needs no network. Each step sets on the request's :class:`AuditFields` what it learnt
(the claimed DID, whether a signature was checked, the session opened).

State: none of its own. A pending handshake (§5.2-§5.5) and an open session (§5.6) live
in the :class:`Store`; this room writes both (a pending handshake under this agent's DID:
another agent sharing the store never finds it), and notes each session it opens in the
:class:`SessionDeadlines`. It offers the policy of the :class:`ServerConfig` to new
handshakes (a session keeps the one it agreed to).
"""

from __future__ import annotations

from typing import Any

from a2a_secure.errors import AuthenticationFailed, HandshakeUnknown, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign_awaited, jws_token, jws_verify
from a2a_secure.identity.resolver import ResolvedDID
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import sealing
from a2a_secure.protocol.capacity import SHARED, full, pool_of
from a2a_secure.protocol.models import (
    AcceptPayload,
    AcceptPolicy,
    Hello,
    Proof,
    ProofPayload,
    PublicKeyEntry,
)
from a2a_secure.protocol.refusal import sign_refusal
from a2a_secure.protocol.server.auditing import AuditFields
from a2a_secure.protocol.server.common import Clock, RandomSource, ServerConfig, stale
from a2a_secure.protocol.server.deadlines import SessionDeadlines
from a2a_secure.protocol.validate import is_fresh
from a2a_secure.store.base import OpenResult, PendingHandshake, SessionRecord
from a2a_secure.system import WallSeconds

__all__ = ["SEALED_REQUIRED", "HandshakeResponder"]

SEALED_REQUIRED = "sealed intents required: accept_policy carries no seal_key"
"""The message of the refusal of a session without seal keys at a server that requires them."""


class HandshakeResponder:
    """The server's three handshake steps; each returns the ``result`` member to send."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        deadlines: SessionDeadlines,
        clock: Clock,
        random_bytes: RandomSource,
    ) -> None:
        self._config = config
        self._deadlines = deadlines
        self._clock = clock
        self._random = random_bytes
        self._public_keys = [config.identity.public_key_entry()]

    def _now(self) -> tuple[WallSeconds, int]:
        now = self._clock()
        return now, int(now)

    # -- §5.1 HELLO → §5.2 CHALLENGE ------------------------------------------------------
    async def hello(self, params: Any, source: str, audit: AuditFields) -> dict[str, Any]:
        """Answer a HELLO with a CHALLENGE and keep the pending handshake."""
        cfg = self._config
        now, now_i = self._now()

        # §5.1 order, up to the DID syntax: string type and version, version (-32046), other
        # shapes, freshness (-32045), DID syntax. The claimed DID is audited once a string.
        def claimed(did: str) -> None:
            audit.client_did = did[:256]

        hello = Hello.parse(params, now=now, on_agent_did=claimed)
        agent_did = hello.agent_did
        client_manifest = hello.manifest_hash
        if agent_did == cfg.identity.did and not cfg.limits.allow_self_handshake:
            raise AuthenticationFailed("refusing a handshake with this agent's own DID")
        resolved: ResolvedDID = await cfg.resolver.resolve(agent_did)
        client_keys = m.bind_public_keys(PublicKeyEntry.pairs(hello.public_keys), resolved)
        await cfg.key_guard.check_hello(cfg.store, cfg.resolver, agent_did, client_keys, resolved, now)

        nonce_b = encoding.b64u_encode(self._random(m.NONCE_BYTES))
        hello_hash = encoding.hash_of(params)  # §5: of the params as received
        policy = cfg.policy
        policy_hash = policy.hash
        payload = {
            "protocol_version": m.PROTOCOL_VERSION,
            "hello_hash": hello_hash,
            "client_did": agent_did,
            "server_did": cfg.identity.did,
            "nonce_a": hello.nonce,
            "nonce_b": nonce_b,
            "client_manifest_hash": client_manifest,
            "server_manifest_hash": cfg.manifest_hash,
            "policy_hash": policy_hash,
            "timestamp": now_i,
        }
        # Hashed into the challenge and kept with the pending handshake: awaited now.
        policy_signature = await jws_sign_awaited(payload, cfg.identity, m.Typ.POLICY)
        challenge = {
            "type": "challenge",
            "protocol_version": m.PROTOCOL_VERSION,
            "nonce_b": nonce_b,
            "server_did": cfg.identity.did,
            "manifest_hash": cfg.manifest_hash,
            "public_keys": self._public_keys,
            "policy_hash": policy_hash,
            "policy_signature": policy_signature,
            "timestamp": now_i,
        }
        pending = PendingHandshake(
            nonce_b=nonce_b,
            nonce_a=hello.nonce,
            client_did=agent_did,
            client_agent_id=hello.agent_id,
            client_keys=client_keys,
            client_manifest_hash=client_manifest,
            server_manifest_hash=cfg.manifest_hash,
            hello_hash=hello_hash,
            challenge_hash=encoding.hash_of(challenge),
            policy=policy,
            policy_hash=policy_hash,
            policy_signature=policy_signature,
            created_at=now_i,
            expires_at=now_i + m.PENDING_LIFETIME,
            source=source,
            server_did=cfg.identity.did,
        )
        # The DID is only claimed yet: a stranger naming a reserved caller reaches that share
        # of pending handshakes, within its address's quota, and no further than the PROOF.
        added = await cfg.store.add_pending(
            pending,
            max_per_source=cfg.limits.max_pending_per_source,
            max_total=cfg.limit_for(cfg.limits.max_pending_total, agent_did),
            now=now,
        )
        if not added:
            raise full("too many pending handshakes", retry_after=5, pool=pool_of(added))
        return challenge

    # -- §5.3 PROOF → §5.4 POLICY ---------------------------------------------------------
    async def _pending_for(self, nonce_b: str) -> PendingHandshake:
        did = self._config.identity.did
        pending = await self._config.store.get_pending(nonce_b, self._clock(), agent=did)
        # Only a CHALLENGE this agent sent: the client signs every other value it is compared
        # with, so another agent's pending handshake (one store shared by several agents)
        # would open a session here under that agent's policy, skipping this agent's HELLO
        # checks. The store keys it by agent; a record that names another is refused as well.
        if pending is None or pending.server_did != did:
            raise HandshakeUnknown("unknown or expired handshake")
        return pending

    async def proof(self, params: Any, audit: AuditFields) -> dict[str, Any]:
        """Verify a PROOF and answer with the signed POLICY."""
        proof = Proof.parse(params)
        header = proof.decoded[0]
        pending = await self._pending_for(proof.nonce_b)
        audit.client_did = pending.client_did
        if pending.proven_kid is not None:
            raise HandshakeUnknown("handshake already proven")
        kid = header.get("kid")
        key = pending.client_keys.get(kid) if isinstance(kid, str) else None
        if key is None or not isinstance(kid, str):
            raise AuthenticationFailed("proof kid is not a key the client's DID resolved to")
        audit.signature_checked = True
        payload = jws_verify(proof.proof_jws, key, typ=m.Typ.PROOF, kid=kid, decoded=proof.decoded)
        ts = ProofPayload.parse(
            payload,
            expected={
                "nonce_a": pending.nonce_a,
                "nonce_b": pending.nonce_b,
                "client_did": pending.client_did,
                "server_did": self._config.identity.did,
                "client_manifest_hash": pending.client_manifest_hash,
                "server_manifest_hash": pending.server_manifest_hash,
                "challenge_hash": pending.challenge_hash,
            },
        ).timestamp
        now = self._clock()
        if not is_fresh(ts, now):
            raise stale("proof", ts, now)
        if not await self._config.store.mark_proven(pending.nonce_b, kid, now, agent=pending.server_did):
            raise HandshakeUnknown("handshake already proven or expired")
        audit.verified = True
        return {
            "type": "policy",
            "policy": pending.policy.to_dict(),
            "policy_hash": pending.policy_hash,
            "policy_signature": pending.policy_signature,
        }

    # -- §5.5 ACCEPT_POLICY → §5.6 SESSION ------------------------------------------------
    async def accept(self, params: Any, audit: AuditFields) -> dict[str, Any]:
        """Verify an ACCEPT_POLICY, open the session and answer with the signed SESSION."""
        cfg = self._config
        accept = AcceptPolicy.parse(params)
        pending = await self._pending_for(accept.nonce_b)
        audit.client_did = pending.client_did
        kid = pending.proven_kid
        if kid is None:
            raise HandshakeUnknown("handshake not proven")
        audit.signature_checked = True
        payload = jws_verify(
            accept.accept_jws, pending.client_keys[kid], typ=m.Typ.ACCEPT, kid=kid, decoded=accept.decoded
        )
        commitment = m.session_commitment(pending.nonce_a, pending.nonce_b, pending.policy_hash)
        # §12.6: a seal_key is taken only by a server that declares sealed intents; anywhere
        # else it is an unexpected member of the signed payload (-32040).
        optional = frozenset((sealing.KEY_MEMBER,)) if cfg.limits.sealed_intents else frozenset()
        ts = AcceptPayload.parse(
            payload,
            optional=optional,
            expected={
                "policy_hash": pending.policy_hash,
                "session_commitment": commitment,
                "nonce_a": pending.nonce_a,
                "nonce_b": pending.nonce_b,
                "client_did": pending.client_did,
                "server_did": cfg.identity.did,
            },
        ).timestamp
        client_seal = payload.get(sealing.KEY_MEMBER) if optional else None
        if client_seal is not None:
            sealing.parse_seal_key(client_seal)  # 32 bytes, else -32040 before anything opens
        now, now_i = self._now()
        if not is_fresh(ts, now):
            raise stale("accept_policy", ts, now)
        audit.verified = True
        if client_seal is None and cfg.limits.require_sealed:
            # §12.6: the one place every door that opens a session decides it (the /a2a
            # handshake, the A2A binding, serve --app); signed, the pending handshake kept.
            raise sign_refusal(
                PolicyViolation(SEALED_REQUIRED),
                cfg.identity,
                nonce_a=pending.nonce_a,
                nonce_b=pending.nonce_b,
                client_did=pending.client_did,
                accept_jws=accept.accept_jws,
                now=now_i,
            )
        session_id = encoding.b64u_encode(self._random(m.SESSION_ID_BYTES))
        expires_at = now_i + pending.policy.session_timeout
        seal_keys, server_seal = b"", None
        if client_seal is not None:
            # The server's ephemeral key lives only in this call: once the session's keys are
            # gone, nothing the server keeps opens the session's traffic again.
            ephemeral = sealing.EphemeralKey(self._random)
            server_seal = ephemeral.public_b64u
            shared = ephemeral.exchange(sealing.parse_seal_key(client_seal))
            seal_keys = sealing.derive_keys(
                shared,
                sealing.transcript(
                    client_did=pending.client_did,
                    server_did=cfg.identity.did,
                    nonce_a=pending.nonce_a,
                    nonce_b=pending.nonce_b,
                    session_id=session_id,
                    session_commitment=commitment,
                    client_seal_key=client_seal,
                    server_seal_key=server_seal,
                ),
            ).to_bytes()
        record = SessionRecord(
            session_id=session_id,
            session_commitment=commitment,
            client_did=pending.client_did,
            server_did=cfg.identity.did,
            client_kid=kid,
            client_key=pending.client_keys[kid],
            policy=pending.policy,
            created_at=now_i,
            expires_at=expires_at,
            client_agent_id=pending.client_agent_id,
            server_kid=cfg.identity.kid,
            seal_keys=seal_keys,
        )
        max_sessions = cfg.limit_for(cfg.limits.max_sessions, pending.client_did)  # proven now
        opened = await cfg.store.open_session(
            pending.nonce_b, record, max_sessions=max_sessions, now=now, agent=pending.server_did
        )
        if opened is OpenResult.HANDSHAKE_GONE:
            raise HandshakeUnknown("handshake already used or expired")
        if opened is OpenResult.FULL:
            raise full("too many open sessions", retry_after=30, pool=SHARED)
        self._deadlines.note(session_id, pending.policy.session_timeout)
        audit.session_id = session_id
        session_payload = {
            "session_id": session_id,
            "session_commitment": commitment,
            "client_did": pending.client_did,
            "server_did": cfg.identity.did,
            "created_at": now_i,
            "expires_at": expires_at,
        }
        if server_seal is not None:
            session_payload[sealing.KEY_MEMBER] = server_seal
        return {
            "type": "session",
            "session_id": session_id,
            "server_did": cfg.identity.did,
            "client_did": pending.client_did,
            "session_commitment": commitment,
            "created_at": now_i,
            "expires_at": expires_at,
            "public_keys": self._public_keys,
            "session_jws": jws_token(session_payload, cfg.identity, m.Typ.SESSION),
        }
