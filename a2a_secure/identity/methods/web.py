"""The ``did:web`` method plug-in: :class:`~a2a_secure.identity.didweb.DidWebResolver`.

``DIDResolver()`` loads it with its default bounds (public addresses only, HTTPS with
certifi's CA bundle, 5 s, 64 KiB). ``a2a_secure.identity.didweb.make_resolver`` registers
one with other bounds.
"""

from __future__ import annotations

from a2a_secure.identity.didweb import DidWebResolver

__all__ = ["DidWebMethod"]


class DidWebMethod(DidWebResolver):
    """A :class:`DidWebResolver` with the default bounds (the entry point's class)."""
