"""``a2a-secure serve``: serve an agent over HTTP(S), in one or several worker processes.

The options reach the workers as ``A2A_SECURE_*`` variables (:mod:`a2a_secure.server.run`);
what cannot be used is one line before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from a2a_secure.cli_identity import add_key_options, key_source_if_given
from a2a_secure.cli_registry import Subparsers, _fail, subcommand

__all__: list[str] = []


@subcommand("serve")
def _build_serve(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an agent over HTTP(S)",
        description=(
            "Serve an agent. With no --app it serves the test agent of PROTOCOL.md §11 (an 'echo'"
            " intent) under the given policy (default: all intents, 1000 per hour, one-hour sessions)."
        ),
    )
    add_key_options(
        parser,
        "the agent's key file (its DID); not needed with an --app that holds its own identity",
        required=False,
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="policy JSON (missing members take defaults; 'delegation': {goal: [principal DIDs]}"
        " accepts delegation chains); default: all intents, 1000 per hour, one-hour sessions",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="serve this AgentServer/A2AAgent as it was built, or a callable(server) that registers"
        " handlers (default: the test agent of PROTOCOL.md §11)",
    )
    parser.add_argument(
        "--app-dir",
        metavar="DIR",
        default=".",
        help="the folder --app's module is imported from (default: the current folder)",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="the agent's public base URL, the card's 'url' (default: http[s]://HOST:PORT, "
        "or empty for a wildcard --host)",
    )
    parser.add_argument("--audit-log", metavar="FILE", help="hash-chained JSON Lines audit log")
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="PEM certificate chain: serve HTTPS (default: HTTP)"
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes (default 1; more than 1 needs --redis-url)"
    )
    parser.add_argument(
        "--redis-url",
        metavar="URL",
        help="shared store for sessions and sequences: redis://host:port/db, "
        "redis+cluster://host:port[,host:port], redis+sentinel://host:port[,host:port]/service",
    )
    parser.add_argument("--redis-prefix", metavar="P", help="key prefix in Redis (default a2a:)")
    parser.add_argument(
        "--redis-wait-replicas",
        type=_wait_arg("redis_wait_replicas"),
        metavar="N",
        help="run a new intent only once N replicas acknowledged its sequence (Redis WAIT), "
        "else answer 503; default 0 (off). See SECURITY.md, 'Replication is asynchronous'",
    )
    parser.add_argument(
        "--redis-wait-timeout-ms",
        type=_wait_arg("redis_wait_timeout_ms"),
        metavar="MS",
        help="how long WAIT waits for the replicas, 1-800 ms (default 100)",
    )
    parser.add_argument(
        "--claim-lease-margin",
        type=_lease_arg,
        metavar="S",
        help="seconds past the handler timeout an intent_id whose run started and never "
        "answered is waited for before resends are told 'outcome unknown' (default 60)",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at /metrics (needs the metrics extra; all workers summed)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object per line, one per answered request (no inputs, no tokens); default text",
    )
    parser.set_defaults(handler=_serve)


def _wait_arg(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        from a2a_secure.server.run import wait_setting  # noqa: PLC0415 - server extra

        try:
            return wait_setting(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _lease_arg(text: str) -> int:
    from a2a_secure.server.timing import lease_setting  # noqa: PLC0415 - server extra

    try:
        return lease_setting(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve(args: argparse.Namespace) -> int:
    from a2a_secure.server.run import ServeUsageError, serve  # noqa: PLC0415 - server extra

    try:
        serve(
            key_source_if_given(args),
            host=args.host,
            port=args.port,
            workers=args.workers,
            redis_url=args.redis_url,
            redis_prefix=args.redis_prefix,
            redis_wait_replicas=args.redis_wait_replicas,
            redis_wait_timeout_ms=args.redis_wait_timeout_ms,
            policy_path=args.policy,
            audit_log=args.audit_log,
            app=args.app,
            app_dir=args.app_dir,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            url=args.url,
            metrics=args.metrics,
            log_format=args.log_format,
            claim_lease_margin=args.claim_lease_margin,
        )
    except ServeUsageError as exc:  # arguments that do not go together: a usage error
        _fail(str(exc))
        return 2
    except ValueError as exc:
        _fail(str(exc))
        return 1
    return 0
