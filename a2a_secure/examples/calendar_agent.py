"""A calendar agent that asks a person before it invites anyone (PROTOCOL.md §12).

``create_event`` does not create the event: it answers ``NeedsApproval`` with the event as
``action_data`` and a one-line preview. The event is created (once) only when one of the
configured ``approvers`` signs ``tool.approve`` for exactly that data's hash. The events
are kept in memory, as an example; a real calendar keeps them where every worker sees them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from a2a_secure.agent import A2AAgent
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.approval import ActionContext, NeedsApproval

__all__ = ["CREATE_EVENT_SCHEMA", "build_agent", "check_event"]

_EMAIL = re.compile(r"[^@\s]{1,64}@[^@\s]{1,255}")
_START = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:\d{2})?")

CREATE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "start": {"type": "string", "description": "ISO 8601 date and time, e.g. 2026-03-02T10:00Z"},
        "participants": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 50},
    },
    "required": ["title", "start", "participants"],
    "additionalProperties": False,
}


def check_event(inputs: dict[str, Any]) -> dict[str, Any]:
    """The event the inputs describe, or ``InvalidParams``."""
    if set(inputs) != {"title", "start", "participants"}:
        raise InvalidParams("create_event takes exactly title, start and participants")
    title, start, participants = inputs["title"], inputs["start"], inputs["participants"]
    if not isinstance(title, str) or not 1 <= len(title) <= 200:
        raise InvalidParams("title must be 1-200 characters")
    if not isinstance(start, str) or not _START.fullmatch(start):
        raise InvalidParams("start must be an ISO 8601 date and time")
    if (
        not isinstance(participants, list)
        or len(participants) > 50
        or not all(isinstance(p, str) and _EMAIL.fullmatch(p) for p in participants)
    ):
        raise InvalidParams("participants must be at most 50 e-mail addresses")
    return {"title": title, "start": start, "participants": participants}


def build_agent(identity: Identity | None = None, *, approvers: Iterable[str] = ()) -> A2AAgent:
    """The calendar agent: ``list_events``, and ``create_event`` once a person approves it."""
    agent = A2AAgent(
        "calendar", identity, description="Calendar that asks before it invites", approvers=approvers
    )
    events: list[dict[str, Any]] = []

    @agent.intent(
        "list_events",
        description="The events created so far.",
        input_schema={"type": "object", "properties": {}},
    )
    def list_events(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"events": list(events)}

    @agent.intent(
        "create_event",
        description="Create an event and invite its participants, once a person approves it.",
        input_schema=CREATE_EVENT_SCHEMA,
    )
    def create_event(inputs: dict[str, Any]) -> NeedsApproval:
        event = check_event(inputs)
        who = ", ".join(event["participants"]) or "nobody"
        return NeedsApproval(event, preview=f"Create {event['title']!r} at {event['start']}, invite {who}")

    @agent.approved_action("create_event")
    def insert(event: dict[str, Any], context: ActionContext) -> dict[str, Any]:
        created = {"id": len(events) + 1, **event, "approved_by": context.approver_did}
        events.append(created)
        return {"created": created}

    return agent
