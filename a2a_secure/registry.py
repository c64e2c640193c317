"""The agent registry: names -> agents (DID, endpoint, capabilities), from a file or code.

:class:`~a2a_secure.agent.A2AAgent` looks its peers up here; the LLM tool catalog
(:mod:`a2a_secure.llm_tools`) lists its agents from here. A registry DID is only a pointer (the
handshake authenticates the agent); an endpoint read from a file the operator points at is
the operator's own choice, as ``--endpoint`` is (https, or plain http to loopback), and one
read from a registry another network served may not point further in than that network
(:func:`a2a_secure.identity.addresses.check_address`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import AddressPolicy, Reach
from a2a_secure.identity.did import check_did_syntax
from a2a_secure.identity.rotation import RotationFollower, verify_rotation_statement
from a2a_secure.system import wall_now

__all__ = [
    "AgentNotFound",
    "AgentRegistry",
    "AmbiguousTarget",
    "RegistryEntry",
    "RegistryEntryError",
    "RegistryError",
]

# The agent's log, where operators (and tests) have always found a skipped entry.
_log = logging.getLogger("a2a_secure.agent")
# How many names an error message lists before it says "and N more".
_LISTED_NAMES = 10


class RegistryError(A2AError):
    """A registry could not be read, or a lookup found no agent, or more than one."""

    code = -32602
    http_status = 400
    default_message = "registry lookup failed"


class AgentNotFound(RegistryError):
    """No agent in the registry has that name, DID, name prefix or capability."""

    default_message = "no agent found"


class AmbiguousTarget(RegistryError):
    """A name prefix or a capability fits several agents; ``matches`` holds their names."""

    default_message = "ambiguous target"

    def __init__(self, message: str | None = None, *, matches: Iterable[str] = ()) -> None:
        self.matches = tuple(matches)
        super().__init__(message)


class RegistryEntryError(RegistryError):
    """One registry entry is malformed; ``entry`` names it and ``member`` the bad member (or None)."""

    default_message = "malformed registry entry"

    def __init__(self, entry: str, member: str | None, problem: str) -> None:
        self.entry = entry
        self.member = member
        where = f"registry entry {entry!r}" + (f": member {member!r}" if member is not None else "")
        super().__init__(f"{where} {problem}")


def _listing(names: Iterable[str]) -> str:
    ordered = sorted(names)
    shown = ", ".join(ordered[:_LISTED_NAMES])
    more = len(ordered) - _LISTED_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """One known agent: its name, DID, endpoint and the goals it offers."""

    name: str
    did: str
    endpoint: str | None = None
    capabilities: tuple[str, ...] = field(default_factory=tuple)
    # The address policy and the document's network the endpoint was taken under, when the
    # registry came from elsewhere (``from_dict(origin=...)``): the client then dials only a
    # checked address of its host (a2a_secure.client.pinning). None: the operator's own.
    taken_under: tuple[AddressPolicy, Reach] | None = field(default=None, compare=False, repr=False)


def _parse_entry(
    label: str, raw: Any, *, named: bool, addresses: AddressPolicy, origin: Reach | None
) -> RegistryEntry:
    """One entry of a registry file; ``named`` when the name is a member (the array form).

    Every form goes through here, so a DID and an endpoint are checked the same way whatever
    the form: the DID's syntax (a registry DID is only a pointer, the handshake authenticates
    the agent) and the endpoint as the word of ``origin`` (None: the operator's own file).
    """
    if not isinstance(raw, dict):
        raise RegistryEntryError(label, None, "must be an object with a 'did' member")
    name = label
    if named:
        member = raw.get("name")
        if not isinstance(member, str) or not member:
            raise RegistryEntryError(label, "name", "must be a non-empty string")
        name = member
    elif not name:
        raise RegistryEntryError(label, None, "needs a non-empty name")
    if "did" not in raw:
        raise RegistryEntryError(name, "did", "is missing")
    did = raw["did"]
    try:
        check_did_syntax(did)
    except A2AError as exc:
        raise RegistryEntryError(name, "did", f"is not usable: {exc.message}") from None
    endpoint = raw.get("endpoint")
    if endpoint is not None:
        if not isinstance(endpoint, str):
            raise RegistryEntryError(name, "endpoint", "must be a string")
        try:
            addresses.check_url(endpoint, what="endpoint", origin=origin)
        except A2AError as exc:
            raise RegistryEntryError(name, "endpoint", f"is not usable: {exc.message}") from None
    caps = raw.get("capabilities", [])
    if not isinstance(caps, list) or not all(isinstance(c, str) and c for c in caps):
        raise RegistryEntryError(name, "capabilities", "must be an array of non-empty strings")
    taken_under = (addresses, origin) if endpoint is not None and origin is not None else None
    return RegistryEntry(name, did, endpoint, tuple(caps), taken_under)


def _raw_entries(data: Any) -> list[tuple[str, Any, bool]]:
    """(label, raw entry, named) for each entry of any registry form."""
    if not isinstance(data, dict):
        raise RegistryError(
            "a registry is a JSON object: {name: {did, endpoint, capabilities}, …} or {'agents': …}"
        )
    if "agents" not in data:
        # The flat form: every top-level member is one agent, named by its key.
        return [(name, raw, False) for name, raw in data.items()]
    # A top-level "agents" member always means the wrapped forms, never an agent named
    # "agents": otherwise one file could mean two different registries.
    agents = data["agents"]
    if isinstance(agents, dict):
        return [(name, raw, False) for name, raw in agents.items()]
    if isinstance(agents, list):
        labels = [
            raw["name"] if isinstance(raw, dict) and isinstance(raw.get("name"), str) else f"#{i}"
            for i, raw in enumerate(agents)
        ]
        return [(label, raw, True) for label, raw in zip(labels, agents, strict=True)]
    raise RegistryError("registry member 'agents' must be an object or an array")


class AgentRegistry:
    """Names → agents, loaded from an ``agent_registry.json`` or built in code.

    Three file forms are read:

    - flat: ``{"translator": {"did": …, "endpoint": …, "capabilities": […]}, …}``;
    - wrapped: ``{"agents": {"translator": {…}, …}}``;
    - array: ``{"agents": [{"name": "translator", "did": …}, …]}``.

    A top-level ``agents`` member always selects one of the last two. A malformed entry is
    skipped, logged as a warning and kept in :attr:`problems`; the others load. A file where
    every entry is malformed raises :class:`RegistryError`. A DID in the registry is only a
    pointer: the handshake still authenticates the agent behind it. A file the operator points
    at is its own choice, as ``--endpoint`` and entries added in code are: its endpoints may
    name loopback or private hosts (https, or plain http to loopback) without an opt-in.
    """

    def __init__(self, entries: Iterable[RegistryEntry] = ()) -> None:
        self._entries: dict[str, RegistryEntry] = {}
        self.problems: tuple[RegistryEntryError, ...] = ()
        """The entries skipped when the registry was read, one error each."""
        # The did:key rotations followed so far (each is followed once).
        self.rotations = RotationFollower()
        for entry in entries:
            self.add(entry)

    def follow_rotation(
        self, statements: Sequence[str] | str, *, now: float | None = None
    ) -> list[RegistryEntry]:
        """Re-pin the entries whose did:key these rotation statements rotate (once each).

        Every statement is verified with the key of the DID it rotates away from, and every
        entry's chain is checked before anything changes (``a2a_secure.identity.rotation``).
        Returns the changed entries; raises (changing nothing) when no entry pins a DID the
        statements rotate, or when a statement is refused.
        """
        tokens = [statements] if isinstance(statements, str) else list(statements)
        t = wall_now() if now is None else now
        olds = {verify_rotation_statement(tok, now=t).did for tok in tokens}
        pinned = sorted({e.did for e in self._entries.values() if e.did in olds})
        if not pinned:
            raise AuthenticationFailed("no registry entry pins a DID that these statements rotate")
        plans = [self.rotations.plan(did, tokens, now=t) for did in pinned]
        changed: list[RegistryEntry] = []
        for did, chain in zip(pinned, plans, strict=True):
            new = self.rotations.commit(chain)
            for name, entry in list(self._entries.items()):
                if entry.did == did:
                    self._entries[name] = replace(entry, did=new)
                    changed.append(self._entries[name])
        return changed

    def add(self, entry: RegistryEntry) -> None:
        """Add or replace an entry (by name)."""
        check_did_syntax(entry.did)
        self._entries[entry.name] = entry

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, addresses: AddressPolicy | None = None) -> AgentRegistry:
        """Read a registry file (any of the forms of :class:`AgentRegistry`).

        The file is the operator's: its endpoints are its own choice (``addresses`` matters
        only to :meth:`from_dict` with an ``origin``).
        """
        p = Path(path)
        try:
            data = encoding.loads(p.read_bytes(), error=RegistryError)
        except FileNotFoundError:
            raise RegistryError(f"registry file not found: {p}") from None
        except OSError as exc:
            raise RegistryError(f"cannot read registry file {p}: {exc.strerror or exc}") from None
        except RegistryError as exc:
            raise RegistryError(f"registry file {p} is not JSON: {exc.message}") from None
        try:
            return cls.from_dict(data, addresses=addresses)
        except RegistryError as exc:
            raise RegistryError(f"registry file {p}: {exc.message}") from None

    @classmethod
    def from_dict(
        cls, data: Any, *, addresses: AddressPolicy | None = None, origin: Reach | None = None
    ) -> AgentRegistry:
        """A registry from its JSON form (see :class:`AgentRegistry`).

        ``origin``: None for the operator's own (a file it points at); else the network the
        data came from, whose endpoints may then point no further in, unless ``addresses``
        opts them in (:func:`a2a_secure.identity.addresses.check_address`).
        """
        policy = addresses or AddressPolicy()
        registry = cls()
        problems: list[RegistryEntryError] = []
        raw_entries = _raw_entries(data)
        for label, raw, named in raw_entries:
            try:
                entry = _parse_entry(label, raw, named=named, addresses=policy, origin=origin)
                if entry.name in registry._entries:
                    raise RegistryEntryError(entry.name, "name", "is used by an earlier entry")
            except RegistryEntryError as exc:
                problems.append(exc)
                continue
            registry._entries[entry.name] = entry
        if problems and not registry._entries:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise RegistryError(f"no usable agent: {problems[0].message}{more}")
        for problem in problems:
            _log.warning("skipped %s", problem.message)
        registry.problems = tuple(problems)
        return registry

    def entries(self) -> list[RegistryEntry]:
        """All entries, by name."""
        return [self._entries[k] for k in sorted(self._entries)]

    def by_did(self, did: str) -> RegistryEntry | None:
        """The entry whose DID is ``did``, if exactly one has it."""
        matches = [e for e in self._entries.values() if e.did == did]
        return matches[0] if len(matches) == 1 else None

    def find(self, target: str) -> RegistryEntry:
        """The one agent ``target`` designates.

        In order: the agent named ``target``; else the agent whose DID is ``target``; else the
        agents whose name starts with ``target`` or that offer the goal ``target``, which must
        be exactly one. Raises :class:`AgentNotFound` or :class:`AmbiguousTarget`, whose
        messages name the candidates.
        """
        exact = self._entries.get(target)
        if exact is not None:
            return exact
        matches = [e for e in self._entries.values() if e.did == target]
        if not matches and target:
            matches = [
                e for e in self._entries.values() if e.name.startswith(target) or target in e.capabilities
            ]
        if not matches:
            known = f"known agents: {_listing(self._entries)}" if self._entries else "the registry is empty"
            raise AgentNotFound(f"No agent found matching {target!r} ({known})")
        if len(matches) > 1:
            names = [e.name for e in matches]
            raise AmbiguousTarget(
                f"Ambiguous target {target!r} (matches {_listing(names)}): use a full name or a DID",
                matches=sorted(names),
            )
        return matches[0]
