"""``A2AAgent``: the high-level API. One object both calls peers and hosts its own intents::

async with A2AAgent("orchestrator", identity, registry="agent_registry.json") as agent:
    text = await agent.request("translator", {"goal": "translate", "inputs": {...}})
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import A2AError, InvalidParams
from a2a_secure.identity import encoding
from a2a_secure.identity.did import A2A_SERVICE_TYPE, check_did_syntax
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver
from a2a_secure.protocol.client import ClientSession, IntentResult
from a2a_secure.protocol.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.server import AuditHook

if TYPE_CHECKING:
    from fastapi import FastAPI

    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.base import Store

__all__ = ["A2AAgent", "AgentRegistry", "RegistryEntry", "RegistryError"]

SERVICE_TYPE = A2A_SERVICE_TYPE


class RegistryError(A2AError):
    """A registry lookup found no agent, or more than one."""

    code = -32602
    http_status = 400
    default_message = "registry lookup failed"


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """One known agent: its name, DID, endpoint and the goals it offers."""

    name: str
    did: str
    endpoint: str | None = None
    capabilities: tuple[str, ...] = field(default_factory=tuple)


class AgentRegistry:
    """Names → agents, loaded from an ``agent_registry.json`` or built in code.

    The file is ``{"agents": {"translator": {"did": …, "endpoint": …, "capabilities": […]}}}``
    (a list of objects with a ``name`` member is accepted too). A DID in the registry is
    only a pointer: the handshake still authenticates the agent behind it.
    """

    def __init__(self, entries: Iterable[RegistryEntry] = ()) -> None:
        self._entries: dict[str, RegistryEntry] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: RegistryEntry) -> None:
        """Add or replace an entry (by name)."""
        check_did_syntax(entry.did)
        self._entries[entry.name] = entry

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AgentRegistry:
        """Read a registry file."""
        p = Path(path)
        try:
            data = encoding.loads(p.read_bytes(), error=RegistryError)
        except OSError:
            raise RegistryError(f"registry file not found: {p}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> AgentRegistry:
        """A registry from its JSON form."""
        agents = data.get("agents") if isinstance(data, dict) else None
        if isinstance(agents, dict):
            items = [{"name": k, **v} for k, v in agents.items() if isinstance(v, dict)]
        elif isinstance(agents, list):
            items = [a for a in agents if isinstance(a, dict)]
        else:
            raise RegistryError("registry needs an 'agents' object or array")
        entries = []
        for item in items:
            name, did = item.get("name"), item.get("did")
            if not isinstance(name, str) or not isinstance(did, str):
                raise RegistryError("every registry agent needs a name and a did")
            endpoint = item.get("endpoint")
            caps = item.get("capabilities", [])
            if endpoint is not None and not isinstance(endpoint, str):
                raise RegistryError(f"agent {name!r}: endpoint must be a string")
            if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                raise RegistryError(f"agent {name!r}: capabilities must be strings")
            entries.append(RegistryEntry(name, did, endpoint, tuple(caps)))
        return cls(entries)

    def entries(self) -> list[RegistryEntry]:
        """All entries, by name."""
        return [self._entries[k] for k in sorted(self._entries)]

    def find(self, target: str) -> RegistryEntry:
        """The one agent named ``target``, with DID ``target``, or offering goal ``target``."""
        if target in self._entries:
            return self._entries[target]
        by_did = [e for e in self._entries.values() if e.did == target]
        matches = by_did or [e for e in self._entries.values() if target in e.capabilities]
        if not matches:
            raise RegistryError(f"No agent found matching '{target}'")
        if len(matches) > 1:
            names = ", ".join(sorted(e.name for e in matches))
            raise RegistryError(f"Ambiguous target '{target}' (matches {names})")
        return matches[0]


class A2AAgent:
    """An agent that calls peers over DID-authenticated sessions and can host intents."""

    def __init__(
        self,
        agent_id: str,
        identity: Identity | None = None,
        *,
        endpoint: str | None = None,
        registry: AgentRegistry | str | os.PathLike[str] | None = None,
        policy: Policy = DEFAULT_POLICY,
        store: Store | None = None,
        resolver: DIDResolver | None = None,
        audit: AuditHook | None = None,
        verify: Any = True,
        retry: RetryPolicy | None = None,
        accept_policy: Callable[[Policy], bool] | None = None,
        description: str = "",
    ) -> None:
        self.agent_id = agent_id
        self.identity = identity or Identity.generate(agent_id)
        self.endpoint = endpoint
        if registry is None or isinstance(registry, AgentRegistry):
            self.registry = registry or AgentRegistry()
        else:
            self.registry = AgentRegistry.load(registry)
        self.resolver = resolver or DIDResolver()
        self._audit = audit
        self.client = A2AClient(
            self.identity,
            resolver=self.resolver,
            verify=verify,
            retry=retry,
            accept_policy=accept_policy,
            audit=audit,
        )
        self._policy = policy
        self._store = store
        self._description = description
        self._server: AgentServer | None = None
        self._sessions: dict[str, ClientSession] = {}

    def __repr__(self) -> str:
        return f"A2AAgent(agent_id={self.agent_id!r}, did={self.identity.did!r})"

    @property
    def did(self) -> str:
        """This agent's DID."""
        return self.identity.did

    async def __aenter__(self) -> A2AAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every open session and the HTTP client."""
        self._sessions.clear()
        await self.client.aclose()

    # -- calling peers ---------------------------------------------------------------------
    async def _locate(self, target: str) -> tuple[str, str | None]:
        entry: RegistryEntry | None = None
        if target.startswith("did:"):
            try:
                entry = self.registry.find(target)
            except A2AError:
                entry = None
            did = target
        else:
            entry = self.registry.find(target)
            did = entry.did
        endpoint = entry.endpoint if entry is not None else None
        if endpoint is None and did.startswith("did:web:"):
            resolved = await self.resolver.resolve(did)
            for service in resolved.services:
                ep = service.get("serviceEndpoint")
                if service.get("type") == SERVICE_TYPE and isinstance(ep, str):
                    endpoint = ep
                    break
        return did, endpoint

    async def request(self, target: str, intent: Mapping[str, Any], *, intent_id: str | None = None) -> Any:
        """Send ``intent`` to the agent named (or with DID) ``target``; return its result.

        The result is verified against the server's signature before it is returned; a
        session with that agent is reused, and re-established once if it has expired.
        ``intent_id``: the caller's own id for this intent, so that calling again with the
        same id (after a crash, say) returns the one run's result instead of running it
        again (see :meth:`A2AClient.request`; the server must declare the extension).
        """
        did, endpoint = await self._locate(target)
        result = await self.client.request(did, intent, endpoint=endpoint, intent_id=intent_id)
        return result.result

    async def stream(self, target: str, intent: Mapping[str, Any]) -> AsyncIterator[Any]:
        """Send ``intent`` as a streamed request (PROTOCOL.md §6.4); yield verified partial results."""
        did, endpoint = await self._locate(target)
        async for item in self.client.stream(did, intent, endpoint=endpoint):
            yield item

    async def handshake(self, remote_did: str, remote_endpoint: str | None = None) -> str:
        """Open a session with ``remote_did``; return its ``session_id``."""
        if remote_endpoint is None:
            remote_did, remote_endpoint = await self._locate(remote_did)
        session = await self.client.handshake(remote_did, remote_endpoint)
        self._sessions[session.session_id] = session
        return session.session_id

    def _session(self, session_id: str) -> ClientSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise InvalidParams("unknown session id")
        return session

    async def send_intent(self, session_id: str, intent: Mapping[str, Any]) -> IntentResult:
        """Send ``intent`` on the session ``session_id``; return the verified result object."""
        return await self.client.send_intent(self._session(session_id), intent)

    async def close_session(self, session_id: str) -> None:
        """Close the session ``session_id`` with an authenticated close."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await self.client.close_session(session.server_did)

    # -- hosting ---------------------------------------------------------------------------
    @property
    def server(self) -> AgentServer:
        """The server side of this agent (needs the ``server`` extra)."""
        if self._server is None:
            from a2a_secure.server.app import AgentServer  # noqa: PLC0415 - optional extra

            self._server = AgentServer(
                self.identity,
                self._policy,
                name=self.agent_id,
                description=self._description,
                url=self.endpoint or "",
                store=self._store,
                resolver=self.resolver,
                audit=self._audit,
            )
        return self._server

    def intent(self, goal: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: host ``goal`` with the decorated handler."""
        return self.server.intent(goal)

    @property
    def app(self) -> FastAPI:
        """A FastAPI app hosting this agent's intents."""
        return self.server.app()

    async def serve(self, host: str = "127.0.0.1", port: int = 8000, **uvicorn_options: Any) -> None:
        """Serve the agent with uvicorn until cancelled."""
        import uvicorn  # noqa: PLC0415 - optional extra

        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", **uvicorn_options)
        await uvicorn.Server(config).serve()
