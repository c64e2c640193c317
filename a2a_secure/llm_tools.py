"""Registry agents as LLM tools: one tool per (agent, intent), described by the agent's card.

This module is the one place that turns an agent registry into tools a model can call; the
MCP server (``a2a_secure.mcp_server``) and the function-calling schemas of
:meth:`A2AAgent.tool_schemas <a2a_secure.agent.A2AAgent.tool_schemas>` are thin adapters
over :class:`ToolCatalog`. It needs no extra: it does not import ``mcp``.

Where tools come from. For each registry agent the catalog fetches
``/.well-known/agent-card.json``, checks that the card names the registry's DID, opens (or
reuses) a DID-authenticated session, and checks ``hash_of(card)`` against the
``manifest_hash`` the agent signed in its CHALLENGE (PROTOCOL.md §4, §5.2). A card that
fails any check is refused: none of that agent's tools is offered, and a call to one of
them answers with the reason. The tools of an agent are the intents its card lists, limited
to the registry's ``capabilities`` for it when there are any, and to those the negotiated
policy allows. The card's optional ``intent_schemas`` member
(``{goal: {"description", "input_schema"}}``, written by ``AgentServer.describe_intent``)
gives each tool its description and input schema; without it a tool takes any object.

Tool names. ``<agent>__<intent>``, where every character of either part outside
``[A-Za-z0-9_-]`` becomes ``_`` (an empty part becomes ``_``). That alphabet and a length
of at most 64 are accepted by MCP clients (the MCP pattern ``[A-Za-z0-9._-]{1,128}`` is
wider) and by the OpenAI and Anthropic function-calling APIs (``^[a-zA-Z0-9_-]{1,64}$``),
so one name works everywhere. When two (agent, intent) pairs map to the same name, or a
name is longer than 64 characters, the name becomes its first 55 characters, ``_`` and the
first 8 hex digits of ``SHA-256(agent + "\\x00" + intent)``: deterministic, and independent of
the order of the registry. If such a name still collides, every pair with it is refused.

What a call returns: a :class:`ToolResult` whose ``content`` is the verified result (the
server's signature, the sequence and the request binding all checked by the client) and
whose ``response_jws`` is the signed response token, kept for callers that want proof. A
verified result ``{"needs_approval": true, "action_id", "action_hash", "preview",
"expires_at"}`` is reported as *not run*, with its preview and action id. Errors from the
agent or the transport become a result with ``is_error`` set and a sentence a person can
read; only a call the catalog cannot even start (unknown tool, arguments that are not an
object, not I-JSON, nested deeper than ``MAX_ARGUMENT_DEPTH`` or over ``MAX_ARGUMENT_BYTES``
of JSON) raises :class:`ToolCallError`, before anything is sent.

Cards change. A call goes out only on a session that commits (``manifest_hash``) to the card
the caller was last shown, through :meth:`ToolCatalog.tools`, :meth:`ToolCatalog.schemas` or
:meth:`ToolCatalog.refresh` (a catalog never listed lists on first use): a session re-opened
since, on the agent's word or after the agent forgot the old one, may commit to another
card, whose descriptions the model never read. Such a call fails, streamed or not, with
"its card changed since the tools were listed; list the tools again" (or "its tools were
not in the last listing", for an agent the last listing did not offer) and
``meta["a2a-secure/tools_changed"]`` true, nothing sent, until the tools are listed again.

Streamed calls. With a progress callback, a streaming intent (PROTOCOL.md §6.4) is sent as
a stream and each verified partial result is reported as it arrives. Every event is signed
on its own (``typ`` ``a2a-event+jws``): the result's ``event_jws`` holds the tokens of all
the events in index order (0, 1, … n-1), and its ``response_jws`` is the token of the final
one (``"final": true``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from a2a_secure.client.extensions import CARD_FETCH_TIMEOUT, CARD_PATH, fetch_card
from a2a_secure.errors import A2AError, InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.llm_tool_values import (
    GENERIC_INPUT_SCHEMA,
    MAX_ARGUMENT_BYTES,
    MAX_ARGUMENT_DEPTH,
    MAX_TOOL_NAME,
    META_PREFIX,
    CardRefused,
    CheckedCard,
    ProgressCallback,
    ToolCallError,
    ToolFormat,
    ToolResult,
    ToolSpec,
    approval_result,
    assign_tool_names,
    error_result,
    shown_cards,
    success_result,
    tool_name,
    tool_spec,
)
from a2a_secure.protocol.client import check_intent_inputs
from a2a_secure.protocol.sealing import SEALED
from a2a_secure.registry import AgentRegistry, RegistryEntry

if TYPE_CHECKING:
    from a2a_secure.client.http import A2AClient
    from a2a_secure.delegation import Chain
    from a2a_secure.protocol.client import ClientSession

__all__ = [
    "GENERIC_INPUT_SCHEMA",
    "MAX_ARGUMENT_BYTES",
    "MAX_ARGUMENT_DEPTH",
    "MAX_TOOL_NAME",
    "CardRefused",
    "CatalogAgent",
    "ToolCallError",
    "ToolCatalog",
    "ToolResult",
    "ToolSpec",
    "assign_tool_names",
    "tool_name",
]

# -- the catalog --------------------------------------------------------------------------------


class CatalogAgent(Protocol):
    """What a catalog needs of its agent (:class:`~a2a_secure.agent.A2AAgent` is one).

    Named here rather than imported: the agent offers its catalog (``A2AAgent.tools``), so
    this module importing ``a2a_secure.agent`` would close an import circle.
    """

    registry: AgentRegistry
    client: A2AClient
    on_behalf_of: Chain | None  # the delegation chain its calls act under (PROTOCOL.md §12.7)

    async def _locate(self, target: str) -> tuple[str, str, str | None]:
        """(name for messages, DID, endpoint) of ``target``."""
        ...

    def _naming(self, name: str, endpoint: str | None) -> AbstractContextManager[None]:
        """Say which agent and which endpoint did not answer."""
        ...


class ToolCatalog:
    """The tools of the agents in ``agent.registry``, checked against their cards.

    :meth:`refresh` fetches and checks every card; :meth:`tools` lists the tools offered;
    :meth:`call` runs one. A catalog that was never refreshed refreshes on first use.
    """

    def __init__(self, agent: CatalogAgent) -> None:
        self.agent = agent
        self._specs: dict[str, ToolSpec] = {}
        self._failures: dict[str, str] = {}
        self._shown: dict[str, str] = {}  # agent -> hash of the card in the last listing
        self._refreshed = False
        self._lock = asyncio.Lock()

    @property
    def failures(self) -> dict[str, str]:
        """Agent name -> why its tools are not offered, from the last refresh."""
        return dict(self._failures)

    async def refresh(self, *, shown: bool = True) -> list[ToolSpec]:
        """Fetch and check every registry agent's card; rebuild the tools; return those offered.

        The list returned is the one calls are then held to (see the module doc): with
        ``shown=False`` (a check nobody reads) calls stay held to the previous listing.
        """
        specs = await self._rebuild()
        if shown:
            self._shown = shown_cards(specs)
        return specs

    async def _rebuild(self) -> list[ToolSpec]:
        async with self._lock:
            entries = self.agent.registry.entries()
            checked = await asyncio.gather(*(self._check(entry) for entry in entries))
            candidates: dict[tuple[str, str], tuple[RegistryEntry, CheckedCard | str]] = {}
            failures: dict[str, str] = {}
            for entry, outcome in zip(entries, checked, strict=True):
                if isinstance(outcome, str):
                    failures[entry.name] = outcome
                    for intent in entry.capabilities:
                        candidates[(entry.name, intent)] = (entry, outcome)
                    continue
                declared = [g for g in outcome.card.get("intents", []) if isinstance(g, str)]
                wanted = list(entry.capabilities) or declared
                for intent in wanted:
                    candidates[(entry.name, intent)] = (entry, outcome)
            names = assign_tool_names(candidates)
            specs: dict[str, ToolSpec] = {}
            for pair, name in sorted(names.items()):
                entry, outcome = candidates[pair]
                if name is None:
                    continue  # refused: its name collides with another tool's
                specs[name] = tool_spec(name, entry, pair[1], outcome)
            self._specs = specs
            self._failures = failures
            self._refreshed = True
            return [s for s in specs.values() if s.error is None]

    async def tools(self, *, refresh: bool = False) -> list[ToolSpec]:
        """The tools offered (refreshed first if asked, or if never refreshed), by name."""
        if refresh or not self._refreshed:
            return await self.refresh()
        specs = [s for s in self._specs.values() if s.error is None]
        self._shown = shown_cards(specs)
        return specs

    async def schemas(self, format: ToolFormat = "openai", *, refresh: bool = False) -> list[dict[str, Any]]:
        """Function-calling schemas of the tools offered (``openai`` or ``anthropic``)."""
        if format not in ("openai", "anthropic"):
            raise ValueError(f"format must be 'openai' or 'anthropic', not {format!r}")
        return [spec.schema(format) for spec in await self.tools(refresh=refresh)]

    async def _check(self, entry: RegistryEntry) -> CheckedCard | str:
        """Fetch ``entry``'s card and check it against the session; a reason string on failure."""
        try:
            _, did, endpoint = await self.agent._locate(entry.name)
            if endpoint is None:
                raise CardRefused(f"no endpoint known for {entry.name}")
            card = await self._fetch_card(endpoint)
            if card.get("did") != did:
                raise CardRefused("its card names another DID than the registry")
            # The handshake authenticates the agent by the registry's DID; the hash it signed
            # in its CHALLENGE must be the hash of the card we are about to show the model.
            client = self.agent.client
            session = await client.session_for(did, endpoint)
            card_hash = encoding.hash_of(card)
            if not hmac.compare_digest(card_hash, session.server_manifest_hash):
                raise CardRefused("its card is not the one it committed to in the handshake (manifest_hash)")
            # The card is verified now (the handshake signed its hash). One that declares
            # sealed intents makes every session with the agent sealed: one opened while the
            # card could not be fetched is replaced (or the agent refused), never offered.
            if SEALED in client.trust_card(did, card) and not session.sealed:
                session = await client.session_for(did, endpoint)
                if not hmac.compare_digest(card_hash, session.server_manifest_hash):
                    raise CardRefused("its card changed during the check")
            return CheckedCard(card, card_hash, session.policy.allows)
        except A2AError as exc:
            return f"{entry.name} refused: {exc.message} ({exc.code})"
        except httpx.HTTPError:
            return f"{entry.name} unreachable: its agent card could not be fetched"

    async def _fetch_card(self, endpoint: str) -> dict[str, Any]:
        # This module's deadline, read at each call, bounds a tool listing.
        card = await fetch_card(
            self.agent.client.http,
            endpoint.rstrip("/") + CARD_PATH,
            deadline=CARD_FETCH_TIMEOUT,
            error=CardRefused,
        )
        if not isinstance(card, dict):
            raise CardRefused("its agent card is not a JSON object")
        # The card is the agent's own word, read before anything else trusts it: a member
        # of the wrong type must refuse this agent, never break the listing of the others.
        for member in ("intents", "streaming_intents"):
            goals = card.get(member, [])
            if not isinstance(goals, list) or not all(isinstance(g, str) for g in goals):
                raise CardRefused(f"its agent card member {member!r} is not an array of strings")
        return card

    async def _lookup(self, name: str) -> ToolSpec:
        if not self._refreshed:
            await self.refresh()
        spec = self._specs.get(name)
        if spec is None or spec.error is not None:
            # The agent may have come up, or changed its card, since the last listing; the
            # reason is worth giving, but a card found now was not shown to anyone.
            await self.refresh(shown=False)
            spec = self._specs.get(name)
        if spec is None:
            # A refused agent with no capabilities in the registry has no tool names; a name
            # with its prefix still gets the reason rather than "unknown tool".
            for agent, reason in sorted(self._failures.items()):
                prefix = tool_name(agent, "")[:-1]
                if name.startswith(prefix) and len(name) > len(prefix):
                    intent = name[len(prefix) :]
                    did = self.agent.registry.find(agent).did
                    return ToolSpec(name, agent, intent, did, "", dict(GENERIC_INPUT_SCHEMA), error=reason)
            raise ToolCallError(f"unknown tool {name[:80]!r}")
        return spec

    async def call(
        self, name: str, arguments: Any = None, *, on_progress: ProgressCallback | None = None
    ) -> ToolResult:
        """Run the tool ``name`` with ``arguments`` (the intent's inputs, a JSON object).

        With ``on_progress`` a streaming intent (PROTOCOL.md §6.4) is sent as a stream and
        ``on_progress(n, partial)`` is awaited for each verified partial result; the result
        then holds them all, and the signed token of every event (``event_jws``; the final
        one is also ``response_jws``).
        The call goes out only on a session committed to the card of the last listing (see
        the module doc); else the result is an error, with ``meta["a2a-secure/tools_changed"]``.
        Raises :class:`ToolCallError` for an unknown tool, or arguments that are not a JSON
        object, not I-JSON, nested deeper than :data:`MAX_ARGUMENT_DEPTH` or larger than
        :data:`MAX_ARGUMENT_BYTES` as JSON: nothing is sent for those.
        """
        if arguments is None:
            arguments = {}
        _check_arguments(arguments)
        spec = await self._lookup(name)
        if spec.error is not None:
            return error_result(spec, spec.error, None)
        # Every session the call could go out on, first or re-opened, streamed or not, passes
        # this one check against the card the model was shown.
        shown = self._shown.get(spec.agent)
        check = functools.partial(_check_card, shown)
        try:
            _, did, endpoint = await self.agent._locate(spec.agent)
            intent = {"goal": spec.intent, "inputs": arguments}
            if spec.streaming and on_progress is not None:
                return await self._stream(spec, did, endpoint, intent, on_progress, check)
            with self.agent._naming(spec.agent, endpoint):
                # request(): the client's one attempt machine, which runs ``check`` on every
                # session the call could go out on (a new one after -32043 too).
                verified = await self.agent.client.request(
                    did, intent, endpoint=endpoint, on_behalf_of=self.agent.on_behalf_of, session_check=check
                )
        except _CardChanged:
            return _card_changed(spec, shown is not None)
        except PolicyViolation as exc:
            return error_result(spec, f"{spec.agent} refused: {exc.message} ({exc.code})", exc.code)
        except A2AError as exc:
            verb = "refused" if exc.signed else "failed"
            return error_result(spec, f"{spec.agent} {verb}: {exc.message} ({exc.code})", exc.code)
        except httpx.HTTPError:
            return error_result(spec, f"{spec.agent} failed: the agent could not be reached", None)
        result = verified.result
        if isinstance(result, dict) and result.get("needs_approval") is True:
            return approval_result(spec, result, verified.response_jws)
        return success_result(spec, result, verified.response_jws, sequence=verified.sequence)

    async def _stream(
        self,
        spec: ToolSpec,
        did: str,
        endpoint: str | None,
        intent: Mapping[str, Any],
        on_progress: ProgressCallback,
        check: Callable[[ClientSession], None],
    ) -> ToolResult:
        """Run a streaming intent; report each verified partial; keep every event's token."""
        partials: list[Any] = []
        tokens: list[str] = []
        events = self.agent.client.stream_events(
            did, intent, endpoint=endpoint, session_check=check, on_behalf_of=self.agent.on_behalf_of
        )
        with self.agent._naming(spec.agent, endpoint):
            async with contextlib.aclosing(events):
                async for event in events:
                    tokens.append(event.response_jws)
                    # The closing event of a streaming handler has no partial result.
                    if event.result is not None or not event.final:
                        partials.append(event.result)
                        await on_progress(len(partials), event.result)
        # The client raises unless the stream ended with a verified final event.
        return success_result(spec, partials, tokens[-1], streamed=True, event_jws=tuple(tokens))


def _check_arguments(arguments: Any) -> None:
    """Refuse, before anything is signed or sent, arguments that no agent would take."""
    if not isinstance(arguments, dict):
        raise ToolCallError("tool arguments must be a JSON object")
    try:
        check_intent_inputs(arguments, "tool arguments")
    except InvalidParams as exc:
        raise ToolCallError(exc.message) from None


class _CardChanged(Exception):
    """The session a call would go out on commits to another card than the model saw."""


def _check_card(shown: str | None, session: ClientSession) -> None:
    """Raise :class:`_CardChanged` unless ``session`` commits to the card hash ``shown``."""
    if shown is None or not hmac.compare_digest(shown, session.server_manifest_hash):
        raise _CardChanged


def _card_changed(spec: ToolSpec, listed: bool) -> ToolResult:
    why = (
        "its card changed since the tools were listed" if listed else "its tools were not in the last listing"
    )
    result = error_result(spec, f"{spec.agent} refused: {why}; list the tools again", None)
    result.meta[f"{META_PREFIX}tools_changed"] = True
    return result
