"""The floor: the least a server answering a signed intent must do, written as plainly as it goes.

A raw ASGI app (no FastAPI, no a2a_secure code) that reads the body, parses the JSON-RPC
request, decodes the compact JWS in ``params.request_jws`` (base64url header and payload),
verifies its Ed25519 signature with PyNaCl, signs a small response JWS with PyNaCl and
answers it in a JSON-RPC result. No protocol checks (session, sequence, timestamp, DID
binding), no store. The key is the one the token's ``kid`` names (a did:key), decoded the
first time a kid is seen and kept, as a server keeps a session's client key in memory.

Served as every other case is (``runner.serve_child``), it says what the signed path costs
beyond the cryptography and JSON any implementation has to do. At start-up the app must
refuse tampered tokens (``check_floor``), else the server does not start: a floor that did
not verify would flatter the ratio.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import base58
import orjson
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from a2abench.common import JSON_HEADERS
from a2abench.runner import Bench, Proc, Starting, _asgi_post

FLOOR_NAME = "floor: verify + sign, raw ASGI"
# Signed bodies the floor goes round per wrk thread (it keeps no state: a body may repeat).
FLOOR_BODIES = 4000
_DID_KEY = "did:key:z"
_ED25519_PUB = b"\xed\x01"  # multicodec prefix of an Ed25519 public key
_KEYS_MAX = 1024

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def did_key(public_key: bytes) -> str:
    """``did:key:z`` + base58btc(0xed 0x01 ‖ key), and its key id (the DID + ``#`` + the key)."""
    multibase = "z" + base58.b58encode(_ED25519_PUB + public_key).decode("ascii")
    return f"did:key:{multibase}#{multibase}"


class Refused(Exception):
    """A request the floor does not answer with 200 (bad form, unknown key, bad signature)."""


class Floor:
    """The floor app: ``await Floor()(scope, receive, send)``."""

    def __init__(self, signing_key: SigningKey | None = None) -> None:
        self.signing_key = signing_key or SigningKey(os.urandom(32))
        self.kid = did_key(bytes(self.signing_key.verify_key))
        header = {"alg": "EdDSA", "typ": "a2a-response+jws", "kid": self.kid}
        self.header = _b64u(orjson.dumps(header))
        self.keys: dict[str, VerifyKey] = {}

    def _key(self, kid: object) -> VerifyKey:
        key = self.keys.get(kid) if isinstance(kid, str) else None
        if key is not None:
            return key
        if not isinstance(kid, str) or not kid.startswith(_DID_KEY):
            raise Refused("kid is not a did:key")
        raw = base58.b58decode(kid[len(_DID_KEY) :].split("#", 1)[0])
        if len(raw) != 34 or raw[:2] != _ED25519_PUB:
            raise Refused("not an Ed25519 did:key")
        key = VerifyKey(raw[2:])
        if len(self.keys) >= _KEYS_MAX:
            self.keys.clear()
        self.keys[kid] = key
        return key

    def answer(self, body: bytes) -> bytes:
        """The JSON-RPC answer to one request body, or ``Refused``."""
        try:
            request = orjson.loads(body)
            token = request["params"]["request_jws"]
            h, p, s = token.split(".")
            header = orjson.loads(_unb64u(h))
            payload = orjson.loads(_unb64u(p))
            signature = _unb64u(s)
        except (
            orjson.JSONDecodeError,
            binascii.Error,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
        ) as exc:
            raise Refused(f"malformed: {type(exc).__name__}") from exc
        try:
            self._key(header.get("kid")).verify(f"{h}.{p}".encode("ascii"), signature)
        except (BadSignatureError, ValueError, AttributeError) as exc:
            raise Refused("bad signature") from exc
        inputs = payload.get("intent", {}).get("inputs")
        response = {
            "session_id": payload.get("session_id"),
            "sequence": payload.get("sequence"),
            "status": "success",
            "result": inputs,
            "timestamp": int(time.time()),
        }
        signing_input = f"{self.header}.{_b64u(orjson.dumps(response))}"
        sig = self.signing_key.sign(signing_input.encode("ascii")).signature
        result = {
            "status": "success",
            "sequence": response["sequence"],
            "result": inputs,
            "response_jws": f"{signing_input}.{_b64u(sig)}",
        }
        return orjson.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": result})

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        try:
            status, reply = 200, self.answer(b"".join(chunks))
        except Refused as exc:
            error = {"code": -32040, "message": str(exc)}
            status, reply = 401, orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


def request_body(signing_key: SigningKey, payload: dict[str, Any], rid: int = 1) -> bytes:
    """A JSON-RPC ``intent`` request whose ``request_jws`` ``signing_key`` signed over ``payload``."""
    kid = did_key(bytes(signing_key.verify_key))
    header = _b64u(orjson.dumps({"alg": "EdDSA", "typ": "a2a-request+jws", "kid": kid}))
    signing_input = f"{header}.{_b64u(orjson.dumps(payload))}"
    token = f"{signing_input}.{_b64u(signing_key.sign(signing_input.encode('ascii')).signature)}"
    params = {"request_jws": token}
    return orjson.dumps({"jsonrpc": "2.0", "method": "intent", "params": params, "id": rid})


def tamper(body: bytes) -> list[bytes]:
    """Copies of a signed request body that no honest verifier accepts.

    The payload with one signed byte changed, the signature with one byte changed, and the
    token signed by another key under the same kid.
    """
    request = orjson.loads(body)
    h, p, s = request["params"]["request_jws"].split(".")
    payload = _unb64u(p)
    changed = payload.replace(b'"sequence":', b'"sequence":9', 1)
    if changed == payload:
        changed = payload[:-1] + b',"x":1}'
    signature = bytearray(_unb64u(s))
    signature[0] ^= 1
    other = SigningKey(os.urandom(32)).sign(f"{h}.{p}".encode("ascii")).signature
    out = []
    for token in (
        f"{h}.{_b64u(changed)}.{s}",
        f"{h}.{p}.{_b64u(bytes(signature))}",
        f"{h}.{p}.{_b64u(other)}",
    ):
        request["params"]["request_jws"] = token
        out.append(orjson.dumps(request))
    return out


async def _check(app: Floor, body: bytes) -> str:
    reply: list[bytes] = []
    if await _asgi_post(app, "/a2a/intent", body, reply) != 200:
        return "refused a well-signed request"
    token = orjson.loads(b"".join(reply))["result"]["response_jws"]
    h, p, s = token.split(".")
    try:
        app.signing_key.verify_key.verify(f"{h}.{p}".encode("ascii"), _unb64u(s))
    except BadSignatureError:
        return "signed its answer wrongly"
    for i, bad in enumerate(tamper(body)):
        if await _asgi_post(app, "/a2a/intent", bad) != 401:
            return f"accepted tampered request {i}"
    return ""


def check_floor(app: Floor, body: bytes | None = None) -> None:
    """Raise RuntimeError unless ``app`` answers ``body`` (a fresh signed request by default)
    with a correctly signed result and refuses every ``tamper(body)``."""
    if body is None:
        payload = {"session_id": "s", "sequence": 1, "timestamp": int(time.time()), "intent": {"inputs": {}}}
        body = request_body(SigningKey(os.urandom(32)), payload)
    why = asyncio.run(_check(app, body))
    if why:
        raise RuntimeError(f"the floor app {why}")


def floor_app() -> Floor:
    """The floor, checked to verify before it serves (``--serve floor``)."""
    app = Floor()
    check_floor(app)
    return app


def start_floor(bench: Bench, starting: Starting | None) -> Proc | None:
    """The floor server once up, or None (its wrk case then says why)."""
    if starting is None:
        return None
    try:
        proc = starting.wait()
    except RuntimeError as exc:
        bench.case("wrk_floor", FLOOR_NAME).skipped = f"skipped: {str(exc)[-300:]}"
        return None
    bench.procs.append(proc)
    return proc


def check_floor_http(url: str, body: bytes) -> str:
    """Why the floor server at ``url`` is not honest about ``body`` (a real signed request), or "".

    It must answer ``body`` with 200 and a result, and refuse every ``tamper(body)`` with 401.
    """
    import httpx

    with httpx.Client(timeout=10.0) as http:
        resp = http.post(url, content=body, headers=JSON_HEADERS)
        if resp.status_code != 200 or "response_jws" not in resp.json().get("result", {}):
            return f"refused a signed request the server accepts: HTTP {resp.status_code} {resp.text[:200]}"
        for i, bad in enumerate(tamper(body)):
            resp = http.post(url, content=bad, headers=JSON_HEADERS)
            if resp.status_code != 401:
                return f"answered tampered request {i} with HTTP {resp.status_code}"
    return ""


def wrk_floor(bench: Bench, floor: Proc, bodies: Sequence[Sequence[bytes]]) -> Proc | None:
    """wrk on the floor with the signed server's bodies of this round, cycled; None if it failed."""
    url = floor.url + "/a2a/intent"
    why = check_floor_http(url, bodies[0][0])
    if why:
        bench.case("wrk_floor", FLOOR_NAME).note = f"error: the floor {why}"
        return None
    bench.wrk("wrk_floor", FLOOR_NAME, url, [lines[:FLOOR_BODIES] for lines in bodies], floor, once=False)
    return floor
