"""The endpoint rule of PROTOCOL.md §4: https, or plain http only to a loopback host.

Applied by the client before anything goes on the wire (:mod:`a2a_secure.client.http`), to
an agent card's URL (:mod:`a2a_secure.client.extensions`), to an endpoint the caller gives
(:mod:`a2a_secure.agent`), and to the MCP HTTP transport's listening address.
"""

from __future__ import annotations

import ipaddress

from a2a_secure.identity.addresses import check_address

__all__ = ["check_endpoint"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_endpoint(url: str) -> str:
    """Return the base URL if it is https, or http to a loopback host (PROTOCOL.md §4).

    The rule for an endpoint the operator gives itself (in code, ``--endpoint``, a registry
    file it points at); one taken from a remote document passes
    :func:`~a2a_secure.identity.addresses.check_address` with the document's origin. A URL
    that does not parse is ``InvalidParams`` like any other refusal (never ``ValueError``).
    """
    return check_address(url, what="endpoint", origin=None)
