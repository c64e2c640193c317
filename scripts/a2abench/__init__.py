"""a2a_secure end to end and server capacity, beside a plain FastAPI echo and a2a-sdk.

One command, one run, every case side by side on 127.0.0.1; every figure is the median of
``--rounds`` rounds (rounds interleave the cases, so that drift on a shared machine hits them
alike), and every target ratio the median of the ratios taken within each round. Servers
run in their own process (uvicorn, one worker, uvloop + httptools when installed, access
log off); their CPU time is read from ``/proc/<pid>/stat``.

1. baseline: FastAPI JSON echo (``body: dict``), ~500-byte JSON-RPC body, one httpx client
   sequential, and 32 clients concurrently (one httpx client each); and, to tell the client's
   share from the server's, one client sequential through a2a_secure's own HTTP/1.1 pool
   (``a2a_secure.client.pool``, what ``A2AClient`` sends with);
2. a2a_secure signed intents through ``A2AClient.request`` to an ``AgentServer`` serving
   ``echo``: one session sequential; 32 sessions concurrently (32 identities, one client each);
3. a2a-sdk echo agent, JSON-RPC ``SendMessage`` driven by the same httpx loop: only if ``a2a``
   is importable here, or ``--a2a-python`` names an interpreter that has a2a-sdk (the agent
   then runs under that interpreter; the client side is plain httpx); OpenTelemetry as the
   environment leaves it (on by default); and one client sequential through a2a_secure's
   pool, so that the intents/s ratio can also be read with the same client on both sides;
   3b. what the DID session costs per a2a-sdk call: the same echo executor served by a2a-sdk
   directly (A: its JSON-RPC ``SendMessage`` route) and behind a2a_secure (B: ``A2ABridge``
   in an ``AgentServer``), both with OpenTelemetry off (as in BASELINES.md), back to back in
   each round: one httpx client for A, ``A2AClient.request`` on one session for B, then wrk
   (plain bodies for A, pre-signed ``SendMessage`` intents for B); ratios B / A of server CPU
   per call and of calls per second. Needs ``a2a`` importable by this interpreter;
4. full handshakes per second (``A2AClient.handshake``, a fresh session each time);
5. server capacity with wrk (when on PATH) replaying requests prepared in advance: the plain
   echo, and signed intents each sent once (many sessions, increasing sequences, signed just
   before each round); server CPU µs per request and the ratio signed / plain;
   5b. the floor: a raw ASGI app under the same uvicorn settings that only verifies the
   request JWS's Ed25519 signature and signs a small response JWS (PyNaCl, no protocol
   checks, no store), replaying the same signed bodies; the ratio signed / floor is what
   a2a_secure costs beyond the JSON and the cryptography any implementation must do;
6. memory per open session: ``MemoryStore`` (RSS delta in a fresh process) and ``RedisStore``
   (``used_memory`` delta), idle and after one intent (the stored reply);
7. Redis: network round trips per intent (INFO stats ``total_reads_processed``) and commands
   per intent (INFO commandstats), and capacity with ``a2a-secure serve
   --redis-url`` at 1 and 2 workers;
   7b. Redis Cluster: 2 workers on a local 3-primary cluster (3 replicas; ``--redis-url
   redis+cluster://...``) in the same rounds as the 2 workers on one Redis, intents/s and
   server CPU per intent and their ratios; then the keys per primary after
   ``--cluster-sessions`` sessions opened through ``RedisStore`` (default 100 000, about 100 s
   on 2 cores; ``--quick`` 10 000), and their largest deviation from the mean (target: 10 %).
   Needs ``redis-server`` and ``redis-cli``; ``--no-cluster`` skips it.

Plus an in-process breakdown of one intent (envelope parse, protocol core, reply encoding),
and with ``--profile`` a cProfile of the signed server under wrk.

The code: ``runner`` (processes, CPU accounting, client loops, wrk, rounds and paired
ratios), one module per case family (``echo``, ``signed``, ``floor``, ``a2asdk``,
``memory``, ``redis_cases``, ``cluster_cases``), ``report`` (targets and tables) and
``main`` (the run).

    python scripts/bench.py [--quick] [--rounds N] [--json bench-results.json]
                            [--a2a-python /path/to/python] [--profile] [--no-redis] [--no-wrk]
                            [--no-cluster] [--cluster-sessions N]

The default run takes about six minutes on 2 cores (100 s of it opening the cluster's
sessions), ``--quick`` about a minute. wrk replays bodies with ``scripts/wrk/replay.lua``;
a latency plot is written beside the JSON when matplotlib is importable. Rates move with
whatever else the machine runs (the header says how many cores other processes used
meanwhile): compare ratios from one run.
"""
