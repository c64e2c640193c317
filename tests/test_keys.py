"""Identity keys: construction, key files, secrecy, strict verification (ATTACKS.md A, I3)."""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import nacl.bindings
import pytest

from a2a_secure.errors import DIDResolutionError, InvalidParams
from a2a_secure.identity import (
    Identity,
    KeyFileError,
    b64u_decode,
    b64u_encode,
    check_public_key,
    public_key_from_did_key,
    verify_signature,
)
from a2a_secure.identity.keys import public_key_entry

SEED = bytes(range(32))

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


def _secret_spellings(ident: Identity) -> list[str]:
    seed = b64u_decode(ident.private_key_b64u())
    return [ident.private_key_b64u(), seed.hex(), repr(seed)[2:-1], seed.hex().upper()]


# -- construction ----------------------------------------------------------------------------------


def test_generate_gives_distinct_did_key_identities() -> None:
    a, b = Identity.generate("a"), Identity.generate("b")
    assert a.did != b.did
    assert a.did.startswith("did:key:z6Mk")
    assert a.kid == f"{a.did}#{a.did[len('did:key:') :]}"
    assert public_key_from_did_key(a.did) == a.public_key
    assert len(a.public_key) == 32
    assert a.agent_id == "a"


def test_sign_gives_64_bytes_that_verify() -> None:
    ident = Identity.generate("a")
    sig = ident.sign(b"message")
    assert len(sig) == 64
    assert verify_signature(ident.public_key, b"message", sig)
    assert not verify_signature(ident.public_key, b"messagf", sig)


def test_sign_takes_no_public_key() -> None:
    # A8: the public key inside the signature is always derived from the private key.
    assert list(inspect.signature(Identity.sign).parameters) == ["self", "data"]


@pytest.mark.parametrize("agent_id", ["", "x" * 129, None, 5])
def test_agent_id_bounds(agent_id: Any) -> None:
    with pytest.raises(InvalidParams):
        Identity.generate(agent_id)


def test_agent_id_limits_accepted() -> None:
    assert Identity.generate("x").agent_id == "x"
    assert Identity.generate("x" * 128).agent_id == "x" * 128


def test_from_seed_is_deterministic() -> None:
    assert Identity.from_seed(SEED, "a").did == Identity.from_seed(SEED, "b").did


@pytest.mark.parametrize("seed", [b"", b"\x00" * 31, b"\x00" * 33, b"\x00" * 64, bytearray(32), "0" * 32])
def test_from_seed_wrong_length_or_type(seed: Any) -> None:
    with pytest.raises(KeyFileError):
        Identity.from_seed(seed, "a")


def test_from_private_key_round_trip() -> None:
    ident = Identity.from_seed(SEED, "a")
    again = Identity.from_private_key(ident.private_key_b64u(), "a")
    assert again.did == ident.did
    assert again.sign(b"x") == ident.sign(b"x")


@pytest.mark.parametrize(
    "text",
    [
        b64u_encode(SEED) + "=",
        b64u_encode(SEED).replace("_", "/").replace("-", "+") + "/",
        b64u_encode(SEED[:31]),
        b64u_encode(SEED + b"\x00"),
        "not base64!",
        "",
    ],
)
def test_from_private_key_rejects_bad_text(text: str) -> None:
    with pytest.raises(KeyFileError):
        Identity.from_private_key(text, "a")


@pytest.mark.parametrize("value", [None, 5, SEED])
def test_from_private_key_rejects_non_str(value: Any) -> None:
    with pytest.raises(KeyFileError):
        Identity.from_private_key(value, "a")


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    ident = Identity.from_seed(SEED, "a")
    monkeypatch.setenv("A2A_PRIVATE_KEY", ident.private_key_b64u())
    assert Identity.from_env(agent_id="a").did == ident.did
    monkeypatch.setenv("OTHER_KEY", ident.private_key_b64u() + "\n")
    assert Identity.from_env("OTHER_KEY", agent_id="a").did == ident.did


def test_from_env_missing_or_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("A2A_PRIVATE_KEY", raising=False)
    with pytest.raises(KeyFileError, match="A2A_PRIVATE_KEY"):
        Identity.from_env(agent_id="a")
    monkeypatch.setenv("A2A_PRIVATE_KEY", "")
    with pytest.raises(KeyFileError):
        Identity.from_env(agent_id="a")
    monkeypatch.setenv("A2A_PRIVATE_KEY", "garbage!")
    with pytest.raises(KeyFileError):
        Identity.from_env(agent_id="a")


def test_did_web_identity_needs_kid() -> None:
    signing = nacl.signing.SigningKey(SEED)
    with pytest.raises(InvalidParams):
        Identity(signing, "a", did="did:web:example.com")
    ident = Identity.from_seed(SEED, "a").with_did_web("did:web:example.com", "did:web:example.com#key-1")
    assert ident.did == "did:web:example.com"
    assert ident.kid == "did:web:example.com#key-1"
    assert ident.public_key == Identity.from_seed(SEED, "a").public_key


# -- key files ---------------------------------------------------------------------------------------


@posix_only
def test_save_creates_file_0600(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    old = os.umask(0)
    try:
        Identity.from_seed(SEED, "a").save(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    ident = Identity.from_seed(SEED, "agent-1")
    ident.save(path)
    loaded = Identity.load(path)
    assert (loaded.did, loaded.kid, loaded.agent_id, loaded.public_key) == (
        ident.did,
        ident.kid,
        ident.agent_id,
        ident.public_key,
    )
    data = json.loads(path.read_text())
    assert data == {
        "version": 1,
        "agent_id": "agent-1",
        "did": ident.did,
        "kid": ident.kid,
        "private_key": ident.private_key_b64u(),
    }


def test_save_load_did_web_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "web.key"
    ident = Identity.from_seed(SEED, "a").with_did_web("did:web:example.com", "did:web:example.com#key-1")
    ident.save(path)
    loaded = Identity.load(path)
    assert loaded.did == "did:web:example.com"
    assert loaded.kid == "did:web:example.com#key-1"


def test_save_refuses_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    first = Identity.from_seed(SEED, "a")
    first.save(path)
    before = path.read_bytes()
    with pytest.raises(KeyFileError, match="exists"):
        Identity.generate("b").save(path)
    assert path.read_bytes() == before
    assert Identity.load(path).did == first.did


@posix_only
def test_save_overwrite_replaces_and_tightens_mode(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    path.write_text("old")
    path.chmod(0o644)
    second = Identity.generate("b")
    second.save(path, overwrite=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load(path).did == second.did


@posix_only
def test_save_does_not_follow_symlink(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    link = tmp_path / "agent.key"
    link.symlink_to(target)
    with pytest.raises(KeyFileError):
        Identity.generate("a").save(link)
    with pytest.raises(KeyFileError):
        Identity.generate("a").save(link, overwrite=True)
    assert target.read_text() == "precious"


def test_save_into_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError):
        Identity.generate("a").save(tmp_path / "missing" / "agent.key")


@posix_only
@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604, 0o620, 0o660, 0o601, 0o666])
def test_load_refuses_group_or_world_accessible_file(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "agent.key"
    Identity.from_seed(SEED, "a").save(path)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        Identity.load(path)
    assert Identity.load(path, check_permissions=False).did == Identity.from_seed(SEED, "a").did


@posix_only
def test_load_accepts_owner_only_modes(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    Identity.from_seed(SEED, "a").save(path)
    for mode in (0o400, 0o600, 0o700):
        path.chmod(mode)
        assert Identity.load(path).agent_id == "a"


def _write_key_file(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    path.chmod(0o600)


def test_load_refuses_wrong_did(tmp_path: Path) -> None:
    ident = Identity.from_seed(SEED, "a")
    other = Identity.generate("b")
    path = tmp_path / "agent.key"
    _write_key_file(
        path,
        {
            "version": 1,
            "agent_id": "a",
            "did": other.did,
            "kid": other.kid,
            "private_key": ident.private_key_b64u(),
        },
    )
    with pytest.raises(KeyFileError, match="does not match"):
        Identity.load(path)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"version":1,"version":1,"agent_id":"a","private_key":"x"}',
        [],
        {"version": 2, "agent_id": "a", "private_key": b64u_encode(SEED)},
        {"agent_id": "a", "private_key": b64u_encode(SEED)},
        {"version": 1, "private_key": b64u_encode(SEED)},
        {"version": 1, "agent_id": "a"},
        {"version": 1, "agent_id": "a", "private_key": b64u_encode(SEED[:31])},
        {"version": 1, "agent_id": "a", "private_key": 5},
        {"version": 1, "agent_id": "a", "did": "did:web:example.com", "private_key": b64u_encode(SEED)},
    ],
)
def test_load_refuses_malformed_files(tmp_path: Path, content: Any) -> None:
    path = tmp_path / "agent.key"
    _write_key_file(path, content)
    with pytest.raises(KeyFileError):
        Identity.load(path)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="not found"):
        Identity.load(tmp_path / "nope.key")


def test_load_refuses_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    _write_key_file(path, " " * (64 * 1024 + 1))
    with pytest.raises(KeyFileError, match="too large"):
        Identity.load(path)


def test_load_directory(tmp_path: Path) -> None:
    path = tmp_path / "dir.key"
    path.mkdir(mode=0o700)
    with pytest.raises(KeyFileError):
        Identity.load(path)


# -- secrecy (I3) -------------------------------------------------------------------------------------


def test_repr_str_format_never_show_the_private_key() -> None:
    ident = Identity.from_seed(SEED, "agent-1")
    texts = [repr(ident), str(ident), f"{ident}", f"{ident!r}", format(ident), "%s %r" % (ident, ident)]  # noqa: UP031 (logging style)
    for text in texts:
        assert ident.did in text
        for secret in _secret_spellings(ident):
            assert secret not in text


def test_logging_never_shows_the_private_key(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG)
    ident = Identity.from_seed(SEED, "agent-1")
    log = logging.getLogger("test.identity")
    log.info("identity %s", ident)
    log.info("identity %r", ident)
    log.info(ident)
    log.info("dict %s", {"identity": ident})
    log.info("extra", extra={"identity": ident})
    ident.save(tmp_path / "k")
    Identity.load(tmp_path / "k")
    assert ident.did in caplog.text
    for secret in _secret_spellings(ident):
        assert secret not in caplog.text
        for record in caplog.records:
            assert secret not in record.getMessage()


def test_errors_never_show_the_private_key(tmp_path: Path) -> None:
    ident = Identity.from_seed(SEED, "a")
    path = tmp_path / "agent.key"
    _write_key_file(
        path,
        {"version": 1, "agent_id": "a", "did": "did:key:zWrong", "private_key": ident.private_key_b64u()},
    )
    with pytest.raises(KeyFileError) as info:
        Identity.load(path)
    for secret in _secret_spellings(ident):
        assert secret not in str(info.value)
        assert secret not in repr(info.value)


def test_identity_has_no_instance_dict() -> None:
    # __slots__: nothing like vars(ident) or ident.__dict__ dumps the key by accident.
    ident = Identity.generate("a")
    assert not hasattr(ident, "__dict__")


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickling_refused(protocol: int) -> None:
    with pytest.raises(TypeError, match="picklable"):
        pickle.dumps(Identity.generate("a"), protocol=protocol)


def test_copy_refused() -> None:
    ident = Identity.generate("a")
    with pytest.raises(TypeError):
        copy.copy(ident)
    with pytest.raises(TypeError):
        copy.deepcopy(ident)


# -- public key entry (§2) --------------------------------------------------------------------------


def test_public_key_entry_shape() -> None:
    ident = Identity.from_seed(SEED, "a")
    entry = ident.public_key_entry()
    assert entry == {
        "kid": ident.kid,
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "key": b64u_encode(ident.public_key),
    }
    assert b64u_decode(entry["key"]) == ident.public_key
    assert len(entry["key"]) == 43
    assert public_key_entry(ident.kid, ident.public_key) == entry


# -- verify_signature never raises ------------------------------------------------------------------

_IDENT = Identity.from_seed(SEED, "v")
_MSG = b"hello"
_SIG = _IDENT.sign(_MSG)
_PK = _IDENT.public_key


@pytest.mark.parametrize(
    ("public_key", "message", "signature"),
    [
        (None, _MSG, _SIG),
        (_PK, None, _SIG),
        (_PK, _MSG, None),
        (_PK.hex(), _MSG, _SIG),
        (_PK, _MSG.decode(), _SIG),
        (_PK, _MSG, _SIG.hex()),
        (bytearray(_PK), _MSG, _SIG),
        (_PK, _MSG, bytearray(_SIG)),
        (_PK[:31], _MSG, _SIG),
        (_PK + b"\x00", _MSG, _SIG),
        (b"", _MSG, _SIG),
        (_PK, _MSG, _SIG[:63]),
        (_PK, _MSG, _SIG + b"\x00"),
        (_PK, _MSG, b""),
        (_PK, _MSG, b"\x00" * 64),
        (_PK, _MSG, b"\xff" * 64),
        (b"\x00" * 32, _MSG, _SIG),
        (b"\xff" * 32, _MSG, _SIG),
        (_PK, 12345, _SIG),
        ([1, 2], [3], [4]),
        (object(), object(), object()),
    ],
)
def test_verify_signature_garbage_is_false(public_key: Any, message: Any, signature: Any) -> None:
    assert verify_signature(public_key, message, signature) is False


def test_verify_signature_accepts_buffer_messages() -> None:
    assert verify_signature(_PK, bytearray(_MSG), _SIG) is True
    assert verify_signature(_PK, memoryview(_MSG), _SIG) is True


IDENTITY_POINT = bytes.fromhex("01" + "00" * 31)


@pytest.mark.parametrize("message", [b"", b"any message", b"\x00" * 100])
def test_small_order_key_universal_forgery_fails(message: bytes) -> None:
    # A3: key = identity, R = identity, S = 0 "verifies" every message under OpenSSL.
    assert verify_signature(IDENTITY_POINT, message, IDENTITY_POINT + b"\x00" * 32) is False


# -- check_public_key (A3, A4, A6) ------------------------------------------------------------------

_P = 2**255 - 19


def _y_not_on_curve() -> bytes:
    d = (-121665 * pow(121666, _P - 2, _P)) % _P
    for y in range(2, 100):
        x2 = (y * y - 1) * pow(d * y * y + 1, _P - 2, _P) % _P
        if x2 and pow(x2, (_P - 1) // 2, _P) != 1:
            return y.to_bytes(32, "little")
    raise AssertionError("unreachable")


SMALL_ORDER_AND_NON_CANONICAL = {
    "identity (order 1)": "01" + "00" * 31,
    "y=0 (order 4)": "00" * 32,
    "y=0 sign bit (order 4)": "00" * 31 + "80",
    "y=-1 (order 2)": "ec" + "ff" * 30 + "7f",
    "order 8 a": "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "order 8 b": "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "order 8 b negated": "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    "y=p (non-canonical 0)": "ed" + "ff" * 30 + "7f",
    "y=p+1 (non-canonical identity)": "ee" + "ff" * 30 + "7f",
    "y=2^255-1 (non-canonical)": "ff" * 31 + "7f",
    "not on the curve": _y_not_on_curve().hex(),
}


@pytest.mark.parametrize(
    "key_hex", SMALL_ORDER_AND_NON_CANONICAL.values(), ids=SMALL_ORDER_AND_NON_CANONICAL.keys()
)
def test_check_public_key_refuses(key_hex: str) -> None:
    with pytest.raises(DIDResolutionError) as info:
        check_public_key(bytes.fromhex(key_hex))
    assert info.value.code == -32047


def test_check_public_key_refuses_mixed_order_key() -> None:
    # A valid key plus a point of order 8: on the curve, but not in the prime-order subgroup.
    order8 = bytes.fromhex(SMALL_ORDER_AND_NON_CANONICAL["order 8 b"])
    mixed = nacl.bindings.crypto_core_ed25519_add(_PK, order8)
    assert mixed != _PK
    with pytest.raises(DIDResolutionError):
        check_public_key(mixed)


@pytest.mark.parametrize("key", [b"", _PK[:31], _PK + b"\x00", bytearray(_PK), _PK.hex(), None])
def test_check_public_key_refuses_wrong_type_or_length(key: Any) -> None:
    with pytest.raises(DIDResolutionError):
        check_public_key(key)


def test_check_public_key_accepts_real_keys() -> None:
    assert check_public_key(_PK) == _PK
    for _ in range(20):
        pk = Identity.generate("a").public_key
        assert check_public_key(pk) is pk
