"""The runtime's half of remote signing: await the signatures the core left pending.

When the server's key is held by a service (:mod:`a2a_secure.identity.remote`), the core
writes a :class:`~a2a_secure.identity.jws.PendingJWS` where each token goes. Before a reply
or a stream event leaves the runtime (sent, or kept for a retry), :func:`finish_reply` and
:func:`finish_event` await every pending signature of it at once and put the finished
tokens in their places. A pending token is a member of a reply's ``result`` object, of its
error's ``data``, or of an event: those are the only places looked at.

A signature that fails (the service is down, slow, or answers with another key) turns the
reply into an unsigned 503 -32048 the client may retry; the request's answer, if it was
kept, is signed again on that retry (PROTOCOL.md §6.1 step 7).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from a2a_secure.errors import Unavailable
from a2a_secure.identity.jws import PendingJWS
from a2a_secure.identity.keys import SignerFailed
from a2a_secure.protocol.server.common import Reply, ServerConfig
from a2a_secure.protocol.server.replies import unsigned_error

__all__ = ["finish_event", "finish_events", "finish_reply", "has_pending", "may_pend"]

_log = logging.getLogger(__name__)


def _pending_in(obj: object) -> list[tuple[MutableMapping[str, Any], str, PendingJWS]]:
    if not isinstance(obj, dict):
        return []
    return [(obj, k, v) for k, v in obj.items() if type(v) is PendingJWS]


def _slots(reply: Reply) -> list[tuple[MutableMapping[str, Any], str, PendingJWS]]:
    found = _pending_in(reply.result)
    error = reply.error
    if isinstance(error, Mapping):
        found += _pending_in(error.get("data"))
    return found


def may_pend(config: ServerConfig) -> bool:
    """Whether a reply may hold a token still to sign: a key held by a service signs the
    agent's answers, or a retired key (which may be one) answers some session."""
    return config.identity.remote or bool(config.retired_signers)


def has_pending(reply: Reply) -> bool:
    """True if ``reply`` holds a token whose signature is still to come, or is a stream
    (whose events are signed as they go)."""
    return reply.stream is not None or bool(_slots(reply))


async def _fill(slots: list[tuple[MutableMapping[str, Any], str, PendingJWS]]) -> None:
    tokens = await asyncio.gather(*(p.sign() for _, _, p in slots), return_exceptions=True)
    failed = next((t for t in tokens if isinstance(t, BaseException)), None)
    if failed is not None:
        if isinstance(failed, asyncio.CancelledError):
            raise failed
        _log.warning("a signature from the remote key holder failed: %s", failed)
        raise SignerFailed()
    for (where, key, _), token in zip(slots, tokens, strict=True):
        assert isinstance(token, str)
        where[key] = token


async def finish_reply(reply: Reply) -> Reply:
    """``reply`` with its pending tokens signed, or the unsigned 503 if a signature failed.

    A stream's events are signed as they are sent (a failure ends the stream)."""
    if reply.stream is not None:
        abort = reply.abort
        return replace(
            reply,
            stream=_signed_events(reply.stream),
            abort=_signed_abort(abort) if abort is not None else None,
        )
    slots = _slots(reply)
    if not slots:
        return reply
    try:
        await _fill(slots)
    except Unavailable as exc:
        return unsigned_error(exc)
    return reply


async def finish_events(events: Sequence[MutableMapping[str, Any]]) -> None:
    """:func:`finish_event` of each of ``events``, all signatures awaited at once."""
    slots = [slot for event in events for slot in _pending_in(event)]
    if slots:
        await _fill(slots)


async def finish_event(event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A stream event with its pending token signed (raises :class:`SignerFailed`)."""
    slots = _pending_in(event)
    if slots:
        await _fill(slots)
    return event


async def _signed_events(events: AsyncIterator[Mapping[str, Any]]) -> AsyncIterator[Mapping[str, Any]]:
    try:
        async for event in events:
            if isinstance(event, dict):
                await finish_event(event)
            yield event
    finally:
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await closer()


def _signed_abort(
    abort: Callable[[int], AsyncIterator[Mapping[str, Any]]],
) -> Callable[[int], AsyncIterator[Mapping[str, Any]]]:
    def signed(next_index: int) -> AsyncIterator[Mapping[str, Any]]:
        return _signed_events(abort(next_index))

    return signed
