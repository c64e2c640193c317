"""The session policy of PROTOCOL.md §5.4 (defined in :mod:`a2a_secure.policy`).

The policy is a plain value type that the stores persist too, so it lives below the protocol
core; this module keeps the import path the protocol code and users already use.
"""

from a2a_secure.policy import DEFAULT_POLICY, Policy

__all__ = ["DEFAULT_POLICY", "Policy"]
