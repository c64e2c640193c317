"""The house: which layer may import what, and no import circles.

Three floors, each importing only the floors below it (README "Layout"):

* ``protocol/`` decides. It never waits and never reaches the network or the clock: no
  module under it imports asyncio, a network library or a clock module, not even inside a
  function or under TYPE_CHECKING. Its clocks and random source are parameters; a caller
  that passes none gets those of :mod:`a2a_secure.system`.
* ``runtime/`` waits: handler deadlines, the priority gate, stream pumps, waiting on a
  stored answer or an ``intent_id`` claim. It drives the core; the core never imports it.
* the adapters (``server/``, ``client/``, ``agent.py``...) speak HTTP around both.

How an edge is counted: every ``import`` and ``from ... import`` of a module, wherever it
stands (top level, inside a function, under TYPE_CHECKING), relative imports resolved.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``
itself. An edge to a package is an edge to its ``__init__`` module and no further; but a
package whose ``__init__`` re-exports lazily (:mod:`a2a_secure._lazy`) has an edge to each
module its table names, as it imports that module on first use. Importing ``pkg.sub``
runs ``pkg/__init__`` first, yet that is not counted as an edge from the importer to
``pkg``: each package's ``__init__`` imports its own submodules, so every package would
be a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "a2a_secure"
BENCH = REPO / "scripts" / "a2abench"

# What the core must not import: the event loop, the network, threads and processes, clocks.
WAITING_OR_IO = (
    "asyncio",
    "anyio",
    "trio",
    "sniffio",
    "concurrent",
    "threading",
    "multiprocessing",
    "subprocess",
    "signal",
    "selectors",
    "select",
    "socket",
    "ssl",
    "http",
    "urllib",
    "httpx",
    "h11",
    "uvicorn",
    "starlette",
    "fastapi",
    "redis",
    "time",
    "datetime",
)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, top: str) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (``top`` is its name)."""
    base = root.parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, base)
        assert name.split(".")[0] == top
        out[name] = path
    return out


def _lazy_table(tree: ast.Module) -> list[str]:
    """The modules an ``attach(__name__, {...})`` table names (a2a_secure/_lazy.py)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "attach":
            for arg in node.args[1:]:
                if isinstance(arg, ast.Dict):
                    found += [v.value for v in arg.values if isinstance(v, ast.Constant)]
    return found


def imports_of(source: str, module: str, *, is_package: bool, known: Iterable[str] = ()) -> set[str]:
    """Every module that ``module`` (whose text is ``source``) imports, wherever it stands."""
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    found: set[str] = set(_lazy_table(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = ".".join(filter(None, (base, node.module)))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return found


def graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Edges among ``modules`` only (the standard library and other packages are leaves)."""
    out = {}
    for name, path in modules.items():
        edges = imports_of(
            path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py", known=modules
        )
        out[name] = {e for e in edges if e in modules and e != name}
    return out


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle_among_a2a_secure_modules() -> None:
    assert cycles(graph(_modules(PACKAGE, "a2a_secure"))) == []


def test_no_import_circle_in_the_benchmark_package() -> None:
    assert cycles(graph(_modules(BENCH, "a2abench"))) == []


def test_the_core_imports_nothing_that_waits_or_reads_the_clock() -> None:
    modules = _modules(PACKAGE, "a2a_secure")
    core = {
        n: p for n, p in modules.items() if n == "a2a_secure.protocol" or n.startswith("a2a_secure.protocol.")
    }
    assert len(core) > 20
    bad = {}
    for name, path in core.items():
        found = imports_of(path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py")
        hits = sorted(m for m in found if m.split(".")[0] in WAITING_OR_IO)
        if hits:
            bad[name] = hits
    assert bad == {}


def test_the_core_does_not_import_the_runtime() -> None:
    # The runtime drives the core; the only way up is the name a2a_secure.protocol lends to
    # ServerProtocol, which the runtime assembles (its lazy table, loaded on first use).
    edges = graph(_modules(PACKAGE, "a2a_secure"))
    up = {
        name: sorted(e for e in targets if e.startswith("a2a_secure.runtime"))
        for name, targets in edges.items()
        if name.startswith("a2a_secure.protocol")
    }
    up = {name: targets for name, targets in up.items() if targets}
    assert up == {"a2a_secure.protocol": ["a2a_secure.runtime.router"]}


def test_the_runtime_is_where_the_waiting_is() -> None:
    # Not vacuous: the modules that wait import asyncio, and they all live in runtime/.
    modules = _modules(PACKAGE, "a2a_secure")
    waiting = {
        name
        for name, path in modules.items()
        if "asyncio" in imports_of(path.read_text(encoding="utf-8"), name, is_package=False)
        and name.startswith(("a2a_secure.protocol", "a2a_secure.runtime"))
    }
    assert waiting == {
        "a2a_secure.runtime.exactly_once",
        "a2a_secure.runtime.gate",
        "a2a_secure.runtime.replay",
        "a2a_secure.runtime.router",
        "a2a_secure.runtime.runner",
        "a2a_secure.runtime.signing",
        "a2a_secure.runtime.stream_pump",
        "a2a_secure.runtime.stream_record",
        "a2a_secure.runtime.sweeper",
    }


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        # relative, inside a function and under TYPE_CHECKING all count
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..store import base\n"
            "def f():\n    from .keys import Identity\n",
            "a2a_secure.identity.did",
            False,
            {"typing", "a2a_secure.store.base", "a2a_secure.identity.keys"},
        ),
        # from pkg import name: the submodule when it is one, else the package
        (
            "from a2a_secure.protocol import messages as m\nfrom a2a_secure import errors, A2AAgent\n",
            "a2a_secure.x",
            False,
            {"a2a_secure.protocol.messages", "a2a_secure.errors", "a2a_secure"},
        ),
        # a lazy package __init__ names its modules
        (
            "from a2a_secure._lazy import attach\n__getattr__, __dir__ = attach(__name__, {'A': 'pkg.a'})\n",
            "pkg",
            True,
            {"a2a_secure._lazy", "pkg.a"},
        ),
        # `from . import x` inside a package __init__ is that package's submodule
        ("from . import a\n", "pkg", True, {"pkg.a"}),
    ],
)
def test_the_walker_sees_every_kind_of_import(
    source: str, module: str, is_package: bool, expected: set[str]
) -> None:
    known = {"a2a_secure.protocol.messages", "a2a_secure.errors", "a2a_secure.store.base", "pkg.a"}
    assert imports_of(source, module, is_package=is_package, known=known) == expected


def test_the_cycle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# -- the client: one machine decides, the adapters do I/O ------------------------------------------
# The client's decisions between two sends (resend after -32043, the chain in full, ids
# full, sealing, undeclared members) live in protocol/client_attempt.py, which uses the rules
# of protocol/client_decisions.py. Which adapter may name which of them:
CLIENT_DECISIONS = {
    "a2a_secure.client.http": {"HANDSHAKE", "Call", "CallOptions", "Resend", "Send", "send_close"},
    "a2a_secure.client.handshake": {"PeerState", "seal"},  # the CHALLENGE's card decides, in the core
    "a2a_secure.client.transport": {  # retry of the byte-identical request
        "Retry",
        "backoff",
        "gives_up",
        "parse_retry_after",
        "reply_retry",
        "stream_reply_retried",
        "transport_failure_retried",
    },
}
DECISION_MODULES = ("a2a_secure.protocol.client_attempt", "a2a_secure.protocol.client_decisions")
# Names that only a deciding module may use: seeing one in an adapter means a second place decides.
DECISION_NAMES = (
    "CHAIN_UNKNOWN",
    "chain_unknown",
    "is_ids_full",
    "ids_full_pause",
    "intent_id_need",
    "resend_after_session_unknown",
    "undeclared",
)


def _names_from(path: Path, modules: tuple[str, ...]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in modules
        for alias in node.names
    }


def test_the_client_adapters_import_no_decision_but_the_machine() -> None:
    modules = _modules(PACKAGE, "a2a_secure")
    used = {
        name: found
        for name, path in modules.items()
        if not name.startswith("a2a_secure.protocol") and (found := _names_from(path, DECISION_MODULES))
    }
    assert used == CLIENT_DECISIONS


def test_no_adapter_names_a_resend_rule() -> None:
    modules = _modules(PACKAGE, "a2a_secure")
    core_or_server = (
        "a2a_secure.protocol",
        "a2a_secure.delegation",
        "a2a_secure.runtime",
        "a2a_secure.server",
    )
    hits = {}
    for name, path in modules.items():
        if name.startswith(core_or_server):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
        }
        if bad := sorted(found & set(DECISION_NAMES)):
            hits[name] = bad
    assert hits == {}


def test_the_bridges_reach_the_client_through_the_one_machine_only() -> None:
    # The A2A transport and the MCP bridge's tool catalog call A2AClient; neither imports a
    # session, handshake or decision module of the core to make a call of its own.
    edges = graph(_modules(PACKAGE, "a2a_secure"))
    for bridge in ("a2a_secure.a2a_binding.client", "a2a_secure.llm_tools", "a2a_secure.mcp_server"):
        reached = {e for e in edges[bridge] if e.startswith("a2a_secure.protocol.client")}
        reached -= {"a2a_secure.protocol.client"}  # the facade: types (ClientSession) and input bounds
        assert reached == set(), bridge
