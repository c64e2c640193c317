"""How a command names the agent it talks to: the registry, ``--to``/``--endpoint``, the
address opt-ins for endpoints read from documents, and ``--on-behalf-of``'s chain.

``call``, ``approve`` and ``mcp`` take these options alike, so they are decided here once.
"""

from __future__ import annotations

import argparse
from typing import Any

from a2a_secure.cli_registry import check_did_arg

__all__ = ["add_address_options", "address_policy", "chain_arg", "registry_for"]


def add_address_options(parser: argparse.ArgumentParser) -> None:
    """The opt-ins of the address policy, for endpoints read from a remote document."""
    group = parser.add_argument_group(
        "addresses",
        "the registry file is yours (any https host, plain http to loopback); an endpoint read"
        " from a did:web document or a card may not point further in than where the document"
        " came from; these let it name more (SECURITY.md, 'Addresses taken from documents')",
    )
    group.add_argument(
        "--allow-loopback-dev",
        action="store_true",
        help="development only: allow localhost and loopback endpoints, over plain HTTP",
    )
    group.add_argument(
        "--allow-address",
        action="append",
        default=[],
        metavar="NET",
        help="a network whose addresses endpoints may name (10.1.0.0/16); repeatable",
    )
    group.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME", help="an internal host name; repeatable"
    )


def address_policy(args: argparse.Namespace) -> Any:
    """The :class:`~a2a_secure.identity.addresses.AddressPolicy` of ``add_address_options``."""
    from a2a_secure.errors import InvalidParams  # noqa: PLC0415
    from a2a_secure.identity.addresses import AddressPolicy  # noqa: PLC0415

    try:
        return AddressPolicy.build(
            allow_hosts=getattr(args, "allow_host", ()),
            allow_addresses=getattr(args, "allow_address", ()),
            dev_allow_loopback=getattr(args, "allow_loopback_dev", False),
        )
    except ValueError:
        raise InvalidParams("--allow-address takes a network such as 10.1.0.0/16") from None


def chain_arg(args: argparse.Namespace) -> Any:
    """The delegation chain of ``--on-behalf-of`` (PROTOCOL.md §12.7), or None."""
    if not args.on_behalf_of:
        return None
    from a2a_secure.cli_delegate import read_chain  # noqa: PLC0415

    return read_chain(args.on_behalf_of)


def registry_for(args: argparse.Namespace) -> tuple[Any, str]:
    """The registry of ``--registry``/``--endpoint`` and the target ``--to`` to look up in it."""
    from a2a_secure.agent import AgentRegistry, RegistryEntry  # noqa: PLC0415

    addresses = address_policy(args)
    registry = AgentRegistry.load(args.registry, addresses=addresses) if args.registry else AgentRegistry()
    target = check_did_arg(args.to, "--to") if args.to.startswith("did:") else args.to
    if args.endpoint:
        did = target if target.startswith("did:") else registry.find(target).did
        # Named as the person gave it: an error then says which agent did not answer.
        registry.add(RegistryEntry(target, did, args.endpoint))
        target = did
    return registry, target
