"""The one escape form names are shown in (issue 19; docs/json.md#names-shown-to-people).

The decoder here is written from the documented rule, not taken from fleetctl: ``\\\\`` is a
backslash, ``\\x`` and two hex digits that byte, any other character its UTF-8 bytes. Cases from
bug reports of ls and others: a name holding ESC sequences, a newline or a bidi override
(U+202E, "Trojan Source") must not colour, forge a line or reorder what a person reads; two
names must never look alike (``a\\x1b`` the byte and ``a\\x1b`` the four characters).
"""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.names import escape_name, show_name, tree_path, unshow_bytes, unshow_name


def decode(text: str) -> bytes:
    """The documented decoding, independently of fleetctl."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text.startswith("\\\\", i):
            out += b"\\"
            i += 2
        elif re.match(r"\\x[0-9a-f]{2}", text[i:i + 4]):
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            out += text[i].encode("utf-8")
            i += 1
    return bytes(out)


def looks_safe(text: str) -> bool:
    """Nothing a terminal acts on or hides: only printable characters, no edge spaces."""
    return all(ch.isprintable() for ch in text) and text == text.strip(" ") and \
        not any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


HOSTILE = [b"\x1b[31mred\x1b[0m", b"a\nforged: in-sync", b"tab\there", b"cr\rover",
           "bidi\u202etxt.exe".encode(), b"back\\slash", b"a\x1b", b"a\\x1b", b"a\\\\x1b",
           b" lead", b"trail ", b" ", b"\xff\xfe", b"\\xff", "\x85".encode(), b"\xc2",
           "\u2028".encode(), b"[red]markup[/red]", b"\x00", b""]

names = st.binary(max_size=40) | st.lists(st.sampled_from(HOSTILE), max_size=5).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(names)
def test_any_bytes_round_trip_and_print_safely(raw):
    name = raw.decode("utf-8", "surrogateescape")
    text = show_name(name)
    assert looks_safe(text), text
    assert decode(text) == raw
    assert unshow_bytes(text) == raw and unshow_name(text) == name


@settings(max_examples=500, deadline=None)
@given(names, names)
def test_two_different_names_never_print_the_same(a, b):
    if a != b:
        assert show_name(a.decode("utf-8", "surrogateescape")) != \
            show_name(b.decode("utf-8", "surrogateescape"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_the_json_escape_decodes_with_the_same_rule(raw):
    """A JSON name that is not UTF-8 is escaped (``path_escaped: true``) and decodes back by the
    same rule as the shown form."""
    text, escaped = escape_name(raw.decode("utf-8", "surrogateescape"))
    assert (decode(text) if escaped else text.encode("utf-8")) == raw


def test_names_that_look_alike_in_naive_escapers_stay_apart():
    shown = {raw: show_name(raw.decode("utf-8", "surrogateescape")) for raw in HOSTILE}
    assert len(set(shown.values())) == len(HOSTILE)
    assert shown[b"a\x1b"] == "a\\x1b" and shown[b"a\\x1b"] == "a\\\\x1b"
    assert shown["bidi\u202etxt.exe".encode()] == "bidi\\xe2\\x80\\xaetxt.exe"
    assert shown[b" lead"] == "\\x20lead" and shown[b"trail "] == "trail\\x20"


def test_names_that_would_look_alike_on_screen_print_differently():
    """Canonically equivalent names (NFD "e" + U+0301 and NFC "é") and letters drawn as nothing
    (U+3164 Hangul filler) would pass str.isprintable and still look alike."""
    assert show_name("\u00e9") == "\u00e9"
    assert show_name("e\u0301") == "e\\xcc\\x81"
    assert show_name("ab") != show_name("a\u3164b") == "a\\xe3\\x85\\xa4b"
    assert show_name("\u0301x") == "\\xcc\\x81x"  # a mark with nothing to sit on
    assert show_name("\u0915\u094d\u0937\u093f") == "\u0915\u094d\u0937\u093f"  # NFC Devanagari stays


_part = names.filter(lambda raw: raw not in (b"", b".", b"..") and b"/" not in raw
                     and b"\x00" not in raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(_part, min_size=1, max_size=3))
def test_a_path_given_as_drift_shows_it_is_that_path(parts):
    """A PATH argument copied from drift's output (each name in the escape form, joined by /)
    is read back as exactly that path's bytes (backport, --force-path)."""
    raw = b"/".join(parts)
    path = raw.decode("utf-8", "surrogateescape")
    shown = "/".join(show_name(p.decode("utf-8", "surrogateescape")) for p in parts)
    assert tree_path(shown, "--force-path").encode("utf-8", "surrogateescape") == decode(shown)
    assert decode(shown) == raw and tree_path(shown, "--force-path") == path
