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

__all__ = ["PROG", "Builder", "Handler", "Subparsers", "add_command_group", "print_json", "subcommand"]

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
