"""The Python SDK as a client, for what its CLI has no flag for (streams, a caller's intent_id).

Usage: python py_client.py '{"key_file", "to", "endpoint", "goal", "inputs", "stream"?, "intent_id"?, "sealed"?}'
Prints the verified result (or the list of streamed results) as JSON; exit 1 with the error's
code and whether it was signed on stderr.
"""

import asyncio
import json
import sys

from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.errors import A2AError
from a2a_secure.identity.keys import Identity


async def main(spec: dict) -> object:
    identity = Identity.load(spec["key_file"])
    registry = AgentRegistry()
    registry.add(RegistryEntry("target", spec["to"], spec["endpoint"]))
    async with A2AAgent(identity.agent_id, identity, registry=registry, sealed=spec.get("sealed")) as agent:
        intent = {"goal": spec["goal"], "inputs": spec.get("inputs", {})}
        if spec.get("stream"):
            intent["constraints"] = {"stream": True}
            return [item async for item in agent.stream(spec["to"], intent)]
        return await agent.request(spec["to"], intent, intent_id=spec.get("intent_id"))


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
    except A2AError as exc:
        print(json.dumps({"code": exc.code, "signed": getattr(exc, "signed", False), "message": exc.message}), file=sys.stderr)
        sys.exit(1)
