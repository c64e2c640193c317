"""The server side of the protocol (PROTOCOL.md §5, §6): no sockets, no HTTP.

``ServerProtocol`` takes a method name and its decoded ``params`` and returns the reply to
send, or the :class:`A2AError` that the adapter turns into the JSON-RPC error of §7.
State lives behind the :class:`Store` interface, the peer's DID resolution behind a
:class:`DIDResolver`, and time and randomness are parameters, so the whole protocol runs in
memory in tests and behind any transport in production.

One module per section of the contract, each saying in its docstring what state it owns::

    router       ServerProtocol: builds the rooms, routes a method to its room (§4)
    handshake    the handshake responder: HELLO, PROOF, ACCEPT_POLICY (§5)
    intents      the intent processor: §6.1 steps 1-10, and close (§6.3)
    replies      signed results and errors, unsigned refusals (§6.2, §7)
    replay       stored answers, byte-identical retries (§6.1 step 7)
    runner       the handler within its deadline (§6.1 step 11)
    scheduler    the priority queue: who runs, who waits, who is interrupted (§12.3)
    gate         the scheduler's event-loop side: waiting for a slot, interrupting (§12.3)
    streams      the stream pump: signed events of a streamed answer (§6.4)
    exactly_once the intent_id extension: one run per (DID, intent_id) across sessions
    deadlines    session lifetimes on the monotonic clock (§5.6)
    budget       failed signature-checked handshake steps per source (ATTACKS.md H4)
    auditing     one audit record per request (§8)
    dispatcher   goals and their handlers, what a handler is told
    common       ServerLimits (§9), Reply, which endpoint serves which method (§4)

Only ``runner``, ``gate``, ``streams``, ``replay`` and ``exactly_once`` wait on the event loop
and import asyncio.
"""

from __future__ import annotations

from a2a_secure.protocol.server.common import HANDSHAKE_METHODS as HANDSHAKE_METHODS
from a2a_secure.protocol.server.common import INTENT_METHODS as INTENT_METHODS
from a2a_secure.protocol.server.common import AuditHook, Reply, ServerLimits
from a2a_secure.protocol.server.common import endpoint_of as endpoint_of
from a2a_secure.protocol.server.dispatcher import IntentContext, IntentDispatcher
from a2a_secure.protocol.server.intents import parse_intent
from a2a_secure.protocol.server.router import ServerProtocol

__all__ = [
    "AuditHook",
    "IntentContext",
    "IntentDispatcher",
    "Reply",
    "ServerLimits",
    "ServerProtocol",
    "parse_intent",
]
