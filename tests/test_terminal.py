"""Peer text made safe for a terminal (a2a_secure.terminal): what is escaped, what is kept."""

from __future__ import annotations

import json

import pytest

from a2a_secure.terminal import printable, printable_json

# Each of these, printed raw, changes what a person reads on a terminal.
UNSAFE = {
    "\x00": "\\x00",
    "\x07": "\\x07",  # BEL, ends an OSC sequence
    "\x08": "\\x08",  # backspace
    "\t": "\\t",
    "\n": "\\n",  # forges a line of its own
    "\r": "\\r",  # rewrites the line from its start
    "\x1b": "\\x1b",  # ESC: every ANSI sequence (ESC[8m hides, ESC[2K erases)
    "\x7f": "\\x7f",
    "\x85": "\\x85",  # NEL
    "\x9b": "\\x9b",  # CSI in one byte
    "\x9d": "\\x9d",  # OSC in one byte
    "\xa0": "\\xa0",  # a space that is not U+0020
    "\xad": "\\xad",  # soft hyphen: invisible
    "\u034f": "\\u034f",  # combining grapheme joiner
    "\u061c": "\\u061c",  # Arabic letter mark
    "\u115f": "\\u115f",  # Hangul filler
    "\u180e": "\\u180e",
    "\u200b": "\\u200b",  # zero-width space
    "\u200d": "\\u200d",  # zero-width joiner
    "\u200e": "\\u200e",  # LRM
    "\u2028": "\\u2028",  # line separator
    "\u202a": "\\u202a",
    "\u202e": "\\u202e",  # RLO: shows the rest backwards
    "\u2060": "\\u2060",  # word joiner
    "\u2066": "\\u2066",
    "\u2069": "\\u2069",
    "\u3164": "\\u3164",  # Hangul filler
    "\ufe0f": "\\ufe0f",  # variation selector
    "\ufeff": "\\ufeff",  # zero-width no-break space
    "\ud800": "\\ud800",  # a lone surrogate
    "\ue000": "\\ue000",  # private use
    "\U000e0041": "\\U000e0041",  # tag letter A: invisible text
    "\U000e0100": "\\U000e0100",  # variation selector 17
}


@pytest.mark.parametrize(("char", "escaped"), sorted(UNSAFE.items()))
def test_every_unsafe_character_is_escaped_where_it_stands(char: str, escaped: str) -> None:
    assert printable(f"a{char}b") == f"a{escaped}b"


@pytest.mark.parametrize("char", sorted(UNSAFE))
def test_json_escapes_them_too_and_reads_back_to_the_same_value(char: str) -> None:
    value = {f"k{char}": [f"v{char}", 1]}
    compact = printable_json(value, indent=None)
    assert char not in compact
    assert json.loads(compact) == value
    assert json.loads(printable_json(value)) == value


def test_readable_text_is_kept_as_it_is() -> None:
    text = "Réunion 会議 встреча 😀 ‘quotes’ — \\x1b and \\u202e as typed"
    assert printable(text) == text
    assert (
        printable_json({"t": text}, indent=None)
        == '{"t": "Réunion 会議 встреча 😀 ‘quotes’ — \\\\x1b and \\\\u202e as typed"}'
    )


def test_json_layout_keeps_its_newlines() -> None:
    assert printable_json({"a": ["x\ny"]}) == '{\n  "a": [\n    "x\\ny"\n  ]\n}'
