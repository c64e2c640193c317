"""``a2a-secure mcp``: registry agents as MCP tools, over stdio or streamable HTTP.

A thin adapter over :class:`a2a_secure.tools.ToolCatalog` with the official ``mcp`` SDK's
low-level server (the tool list is dynamic and each tool carries the input schema its agent
declares, which the decorator-based FastMCP does not take). Needs the ``mcp`` extra:
``pip install "a2a-secure[mcp]"``; nothing else in the package imports this module.

- ``tools/list`` fetches and checks every agent's card again (the catalog's ``refresh``), so
  a model sees what each agent declares now, and only agents whose card is the one they
  committed to in the handshake.
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
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from a2a_secure import __version__
from a2a_secure.agent import A2AAgent
from a2a_secure.tools import ToolCallError, ToolResult, ToolSpec

__all__ = ["build_server", "configure_logging", "in_scope", "run_http", "run_stdio"]

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
    such a tool is refused before anything is sent in any case (PROTOCOL.md §12.6).
    """
    chain = agent.on_behalf_of
    if chain is None:
        return specs
    now = time.time()
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
            result = await agent.tools.call(params.name, params.arguments, on_progress=on_progress)
        except ToolCallError as exc:
            return _failure(exc.message)
        except Exception:
            # The model must see a tool error, and the server must go on serving; the details
            # stay in the local log (they may hold inputs, which never go to the model twice).
            logger.exception("tool %s failed", params.name[:80])
            return _failure(f"tool {params.name[:80]!r} failed with an internal error")
        return _result(result)

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _prime(agent: A2AAgent) -> None:
    """Check every card once at start, so refusals show in the log before any model asks."""
    specs = in_scope(agent, await agent.tools.refresh())
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


async def run_http(agent: A2AAgent, host: str, port: int) -> None:
    """Serve MCP over streamable HTTP at ``http://host:port/mcp`` until cancelled."""
    import uvicorn  # noqa: PLC0415 - the mcp SDK depends on it

    async with agent:
        await _prime(agent)
        server = build_server(agent)
        app = server.streamable_http_app(host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        with contextlib.suppress(KeyboardInterrupt):
            await uvicorn.Server(config).serve()


def configure_logging() -> None:
    """Log to stderr: on stdio, stdout carries the MCP messages."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("a2a-secure mcp: %(message)s"))
    root = logging.getLogger("a2a_secure")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
