"""a2a_secure.frozen: the faster constructors build the very instances the dataclass would."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from a2a_secure.frozen import builder, quick_init
from a2a_secure.protocol.server import Reply
from a2a_secure.protocol.server.dispatcher import IntentContext
from a2a_secure.store.base import Begin, BeginKind, StoredReply


def _twin(cls: type[Any]) -> type[Any]:
    """``cls`` as the plain frozen slotted dataclass, without quick_init."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    made = dataclasses.make_dataclass(cls.__name__, [(n, t, dataclasses.field(
        default=f.default, init=f.init, repr=f.repr, compare=f.compare, kw_only=f.kw_only
    )) for n, t, f in fields], frozen=True, slots=True)  # fmt: skip
    return made


@pytest.mark.parametrize("cls", [Reply, StoredReply, Begin])
def test_the_hot_values_keep_their_constructor(cls: type[Any]) -> None:
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    twin = _twin(cls)
    assert str(inspect.signature(cls.__init__)) == str(inspect.signature(twin.__init__))


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: Any = None
    c: list[int] | None = None
    d: str = field(default="d", init=False)
    e: int = field(default=5, kw_only=True)


@quick_init
@dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: Any = None
    c: list[int] | None = None
    d: str = field(default="d", init=False)
    e: int = field(default=5, kw_only=True)


def _fields(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, 2), {}), ((1, 2, [3]), {"e": 6}), ((), {"a": 1, "c": None, "b": "x"})],
)
def test_quick_init_builds_what_the_dataclass_builds(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    quick, plain = Quick(*args, **kwargs), Plain(*args, **kwargs)
    assert _fields(quick) == _fields(plain)
    assert repr(quick).replace("Quick", "Plain") == repr(plain)
    assert quick == Quick(*args, **kwargs) and quick != Quick(99)
    assert str(inspect.signature(Quick.__init__)) == str(inspect.signature(Plain.__init__))
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 2  # type: ignore[misc]
    assert dataclasses.replace(quick, b="y").b == "y"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, 2, 3, 4), {}), ((1,), {"a": 1}), ((1,), {"z": 1}), ((1, 2, 3, 4), {"e": 1})],
)
def test_quick_init_refuses_what_the_dataclass_refuses(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        Plain(*args, **kwargs)
    with pytest.raises(TypeError):
        Quick(*args, **kwargs)


def test_quick_init_runs_post_init_and_takes_no_factory() -> None:
    seen: list[int] = []

    @quick_init
    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            seen.append(self.a)

    Checked(4)
    assert seen == [4]
    with pytest.raises(TypeError, match="default_factory"):

        @quick_init
        @dataclass(frozen=True, slots=True)
        class Factory:
            a: list[int] = field(default_factory=list)


def test_the_hot_values_are_what_they_were() -> None:
    stored = StoredReply(200, {"x": 1}, None, None, False, 7)
    assert stored == StoredReply(200, result={"x": 1}, signed_at=7) and stored.encoded is None
    assert stored.with_json(b"{}").encoded == b"{}"
    assert Begin(BeginKind.NEW, 3) == Begin(BeginKind.NEW, last_sequence=3, reply=None, retry_after=0)
    assert hash(Begin(BeginKind.STALE, 2)) == hash(Begin(BeginKind.STALE, 2))
    reply = Reply(200, {"a": 1}, stored=stored, result_json=b"{}")
    assert (reply.error, reply.retry_after, reply.stream, reply.abort) == (None, None, None, None)
    assert reply == Reply(200, {"a": 1}, None, None, None, None, stored, b"{}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        reply.http_status = 500  # type: ignore[misc]


def test_builder_takes_every_slot_in_order_and_no_more() -> None:
    build = builder(IntentContext)
    values = ("did:key:z", "sid", 4, "echo", None, {"timeout_ms": 5}, "agent", 3, None, None, None, True)
    built = build(*values)
    assert built == IntentContext(*values)
    assert type(built) is IntentContext
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.goal = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        build(*values[:-1])
    with pytest.raises(TypeError):
        build(*values, None)
