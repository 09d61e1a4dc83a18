"""Text from hosts, inventories and blueprints made safe in a Markdown document.

Every Markdown renderer (drift and ship, ``creds audit``, ``tokens``, the nightly report) escapes
what it did not write itself with :func:`md_text`, or shows it as a code span with
:func:`md_code`; a line shared with the text format, whose backtick-quoted commands are meant as
code, goes through :func:`md_line`, which is the two together. A host name, a path or a host's
error message is data: it must not open an HTML tag (GitHub renders raw HTML in a job summary or
a PR comment), a link, emphasis, a code span or a new table cell.
"""

from __future__ import annotations

import re

from fleetctl.names import printable

# Backslash-escaped wherever they appear: a backslash, a code span, emphasis with ``*``, a table
# cell, strikethrough.
_MD_ALWAYS = re.compile(r"([\\`*|~])")
# A run of ``_`` opens or closes emphasis only at a word's edge (CommonMark): ``known_hosts`` and
# ``mcp__tracker__create_issue`` stay as they are.
_MD_UNDERSCORES = re.compile(r"_+")
# A link or an image needs ``[...](`` (inline) or ``[...][`` (reference); a lone ``[ok]`` links
# nothing and is left as written.
_MD_LINK = re.compile(r"\[([^\]]*)\](?=[(\[])")


def md_text(text: str | None) -> str:
    """``text`` safe in Markdown and in a GFM table cell (``None`` is the empty string).

    Control characters and undecodable bytes are escaped (:func:`fleetctl.names.printable`), so
    the text stays on one line; ``&`` and ``<`` become HTML entities, so no tag and no entity
    can open; then what could start markup is backslash-escaped: ``\\``, backticks, ``*``,
    ``|``, ``~``, an ``_`` at a word's edge, and the brackets of a ``[...](`` or ``[...][`` (no link
    or image). Text that starts no markup is left as written (``->``, ``[ok]``, ``o200k_base``),
    so the raw Markdown reads like the text format; a Markdown viewer shows the original
    characters either way.
    """
    shown = printable(text or "").replace("&", "&amp;").replace("<", "&lt;")
    shown = _MD_ALWAYS.sub(r"\\\1", shown)
    shown = _MD_UNDERSCORES.sub(_underscores, shown)
    return _MD_LINK.sub(r"\\[\1\\]", shown)


def _underscores(run: re.Match[str]) -> str:
    """A run of ``_`` escaped when it touches a word's edge, where it could be emphasis."""
    text, start, end = run.string, run.start(), run.end()
    inside = (start > 0 and text[start - 1].isalnum()) and (end < len(text) and text[end].isalnum())
    return run.group(0) if inside else run.group(0).replace("_", "\\_")


def md_code(text: str) -> str:
    """``text`` as a Markdown code span in a table cell.

    Backslashes do not escape inside a code span, so the fence is one backtick longer than the
    longest run of backticks in the text (CommonMark), and ``|`` is escaped for the table (GFM).
    Inside a code span ``<`` and ``&`` are shown as themselves, never read as HTML.
    """
    shown = printable(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


_CODE_RUN = re.compile(r"`([^`\n]+)`")


def md_line(text: str) -> str:
    """A line written for the text format, safe in Markdown on one line: each ```...``` run is a
    code span (:func:`md_code`), the rest :func:`md_text`; newlines become spaces.

    A code span shows its content literally, so a host-supplied text that happens to hold
    backticks can at most become a code span, never markup.
    """
    text = text.replace("\n", " ")
    out, at = [], 0
    for match in _CODE_RUN.finditer(text):
        out += [md_text(text[at:match.start()]), md_code(match.group(1))]
        at = match.end()
    out.append(md_text(text[at:]))
    return "".join(out)
