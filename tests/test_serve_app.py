"""``a2a-secure serve --app module:agent`` serves the app as it was built.

An app built with a policy that allows one goal, revocations, a key ring, limits or an A2A
card builder must be served with them, never under the default policy that allows every
goal; a setting the command line gives differently refuses to start. The served app is the
one the worker factory builds (``app_from_env``), under real uvicorn, called by the real client.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from a2a_secure.client.http import A2AClient, RetryPolicy
from a2a_secure.errors import A2AError, PolicyViolation
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import DEFAULT_POLICY, Policy
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.server.run import ENV, app_from_env, build_server
from a2a_secure.store.revocation import FileRevocations
from a2a_secure.testing import serve_app

SEED = bytes(range(32))
CALLER = Identity.from_seed(bytes(range(1, 33)), "caller")
REVOKED = Identity.from_seed(bytes(range(2, 34)), "revoked")
NO_RETRY = RetryPolicy(attempts=1)

APP = """
from a2a_secure import A2AAgent
from a2a_secure.identity.keys import Identity
from a2a_secure.policy import Policy
from a2a_secure.protocol.server import ServerLimits
from a2a_secure.store.revocation import FileRevocations

agent = A2AAgent(
    "built",
    Identity.from_seed(bytes(range(32)), "built"),
    policy=Policy.build(allowed=["echo"], rate_limit=50),
    limits=ServerLimits(max_pending_total=77),
)
agent.server.revocations = (FileRevocations({revocations!r}),)
agent.server.set_card_builder(lambda card: {{**card, "x-built": True}})


@agent.intent("echo")
def echo(inputs):
    return inputs


@agent.intent("admin")
def admin(inputs):
    return "every goal ran"
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    revocations = tmp_path / "revoked.json"
    name = f"built_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP.format(revocations=str(revocations))))
    monkeypatch.syspath_prepend(str(tmp_path))
    Identity.from_seed(SEED, "built").save(tmp_path / "agent.key")
    yield f"{name}:agent"
    sys.modules.pop(name, None)


async def test_serve_app_keeps_the_policy_and_revocations_the_app_was_built_with(
    tmp_path: Path, app_module: str
) -> None:
    await FileRevocations(tmp_path / "revoked.json").revoke(REVOKED.did)
    env = {ENV["key_file"]: str(tmp_path / "agent.key"), ENV["app"]: app_module}
    app = app_from_env(env)
    server = app.state.agent_server
    assert server.policy == Policy.build(allowed=["echo"], rate_limit=50)
    assert server.limits.max_pending_total == 77 and server.card["x-built"] is True
    did = server.identity.did
    async with serve_app(app) as url, A2AClient(CALLER, retry=NO_RETRY) as client:
        echoed = await client.request(did, {"goal": "echo", "inputs": {"a": 1}}, endpoint=url)
        assert echoed.result == {"a": 1}
        session = await client.session_for(did, url)
        assert session.policy.allowed_intents == ("echo",)
        with pytest.raises(PolicyViolation) as refused:  # not "every goal ran"
            await client.request(did, {"goal": "admin", "inputs": {}}, endpoint=url)
        assert refused.value.code == -32042
    async with serve_app(app) as url, A2AClient(REVOKED, retry=NO_RETRY) as revoked:
        with pytest.raises(A2AError):  # the app's own revocation list holds
            await revoked.request(did, {"goal": "echo", "inputs": {}}, endpoint=url)


def test_a_setting_given_twice_differently_refuses_to_start(tmp_path: Path, app_module: str) -> None:
    identity = Identity.load(tmp_path / "agent.key")
    other = Policy.build(allowed=["*"], rate_limit=10)
    with pytest.raises(ValueError, match="built with its own policy, and the command line gives another"):
        build_server(identity, policy=other, app=app_module)
    with pytest.raises(ValueError, match=r"its own limits, and the command line gives another \(--policy"):
        build_server(identity, limits=ServerLimits(max_pending_total=5), app=app_module)
    same = build_server(identity, policy=Policy.build(allowed=["echo"], rate_limit=50), app=app_module)
    assert same.policy.allowed_intents == ("echo",)
    assert build_server(identity, app=app_module).policy != DEFAULT_POLICY


async def test_an_app_with_a_shared_store_is_served_on_it(tmp_path: Path, app_module: str) -> None:
    # Its sessions, sequences and the revocations kept in the store live there: serving it on
    # a fresh in-memory store would forget them (a revoked DID would be let in again). Another
    # shared store given on the command line is a conflict, not a silent choice.
    from a2a_secure.store.redis import RedisStore

    build_server(Identity.load(tmp_path / "agent.key"), app=app_module)  # imports the module
    module = sys.modules[app_module.partition(":")[0]]
    shared = RedisStore("redis://127.0.0.1:6379/0", prefix="a2a-test-serve-app:")  # not contacted
    other = RedisStore("redis://127.0.0.1:6379/0", prefix="a2a-test-serve-app-2:")
    module.agent.server.store = shared
    try:
        identity = Identity.load(tmp_path / "agent.key")
        assert build_server(identity, app=app_module).store is shared
        conflict = r"its own store, and the command line gives another \(--redis-url\)"
        with pytest.raises(ValueError, match=conflict):
            build_server(identity, app=app_module, store=other)
    finally:
        await shared.aclose()
        await other.aclose()


def test_the_key_ring_the_app_was_built_with_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from a2a_secure.identity.rotation import KeyRing, RetiredKey
    from a2a_secure.server.app import AgentServer

    ring = KeyRing(Identity.from_seed(bytes(range(3, 35)), "ringed")).rotate(overlap=3600)
    ring.save(tmp_path / "ring.key")
    module = types.ModuleType("ringed_app")
    module.server = AgentServer(ring.current, key_ring=ring)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ringed_app", module)
    # Sessions opened with the retired key keep their answers: the ring must not be dropped.
    assert build_server(ring.current, app="ringed_app:server").key_ring is ring
    from_file = build_server(
        ring.current, app="ringed_app:server", key_ring=KeyRing.load(tmp_path / "ring.key")
    )
    assert from_file.key_ring is ring
    other = KeyRing(ring.current, retired=(RetiredKey(Identity.generate("else"), 1, 2),))
    conflict = r"its own key ring, and the command line gives another \(--key-file\)"
    with pytest.raises(ValueError, match=conflict):
        build_server(ring.current, app="ringed_app:server", key_ring=other)
