"""A calendar agent that asks a person before it invites anyone, end to end on loopback.

    python examples/calendar_agent.py

An assistant agent asks the calendar to create an event with participants; the calendar
stores the action and answers with its preview and hash instead of acting; the person's own
key (a different DID from the assistant's) reads the pending action, checks its hash and
signs the approval; the event is created once, and a second approval is refused.
"""

from __future__ import annotations

import asyncio

from a2a_secure import A2AAgent, A2AError, AgentRegistry, Identity
from a2a_secure.agent import RegistryEntry
from a2a_secure.examples import calendar_agent
from a2a_secure.testing import serve_app


async def main() -> None:
    person = Identity.generate("person")  # in real use: the person's own key file
    calendar = calendar_agent.build_agent(approvers=[person.did])
    async with serve_app(calendar.app) as url:
        registry = AgentRegistry([RegistryEntry("calendar", calendar.did, url)])
        async with (
            A2AAgent("assistant", registry=registry) as assistant,
            A2AAgent("person", person, registry=registry) as me,
        ):
            event = {
                "title": "Design review",
                "start": "2026-03-02T10:00Z",
                "participants": ["ana@example.com"],
            }
            result = await assistant.request("calendar", {"goal": "create_event", "inputs": event})
            print("needs approval:", result.needs_approval, "action", result.action_id)
            print("preview:", result.preview)
            outcome = await me.approve("calendar", result.action_id, approved=True)
            print("approved by", person.did[:24] + "…", "->", outcome.result)
            try:
                await me.approve("calendar", result.action_id, approved=True)
            except A2AError as exc:
                print("second approval refused:", exc.code, exc.message)


if __name__ == "__main__":
    asyncio.run(main())
