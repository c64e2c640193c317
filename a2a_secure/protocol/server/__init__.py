"""The server side of the protocol (PROTOCOL.md §5, §6): the decisions, no sockets, no waiting.

The rooms below take a request's decoded ``params`` and decide its answer, or the
:class:`A2AError` that the adapter turns into the JSON-RPC error of §7. State lives behind
the :class:`Store` interface, the peer's DID resolution behind a :class:`DIDResolver`, and
time and randomness are parameters, so the whole protocol runs in memory in tests and
behind any transport in production.

One module per section of the contract, each saying in its docstring what state it owns::

    handshake    the handshake responder: HELLO, PROOF, ACCEPT_POLICY (§5)
    intents      the intent processor: §6.1 steps 1-10, and close (§6.3)
    common_intent  the same for the common intent, flat: no models, no coroutine (§6.1)
    replies      signed results and errors, unsigned refusals (§6.2, §7)
    events       signed events of a streamed answer (§6.4)
    scheduler    the priority queue: who runs, who waits, who is interrupted (§12.3)
    deadlines    session lifetimes on the monotonic clock (§5.6)
    budget       failed signature-checked handshake steps per source (ATTACKS.md H4)
    auditing     one audit record per request (§8)
    dispatcher   goals and their handlers, what a handler is told
    ports        what the intent processor hands to the runtime (steps 7 and 11, §6.4, §12)
    common       ServerLimits (§9), Reply, which endpoint serves which method (§4)

What this package does not do: wait. Running a handler within its deadline, a slot in the
priority queue, a stream's pump, waiting on the original of a retry or on an
``intent_id`` claim, and :class:`~a2a_secure.runtime.router.ServerProtocol`, which builds
these rooms and routes each method to its room, are :mod:`a2a_secure.runtime`'s. No module
here imports asyncio, a network library or a clock (tests/test_import_graph.py).
"""

from __future__ import annotations

from a2a_secure.protocol.server.common import HANDSHAKE_METHODS as HANDSHAKE_METHODS
from a2a_secure.protocol.server.common import INTENT_METHODS as INTENT_METHODS
from a2a_secure.protocol.server.common import AuditHook, Reply, ServerLimits
from a2a_secure.protocol.server.common import endpoint_of as endpoint_of
from a2a_secure.protocol.server.dispatcher import IntentContext, IntentDispatcher
from a2a_secure.protocol.server.intents import parse_intent

__all__ = [
    "AuditHook",
    "IntentContext",
    "IntentDispatcher",
    "Reply",
    "ServerLimits",
    "parse_intent",
]
