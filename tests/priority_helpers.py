"""An ``A2A_SECURE_APP`` target for server subprocesses that tells what its handlers did.

``register_traced`` serves ``work``: it sleeps ``inputs["seconds"]`` and appends
``"<event>:<tag>:<pid>"`` (``start``, ``finish`` or ``cancelled``) to the Redis list
``$A2A_TEST_COUNTER_KEY``, so a test sees across processes which worker ran an intent and
which one saw its handler cancelled (PROTOCOL.md §12.3).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from redis_helpers import COUNTER_KEY_ENV, COUNTER_URL_ENV


def register_traced(server: Any) -> None:
    """Register ``work`` (see the module docstring) on ``server``."""
    import redis.asyncio as redis_asyncio
    from redis.maint_notifications import MaintNotificationsConfig

    client = redis_asyncio.Redis.from_url(
        os.environ[COUNTER_URL_ENV],
        socket_timeout=30.0,  # a loaded machine: a handler's count must not fail the run
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    key = os.environ[COUNTER_KEY_ENV]
    pid = os.getpid()

    @server.intent("work")
    async def work(inputs: dict[str, Any], ctx: Any) -> dict[str, Any]:
        tag = inputs["tag"]
        await client.rpush(key, f"start:{tag}:{pid}")
        try:
            await asyncio.sleep(inputs.get("seconds", 0))
        except asyncio.CancelledError:
            await client.rpush(key, f"cancelled:{tag}:{pid}")
            raise
        await client.rpush(key, f"finish:{tag}:{pid}")
        return {"tag": tag, "priority": ctx.priority, "pid": pid}
