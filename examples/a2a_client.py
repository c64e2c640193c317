"""Call the secured a2a-sdk echo agent with the a2a-sdk client API, through the secure transport.

    python examples/a2a_echo_agent.py                       # in one terminal
    python examples/a2a_client.py --did <its DID>           # in another

The code below is ordinary a2a-sdk client code (``Client.send_message``, ``get_task``); the
only differences are how the client is made: the agent card is fetched and verified against
the DID we expect (signature by that DID's key, no ``jku``, the card exactly as signed), and
the ``ClientFactory`` gets the signed-intent transport. The handshake happens on the first
call; every answer and every streamed event is verified before the SDK sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from a2a.helpers import get_artifact_text, new_text_message
from a2a.types import GetTaskRequest, Role, SendMessageRequest, TaskState

from a2a_secure import Identity
from a2a_secure.a2a_binding import create_secure_client
from a2a_secure.client.http import A2AClient
from a2a_secure.identity.addresses import AddressPolicy


async def run(
    url: str, did: str, text: str = "hello secure world", identity: Identity | None = None
) -> list[str]:
    """Send ``text`` as a streamed message, print each verified event, then read the task back."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line)

    # The example agent runs on this machine, and the card names its loopback URL: a client
    # takes such an address from a card only with this explicit opt-in (SECURITY.md).
    loopback = AddressPolicy.build(dev_allow_loopback=True)
    async with A2AClient(identity or Identity.generate("a2a-example-client"), addresses=loopback) as secure:
        client = await create_secure_client(secure, url, did)
        try:
            task_id = ""
            request = SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))
            async for event in client.send_message(request):
                kind = event.WhichOneof("payload")
                if kind == "task":
                    task_id = event.task.id
                    say(f"task      {task_id} {TaskState.Name(event.task.status.state)}")
                elif kind == "status_update":
                    say(f"status    {TaskState.Name(event.status_update.status.state)}")
                elif kind == "artifact_update":
                    say(f"artifact  {get_artifact_text(event.artifact_update.artifact, ' ')!r}")
                elif kind == "message":
                    say(f"message   {event.message.parts[0].text!r}")
            if task_id:
                task = await client.get_task(GetTaskRequest(id=task_id))
                text = get_artifact_text(task.artifacts[0], " ")
                say(f"get_task  {TaskState.Name(task.status.state)} {text!r}")
        finally:
            await client.close()
    return lines


def main() -> None:
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8110")
    parser.add_argument("--did", required=True, help="the agent's DID (printed by a2a_echo_agent.py)")
    parser.add_argument("--text", default="hello secure world")
    args = parser.parse_args()
    asyncio.run(run(args.url, args.did, args.text))


if __name__ == "__main__":
    main()
