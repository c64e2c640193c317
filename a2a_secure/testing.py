"""Helpers for tests, the demo and benchmarks: a settable clock and a loopback server.

``serve_app`` runs any ASGI app under a real uvicorn server on 127.0.0.1 with an ephemeral
port (optionally with TLS) and yields its base URL, so tests talk to the real stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["FakeClock", "serve_app"]


class FakeClock:
    """A clock that stands still until moved: ``clock()`` returns ``now``."""

    def __init__(self, now: float = 1_763_700_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (or back, with a negative value)."""
        self.now += seconds


@contextlib.asynccontextmanager
async def serve_app(
    app: Any,
    *,
    ssl_context: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
    **config: Any,
) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on ``host`` and an ephemeral port; yield the base URL."""
    import uvicorn  # noqa: PLC0415 - server extra

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "off", "access_log": False}
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, **options))
    if ssl_context is not None:
        # uvicorn builds its own context from files; hand it ours through the config.
        server.config.load()
        server.config.ssl = ssl_context
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
            raise RuntimeError("server did not start")
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://{host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        sock.close()
