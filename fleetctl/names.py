"""Showing names that may not be valid UTF-8, reversibly in documents and safely to people.

Names from hosts are ``str`` decoded with ``surrogateescape``: each byte that is not valid UTF-8
is a lone surrogate. Such a string cannot be written as UTF-8, so every output goes through here.
"""

from __future__ import annotations


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

    Raises:
        InputError: empty, absolute, or with an empty, ``.`` or ``..`` part (``what`` says
            where it came from: ``--force-path``, a backport argument).
    """
    from fleetctl.errors import InputError

    cleaned = path.rstrip("/")
    if not cleaned or path.startswith("/") or cleaned == "." or not valid_tree_path(cleaned):
        raise InputError(f"{what} {path!r}: not a plain path relative to the managed tree",
                         hint="name paths as drift shows them, e.g. runner/README")
    return cleaned
