"""Audit assembly for the server side (PROTOCOL.md §8).

Each request gathers its audit fields in an :class:`AuditFields` while the other rooms
process it (who the caller is, which session and sequence, whether a signature was
verified); :class:`AuditWriter` turns them and the reply into one call of the audit hook.
A streamed answer (§6.4) writes its record at its final event, with that event's status.

State: none between requests; the hook (``a2a_secure.audit`` or the application's own)
keeps whatever it records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_secure.protocol.server.common import AuditHook, MonoClock, Reply, ServerConfig

__all__ = ["AuditFields", "AuditWriter", "ObserveHook"]

# Called once per answered request with its audit fields, its reply and its duration (s).
ObserveHook = Callable[[Any, Reply, float], object]


@dataclass(slots=True)
class AuditFields:
    """Audit fields gathered while a request is processed (PROTOCOL.md §8)."""

    event: str
    # When the request began, on the MONOTONIC clock (durations only: a wall clock stepped
    # back mid-request made a negative duration, which the audit record refuses).
    started: float
    session_id: str | None = None
    client_did: str | None = None
    intent_goal: str | None = None
    sequence: int | None = None
    verified: bool = False
    deferred: bool = False  # a stream writes its record at its final event
    signature_checked: bool = False  # an Ed25519 verification was spent on this request
    # §12.7: the principal and name of the verified chain the intent ran under
    principal: str | None = None
    delegation: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class AuditWriter:
    """Writes one audit record per request through the hook (none without a hook)."""

    def __init__(
        self,
        hook: AuditHook | None,
        config: ServerConfig,
        monotonic: MonoClock,
        observe: ObserveHook | None = None,
    ) -> None:
        self._hook = hook
        self._config = config
        self._clock = monotonic  # durations only
        self._observe = observe

    @property
    def observe(self) -> ObserveHook | None:
        """Who is told of every answered request (telemetry), or None."""
        return self._observe

    @observe.setter
    def observe(self, value: ObserveHook | None) -> None:
        self._observe = value

    def write(self, a: AuditFields, reply: Reply) -> None:
        """The record of a request that ended with ``reply``."""
        if self._observe is not None:  # telemetry (a2a_secure.telemetry): fields, never inputs
            self._observe(a, reply, self._clock() - a.started)
        if self._hook is None:
            return
        code = reply.error.get("code") if reply.error is not None else None
        # Passed only when there is a chain: a hook written for the base record keeps working.
        chain = {} if a.principal is None else {"principal": a.principal, "delegation": a.delegation}
        self._hook(
            event=a.event,
            role="server",
            session_id=a.session_id,
            client_did=a.client_did,
            server_did=self._config.identity.did,
            intent_goal=a.intent_goal,
            sequence=a.sequence,
            status="error" if reply.is_error else "success",
            duration_ms=round((self._clock() - a.started) * 1000, 3),
            error_code=code,
            verified=a.verified,
            **chain,
        )

    def write_stream_end(self, a: AuditFields, code: int | None) -> None:
        """The record of a streamed answer whose final event carried error ``code`` (or none)."""
        self.write(a, Reply(200, error={"code": code, "message": ""} if code is not None else None))

    async def audited(
        self, events: AsyncIterator[Mapping[str, Any]], audit: AuditFields
    ) -> AsyncIterator[Mapping[str, Any]]:
        """A replayed stream is one audit record, written at its final event with its status.

        The caller sets ``audit.deferred`` before handing this generator out (its body runs
        only when the adapter starts reading).
        """
        code: int | None = None
        try:
            async for event in events:
                if event.get("final") is True and event.get("status") == "error":
                    code = event["error"]["code"]
                yield event
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()
            self.write_stream_end(audit, code)
