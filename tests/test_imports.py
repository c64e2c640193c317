"""Import cost and import direction.

The identity and protocol layers are pure: importing them must not load the network stack
(httpx, h11, asyncio with ssl and socket) or the server extras, which only the adapters and
the did:web resolver need. Packages expose their public names lazily (PEP 562), and imports
point one way (errors -> identity -> protocol -> store / server / client, STYLE.md),
so did.py never imports keys.py and the stores never import the protocol core.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "a2a_secure"

HEAVY = ("httpx", "h11", "asyncio", "ssl", "socket", "fastapi", "uvicorn", "starlette", "redis")

LIGHT_MODULES = (
    "a2a_secure",
    "a2a_secure.identity",
    "a2a_secure.identity.did",
    "a2a_secure.identity.encoding",
    "a2a_secure.identity.jws",
    "a2a_secure.identity.keys",
    "a2a_secure.protocol",
    "a2a_secure.protocol.client",
    "a2a_secure.protocol.messages",
    "a2a_secure.protocol.models",
    "a2a_secure.policy",
    "a2a_secure.protocol.validate",
    "a2a_secure.store",
)

LAZY_PACKAGES = ("a2a_secure", "a2a_secure.identity", "a2a_secure.protocol")


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter that imports this tree; return its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_pure_layers_import_without_the_network_stack(module: str) -> None:
    out = _fresh_python(
        f"import json, sys\nimport {module}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert json.loads(out) == []


def test_every_public_name_resolves_from_a_fresh_interpreter() -> None:
    # From cold, each lazy name must load and be the very object its defining module holds.
    code = f"""
import importlib, json
out = {{}}
for name in {LAZY_PACKAGES!r}:
    pkg = importlib.import_module(name)
    out[name] = [(n, getattr(pkg, n) is not None, type(getattr(pkg, n)).__name__) for n in pkg.__all__]
print(json.dumps(out))
"""
    got = json.loads(_fresh_python(code))
    for name in LAZY_PACKAGES:
        assert [n for n, _, _ in got[name]] == list(importlib.import_module(name).__all__)
        assert all(present for _, present, _ in got[name])


def test_from_import_of_the_top_level_names_works_from_cold() -> None:
    out = _fresh_python(
        "from a2a_secure import A2AAgent, A2AClient, A2AError, AgentRegistry, Identity\n"
        "from a2a_secure.agent import A2AAgent as Agent\n"
        "print(A2AAgent is Agent, issubclass(A2AError, Exception), Identity.__name__)"
    )
    assert out.split() == ["True", "True", "Identity"]


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_lazy_package_exports_every_name_in_all(name: str) -> None:
    pkg = importlib.import_module(name)
    assert len(set(pkg.__all__)) == len(pkg.__all__)
    listed = dir(pkg)
    for attr in pkg.__all__:
        value = getattr(pkg, attr)
        assert value is not None, attr
        assert attr in listed, attr


def test_lazy_names_are_the_defining_modules_objects() -> None:
    import a2a_secure
    import a2a_secure.identity
    import a2a_secure.protocol
    from a2a_secure.agent import A2AAgent
    from a2a_secure.identity.didweb import DidWebResolver
    from a2a_secure.identity.keys import verify_signature
    from a2a_secure.policy import Policy
    from a2a_secure.runtime.router import ServerProtocol

    assert a2a_secure.A2AAgent is A2AAgent
    assert a2a_secure.verify_signature is verify_signature
    assert a2a_secure.identity.DidWebResolver is DidWebResolver
    assert a2a_secure.protocol.Policy is Policy
    assert a2a_secure.protocol.ServerProtocol is ServerProtocol


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_unknown_attribute_raises_attribute_error(name: str) -> None:
    pkg = importlib.import_module(name)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = pkg.no_such_name
    assert not hasattr(pkg, "no_such_name")


# -- import direction ------------------------------------------------------------------------


def _imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` imports, at the top or inside a function or TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _module_imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    return _imported_modules(path.read_text(encoding="utf-8"), package)


def _offending(paths: list[Path], forbidden: str) -> dict[str, list[str]]:
    bad = {}
    for path in paths:
        hits = sorted(m for m in _module_imports(path) if m == forbidden or m.startswith(forbidden + "."))
        if hits:
            bad[str(path.relative_to(REPO))] = hits
    return bad


def test_the_stores_do_not_import_the_protocol_core() -> None:
    paths = sorted((PACKAGE / "store").glob("*.py"))
    assert paths
    assert _offending(paths, "a2a_secure.protocol") == {}


def test_values_below_the_protocol_do_not_import_it() -> None:
    paths = [PACKAGE / "policy.py", PACKAGE / "checks.py"]
    assert _offending(paths, "a2a_secure.protocol") == {}


def test_did_does_not_import_keys() -> None:
    # keys.py imports did.py to name an identity; the reverse edge would be a cycle.
    paths = [PACKAGE / "identity" / "did.py", PACKAGE / "identity" / "ed25519.py"]
    assert _offending(paths, "a2a_secure.identity.keys") == {}


def test_identity_does_not_import_upper_layers() -> None:
    paths = sorted((PACKAGE / "identity").glob("*.py"))
    for upper in ("a2a_secure.protocol", "a2a_secure.store", "a2a_secure.server", "a2a_secure.client"):
        assert _offending(paths, upper) == {}, upper


def test_the_direction_checker_sees_every_kind_of_import() -> None:
    # The checks above would pass vacuously if lazy or relative imports were missed.
    source = (
        "import a2a_secure.protocol.server\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..protocol import policy\n"
        "def f():\n    from .keys import Identity\n"
    )
    found = _imported_modules(source, "a2a_secure.identity")
    assert {"a2a_secure.protocol.server", "a2a_secure.protocol.policy", "a2a_secure.identity.keys"} <= found
    assert "a2a_secure.identity.ed25519" in _module_imports(PACKAGE / "identity" / "did.py")
