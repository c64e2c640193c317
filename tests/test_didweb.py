"""did:web resolution against real HTTPS servers on 127.0.0.1 (PROTOCOL.md §2, ATTACKS.md E).

Every server here is started by the test itself on loopback, with a trustme CA. The
resolver reaches it through the test-only host override (``agent.test`` → 127.0.0.1) and an
explicit allow-list for 127.0.0.1; separate tests prove that the default configuration
refuses loopback and private addresses before connecting.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import base58
import nacl.signing
import pytest
import trustme
from conftest import load_vector

from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.did import did_web_to_url
from a2a_secure.identity.didweb import (
    DEFAULT_MAX_DOCUMENT_BYTES,
    DEFAULT_TIMEOUT,
    DidWebResolver,
    is_public_address,
    make_resolver,
    parse_did_document,
)
from a2a_secure.identity.resolver import DIDResolver

VECTORS = load_vector("did_web_urls.json")
SMALL_ORDER_KEY = bytes([1]) + bytes(31)  # the identity point: one signature fits every message

# -- a tiny real HTTP/1.1 server -----------------------------------------------------------------


@dataclass
class Req:
    target: str
    headers: dict[str, str]


Handler = Callable[[Req, asyncio.StreamWriter], Awaitable[None]]


async def send(
    writer: asyncio.StreamWriter,
    body: bytes = b"",
    *,
    status: int = 200,
    headers: dict[str, str | None] | None = None,
) -> None:
    hdrs: dict[str, str | None] = {
        "Content-Type": "application/did+json",
        "Content-Length": str(len(body)),
        "Connection": "close",
    }
    hdrs.update(headers or {})
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None)
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


def json_route(doc: Any, **kw: Any) -> Handler:
    async def handler(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, encoding.dumps(doc), **kw)

    return handler


@dataclass
class DocServer:
    ssl_context: ssl.SSLContext | None
    routes: dict[str, Handler] = field(default_factory=dict)
    hits: Counter[str] = field(default_factory=Counter)
    requests: list[Req] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)
    connections: int = 0
    active: int = 0
    max_active: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def start(self) -> DocServer:
        if self.ssl_context is not None:
            self.ssl_context.sni_callback = lambda obj, name, ctx: self.sni.append(name)
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def did(self) -> str:
        return f"did:web:agent.test%3A{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            req = Req(target, headers)
            self.hits[target] += 1
            self.requests.append(req)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                handler = self.routes.get(target)
                if handler is None:
                    await send(writer, b"not found", status=404, headers={"Content-Type": "text/plain"})
                else:
                    await handler(req, writer)
            finally:
                self.active -= 1
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass
        finally:
            writer.transport.abort()
            self._tasks.discard(task)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


# -- keys, documents, certificates -----------------------------------------------------------------


def new_key() -> bytes:
    return bytes(nacl.signing.SigningKey.generate().verify_key)


def multibase(pk: bytes) -> str:
    return "z" + base58.b58encode(b"\xed\x01" + pk).decode()


def multikey_doc(did: str, pk: bytes, *, kind: str = "Multikey", kid: str = "#key-1") -> dict[str, Any]:
    return {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "verificationMethod": [
            {"id": kid, "type": kind, "controller": did, "publicKeyMultibase": multibase(pk)}
        ],
        "authentication": [kid],
    }


def jwk_doc(did: str, jwk: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": did,
        "verificationMethod": [
            {"id": "#jwk", "type": "JsonWebKey2020", "controller": did, "publicKeyJwk": jwk}
        ],
        "authentication": ["#jwk"],
    }


def okp(pk: bytes, **extra: str) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "x": encoding.b64u_encode(pk), **extra}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def server_ctx(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(ctx)
    return ctx


@pytest.fixture
async def servers() -> AsyncIterator[list[DocServer]]:
    started: list[DocServer] = []
    yield started
    for s in started:
        await s.close()


@pytest.fixture
def start(servers: list[DocServer]) -> Callable[[ssl.SSLContext | None], Awaitable[DocServer]]:
    async def _start(ctx: ssl.SSLContext | None) -> DocServer:
        s = await DocServer(ctx).start()
        servers.append(s)
        return s

    return _start


@pytest.fixture
async def server(ca: trustme.CA, start: Callable[[ssl.SSLContext | None], Awaitable[DocServer]]) -> DocServer:
    return await start(server_ctx(ca, "agent.test"))


def resolver_for(client_ctx: ssl.SSLContext, **kw: Any) -> DIDResolver:
    """The test configuration: agent.test → 127.0.0.1, and 127.0.0.1 explicitly allowed."""
    options: dict[str, Any] = {
        "verify": client_ctx,
        "host_overrides": {"agent.test": "127.0.0.1"},
        "allow_addresses": ["127.0.0.1/32"],
        "timeout": 3.0,
    }
    options.update(kw)
    return make_resolver(**options)


async def refused(resolver: DIDResolver, did: str) -> DIDResolutionError:
    with pytest.raises(DIDResolutionError) as info:
        await resolver.resolve(did)
    err = info.value
    assert err.code == -32047
    assert len(err.message) < 120 and "Traceback" not in err.message
    return err


# -- success -----------------------------------------------------------------------------------


async def test_multikey_relative_id(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    doc = multikey_doc(did, pk)
    doc["service"] = [{"id": "#a2a", "type": "A2AService", "serviceEndpoint": "https://agent.test/"}]
    server.routes["/.well-known/did.json"] = json_route(doc)
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}
    assert [dict(s) for s in resolved.services] == doc["service"]
    # The connection went to 127.0.0.1, but TLS and HTTP named the host.
    assert server.sni == ["agent.test"]
    assert server.requests[0].headers["host"] == f"agent.test:{server.port}"


async def test_ed25519_2020_absolute_id(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    doc = multikey_doc(did, pk, kind="Ed25519VerificationKey2020", kid=f"{server.did}#k")
    server.routes["/.well-known/did.json"] = json_route(doc)
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#k": pk}


async def test_json_web_key_2020(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    server.routes["/.well-known/did.json"] = json_route(jwk_doc(did, okp(pk, alg="EdDSA")))
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#jwk": pk}


async def test_did_with_path(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = f"{server.did}:user:alice", new_key()
    server.routes["/user/alice/did.json"] = json_route(multikey_doc(did, pk))
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}
    assert server.hits == Counter({"/user/alice/did.json": 1})


async def test_only_authentication_keys(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, auth_key, other_key, embedded_key = server.did, new_key(), new_key(), new_key()
    doc = multikey_doc(did, auth_key)
    doc["verificationMethod"].append(
        {"id": "#assert", "type": "Multikey", "controller": did, "publicKeyMultibase": multibase(other_key)}
    )
    doc["assertionMethod"] = ["#assert"]
    doc["authentication"].append(
        {"id": "#emb", "type": "Multikey", "controller": did, "publicKeyMultibase": multibase(embedded_key)}
    )
    doc["authentication"].append(f"{did}#missing")  # a reference to nothing is skipped
    server.routes["/.well-known/did.json"] = json_route(doc)
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": auth_key, f"{did}#emb": embedded_key}


async def test_gzip_document_accepted(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    body = gzip.compress(encoding.dumps(multikey_doc(did, pk)))

    async def handler(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body, headers={"Content-Encoding": "gzip"})

    server.routes["/.well-known/did.json"] = handler
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}


async def test_real_dns_for_allow_listed_localhost(
    ca: trustme.CA, client_ctx: ssl.SSLContext, start: Callable[[ssl.SSLContext | None], Awaitable[DocServer]]
) -> None:
    srv = await start(server_ctx(ca, "localhost"))
    did, pk = f"did:web:localhost%3A{srv.port}", new_key()
    srv.routes["/.well-known/did.json"] = json_route(multikey_doc(did, pk))
    # The name is allowed but its DNS answer (127.0.0.1) is not: refused before connecting.
    await refused(make_resolver(verify=client_ctx, allow_hosts={"localhost"}), did)
    assert srv.connections == 0
    # Development mode allows localhost and loopback addresses, found by a real DNS lookup.
    resolved = await make_resolver(verify=client_ctx, dev_allow_loopback=True).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}


async def test_did_key_still_resolves(client_ctx: ssl.SSLContext) -> None:
    from a2a_secure.identity.did import did_key_from_public_key

    pk = new_key()
    did = did_key_from_public_key(pk)
    assert list((await make_resolver().resolve(did)).keys.values()) == [pk]


# -- SSRF: names and addresses (E1-E3) -------------------------------------------------------


async def test_default_config_refuses_loopback_before_connecting(
    server: DocServer, client_ctx: ssl.SSLContext
) -> None:
    server.routes["/.well-known/did.json"] = json_route(multikey_doc(server.did, new_key()))
    resolver = make_resolver(verify=client_ctx, host_overrides={"agent.test": "127.0.0.1"})
    err = await refused(resolver, server.did)
    assert "non-public" in err.message
    assert server.connections == 0


async def test_localhost_name_refused_even_when_address_allowed(
    server: DocServer, client_ctx: ssl.SSLContext
) -> None:
    did = f"did:web:localhost%3A{server.port}"
    resolver = resolver_for(client_ctx, host_overrides={"localhost": "127.0.0.1"})
    err = await refused(resolver, did)
    assert "local or internal" in err.message
    assert server.connections == 0


NON_PUBLIC = [
    "127.0.0.1",
    "127.8.9.10",
    "10.0.0.1",
    "172.16.5.4",
    "172.31.255.255",
    "192.168.1.10",
    "169.254.169.254",
    "100.64.0.1",
    "100.127.255.254",
    "0.0.0.0",
    "0.1.2.3",
    "224.0.0.1",
    "240.0.0.1",
    "255.255.255.255",
    "192.0.2.1",
    "::",
    "::1",
    "::7f00:1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "64:ff9b::7f00:1",
    "2002:7f00:1::1",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "2001:db8::1",
]


@pytest.mark.parametrize("address", NON_PUBLIC)
async def test_non_public_address_refused(
    server: DocServer, client_ctx: ssl.SSLContext, address: str
) -> None:
    assert not is_public_address(ipaddress.ip_address(address))
    resolver = make_resolver(verify=client_ctx, host_overrides={"agent.test": address})
    err = await refused(resolver, server.did)
    assert "non-public" in err.message
    assert server.connections == 0


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_address_accepted(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


async def test_any_non_public_answer_refuses(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    # Rebinding: an allowed answer next to a private one. ANY bad address refuses the name.
    resolver = resolver_for(client_ctx, host_overrides={"agent.test": ["127.0.0.1", "10.0.0.7"]})
    await refused(resolver, server.did)
    assert server.connections == 0


async def test_allow_list_is_per_network(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    server.routes["/.well-known/did.json"] = json_route(multikey_doc(server.did, new_key()))
    resolver = resolver_for(client_ctx, allow_addresses=["127.0.0.2/32", "10.0.0.0/8"])
    await refused(resolver, server.did)
    assert server.connections == 0
    ok = resolver_for(client_ctx, allow_addresses=[ipaddress.ip_network("127.0.0.0/8")])
    assert (await ok.resolve(server.did)).keys


async def test_next_checked_address_tried_when_one_is_down(
    server: DocServer, client_ctx: ssl.SSLContext
) -> None:
    # 127.0.0.2 has nothing listening on the port; the second checked address answers.
    server.routes["/.well-known/did.json"] = json_route(multikey_doc(server.did, new_key()))
    resolver = resolver_for(
        client_ctx, host_overrides={"agent.test": ["127.0.0.2", "127.0.0.1"]}, allow_addresses=["127.0.0.0/8"]
    )
    assert (await resolver.resolve(server.did)).keys


# -- redirects (E4) ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirect_refused(server: DocServer, client_ctx: ssl.SSLContext, status: int) -> None:
    did = server.did
    server.routes["/moved/did.json"] = json_route(multikey_doc(did, new_key()))

    async def same_origin(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(
            writer, status=status, headers={"Location": f"https://agent.test:{server.port}/moved/did.json"}
        )

    async def other_origin(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(
            writer, status=status, headers={"Location": f"http://127.0.0.1:{server.port}/moved/did.json"}
        )

    server.routes["/.well-known/did.json"] = same_origin
    server.routes["/x/did.json"] = other_origin
    resolver = resolver_for(client_ctx)
    assert "redirect" in (await refused(resolver, did)).message
    assert "redirect" in (await refused(resolver, f"{did}:x")).message
    assert server.hits["/moved/did.json"] == 0


# -- TLS (E5) ------------------------------------------------------------------------------


async def test_untrusted_certificate_refused(server: DocServer) -> None:
    server.routes["/.well-known/did.json"] = json_route(multikey_doc(server.did, new_key()))
    other_ca_ctx = ssl.create_default_context()
    trustme.CA().configure_trust(other_ca_ctx)
    err = await refused(resolver_for(other_ca_ctx), server.did)
    assert "TLS" in err.message
    assert server.hits.total() == 0


async def test_certificate_for_another_name_refused(
    ca: trustme.CA, client_ctx: ssl.SSLContext, start: Callable[[ssl.SSLContext | None], Awaitable[DocServer]]
) -> None:
    srv = await start(server_ctx(ca, "other.test"))
    srv.routes["/.well-known/did.json"] = json_route(multikey_doc(srv.did, new_key()))
    err = await refused(resolver_for(client_ctx), srv.did)
    assert "TLS" in err.message
    assert srv.hits.total() == 0
    # And the same CA's certificate for the right name is accepted (the check is the name).
    other_did = f"did:web:other.test%3A{srv.port}"
    srv.routes["/.well-known/did.json"] = json_route(multikey_doc(other_did, new_key()))
    ok = resolver_for(client_ctx, host_overrides={"other.test": "127.0.0.1"})
    assert (await ok.resolve(other_did)).keys


def test_unverified_tls_cannot_be_configured(client_ctx: ssl.SSLContext) -> None:
    lax = ssl.create_default_context()
    lax.check_hostname = False
    lax.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError):
        DidWebResolver(verify=lax)
    with pytest.raises(ValueError):
        DidWebResolver(verify=False)  # type: ignore[arg-type]


async def test_plain_http_only_in_dev_mode_on_loopback(
    client_ctx: ssl.SSLContext, start: Callable[[ssl.SSLContext | None], Awaitable[DocServer]]
) -> None:
    srv = await start(None)
    did, pk = srv.did, new_key()
    srv.routes["/.well-known/did.json"] = json_route(multikey_doc(did, pk))
    # Without dev mode the resolver speaks TLS to the plain server: no request is ever read.
    await refused(resolver_for(client_ctx, timeout=0.5), did)
    assert srv.hits.total() == 0
    resolved = await resolver_for(client_ctx, dev_allow_http=True).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}
    # Dev mode never downgrades a non-loopback address.
    web = DidWebResolver(dev_allow_http=True)
    assert web._scheme_for(ipaddress.ip_address("8.8.8.8")) == "https"
    assert web._scheme_for(ipaddress.ip_address("10.0.0.1")) == "https"
    assert DidWebResolver()._scheme_for(ipaddress.ip_address("127.0.0.1")) == "https"


# -- size and time (E6, E7) ------------------------------------------------------------------


async def test_oversized_document_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    doc = multikey_doc(did, new_key())
    doc["service"] = [{"id": "#pad", "type": "X", "serviceEndpoint": "x" * (DEFAULT_MAX_DOCUMENT_BYTES)}]
    server.routes["/.well-known/did.json"] = json_route(doc)
    assert "larger than" in (await refused(resolver_for(client_ctx), did)).message


async def test_endless_chunked_body_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    sent = 0

    async def endless(req: Req, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await send(writer, headers={"Content-Length": None, "Transfer-Encoding": "chunked"})
        chunk = b"2000\r\n" + b" " * 0x2000 + b"\r\n"
        while sent < 64 * 1024 * 1024:
            writer.write(chunk)
            await writer.drain()
            sent += 0x2000

    server.routes["/.well-known/did.json"] = endless
    assert "larger than" in (await refused(resolver_for(client_ctx), server.did)).message
    assert sent < 8 * 1024 * 1024  # the client hung up early


async def test_lying_content_length_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    body = encoding.dumps(multikey_doc(did, new_key()))

    async def short(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body + b" " * 100_000, headers={"Content-Length": "20"})

    async def huge(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body, headers={"Content-Length": str(10**12)})

    async def close_delimited(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body + b" " * 100_000, headers={"Content-Length": None})

    server.routes["/.well-known/did.json"] = short
    server.routes["/huge/did.json"] = huge
    server.routes["/close/did.json"] = close_delimited
    resolver = resolver_for(client_ctx)
    await refused(resolver, did)  # only the first 20 bytes count: not a document
    assert "larger than" in (await refused(resolver, f"{did}:huge")).message
    assert "larger than" in (await refused(resolver, f"{did}:close")).message


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return gzip.compress(b" " * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB → ~64 KiB


async def test_gzip_bomb_refused(server: DocServer, client_ctx: ssl.SSLContext, gzip_bomb: bytes) -> None:
    assert len(gzip_bomb) < 2 * DEFAULT_MAX_DOCUMENT_BYTES

    async def bomb(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, gzip_bomb, headers={"Content-Encoding": "gzip"})

    server.routes["/.well-known/did.json"] = bomb
    assert "larger than" in (await refused(resolver_for(client_ctx), server.did)).message


@pytest.mark.parametrize(
    ("encoding_header", "body"),
    [
        ("gzip", b"\x1f\x8b not gzip at all"),
        ("gzip", gzip.compress(b'{"id": "x"}', mtime=0)[:-6]),  # truncated
        ("gzip", gzip.compress(b"{}", mtime=0) + b"trailing"),
        ("br", b"{}"),
        ("gzip, gzip", gzip.compress(gzip.compress(b"{}", mtime=0), mtime=0)),
    ],
)
async def test_bad_content_encoding_refused(
    server: DocServer, client_ctx: ssl.SSLContext, encoding_header: str, body: bytes
) -> None:
    async def handler(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body, headers={"Content-Encoding": encoding_header})

    server.routes["/.well-known/did.json"] = handler
    await refused(resolver_for(client_ctx), server.did)


async def test_silent_server_times_out(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    async def silent(req: Req, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server.routes["/.well-known/did.json"] = silent
    began = time.monotonic()
    assert "timed out" in (await refused(resolver_for(client_ctx, timeout=0.5), server.did)).message
    assert time.monotonic() - began < 2


async def test_slowloris_body_times_out(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    async def drip(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, headers={"Content-Length": "1000"})
        for _ in range(1000):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)  # each read is quick; only the overall deadline stops it

    server.routes["/.well-known/did.json"] = drip
    began = time.monotonic()
    assert "timed out" in (await refused(resolver_for(client_ctx, timeout=0.5), server.did)).message
    assert time.monotonic() - began < 2


async def test_tls_handshake_stall_times_out(
    client_ctx: ssl.SSLContext, start: Callable[[ssl.SSLContext | None], Awaitable[DocServer]]
) -> None:
    srv = await start(None)  # accepts TCP, never answers the ClientHello
    began = time.monotonic()
    await refused(resolver_for(client_ctx, timeout=0.5), srv.did)
    assert time.monotonic() - began < 2


def test_defaults_match_the_protocol() -> None:
    policy = VECTORS["fetch_policy_recommended_not_in_spec"]
    assert DEFAULT_MAX_DOCUMENT_BYTES == policy["max_body_bytes"] == 64 * 1024
    assert DEFAULT_TIMEOUT == policy["connect_timeout_s"] == 5  # and 5 s in total (§2)
    assert DidWebResolver()._timeout == 5.0


# -- HTTP answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        (404, "application/did+json", b"{}"),
        (500, "application/did+json", b"{}"),
        (200, "text/html", b"{}"),
        (200, None, b"{}"),
        (200, "application/json", b"not json"),
        (200, "application/json", b'{"id": "a", "id": "b"}'),  # duplicate member: not I-JSON
        (200, "application/json", b"[]"),
        (200, "application/json", b'{"id": NaN}'),
    ],
)
async def test_bad_answers_refused(
    server: DocServer, client_ctx: ssl.SSLContext, status: int, content_type: str | None, body: bytes
) -> None:
    async def handler(req: Req, writer: asyncio.StreamWriter) -> None:
        await send(writer, body, status=status, headers={"Content-Type": content_type})

    server.routes["/.well-known/did.json"] = handler
    await refused(resolver_for(client_ctx), server.did)


# -- document rules (E8-E10, H8) ------------------------------------------------------------


async def serve_and_refuse(server: DocServer, client_ctx: ssl.SSLContext, doc: dict[str, Any]) -> str:
    server.routes["/.well-known/did.json"] = json_route(doc)
    return (await refused(resolver_for(client_ctx), server.did)).message


async def test_id_mismatch_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    mismatch = VECTORS["invalid_per_spec"][4]["did_document_id_mismatch"]
    assert mismatch["document_id"] == "did:web:evil.example"
    doc = multikey_doc(server.did, new_key())
    doc["id"] = mismatch["document_id"]
    assert "does not match" in await serve_and_refuse(server, client_ctx, doc)
    doc["id"] = server.did.replace("agent", "Agent")  # no case folding
    assert "does not match" in await serve_and_refuse(server, client_ctx, doc)
    doc["id"] = server.did + " "
    assert "does not match" in await serve_and_refuse(server, client_ctx, doc)


async def test_jwk_with_private_key_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    doc = jwk_doc(did, okp(pk, d=encoding.b64u_encode(bytes(32))))
    assert "private key" in await serve_and_refuse(server, client_ctx, doc)
    # Even next to a usable key: a document that publishes a private key is broken.
    doc = multikey_doc(did, pk)
    doc["verificationMethod"].append(jwk_doc(did, okp(new_key(), d="AAAA"))["verificationMethod"][0])
    assert "private key" in await serve_and_refuse(server, client_ctx, doc)


@pytest.mark.parametrize("kind", ["Multikey", "Ed25519VerificationKey2020", "JsonWebKey2020"])
async def test_small_order_key_refused(server: DocServer, client_ctx: ssl.SSLContext, kind: str) -> None:
    did = server.did
    if kind == "JsonWebKey2020":
        doc = jwk_doc(did, okp(SMALL_ORDER_KEY))
    else:
        doc = multikey_doc(did, SMALL_ORDER_KEY, kind=kind)
    assert "prime-order" in await serve_and_refuse(server, client_ctx, doc)


@pytest.mark.parametrize(
    "jwk",
    [
        {"kty": "OKP", "crv": "X25519", "x": encoding.b64u_encode(bytes(range(32)))},
        {"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"},
        {"kty": "OKP", "crv": "Ed25519", "x": "not base64url!"},
        {"kty": "OKP", "crv": "Ed25519", "x": encoding.b64u_encode(bytes(31))},
    ],
)
async def test_unusable_jwk_refused(
    server: DocServer, client_ctx: ssl.SSLContext, jwk: dict[str, str]
) -> None:
    await serve_and_refuse(server, client_ctx, jwk_doc(server.did, jwk))


async def test_method_of_another_controller_ignored(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, good, foreign = server.did, new_key(), new_key()
    doc = multikey_doc(did, good)
    doc["verificationMethod"].append(
        {
            "id": "#theirs",
            "type": "Multikey",
            "controller": "did:web:evil.example",
            "publicKeyMultibase": multibase(foreign),
        }
    )
    doc["verificationMethod"].append(
        {
            "id": "did:web:evil.example#k",
            "type": "Multikey",
            "controller": did,
            "publicKeyMultibase": multibase(foreign),
        }
    )
    doc["authentication"] += ["#theirs", "did:web:evil.example#k"]
    server.routes["/.well-known/did.json"] = json_route(doc)
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": good}
    # Only a foreign method under authentication: nothing usable.
    only = multikey_doc(did, foreign)
    only["verificationMethod"][0]["controller"] = "did:web:evil.example"
    server.routes["/.well-known/did.json"] = json_route(only)
    await refused(resolver_for(client_ctx), did)


async def test_duplicate_method_ids_refused(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    doc = multikey_doc(did, new_key())
    doc["verificationMethod"].append({**doc["verificationMethod"][0], "id": f"{did}#key-1"})
    assert "duplicate" in await serve_and_refuse(server, client_ctx, doc)
    doc = multikey_doc(did, new_key())
    doc["authentication"].append({**doc["verificationMethod"][0], "publicKeyMultibase": multibase(new_key())})
    assert "duplicate" in await serve_and_refuse(server, client_ctx, doc)


async def test_counts_capped(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    doc = multikey_doc(did, new_key())
    doc["verificationMethod"] += [
        {"id": f"#k{i}", "type": "Multikey", "controller": did, "publicKeyMultibase": multibase(new_key())}
        for i in range(64)
    ]
    assert "more than 64" in await serve_and_refuse(server, client_ctx, doc)
    doc = multikey_doc(did, new_key())
    doc["service"] = [{"id": f"#s{i}", "type": "X", "serviceEndpoint": "https://x.test/"} for i in range(65)]
    assert "more than 64" in await serve_and_refuse(server, client_ctx, doc)


async def test_key_outside_authentication_not_usable(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    doc = multikey_doc(server.did, new_key())
    doc["assertionMethod"] = doc.pop("authentication")
    assert "no usable" in await serve_and_refuse(server, client_ctx, doc)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(verificationMethod={"id": "#x"}),
        lambda d: d.update(authentication=[5]),
        lambda d: d.update(service="https://x.test"),
        lambda d: d.update(service=["https://x.test"]),
        lambda d: d["verificationMethod"][0].update(id="key-1"),  # not "#...": not an id of this DID
        lambda d: d["verificationMethod"][0].update(publicKeyMultibase=42),
        lambda d: d["verificationMethod"][0].update(type="Ed25519VerificationKey2018"),
        lambda d: d["verificationMethod"][0].update(controller=["did:web:x.test"]),
    ],
)
def test_malformed_documents(mutate: Callable[[dict[str, Any]], None]) -> None:
    did = "did:web:example.com"
    doc = multikey_doc(did, new_key())
    assert parse_did_document(did, doc).keys
    mutate(doc)
    with pytest.raises(DIDResolutionError):
        parse_did_document(did, doc)


# -- cache (E13), coalescing and concurrency (H5) --------------------------------------------


async def test_failures_not_cached(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did, pk = server.did, new_key()
    state = {"ok": False}

    async def flaky(req: Req, writer: asyncio.StreamWriter) -> None:
        if state["ok"]:
            await send(writer, encoding.dumps(multikey_doc(did, pk)))
        else:
            await send(writer, b"{}", status=500)

    server.routes["/.well-known/did.json"] = flaky
    resolver = resolver_for(client_ctx)
    await refused(resolver, did)
    assert resolver.resolve_offline(did) is None
    state["ok"] = True
    assert dict((await resolver.resolve(did)).keys) == {f"{did}#key-1": pk}
    assert server.hits["/.well-known/did.json"] == 2


async def test_successes_cached_with_ttl(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    server.routes["/.well-known/did.json"] = json_route(multikey_doc(did, new_key()))
    now = [1000.0]
    resolver = resolver_for(client_ctx, cache_ttl=60.0, clock=lambda: now[0])
    first = await resolver.resolve(did)
    assert await resolver.resolve(did) is first
    now[0] += 59
    assert await resolver.resolve(did) is first
    assert server.hits["/.well-known/did.json"] == 1
    now[0] += 2
    await resolver.resolve(did)
    assert server.hits["/.well-known/did.json"] == 2


async def test_concurrent_resolutions_share_one_fetch(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    did = server.did
    body = encoding.dumps(multikey_doc(did, new_key()))

    async def slowish(req: Req, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.1)
        await send(writer, body)

    server.routes["/.well-known/did.json"] = slowish
    resolver = resolver_for(client_ctx)
    results = await asyncio.gather(*(resolver.resolve(did) for _ in range(10)))
    assert len({r.did for r in results}) == 1
    assert server.hits["/.well-known/did.json"] == 1


async def test_fetch_concurrency_bounded(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    for i in range(6):
        did = f"{server.did}:u{i}"
        body = encoding.dumps(multikey_doc(did, new_key()))

        async def handler(req: Req, writer: asyncio.StreamWriter, body: bytes = body) -> None:
            await asyncio.sleep(0.1)
            await send(writer, body)

        server.routes[f"/u{i}/did.json"] = handler
    resolver = resolver_for(client_ctx, max_concurrency=2)
    results = await asyncio.gather(*(resolver.resolve(f"{server.did}:u{i}") for i in range(6)))
    assert len(results) == 6
    assert server.max_active <= 2
    assert server.connections == 6


# -- vectors (did_web_urls.json) ---------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["did"])
def test_vector_urls(vector: dict[str, str]) -> None:
    assert did_web_to_url(vector["did"]) == vector["url"]
    assert DidWebResolver().request_url(vector["did"]) == vector["url"]


REJECTED = [v["did"] for v in VECTORS["invalid_per_spec"] if "did" in v] + [
    v["did"] for v in VECTORS["sdk_policy_rejects_not_in_spec"] if v["did"] != "did:web:rebind.example"
]


@pytest.mark.parametrize("did", REJECTED)
async def test_vector_rejections_before_io(server: DocServer, client_ctx: ssl.SSLContext, did: str) -> None:
    # Even with every name pointed at the live server and 127.0.0.1 allowed, these are
    # refused by syntax, the URL rule or the name policy, so nothing is ever dialled.
    host = did.split(":")[2].split("%", maxsplit=1)[0]
    resolver = resolver_for(client_ctx, host_overrides={host: "127.0.0.1", "agent.test": "127.0.0.1"})
    with pytest.raises((InvalidParams, DIDResolutionError)):
        DidWebResolver(host_overrides={host: "127.0.0.1"}, allow_addresses=["127.0.0.1"]).request_url(did)
    with pytest.raises((InvalidParams, DIDResolutionError)):
        await resolver.resolve(did)
    assert server.connections == 0


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.20.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "::1",
        "fc00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
    ],
)
async def test_vector_rebind(server: DocServer, client_ctx: ssl.SSLContext, address: str) -> None:
    assert any(v["did"] == "did:web:rebind.example" for v in VECTORS["sdk_policy_rejects_not_in_spec"])
    did = "did:web:rebind.example"
    web = DidWebResolver(verify=client_ctx, host_overrides={"rebind.example": address})
    assert web.request_url(did) == "https://rebind.example/.well-known/did.json"  # the name is fine
    resolver = make_resolver(verify=client_ctx, host_overrides={"rebind.example": address})
    assert "non-public" in (await refused(resolver, did)).message


async def test_document_from_did_web_document_resolves(server: DocServer, client_ctx: ssl.SSLContext) -> None:
    from a2a_secure.identity import did as did_module

    make_doc = getattr(did_module, "did_web_document", None)
    if make_doc is None:
        pytest.skip("did_web_document is not available")
    did, pk = f"{server.did}:agents:translator", new_key()
    server.routes["/agents/translator/did.json"] = json_route(make_doc(did, pk))
    resolved = await resolver_for(client_ctx).resolve(did)
    assert dict(resolved.keys) == {f"{did}#key-1": pk}
