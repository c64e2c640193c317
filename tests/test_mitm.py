"""An active attacker between real clients and a real server (ATTACKS.md F, G, J).

``tests/mitm_helpers.py`` has the harness: a man-in-the-middle ASGI app under uvicorn between
two honest ``A2AClient``s and an ``AgentServer`` under uvicorn, applying seeded random
mutations (drop, duplicate, delay, reorder, replay, reflect, edit bodies and headers, forge
errors). After every run it checks that client and server agree on every session both
accepted, that only signed intents run and each at most once per session and sequence, and
that every value a client returns is the server's output for that very request. The
longer campaign is ``scripts/mitm_campaign.py``.

The targeted tests below pin the client bugs the campaign found: an attacker-chosen
``Retry-After`` could raise a raw ``ValueError`` ("²" is ``str.isdigit()``) or make the client
sleep for as long as the attacker liked (non-503 statuses and streams ignored ``max_wait``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from redis_helpers import redis_url  # noqa: F401

from a2a_secure.errors import A2AError
from tests.mitm_helpers import MUTATION_NAMES, Answer, Campaign, Wire, _json_answer, run_campaign

SEED = 20_251_121
RUNS = 40
# Edits of streamed events depend on timing in the campaign (a stream must get that far
# while its response is the one picked): test_every_edited_stream_is_refused_or_exact below
# edits streams on purpose instead.
EDIT_PREFIXES = ("edit_req:", "edit_resp:", "jws-flip")
SSE_EDITS = ("drop", "duplicate", "swap", "edit", "truncate", "keepalive")


async def test_campaign_keeps_every_invariant_on_every_run() -> None:
    report = await run_campaign(SEED, RUNS, ops_per_client=5)
    print("\n" + report.summary(details=True))
    assert report.violations == [], report.summary()
    assert report.runs == RUNS
    # The attacker really attacked: every kind of mutation was tried, replays came from the
    # same and from the other client, held-back requests were delivered late, and edits hit
    # requests, responses and streamed events.
    missing = [name for name in MUTATION_NAMES if report.mutations[name] == 0]
    assert not missing, missing
    assert report.mutations.total() - report.mutations["pass"] > 300
    # Which request or response a mutation lands on depends on timing as well as on the seed:
    # when something was not reached, further seeded campaigns run (each one checking every
    # invariant) until it is, at most three.
    wanted = ("replay:same-client", "replay:other-client", "late_delivered", "forged:-32043", *EDIT_PREFIXES)
    details = Counter(report.details)
    for extra_seed in range(SEED + 1, SEED + 4):
        if all(any(w in k for k in details) for w in wanted):
            break
        more = await run_campaign(extra_seed, 10, ops_per_client=5)
        assert more.violations == [], more.summary()
        details.update(more.details)
    for w in wanted:
        assert any(w in k for k in details), w
    # ... and honest work still got done, so the invariants were not checked on nothing.
    assert report.sessions_accepted > 40 and report.results_returned > 80 and report.executions > 80
    assert report.outcomes["success"] > 80
    assert sum(n for k, n in report.outcomes.items() if k.startswith("error")) > 80


# -- regressions: Retry-After is unauthenticated ---------------------------------------------------


@pytest_asyncio.fixture
async def campaign() -> AsyncIterator[Campaign]:
    async with Campaign(1) as c:
        yield c


def forge_once(
    campaign: Campaign, method: str, status: int, retry_after: bytes, *, forward: bool = False
) -> None:
    """Answer the next ``method`` request with an unsigned error and this ``Retry-After``."""
    mitm = campaign.mitm
    assert mitm is not None
    honest = mitm.exchange
    state = {"forged": 0}

    async def exchange(wire: Wire) -> Answer:
        if wire.method == method and not state["forged"]:
            state["forged"] += 1
            if forward:
                await mitm.forward(wire)
            error = {"jsonrpc": "2.0", "id": wire.rpc["id"], "error": {"code": -32048, "message": "busy"}}
            return _json_answer(error, status, **{"retry-after": retry_after})
        return await honest(wire)

    mitm.exchange = exchange  # type: ignore[method-assign]


@pytest.mark.parametrize("value", [b"\xb2", b"\xb9", b"1\xb3", b"\xd9\xa3"])
async def test_retry_after_that_is_not_ascii_digits_is_ignored(campaign: Campaign, value: bytes) -> None:
    # b"\xb2" reaches httpx as "²" (latin-1): str.isdigit() says yes, float() raised ValueError.
    forge_once(campaign, "intent", 503, value)
    async with campaign._clients() as clients:
        alice = clients["alice"]
        did = campaign.server_identity.did
        res = await alice.request(did, {"goal": "echo", "inputs": {"tag": "r"}}, endpoint=campaign.url)
        assert res.result["echo"] == {"tag": "r"}  # the 503 was retried after the backoff
        await alice.aclose()
    assert [e.sequence for e in campaign.ledger.executions if e.inputs.get("tag") == "r"] == [res.sequence]
    assert campaign.ledger.check() == []


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_unsigned_retry_after_beyond_max_wait_fails_fast(campaign: Campaign, status: int) -> None:
    # Before the fix, only a 503 was checked against max_wait: 502 + "Retry-After: 3600" slept an hour.
    forge_once(campaign, "intent", status, b"3600", forward=True)
    async with campaign._clients() as clients:
        alice = clients["alice"]
        did = campaign.server_identity.did
        await alice.handshake(did, endpoint=campaign.url)
        started = time.perf_counter()
        with pytest.raises(A2AError) as caught:
            await alice.request(did, {"goal": "echo", "inputs": {"tag": "w"}}, endpoint=campaign.url)
        assert time.perf_counter() - started < 2
        assert not caught.value.signed
        # The byte-identical retry was not sent; the next request goes on normally.
        res = await alice.request(did, {"goal": "echo", "inputs": {"tag": "next"}}, endpoint=campaign.url)
        assert res.result["echo"] == {"tag": "next"}
        await alice.aclose()
    assert campaign.ledger.check() == []


async def test_stream_retry_after_beyond_max_wait_fails_fast(campaign: Campaign) -> None:
    # Before the fix the stream path slept max(Retry-After, backoff) without looking at max_wait.
    forge_once(campaign, "intent", 503, b"99999999")
    async with campaign._clients() as clients:
        alice = clients["alice"]
        did = campaign.server_identity.did
        await alice.handshake(did, endpoint=campaign.url)
        started = time.perf_counter()
        with pytest.raises(A2AError):
            async for _ in alice.stream(did, {"goal": "count", "inputs": {"n": 2}}, endpoint=campaign.url):
                pass  # pragma: no cover - nothing arrives
        assert time.perf_counter() - started < 2
        items = [
            i async for i in alice.stream(did, {"goal": "count", "inputs": {"n": 2}}, endpoint=campaign.url)
        ]
        assert [i["i"] for i in items] == [0, 1]
        await alice.aclose()
    assert campaign.ledger.check() == []


async def test_every_edited_stream_is_refused_or_exact(campaign: Campaign) -> None:
    """Every streamed answer is edited on the way back (drop, duplicate, swap, edit,
    truncate or a keep-alive inserted): the client raises an A2AError, or what it yielded
    is exactly the handler's items for that request; never anything else."""
    mitm = campaign.mitm
    assert mitm is not None
    honest = mitm.exchange

    async def exchange(wire: Wire) -> Answer:
        answer = await honest(wire)
        if answer.is_sse:
            return Answer(answer.status, answer.headers, mitm.edit_sse(answer.body))
        return answer

    mitm.exchange = exchange  # type: ignore[method-assign]
    refused = exact = 0
    async with campaign._clients() as clients:
        alice = clients["alice"]
        me = alice.identity.did
        for k in range(36):
            intent = {"goal": "count", "inputs": {"tag": f"sse-{k}", "n": 2 + k % 3}}
            try:
                await campaign._stream(alice, me, intent)
            except A2AError:
                refused += 1
            else:
                exact += 1
        await alice.aclose()
    kinds = {k.removeprefix("edit_sse:") for k in mitm.details if k.startswith("edit_sse:")}
    assert set(SSE_EDITS) <= kinds, kinds  # an edit also names the member it edited
    # Both outcomes happened (a keep-alive or an identical duplicate changes nothing signed),
    # and the ledger holds every yielded item against the handler's own output.
    assert refused > 0 and exact > 0, (refused, exact)
    assert campaign.ledger.check() == []


# -- exactly once: forged -32043 after the intent ran ----------------------------------------------


def forge_unknown_session_once(campaign: Campaign, *, drop_first: bool = False) -> None:
    """The next intent runs; its answer (or, with ``drop_first``, the answer to its retry) is
    replaced by an unsigned -32043."""
    mitm = campaign.mitm
    assert mitm is not None
    honest = mitm.exchange
    state = {"done": False}

    async def exchange(wire: Wire) -> Answer:
        if wire.method == "intent" and not state["done"]:
            state["done"] = True
            if drop_first:
                return await mitm._m_drop_then_forge_unknown_session(wire)
            return await mitm._m_forge_unknown_session(wire)
        return await honest(wire)

    mitm.exchange = exchange  # type: ignore[method-assign]


@pytest.mark.parametrize("drop_first", [False, True])
async def test_forged_unknown_session_after_the_run_does_not_run_the_intent_twice(
    campaign: Campaign, drop_first: bool
) -> None:
    forge_unknown_session_once(campaign, drop_first=drop_first)
    async with campaign._clients() as clients:
        alice = clients["alice"]
        did = campaign.server_identity.did
        res = await alice.request(did, {"goal": "echo", "inputs": {"tag": "once"}}, endpoint=campaign.url)
        runs = [e for e in campaign.ledger.executions if e.inputs.get("tag") == "once"]
        assert len(runs) == 1 and runs[0].intent_id == res.intent_id is not None
        # The value is the one run's (under the first session), delivered on the second.
        assert res.result == runs[0].output and res.result["session"] == runs[0].session_id
        assert campaign.ledger.last_session[alice.identity.did] != runs[0].session_id
        await alice.aclose()
    assert campaign.ledger.check() == []


async def test_without_the_extension_the_forged_resend_runs_twice(campaign: Campaign) -> None:
    # Today's behaviour for a client that does not use intent_id (SECURITY.md).
    forge_unknown_session_once(campaign)
    async with campaign._clients() as clients:
        alice = clients["alice"]
        alice.exactly_once = False
        did = campaign.server_identity.did
        await alice.request(did, {"goal": "echo", "inputs": {"tag": "twice"}}, endpoint=campaign.url)
        await alice.aclose()
    assert len([e for e in campaign.ledger.executions if e.inputs.get("tag") == "twice"]) == 2
    assert campaign.ledger.logical_duplicates() == 1


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_exactly_once_campaign_in_process(store: str, request: pytest.FixtureRequest) -> None:
    from tests.mitm_helpers import EXACTLY_ONCE_MUTATIONS

    url = request.getfixturevalue("redis_url") if store == "redis" else ""
    runs = 150 if store == "memory" else 60
    report = await run_campaign(
        SEED,
        runs,
        in_process=True,
        runs_per_handshake=5,
        exactly_once=True,
        mutations=EXACTLY_ONCE_MUTATIONS,
        store=store,
        redis_url=url,
        check_every=10,
    )
    print("\n" + report.summary())
    assert report.violations == [], report.summary()
    assert report.logical_duplicates == 0
    assert report.with_intent_id == report.executions > 200
    assert report.resent > 10 and report.resent_answered > 5
    assert report.mutations["forge_unknown_session"] > 0
    assert report.mutations["drop_then_forge_unknown_session"] > 0
    if store == "redis":
        assert report.details["server_restart:cancelled"] > 0


async def test_sealed_campaign_in_process() -> None:
    # PROTOCOL.md §12.6: the sealed mutations (sealed values flipped, moved across sequences,
    # sessions, clients and directions, stripped or replaced by plaintext; seal_keys swapped in
    # the signed handshake; the card stripped of "sealed") with clients that require sealing.
    # The handler gets exactly the inputs the client sealed, and every value returned is the
    # handler's output for that request; a stripped card is refused, never sent in the clear.
    from tests.mitm_helpers import SEALED_MUTATIONS

    report = await run_campaign(SEED, 80, in_process=True, runs_per_handshake=5, sealed=True, check_every=10)
    print("\n" + report.summary(details=True))
    assert report.violations == [], report.summary()
    for name, _ in SEALED_MUTATIONS:
        assert report.mutations[name] > 0, name
    assert report.executions > 200 and report.results_returned > 200
    edits = [k for k in report.details if k.startswith(("seal_edit_request:", "seal_edit_response:"))]
    assert {k.split(":")[1] for k in edits} >= {"flip", "swap", "plain"}, edits


async def test_sealed_exactly_once_campaign_in_process() -> None:
    # Sealed sessions with intent_ids: a resend on a new session (after a forged -32043) gets
    # the one run's answer, kept sealed under the intent's answer key and sealed again for the
    # new session; the sealed mutations join the exactly-once table.
    from tests.mitm_helpers import EXACTLY_ONCE_MUTATIONS

    report = await run_campaign(
        SEED,
        100,
        in_process=True,
        runs_per_handshake=5,
        exactly_once=True,
        sealed=True,
        mutations=EXACTLY_ONCE_MUTATIONS,
        check_every=10,
    )
    print("\n" + report.summary())
    assert report.violations == [], report.summary()
    assert report.logical_duplicates == 0
    assert report.with_intent_id == report.executions > 200
    assert report.resent > 10 and report.resent_answered > 5
