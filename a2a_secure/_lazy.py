"""Lazy package attributes (PEP 562), so importing a package loads only what is used.

A package lists which submodule defines each of its public names; the first access to a
name imports that submodule and caches the value in the package, so later accesses are
plain attribute reads. Importing ``a2a_secure.identity`` for did:key work then does not load
httpx and the TLS stack that only the did:web resolver needs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["attach"]


def attach(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``exports`` maps each lazy
    name to the module that defines it.

    An unknown name raises ``AttributeError`` as for any module, so ``hasattr`` and
    ``from package import submodule`` keep working.
    """
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        # Cached in the package so the next access does not come back here.
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | table.keys())

    return __getattr__, __dir__
