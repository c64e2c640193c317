"""What the intent processor hands to the runtime above it (PROTOCOL.md §6.1, §6.4, §12.3, §12.5).

The core decides; it never waits. Where an answer needs waiting (a handler run within its
deadline, a slot in the priority queue, a stream's events, the original of a byte-identical
retry still running, an ``intent_id`` claimed by a run that has not reported), the intent
processor hands the work to an object of :mod:`a2a_secure.runtime` through one of these
interfaces. They are structural (:class:`typing.Protocol`): the core names what it needs,
never the module that provides it, so that imports point one way (runtime -> protocol).

State: none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from a2a_secure.protocol.models import Intent
from a2a_secure.protocol.server.auditing import AuditFields
from a2a_secure.protocol.server.common import Reply
from a2a_secure.protocol.server.dispatcher import IntentContext
from a2a_secure.store.base import Begin, SessionRecord, StoredReply
from a2a_secure.store.intents import Claim

__all__ = ["Admission", "Claims", "PendingClaim", "Replay", "Runner", "Streams"]


class Admission(Protocol):
    """The priority queue's door (§12.3), asked before the sequence is consumed."""

    def has_room(self, priority: int) -> bool:
        """Whether an intent of ``priority`` would be admitted now."""
        ...


class Runner(Protocol):
    """Runs an accepted, non-streamed intent's handler within its deadline (§6.1 step 11)."""

    @property
    def gate(self) -> Admission:
        """The queue the handler waits in when a concurrency limit is set."""
        ...

    async def run(self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int) -> Any:
        """The handler's result, or the :class:`~a2a_secure.errors.A2AError` of step 11."""
        ...

    def start(
        self, goal: str, inputs: Any, context: IntentContext, timeout_ms: int
    ) -> tuple[Any, Awaitable[Any] | None]:
        """:meth:`run` as far as the handler goes without suspending: ``(result, None)``, or
        ``(None, rest)`` with ``rest`` to await for the result (within the deadline). The
        result is not checked yet: the caller writes it with ``replies.result_json``."""
        ...


class Streams(Protocol):
    """Runs streamed answers (§6.4)."""

    def has_room(self, session_id: str, sequence: int, did: str) -> bool:
        """Whether a stream for (``session_id``, ``sequence``) may go on or start for ``did``."""
        ...

    async def start(
        self,
        session: SessionRecord,
        sequence: int,
        req_hash: str,
        goal: str,
        inputs: Any,
        context: IntentContext,
        timeout_ms: int,
        audit: AuditFields,
    ) -> Reply:
        """Start the stream of an accepted intent; the reply once its first event exists."""
        ...


class Replay(Protocol):
    """Answers a byte-identical retry with the original's answer (§6.1 step 7)."""

    async def answer(
        self,
        session_id: str,
        sequence: int,
        req_hash: str,
        stored: StoredReply | None,
        audit: AuditFields,
        *,
        sealed: bool = False,
    ) -> Reply:
        """The original's answer; ``stored`` is None while the original is still running.

        ``sealed``: the session is sealed, so a stored success's result is sealed (§12.6).
        """
        ...


class PendingClaim(Protocol):
    """A request with an ``intent_id`` between its claim and its answer (§12.5)."""

    @property
    def claim(self) -> Claim | None:
        """The store's answer to the claim, once made."""
        ...

    # Sealed intents (§12.6): the answer as the claim keeps it (sealed under the intent's
    # answer key), and back, sealed for the resend's session; None for a plain intent.
    to_claim: Callable[[StoredReply], StoredReply] | None
    from_claim: Callable[[StoredReply, int, str], StoredReply] | None


class Claims(Protocol):
    """The ``intent_id`` extension (§12.5): one run per (DID, intent_id) across sessions.

    ``pending`` is always the value :meth:`prepare` returned for the same request.
    """

    def check(self, intent: Intent) -> None:
        """Step 1 for a server without the extension: ``intent_id`` is an unknown member."""
        ...

    def prepare(
        self,
        session: SessionRecord,
        intent: Intent,
        intent_obj: Mapping[str, Any],
        wants_stream: bool,
        now: float,
    ) -> PendingClaim | None:
        """The claim this request will make, or None (a refused intent claims nothing)."""
        ...

    async def begin(
        self,
        pending: Any,
        session: SessionRecord,
        sequence: int,
        request_hash: str,
        *,
        rate_limit: int | None,
        now: float,
    ) -> Begin:
        """§6.1 steps 7-8 and the claim, in one store step."""
        ...

    async def start(
        self, pending: Any, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply | None:
        """Record the start of a NEW claim's handler: None to run it, else the answer."""
        ...

    def is_resumable(self, stored: StoredReply | None) -> bool:
        """Whether a byte-identical retry finds the "still running" answer of a resend."""
        ...

    async def answer(
        self, pending: Any, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply:
        """The answer to a request whose claim was not NEW (it does not run the intent)."""
        ...

    async def resume(
        self, pending: Any, session_id: str, sequence: int, req_hash: str, audit: AuditFields
    ) -> Reply:
        """A byte-identical retry of a resend that was answered "still running"."""
        ...

    async def finish(self, session_id: str, sequence: int, stored: StoredReply) -> None:
        """Keep the answer of a run this process claimed."""
        ...
