"""Where an a2a-sdk agent behind the DID session may send push notifications.

A push-notification config names a URL that the agent's server will POST task updates to.
The caller who registers it is authenticated by the handshake, but that does not make the
URL safe: without a policy, any caller can point the server at its own loopback, the cloud
metadata address or an intranet host (server-side request forgery). The a2a-sdk accepts
every URL unless given a ``push_url_validator``; :class:`PushUrlPolicy` is one, with the
address rules the did:web resolver uses::

    policy = PushUrlPolicy()
    handler = DefaultRequestHandler(..., push_config_store=store, push_url_validator=policy)
    sender = BasePushNotificationSender(client, store, push_url_validator=policy)

The handler checks the URL when a config is created; the sender checks it again before each
notification, so a name that later resolves to a private address is refused then too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection
from urllib.parse import urlsplit

from a2a_secure.identity.addresses import Reach, address_reach, host_reach, may_point

__all__ = ["PushUrlPolicy"]

# (host, port) -> the addresses the host resolves to.
Resolve = Callable[[str, int], Awaitable[list[str]]]


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class PushUrlPolicy:
    """A ``push_url_validator``: True only for a URL the server may safely POST to.

    The URL must be ``https`` (``allow_http=True`` also takes ``http``) and name a host
    without user info. It is the caller's word, a remote document's, so the host may point no
    further in than ``origin``, the network such callers come from (by default public, the
    strictest: :class:`~a2a_secure.identity.addresses.Reach`): its name judged as a name
    (``localhost``, names without a dot, ``*.internal``, ``*.local`` …), and every address
    it resolves to. Hosts in ``allow_hosts`` (exact, lower case) skip the rule: for a known
    internal receiver. Any failure, including a name that does not resolve, is a refusal.
    """

    def __init__(
        self,
        *,
        allow_hosts: Collection[str] = (),
        allow_http: bool = False,
        resolve: Resolve = _getaddrinfo,
        timeout: float = 2.0,
        origin: Reach = Reach.PUBLIC,
    ) -> None:
        self.allow_hosts = frozenset(h.lower() for h in allow_hosts)
        self.schemes = frozenset(("https", "http") if allow_http else ("https",))
        self._resolve = resolve
        self._timeout = timeout
        self.origin = origin

    async def __call__(self, url: str) -> bool:
        """True if notifications may go to ``url``."""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        if parts.scheme not in self.schemes or not host or parts.username is not None or "%" in host:
            return False
        if host in self.allow_hosts:
            return True
        try:
            return self._reaches(address_reach(ipaddress.ip_address(host)))
        except ValueError:
            pass  # a name
        if not self._reaches(host_reach(host)):
            return False
        try:
            async with asyncio.timeout(self._timeout):
                addresses = await self._resolve(host, port)
            return bool(addresses) and all(
                "%" not in a and self._reaches(address_reach(ipaddress.ip_address(a))) for a in addresses
            )
        except (OSError, ValueError, TimeoutError):
            return False

    def _reaches(self, target: Reach) -> bool:
        return may_point(target, self.origin)  # the rule of every address a document names
