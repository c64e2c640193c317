"""An example DID method plug-in: ``did:github:<owner>:<repo>``.

The DID document is the file ``.well-known/did.json`` of the repository's default branch,
fetched over HTTPS from ``https://raw.githubusercontent.com/<owner>/<repo>/HEAD/.well-known/did.json``
(``base_url`` replaces the origin, e.g. for GitHub Enterprise or tests). The document's
``id`` must be the DID exactly, and every other rule of did:web documents applies.

Syntax (DID Core method-specific-id, colon-separated): ``owner`` is a GitHub user or
organisation name (1-39 letters, digits and inner hyphens), ``repo`` a repository name
(1-100 of letters, digits, ``.``, ``-``, ``_``; not ``.`` or ``..``). GitHub names are
case-insensitive, DIDs are not: the DID is compared byte for byte with the document's id.

The fetch is :class:`~a2a_secure.identity.didweb.DidWebResolver`'s: the same SSRF bounds
(public addresses only unless allow-listed, no redirects, pinned address), the same size and
time caps. Only the URL differs, and ``text/plain`` is accepted because that is what
raw.githubusercontent.com serves.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit

from a2a_secure.errors import DIDResolutionError
from a2a_secure.identity.did import check_did_syntax
from a2a_secure.identity.didweb import ACCEPTED_MEDIA_TYPES, DidWebResolver

__all__ = ["DEFAULT_BASE_URL", "GithubResolver", "github_did_url"]

DEFAULT_BASE_URL: Final = "https://raw.githubusercontent.com"
_OWNER_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,37}[A-Za-z0-9])?")
_REPO_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")


def _owner_repo(did: str) -> tuple[str, str]:
    check_did_syntax(did)
    parts = did.split(":")
    if len(parts) != 4 or parts[:2] != ["did", "github"]:
        raise DIDResolutionError("a did:github DID is did:github:<owner>:<repo>")
    owner, repo = parts[2], parts[3]
    if _OWNER_RE.fullmatch(owner) is None or "--" in owner:
        raise DIDResolutionError("did:github owner is not a GitHub user or organisation name")
    if _REPO_RE.fullmatch(repo) is None or repo in (".", ".."):
        raise DIDResolutionError("did:github repository is not a GitHub repository name")
    return owner, repo


def github_did_url(did: str, base_url: str = DEFAULT_BASE_URL) -> str:
    """The URL of the DID document of ``did`` under ``base_url``."""
    owner, repo = _owner_repo(did)
    return f"{base_url.rstrip('/')}/{owner}/{repo}/HEAD/.well-known/did.json"


class GithubResolver(DidWebResolver):
    """Resolves ``did:github:<owner>:<repo>``; register with ``resolver.register("github", ...)``.

    Args:
        base_url: ``https://host[:port][/path]`` the repository files are served from.
        **bounds: :class:`DidWebResolver`'s arguments (``timeout``, ``verify``,
            ``allow_addresses``, ``host_overrides``, ...).
    """

    _media_types = ACCEPTED_MEDIA_TYPES | {"text/plain"}

    def __init__(self, *, base_url: str = DEFAULT_BASE_URL, **bounds: Any) -> None:
        super().__init__(**bounds)
        parts = urlsplit(base_url)
        if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("base_url must be an https:// URL without query or fragment")
        if parts.username or parts.password:
            raise ValueError("base_url may not carry credentials")
        self._base_host = parts.hostname
        self._base_port = parts.port
        self._base_path = parts.path.rstrip("/")

    def _plan(self, did: str) -> tuple[str, int | None, str]:
        owner, repo = _owner_repo(did)
        self._check_host_name(self._base_host)
        return self._base_host, self._base_port, f"{self._base_path}/{owner}/{repo}/HEAD/.well-known/did.json"
