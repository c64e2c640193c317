"""Every Python block of the README runs as pasted, against real local agents.

The blocks are taken from README.md as a reader copies them and each is run as a program
of its own, in a folder laid out as the README's "Use" section says: key files made with
``a2a-secure keygen``, the "Host an agent" block saved as ``translator_app.py`` and served
with ``a2a-secure serve --app translator_app:agent`` from that folder, and an
``agent_registry.json`` naming it. A block that needs names it never defines, an ``await``
outside a function, or an address the rules refuse fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO, cli_env, run_cli, serve_cli

BLOCKS = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.M | re.S)


def _did(keygen: subprocess.CompletedProcess[str]) -> str:
    assert keygen.returncode == 0, keygen.stderr
    return keygen.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 10
    assert sum("app = agent.app" in block for block in BLOCKS) == 1  # the agent the others call


def test_every_python_block_runs_as_pasted(folder: Path) -> None:
    _did(run_cli("keygen", "--out", "orchestrator.key", "--agent-id", "orchestrator", cwd=folder))
    translator = _did(run_cli("keygen", "--out", "translator.key", "--agent-id", "translator", cwd=folder))
    host = next(block for block in BLOCKS if "app = agent.app" in block)
    (folder / "translator_app.py").write_text(host, encoding="utf-8")
    failures = []
    outputs: dict[int, str] = {}
    args = ("--key-file", "translator.key", "--app", "translator_app:agent")
    with serve_cli(folder, *args, cwd=folder) as served:
        registry = {"translator": {"did": translator, "endpoint": served.url, "capabilities": ["translate"]}}
        (folder / "agent_registry.json").write_text(json.dumps(registry), encoding="utf-8")
        for number, block in enumerate(BLOCKS, 1):
            script = folder / f"block_{number}.py"
            script.write_text(block, encoding="utf-8")
            done = subprocess.run(
                [sys.executable, script.name],
                cwd=folder,
                env=cli_env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            outputs[number] = done.stdout
            if done.returncode != 0:
                first = block.strip().splitlines()[0]
                failures.append(f"block {number} ({first!r}):\n{done.stderr[-2000:]}")
    assert failures == [], "\n\n".join(failures)
    # What they print is what the README says they do.
    said = {number: outputs[number] for number, block in enumerate(BLOCKS, 1)}
    call = next(n for n, block in enumerate(BLOCKS, 1) if '"Hello world"' in block)
    assert "'translated_text': 'HELLO WORLD'" in said[call]  # through the served translator
    stream = next(n for n, block in enumerate(BLOCKS, 1) if "caller.stream(" in block)
    assert said[stream].split() == ["{'i':", "0}", "{'i':", "1}", "{'i':", "2}"]
    approval = next(n for n, block in enumerate(BLOCKS, 1) if "approvers=[person_key.did]" in block)
    assert said[approval].strip() == "{'event_id': 1}"
    once = next(n for n, block in enumerate(BLOCKS, 1) if "intent_id=order_id" in block)
    assert said[once].strip().endswith(" 1")  # ran once for both calls
