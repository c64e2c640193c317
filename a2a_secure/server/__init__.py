"""The HTTP server adapter (needs the ``server`` extra: fastapi and uvicorn)."""

try:
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("a2a_secure.server needs the server extra: pip install 'a2a-secure[server]'") from exc

from a2a_secure.server.app import AgentServer, create_app

__all__ = ["AgentServer", "create_app"]
