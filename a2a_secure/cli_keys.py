"""``a2a-secure key rotate`` and ``a2a-secure revoke``: the key lifecycle commands.

Registered on the ``a2a-secure`` command (:mod:`a2a_secure.cli`) through its subcommand
registry (:mod:`a2a_secure.cli_registry`). Private keys are never printed. Exit codes: 0
done, 1 a user error, 2 a malformed argument (a revocation target that is neither a DID nor
a key id).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from a2a_secure.cli_identity import add_key_options
from a2a_secure.cli_registry import Subparsers, _fail, add_command_group, iso_time, print_json, subcommand
from a2a_secure.delegation import REVOCATION_PREFIX as TOKEN_PREFIX
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity.rotation import DEFAULT_OVERLAP, KeyRing, parse_duration
from a2a_secure.store.revocation import FileRevocations, Revocations, StoreRevocations, check_target
from a2a_secure.system import wall_now
from a2a_secure.terminal import printable

__all__: list[str] = []


def _auditor(path: str | None, role: Any = "server") -> Any:
    if not path:
        return None
    from a2a_secure.audit import Auditor, JsonlAuditLog  # noqa: PLC0415

    return Auditor([JsonlAuditLog(path)], role=role)


def _statement_path(key_file: str) -> Path:
    """Where ``key rotate`` writes a did:key rotation chain: next to the key file."""
    p = Path(key_file)
    return p.with_name(p.name + ".rotation.json")


# -- key rotate -------------------------------------------------------------------------------


@subcommand("key")
def _build_key(subparsers: Subparsers) -> None:
    key = add_command_group(subparsers, "key", "manage the keys of a key file")
    rotate = key.add_parser(
        "rotate",
        help="replace the key of a key file, keeping the old one for an overlap window",
        description=(
            "Generate a new key for the key file and keep the old one, retired, until the overlap"
            " ends. did:web keeps its DID (the new key gets the next key-N id; 'did document'"
            " lists both, the old one with 'expires'). did:key gets a new DID: the old key signs"
            " a rotation statement, written to KEY_FILE.rotation.json and served at"
            " /.well-known/a2a-rotation.json, that peers follow once."
        ),
    )
    add_key_options(rotate)
    rotate.add_argument(
        "--overlap",
        default=str(DEFAULT_OVERLAP),
        metavar="DURATION",
        help="how long the old key stays valid: seconds or 30m, 24h, 7d (default 24h, at most 90d)",
    )
    rotate.add_argument(
        "--did-web",
        metavar="DID",
        help="the key file's key is published under this did:web DID (as 'did document --did-web'):"
        " keep that DID",
    )
    rotate.add_argument(
        "--fragment", default="key-1", help="with --did-web: the current key's fragment (default key-1)"
    )
    rotate.add_argument("--audit-log", metavar="FILE", help="append a 'rotate' record to this audit log")
    rotate.set_defaults(handler=_key_rotate)


def _key_rotate(args: argparse.Namespace) -> int:
    try:
        overlap = parse_duration(args.overlap)
    except ValueError as exc:
        _fail(str(exc))
        return 2
    if args.key_uri:
        return _key_rotate_in_token(args, overlap)
    ring = KeyRing.load(args.key_file)
    if args.did_web:
        if not ring.current.did.startswith("did:key:") and ring.current.did != args.did_web:
            _fail(f"the key file is for {ring.current.did}, not {args.did_web}")
            return 1
        if ring.current.did.startswith("did:key:"):
            ring = KeyRing(ring.current.with_did_web(args.did_web, f"{args.did_web}#{args.fragment}"))
    now = int(wall_now())
    old = ring.current
    rotated = ring.rotate(overlap=overlap, now=now)
    rotated.save(args.key_file)
    out: dict[str, Any] = {
        "did": rotated.current.did,
        "kid": rotated.current.kid,
        "retired_kid": old.kid,
        "overlap_until": iso_time(now + overlap),
    }
    if rotated.statements != ring.statements:
        path = _statement_path(args.key_file)
        path.write_text(
            json.dumps({"statements": list(rotated.statements)}, indent=2) + "\n", encoding="utf-8"
        )
        out["previous_did"] = old.did
        out["rotation_statement"] = str(path)
    return _rotated(args, old.kid, rotated.current.did, out)


def _rotated(args: argparse.Namespace, old_kid: str, new_did: str, out: dict[str, Any]) -> int:
    """A rotation done: its audit record, if asked for, and what it did, printed."""
    auditor = _auditor(args.audit_log)
    if auditor is not None:
        auditor.record(event="rotate", status="success", client_did=old_kid, server_did=new_did)
        auditor.close()
    print_json(out)
    return 0


def _key_rotate_in_token(args: argparse.Namespace, overlap: int) -> int:
    """``key rotate --key-uri``: the next key is generated in the token, the ring kept there."""
    from a2a_secure.identity.pkcs11_ring import load_token_ring, rotate_token_ring  # noqa: PLC0415

    if args.did_web:
        _fail("--did-web: a key ring kept in a token rotates did:key identities only")
        return 2
    now = int(wall_now())
    old = load_token_ring(args.key_uri, now=now).current
    rotated = rotate_token_ring(args.key_uri, overlap=overlap, now=now)
    out: dict[str, Any] = {
        "did": rotated.current.did,
        "kid": rotated.current.kid,
        "retired_kid": old.kid,
        "overlap_until": iso_time(now + overlap),
        "previous_did": old.did,
        "rotation_statements": list(rotated.statements),
    }
    return _rotated(args, old.kid, rotated.current.did, out)


# -- revoke -------------------------------------------------------------------------------------


@subcommand("revoke")
def _build_revoke(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "revoke",
        help="revoke a DID or key id for every worker (or --list, --undo)",
        description=(
            "Add a DID (all of its keys) or a key id (DID#fragment) to the deny list: it cannot"
            " start a handshake, and its open sessions end at their next intent. A delegation"
            " token id (delegation:<jti>) ends every chain through that link. The list lives"
            " in a file (--file, serve with A2A_SECURE_REVOCATIONS) or in the agent's Redis"
            " (--redis-url and the agent's --redis-prefix)."
        ),
    )
    parser.add_argument(
        "target", nargs="?", metavar="DID|KID|delegation:JTI", help="what to revoke (or --list)"
    )
    parser.add_argument(
        "--reason", default="", help="why (kept with the entry, at most 200 characters; default none)"
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", metavar="FILE", help="a revocation file")
    where.add_argument("--redis-url", metavar="URL", help="the Redis of the agent's workers")
    parser.add_argument("--redis-prefix", default="a2a:", help="the agent's Redis key prefix (default a2a:)")
    parser.add_argument("--list", action="store_true", help="print the deny list")
    parser.add_argument("--undo", action="store_true", help="remove the target from the deny list")
    parser.add_argument(
        "--audit-log", metavar="FILE", help="append a 'revoke'/'unrevoke' record to this audit log"
    )
    parser.set_defaults(handler=_revoke)


async def _resolves(target: str) -> str | None:
    """None when ``target`` resolves (and lists the key id), else why not."""
    from a2a_secure.identity.resolver import DIDResolver  # noqa: PLC0415

    did = target.split("#", 1)[0]
    try:
        resolved = await DIDResolver(timeout=5.0).resolve(did)
    except A2AError as exc:
        return exc.message
    if "#" in target and resolved.key_for(target) is None:
        return "the DID does not list this key id"
    return None


async def _run_revoke(args: argparse.Namespace, revocations: Revocations) -> int:
    if args.list:
        print_json(
            [{**e.to_dict(), "revoked_at": iso_time(e.revoked_at)} for e in await revocations.entries()]
        )
        return 0
    target: str = args.target
    auditor = _auditor(args.audit_log)
    try:
        if args.undo:
            if not await revocations.unrevoke(target):
                print(f"{target} was not revoked")
                return 0
            event = "unrevoke"
            print(f"no longer revoked: {target}")
        else:
            if not await revocations.revoke(target, reason=args.reason):
                print(f"already revoked: {target}")
                return 0
            event = "revoke"
            print(f"revoked: {target}")
            # A delegation token id names no DID to resolve.
            why = None if target.startswith(TOKEN_PREFIX) else await _resolves(target)
            if why is not None:
                # The reason may quote what a did:web host answered.
                print(
                    f"note: {target} is not known here ({printable(why)}); revoked preemptively",
                    file=sys.stderr,
                )
        if auditor is not None:
            auditor.record(event=event, status="success", client_did=target)
    finally:
        if auditor is not None:
            auditor.close()
    return 0


def _revoke(args: argparse.Namespace) -> int:
    if args.list == (args.target is not None):
        _fail("give a DID or key id to revoke, or --list")
        return 2
    if args.target is not None:
        try:
            check_target(args.target)
        except InvalidParams as exc:
            _fail(f"{args.target[:200]!r} is not a DID or a key id: {exc.message}")
            return 2
    if args.file:
        return asyncio.run(_run_revoke(args, FileRevocations(args.file)))

    async def on_redis() -> int:
        from a2a_secure.store.redis import RedisStore  # noqa: PLC0415 - redis extra

        try:
            store = RedisStore(args.redis_url, prefix=args.redis_prefix)
        except ValueError as exc:  # a malformed URL: one clean line (it never quotes the URL)
            _fail(str(exc))
            return 1
        try:
            return await _run_revoke(args, StoreRevocations(store))
        finally:
            await store.aclose()

    return asyncio.run(on_redis())
