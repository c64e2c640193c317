"""``a2a-secure demo``: four agents on loopback, handshakes, signed intents, the audit trail.

The translator, summarizer and sentiment example agents are served by real uvicorn servers
on 127.0.0.1 (ephemeral ports); an orchestrator finds them through a registry, runs a
handshake with each, sends signed intents, shows that a tampered request is refused, books
in a diary on a person's behalf under a delegation chain (and is refused anything wider),
closes its sessions, and finally verifies every agent's hash-chained audit log.

With ``--trace`` the three telemetry parts run too (a2a_secure.telemetry): every call is
traced (an in-process OpenTelemetry SDK; the whole demo is one trace, printed as a tree at
the end), each agent counts its intents in Prometheus metrics (summed up at the end), and
each answered request is one JSON line in ``events.jsonl`` beside the audit logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import Any, TextIO

import httpx

from a2a_secure.agent import A2AAgent, AgentRegistry, RegistryEntry
from a2a_secure.audit import AuditEvent, Auditor, JsonlAuditLog, run_audit_verify
from a2a_secure.delegation import DelegationRules
from a2a_secure.errors import A2AError
from a2a_secure.examples import calendar_agent, sentiment, summarizer, translator
from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.protocol.server import IntentContext
from a2a_secure.protocol.wire import encode_request
from a2a_secure.testing import serve_app

__all__ = ["main", "run_demo"]

_STEP = {
    "hello": "HELLO         -> CHALLENGE",
    "proof": "PROOF         -> POLICY",
    "accept_policy": "ACCEPT_POLICY -> SESSION",
    "intent": "INTENT",
    "close": "CLOSE",
}


class _PrintSink:
    """Prints the client's audit records as they happen (no inputs: the records have none)."""

    def __init__(self, out: TextIO, names: dict[str, str]) -> None:
        self.out = out
        self.names = names

    def write(self, event: AuditEvent) -> None:
        rec = event.to_dict()
        peer = self.names.get(rec["server_did"] or "", "?")
        step = _STEP.get(rec["event"], rec["event"])
        status = "ok" if rec["status"] == "success" else f"refused {rec['error_code']}"
        extra = f" seq={rec['sequence']}" if rec["sequence"] is not None else ""
        sid = rec["session_id"]
        if rec["event"] == "accept_policy" and sid:
            extra += f" session={sid[:10]}…"
        self.out.write(f"    [{peer:<10}] {step:<26} {status:<8}{extra} ({rec['duration_ms']:.1f} ms)\n")

    def close(self) -> None:
        """Nothing to release."""


def _short(value: Any) -> str:
    text = encoding.dumps(value).decode()
    return text if len(text) <= 90 else text[:87] + "..."


async def _approval_part(
    out: TextIO,
    stack: contextlib.AsyncExitStack,
    orchestrator: A2AAgent,
    registry: AgentRegistry,
    workdir: Path,
    logs: dict[str, Path],
    auditors: list[Auditor],
    dids: dict[str, str],
    names: dict[str, str],
) -> None:
    """A calendar agent that asks a person (another key) before it invites anyone (§12)."""
    person = Identity.generate("person")
    calendar_identity = Identity.generate("calendar")
    logs["calendar"] = workdir / "calendar.audit.jsonl"
    auditor = Auditor([JsonlAuditLog(logs["calendar"], calendar_identity)], role="server")
    auditors.append(auditor)
    dids["calendar"] = calendar_identity.did
    names[calendar_identity.did] = "calendar"
    calendar = calendar_agent.build_agent(calendar_identity, approvers=[person.did])
    calendar.server._audit = auditor.record
    url = await stack.enter_async_context(serve_app(calendar.app))
    registry.add(RegistryEntry("calendar", calendar.did, url, tuple(calendar.server.goals)))
    out.write(f"  human approval: calendar {calendar.did[:32]}…, person {person.did[:32]}…\n")
    event = {"title": "Design review", "start": "2026-03-02T10:00Z", "participants": ["ana@example.com"]}
    out.write(f"  orchestrator -> calendar: create_event {_short(event)}\n")
    result = await orchestrator.request("calendar", {"goal": "create_event", "inputs": event})
    out.write(f"    needs approval: action {result.action_id}, preview: {result.preview}\n")
    async with A2AAgent("person", person, registry=registry) as me:
        outcome = await me.approve("calendar", result.action_id, approved=True)
        out.write(f"    the person signed the approval of {outcome.action_hash[:23]}…; ran once: ")
        out.write(f"{_short(outcome.result)}\n")
        try:
            await me.approve("calendar", result.action_id, action_hash=outcome.action_hash)
        except A2AError as exc:
            out.write(f"    a second approval is refused: code {exc.code}: {exc.message}\n\n")


async def _delegation_part(
    out: TextIO,
    stack: contextlib.AsyncExitStack,
    orchestrator: A2AAgent,
    registry: AgentRegistry,
    names: dict[str, str],
) -> None:
    """A person lets the orchestrator book in their diary, and nothing more (§12.7)."""
    person = Identity.generate("person")
    diary = A2AAgent("diary", delegation=DelegationRules.build({"book": [person.did]}))

    @diary.intent("book")
    async def book(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        hops = [h["issuer"][:20] + "…" for h in ctx.delegation.hops] if ctx.delegation else []
        return {"booked": inputs.get("title"), "for": ctx.principal, "hops": hops}

    @diary.intent("cancel_all")
    async def cancel_all(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        return {"cancelled": "everything"}

    names[diary.did] = "diary"
    url = await stack.enter_async_context(serve_app(diary.app))
    registry.add(RegistryEntry("diary", diary.did, url, tuple(diary.server.goals)))
    chain = person.delegate(orchestrator.did, ["book"], ttl=600, targets=[diary.did])
    out.write(f"  delegation: person {person.did[:32]}… -> orchestrator -> diary, goals ['book'], 10 min\n")
    result = await orchestrator.request(
        "diary", {"goal": "book", "inputs": {"title": "Dentist"}}, on_behalf_of=chain
    )
    out.write(f"    verified result: {_short(result)}\n")
    try:
        orchestrator.delegate_further(chain, diary.did, ["book", "cancel_all"])
    except A2AError as exc:
        out.write(f"    widening the chain at the next hop is refused before signing: {exc.message}\n")
    session = await orchestrator.client.session_for(diary.did)
    try:
        # Sent as it is (the client API would refuse it before sending): the diary refuses.
        await orchestrator.client.send_intent(
            session, {"goal": "cancel_all", "inputs": {}, "delegation": chain.tokens}
        )
    except A2AError as exc:
        signed = "signed" if exc.signed else "unsigned"
        out.write(f"    cancel_all under the same chain: {signed} code {exc.code}: {exc.message}\n\n")


async def run_demo(out: TextIO, workdir: Path, *, trace: Any = None) -> int:
    """Run the whole demo, writing to ``out``; audit logs go under ``workdir``.

    ``trace``: a :class:`~a2a_secure.telemetry.view.SpanCollector` installed in the global
    tracer provider: the demo then also shows its trace tree, metrics and JSON log lines.
    """
    builders = {"translator": translator, "summarizer": summarizer, "sentiment": sentiment}
    hosts: dict[str, A2AAgent] = {}
    logs: dict[str, Path] = {}
    auditors: list[Auditor] = []
    for name, module in builders.items():
        identity = Identity.generate(name)
        logs[name] = workdir / f"{name}.audit.jsonl"
        auditor = Auditor([JsonlAuditLog(logs[name], identity)], role="server")
        auditors.append(auditor)
        agent = module.build_agent(identity)
        agent.server._audit = auditor.record  # the example builders take no audit argument
        hosts[name] = agent
    telemetry = _Telemetry(hosts, workdir) if trace is not None else None

    out.write("a2a-secure demo: three agents and an orchestrator on loopback\n\n")
    dids_extra: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        registry = AgentRegistry()
        session_urls: dict[str, str] = {}
        for name, agent in hosts.items():
            url = await stack.enter_async_context(serve_app(agent.app))
            registry.add(RegistryEntry(name, agent.did, url, tuple(agent.server.goals)))
            session_urls[name] = url
            out.write(f"  {name:<11} {agent.did[:32]}…  {url}  intents={agent.server.goals}\n")

        orch_identity = Identity.generate("orchestrator")
        logs["orchestrator"] = workdir / "orchestrator.audit.jsonl"
        names = {a.did: n for n, a in hosts.items()}
        orch_audit = Auditor(
            [JsonlAuditLog(logs["orchestrator"], orch_identity), _PrintSink(out, names)], role="client"
        )
        auditors.append(orch_audit)
        out.write(f"  orchestrator {orch_identity.did[:32]}…  (client)\n\n")

        if telemetry is not None:  # one trace for the whole demo
            stack.enter_context(telemetry.root())
        async with A2AAgent(
            "orchestrator", orch_identity, registry=registry, audit=orch_audit.record
        ) as orchestrator:
            text = (
                "Hello world. Good morning agents. The agents talk safely because every request is "
                "signed and every answer is signed too. The report is ready."
            )
            calls = [
                ("summarizer", {"goal": "summarize", "inputs": {"text": text, "max_sentences": 2}}),
                (
                    "translator",
                    {"goal": "translate", "inputs": {"text": "Hello world", "target_language": "es"}},
                ),
                ("sentiment", {"goal": "sentiment", "inputs": {"text": "The report is ready and safe"}}),
                (
                    "translator",
                    {"goal": "translate", "inputs": {"text": "The report is ready", "target_language": "fr"}},
                ),
            ]
            for target, intent in calls:
                out.write(f"  orchestrator -> {target}: {intent['goal']} {_short(intent['inputs'])}\n")
                result = await orchestrator.request(target, intent)
                out.write(f"    verified result: {_short(result)}\n\n")

            out.write("  an attacker on the path edits a signed request (inputs changed, signature kept):\n")
            session = await orchestrator.client.session_for(hosts["translator"].did)
            honest = {"goal": "translate", "inputs": {"text": "hi", "target_language": "es"}}
            req = session.prepare_intent(honest)
            forged = dict(req.params, intent={**honest, "inputs": {"text": "evil", "target_language": "es"}})
            body = encode_request("intent", forged, 1)
            url = f"{session_urls['translator']}/a2a/intent"
            async with httpx.AsyncClient() as raw:
                resp = await raw.post(url, content=body, headers={"Content-Type": "application/json"})
            err = resp.json()["error"]
            out.write(
                f"    server answered HTTP {resp.status_code}, code {err['code']}: {err['message']}\n\n"
            )
            await _approval_part(
                out, stack, orchestrator, registry, workdir, logs, auditors, dids_extra, names
            )
            await _delegation_part(out, stack, orchestrator, registry, names)
            out.write("  closing sessions\n")
        # leaving the context closed every session with an authenticated close
        for auditor in auditors:
            auditor.close()

    out.write("\naudit trail (hash-chained JSON Lines, checkpoints signed by each agent's key):\n")
    ok = True
    dids = {n: a.did for n, a in hosts.items()} | {"orchestrator": orch_identity.did} | dids_extra
    for name, path in logs.items():
        code, message = run_audit_verify(str(path), dids[name])
        ok = ok and code == 0
        lines = path.read_text().splitlines()
        events = [encoding.loads(line)["event"] for line in lines]
        out.write(f"  {name:<12} {message}\n               events: {' '.join(events)}\n")
    if telemetry is not None:
        telemetry.report(out, trace, names | {orch_identity.did: "orchestrator"})
    verdict = "all handshakes, intents and audit chains verified" if ok else "audit verification FAILED"
    out.write(f"\ndemo finished: {verdict}\n")
    return 0 if ok else 1


TRACE_EXTRAS = "pip install 'a2a-secure[otel,metrics]'"


class _Telemetry:
    """The demo's metrics and JSON event log (``--trace``), and its one root span."""

    def __init__(self, hosts: dict[str, A2AAgent], workdir: Path) -> None:
        from a2a_secure.telemetry.logs import EVENTS, JsonFormatter  # noqa: PLC0415

        self.metrics: list[tuple[str, Any]] = []
        with_metrics = importlib.util.find_spec("prometheus_client") is not None  # the metrics extra
        for name, agent in hosts.items():
            observer = agent.server._observer  # the example builders take no telemetry argument
            observer.log_requests = True
            if with_metrics:
                from a2a_secure.telemetry.metrics import ServerMetrics  # noqa: PLC0415

                agent.server.metrics = observer.metrics = ServerMetrics()
                self.metrics.append((name, agent.server.metrics))
        self.log_path = workdir / "events.jsonl"
        self.handler = logging.FileHandler(self.log_path, encoding="utf-8")
        self.handler.setFormatter(JsonFormatter())
        events = logging.getLogger(EVENTS)
        events.addHandler(self.handler)
        events.setLevel(logging.INFO)

    def root(self) -> contextlib.AbstractContextManager[Any]:
        from opentelemetry import trace  # noqa: PLC0415

        return trace.get_tracer("a2a_secure.demo").start_as_current_span("a2a-secure demo")

    def report(self, out: TextIO, collector: Any, names: dict[str, str]) -> None:
        from a2a_secure.telemetry.logs import EVENTS  # noqa: PLC0415
        from a2a_secure.telemetry.view import metrics_summary, trace_tree  # noqa: PLC0415

        logging.getLogger(EVENTS).removeHandler(self.handler)
        self.handler.close()
        if self.metrics:
            out.write("\nmetrics (Prometheus counters of each agent):\n")
            out.write(metrics_summary(self.metrics) + "\n")
        lines = self.log_path.read_text(encoding="utf-8").splitlines()
        out.write(f"\nJSON event log: {len(lines)} lines in {self.log_path}, e.g.\n  {lines[-1]}\n")
        out.write("\ntrace tree (OpenTelemetry spans of every agent, one trace):\n")
        demo_spans = [s for s in collector.spans if s.instrumentation_scope.name.startswith("a2a_secure")]
        out.write(trace_tree(demo_spans, names) + "\n")


def main(keep_logs: str | None = None, trace: bool = False) -> int:
    """Run the demo; audit logs go to ``keep_logs`` if given, else a temporary directory.

    ``trace``: also show the telemetry (the ``otel`` and ``metrics`` extras). Its
    ``events.jsonl`` is kept: in ``keep_logs``, else in a new folder the demo names.
    """
    import sys  # noqa: PLC0415

    collector = None
    if trace:
        try:
            from opentelemetry import trace as otel  # noqa: PLC0415
            from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        except ImportError:
            sys.stderr.write(f"demo --trace needs the OpenTelemetry SDK: {TRACE_EXTRAS}\n")
            return 2
        if importlib.util.find_spec("prometheus_client") is None:
            sys.stderr.write(f"demo --trace: no metrics without prometheus_client: {TRACE_EXTRAS}\n")
        from a2a_secure.telemetry.view import SpanCollector  # noqa: PLC0415

        collector = SpanCollector()
        provider = TracerProvider()
        provider.add_span_processor(collector)  # type: ignore[arg-type]
        otel.set_tracer_provider(provider)
    chosen = trace and not keep_logs
    if chosen:  # the event lines it prints the path of must outlive the demo
        keep_logs = tempfile.mkdtemp(prefix="a2a-demo-")
    try:
        if keep_logs:
            path = Path(keep_logs)
            path.mkdir(parents=True, exist_ok=True)
            code = asyncio.run(run_demo(sys.stdout, path, trace=collector))
            if chosen:
                sys.stderr.write(
                    f"demo --trace: events.jsonl and the audit logs kept in {path} (--out DIR)\n"
                )
            return code
        with tempfile.TemporaryDirectory(prefix="a2a-demo-") as tmp:
            return asyncio.run(run_demo(sys.stdout, Path(tmp), trace=collector))
    except A2AError as exc:
        sys.stderr.write(f"demo failed: {exc.message} (code {exc.code})\n")
        return 1
