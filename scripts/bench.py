#!/usr/bin/env python3
"""a2a_secure end to end and server capacity: the entry point of the ``a2abench`` package.

    python scripts/bench.py [--quick] [--rounds N] [--json bench-results.json]

``--help`` describes the cases. Server children (``--serve KIND``) and the memory probe
(``--probe-memory N``) run through this file too.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory is on sys.path already; imported (bench_ab), maybe not.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from a2abench.main import main
from a2abench.runner import _asgi_post
from a2abench.signed import intent_body, open_in_process

__all__ = ["_asgi_post", "intent_body", "main", "open_in_process"]

if __name__ == "__main__":
    sys.exit(main())
