"""Names from outside as file names and log text: one reversible encoding, one line form.

A task id comes from a chat bridge (``slack:C042:1732950000.1234``), and the runner names
files and directories after it: ``runs/<task>/``, ``STATE/agent/<task>/``,
``STATE/shims/<task>.<n>/``, the last of which goes first on the agent's ``PATH``, where a
``:`` would split it. So every such name is :func:`encode_name`'s form of the id, never the id
itself:

- the id's UTF-8 bytes (``surrogateescape``: a byte that is not UTF-8 survives too);
- each byte that is not an ASCII letter or digit or one of ``._-@+`` is written ``%XX``
  (two upper-case hex digits), ``%`` itself included, and so is a ``.`` at the start (no
  ``.``, ``..`` or dot-file): ``slack:C042:1.2`` is ``slack%3AC042%3A1.2``, ``a b`` is
  ``a%20b``;
- a form longer than :data:`NAME_MAX_CHARS` is cut to :data:`NAME_CUT_CHARS` (never inside a
  ``%XX``) and ended with ``~`` and the first 16 hex digits of the sha256 of the bytes
  (``~`` is never written otherwise, so a cut form is never another name's whole form).

Any other form decodes back to the exact name (:func:`decode_name`); two different names never
share a form. The form is what a PATH, a shell word, a file name and a cgroup name can all
hold: letters, digits, ``._-@+%~``.

:func:`one_line` is how a name (or any text from outside) is written into a log line: control
characters, a backslash and bytes that are not UTF-8 escaped, so one record stays one line.

Standard library only; no side effects on import.
"""

from __future__ import annotations

import hashlib

NAME_MAX_CHARS = 200
"""The longest encoded name kept whole (a file name holds 255 bytes; the runner adds suffixes
such as ``.12`` or ``.json``)."""
NAME_CUT_CHARS = 180
"""What is kept of a longer encoded name before ``~`` and its digest."""
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@+")
_HEX = "0123456789ABCDEF"


def encode_name(name: str) -> str:
    """The file-name form of ``name`` (the module docstring gives the rule).

    Raises:
        ValueError: ``name`` is empty (no file can be named after it).
    """
    if not name:
        raise ValueError("an empty name has no file name")
    data = name.encode("utf-8", "surrogateescape")
    parts = []
    for i, byte in enumerate(data):
        if byte in _SAFE and not (i == 0 and byte == 0x2E):
            parts.append(chr(byte))
        else:
            parts.append(f"%{byte:02X}")
    if sum(len(p) for p in parts) <= NAME_MAX_CHARS:
        return "".join(parts)
    kept, size = [], 0
    for part in parts:
        if size + len(part) > NAME_CUT_CHARS:
            break
        kept.append(part)
        size += len(part)
    return "".join(kept) + "~" + hashlib.sha256(data).hexdigest()[:16]


def decode_name(text: str) -> str:
    """The name whose :func:`encode_name` form is ``text`` (``surrogateescape`` for bytes that
    are not UTF-8).

    Raises:
        ValueError: ``text`` is not such a form, or a cut one (``~``: its end is a digest).
    """
    if "~" in text:
        raise ValueError(f"{text!r}: a cut name (its end is a digest), not decodable")
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            pair = text[i + 1:i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise ValueError(f"{text!r}: a % not followed by two upper-case hex digits")
            out.append(int(pair, 16))
            i += 3
            continue
        if ord(ch) >= 128 or ord(ch) not in _SAFE:
            raise ValueError(f"{text!r}: {ch!r} is never written by encode_name")
        out.append(ord(ch))
        i += 1
    name = out.decode("utf-8", "surrogateescape")
    if encode_name(name) != text:  # %41 for A, or a leading "." left plain
        raise ValueError(f"{text!r}: not the form encode_name writes")
    return name


def one_line(text: str) -> str:
    """``text`` for one log line: a backslash doubled; control characters (newline, CR, tab,
    ESC, DEL, C1) written as Python escapes (``\\n``, ``\\x1b``, ``\\u2028``), and bytes that
    are not UTF-8 (``surrogateescape``) as ``\\xNN``. Printable text is left as it is."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)
