"""``a2a-secure mcp``: registry agents as MCP tools, over stdio or streamable HTTP.

A thin adapter over :class:`a2a_secure.llm_tools.ToolCatalog` with the official ``mcp`` SDK's
low-level server (the tool list is dynamic and each tool carries the input schema its agent
declares, which the decorator-based FastMCP does not take). Needs the ``mcp`` extra:
``pip install "a2a-secure[mcp]"``; nothing else in the package imports this module.

- ``tools/list`` fetches and checks every agent's card again (the catalog's ``refresh``), so
  a model sees what each agent declares now, and only agents whose card is the one they
  committed to in the handshake.
- A call goes out only on a session that commits to the card the last ``tools/list`` showed:
  after an agent's card changed (a session re-opened since may commit to another card, with
  other descriptions), its calls answer ``isError`` ("its card changed since the tools were
  listed; list the tools again") until the tools are listed again, and the server sends
  ``notifications/tools/list_changed`` (declared as ``tools.listChanged``).
- ``tools/call`` runs the intent over the DID-authenticated session and answers with the
  verified result as ``structuredContent``, its JSON as text, and the signed response token
  (``typ`` ``a2a-response+jws``) under ``_meta["a2a-secure/response_jws"]``. A streaming
  intent called with a ``progressToken`` reports each verified partial result as progress;
  its result holds the partial results, ``_meta["a2a-secure/event_jws"]`` the signed token
  of every event in index order (``typ`` ``a2a-event+jws``, indices 0 … n-1), and
  ``_meta["a2a-secure/response_jws"]`` the token of the final event. Every failure is a
  tool result with ``isError: true`` and a readable sentence; the server keeps serving.
  Arguments no agent would take (over 384 KiB of JSON, nested deeper than 29 levels, not
  I-JSON) are refused before anything is signed or sent.
- Calls are sealed (PROTOCOL.md §12.6) with every agent that declares sealed intents: the
  intent's inputs and its answer cross every proxy between the bridge and the agent as
  ciphertext. With ``--sealed`` (``A2AAgent(sealed=True)``) an agent that does not declare
  them fails its check: its tools are not offered, and a call of one answers ``isError``
  saying so, before any intent is sent.
- Over HTTP (:func:`run_http`) the server binds a loopback address only, and answers only
  requests whose ``Host`` is that address (or ``localhost`` for 127.0.0.1 and ::1) with its
  port, and whose ``Origin``, when there is one, is ``http://`` and such a host: a web page
  that rebinds its own DNS name to the loopback address (DNS rebinding) gets 421 or 403.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import sys
from typing import Any

import mcp_types as types
from mcp.server import InitializationOptions, NotificationOptions
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from a2a_secure import __version__
from a2a_secure.agent import A2AAgent
from a2a_secure.llm_tool_values import META_PREFIX, ToolCallError, ToolResult, ToolSpec
from a2a_secure.system import wall_now
from a2a_secure.telemetry import tracing
from a2a_secure.terminal import printable

__all__ = ["build_server", "configure_logging", "http_security", "in_scope", "run_http", "run_stdio"]

logger = logging.getLogger(__name__)
SERVER_NAME = "a2a-secure"
INSTRUCTIONS = (
    "Each tool is one intent of a registry agent, called over a DID-authenticated session: the "
    "request is signed and the answer verified. A result with status 'needs_approval' was NOT "
    "run: a person must approve it first."
)


def in_scope(agent: A2AAgent, specs: list[ToolSpec]) -> list[ToolSpec]:
    """The tools the agent's delegation chain covers now (all of them without a chain).

    A model acting for a person is not shown what that person did not delegate; a call of
    such a tool is refused before anything is sent in any case (PROTOCOL.md §12.7).
    """
    chain = agent.on_behalf_of
    if chain is None:
        return specs
    now = wall_now()
    return [
        s
        for s in specs
        if chain.refusal(now=now, client_did=agent.did, server_did=s.did, goal=s.intent) is None
    ]


def _tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema)


def _result(result: ToolResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=result.text)],
        structured_content=result.content,
        is_error=result.is_error,
        _meta=result.meta,
    )


def _failure(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def _wants_progress(ctx: Any) -> bool:
    meta = getattr(ctx, "meta", None)
    return isinstance(meta, dict) and meta.get("progress_token") is not None


class _ToolServer(Server[Any]):
    """The SDK's low-level server, declaring ``tools.listChanged`` on every transport."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def build_server(agent: A2AAgent) -> Server[Any]:
    """The MCP server offering ``agent``'s registry agents as tools."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        specs = in_scope(agent, await agent.tools.refresh())
        for name, reason in sorted(agent.tools.failures.items()):
            logger.warning("tools of %s not offered: %s", name, reason)
        return types.ListToolsResult(tools=[_tool(spec) for spec in specs])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        on_progress = None
        if _wants_progress(ctx):

            async def on_progress(count: int, partial: Any) -> None:
                await ctx.session.report_progress(float(count), None, f"partial result {count}")

        try:
            # The caller's trace (traceparent in _meta) goes on into the agents' intents.
            with tracing.continue_trace(getattr(ctx, "meta", None)):
                result = await agent.tools.call(params.name, params.arguments, on_progress=on_progress)
        except ToolCallError as exc:
            return _failure(exc.message)
        except Exception:
            # The model must see a tool error, and the server must go on serving; the details
            # stay in the local log (they may hold inputs, which never go to the model twice).
            logger.exception("tool %s failed", params.name[:80])
            return _failure(f"tool {params.name[:80]!r} failed with an internal error")
        if result.meta.get(f"{META_PREFIX}tools_changed") is True:
            # The client should list again, and show the model the card calls now go to.
            try:
                await ctx.session.send_tool_list_changed()
            except Exception:  # a transport with no channel for it: the error text says it too
                logger.debug("could not send tools/list_changed", exc_info=True)
        return _result(result)

    return _ToolServer(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _prime(agent: A2AAgent) -> None:
    """Check every card once at start, so refusals show in the log before any model asks."""
    specs = in_scope(agent, await agent.tools.refresh(shown=False))  # tools/list shows them to a model
    for name, reason in sorted(agent.tools.failures.items()):
        logger.warning("tools of %s not offered: %s", name, reason)
    logger.info("offering %d tools: %s", len(specs), ", ".join(s.name for s in specs))


async def run_stdio(agent: A2AAgent) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes it."""
    async with agent:
        await _prime(agent)
        server = build_server(agent)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def http_security(host: str, port: int) -> TransportSecuritySettings:
    """The ``Host`` and ``Origin`` values a request to ``http://host:port/mcp`` may carry.

    Raises ``ValueError`` when ``host`` is not a loopback address (or ``localhost``) or the
    port is not 1-65535: the endpoint does not authenticate its callers, and its allowed
    hosts are derived from the address and the port it is reached at.
    """
    if not 0 < port < 65536:
        raise ValueError(f"the MCP HTTP port must be 1-65535, not {port}")
    if host == "localhost":
        names = ["localhost", "127.0.0.1", "[::1]"]
    else:
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            ip = None
        if ip is None or not ip.is_loopback:
            raise ValueError(
                f"{host[:100]!r} is not a loopback address:"
                " the MCP HTTP endpoint does not authenticate callers"
            )
        names = [f"[{ip.compressed}]" if ip.version == 6 else ip.compressed]
        if ip.compressed in ("127.0.0.1", "::1"):
            names.append("localhost")
    # DNS rebinding: a page at http://evil.example:port whose name now resolves to this
    # address sends "Host: evil.example:port" and "Origin: http://evil.example:port". The
    # SDK checks these only for 127.0.0.1, localhost and ::1 unless told; here it is always
    # told, with this port only (another local port is another origin).
    hosts = [f"{name}:{port}" for name in names] + (names if port == 80 else [])
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{authority}" for authority in hosts],
    )


async def run_http(agent: A2AAgent, host: str, port: int) -> None:
    """Serve MCP over streamable HTTP at ``http://host:port/mcp`` until cancelled.

    ``host`` must be a loopback address; requests with another ``Host`` or ``Origin`` are
    refused (:func:`http_security`).
    """
    import uvicorn  # noqa: PLC0415 - the mcp SDK depends on it

    security = http_security(host, port)  # before anything starts
    async with agent:
        await _prime(agent)
        server = build_server(agent)
        app = server.streamable_http_app(host=host, transport_security=security)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        with contextlib.suppress(KeyboardInterrupt):
            await uvicorn.Server(config).serve()


class _PrintableFormatter(logging.Formatter):
    """Log lines with every terminal control character escaped.

    The lines quote peers and callers: an agent's error message, a tool name the MCP client
    sent, the ``Host`` header of a refused request (the SDK logs it).
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    # Split on "\n" only: splitlines() would also break at U+2028, U+0085 and \x1c-\x1e,
    # turning a character a peer chose into a line of its own instead of escaping it.
    def formatException(self, ei: Any) -> str:
        return "\n".join(printable(line) for line in super().formatException(ei).split("\n"))

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(printable(line) for line in super().formatStack(stack_info).split("\n"))


def configure_logging() -> None:
    """Log to stderr, escaped: on stdio, stdout carries the MCP messages.

    The handler sits on the root logger, so the MCP SDK's warnings go through it too.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("a2a-secure mcp: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("a2a_secure").setLevel(logging.INFO)
