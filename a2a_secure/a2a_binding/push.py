"""Where an a2a-sdk agent behind the DID session may send push notifications.

A push-notification config names a URL that the agent's server will POST task updates to.
The caller who registers it is authenticated by the handshake, but that does not make the
URL safe: without a policy, any caller can point the server at its own loopback, the cloud
metadata address or an intranet host (server-side request forgery). The a2a-sdk accepts
every URL unless given a ``push_url_validator``; :class:`PushUrlPolicy` is one, with the
address rules the did:web resolver uses::

    policy = PushUrlPolicy()
    handler = DefaultRequestHandler(..., push_config_store=store, push_url_validator=policy)
    sender = BasePushNotificationSender(policy.client(), store, push_url_validator=policy)

The handler checks the URL when a config is created; the sender checks it again before each
notification. The sender's HTTP client must then connect to the address that was checked,
not to whatever the name resolves to a moment later (DNS rebinding): :meth:`PushUrlPolicy.client`
resolves the name once more, applies the same rules to that answer and dials one of its
addresses, with ``Host`` and TLS kept for the name (:mod:`a2a_secure.identity.dial`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Callable, Collection

import httpx

from a2a_secure.errors import InvalidParams
from a2a_secure.identity.addresses import Reach, address_reach, host_reach, may_point, parse_http_url
from a2a_secure.identity.dial import AddressRefused, PinnedTransport, Resolve, resolve_checked, system_resolve

__all__ = ["PushUrlPolicy"]

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _any_address(_addr: _Address) -> bool:
    return True


class PushUrlPolicy:
    """A ``push_url_validator``: True only for a URL the server may safely POST to.

    The URL must be ``https`` (``allow_http=True`` also takes ``http``) and name a host
    without user info. It is the caller's word, a remote document's, so the host may point no
    further in than ``origin``, the network such callers come from (by default public, the
    strictest: :class:`~a2a_secure.identity.addresses.Reach`): its name judged as a name
    (``localhost``, names without a dot, ``*.internal``, ``*.local`` …), and every address
    it resolves to (:func:`~a2a_secure.identity.addresses.may_point`, the rule of every
    address a document names). Hosts in ``allow_hosts`` (exact, lower case) skip the rule:
    for a known internal receiver. Any failure, including a name that does not resolve, is
    a refusal. The
    notifications themselves go through :meth:`client`, which dials only an address these
    rules allowed at that moment.
    """

    def __init__(
        self,
        *,
        allow_hosts: Collection[str] = (),
        allow_http: bool = False,
        resolve: Resolve = system_resolve,
        timeout: float = 2.0,
        origin: Reach = Reach.PUBLIC,
    ) -> None:
        self.allow_hosts = frozenset(h.lower() for h in allow_hosts)
        self.schemes = frozenset(("https", "http") if allow_http else ("https",))
        self._resolve = resolve
        self._timeout = timeout
        self.origin = origin

    def addresses_for(self, host: str) -> Callable[[_Address], bool]:
        """The address rule for ``host``: any address for an allow-listed host, else those no
        further in than ``origin``."""
        return _any_address if host in self.allow_hosts else self._reaches

    def _reaches(self, addr: _Address) -> bool:
        return may_point(address_reach(addr), self.origin)

    async def __call__(self, url: str) -> bool:
        """True if notifications may go to ``url`` (its name's addresses as resolved now)."""
        try:
            parsed = parse_http_url(url, what="push URL")
        except InvalidParams:  # every way the URL fails to parse
            return False
        host = parsed.host
        if parsed.scheme not in self.schemes:
            return False
        if host in self.allow_hosts:
            return True  # no address rule to apply (the client still dials what it resolved)
        if parsed.address is None and not may_point(host_reach(host), self.origin):
            return False
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            async with asyncio.timeout(self._timeout):
                await resolve_checked(host, port, self.addresses_for(host), resolve=self._resolve)
        except (AddressRefused, TimeoutError):
            return False
        return True

    def client(self, *, verify: ssl.SSLContext | bool = True, timeout: float = 10.0) -> httpx.AsyncClient:
        """An HTTP client for the SDK's push sender that dials only addresses this policy allows.

        Each request resolves its host once (with this policy's resolver), refuses it unless
        every address is allowed, and connects to a checked address; no proxy from the
        environment, no redirects.
        """
        transport = PinnedTransport(self.addresses_for, resolve=self._resolve, verify=verify)
        return httpx.AsyncClient(
            transport=transport, trust_env=False, follow_redirects=False, timeout=timeout
        )
