"""``AgentRegistry``: the file forms it reads, lookups, and errors a person can act on.

The flat form (``{name: {did, endpoint, capabilities}}``) is how registries are usually
written; the wrapped and array forms under a top-level ``agents`` member keep their meaning.
The unreachable-endpoint tests use a real closed port on 127.0.0.1 and the real client.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from a2a_secure.agent import (
    A2AAgent,
    AgentNotFound,
    AgentRegistry,
    AmbiguousTarget,
    RegistryEntry,
    RegistryEntryError,
    RegistryError,
)
from a2a_secure.client.http import RetryPolicy
from a2a_secure.errors import A2AError, PeerUnreachable, Unavailable
from a2a_secure.identity.addresses import AddressPolicy
from tests.http_helpers import identity

# The servers here run on 127.0.0.1: endpoints read from a document need the explicit opt-in.
LOOPBACK = AddressPolicy.build(dev_allow_loopback=True)

SUMMARIZER = identity("summarizer").did
TRANSLATOR = "did:web:translator.example.com"
FLAT: dict[str, Any] = {
    "summarizer": {
        "did": SUMMARIZER,
        "endpoint": "https://summarizer.example.com",
        "capabilities": ["summarize", "extract-key-points"],
    },
    "translator": {
        "did": TRANSLATOR,
        "endpoint": "https://translator.example.com/a2a",
        "capabilities": ["translate", "detect-language"],
    },
}
EXPECTED = [
    RegistryEntry(
        "summarizer", SUMMARIZER, "https://summarizer.example.com", ("summarize", "extract-key-points")
    ),
    RegistryEntry(
        "translator", TRANSLATOR, "https://translator.example.com/a2a", ("translate", "detect-language")
    ),
]
FAST = RetryPolicy(attempts=2, base=0.01, cap=0.02)


def write(tmp_path: Path, data: Any, name: str = "agent_registry.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- file forms --------------------------------------------------------------------------------


def test_flat_form_loads_as_written(tmp_path: Path) -> None:
    registry = AgentRegistry.load(write(tmp_path, FLAT))
    assert registry.entries() == EXPECTED
    assert registry.problems == ()


def test_wrapped_and_array_forms_still_load_the_same_entries(tmp_path: Path) -> None:
    wrapped = write(tmp_path, {"agents": FLAT}, "wrapped.json")
    array = write(tmp_path, {"agents": [{"name": k, **v} for k, v in FLAT.items()]}, "array.json")
    assert AgentRegistry.load(wrapped).entries() == EXPECTED
    assert AgentRegistry.load(array).entries() == EXPECTED


def test_a_top_level_agents_member_keeps_its_old_meaning(tmp_path: Path) -> None:
    # Members beside "agents" are not agents: the file is the wrapped form.
    mixed = {"agents": {"summarizer": FLAT["summarizer"]}, "translator": FLAT["translator"]}
    assert [e.name for e in AgentRegistry.from_dict(mixed).entries()] == ["summarizer"]
    # An "agents" member shaped like one agent is still the wrapped form, so it does not load.
    with pytest.raises(RegistryError, match="registry entry 'did' must be an object"):
        AgentRegistry.from_dict({"agents": {"did": SUMMARIZER, "endpoint": "https://a.example"}})
    with pytest.raises(RegistryError, match="registry member 'agents' must be an object or an array"):
        AgentRegistry.from_dict({"agents": "summarizer"})


def test_empty_registries_load_empty() -> None:
    for data in ({}, {"agents": {}}, {"agents": []}):
        registry = AgentRegistry.from_dict(data)
        assert registry.entries() == [] and registry.problems == ()


@pytest.mark.parametrize("data", [[], "agents", 3, None])
def test_a_registry_that_is_not_an_object_is_refused(data: Any) -> None:
    with pytest.raises(RegistryError, match="a registry is a JSON object"):
        AgentRegistry.from_dict(data)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"registry file not found: .*missing\.json"):
        AgentRegistry.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(RegistryError, match=r"registry file .*bad.json is not JSON"):
        AgentRegistry.load(bad)
    with pytest.raises(RegistryError, match=r"registry file .*list.json: a registry is a JSON object"):
        AgentRegistry.load(write(tmp_path, [FLAT], "list.json"))


# -- malformed entries -------------------------------------------------------------------------

MALFORMED: dict[str, tuple[Any, str]] = {
    "no-did": ({"endpoint": "https://a.example"}, "registry entry 'no-did': member 'did' is missing"),
    "did-number": (
        {"did": 7},
        "registry entry 'did-number': member 'did' is not usable: DID must be a string",
    ),
    "did-syntax": (
        {"did": "translator"},
        "registry entry 'did-syntax': member 'did' is not usable: not a DID",
    ),
    "endpoint-type": (
        {"did": SUMMARIZER, "endpoint": 8080},
        "registry entry 'endpoint-type': member 'endpoint' must be a string",
    ),
    "endpoint-plain-http": (
        {"did": SUMMARIZER, "endpoint": "http://agents.example.com"},
        "registry entry 'endpoint-plain-http': member 'endpoint' is not usable: endpoint must be https",
    ),
    "caps-string": (
        {"did": SUMMARIZER, "capabilities": "summarize"},
        "registry entry 'caps-string': member 'capabilities' must be an array of non-empty strings",
    ),
    "caps-number": (
        {"did": SUMMARIZER, "capabilities": ["ok", 3]},
        "registry entry 'caps-number': member 'capabilities' must be an array of non-empty strings",
    ),
    "not-object": ("did:key:z6Mk", "registry entry 'not-object' must be an object with a 'did' member"),
}


def test_a_malformed_entry_is_skipped_named_and_the_others_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = {**FLAT, **{name: raw for name, (raw, _) in MALFORMED.items()}}
    with caplog.at_level(logging.WARNING, logger="a2a_secure.agent"):
        registry = AgentRegistry.load(write(tmp_path, data))
    assert registry.entries() == EXPECTED
    assert len(registry.problems) == len(MALFORMED)
    for problem, (name, (_, message)) in zip(registry.problems, MALFORMED.items(), strict=True):
        assert isinstance(problem, RegistryEntryError) and problem.entry == name
        assert problem.message.startswith(message), problem.message
    assert [p.member for p in registry.problems] == [
        "did", "did", "did", "endpoint", "endpoint", "capabilities", "capabilities", None,
    ]  # fmt: skip
    logged = [r.getMessage() for r in caplog.records if r.name == "a2a_secure.agent"]
    assert logged == [f"skipped {p.message}" for p in registry.problems]
    with pytest.raises(AgentNotFound):
        registry.find("no-did")


def test_array_form_entries_are_named_by_name_or_position() -> None:
    registry = AgentRegistry.from_dict(
        {
            "agents": [
                {"name": "summarizer", "did": SUMMARIZER},
                {"did": TRANSLATOR},
                {"name": "summarizer", "did": TRANSLATOR},
                "translator",
            ]
        }
    )
    assert [e.name for e in registry.entries()] == ["summarizer"]
    assert registry.find("summarizer").did == SUMMARIZER  # the first of two with one name wins
    assert [p.message for p in registry.problems] == [
        "registry entry '#1': member 'name' must be a non-empty string",
        "registry entry 'summarizer': member 'name' is used by an earlier entry",
        "registry entry '#3' must be an object with a 'did' member",
    ]


def test_a_file_where_every_entry_is_malformed_raises(tmp_path: Path) -> None:
    data = {name: raw for name, (raw, _) in MALFORMED.items()}
    with pytest.raises(RegistryError) as exc:
        AgentRegistry.load(write(tmp_path, data))
    assert "no usable agent: registry entry 'no-did': member 'did' is missing" in exc.value.message
    assert exc.value.message.endswith(f"(and {len(MALFORMED) - 1} more)")
    with pytest.raises(
        RegistryError, match=r"no usable agent: registry entry 'peers': member 'did' is missing$"
    ):
        AgentRegistry.from_dict({"peers": {}})


# -- lookups -----------------------------------------------------------------------------------


def registry_of(*entries: RegistryEntry) -> AgentRegistry:
    return AgentRegistry(entries)


def test_lookup_by_exact_name_did_name_prefix_and_capability() -> None:
    registry = AgentRegistry.from_dict(FLAT)
    summarizer, translator = EXPECTED
    assert registry.find("translator") == translator
    assert registry.find(TRANSLATOR) == translator
    assert registry.find(SUMMARIZER) == summarizer
    assert registry.find("trans") == translator
    assert registry.find("s") == summarizer
    assert registry.find("detect-language") == translator
    assert registry.find("extract-key-points") == summarizer
    # A prefix and a capability of the same agent are one match, not two.
    assert registry.find("summarize") == summarizer


def test_an_exact_name_wins_over_a_longer_name_and_a_capability() -> None:
    registry = registry_of(
        RegistryEntry("echo", SUMMARIZER, None, ()),
        RegistryEntry("echo-2", TRANSLATOR, None, ("echo",)),
    )
    assert registry.find("echo").did == SUMMARIZER
    assert registry.find("echo-").did == TRANSLATOR


def test_unknown_target_names_the_target_and_the_known_agents() -> None:
    with pytest.raises(AgentNotFound) as exc:
        AgentRegistry.from_dict(FLAT).find("xyz")
    assert exc.value.message == "No agent found matching 'xyz' (known agents: summarizer, translator)"
    assert isinstance(exc.value, RegistryError) and exc.value.code == -32602
    with pytest.raises(AgentNotFound, match=r"^No agent found matching 'xyz' \(the registry is empty\)$"):
        AgentRegistry().find("xyz")
    with pytest.raises(AgentNotFound, match=r"^No agent found matching ''"):
        AgentRegistry.from_dict(FLAT).find("")  # the empty prefix designates nobody
    many = registry_of(*(RegistryEntry(f"agent-{i:02}", SUMMARIZER) for i in range(12)))
    with pytest.raises(AgentNotFound, match=r"known agents: agent-00, .*, agent-09 and 2 more\)$"):
        many.find("xyz")


def test_a_prefix_or_capability_that_fits_several_agents_is_ambiguous() -> None:
    registry = registry_of(
        RegistryEntry("translator-de", SUMMARIZER, None, ("translate",)),
        RegistryEntry("translator-fr", TRANSLATOR, None, ("translate",)),
        RegistryEntry("summarizer", identity("other").did, None, ("translate-summary",)),
    )
    with pytest.raises(AmbiguousTarget) as exc:
        registry.find("translator")
    assert exc.value.message == (
        "Ambiguous target 'translator' (matches translator-de, translator-fr): use a full name or a DID"
    )
    assert exc.value.matches == ("translator-de", "translator-fr")
    with pytest.raises(
        AmbiguousTarget, match=r"^Ambiguous target 'translate' \(matches translator-de, translator-fr\)"
    ):
        registry.find("translate")
    assert registry.find("translate-summary").name == "summarizer"
    # Two names for one DID: the DID alone cannot say which entry is meant.
    twice = registry_of(RegistryEntry("a", SUMMARIZER), RegistryEntry("b", SUMMARIZER))
    with pytest.raises(AmbiguousTarget, match=r"matches a, b"):
        twice.find(SUMMARIZER)


async def test_agent_find_uses_its_registry(tmp_path: Path) -> None:
    async with A2AAgent("caller", identity("caller"), registry=write(tmp_path, FLAT)) as agent:
        assert agent.find("translate") == EXPECTED[1]
        assert agent.find("summ") == EXPECTED[0]
        with pytest.raises(AgentNotFound, match="No agent found matching 'xyz'"):
            agent.find("xyz")
        with pytest.raises(AgentNotFound, match="No agent found matching 'xyz'"):
            await agent.request("xyz", {"goal": "translate", "inputs": {}})


# -- an endpoint that does not answer ------------------------------------------------------------


async def test_an_endpoint_that_does_not_answer_names_the_agent_and_the_endpoint(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    named = f"^agent 'summarizer' did not answer at {re.escape(endpoint)} "
    flat = {"summarizer": {"did": SUMMARIZER, "endpoint": endpoint, "capabilities": ["summarize"]}}
    async with A2AAgent(
        "caller", identity("caller"), registry=write(tmp_path, flat), retry=FAST, addresses=LOOPBACK
    ) as agent:
        for target in ("summarizer", "summ", "summarize", SUMMARIZER):
            with pytest.raises(PeerUnreachable) as exc:
                await agent.request(target, {"goal": "summarize", "inputs": {"text": "x"}})
            assert exc.value.message == f"agent 'summarizer' did not answer at {endpoint} (could not connect)"
            assert isinstance(exc.value, Unavailable) and exc.value.code == -32048
            assert exc.value.endpoint == endpoint and exc.value.reason == "could not connect"
        with pytest.raises(PeerUnreachable, match=named):
            await agent.handshake("summarizer")
        with pytest.raises(PeerUnreachable, match=named):
            async for _ in agent.stream("summarizer", {"goal": "summarize", "inputs": {"text": "x"}}):
                pass  # pragma: no cover - nothing arrives


async def test_an_unlisted_did_that_does_not_answer_is_named_by_its_did() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    async with A2AAgent("caller", identity("caller"), retry=FAST) as agent:
        with pytest.raises(PeerUnreachable) as exc:
            await agent.handshake(SUMMARIZER, endpoint)
    assert exc.value.message == f"agent '{SUMMARIZER}' did not answer at {endpoint} (could not connect)"
    assert isinstance(exc.value, A2AError)
