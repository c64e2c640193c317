"""The baseline: a FastAPI JSON echo (``body: dict``) and its ~500-byte JSON-RPC request."""

from __future__ import annotations

import json
from typing import Any

PLAIN_POOL_NAME = "FastAPI echo, 1 client, pool"


def _plain_body() -> bytes:
    """A JSON-RPC request of 499 bytes, the size BASELINES.md used."""
    pad = 0
    while True:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "echo",
                "params": {"goal": "echo", "domain": "bench", "inputs": {"text": "x" * pad}},
                "id": 1,
            },
            separators=(",", ":"),
        ).encode()
        if len(body) >= 499:
            return body
        pad += 1


PLAIN_BODY = _plain_body()


def _plain_app() -> Any:
    from fastapi import FastAPI

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    return app
