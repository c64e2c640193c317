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
                            ``max_concurrent_intents`` and ``max_queued_intents`` (per worker),
                            and ``delegation`` (``{goal: [principal DIDs]}``: accept delegation
                            chains, PROTOCOL.md §12.7, and run each goal listed only on behalf
                            of one of its principals; ``{}`` reserves no goal)
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
``A2A_SECURE_CLAIM_LEASE_MARGIN`` ``ServerLimits.claim_lease_margin`` (seconds, at least 1):
                            how long past the handler timeout an ``intent_id`` whose run
                            started and never answered is waited for before a resend is told
                            "outcome unknown" (default 60; a2a_secure.server.timing)
``A2A_SECURE_TEST_CLOCK_DIR`` FOR TESTING ONLY (fault campaigns, scripts/chaos.py): each
                            worker's wall clock is ``time.time()`` plus the seconds written in
                            the file ``<dir>/<pid>`` (:class:`a2a_secure.testing.SteppedClock`)
``A2A_SECURE_APP``          ``module:attr``: an ``AgentServer`` (or an object with a ``server``
                            attribute holding one, like ``A2AAgent``) whose intents are served,
                            or a callable given the ``AgentServer`` to register handlers on
``A2A_SECURE_APP_DIR``      the folder ``A2A_SECURE_APP``'s module is imported from (default:
                            the current folder)

With no ``A2A_SECURE_APP`` the server is the test agent of PROTOCOL.md §11: ``echo`` (result =
inputs unchanged), the streaming ``count``, and each goal the policy's ``delegation`` member
reserves, answered like ``echo``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.rotation import KeyRing
from a2a_secure.identity.sources import is_token_uri, load_key_ring
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.app import AgentServer, public_url
from a2a_secure.server.settings import give_settings, refuse_later
from a2a_secure.server.startup import app_identity, banner, check_port, check_store, check_tls, load_object
from a2a_secure.server.test_agent import register_test_agent
from a2a_secure.server.timing import LEASE_ENV, TIMING_MEMBERS, test_clock, timing_bounds, with_lease
from a2a_secure.store.base import Store
from a2a_secure.store.revocation import FileRevocations, Revocations
from a2a_secure.system import WallClock, wall_now
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

_log = logging.getLogger("a2a_secure.server")

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
    "app_dir": "A2A_SECURE_APP_DIR",
    "revocations": "A2A_SECURE_REVOCATIONS",
    "metrics": "A2A_SECURE_METRICS",
    "log_format": "A2A_SECURE_LOG_FORMAT",
    "claim_lease_margin": LEASE_ENV,
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
    "reserved_callers",
    "reserved_share",
    "delegation",
    *TIMING_MEMBERS,
)


def _read_policy_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ValueError(f"policy file {os.fspath(path)}: no such file")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"policy file {os.fspath(path)}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"policy file {os.fspath(path)}: holds one JSON object, not {type(data).__name__}")
    return data


def load_delegation(path: str | os.PathLike[str] | None) -> DelegationRules | None:
    """The policy file's ``delegation`` member (PROTOCOL.md §12.7), or None when it has none."""
    if not path:
        return None
    data = _read_policy_file(path)
    if "delegation" not in data:
        return None
    try:
        return DelegationRules.from_member(data["delegation"])
    except ValueError as exc:
        raise ValueError(f"policy file {os.fspath(path)}: {exc}") from None


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
    if "reserved_callers" in data:  # reserved capacity (SECURITY.md)
        named = data["reserved_callers"]
        if not isinstance(named, list) or not all(isinstance(d, str) for d in named):
            raise ValueError(f"{path}: reserved_callers must be an array of DIDs")
        bounds["reserved_callers"] = frozenset(named)
    if "reserved_share" in data:
        share = data["reserved_share"]
        if type(share) not in (int, float):
            raise ValueError(f"{path}: reserved_share must be a number from 0 to below 1")
        bounds["reserved_share"] = float(share)
    bounds.update(timing_bounds(data, path))
    try:
        return rights, ServerLimits(**bounds)
    except (ValueError, InvalidParams) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _default_app(server: AgentServer) -> None:
    # Each goal the delegation member reserves is answered like echo (PROTOCOL.md §11), so
    # that implementations can test chains against one another with no app of their own.
    reserved = () if server.delegation is None else server.delegation.required_principals
    register_test_agent(server, echo_goals=reserved)


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
    metrics: bool = False,
    log_requests: bool = False,
    delegation: DelegationRules | None = None,
    app_dir: str | os.PathLike[str] | None = None,
    given_later: Sequence[str] = (),
    clock: WallClock = wall_now,
) -> AgentServer:
    """The ``AgentServer`` of :func:`app_from_env`, from already loaded parts.

    An ``app`` that is an ``AgentServer`` (or holds one in ``server``, like ``A2AAgent``) is
    served as the very object it built, every setting as it set it
    (:mod:`a2a_secure.server.settings`); the settings given here are added where the app left
    them unset, and one given both here and in the app, differently, is a ``ValueError``:
    either choice could fail open; ``given_later`` names settings (``store``, ``audit``) the
    command line will give the workers, refused here already if the app set them. A callable
    ``app`` is given a server built from these
    settings to register its handlers on; no ``app``: the test agent of PROTOCOL.md §11.
    """
    given: dict[str, Any] = {
        "policy": policy,
        "store": store,
        "audit": audit,
        "key_ring": key_ring,
        "revocations": tuple(revocations),
        "priority_rights": priority_rights or PriorityRights(),
        "limits": limits or ServerLimits(),
        "url": url,
        "metrics": metrics,
        "log_requests": log_requests,
        "delegation": delegation,
        "clock": clock,
    }
    obj = load_object(app, app_dir) if app else None
    source = obj if obj is None or isinstance(obj, AgentServer) else getattr(obj, "server", None)
    if isinstance(source, AgentServer):
        if source.identity.did != identity.did:
            raise ValueError(f"app {app!r} has the DID {source.identity.did}, the key file {identity.did}")
        assert app is not None
        refuse_later(source, given_later, app)
        give_settings(source, given, app)
        return source
    server = AgentServer(
        identity,
        name=identity.agent_id,
        description="" if app else "a2a-secure test agent (PROTOCOL.md §11)",
        **given,
    )
    if obj is None:
        _default_app(server)
    elif callable(obj):
        obj(server)
    else:
        raise ValueError(f"--app {app!r} is neither an AgentServer (or A2AAgent) nor a callable")
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
    app_spec = env.get(ENV["app"])
    key_ring: KeyRing | None = None
    if key_file:
        key_ring = load_key_ring(key_file)  # the key, and the retired keys still in their window
        identity = key_ring.current
    elif app_spec:
        identity = app_identity(app_spec, env.get(ENV["app_dir"]) or None)
    else:
        raise ValueError(f"{ENV['key_file']} is not set")
    policy = load_policy(env.get(ENV["policy"]) or None)
    revocation_file = env.get(ENV["revocations"])
    revocations = [FileRevocations(revocation_file)] if revocation_file else []
    rights, limits = load_scheduling(env.get(ENV["policy"]) or None)
    limits = with_lease(limits, env.get(ENV["claim_lease_margin"]))

    store: Store | None = None  # None: the server's own in-memory store (an app's, if it has one)
    redis_url = env.get(ENV["redis_url"])
    if redis_url:
        from a2a_secure.store.redis import RedisStore  # noqa: PLC0415 - redis extra

        store = RedisStore(redis_url, prefix=env.get(ENV["redis_prefix"]) or "a2a:", **_wait_from_env(env))
    else:
        for name in ("redis_wait_replicas", "redis_wait_timeout_ms"):
            if env.get(ENV[name]):  # the operator asked for replication: do not run without it
                raise ValueError(f"{ENV[name]} needs {ENV['redis_url']}")

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
        app_dir=env.get(ENV["app_dir"]) or None,
        key_ring=key_ring,
        revocations=revocations,
        priority_rights=rights,
        limits=limits,
        url=env.get(ENV["url"]) or "",
        metrics=env.get(ENV["metrics"]) == "1",
        log_requests=env.get(ENV["log_format"]) == "json",
        delegation=load_delegation(env.get(ENV["policy"]) or None),
        clock=test_clock(env),
    )
    fastapi_app = server.app()
    fastapi_app.state.agent_server = server

    own = fastapi_app.router.lifespan_context  # the server's own (its session sweep)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        check = getattr(server.store, "check", None)
        if check is not None:  # a Redis that does not answer: said once, naming the URL
            try:
                await check()
            except ConnectionError as exc:
                # Not fatal: a worker the supervisor starts again (after a crash) while Redis
                # restarts must come up and answer 503 until Redis is back; a failed start
                # would stop the whole server. ``serve`` checks Redis before it starts.
                _log.error("%s", exc)
        try:
            async with own(_app):
                yield
        finally:
            with contextlib.suppress(Exception):
                await server.store.aclose()
            if auditor is not None:
                with contextlib.suppress(Exception):
                    auditor.close()
            if server.metrics is not None:  # this worker's live gauges end with it
                from a2a_secure.telemetry.metrics import mark_process_dead  # noqa: PLC0415

                mark_process_dead(os.getpid())

    fastapi_app.router.lifespan_context = lifespan
    return fastapi_app


def serve(
    key_file: str | os.PathLike[str] | None,
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
    claim_lease_margin: int | None = None,
    app_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Run the agent under uvicorn with ``workers`` processes (blocks until stopped).

    ``url`` is the agent's public base URL in its card (PROTOCOL.md §4); None:
    :func:`default_url` of ``host``, ``port`` and TLS.
    ``metrics``: serve Prometheus metrics at ``/metrics``; with several workers in
    ``prometheus_client``'s multiprocess mode, through a directory made for this run (or
    ``PROMETHEUS_MULTIPROC_DIR`` if set, emptied first) and removed when it ends.
    ``log_format``: ``text`` or ``json`` (one object per line, one per answered request).
    ``claim_lease_margin``: ``ServerLimits.claim_lease_margin`` (None: the policy file's, else 60).
    ``app_dir``: the folder ``app``'s module is imported from (default: the current one).

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

    # Fail here, once, with one clear line rather than in every worker, and before uvicorn
    # says "Application startup complete": the app, the key file, the policy, the port and
    # the Redis URL are checked (no store kept open, no audit log opened).
    if tls_cert is not None and tls_key is not None:
        check_tls(tls_cert, tls_key)
    if audit_log is not None and not os.path.isdir(os.path.dirname(os.path.abspath(audit_log))):
        raise ValueError(f"--audit-log {os.fspath(audit_log)}: its folder does not exist")
    if redis_url:
        check_store(redis_url, redis_prefix)
    check_port(host, port)
    rights, limits = load_scheduling(policy_path)
    lease = None if claim_lease_margin is None else str(claim_lease_margin)
    limits = with_lease(limits, lease)
    if key_file is None and app is None:
        raise ServeUsageError("serve needs --key-file or --key-uri (or an --app that holds its own identity)")
    key_ring = load_key_ring(key_file) if key_file is not None else None
    checked = build_server(
        key_ring.current if key_ring is not None else app_identity(str(app), app_dir),
        policy=load_policy(policy_path),
        app=app,
        app_dir=app_dir,
        key_ring=key_ring,
        priority_rights=rights,
        limits=limits,
        url=public_url(url) if url is not None else "",
        delegation=load_delegation(policy_path),
        metrics=metrics,
        log_requests=log_format == "json",
        given_later=[name for name, wanted in (("store", redis_url), ("audit", audit_log)) if wanted],
    )
    if key_file is not None and not is_token_uri(key_file):  # the workers get an absolute path
        key_file = os.path.abspath(key_file)
    # The card's url: --url, else the app's own, else where this server listens.
    url = checked.url or public_url(default_url(host, port, tls=tls_cert is not None))
    settings = {
        "key_file": None if key_file is None else str(key_file),
        "url": url,
        "policy": os.path.abspath(policy_path) if policy_path else None,
        "redis_url": redis_url,
        "redis_prefix": redis_prefix,
        "audit_log": os.path.abspath(audit_log) if audit_log else None,
        "app": app,
        "app_dir": os.path.abspath(app_dir) if app and app_dir is not None else None,
        **{name: None if value is None else str(value) for name, value in wait.items()},
        "metrics": "1" if metrics else None,
        "log_format": "json" if log_format == "json" else None,
        "claim_lease_margin": lease,
    }
    for name, value in settings.items():
        if value:
            os.environ[ENV[name]] = value
        else:
            os.environ.pop(ENV[name], None)
    wildcard = host in ("", "0.0.0.0", "::")  # noqa: S104 - compared, not bound
    reachable = default_url("127.0.0.1" if wildcard else host, port, tls=tls_cert is not None)
    print(banner(checked, reachable), flush=True)
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
