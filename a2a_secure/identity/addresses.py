"""The address policy: where the SDK may connect when a URL comes from something it read.

A did:web DID names a host the resolver fetches from; a DID document names service
endpoints; a registry file, an agent card and an A2A card name base URLs. Each of these was
written by someone else, so following it unchecked is a server-side request forgery: a
public did:web could send this client's HELLO to ``http://127.0.0.1:8080/admin`` or to
the cloud metadata service (ATTACKS.md E1-E3, E14). One policy guards all of them, the
did:web fetch included (``DidWebResolver`` holds an :class:`AddressPolicy`):

* a host name must be a public DNS name: ``localhost``, ``*.localhost``, single-label
  names and internal suffixes (``.internal``, ``.local``, ``.home.arpa`` …) are refused
  (E2), as are names that are IPv4 addresses in another spelling (``127.1``,
  ``0x7f000001``);
* an IP literal must be a public unicast address, and so must any IPv4 address it embeds
  (``::ffff:127.0.0.1``, NAT64, 6to4): private, loopback, link-local, CGNAT, multicast,
  reserved and documentation ranges are refused (E3);
* a URL that does not parse cleanly is refused, never half-read: no user info, no
  non-ASCII or percent-encoded host, no scoped IPv6 address, ports 1-65535 only.

Whose word the address is decides how far in it may point (:func:`check_address`, the one
place that decides, with :class:`Reach`):

* the operator's own (an endpoint given in code or with ``--endpoint``, a registry file the
  operator points at): any host, over https, or plain http to loopback (PROTOCOL.md §4);
* a remote document's (a did:web document's service, a fetched agent or A2A card's URL, a
  push URL): no network more private than the one the document came from, the rule
  browsers apply to private networks. From a public origin, loopback and private hosts are
  refused; from a private one, loopback; the same network or a more public one is allowed.
  Link-local (the cloud metadata address), multicast, reserved and documentation ranges are
  refused from any origin.

The opt-in is explicit and per policy: ``allow_hosts`` (exact names exempt from the name
rule), ``allow_addresses`` (networks that may be dialled although not public) and
``dev_allow_loopback`` (development: ``localhost`` and 127.0.0.0/8, ::1, and only then plain
``http://``, to loopback alone).

Every refusal here is ``InvalidParams`` (-32602) naming what was refused and why; the did:web
resolver turns its own into ``DIDResolutionError``.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeAlias

from a2a_secure.errors import InvalidParams
from a2a_secure.identity.did import _is_ip_literal

__all__ = [
    "AddressPolicy",
    "HttpURL",
    "Reach",
    "address_reach",
    "check_address",
    "host_name_blocked",
    "host_reach",
    "is_public_address",
    "may_point",
    "parse_http_url",
    "url_reach",
]

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH: Final = 2048
# A DNS label of a URL host, lower case; "_" is not LDH, but container and service names
# carry it and resolvers answer for it.
_LABEL_RE: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")

# Names that point inside the resolver's own network (E2). Refused before any DNS query
# unless the operator allow-lists the exact name.
_BLOCKED_NAMES: Final = frozenset(
    {
        "localhost",
        "metadata",
        "metadata.goog",
        "metadata.google.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_BLOCKED_SUFFIXES: Final = (
    ".localhost",  # RFC 6761: always loopback
    ".localdomain",
    ".internal",  # ICANN private-use TLD; cloud metadata lives here
    ".local",  # mDNS
    ".home.arpa",  # RFC 8375 home networks
    ".lan",
    ".home",
    ".corp",
    ".intranet",
    ".metadata.goog",
)

# Non-public ranges refused even where a Python version's ``is_global`` says otherwise (E3).
_BLOCKED_NETWORKS: Final[tuple[IPNetwork, ...]] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata 169.254.169.254
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",  # unspecified, loopback and the deprecated IPv4-compatible form
        "::ffff:0:0/96",  # IPv4-mapped (the embedded address is checked too)
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
    )
)
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
LOOPBACK_NETWORKS: Final[tuple[IPNetwork, ...]] = (
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv6Network("::1/128"),
)


# -- addresses and names -------------------------------------------------------------------


def embedded_ipv4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address that an IPv6 form carries and that a dual-stack socket may reach."""
    if isinstance(addr, ipaddress.IPv4Address):
        return None
    if addr.ipv4_mapped is not None:  # ::ffff:127.0.0.1 reaches 127.0.0.1
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def _plainly_public(addr: IPAddress) -> bool:
    return (
        addr.is_global
        and not addr.is_private
        and not addr.is_loopback
        and not addr.is_link_local
        and not addr.is_multicast
        and not addr.is_reserved
        and not addr.is_unspecified
        and not any(addr in net for net in _BLOCKED_NETWORKS)
    )


def is_public_address(addr: IPAddress) -> bool:
    """True if ``addr`` is a public unicast address, and so is any IPv4 address it embeds.

    Refused: private, loopback, link-local, CGNAT (100.64/10), 0/8, multicast, reserved,
    documentation and benchmark ranges, unique-local fc00::/7, fe80::/10, and IPv6 forms
    that carry such an IPv4 address (``::ffff:127.0.0.1``, NAT64, 6to4).
    """
    inner = embedded_ipv4(addr)
    if inner is not None and not _plainly_public(inner):
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return True  # decided by the embedded address alone
    return _plainly_public(addr)


def is_loopback_address(addr: IPAddress) -> bool:
    """True for 127.0.0.0/8, ::1 and an IPv6 form that carries a loopback IPv4 address."""
    inner = embedded_ipv4(addr)
    return addr.is_loopback or (inner is not None and inner.is_loopback)


def host_name_blocked(host: str) -> bool:
    """True for a host name that names no public host.

    That is ``localhost`` and the like, a name without a dot (completed with the resolver's
    search domains: an intranet host), and the private-use and intranet suffixes
    (``.internal``, ``.local``, ``.home.arpa`` …).
    """
    return host in _BLOCKED_NAMES or "." not in host or host.endswith(_BLOCKED_SUFFIXES)


class Reach(enum.IntEnum):
    """How far a network reaches, the most private first.

    An address a remote document names may reach only as far in as the document's own origin:
    ``target >= origin``. ``NOWHERE`` (link-local, multicast, reserved, unspecified,
    documentation and benchmark ranges, cloud metadata names) is below every origin.
    """

    NOWHERE = -1
    LOOPBACK = 0
    PRIVATE = 1
    PUBLIC = 2


_PRIVATE_NETWORKS: Final[tuple[IPNetwork, ...]] = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_METADATA_NAMES: Final = frozenset(n for n in _BLOCKED_NAMES if n != "localhost")


def address_reach(addr: IPAddress) -> Reach:
    """The network ``addr`` belongs to (an IPv6 form carrying an IPv4 address: the lower of both)."""
    inner = embedded_ipv4(addr)
    own = _reach_one(addr) if not (isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped) else None
    reaches = [r for r in (own, None if inner is None else _reach_one(inner)) if r is not None]
    return min(reaches)


def _reach_one(addr: IPAddress) -> Reach:
    if addr.is_loopback:
        return Reach.LOOPBACK
    if _plainly_public(addr):
        return Reach.PUBLIC
    if any(addr in net for net in _PRIVATE_NETWORKS):
        return Reach.PRIVATE
    return Reach.NOWHERE


def may_point(target: Reach, origin: Reach) -> bool:
    """Whether a document from the network ``origin`` may point the SDK at ``target``.

    No further in than where it came from; ``NOWHERE`` from nowhere (only an opt-in).
    """
    return target is not Reach.NOWHERE and target >= origin


def host_reach(host: str) -> Reach:
    """The network a host name (lower case, not an IP literal) names, judged by the name."""
    if host == "localhost" or host.endswith(".localhost"):
        return Reach.LOOPBACK
    if host in _METADATA_NAMES or host.endswith(".metadata.goog"):
        return Reach.NOWHERE
    return Reach.PRIVATE if host_name_blocked(host) else Reach.PUBLIC


# -- URLs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpURL:
    """An ``http``/``https`` URL that parsed cleanly: its parts, checked for shape only."""

    url: str
    scheme: str
    host: str  # lower-case; an IPv6 literal without its brackets
    port: int | None
    address: IPAddress | None  # the host, when it is an IP literal

    @property
    def base(self) -> str:
        """The URL without a trailing slash (the client appends ``/a2a/...`` to it)."""
        return self.url.rstrip("/")


def _refuse(what: str, problem: str) -> InvalidParams:
    return InvalidParams(f"{what} {problem}")


def parse_http_url(url: object, *, what: str = "URL") -> HttpURL:
    """Parse an ``http``/``https`` URL, or raise ``InvalidParams`` saying what is wrong.

    Every way a URL can fail to parse is ``InvalidParams``, never ``ValueError``: a caller
    that skips a bad entry (a registry, a DID document's services, the LLM tool listing)
    must not be broken by one. Refused: a non-string, more than 2048 characters, control
    characters or spaces, another scheme, no host, user info, a non-ASCII or
    percent-encoded host, an IPv6 literal that is not one (``[::1``) or has a scope
    (``%eth0``), a port that is not a number in 1-65535.
    """
    if not isinstance(url, str):
        raise _refuse(what, "must be a string")
    if len(url) > MAX_URL_LENGTH:
        raise _refuse(what, f"is longer than {MAX_URL_LENGTH} characters")
    if not url.isascii() or not url.isprintable() or " " in url:
        raise _refuse(what, "has non-ASCII, control or space characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        hostname = parts.hostname
    except ValueError:
        # "[::1", ":99999", ":x": the message of urllib may quote the URL; ours does not.
        raise _refuse(what, "is not a valid URL (host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse(what, "must be an http or https URL")
    if "@" in parts.netloc:
        # "https://public.example@10.0.0.1/" reads as one host and connects to another.
        raise _refuse(what, "may not carry user info")
    if not hostname:
        raise _refuse(what, "has no host")
    if "%" in hostname:
        raise _refuse(what, "has a percent-encoded or scoped host")
    if port is not None and not 1 <= port <= 65535:
        raise _refuse(what, "has a port outside 1-65535")
    authority = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    if authority.endswith(":"):
        raise _refuse(what, "has an empty port")
    address: IPAddress | None = None
    if authority.startswith("["):
        if not authority.endswith("]"):
            raise _refuse(what, "is not a valid URL (host or port)")
        try:
            address = ipaddress.IPv6Address(hostname)
        except ValueError:
            raise _refuse(what, "has a bracketed host that is not an IPv6 address") from None
    else:
        try:
            address = ipaddress.IPv4Address(hostname)
        except ValueError:
            if _is_ip_literal(hostname):
                # 127.1, 2130706433, 0x7f000001: resolvers turn these into addresses.
                raise _refuse(what, "names an IPv4 address in a non-standard form") from None
            if len(hostname) > 253 or not all(_LABEL_RE.fullmatch(label) for label in hostname.split(".")):
                raise _refuse(what, "has a host that is not a DNS name") from None
    return HttpURL(url=url, scheme=scheme, host=hostname, port=port, address=address)


def url_reach(url: object, *, what: str = "URL") -> Reach:
    """The network the host of ``url`` is in (``InvalidParams`` when it does not parse)."""
    return _reach_of(parse_http_url(url, what=what))


def _reach_of(parsed: HttpURL) -> Reach:
    return address_reach(parsed.address) if parsed.address is not None else host_reach(parsed.host)


def check_address(
    url: object, *, what: str = "endpoint", origin: Reach | None, policy: AddressPolicy | None = None
) -> str:
    """``url`` without its trailing slash, if the SDK may connect there; else ``InvalidParams``.

    The one decision for every address the SDK follows. ``origin`` is whose word it is:
    None for the operator's own (an endpoint in code or ``--endpoint``, a registry file it
    points at): https to any host, or plain http to loopback (PROTOCOL.md §4). Otherwise the
    network of the remote document that named it: the address may not be more private than
    that (see the module documentation), unless ``policy`` opts it in. Plain http goes only
    to loopback, and from a document only with the loopback opt-in or from loopback itself.
    A name is judged here, before any I/O; its DNS answer is checked where the connection is
    made (the did:web fetch, the push sender, the client's pool for an endpoint taken with
    :class:`~a2a_secure.client.pinning.DialPlan`: :meth:`AddressPolicy.answer_rule`).
    """
    parsed = parse_http_url(url, what=what)
    reach = _reach_of(parsed)
    loopback = reach is Reach.LOOPBACK
    if origin is None:
        if parsed.scheme == "http" and not loopback:
            raise _refuse(what, "must be https (plain http only to loopback)")
        return parsed.base
    policy = policy or _DEFAULT_POLICY
    if parsed.scheme == "http" and not (loopback and (policy.dev_allow_loopback or origin is Reach.LOOPBACK)):
        raise _refuse(what, "must be https (plain http only to loopback, in development mode)")
    if parsed.address is not None:
        if policy.address_may_point(parsed.address, origin):
            return parsed.base
    elif policy.opted_in(parsed) or may_point(reach, origin):
        return parsed.base
    if parsed.address is not None:
        raise _refuse(what, "names a non-public address (it needs an explicit opt-in)")
    raise _refuse(what, "names a local or internal host (it needs an explicit opt-in)")


# -- the policy ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Where the SDK may connect when the address comes from a document, registry or card.

    The default refuses every non-public host and every plain ``http://`` URL. Args (all an
    explicit opt-in of the operator):

    Attributes:
        allow_hosts: Exact host names exempt from the name rule (``agents.corp``).
        allow_networks: Networks whose addresses may be used although they are not public.
        dev_allow_loopback: Development: allow ``localhost``, ``*.localhost`` and the loopback
            addresses, and plain ``http://`` to those (never to another host).
    """

    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[IPNetwork, ...] = ()
    dev_allow_loopback: bool = False

    @classmethod
    def build(
        cls,
        *,
        allow_hosts: Iterable[str] = (),
        allow_addresses: Iterable[str | IPNetwork] = (),
        dev_allow_loopback: bool = False,
    ) -> AddressPolicy:
        """A policy from host names and networks (``"10.1.2.0/24"``, ``"127.0.0.1"``).

        Raises ``ValueError`` for a network that does not parse.
        """
        networks = [ipaddress.ip_network(n, strict=False) for n in allow_addresses]
        return cls(
            allow_hosts=frozenset(h.lower() for h in allow_hosts),
            allow_networks=tuple(networks),
            dev_allow_loopback=dev_allow_loopback,
        )

    def address_allowed(self, addr: IPAddress) -> bool:
        """True if ``addr`` may be dialled: public, or inside an allowed network."""
        if self.dev_allow_loopback and is_loopback_address(addr):
            return True
        candidates = [addr]
        inner = embedded_ipv4(addr)
        if inner is not None:
            candidates.append(inner)
        if any(c in net for net in self.allow_networks for c in candidates):
            return True
        return is_public_address(addr)

    def host_allowed(self, host: str) -> bool:
        """True if the host name ``host`` (lower case, not an IP literal) may be used."""
        if host in self.allow_hosts:
            return True
        if self.dev_allow_loopback and (host == "localhost" or host.endswith(".localhost")):
            return True
        return not host_name_blocked(host)

    def _address_opted_in(self, addr: IPAddress) -> bool:
        if self.dev_allow_loopback and is_loopback_address(addr):
            return True
        inner = embedded_ipv4(addr)
        candidates = [addr] if inner is None else [addr, inner]
        return any(c in net for net in self.allow_networks for c in candidates)

    def address_may_point(self, addr: IPAddress, origin: Reach) -> bool:
        """Whether a document from ``origin`` may have the SDK dial ``addr``: opted in, or no
        further in than ``origin``. The one rule for an IP literal a document names
        (:func:`check_address`) and for each address its host names resolve to when dialled
        (:meth:`answer_rule`)."""
        return self._address_opted_in(addr) or may_point(address_reach(addr), origin)

    def answer_rule(self, host: str, origin: Reach) -> Callable[[IPAddress], bool]:
        """The rule for the DNS answer of ``host`` (a name a document from ``origin`` named
        and :func:`check_address` took): any address for a name in ``allow_hosts`` (the
        operator vouched for it), else :meth:`address_may_point` for each address."""
        if host in self.allow_hosts:
            return _any_address
        return functools.partial(self.address_may_point, origin=origin)

    def opted_in(self, parsed: HttpURL) -> bool:
        """True if the operator let the SDK connect to ``parsed``'s host whatever named it."""
        if parsed.address is not None:
            return self._address_opted_in(parsed.address)
        host = parsed.host
        return host in self.allow_hosts or (
            self.dev_allow_loopback and (host == "localhost" or host.endswith(".localhost"))
        )

    def check_url(self, url: object, *, what: str = "endpoint", origin: Reach | None = Reach.PUBLIC) -> str:
        """:func:`check_address` under this policy: ``url`` named by a document from ``origin``
        (by default a public one: the strictest), or the operator's own (None)."""
        return check_address(url, what=what, origin=origin, policy=self)


def _any_address(_addr: IPAddress) -> bool:
    return True


_DEFAULT_POLICY: Final = AddressPolicy()
