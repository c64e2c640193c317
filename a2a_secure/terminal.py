"""Text from peers, made safe to print on a terminal: the one place that escapes it.

Everything the ``a2a-secure`` command and the MCP bridge print that a peer or a caller
chose (a preview, action data, an intent's result, an error message an agent sent, a DID
document, an audit log line, a header value in a log) goes through :func:`printable` or
:func:`printable_json` first. Without it a string can drive the terminal: ``ESC[8m`` hides
the lines after it, ``ESC[2K`` or ``\\r`` rewrites the line before, a newline forges a line
of its own, U+202E shows text backwards, and zero-width or tag characters carry words
nobody sees. Escaped, each of them is visible as what it is.

Escaped: every character Python does not count as printable (``str.isprintable``: C0 and
C1 controls and DEL, format characters such as the bidi controls U+200E/U+200F,
U+202A-U+202E, U+2066-U+2069, the zero-width characters, U+FEFF and the tag characters,
line and paragraph separators, spaces other than U+0020, surrogates, private use and
unassigned code points), plus the invisible characters that Unicode classes as letters or
marks: the Hangul fillers, U+034F, the Khmer inherent vowels, and the variation selectors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

__all__ = ["printable", "printable_json"]

# Invisible characters Python counts as printable (letters or combining marks).
_INVISIBLE = (
    "\u034f"  # combining grapheme joiner
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers
    "\u17b4\u17b5"  # Khmer inherent vowels
    "\u180b-\u180d\u180f"  # Mongolian free variation selectors
    "\ufe00-\ufe0f"  # variation selectors
    "\U000e0100-\U000e01ef"  # variation selectors supplement
)
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")


def _unsafe(char: str) -> bool:
    return not char.isprintable() or _INVISIBLE_RE.match(char) is not None


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    point = ord(char)
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def _json_escape(char: str) -> str:
    point = ord(char)
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    point -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a code point above U+FFFF
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


def _replace(text: str, escape: Callable[[str], str], keep: str = "") -> str:
    if text.isprintable() and _INVISIBLE_RE.search(text) is None:
        return text
    return "".join(escape(c) if _unsafe(c) and c not in keep else c for c in text)


def printable(text: str) -> str:
    """``text`` on one line with every unsafe character escaped (``\\x1b``, ``\\u202e``, ``\\n``).

    Safe to print on a terminal: nothing in the result moves the cursor, changes colours,
    starts a new line or hides or reorders characters.
    """
    return _replace(text, _escape)


def printable_json(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as JSON (non-ASCII text kept readable) with every unsafe character escaped.

    The escapes are JSON's own ``\\uXXXX``, so the output parses to the same value.
    """
    # A raw newline in JSON text is always layout: inside strings json.dumps writes "\\n".
    return _replace(json.dumps(value, indent=indent, ensure_ascii=False), _json_escape, keep="\n")
