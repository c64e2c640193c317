"""Traces for operators without an SDK, from the command line.

``a2a-secure call`` honours OpenTelemetry's ``TRACEPARENT``/``TRACESTATE`` environment
variables: with no SDK the requests carry that context on unchanged, with one (configured
by ``OTEL_EXPORTER_OTLP_*``) the call's spans are its children. ``serve --log-format json``
puts the incoming ``traceparent``'s trace id on each request's line, no SDK needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import run_cli, serve_cli
from telemetry_helpers import decode_spans, otlp_receiver

from a2a_secure.identity.keys import Identity

SERVER = Identity.from_seed(bytes(range(70, 102)), "server")
ME = Identity.from_seed(bytes(range(71, 103)), "me")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
NO_SDK = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}


def _keys(tmp_path: Path) -> tuple[Path, Path]:
    server_key, my_key = tmp_path / "server.key", tmp_path / "me.key"
    SERVER.save(server_key)
    ME.save(my_key)
    return server_key, my_key


def _echo(key_file: Path, url: str) -> list[str]:
    return ["call", "--key-file", str(key_file), "--to", SERVER.did, "--endpoint", url, "--goal", "echo"]


def _lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_call_carries_traceparent_into_the_servers_json_log_lines_without_an_sdk(tmp_path: Path) -> None:
    server_key, my_key = _keys(tmp_path)
    args = ("--key-file", str(server_key), "--log-format", "json")
    with serve_cli(tmp_path, *args, env=NO_SDK) as served:
        call = _echo(my_key, served.url)
        traced = {**NO_SDK, "TRACEPARENT": f"00-{TRACE_ID}-{PARENT}-01", "TRACESTATE": "vendor=x"}
        done = run_cli(*call, env=traced)
        assert done.returncode == 0, done.stderr
        first = len(_lines(served.output()))
        untraced = run_cli(*call, env={**NO_SDK, "TRACEPARENT": "00-not-a-traceparent-01"})
        assert untraced.returncode == 0, untraced.stderr  # an invalid one is ignored, as W3C says
        lines = _lines(served.output())
    mine = [line for line in lines[:first] if line.get("logger") == "a2a_secure.events"]
    assert {line["event"] for line in mine} >= {"hello", "proof", "accept_policy", "intent"}
    assert all(line.get("trace_id") == TRACE_ID for line in mine), mine
    later = [line for line in lines[first:] if line.get("logger") == "a2a_secure.events"]
    assert later and all("trace_id" not in line for line in later), later


def test_call_spans_are_children_of_the_environments_traceparent(tmp_path: Path) -> None:
    server_key, my_key = _keys(tmp_path)
    with (
        serve_cli(tmp_path, "--key-file", str(server_key), env=NO_SDK) as served,
        otlp_receiver() as (url, bodies),
    ):
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
            "OTEL_SERVICE_NAME": "script",
            "TRACEPARENT": f"00-{TRACE_ID}-{PARENT}-01",
        }
        call = _echo(my_key, served.url)
        done = run_cli(*call, env=env)
        assert done.returncode == 0, done.stderr
        spans = decode_spans(bodies, ("a2a_secure",))
    assert {span.name for span in spans} >= {"a2a_secure/handshake", "a2a_secure/intent"}
    assert all(span.trace_id.hex() == TRACE_ID for span in spans)
    ours = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_span_id not in ours]
    assert roots and all(span.parent_span_id.hex() == PARENT for span in roots)
