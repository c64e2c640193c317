"""Streamed answers (PROTOCOL.md §6.4) over the wire: real uvicorn, raw httpx and A2AClient.

The server is the §11 test agent (``count`` streams, ``echo`` does not) with a few extra
streaming goals from ``tests/conformance_helpers.py``. Raw tests read the exact bytes
(framing, members, signed payloads, replays byte for byte); client tests put a
man-in-the-middle between ``A2AClient.stream`` and the server that rewrites the event stream,
and check that every rewrite is refused and no forged value is ever yielded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import (
    A2AError,
    AuthenticationFailed,
    IntentTimeout,
    InvalidParams,
    StaleTimestamp,
    Unavailable,
)
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_decode_unverified, jws_sign, jws_verify
from a2a_secure.policy import Policy
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.client import PreparedRequest
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.testing import FakeClock, serve_app
from tests.conformance_helpers import (
    JSON,
    Frame,
    Shared,
    Stack,
    agent_server,
    envelope,
    error_of,
    identity,
    open_stack,
    parse_sse,
    serve_shared,
    serve_stack,
    wait_for,
)
from tests.http_helpers import raw_handshake

EVENT_MEMBERS = {"status", "sequence", "index", "final", "result", "response_jws"}
EVENT_ERROR_MEMBERS = {"status", "sequence", "index", "final", "error", "response_jws"}
EVENT_PAYLOAD = {"session_id", "sequence", "request_hash", "index", "final", "status", "result", "timestamp"}
EVENT_ERROR_PAYLOAD = EVENT_PAYLOAD - {"result"} | {"error"}
FAST = RetryPolicy(attempts=3, base=0.01, cap=0.02, max_wait=5)

# One test agent for the module (starting and stopping uvicorn is most of a test's time); each
# test gets a new client DID and session on it. Tests that need other limits, another policy
# or a clock of their own start their own server with serve_stack.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[Shared]:
    async with serve_shared() as sh:
        yield sh


@pytest_asyncio.fixture(loop_scope="module")
async def stack(shared: Shared) -> Stack:
    return await open_stack(shared)


def request_hash(req: PreparedRequest) -> str:
    return "sha256:" + hashlib.sha256(req.params["request_jws"].encode("ascii")).hexdigest()


def check_event(stack: Stack, req: PreparedRequest, frame: Frame, rid: Any, index: int) -> dict[str, Any]:
    """Every rule of §6.4 for one event; returns its signed payload."""
    message = frame.message
    assert message.keys() == {"jsonrpc", "id", "result"}
    assert message["jsonrpc"] == "2.0"
    assert message["id"] == rid and type(message["id"]) is type(rid)
    result = message["result"]
    assert frame.id == str(index).encode()
    is_error = "error" in result
    assert result.keys() == (EVENT_ERROR_MEMBERS if is_error else EVENT_MEMBERS)
    token = result["response_jws"]
    header, _payload, _si, _sig = jws_decode_unverified(token)
    assert header == {"alg": "EdDSA", "typ": "a2a-event+jws", "kid": stack.server.identity.kid}
    payload = jws_verify(
        token, stack.server.identity.public_key, typ=m.Typ.EVENT, kid=stack.server.identity.kid
    )
    assert payload.keys() == (EVENT_ERROR_PAYLOAD if is_error else EVENT_PAYLOAD)
    assert payload["session_id"] == stack.session.session_id
    assert payload["sequence"] == result["sequence"] == req.sequence
    assert payload["request_hash"] == request_hash(req)
    assert payload["index"] == result["index"] == index
    assert payload["final"] is result["final"]
    assert payload["status"] == result["status"] == ("error" if is_error else "success")
    if is_error:
        assert payload["error"] == result["error"]
        assert result["error"].keys() == {"code", "message"}
        assert result["final"] is True  # an error event is always final
    else:
        assert encoding.jcs(payload["result"]) == encoding.jcs(result["result"])
    assert type(payload["timestamp"]) is int
    # ... and the SDK's own client check agrees.
    stack.session.verify_event(req, result, index)
    return payload


def check_stream(stack: Stack, req: PreparedRequest, resp: httpx.Response, rid: Any) -> list[Frame]:
    """A complete streamed answer: 200, text/event-stream, exact framing, every event checked."""
    assert resp.status_code == 200, resp.text[:300]
    ctype = resp.headers["content-type"].replace(" ", "").lower()
    assert ctype in ("text/event-stream", "text/event-stream;charset=utf-8"), ctype
    frames = parse_sse(resp.content)
    for i, frame in enumerate(frames):
        check_event(stack, req, frame, rid, i)
        assert (frame.result["final"] is True) == (i == len(frames) - 1)
    return frames


def results(frames: list[Frame]) -> list[Any]:
    return [f.result.get("result") for f in frames]


class LiveStream:
    """An event stream read incrementally, frame by frame."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self._chunks = resp.aiter_bytes()
        self._buf = b""
        self.frames: list[Frame] = []
        self.comments = 0

    async def next_frame(self, seconds: float = 5.0) -> Frame:
        while True:
            while b"\n\n" in self._buf:
                block, self._buf = self._buf.split(b"\n\n", 1)
                if block.startswith(b":"):
                    self.comments += 1
                    continue
                frame = parse_sse(block + b"\n\n")[0]
                self.frames.append(frame)
                return frame
            self._buf += await asyncio.wait_for(anext(self._chunks), seconds)

    async def rest(self, seconds: float = 5.0) -> list[Frame]:
        """Read to the end of the stream; the stream must end right after a final event."""
        while not (self.frames and self.frames[-1].result["final"] is True):
            await self.next_frame(seconds)
        with contextlib.suppress(StopAsyncIteration):
            while True:
                self._buf += await asyncio.wait_for(anext(self._chunks), seconds)
        assert self._buf == b"", self._buf[:200]  # nothing after the final event
        return self.frames

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def live(stack: Stack, req: PreparedRequest, rid: Any) -> AsyncIterator[LiveStream]:
    body = envelope("intent", req.params, rid)
    async with stack.http.stream("POST", stack.url + "/a2a/intent", content=body, headers=JSON) as resp:
        stream = LiveStream(resp)
        try:
            yield stream
        finally:
            await stream.aclose()


def intent_records(stack: Stack, req: PreparedRequest) -> list[dict[str, Any]]:
    return [r for r in stack.audit if r["event"] == "intent" and r["sequence"] == req.sequence]


# -- framing, members, signatures ---------------------------------------------------------------------


@pytest.mark.parametrize("rid", ["s-1", 7], ids=["string-id", "integer-id"])
async def test_streamed_count_framing_members_and_signatures(rid: Any, stack: Stack) -> None:
    req = stack.prepare("count", {"n": 3}, stream=True)
    resp = await stack.send(req, rid)
    frames = check_stream(stack, req, resp, rid)
    # Partial results with final: false, then one final event whose result is null.
    assert [f.id for f in frames] == [b"0", b"1", b"2", b"3"]
    assert results(frames) == [{"i": 0}, {"i": 1}, {"i": 2}, None]
    assert [f.result["final"] for f in frames] == [False, False, False, True]
    assert all(f.result["status"] == "success" for f in frames)
    # The exact bytes: "id: N" LF "data: JSON" LF LF and nothing else.
    assert resp.content == b"".join(f.raw for f in frames)
    for f in frames:
        assert f.raw == b"id: " + f.id + b"\ndata: " + f.data + b"\n\n"
    ts = {jws_decode_unverified(f.result["response_jws"])[1]["timestamp"] for f in frames}
    assert ts == {int(stack.clock())}


async def test_non_streaming_goal_with_stream_true_is_exactly_one_final_event(stack: Stack) -> None:
    inputs = {"text": "héllo", "n": [1, 2.5, None, True], "deep": {"a": {"b": []}}}
    req = stack.prepare("echo", inputs, stream=True)
    frames = check_stream(stack, req, await stack.send(req, "e"), "e")
    assert len(frames) == 1
    assert frames[0].result["index"] == 0 and frames[0].result["final"] is True
    assert frames[0].result["result"] == inputs


@pytest.mark.parametrize("stream", [None, False], ids=["no-stream-member", "stream-false"])
async def test_streaming_goal_without_stream_true_is_one_result_array(
    stream: bool | None, stack: Stack
) -> None:
    req = stack.prepare("count", {"n": 3, "delay_ms": 1}, stream=stream)
    resp = await stack.send(req, "plain")
    assert resp.status_code == 200
    assert resp.headers["content-type"].split(";")[0] == "application/json"
    body = resp.json()
    assert body.keys() == {"jsonrpc", "id", "result"} and body["id"] == "plain"
    verified = stack.session.verify_result(req, body["result"])
    assert verified.result == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_count_bounds_are_accepted(stack: Stack) -> None:
    req = stack.prepare("count", {"n": 50, "delay_ms": 0}, stream=True)
    frames = check_stream(stack, req, await stack.send(req, 1), 1)
    assert results(frames) == [{"i": i} for i in range(50)] + [None]
    req = stack.prepare("count", {"n": 1, "delay_ms": 1000}, stream=True)
    frames = check_stream(stack, req, await stack.send(req, 2), 2)
    assert results(frames) == [{"i": 0}, None]  # delay_ms only between two items


async def test_a_stream_without_partials_is_one_final_event(stack: Stack) -> None:
    req = stack.prepare("many", {"n": 0}, stream=True)
    frames = check_stream(stack, req, await stack.send(req, "empty"), "empty")
    assert [(f.result["index"], f.result["final"], f.result["result"]) for f in frames] == [(0, True, None)]


@pytest.mark.parametrize(
    "inputs",
    [
        {"n": 0},
        {"n": 51},
        {"n": 1, "delay_ms": 1001},
        {"n": 1, "delay_ms": -1},
        {"n": 1, "extra": 1},
        {"n": True},
        {"n": "3"},
        {"n": 2, "delay_ms": False},
        {},
    ],
    ids=[
        "n=0",
        "n=51",
        "delay=1001",
        "delay=-1",
        "extra-member",
        "n=true",
        "n-string",
        "delay=false",
        "no-n",
    ],
)
async def test_count_bad_inputs_are_a_signed_json_error_not_a_stream(
    inputs: dict[str, Any], stack: Stack
) -> None:
    req = stack.prepare("count", inputs, stream=True)
    resp = await stack.send(req, "bad")
    error = error_of(resp, 400, -32602, "bad")
    assert stack.session.error_from_reply(req, error).signed
    # The sequence was consumed and the answer stored: the byte-identical retry gets it,
    # under its own id, and the handler does not run again.
    again = error_of(await stack.send(req, "again"), 400, -32602, "again")
    assert again == error
    assert stack.calls["count"] == 1
    # One audit record each (the request and its retry), with the code.
    records = intent_records(stack, req)
    assert len(records) == 2
    assert all(r["status"] == "error" and r["error_code"] == -32602 and r["verified"] for r in records)


# -- failures before and after the first event ------------------------------------------------------


async def test_timeout_before_the_first_event_is_a_signed_json_32049(stack: Stack) -> None:
    req = stack.prepare("sleepy", {"before_ms": 3000}, stream=True, timeout_ms=100)
    error = error_of(await stack.send(req, "t"), 504, -32049, "t")
    assert stack.session.error_from_reply(req, error).signed
    assert error_of(await stack.send(req, "t2"), 504, -32049, "t2") == error
    assert stack.calls["sleepy"] == 1


async def test_handler_rejecting_inputs_at_the_first_event_is_a_signed_json_32602(stack: Stack) -> None:
    req = stack.prepare("sleepy", {"before_ms": 20, "fail": True}, stream=True)
    error = error_of(await stack.send(req, "f"), 400, -32602, "f")
    assert error["message"] == "sleepy was told to fail"
    assert stack.session.error_from_reply(req, error).signed


async def test_timeout_between_events_ends_the_stream_with_a_final_32049_event(stack: Stack) -> None:
    req = stack.prepare("count", {"n": 3, "delay_ms": 1000}, stream=True, timeout_ms=100)
    frames = check_stream(stack, req, await stack.send(req, "tb"), "tb")
    assert len(frames) == 2
    assert frames[0].result["result"] == {"i": 0} and frames[0].result["final"] is False
    last = frames[1].result
    assert last["status"] == "error" and last["final"] is True and last["index"] == 1
    assert last["error"]["code"] == -32049
    ev = stack.session.verify_event(req, last, 1)
    assert isinstance(ev.error, IntentTimeout) and ev.error.signed
    await wait_for(lambda: len(intent_records(stack, req)) == 1)
    (record,) = intent_records(stack, req)
    assert record["status"] == "error" and record["error_code"] == -32049 and record["verified"]


async def test_the_server_timeout_bounds_each_gap_not_the_whole_stream(stack: Stack) -> None:
    # PROTOCOL.md §6.4: four gaps of 150 ms under a 400 ms timeout, 600 ms in all.
    req = stack.prepare("count", {"n": 4, "delay_ms": 150}, stream=True, timeout_ms=400)
    frames = check_stream(stack, req, await stack.send(req, "gaps"), "gaps")
    assert results(frames) == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}, None]
    assert frames[-1].result["status"] == "success"


async def test_keepalive_is_exactly_a_comment_line_and_an_empty_line(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from a2a_secure.runtime import stream_record as streaming

    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.02)
    req = stack.prepare("count", {"n": 2, "delay_ms": 200}, stream=True)
    body = (await stack.send(req, "ka")).content
    blocks = body.split(b"\n\n")[:-1]
    keepalives = [b for b in blocks if not b.startswith(b"id: ")]
    assert keepalives and set(keepalives) == {b": keep-alive"}  # §6.4: ": keep-alive" LF LF


async def test_session_closed_on_another_connection_ends_the_stream_with_32043(stack: Stack) -> None:
    req = stack.prepare("fed", stream=True)
    await stack.feed.put({"i": 0})
    async with live(stack, req, "L") as stream:
        first = await stream.next_frame()
        assert first.result["result"] == {"i": 0}
        close = stack.session.prepare_close()
        resp = await stack.send(close, "close")
        assert resp.status_code == 200
        stack.session.verify_closed(close, resp.json()["result"])
        await stack.feed.put({"i": 1})  # the next item finds the session gone
        frames = await stream.rest()
    assert len(frames) == 2
    last = check_event(stack, req, frames[1], "L", 1)
    assert last["status"] == "error" and last["error"]["code"] == -32043 and last["final"] is True
    await wait_for(lambda: len(intent_records(stack, req)) == 1)
    (record,) = intent_records(stack, req)
    # A verified record may carry -32043 (§8).
    assert record["error_code"] == -32043 and record["verified"] is True


async def test_session_expiring_mid_stream_ends_the_stream_with_32043() -> None:
    async with serve_stack(policy=Policy.build(session_timeout=60)) as stack:
        req = stack.prepare("fed", stream=True)
        await stack.feed.put({"i": 0})
        async with live(stack, req, "X") as stream:
            await stream.next_frame()
            stack.clock.advance(60)  # now == expires_at: expired
            await stack.feed.put({"i": 1})
            frames = await stream.rest()
        assert frames[-1].result["error"]["code"] == -32043 and frames[-1].result["index"] == 1


async def test_session_closed_before_the_first_event_is_a_signed_json_32043(stack: Stack) -> None:
    req = stack.prepare("fed", stream=True)
    pending = asyncio.create_task(stack.send(req, "early"))
    await wait_for(lambda: stack.calls["fed"] == 1)  # the handler runs, no event yet
    close = stack.session.prepare_close()
    assert (await stack.send(close)).status_code == 200
    await stack.feed.put({"i": 0})  # the first item finds the session gone
    error = error_of(await pending, 401, -32043, "early")
    assert stack.session.error_from_reply(req, error).signed


async def test_handler_runs_to_its_end_when_the_client_goes_away(stack: Stack) -> None:
    req = stack.prepare("count", {"n": 5, "delay_ms": 30}, stream=True)
    async with live(stack, req, "gone") as stream:
        await stream.next_frame()
    # The client disconnected after one event; the handler still yields every item ...
    await wait_for(lambda: stack.calls["count-items"] == 5)
    await wait_for(lambda: len(intent_records(stack, req)) == 1)
    # ... and the whole stream is the stored answer.
    frames = check_stream(stack, req, await stack.send(req, "back"), "back")
    assert results(frames) == [{"i": i} for i in range(5)] + [None]
    assert stack.calls["count"] == 1


# -- capacity and rate limit ---------------------------------------------------------------------------


async def test_stream_capacity_per_did_is_503_and_does_not_consume_the_sequence() -> None:
    async with serve_stack(limits=ServerLimits(max_streams_per_did=1)) as stack:
        first = stack.prepare("fed", stream=True)
        await stack.feed.put({"i": 0})
        async with live(stack, first, "A") as stream:
            await stream.next_frame()
            second = stack.prepare("count", {"n": 2}, stream=True)
            resp = await stack.send(second, "B")
            error = error_of(resp, 503, -32048, "B")
            assert resp.headers["retry-after"].isdigit()
            assert error["data"]["retry_after"] == int(resp.headers["retry-after"]) >= 1
            assert stack.session.error_from_reply(second, error).signed
            assert stack.calls["count"] == 0
            await stack.feed.put(None)
            await stream.rest()
        await wait_for(lambda: len(intent_records(stack, first)) == 1)
        # Nothing was consumed or stored: the very same request is accepted now.
        frames = check_stream(stack, second, await stack.send(second, "B2"), "B2")
        assert results(frames) == [{"i": 0}, {"i": 1}, None]


async def test_stream_capacity_in_total_is_503() -> None:
    async with serve_stack(limits=ServerLimits(max_streams_total=1)) as stack:
        other = await stack.new_session(identity("other-client"))
        first = stack.prepare("fed", stream=True)
        await stack.feed.put({"i": 0})
        async with live(stack, first, "A") as stream:
            await stream.next_frame()
            req = stack.prepare("count", {"n": 1}, stream=True, session=other)
            resp = await stack.send(req, "O")
            error_of(resp, 503, -32048, "O")
            assert resp.headers["retry-after"].isdigit()
            await stack.feed.put(None)
            await stream.rest()


async def test_retry_of_a_live_stream_at_the_stream_limit_is_replayed() -> None:
    # The retry is the same stream, not a new one: it must not be refused for capacity.
    async with serve_stack(limits=ServerLimits(max_streams_per_did=1)) as stack:
        req = stack.prepare("fed", stream=True)
        await stack.feed.put({"i": 0})
        async with live(stack, req, "A") as original:
            await original.next_frame()
            async with live(stack, req, "R") as retry:
                assert retry.resp.status_code == 200, await retry.resp.aread()
                replayed = await retry.next_frame()
                assert replayed.result_bytes == original.frames[0].result_bytes
                await stack.feed.put(None)
                await retry.rest()
            await original.rest()
        assert stack.calls["fed"] == 1


async def test_a_stream_counts_once_against_the_rate_limit() -> None:
    async with serve_stack(policy=Policy.build(rate_limit=2, rate_period=60)) as stack:
        req = stack.prepare("count", {"n": 5}, stream=True)
        check_stream(stack, req, await stack.send(req, 1), 1)
        check_stream(stack, req, await stack.send(req, 2), 2)  # a replay is not counted
        echo = stack.prepare("echo", {"x": 1})
        assert (await stack.send(echo)).status_code == 200
        over = stack.prepare("count", {"n": 1}, stream=True)
        resp = await stack.send(over, "over")
        error_of(resp, 503, -32048, "over")
        assert resp.headers["retry-after"] == "60"


# -- byte-identical retries and the replay bound -------------------------------------------------------


async def test_retry_during_and_after_a_live_stream_replays_the_same_bytes(stack: Stack) -> None:
    req = stack.prepare("fed", stream=True)
    await stack.feed.put({"i": 0})
    await stack.feed.put({"i": 1})
    async with live(stack, req, "orig") as original:
        await original.next_frame()
        await original.next_frame()
        assert intent_records(stack, req) == []  # a stream's record waits for its final event
        async with live(stack, req, "during") as retry:
            # The recorded events, byte for byte (under the retry's id) ...
            for k in range(2):
                frame = await retry.next_frame()
                assert frame.result_bytes == original.frames[k].result_bytes
                assert frame.message["id"] == "during"
            # ... then the live ones, the same events as the original gets.
            await stack.feed.put({"i": 2})
            await stack.feed.put(None)
            during = await retry.rest()
        orig = await original.rest()
    assert [f.result_bytes for f in during] == [f.result_bytes for f in orig]
    for i, f in enumerate(orig):
        check_event(stack, req, f, "orig", i)
    for i, f in enumerate(during):
        check_event(stack, req, f, "during", i)
    assert results(orig) == [{"i": 0}, {"i": 1}, {"i": 2}, None]
    await wait_for(lambda: len(intent_records(stack, req)) == 2)  # the stream and one replay
    # After the stream ended: the stored answer is the stream itself.
    after = check_stream(stack, req, await stack.send(req, "after"), "after")
    assert [f.result_bytes for f in after] == [f.result_bytes for f in orig]
    assert stack.calls["fed"] == 1
    assert len(intent_records(stack, req)) == 3  # a replay is a record of its own
    assert all(r["verified"] and r["status"] == "success" for r in intent_records(stack, req))


async def test_retry_after_a_stored_stream_does_not_run_the_handler_again(stack: Stack) -> None:
    req = stack.prepare("count", {"n": 3}, stream=True)
    first = check_stream(stack, req, await stack.send(req, 1), 1)
    for rid in (2, 3):
        again = check_stream(stack, req, await stack.send(req, rid), rid)
        assert [f.result_bytes for f in again] == [f.result_bytes for f in first]
        assert [f.data.replace(b'"id":%d' % rid, b'"id":1') for f in again] == [f.data for f in first]
    assert stack.calls["count"] == 1 and stack.calls["count-items"] == 3
    # A different request with the same sequence is not a retry.
    stack.session.last_sequence -= 1
    other = stack.prepare("count", {"n": 2}, stream=True)
    error_of(await stack.send(other, 4), 409, -32044, 4)


async def test_retry_before_the_first_event_waits_for_it(stack: Stack) -> None:
    req = stack.prepare("fed", stream=True)
    original = asyncio.create_task(stack.send(req, "o"))
    await wait_for(lambda: stack.calls["fed"] == 1)  # the handler runs, no event yet
    retry = asyncio.create_task(stack.send(req, "r"))
    await asyncio.sleep(0.2)  # the retry waits on the server
    for item in ({"i": 0}, {"i": 1}, None):
        await stack.feed.put(item)
    frames_r = check_stream(stack, req, await retry, "r")
    frames_o = check_stream(stack, req, await original, "o")
    assert [f.result_bytes for f in frames_r] == [f.result_bytes for f in frames_o]
    assert results(frames_o) == [{"i": 0}, {"i": 1}, None]
    assert stack.calls["fed"] == 1


async def test_retry_before_a_first_event_that_fails_gets_the_stored_json_error(stack: Stack) -> None:
    req = stack.prepare("fed", stream=True)
    original = asyncio.create_task(stack.send(req, "o"))
    await wait_for(lambda: stack.calls["fed"] == 1)
    retry = asyncio.create_task(stack.send(req, "r"))
    await asyncio.sleep(0.2)  # the retry waits on the server
    await stack.feed.put(InvalidParams("fed was told to fail"))
    error = error_of(await asyncio.wait_for(retry, 4), 400, -32602, "r")
    assert error["message"] == "fed was told to fail"
    assert error == error_of(await original, 400, -32602, "o")
    assert stack.session.error_from_reply(req, error).signed
    assert stack.calls["fed"] == 1


async def test_replay_keeps_256_events_then_a_newly_signed_final_32048(stack: Stack) -> None:
    req = stack.prepare("many", {"n": 300}, stream=True)
    live_frames = check_stream(stack, req, await stack.send(req, "all"), "all")
    assert len(live_frames) == 301 and live_frames[-1].result["result"] is None
    await wait_for(lambda: len(intent_records(stack, req)) == 1)
    stack.clock.advance(5)
    frames = check_stream(stack, req, await stack.send(req, "again"), "again")
    assert len(frames) == 257
    assert [f.result_bytes for f in frames[:256]] == [f.result_bytes for f in live_frames[:256]]
    last = frames[256].result
    assert last["index"] == 256 and last["final"] is True and last["status"] == "error"
    assert last["error"]["code"] == -32048
    payload = jws_decode_unverified(last["response_jws"])[1]
    assert payload["timestamp"] == int(stack.clock())  # newly signed
    ev = stack.session.verify_event(req, last, 256)
    assert isinstance(ev.error, Unavailable) and ev.error.signed
    assert stack.calls["many"] == 1


async def test_replay_stops_keeping_at_the_first_event_past_1_mib(stack: Stack) -> None:
    # 400 000 + 400 000 fit in 1 MiB of result JSON, the third does not; the small fourth
    # would fit, but keeping stopped at the first that did not.
    sizes = [400_000, 400_000, 400_000, 10]
    req = stack.prepare("sizes", {"sizes": sizes}, stream=True)
    live_frames = check_stream(stack, req, await stack.send(req, 1), 1)
    assert len(live_frames) == 5
    frames = check_stream(stack, req, await stack.send(req, 2), 2)
    assert len(frames) == 3
    assert [f.result_bytes for f in frames[:2]] == [f.result_bytes for f in live_frames[:2]]
    assert frames[2].result["error"]["code"] == -32048 and frames[2].result["index"] == 2
    assert stack.calls["sizes"] == 1


async def test_keepalive_comments_between_events(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    from a2a_secure.runtime import stream_record as streaming

    assert streaming.KEEPALIVE_SECONDS <= 15  # "at least every 15 s"
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.02)
    req = stack.prepare("count", {"n": 2, "delay_ms": 200}, stream=True)
    resp = await stack.send(req, "k")
    comments: list[bytes] = []
    frames = parse_sse(resp.content, comments=comments)
    assert comments and all(c.startswith(b":") for c in comments)
    assert results(frames) == [{"i": 0}, {"i": 1}, None]
    # The SDK client ignores them.
    async with A2AClient(identity("keepalive"), clock=stack.clock) as client:
        got = [x async for x in client.stream(stack.server.identity.did, count(2, 200), endpoint=stack.url)]
    assert got == [{"i": 0}, {"i": 1}]


async def test_no_event_is_larger_than_1_mib(stack: Stack) -> None:
    # The second partial would make an event of about 1.6 MB (the result travels twice: in
    # the event and inside its signature): the stream ends there with a final -32603 event.
    req = stack.prepare("sizes", {"sizes": [10, 700_000]}, stream=True)
    frames = parse_sse((await stack.send(req, 1)).content)
    assert all(len(f.data) <= 1024 * 1024 for f in frames)
    assert [f.result["final"] for f in frames] == [False, True]
    assert frames[-1].result["error"]["code"] == -32603


async def test_replay_record_carries_the_status_of_its_final_event(stack: Stack) -> None:
    req = stack.prepare("many", {"n": 300}, stream=True)
    await stack.send(req, 1)
    await wait_for(lambda: len(intent_records(stack, req)) == 1)
    frames = parse_sse((await stack.send(req, 2)).content)
    assert frames[-1].result["error"]["code"] == -32048
    await wait_for(lambda: len(intent_records(stack, req)) == 2)
    replay = intent_records(stack, req)[1]
    assert replay["status"] == "error" and replay["error_code"] == -32048


# -- the SDK client -----------------------------------------------------------------------------------


def count(n: int, delay_ms: int = 0) -> dict[str, Any]:
    return {"goal": "count", "inputs": {"n": n, "delay_ms": delay_ms}}


async def test_client_stream_yields_every_partial_once_in_order(stack: Stack) -> None:
    async with A2AClient(identity("c"), clock=stack.clock, retry=FAST) as client:
        did = stack.server.identity.did
        got = [x async for x in client.stream(did, count(4), endpoint=stack.url)]
        assert got == [{"i": i} for i in range(4)]
        # A non-streaming goal: its one result.
        got = [x async for x in client.stream(did, {"goal": "echo", "inputs": {"a": 1}})]
        assert got == [{"a": 1}]
        # Without stream, the same goal is one result: the array.
        res = await client.request(did, count(3))
        assert res.result == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_client_raises_a_signed_error_event(stack: Stack) -> None:
    async with A2AClient(identity("c"), clock=stack.clock, retry=FAST) as client:
        got: list[Any] = []
        intent = {**count(3, 1000), "constraints": {"timeout_ms": 100}}
        with pytest.raises(IntentTimeout) as info:
            async for x in client.stream(stack.server.identity.did, intent, endpoint=stack.url):
                got.append(x)
        assert info.value.signed and got == [{"i": 0}]
        with pytest.raises(InvalidParams) as info2:
            async for _ in client.stream(stack.server.identity.did, count(0)):
                pass
        assert info2.value.signed


async def test_client_receives_results_with_unicode_line_separators(stack: Stack) -> None:
    # Raw U+2028, U+2029, U+0085, \x1c-\x1e, \x0b, \x0c are legal inside JSON strings and are
    # not line ends in an event stream (only LF ends a line).
    text = "a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci"
    req = stack.prepare("echo", {"text": text}, stream=True)
    frames = check_stream(stack, req, await stack.send(req, 1), 1)
    assert frames[0].result["result"] == {"text": text}
    async with A2AClient(identity("c"), clock=stack.clock, retry=FAST) as client:
        intent = {"goal": "echo", "inputs": {"text": text}}
        got = [x async for x in client.stream(stack.server.identity.did, intent, endpoint=stack.url)]
    assert got == [{"text": text}]


async def test_client_timeout_bounds_each_gap_not_the_whole_stream(stack: Stack) -> None:
    # 1 s per read; four events 0.4 s apart take 1.2 s in all.
    async with A2AClient(identity("c"), clock=stack.clock, retry=FAST, timeout=1.0) as client:
        got = [x async for x in client.stream(stack.server.identity.did, count(4, 400), endpoint=stack.url)]
    assert got == [{"i": i} for i in range(4)]
    assert stack.calls["count"] == 1


async def test_server_shutdown_ends_a_live_stream_with_a_final_32603_event() -> None:
    clock = FakeClock()
    feed: asyncio.Queue[Any] = asyncio.Queue()
    server = agent_server(clock=clock, feed=feed)
    exits = contextlib.AsyncExitStack()  # the server only: the client outlives it
    stopping: asyncio.Task[None] | None = None
    http = httpx.AsyncClient(timeout=5)
    try:
        url = await exits.enter_async_context(serve_app(server.app(), timeout_graceful_shutdown=0.3))
        session = await raw_handshake(http, url, identity("client"), server.identity.did, clock=clock)
        req = session.prepare_intent({"goal": "fed", "inputs": {}, "constraints": {"stream": True}})
        await feed.put({"i": 0})
        body = envelope("intent", req.params, 1)
        async with http.stream("POST", url + "/a2a/intent", content=body, headers=JSON) as resp:
            stream = LiveStream(resp)
            try:
                await stream.next_frame()
                stopping = asyncio.create_task(exits.aclose())  # the server stops
                frames = await stream.rest()
            finally:
                await stream.aclose()
        last = frames[-1].result
        assert last["final"] is True and last["error"]["code"] == -32603
    finally:
        await feed.put(None)  # let the handler end in any case
        if stopping is not None:
            await stopping
        else:
            await exits.aclose()
        await http.aclose()


# -- a man in the middle --------------------------------------------------------------------------------

Rewrite = Callable[[list[bytes], Any], list[bytes]]


class Mitm:
    """An ASGI proxy in front of the real server that can rewrite event streams.

    ``rewrite(blocks, rid)`` gets the upstream's event blocks (``id: ..\\ndata: ..\\n\\n``) and
    the request's JSON-RPC id and returns the blocks to send. ``cut_after`` forwards that many
    events live and then drops the connection (for ``cuts`` answers). Every stream received
    from upstream is kept in ``streams``, every intent request body in ``bodies``.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.http = httpx.AsyncClient(timeout=10)
        self.rewrite: Rewrite | None = None
        self.cut_after = 0
        self.cuts = 0
        self.bodies: list[bytes] = []
        self.streams: list[list[bytes]] = []
        self.answer: tuple[int, bytes] | None = None  # answer intent calls with this JSON
        self.header_names: list[set[str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/a2a/intent":
            self.bodies.append(body)
            self.header_names.append({k.decode().lower() for k, _v in scope["headers"]})
            if self.answer is not None:
                status, content = self.answer
                ctype = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": status, "headers": ctype})
                await send({"type": "http.response.body", "body": content})
                return
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k == b"content-type"}
        request = self.http.build_request(
            scope["method"], self.upstream + scope["path"], content=body, headers=headers
        )
        resp = await self.http.send(request, stream=True)
        try:
            out = [(b"content-type", resp.headers.get("content-type", "").encode())]
            if "retry-after" in resp.headers:
                out.append((b"retry-after", resp.headers["retry-after"].encode()))
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                await send({"type": "http.response.body", "body": await resp.aread()})
                return
            rid = encoding.loads(body)["id"]
            if self.cuts > 0:
                self.cuts -= 1
                sent = 0
                async for block in self._blocks(resp):
                    await send({"type": "http.response.body", "body": block, "more_body": True})
                    sent += 1
                    if sent == self.cut_after:
                        raise ConnectionAbortedError("the proxy drops the connection")
            blocks = [b async for b in self._blocks(resp)]
            self.streams.append(blocks)
            if self.rewrite is not None:
                blocks = self.rewrite(blocks, rid)
            for block in blocks:
                await send({"type": "http.response.body", "body": block, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()

    @staticmethod
    async def _blocks(resp: httpx.Response) -> AsyncIterator[bytes]:
        buf = b""
        async for chunk in resp.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                if not block.startswith(b":"):
                    yield block + b"\n\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(shared: Shared) -> AsyncIterator[tuple[Mitm, str]]:
    mitm = Mitm(shared.url)
    try:
        async with serve_app(mitm) as url:
            yield mitm, url
    finally:
        await mitm.http.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def mitm_env(stack: Stack, proxy: tuple[Mitm, str]) -> tuple[Stack, Mitm, str]:
    mitm, url = proxy
    mitm.rewrite, mitm.answer, mitm.cut_after, mitm.cuts = None, None, 0, 0
    mitm.bodies.clear()
    mitm.streams.clear()
    mitm.header_names.clear()
    return stack, mitm, url


def _message(block: bytes) -> dict[str, Any]:
    return encoding.loads(block.split(b"\ndata: ", 1)[1].rstrip(b"\n"))  # type: ignore[no-any-return]


def _block(message: dict[str, Any], event_id: Any = None) -> bytes:
    if event_id is None:
        event_id = message["result"]["index"]
    return b"id: %s\ndata: %s\n\n" % (str(event_id).encode(), encoding.dumps(message))


def _edit(block: bytes, rid: Any = None, **changes: Any) -> bytes:
    """``block`` with members of its event ``result`` changed (None removes), under ``rid``."""
    msg = _message(block)
    for name, value in changes.items():
        if value is None:
            msg["result"].pop(name, None)
        else:
            msg["result"][name] = value
    if rid is not None:
        msg["id"] = rid
    return _block(msg)


SERVER_ID = identity("server")  # the key of the server in serve_stack


def _resign(block: bytes, **changes: Any) -> bytes:
    """``block`` re-signed with the server's own key after ``changes`` to payload and event."""
    msg = _message(block)
    payload = jws_decode_unverified(msg["result"]["response_jws"])[1]
    for name, value in changes.items():
        for obj in (payload, msg["result"]):
            if value is None:
                obj.pop(name, None)
            elif name != "timestamp" or obj is payload:
                obj[name] = value
    msg["result"]["response_jws"] = jws_sign(payload, SERVER_ID, m.Typ.EVENT)
    return _block(msg)


TIMEOUT_ERROR = {"code": -32049, "message": "intent did not finish"}

# Rewrites of the 5 blocks of count n=4 (indices 0-3, then the final event at 4).
REWRITES: dict[str, Rewrite] = {
    "drop": lambda b, rid: [b[0], *b[2:]],
    "reorder": lambda b, rid: [b[0], b[2], b[1], *b[3:]],
    "duplicate": lambda b, rid: [b[0], b[1], b[1], *b[2:]],
    "duplicate-earlier": lambda b, rid: [*b[:3], b[1], *b[3:]],
    "append-after-final": lambda b, rid: [*b, b[0]],
    "final-twice": lambda b, rid: [*b, b[-1]],
    "append-garbage": lambda b, rid: [*b, b"garbage\n\n"],
    "edit-result": lambda b, rid: [b[0], _edit(b[1], result={"i": 42}), *b[2:]],
    "edit-final-result": lambda b, rid: [*b[:4], _edit(b[4], result={"i": 4})],
    "non-final-error": lambda b, rid: [
        b[0],
        _edit(b[1], status="error", result=None, error=TIMEOUT_ERROR),
        *b[2:],
    ],
    "final-made-non-final": lambda b, rid: [*b[:4], _edit(b[4], final=False)],
    "early-final": lambda b, rid: [b[0], _edit(b[1], final=True)],
    "other-jsonrpc-id": lambda b, rid: [b[0], _edit(b[1], rid=f"{rid}-x"), *b[2:]],
    "id-line-mismatch": lambda b, rid: [b[0], b[1].replace(b"id: 1\n", b"id: 7\n"), *b[2:]],
    "extra-field": lambda b, rid: [b[0], b"event: message\n" + b[1], *b[2:]],
    "event-without-data": lambda b, rid: [*b[:2], b"id: 2\n\n"],
    # The server's own key (a compromised or buggy server): the rules beyond the signature.
    "signed-non-final-error": lambda b, rid: [
        b[0],
        _resign(b[1], status="error", result=None, error=TIMEOUT_ERROR),
        *b[2:],
    ],
    "signed-event-after-final": lambda b, rid: [*b, _resign(b[3], index=5, final=False)],
    "signed-gap": lambda b, rid: [b[0], _resign(b[1], index=2), *b[2:]],
    "signed-stale-event": lambda b, rid: [b[0], _resign(b[1], timestamp=1), *b[2:]],
    "signed-final-with-error-status-and-result": lambda b, rid: [*b[:4], _resign(b[4], status="error")],
}


@pytest.mark.parametrize("case", REWRITES, ids=REWRITES.keys())
async def test_client_refuses_every_rewritten_stream(case: str, mitm_env: tuple[Stack, Mitm, str]) -> None:
    stack, mitm, proxy = mitm_env
    mitm.rewrite = REWRITES[case]
    got: list[Any] = []
    async with A2AClient(identity("victim"), clock=stack.clock, retry=FAST) as client:
        with pytest.raises(A2AError) as info:
            async for x in client.stream(stack.server.identity.did, count(4), endpoint=proxy):
                got.append(x)
    expected = StaleTimestamp if case == "signed-stale-event" else AuthenticationFailed
    assert type(info.value) is expected, info.value
    # Whatever was yielded before the forgery was seen is genuine, in order, once.
    assert got == [{"i": i} for i in range(len(got))]
    assert {"i": 42} not in got and len(got) <= 4
    # A forgery is not retried: one stream request, then the client's close.
    assert len(mitm.bodies) == 2


@pytest.mark.parametrize("where", ["same-session", "other-session"])
async def test_client_refuses_an_event_spliced_from_another_stream(
    where: str, mitm_env: tuple[Stack, Mitm, str]
) -> None:
    stack, mitm, proxy = mitm_env
    did = stack.server.identity.did
    async with A2AClient(identity("victim"), clock=stack.clock, retry=FAST) as client:
        if where == "same-session":
            donor = [x async for x in client.stream(did, count(4), endpoint=proxy)]
        else:
            async with A2AClient(identity("donor"), clock=stack.clock) as other:
                donor = [x async for x in other.stream(did, count(4), endpoint=proxy)]
        assert donor == [{"i": i} for i in range(4)]
        spliced = mitm.streams[-1][1]  # a genuine, signed event with the same index and value
        mitm.rewrite = lambda b, rid: [b[0], _edit(spliced, rid=rid), *b[2:]]
        got: list[Any] = []
        with pytest.raises(AuthenticationFailed):
            async for x in client.stream(did, count(4), endpoint=proxy):
                got.append(x)
        assert got == [{"i": 0}]


async def test_client_retries_a_truncated_stream_byte_identically_then_raises(
    mitm_env: tuple[Stack, Mitm, str],
) -> None:
    stack, mitm, proxy = mitm_env
    mitm.rewrite = lambda b, rid: b[:-1]  # never the final event
    got: list[Any] = []
    async with A2AClient(identity("victim"), clock=stack.clock, retry=FAST) as client:
        with pytest.raises(AuthenticationFailed, match="final"):
            async for x in client.stream(stack.server.identity.did, count(4), endpoint=proxy):
                got.append(x)
        stream_bodies = mitm.bodies[:]
    assert got == [{"i": i} for i in range(4)]  # each once: the replays were skipped
    assert len(stream_bodies) == FAST.attempts
    assert len(set(stream_bodies)) == 1  # the byte-identical request, every time
    assert stack.calls["count"] == 1


async def test_client_resumes_a_stream_cut_by_the_network(mitm_env: tuple[Stack, Mitm, str]) -> None:
    stack, mitm, proxy = mitm_env
    mitm.cut_after, mitm.cuts = 2, 1
    async with A2AClient(identity("resumer"), clock=stack.clock, retry=FAST) as client:
        got = [x async for x in client.stream(stack.server.identity.did, count(6, 60), endpoint=proxy)]
        bodies = mitm.bodies[:]
    assert got == [{"i": i} for i in range(6)]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert not any("last-event-id" in names for names in mitm.header_names)  # §6.4: not used
    assert stack.calls["count"] == 1 and stack.calls["count-items"] == 6


async def test_client_refuses_a_duplicate_after_the_replay_of_a_resumed_stream(
    mitm_env: tuple[Stack, Mitm, str],
) -> None:
    stack, mitm, proxy = mitm_env
    mitm.cut_after, mitm.cuts = 2, 1
    # The resumed answer: events 0 and 1 replayed, event 2, then event 2 again.
    mitm.rewrite = lambda b, rid: [*b[:3], b[2], *b[3:]]
    got: list[Any] = []
    async with A2AClient(identity("resumer"), clock=stack.clock, retry=FAST) as client:
        with pytest.raises(AuthenticationFailed):
            async for x in client.stream(stack.server.identity.did, count(5, 30), endpoint=proxy):
                got.append(x)
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_client_resume_past_the_replay_bound_ends_with_the_signed_32048(
    mitm_env: tuple[Stack, Mitm, str],
) -> None:
    stack, mitm, proxy = mitm_env
    mitm.cut_after, mitm.cuts = 260, 1
    got: list[Any] = []
    async with A2AClient(identity("resumer"), clock=stack.clock, retry=FAST) as client:
        with pytest.raises(Unavailable) as info:
            async for x in client.stream(
                stack.server.identity.did, {"goal": "many", "inputs": {"n": 300}}, endpoint=proxy
            ):
                got.append(x)
    assert info.value.signed
    assert got == [{"i": i} for i in range(260)]


async def test_client_treats_an_unsigned_error_instead_of_a_stream_as_unauthenticated(
    mitm_env: tuple[Stack, Mitm, str],
) -> None:
    stack, mitm, proxy = mitm_env
    async with A2AClient(identity("victim"), clock=stack.clock, retry=FAST) as client:
        await client.handshake(stack.server.identity.did, proxy)
        mitm.answer = (403, b'{"jsonrpc":"2.0","id":null,"error":{"code":-32042,"message":"blocked"}}')
        with pytest.raises(A2AError) as info:
            async for _ in client.stream(stack.server.identity.did, count(2)):
                pass
        assert info.value.code == -32042 and info.value.signed is False
        assert stack.calls["count"] == 0
