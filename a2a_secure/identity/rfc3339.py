"""RFC 3339 date-times for the ``expires`` of a retired verification method."""

from __future__ import annotations

import datetime as dt
import re

from a2a_secure.errors import DIDResolutionError

__all__ = ["format_rfc3339", "parse_expires"]

# RFC 3339 section 5.6 date-time, with an explicit offset ("Z" or ±hh:mm).
_RFC3339 = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?"
    r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
)


def parse_expires(value: object) -> int:
    """Unix seconds (rounded down) of an RFC 3339 date-time; ``DIDResolutionError`` otherwise."""
    if not isinstance(value, str) or len(value) > 40 or _RFC3339.fullmatch(value.upper()) is None:
        raise DIDResolutionError("verification method expires is not an RFC 3339 date-time")
    text = value.upper().replace("Z", "+00:00")
    if text[17:19] == "60":  # a leap second counts as the second before it
        text = text[:17] + "59" + text[19:]
    try:
        return int(dt.datetime.fromisoformat(text).timestamp())
    except ValueError:
        raise DIDResolutionError("verification method expires is not a valid date") from None


def format_rfc3339(unix_seconds: int) -> str:
    """``YYYY-MM-DDThh:mm:ssZ`` for whole Unix seconds."""
    return dt.datetime.fromtimestamp(int(unix_seconds), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
