"""Resolve, check, pin: connect to the very address that was checked (ATTACKS.md E3).

A name checked against an address policy and then handed to an HTTP client is resolved a
second time when the client connects, and a DNS server the caller controls may answer a
public address to the check and ``127.0.0.1`` to the connection (DNS rebinding). Everything
here resolves a name once, refuses it unless every address it resolves to is allowed, and
connects to one of those addresses while the ``Host`` header, TLS SNI and certificate
verification keep the name:

* :func:`resolve_checked`: the one decision, for the did:web fetch
  (:class:`~a2a_secure.identity.didweb.DidWebResolver`) and for push notifications
  (:class:`~a2a_secure.a2a_binding.PushUrlPolicy`);
* :class:`PinnedTransport`: an ``httpx`` transport that makes that decision at each
  request and dials the checked address (each request gets its own connection, so a
  connection verified for one name is never reused for another name at the same address).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias

import httpx

from a2a_secure.errors import InvalidParams

__all__ = [
    "AddressRefused",
    "PinnedTransport",
    "Resolve",
    "resolve_checked",
    "system_resolve",
]

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve: TypeAlias = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port)`` -> the addresses ``host`` resolves to, as text."""

MAX_ADDRESSES: Final = 16
_MAX_CONNECT_ATTEMPTS: Final = 4
_MAX_ANSWER_BYTES: Final = 1 << 20
_FRAMING: Final = frozenset((b"transfer-encoding", b"content-length", b"connection", b"keep-alive"))


class AddressRefused(InvalidParams):
    """A host that may not be dialled; ``reason`` says why, for callers with their own words:
    ``"unresolved"``, ``"unusable"`` (a scoped or malformed answer), ``"too_many"`` or
    ``"not_allowed"`` (an address the policy refuses)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def system_resolve(host: str, port: int) -> list[str]:
    """The system resolver's TCP addresses for ``host``."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


async def resolve_checked(
    host: str,
    port: int,
    allowed: Callable[[IPAddress], bool],
    *,
    resolve: Resolve = system_resolve,
    max_addresses: int = MAX_ADDRESSES,
) -> list[IPAddress]:
    """The addresses to dial for ``host``, resolved once; all of them ``allowed``, else refused.

    An IP literal is its own answer. ANY refused address refuses the name: a rebinding
    attacker mixes a public address with ``127.0.0.1`` and hopes the second is picked.
    Raises :class:`AddressRefused`.
    """
    try:
        texts = [host] if _literal(host) is not None else await resolve(host, port)
    except (OSError, UnicodeError):
        raise AddressRefused("unresolved", "the host name does not resolve") from None
    addresses: list[IPAddress] = []
    for text in texts:
        addr = _literal(text) if "%" not in text else None  # a scope id: link-local only
        if addr is None:
            raise AddressRefused("unusable", "the host resolves to an unusable address")
        if addr not in addresses:
            addresses.append(addr)
    if not addresses:
        raise AddressRefused("unresolved", "the host name does not resolve")
    if len(addresses) > max_addresses:
        raise AddressRefused("too_many", "the host name resolves to too many addresses")
    if not all(allowed(a) for a in addresses):
        raise AddressRefused("not_allowed", "the host resolves to an address that may not be dialled")
    return addresses


def _literal(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class PinnedTransport(httpx.AsyncBaseTransport):
    """Dials, for each request, an address :func:`resolve_checked` allowed for its host.

    ``allowed(host)`` gives the address rule for a host (the host may be exempt from it: a
    rule that takes every address); a refused host is an ``httpx.ConnectError`` before any
    connection. The answer is read whole (at most 1 MiB) before the connection closes: for
    short exchanges such as webhook POSTs, not for streams.
    """

    def __init__(
        self,
        allowed: Callable[[str], Callable[[IPAddress], bool]],
        *,
        resolve: Resolve = system_resolve,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._allowed = allowed
        self._resolve = resolve
        self._verify = verify

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Resolve, check, then send ``request`` to the checked address."""
        url = request.url
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            addresses = await resolve_checked(host, port, self._allowed(host), resolve=self._resolve)
        except AddressRefused as exc:
            raise httpx.ConnectError(f"{host}: {exc.message}", request=request) from None
        body = await request.aread()
        for addr in addresses[:_MAX_CONNECT_ATTEMPTS]:
            try:
                return await self._send_to(addr, host, request, body)
            except httpx.ConnectError:
                continue  # nothing was sent: the next checked address
        raise httpx.ConnectError(f"{host}: no checked address could be reached", request=request)

    async def _send_to(
        self, addr: IPAddress, host: str, request: httpx.Request, body: bytes
    ) -> httpx.Response:
        # The URL names the checked address, so nothing resolves the name again; Host keeps
        # the name (httpx set it from the original URL) and "sni_hostname" makes TLS send
        # and verify the name. One connection per request, closed before returning.
        extensions = dict(request.extensions)
        if _literal(host) is None:
            extensions["sni_hostname"] = host
        pinned = httpx.Request(
            request.method,
            request.url.copy_with(host=str(addr)),
            headers=request.headers,
            content=body,
            extensions=extensions,
        )
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
        async with httpx.AsyncHTTPTransport(verify=self._verify, limits=limits) as inner:
            response = await inner.handle_async_request(pinned)
            try:
                answer = await _read_capped(response)
            finally:
                await response.aclose()
        # The body is whole now: the framing headers of the connection no longer apply.
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _FRAMING]
        return httpx.Response(response.status_code, headers=headers, content=answer, request=request)


async def _read_capped(response: httpx.Response) -> bytes:
    out = bytearray()
    async for chunk in response.aiter_raw():
        out += chunk
        if len(out) > _MAX_ANSWER_BYTES:
            raise httpx.ReadError("the answer is larger than 1 MiB")
    return bytes(out)
