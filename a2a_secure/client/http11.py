"""The common reply of an HTTP/1.1 exchange, written and read without h11's state machine.

Nearly every reply the client reads is one shape: ``HTTP/1.1 NNN``, a few headers, a
``Content-Length`` body, keep-alive. h11 reads it correctly and spends, on a small signed
intent, about as much CPU as checking the reply's signature (an event object per step,
header normalisation, state transitions). The pool (:mod:`a2a_secure.client.pool`) writes
its own request (every byte of it is the client's own) and reads such a reply with
:func:`parse_head`; any head this does not take as it is (HTTP/1.0, a 1xx, 204 or 304, no
``Content-Length`` or two, ``Transfer-Encoding``, a folded line, a control byte in a line)
is handed to h11 whole, which then reads (or refuses) the reply as before. This path is
stricter than h11, never laxer: a shortcut for one shape, not a second parser of the others.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["FastHead", "parse_head", "request_head"]

_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
# Anything but field-vchar, SP and HTAB in a line: h11 decides (it takes some of these bytes).
_BAD_BYTE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# The whole head in one pass: the status line, then header lines of a token, a colon and
# field-vchar, SP or HTAB only (no folded line, no stray CR or LF, no empty name).
_HEAD: Final = re.compile(
    rb"HTTP/1\.1 ([2-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?"
    rb"((?:\r\n[-!#$%&'*+.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*)"
)
_FIELD: Final = re.compile(rb"\r\n([^:]+):([^\r]*)")


class FastHead:
    """A reply head :func:`parse_head` took: status, the headers the client acts on, framing."""

    __slots__ = ("close", "content_encoding", "content_type", "length", "retry_after", "status")

    def __init__(self, status: int) -> None:
        self.status = status
        self.length = -1
        self.close = False  # the server closes the connection after this reply
        self.content_type = ""
        self.content_encoding = b""
        self.retry_after: str | None = None


# Heads read lately: a server's replies repeat theirs (the same headers, a date that changes
# once a second, a length that seldom does), and reading one costs more than the rest of the
# exchange's framing. Bounded in count and head size, emptied when full; a FastHead is never
# changed once made.
_SEEN: dict[bytes, FastHead | None] = {}
_SEEN_MAX = 64
_SEEN_MAX_HEAD = 1024


def parse_head(head: bytes) -> FastHead | None:
    """The head ``head`` (without its final CRLF CRLF) when it is the common shape, else None."""
    try:
        return _SEEN[head]
    except KeyError:
        pass
    out = _parse_head(head)
    if len(head) <= _SEEN_MAX_HEAD:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[head] = out
    return out


def _parse_head(head: bytes) -> FastHead | None:
    m = _HEAD.fullmatch(head)
    if m is None:
        return None
    status = int(m.group(1))
    if status in (204, 304):
        return None
    out = FastHead(status)
    for name, raw in _FIELD.findall(m.group(2)):
        key = name.lower()
        if key == b"content-length":
            value = raw.strip(b" \t")
            if out.length >= 0 or not value.isdigit() or len(value) > 18:
                return None
            out.length = int(value)
        elif key == b"transfer-encoding":
            return None
        elif key == b"connection":
            out.close = b"close" in (t.strip(b" \t").lower() for t in raw.split(b","))
        elif key == b"content-type":
            out.content_type = raw.strip(b" \t").decode("latin-1")
        elif key == b"retry-after":
            out.retry_after = raw.strip(b" \t").decode("latin-1")
        elif key == b"content-encoding":
            out.content_encoding = raw.strip(b" \t").lower()
    return out if out.length >= 0 else None


def request_head(target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """``POST target HTTP/1.1`` and ``headers``, each line checked as h11 checks it; None if
    one would not pass (the caller then lets h11 write the request, and refuse it)."""
    if _BAD_BYTE.search(target) is not None or b" " in target:
        return None
    parts = [b"POST ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        if (
            _TOKEN.fullmatch(name) is None
            or _BAD_BYTE.search(value) is not None
            or value[:1] in (b" ", b"\t")
            or value[-1:] in (b" ", b"\t")
        ):
            return None
        parts += [name, b": ", value, b"\r\n"]
    return b"".join(parts)
