"""A summarizer agent: keeps the first sentence and the longest one."""

from __future__ import annotations

import re
from typing import Any

from a2a_secure.agent import A2AAgent
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity


def summarize(inputs: dict[str, Any]) -> dict[str, Any]:
    """Summarize ``inputs.text`` into at most ``inputs.max_sentences`` sentences (default 2)."""
    text = inputs.get("text")
    limit = inputs.get("max_sentences", 2)
    if not isinstance(text, str) or type(limit) is not int or limit < 1:
        raise InvalidParams("summarize needs text and a positive max_sentences")
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    if len(sentences) <= limit:
        chosen = sentences
    else:
        rest = sorted(sentences[1:], key=len, reverse=True)[: limit - 1]
        chosen = [s for s in sentences if s == sentences[0] or s in rest][:limit]
    return {"summary": " ".join(chosen), "sentences": len(chosen), "original_sentences": len(sentences)}


def build_agent(identity: Identity | None = None) -> A2AAgent:
    """The summarizer agent, serving the ``summarize`` intent."""
    agent = A2AAgent("summarizer", identity, description="Extractive summarizer")
    agent.intent("summarize")(summarize)
    agent.server.describe_intent(
        "summarize",
        "Summarize a text by keeping its first sentence and its longest ones.",
        {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "the text to summarize"},
                "max_sentences": {"type": "integer", "minimum": 1, "description": "default 2"},
            },
            "required": ["text"],
        },
    )
    return agent
