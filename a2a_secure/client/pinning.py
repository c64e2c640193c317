"""The client pool dials the address that was checked, for every name a document gave it.

An endpoint taken from a remote document (a did:web service endpoint, an A2A card's
interface URL) passes :func:`~a2a_secure.identity.addresses.check_address` by its name;
connecting by that name would ask DNS again, and a DNS server that answers a public address
to one question and ``127.0.0.1`` to the next (rebinding) would have the client's HELLO
reach an address nobody checked. :class:`DialPlan` remembers, for each origin (scheme,
host, port) accepted that way, the address policy and the network of the document it was
accepted under; the pool (:mod:`a2a_secure.client.pool`) then resolves such a host once
with :func:`~a2a_secure.identity.dial.resolve_checked` under that rule
(:meth:`~a2a_secure.identity.addresses.AddressPolicy.answer_rule`) and connects to one of
the checked addresses, TLS SNI and certificate verification (and the ``Host`` header)
still for the name; the client's own ``httpx`` client (agent cards) does the same through
:class:`PlanTransport`. A caller's own ``httpx`` client (``A2AClient(http=...)``) is out of
reach: it dials by name.

An IP literal is dialled as written (it was checked as it is). A name nobody recorded (an
endpoint the operator gave: in code, ``--endpoint``, a registry file it points at) is
dialled by name as before: any address is the operator's rule for it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Callable
from typing import Any, Final, TypeAlias, TypeVar

import httpx

from a2a_secure.errors import InvalidParams
from a2a_secure.identity.addresses import AddressPolicy, Reach, check_address, parse_http_url
from a2a_secure.identity.dial import (
    AddressRefused,
    PinnedTransport,
    Resolve,
    resolve_checked,
    system_resolve,
)

__all__ = ["DialPlan", "PlanTransport", "open_connection"]

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
_Key: TypeAlias = tuple[bool, str, int]  # (tls, host, port), as the pool keys its connections
_P = TypeVar("_P", bound=asyncio.BaseProtocol)

MAX_NAMES: Final = 65536
_MAX_CONNECT_ATTEMPTS: Final = 4


class DialPlan:
    """The names a client must dial by a checked address, each with the rule it was taken under.

    ``resolve``: how a name's addresses are found (the system resolver by default).
    """

    def __init__(self, *, resolve: Resolve = system_resolve, max_names: int = MAX_NAMES) -> None:
        self._resolve = resolve
        self._max_names = max_names
        # (policy, document origin) pairs each name was taken under: equal pairs are one entry.
        self._rules: dict[_Key, set[tuple[AddressPolicy, Reach]]] = {}

    def accept(self, url: object, *, what: str, origin: Reach | None, policy: AddressPolicy) -> str:
        """:func:`check_address` under ``policy``, and, for a host name a document from
        ``origin`` gave, the rule its DNS answer must meet when the client connects.

        ``InvalidParams`` for a refused URL, and (failing closed) when this client already
        holds ``max_names`` such names.
        """
        base = check_address(url, what=what, origin=origin, policy=policy)
        if origin is None:
            return base  # the operator's own: dialled by name, any address
        parsed = parse_http_url(base, what=what)
        if parsed.address is not None:
            return base  # a literal is dialled as it was checked
        tls = parsed.scheme == "https"
        key = (tls, parsed.host, parsed.port or (443 if tls else 80))
        taken = self._rules.get(key)
        if taken is None:
            if len(self._rules) >= self._max_names:
                raise InvalidParams(f"{what} is refused: this client holds too many names from documents")
            taken = self._rules[key] = set()
        taken.add((policy, origin))  # every rule it was taken under must hold
        return base

    def allowed(self, tls: bool, host: str, port: int) -> Callable[[IPAddress], bool] | None:
        """The rule ``host``'s DNS answer must meet; None for a name nobody recorded."""
        return self._allowed((tls, host, port))

    def pinned(self, rule: Callable[[IPAddress], bool], verify: ssl.SSLContext | bool) -> PinnedTransport:
        """An ``httpx`` transport that dials only addresses ``rule`` allows, found with this
        plan's resolver."""
        return PinnedTransport(lambda _host: rule, resolve=self._resolve, verify=verify)

    def _allowed(self, key: _Key) -> Callable[[IPAddress], bool] | None:
        taken = self._rules.get(key)
        if taken is None:
            return None
        host = key[1]
        rules = [policy.answer_rule(host, origin) for policy, origin in taken]
        return lambda addr: all(rule(addr) for rule in rules)

    async def addresses(self, tls: bool, host: str, port: int) -> list[IPAddress] | None:
        """The checked addresses to dial for ``host``; None for a name dialled by name.

        A refused answer is ``httpx.ConnectError`` (nothing is dialled).
        """
        allowed = self._allowed((tls, host, port))
        if allowed is None:
            return None
        try:
            return await resolve_checked(host, port, allowed, resolve=self._resolve)
        except AddressRefused as exc:
            raise httpx.ConnectError(f"{host}: {exc.message}") from None


async def open_connection(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], _P],
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    plan: DialPlan | None,
    **extra: Any,
) -> _P:
    """``loop.create_connection`` to ``host``, or to a checked address of it when ``plan``
    names it (then TLS SNI and certificate verification still for ``host``). Raises what
    ``create_connection`` raises, or ``httpx.ConnectError`` for a refused name."""
    server_hostname = host if tls is not None else None
    addresses = None if plan is None else await plan.addresses(tls is not None, host, port)
    if addresses is None:
        _transport, conn = await loop.create_connection(
            factory, host, port, ssl=tls, server_hostname=server_hostname, **extra
        )
        return conn
    failure: OSError | None = None
    for addr in addresses[:_MAX_CONNECT_ATTEMPTS]:
        try:
            _transport, conn = await loop.create_connection(
                factory, str(addr), port, ssl=tls, server_hostname=server_hostname
            )
        except OSError as exc:  # ssl.SSLError included: the next checked address
            failure = exc
            continue
        return conn
    assert failure is not None
    raise failure


class PlanTransport(httpx.AsyncBaseTransport):
    """The transport of ``A2AClient.http``: a request to a name ``plan`` recorded goes to a
    checked address (:class:`~a2a_secure.identity.dial.PinnedTransport`: its reply read whole,
    at most 1 MiB, on a connection of its own), any other through ``inner`` as before."""

    def __init__(
        self, plan: DialPlan, inner: httpx.AsyncBaseTransport, verify: ssl.SSLContext | bool
    ) -> None:
        self._plan = plan
        self._inner = inner
        self._verify = verify

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``, to a checked address when its host was recorded."""
        url = request.url
        tls = url.scheme == "https"
        rule = self._plan.allowed(tls, url.host, url.port or (443 if tls else 80))
        if rule is None:
            return await self._inner.handle_async_request(request)
        return await self._plan.pinned(rule, self._verify).handle_async_request(request)

    async def aclose(self) -> None:
        """Close the inner transport's connections."""
        await self._inner.aclose()
