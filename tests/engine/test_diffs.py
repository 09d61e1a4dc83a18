"""Content diffs a person can apply (issue 19), checked with real ``git apply``.

The oracle is git: each diff, taken from ``patch`` or cut from the text a person sees and decoded
with the documented escape form, must turn one side's bytes into the other's exactly. Key-level
YAML/JSON views are checked against ``json.dumps(sort_keys=True)`` of the data (type-strict, and
none of fleetctl's code). The cases first, from public bug reports: difflib drops "\\ No newline
at end of file" (ansible#14094, jsdiff#94, cpython#46395) and splits at a bare CR; a CRLF patch is
"corrupt" to git apply; deepdiff 9.1 finds ``[2]`` and ``[2.0]`` equal (deepdiff#605), and
``ignore_order`` hides int to float (deepdiff#485).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from fleetctl.cli.output.results import diff_text
from fleetctl.cli.output.text import RStripWriter
from fleetctl.diffs import diff_contents
from fleetctl.names import unshow_bytes

PIECES = [b"a", b"b", b"line", b" ", b"\t", b"\\", b"\\x41", b"\r", b"\n", b"\n", b"\n",
          b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x1e", "\x85".encode(), "\u2028".encode(),
          "\u202e".encode(), b"\x1b[31m", "é".encode(), b"\xff", b"\x80", b"\x00"]
contents = st.lists(st.sampled_from(PIECES), max_size=24).map(b"".join)


@st.composite
def pairs(draw):
    """(live, desired): unrelated, or one an edit of the other (so hunks have context)."""
    live = draw(contents)
    if draw(st.booleans()):
        return live, draw(contents)
    cut = draw(st.integers(0, len(live)))
    end = draw(st.integers(cut, len(live)))
    return live, live[:cut] + draw(contents) + live[end:]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data


def git_apply(patch: bytes, start: bytes, reverse: bool = False, name: str = "f.txt") -> bytes:
    """``start`` patched by real ``git apply`` (outside any repository: a plain patch tool)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / name).write_bytes(start)
        (Path(tmp) / "p.diff").write_bytes(patch)
        done = subprocess.run(["git", "apply", *(["-R"] if reverse else []), "p.diff"], cwd=tmp,
                              capture_output=True)
        assert done.returncode == 0, (done.stderr.decode(), patch)
        return (Path(tmp) / name).read_bytes()


def printed(host: str, diff) -> str:
    """The diff as ``drift --diff`` prints it to a pipe: rich, then trailing spaces stripped."""
    buf = io.StringIO()
    console = Console(file=RStripWriter(buf), width=160)  # type: ignore[arg-type]
    for line in diff_text(host, diff):
        console.print(Text(line), soft_wrap=True)
    console.file.flush()
    return buf.getvalue()


def cut_patch(output: str) -> bytes:
    """What a person cuts from the text output: from the ``--- `` line to the next ``#`` line,
    each line decoded from the escape form (docs/releases.md)."""
    lines = output.split("\n")[:-1]  # the output ends with a newline
    start = next(i for i, line in enumerate(lines) if line.startswith("--- "))
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return b"".join(unshow_bytes(line) + b"\n" for line in lines[start:end])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs(), st.sampled_from(["f.txt", "f.yaml", "f.json"]))
def test_every_text_diff_applies_both_ways_from_json_and_from_the_printed_text(pair, name):
    live, desired = pair
    diff = diff_contents(name, live, desired)
    doc = json.loads(json.dumps(diff.to_json()))
    assert (doc["live_digest"], doc["desired_digest"]) == (sha(live), sha(desired))
    if live == desired:
        return
    # The rule: digests differ, so the diff is not empty.
    assert diff.lines or diff.note
    assert len(printed("h", diff).strip().split("\n")) > 1
    if not (is_text(live) and is_text(desired)):
        assert doc["kind"] == "binary" and doc["patch"] is None and doc["lines"] == []
        for part in (f"{len(live)} B", f"{len(desired)} B", sha(live), sha(desired)):
            assert part in doc["note"]
        return
    patch = doc["patch"].encode("utf-8")
    assert git_apply(patch, desired, reverse=True, name=name) == live
    assert git_apply(patch, live, name=name) == desired
    from_text = cut_patch(printed("h", diff))
    # A pipe's stripped line ends take an empty context line's space; git reads it as context.
    assert [line or b" " for line in from_text.split(b"\n")] == \
        [line or b" " for line in patch.split(b"\n")]
    assert git_apply(from_text, desired, reverse=True, name=name) == live
    if live.replace(b"\r\n", b"\n") == desired.replace(b"\r\n", b"\n"):
        assert "only line endings differ" in doc["note"]


@pytest.mark.parametrize("live, desired", [
    (b"one\ntwo", b"one\ntwo\n"),            # cpython#46395: the old side lacks the newline
    (b"a\nb\nc", b"a\nb\nd"),                # jsdiff#94: both lack it, last line changed
    (b"x\r\ny\r\n", b"x\ny\n"),              # CRLF to LF: a patch git applies, and a note
    (b"a\rb\n", b"a\rc\n"),                  # a bare CR is content, not a line break
    ("a\u2028b\x85c\x0cd\n".encode(), "a\u2028b\x85c\x0ce\n".encode()),
    (b"", b"x\n"), (b"x\n", b""),            # an empty file on one side
    (b"  indented \n\n", b"  indented\n\n"),  # trailing space, empty context line
])
def test_cases_from_bug_reports_apply(live, desired):
    diff = diff_contents("f.txt", live, desired)
    patch = (diff.patch or "").encode()
    assert git_apply(patch, desired, reverse=True) == live
    assert git_apply(patch, live) == desired
    assert git_apply(cut_patch(printed("h", diff)), desired, reverse=True) == live
    if not live.endswith(b"\n") and live:
        assert "\\ No newline at end of file" in diff.lines


def test_a_crlf_only_change_says_so_and_shows_the_cr():
    diff = diff_contents("f.txt", b"x\r\ny\r\n", b"x\ny\n")
    assert diff.note == "only line endings differ (live: CRLF, desired: LF)"
    assert "-x\\x0d" in diff.lines and "+x" in diff.lines
    assert "\r" not in printed("h", diff)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 2.5, -0.0])
    | st.sampled_from(["", "1", "true", "a", "null"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["a", "b", "1", "true"]), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(json_values, json_values, st.sampled_from(["c.json", "c.yaml"]))
def test_the_key_level_view_hides_no_change_of_data(old, new, name):
    """Key lines exactly when the data differ type-strictly (json.dumps tells 1 from 1.0 and
    from true and "1"); and the text diff is always there and applies."""
    live, desired = (json.dumps(v, indent=1).encode() + b"\n" for v in (old, new))
    diff = diff_contents(name, live, desired)
    same = json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    assert bool(diff.keys) == (not same), diff
    if live != desired:
        assert diff.patch and git_apply(diff.patch.encode(), desired, True, name) == live


@pytest.mark.parametrize("live, desired, line", [
    (b"[2]\n", b"[2.0]\n", "~ root[0]: 2 -> 2.0 (int -> float)"),          # deepdiff#605
    (b"[true]\n", b"[1]\n", "~ root[0]: true -> 1 (bool -> int)"),
    (b'[{"a": 1}]\n', b'[{"a": 1.0}]\n', "~ root[0]['a']: 1 -> 1.0 (int -> float)"),  # #485
    (b'{"a": "41"}\n', b'{"a": 41}\n', "~ root['a']: \"41\" -> 41 (str -> int)"),       # #180
    (b"v: true\n", b'v: "true"\n', "~ root['v']: true -> \"true\" (bool -> str)"),
    (b"l: [1, 1, 2]\n", b"l: [1, 2]\n", "- root['l'][0]: 1"),
])
def test_type_changes_and_repeated_items_are_named(live, desired, line):
    name = "c.json" if live.startswith((b"[", b"{")) else "c.yaml"
    diff = diff_contents(name, live, desired)
    assert diff.kind == "structured" and line in diff.keys, diff.keys
    assert diff.lines  # the text diff follows


@pytest.mark.parametrize("live, desired, note", [
    (b"a: 1  # port\n", b"a: 1\n", "the same data, written differently"),
    (b"x: &p {k: 1}\ny: *p\n", b"x: {k: 1}\ny: {k: 1}\n", "the same data, written differently"),
    (b"a: 1\nb: 2\n", b"b: 2\na: 1\n", "the same data, written differently"),
    (b"a: 1\na: 2\n", b"a: 2\n", "live: duplicate key 'a' on line 2"),
    (b'{"a": 1, "a": 2}\n', b'{"a": 2}\n', "live: duplicate key 'a'"),
])
def test_a_change_outside_the_key_level_is_shown_as_text(live, desired, note):
    name = "c.json" if live.startswith(b"{") else "c.yaml"
    diff = diff_contents(name, live, desired)
    assert not diff.keys and diff.kind == "text"
    assert diff.note and note in diff.note
    assert git_apply(diff.patch.encode(), desired, True, name) == live


@pytest.mark.parametrize("name", ["deep.json", "deep.yaml"])
def test_data_nested_past_the_parsers_depth_is_shown_as_text(name):
    """json and PyYAML raise RecursionError (not their parse errors) on deep nesting; it was
    not caught, so one such file on a host ended drift --diff with an internal error."""
    deep = b"[" * 20000 + b"]" * 20000 + b"\n"
    diff = diff_contents(name, deep, b"[]\n")
    assert diff.kind == "text" and "not valid" in diff.note and diff.patch


def test_a_yaml_file_with_an_impossible_day_keeps_its_key_level_view():
    """``2026-13-01`` is a string to YAML 1.2; PyYAML 1.1's timestamp raised a bare ValueError,
    and the diff called the file 'not valid YAML' (the loader fleetctl reads its own YAML with
    already kept it a string)."""
    diff = diff_contents("a.yaml", b"d: 2026-13-01\nx: 1\n", b"d: 2026-13-01\nx: 2\n")
    assert diff.kind == "structured" and len(diff.keys) == 1 and "x" in diff.keys[0], diff
    assert "not valid" not in (diff.note or "")
