"""``a2a-secure delegate``: sign a delegation (PROTOCOL.md §12.7) and write the chain.

``--key-file`` is the issuer: the principal for a new chain, or, with ``--parent``, the
audience of the parent chain's last link, which it narrows by one hop. The chain file is the
JSON array of tokens that ``a2a-secure call --on-behalf-of FILE`` reads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from a2a_secure.cli_identity import add_key_options, key_source
from a2a_secure.cli_registry import Subparsers, _fail, check_did_arg, iso_time, subcommand
from a2a_secure.delegation import MAX_TTL, Chain, issue, load_chain
from a2a_secure.errors import InvalidParams
from a2a_secure.identity.rotation import parse_duration
from a2a_secure.identity.sources import load_identity
from a2a_secure.system import wall_now

__all__ = ["read_chain"]


def read_chain(path: str) -> Chain:
    """The chain in the file ``path`` (``InvalidParams`` naming the file if it is not one)."""
    data = Path(path).read_bytes()
    try:
        return load_chain(data)
    except InvalidParams as exc:
        raise InvalidParams(f"{path}: not a delegation chain: {exc.message}") from None


@subcommand("delegate")
def _build_delegate(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "delegate",
        help="let another DID act on your behalf: sign a delegation and write the chain",
        description=(
            "Sign a delegation (PROTOCOL.md §12.7) from the key file's DID to --to, for the"
            " listed goals, for --ttl, optionally only at the --target agents. With --parent,"
            " add one narrower hop to that chain (the key file must be its audience)."
        ),
    )
    add_key_options(parser, "the issuer's key file")
    parser.add_argument("--to", required=True, metavar="DID", help="the DID that may act")
    parser.add_argument(
        "--goals", metavar="A,B", help="the goals allowed ('*' for all; default: the parent's)"
    )
    parser.add_argument(
        "--ttl", metavar="DURATION", help="e.g. 3600, 30m, 8h, 7d (default 1h, or the parent's end)"
    )
    parser.add_argument(
        "--target", action="append", metavar="DID", help="an agent it may be used at (repeatable)"
    )
    parser.add_argument(
        "--max-priority", type=int, choices=range(1, 6), metavar="N", help="highest priority 1-5"
    )
    parser.add_argument("--parent", metavar="FILE", help="the chain to narrow by one hop")
    parser.add_argument("--out", metavar="FILE", help="where to write the chain (default: stdout)")
    parser.set_defaults(handler=_delegate)


def _delegate(args: argparse.Namespace) -> int:
    identity = load_identity(key_source(args))
    check_did_arg(args.to, "--to")
    for target in args.target or ():
        check_did_arg(target, "--target")
    goals = None if args.goals is None else [g.strip() for g in args.goals.split(",") if g.strip()]
    try:
        ttl = None if args.ttl is None else parse_duration(args.ttl)
    except ValueError as exc:
        _fail(str(exc))
        return 2
    if ttl is not None and not 0 < ttl <= MAX_TTL:
        _fail(f"--ttl must be between 1 s and {MAX_TTL // 86400} days")
        return 2
    now = wall_now()
    if args.parent:
        chain = read_chain(args.parent).further(
            identity,
            to=args.to,
            goals=goals,
            now=now,
            ttl=ttl,
            targets=args.target,
            max_priority=args.max_priority,
        )
    else:
        if not goals:
            _fail("--goals is required for a new chain")
            return 2
        chain = issue(
            identity,
            to=args.to,
            goals=goals,
            ttl=ttl or 3600,
            now=now,
            targets=args.target,
            max_priority=args.max_priority or 5,
        )
    text = chain.dumps() + "\n"
    if args.out:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        leaf = chain.leaf
        print(
            f"{args.out}: {len(chain.links)} link(s) on behalf of {chain.principal}, to {leaf.audience},"
            f" goals {','.join(leaf.goals)}, until {iso_time(leaf.exp)}, token id {leaf.jti}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0
