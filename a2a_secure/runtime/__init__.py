"""The runtime: the layer above the protocol core that waits (asyncio).

:mod:`a2a_secure.protocol` decides: it checks a request, consumes its sequence, signs its
answer, and says who may run. Whatever needs waiting happens here, as in h11 the state
machine never waits and its driver does. The runtime owns:

    router        ServerProtocol: builds the core's rooms and these, routes each method (§4)
    runner        an accepted intent's handler run within its deadline (§6.1 step 11)
    gate          the priority queue on the event loop: waiting for a slot, interrupting (§12.3)
    stream_pump   the pump task of a streamed answer, publishing its signed events (§6.4)
    stream_record one streamed answer's events and the queues of its readers (§6.4)
    replay        a byte-identical retry waiting for its still-running original (§6.1 step 7)
    exactly_once  the intent_id extension: a resend waiting on its claim's answer (§12.5)

It does not decide: what an answer says, who may run and who is interrupted, what is
signed, are the core's (:mod:`a2a_secure.protocol.server`), which hands work here through
the interfaces of :mod:`a2a_secure.protocol.server.ports` and never imports this package.
The HTTP adapters (:mod:`a2a_secure.server`, :mod:`a2a_secure.client`) sit above both.
``ServerProtocol`` loads on first use (PEP 562).
"""

from typing import TYPE_CHECKING

from a2a_secure._lazy import attach

if TYPE_CHECKING:
    from a2a_secure.runtime.router import ServerProtocol

__all__ = ["ServerProtocol"]

__getattr__, __dir__ = attach(__name__, {"ServerProtocol": "a2a_secure.runtime.router"})
