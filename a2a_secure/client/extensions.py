"""Which protocol extensions a server serves, learnt from its authenticated agent card.

A server lists its extensions in its agent card (``a2a_secure_extensions``,
PROTOCOL.md §12: ``intent_id`` of §12.5, ``priority`` of §12.3; unknown names are kept and
ignored). The card is fetched over plain HTTP(S), but its hash is the
``manifest_hash`` the server signed in its CHALLENGE (PROTOCOL.md §5.2), so a card whose
``hash_of`` equals the session's ``server_manifest_hash`` is the server's own. Results are
kept in one process-wide cache keyed by that hash (safe to share between clients and
peers: the key names the exact card), bounded in size, so a card is fetched once per
server version, not per handshake and never per intent.

A card that cannot be fetched, does not hash to the manifest hash, or does not parse gives
None ("not verified"), and is never cached here: one blocked fetch must not speak for every
client and every server in the process for minutes. Each client remembers its own failures
per server (``PeerState.card_failures``), and decides what an unverified card means (with
``sealed=None`` and no verified card of that server declaring ``sealed``, a server that
implements only PROTOCOL.md; otherwise a refusal: :func:`~a2a_secure.protocol.client_decisions.seal`).
A verified card is kept until the cache evicts it.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import OrderedDict
from typing import Any, Final

import httpx

from a2a_secure.client.endpoint import check_endpoint
from a2a_secure.errors import A2AError
from a2a_secure.identity import encoding
from a2a_secure.protocol.intent_id import CARD_MEMBER

__all__ = ["card_url", "fetch_card", "fetch_extensions", "forget", "known_extensions", "learn_card"]

_log = logging.getLogger("a2a_secure.client.extensions")

CACHE_SIZE: Final = 1024
MAX_CARD_BYTES: Final = 256 * 1024
CARD_FETCH_TIMEOUT: Final = 10.0  # seconds for the whole card, however slowly it comes
CARD_PATH: Final = "/.well-known/agent-card.json"
_NONE: Final[frozenset[str]] = frozenset()

# manifest hash -> the extensions of the verified card with that hash
_cache: OrderedDict[str, frozenset[str]] = OrderedDict()


def card_url(endpoint: str) -> str:
    """The agent card's URL on the origin of ``endpoint`` (PROTOCOL.md §4)."""
    parts = urllib.parse.urlsplit(endpoint)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, CARD_PATH, "", ""))


def known_extensions(manifest_hash: str) -> frozenset[str] | None:
    """The extensions of the verified card whose hash is ``manifest_hash``, or None."""
    hit = _cache.get(manifest_hash)
    if hit is not None:
        _cache.move_to_end(manifest_hash)
    return hit


def _put(manifest_hash: str, extensions: frozenset[str]) -> frozenset[str]:
    _cache[manifest_hash] = extensions
    _cache.move_to_end(manifest_hash)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return extensions


def forget() -> None:
    """Empty the cache (tests)."""
    _cache.clear()


def parse_extensions(card: Any) -> frozenset[str]:
    """The extension names a card lists (none when the member is absent or malformed)."""
    value = card.get(CARD_MEMBER) if isinstance(card, dict) else None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return _NONE
    return frozenset(value)


def learn_card(card: Any) -> frozenset[str]:
    """Keep the extensions ``card`` lists under ``hash_of(card)``, as if fetched and checked.

    For a client that already holds a server's card (an A2A card it verified, PROTOCOL.md
    §10): its handshakes then need no fetch. Safe whatever the card holds: the entry is
    keyed by the hash of this exact card, and a session reads it only when its CHALLENGE
    signed that hash.
    """
    return _put(encoding.hash_of(card), parse_extensions(card))


async def fetch_card(
    http: httpx.AsyncClient,
    url: str,
    *,
    deadline: float = CARD_FETCH_TIMEOUT,
    error: type[Exception] = ValueError,
) -> Any:
    """The parsed agent card at ``url``, or ``error`` (an A2AError for a refused endpoint).

    The endpoint rule of PROTOCOL.md §4 is applied before anything goes on the wire (a URL
    built in code or from a did:web service has not been checked yet); the card must answer
    200, stay under 256 KiB and arrive whole within ``deadline`` seconds.
    """
    url = check_endpoint(url)
    chunks: list[bytes] = []
    try:
        # The HTTP timeout bounds each read only: a card sent a byte at a time would hold
        # its caller (a handshake, a tool listing) for as long as the sender liked.
        async with asyncio.timeout(deadline):
            async with http.stream("GET", url, headers={"Accept": "application/json"}) as resp:
                if resp.status_code != 200:
                    raise error(f"its agent card answered HTTP {resp.status_code}")
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_CARD_BYTES:
                        raise error("its agent card is larger than 256 KiB")
                    chunks.append(chunk)
    except TimeoutError:
        raise error(f"its agent card did not arrive within {deadline:g} s") from None
    return encoding.loads(b"".join(chunks), error=error)


async def fetch_extensions(
    http: httpx.AsyncClient, endpoint: str, manifest_hash: str
) -> frozenset[str] | None:
    """The extensions of the server whose signed manifest hash is ``manifest_hash``.

    From the cache, else by fetching the card from ``endpoint``'s origin and checking that it
    hashes to ``manifest_hash``; None when it cannot be had or does not verify (logged at
    debug level, not cached).
    """
    known = known_extensions(manifest_hash)
    if known is not None:
        return known
    url = card_url(endpoint)
    try:
        card = await fetch_card(http, url)
    except (httpx.HTTPError, A2AError, ValueError, OSError) as exc:
        _log.debug("agent card %s not usable: %s", url, str(exc)[:200])
        return None
    if encoding.hash_of(card) != manifest_hash:
        # Another version of the card (the server changed it since the handshake), or a
        # card altered on the way: either way not the one the server signed.
        _log.debug("agent card %s does not hash to the signed manifest_hash", url)
        return None
    return _put(manifest_hash, parse_extensions(card))
