"""Typed models of the messages of PROTOCOL.md §2, §5 and §6: raw dicts stop here.

Every model is a frozen, slotted dataclass built by ``parse(obj, error=...)``, which runs the
checks of the specification on the received JSON value *in the order the specification fixes*
(the tests check that order) and raises the error class the caller names: ``InvalidParams``
(-32602) for JSON-RPC ``params``, ``AuthenticationFailed`` (-32040) for a signed payload and
for a reply the client receives (§9). ``to_dict()`` gives the exact wire object back.

Constructing a model directly re-validates it through ``parse`` (``__post_init__``), so a
model cannot exist in a shape the wire would refuse; ``parse`` itself builds without that
second pass, because the intent path is hot.

Where to draw the line: a member the receiver *type-checks* today is typed here. A member of
a signed payload (or of a reply) that the receiver only *compares* with a value it already
holds (§3: "the receiver compares each member with the message's own fields and with its own
state") is kept as the JSON value received (typed :data:`Json`), and ``parse`` compares it
when given ``expected``. Comparison is stricter than a type check, and a type check in front
of it would change which failure a doubly-broken message reports, or (for numbers, where §1
equality makes ``1`` equal ``1.0``) what is accepted.

Hashes (``hello_hash``, ``challenge_hash``, ``hash_of(policy)``) are computed by the core on
the object *as received*; ``to_dict()`` gives an equal object back, but the core does not
rely on it.
"""

from a2a_secure.protocol.models._base import Json
from a2a_secure.protocol.models.events import EventMessage, EventPayload
from a2a_secure.protocol.models.handshake import (
    AcceptPayload,
    AcceptPolicy,
    Challenge,
    Hello,
    PolicyMessage,
    PolicyPayload,
    Proof,
    ProofPayload,
    PublicKeyEntry,
    SessionMessage,
    SessionPayload,
)
from a2a_secure.protocol.models.intents import (
    ClosePayload,
    CloseRequest,
    Constraints,
    Intent,
    IntentRequest,
    RequestPayload,
)
from a2a_secure.protocol.models.responses import (
    ClosedMessage,
    ErrorObject,
    IntentResultMessage,
    ResponsePayload,
)

__all__ = [
    "AcceptPayload",
    "AcceptPolicy",
    "Challenge",
    "CloseRequest",
    "ClosePayload",
    "ClosedMessage",
    "Constraints",
    "ErrorObject",
    "EventMessage",
    "EventPayload",
    "Hello",
    "Intent",
    "IntentRequest",
    "IntentResultMessage",
    "Json",
    "PolicyMessage",
    "PolicyPayload",
    "Proof",
    "ProofPayload",
    "PublicKeyEntry",
    "RequestPayload",
    "ResponsePayload",
    "SessionMessage",
    "SessionPayload",
]
