"""The address policy for every URL taken from a document, a registry file or a card.

A public did:web document, a registry file or an agent card names where the client connects;
none may point it at loopback or a private host unless the operator opted in
(``a2a_secure.identity.addresses``, SECURITY.md). And no URL, however broken, may escape as a
``ValueError`` from a loop that skips bad entries. The servers are real, on 127.0.0.1: the
did:web documents come over HTTPS from the test CA of test_didweb.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import test_didweb as didweb
from test_didweb import ca, client_ctx, server, servers, start  # noqa: F401

from a2a_secure.a2a_binding.push import PushUrlPolicy
from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.cli import main
from a2a_secure.client.http import check_endpoint
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import AddressPolicy, Reach, may_point, parse_http_url, url_reach
from a2a_secure.testing import serve_app
from tests.http_helpers import identity, system_dns

LOOPBACK = AddressPolicy.build(dev_allow_loopback=True)
ECHO = {"goal": "echo", "inputs": {"a": 1}}

# URLs that must be refused as InvalidParams, never raise ValueError from urllib or ipaddress.
UNPARSABLE = [
    "https://[::1",
    "https://[::1]x",
    "https://[zz]",
    "https://[fe80::1%25eth0]",
    "https://agent.example:99999",
    "https://agent.example:0",
    "https://agent.example:-1",
    "https://agent.example:x",
    "https://agent.example:",
    "https://user:secret@agent.example",
    "https://public.example@127.0.0.1",
    "https://exämple.com",
    "https://a b.example",
    "https://%6c%6f.example",
    "https://agent.example\n.evil",
    "https://",
    "agent.example",
    "ftp://agent.example",
    "",
    "https://" + "a" * 2100 + ".example",
]
# URLs that parse but name a host no document may send this client to without an opt-in.
NON_PUBLIC = [
    "http://127.0.0.1:8080/admin",
    "https://127.0.0.1:8443",
    "https://127.1:8443",
    "https://2130706433",
    "https://0x7f000001",
    "https://[::1]:8443",
    "https://[::ffff:127.0.0.1]",
    "https://[64:ff9b::a00:1]",
    "https://10.0.0.5",
    "https://192.168.1.10:8443",
    "https://100.64.0.1",
    "http://169.254.169.254/latest/meta-data",
    "https://[fd00::1]",
    "https://localhost:8443",
    "https://api.localhost",
    "https://metadata.google.internal",
    "https://intranet",
    "https://printer.local",
    "https://router.home.arpa",
]


def did_web_doc(did: str, endpoint: Any) -> dict[str, Any]:
    doc = didweb.multikey_doc(did, didweb.new_key())
    doc["service"] = [{"id": "#a2a", "type": "A2ASecureAgent", "serviceEndpoint": endpoint}]
    return doc


# -- the policy itself -----------------------------------------------------------------------------


@pytest.mark.parametrize("url", UNPARSABLE)
def test_a_url_that_does_not_parse_is_invalid_params_never_value_error(url: str) -> None:
    for check in (check_endpoint, AddressPolicy().check_url, LOOPBACK.check_url, parse_http_url):
        with pytest.raises(InvalidParams) as info:
            check(url)
        assert info.value.code == -32602
        assert "secret" not in info.value.message  # user info is never echoed


@pytest.mark.parametrize("url", NON_PUBLIC)
def test_a_non_public_host_is_refused_without_an_opt_in(url: str) -> None:
    with pytest.raises(
        InvalidParams, match=r"non-public address|non-standard form|local or internal host|must be https"
    ):
        AddressPolicy().check_url(url)


def test_the_opt_ins_are_explicit_and_narrow() -> None:
    assert AddressPolicy().check_url("https://agent.example.com/") == "https://agent.example.com"
    assert AddressPolicy().check_url("https://[2606:4700::1111]:8443") == "https://[2606:4700::1111]:8443"
    assert LOOPBACK.check_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert LOOPBACK.check_url("http://localhost:1") == "http://localhost:1"
    assert LOOPBACK.check_url("https://[::1]:8443") == "https://[::1]:8443"
    assert check_endpoint("https://agent_1:8443") == "https://agent_1:8443"  # a service name, in code
    for url in ("http://10.0.0.5", "https://10.0.0.5", "http://agent.example.com", "https://intranet"):
        with pytest.raises(InvalidParams):
            LOOPBACK.check_url(url)  # loopback, and nothing else
    private = AddressPolicy.build(allow_addresses=["10.1.0.0/16"], allow_hosts=["agents.corp"])
    assert private.check_url("https://10.1.2.3:8443") == "https://10.1.2.3:8443"
    assert private.check_url("https://agents.corp") == "https://agents.corp"
    for url in ("https://10.2.0.1", "http://10.1.2.3", "https://127.0.0.1", "https://other.corp"):
        with pytest.raises(InvalidParams):
            private.check_url(url)


def test_the_did_web_fetch_and_the_endpoints_share_one_policy(client_ctx: ssl.SSLContext) -> None:  # noqa: F811
    from a2a_secure.identity.didweb import DidWebResolver

    resolver = DidWebResolver(verify=client_ctx, allow_addresses=["10.1.0.0/16"], dev_allow_loopback=True)
    assert isinstance(resolver.addresses, AddressPolicy)
    assert resolver.addresses.check_url("https://10.1.0.9") == "https://10.1.0.9"
    assert resolver.addresses.check_url("http://127.0.0.1:1") == "http://127.0.0.1:1"


# -- did:web service endpoints -----------------------------------------------------------------


async def test_a_did_web_document_cannot_send_the_hello_to_loopback(
    server: didweb.DocServer,  # noqa: F811
    start: Any,  # noqa: F811
    client_ctx: ssl.SSLContext,  # noqa: F811
) -> None:
    admin = await start(None)  # a plain-HTTP service on this machine the document points at
    server.routes["/.well-known/did.json"] = didweb.json_route(
        did_web_doc(server.did, f"http://127.0.0.1:{admin.port}/admin")
    )
    async with A2AAgent("caller", identity("caller"), resolver=didweb.resolver_for(client_ctx)) as caller:
        with pytest.raises(InvalidParams, match=r"service endpoint of did:web:agent\.test") as info:
            await caller.request(server.did, ECHO)
        assert info.value.code == -32602 and "127.0.0.1" not in info.value.message
        with pytest.raises(InvalidParams):
            await caller.handshake(server.did)
    assert admin.connections == 0  # no HELLO, no GET: nothing reached the address
    # The same document with the operator's explicit opt-in does reach it (the test is live).
    async with A2AAgent(
        "caller", identity("caller"), resolver=didweb.resolver_for(client_ctx), addresses=LOOPBACK
    ) as ok:
        with pytest.raises(A2AError):
            await ok.request(server.did, ECHO)
    assert admin.hits["/admin/a2a/handshake"] == 1


async def test_a_did_web_service_name_that_resolves_to_loopback_gets_no_connection(
    server: didweb.DocServer,  # noqa: F811
    start: Any,  # noqa: F811
    client_ctx: ssl.SSLContext,  # noqa: F811
) -> None:
    # A public name passes the policy by name; its DNS answer, checked when the client
    # connects, is loopback: nothing is dialled (a dial by name would reach the service).
    admin = await start(None)
    server.routes["/.well-known/did.json"] = didweb.json_route(
        did_web_doc(server.did, f"https://rebind.example.com:{admin.port}/admin")
    )
    with system_dns({"rebind.example.com": ["127.0.0.1"]}):
        async with A2AAgent("caller", identity("caller"), resolver=didweb.resolver_for(client_ctx)) as caller:
            with pytest.raises(A2AError, match="did not answer"):
                await caller.request(server.did, ECHO)
    assert admin.connections == 0


@pytest.mark.parametrize(
    "endpoint", ["https://10.0.0.5:8443", "https://[::1", "https://metadata.google.internal"]
)
async def test_a_refused_service_endpoint_is_skipped_for_the_next_one(
    server: didweb.DocServer,  # noqa: F811
    client_ctx: ssl.SSLContext,  # noqa: F811
    endpoint: str,
) -> None:
    doc = did_web_doc(server.did, endpoint)
    doc["service"].append(
        {"id": "#a2a-2", "type": "A2ASecureAgent", "serviceEndpoint": "https://agent.example"}
    )
    server.routes["/.well-known/did.json"] = didweb.json_route(doc)
    async with A2AAgent("caller", identity("caller"), resolver=didweb.resolver_for(client_ctx)) as caller:
        assert (await caller._locate(server.did))[2] == "https://agent.example"


# -- the LLM tool listing ------------------------------------------------------------------------


async def test_one_bad_service_endpoint_does_not_break_the_tool_listing(
    server: didweb.DocServer,  # noqa: F811
    client_ctx: ssl.SSLContext,  # noqa: F811
) -> None:
    server.routes["/.well-known/did.json"] = didweb.json_route(did_web_doc(server.did, "https://[::1"))
    host = A2AAgent("host", identity("tool-host"))

    @host.intent("echo")
    async def echo(inputs: Any) -> Any:
        return inputs

    async with serve_app(host.app) as url:
        registry = AgentRegistry(
            [
                RegistryEntry("good", host.did, url, ("echo",)),
                RegistryEntry("bad", server.did, None, ("echo",)),
                RegistryEntry("typo", host.did, "https://[::1", ("echo",)),  # built in code
            ]
        )
        async with A2AAgent(
            "orchestrator",
            identity("orchestrator"),
            registry=registry,
            resolver=didweb.resolver_for(client_ctx),
        ) as agent:
            names = [s["function"]["name"] for s in await agent.tool_schemas()]
            assert names == ["good__echo"]
            assert "bad refused:" in agent.tools.failures["bad"]
            assert "service endpoint" in agent.tools.failures["bad"]
            assert "typo refused: endpoint is not a valid URL" in agent.tools.failures["typo"]
            result = await agent.call_tool("good__echo", {"a": 1})
            assert result.status == "success" and result.content["result"] == {"a": 1}


# -- registry files ----------------------------------------------------------------------------


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "agent_registry.json"
    path.write_bytes(encoding.dumps(data))
    return path


# Plain http to a host other than loopback: refused even from the operator (PROTOCOL.md §4).
PLAIN_HTTP_ELSEWHERE = ["http://10.0.0.5", "http://agent.example.com", "http://printer.local"]


@pytest.mark.parametrize("endpoint", UNPARSABLE + PLAIN_HTTP_ELSEWHERE)
def test_a_registry_endpoint_that_is_broken_or_plain_http_elsewhere_is_skipped(
    tmp_path: Path, endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    did = identity("summarizer").did
    data = {"bad": {"did": did, "endpoint": endpoint}, "good": {"did": did, "endpoint": "https://a.example"}}
    with caplog.at_level(logging.WARNING, logger="a2a_secure.agent"):
        registry = AgentRegistry.load(_write(tmp_path, data))
    assert [e.name for e in registry.entries()] == ["good"]
    [problem] = registry.problems
    assert problem.entry == "bad" and problem.member == "endpoint"
    assert "skipped registry entry 'bad': member 'endpoint' is not usable" in caplog.text
    assert "secret" not in caplog.text


def test_a_registry_file_is_the_operators_own_choice_as_an_endpoint_argument_is(tmp_path: Path) -> None:
    # The operator points at the file: loopback and private hosts need no opt-in (as with
    # --endpoint), and the rule is the endpoint rule of §4, the same function.
    did = identity("summarizer").did
    # (Every https one but the IPv4 addresses in a non-standard form, which no rule parses.)
    odd = ("https://127.1:8443", "https://2130706433", "https://0x7f000001")
    taken = [url for url in NON_PUBLIC if url.startswith("https://") and url not in odd]
    taken.append("http://127.0.0.1:8080/admin")
    local = {f"a{i}": {"did": did, "endpoint": url} for i, url in enumerate(taken)}
    local["dev"] = {"did": did, "endpoint": "http://127.0.0.1:8101"}
    registry = AgentRegistry.load(_write(tmp_path, local))
    assert registry.problems == ()
    assert registry.find("dev").endpoint == "http://127.0.0.1:8101"
    for url in taken:
        assert check_endpoint(url)  # what --endpoint takes, a registry file takes
    # Entries added in code are the caller's own choice too.
    AgentRegistry([RegistryEntry("local", did, "http://127.0.0.1:8101")])
    # A registry another network served is a remote document: no further in than that network.
    served = {
        "a": {"did": did, "endpoint": "https://10.0.0.5"},
        "b": {"did": did, "endpoint": "https://a.example"},
    }
    assert [e.name for e in AgentRegistry.from_dict(served, origin=Reach.PUBLIC).entries()] == ["b"]
    assert len(AgentRegistry.from_dict(served, origin=Reach.PRIVATE).entries()) == 2


# (target, origin of the document that names it, allowed without an opt-in)
ORIGINS = [
    ("https://agent.example.com", Reach.PUBLIC, True),
    ("https://10.1.2.3", Reach.PUBLIC, False),
    ("https://agents.corp", Reach.PUBLIC, False),
    ("https://127.0.0.1:8443", Reach.PUBLIC, False),
    ("https://agent.example.com", Reach.PRIVATE, True),
    ("https://10.1.2.3", Reach.PRIVATE, True),
    ("https://[fd00::1]", Reach.PRIVATE, True),
    ("https://agents.corp", Reach.PRIVATE, True),
    ("https://127.0.0.1:8443", Reach.PRIVATE, False),
    ("https://localhost", Reach.PRIVATE, False),
    ("https://agent.example.com", Reach.LOOPBACK, True),
    ("https://10.1.2.3", Reach.LOOPBACK, True),
    ("https://127.0.0.1:8443", Reach.LOOPBACK, True),
    ("http://127.0.0.1:8443", Reach.LOOPBACK, True),
    ("http://127.0.0.1:8443", Reach.PRIVATE, False),
    ("http://10.1.2.3", Reach.LOOPBACK, False),
    # The metadata service and other special ranges: from nowhere.
    ("http://169.254.169.254/latest/meta-data", Reach.LOOPBACK, False),
    ("https://169.254.169.254", Reach.PRIVATE, False),
    ("https://metadata.google.internal", Reach.LOOPBACK, False),
    ("https://[ff02::1]", Reach.LOOPBACK, False),
]


@pytest.mark.parametrize(("url", "origin", "allowed"), ORIGINS)
def test_a_document_may_point_no_further_in_than_where_it_came_from(
    url: str, origin: Reach, allowed: bool
) -> None:
    policy = AddressPolicy()
    if allowed:
        assert policy.check_url(url, origin=origin) == url.rstrip("/")
    else:
        with pytest.raises(InvalidParams, match=r"opt-in|must be https"):
            policy.check_url(url, origin=origin)
    # The push validator decides by the same rule (its DNS answers are addresses too).
    push = PushUrlPolicy(origin=origin, allow_http=True, resolve=_dns)
    assert asyncio.run(push(url)) is (
        allowed or (url.startswith("http://") and may_point(url_reach(url), origin))
    )
    # The operator's opt-in admits it whatever the origin (here, the networks named).
    opted = AddressPolicy.build(allow_addresses=["10.1.0.0/16", "127.0.0.0/8"], allow_hosts=["agents.corp"])
    if url.startswith("https://") and ("10.1." in url or "127.0.0.1" in url or "agents.corp" in url):
        assert opted.check_url(url, origin=Reach.PUBLIC) == url.rstrip("/")


async def _dns(host: str, port: int) -> list[str]:
    """What the names of ORIGINS resolve to, in this test."""
    names = {
        "agent.example.com": "93.184.216.34",
        "agents.corp": "10.1.2.3",
        "localhost": "127.0.0.1",
        "metadata.google.internal": "169.254.169.254",
    }
    return [names[host]]


def test_a_did_web_service_endpoint_points_no_further_in_than_the_did_web_host() -> None:
    from a2a_secure.agent import _service_endpoint
    from a2a_secure.client.pinning import DialPlan
    from a2a_secure.identity.resolver import ResolvedDID

    def endpoint_of(did: str, url: str) -> str | None:
        service = {"id": "#a2a", "type": "A2ASecureAgent", "serviceEndpoint": url}
        accept = functools.partial(DialPlan().accept, policy=AddressPolicy())
        return _service_endpoint(ResolvedDID(did, {}, (service,)), accept)

    assert endpoint_of("did:web:agents.corp", "https://10.1.2.3:8443") == "https://10.1.2.3:8443"
    assert (
        endpoint_of("did:web:agent.example.com", "https://agent.example.com") == "https://agent.example.com"
    )
    with pytest.raises(InvalidParams, match="non-public address"):
        endpoint_of("did:web:agent.example.com", "https://10.1.2.3:8443")  # public -> private
    with pytest.raises(InvalidParams, match="non-public address"):
        endpoint_of("did:web:agents.corp", "https://127.0.0.1:8443")  # private -> loopback


def test_cli_call_with_a_malformed_registry_endpoint_skips_it_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "me.key"
    identity("cli-caller").save(key)
    did = identity("summarizer").did
    path = _write(
        tmp_path,
        {
            "bad": {"did": did, "endpoint": "https://[::1"},
            "good": {"did": did, "endpoint": "https://a.example"},
        },
    )
    code = main(["call", "--key-file", str(key), "--registry", str(path), "--to", "xyz", "--goal", "echo"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "No agent found matching 'xyz' (known agents: good)" in err
    path.write_bytes(encoding.dumps({"local": {"did": did, "endpoint": "http://127.0.0.1:1"}}))
    code = main(["call", "--key-file", str(key), "--registry", str(path), "--to", "local", "--goal", "echo"])
    err = capsys.readouterr().err  # the operator's own file: taken, and nothing answers there
    assert code == 1 and "did not answer at http://127.0.0.1:1" in err and "Traceback" not in err
    code = main(["call", "--key-file", str(key), "--registry", str(path), "--to", "local", "--goal", "echo",
                 "--allow-address", "not-a-network"])  # fmt: skip
    assert code == 1 and "--allow-address takes a network" in capsys.readouterr().err


def test_cli_mcp_with_only_malformed_registry_endpoints_is_one_clean_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mcp")
    key = tmp_path / "me.key"
    identity("mcp-caller").save(key)
    path = _write(tmp_path, {"bad": {"did": identity("summarizer").did, "endpoint": "https://[::1"}})
    code = main(["mcp", "--key-file", str(key), "--registry", str(path)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "no usable agent: registry entry 'bad': member 'endpoint' is not usable" in err


async def test_the_readmes_first_snippet_works_with_a_registry_of_agents_on_this_machine(
    tmp_path: Path,
) -> None:
    # README "Use": A2AAgent(..., registry="agent_registry.json") and request by name, the
    # registry naming an agent on loopback, with no address opt-in: the operator's own file.
    from a2a_secure.server.app import AgentServer

    translator = AgentServer(identity("readme-translator"))

    @translator.intent("translate")
    def translate(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"text": inputs["text"][::-1]}

    async with serve_app(translator.app()) as url:
        entry = {"did": translator.identity.did, "endpoint": url, "capabilities": ["translate"]}
        path = _write(tmp_path, {"translator": entry})
        async with A2AAgent("orchestrator", identity("readme-orchestrator"), registry=str(path)) as agent:
            result = await agent.request(
                "translator",
                {"goal": "translate", "inputs": {"text": "Hello world", "target_language": "es"}},
            )
    assert result == {"text": "dlrow olleH"}
