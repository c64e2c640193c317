"""PKCS#11 URIs (RFC 7512) naming an agent's key in a token, parsed without touching a token.

``pkcs11:token=a2a;object=agent;type=private?pin-value=1234&module-path=/usr/lib/softhsm/libsofthsm2.so``

The path names the token (``token``, ``manufacturer``, ``serial``, ``model``, ``slot-id``)
and the key (``object`` and/or ``id``; ``type``, if given, is ``private``); the query says how
to reach it: ``module-path`` (else ``A2A_SECURE_PKCS11_MODULE``) and the PIN, from
``pin-value``, ``pin-source=file:…`` or ``A2A_SECURE_PKCS11_PIN``. An attribute this module
does not know is refused rather than ignored: a URI that names less than its author meant
could select another key. The PIN is never part of ``repr``, ``str`` or an error message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import unquote_to_bytes

from a2a_secure.errors import A2AError

__all__ = ["MODULE_ENV", "PIN_ENV", "Pkcs11Uri", "TokenError"]

MODULE_ENV: Final = "A2A_SECURE_PKCS11_MODULE"
PIN_ENV: Final = "A2A_SECURE_PKCS11_PIN"
_PATH_ATTRS: Final = frozenset(
    ("token", "manufacturer", "serial", "model", "slot-id", "object", "id", "type")
)
_QUERY_ATTRS: Final = frozenset(("pin-value", "pin-source", "module-path", "module-name"))
_MAX_URI: Final = 4096
_MAX_PIN_FILE: Final = 1024


class TokenError(A2AError):
    """A token, or a key in it, cannot be used: one line naming the token, never the PIN."""

    default_message = "the PKCS#11 token cannot be used"


def _split(part: str, sep: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not part:
        return out
    for item in part.split(sep):
        name, eq, raw = item.partition("=")
        if not eq or not name:
            raise TokenError(f"PKCS#11 URI: {where} attribute {name or item!r} has no value")
        if name in out:
            raise TokenError(f"PKCS#11 URI: {where} attribute {name!r} is given twice")
        try:
            value = unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            if name != "id":
                raise TokenError(f"PKCS#11 URI: {name!r} is not UTF-8") from None
            value = raw  # ids are bytes: kept percent-encoded, decoded by ``key_id``
        out[name] = raw if name == "id" else value
    return out


@dataclass(frozen=True, slots=True)
class Pkcs11Uri:
    """A parsed ``pkcs11:`` URI naming one Ed25519 private key."""

    path: Mapping[str, str]
    query: Mapping[str, str] = field(repr=False)

    @classmethod
    def parse(cls, uri: str) -> Pkcs11Uri:
        """Parse ``uri``; raises :class:`TokenError` (one line, no PIN) when it is unusable."""
        if not isinstance(uri, str) or not uri.startswith("pkcs11:"):
            raise TokenError("a key URI starts with 'pkcs11:' (RFC 7512)")
        if len(uri) > _MAX_URI:
            raise TokenError("PKCS#11 URI is too long")
        body = uri[len("pkcs11:") :]
        path_part, _, query_part = body.partition("?")
        path = _split(path_part, ";", "path")
        query = _split(query_part, "&", "query")
        unknown = sorted((set(path) - _PATH_ATTRS) | (set(query) - _QUERY_ATTRS))
        if unknown:
            raise TokenError(f"PKCS#11 URI: unknown attribute {unknown[0]!r} (refused, not ignored)")
        if "object" not in path and "id" not in path:
            raise TokenError("PKCS#11 URI names no key: give object=… or id=…")
        if path.get("type", "private") != "private":
            raise TokenError("PKCS#11 URI: type must be 'private' (the key that signs)")
        if "pin-value" in query and "pin-source" in query:
            raise TokenError("PKCS#11 URI: give pin-value or pin-source, not both")
        return cls(path, query)

    # -- what the URI names ----------------------------------------------------------------
    @property
    def token_label(self) -> str | None:
        return self.path.get("token")

    @property
    def object_label(self) -> str | None:
        return self.path.get("object")

    @property
    def key_id(self) -> bytes | None:
        raw = self.path.get("id")
        return None if raw is None else unquote_to_bytes(raw)

    def describe(self) -> str:
        """How errors name the key: token and object, never the PIN or the module's query."""
        token = self.token_label or self.path.get("serial") or "?"
        what = self.object_label or (self.key_id or b"").hex()
        return f"token {token!r}, key {what!r}"

    def without_secrets(self) -> str:
        """The URI without its query (no PIN): what may be printed or logged."""
        return "pkcs11:" + ";".join(f"{k}={v}" for k, v in self.path.items())

    # -- how to reach it --------------------------------------------------------------------
    def module_path(self, env: Mapping[str, str] | None = None) -> str:
        env = os.environ if env is None else env
        path = self.query.get("module-path") or env.get(MODULE_ENV)
        if not path:
            raise TokenError(
                f"no PKCS#11 module for {self.describe()}: add module-path=… to the URI or set {MODULE_ENV}"
            )
        if not Path(path).is_file():
            raise TokenError(f"PKCS#11 module not found: {path}")
        return path

    def pin(self, env: Mapping[str, str] | None = None) -> str | None:
        """The user PIN, or None for a token that needs no login."""
        env = os.environ if env is None else env
        if "pin-value" in self.query:
            return self.query["pin-value"]
        source = self.query.get("pin-source")
        if source is not None:
            name = source[len("file:") :] if source.startswith("file:") else source
            try:
                with open(name, "rb") as f:
                    data = f.read(_MAX_PIN_FILE + 1)
            except OSError as exc:
                raise TokenError(f"PIN file {name} cannot be read ({exc.strerror})") from None
            if len(data) > _MAX_PIN_FILE:
                raise TokenError(f"PIN file {name} is too large")
            return data.decode("utf-8", "strict").rstrip("\r\n")
        return env.get(PIN_ENV)
