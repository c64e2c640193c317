"""A newcomer's path, in the README's order, as one person at one shell.

keygen → serve (with a policy that reserves a goal to a person) → the call line serve
prints → delegate → call on behalf → demo --trace. Every step succeeds, and none prints a
traceback or an error it does not explain.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from cli_helpers import run_cli, serve_cli


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return done


def _did(done: subprocess.CompletedProcess[str]) -> str:
    return _ok(done).stdout.strip().splitlines()[-1]


def test_keygen_serve_call_delegate_call_on_behalf_demo_trace(tmp_path: Path) -> None:
    me = _did(run_cli("keygen", "--out", "me.key", "--agent-id", "me", cwd=tmp_path))
    person = _did(run_cli("keygen", "--out", "person.key", "--agent-id", "person", cwd=tmp_path))
    agent = _did(run_cli("keygen", "--out", "agent.key", "--agent-id", "calendar", cwd=tmp_path))
    (tmp_path / "policy.json").write_text(json.dumps({"delegation": {"calendar.book": [person]}}))
    with serve_cli(tmp_path, "--key-file", "agent.key", "--policy", "policy.json", cwd=tmp_path) as served:
        said = served.output()
        assert f"a2a-secure: serving {agent}" in said and "Traceback" not in said
        line = re.search(r"a2a-secure: try  a2a-secure (call .*?)   \(", said)
        assert line is not None, said
        call = shlex.split(line.group(1).replace("YOUR.key", "me.key"))
        assert json.loads(_ok(run_cli(*call, cwd=tmp_path)).stdout) == {}
        _ok(run_cli("delegate", "--key-file", "person.key", "--to", me, "--goals", "calendar.book",
                    "--ttl", "1h", "--out", "chain.json", cwd=tmp_path))  # fmt: skip
        book = [*call[:-4], "--goal", "calendar.book", "--inputs", '{"at": "09:00"}']
        booked = _ok(run_cli(*book, "--on-behalf-of", "chain.json", cwd=tmp_path))
        assert json.loads(booked.stdout) == {"at": "09:00"}
        assert "Traceback" not in served.output()
    demo = _ok(run_cli("demo", "--trace", "--out", "demo", cwd=tmp_path, timeout=120))
    assert "demo finished: all handshakes, intents and audit chains verified" in demo.stdout
    assert (tmp_path / "demo" / "events.jsonl").is_file()
