"""Errors a person meets on the command line: one line naming the thing and the fix, no traceback.

Each case is one the README's path leads to (a DID copied wrong, a file passed by mistake, a
flag forgotten); each runs the real command in a child process, against a real server where
the error needs one. Also: every flag has help text that gives its default, times are printed
as ISO 8601, and ``serve`` checks its port and its Redis before uvicorn starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli, serve_cli

from a2a_secure.cli import build_parser
from a2a_secure.identity.keys import Identity
from a2a_secure.store.redis import RedisStore

SERVER = Identity.from_seed(bytes(range(60, 92)), "server")
OTHER = Identity.from_seed(bytes(range(61, 93)), "other")
ME = Identity.from_seed(bytes(range(62, 94)), "me")


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for identity in (SERVER, OTHER, ME):
        files[identity.agent_id] = tmp_path / f"{identity.agent_id}.key"
        identity.save(files[identity.agent_id])
    return files


def test_call_errors_name_the_flag_and_the_fix(tmp_path: Path, keys: dict[str, Path]) -> None:
    with serve_cli(tmp_path, "--key-file", str(keys["server"])) as served:
        base = ["call", "--key-file", str(keys["me"]), "--endpoint", served.url, "--goal", "echo"]
        # A DID typo (another valid DID): both DIDs are shown.
        typo = one_line_error(run_cli(*base, "--to", OTHER.did))
        assert f"the agent there is {SERVER.did}, not {OTHER.did}" in typo
        # The agent is named as given, not by a placeholder.
        down = one_line_error(run_cli(*base[:4], "http://127.0.0.1:9", "--goal", "echo", "--to", OTHER.did))
        assert down.startswith(f"agent '{OTHER.did}' did not answer at http://127.0.0.1:9")
        # A DID cut short when copied.
        cut = SERVER.did[:30]
        truncated = one_line_error(run_cli(*base, "--to", cut))
        assert truncated.startswith(f"--to {cut!r} is not a valid DID (") and "is it complete?" in truncated
        bad_inputs = one_line_error(run_cli(*base, "--to", SERVER.did, "--inputs", "{bad"))
        assert bad_inputs.startswith("--inputs is not valid JSON (Expecting property name")
        array = one_line_error(run_cli(*base, "--to", SERVER.did, "--inputs", "[1]"))
        assert array.startswith("--inputs must be a JSON object")
        done = run_cli(*base, "--to", SERVER.did, "--inputs", '{"a": 1}')
        assert (done.returncode, json.loads(done.stdout)) == (0, {"a": 1})
    registry = tmp_path / "agents.json"
    registry.write_text(json.dumps({"srv": {"did": SERVER.did, "endpoint": "http://127.0.0.1:9"}}))
    # The registry file is the operator's own, as --endpoint is: its loopback endpoint is
    # taken without an opt-in (SECURITY.md, "Addresses taken from documents"), and the
    # error is the one of an agent that does not answer there.
    loopback = one_line_error(
        run_cli(
            "call", "--key-file", str(keys["me"]), "--registry", str(registry), "--to", "srv", "--goal", "x"
        )
    )
    assert loopback == "agent 'srv' did not answer at http://127.0.0.1:9 (could not connect)", loopback


def test_key_file_errors_name_the_file(tmp_path: Path, keys: dict[str, Path]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("remember the milk\n")
    os.chmod(notes, 0o644)
    for command in (["did", "show"], ["serve", "--port", "1"]):
        error = one_line_error(run_cli(*command, "--key-file", str(notes)))
        assert error == f"{notes} is not an a2a-secure key file; make one with: a2a-secure keygen --out FILE"
        assert "chmod" not in error  # only a real key is told to be chmod-ed
    os.chmod(keys["me"], 0o644)
    loose = one_line_error(run_cli("did", "show", "--key-file", str(keys["me"])))
    assert loose.endswith(f"(mode 644); run: chmod 600 {keys['me']}")
    again = one_line_error(run_cli("keygen", "--out", str(keys["other"])))
    assert again == f"{keys['other']} exists; add --force to replace it"  # CLI words, not API ones


def test_serve_errors_name_the_file_or_flag(tmp_path: Path, keys: dict[str, Path]) -> None:
    serve = ["serve", "--key-file", str(keys["server"]), "--port", "1"]
    missing = one_line_error(run_cli(*serve, "--tls-cert", "nope.pem", "--tls-key", "nope.key", cwd=tmp_path))
    assert missing == "--tls-cert nope.pem: no such file"
    notes = tmp_path / "notes.txt"
    notes.write_text("not a certificate\n")
    unusable = one_line_error(run_cli(*serve, "--tls-cert", str(notes), "--tls-key", str(notes)))
    assert unusable.startswith(f"--tls-cert {notes} and --tls-key {notes} cannot be used (")
    policy = tmp_path / "policy.json"
    policy.write_text('{"rate_limit": }')
    invalid = one_line_error(run_cli(*serve, "--policy", str(policy)))
    assert invalid.startswith(f"policy file {policy}: not valid JSON (Expecting value: line 1")
    missing_policy = one_line_error(run_cli(*serve, "--policy", "nope.json", cwd=tmp_path))
    assert missing_policy == "policy file nope.json: no such file"
    no_folder = one_line_error(run_cli(*serve, "--audit-log", str(tmp_path / "gone" / "audit.jsonl")))
    assert no_folder == f"--audit-log {tmp_path / 'gone' / 'audit.jsonl'}: its folder does not exist"


def test_did_commands_name_the_did_they_cannot_use(tmp_path: Path, keys: dict[str, Path]) -> None:
    cut = SERVER.did[:20]
    resolve = one_line_error(run_cli("did", "resolve", cut))
    assert resolve.startswith(f"the DID {cut!r} is not a valid DID (") and "is it complete?" in resolve
    document = one_line_error(run_cli("did", "document", "--key-file", str(keys["me"]), "--did-web", "bad"))
    assert document == "--did-web 'bad' is not a did:web DID (did:web:agents.example.com)"


def test_serve_checks_its_port_and_redis_before_uvicorn_starts(tmp_path: Path, keys: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("serve", "--key-file", str(keys["server"]), "--port", str(port))
    error = one_line_error(done)
    assert error == f"port {port} on 127.0.0.1 is in use (another server?): stop it, or choose another --port"
    assert "Application startup complete" not in done.stdout + done.stderr
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = closed.getsockname()[1]  # nothing listens once closed
    url = f"redis://:s3cret@127.0.0.1:{down}/0"
    redis_down = one_line_error(run_cli("serve", "--key-file", str(keys["server"]), "--redis-url", url))
    assert redis_down.startswith(f"Redis at redis://:***@127.0.0.1:{down}/0 does not answer (")
    assert redis_down.endswith("start it, or fix --redis-url") and "s3cret" not in redis_down


async def test_a_redis_store_that_is_down_is_a_clear_error_in_code() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = closed.getsockname()[1]
    store = RedisStore(f"redis://user:s3cret@127.0.0.1:{down}/0")
    try:
        with pytest.raises(
            ConnectionError, match=rf"^Redis at redis://user:\*\*\*@127.0.0.1:{down}/0 does not answer"
        ):
            await store.check()
    finally:
        await store.aclose()


def test_serve_prints_its_did_card_and_a_call_line_that_works(tmp_path: Path, keys: dict[str, Path]) -> None:
    with serve_cli(tmp_path, "--key-file", str(keys["server"])) as served:
        output = served.output()
        assert f"a2a-secure: serving {SERVER.did}" in output
        assert f"a2a-secure: card {served.url}/.well-known/agent-card.json" in output
        line = re.search(r"a2a-secure: try  a2a-secure (call .*?)   \(", output)
        assert line is not None, output
        argv = line.group(1).replace("YOUR.key", str(keys["me"])).split(" ")
        argv[-1] = argv[-1].strip("'")
        done = run_cli(*argv)
        assert (done.returncode, json.loads(done.stdout)) == (0, {}), done.stderr


def _actions(parser: argparse.ArgumentParser, path: str = "a2a-secure") -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            found.append((path, action))
    return found


def test_every_flag_has_help_that_gives_its_default() -> None:
    missing = []
    for path, action in _actions(build_parser()):
        name = action.option_strings[0] if action.option_strings else action.dest
        if not action.help:
            missing.append(f"{path} {name}: no help")
        elif action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in action.help:
            missing.append(f"{path} {name}: its default {action.default!r} is not said")
    assert missing == []


def test_times_are_printed_as_iso_8601(tmp_path: Path, keys: dict[str, Path]) -> None:
    made = run_cli(
        "delegate",
        "--key-file",
        str(keys["other"]),
        "--to",
        ME.did,
        "--goals",
        "echo",
        "--out",
        "c.json",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    assert re.search(r", until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, token id ", made.stderr), made.stderr
    bad_to = one_line_error(
        run_cli("delegate", "--key-file", str(keys["other"]), "--to", ME.did[:20], "--goals", "x")
    )
    assert bad_to.startswith("--to ")
    rotated = run_cli("key", "rotate", "--key-file", str(keys["other"]), "--overlap", "1h")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", json.loads(rotated.stdout)["overlap_until"])
    deny = tmp_path / "deny.json"
    assert run_cli("revoke", OTHER.did, "--file", str(deny)).returncode == 0
    listed = json.loads(run_cli("revoke", "--list", "--file", str(deny)).stdout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed[0]["revoked_at"])


async def test_an_agent_served_in_code_on_a_redis_that_is_down_says_so_before_listening() -> None:
    from a2a_secure import A2AAgent

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = closed.getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{down}/0")
    agent = A2AAgent("down", SERVER, store=store)
    try:
        with pytest.raises(ConnectionError, match=rf"^Redis at redis://127.0.0.1:{down}/0 does not answer"):
            await agent.serve(port=down)
    finally:
        await store.aclose()


def test_a_document_address_refusal_names_the_flags_of_the_opt_in() -> None:
    # What a did:web document or a card may not name (a network more private than its own)
    # is refused by the SDK in its own words; the command names the flag that opts in.
    import argparse

    from a2a_secure.cli import cli_words
    from a2a_secure.errors import InvalidParams
    from a2a_secure.identity.addresses import AddressPolicy, Reach

    args = argparse.Namespace(allow_loopback_dev=False, allow_address=[])
    for url, hint in (
        ("http://127.0.0.1:9", "(add --allow-loopback-dev)"),
        ("https://10.1.2.3", "add --allow-address NET or --allow-host NAME"),
        ("https://agents.corp", "add --allow-address NET or --allow-host NAME"),
    ):
        with pytest.raises(InvalidParams) as refused:
            AddressPolicy().check_url(
                url, what="the service endpoint of did:web:agent.example", origin=Reach.PUBLIC
            )
        assert hint in cli_words(refused.value.message, args), refused.value.message
