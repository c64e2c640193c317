"""Host the three example agents on 127.0.0.1:8101-8103 and write agent_registry.json.

    python examples/host_agents.py          # leave it running
    python examples/orchestrator.py         # in another terminal

Keys are kept in examples/keys/ (mode 0600, not committed), so the DIDs in the registry stay
the same from one run to the next.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from a2a_secure import Identity
from a2a_secure.examples import sentiment, summarizer, translator

HERE = Path(__file__).resolve().parent
AGENTS = {"translator": (translator, 8101), "summarizer": (summarizer, 8102), "sentiment": (sentiment, 8103)}


def load_or_create(name: str) -> Identity:
    """The agent's key from examples/keys/, created on first use."""
    path = HERE / "keys" / f"{name}.key"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        Identity.generate(name).save(path)
    return Identity.load(path)


async def main() -> None:
    registry = {}
    servers = []
    for name, (module, port) in AGENTS.items():
        agent = module.build_agent(load_or_create(name))
        registry[name] = {
            "did": agent.did,
            "endpoint": f"http://127.0.0.1:{port}",
            "capabilities": agent.server.goals,
        }
        servers.append(agent.serve("127.0.0.1", port))
        print(f"{name:<11} {agent.did}  http://127.0.0.1:{port}")
    (HERE / "agent_registry.json").write_text(json.dumps({"agents": registry}, indent=2) + "\n")
    print(f"wrote {HERE / 'agent_registry.json'}; Ctrl-C to stop")
    await asyncio.gather(*servers)


if __name__ == "__main__":
    asyncio.run(main())
