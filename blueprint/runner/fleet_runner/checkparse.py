"""Parsing a checker's output into diagnostics (path, line, column, severity, message).

Formats understood (stdout and stderr are read together, line by line, after terminal escape
sequences are stripped: :func:`strip_ansi`):

``gnu``      ``path:line:col: message`` and ``path:line: message``. Emitted by ruff
             (``--output-format concise``), flake8, pyflakes, mypy (with or without
             ``--show-column-numbers``; with ``--show-error-end`` it prints
             ``path:line:col:end_line:end_col: message``, whose end is skipped: the column
             stays the start's), gcc and clang, ``eslint --format unix``.
``paren``    ``path(line,col): message``: ``tsc --pretty false``.
``arrow``    a header line ``CODE message`` followed by a location line ``--> path:line:col``:
             ruff's default ``full`` format.
``tsc-pretty`` ``path:line:col - error TS...: message``, then a numbered code frame (its lines
             starting with a number, and ``~`` underlines, are context): tsc with ``pretty``.
``stylish``  a line naming a file, then indented ``line:col  error|warning  message  rule``
             rows: eslint's default format (a row with no file line above it is unparsed).

Lines that are understood but carry no diagnostic, and so never count as unparsed:
blank lines; lines starting with whitespace or a ``|`` code-frame gutter (source excerpts,
carets, continuations), or with a line number and ``+``/``-`` (ruff's fix preview: ``1 + import
os``); ``help:``/``note:``/``hint:``/``info:`` lines; and the summaries
``Found N errors``, ``[*] N fixable ...``, ``No fixes available ...``, ``All checks passed!``
(ruff), ``Success: no issues found ...`` (mypy), ``N problems`` and ``✖ N problems (...)``
(eslint), ``Errors  Files`` (tsc), ``In file included
from ...``, ``path: In function ...:``, ``path: At top level:``, ``compilation terminated.``
(gcc), ``N errors generated.`` (clang). Every other line is *unparsed*; the check gate treats
unparsed output of a failing checker as a fault (it cannot judge it).

:func:`place` puts a printed path in the workspace (relative to the checker's directory,
``./``, ``..``, absolute, through symlinks, backslashes) or says it cannot be placed.

Severity: a message starting with ``error``/``fatal error`` (or an eslint ``[Error/...]``
suffix) is an error; ``warning`` (or ``[Warning/...]``) a warning; ``note``, ``info``,
``help``, ``required from``, ``In instantiation of`` a note; anything else (ruff, flake8 and
pyflakes codes such as ``F401``) an error.

Test runners (pytest, go test) do not print their failures in these formats: a failing test
command leaves unparsed lines, so it is declared ``format: exit`` (its exit status decides).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ERROR, WARNING, NOTE = "error", "warning", "note"

# A path may hold ":" (a file name is anyone's): it ends at the first ":LINE:" after it.
_GNU = re.compile(r"^(?P<path>[^\s:].*?):(?P<line>\d+):(?:(?P<col>\d+):(?:\d+:\d+:)?)?"
                  r"\s*(?P<msg>.*)\Z")
_TSC_PRETTY = re.compile(r"^(?P<path>[^\s:].*?):(?P<line>\d+):(?P<col>\d+) - "
                         r"(?P<msg>(?:error|warning|message)\b.*)\Z")
_PAREN = re.compile(r"^(?P<path>[^\s(][^(]*?)\((?P<line>\d+),(?P<col>\d+)\):\s*(?P<msg>.*)\Z")
_ARROW = re.compile(r"^\s*-->\s*(?P<path>.+?):(?P<line>\d+):(?P<col>\d+)\s*\Z")
_CONTEXT = re.compile(r"^(\s|\d*\s*\||\d+\s+[+-](\s|\Z))")
_NOISE = re.compile(
    r"^(?:"
    r"(?:help|note|hint|info)(?:\[[^\]]*\])?:\s"
    r"|Found \d+ (?:errors?|warnings?|problems?|diagnostics?)\b"
    r"|\[\*\] \d+ fixable"
    r"|No fixes available"
    r"|All checks passed!"
    r"|Success: no issues found"
    r"|\d+ problems?(?: \(.*\))?\Z"
    r"|In file included from "
    r"|\S.*: (?:In (?:member |static member )?function|In constructor|In destructor"
    r"|In instantiation of|At top level|At global scope)\b.*:\Z"
    r"|compilation terminated\.\Z"
    r"|\d+ (?:warnings?|errors?)(?: and \d+ (?:warnings?|errors?))? generated\.\Z"
    r"|[^\s:]+: note: "
    r"|[\u2716\u2717xX] \d+ problems? \("
    r"|Errors\s+Files\Z"
    r")")
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_STYLISH_ROW = re.compile(r"^\s+(?P<line>\d+):(?P<col>\d+)\s+(?P<sev>error|warning)\s+"
                          r"(?P<msg>.*)\Z")
_FRAME = re.compile(r"^(?:\d+ |\s*~+\s*\Z|\s*\Z)")
_ESLINT_SEVERITY = re.compile(r"\[(Error|Warning)/[^\]]*\]\s*\Z")


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding of a checker.

    Attributes:
        path: the path as the checker printed it.
        line: 1-based line.
        col: 1-based column, or ``None``.
        severity: ``"error"``, ``"warning"`` or ``"note"``.
        message: the text after the location.
        format: ``"gnu"``, ``"paren"`` or ``"arrow"``.
    """

    path: str
    line: int
    col: int | None
    severity: str
    message: str
    format: str

    def render(self) -> str:
        """``path:line:col: message`` (column left out when unknown)."""
        col = f"{self.col}:" if self.col is not None else ""
        return f"{self.path}:{self.line}:{col} {self.message}"


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A checker's output, parsed.

    Attributes:
        diagnostics: every diagnostic found, in output order.
        unparsed: lines that are neither a diagnostic nor known context or summary.
    """

    diagnostics: tuple[Diagnostic, ...]
    unparsed: tuple[str, ...]


def severity_of(message: str) -> str:
    """The severity of a diagnostic message (rules in the module docstring)."""
    eslint = _ESLINT_SEVERITY.search(message)
    if eslint:
        return ERROR if eslint.group(1) == "Error" else WARNING
    low = message.lstrip().lower()
    if low.startswith(("error", "fatal error")):
        return ERROR
    if low.startswith("warning"):
        return WARNING
    if low.startswith(("note", "info", "help", "required from", "in instantiation of")):
        return NOTE
    return ERROR


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, OSC hyperlinks) and
    carriage returns: a checker that colours its output anyway is read as plain text."""
    return _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


def parse_checker_output(text: str) -> ParsedOutput:
    """Parse checker output (formats in the module docstring); escape sequences are stripped
    first (:func:`strip_ansi`)."""
    diagnostics: list[Diagnostic] = []
    unparsed: list[str] = []
    header: str | None = None  # a candidate header line for an arrow location
    stylish: str | None = None  # the file header of eslint's stylish rows under it
    stylish_used = False
    frame = False  # inside the numbered code frame of a tsc --pretty diagnostic
    for line in strip_ansi(text).splitlines():
        arrow = _ARROW.match(line)
        if arrow:
            message = header if header is not None else ""
            if header is not None:
                unparsed.pop()  # the header belongs to this diagnostic
            header = stylish = None
            diagnostics.append(Diagnostic(arrow["path"], int(arrow["line"]), int(arrow["col"]),
                                          severity_of(message), message, "arrow"))
            continue
        row = _STYLISH_ROW.match(line)
        if row:
            if stylish is None:
                unparsed.append(line)  # a row with no file above it: nothing to place it in
                continue
            if not stylish_used:
                unparsed.remove(stylish)  # the header names the file of the rows below it
                stylish_used = True
            severity = ERROR if row["sev"] == "error" else WARNING
            diagnostics.append(Diagnostic(stylish, int(row["line"]), int(row["col"]), severity,
                                          f"{row['sev']}: {row['msg'].rstrip()}", "stylish"))
            continue
        if frame and _FRAME.match(line):
            continue
        if not line.strip() or _CONTEXT.match(line) or _NOISE.match(line):
            header = None
            if line.strip():
                stylish = None
            continue
        header = stylish = None
        frame = False
        paren = _PAREN.match(line)
        if paren:
            diagnostics.append(Diagnostic(paren["path"], int(paren["line"]), int(paren["col"]),
                                          severity_of(paren["msg"]), paren["msg"], "paren"))
            continue
        pretty = _TSC_PRETTY.match(line)
        if pretty:  # tsc --pretty: a numbered code frame follows
            frame = True
            diagnostics.append(Diagnostic(pretty["path"], int(pretty["line"]),
                                          int(pretty["col"]), severity_of(pretty["msg"]),
                                          pretty["msg"], "tsc-pretty"))
            continue
        gnu = _GNU.match(line)
        if gnu:
            col = int(gnu["col"]) if gnu["col"] else None
            diagnostics.append(Diagnostic(gnu["path"], int(gnu["line"]), col,
                                          severity_of(gnu["msg"]), gnu["msg"], "gnu"))
            continue
        unparsed.append(line)
        header = line
        stylish, stylish_used = line, False
    return ParsedOutput(tuple(diagnostics), tuple(unparsed))


def path_keys(path: str, cwd: str) -> set[str]:
    """The absolute forms of a path as a checker running in ``cwd`` printed it: lexically
    normalised (``./``, ``..``, relative or absolute) and with symlinks resolved. Two paths
    name the same file when their key sets intersect."""
    joined = os.path.normpath(os.path.join(cwd, path))
    return {joined, os.path.realpath(joined)}


def place(path: str, cwd: str, workspace: str) -> set[str] | None:
    """Where in the workspace a path printed by a checker running in ``cwd`` is.

    The path is joined to ``cwd`` when relative, normalised (``./``, ``..``) and resolved
    through symlinks; backslashes are read as ``/`` when the path as printed names no file.

    Args:
        path: the path as printed.
        cwd: the checker's working directory (absolute).
        workspace: the workspace (absolute).

    Returns:
        The workspace-relative (``/``-separated) forms of the file, lexical and resolved, or
        ``None`` when it cannot be placed: no such file, or a file outside the workspace.
    """
    candidates = [path]
    if "\\" in path:
        candidates.append(path.replace("\\", "/"))
    ws_lexical = os.path.normpath(os.path.abspath(workspace))
    ws_real = os.path.realpath(workspace)
    for candidate in candidates:
        joined = os.path.normpath(os.path.join(cwd, candidate))
        if not os.path.lexists(joined):
            continue
        forms: set[str] = set()
        for base, full in ((ws_lexical, joined), (ws_real, joined),
                           (ws_real, os.path.realpath(joined))):
            if full.startswith(base + os.sep):
                forms.add(os.path.relpath(full, base).replace(os.sep, "/"))
        real = os.path.realpath(joined)
        if not (real == ws_real or real.startswith(ws_real + os.sep)):
            return None  # reached through a link that leads out of the workspace
        return forms or None
    return None


def workspace_keys(rel: str, workspace: str) -> set[str]:
    """The forms :func:`place` gives for the workspace file ``rel`` (``a/b.py``): itself and,
    when a link on the way leads elsewhere in the workspace, its resolved form."""
    forms = {rel}
    ws_real = os.path.realpath(workspace)
    real = os.path.realpath(os.path.join(workspace, rel))
    if real.startswith(ws_real + os.sep):
        forms.add(os.path.relpath(real, ws_real).replace(os.sep, "/"))
    return forms
