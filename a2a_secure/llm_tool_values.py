"""What the tool catalog says of a tool and of a call: names, specs, results (no I/O).

:mod:`a2a_secure.llm_tools` decides which tools an agent offers and runs their calls; this
module holds the values it hands out: the rule that names a tool (``<agent>__<intent>``,
with the hashed fallback), :class:`ToolSpec` and :class:`ToolResult`, and the functions that
turn a card's intent into a spec and a verified answer or a refusal into a result.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.protocol.client import MAX_INPUT_BYTES, MAX_INPUT_DEPTH
from a2a_secure.registry import RegistryEntry

if TYPE_CHECKING:
    pass

__all__ = [
    "CardRefused",
    "CheckedCard",
    "GENERIC_INPUT_SCHEMA",
    "MAX_ARGUMENT_BYTES",
    "MAX_ARGUMENT_DEPTH",
    "MAX_DESCRIPTION",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOL_NAME",
    "META_PREFIX",
    "ProgressCallback",
    "SEPARATOR",
    "ToolCallError",
    "ToolFormat",
    "ToolResult",
    "ToolSpec",
    "approval_result",
    "assign_tool_names",
    "error_result",
    "shown_cards",
    "success_result",
    "tool_name",
    "tool_spec",
]

MAX_TOOL_NAME = 64
SEPARATOR = "__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HASH_DIGITS = 8
MAX_DESCRIPTION = 1024
MAX_SCHEMA_BYTES = 16 * 1024
GENERIC_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
# A signed request carries its inputs twice, as JSON in ``params.intent.inputs`` and base64url
# (4/3 larger) inside ``request_jws``: 384 KiB of arguments make a body of about 0.9 MiB, under
# the 1 MiB an agent accepts by default (PROTOCOL.md §9). The inputs sit 3 containers deep in
# the body (request, params, intent), under an agent's default limit of 32.
MAX_ARGUMENT_BYTES = MAX_INPUT_BYTES
MAX_ARGUMENT_DEPTH = MAX_INPUT_DEPTH
META_PREFIX = "a2a-secure/"
ToolFormat = Literal["openai", "anthropic"]
ProgressCallback = Callable[[int, Any], Awaitable[None]]


class ToolCallError(InvalidParams):
    """A tool call that cannot start: unknown tool name, or arguments no agent would take."""

    default_message = "bad tool call"


class CardRefused(A2AError):
    """An agent's card did not check out (wrong DID, or not the card it signed for)."""

    code = -32040
    http_status = 401
    default_message = "agent card refused"


# -- names --------------------------------------------------------------------------------------


def tool_name(agent: str, intent: str) -> str:
    """The tool name of ``intent`` on ``agent`` before collisions are resolved (see module doc)."""
    return f"{_UNSAFE.sub('_', agent) or '_'}{SEPARATOR}{_UNSAFE.sub('_', intent) or '_'}"


def _hashed_name(agent: str, intent: str) -> str:
    digest = hashlib.sha256(f"{agent}\x00{intent}".encode()).hexdigest()[:_HASH_DIGITS]
    return f"{tool_name(agent, intent)[: MAX_TOOL_NAME - _HASH_DIGITS - 1]}_{digest}"


def assign_tool_names(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """A name for every (agent, intent) pair; ``None`` for a pair refused for a collision.

    The result depends on the set of pairs only, never on their order.
    """
    unique = sorted(set(pairs))
    base = {pair: tool_name(*pair) for pair in unique}
    counts = Counter(base.values())
    first = {
        pair: name if counts[name] == 1 and len(name) <= MAX_TOOL_NAME else _hashed_name(*pair)
        for pair, name in base.items()
    }
    final_counts = Counter(first.values())
    return {pair: name if final_counts[name] == 1 else None for pair, name in first.items()}


@dataclass(frozen=True, slots=True)
class CheckedCard:
    """An agent whose card checked out: the card, its hash, and the negotiated policy."""

    card: dict[str, Any]
    card_hash: str
    allows: Callable[[str], bool]


# -- tools and results -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: an intent of a registry agent, with what its card says about it.

    ``error`` is set when the tool is known (from the registry) but not offered: the card
    was refused, the agent was unreachable, or the policy does not allow the intent.
    """

    name: str
    agent: str
    intent: str
    did: str
    description: str
    input_schema: dict[str, Any]
    streaming: bool = False
    card_hash: str | None = None
    error: str | None = None

    def schema(self, format: ToolFormat = "openai") -> dict[str, Any]:
        """This tool as a function-calling schema (``openai`` or ``anthropic``)."""
        if format == "openai":
            return {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": _copy(self.input_schema),
                },
            }
        if format == "anthropic":
            return {
                "name": self.name,
                "description": self.description,
                "input_schema": _copy(self.input_schema),
            }
        raise ValueError(f"format must be 'openai' or 'anthropic', not {format!r}")


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call gave: the verified content, a text rendering, and the proof token.

    ``status`` is ``"success"`` (the intent ran; ``content["result"]`` is its verified
    result), ``"needs_approval"`` (the agent did NOT run it; it waits for a person's
    approval of ``content["action_id"]``) or ``"error"``.

    ``response_jws`` is the agent's ``a2a-response+jws`` token over the answer; for a
    streamed call it is the token of the final event (``a2a-event+jws``), and
    ``event_jws`` holds the tokens of all the events, index 0 first.
    """

    tool: str
    agent: str
    intent: str
    status: Literal["success", "needs_approval", "error"]
    content: dict[str, Any]
    text: str
    response_jws: str | None = None
    error_code: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    event_jws: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        """True when the call failed (the agent refused, or could not be reached)."""
        return self.status == "error"


def _copy(value: Any) -> Any:
    return encoding.loads(encoding.dumps(value))


def shown_cards(specs: Iterable[ToolSpec]) -> dict[str, str]:
    """Agent name -> hash of its card, for the tools ``specs`` a model was shown."""
    return {spec.agent: spec.card_hash for spec in specs if spec.card_hash is not None}


def _render(value: Any) -> str:
    return encoding.dumps(value).decode()


def _describe(entry: RegistryEntry, intent: str, card: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The description and input schema the card gives ``intent`` (bounded), or generic ones."""
    details = card.get("intent_schemas")
    info = details.get(intent) if isinstance(details, dict) else None
    info = info if isinstance(info, dict) else {}
    text = info.get("description")
    if not isinstance(text, str) or not text.strip():
        card_text = card.get("description")
        text = f"Intent '{intent}'" + (
            f" of: {card_text}" if isinstance(card_text, str) and card_text else ""
        )
    description = f"{entry.name}: {text.strip()}"[:MAX_DESCRIPTION]
    schema = info.get("input_schema")
    if (
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and len(encoding.dumps(schema)) <= MAX_SCHEMA_BYTES
    ):
        return description, _copy(schema)
    return description, dict(GENERIC_INPUT_SCHEMA)


def tool_spec(name: str, entry: RegistryEntry, intent: str, outcome: CheckedCard | str) -> ToolSpec:
    if isinstance(outcome, str):
        return ToolSpec(name, entry.name, intent, entry.did, "", dict(GENERIC_INPUT_SCHEMA), error=outcome)
    description, schema = _describe(entry, intent, outcome.card)
    streaming = outcome.card.get("streaming_intents")
    is_streaming = isinstance(streaming, list) and intent in streaming
    error: str | None = None
    if intent not in outcome.card.get("intents", []):
        error = f"{entry.name} refused: its card does not offer the intent {intent[:64]!r}"
    elif not outcome.allows(intent):
        error = f"{entry.name} refused: intent {intent[:64]!r} is not in the negotiated policy (-32042)"
    return ToolSpec(
        name, entry.name, intent, entry.did, description, schema, is_streaming, outcome.card_hash, error
    )


def _meta(
    spec: ToolSpec, response_jws: str | None, event_jws: tuple[str, ...] = (), **extra: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {f"{META_PREFIX}agent": spec.agent, f"{META_PREFIX}agent_did": spec.did}
    if response_jws is not None:
        meta[f"{META_PREFIX}response_jws"] = response_jws
    if event_jws:
        meta[f"{META_PREFIX}event_jws"] = list(event_jws)
    meta.update({f"{META_PREFIX}{k}": v for k, v in extra.items()})
    return meta


def success_result(
    spec: ToolSpec,
    result: Any,
    response_jws: str | None,
    *,
    streamed: bool = False,
    sequence: int | None = None,
    event_jws: tuple[str, ...] = (),
) -> ToolResult:
    content = {
        "status": "success",
        "executed": True,
        "agent": spec.agent,
        "intent": spec.intent,
        "result": result,
    }
    extra: dict[str, Any] = {"streamed": True} if streamed else {"sequence": sequence}
    return ToolResult(
        spec.name, spec.agent, spec.intent, "success", content, _render(result), response_jws,
        meta=_meta(spec, response_jws, event_jws, **extra), event_jws=event_jws,
    )  # fmt: skip


def approval_result(spec: ToolSpec, result: Mapping[str, Any], response_jws: str) -> ToolResult:
    # Fail closed: whatever else the result holds, an agent that says it needs approval did
    # not run the action, so this is never reported as a completed run.
    content: dict[str, Any] = {
        "status": "needs_approval",
        "executed": False,
        "agent": spec.agent,
        "intent": spec.intent,
    }
    for member in ("action_id", "action_hash", "preview", "expires_at"):
        if member in result:
            content[member] = result[member]
    action = content.get("action_id")
    lines = [
        f"NOT RUN: {spec.agent} did not run '{spec.intent}'; it waits for a person to approve it.",
        f"action id: {_render(action) if not isinstance(action, str) else action}",
    ]
    if "expires_at" in content:
        lines.append(f"approval expires at: {_render(content['expires_at'])}")
    if "preview" in content:
        lines.append(f"preview: {_render(content['preview'])}")
    return ToolResult(
        spec.name, spec.agent, spec.intent, "needs_approval", content, "\n".join(lines), response_jws,
        meta=_meta(spec, response_jws, needs_approval=True),
    )  # fmt: skip


def error_result(spec: ToolSpec, message: str, code: int | None) -> ToolResult:
    # No "executed" member: a timeout (-32049) or a lost answer may follow an intent that ran.
    content: dict[str, Any] = {
        "status": "error",
        "agent": spec.agent,
        "intent": spec.intent,
        "error": message,
    }
    if code is not None:
        content["code"] = code
    return ToolResult(
        spec.name, spec.agent, spec.intent, "error", content, message, None, code, _meta(spec, None)
    )
