"""The policy member ``"delegation": {goal: [principal DIDs]}`` (PROTOCOL.md §11, §12.7).

``a2a-secure serve --policy`` reads it, and an app's own settings (``AgentServer(delegation=…)``)
read the same member the same way; it makes the card declare ``delegation``, and the test agent
answers each goal it reserves like ``echo``. Driven as a person would: keygen, serve,
delegate, call and call on behalf, each a child process.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from cli_helpers import one_line_error, run_cli, serve_cli

from a2a_secure.delegation import DelegationRules
from a2a_secure.identity.keys import Identity
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import ENV, app_from_env

SERVER = Identity.from_seed(bytes(range(40, 72)), "calendar")
PERSON = Identity.from_seed(bytes(range(41, 73)), "person")
ASSISTANT = Identity.from_seed(bytes(range(42, 74)), "assistant")


def _keys(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for identity in (SERVER, PERSON, ASSISTANT):
        files[identity.agent_id] = tmp_path / f"{identity.agent_id}.key"
        identity.save(files[identity.agent_id])
    return files


def test_serve_policy_delegation_serves_reserved_goals_only_on_behalf(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"delegation": {"calendar.book": [PERSON.did]}}))
    with serve_cli(tmp_path, "--key-file", str(keys["calendar"]), "--policy", str(policy)) as served:
        card = httpx.get(served.url + "/.well-known/agent-card.json").json()
        assert "delegation" in card["a2a_secure_extensions"]
        assert card["intents"] == ["calendar.book", "count", "echo"]
        call = ["call", "--key-file", str(keys["assistant"]), "--to", SERVER.did]
        call += ["--endpoint", served.url, "--goal", "calendar.book", "--inputs", '{"at": "09:00"}']
        refused = one_line_error(run_cli(*call))
        assert "runs only on behalf of a principal: send a delegation chain" in refused
        chain = tmp_path / "chain.json"
        made = run_cli(
            "delegate", "--key-file", str(keys["person"]), "--to", ASSISTANT.did,
            "--goals", "calendar.book", "--out", str(chain),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        done = run_cli(*call, "--on-behalf-of", str(chain))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"at": "09:00"}  # answered like echo
        # The echo of the test agent is not reserved: it runs without a chain.
        echoed = run_cli(*call[:7], "--goal", "echo", "--inputs", "{}")
        assert echoed.returncode == 0, echoed.stderr


def test_an_empty_member_accepts_chains_and_reserves_nothing(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    policy = tmp_path / "policy.json"
    policy.write_text('{"delegation": {}}')
    server = app_from_env(
        {ENV["key_file"]: str(keys["calendar"]), ENV["policy"]: str(policy)}
    ).state.agent_server
    assert server.delegation == DelegationRules()
    assert "delegation" in server.card["a2a_secure_extensions"]
    assert server.goals == ["count", "echo"]
    policy.write_text("{}")  # no member: no extension
    server = app_from_env(
        {ENV["key_file"]: str(keys["calendar"]), ENV["policy"]: str(policy)}
    ).state.agent_server
    assert server.delegation is None
    assert "delegation" not in server.card.get("a2a_secure_extensions", [])


def test_an_apps_own_settings_read_the_same_member() -> None:
    member = {"calendar.book": [PERSON.did], "pay": [PERSON.did, ASSISTANT.did]}
    built = AgentServer(SERVER, delegation=member)
    assert built.delegation == DelegationRules.from_member(member)
    assert built.delegation == DelegationRules.build(member)
    assert built.delegation.to_member() == {k: sorted(v) for k, v in member.items()}
    assert "delegation" in built.card["a2a_secure_extensions"]


@pytest.mark.parametrize(
    ("member", "message"),
    [
        ([], "delegation must be an object {goal: [principal DIDs]}"),
        ({"pay": []}, "delegation['pay'] must be a non-empty array of principal DIDs"),
        ({"pay": "did:key:z6Mk"}, "delegation['pay'] must be a non-empty array of principal DIDs"),
        ({"pay": ["alice"]}, "delegation['pay'] entry 'alice' is not a DID"),
    ],
)
def test_a_bad_member_is_one_line_naming_the_file(tmp_path: Path, member: object, message: str) -> None:
    keys = _keys(tmp_path)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"delegation": member}))
    with pytest.raises(ValueError, match=r"must|not a DID"):
        DelegationRules.from_member(member)
    error = one_line_error(run_cli("serve", "--key-file", str(keys["calendar"]), "--policy", str(policy)))
    assert error.startswith(f"policy file {policy}: ") and message in error
