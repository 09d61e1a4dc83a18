"""Text for people that fits the terminal: paths wrapped at ``/`` (never inside a name), and
output to a pipe or file without the padding a table adds to each line.

Used by :func:`fleetctl.cli.output.results.print_text` (the drift and ship tables) and by the
CLI's console for piped output. Imports rich only through the caller's console; nothing here draws.
"""

from __future__ import annotations

import os
import textwrap
from typing import IO, Any

PATH_MIN_WIDTH = 20
"""The narrowest path column drawn (characters)."""
OTHER_COLUMNS_WIDTH = 56
"""What the other columns of a change table need beside the path (change 7, origin 10, live
and desired 12 each: a short digest, their summaries wrapped at spaces; and 15 of padding
between columns), in characters: at 80 columns a path gets 24."""
TABLE_PADDING = 15
"""Characters a five-column change table spends between and around its columns."""


def path_column_width(paths: list[str], console_width: int) -> int:
    """The width (characters) of a table's path column on a console ``console_width`` wide:
    the longest path when it fits beside the other columns, else what is left beside them (at
    least :data:`PATH_MIN_WIDTH`). Paths are wrapped to it after a ``/``
    (:func:`wrap_path`); only a single name wider than the column is broken inside.
    """
    if not paths:
        return PATH_MIN_WIDTH
    return min(max(len(p) for p in paths),
               max(PATH_MIN_WIDTH, console_width - OTHER_COLUMNS_WIDTH))


PROSE_WIDTH = 80
"""Columns prose is wrapped to when it goes to a pipe or a file and ``$COLUMNS`` is not set."""


def prose_width(console: Any) -> int:
    """The width (columns) to wrap prose to on ``console`` (a rich Console): the terminal's
    own; for a pipe or a file, ``$COLUMNS`` when it is set, else :data:`PROSE_WIDTH`; never
    wider than the console. (Tables to a pipe are drawn 160 wide; prose wrapped that wide
    would not read at 80.)"""
    if console.is_terminal:
        return int(console.width)
    columns = os.environ.get("COLUMNS", "")
    wanted = int(columns) if columns.isdigit() and int(columns) > 0 else PROSE_WIDTH
    return min(wanted, int(console.width))


def wrap_words(text: str, width: int, indent: str = "", more: str | None = None) -> list[str]:
    """``text`` as lines of at most ``width`` characters, the first starting with ``indent``,
    the others with ``more`` (default: ``indent``), broken only at spaces: a path, a digest, a
    release id or a key longer than the line stays whole on a line of its own (copyable),
    never cut or ellipsised; the lines' words, joined with single spaces, give back ``text``
    with its runs of spaces made single."""
    more = indent if more is None else more
    return textwrap.wrap(text, width=max(width, len(indent) + 1, len(more) + 1),
                         initial_indent=indent, subsequent_indent=more, break_long_words=False,
                         break_on_hyphens=False) or [indent]


def wrap_path(path: str, width: int) -> str:
    """``path`` on as many lines as it needs to be at most ``width`` wide, broken only after a
    ``/``; a single name longer than ``width`` is broken where it must be.

    >>> wrap_path("skills/forge/bin/forge-pr-create", 18)
    'skills/forge/bin/\\nforge-pr-create'
    """
    if len(path) <= width or width < 1:
        return path
    parts = path.split("/")
    pieces = [p + "/" for p in parts[:-1]] + [parts[-1]]
    lines: list[str] = []
    line = ""
    for piece in pieces:
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        while len(piece) > width:  # a name wider than the column: no better place to break
            head, piece = piece[:width - len(line)], piece[width - len(line):]
            lines.append(line + head)
            line = ""
        line += piece
    if line:
        lines.append(line)
    return "\n".join(lines)


class RStripWriter:
    """A text stream that writes each line to ``target`` without trailing spaces: what a rich
    table drawn for a pipe or a file would otherwise pad every line with."""

    def __init__(self, target: IO[str]) -> None:
        self._target = target
        self._partial = ""

    def write(self, text: str) -> int:
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._target.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._target.write(self._partial.rstrip(" "))
            self._partial = ""
        self._target.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self._target, "encoding", "utf-8") or "utf-8"

    def fileno(self) -> int:
        raise OSError("not a real file")
