"""The client's half of the handshake (PROTOCOL.md §5): no sockets, no HTTP.

``ClientHandshake`` is a small state machine in the manner of h11: each ``receive_*``
method takes the peer's reply, checks all of it, and returns the next message to send;
calling a method out of order, or after any failure, raises (errors are sticky: a failed
handshake is never resumed). It hands over to a
:class:`~a2a_secure.protocol.client_session.ClientSession`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

from a2a_secure import system
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    InvalidRequest,
    PolicyViolation,
    StaleTimestamp,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_token, jws_verify
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import ResolvedDID
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol import refusal, sealing
from a2a_secure.protocol.client_session import ClientSession, Clock, RandomSource
from a2a_secure.protocol.models import (
    Challenge,
    PolicyMessage,
    PolicyPayload,
    PublicKeyEntry,
    SessionMessage,
    SessionPayload,
)
from a2a_secure.protocol.validate import check_payload_matches, is_fresh, json_equal

__all__ = ["ClientHandshake", "HandshakeState"]


class HandshakeState(enum.Enum):
    """Where a client handshake stands. Any failure moves it to ``FAILED`` for good."""

    START = "start"
    SENT_HELLO = "sent_hello"
    SENT_PROOF = "sent_proof"
    SENT_ACCEPT = "sent_accept"
    DONE = "done"
    FAILED = "failed"


# Rule: every transition of the client handshake is listed here; anything else is an error.
_TRANSITIONS: dict[tuple[HandshakeState, str], HandshakeState] = {
    (HandshakeState.START, "hello"): HandshakeState.SENT_HELLO,
    (HandshakeState.SENT_HELLO, "challenge"): HandshakeState.SENT_PROOF,
    (HandshakeState.SENT_PROOF, "policy"): HandshakeState.SENT_ACCEPT,
    (HandshakeState.SENT_ACCEPT, "session"): HandshakeState.DONE,
}


class ClientHandshake:
    """The client's half of one handshake with one server DID.

    ``server`` is the resolution of the DID the client means to reach, done by the adapter
    before the handshake starts: the server's key is pinned from it, never from a message.
    """

    def __init__(
        self,
        identity: Identity,
        server: ResolvedDID,
        *,
        manifest_hash: str | None = None,
        clock: Clock = system.wall_clock,
        random_bytes: RandomSource = system.random_bytes,
    ) -> None:
        self.identity = identity
        self.server = server
        self.manifest_hash = manifest_hash or m.client_manifest_hash(identity.agent_id, identity.did)
        self._clock = clock
        self._random = random_bytes
        self.state = HandshakeState.START
        self._hello: dict[str, Any] | None = None
        self._challenge: Challenge | None = None
        self._server_kid = ""
        self._server_key = b""
        self._policy: Policy | None = None
        self.nonce_a = ""
        self.nonce_b = ""
        # Sealed intents (§12.6): set before the POLICY arrives to bring a seal_key.
        self.seal = False
        self._ephemeral: sealing.EphemeralKey | None = None

    @property
    def server_manifest_hash(self) -> str:
        """The server's manifest hash, signed in its CHALLENGE ("" before it is checked)."""
        return self._challenge.manifest_hash if self._challenge is not None else ""

    def _advance(self, event: str) -> None:
        nxt = _TRANSITIONS.get((self.state, event))
        if nxt is None:
            previous = self.state
            self.state = HandshakeState.FAILED
            raise InvalidRequest(f"{event} is not expected in state {previous.value}")
        self.state = nxt

    def _guard(self, event: str, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self._advance(event)
        try:
            return step()
        except A2AError:
            self.state = HandshakeState.FAILED
            raise
        except Exception:
            self.state = HandshakeState.FAILED
            raise AuthenticationFailed("malformed handshake reply") from None

    # -- HELLO ----------------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        """The HELLO params to send (method ``hello``)."""
        return self._guard("hello", self._make_hello)

    def _make_hello(self) -> dict[str, Any]:
        if self.server.did == self.identity.did:
            raise AuthenticationFailed("refusing a handshake with this agent's own DID")
        self.nonce_a = encoding.b64u_encode(self._random(m.NONCE_BYTES))
        self._hello = {
            "type": "hello",
            "protocol_version": m.PROTOCOL_VERSION,
            "agent_did": self.identity.did,
            "agent_id": self.identity.agent_id,
            "manifest_hash": self.manifest_hash,
            "nonce": self.nonce_a,
            "public_keys": [self.identity.public_key_entry()],
            "timestamp": int(self._clock()),
        }
        return self._hello

    # -- CHALLENGE → PROOF --------------------------------------------------------------------
    def receive_challenge(self, challenge: Any) -> dict[str, Any]:
        """Check the CHALLENGE (§5.2) and return the PROOF params (method ``proof``)."""
        return self._guard("challenge", lambda: self._on_challenge(challenge))

    def _on_challenge(self, c: Any) -> dict[str, Any]:
        assert self._hello is not None
        err = AuthenticationFailed
        challenge = Challenge.parse(c, server_did=self.server.did)
        nonce_b, ts = challenge.nonce_b, challenge.timestamp
        bound = m.bind_public_keys(PublicKeyEntry.pairs(challenge.public_keys), self.server)
        decoded = jws_decode_unverified(challenge.policy_signature)
        kid = decoded[0].get("kid")
        if not isinstance(kid, str) or kid not in bound:
            raise err("policy signature kid is not a bound server key")
        payload = jws_verify(
            challenge.policy_signature, bound[kid], typ=m.Typ.POLICY, kid=kid, decoded=decoded
        )
        PolicyPayload.parse(
            payload,
            expected={
                "protocol_version": m.PROTOCOL_VERSION,
                "hello_hash": encoding.hash_of(self._hello),
                "client_did": self.identity.did,
                "server_did": self.server.did,
                "nonce_a": self.nonce_a,
                "nonce_b": nonce_b,
                "client_manifest_hash": self.manifest_hash,
                "server_manifest_hash": challenge.manifest_hash,
                "policy_hash": challenge.policy_hash,
                "timestamp": ts,
            },
        )
        now = self._clock()
        if not is_fresh(ts, now):
            raise StaleTimestamp("challenge timestamp is not fresh")
        self._challenge = challenge
        self._server_kid, self._server_key = kid, bound[kid]
        self.nonce_b = nonce_b
        payload = {
            "nonce_a": self.nonce_a,
            "nonce_b": nonce_b,
            "client_did": self.identity.did,
            "server_did": self.server.did,
            "client_manifest_hash": self.manifest_hash,
            "server_manifest_hash": challenge.manifest_hash,
            "challenge_hash": encoding.hash_of(c),  # §5: of the CHALLENGE as received
            "timestamp": int(now),
        }
        return {
            "type": "proof",
            "nonce_b": nonce_b,
            "proof_jws": jws_token(payload, self.identity, m.Typ.PROOF),
        }

    # -- POLICY → ACCEPT_POLICY -----------------------------------------------------------
    def receive_policy(self, msg: Any, *, accept: Callable[[Policy], bool] | None = None) -> dict[str, Any]:
        """Check the POLICY (§5.4) and return the ACCEPT_POLICY params.

        ``accept`` may refuse a policy the caller does not want (``PolicyViolation``).
        """
        return self._guard("policy", lambda: self._on_policy(msg, accept))

    def _on_policy(self, msg: Any, accept: Callable[[Policy], bool] | None) -> dict[str, Any]:
        assert self._challenge is not None
        err = AuthenticationFailed
        parsed = PolicyMessage.parse(msg)
        policy = parsed.policy
        if not json_equal(parsed.policy_hash, self._challenge.policy_hash):
            raise err("policy_hash differs from the signed one")
        # Hashed as received (to_dict() would give an equal object; this needs no argument).
        if not json_equal(encoding.hash_of(msg["policy"]), parsed.policy_hash):
            raise err("policy does not hash to policy_hash")
        if not json_equal(parsed.policy_signature, self._challenge.policy_signature):
            raise err("policy_signature is not the challenge's")
        if accept is not None and not accept(policy):
            raise PolicyViolation("the offered policy was refused by this client")
        self._policy = policy
        policy_hash = self._challenge.policy_hash  # equal to the message's, checked above
        payload = {
            "policy_hash": policy_hash,
            "session_commitment": m.session_commitment(self.nonce_a, self.nonce_b, policy_hash),
            "nonce_a": self.nonce_a,
            "nonce_b": self.nonce_b,
            "client_did": self.identity.did,
            "server_did": self.server.did,
            "timestamp": int(self._clock()),
        }
        if self.seal:
            self._ephemeral = sealing.EphemeralKey(self._random)
            payload[sealing.KEY_MEMBER] = self._ephemeral.public_b64u
        return {
            "type": "accept_policy",
            "nonce_b": self.nonce_b,
            "accept_jws": jws_token(payload, self.identity, m.Typ.ACCEPT),
        }

    def refusal_is_signed(self, error: Any, accept_params: Mapping[str, Any]) -> bool:
        """Whether ``error``, answering the ACCEPT_POLICY ``accept_params``, is signed (§12.6)."""
        return refusal.refusal_is_signed(
            error,
            server_key=self._server_key,
            server_kid=self._server_kid,
            expected={
                "nonce_a": self.nonce_a,
                "nonce_b": self.nonce_b,
                "client_did": self.identity.did,
                "server_did": self.server.did,
            },
            accept_jws=accept_params.get("accept_jws", ""),
            now=self._clock(),
        )

    # -- SESSION ------------------------------------------------------------------------------
    def receive_session(self, msg: Any) -> ClientSession:
        """Check the SESSION (§5.6) and return the open session."""
        holder: dict[str, ClientSession] = {}

        def step() -> dict[str, Any]:
            holder["s"] = self._on_session(msg)
            return {}

        self._guard("session", step)
        return holder["s"]

    def _on_session(self, s: Any) -> ClientSession:
        assert self._policy is not None and self._challenge is not None
        err = AuthenticationFailed
        session = SessionMessage.parse(s)
        created, expires = session.created_at, session.expires_at
        commitment = m.session_commitment(self.nonce_a, self.nonce_b, self._challenge.policy_hash)
        m.bind_public_keys(PublicKeyEntry.pairs(session.public_keys), self.server)
        payload = jws_verify(session.session_jws, self._server_key, typ=m.Typ.SESSION, kid=self._server_kid)
        expected = {
            "session_id": session.session_id,
            "session_commitment": commitment,
            "client_did": self.identity.did,
            "server_did": self.server.did,
            "created_at": created,
            "expires_at": expires,
        }
        # §12.6: a seal_key answers ours; without ours there must be none (exact members).
        extra = frozenset((sealing.KEY_MEMBER,)) if self._ephemeral is not None else frozenset()
        SessionPayload.parse(payload, expected=expected, extra=extra)
        check_payload_matches(
            session.to_dict(), {k: v for k, v in expected.items() if k != "session_id"}, err
        )
        if expires != created + self._policy.session_timeout:
            raise err("expires_at is not created_at + session_timeout")
        if not is_fresh(created, self._clock()):
            raise StaleTimestamp("session created_at is not fresh")
        keys = None
        if self._ephemeral is not None:
            server_seal = payload[sealing.KEY_MEMBER]
            client_seal = self._ephemeral.public_b64u
            shared = self._ephemeral.exchange(sealing.parse_seal_key(server_seal))
            self._ephemeral = None  # the private half is gone: forward secrecy
            keys = sealing.derive_keys(
                shared,
                sealing.transcript(
                    client_did=self.identity.did,
                    server_did=self.server.did,
                    nonce_a=self.nonce_a,
                    nonce_b=self.nonce_b,
                    session_id=session.session_id,
                    session_commitment=commitment,
                    client_seal_key=client_seal,
                    server_seal_key=server_seal,
                ),
            )
        return ClientSession(
            identity=self.identity,
            server_did=self.server.did,
            server_kid=self._server_kid,
            server_key=self._server_key,
            session_id=session.session_id,
            session_commitment=commitment,
            policy=self._policy,
            created_at=created,
            expires_at=expires,
            server_manifest_hash=self._challenge.manifest_hash,
            clock=self._clock,
            seal_keys=keys,
        )
