"""Two identical worlds, one answering through the common intent's flat path, one through the
general path, and signed requests to send to both (tests/test_common_intent*.py).

``ServerProtocol.handle_now`` answers the common intent through the flat path of
:mod:`a2a_secure.protocol.server.common_intent`; ``handle`` takes the general path for every
request. :class:`Pair` sends the same request to both and checks that the answers (the two
ASGI messages the adapter sends, so the bytes on the wire and the HTTP status; the JSON-RPC
code and message; the stored answer), the audit records, the stores and the handlers' runs
are the same.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

from protocol_helpers import DROP, T0, Flow, World, identity, make_world, sign_raw, snapshot

from a2a_secure.identity import encoding
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import ClientSession
from a2a_secure.protocol.server import IntentContext, Reply, ServerLimits
from a2a_secure.server.asgi import reply_messages as _reply_messages

POLICY = Policy.build(blocked=("blocked",), rate_limit=10**6)
MALLORY = identity("mallory")


async def _slow(inputs: Any, ctx: IntentContext) -> Any:
    await asyncio.sleep(0)  # suspends once: the handler's rest is awaited
    return {"slow": inputs, "priority": ctx.priority, "constraints": dict(ctx.constraints)}


async def _context(inputs: Any, ctx: IntentContext) -> Any:
    # Everything a handler is told, in the order it is told: the two paths must agree.
    return {
        "caller": ctx.caller_did,
        "session": ctx.session_id,
        "sequence": ctx.sequence,
        "goal": ctx.goal,
        "domain": ctx.domain,
        "constraints": list(ctx.constraints.items()),
        "agent": ctx.client_agent_id,
        "priority": ctx.priority,
        "intent_id": ctx.intent_id,
        "principal": ctx.principal,
    }


async def _ticks(inputs: Any, ctx: IntentContext) -> Any:
    yield {"tick": 1}


class Pair:
    """Two identical worlds: ``fast`` answered through ``handle_now``, ``general`` through ``handle``."""

    def __init__(self, policy: Policy = POLICY, limits: ServerLimits | None = None) -> None:
        self.fast = make_world(policy, limits=limits)
        self.general = make_world(policy, limits=limits)
        for w in (self.fast, self.general):
            w.handlers.dispatcher.add("slow", _slow)
            w.handlers.dispatcher.add("context", _context)
            w.handlers.dispatcher.add_stream("ticks", _ticks, always=True)
        self.flat = 0  # requests the flat path started (it may hand them on after step 4)

    async def open(self, *, seal: bool = False) -> ClientSession:
        sessions = []
        for w in (self.fast, self.general):
            flow = Flow(w)
            flow.hs.seal = seal
            sessions.append(await flow.complete())
        assert sessions[0].session_id == sessions[1].session_id
        return sessions[0]

    async def send(self, method: str, params: Any) -> Reply:
        """Send ``params`` to both worlds; the two answers and states must be the same."""
        fast_params, general_params = copy.deepcopy(params), copy.deepcopy(params)
        common = method == "intent" and self.fast.server._intents.common(copy.deepcopy(params)) is not None
        pending = self.fast.server.handle_now(method, fast_params)
        fast = pending if isinstance(pending, Reply) else await pending
        general = await self.general.server.handle(method, general_params)
        if fast.stream is not None or general.stream is not None:  # §6.4: the general path's
            assert fast.stream is not None and general.stream is not None
            assert [e async for e in fast.stream] == [e async for e in general.stream]
            fast, general = _without_stream(fast), _without_stream(general)
        assert_same(fast, general)
        assert_same_state(self.fast, self.general)
        self.flat += common
        return fast


def _without_stream(reply: Reply) -> Reply:
    return dataclasses.replace(reply, stream=None, abort=None)


def assert_same(fast: Reply, general: Reply) -> None:
    assert fast.stream is None and general.stream is None
    for close in (False, True):
        assert _reply_messages(7, fast, close) == _reply_messages(7, general, close)
        assert _reply_messages("id", fast, close) == _reply_messages("id", general, close)
    assert (fast.http_status, fast.result, fast.error, fast.retry_after, fast.result_json) == (
        general.http_status,
        general.result,
        general.error,
        general.retry_after,
        general.result_json,
    )
    assert fast.stored == general.stored
    if fast.stored is not None and general.stored is not None:
        assert fast.stored.to_json() == general.stored.to_json()


def assert_same_state(a: World, b: World) -> None:
    assert snapshot(a.store) == snapshot(b.store)
    assert a.handlers.calls == b.handlers.calls
    records = [[{k: v for k, v in r.items() if k != "duration_ms"} for r in w.audit] for w in (a, b)]
    assert records[0] == records[1]


def signed_params(sess: ClientSession, payload: dict[str, Any], params_intent: Any = None) -> dict[str, Any]:
    """Params carrying ``payload`` signed by the session's client (and its intent, unless told)."""
    token = sign_raw(payload, sess.identity, typ=m.Typ.REQUEST)
    return {
        "session_id": sess.session_id,
        "session_commitment": sess.session_commitment,
        "sequence": payload.get("sequence"),
        "intent": payload.get("intent") if params_intent is None else params_intent,
        "request_jws": token,
    }


def next_sequence(sess: ClientSession) -> int:
    sess.last_sequence += 1
    return sess.last_sequence


def payload_for(sess: ClientSession, intent: Any, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = {
        "session_id": sess.session_id,
        "session_commitment": sess.session_commitment,
        "sequence": next_sequence(sess),
        "timestamp": T0,
        "intent": intent,
    }
    for name, value in (changes or {}).items():
        if value is DROP:
            del payload[name]
        else:
            payload[name] = value
    return payload


def raw_token(sess: ClientSession, payload_json: bytes, signer: Any = None) -> str:
    """A token over the exact payload bytes given (duplicate members, any spacing)."""
    header = encoding.b64u_encode(
        encoding.dumps({"alg": "EdDSA", "typ": m.Typ.REQUEST, "kid": sess.identity.kid})
    )
    signing_input = f"{header}.{encoding.b64u_encode(payload_json)}"
    signature = (signer or sess.identity).sign(signing_input.encode("ascii"))
    return f"{signing_input}.{encoding.b64u_encode(signature)}"


def non_canonical(text: str) -> str:
    """``text`` (base64url of a length that leaves spare bits) with a spare bit set."""
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(text[-1])
    return text[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last + 1]


ECHO = {"goal": "echo", "inputs": {"text": "hi"}}
ECHO_A = {"goal": "echo", "inputs": {"a": 1}}
