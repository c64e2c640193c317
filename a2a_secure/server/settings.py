"""Every setting of an ``AgentServer``, read back from a built server, and how a server left
without one is given it: what serves an app as it was built (``a2a-secure serve --app``).

An app is served as the very object its module built: its handlers, approved actions, card
builder, delegation rules, tools, metrics and every other setting stay as they are. The
command line may only *add* what the app left unset (a shared store, an audit log, metrics,
log lines, a policy…); a setting both give differently refuses to start, naming the flag,
since either choice could fail open. :data:`SETTINGS` names one entry per parameter of
``AgentServer.__init__`` (a test walks the signature), so a new setting must say here how it
is read and whether the command line can give it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from a2a_secure.policy import DEFAULT_POLICY
from a2a_secure.protocol.priority import PriorityRights
from a2a_secure.protocol.server import IntentDispatcher, ServerLimits
from a2a_secure.protocol.tools import TOOL_LIST
from a2a_secure.store.memory import MemoryStore
from a2a_secure.system import mono_now, wall_now

if TYPE_CHECKING:
    from a2a_secure.identity.rotation import KeyRing
    from a2a_secure.server.app import AgentServer

__all__ = ["SETTINGS", "Setting", "give_settings", "refuse_later"]


class _Conflict(Exception):
    """The app and the command line give one setting two different values."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One constructor setting: how to read it from a built server, whether a value means
    "left unset", and (when the command line can give it) how a server is given it.

    ``flag``: the command line's word for it, named in a conflict. ``combine(app, given)``:
    the value to serve when both set it (raises :class:`_Conflict` when they differ).
    ``silent(given)``: whether a value given says nothing (default: ``unset``).
    """

    read: Callable[[AgentServer], Any]
    unset: Callable[[Any], bool]
    give: Callable[[AgentServer, Any], None] | None = None
    flag: str = ""
    combine: Callable[[Any, Any], Any] | None = None
    silent: Callable[[Any], bool] | None = None


def _never(_value: Any) -> bool:
    return False


def _same(ours: Any, given: Any) -> Any:
    if ours != given:
        raise _Conflict
    return ours


def _both_on(ours: Any, given: Any) -> Any:
    return ours  # metrics or request logs on in both: the app's own object serves


def _attr(name: str) -> Callable[[AgentServer, Any], None]:
    def give(server: AgentServer, value: Any) -> None:
        setattr(server, name, value)
        _rebuild(server)

    return give


def _rebuild(server: AgentServer) -> None:
    """The card and the core are built again, with the settings as they are now."""
    server._card = None
    server._protocol = None


def _give_store(server: AgentServer, store: Any) -> None:
    # Everything that was handed the store when the app was built takes the new one: the
    # approval engine and the tool catalogue keep actions and read sessions there.
    server.store = store
    if server._approvals is not None:
        server._approvals.store = store
    if server.has(TOOL_LIST):
        server.enable_tools()
    _rebuild(server)


def _give_audit(server: AgentServer, audit: Any) -> None:
    server._audit = audit if callable(audit) else audit.record
    _rebuild(server)


def _give_metrics(server: AgentServer, metrics: Any) -> None:
    if metrics is True:
        from a2a_secure.telemetry.metrics import ServerMetrics  # noqa: PLC0415 - metrics extra

        metrics = ServerMetrics()
    server.metrics = metrics
    server._observer.metrics = metrics
    # The handlers registered before metrics were on are timed from now on too.
    for goal, (handler, inner) in server._untimed.items():
        if goal in server._handlers:
            IntentDispatcher.add(server, goal, server._observer.timed(goal, handler), inner=inner)
    _rebuild(server)


def _give_log_requests(server: AgentServer, value: Any) -> None:
    server._observer.log_requests = bool(value)
    _rebuild(server)


def _give_tools(server: AgentServer, value: Any) -> None:
    if value:
        server.enable_tools()


def _ring_view(ring: KeyRing) -> tuple[Any, ...]:
    """What tells two key rings apart (an ``Identity`` compares by object, not by key)."""
    retired = tuple((r.identity.kid, r.retired_at, r.overlap_until) for r in ring.retired)
    return ring.current.kid, retired, ring.statements


def _combine_rings(ours: KeyRing, given: KeyRing) -> KeyRing:
    # The key file's ring with no retired key says nothing more than its current key, which
    # is the app's (checked before): the app's own ring serves.
    if given.retired and _ring_view(ours) != _ring_view(given):
        raise _Conflict
    return ours


def _combine_revocations(ours: tuple[Any, ...], given: tuple[Any, ...]) -> tuple[Any, ...]:
    return ours + tuple(r for r in given if r not in ours)  # deny lists only add up


def _default(value: Any) -> Callable[[Any], bool]:
    return lambda v: v == value


SETTINGS: Mapping[str, Setting] = {
    "identity": Setting(lambda s: s.identity, _never),
    "policy": Setting(lambda s: s.policy, _default(DEFAULT_POLICY), _attr("policy"), "--policy"),
    "name": Setting(lambda s: s.name, _never),
    "description": Setting(lambda s: s.description, _never),
    "version": Setting(lambda s: s.version, _never),
    "url": Setting(lambda s: s.url, _default(""), _attr("url"), "--url"),
    # An app's in-memory store holds nothing another worker could share: a store given
    # replaces it (its approvals and tools move with it); None given says nothing.
    "store": Setting(
        lambda s: s.store,
        lambda v: v is None or isinstance(v, MemoryStore),
        _give_store,
        "--redis-url",
        silent=lambda v: v is None,
    ),
    "resolver": Setting(lambda s: s.resolver, _never),
    "audit": Setting(lambda s: s._audit, _default(None), _give_audit, "--audit-log"),
    "limits": Setting(lambda s: s.limits, _default(ServerLimits()), _attr("limits"), "--policy"),
    "max_body": Setting(lambda s: s.max_body, _never),
    "clock": Setting(lambda s: s._clock, _default(wall_now)),
    "monotonic": Setting(lambda s: s._monotonic, _default(mono_now)),
    "key_ring": Setting(
        lambda s: s.key_ring, _default(None), _attr("key_ring"), "--key-file", _combine_rings
    ),
    "revocations": Setting(
        lambda s: s.revocations, _default(()), _attr("revocations"), "", _combine_revocations
    ),
    "priority_rights": Setting(
        lambda s: s.priority_rights,
        _default(PriorityRights()),
        _attr("priority_rights"),
        "--policy",
    ),
    "approvers": Setting(lambda s: s._approvers, _default(frozenset())),
    "approval": Setting(lambda s: s._approval_settings, _default(None)),
    "serve_tools": Setting(lambda s: s.has(TOOL_LIST), _default(False), _give_tools, "", _both_on),
    "metrics": Setting(lambda s: s.metrics, lambda v: not v, _give_metrics, "--metrics", _both_on),
    "log_requests": Setting(
        lambda s: s._observer.log_requests, _default(False), _give_log_requests, "--log-format", _both_on
    ),
    "delegation": Setting(lambda s: s.delegation, _default(None), _attr("delegation"), "--policy"),
    # Folded into the limits by the constructor: the command line gives it with them (--policy).
    "require_sealed": Setting(lambda s: s.limits.require_sealed, _default(False)),
}


def _conflict(spec: str, name: str) -> ValueError:
    flag = SETTINGS[name].flag
    where = f" ({flag})" if flag else ""
    return ValueError(
        f"app {spec!r} was built with its own {name.replace('_', ' ')}, and the command line"
        f" gives another{where}: give it in one place only"
    )


def refuse_later(server: AgentServer, names: Iterable[str], spec: str) -> None:
    """``ValueError`` if ``server`` set one of ``names``, which the command line will give
    its workers (a store, an audit log: opened only there, so not given in the check)."""
    for name in names:
        setting = SETTINGS[name]
        if not setting.unset(setting.read(server)):
            raise _conflict(spec, name)


def give_settings(server: AgentServer, given: Mapping[str, Any], spec: str) -> None:
    """Give ``server`` (built by the app ``spec``) the command line's settings ``given``.

    A value ``given`` that is its setting's default says nothing and is skipped; one the app
    left unset is given; one the app set too is combined (equal, or both on) or refused with
    a ``ValueError`` naming the setting and the flag.
    """
    for name, value in given.items():
        setting = SETTINGS[name]
        if (setting.silent or setting.unset)(value):
            continue
        ours = setting.read(server)
        if setting.unset(ours):
            if setting.give is None:
                raise ValueError(f"{name} cannot be given to an app from the command line")
            setting.give(server, value)
            continue
        try:
            kept = (setting.combine or _same)(ours, value)
        except _Conflict:
            raise _conflict(spec, name) from None
        if kept is not ours and setting.give is not None:
            setting.give(server, kept)
