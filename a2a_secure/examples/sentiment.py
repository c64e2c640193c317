"""A sentiment agent: counts positive and negative words."""

from __future__ import annotations

from typing import Any

from a2a_secure.agent import A2AAgent
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity

POSITIVE = frozenset(
    ["good", "great", "excellent", "happy", "safe", "safely", "ready", "love", "success", "fast"]
)
NEGATIVE = frozenset(["bad", "poor", "sad", "slow", "broken", "fail", "failure", "angry", "unsafe", "late"])


def analyze(inputs: dict[str, Any]) -> dict[str, Any]:
    """Score ``inputs.text``: positive minus negative words, with a label."""
    text = inputs.get("text")
    if not isinstance(text, str):
        raise InvalidParams("sentiment needs a text string")
    words = [w.lower().strip(".,!?") for w in text.split()]
    score = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    label = "positive" if score > 0 else "negative" if score < 0 else "neutral"
    return {"label": label, "score": score}


def build_agent(identity: Identity | None = None) -> A2AAgent:
    """The sentiment agent, serving the ``sentiment`` intent."""
    agent = A2AAgent("sentiment", identity, description="Lexicon sentiment scorer")
    agent.intent("sentiment")(analyze)
    agent.server.describe_intent(
        "sentiment",
        "Score the sentiment of an English text: positive, negative or neutral, with a score.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )
    return agent
