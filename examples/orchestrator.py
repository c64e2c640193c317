"""An orchestrator that asks two example agents in turn, through the registry.

Run examples/host_agents.py first; it writes the registry of the agents it hosts in
examples/keys/agent_registry.json (``--registry FILE`` to read another).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from a2a_secure import A2AAgent, Identity
from a2a_secure.identity.addresses import AddressPolicy

HERE = Path(__file__).resolve().parent


async def main(registry: Path = HERE / "keys" / "agent_registry.json") -> None:
    identity = Identity.generate("orchestrator")
    # The example agents run on this machine: a registry file may name loopback endpoints
    # only with this explicit opt-in (SECURITY.md, "Addresses taken from documents").
    local = AddressPolicy.build(dev_allow_loopback=True)
    async with A2AAgent("orchestrator", identity, registry=registry, addresses=local) as agent:
        text = "Good morning agents. The report is ready. Every answer is signed."
        summary = await agent.request("summarizer", {"goal": "summarize", "inputs": {"text": text}})
        print("summary:", summary["summary"])
        spanish = await agent.request(
            "translator",
            {"goal": "translate", "inputs": {"text": summary["summary"], "target_language": "es"}},
        )
        print("translated:", spanish["translated_text"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Ask the example agents, through their registry.")
    parser.add_argument(
        "--registry",
        type=Path,
        default=HERE / "keys" / "agent_registry.json",
        help="the registry host_agents.py wrote (default examples/keys/agent_registry.json)",
    )
    asyncio.run(main(parser.parse_args().registry))
