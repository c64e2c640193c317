"""What ``a2a-secure serve`` checks and says before uvicorn starts.

Each check fails with one line naming the thing and the fix, before any worker starts (and
so before "Application startup complete"): the app to import (:func:`load_object`), the port
to bind (:func:`check_port`), the Redis URL to reach (:func:`check_store`). Once they pass,
:func:`banner` prints what a person needs to call the agent: its DID, its card's URL and a
ready ``a2a-secure call`` line.
"""

from __future__ import annotations

import asyncio
import errno
import importlib
import os
import shlex
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from a2a_secure.identity.keys import Identity
    from a2a_secure.server.app import AgentServer

__all__ = ["banner", "check_port", "check_store", "check_tls", "load_object"]


def load_object(spec: str, app_dir: str | os.PathLike[str] | None = None) -> Any:
    """The object ``module:attr`` names, importing ``module`` from ``app_dir`` first.

    ``app_dir`` (default: the current folder, like uvicorn's ``--app-dir``) is put first on
    ``sys.path``. A module that is not found, an attribute it lacks, or an import that fails
    is one ``ValueError`` line naming what and where, never a traceback.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--app {spec!r} must be 'module:attribute' (e.g. myagent:agent)")
    folder = os.path.abspath(app_dir if app_dir is not None else ".")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise ValueError(
                f"--app {spec!r}: no module named {exc.name!r} in {folder}"
                " (run from its folder, or give --app-dir)"
            ) from None
        raise ValueError(f"--app {spec!r}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # the app's own code failed while importing: say where
        place = traceback.extract_tb(exc.__traceback__)[-1]
        raise ValueError(
            f"--app {spec!r}: importing {module_name} failed at {place.filename}:{place.lineno}:"
            f" {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            owner = getattr(obj, "__name__", module_name)
            raise ValueError(f"--app {spec!r}: {owner} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def check_port(host: str, port: int) -> None:
    """``ValueError`` if ``host``:``port`` cannot be bound now (in use, or not an address here).

    uvicorn binds only after the app started, so its own error would come after "Application
    startup complete"; this one comes first. (Another process may still take the port between
    this check and uvicorn's bind: then uvicorn's error stands.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} on {host} is in use (another server?): stop it, or choose another --port"
                ) from None
            raise ValueError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (check --host)"
            ) from None


def check_tls(cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> None:
    """``ValueError`` naming the file when the certificate and key cannot serve TLS."""
    import ssl  # noqa: PLC0415

    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {os.fspath(path)}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ValueError(
            f"--tls-cert {os.fspath(cert)} and --tls-key {os.fspath(key)} cannot be used ({reason}):"
            " give a PEM certificate chain and its private key"
        ) from None


def check_store(redis_url: str, prefix: str | None = None) -> None:
    """``ValueError`` naming the URL (its password hidden) when Redis there does not answer."""
    from a2a_secure.store.redis import RedisStore  # noqa: PLC0415 - redis extra

    async def ping() -> None:
        store = RedisStore(redis_url, prefix=prefix or "a2a:")
        try:
            await store.check()
        finally:
            await store.aclose()

    try:
        asyncio.run(ping())
    except ConnectionError as exc:
        raise ValueError(f"{exc}: start it, or fix --redis-url") from None


def banner(server: AgentServer, base_url: str) -> str:
    """The lines ``serve`` prints at start: the DID, the card URL, a ready call line."""
    goals = [g for g in server.goals if "." not in g] or server.goals
    goal = "echo" if "echo" in goals else (goals[0] if goals else "echo")
    call = shlex.join(
        [
            "a2a-secure",
            "call",
            "--key-file",
            "YOUR.key",
            "--to",
            server.identity.did,
            "--endpoint",
            base_url,
            "--goal",
            goal,
            "--inputs",
            "{}",
        ]
    )
    return (
        f"a2a-secure: serving {server.identity.did}\n"
        f"a2a-secure: card {base_url}/.well-known/agent-card.json\n"
        f"a2a-secure: try  {call}   (YOUR.key: a2a-secure keygen --out YOUR.key)"
    )


def app_identity(app: str, app_dir: str | os.PathLike[str] | None) -> Identity:
    """The identity of the ``AgentServer`` (or ``A2AAgent``) ``app`` names, for an app that
    holds its own key (a key held by a signing service, identity/remote.py)."""
    from a2a_secure.server.app import AgentServer  # noqa: PLC0415 - app imports this module's users

    obj = load_object(app, app_dir)
    source = obj if isinstance(obj, AgentServer) else getattr(obj, "server", None)
    if not isinstance(source, AgentServer):
        raise ValueError(f"--app {app!r} builds no AgentServer: give --key-file or --key-uri")
    return source.identity
