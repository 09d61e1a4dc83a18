"""Text from hosts, inventories and blueprints made safe in a Markdown document.

Every Markdown renderer (drift and ship, ``creds audit``, ``tokens``, the nightly report) escapes
what it did not write itself with :func:`md_text`, or shows it as a code span with
:func:`md_code`; a line shared with the text format, whose backtick-quoted commands are meant as
code, goes through :func:`md_line`, which is the two together. A host name, a path or a host's
error message is data: it must not open an HTML tag (GitHub renders raw HTML in a job summary or
a PR comment), a link, emphasis, a code span or a new table cell.
"""

from __future__ import annotations

import html
import re

from fleetctl.names import printable

_MD_PUNCT = re.compile(r"([\\`*_\[\]{}|#~!<>])")


def md_text(text: str | None) -> str:
    """``text`` safe in Markdown and in a GFM table cell (``None`` is the empty string).

    Control characters and undecodable bytes are escaped (:func:`fleetctl.names.printable`), so
    the text stays on one line; ``&``, ``<`` and ``>`` become HTML entities, so no tag can open;
    then Markdown punctuation is backslash-escaped, so no link, emphasis, code span or new cell
    can start. A Markdown viewer shows the original characters.
    """
    shown = html.escape(printable(text or ""), quote=False)
    return _MD_PUNCT.sub(r"\\\1", shown)


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
