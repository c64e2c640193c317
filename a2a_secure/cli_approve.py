"""``a2a-secure approve``: a person reads a pending action and signs its approval, or not."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from a2a_secure.cli_identity import add_key_options, key_source
from a2a_secure.cli_peers import add_address_options, address_policy, registry_for
from a2a_secure.cli_registry import Subparsers, _fail, iso_time, print_json, subcommand
from a2a_secure.identity.sources import load_identity
from a2a_secure.terminal import printable, printable_json

if TYPE_CHECKING:
    from a2a_secure.client.approval import ActionDetails

__all__ = ["show_action"]


@subcommand("approve")
def build_approve(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "approve",
        help="approve (or reject) an action an agent is waiting to run",
        description=(
            "Read the pending action, check that its data hashes to its action_hash, print it"
            " (control characters escaped), and ask; only a 'y' typed on the terminal signs the"
            " approval (or, with --reject, the rejection) with the key file: the action runs"
            " once, with the data shown (PROTOCOL.md §12). Without a terminal on stdin it signs"
            " nothing unless --yes is given."
        ),
    )
    add_key_options(parser, "the approver's own key file")
    parser.add_argument("--to", required=True, metavar="DID|NAME", help="the agent's DID or registry name")
    parser.add_argument("--action-id", required=True, metavar="ID", help="the action_id the agent answered")
    parser.add_argument("--reject", action="store_true", help="reject the action instead")
    parser.add_argument(
        "--yes",
        action="store_true",
        help="sign without asking (scripts): the action is still printed, but nobody confirms it",
    )
    parser.add_argument("--endpoint", metavar="URL", help="the agent's base URL")
    parser.add_argument("--registry", metavar="FILE", help="agent_registry.json")
    parser.add_argument("--ca-bundle", metavar="FILE", help="CA bundle to verify the agent's certificate")
    add_address_options(parser)
    parser.set_defaults(handler=approve)


def approve(args: argparse.Namespace) -> int:
    from a2a_secure.agent import A2AAgent  # noqa: PLC0415

    # Approval is a person's decision: whoever runs this with stdin from /dev/null or a pipe
    # has not seen the action, so nothing is signed unless they said so with --yes.
    if not args.yes and (sys.stdin is None or not sys.stdin.isatty()):
        _fail("stdin is not a terminal, so nobody can confirm: nothing signed (--yes signs without asking)")
        return 1
    identity = load_identity(key_source(args))
    registry, target = registry_for(args)

    async def run() -> Any:
        async with A2AAgent(
            identity.agent_id,
            identity,
            registry=registry,
            verify=args.ca_bundle or True,
            addresses=address_policy(args),
        ) as agent:
            details = await agent.pending_action(target, args.action_id)
            show_action(details)
            if not args.yes and not confirm("Reject" if args.reject else "Approve and run"):
                return None
            return await agent.approve(
                target, args.action_id, approved=not args.reject, action_hash=details.action_hash
            )

    outcome = asyncio.run(run())
    if outcome is None:
        _fail("not confirmed: nothing signed")
        return 1
    if outcome.approved:
        print("approved; the action ran once. Its result:")
        print_json(outcome.result)
    else:
        print("rejected; the action will not run")
    return 0


def show_action(details: ActionDetails) -> None:
    """Print a pending action as its approver must see it: the data that will run, escaped."""
    # Every member but the hash (checked against the data) is the server's or the caller's
    # text: a preview holding ESC[8m would hide the data line after it.
    preview = details.preview
    preview_text = preview if isinstance(preview, str) else printable_json(preview, indent=None)
    print(f"action:   {printable(details.action)} (asked by {printable(details.caller_did)})")
    if details.principal is not None:  # asked under a delegation chain (PROTOCOL.md §12.7)
        print(f"for:      {printable(details.principal)} (the chain's principal)")
    print(f"preview:  {printable(preview_text)}  (the server's words; the data below is what runs)")
    print(f"data:     {printable_json(details.action_data, indent=None)}")
    print(f"hash:     {details.action_hash} (checked against the data)")
    print(f"state:    {printable(details.state)}, expires at {iso_time(details.expires_at)}")


def confirm(verb: str) -> bool:
    """Ask on the terminal; only "y" or "yes" is a yes (end of input is a no)."""
    print(f"{verb} this action, with the data shown above? [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")
