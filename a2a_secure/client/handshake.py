"""The handshake driver and card discovery: what opens a session with one server.

:class:`Peer` is one server as the client knows it: the core's
:class:`~a2a_secure.protocol.client_decisions.PeerState` (its session, its card's
extensions, whether a verified card of it declared ``sealed``, its failed card look-ups),
plus where it is and a lock that keeps its sequences in order. :class:`Handshaker` resolves
the server's DID, drives the core's :class:`~a2a_secure.protocol.client_handshake.ClientHandshake`
through the four steps over the :class:`~a2a_secure.client.transport.Transport`, and learns
the extensions the server's authenticated card declares (its hash is the manifest hash the
CHALLENGE signed): whether to seal is the core's :func:`~a2a_secure.protocol.client_decisions.seal`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from a2a_secure import system
from a2a_secure.client.endpoint import check_endpoint
from a2a_secure.client.extensions import fetch_extensions, known_extensions
from a2a_secure.client.transport import Transport
from a2a_secure.client.turns import Turns
from a2a_secure.errors import A2AError
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.remote import finish_tokens
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.policy import Policy
from a2a_secure.protocol.client_decisions import PeerState, seal
from a2a_secure.protocol.client_handshake import ClientHandshake
from a2a_secure.protocol.client_session import ClientSession
from a2a_secure.telemetry import tracing

__all__ = ["Handshaker", "Peer"]


class Peer(PeerState):
    """One server: its endpoint and the core's state of it, with a lock keeping sequences
    ordered (one call at a time signs on its session)."""

    def __init__(self, did: str, endpoint: str) -> None:
        super().__init__()
        self.did = did
        self.endpoint = check_endpoint(endpoint)
        self.lock = Turns(1)
        self.key_timer: asyncio.TimerHandle | None = None  # drops a sealed session's keys

    def hold(self, session: ClientSession) -> None:
        """Make ``session`` this peer's, and drop its sealing keys when it expires (§12.6),
        whether or not it is used again: a timer, checked against the session's own clock."""
        self.session = session
        if self.key_timer is not None:
            self.key_timer.cancel()
            self.key_timer = None
        if session.sealed:
            self._keys_timer(session)

    def _keys_timer(self, session: ClientSession) -> None:
        left = session.drop_keys()
        if left is not None:  # not ended yet by its clock: look again then
            loop = asyncio.get_running_loop()
            self.key_timer = loop.call_later(left + 0.05, self._keys_timer, session)
        else:
            self.key_timer = None

    def forget_timer(self) -> None:
        """Cancel the timer (the client is closing; its sessions go with it)."""
        if self.key_timer is not None:
            self.key_timer.cancel()
            self.key_timer = None


# The client's audit and trace hook for one step: ``A2AClient._record(event, started, peer,
# *, error=None, goal=None, sequence=None, verified=True)``.
Record = Callable[..., None]


class Handshaker:
    """Opens sessions for one client (see the module doc); its settings are read per call,
    so a client's ``sealed``, ``exactly_once``, ``manifest_hash`` and ``accept_policy`` may
    change between calls."""

    def __init__(
        self,
        identity: Identity,
        resolver: DIDResolver,
        transport: Transport,
        http: httpx.AsyncClient,
        clock: Callable[[], float],
        record: Record,
    ) -> None:
        self.identity = identity
        self.resolver = resolver
        self.transport = transport
        self.http = http
        self.clock = clock
        self.record = record

    async def card_extensions(
        self, peer: Peer, manifest_hash: str, *, retry_failed: bool = False
    ) -> frozenset[str] | None:
        """The extensions of ``peer``'s verified card with hash ``manifest_hash``, or None.

        A look-up that failed lately for this server is not tried again unless
        ``retry_failed`` (the caller needs certainty: a member it is about to send, or a
        server that must seal).
        """
        if not manifest_hash:
            return None
        known = known_extensions(manifest_hash)  # a verified card (fetched, or learnt whole)
        if known is not None:
            peer.card_verified(known)
            return known
        mono = system.mono_now()
        if not retry_failed and peer.card_failure_fresh(manifest_hash, mono):
            return None
        found = await fetch_extensions(self.http, peer.endpoint, manifest_hash)
        if found is None:
            peer.card_failed(manifest_hash, mono)
            return None
        peer.card_verified(found)
        return found

    async def open(
        self,
        peer: Peer,
        *,
        sealed: bool | None,
        exactly_once: bool | None,
        manifest_hash: str | None,
        accept: Callable[[Policy], bool] | None,
    ) -> ClientSession:
        """Run the handshake with ``peer`` and make the new session its current one."""
        with tracing.client_span("handshake", peer.did):  # the steps are its events (record)
            resolved = await self.resolver.resolve(peer.did)
            hs = ClientHandshake(self.identity, resolved, manifest_hash=manifest_hash, clock=self.clock)
            url = peer.endpoint + "/a2a/handshake"
            msg: Any = hs.hello()
            session: ClientSession | None = None
            for method in ("hello", "proof", "accept_policy"):
                started = self.clock()
                try:
                    if self.identity.remote:  # the core left the signature to be awaited
                        await finish_tokens(msg)
                    _status, result, error, _ra = await self.transport.call(url, method, msg)
                    if error is not None:
                        refused = self.transport.plain_error(error)
                        if method == "accept_policy":  # §12.6: a server's own refusal is signed
                            refused.signed = hs.refusal_is_signed(error, msg)
                        raise refused
                    if method == "hello":
                        msg = hs.receive_challenge(result)
                        if sealed is not False:
                            # The card is the one whose hash the CHALLENGE just signed.
                            must = sealed is True or peer.sealed_seen
                            declared = await self.card_extensions(
                                peer, hs.server_manifest_hash, retry_failed=must
                            )
                            hs.seal = seal(peer.did, sealed, declared, seen=peer.sealed_seen)
                    elif method == "proof":
                        msg = hs.receive_policy(result, accept=accept)
                    else:
                        session = hs.receive_session(result)
                        peer.hold(session)
                except A2AError as exc:
                    self.record(method, started, peer, error=exc)
                    raise
                self.record(method, started, peer, verified=True)
            assert session is not None
            peer.new_session()
            if exactly_once is not False:
                peer.extensions = (
                    await self.card_extensions(peer, session.server_manifest_hash) or frozenset()
                )
            return session
