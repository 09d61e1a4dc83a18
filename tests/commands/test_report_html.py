"""The HTML report in a real browser: Debian's headless Chromium (installed by
``scripts/setup.sh --test``) opens the page from a file with the network unused, and the test
reads back the DOM after the page's script ran (``--dump-dom``), the console (Chromium logs every
console message and uncaught error as ``CONSOLE`` on stderr with ``--enable-logging=stderr``)
and a screenshot.

A control page that throws proves that the console check would see an error.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.helpers import cli, git
from tests.commands.test_report import HOSTILE, live, make_fleet

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp: Path, url: str, *args: str) -> tuple[str, list[str]]:
    """Run headless Chromium on ``url``; return (stdout, console lines). A missing browser
    fails the test (never a skip that would hide a missing install step)."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: run scripts/setup.sh --test (Debian's chromium)")
    profile = tmp / "chromium-profile"
    done = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--disable-background-networking", "--disable-component-update", *args, url],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


class Dom(HTMLParser):
    """Elements of a dumped DOM: tag → list of attribute dicts, and the text of ids."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: dict[str, list[dict[str, str | None]]] = {}
        self.text_of: dict[str, str] = {}
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.setdefault(tag, []).append(a)
        if a.get("id"):
            self.text_of[a["id"]] = ""
            self._open.append(a["id"])

    def handle_endtag(self, tag):
        pass

    def handle_data(self, data):
        for i in self._open[-1:]:
            self.text_of[i] += data


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the decoded image data) of a PNG, read here."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(raw):
        length, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def test_control_page_errors_are_seen(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>throw new Error('control-boom')"
                    "</script></body></html>")
    _, console = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert any("control-boom" in line for line in console), console


def test_html_report_in_headless_chromium(tmp_path):
    """Two hosts, two nights: a hand-patch and a hostile file name on h1, a pending change
    everywhere. The page has the overview (2 hosts × 3 checks), a bar per night, every finding
    as a row, filters that work (from the URL), no element made from the hostile name, no
    console message, and a screenshot that is not blank."""
    inv, bp = make_fleet(tmp_path)
    hist = tmp_path / "history"
    first = cli("report", "--history", str(hist), "--now", "2026-11-30T02:00:00Z",
                "--no-ledgers", "--format", "json", inventory=inv, blueprint=bp)
    assert first.code == 0, first.stdout + first.stderr
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("patched\n")
    (live(tmp_path, "h1") / "runner" / HOSTILE).write_text("x\n")
    (bp / "runner" / "b.txt").write_text("b, version 2\n")
    git(tmp_path, "commit", "-qam", "b v2")
    page = tmp_path / "report.html"
    run = cli("report", "--history", str(hist), "--now", "2026-12-01T02:00:00Z",
              "--no-ledgers", "--html", str(page), "--format", "json", inventory=inv,
              blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr
    expected_rows = {("h1", "hand-patch", "runner/a.txt"), ("h1", "hand-patch",
                                                            f"runner/{HOSTILE}"),
                     ("h1", "pending", "runner/b.txt"), ("h2", "pending", "runner/b.txt")}

    dom_text, console = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert console == []
    dom = Dom(dom_text)
    body = dom.tags["body"][0]
    assert body.get("data-ready") == "1" and body.get("data-exit-code") == "1"
    assert "img" not in dom.tags and "script" in dom.tags
    assert len(dom.tags["script"]) == 1  # the page's own, nothing from a host
    svgs = {a.get("id") for a in dom.tags["svg"]}
    assert {"chart-findings-svg", "chart-prefix-svg"} <= svgs
    assert sum(1 for r in dom.tags["rect"] if r.get("class") == "bar-all") == 2
    rows = [r for r in dom.tags["tr"] if r.get("data-kind")]
    assert {(r["data-host"], r["data-kind"]) for r in rows} == {(h, k) for h, k, _ in
                                                                 expected_rows}
    assert len(rows) == 4 and not any("hidden" in r for r in rows)
    cells = [td for td in dom.tags["td"] if td.get("data-check")]
    assert len(cells) == 6
    assert {td["class"] for td in cells} == {"check findings", "check ok", "check skipped"}
    assert dom.text_of["shown-count"] == "4 of 4 shown"
    assert HOSTILE in dom_text.replace("&lt;", "<").replace("&gt;", ">")

    # The filters, driven from the URL: only h1's hand-patches, then only failing on h2.
    filtered, console = chromium(tmp_path, page.as_uri() + "#kind=hand-patch", "--dump-dom")
    assert console == []
    dom = Dom(filtered)
    shown = [r for r in dom.tags["tr"] if r.get("data-kind") and "hidden" not in r]
    assert {(r["data-host"], r["data-kind"]) for r in shown} == {("h1", "hand-patch")}
    assert len(shown) == 2 and dom.text_of["shown-count"] == "2 of 4 shown"
    filtered, _ = chromium(tmp_path, page.as_uri() + "#host=h2&failing=1", "--dump-dom")
    dom = Dom(filtered)
    shown = [r for r in dom.tags["tr"] if r.get("data-kind") and "hidden" not in r]
    assert [(r["data-host"], r["data-kind"]) for r in shown] == [("h2", "pending")]

    shot = tmp_path / "shot.png"
    _, console = chromium(tmp_path, page.as_uri(), f"--screenshot={shot}",
                          "--window-size=1280,1600", "--hide-scrollbars")
    assert console == []
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == (1280, 1600) and colours > 8


def test_a_script_that_slipped_into_the_page_would_not_run(tmp_path):
    """Defence in depth: the page's CSP allows its own script by digest only. The same page
    with one more inline script (as if a host's text had escaped escaping) still runs its own
    (data-ready) but not the added one, and Chromium reports the refusal."""
    from fleetctl.cli.output.nightly import to_html
    from tests.commands.test_report import _doc_with

    page = to_html(_doc_with(3))
    tampered = page.replace("</h1>", "</h1><script>document.title='PWNED'</script>", 1)
    path = tmp_path / "tampered.html"
    path.write_text(tampered)
    dom_text, console = chromium(tmp_path, path.as_uri(), "--dump-dom")
    dom = Dom(dom_text)
    assert dom.tags["body"][0].get("data-ready") == "1"
    assert "PWNED" not in dom_text.split("<h1>")[0]  # the title was not changed
    assert any("Content Security Policy" in line for line in console), console
    clean = tmp_path / "clean.html"
    clean.write_text(page)
    _, console = chromium(tmp_path, clean.as_uri(), "--dump-dom")
    assert console == []


class Tree(HTMLParser):
    """A dumped DOM read in document order: ``ids`` in the order they start, the text inside
    each id'ed element (nested text included), and every element as ``(tag, attributes,
    ids of the id'ed elements it is inside)``."""

    VOID = {"meta", "link", "input", "br", "img", "hr", "source", "col", "wbr"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.text: dict[str, str] = {}
        self.elements: list[tuple[str, dict, tuple[str, ...]]] = []
        self._stack: list[tuple[str, str | None]] = []
        self.feed(text)

    def _inside(self) -> tuple[str, ...]:
        return tuple(i for _, i in self._stack if i)

    def handle_starttag(self, tag, attrs):
        self.handle_startendtag(tag, attrs)
        if tag not in self.VOID:
            self._stack.append((tag, dict(attrs).get("id")))

    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a, self._inside()))
        if a.get("id"):
            self.ids.append(a["id"])
            self.text[a["id"]] = ""

    def handle_endtag(self, tag):
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data):
        for i in self._inside():
            self.text[i] += data

    def within(self, ident: str, tag: str | None = None) -> list[dict]:
        return [a for t, a, inside in self.elements if ident in inside
                and (tag is None or t == tag)]


def test_html_leads_with_tonight_and_labels_every_chart(tmp_path):
    """Two nights on two hosts, each with agent w1. Night 2: h1's a.txt still patched
    (persisting), h2's b.txt newly patched (new); h1/w1's runner gave up on task t7 and an
    escalation waits; h2/w1's ledger cannot be read. The rendered page leads with Tonight (the
    new finding, h1/w1, what could not be read), then what persists, then the fleet and the
    charts; each chart is an image named by its title and description, has a label on each
    axis, a legend entry per series and its numbers in a table; the unread ledger is named,
    not drawn as "no turns"."""
    import json

    from tests.commands.test_report import key

    inv, bp = make_fleet(tmp_path, agents={"w1": {"role": "worker"}},
                         roles={"worker": {"prompt": "work"}})
    hist = tmp_path / "history"
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("patched\n")
    first = cli("report", "--history", str(hist), "--now", "2026-11-30T02:00:00Z",
                "--format", "json", inventory=inv, blueprint=bp)
    assert first.code == 1, first.stdout + first.stderr
    (live(tmp_path, "h2") / "runner" / "b.txt").write_text("patched\n")
    state = tmp_path / "boxes" / "h1" / "state" / "w1"
    (state / "runs" / "t7").mkdir(parents=True)
    (state / "runs" / "t7" / "result.json").write_text(json.dumps(
        {"outcome": "gave-up", "attempts": 2, "reason": "the check failed twice"}))
    (state / "notify").mkdir()
    (state / "notify" / "0001-t7.json").write_text(json.dumps(
        {"task": "t7", "kind": "gave-up", "time": "2026-12-01T01:00:00Z",
         "reason": "Task t7 gave up after 2 failed verification(s)"}))
    (state / "ledger.jsonl").write_text("".join(json.dumps(
        {"schema_version": 1, "time": f"2026-12-01T01:0{i}:00.000Z", "agent": "w1",
         "prefix_tokens": {"role_prompt": 40 + i, "cli_index": 10}}) + "\n" for i in range(3)))
    unread = tmp_path / "boxes" / "h2" / "state" / "w1" / "ledger.jsonl"
    unread.mkdir(parents=True)  # a directory where the ledger should be: not readable as one
    page = tmp_path / "report.html"
    md = tmp_path / "report.md"
    run = cli("report", "--history", str(hist), "--now", "2026-12-01T02:00:00Z", "--html",
              str(page), "--markdown", str(md), "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr
    # The Markdown and the text say the same, in the same order.
    summary = md.read_text().replace("\\", "")
    assert summary.index("### Not checked") < summary.index("### New tonight: 1 finding(s)") \
        < summary.index("### Agents that gave up or wait on a person: 1") \
        < summary.index("Persisting: 3 finding(s)")
    assert "h2/w1: ledger not read (unreadable)" in summary
    text = cli("report", "--now", "2026-12-01T02:00:00Z", "--quiet", inventory=inv,
               blueprint=bp).stdout
    assert "needs a person: h1/w1 (worker): last task t7 gave-up" in text
    assert "not checked: h2/w1: ledger not read (unreadable)" in text
    new_id = key("drift", "h2", "hand-patch", "runner/b.txt")
    # Persisting: a.txt, and each agent's no-own-user (local demo agents have no user).
    old_ids = {key("drift", "h1", "hand-patch", "runner/a.txt"),
               key("creds", "h1", "no-own-user", "w1"), key("creds", "h2", "no-own-user", "w1")}

    dom_text, console = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert console == []
    dom = Tree(dom_text)
    order = [i for i in dom.ids if i in ("tonight", "persisting", "overview", "charts",
                                          "findings")]
    assert order == ["tonight", "persisting", "overview", "charts", "findings"]
    h2s = [a for t, a, _ in dom.elements if t == "h2"]
    assert h2s and dom.text["tonight"].startswith("Tonight")
    assert [a["data-new"] for a in dom.within("tonight", "tr") if "data-new" in a] == [new_id]
    persisting = [a["data-persisting"] for a in dom.within("persisting", "tr")
                  if "data-persisting" in a]
    assert len(persisting) == 3 and set(persisting) == old_ids
    assert [a["data-agent"] for a in dom.within("people", "li")] == ["h1/w1"]
    people = dom.text["people"]
    assert "t7 gave-up" in people and "1 escalation(s) waiting" in people
    assert "h2/w1: ledger not read (unreadable)" in dom.text["not-checked"]

    for chart, x_label, y_label, series in (
            ("chart-findings-svg", "night (UTC date)", "findings",
             ["all findings", "failing", "not checked"]),
            ("chart-prefix-svg", "time of the turn (UTC)", "prefix tokens per turn",
             ["h1/w1 (median 51 tokens/turn)"])):
        svg = next(a for t, a, _ in dom.elements if t == "svg" and a.get("id") == chart)
        assert svg.get("role") == "img"
        named = svg["aria-labelledby"].split()
        assert named == [f"{chart}-title", f"{chart}-desc"]
        assert all(dom.text[n].strip() for n in named)
        labels = {a.get("data-axis"): a for a in dom.within(chart, "text")
                  if a.get("class") == "axis-label"}
        assert set(labels) == {"x", "y"}
        assert f">{x_label}<" in dom_text and f">{y_label}<" in dom_text
        assert [a["data-series"] for a in dom.within(chart, "g")
                if a.get("class") == "legend"] == series
    assert "2 night(s), 2026-11-30 to 2026-12-01" in dom.text["chart-findings-svg-desc"]
    assert "Not read: h2/w1 (unreadable" in dom.text["chart-prefix-svg-desc"]
    assert "No ledger turns" not in dom.text["chart-prefix-svg-desc"]
    assert len([a for a in dom.within("chart-findings-data", "tr")]) == 1 + 2  # head, nights
    assert len([a for a in dom.within("chart-prefix-data", "tr")]) == 1 + 2  # head, agents
