"""Agent keys held in a real SoftHSM2 token (PKCS#11), never read out of it.

Keys are generated inside the token (by ``a2a-secure keygen --key-uri`` and by opensc's
``pkcs11-tool``), then used by the real command line and the real server and client over
HTTP on loopback: serve and call with token keys against each other and against file keys,
a delegation chain whose root is the token's DID, rotation inside the token, sealed actions
at rest derived inside the token, and the one-line errors of a wrong PIN, a missing token
and a removed key.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_helpers import free_port
from softhsm_helpers import PIN, SoftHsm, fresh_label, softhsm  # noqa: F401
from worker_helpers import stop_group, wait_healthy

from a2a_secure.client.http import A2AClient
from a2a_secure.delegation import DelegationRules, load_chain, verify_signatures
from a2a_secure.identity.did import public_key_from_did_key
from a2a_secure.identity.ed25519 import verify_signature
from a2a_secure.identity.encoding import hash_of
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.pkcs11_uri import Pkcs11Uri, TokenError
from a2a_secure.protocol.sealed_actions import open_action, seal_action
from a2a_secure.protocol.server import IntentContext
from a2a_secure.server.app import AgentServer
from a2a_secure.store.actions import PendingAction
from a2a_secure.testing import serve_app


def cli(hsm: SoftHsm, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "a2a_secure", *args]
    proc = subprocess.run(argv, env=hsm.env(), capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"a2a-secure {' '.join(args[:2])} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def keygen(hsm: SoftHsm, label: str, token: str = "a2a") -> str:
    """A key made in the token by the command line; its DID."""
    return cli(hsm, "keygen", "--key-uri", hsm.uri(label, token=token)).stdout.strip().splitlines()[-1]


def token_identity(hsm: SoftHsm, label: str) -> Identity:
    from a2a_secure.identity.pkcs11 import load_token_identity

    return load_token_identity(hsm.uri(label))


@contextlib.contextmanager
def serving(hsm: SoftHsm, tmp: Path, did: str, *key: str) -> Iterator[str]:
    """``a2a-secure serve`` (the §11 test agent) with ``key`` (--key-uri U or --key-file F)."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    argv = [sys.executable, "-m", "a2a_secure", "serve", *key, "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=hsm.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, did)
        yield url
    finally:
        stop_group(proc)


def call(hsm: SoftHsm, url: str, to: str, *key: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    inputs = json.dumps({"text": "from a token"})
    args = ["call", *key, "--to", to, "--endpoint", url, "--goal", "echo", "--inputs", inputs]
    return cli(hsm, *args, "--allow-loopback-dev", check=check)


# -- the key stays in the token ------------------------------------------------------------------
def test_a_key_generated_in_the_token_signs_and_cannot_be_read(softhsm: SoftHsm) -> None:  # noqa: F811
    import pkcs11

    label = fresh_label()
    did = keygen(softhsm, label)
    ident = token_identity(softhsm, label)
    assert ident.did == did and did.startswith("did:key:z6Mk")
    message = b"signed inside the token"
    assert verify_signature(public_key_from_did_key(did), message, ident.sign(message))
    with pytest.raises(TokenError, match="never leaves it"):
        ident.private_key_b64u()
    # The token itself refuses to give the private key out: sensitive, not extractable.
    lib = pkcs11.lib(softhsm.module)
    with lib.get_token(token_label="a2a").open() as session:  # the process is logged in already
        (private,) = session.get_objects(
            {pkcs11.Attribute.CLASS: pkcs11.ObjectClass.PRIVATE_KEY, pkcs11.Attribute.LABEL: label}
        )
        assert private[pkcs11.Attribute.EXTRACTABLE] is False
        assert private[pkcs11.Attribute.SENSITIVE] is True
        assert private[pkcs11.Attribute.NEVER_EXTRACTABLE] is True
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            private[pkcs11.Attribute.VALUE]
    # Derived keys are made inside the token too: stable per info, different per info.
    assert ident.derive_key(b"a") == ident.derive_key(b"a") != ident.derive_key(b"b")


def test_one_login_per_process_is_shared_and_a_second_pin_is_checked(softhsm: SoftHsm) -> None:  # noqa: F811
    import pkcs11

    from a2a_secure.identity import pkcs11 as token_module
    from a2a_secure.identity.sources import load_key_ring

    first, second = fresh_label(), fresh_label()
    keygen(softhsm, first)
    keygen(softhsm, second)
    token_identity(softhsm, first)
    token_identity(softhsm, second)
    load_key_ring(softhsm.uri(first))
    mine = [k for k in token_module._sessions if k[2] == "a2a"]
    assert len(mine) == 1  # one logged-in session for every key of the token
    # PKCS#11 logs in the application: a second login is refused by the token itself...
    with pytest.raises(pkcs11.exceptions.UserAlreadyLoggedIn):
        pkcs11.lib(softhsm.module).get_token(token_label="a2a").open(user_pin=PIN)
    # ...and a URI with another PIN may not ride on the first login.
    with pytest.raises(TokenError, match="wrong PIN for PKCS#11 token 'a2a'") as info:
        token_identity_with_pin(softhsm, first, "9999")
    assert "9999" not in str(info.value)


def token_identity_with_pin(hsm: SoftHsm, label: str, pin: str) -> Identity:
    from a2a_secure.identity.pkcs11 import load_token_identity

    return load_token_identity(hsm.uri(label, pin=pin))


def test_a_key_made_by_pkcs11_tool_names_its_curve_as_a_string_and_is_accepted(softhsm: SoftHsm) -> None:  # noqa: F811
    label = fresh_label("tool")
    made = softhsm.tool(
        "--keypairgen", "--key-type", "EC:edwards25519", "--label", label, "--id", "a1", token="tool"
    )
    # EC_PARAMS as the DER printable string "edwards25519", not the OID 1.3.101.112
    assert "130c" + b"edwards25519".hex() in made.stdout
    from a2a_secure.identity.pkcs11 import load_token_identity

    ident = load_token_identity(softhsm.uri(label, token="tool"))
    assert verify_signature(ident.public_key, b"m", ident.sign(b"m"))
    # No derivation key beside it: what needs one fails closed and names it.
    with pytest.raises(TokenError, match=f"holds no derivation key '{label}#derive'"):
        ident.derive_key(b"x")


def test_uri_errors_are_one_line_and_never_show_the_pin() -> None:
    bad = {
        "pkcs11:token=a2a;object=k;frobnicate=1?pin-value=777": "unknown attribute 'frobnicate'",
        "pkcs11:token=a2a?pin-value=777": "names no key",
        "pkcs11:token=a2a;object=k;type=public": "type must be 'private'",
        "pkcs11:token=a2a;object=k?pin-value=777&pin-source=file:/x": "not both",
        "file:/etc/passwd": "starts with 'pkcs11:'",
        "pkcs11:token=a2a;object=k;object=j": "given twice",
    }
    for uri, expected in bad.items():
        with pytest.raises(TokenError, match=expected) as info:
            Pkcs11Uri.parse(uri)
        assert "777" not in str(info.value) and "\n" not in str(info.value)
    parsed = Pkcs11Uri.parse("pkcs11:token=my%20token;object=a%2Fb;id=%01%ff?pin-value=777&module-path=/m.so")
    assert (parsed.token_label, parsed.object_label, parsed.key_id) == ("my token", "a/b", b"\x01\xff")
    assert "777" not in repr(parsed) and "777" not in parsed.without_secrets()
    assert parsed.pin({}) == "777"


def test_the_pin_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    pin_file = tmp_path / "pin"
    pin_file.write_text("4321\n")
    assert Pkcs11Uri.parse(f"pkcs11:object=k?pin-source=file:{pin_file}").pin({}) == "4321"
    assert Pkcs11Uri.parse("pkcs11:object=k").pin({"A2A_SECURE_PKCS11_PIN": "55"}) == "55"
    assert Pkcs11Uri.parse("pkcs11:object=k").module_path({"A2A_SECURE_PKCS11_MODULE": str(pin_file)}) == str(
        pin_file
    )
    with pytest.raises(TokenError, match="no PKCS#11 module"):
        Pkcs11Uri.parse("pkcs11:object=k").module_path({})


# -- serve, call and delegate with token keys -----------------------------------------------------
def test_serve_and_call_with_token_keys_against_each_other_and_file_keys(
    softhsm: SoftHsm,  # noqa: F811
    tmp_path: Path,
) -> None:
    server_label, client_label = fresh_label("srv"), fresh_label("cli")
    server_did = keygen(softhsm, server_label)
    client_did = keygen(softhsm, client_label, token="other")
    file_key = tmp_path / "file.key"
    cli(softhsm, "keygen", "--out", str(file_key))
    file_did = Identity.load(file_key).did
    token_client = ("--key-uri", softhsm.uri(client_label, token="other"))
    with serving(softhsm, tmp_path, server_did, "--key-uri", softhsm.uri(server_label)) as url:
        for key in (token_client, ("--key-file", str(file_key))):
            out = call(softhsm, url, server_did, *key)
            assert json.loads(out.stdout) == {"text": "from a token"}
    with serving(softhsm, tmp_path, file_did, "--key-file", str(file_key)) as url:
        assert json.loads(call(softhsm, url, file_did, *token_client).stdout) == {"text": "from a token"}
    assert client_did != server_did


async def test_a_token_server_in_process_and_a_chain_rooted_in_the_token(
    softhsm: SoftHsm,  # noqa: F811
    tmp_path: Path,
) -> None:
    principal_label, server_label = fresh_label("person"), fresh_label("cal")
    principal_did = keygen(softhsm, principal_label)
    server = token_identity(softhsm, (keygen(softhsm, server_label), server_label)[1])
    caller = Identity.generate("assistant")
    chain_file = tmp_path / "chain.json"
    cli(
        softhsm, "delegate", "--key-uri", softhsm.uri(principal_label), "--to", caller.did,
        "--goals", "create_event", "--ttl", "1h", "--target", server.did, "--out", str(chain_file),
    )  # fmt: skip
    chain = load_chain(chain_file.read_bytes())
    assert chain.principal == principal_did and chain.leaf.issuer == principal_did
    verify_signatures(chain, lambda link: public_key_from_did_key(link.issuer))

    agent = AgentServer(server, delegation=DelegationRules.build({"create_event": [principal_did]}))
    seen: list[Any] = []

    @agent.intent("create_event")
    async def create_event(inputs: dict[str, Any], ctx: IntentContext) -> dict[str, Any]:
        seen.append(ctx.principal)
        return {"for": ctx.principal}

    async with serve_app(agent.app()) as url, A2AClient(caller) as client:
        answer = await client.request(
            server.did, {"goal": "create_event", "inputs": {}}, endpoint=url, on_behalf_of=chain
        )
        assert answer.result == {"for": principal_did} and seen == [principal_did]
        # Without the chain, the goal reserved to the principal is refused.
        with pytest.raises(Exception, match="runs only on behalf of a principal"):
            await client.request(server.did, {"goal": "create_event", "inputs": {}}, endpoint=url)
    assert seen == [principal_did]


def test_key_rotate_inside_the_token_serves_the_new_did_with_its_statement(
    softhsm: SoftHsm,  # noqa: F811
    tmp_path: Path,
) -> None:
    label = fresh_label("rot")
    old_did = keygen(softhsm, label)
    out = json.loads(cli(softhsm, "key", "rotate", "--key-uri", softhsm.uri(label), "--overlap", "1h").stdout)
    assert out["previous_did"] == old_did and out["did"] != old_did
    new_did = out["did"]
    with serving(softhsm, tmp_path, new_did, "--key-uri", softhsm.uri(label)) as url:
        statements = httpx.get(url + "/.well-known/a2a-rotation.json", timeout=5).json()
        assert len(statements["statements"]) == 1
        # A caller reaches the agent under its new DID, signed by the new key in the token.
        client_label = fresh_label("rot-client")
        keygen(softhsm, client_label, token="other")
        answer = call(softhsm, url, new_did, "--key-uri", softhsm.uri(client_label, token="other"))
        assert json.loads(answer.stdout) == {"text": "from a token"}
    listed = softhsm.tool("--list-objects", "--type", "privkey").stdout
    assert f"{label}#retired-" in listed and f"label:      {label}\n" in listed


def test_sealed_actions_at_rest_are_keyed_inside_the_token(softhsm: SoftHsm) -> None:  # noqa: F811
    label = fresh_label("act")
    keygen(softhsm, label)
    ident = token_identity(softhsm, label)
    action = PendingAction(
        action_id="a" * 22, server_did=ident.did, caller_did="did:key:zCaller", action="pay", goal="pay",
        action_data={"amount": 5}, preview={"what": "pay 5"}, action_hash=hash_of({"amount": 5}),
        created_at=1, expires_at=2, keep_until=3,
    )  # fmt: skip
    import os

    sealed = seal_action(action, kid=ident.kid, derive_key=ident.derive_key, random_bytes=os.urandom)
    assert sealed.action_data is None and sealed.sealed is not None
    assert open_action(sealed, ident.derive_key).action_data == {"amount": 5}
    other = token_identity(softhsm, (keygen(softhsm, (o := fresh_label("act"))), o)[1])
    with pytest.raises(Exception, match="does not open"):
        open_action(sealed, other.derive_key)


# -- errors: one line naming the token, no traceback, no PIN -------------------------------------
def test_wrong_pin_missing_token_and_removed_key_are_one_line_errors(
    softhsm: SoftHsm,  # noqa: F811
    tmp_path: Path,
) -> None:
    label = fresh_label("err")
    keygen(softhsm, label)
    softhsm.tool("--delete-object", "--type", "privkey", "--label", label)
    cases = {
        softhsm.uri(fresh_label(), pin="0000"): "wrong PIN for PKCS#11 token 'a2a'",
        softhsm.uri("agent", token="no-such-token"): "no PKCS#11 token 'no-such-token'",
        softhsm.uri(label): f"no private key in token 'a2a', key '{label}'",
    }
    for uri, expected in cases.items():
        for command in (("did", "show", "--key-uri", uri), ("serve", "--key-uri", uri, "--port", "1")):
            proc = cli(softhsm, *command, check=False)
            assert proc.returncode != 0
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and expected in lines[0], proc.stderr
            assert "Traceback" not in proc.stderr and "0000" not in proc.stderr
