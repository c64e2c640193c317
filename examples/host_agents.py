"""Host the three example agents on 127.0.0.1:8101-8103 and write their registry.

    python examples/host_agents.py          # leave it running
    python examples/orchestrator.py         # in another terminal

Keys are kept in examples/keys/ (mode 0600, not committed), so the DIDs stay the same from
one run to the next; the registry naming them is written there too
(examples/keys/agent_registry.json), never over the committed examples/agent_registry.json,
which shows the file's form. ``--port-base N`` serves on N, N+1, N+2; ``--keys DIR`` keeps
the keys and the registry in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from a2a_secure import Identity
from a2a_secure.examples import sentiment, summarizer, translator

HERE = Path(__file__).resolve().parent
KEYS = HERE / "keys"
AGENTS = {"translator": translator, "summarizer": summarizer, "sentiment": sentiment}


def load_or_create(keys: Path, name: str) -> Identity:
    """The agent's key from ``keys``, created on first use."""
    path = keys / f"{name}.key"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        Identity.generate(name).save(path)
    return Identity.load(path)


async def main(port_base: int = 8101, keys: Path = KEYS) -> None:
    registry = {}
    servers = []
    for offset, (name, module) in enumerate(AGENTS.items()):
        port = port_base + offset
        agent = module.build_agent(load_or_create(keys, name))
        registry[name] = {
            "did": agent.did,
            "endpoint": f"http://127.0.0.1:{port}",
            "capabilities": agent.server.goals,
        }
        servers.append(agent.serve("127.0.0.1", port))
        print(f"{name:<11} {agent.did}  http://127.0.0.1:{port}")
    path = keys / "agent_registry.json"
    path.write_text(json.dumps({"agents": registry}, indent=2) + "\n")
    print(f"wrote {path}; Ctrl-C to stop", flush=True)
    await asyncio.gather(*servers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Host the three example agents on loopback.")
    parser.add_argument("--port-base", type=int, default=8101, help="first of three ports (default 8101)")
    parser.add_argument("--keys", type=Path, default=KEYS, help=f"keys and registry folder (default {KEYS})")
    args = parser.parse_args()
    asyncio.run(main(args.port_base, args.keys))
