"""The ``a2a-secure`` command's subcommand registry and what every subcommand uses.

A builder registered with :func:`subcommand` adds its parser to the top-level subparsers and
sets ``handler`` (a function of the parsed arguments returning the exit code);
:func:`a2a_secure.cli.build_parser` calls every builder, in the order they registered. The
command's own subcommands (:mod:`a2a_secure.cli`) and the key lifecycle ones
(:mod:`a2a_secure.cli_keys`) both register here, so neither module imports the other's
helpers through it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

from a2a_secure.terminal import printable, printable_json

__all__ = [
    "PROG",
    "Builder",
    "Handler",
    "Subparsers",
    "add_command_group",
    "check_did_arg",
    "iso_time",
    "print_json",
    "subcommand",
]

PROG = "a2a-secure"

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler: TypeAlias = Callable[[argparse.Namespace], int]
Builder: TypeAlias = Callable[[Subparsers], None]

# name -> builder, in the order the help lists them.
_SUBCOMMANDS: dict[str, Builder] = {}


def subcommand(name: str) -> Callable[[Builder], Builder]:
    """Register ``builder`` as the builder of the top-level subcommand ``name``."""

    def register(builder: Builder) -> Builder:
        if name in _SUBCOMMANDS:
            raise ValueError(f"subcommand {name!r} registered twice")
        _SUBCOMMANDS[name] = builder
        return builder

    return register


def _fail(message: str) -> None:
    # Error messages carry peers' words (an agent's error message, a resolver's reason).
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout, every terminal control character escaped."""
    print(printable_json(obj))


def add_command_group(subparsers: Subparsers, name: str, help_text: str) -> Subparsers:
    """Add a command ``name`` with subcommands of its own (``did show``, ``audit verify``).

    Returns the subparsers to add those subcommands to; the group alone prints its help.
    """
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(usage_parser=parser)
    return parser.add_subparsers(title="commands", metavar="COMMAND")


def check_did_arg(value: str, flag: str) -> str:
    """``value``, a DID given as ``flag``; one line saying so if it is not a usable one.

    A did:key is decoded here, so that one cut short when copied is named as such, not met
    later as "multicodec is not ed25519-pub".
    """
    from a2a_secure.errors import A2AError, InvalidParams  # noqa: PLC0415
    from a2a_secure.identity.did import check_did_syntax, public_key_from_did_key  # noqa: PLC0415

    try:
        check_did_syntax(value)
        if value.startswith("did:key:"):
            public_key_from_did_key(value)
    except A2AError as exc:
        raise InvalidParams(
            f"{flag} {value[:80]!r} is not a valid DID ({exc.message}): is it complete? The agent's"
            " serve prints its DID; so does: a2a-secure did show --key-file ITS.key"
        ) from None
    return value


def iso_time(unix_seconds: int | float) -> str:
    """A Unix time as a person reads it: ISO 8601 in UTC (``2026-03-02T10:00:00Z``)."""
    from a2a_secure.identity.rfc3339 import format_rfc3339  # noqa: PLC0415

    return format_rfc3339(int(unix_seconds))
