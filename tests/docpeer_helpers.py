"""A second implementation of the wire contract, written from docs/PROTOCOL.md alone.

Nothing here uses the SDK's protocol code (no state machine, no models, no JWS module):
only an Ed25519 library (PyNaCl), RFC 8785 canonical JSON (``encoding.jcs``, a standard
the document names) and the rules of the document, section by section. A test puts it on
one side and the SDK on the other, so what the document says, and not what the SDK
happens to do, is what has to interoperate.

- :class:`DocClient`: the client side of §5 (handshake) and §6.1/§6.2 (intents), plus the
  extension declaration of §12 (it sends ``priority`` only to a server whose card,
  authenticated by its ``manifest_hash``, lists ``"priority"``).
- :class:`DocServer`: a raw ASGI app serving the card (§4), the handshake and intents, one
  handler (``echo``-like: it answers its inputs and the priority it read), declaring the
  extensions it is given.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import nacl.signing

from a2a_secure.identity.encoding import jcs

__all__ = ["DocClient", "DocServer", "DocSession"]

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
FRESH = 300  # §1


# -- §1 encodings -------------------------------------------------------------------------------
def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64u(text: str) -> bytes:
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert b64u(data) == text, "not canonical base64url (§1)"
    return data


def hash_of(value: Any) -> str:
    return "sha256:" + hashlib.sha256(jcs(value)).hexdigest()


def fresh(ts: int, now: float) -> bool:
    return abs(now - ts) <= FRESH


# -- §2 did:key ------------------------------------------------------------------------------------
def did_key(public: bytes) -> str:
    data = b"\xed\x01" + public
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "did:key:z" + "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def key_of_did(did: str) -> bytes:
    assert did.startswith("did:key:z")
    n = 0
    for ch in did[len("did:key:z") :]:
        n = n * 58 + _B58.index(ch)
    data = n.to_bytes((n.bit_length() + 7) // 8, "big")
    assert data[:2] == b"\xed\x01" and len(data) == 34
    return data[2:]


def kid_of(did: str) -> str:
    return did + "#" + did[len("did:key:") :]


def key_entry(did: str, public: bytes) -> dict[str, str]:
    return {"kid": kid_of(did), "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "key": b64u(public)}


# -- §3 JWS --------------------------------------------------------------------------------------
def sign(payload: dict[str, Any], key: nacl.signing.SigningKey, did: str, typ: str) -> str:
    header = {"alg": "EdDSA", "typ": typ, "kid": kid_of(did)}
    text = b64u(json.dumps(header).encode()) + "." + b64u(json.dumps(payload).encode())
    return text + "." + b64u(key.sign(text.encode("ascii")).signature)


def verify(token: str, did: str, typ: str) -> dict[str, Any]:
    h, p, s = token.split(".")
    header = json.loads(unb64u(h))
    assert header == {"alg": "EdDSA", "typ": typ, "kid": kid_of(did)}, header
    nacl.signing.VerifyKey(key_of_did(did)).verify((h + "." + p).encode("ascii"), unb64u(s))
    payload: dict[str, Any] = json.loads(unb64u(p))
    return payload


def rpc(method: str, params: Any, rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params, "id": rid}


# -- the client ------------------------------------------------------------------------------------
@dataclass
class DocSession:
    session_id: str
    commitment: str
    server_did: str
    extensions: frozenset[str]
    sequence: int = 0


class DocClient:
    """A client that knows only docs/PROTOCOL.md (see the module docstring)."""

    def __init__(self, http: httpx.AsyncClient, seed: bytes, agent_id: str = "doc-client") -> None:
        self.http = http
        self.key = nacl.signing.SigningKey(seed)
        self.did = did_key(bytes(self.key.verify_key))
        self.agent_id = agent_id

    async def _post(self, url: str, method: str, params: Any, rid: Any) -> httpx.Response:
        body = json.dumps(rpc(method, params, rid)).encode()
        return await self.http.post(url, content=body, headers={"Content-Type": "application/json"})

    async def handshake(self, base: str, server_did: str) -> DocSession:
        """§5.1-§5.6, then §12's declaration read from the card the CHALLENGE authenticated."""
        nonce_a = b64u(os.urandom(32))
        hello = {
            "type": "hello",
            "protocol_version": "1.0",
            "agent_did": self.did,
            "agent_id": self.agent_id,
            "manifest_hash": hash_of({"agent_id": self.agent_id, "did": self.did}),
            "nonce": nonce_a,
            "public_keys": [key_entry(self.did, bytes(self.key.verify_key))],
            "timestamp": int(time.time()),
        }
        resp = await self._post(base + "/a2a/handshake", "hello", hello, 1)
        challenge = resp.json()["result"]
        assert challenge["server_did"] == server_did
        signed = verify(challenge["policy_signature"], server_did, "a2a-policy+jws")
        assert signed["hello_hash"] == hash_of(hello) and signed["nonce_a"] == nonce_a
        assert signed["server_manifest_hash"] == challenge["manifest_hash"]
        assert fresh(challenge["timestamp"], time.time())
        nonce_b = challenge["nonce_b"]
        common = {"nonce_a": nonce_a, "nonce_b": nonce_b, "client_did": self.did, "server_did": server_did}
        proof = {
            **common,
            "client_manifest_hash": hello["manifest_hash"],
            "server_manifest_hash": challenge["manifest_hash"],
            "challenge_hash": hash_of(challenge),
            "timestamp": int(time.time()),
        }
        params = {
            "type": "proof",
            "nonce_b": nonce_b,
            "proof_jws": sign(proof, self.key, self.did, "a2a-proof+jws"),
        }
        resp = await self._post(base + "/a2a/handshake", "proof", params, 2)
        policy = resp.json()["result"]
        assert hash_of(policy["policy"]) == policy["policy_hash"] == challenge["policy_hash"]
        assert policy["policy_signature"] == challenge["policy_signature"]
        commitment = (
            "sha256:" + hashlib.sha256(f"{nonce_a}|{nonce_b}|{policy['policy_hash']}".encode()).hexdigest()
        )
        accept = {
            "policy_hash": policy["policy_hash"],
            "session_commitment": commitment,
            **common,
            "timestamp": int(time.time()),
        }
        params = {
            "type": "accept_policy",
            "nonce_b": nonce_b,
            "accept_jws": sign(accept, self.key, self.did, "a2a-accept+jws"),
        }
        resp = await self._post(base + "/a2a/handshake", "accept_policy", params, 3)
        session = resp.json()["result"]
        payload = verify(session["session_jws"], server_did, "a2a-session+jws")
        assert payload["session_commitment"] == commitment == session["session_commitment"]
        # §12: the extensions are those of the card whose hash the server signed.
        card = (await self.http.get(base + "/.well-known/agent-card.json")).json()
        declared = (
            card.get("a2a_secure_extensions", []) if hash_of(card) == challenge["manifest_hash"] else []
        )
        return DocSession(payload["session_id"], commitment, server_did, frozenset(declared))

    async def intent(self, base: str, session: DocSession, intent: dict[str, Any]) -> httpx.Response:
        """§6.1: one signed intent; the raw HTTP answer (its ``response_jws`` checked when 200)."""
        if "priority" in intent and "priority" not in session.extensions:
            raise AssertionError("§12: priority is sent only to a server that declares it")
        session.sequence += 1
        signed = {
            "session_id": session.session_id,
            "session_commitment": session.commitment,
            "sequence": session.sequence,
            "timestamp": int(time.time()),
            "intent": intent,
        }
        token = sign(signed, self.key, self.did, "a2a-request+jws")
        params = {k: signed[k] for k in ("session_id", "session_commitment", "sequence", "intent")}
        resp = await self._post(base + "/a2a/intent", "intent", {**params, "request_jws": token}, "i")
        if resp.status_code == 200:
            result = resp.json()["result"]
            payload = verify(result["response_jws"], session.server_did, "a2a-response+jws")
            assert payload["request_hash"] == "sha256:" + hashlib.sha256(token.encode()).hexdigest()
            assert payload["sequence"] == session.sequence and payload["status"] == result["status"]
            assert jcs(payload["result"]) == jcs(result["result"])
        return resp


# -- the server ------------------------------------------------------------------------------------
@dataclass
class _Pending:
    hello: dict[str, Any]
    challenge: dict[str, Any]
    proven: bool = False


@dataclass
class _Session:
    client_did: str
    commitment: str
    last: int = 0


@dataclass
class DocServer:
    """A server that knows only docs/PROTOCOL.md: its card lists ``extensions`` (§12).

    Its one goal, ``echo``, answers ``{"inputs": …, "priority": <the priority it runs at>}``;
    ``received`` holds every intent object it accepted, as signed.
    """

    seed: bytes
    extensions: list[str]
    received: list[dict[str, Any]] = field(default_factory=list)
    policy: dict[str, Any] = field(
        default_factory=lambda: {
            "rate_limit": 1000,
            "rate_period": 3600,
            "allowed_intents": ["echo"],
            "blocked_intents": [],
            "session_timeout": 3600,
        }
    )
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _sessions: dict[str, _Session] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = nacl.signing.SigningKey(self.seed)
        self.did = did_key(bytes(self.key.verify_key))
        self.card: dict[str, Any] = {
            "name": "doc-server",
            "description": "written from docs/PROTOCOL.md",
            "version": "1.0.0",
            "url": "http://127.0.0.1",
            "did": self.did,
            "protocol": "a2a-secure/1.0",
            "endpoints": {"handshake": "/a2a/handshake", "intent": "/a2a/intent"},
            "intents": ["echo"],
            "public_keys": [key_entry(self.did, bytes(self.key.verify_key))],
        }
        if self.extensions:
            self.card["a2a_secure_extensions"] = sorted(self.extensions)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET" and scope["path"] == "/.well-known/agent-card.json":
            status, answer = 200, self.card
        else:
            request = json.loads(body)
            status, answer = self._dispatch(request["method"], request["params"])
            member = "result" if status == 200 else "error"
            answer = {"jsonrpc": "2.0", "id": request["id"], member: answer}
        out = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": out})

    def _dispatch(self, method: str, params: dict[str, Any]) -> tuple[int, Any]:
        now = int(time.time())
        if method == "hello":
            return 200, self._challenge(params, now)
        if method == "proof":
            pending = self._pending[params["nonce_b"]]
            payload = verify(params["proof_jws"], pending.hello["agent_did"], "a2a-proof+jws")
            assert payload["challenge_hash"] == hash_of(pending.challenge) and fresh(
                payload["timestamp"], now
            )
            pending.proven = True
            return 200, {
                "type": "policy",
                "policy": self.policy,
                "policy_hash": pending.challenge["policy_hash"],
                "policy_signature": pending.challenge["policy_signature"],
            }
        if method == "accept_policy":
            return 200, self._session(params, now)
        if method == "intent":
            return self._intent(params, now)
        return 404, {"code": -32601, "message": "method not found"}

    def _challenge(self, hello: dict[str, Any], now: int) -> dict[str, Any]:
        did = hello["agent_did"]
        assert hello["public_keys"] == [key_entry(did, key_of_did(did))] and fresh(hello["timestamp"], now)
        nonce_b = b64u(os.urandom(32))
        manifest = hash_of(self.card)
        signed = {
            "protocol_version": "1.0",
            "hello_hash": hash_of(hello),
            "client_did": did,
            "server_did": self.did,
            "nonce_a": hello["nonce"],
            "nonce_b": nonce_b,
            "client_manifest_hash": hello["manifest_hash"],
            "server_manifest_hash": manifest,
            "policy_hash": hash_of(self.policy),
            "timestamp": now,
        }
        challenge = {
            "type": "challenge",
            "protocol_version": "1.0",
            "nonce_b": nonce_b,
            "server_did": self.did,
            "manifest_hash": manifest,
            "public_keys": self.card["public_keys"],
            "policy_hash": signed["policy_hash"],
            "policy_signature": sign(signed, self.key, self.did, "a2a-policy+jws"),
            "timestamp": now,
        }
        self._pending[nonce_b] = _Pending(hello, challenge)
        return challenge

    def _session(self, params: dict[str, Any], now: int) -> dict[str, Any]:
        pending = self._pending.pop(params["nonce_b"])
        assert pending.proven
        did = pending.hello["agent_did"]
        payload = verify(params["accept_jws"], did, "a2a-accept+jws")
        nonce_a, nonce_b = pending.hello["nonce"], params["nonce_b"]
        commitment = (
            "sha256:"
            + hashlib.sha256(f"{nonce_a}|{nonce_b}|{pending.challenge['policy_hash']}".encode()).hexdigest()
        )
        assert payload["session_commitment"] == commitment and fresh(payload["timestamp"], now)
        session_id = b64u(os.urandom(32))
        self._sessions[session_id] = _Session(did, commitment)
        signed = {
            "session_id": session_id,
            "session_commitment": commitment,
            "client_did": did,
            "server_did": self.did,
            "created_at": now,
            "expires_at": now + self.policy["session_timeout"],
        }
        return {
            "type": "session",
            **{k: signed[k] for k in ("session_id", "server_did", "client_did", "session_commitment")},
            "created_at": now,
            "expires_at": signed["expires_at"],
            "public_keys": self.card["public_keys"],
            "session_jws": sign(signed, self.key, self.did, "a2a-session+jws"),
        }

    def _intent(self, params: dict[str, Any], now: int) -> tuple[int, Any]:
        intent = params["intent"]
        known = {"goal", "domain", "inputs", "constraints"} | (
            {"priority"} if "priority" in self.extensions else set()
        )
        if set(intent) - known:  # §6.1 step 1: an unknown member of intent
            return 400, {"code": -32602, "message": "unknown member of intent"}
        if "priority" in intent and not (type(intent["priority"]) is int and 1 <= intent["priority"] <= 5):
            return 400, {"code": -32602, "message": "priority must be an integer from 1 to 5"}
        session = self._sessions[params["session_id"]]
        payload = verify(params["request_jws"], session.client_did, "a2a-request+jws")
        assert payload["intent"] == intent and payload["sequence"] == params["sequence"] > session.last
        assert fresh(payload["timestamp"], now)
        session.last = payload["sequence"]
        self.received.append(intent)
        result = {"inputs": intent["inputs"], "priority": intent.get("priority", 3)}
        signed = {
            "session_id": params["session_id"],
            "sequence": payload["sequence"],
            "request_hash": "sha256:" + hashlib.sha256(params["request_jws"].encode("ascii")).hexdigest(),
            "status": "success",
            "result": result,
            "timestamp": now,
        }
        token = sign(signed, self.key, self.did, "a2a-response+jws")
        return 200, {
            "status": "success",
            "sequence": payload["sequence"],
            "result": result,
            "response_jws": token,
        }
