"""The common intent as bytes (``protocol/client_wire.py``) against the general path.

The request a session writes from one text of the intent is, byte for byte, what writing
its payload, params and body whole gives. An answer is taken from its bytes only when it is
the server's own success for that very request: every forged or altered answer below is
left to the general path (``verified_reply`` gives None), which refuses it, through the
real ``Transport`` reading of the reply and ``ClientSession.verify_result``; answers that
are merely written another way are left to it too, and accepted there.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from a2a_secure.client.transport import RetryPolicy, Transport
from a2a_secure.errors import A2AError, AuthenticationFailed
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign_bytes
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client_session import ClientSession, IntentResult, PreparedRequest
from a2a_secure.protocol.sealing import SessionKeys
from a2a_secure.protocol.server.replies import SignedReplies
from a2a_secure.protocol.wire import encode_request, encode_request_json, encode_result_json

CLIENT = Identity.generate("client")
SERVER = Identity.generate("server")
MALLORY = Identity.generate("mallory")
SESSION_ID = "B-xciq9ndoMKOqzjXRDtSiA1Xj2Sqd6NtdmT3Isjeoc"
RID = 41


class _Config:
    """What SignedReplies reads of a server's configuration: its signer."""

    def signer(self, _session_id: str) -> Identity:
        return SERVER


def session(seal_keys: SessionKeys | None = None) -> ClientSession:
    return ClientSession(
        identity=CLIENT,
        server_did=SERVER.did,
        server_kid=SERVER.kid,
        server_key=SERVER.public_key,
        session_id=SESSION_ID,
        session_commitment="sha256:" + "ab" * 32,
        policy=Policy.build(),
        created_at=int(time.time()),
        expires_at=int(time.time()) + 3600,
        seal_keys=seal_keys,
    )


def answer(req: PreparedRequest, result: Any, *, rid: int = RID, **signed: Any) -> bytes:
    """The server's success for ``req`` as its adapter sends it (``signed``: what it signs
    instead of the request's own session, sequence, request hash or the time)."""
    reply = SignedReplies(_Config()).success(  # type: ignore[arg-type]
        signed.get("session_id", SESSION_ID),
        signed.get("sequence", req.sequence),
        signed.get("request_hash", req.request_hash),
        result,
        signed.get("timestamp", int(time.time())),
    )
    assert reply.result_json is not None
    return encode_result_json(rid, reply.result_json)


INTENTS: list[dict[str, Any]] = [
    {"goal": "echo", "inputs": {"n": 1}},
    {"goal": "echo", "inputs": {}, "intent_id": "A" * 22},
    {"inputs": {"text": "héllo ✓", "x": [1.5, None, True, "\u2028"]}, "goal": "tränslate"},
    {"goal": 'g\x01\x1f\u2028\u2029"\\/\x7f\U0001f600', "inputs": {"k\x00": "\ud7ff\ue000"}},
    {
        "goal": "g",
        "domain": "d",
        "inputs": {"deep": {"a": [{"b": 1e300}]}},
        "constraints": {"timeout_ms": 5000, "stream": False},
        "priority": 4,
        "intent_id": "Zz-_" * 8,
    },
]


@pytest.mark.parametrize("intent", INTENTS)
def test_the_request_is_written_as_writing_it_whole_gives(intent: dict[str, Any]) -> None:
    sess = session()
    req = sess.prepare_intent(intent)
    assert req.params_json is not None
    assert req.params_json == encoding.dumps(req.params)
    assert encode_request_json("intent", req.params_json, 7) == encode_request("intent", req.params, 7)
    token = req.params["request_jws"]
    header, payload, signing_input, _signature = jws_decode_unverified(token)
    assert header == {"alg": "EdDSA", "typ": m.Typ.REQUEST, "kid": CLIENT.kid}
    signed = {
        "session_id": SESSION_ID,
        "session_commitment": sess.session_commitment,
        "sequence": req.sequence,
        "timestamp": req.timestamp,
        "intent": intent,
    }
    assert payload == signed
    assert signing_input.split(b".")[1] == encoding.b64u_encode_bytes(encoding.dumps(signed))
    assert req.request_hash == m.request_hash(token)
    assert req.intent_id == intent.get("intent_id")


def test_the_servers_success_is_taken_from_its_bytes_as_the_general_path_takes_it() -> None:
    sess = session()
    req = sess.prepare_intent({"goal": "echo", "inputs": {"n": 1, "s": "é"}})
    content = answer(req, {"n": 1, "s": "é"})
    got = sess.verified_reply(req, RID, content)
    assert got is not None
    assert got == sess.verify_result(req, orjson.loads(content)["result"])
    assert got == IntentResult("success", req.sequence, {"n": 1, "s": "é"}, got.response_jws, None)


def answer_raw(req: PreparedRequest, raw: bytes) -> bytes:
    """A success the server's key signs whose result is the text ``raw`` (which the server
    itself would refuse to write: a hostile or broken server)."""
    payload = (
        b'{"session_id":"%s","sequence":%d,"request_hash":"%s","status":"success","result":%s,"timestamp":%d}'
    )
    payload %= (SESSION_ID.encode(), req.sequence, req.request_hash.encode(), raw, int(time.time()))
    token = jws_sign_bytes(payload, SERVER, m.Typ.RESPONSE)
    sent = b'{"status":"success","sequence":%d,"result":%s,"response_jws":"%s"}' % (req.sequence, raw, token)
    return encode_result_json(RID, sent)


def _replace(content: bytes, old: bytes, new: bytes) -> bytes:
    assert content.count(old) == 1, (old, content)
    return content.replace(old, new)


def _token(content: bytes) -> bytes:
    return content.split(b'"response_jws":"')[1].split(b'"')[0]


def _resigned(content: bytes, signer: Identity, header: bytes | None = None) -> bytes:
    """``content`` with its token's payload signed again by ``signer`` (under ``header``)."""
    token = _token(content)
    payload = encoding.b64u_decode(token.split(b".")[1].decode())
    forged = jws_sign_bytes(payload, signer, m.Typ.RESPONSE)
    if header is not None:
        head = encoding.b64u_encode_bytes(header)
        signing_input = head + b"." + forged.split(b".")[1]
        forged = signing_input + b"." + encoding.b64u_encode_bytes(signer.sign(signing_input))
    return content.replace(token, forged)


def _flip_signature(content: bytes) -> bytes:
    token = _token(content)
    head, payload, sig = token.split(b".")
    raw = bytearray(encoding.b64u_decode(sig.decode()))
    raw[5] ^= 1
    return content.replace(token, b"%s.%s.%s" % (head, payload, encoding.b64u_encode_bytes(bytes(raw))))


def _forgeries(req: PreparedRequest) -> dict[str, bytes]:
    honest = answer(req, {"n": 1})
    seq = b'"sequence":%d' % req.sequence
    other_kid = orjson.dumps({"alg": "EdDSA", "typ": m.Typ.RESPONSE, "kid": MALLORY.kid})
    return {
        "outer result altered": _replace(honest, b'"result":{"n":1}', b'"result":{"n":2}'),
        "outer sequence altered": _replace(honest, seq, b'"sequence":%d' % (req.sequence + 1)),
        "outer status altered": _replace(honest, b'"status":"success"', b'"status":"failure"'),
        "a member added to the result": _replace(honest, b'"result":{"n":1}', b'"result":{"n":1},"x":1'),
        "a member given twice": _replace(honest, b'"result":{"n":1}', b'"result":{"n":1},"result":{"n":1}'),
        "the answer to another request id": answer(req, {"n": 1}, rid=RID + 1),
        "signed by another key": _resigned(honest, MALLORY),
        "signed by another key under its own kid": _resigned(honest, MALLORY, other_kid),
        "signature altered": _flip_signature(honest),
        "signed for another sequence": answer(req, {"n": 1}, sequence=req.sequence + 1),
        "signed for another request": answer(req, {"n": 1}, request_hash="sha256:" + "0" * 64),
        "signed for another session": answer(req, {"n": 1}, session_id="A" * 43),
        "signed long ago": answer(req, {"n": 1}, timestamp=int(time.time()) - 3600),
        "signed in the future": answer(req, {"n": 1}, timestamp=int(time.time()) + 3600),
        "a token with a fourth segment": _replace(honest, b'"}}', b'.AAAA"}}'),
        "a result out of the I-JSON range": answer_raw(req, b'{"n":1152921504606846976}'),
        "a result with a member given twice": answer_raw(req, b'{"n":1,"n":2}'),
    }


async def _general(sess: ClientSession, req: PreparedRequest, content: bytes) -> IntentResult:
    """The reply ``content`` read by the real Transport and verified as A2AClient does."""

    class _Pool:
        async def post(self, *_a: Any, **_k: Any) -> tuple[int, bytes, str | None]:
            return 200, content, None

    transport = Transport(None, _Pool(), RetryPolicy(attempts=1))  # type: ignore[arg-type]
    _status, result, error, _ra = await transport._post("http://x/a2a/intent", b"{}", RID, sess, req)
    if error is not None:
        raise sess.error_from_reply(req, error)
    return result if type(result) is IntentResult else sess.verify_result(req, result)


@pytest.mark.parametrize("case", sorted(_forgeries(session().prepare_intent({"goal": "echo", "inputs": {}}))))
def test_a_forged_or_altered_answer_is_not_taken_from_its_bytes_and_is_refused(case: str) -> None:
    sess = session()
    req = sess.prepare_intent({"goal": "echo", "inputs": {"n": 1}})
    assert sess.verified_reply(req, RID, answer(req, {"n": 1})) is not None  # the honest one is
    forged = _forgeries(req)[case]
    assert sess.verified_reply(req, RID, forged) is None
    with pytest.raises(A2AError) as refused:
        asyncio.run(_general(sess, req, forged))
    assert not refused.value.signed
    # -32040 for what does not verify, -32045 for a stale answer, -32603 for a body that is
    # not I-JSON at all.
    assert isinstance(refused.value, AuthenticationFailed) or refused.value.code in (-32045, -32603)


OTHERWISE: dict[str, tuple[bytes, bytes]] = {
    "spaces in the envelope": (b'"jsonrpc":"2.0",', b'"jsonrpc": "2.0", '),
    "members in another order": (b'{"jsonrpc":"2.0","id":41,', b'{"id":41,"jsonrpc":"2.0",'),
    "the same result written otherwise": (b'"result":{"n":1,"m":2}', b'"result":{"m":2,"n":1.0}'),
}


@pytest.mark.parametrize("case", sorted(OTHERWISE))
def test_an_answer_written_another_way_goes_to_the_general_path_which_takes_it(case: str) -> None:
    sess = session()
    req = sess.prepare_intent({"goal": "echo", "inputs": {}})
    content = _replace(answer(req, {"n": 1, "m": 2}), *OTHERWISE[case])
    assert sess.verified_reply(req, RID, content) is None, case
    got = asyncio.run(_general(sess, req, content))
    assert got.result == {"n": 1, "m": 2} and got.sequence == req.sequence


def test_a_sealed_session_or_a_close_is_never_read_from_bytes() -> None:
    sess = session()
    close = sess.prepare_close()
    assert close.params_json is None
    assert (
        sess.verified_reply(close, RID, answer(close, {"type": "closed", "session_id": SESSION_ID})) is None
    )
