"""Agents as LLM tools: function-calling schemas and a tool-use loop, no MCP needed.

Two example agents (translator, summarizer) run on loopback; an orchestrator turns them into
tools with ``agent.tool_schemas()``, hands the schemas to a "model", and runs the tool the
model picks with ``agent.call_tool()``: a DID-authenticated handshake, a signed intent and a
verified answer, whose signed token is kept as proof.

The model here is a scripted stand-in (no network, no API key). For a real model, change the
two lines marked REAL MODEL (the schemas from ``tool_schemas("openai")`` go to it as they are):

1. ``ScriptedModel()`` becomes your client, e.g. ``model = openai.AsyncOpenAI()``;
2. ``call = await model.pick(prompt, schemas)`` becomes
   ``resp = await model.chat.completions.create(model="gpt-4o", tools=schemas, messages=[...])``
   and ``call = resp.choices[0].message.tool_calls[0].function`` (its ``name``, and
   ``json.loads(call.arguments)``). With Anthropic use ``tool_schemas("anthropic")`` and the
   ``tool_use`` block's ``name`` and ``input``.

Run: ``python examples/llm_tools.py``
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from a2a_secure import A2AAgent, AgentRegistry, Identity
from a2a_secure.agent import RegistryEntry
from a2a_secure.examples import summarizer, translator
from a2a_secure.testing import serve_app


@dataclass
class ToolCall:
    """What a model answers when it wants a tool: its name and arguments."""

    name: str
    arguments: dict[str, Any]


class ScriptedModel:
    """Stands in for an LLM: picks the first tool whose description mentions a keyword."""

    async def pick(self, prompt: str, schemas: list[dict[str, Any]]) -> ToolCall:
        """Choose a tool for ``prompt`` among the OpenAI-format ``schemas``."""
        for schema in schemas:
            function = schema["function"]
            if "Spanish" in function["description"] and "Spanish" in prompt:
                text = prompt.split(": ", 1)[1]
                return ToolCall(function["name"], {"text": text, "target_language": "es"})
        raise LookupError("no tool fits")


async def main() -> None:
    """Serve two agents, let the model pick a tool, call it, print the verified answer."""
    hosts = {"translator": translator.build_agent(), "summarizer": summarizer.build_agent()}
    async with contextlib.AsyncExitStack() as stack:
        registry = AgentRegistry()
        for name, host in hosts.items():
            url = await stack.enter_async_context(serve_app(host.app))
            registry.add(RegistryEntry(name, host.did, url, tuple(host.server.goals)))

        orchestrator = await stack.enter_async_context(
            A2AAgent("orchestrator", Identity.generate("orchestrator"), registry=registry)
        )
        schemas = await orchestrator.tool_schemas("openai")
        print("tools offered to the model:")
        for schema in schemas:
            print(f"  {schema['function']['name']}: {schema['function']['description']}")

        model = ScriptedModel()  # REAL MODEL: your client, e.g. openai.AsyncOpenAI()
        prompt = "Say this in Spanish: Hello world"
        call = await model.pick(prompt, schemas)  # REAL MODEL: chat.completions.create(tools=...)
        print(f"\nmodel asks for {call.name}({json.dumps(call.arguments)})")

        result = await orchestrator.call_tool(call.name, call.arguments)
        if result.is_error:
            print(f"tool error (sent back to the model): {result.text}")
            return
        print(f"verified answer: {json.dumps(result.content['result'], ensure_ascii=False)}")
        token = result.response_jws or ""
        print(f"signed response token kept as proof: {token[:40]}… ({len(token)} characters)")


if __name__ == "__main__":
    asyncio.run(main())
