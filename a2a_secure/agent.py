"""``A2AAgent``: the high-level API. One object both calls peers and hosts its own intents::

async with A2AAgent("orchestrator", identity, registry="agent_registry.json") as agent:
    text = await agent.request("translator", {"goal": "translate", "inputs": {...}})
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from a2a_secure.client import approval as _approval
from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.delegation import Chain, DelegationRules
from a2a_secure.errors import A2AError, InvalidParams, PeerUnreachable, SessionClosed
from a2a_secure.identity import encoding
from a2a_secure.identity.addresses import AddressPolicy, url_reach
from a2a_secure.identity.did import A2A_SERVICE_TYPE, did_web_to_url
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import DIDResolver, ResolvedDID
from a2a_secure.identity.rotation import WELL_KNOWN_ROTATION, RotationFollower
from a2a_secure.llm_tool_values import ProgressCallback, ToolFormat, ToolResult
from a2a_secure.llm_tools import ToolCatalog
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.approval import ApprovalSettings, approver_dids
from a2a_secure.protocol.client import ClientSession, IntentResult
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import AuditHook, ServerLimits
from a2a_secure.registry import (
    AgentNotFound,
    AgentRegistry,
    AmbiguousTarget,
    RegistryEntry,
    RegistryEntryError,
    RegistryError,
)
from a2a_secure.system import wall_now

if TYPE_CHECKING:
    from fastapi import FastAPI

    from a2a_secure.server.app import AgentServer
    from a2a_secure.store.base import Store

__all__ = [
    "A2AAgent",
    "AgentNotFound",
    "AgentRegistry",
    "AmbiguousTarget",
    "RegistryEntry",
    "RegistryEntryError",
    "RegistryError",
]

SERVICE_TYPE = A2A_SERVICE_TYPE
_log = logging.getLogger(__name__)
# Seconds for the whole fetch of a rotation chain (connect, headers and body).
ROTATION_FETCH_TIMEOUT = 5.0
_CLOSED_REMEMBERED = 1024  # closed session ids remembered per agent (send_intent says "closed")


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
        priority_rights: PriorityRights | None = None,
        limits: ServerLimits | None = None,
        approvers: Iterable[str] = (),
        approval: ApprovalSettings | None = None,
        serve_tools: bool = False,
        addresses: AddressPolicy | None = None,
        sealed: bool | None = None,
        on_behalf_of: Chain | None = None,
        delegation: DelegationRules | Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """``priority_rights`` and ``limits`` configure the hosted side (:attr:`server`): the
        highest intent priority each caller may use, and the server's bounds, among them
        ``max_concurrent_intents`` (PROTOCOL.md §12.3) and ``sealed_intents`` (§12.6).

        ``addresses``: where this agent may connect when the address comes from a registry
        file, a did:web document's service or a card (default: public hosts over https;
        ``AddressPolicy.build(dev_allow_loopback=True)`` for agents on this machine,
        ``allow_addresses``/``allow_hosts`` for a private network; SECURITY.md).

        ``sealed``: the calling side's sealed intents (PROTOCOL.md §12.6): None seals with
        every peer that declares the extension, True refuses a peer that does not, False
        never seals (see :class:`~a2a_secure.client.http.A2AClient`).

        ``on_behalf_of``: the delegation chain every request acts under unless it names
        another (PROTOCOL.md §12.7); ``delegation``: the hosted side accepts chains, with
        these rules."""
        self.agent_id = agent_id
        self.identity = identity or Identity.generate(agent_id)
        self.endpoint = endpoint
        self.addresses = addresses or AddressPolicy()
        if registry is None or isinstance(registry, AgentRegistry):
            self.registry = registry or AgentRegistry()
        else:
            self.registry = AgentRegistry.load(registry, addresses=self.addresses)
        self.resolver = resolver or DIDResolver()
        self._audit = audit
        self.client = A2AClient(
            self.identity,
            resolver=self.resolver,
            verify=verify,
            retry=retry,
            accept_policy=accept_policy,
            audit=audit,
            addresses=self.addresses,
            sealed=sealed,
        )
        self._policy = policy
        self._store = store
        self.registry.rotations = RotationFollower(audit=self._audit_follow)
        self._description = description
        self._priority_rights = priority_rights
        self._limits = limits
        self._approvers = approver_dids(approvers)
        self._approval = approval
        self._serve_tools = serve_tools
        self.on_behalf_of = on_behalf_of
        self._delegation = (
            DelegationRules.from_member(delegation)
            if delegation is not None and not isinstance(delegation, DelegationRules)
            else delegation
        )
        self._server: AgentServer | None = None
        self._sessions: dict[str, ClientSession] = {}
        # The ids of the sessions this agent closed (the latest few), so that a later
        # send_intent says "closed" rather than "unknown".
        self._closed: dict[str, None] = {}

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
    def find(self, target: str) -> RegistryEntry:
        """The registry entry ``target`` designates: a name, a DID, a name prefix or a goal.

        See :meth:`AgentRegistry.find`; raises :class:`AgentNotFound` or :class:`AmbiguousTarget`.
        """
        return self.registry.find(target)

    async def _locate(self, target: str) -> tuple[str, str, str | None]:
        """(name for messages, DID, endpoint) of ``target``."""
        entry: RegistryEntry | None
        if target.startswith("did:"):
            # A DID needs no registry entry; one only adds the endpoint (and a name).
            entry = self.registry.by_did(target)
            did = target
        else:
            entry = self.registry.find(target)
            did = entry.did
        name = entry.name if entry is not None else did
        endpoint = entry.endpoint if entry is not None else None
        if entry is not None and endpoint is not None and entry.taken_under is not None:
            # A registry from elsewhere: its endpoint is dialled at a checked address only.
            policy, origin = entry.taken_under
            endpoint = self.client.dial.accept(endpoint, what="endpoint", origin=origin, policy=policy)
        if endpoint is None and did.startswith("did:web:"):
            endpoint = _service_endpoint(await self.resolver.resolve(did), self.client.accept_endpoint)
        return name, did, endpoint

    @staticmethod
    @contextlib.contextmanager
    def _naming(name: str, endpoint: str | None) -> Iterator[None]:
        """Say which agent and which endpoint did not answer: the client knows only a URL."""
        try:
            yield
        except PeerUnreachable as exc:
            where = endpoint or exc.endpoint or "its endpoint"
            reason = exc.reason or "no answer"
            raise PeerUnreachable(
                f"agent {name!r} did not answer at {where} ({reason})", endpoint=where, reason=exc.reason
            ) from None

    async def request(
        self,
        target: str,
        intent: Mapping[str, Any],
        *,
        priority: int | None = None,
        intent_id: str | None = None,
        on_behalf_of: Chain | None = None,
    ) -> Any:
        """Send ``intent`` to the agent ``target`` designates (see :meth:`find`); return its result.

        The result is verified against the server's signature before it is returned; a
        session with that agent is reused, and re-established once if it has expired. An
        endpoint that does not answer raises :class:`~a2a_secure.errors.PeerUnreachable`
        naming the agent and the endpoint. ``priority`` (1-5, default 3; PROTOCOL.md §12.3)
        asks the agent to schedule the intent at that priority, within the rights the agent
        gives this caller. ``intent_id``: the caller's own id for this intent, so that
        calling again with the same id (after a crash, say) returns the one run's result
        instead of running it again (see :meth:`A2AClient.request`; the server must declare
        the extension). ``on_behalf_of``: the delegation chain to act under (PROTOCOL.md
        §12.7; default :attr:`on_behalf_of`); its leaf must name this agent's DID.
        """
        # A JSON object comes back as a dict that also answers ``.needs_approval`` (§12).
        result = await self.request_verified(
            target, intent, priority=priority, intent_id=intent_id, on_behalf_of=on_behalf_of
        )
        return _approval.as_result(result.result)

    async def request_verified(
        self,
        target: str,
        intent: Mapping[str, Any],
        *,
        priority: int | None = None,
        intent_id: str | None = None,
        on_behalf_of: Chain | None = None,
    ) -> IntentResult:
        """Like :meth:`request`, but return the whole verified answer: ``status``,
        ``sequence``, ``result``, the server's signed ``response_jws`` (kept as proof) and
        the ``intent_id`` used."""
        name, did, endpoint = await self._locate(target)
        chain = on_behalf_of if on_behalf_of is not None else self.on_behalf_of
        with self._naming(name, endpoint):
            return await self.client.request(
                did, intent, endpoint=endpoint, priority=priority, intent_id=intent_id, on_behalf_of=chain
            )

    def delegate_further(
        self,
        chain: Chain,
        to: str,
        goals: Iterable[str] | None = None,
        *,
        ttl: int | None = None,
        targets: Iterable[str] | None = None,
        max_priority: int | None = None,
    ) -> Chain:
        """``chain`` (delegated to this agent) with one more hop, to the DID ``to``.

        Scope members left out are the chain's own; a wider one is refused before signing.
        """
        return chain.further(
            self.identity,
            to=to,
            goals=goals,
            now=wall_now(),
            ttl=ttl,
            targets=targets,
            max_priority=max_priority,
        )

    # -- key rotation ----------------------------------------------------------------------------
    def _audit_follow(self, statement: Any) -> None:
        if self._audit is not None:
            self._audit(
                event="follow_rotation",
                role="client",
                status="success",
                verified=True,
                client_did=statement.did,
                server_did=statement.successor,
            )

    async def follow_rotation(self, target: str, statements: Sequence[str] | str | None = None) -> str:
        """Follow the did:key rotation of the registry agent ``target``; return its new DID.

        ``statements`` is a rotation statement or chain (a file written by ``a2a-secure key
        rotate``); without it they are fetched from the agent's endpoint at
        ``/.well-known/a2a-rotation.json``. Each rotation is followed once and audited
        (``follow_rotation``); a refused statement changes nothing and is audited as a
        ``reject``.
        """
        entry = self.registry.find(target)
        if statements is None:
            # Located as a request would be: an endpoint a document named is dialled at its
            # checked address (the client's own HTTP client, client/pinning.py).
            _name, _did, endpoint = await self._locate(entry.name)
            if endpoint is None:
                raise InvalidParams(f"agent {entry.name!r} has no endpoint to fetch its rotation from")
            statements = await _fetch_statements(endpoint, self.client.http)
        try:
            self.registry.follow_rotation(statements)
        except A2AError as exc:
            if self._audit is not None:
                self._audit(
                    event="reject", role="client", status="error", client_did=entry.did, error_code=exc.code
                )
            raise
        return self.registry.find(entry.name).did

    # -- peers as LLM tools ---------------------------------------------------------------------
    @cached_property
    def tools(self) -> ToolCatalog:
        """The registry's agents as LLM tools, checked against their cards (``a2a_secure.llm_tools``)."""
        return ToolCatalog(self)

    async def tool_schemas(
        self, format: ToolFormat = "openai", *, refresh: bool = False
    ) -> list[dict[str, Any]]:
        """Function-calling schemas, one per (registry agent, intent), for chat-completion APIs.

        ``format="openai"`` gives ``{"type": "function", "function": {"name", "description",
        "parameters"}}``, ``format="anthropic"`` gives ``{"name", "description",
        "input_schema"}``. Cards are fetched and checked on first use (or with ``refresh``);
        an agent whose card does not check out has no tools here. Naming rule: ``a2a_secure.llm_tools``.
        """
        return await self.tools.schemas(format, refresh=refresh)

    async def call_tool(
        self, name: str, arguments: Any = None, *, on_progress: ProgressCallback | None = None
    ) -> ToolResult:
        """Run the tool ``name`` (from :meth:`tool_schemas`) with the model's ``arguments``.

        Returns a ``ToolResult``: ``text`` to give back to the model, ``is_error``, the
        verified ``content`` and the signed ``response_jws``. An agent's refusal or a
        transport failure is a result with ``is_error`` set; an unknown tool or arguments
        that are not an object raise ``ToolCallError``.
        """
        return await self.tools.call(name, arguments, on_progress=on_progress)

    async def stream(
        self, target: str, intent: Mapping[str, Any], *, priority: int | None = None
    ) -> AsyncIterator[Any]:
        """Send ``intent`` as a streamed request (PROTOCOL.md §6.4); yield verified partial results."""
        name, did, endpoint = await self._locate(target)
        with self._naming(name, endpoint):
            async for item in self.client.stream(did, intent, endpoint=endpoint, priority=priority):
                yield item

    async def handshake(self, remote_did: str, remote_endpoint: str | None = None) -> str:
        """Open a session with ``remote_did`` (a DID, or any target :meth:`find` accepts).

        Returns the ``session_id``.
        """
        name = remote_did
        if remote_endpoint is None:
            name, remote_did, remote_endpoint = await self._locate(remote_did)
        with self._naming(name, remote_endpoint):
            session = await self.client.handshake(remote_did, remote_endpoint)
        self._sessions[session.session_id] = session
        return session.session_id

    def _session(self, session_id: str) -> ClientSession:
        session = self._sessions.get(session_id)
        if session is None:
            if session_id in self._closed:
                raise SessionClosed("this agent closed that session; open a new one with handshake()")
            raise InvalidParams("unknown session id")
        return session

    async def send_intent(self, session_id: str, intent: Mapping[str, Any]) -> IntentResult:
        """Send ``intent`` on the session ``session_id``; return the verified result object.

        After :meth:`close_session` of that session: :class:`~a2a_secure.errors.SessionClosed`,
        before anything is sent.
        """
        return await self.client.send_intent(self._session(session_id), intent)

    async def close_session(self, session_id: str) -> None:
        """Close the session ``session_id`` with an authenticated close."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._closed[session_id] = None
            if len(self._closed) > _CLOSED_REMEMBERED:
                del self._closed[next(iter(self._closed))]
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
                limits=self._limits,
                priority_rights=self._priority_rights,
                approvers=self._approvers,
                approval=self._approval,
                serve_tools=self._serve_tools,
                delegation=self._delegation,
            )
        return self._server

    def intent(
        self,
        goal: str,
        *,
        description: str | None = None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: host ``goal`` with the decorated handler (described in the card)."""
        return self.server.intent(goal, description=description, input_schema=input_schema)

    # -- human approval (PROTOCOL.md §12) ----------------------------------------------------
    def approved_action(
        self, action: str, *, approvers: Iterable[str] | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: run the decorated function when a person approves an ``action``.

        See :meth:`AgentServer.approved_action <a2a_secure.server.app.AgentServer.approved_action>`.
        """
        return self.server.approved_action(action, approvers=approvers)

    async def pending_action(self, target: str, action_id: str) -> _approval.ActionDetails:
        """The pending action ``action_id`` at ``target``, checked (for its approvers)."""
        name, did, endpoint = await self._locate(target)
        with self._naming(name, endpoint):
            return await _approval.pending_action(self.client, did, action_id, endpoint=endpoint)

    async def approve(
        self, target: str, action_id: str, *, approved: bool = True, action_hash: str | None = None
    ) -> _approval.ApprovalOutcome:
        """Sign this agent's approval (or rejection) of ``action_id`` at ``target``.

        Without ``action_hash``, the pending action is read first and its data checked
        against its hash; the outcome holds those details and, once approved, the action's
        result.
        """
        name, did, endpoint = await self._locate(target)
        with self._naming(name, endpoint):
            return await _approval.approve(
                self.client, did, action_id, approved=approved, action_hash=action_hash, endpoint=endpoint
            )

    @property
    def app(self) -> FastAPI:
        """A FastAPI app hosting this agent's intents."""
        return self.server.app()

    async def serve(self, host: str = "127.0.0.1", port: int = 8000, **uvicorn_options: Any) -> None:
        """Serve the agent with uvicorn until cancelled.

        A shared store that does not answer is a ``ConnectionError`` naming its URL, before
        anything listens (not a -32048 "shared store unavailable" on every request).
        """
        import uvicorn  # noqa: PLC0415 - optional extra

        check = getattr(self.server.store, "check", None)
        if check is not None:
            await check()

        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", **uvicorn_options)
        await uvicorn.Server(config).serve()


def _service_endpoint(resolved: ResolvedDID, accept: Callable[..., str]) -> str | None:
    """The first A2ASecureAgent service endpoint of a did:web document that ``accept`` takes
    (:meth:`A2AClient.accept_endpoint`: the client then dials only a checked address of it).

    The document is its owner's word, and anyone can own a did:web: an endpoint naming
    loopback or a private host would turn this client's HELLO into a request forgery (E14).
    A malformed or refused entry is skipped; when none is usable, the first refusal is raised.
    """
    refusal: A2AError | None = None
    for service in resolved.services:
        ep = service.get("serviceEndpoint")
        if service.get("type") != SERVICE_TYPE or not isinstance(ep, str):
            continue
        try:
            # No more private than the network the document came from (the DID's host).
            origin = url_reach(did_web_to_url(resolved.did))
            return accept(ep, what=f"the service endpoint of {resolved.did}", origin=origin)
        except A2AError as exc:
            refusal = refusal or exc
    if refusal is not None:
        raise refusal
    return None


async def _fetch_statements(endpoint: str, http: Any) -> list[str]:
    """The rotation chain an agent serves at ``/.well-known/a2a-rotation.json`` (64 KiB, 5 s),
    fetched with ``http`` (the agent's ``httpx.AsyncClient``), no redirect followed."""
    import asyncio  # noqa: PLC0415

    import httpx  # noqa: PLC0415

    url = endpoint.rstrip("/") + WELL_KNOWN_ROTATION
    deadline = ROTATION_FETCH_TIMEOUT  # read at each call: tests shorten it
    try:
        # httpx's timeout bounds each read only: a server sending a byte every few seconds
        # would hold the caller for as long as it liked. One deadline covers the whole fetch.
        async with (
            asyncio.timeout(deadline),
            http.stream("GET", url, timeout=deadline, follow_redirects=False) as resp,
        ):
            if resp.status_code != 200:
                raise InvalidParams(f"{url} answered HTTP {resp.status_code}")
            body = b""
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > 64 * 1024:
                    raise InvalidParams(f"{url} is larger than 64 KiB")
    except TimeoutError:
        raise InvalidParams(f"{url} did not arrive within {deadline:g} s") from None
    except httpx.HTTPError:
        raise InvalidParams(f"{url} could not be fetched") from None
    data = encoding.loads(body, error=InvalidParams)
    statements = data.get("statements") if isinstance(data, dict) else None
    if not isinstance(statements, list) or not all(isinstance(t, str) for t in statements):
        raise InvalidParams(f"{url} has no statements array")
    return statements
