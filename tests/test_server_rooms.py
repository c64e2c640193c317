"""The server core's layout (a2a_secure.protocol.server): one module per section of the contract."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from protocol_helpers import make_world

from a2a_secure.policy import Policy
from a2a_secure.protocol import server
from a2a_secure.protocol.server import IntentDispatcher
from a2a_secure.store.memory import MemoryStore

ROOT = Path(server.__file__).parent
MODULES = sorted(p for p in ROOT.glob("*.py"))
# The modules that decide (sans-I/O): all of them. What waits on the event loop (the
# runner, the gate, the stream pump, the replay, the intent_id claims) is a2a_secure.runtime's.
NO_ASYNCIO = (
    "auditing",
    "budget",
    "common",
    "deadlines",
    "dispatcher",
    "events",
    "handshake",
    "intents",
    "ports",
    "replies",
    "scheduler",
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_the_public_names_are_importable_from_the_package() -> None:
    from a2a_secure.protocol.server import (  # noqa: F401
        HANDSHAKE_METHODS,
        INTENT_METHODS,
        AuditHook,
        IntentContext,
        IntentDispatcher,
        Reply,
        ServerLimits,
        endpoint_of,
        parse_intent,
    )

    public = ["AuditHook", "IntentContext", "IntentDispatcher", "Reply", "ServerLimits"]
    assert sorted(server.__all__) == sorted([*public, "parse_intent"])
    assert all(getattr(server, name) is not None for name in server.__all__)
    assert endpoint_of("proof") == "handshake" and endpoint_of("close") == "intent"
    assert endpoint_of("nope") is None
    assert HANDSHAKE_METHODS.isdisjoint(INTENT_METHODS)


@pytest.mark.parametrize("name", NO_ASYNCIO)
def test_rooms_that_decide_do_not_import_asyncio(name: str) -> None:
    assert (ROOT / f"{name}.py").is_file()
    assert "asyncio" not in _imports(ROOT / f"{name}.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_every_room_names_the_section_it_implements(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc is not None and "§" in doc
    assert len(path.read_text(encoding="utf-8").splitlines()) < 600


async def test_replacing_the_configuration_of_a_live_server_reaches_its_rooms() -> None:
    w = make_world()
    sess, _ = await w.open_session()
    assert (await w.intent(sess, a=1)).result["echo"] == {"a": 1}
    # Another dispatcher: the intent processor no longer finds the goal (signed -32601).
    w.server.dispatcher = IntentDispatcher()
    req = sess.prepare_intent({"goal": "echo", "inputs": {}})
    r = await w.call("intent", req.params)
    assert r.error is not None and r.error["code"] == -32601 and "response_jws" in r.error["data"]
    # Another store: the session is unknown there (unsigned -32043).
    w.server.store = MemoryStore()
    req = sess.prepare_intent({"goal": "echo", "inputs": {}})
    r = await w.call("intent", req.params)
    assert r.error is not None and r.error["code"] == -32043 and "data" not in r.error
    # Another policy: offered by the handshake responder to the next HELLO.
    blocked = Policy.build(blocked=["echo"])
    w.server.policy = blocked
    challenge = (await w.call("hello", w.handshake().hello())).result
    assert challenge["policy_hash"] == blocked.hash
