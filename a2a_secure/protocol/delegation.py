"""Delegation chains (PROTOCOL.md §12.7): the rules live in :mod:`a2a_secure.delegation`.

A value layer below the protocol core (issued by an ``Identity``, named by the stores'
deny lists); this module keeps the protocol's import path.
"""

from a2a_secure.delegation import (
    CHAIN_UNKNOWN,
    DELEGATION,
    MAX_CHAIN_CHARS,
    MAX_DEPTH,
    MAX_LINK_CHARS,
    MAX_TTL,
    REVOCATION_PREFIX,
    TYP,
    Chain,
    DelegationRefused,
    DelegationRules,
    Link,
    check_bounds,
    check_member,
    check_revocation_target,
    issue,
    load_chain,
    parse_chain,
    reference_of,
    verify_signatures,
)

__all__ = [
    "CHAIN_UNKNOWN",
    "DELEGATION",
    "MAX_CHAIN_CHARS",
    "MAX_DEPTH",
    "MAX_LINK_CHARS",
    "MAX_TTL",
    "REVOCATION_PREFIX",
    "TYP",
    "Chain",
    "DelegationRefused",
    "DelegationRules",
    "Link",
    "check_bounds",
    "check_member",
    "check_revocation_target",
    "issue",
    "load_chain",
    "parse_chain",
    "reference_of",
    "verify_signatures",
]
