"""Priority from the command line and the ``serve --policy`` file (PROTOCOL.md §12.3)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from http_helpers import identity

from a2a_secure import cli
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import IntentContext, ServerLimits
from a2a_secure.server.app import AgentServer
from a2a_secure.server.run import app_from_env, load_policy, load_scheduling
from a2a_secure.store.memory import MemoryStore
from a2a_secure.testing import serve_app


@pytest.mark.parametrize("value", ["0", "6", "5.0", "+5", "05", "true", "five", ""])
def test_call_refuses_a_bad_priority_with_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["call", "--key-file", "unused", "--to", "did:key:z", "--goal", "g", "--priority", value]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "argument --priority: must be an integer from 1 to 5" in err


def _key_file(tmp_path: Path, ident: Identity) -> str:
    path = tmp_path / f"{ident.agent_id}.key"
    ident.save(path)
    return str(path)


async def test_call_sends_the_priority_and_reports_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    caller = identity("cli-caller")
    server = AgentServer(
        identity("cli-server"),
        Policy(),
        store=MemoryStore(),
        limits=ServerLimits(max_concurrent_intents=2),
        priority_rights=PriorityRights(per_did={caller.did: 4}),
    )

    @server.intent("priority")
    async def priority_of(inputs: Any, ctx: IntentContext) -> int:
        return ctx.priority

    key_file = _key_file(tmp_path, caller)
    async with serve_app(server.app()) as url:
        base = ["call", "--key-file", key_file, "--to", server.identity.did, "--endpoint", url]
        base += ["--goal", "priority"]
        # The command runs its own event loop: in a thread, beside the server's.
        assert await asyncio.to_thread(cli.main, [*base, "--priority", "4"]) == 0
        assert json.loads(capsys.readouterr().out) == 4
        assert await asyncio.to_thread(cli.main, base) == 0
        assert json.loads(capsys.readouterr().out) == 3
        assert await asyncio.to_thread(cli.main, [*base, "--priority", "5"]) == 1
        assert "priority 5 is above this caller's highest, 4" in capsys.readouterr().err


def test_the_policy_file_holds_the_scheduling_settings_apart_from_the_policy(tmp_path: Path) -> None:
    did = identity("cli-rights").did
    path = tmp_path / "policy.json"
    path.write_text(
        json.dumps(
            {
                "rate_limit": 7,
                "priority_rights": {"default": 2, "per_did": {did: 5}},
                "max_concurrent_intents": 3,
                "max_queued_intents": 9,
            }
        )
    )
    # The negotiated policy keeps its five members: a peer would refuse a sixth.
    assert load_policy(path) == Policy.build(rate_limit=7)
    rights, limits = load_scheduling(path)
    assert rights == PriorityRights(default=2, per_did={did: 5})
    assert (limits.max_concurrent_intents, limits.max_queued_intents) == (3, 9)
    key_file = _key_file(tmp_path, identity("cli-served"))
    app: Any = app_from_env({"A2A_SECURE_KEY_FILE": key_file, "A2A_SECURE_POLICY": str(path)})
    served = app.state.agent_server
    assert served.priority_rights == rights and served.limits.max_concurrent_intents == 3
    assert served.protocol.priority_rights == rights
    assert load_scheduling(None) == (PriorityRights(), ServerLimits())


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("priority_rights", {"default": 6}),
        ("priority_rights", {"per_did": {"nope": 5}}),
        ("max_concurrent_intents", 0),
        ("max_concurrent_intents", "2"),
        ("max_queued_intents", True),
        ("max_queued_intents", -1),
    ],
)
def test_bad_scheduling_settings_stop_the_server_before_it_starts(
    tmp_path: Path, member: str, value: Any
) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({member: value}))
    with pytest.raises((ValueError, InvalidParams)):
        load_scheduling(path)
