"""The ``a2a-secure`` command.

Subcommands live in a registry (:mod:`a2a_secure.cli_registry`): a builder adds its
parser to the top-level subparsers and sets ``handler`` (a function of the parsed arguments
returning the exit code). A new subcommand is one decorated builder
(``add_command_group`` makes a command with subcommands of its own, like ``did show``)::

    @subcommand("serve")
    def _build_serve(subparsers: Subparsers) -> None:
        parser = subparsers.add_parser("serve", help="...")
        parser.set_defaults(handler=_serve)

Exit codes: 0 success, 1 a user error (an :class:`~a2a_secure.errors.A2AError` or an
unusable file: one line on stderr, never a traceback), 2 a usage error (argparse), 130
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from a2a_secure import __version__
from a2a_secure.cli_identity import add_key_options, key_source
from a2a_secure.cli_peers import add_address_options, address_policy, chain_arg, registry_for
from a2a_secure.cli_registry import (
    _SUBCOMMANDS,
    PROG,
    Handler,
    Subparsers,
    _fail,
    add_command_group,
    check_did_arg,
    print_json,
    subcommand,
)
from a2a_secure.errors import A2AError
from a2a_secure.identity.did import did_web_document, did_web_to_url
from a2a_secure.identity.keys import Identity, public_key_entry
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.identity.sources import load_identity, load_key_ring
from a2a_secure.telemetry import tracing
from a2a_secure.terminal import printable

if TYPE_CHECKING:
    pass

__all__ = ["Handler", "Subparsers", "add_command_group", "build_parser", "main", "print_json", "subcommand"]

DEFAULT_AGENT_ID = "a2a-agent"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="DID-authenticated handshakes and signed intents between agents."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for builder in _SUBCOMMANDS.values():
        builder(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        # A command group without its subcommand ("a2a-secure did"): show its usage.
        usage_parser: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
        usage_parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except A2AError as exc:
        _fail(cli_words(exc.message, args))
    except OSError as exc:
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    except KeyboardInterrupt:
        return 130
    return 1


# The SDK's errors speak of its own parameters; on the command line each is named by the flag
# a person types (the opt-in is only suggested where the command has it).
_FLAG_HINTS = (
    ("pass overwrite=True", "allow_force", lambda m: m.replace("pass overwrite=True", "add --force")),
    ("in development mode", "allow_loopback_dev", lambda m: f"{m} (add --allow-loopback-dev)"),
    (
        "it needs an explicit opt-in",
        "allow_address",
        lambda m: m.replace("it needs an explicit opt-in", "add --allow-address NET or --allow-host NAME"),
    ),
)


def cli_words(message: str, args: argparse.Namespace) -> str:
    """``message`` with the SDK's words for an option replaced by the command's flag."""
    for phrase, option, rewrite in _FLAG_HINTS:
        if phrase in message and hasattr(args, option):
            message = rewrite(message)
    return message


# -- keygen ---------------------------------------------------------------------------------------


@subcommand("keygen")
def _build_keygen(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="generate an Ed25519 identity (did:key)",
        description=(
            "Generate an Ed25519 identity. With --out, write a key file (mode 0600); without it,"
            " print an A2A_PRIVATE_KEY=... line. The DID is always the last line of output."
        ),
    )
    parser.add_argument("--out", metavar="FILE", help="key file to write (mode 0600)")
    parser.add_argument(
        "--key-uri",
        metavar="URI",
        help="generate the key inside this PKCS#11 token instead (RFC 7512 URI with object=LABEL):"
        " sensitive, never extractable; the token's PIN as for every --key-uri",
    )
    parser.add_argument(
        "--agent-id",
        default=DEFAULT_AGENT_ID,
        help=f"agent id stored in the key file (default {DEFAULT_AGENT_ID})",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing key file (default: refuse)")
    parser.set_defaults(handler=_keygen, allow_force=True)


def _keygen(args: argparse.Namespace) -> int:
    if args.key_uri is not None:
        if args.out is not None:
            _fail("--out and --key-uri are two places for one key: give one")
            return 2
        from a2a_secure.identity.pkcs11 import generate_token_identity  # noqa: PLC0415 - pkcs11 extra
        from a2a_secure.identity.pkcs11_uri import Pkcs11Uri  # noqa: PLC0415

        uri = Pkcs11Uri.parse(args.key_uri)
        identity = generate_token_identity(uri)
        print(f"key: {uri.without_secrets()} (generated in the token, not extractable)")
        print(f"kid: {identity.kid}")
        print(identity.did)
        return 0
    identity = Identity.generate(args.agent_id)
    if args.out is None:
        print("a2a-secure: keep A2A_PRIVATE_KEY secret; anyone who has it is this agent", file=sys.stderr)
        print(f"A2A_PRIVATE_KEY={identity.private_key_b64u()}")
    else:
        identity.save(args.out, overwrite=args.force)
        print(f"key file: {args.out} (mode 0600)")
        print(f"kid: {identity.kid}")
    print(identity.did)
    return 0


# -- did show / document / resolve ----------------------------------------------------------------


@subcommand("did")
def _build_did(subparsers: Subparsers) -> None:
    did = add_command_group(subparsers, "did", "show, publish and resolve DIDs")

    show = did.add_parser("show", help="print the DID, key id and public key entry of a key file")
    add_key_options(show, "the key file (a2a-secure keygen --out)")
    show.set_defaults(handler=_did_show)

    document = did.add_parser(
        "document", help="print the did:web DID document (did.json) for a key file's key"
    )
    add_key_options(document, "the key file whose key to publish")
    document.add_argument("--did-web", required=True, metavar="DID", help="the did:web DID to publish")
    document.add_argument("--fragment", default="key-1", help="fragment of the key id (default key-1)")
    document.add_argument(
        "--endpoint", metavar="URL", help="the agent's base URL, published as an A2ASecureAgent service"
    )
    document.set_defaults(handler=_did_document)

    resolve = did.add_parser("resolve", help="resolve a DID and print its authentication keys")
    resolve.add_argument("did", metavar="DID", help="a did:key or did:web DID")
    resolve.add_argument(
        "--allow-loopback-dev",
        action="store_true",
        help="development only: allow did:web on localhost/loopback, over plain HTTP",
    )
    resolve.add_argument("--ca-bundle", metavar="FILE", help="CA bundle for did:web (default: certifi)")
    resolve.add_argument("--timeout", type=float, default=5.0, help="did:web deadline in seconds (default 5)")
    resolve.set_defaults(handler=_did_resolve)


def _did_show(args: argparse.Namespace) -> int:
    identity = load_identity(key_source(args))
    print_json(
        {
            "agent_id": identity.agent_id,
            "did": identity.did,
            "kid": identity.kid,
            "public_key_entry": identity.public_key_entry(),
        }
    )
    return 0


def _did_document(args: argparse.Namespace) -> int:
    if not args.did_web.startswith("did:web:"):
        _fail(f"--did-web {args.did_web[:80]!r} is not a did:web DID (did:web:agents.example.com)")
        return 1
    check_did_arg(args.did_web, "--did-web")
    ring = load_key_ring(key_source(args))
    identity = ring.current
    if identity.did == args.did_web:  # a rotated did:web key file: retired keys are listed too
        document = ring.did_document(endpoint=args.endpoint)
    else:
        document = did_web_document(args.did_web, identity.public_key, args.fragment, endpoint=args.endpoint)
    print(f"a2a-secure: serve this at {did_web_to_url(args.did_web)}", file=sys.stderr)
    print_json(document)
    return 0


def _make_resolver(args: argparse.Namespace) -> DIDResolver:
    if not args.did.startswith("did:web:"):
        return DIDResolver()
    # Imported here: did:web pulls in httpx and TLS setup that did:key never needs.
    from a2a_secure.identity.didweb import make_resolver  # noqa: PLC0415

    return make_resolver(
        timeout=args.timeout,
        verify=args.ca_bundle,
        dev_allow_loopback=args.allow_loopback_dev,
        dev_allow_http=args.allow_loopback_dev,
    )


def _did_resolve(args: argparse.Namespace) -> int:
    check_did_arg(args.did, "the DID")
    resolver = _make_resolver(args)
    resolved: ResolvedDID = asyncio.run(resolver.resolve(args.did))
    out: dict[str, Any] = {
        "did": resolved.did,
        "public_keys": [public_key_entry(kid, key) for kid, key in resolved.keys.items()],
    }
    if resolved.services:
        out["services"] = [dict(service) for service in resolved.services]
    print_json(out)
    return 0


# -- serve / call / demo / audit ----------------------------------------------------------------


# serve registers here, so that the help lists it after did and before call.
from a2a_secure import cli_serve  # noqa: E402, F401


@subcommand("call")
def _build_call(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("call", help="send one signed intent and print the verified result")
    add_key_options(parser, "the caller's key file")
    parser.add_argument("--to", required=True, metavar="DID|NAME", help="the agent's DID or registry name")
    parser.add_argument("--endpoint", metavar="URL", help="the agent's base URL")
    parser.add_argument("--registry", metavar="FILE", help="agent_registry.json")
    parser.add_argument("--goal", required=True, help="the intent's goal (an intent the agent's card lists)")
    parser.add_argument("--domain", help="the intent's optional domain (default: none)")
    parser.add_argument(
        "--inputs", default="{}", metavar="JSON", help="intent inputs, a JSON object (default {})"
    )
    parser.add_argument("--ca-bundle", metavar="FILE", help="CA bundle to verify the agent's certificate")
    parser.add_argument(
        "--priority",
        type=_priority_arg,
        metavar="N",
        help="intent priority 1-5 (default 3), within the rights the agent gives this caller",
    )
    parser.add_argument(
        "--sealed",
        action="store_true",
        help="require sealed intents (PROTOCOL.md §12.6): refuse an agent that does not declare them"
        " instead of sending the inputs in the clear (without it they are sealed when declared)",
    )
    parser.add_argument(
        "--on-behalf-of", metavar="FILE", help="act under this delegation chain (a2a-secure delegate)"
    )
    add_address_options(parser)
    parser.set_defaults(handler=_call)


def _priority_arg(text: str) -> int:
    # PROTOCOL.md §12.3: an integer 1-5 written as one ("5", not "5.0", "+5" or "05").
    if text not in ("1", "2", "3", "4", "5"):
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 5, not {text!r}")
    return int(text)


def _call(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415

    from a2a_secure.agent import A2AAgent  # noqa: PLC0415
    from a2a_secure.identity import encoding  # noqa: PLC0415

    identity = load_identity(key_source(args))
    try:
        inputs = encoding.loads(args.inputs.encode())
    except A2AError as exc:
        _fail(
            f"--inputs is not valid JSON ({exc.message.removeprefix('not I-JSON: ')}): give an object,"
            """ e.g. --inputs '{"text": "hi"}'"""
        )
        return 1
    if not isinstance(inputs, dict):
        _fail('--inputs must be a JSON object, e.g. --inputs \'{"text": "hi"}\'')
        return 1
    intent: dict[str, Any] = {"goal": args.goal, "inputs": inputs}
    if args.domain:
        intent["domain"] = args.domain
    registry, target = registry_for(args)
    chain = chain_arg(args)

    async def run() -> Any:
        async with A2AAgent(
            identity.agent_id,
            identity,
            registry=registry,
            verify=args.ca_bundle or True,
            addresses=address_policy(args),
            sealed=True if args.sealed else None,
            on_behalf_of=chain,
        ) as a:
            return await a.request(target, intent, priority=args.priority)

    # A script's trace goes on: OpenTelemetry's TRACEPARENT/TRACESTATE variables are the
    # parent of this call (OTEL_EXPORTER_OTLP_* asks for its spans to be exported).
    tracing.configure_from_env("a2a-secure-call")
    try:
        with tracing.continue_env_trace():
            result = asyncio.run(run())
    finally:
        tracing.shutdown()
    print_json(result)
    return 0


@subcommand("demo")
def _build_demo(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="run three example agents and an orchestrator on loopback, then verify the audit logs"
    )
    parser.add_argument(
        "--out",
        "--keep-logs",
        dest="keep_logs",
        metavar="DIR",
        help="keep the audit logs (and with --trace events.jsonl) in DIR (default: a temporary"
        " folder, removed at the end without --trace, kept and named with it)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also trace every call (printed as a tree), count metrics and write JSON event lines"
        " (needs: pip install 'a2a-secure[otel,metrics]'; default off)",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from a2a_secure.demo import main as demo_main  # noqa: PLC0415 - server extra

    return demo_main(args.keep_logs, trace=args.trace)


@subcommand("audit")
def _build_audit(subparsers: Subparsers) -> None:
    audit = add_command_group(subparsers, "audit", "check audit logs")
    verify = audit.add_parser("verify", help="re-compute an audit log's hash chain and checkpoints")
    verify.add_argument("file", metavar="FILE", help="the JSON Lines audit log")
    verify.add_argument("--did", help="the writing agent's did:key, to verify checkpoint signatures")
    verify.add_argument("--checkpoint", metavar="TOKEN", help="a checkpoint token kept elsewhere")
    verify.set_defaults(handler=_audit_verify)


def _audit_verify(args: argparse.Namespace) -> int:
    from a2a_secure.audit import run_audit_verify  # noqa: PLC0415

    code, message = run_audit_verify(args.file, args.did, anchor=args.checkpoint)
    # The reason for a broken line quotes the log, which holds what peers sent.
    print(printable(message), file=sys.stdout if code == 0 else sys.stderr)
    return code


# -- mcp ------------------------------------------------------------------------------------------


@subcommand("mcp")
def _build_mcp(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve the registry's agents as MCP tools (needs the mcp extra)",
        description=(
            "Serve one MCP tool per (registry agent, intent). Every call is a DID-authenticated"
            " handshake and a signed intent; the answer is verified before the model sees it."
            " Install with: pip install 'a2a-secure[mcp]'."
        ),
    )
    add_key_options(parser, "this client's key file")
    parser.add_argument("--registry", required=True, metavar="FILE", help="agent_registry.json")
    parser.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="how the MCP client connects (default stdio)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="http transport: loopback address to bind (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8765, help="http transport: port (default 8765)")
    parser.add_argument("--ca-bundle", metavar="FILE", help="CA bundle to verify the agents' certificates")
    parser.add_argument(
        "--on-behalf-of",
        metavar="FILE",
        help="act for a person under this delegation chain: only the tools it covers are offered",
    )
    parser.add_argument(
        "--sealed",
        action="store_true",
        help="require sealed intents (PROTOCOL.md §12.6): an agent that does not declare them is not"
        " offered, and a call of its tools is an error; nothing goes to it in the clear (without it"
        " calls are sealed with every agent that declares them)",
    )
    add_address_options(parser)
    parser.set_defaults(handler=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    try:
        from a2a_secure import mcp_server  # noqa: PLC0415 - optional extra
    except ImportError:
        _fail("the mcp command needs the MCP SDK: pip install 'a2a-secure[mcp]'")
        return 2
    from a2a_secure.agent import A2AAgent, AgentRegistry  # noqa: PLC0415
    from a2a_secure.client.endpoint import _is_loopback  # noqa: PLC0415

    if args.transport == "http" and not _is_loopback(args.host):
        # The MCP HTTP transport has no caller authentication here: anyone who reaches it
        # could make this agent sign intents. Keep it on this machine.
        _fail("--host must be a loopback address: the MCP HTTP endpoint does not authenticate callers")
        return 2
    if args.transport == "http":
        try:
            mcp_server.http_security(args.host, args.port)
        except ValueError as exc:
            _fail(str(exc))
            return 2
    identity = load_identity(key_source(args))
    addresses = address_policy(args)
    registry = AgentRegistry.load(args.registry, addresses=addresses)
    agent = A2AAgent(
        identity.agent_id,
        identity,
        registry=registry,
        verify=args.ca_bundle or True,
        addresses=addresses,
        on_behalf_of=chain_arg(args),
        sealed=True if args.sealed else None,
    )
    mcp_server.configure_logging()
    tracing.configure_from_env("a2a-secure-mcp")  # OTEL_EXPORTER_OTLP_* asks for traces
    if args.transport == "stdio":
        asyncio.run(mcp_server.run_stdio(agent))
    else:
        asyncio.run(mcp_server.run_http(agent, args.host, args.port))
    return 0


# The key lifecycle commands (key rotate, revoke), delegate and approve register themselves on import.
from a2a_secure import cli_approve, cli_delegate, cli_keys  # noqa: E402, F401
