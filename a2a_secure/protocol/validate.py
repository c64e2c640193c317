"""Shape checks for received messages (defined in :mod:`a2a_secure.checks`).

The checks depend on nothing in the protocol core, so they live below it where the stores
and the policy value type can use them; this module keeps the protocol's import path.
"""

from a2a_secure.checks import (
    FRESHNESS_WINDOW,
    MAX_SAFE_INT,
    ErrorType,
    check_payload_matches,
    ct_equal,
    exact_members,
    is_fresh,
    json_equal,
    require_b64u_bytes,
    require_bool,
    require_did,
    require_hash,
    require_int,
    require_object,
    require_str,
)

__all__ = [
    "FRESHNESS_WINDOW",
    "MAX_SAFE_INT",
    "ErrorType",
    "check_payload_matches",
    "ct_equal",
    "exact_members",
    "is_fresh",
    "json_equal",
    "require_b64u_bytes",
    "require_bool",
    "require_did",
    "require_hash",
    "require_int",
    "require_object",
    "require_str",
]
