"""did:web resolution over HTTPS, bounded against SSRF and hostile servers (PROTOCOL.md §2).

Fetching a URL that a peer chose is a server-side request forgery by design, so every step
here is a bound from ATTACKS.md section E:

* before any I/O: the DID's syntax and URL rule (``did_web_host_port``: IP literals, ports,
  percent-encoding, dot segments; E1, E11) and a name policy that refuses ``localhost``,
  ``*.localhost``, single-label names and internal suffixes such as
  ``metadata.google.internal`` (E2); the name and address rules are those of
  :class:`~a2a_secure.identity.addresses.AddressPolicy`, the one policy that also guards
  every endpoint taken from a document;
* the host name is resolved here, every address it resolves to must be public (E3), and the
  connection goes to that very address while TLS SNI, certificate verification and the
  ``Host`` header use the name: a second DNS answer (DNS rebinding) is never consulted;
* HTTPS with certificate validation only; plain ``http://`` only in an explicit development
  mode and only to a loopback address (E5);
* no redirects (E4), one overall deadline (E7), at most 64 KiB of body counted after
  decompression while streaming (E6), strict I-JSON;
* the document's ``id`` is the DID exactly (E8, E12), relative ids are resolved against the
  DID, methods of other controllers are ignored, duplicate ids and published private keys
  refuse the document (E9, E10), counts are capped (H8);
* fetches run under a semaphore and concurrent resolutions of one DID share one fetch (H5).

Caching is :class:`~a2a_secure.identity.resolver.DIDResolver`'s job: it keeps successes for
its TTL and never stores a failure (E13). Every failure here is a ``DIDResolutionError``
(-32047) with a short message; a string that is not a DID stays ``InvalidParams`` (-32602).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import certifi
import httpx

from a2a_secure.errors import DIDResolutionError
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import (
    AddressPolicy,
    IPAddress,
    IPNetwork,
    host_name_blocked,
    is_loopback_address,
    is_public_address,
)
from a2a_secure.identity.dial import AddressRefused, resolve_checked, system_resolve
from a2a_secure.identity.did import did_web_host_port
from a2a_secure.identity.did_document import MAX_SERVICES, MAX_VERIFICATION_METHODS, parse_did_document
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.system import mono_now

__all__ = [
    "ACCEPTED_MEDIA_TYPES",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_DOCUMENT_BYTES",
    "DEFAULT_TIMEOUT",
    "MAX_SERVICES",
    "MAX_VERIFICATION_METHODS",
    "DidWebResolver",
    "host_name_blocked",
    "is_public_address",
    "make_resolver",
    "parse_did_document",
]

DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_MAX_DOCUMENT_BYTES: Final = 64 * 1024
DEFAULT_MAX_CONCURRENCY: Final = 16
# Every address a name resolves to is checked; only the first few are dialled.
_MAX_ADDRESSES: Final = 16
_MAX_CONNECT_ATTEMPTS: Final = 4

ACCEPTED_MEDIA_TYPES: Final = frozenset(
    {"application/did+json", "application/did+ld+json", "application/json", "application/ld+json"}
)


# -- address policy ---------------------------------------------------------------------------
# The policy itself (blocked names and networks, the opt-ins) lives in
# a2a_secure.identity.addresses: every URL the SDK takes from a document goes through it too.


# resolve_checked's refusals, in this resolver's words.
_REFUSALS: Final = {
    "unresolved": "did:web host name does not resolve",
    "unusable": "did:web host resolves to an unusable address",
    "too_many": "did:web host name resolves to too many addresses",
    "not_allowed": "did:web host resolves to a non-public address",
}


# -- TLS -----------------------------------------------------------------------------------


def _ssl_context(verify: ssl.SSLContext | str | os.PathLike[str] | None) -> ssl.SSLContext:
    if verify is None:
        return ssl.create_default_context(cafile=certifi.where())
    if isinstance(verify, ssl.SSLContext):
        # E5: a context that skips certificate or host name checks is never accepted.
        if verify.verify_mode != ssl.CERT_REQUIRED or not verify.check_hostname:
            raise ValueError("the SSL context must verify certificates and host names")
        return verify
    if isinstance(verify, str | os.PathLike):
        return ssl.create_default_context(cafile=os.fspath(verify))
    raise ValueError("verify must be an SSLContext or a CA bundle path (verify=False is not supported)")


def _is_cert_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class _ConnectFailed(Exception):
    """The TCP connection to one address failed; the next checked address may be tried."""


# -- the resolver --------------------------------------------------------------------------


class DidWebResolver:
    """Resolves ``did:web`` DIDs; register it with ``DIDResolver.register("web", resolver)``.

    Each call checks the DID and the host name before any I/O, resolves the name, refuses it
    if any address is not public (unless allow-listed), connects to a checked address with
    TLS verified against the name, and reads at most ``max_document_bytes`` within
    ``timeout`` seconds. Concurrent calls for the same DID share one fetch; at most
    ``max_concurrency`` fetches run at once.

    Args:
        timeout: Overall deadline in seconds for one resolution (queueing, DNS, connect,
            TLS, headers and body).
        max_document_bytes: Body cap, counted after decompression.
        max_concurrency: Fetches in flight at once.
        verify: CA trust: an ``ssl.SSLContext`` that verifies certificates and host names,
            or the path of a CA bundle; None uses certifi's bundle.
        allow_hosts: Exact host names exempt from the name policy (``localhost``,
            ``*.internal``, single-label names); their addresses are still checked.
        allow_addresses: Networks (``"10.1.2.0/24"``, ``"127.0.0.1"``) whose addresses may
            be dialled although they are not public.
        host_overrides: Test-only static name → address(es) table used instead of DNS (like
            ``curl --resolve``); the addresses pass the same checks.
        dev_allow_loopback: Development only: allow ``localhost``/``*.localhost`` and the
            loopback addresses 127.0.0.0/8 and ::1.
        dev_allow_http: Development only: fetch over plain ``http://`` when, and only when,
            the checked address is a loopback address.
    """

    # The Content-Types a document may come with (a subclass for another host may add some).
    _media_types: frozenset[str] = ACCEPTED_MEDIA_TYPES

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        verify: ssl.SSLContext | str | os.PathLike[str] | None = None,
        allow_hosts: Iterable[str] = (),
        allow_addresses: Iterable[str | IPNetwork] = (),
        host_overrides: Mapping[str, str | Sequence[str]] | None = None,
        dev_allow_loopback: bool = False,
        dev_allow_http: bool = False,
    ) -> None:
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        if max_document_bytes < 1 or max_concurrency < 1:
            raise ValueError("max_document_bytes and max_concurrency must be at least 1")
        self._timeout = float(timeout)
        self._max_bytes = int(max_document_bytes)
        self._ssl = _ssl_context(verify)
        # E1-E3: the same policy that guards every endpoint taken from a document.
        self.addresses = AddressPolicy.build(
            allow_hosts=allow_hosts, allow_addresses=allow_addresses, dev_allow_loopback=dev_allow_loopback
        )
        self._dev_allow_http = dev_allow_http
        self._overrides: dict[str, tuple[str, ...]] = {
            name: (value,) if isinstance(value, str) else tuple(value)
            for name, value in (host_overrides or {}).items()
        }
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._inflight: dict[str, asyncio.Task[ResolvedDID]] = {}

    # -- pre-I/O checks ---------------------------------------------------------------------
    def _check_host_name(self, host: str) -> None:
        if not self.addresses.host_allowed(host):
            raise DIDResolutionError("did:web host name is local or internal")

    def _plan(self, did: str) -> tuple[str, int | None, str]:
        host, port, segments = did_web_host_port(did)
        self._check_host_name(host)
        path = "/" + "/".join(segments) + "/did.json" if segments else "/.well-known/did.json"
        return host, port, path

    def request_url(self, did: str) -> str:
        """The HTTPS URL that resolving ``did`` fetches, after every check made before I/O.

        Raises:
            InvalidParams: ``did`` is not a DID.
            DIDResolutionError: It is not a did:web DID this resolver may fetch (IP literal,
                bad port or path, local or internal host name).
        """
        host, port, path = self._plan(did)
        netloc = host if port is None else f"{host}:{port}"
        return f"https://{netloc}{path}"

    def address_allowed(self, addr: IPAddress) -> bool:
        """True if ``addr`` may be dialled: public, or inside an allow-listed network."""
        return self.addresses.address_allowed(addr)

    # -- resolution -------------------------------------------------------------------------
    async def __call__(self, did: str) -> ResolvedDID:
        """Resolve ``did``.

        Raises:
            InvalidParams: ``did`` is not a DID.
            DIDResolutionError: Anything else went wrong (policy, network, TLS, HTTP, size,
                time, JSON, document rules).
        """
        host, port, path = self._plan(did)
        task = self._inflight.get(did)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._resolve(did, host, port, path))
            self._inflight[did] = task
            task.add_done_callback(self._forget)
        try:
            # Shielded: one caller giving up does not cancel the fetch the others wait for.
            return await asyncio.shield(task)
        except DIDResolutionError as exc:
            raise DIDResolutionError(exc.message) from None

    def _forget(self, task: asyncio.Task[ResolvedDID]) -> None:
        for did, running in list(self._inflight.items()):
            if running is task:
                del self._inflight[did]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" noise when every waiter left

    async def _resolve(self, did: str, host: str, port: int | None, path: str) -> ResolvedDID:
        try:
            # E7 / H5: one deadline covers the wait for a fetch slot, DNS, connect, TLS,
            # headers and the whole body, so a slow or silent server costs at most `timeout`.
            deadline = asyncio.get_running_loop().time() + self._timeout
            async with asyncio.timeout_at(deadline), self._semaphore:
                body = await self._fetch(host, port, path, deadline)
            document = encoding.loads(body, error=DIDResolutionError)
            return parse_did_document(did, document)
        except TimeoutError:
            raise DIDResolutionError("did:web resolution timed out") from None
        except DIDResolutionError:
            raise
        except Exception:  # anything unforeseen is still only a resolution failure
            raise DIDResolutionError("did:web resolution failed") from None

    async def _answer(self, host: str, port: int) -> list[str]:
        override = self._overrides.get(host)
        return list(override) if override is not None else await system_resolve(host, port)

    async def _fetch(self, host: str, port: int | None, path: str, deadline: float) -> bytes:
        # E3, and DNS rebinding: resolved once, ANY refused answer refuses the name (a
        # rebinding attacker mixes a public address with 127.0.0.1 and hopes the client picks
        # the second), and only those checked addresses are dialled (identity/dial.py).
        try:
            addresses = await resolve_checked(
                host, port or 443, self.address_allowed, resolve=self._answer, max_addresses=_MAX_ADDRESSES
            )
        except AddressRefused as exc:
            raise DIDResolutionError(_REFUSALS[exc.reason]) from None
        for addr in addresses[:_MAX_CONNECT_ATTEMPTS]:
            try:
                return await self._fetch_from(addr, host, port, path, deadline)
            except _ConnectFailed:
                continue
        raise DIDResolutionError("did:web host cannot be reached")

    def _scheme_for(self, addr: IPAddress) -> str:
        # E5: plain HTTP only in explicit development mode and only to this machine.
        return "http" if self._dev_allow_http and is_loopback_address(addr) else "https"

    def _phase_timeouts(self, deadline: float) -> httpx.Timeout:
        # httpx's own timeouts end each phase slightly before the overall deadline, so the
        # deadline's cancellation (a backstop) rarely lands inside httpcore's TLS handshake,
        # which leaks its socket when cancelled there. Connecting and the TLS handshake are
        # two phases that each get the connect timeout, hence half of what is left.
        remaining = deadline - asyncio.get_running_loop().time() - min(0.1, 0.1 * self._timeout)
        if remaining <= 0:
            raise DIDResolutionError("did:web resolution timed out")
        return httpx.Timeout(remaining, connect=remaining / 2)

    async def _fetch_from(
        self, addr: IPAddress, host: str, port: int | None, path: str, deadline: float
    ) -> bytes:
        scheme = self._scheme_for(addr)
        url = httpx.URL(scheme=scheme, host=str(addr), port=port, path=path)
        headers = {
            "Host": host if port is None else f"{host}:{port}",
            "Accept": "application/did+json, application/did+ld+json;q=0.9, application/json;q=0.8",
            "Accept-Encoding": "gzip",
            "User-Agent": "a2a-secure-didweb",
        }
        # The URL names the checked address, so httpx dials exactly it (no second DNS query:
        # DNS rebinding); "sni_hostname" makes httpcore send SNI for the name and verify the
        # certificate against the name. A fresh client per fetch means a pooled connection
        # verified for one name is never reused for another name on the same address, and
        # trust_env=False keeps proxy variables from routing the request elsewhere.
        async with httpx.AsyncClient(
            verify=self._ssl,
            trust_env=False,
            follow_redirects=False,
            timeout=self._phase_timeouts(deadline),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0),
        ) as client:
            request = client.build_request("GET", url, headers=headers, extensions={"sni_hostname": host})
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if scheme == "https" and _is_cert_error(exc):
                    raise DIDResolutionError(
                        "did:web TLS handshake or certificate verification failed"
                    ) from None
                raise _ConnectFailed from None
            except httpx.TimeoutException:
                raise DIDResolutionError("did:web resolution timed out") from None
            except httpx.HTTPError:
                raise DIDResolutionError("did:web request failed") from None
            try:
                self._check_response(response)
                return await self._read_body(response)
            except httpx.TimeoutException:
                raise DIDResolutionError("did:web resolution timed out") from None
            except httpx.HTTPError:
                raise DIDResolutionError("did:web response could not be read") from None
            finally:
                await response.aclose()

    def _check_response(self, response: httpx.Response) -> None:
        status = response.status_code
        if 300 <= status < 400:
            # E4: a redirect could lead anywhere (a private address, http://); never followed.
            raise DIDResolutionError("did:web server answered with a redirect (refused)")
        if status != 200:
            raise DIDResolutionError(f"did:web server answered HTTP {status}")
        media = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media not in self._media_types:
            raise DIDResolutionError("did:web document has an unexpected Content-Type")

    async def _read_body(self, response: httpx.Response) -> bytes:
        encodings = [
            e.strip().lower() for e in response.headers.get_list("content-encoding", split_commas=True)
        ]
        encodings = [e for e in encodings if e and e != "identity"]
        if not encodings:
            inflater = None
        elif encodings in (["gzip"], ["x-gzip"]):
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            raise DIDResolutionError("did:web document has an unsupported Content-Encoding")
        # E6: both the bytes on the wire and the bytes after decompression are capped while
        # streaming, whatever Content-Length says; a gzip bomb stops at the cap.
        wire_cap = self._max_bytes if inflater is None else 2 * self._max_bytes
        length = response.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > wire_cap):
            raise DIDResolutionError(f"did:web document larger than {self._max_bytes} bytes")
        wire = 0
        body = bytearray()
        async for chunk in response.aiter_raw():
            wire += len(chunk)
            if wire > wire_cap:
                raise DIDResolutionError(f"did:web document larger than {self._max_bytes} bytes")
            if inflater is None:
                body += chunk
            else:
                self._inflate(inflater, chunk, body)
            if len(body) > self._max_bytes:
                raise DIDResolutionError(f"did:web document larger than {self._max_bytes} bytes")
        if inflater is not None and not inflater.eof:
            raise DIDResolutionError("did:web document is truncated gzip")
        return bytes(body)

    def _inflate(self, inflater: zlib._Decompress, chunk: bytes, body: bytearray) -> None:
        data = chunk
        try:
            while data:
                if inflater.eof:
                    raise DIDResolutionError("did:web document has data after the gzip stream")
                # max_length bounds the memory of each step: never more than the cap + 1.
                piece = inflater.decompress(data, self._max_bytes - len(body) + 1)
                body += piece
                if len(body) > self._max_bytes:
                    raise DIDResolutionError(f"did:web document larger than {self._max_bytes} bytes")
                data = inflater.unconsumed_tail
            if inflater.unused_data:
                raise DIDResolutionError("did:web document has data after the gzip stream")
        except zlib.error:
            raise DIDResolutionError("did:web document is not valid gzip") from None


def make_resolver(
    *,
    cache_ttl: float = 300.0,
    max_cache_entries: int = 10_000,
    clock: Callable[[], float] = mono_now,
    timeout: float = DEFAULT_TIMEOUT,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    verify: ssl.SSLContext | str | os.PathLike[str] | None = None,
    allow_hosts: Iterable[str] = (),
    allow_addresses: Iterable[str | IPNetwork] = (),
    host_overrides: Mapping[str, str | Sequence[str]] | None = None,
    dev_allow_loopback: bool = False,
    dev_allow_http: bool = False,
) -> DIDResolver:
    """A caching :class:`DIDResolver` for ``did:key`` and ``did:web``.

    ``cache_ttl``, ``max_cache_entries`` and ``clock`` go to :class:`DIDResolver` (successes
    are cached, failures are not); the other arguments are those of
    :class:`DidWebResolver`.
    """
    resolver = DIDResolver(cache_ttl=cache_ttl, max_cache_entries=max_cache_entries, clock=clock)
    resolver.register(
        "web",
        DidWebResolver(
            timeout=timeout,
            max_document_bytes=max_document_bytes,
            max_concurrency=max_concurrency,
            verify=verify,
            allow_hosts=allow_hosts,
            allow_addresses=allow_addresses,
            host_overrides=host_overrides,
            dev_allow_loopback=dev_allow_loopback,
            dev_allow_http=dev_allow_http,
        ),
    )
    return resolver
