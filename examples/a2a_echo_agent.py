"""An a2a-sdk agent served behind a2a_secure (PROTOCOL.md §10).

    python examples/a2a_echo_agent.py                 # prints its DID and URL; leave it running
    python examples/a2a_client.py --did <that DID>    # in another terminal

The agent is plain a2a-sdk code: an ``AgentExecutor`` that opens a task and streams the words
of the message back as chunks of one artifact, and a ``DefaultRequestHandler`` around it. It
is mounted with ``A2ABridge`` into an a2a_secure ``AgentServer``: only callers that completed
the DID handshake reach it, every call is a signed, sequenced intent, every answer and every
streamed event is signed, and tasks belong to the caller's DID. The SDK's own JSON-RPC routes
are not mounted at all. The agent card at /.well-known/agent-card.json is a valid, signed A2A
AgentCard whose only interface is the signed-intent binding.

The key is kept in examples/keys/a2a-echo.key (mode 0600, not committed), so the DID stays
the same from one run to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

from a2a_secure import Identity
from a2a_secure.a2a_binding import BINDING_URI, A2ABridge
from a2a_secure.policy import Policy
from a2a_secure.server.app import AgentServer

HERE = Path(__file__).resolve().parent


class EchoExecutor(AgentExecutor):
    """Opens a task and streams the message's words back as chunks of one artifact."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Task → working → one artifact chunk per word → completed."""
        self.calls += 1
        assert context.message is not None
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        words = context.get_user_input().split() or [""]
        for i, word in enumerate(words):
            if self.delay:
                await asyncio.sleep(self.delay)
            await updater.add_artifact(
                [new_text_part(word)],
                artifact_id="echo",
                name="echo",
                append=i > 0,
                last_chunk=i == len(words) - 1,
            )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Mark the task canceled."""
        assert context.task_id is not None and context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def agent_card(url: str = "") -> AgentCard:
    """What the agent says about itself (the bridge sets the interface and adds the DID extension)."""
    return AgentCard(
        name="a2a-echo",
        supported_interfaces=[AgentInterface(url=url, protocol_binding=BINDING_URI, protocol_version="1.0")],
        description="Echoes the words of a message back, one artifact chunk per word",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="echo",
                name="Echo",
                description="Streams the words of the message back",
                tags=["echo", "demo"],
                examples=["hello secure world"],
            )
        ],
    )


def build_server(
    identity: Identity,
    url: str = "",
    *,
    delay: float = 0.0,
    policy: Policy | None = None,
) -> tuple[AgentServer, DefaultRequestHandler, EchoExecutor]:
    """The a2a_secure server hosting the echo agent (set ``server.url`` before serving)."""
    executor = EchoExecutor(delay)
    card = agent_card(url)
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    server = AgentServer(identity, policy or Policy(), name=card.name, description=card.description, url=url)
    A2ABridge(handler, agent_card=card).mount(server)
    return server, handler, executor


def load_or_create(name: str) -> Identity:
    """The agent's key from examples/keys/, created on first use."""
    path = HERE / "keys" / f"{name}.key"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        Identity.generate(name).save(path)
    return Identity.load(path)


def main() -> None:
    """Serve the echo agent with uvicorn."""
    import uvicorn  # noqa: PLC0415 - only needed to serve

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8110)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds between two streamed words")
    args = parser.parse_args()
    identity = load_or_create("a2a-echo")
    url = f"http://{args.host}:{args.port}"
    server, _handler, _executor = build_server(identity, url, delay=args.delay)
    print(f"a2a-echo  {identity.did}  {url}")
    print(f"  python examples/a2a_client.py --url {url} --did {identity.did}")
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
