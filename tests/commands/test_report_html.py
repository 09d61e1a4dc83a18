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
