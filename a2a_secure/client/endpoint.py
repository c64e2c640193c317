"""The endpoint rule of PROTOCOL.md §4: https, or plain http only to a loopback host.

Applied by the client before anything goes on the wire (:mod:`a2a_secure.client.http`), to
an agent card's URL (:mod:`a2a_secure.client.extensions`), to a registry entry
(:mod:`a2a_secure.agent`), and to the MCP HTTP transport's listening address.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

from a2a_secure.errors import InvalidParams

__all__ = ["check_endpoint"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_endpoint(url: str) -> str:
    """Return the base URL if it is https, or http to a loopback host (PROTOCOL.md §4)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url.rstrip("/")
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return url.rstrip("/")
    raise InvalidParams("endpoint must be https (plain http only to loopback)")
