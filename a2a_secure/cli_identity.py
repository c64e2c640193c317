"""The key options every command that signs takes: ``--key-file FILE`` or ``--key-uri URI``."""

from __future__ import annotations

import argparse

__all__ = ["add_key_options", "key_source"]

_URI_HELP = (
    "a key held in a PKCS#11 token (RFC 7512), e.g. 'pkcs11:token=a2a;object=agent;type=private"
    "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin'; the module path also"
    " from A2A_SECURE_PKCS11_MODULE and the PIN from A2A_SECURE_PKCS11_PIN (needs the pkcs11 extra)"
)


def add_key_options(
    parser: argparse.ArgumentParser,
    file_help: str = "the agent's key file (mode 0600)",
    *,
    required: bool = True,
) -> None:
    """Add the choice of ``--key-file`` or ``--key-uri`` to ``parser`` (one is ``required``)."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--key-file", metavar="FILE", help=file_help)
    group.add_argument("--key-uri", metavar="URI", help=_URI_HELP)


def key_source(args: argparse.Namespace) -> str:
    """The key file's path or the token URI the command was given."""
    return str(args.key_uri if getattr(args, "key_uri", None) else args.key_file)


def key_source_if_given(args: argparse.Namespace) -> str | None:
    """:func:`key_source`, or None when the command was given neither option."""
    if getattr(args, "key_uri", None) is None and getattr(args, "key_file", None) is None:
        return None
    return key_source(args)
