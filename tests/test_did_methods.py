"""DID methods as plug-ins: registered, from entry points, the did:github example, bounds.

did:github is resolved from a local TLS server (trustme CA; github.test → 127.0.0.1 allowed
only by the test configuration). No test reaches the internet.
"""

from __future__ import annotations

import asyncio
import ssl
import textwrap
from pathlib import Path

import httpx
import pytest
import trustme
from http_helpers import JSON, AuditLog, build_server, envelope, identity
from test_didweb import DocServer, ca, client_ctx, json_route, multibase, send, server_ctx  # noqa: F401

from a2a_secure.errors import DIDResolutionError
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.methods.github import GithubResolver, github_did_url
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID, resolve_did_key
from a2a_secure.protocol.client import ClientHandshake
from a2a_secure.testing import serve_app


async def refused(resolver: DIDResolver, did: str, text: str) -> None:
    with pytest.raises(DIDResolutionError, match=text) as info:
        await resolver.resolve(did)
    assert info.value.code == -32047


async def test_unknown_method_names_the_method() -> None:
    await refused(DIDResolver(), "did:nosuch:abc", "DID method 'nosuch' is not supported")


async def test_did_key_and_did_web_are_plugins_registered_by_default() -> None:
    resolver = DIDResolver()
    me = identity("methods")
    assert (await resolver.resolve(me.did)).keys == {me.kid: me.public_key}
    # did:web is known without configuration (and keeps its bounds: no loopback).
    await refused(resolver, "did:web:localhost", "local or internal")


async def test_a_plugin_that_raises_or_hangs_is_bounded() -> None:
    resolver = DIDResolver(timeout=0.2)

    async def boom(did: str) -> ResolvedDID:
        raise RuntimeError("internal detail")

    async def hang(did: str) -> ResolvedDID:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    async def wrong(did: str) -> ResolvedDID:
        return resolve_did_key(identity("other").did)

    resolver.register("boom", boom)
    resolver.register("hang", hang)
    resolver.register("wrong", wrong)
    await refused(resolver, "did:boom:x", "DID method 'boom' failed")
    loop = asyncio.get_running_loop()
    t = loop.time()
    await refused(resolver, "did:hang:x", "DID method 'hang' did not answer in time")
    assert loop.time() - t < 2
    await refused(resolver, "did:wrong:x", "DID method 'wrong' gave no usable key")


async def test_a_hanging_plugin_is_minus_32047_over_http_never_500() -> None:
    server = build_server(audit=AuditLog())
    resolver = DIDResolver(timeout=0.3)

    async def hang(did: str) -> ResolvedDID:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    resolver.register("hang", hang)
    server.resolver = resolver
    client = Identity.generate("hanging").with_did_web("did:hang:agent", "did:hang:agent#k1")
    async with serve_app(server.app()) as url, httpx.AsyncClient(timeout=10) as http:
        hello = ClientHandshake(client, resolve_did_key(server.identity.did)).hello()
        resp = await http.post(url + "/a2a/handshake", content=envelope("hello", hello), headers=JSON)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == -32047 and "'hang'" in resp.json()["error"]["message"]


# -- entry points ------------------------------------------------------------------------------------
def _dist(tmp_path: Path, name: str, module: str, body: str, entry: str) -> None:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[a2a_secure.did_methods]\n{entry}\n")


async def test_entry_point_plugin_is_loaded_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = identity("ep-key")
    _dist(
        tmp_path,
        "a2a_ep_demo",
        "a2a_ep_demo",
        f"""
        from a2a_secure.identity.resolver import ResolvedDID
        from a2a_secure.identity.encoding import b64u_decode

        class Demo:
            async def __call__(self, did):
                key = b64u_decode("{encoding.b64u_encode(seed.public_key)}")
                return ResolvedDID(did=did, keys={{did + "#k": key}})
        """,
        "demo = a2a_ep_demo:Demo",
    )
    _dist(
        tmp_path,
        "a2a_ep_broken",
        "a2a_ep_broken",
        "raise ImportError('broken plug-in')\n",
        "broken = a2a_ep_broken:X",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    resolver = DIDResolver()
    assert "demo" not in resolver.methods
    resolved = await resolver.resolve("did:demo:abc")
    assert resolved.keys == {"did:demo:abc#k": seed.public_key} and "demo" in resolver.methods
    for _ in range(2):  # a broken plug-in keeps failing with the same clear error
        await refused(resolver, "did:broken:abc", "DID method 'broken' plug-in failed to load")


# -- did:github ---------------------------------------------------------------------------------------
@pytest.fixture
async def github(ca: trustme.CA) -> DocServer:  # noqa: F811
    s = await DocServer(server_ctx(ca, "github.test")).start()
    yield s  # type: ignore[misc]
    await s.close()


def github_resolver(gh: DocServer, ctx: ssl.SSLContext) -> DIDResolver:
    resolver = DIDResolver()
    resolver.register(
        "github",
        GithubResolver(
            base_url=f"https://github.test:{gh.port}/raw",
            verify=ctx,
            host_overrides={"github.test": "127.0.0.1"},
            allow_addresses=["127.0.0.1/32"],
            timeout=2.0,
        ),
    )
    return resolver


async def test_did_github_resolves_from_the_repository_file(
    github: DocServer,
    client_ctx: ssl.SSLContext,  # noqa: F811
) -> None:
    did = "did:github:octo-org:agent.repo"
    key = identity("gh").public_key
    doc = {
        "id": did,
        "verificationMethod": [
            {"id": "#key-1", "type": "Multikey", "controller": did, "publicKeyMultibase": multibase(key)}
        ],
        "authentication": ["#key-1"],
    }

    async def as_text(req: object, writer: asyncio.StreamWriter) -> None:
        await send(writer, encoding.dumps(doc), headers={"Content-Type": "text/plain; charset=utf-8"})

    github.routes["/raw/octo-org/agent.repo/HEAD/.well-known/did.json"] = as_text
    resolver = github_resolver(github, client_ctx)
    assert (await resolver.resolve(did)).keys == {f"{did}#key-1": key}
    assert (
        github_did_url(did)
        == "https://raw.githubusercontent.com/octo-org/agent.repo/HEAD/.well-known/did.json"
    )
    # The document's id must be the DID exactly.
    github.routes["/raw/octo-org/other/HEAD/.well-known/did.json"] = json_route(doc)
    await refused(resolver, "did:github:octo-org:other", "id does not match")
    for bad in ("did:github:octo-org", "did:github:-bad:repo", "did:github:a:..", "did:github:a:b:c"):
        await refused(resolver, bad, "did:github")


async def test_did_github_keeps_the_ssrf_bounds(client_ctx: ssl.SSLContext) -> None:  # noqa: F811
    resolver = DIDResolver()
    resolver.register(
        "github",
        GithubResolver(
            base_url="https://github.test:1", verify=client_ctx, host_overrides={"github.test": "127.0.0.1"}
        ),
    )
    await refused(resolver, "did:github:octo:repo", "non-public address")
    with pytest.raises(ValueError, match="https"):
        GithubResolver(base_url="http://example.com")
