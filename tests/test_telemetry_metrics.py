"""Prometheus metrics and JSON log lines of a real server, after a known workload.

In process: ``AgentServer(metrics=True, log_requests=True)`` under uvicorn, the real client,
``/metrics`` parsed with ``prometheus_client``'s own parser. Across processes: ``a2a-secure
serve --workers 2 --metrics --log-format json`` scraped by a real Prometheus server, whose
HTTP API must give back the counts of the workload whichever worker each scrape reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("prometheus_client", reason="prometheus_client is the metrics extra")

from http_helpers import JSON, envelope, identity
from prometheus_client.parser import text_string_to_metric_families
from prometheus_helpers import Prometheus, prometheus_binary
from redis_helpers import free_port, redis_prefix, redis_url  # noqa: F401 - fixtures
from telemetry_helpers import SECRET
from worker_helpers import TESTS_DIR, stop_group, wait_healthy

from a2a_secure.client.http import A2AClient
from a2a_secure.errors import MethodNotFound, Unavailable
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer
from a2a_secure.telemetry.logs import JsonFormatter
from a2a_secure.testing import serve_app


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


async def _workload(server: AgentServer, url: str) -> dict[str, Any]:
    """Two clients: 3 + 5 echo intents, an unknown goal, a replay, a rate-limited intent."""
    did = server.identity.did
    a, b = A2AClient(identity("client-a")), A2AClient(identity("client-b"))
    for _ in range(3):
        await a.request(did, {"goal": "echo", "inputs": {"text": SECRET}}, endpoint=url)
    with pytest.raises(MethodNotFound):
        await a.request(did, {"goal": "no-such-goal-" + SECRET, "inputs": {}})
    session = await a.session_for(did)
    req = session.prepare_intent({"goal": "echo", "inputs": {"text": SECRET}})
    async with httpx.AsyncClient() as raw:
        for _ in range(2):  # the second is the byte-identical resend: a replay
            resp = await raw.post(f"{url}/a2a/intent", content=envelope("intent", req.params), headers=JSON)
            assert resp.status_code == 200
    for _ in range(5):
        await b.request(did, {"goal": "echo", "inputs": {"text": "x"}}, endpoint=url)
    with pytest.raises(Unavailable, match="rate limit"):
        await b.request(did, {"goal": "echo", "inputs": {"text": "x"}})
    sessions = [session.session_id, (await b.session_for(did)).session_id]
    async with httpx.AsyncClient() as http:
        before = (await http.get(f"{url}/metrics")).text
        await a.aclose()
        await b.aclose()
        after = (await http.get(f"{url}/metrics")).text
    return {
        "before": before,
        "after": after,
        "sessions": sessions,
        "jws": resp.json()["result"]["response_jws"],
    }


async def test_metrics_count_a_known_workload_and_logs_tell_each_request() -> None:
    # 5 intents an hour per DID: the sixth of client b is refused with 503 and a long
    # Retry-After, which the client does not wait for.
    server = AgentServer(
        identity("metrics-server"),
        Policy.build(rate_limit=5, rate_period=3600),
        metrics=True,
        log_requests=True,
    )

    @server.intent("echo")
    async def echo(inputs: Any, context: IntentContext) -> Any:
        return inputs

    lines = _Lines()
    events = logging.getLogger("a2a_secure.events")
    events.addHandler(lines)
    events.setLevel(logging.INFO)
    try:
        async with serve_app(server.app()) as url:
            got = await _workload(server, url)
    finally:
        events.removeHandler(lines)
    s = _samples(got["before"])
    for step in ("hello", "proof", "accept_policy"):
        assert _get(s, "a2a_secure_handshake_steps_total", step=step, outcome="success", code="none") == 2
        assert _get(s, "a2a_secure_handshake_step_duration_seconds_count", step=step) == 2
    assert _get(s, "a2a_secure_intents_total", goal="echo", outcome="success", code="none") == 10
    assert _get(s, "a2a_secure_intents_total", goal="echo", outcome="error", code="-32048") == 1
    # a goal the server does not serve is never a label of its own
    assert _get(s, "a2a_secure_intents_total", goal="other", outcome="error", code="-32601") == 1
    assert _get(s, "a2a_secure_refusals_total", reason="rate_limited") == 1
    assert _get(s, "a2a_secure_replays_total", goal="echo") == 1
    assert _get(s, "a2a_secure_intent_duration_seconds_count", goal="echo") == 11
    assert _get(s, "a2a_secure_handler_duration_seconds_count", goal="echo") == 9  # not the replay
    assert _get(s, "a2a_secure_open_sessions") == 2
    after = _samples(got["after"])
    assert _get(after, "a2a_secure_closes_total", outcome="success", code="none") == 2
    assert _get(after, "a2a_secure_open_sessions") == 0
    for text in (got["before"], got["after"]):
        assert "did:" not in text and SECRET not in text and "no-such-goal" not in text

    records = [json.loads(line) for line in lines.lines]
    assert len(records) == 2 * 3 + 12 + 2  # handshake steps, intents, closes
    intents = [r for r in records if r["event"] == "intent"]
    assert {(r["outcome"], r.get("code")) for r in intents} == {
        ("success", None),
        ("error", -32048),
        ("error", -32601),
    }
    for r in intents:
        assert r["level"] in ("info", "warning") and r["session_hash"] and r["goal"] and r["sequence"] >= 1
    limited = next(r for r in intents if r.get("code") == -32048)
    assert limited["reason"] == "rate_limited" and limited["level"] == "warning"
    forbidden = [SECRET, "hunter2", got["jws"], *got["sessions"], "eyJ", "nonce"]
    for line in lines.lines:
        for item in forbidden:
            assert item not in line, (item, line)


async def test_approvals_are_counted_by_outcome() -> None:
    from a2a_secure.client.approval import NeedsApproval

    person = identity("approver")
    server = AgentServer(identity("approving-server"), approvers=[person.did], metrics=True)

    @server.intent("delete")
    async def delete(inputs: Any) -> Any:
        return NeedsApproval(action_data=inputs, preview="delete a file")

    @server.approved_action("delete")
    async def do_delete(data: Any) -> Any:
        return {"deleted": True}

    async with serve_app(server.app()) as url:
        async with A2AClient(identity("asker")) as asker, A2AClient(person) as approver:
            first = await asker.request(
                server.identity.did, {"goal": "delete", "inputs": {"f": 1}}, endpoint=url
            )
            second = await asker.request(server.identity.did, {"goal": "delete", "inputs": {"f": 2}})
            for result, approved in ((first, True), (second, False)):
                inputs = {k: result.result[k] for k in ("action_id", "action_hash")}
                await approver.request(
                    server.identity.did,
                    {"goal": "tool.approve", "inputs": {**inputs, "approved": approved}},
                    endpoint=url,
                )
        async with httpx.AsyncClient() as http:
            s = _samples((await http.get(f"{url}/metrics")).text)
    assert _get(s, "a2a_secure_approvals_total", outcome="created") == 2
    assert _get(s, "a2a_secure_approvals_total", outcome="approved") == 1
    assert _get(s, "a2a_secure_approvals_total", outcome="executed") == 1
    assert _get(s, "a2a_secure_approvals_total", outcome="rejected") == 1


# -- two workers, one real Prometheus ----------------------------------------------------------
def register_pid_echo(server: Any) -> None:
    """``A2A_SECURE_APP`` of the workers: ``echo``, and ``pid`` (which worker answered)."""

    async def echo(inputs: Any, _context: Any) -> Any:
        return inputs

    async def pid(inputs: Any, _context: Any) -> Any:
        return {"pid": os.getpid()}

    server.add("echo", echo)
    server.add("pid", pid)


async def test_prometheus_scrapes_two_workers_and_reads_the_workload_back(
    tmp_path: Path,
    redis_url: str,  # noqa: F811 - the fixture
    redis_prefix: str,  # noqa: F811 - the fixture
) -> None:
    prometheus_binary()  # skip (or fail in CI) before starting anything
    key = Identity.generate("scraped")
    key_file = tmp_path / "server.key"
    key.save(key_file)
    port = free_port()
    scratch = tmp_path / "tmp"  # where serve makes its multiprocess directory
    scratch.mkdir()
    args = [
        "serve", "--key-file", str(key_file), "--port", str(port), "--workers", "2",
        "--redis-url", redis_url, "--redis-prefix", redis_prefix,
        "--app", "test_telemetry_metrics:register_pid_echo", "--metrics", "--log-format", "json",
    ]  # fmt: skip
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "serve.log"
    code = f"from a2a_secure.cli import main; raise SystemExit(main({args!r}))"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the event loop has work
            [sys.executable, "-c", code],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(wait_healthy, url, proc, log, key.did)
        assert len(list(scratch.iterdir())) == 1  # the multiprocess directory, made by serve
        pids: set[int] = set()
        clients = 0
        while clients < 3 or (len(pids) < 2 and clients < 40):
            clients += 1
            async with A2AClient(Identity.generate(f"c{clients}")) as client:  # a new connection
                pids.add(
                    (await client.request(key.did, {"goal": "pid", "inputs": {}}, endpoint=url)).result["pid"]
                )
                for i in range(2):
                    await client.request(key.did, {"goal": "echo", "inputs": {"i": i, "s": SECRET}})
                with pytest.raises(MethodNotFound):
                    await client.request(key.did, {"goal": "unknown", "inputs": {}})
        assert len(pids) == 2, "both workers answered"
        expected = {
            'sum(a2a_secure_intents_total{goal="echo",outcome="success"})': 2 * clients,
            'sum(a2a_secure_intents_total{goal="pid",outcome="success"})': clients,
            'sum(a2a_secure_intents_total{goal="other",code="-32601"})': clients,
            'sum(a2a_secure_handshake_steps_total{step="accept_policy",outcome="success"})': clients,
            'sum(a2a_secure_closes_total{outcome="success"})': clients,
            'sum(a2a_secure_intent_duration_seconds_count{goal="echo"})': 2 * clients,
            "sum(a2a_secure_open_sessions)": 0,
        }
        with Prometheus(tmp_path, [f"127.0.0.1:{port}"]) as prom:
            for promql, value in expected.items():
                await asyncio.to_thread(prom.wait_for, promql, float(value))
            assert prom.value('up{job="a2a"}') == 1
        # Whichever worker answers a scrape, it gives the sum of both.
        async with httpx.AsyncClient() as http:
            seen = set()
            for _ in range(10):
                async with httpx.AsyncClient() as fresh:  # a new connection each time
                    text = (await fresh.get(f"{url}/metrics")).text
                seen.add(
                    _get(
                        _samples(text),
                        "a2a_secure_intents_total",
                        goal="echo",
                        outcome="success",
                        code="none",
                    )
                )
            assert seen == {2 * clients}
            assert SECRET not in text and "did:" not in text
            await http.aclose()
    finally:
        await asyncio.to_thread(stop_group, proc)
    assert list(scratch.iterdir()) == []  # serve removed its multiprocess directory
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    intents = [r for r in records if r.get("event") == "intent"]
    assert len(intents) == 4 * clients
    assert all(SECRET not in json.dumps(r) for r in records)
    assert {r["outcome"] for r in intents} == {"success", "error"}


def test_the_grafana_dashboard_uses_only_metrics_the_server_exports() -> None:
    import re

    from a2a_secure.telemetry.metrics import ServerMetrics

    dashboard = json.loads((TESTS_DIR.parent / "examples" / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"a2a_secure_\w+", target["expr"])
    }
    exported = set()
    for family in ServerMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
        exported |= {family.name + s for s in suffixes[family.type]}
    assert used and used <= exported, used - exported
    assert len(used) >= 12


def test_refusal_reasons_are_read_from_the_servers_own_messages() -> None:
    from a2a_secure.errors import AuthenticationFailed, SessionUnknown, Unavailable
    from a2a_secure.protocol.keyguard import revoked_message
    from a2a_secure.store.revocation import Revocation
    from a2a_secure.telemetry.observer import _REASONS, refusal_reason

    revoked = revoked_message(Revocation("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"))
    cases = [
        (Unavailable("rate limit reached", retry_after=3), "rate_limited"),
        (Unavailable("shared store unavailable", retry_after=1), "store_unavailable"),
        (AuthenticationFailed(revoked), "revoked"),
        (SessionUnknown(f"session ended: {revoked}"), "revoked"),
        (Unavailable("too many failed handshake steps from this address", retry_after=1), "failure_budget"),
        (Unavailable("too many open sessions", retry_after=30), "capacity"),
        (Unavailable("the original request is still running", retry_after=1), "in_progress"),
        (SessionUnknown("unknown, expired or closed session"), None),
        (AuthenticationFailed("signature does not verify: too many"), None),  # not a 503
    ]
    for exc, reason in cases:
        assert refusal_reason(exc.code, exc.message) == reason, exc.message
    # Each message the classifier reads is still the one the server sends.
    source = "\n".join(p.read_text() for p in (TESTS_DIR.parent / "a2a_secure").rglob("*.py"))
    for needle, _reason in _REASONS:
        assert f'"{needle}' in source or f" {needle}" in source, needle
