"""Showing names that may not be valid UTF-8, reversibly in documents and safely to people.

Names from hosts are ``str`` decoded with ``surrogateescape``: each byte that is not valid UTF-8
is a lone surrogate. Such a string cannot be written as UTF-8, so every output goes through here.

The one form a person sees a name in (:func:`show_name`, documented in ``docs/json.md``) is made of
printable characters only and decodes back to the name's bytes (:func:`unshow_bytes`): a
backslash is ``\\\\``; every byte of a character that is not printable (a control character,
ESC, a tab, a newline, a bidi override, an undecodable byte) is ``\\xNN``; a space that starts
or ends the name is ``\\x20`` (a table's padding and a pipe's stripped line ends would hide it).
So two different names never print the same, and a name cannot start a line, a colour or a
reordering of the text around it.
"""

from __future__ import annotations

import re
import unicodedata

_SHOWN_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2})")
_MARKS = ("Mn", "Mc", "Me")
# Printable by Unicode's categories but drawn as nothing: Hangul fillers, the braille blank.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def escape_name(name: str) -> tuple[str, bool]:
    """Return ``(text, escaped)``: ``name`` itself when it is valid UTF-8, else an escaped form.

    The escaped form doubles each backslash and writes each undecodable byte (a lone
    surrogate from ``surrogateescape``) as ``\\xNN``, so it can be turned back into the bytes.
    """
    if not any(0xDC80 <= ord(ch) <= 0xDCFF for ch in name):
        return name, False
    out = []
    for ch in name:
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out), True


def unescape_name(text: str) -> str:
    """Invert :func:`escape_name` for an escaped name (surrogateescape ``str`` back)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("\\\\", i):
            out.append("\\")
            i += 2
        elif text.startswith("\\x", i):
            out.append(chr(0xDC00 + int(text[i + 2:i + 4], 16)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def show_name(name: str, lead: bool = True) -> str:
    """``name`` in the one escape form people see: printable characters only, reversible.

    Each character that is printable (``str.isprintable``, so a space but no control, format,
    separator or private-use character) stays as it is, except ``\\`` (written ``\\\\``) and a
    space at either end (``\\x20``); every other character is written as the bytes of its UTF-8
    encoding, ``\\xNN`` each (lowercase hex), and so is each byte that is not valid UTF-8 (a
    lone surrogate from ``surrogateescape``). :func:`unshow_bytes` turns it back. With
    ``lead=False`` a leading space stays (a diff line's content, after its marker). In a name
    that is not in Unicode NFC, combining marks are escaped too, and so are a mark after an
    escape and the few letters drawn as nothing (Hangul fillers, the braille blank).

    >>> show_name("a\\x1b[31m b\\\\")
    'a\\\\x1b[31m b\\\\\\\\'
    """
    # A name not in NFC could look like another that is ("e" + U+0301 and "é"): its combining
    # marks are escaped, so canonically equivalent names never print alike.
    # A mark with nothing printable before it would sit on an escape's hex digit.
    marks = not _is_nfc(name)
    out = []
    last = len(name) - 1
    bare = False  # whether the last character was written as itself
    for i, ch in enumerate(name):
        if ch == "\\":
            out.append("\\\\")
        elif ch == " " and ((lead and i == 0) or i == last):
            out.append("\\x20")
        elif ch.isprintable() and ch not in _BLANK_LETTERS and not (
                unicodedata.category(ch) in _MARKS and (marks or not bare)):
            out.append(ch)
            bare = True
            continue
        else:
            out.append("".join(f"\\x{b:02x}" for b in _utf8(ch)))
        bare = False
    return "".join(out)


def _is_nfc(name: str) -> bool:
    try:
        return unicodedata.is_normalized("NFC", name)
    except UnicodeEncodeError:  # pragma: no cover - lone surrogates normalise as themselves
        return True


def _utf8(ch: str) -> bytes:
    """One character's bytes: a ``surrogateescape`` byte as itself, another lone surrogate (not
    from a host's name) by its code point."""
    try:
        return ch.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return ch.encode("utf-8", "surrogatepass")


def unshow_bytes(text: str) -> bytes:
    """The bytes a :func:`show_name` (or :func:`escape_name`) form stands for: ``\\\\`` is one
    backslash, ``\\x`` and two hex digits that byte, any other character its UTF-8 encoding."""
    out = bytearray()
    at = 0
    for match in _SHOWN_ESCAPE.finditer(text):
        out += text[at:match.start()].encode("utf-8", "surrogateescape")
        code = match.group(1)
        out += b"\\" if code == "\\" else bytes([int(code[1:], 16)])
        at = match.end()
    out += text[at:].encode("utf-8", "surrogateescape")
    return bytes(out)


def unshow_name(text: str) -> str:
    """:func:`unshow_bytes` as a name (``str``, undecodable bytes as ``surrogateescape``)."""
    return unshow_bytes(text).decode("utf-8", "surrogateescape")


def printable(name: str) -> str:
    """A one-line form of a name for people: control characters and bad bytes escaped."""
    text, _ = escape_name(name)
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def safe_text(text: str) -> str:
    """``text`` with undecodable bytes escaped (newlines kept): for messages in documents."""
    return escape_name(text)[0]


def valid_tree_path(path: object) -> bool:
    """Whether ``path`` is a plain path relative to a managed tree: ``/``-separated names, none
    empty, ``.`` or ``..``, no NUL (``"."`` alone stands for the root in ``unreadable``)."""
    if not isinstance(path, str) or "\0" in path:
        return False
    if path == ".":
        return True
    return all(part not in ("", ".", "..") for part in path.split("/"))


def tree_path(path: str, what: str) -> str:
    """A path a person named, as drift shows them (a trailing ``/`` dropped), checked.

    The name is read in the escape form drift printed it in (:func:`unshow_name`: ``\\xNN``
    is that byte, ``\\\\`` one backslash), so the path copied from drift's output names that
    file. The name's own bytes work too (``$'runner/a\\nb'`` in bash): they hold no escape,
    except a name with a real backslash before ``x`` and two hex digits, or before another
    backslash, which drift shows with that backslash doubled.

    Raises:
        InputError: empty, absolute, or with an empty, ``.`` or ``..`` part, or a NUL
            (``what`` says where it came from: ``--force-path``, a backport argument).
    """
    from fleetctl.errors import InputError

    cleaned = unshow_name(path).rstrip("/")
    if not cleaned or path.startswith("/") or cleaned == "." or not valid_tree_path(cleaned):
        raise InputError(f"{what} {path!r}: not a plain path relative to the managed tree",
                         hint="name paths as drift shows them, e.g. runner/README")
    return cleaned
