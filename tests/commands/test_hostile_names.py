"""Hostile file names and contents through ``fleetctl drift`` on a local box (issue 19): what is
printed is safe for a terminal and decodes back to the bytes on disk, and the diffs it prints
or writes in JSON apply with real ``git apply``.

Oracles: the names and bytes this test wrote, the documented decoding (``tests.engine.
test_names.decode``, written from docs/json.md, not fleetctl's), and git.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.test_names import HOSTILE, decode, looks_safe
from tests.helpers import cli, local_host, make_project, write_inventory

# File names: any byte but NUL and "/" (and not "." or "..").
NAMES = [raw for raw in HOSTILE if raw and b"\x00" not in raw and b"/" not in raw] + \
    [b"a b", b"x\x1b]0;title\x07", "e\u0301".encode(), "\u00e9".encode()]
CONTENT = b"plain\r\nwith \x1b[2J ESC\rCR only\n\ttab \\x41 and \xe2\x80\xae bidi\nno newline"


def _fleet(tmp_path: Path):
    bp = make_project(tmp_path, {"runner": {"conf": "plain\nline two\n", "keep": "k\n"}})
    root = tmp_path / "box"
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(root)})
    first = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert first.code == 0, first.stderr
    live = Path(os.path.realpath(root / "current")) / "runner"
    for raw in NAMES:
        with open(os.path.join(os.fsencode(live), raw), "wb") as fh:
            fh.write(b"x\n")
    (live / "conf").write_bytes(CONTENT)
    return inv, bp, live


def git_apply_reverse(patch: bytes, start: bytes) -> bytes:
    """``start`` (the blueprint's file) with ``patch`` (live to desired) undone by git."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "runner").mkdir()
        (Path(tmp) / "runner" / "conf").write_bytes(start)
        (Path(tmp) / "p.diff").write_bytes(patch)
        done = subprocess.run(["git", "apply", "-R", "p.diff"], cwd=tmp, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
        return (Path(tmp) / "runner" / "conf").read_bytes()


def test_hostile_names_print_safely_and_decode_back_in_text_and_json(tmp_path):
    inv, bp, live = _fleet(tmp_path)
    wanted = {b"runner/" + raw for raw in NAMES}

    js = cli("drift", "--diff", "--format", "json", inventory=inv, blueprint=bp)
    assert js.code == 1, js.stderr
    changes = js.host("h")["changes"]
    seen = {decode(c["path"]) if c.get("path_escaped") else c["path"].encode()
            for c in changes}
    assert wanted <= seen and len(changes) == len(NAMES) + 1

    text = cli("drift", "--diff", inventory=inv, blueprint=bp)
    assert text.code == 1, text.stderr
    out = text.stdout
    assert all(looks_safe(line.strip(" ")) or not line.strip(" ") for line in out.split("\n")), out
    for ch in "\x1b\r\x07\u202e\u2028\x85\t":
        assert ch not in out + text.stderr
    # Each row of the change table starts with the path as shown: decoded, they are the names.
    rows = [line.strip(" ").split("  ")[0] for line in out.split("\n")
            if line.strip(" ").startswith("runner/")]
    assert {decode(row) for row in rows} == wanted | {b"runner/conf"}, rows

    # The diff of runner/conf applies back to the blueprint's file, from JSON and from the text.
    (diff,) = [d for d in js.host("h")["diffs"] if d["path"] == "runner/conf"]
    blueprint_file = (bp / "runner" / "conf").read_bytes()
    assert git_apply_reverse(diff["patch"].encode(), blueprint_file) == CONTENT
    lines = out.split("\n")
    head = lines.index("# h: runner/conf (text)")
    start = next(i for i in range(head, len(lines)) if lines[i].startswith("--- "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("#")
               or lines[i].startswith("h: "))
    cut = b"".join(decode(line) + b"\n" for line in lines[start:end])
    assert git_apply_reverse(cut, blueprint_file) == CONTENT


def test_the_dry_run_diff_applies_back_too(tmp_path):
    inv, bp, _ = _fleet(tmp_path)
    run = cli("ship", "--dry-run", "--force", "--diff", "--format", "json", inventory=inv,
              blueprint=bp)
    assert run.code == 0, run.stderr
    (diff,) = [d for d in run.host("h")["diffs"] if d["path"] == "runner/conf"]
    assert git_apply_reverse(diff["patch"].encode(), (bp / "runner" / "conf").read_bytes()) \
        == CONTENT


def test_an_error_naming_a_hostile_path_cannot_drive_the_terminal(tmp_path):
    inv, bp, _ = _fleet(tmp_path)
    run = cli("ship", "--yes", "--force-path", "runner/\x1b[31mno-such", inventory=inv,
              blueprint=bp)
    assert "\x1b" not in run.stdout + run.stderr


def test_backports_git_diff_decodes_back_to_a_patch(tmp_path):
    """backport prints git's own diff of what it wrote; its lines (split at \\n only, content
    escaped) decode back to a patch that undoes the write."""
    inv, bp, _ = _fleet(tmp_path)
    before = (bp / "runner" / "conf").read_bytes()
    run = cli("backport", "h", "runner/conf", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    assert (bp / "runner" / "conf").read_bytes() == CONTENT
    lines = run.doc["git_diff"]
    assert all(looks_safe(line.strip(" ")) or not line.strip(" ") for line in lines), lines
    patch = b"".join(decode(line) + b"\n" for line in lines)
    assert git_apply_reverse(patch, CONTENT) == before


def test_hostile_names_in_markdown_decode_back_from_their_code_spans(tmp_path):
    inv, bp, _ = _fleet(tmp_path)
    run = cli("drift", "--format", "markdown", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stderr
    for ch in "\x1b\r\x07\u202e\u2028\x85\t":
        assert ch not in run.stdout
    spans = []
    for line in run.stdout.split("\n"):
        found = re.match(r"\| (`+) ?(.*?) ?\1 \|", line)
        if found and "runner/" in found.group(2):
            spans.append(found.group(2).replace("\\|", "|"))  # GFM: a table cell's \| is |
    assert {decode(s) for s in spans} == {b"runner/" + raw for raw in NAMES} | {b"runner/conf"}


file_names = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"\x00" not in b and b"/" not in b and b not in (b".", b"..")) | \
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(b"".join)


def test_any_file_names_through_drift_print_safely_and_decode_back(tmp_path):
    """Hypothesis names (any byte but NUL and "/") through the real drift, text and JSON: the
    JSON paths and the text's diff headers decode back to exactly the names on disk."""
    inv, bp, live = _fleet(tmp_path)
    counter = iter(range(10**6))

    @settings(max_examples=8, deadline=None, database=None)
    @given(st.lists(file_names, min_size=1, max_size=4, unique=True))
    def check(raws):
        sub = f"e{next(counter)}".encode()
        where = os.path.join(os.fsencode(live), sub)
        os.mkdir(where)
        try:
            for raw in raws:
                with open(os.path.join(where, raw), "wb") as fh:
                    fh.write(b"y\n")
            wanted = {b"runner/" + sub + b"/" + raw for raw in raws}
            js = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
            got = {decode(c["path"]) if c.get("path_escaped") else c["path"].encode()
                   for c in js.host("h")["changes"]}
            assert wanted <= got
            text = cli("drift", "--diff", inventory=inv, blueprint=bp)
            for ch in "\x1b\r\x07\u202e\u2028\x85\t":
                assert ch not in text.stdout + text.stderr
            heads = [re.fullmatch(r"# h: (.*) \(([a-z-]+)\)", line) for line in
                     text.stdout.split("\n") if line.startswith("# h: ")]
            shown = {decode(m.group(1)) for m in heads if m}
            assert len(heads) == len(shown) and wanted <= shown, (raws, text.stdout)
        finally:
            shutil.rmtree(where)

    check()
