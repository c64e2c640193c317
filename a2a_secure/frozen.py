"""Frozen slotted dataclasses, built for a fraction of what their generated ``__init__`` costs.

A frozen dataclass's ``__init__`` writes each field through ``object.__setattr__``, which looks
the field's name up on the type every time; on the path of every intent a handful of them (the
reply, its stored form, the store's decision, the handler's context, the parsed models) cost
more together than several protocol checks. Both tools here write each slot through its own
descriptor, in straight-line code generated once per class (as dataclasses generates its
``__init__``):

* :func:`quick_init`, a decorator under ``@dataclass(frozen=True, slots=True)``, replaces the
  generated ``__init__`` with one of the very same signature (names, kinds, defaults,
  annotations) and effect;
* :func:`builder` returns a function taking every slot positionally, in order, that neither
  checks nor runs ``__post_init__``: for values already checked (a parsed model).

The instances are those the dataclass would build: frozen, equal, hashed and shown as before
(tests/test_frozen.py). Depends on nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["builder", "quick_init"]

_T = TypeVar("_T")


def _setters(cls: type[Any], namespace: dict[str, Any]) -> list[str]:
    """The slots of ``cls`` in order; each slot's descriptor setter named ``_set<i>`` in ``namespace``."""
    names: tuple[str, ...] = cls.__slots__
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__
    return list(names)


def builder(cls: type[_T]) -> Callable[..., _T]:
    """A function ``build(*slots)`` making an instance of the slotted ``cls`` from the values of
    all its slots, in their order, unchecked and without ``__post_init__``."""
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    names = _setters(cls, namespace)
    params = ", ".join(f"v{i}" for i in range(len(names)))
    body = "".join(f"    _set{i}(self, v{i})\n" for i in range(len(names)))
    exec(f"def build({params}):\n    self = _new(_cls)\n{body}    return self\n", namespace)  # noqa: S102
    build: Callable[..., _T] = namespace["build"]
    build.__qualname__ = f"builder({cls.__qualname__})"
    return build


def quick_init(cls: type[_T]) -> type[_T]:
    """Give the frozen slotted dataclass ``cls`` an ``__init__`` of the same signature that writes
    each slot through its descriptor. A field with a ``default_factory`` is refused."""
    original = cls.__init__
    namespace: dict[str, Any] = {}
    names = _setters(cls, namespace)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    params: list[str] = ["self"]
    body: list[str] = []
    keyword_only = False
    for i, name in enumerate(names):
        field = fields[name]
        if field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{name}: quick_init takes no default_factory")
        has_default = field.default is not dataclasses.MISSING
        if has_default:
            namespace[f"_default{i}"] = field.default
        if not field.init:
            if has_default:
                body.append(f"    _set{i}(self, _default{i})\n")
            continue
        if field.kw_only and not keyword_only:
            params.append("*")
            keyword_only = True
        params.append(f"{name}=_default{i}" if has_default else name)
        body.append(f"    _set{i}(self, {name})\n")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()\n")
    source = f"def __init__({', '.join(params)}):\n{''.join(body) or '    pass'}\n"
    exec(source, namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__annotations__ = dict(original.__annotations__)
    init.__qualname__ = original.__qualname__
    init.__module__ = original.__module__
    if inspect.signature(init) != inspect.signature(original):  # never silently another API
        raise TypeError(f"{cls.__name__}: quick_init would change the signature of __init__")
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
