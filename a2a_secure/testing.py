"""Helpers for tests, the demo and benchmarks: a settable clock and a loopback server.

``SteppedClock`` is a wall clock offset by a number of seconds read from a file, for fault
campaigns that step one server process's clock (``A2A_SECURE_TEST_CLOCK_DIR``, read by
:func:`a2a_secure.server.run.app_from_env`): never for production use.

``LatencyKey`` is a remote key holder (identity/remote.py) that signs with a local key after an
injected delay, counting the signatures in flight: what a KMS looks like to the runtime.

``serve_app`` runs any ASGI app under a real uvicorn server on 127.0.0.1 with an ephemeral
port (optionally with TLS) and yields its base URL, so tests talk to the real stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["FakeClock", "LatencyKey", "SteppedClock", "serve_app"]


class SteppedClock:
    """``time.time()`` plus the offset (seconds, a float) written in the file ``path``.

    For testing only: a fault campaign steps a server process's wall clock by writing the
    file (named after the process id). The file is read at most every ``every`` seconds
    (monotonic time); a missing or unreadable file is an offset of 0. Only the wall clock
    the server compares timestamps and expiries with moves; deadlines stay monotonic.
    """

    def __init__(self, path: str | os.PathLike[str], every: float = 0.05) -> None:
        self.path = os.fspath(path)
        self.every = every
        self.offset = 0.0
        self._read_at = -float("inf")

    def __call__(self) -> float:
        t = time.monotonic()
        if t - self._read_at >= self.every:
            self._read_at = t
            try:
                with open(self.path, encoding="ascii") as f:
                    self.offset = float(f.read().strip() or 0)
            except (OSError, ValueError):
                self.offset = 0.0
        return time.time() + self.offset


class LatencyKey:
    """A key holder whose signatures are awaited and take ``latency`` seconds (a remote
    service stand-in for tests and benchmarks; the signature itself is real Ed25519).

    ``in_flight`` and ``most_in_flight`` count concurrent ``sign_async`` calls; ``calls``
    counts them all; ``blocking_calls`` counts ``sign`` (which sleeps the thread).
    ``fail`` set to an exception class makes every signature raise it; ``wrong`` set to
    a key holder makes it sign with that key instead (a service answering with another key).
    """

    def __init__(self, holder: Any, latency: float = 0.02) -> None:
        self._holder = holder
        self.latency = latency
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls = 0
        self.blocking_calls = 0
        self.fail: type[Exception] | None = None
        self.wrong: Any = None

    @property
    def public_key(self) -> bytes:
        return bytes(self._holder.public_key)

    def _signer(self) -> Any:
        if self.fail is not None:
            raise self.fail("the signing service is down")
        return self.wrong if self.wrong is not None else self._holder

    def sign(self, message: bytes) -> bytes:
        self.blocking_calls += 1
        time.sleep(self.latency)
        return bytes(self._signer().sign(message))

    async def sign_async(self, message: bytes) -> bytes:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
            return bytes(self._signer().sign(message))
        finally:
            self.in_flight -= 1

    def derive_key(self, info: bytes) -> bytes:
        return bytes(self._holder.derive_key(info))

    def export_seed(self) -> bytes:
        raise TypeError("a remote key cannot be exported")


class FakeClock:
    """A clock that stands still until moved: ``clock()`` returns ``now``."""

    def __init__(self, now: float = 1_763_700_000.0) -> None:
        self.now = now
        self.elapsed = 0.0

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        """A monotonic companion: it moves with forward steps only (a wall clock set back
        does not take elapsed time back)."""
        return self.elapsed

    def advance(self, seconds: float) -> None:
        """Move the clock forward (or back, with a negative value)."""
        self.now += seconds
        if seconds > 0:
            self.elapsed += seconds


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

    # Let uvicorn bind port 0 itself: asyncio sets TCP_NODELAY only on sockets whose proto
    # says TCP, and a socket made with proto 0 and handed over with ``sockets=`` would make
    # every keep-alive reply wait ~40 ms for a delayed ACK (Nagle).
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "off", "access_log": False}
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, **options))
    if ssl_context is not None:
        # uvicorn builds its own context from files; hand it ours through the config.
        server.config.load()
        server.config.ssl = ssl_context
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
            raise RuntimeError("server did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://{host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
