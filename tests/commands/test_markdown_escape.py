"""Host-supplied text reaches a Markdown page as text, never as HTML or Markdown markup.

A host name, a path and a host's error message are data: a Markdown page (a CI job summary, a PR
comment) renders raw HTML, so each renderer must escape what it did not write. The pages are
rendered here with a real CommonMark renderer (markdown-it-py, with raw HTML allowed as GitHub
allows it) and the HTML is searched for the planted element.
"""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from fleetctl.cli.output import creds as creds_output
from fleetctl.cli.output import results as results_output
from fleetctl.cli.output.markdown import md_code, md_line, md_text
from fleetctl.creds_audit import AuditReport, Finding, HostAudit
from fleetctl.drift import Change
from fleetctl.livestate import Unreadable
from fleetctl.manifest import Entry
from fleetctl.results import HostResult

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(2)">'


def html_of(markdown: str) -> str:
    """The page a Markdown viewer would show: CommonMark with GFM tables and raw HTML on."""
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)


def assert_inert(markdown: str) -> None:
    page = html_of(markdown)
    assert "<script" not in page and "<img" not in page, page
    # The text is still shown, as text.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize("text, expected", [
    (SCRIPT, "&lt;script>alert(1)&lt;/script>"),  # no tag can open without a "<"
    ("a|b", "a\\|b"),
    ("[x](javascript:y)", "\\[x\\](javascript:y)"),
    ("**bold** _it_", "\\*\\*bold\\*\\* \\_it\\_"),
    ("a & b", "a &amp; b"),
    ("two\nlines", "two\\\\nlines"),
    (None, ""),
    # Text that opens no markup stays as written, so raw Markdown reads like the text format.
    ("budget 6,000 [ok]; 19,760 -> 1,070", "budget 6,000 [ok]; 19,760 -> 1,070"),
    ("o200k_base, known_hosts, mcp__tracker__create_issue",
     "o200k_base, known_hosts, mcp__tracker__create_issue"),
    ("__init__ and ![i](y) and [a][b]", "\\_\\_init\\_\\_ and !\\[i\\](y) and \\[a\\][b]"),
])
def test_md_text_escapes_html_and_markdown(text, expected):
    assert md_text(text) == expected


def test_md_text_shows_the_original_characters():
    page = html_of(f"| x |\n| --- |\n| {md_text('<b>|`x`|*y*')} |\n")
    assert "<td>&lt;b&gt;|`x`|*y*</td>" in page


def test_a_code_span_shows_html_as_text():
    assert html_of(md_code(SCRIPT)).strip() == "<p><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></p>"


def _entry(path: str, digest: str) -> Entry:
    return Entry(path, "file", "0644", "root", 3, digest)


def test_drift_markdown_escapes_a_hosts_error_and_paths():
    """Regression: drift and ship Markdown escaped only ``|`` and backticks in plain cells, so
    a host's error reached the page as raw HTML."""
    path = f"runner/{SCRIPT}"
    change = Change(path, "content", "hand-patch", _entry(path, "sha256:" + "a" * 64),
                    _entry(path, "sha256:" + "b" * 64), None)
    results = [
        HostResult(f"web{IMG}", "error", error=f"scan failed: {SCRIPT}"),
        HostResult("db", "drift", changes=[change],
                   unreadable=[Unreadable(f"etc/{SCRIPT}", f"denied: {IMG}")]),
    ]
    assert_inert(results_output.to_markdown(results, "fleetctl drift"))


def test_creds_audit_markdown_escapes_a_hosts_error_and_paths():
    """Regression: the creds audit Markdown escaped only ``|`` and backticks."""
    finding = Finding("h1", "readable-by-others", f"mode 0644 on {SCRIPT}", agent="a1",
                      path=f"credentials/{SCRIPT}")
    report = AuditReport([
        HostAudit("h1", "findings", [finding], scanned=True,
                  unreadable=[(f"home/{SCRIPT}", f"denied {IMG}")]),
        HostAudit("h2", "error", error=f"cannot connect: {SCRIPT}"),
    ])
    assert_inert(creds_output.to_markdown(report))


@pytest.mark.parametrize("text, expected", [
    ("run `mcp-bridge t --help` now", "run `mcp-bridge t --help` now"),
    (f"error: {SCRIPT} in `x|y`", "error: &lt;script>alert(1)&lt;/script> in `x\\|y`"),
    ("a lone ` backtick\nand a newline", "a lone \\` backtick and a newline"),
])
def test_md_line_keeps_code_spans_and_escapes_the_rest(text, expected):
    assert md_line(text) == expected
