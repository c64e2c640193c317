"""Serving an agent from the command line, in one or several worker processes.

``serve`` puts its settings in environment variables and starts uvicorn with the factory
``a2a_secure.server.run:app_from_env``: every worker process builds its own app from the same
variables. Several workers must share their state through Redis (``--redis-url``): with the
in-memory store each worker would know only the sessions it opened itself.

Environment variables read by :func:`app_from_env`:

``A2A_SECURE_KEY_FILE``     the agent's key file (required)
``A2A_SECURE_POLICY``       a policy JSON file (members optional, defaults of §9 applied);
                            it may also hold the server's own scheduling settings, which are
                            never sent to peers (PROTOCOL.md §12.3): ``priority_rights``
                            (``{"default": 3, "per_did": {DID: 5}}``),
                            ``max_concurrent_intents`` and ``max_queued_intents`` (per worker)
``A2A_SECURE_REDIS_URL``    Redis URL: the shared :class:`~a2a_secure.store.redis.RedisStore`
                            (else the in-process :class:`~a2a_secure.store.memory.MemoryStore`);
                            ``redis+cluster://`` and ``redis+sentinel://`` as well
                            (:mod:`a2a_secure.store.redis_connect`)
``A2A_SECURE_REDIS_PREFIX`` key prefix in Redis (default ``a2a:``)
``A2A_SECURE_REDIS_WAIT_REPLICAS``   ``wait_replicas`` of the ``RedisStore``: an integer from 0
                            (off, the default) to 1000; with N > 0 a new request runs only
                            once N replicas acknowledged its sequence (``WAIT``), else 503
                            (SECURITY.md, "Replication is asynchronous"). Needs
                            ``A2A_SECURE_REDIS_URL``
``A2A_SECURE_REDIS_WAIT_TIMEOUT_MS`` how long ``WAIT`` waits for them, 1 to 800 ms (default
                            100); below the 1 s each Redis round trip is given. Needs
                            ``A2A_SECURE_REDIS_WAIT_REPLICAS``
``A2A_SECURE_AUDIT_LOG``    path of the hash-chained JSON Lines audit log (shared by workers)
``A2A_SECURE_REVOCATIONS``  a revocation file (``a2a-secure revoke --file``), checked besides
                            the revocations kept in the store (``a2a-secure revoke --redis-url``)
``A2A_SECURE_URL``          the agent's public base URL, the card's ``url`` (PROTOCOL.md §4)
``A2A_SECURE_METRICS``      ``1``: serve Prometheus metrics at ``/metrics`` (the ``metrics``
                            extra); with several workers, ``serve`` also sets
                            ``PROMETHEUS_MULTIPROC_DIR`` (a2a_secure.telemetry.metrics)
``A2A_SECURE_LOG_FORMAT``   ``json``: log one JSON object per line, one per answered request
                            (a2a_secure.telemetry.logs)
``A2A_SECURE_APP``          ``module:attr``: an ``AgentServer`` (or an object with a ``server``
                            attribute holding one, like ``A2AAgent``) whose intents are served,
                            or a callable given the ``AgentServer`` to register handlers on

With no ``A2A_SECURE_APP`` the server is the test agent of PROTOCOL.md §11: ``echo`` (result =
inputs unchanged) and the streaming ``count``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from a2a_secure.identity.keys import Identity
from a2a_secure.identity.rotation import KeyRing
from a2a_secure.identity.sources import is_token_uri, load_key_ring
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import IntentContext, IntentDispatcher, ServerLimits
from a2a_secure.protocol.tools import TOOL_PREFIX
from a2a_secure.server.app import AgentServer, public_url
from a2a_secure.server.test_agent import register_test_agent
from a2a_secure.store.base import Store
from a2a_secure.store.memory import MemoryStore
from a2a_secure.store.revocation import FileRevocations, Revocations
from a2a_secure.telemetry import tracing

__all__ = [
    "ENV",
    "WAIT_BOUNDS",
    "WORKERS_NEED_REDIS",
    "ServeUsageError",
    "app_from_env",
    "build_server",
    "default_url",
    "serve",
    "wait_setting",
]

ENV = {
    "key_file": "A2A_SECURE_KEY_FILE",
    "policy": "A2A_SECURE_POLICY",
    "url": "A2A_SECURE_URL",
    "redis_url": "A2A_SECURE_REDIS_URL",
    "redis_prefix": "A2A_SECURE_REDIS_PREFIX",
    "redis_wait_replicas": "A2A_SECURE_REDIS_WAIT_REPLICAS",
    "redis_wait_timeout_ms": "A2A_SECURE_REDIS_WAIT_TIMEOUT_MS",
    "audit_log": "A2A_SECURE_AUDIT_LOG",
    "app": "A2A_SECURE_APP",
    "revocations": "A2A_SECURE_REVOCATIONS",
    "metrics": "A2A_SECURE_METRICS",
    "log_format": "A2A_SECURE_LOG_FORMAT",
}
LOG_FORMATS = ("text", "json")
FACTORY = "a2a_secure.server.run:app_from_env"
WORKERS_NEED_REDIS = "--workers > 1 needs --redis-url: sessions would not be shared between workers"

# Lowest and highest value of the RedisStore's WAIT settings that serve accepts. The store
# gives each round trip 1 s (its socket timeout): a WAIT longer than that would end in a
# timeout (the connection dropped) instead of a reply saying how many replicas acknowledged,
# and 0 ms would make Redis wait without end.
WAIT_BOUNDS = {"redis_wait_replicas": (0, 1000), "redis_wait_timeout_ms": (1, 800)}


class ServeUsageError(ValueError):
    """Arguments of :func:`serve` that cannot be used together or as given (exit code 2)."""


def wait_setting(name: str, text: str) -> int:
    """The value of the WAIT setting ``name`` (a key of :data:`WAIT_BOUNDS`) written ``text``.

    Raises ``ValueError("must be an integer from LOW to HIGH, not 'TEXT'")``: plain decimal
    digits only, so that "1.5", "-1", "+1" or " 1" are refused rather than read as something.
    """
    low, high = WAIT_BOUNDS[name]
    if not re.fullmatch(r"[0-9]{1,6}", text) or not low <= int(text) <= high:
        raise ValueError(f"must be an integer from {low} to {high}, not {text!r}")
    return int(text)


# Members of a policy file that configure this server, not the negotiated policy (§12.3).
SERVER_MEMBERS = (
    "priority_rights",
    "max_concurrent_intents",
    "max_queued_intents",
    "sealed_intents",
    "require_sealed",
)


def _read_policy_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a policy file holds one JSON object")
    return data


def load_policy(path: str | os.PathLike[str] | None) -> Policy:
    """The policy in the JSON file ``path`` (missing members take their defaults)."""
    if not path:
        return DEFAULT_POLICY
    data = _read_policy_file(path)
    return Policy.load({k: v for k, v in data.items() if k not in SERVER_MEMBERS})


def load_scheduling(path: str | os.PathLike[str] | None) -> tuple[PriorityRights, ServerLimits]:
    """The priority rights and concurrency limits in the policy file ``path`` (§12.3)."""
    if not path:
        return PriorityRights(), ServerLimits()
    data = _read_policy_file(path)
    rights = PriorityRights.from_dict(data.get("priority_rights", {}))
    bounds: dict[str, Any] = {}
    for name in ("max_concurrent_intents", "max_queued_intents"):
        if name in data:
            value = data[name]
            if not (value is None and name == "max_concurrent_intents") and type(value) is not int:
                raise ValueError(f"{path}: {name} must be an integer")
            bounds[name] = value
    for name in ("sealed_intents", "require_sealed"):  # PROTOCOL.md §12.6
        if name in data:
            if type(data[name]) is not bool:
                raise ValueError(f"{path}: {name} must be true or false")
            bounds[name] = data[name]
    try:
        return rights, ServerLimits(**bounds)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _load_object(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"app {spec!r} must be 'module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _one_of(name: str, spec: str, ours: Any, theirs: Any, default: Any) -> Any:
    """The setting the app was built with, or the command line's; both set and different: refuse."""
    if theirs in (default, ours):
        return ours
    if ours != default:
        raise ValueError(
            f"app {spec!r} was built with its own {name}, and the command line gives another:"
            f" give it in one place only"
        )
    return theirs


def _ring_view(ring: KeyRing) -> tuple[Any, ...]:
    """What tells two key rings apart (an ``Identity`` compares by object, not by key)."""
    retired = tuple((r.identity.kid, r.retired_at, r.overlap_until) for r in ring.retired)
    return ring.current.kid, retired, ring.statements


def _adopt_settings(server: AgentServer, source: AgentServer, spec: str, *, shared_store: bool) -> None:
    """Serve ``source``'s security settings, not the defaults of a server built from flags.

    An app built with a policy that allows two goals must not be served under the default
    policy that allows every goal: the configuration would fail open. Its policy, limits and
    priority rights are taken unless the command line sets another (then serving is refused),
    its revocations are added to the command line's, its key ring, resolver, body limit and
    card builder (the A2A card) are kept, and a store other than the in-memory one is
    refused unless ``--redis-url`` gives the shared store (revocations and sessions live there).
    """
    server.policy = _one_of("policy", spec, server.policy, source.policy, DEFAULT_POLICY)
    server.limits = _one_of("server limits", spec, server.limits, source.limits, ServerLimits())
    server.priority_rights = _one_of(
        "priority rights", spec, server.priority_rights, source.priority_rights, PriorityRights()
    )
    server.revocations = server.revocations + tuple(
        r for r in source.revocations if r not in server.revocations
    )
    if source.key_ring is not None:
        ours = server.key_ring
        if ours is not None and ours.retired and _ring_view(ours) != _ring_view(source.key_ring):
            raise ValueError(f"app {spec!r} was built with another key ring than the key file's")
        server.key_ring = source.key_ring
    if (
        not isinstance(source.store, MemoryStore)
        and isinstance(server.store, MemoryStore)
        and not shared_store
    ):
        raise ValueError(
            f"app {spec!r} keeps its state in a {type(source.store).__name__}: serve it with --redis-url"
        )
    server.resolver = source.resolver
    server.max_body = source.max_body
    if source._card_builder is not None:
        server.set_card_builder(source._card_builder)
    if server._audit is None:
        server._audit = source._audit


def _mount_app(server: AgentServer, spec: str, *, shared_store: bool = False) -> None:
    """Serve the intents of ``spec`` on ``server`` (see the module documentation)."""
    obj = _load_object(spec)
    source = obj if isinstance(obj, AgentServer) else getattr(obj, "server", None)
    if isinstance(source, AgentServer):
        if source.identity.did != server.identity.did:
            raise ValueError(
                f"app {spec!r} has the DID {source.identity.did}, the key file {server.identity.did}"
            )
        server.name = source.name
        server.description = source.description
        server.version = source.version
        server.url = server.url or source.url  # the operator's --url, else the app's own
        _adopt_settings(server, source, spec, shared_store=shared_store)
        # Approved actions run with THIS server's store (shared by the workers), so the
        # source's handlers are called raw and their NeedsApproval is stored here.
        server.adopt_approvals(source)
        for goal in source.goals:
            if goal.startswith(TOOL_PREFIX):  # served by adopt_approvals, bound to this server
                continue
            if source.is_streaming(goal):

                def stream(inputs: Any, context: IntentContext, _goal: str = goal) -> AsyncIterator[Any]:
                    return source.open_stream(_goal, inputs, context)

                server.add_stream(goal, stream)
                continue

            async def run(inputs: Any, context: IntentContext, _goal: str = goal) -> Any:
                return await IntentDispatcher.run(source, _goal, inputs, context)

            server.add(goal, run)
        return
    if callable(obj):
        obj(server)
        return
    raise ValueError(f"app {spec!r} is neither an AgentServer nor a callable")


def _default_app(server: AgentServer) -> None:
    register_test_agent(server)


def build_server(
    identity: Identity,
    *,
    policy: Policy = DEFAULT_POLICY,
    store: Store | None = None,
    audit: Any = None,
    app: str | None = None,
    key_ring: KeyRing | None = None,
    revocations: Sequence[Revocations] = (),
    priority_rights: PriorityRights | None = None,
    limits: ServerLimits | None = None,
    url: str = "",
    shared_store: bool = False,
    metrics: bool = False,
    log_requests: bool = False,
) -> AgentServer:
    """The ``AgentServer`` of :func:`app_from_env`, from already loaded parts.

    An ``app`` that is an ``AgentServer`` (or holds one) is served with its own policy,
    limits, priority rights, revocations, key ring, resolver and card builder (a setting
    given both here and in the app, differently, is a ``ValueError``: the configuration
    must not silently fail open). ``shared_store``: the store will be the shared Redis
    store (``serve`` checks the app before the workers build it).
    """
    server = AgentServer(
        identity,
        policy,
        name=identity.agent_id,
        description="a2a-secure test agent (PROTOCOL.md §11)" if not app else "",
        url=url,
        store=store,
        audit=audit,
        key_ring=key_ring,
        revocations=revocations,
        priority_rights=priority_rights,
        limits=limits,
        metrics=metrics,
        log_requests=log_requests,
    )
    if app:
        _mount_app(server, app, shared_store=shared_store)
    else:
        _default_app(server)
    return server


def default_url(host: str, port: int, *, tls: bool) -> str:
    """The card's ``url`` of a server bound to ``host``:``port`` when none is configured.

    ``""`` for a wildcard address (``0.0.0.0``, ``::``): it names no address a peer can use.
    """
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - compared, not bound
        return ""
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def _wait_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``wait_replicas``/``wait_timeout_ms`` of the RedisStore set in ``env``, checked."""
    options: dict[str, Any] = {}
    for name in ("redis_wait_replicas", "redis_wait_timeout_ms"):
        text = env.get(ENV[name])
        if text:
            try:
                options[name.removeprefix("redis_")] = wait_setting(name, text)
            except ValueError as exc:
                raise ValueError(f"{ENV[name]} {exc}") from None
    if "wait_timeout_ms" in options and "wait_replicas" not in options:
        raise ValueError(f"{ENV['redis_wait_timeout_ms']} needs {ENV['redis_wait_replicas']}")
    return options


def app_from_env(environ: Mapping[str, str] | None = None) -> FastAPI:
    """A FastAPI app configured by the ``A2A_SECURE_*`` environment variables.

    The uvicorn factory of :func:`serve` (one call per worker process). The store and the
    audit log are closed when the app shuts down.
    """
    env = os.environ if environ is None else environ
    tracing.configure_from_env("a2a-secure", env)  # OTEL_EXPORTER_OTLP_* asks for traces
    key_file = env.get(ENV["key_file"])
    if not key_file:
        raise ValueError(f"{ENV['key_file']} is not set")
    key_ring = load_key_ring(key_file)  # the key, and the retired keys still in their window
    identity = key_ring.current
    policy = load_policy(env.get(ENV["policy"]) or None)
    revocation_file = env.get(ENV["revocations"])
    revocations = [FileRevocations(revocation_file)] if revocation_file else []
    rights, limits = load_scheduling(env.get(ENV["policy"]) or None)

    store: Store
    redis_url = env.get(ENV["redis_url"])
    if redis_url:
        from a2a_secure.store.redis import RedisStore  # noqa: PLC0415 - redis extra

        store = RedisStore(redis_url, prefix=env.get(ENV["redis_prefix"]) or "a2a:", **_wait_from_env(env))
    else:
        for name in ("redis_wait_replicas", "redis_wait_timeout_ms"):
            if env.get(ENV[name]):  # the operator asked for replication: do not run without it
                raise ValueError(f"{ENV[name]} needs {ENV['redis_url']}")
        store = MemoryStore()

    auditor: Any = None
    audit_path = env.get(ENV["audit_log"])
    if audit_path:
        from a2a_secure.audit import Auditor, JsonlAuditLog  # noqa: PLC0415

        auditor = Auditor([JsonlAuditLog(audit_path, identity)], role="server")

    server = build_server(
        identity,
        policy=policy,
        store=store,
        audit=auditor,
        app=env.get(ENV["app"]),
        key_ring=key_ring,
        revocations=revocations,
        priority_rights=rights,
        limits=limits,
        url=env.get(ENV["url"]) or "",
        metrics=env.get(ENV["metrics"]) == "1",
        log_requests=env.get(ENV["log_format"]) == "json",
    )
    fastapi_app = server.app()
    fastapi_app.state.agent_server = server

    own = fastapi_app.router.lifespan_context  # the server's own (its session sweep)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        try:
            async with own(_app):
                yield
        finally:
            with contextlib.suppress(Exception):
                await store.aclose()
            if auditor is not None:
                with contextlib.suppress(Exception):
                    auditor.close()
            if server.metrics is not None:  # this worker's live gauges end with it
                from a2a_secure.telemetry.metrics import mark_process_dead  # noqa: PLC0415

                mark_process_dead(os.getpid())

    fastapi_app.router.lifespan_context = lifespan
    return fastapi_app


def serve(
    key_file: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    redis_url: str | None = None,
    policy_path: str | os.PathLike[str] | None = None,
    audit_log: str | os.PathLike[str] | None = None,
    app: str | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    redis_prefix: str | None = None,
    log_level: str = "info",
    redis_wait_replicas: int | None = None,
    redis_wait_timeout_ms: int | None = None,
    url: str | None = None,
    metrics: bool = False,
    log_format: str = "text",
) -> None:
    """Run the agent under uvicorn with ``workers`` processes (blocks until stopped).

    ``url`` is the agent's public base URL in its card (PROTOCOL.md §4); None:
    :func:`default_url` of ``host``, ``port`` and TLS.
    ``metrics``: serve Prometheus metrics at ``/metrics``; with several workers in
    ``prometheus_client``'s multiprocess mode, through a directory made for this run (or
    ``PROMETHEUS_MULTIPROC_DIR`` if set, emptied first) and removed when it ends.
    ``log_format``: ``text`` or ``json`` (one object per line, one per answered request).

    ``redis_wait_replicas`` and ``redis_wait_timeout_ms`` are the ``wait_replicas`` and
    ``wait_timeout_ms`` of the :class:`~a2a_secure.store.redis.RedisStore` (None: its
    defaults, no ``WAIT``), within :data:`WAIT_BOUNDS`.

    Raises :class:`ServeUsageError` before starting anything when the arguments cannot be
    used: ``workers > 1`` without ``redis_url`` (:data:`WORKERS_NEED_REDIS`), a Redis option
    without ``redis_url``, a WAIT setting out of bounds, a timeout without replicas, only one
    of ``tls_cert``/``tls_key``; ``ValueError`` when the key file, policy or app cannot be used.
    """
    if workers < 1:
        raise ServeUsageError("--workers must be at least 1")
    if workers > 1 and not redis_url:
        raise ServeUsageError(WORKERS_NEED_REDIS)
    if (tls_cert is None) != (tls_key is None):
        raise ServeUsageError("--tls-cert and --tls-key go together")
    wait = {"redis_wait_replicas": redis_wait_replicas, "redis_wait_timeout_ms": redis_wait_timeout_ms}
    for name, value in {"redis_prefix": redis_prefix, **wait}.items():
        if value is not None and not redis_url:
            raise ServeUsageError(f"--{name.replace('_', '-')} needs --redis-url")
    for name, value in wait.items():
        low, high = WAIT_BOUNDS[name]
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise ServeUsageError(f"--{name.replace('_', '-')} must be an integer from {low} to {high}")
    if redis_wait_timeout_ms is not None and redis_wait_replicas is None:
        raise ServeUsageError("--redis-wait-timeout-ms needs --redis-wait-replicas")
    if log_format not in LOG_FORMATS:
        raise ServeUsageError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
    if metrics:
        try:
            import prometheus_client  # noqa: F401, PLC0415 - the metrics extra
        except ImportError:
            hint = "pip install 'a2a-secure[metrics]'"
            raise ServeUsageError(f"--metrics needs the metrics extra: {hint}") from None
    import uvicorn  # noqa: PLC0415 - server extra

    url = public_url(default_url(host, port, tls=tls_cert is not None) if url is None else url)
    settings = {
        "key_file": str(key_file) if is_token_uri(key_file) else os.path.abspath(key_file),
        "url": url,
        "policy": os.path.abspath(policy_path) if policy_path else None,
        "redis_url": redis_url,
        "redis_prefix": redis_prefix,
        "audit_log": os.path.abspath(audit_log) if audit_log else None,
        "app": app,
        **{name: None if value is None else str(value) for name, value in wait.items()},
        "metrics": "1" if metrics else None,
        "log_format": "json" if log_format == "json" else None,
    }
    for name, value in settings.items():
        if value:
            os.environ[ENV[name]] = value
        else:
            os.environ.pop(ENV[name], None)
    # Fail here, once, with a clear message rather than in every worker: the key file, the
    # policy and the app are loaded once (no store, no audit log opened).
    rights, limits = load_scheduling(policy_path)
    policy = load_policy(policy_path)
    key_ring = load_key_ring(key_file)
    build_server(
        key_ring.current,
        policy=policy,
        app=app,
        key_ring=key_ring,
        priority_rights=rights,
        limits=limits,
        url=url,
        shared_store=bool(redis_url),
    )
    extra: dict[str, Any] = {}
    if log_format == "json":
        from a2a_secure.telemetry.logs import log_config  # noqa: PLC0415

        extra["log_config"] = log_config(log_level)
    with _metrics_dir(metrics and workers > 1):
        uvicorn.run(
            FACTORY,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            ssl_certfile=os.fspath(tls_cert) if tls_cert is not None else None,
            ssl_keyfile=os.fspath(tls_key) if tls_key is not None else None,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            **extra,
        )


@contextlib.contextmanager
def _metrics_dir(wanted: bool) -> Iterator[None]:
    """``PROMETHEUS_MULTIPROC_DIR`` for the workers, set before any of them starts.

    Values left from an earlier run would be added to this run's: a directory the operator
    named is emptied first, and one made here is removed at the end.
    """
    if not wanted:
        yield
        return
    from a2a_secure.telemetry.metrics import MULTIPROC_ENV  # noqa: PLC0415

    given = os.environ.get(MULTIPROC_ENV)
    if given:
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield
        return
    path = tempfile.mkdtemp(prefix="a2a-secure-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)
