"""Telemetry costs nothing until it is asked for: no OpenTelemetry or Prometheus import.

An agent that configures no OpenTelemetry SDK and no metrics must run without the ``otel``
and ``metrics`` extras installed: the client, the CLI and the telemetry package never import
``opentelemetry`` or ``prometheus_client``, and a whole handshake and intent through a real
server imports neither ``prometheus_client`` nor any OpenTelemetry module besides those
FastAPI itself loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_IMPORTS = """
import json, sys
import a2a_secure, a2a_secure.cli, a2a_secure.client.http, a2a_secure.protocol
import a2a_secure.telemetry, a2a_secure.telemetry.tracing, a2a_secure.telemetry.logs
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry", "prometheus_client"})))
"""

_RUN = """
import asyncio, json, sys
import fastapi
by_fastapi = {m for m in sys.modules if m.startswith("opentelemetry")}
import a2a_secure.cli, a2a_secure.telemetry, a2a_secure.server.run
from a2a_secure.client.http import A2AClient
from a2a_secure.identity.keys import Identity
from a2a_secure.server.app import AgentServer
from a2a_secure.testing import serve_app

async def main():
    server = AgentServer(Identity.generate("s"), log_requests=True)

    @server.intent("echo")
    async def echo(inputs):
        return inputs

    async with serve_app(server.app()) as url, A2AClient(Identity.generate("c")) as client:
        got = await client.request(server.identity.did, {"goal": "echo", "inputs": {"a": 1}}, endpoint=url)
        assert got.result == {"a": 1}

asyncio.run(main())
print(json.dumps(sorted(
    {m for m in sys.modules if m.startswith("opentelemetry") and m not in by_fastapi}
    | ({"prometheus_client"} & set(sys.modules))
)))
"""


def _fresh(code: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_client_cli_and_telemetry_package_import_no_telemetry_library() -> None:
    assert _fresh(_IMPORTS) == []


def test_a_served_intent_without_telemetry_configured_loads_no_telemetry_library() -> None:
    assert _fresh(_RUN) == []
