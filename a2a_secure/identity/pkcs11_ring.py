"""An agent's key ring kept in its PKCS#11 token: current key, retired keys, rotation statements.

The current key is the one labelled as the URI's ``object``. ``key rotate`` generates the new
key in the token, relabels the old one ``<object>#retired-<hex id>`` and records, in a data
object ``<object>#ring`` (private to the token's user), each retired key's window and the
did:key rotation statements. Keys past their window are destroyed at the next rotation.
Nothing here holds key bytes: the token signs and derives for every key of the ring.

The order of a rotation leaves a usable ring if it stops half-way: the new key is made under a
temporary label, the ring record written, and only then are the labels swapped.
"""

from __future__ import annotations

import os
from typing import Any, Final

from a2a_secure.identity import encoding
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.pkcs11 import DERIVE_SUFFIX, TokenSession, _pkcs11, generate_in_token, token_key
from a2a_secure.identity.pkcs11_uri import Pkcs11Uri, TokenError
from a2a_secure.identity.rotation import DEFAULT_OVERLAP, KeyRing, RetiredKey
from a2a_secure.system import wall_now

__all__ = ["load_token_ring", "rotate_token_ring"]

_RING_SUFFIX: Final = "#ring"
_NEXT_SUFFIX: Final = "#next"


def _label(uri: Pkcs11Uri) -> str:
    label = uri.object_label
    if label is None:
        raise TokenError("a key ring in a token is named by object=… (the current key's label)")
    return label


def _read_record(session: TokenSession, label: str) -> dict[str, Any]:
    p11 = _pkcs11()
    a = p11.Attribute
    with session.use() as s:
        found = list(s.get_objects({a.CLASS: p11.ObjectClass.DATA, a.LABEL: label + _RING_SUFFIX}))
        if not found:
            return {"retired": [], "rotations": []}
        value = bytes(found[0][a.VALUE])
    data = encoding.loads(value, error=TokenError)
    if not isinstance(data, dict):
        raise TokenError(f"the ring record {label + _RING_SUFFIX!r} in the token is not an object")
    return data


def _write_record(session: TokenSession, label: str, record: dict[str, Any]) -> None:
    p11 = _pkcs11()
    a = p11.Attribute
    with session.use() as s:
        for old in s.get_objects({a.CLASS: p11.ObjectClass.DATA, a.LABEL: label + _RING_SUFFIX}):
            old.destroy()
        s.create_object(
            {
                a.CLASS: p11.ObjectClass.DATA,
                a.LABEL: label + _RING_SUFFIX,
                a.VALUE: encoding.dumps(record),
                a.TOKEN: True,
                a.PRIVATE: True,
            }
        )


def load_token_ring(uri: str | Pkcs11Uri, now: float | None = None) -> KeyRing:
    """The ring whose current key ``uri`` names, with its retired keys still in their window."""
    parsed = uri if isinstance(uri, Pkcs11Uri) else Pkcs11Uri.parse(uri)
    label = _label(parsed)
    current = Identity(token_key(parsed), label[:128])
    record = _read_record(token_key(parsed)._session, label)  # the same shared session
    t = wall_now() if now is None else now
    retired: list[RetiredKey] = []
    for item in record.get("retired", []):
        if not isinstance(item, dict):
            raise TokenError("a retired key in the token's ring record is not an object")
        at, until, old_label = item.get("retired_at"), item.get("overlap_until"), item.get("label")
        if type(at) is not int or type(until) is not int or not isinstance(old_label, str):
            raise TokenError("a retired key in the token's ring record lacks its label or window")
        if until <= t:
            continue
        old = Identity(token_key(parsed, label=old_label), label[:128])
        if old.did != item.get("did"):
            raise TokenError(f"the retired key {old_label!r} in the token is not the one its ring recorded")
        retired.append(RetiredKey(old, at, until))
    statements = record.get("rotations", [])
    if not isinstance(statements, list) or not all(isinstance(x, str) for x in statements):
        raise TokenError("the rotation statements in the token's ring record are malformed")
    return KeyRing(current, tuple(retired), tuple(statements))


def _relabel(session: TokenSession, old: str, new: str) -> None:
    p11 = _pkcs11()
    a = p11.Attribute
    with session.use() as s:
        for label_from, label_to in ((old, new), (old + DERIVE_SUFFIX, new + DERIVE_SUFFIX)):
            for obj in list(s.get_objects({a.LABEL: label_from})):
                if obj[a.CLASS] in (
                    p11.ObjectClass.PRIVATE_KEY,
                    p11.ObjectClass.PUBLIC_KEY,
                    p11.ObjectClass.SECRET_KEY,
                ):
                    obj[a.LABEL] = label_to


def _destroy(session: TokenSession, label: str) -> None:
    p11 = _pkcs11()
    a = p11.Attribute
    with session.use() as s:
        for name in (label, label + DERIVE_SUFFIX):
            for obj in list(s.get_objects({a.LABEL: name})):
                obj.destroy()


def rotate_token_ring(
    uri: str | Pkcs11Uri, *, overlap: int = DEFAULT_OVERLAP, now: float | None = None
) -> KeyRing:
    """Generate the next key in the token, retire the current one for ``overlap`` seconds."""
    parsed = uri if isinstance(uri, Pkcs11Uri) else Pkcs11Uri.parse(uri)
    label = _label(parsed)
    t = int(wall_now() if now is None else now)
    ring = load_token_ring(parsed, now=t)
    if not ring.current.did.startswith("did:key:"):
        raise TokenError("a token key ring rotates did:key identities")
    session = token_key(parsed)._session
    record = _read_record(session, label)
    next_label = label + _NEXT_SUFFIX
    _destroy(session, next_label)  # a rotation that stopped half-way earlier
    generate_in_token(session, next_label, os.urandom(16))
    fresh = Identity(token_key(parsed, label=next_label), ring.current.agent_id)
    rotated = ring.rotate(overlap=overlap, now=t, fresh=fresh)
    old_label = f"{label}#retired-{ring.current.public_key[:8].hex()}"
    kept = [
        item
        for item in record.get("retired", [])
        if isinstance(item, dict) and type(item.get("overlap_until")) is int and item["overlap_until"] > t
    ]
    for item in record.get("retired", []):
        if item not in kept and isinstance(item, dict) and isinstance(item.get("label"), str):
            _destroy(session, item["label"])  # its window is over: the key is forgotten
    kept.append({"label": old_label, "did": ring.current.did, "retired_at": t, "overlap_until": t + overlap})
    _write_record(session, label, {"retired": kept, "rotations": list(rotated.statements)})
    _relabel(session, label, old_label)
    _relabel(session, next_label, label)
    return load_token_ring(parsed, now=t)
