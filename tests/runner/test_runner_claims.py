"""Claimed versus actual (issue 20): the files an agent's result file claims must be the files
its run changed, or the run fails with both lists.

The cases come from how agents misreport their edits elsewhere: an edit tool that failed
("String not found in file") while the agent reported the change (anthropics/claude-code#36525,
openclaw/openclaw#129009, microsoft/vscode-copilot-release#8899); changes across more files than
the agent said (anthropics/claude-code#85783, a direct edit recorded as touching nothing:
macanderson/stella#3809); the wrong file named (Aider-AI/aider#1436); a copy edited outside the
workspace instead of the file (microsoft/vscode#331154); a file rewritten through a temporary
copy and a rename, one modified file and not two (zed-industries/zed#34412); one file under
two spellings of its path (NousResearch/hermes-agent#112278); NFC versus NFD names
(jj-vcs/jj#7243).

Pure parts first (the result file's rules, the gate as a function, Hypothesis over random
path sets and real file systems), then end-to-end runs of the scripted fake agent under a
real runner.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.runner.test_runner import REPO

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.claims import (  # noqa: E402
    CLAIMS_MAX,
    RESULT_MAX_BYTES,
    ClaimError,
    StatedResult,
    claim_path,
    parse_result,
    read_result,
    result_path,
)
from fleet_runner.gates import FAIL, PASS, SKIP, claims_gate, shown_path  # noqa: E402
from fleet_runner.snapshot import Changes, diff_snapshots, take_snapshot  # noqa: E402


def changes(added=(), modified=(), removed=()) -> Changes:
    return Changes(tuple(sorted(added)), tuple(sorted(modified)), tuple(sorted(removed)))


def stated(*files: str) -> StatedResult:
    return StatedResult("completed", "done", tuple(sorted(set(files))))


def result_bytes(files, **extra) -> bytes:
    return json.dumps({"state": "completed", "summary": "s", "files": files, **extra}).encode()


# -- the result file ------------------------------------------------------------------------

def test_a_result_file_is_read_and_its_paths_named_as_the_snapshots_name_them():
    got = parse_result(result_bytes(["./src//a.py", "src/a.py", "b.txt", "dir/./c"]))
    assert got == StatedResult("completed", "s", ("b.txt", "dir/c", "src/a.py"))
    assert parse_result(b'{"files": []}') == StatedResult(None, None, ())
    assert parse_result(b'{"state": "failed", "summary": "no"}').files is None


@pytest.mark.parametrize("data, expected", [
    (b"\xff{}", "not UTF-8 (byte 0)"),
    (b'{"files": [', "not JSON at line 1 column 12"),
    (b"[]", "an array, not an object"),
    (b"null", "null, not an object"),
    (b'{"file": ["a"]}', 'unknown key(s) "file" (the keys are state, summary, files)'),
    (b'{"state": "done"}', 'state: "done" is none of completed, failed, input-required, rejected'),
    (b'{"summary": 3}', "summary: a string, not a number"),
    (b'{"files": "a.py"}', "files: a list of paths, not a string"),
    (b'{"files": null}', "files: a list of paths, not null"),
    (b'{"files": ["a", 1]}', "files[1]: a path (a string), not a number"),
    (b'{"files": ["a", true]}', "files[1]: a path (a string), not a boolean"),
    (b'{"files": [""]}', "files[0]: an empty path"),
    (b'{"files": ["/etc/passwd"]}', 'files[0]: "/etc/passwd": an absolute path'),
    (b'{"files": ["../x"]}', "files[0]: \"../x\": a '..' part"),
    (b'{"files": ["a/../../x"]}', "a '..' part"),
    (b'{"files": ["a/../b"]}', "a '..' part"),
    (b'{"files": ["src/"]}', "ends with '/', a directory"),
    (b'{"files": ["."]}', "the workspace itself"),
    (b'{"files": ["a\\u0000b"]}', "a NUL is in no file name"),
    (b'{"files": ["a\\ud800b"]}', "a lone surrogate that stands for no byte"),
    (b'{"files": ["a\\udc41"]}', "a lone surrogate that stands for no byte"),
])
def test_a_result_file_that_cannot_be_used_is_refused_saying_why(data, expected):
    with pytest.raises(ClaimError) as caught:
        parse_result(data, "r.json")
    assert str(caught.value).startswith("r.json: ") and expected in str(caught.value)


def test_an_absolute_path_in_the_workspace_is_told_its_relative_form(tmp_path):
    """Claude Code's tools take absolute paths: an agent may well claim one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(ClaimError, match='write it relative to the workspace, "src/a.py"'):
        claim_path(f"{ws}/src/a.py", ws)
    # Outside the workspace (an attachment copy: microsoft/vscode#331154): it never counts.
    with pytest.raises(ClaimError, match="not in the workspace"):
        claim_path(f"{tmp_path}/copy/SKILL.md", ws)


def test_a_name_that_is_not_utf8_is_claimed_by_its_escapes():
    # b"caf\xe9.txt" (Latin-1): os.fsdecode names it "caf\udce9.txt", json.dumps "\\udce9".
    name = os.fsdecode(b"caf\xe9.txt")
    assert parse_result(json.dumps({"files": [name]}).encode()).files == (name,)
    # Escapes of bytes that ARE UTF-8 ("é" is C3 A9) name the file "é", as os.fsdecode does.
    assert claim_path("caf\udcc3\udca9") == "café"


def test_the_result_file_is_read_only_as_a_file_of_its_own(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text('{"files": ["a"]}')
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    with pytest.raises(ClaimError, match="a symlink, not the result file"):
        read_result(link)
    hard = tmp_path / "hard.json"
    os.link(secret, hard)
    with pytest.raises(ClaimError, match="a file with 2 links"):
        read_result(hard)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ClaimError, match="not a regular file"):
        read_result(fifo)  # never blocks
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (RESULT_MAX_BYTES + 1))
    with pytest.raises(ClaimError, match="more than the"):
        read_result(big)
    assert read_result(tmp_path / "none.json") is None
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"files": ["a"] * (CLAIMS_MAX + 1)}))
    with pytest.raises(ClaimError, match=f"more than the {CLAIMS_MAX}"):
        read_result(many)


def test_an_error_never_quotes_the_file():
    with pytest.raises(ClaimError) as caught:
        parse_result(b'{"files": ["a"], "secret-token-123": 1}')
    assert "secret-token-123" in str(caught.value)  # a key is named: the agent wrote it
    with pytest.raises(ClaimError) as caught:
        parse_result(b'secret-token-456 {"files": []}')
    assert "secret-token-456" not in str(caught.value)


def test_the_result_path_is_per_task_and_attempt(tmp_path):
    assert result_path(tmp_path, "slack:C1:2.3", 2) == tmp_path / "result-slack%3AC1%3A2.3-2.json"


# -- the gate -------------------------------------------------------------------------------

def test_an_honest_claim_passes():
    got = claims_gate(stated("a.py", "old.txt", "new.txt"),
                      changes(added=["new.txt"], modified=["a.py"], removed=["old.txt"]))
    assert got.status == PASS and got.details["claimed"] == 3


def test_a_false_claim_fails_with_both_lists():
    """The edit failed but was reported (claude-code#36525); the file edited was another
    (aider#1436)."""
    got = claims_gate(stated("BuildSystemApplication.kt"), changes(modified=["Cache.kt"]))
    assert got.status == FAIL
    assert got.details["claimed_not_changed"] == ['"BuildSystemApplication.kt"']
    assert got.details["changed_not_claimed"] == ['"Cache.kt" (modified)']
    assert "Claimed but not changed (1):\n  \"BuildSystemApplication.kt\"\n" in got.output
    assert "Changed but not claimed (1):\n  \"Cache.kt\" (modified)\n" in got.output
    assert got.summary == ('1 claimed but not changed: "BuildSystemApplication.kt"; '
                           '1 changed but not claimed: "Cache.kt"')


def test_a_hidden_change_fails():
    """Two files changed, one claimed (claude-code#85783); none claimed (stella#3809)."""
    got = claims_gate(stated("a.py"), changes(modified=["a.py", "b.py"]))
    assert got.status == FAIL and got.details["changed_not_claimed"] == ['"b.py" (modified)']
    assert "Claimed but not changed (0):\n  (none)\n" in got.output
    got = claims_gate(stated(), changes(added=["x"]))
    assert got.status == FAIL and got.details["changed_not_claimed_count"] == 1


def test_commits_count_as_changes():
    got = claims_gate(stated("a.py"), changes(), committed=["a.py", "b.py"])
    assert got.status == FAIL and got.details["changed_not_claimed"] == ['"b.py" (committed)']
    got = claims_gate(stated("a.py"), changes(modified=["a.py"]), committed=["a.py"])
    assert got.status == PASS
    got = claims_gate(stated("a.py"), changes(modified=["a.py"]), commit_error="git died")
    assert got.status == FAIL and "could not be read: git died" in got.summary


def test_no_claim_is_skipped_unless_required():
    assert claims_gate(None, changes(added=["a"])).status == SKIP
    assert claims_gate(StatedResult("completed", "s", None), changes()).status == SKIP
    got = claims_gate(None, changes(), required=True)
    assert got.status == FAIL and "no result file" in got.summary
    got = claims_gate(StatedResult("completed", "s", None), changes(), required=True)
    assert got.status == FAIL and "states no files" in got.summary
    assert claims_gate(stated(), changes(), required=True).status == PASS
    got = claims_gate(None, changes(), error="r.json: not JSON")
    assert got.status == FAIL and "r.json: not JSON" in got.output and '"files"' in got.output


def test_a_directory_and_another_spelling_are_explained():
    got = claims_gate(stated("src"), changes(added=["src/a.py", "src/b.py"]))
    assert got.details["claimed_not_changed"] == [
        '"src" (a directory: claim the files in it, 2 changed: "src/a.py", "src/b.py")']
    nfd, nfc = unicodedata.normalize("NFD", "café.md"), unicodedata.normalize("NFC", "café.md")
    got = claims_gate(stated(nfc), changes(modified=[nfd]))
    assert got.status == FAIL
    assert "another Unicode form" in got.details["claimed_not_changed"][0]
    got = claims_gate(stated("README.md"), changes(modified=["readme.md"]))
    assert "names differ in case" in got.details["claimed_not_changed"][0]


def test_odd_names_are_shown_as_json_strings_a_result_can_take_back():
    for name in ["a\nb", "tab\there", "caf\udce9", "\u2028x", 'q"uote', "back\\slash", "é"]:
        shown = shown_path(name)
        assert "\n" not in shown and "\u2028" not in shown
        assert json.loads(shown) == name
    assert shown_path("é") == '"é"'


# -- properties -----------------------------------------------------------------------------

PART = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")).map(os.fsdecode)
PATH = st.lists(PART, min_size=1, max_size=3).map("/".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(PATH, max_size=12), st.lists(PATH, max_size=12), st.lists(PATH, max_size=12),
       st.lists(PATH, max_size=12), st.data())
def test_the_gate_passes_exactly_when_the_claim_is_the_change(added, modified, removed,
                                                              committed, data):
    every = set(added) | set(modified) | set(removed) | set(committed)
    claim = data.draw(st.sets(st.sampled_from(sorted(every)) if every else st.nothing())
                      | st.just(every) | st.sets(PATH, max_size=4).map(lambda s: s | every))
    # Through the file: what an agent writes with json.dumps is read back as the same names.
    read = parse_result(json.dumps({"files": sorted(claim)}).encode())
    got = claims_gate(read, changes(set(added), set(modified) - set(added),
                                    set(removed) - set(added) - set(modified)),
                      committed=sorted(set(committed)))
    assert (got.status == PASS) == (claim == every)
    if got.status == FAIL:
        assert got.details["claimed_not_changed_count"] == len(claim - every)
        assert got.details["changed_not_claimed_count"] == len(every - claim)


@settings(max_examples=300, deadline=None)
@given(PATH)
@example("caf\udce9/x")
@example(os.fsdecode(b"\xc3\xa9"))
def test_every_snapshot_name_is_its_own_claim(path):
    assert claim_path(path) == path
    assert claim_path("./" + path.replace("/", "//")) == path


OPS = st.lists(st.tuples(st.sampled_from(["write", "remove", "rename", "chmod", "same"]),
                         st.integers(0, 7), st.integers(0, 7), st.binary(max_size=4)),
               max_size=10)
NAMES = st.lists(st.binary(min_size=1, max_size=6).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")),
    min_size=8, max_size=8, unique=True)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(NAMES, st.lists(st.booleans(), min_size=8, max_size=8), OPS, st.data())
def test_on_a_real_file_system_an_exact_claim_passes_and_any_other_fails(
        tmp_path, names, present, ops, data):
    """Random files with odd byte names; writes, deletions, renames (onto an existing file
    too), chmods, and rewrites with the same content. What changed is computed by the test
    from its own model of the files, not by the snapshot."""
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    paths = [b"d/" + n if i % 2 else n for i, n in enumerate(names)]
    os.makedirs(os.path.join(os.fsencode(ws), b"d"))
    model: dict[bytes, tuple[bytes, int]] = {}
    for p, here in zip(paths, present):
        if here:
            full = os.path.join(os.fsencode(ws), p)
            with open(full, "wb") as fh:
                fh.write(b"start " + p)
            os.chmod(full, 0o644)
            model[p] = (b"start " + p, 0o644)
    start = dict(model)
    before = take_snapshot(ws)
    for op, i, j, content in ops:
        src, dst = paths[i], paths[j]
        full, to = os.path.join(os.fsencode(ws), src), os.path.join(os.fsencode(ws), dst)
        if op == "write":
            with open(full, "wb") as fh:
                fh.write(content)
            mode = model.get(src, (b"", 0o644))[1]
            os.chmod(full, mode)
            model[src] = (content, mode)
        elif op == "same" and src in model:  # rewritten, byte for byte
            with open(full, "wb") as fh:
                fh.write(model[src][0])
        elif op == "remove" and src in model:
            os.remove(full)
            del model[src]
        elif op == "rename" and src in model and src != dst:
            os.rename(full, to)  # the zed#34412 way: onto the original
            model[dst] = model.pop(src)
        elif op == "chmod" and src in model:
            os.chmod(full, 0o755)
            model[src] = (model[src][0], 0o755)
    changed = {os.fsdecode(p) for p in set(start) | set(model) if start.get(p) != model.get(p)}
    diff = diff_snapshots(before, take_snapshot(ws))
    honest = parse_result(json.dumps({"files": sorted(changed)}).encode(), workspace=ws)
    assert claims_gate(honest, diff).status == PASS
    every = sorted({os.fsdecode(p) for p in paths})
    other = data.draw(st.sets(st.sampled_from(every)))
    assert (claims_gate(stated(*other), diff).status == PASS) == (other == changed)
