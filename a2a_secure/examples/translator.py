"""A translator agent: word-by-word translation from a tiny built-in dictionary."""

from __future__ import annotations

from typing import Any

from a2a_secure.agent import A2AAgent
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity

DICTIONARY: dict[str, dict[str, str]] = {
    "es": {
        "hello": "hola",
        "world": "mundo",
        "good": "buen",
        "morning": "día",
        "agents": "agentes",
        "talk": "hablan",
        "safely": "seguro",
        "the": "el",
        "report": "informe",
        "is": "es",
        "ready": "listo",
    },
    "fr": {
        "hello": "bonjour",
        "world": "monde",
        "good": "bon",
        "morning": "matin",
        "agents": "agents",
        "talk": "parlent",
        "safely": "sûrement",
        "the": "le",
        "report": "rapport",
        "is": "est",
        "ready": "prêt",
    },
}


def translate(inputs: dict[str, Any]) -> dict[str, Any]:
    """Translate ``inputs.text`` into ``inputs.target_language`` (es or fr)."""
    text = inputs.get("text")
    target = inputs.get("target_language")
    if not isinstance(text, str) or not isinstance(target, str):
        raise InvalidParams("translate needs text and target_language strings")
    table = DICTIONARY.get(target)
    if table is None:
        raise InvalidParams(f"unsupported target_language {target[:16]!r}")
    words = [table.get(w.lower().strip(".,!?"), w) for w in text.split()]
    return {"translated_text": " ".join(words).capitalize(), "target_language": target}


def build_agent(identity: Identity | None = None) -> A2AAgent:
    """The translator agent, serving the ``translate`` intent."""
    agent = A2AAgent("translator", identity, description="Word-by-word translator (es, fr)")
    agent.intent("translate")(translate)
    agent.server.describe_intent(
        "translate",
        "Translate English text word by word into Spanish (es) or French (fr).",
        {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "English text to translate"},
                "target_language": {"type": "string", "enum": ["es", "fr"]},
            },
            "required": ["text", "target_language"],
        },
    )
    return agent
