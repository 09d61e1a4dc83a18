"""The runner's gates, the classes issue 19 held back: the scope gate undoes what is out of
scope before the checks judge (their feedback never names a file that is gone); parsed
diagnostics keep their column and are listed once; an agent's output that is prose where its
command asks for a JSON result, or ends in a cut-off JSON line, never passes.

End-to-end tests replay scripts with the ``scripted`` fake agent through a real rendered
release and the real runner; the parser tests read real checkers' output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner.test_runner import FAKES, REPO, make_fleet  # noqa: F401  (a fixture)
from tests.runner.test_runner_gates import scripted  # noqa: F401  (a fixture)

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

BIN = Path(sys.executable).parent
BAD = "BAD = 1\n"  # badcheck (tests/fake_agents) reports each line holding BAD


# -- scope before check ------------------------------------------------------------------------

def test_an_out_of_scope_file_is_undone_before_the_check_judges(scripted):
    """The stray file held an error: the check failed on it and told the next attempt to fix
    a file the scope gate had already deleted, so the retry chased a ghost."""
    fleet = scripted([[{"write": "src/a.py", "text": "GOOD = 1\n"},
                       {"write": "notes/b.py", "text": BAD}, {"print": "done"}],
                      [{"print": "done"}]],
                     check=str(FAKES / "badcheck"), role={"writes": ["src/"]}, max_retries=1)
    fleet.drop("s1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first = fleet.record("s1", 1)
    assert first["failed_gates"] == ["scope"]
    check = fleet.gate("s1", 1, "check")
    # It ran after the undo: the stray file was gone, nothing to report.
    assert check["status"] == "pass" and check["details"]["exit_status"] == 0
    assert not (fleet.workspace / "notes" / "b.py").exists()
    feedback = fleet.events("start")[1]["prompt"].split("fix exactly this", 1)[1]
    assert "notes/b.py (added)" in feedback  # the scope gate's own list names it, as undone
    assert "BAD marker" not in feedback and "gate check" not in feedback
    assert fleet.record("s1", 2)["verdict"] == "pass"  # nothing left to fix
    assert fleet.where("s1") == ["done"]


def test_an_in_scope_error_is_still_judged_after_an_undo(scripted):
    fleet = scripted([[{"write": "src/a.py", "text": BAD}, {"write": "notes/b.py", "text": BAD},
                       {"print": "done"}]],
                     check=str(FAKES / "badcheck"), role={"writes": ["src/"]})
    fleet.drop("s2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.record("s2", 1)["failed_gates"] == ["check", "scope"]
    assert fleet.gate("s2", 1, "check")["details"]["new_errors"] == [
        "src/a.py:1:1: E1 BAD marker"]


# -- columns kept, each diagnostic once --------------------------------------------------------

def _parse(text: str):
    from fleet_runner.checkparse import parse_checker_output
    return parse_checker_output(text)


def test_mypy_with_error_ends_keeps_the_column_and_the_message(tmp_path):
    """``--show-error-end`` prints ``path:line:col:end_line:end_col:``: the end was read as
    the message, so ``note:`` lines counted as errors and the feedback said ``6:14: error``."""
    (tmp_path / "pkg").mkdir()
    source = 'def f() -> int:\n    x: int = "a"\n    reveal_type(x)\n    return 1\n'
    (tmp_path / "pkg" / "a.py").write_text(source)
    done = subprocess.run([str(BIN / "mypy"), "--no-incremental", "--show-column-numbers",
                           "--show-error-end", "pkg"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    parsed = _parse(done.stdout)
    assert parsed.unparsed == ()
    got = [(d.line, d.col, d.severity, d.message.split(":")[0]) for d in parsed.diagnostics]
    assert got == [(2, source.splitlines()[1].index('"a"') + 1, "error", "error"),
                   (3, source.splitlines()[2].index("reveal_type") + 1 + len("reveal_type("),
                    "note", "note")]


def test_ruffs_full_format_with_a_fix_that_adds_lines_is_parsed(tmp_path):
    """ruff's fix preview prints ``1 + import os``: an unparsed line, so the check was a fault
    (escalated) for a plain import error."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.ruff.lint]\nselect = ["I", "F"]\n')
    (tmp_path / "pkg" / "a.py").write_text("import sys\nimport os\n\nprint(os, sys)\n")
    done = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "pkg"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and " + import os" in done.stdout, done.stdout
    parsed = _parse(done.stdout)
    assert parsed.unparsed == ()
    assert [(d.path, d.line, d.col) for d in parsed.diagnostics] == [("pkg/a.py", 1, 1)]


def test_a_diagnostic_printed_twice_is_listed_once(scripted):
    """Two tools in one check, or one file reached by two paths (``pkg/a.py``, ``./pkg/a.py``),
    print one error twice: it was listed, counted and fed back twice."""
    fleet = scripted([[{"write": "pkg/a.py", "text": BAD}, {"print": "done"}]],
                     check=f"{FAKES / 'badcheck'}; {FAKES / 'badcheck'} --style dot")
    fleet.drop("d1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("d1", 1, "check")
    assert check["details"]["new_errors"] == ["pkg/a.py:1:1: E1 BAD marker"]
    assert check["details"]["new_error_count"] == 1
    assert check["output"].count("BAD marker") == 1


# -- the agent CLI's result --------------------------------------------------------------------

RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "done",
          "session_id": "s1", "usage": {"input_tokens": 1, "output_tokens": 1}}
JSON_COMMAND = ["--output-format", "json"]


@pytest.mark.parametrize("steps, why", [
    ([{"print": "All done, the task is complete."}], "no complete JSON result"),
    ([{"print": json.dumps(RESULT)[:40]}], "cut-off JSON line"),
    ([{"print": json.dumps({"type": "assistant", "message": {}})},
      {"print": json.dumps(RESULT)[:-5]}], "cut-off JSON line"),
])
def test_an_agent_sent_task_with_no_complete_result_does_not_pass(scripted, steps, why):
    fleet = scripted([steps], role={"agent_command": [str(FAKES / "scripted"), *JSON_COMMAND]})
    fleet.drop("r1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    run = fleet.gate("r1", 1, "run")
    assert run["status"] == "fail" and why in run["summary"], run["summary"]
    assert fleet.where("r1") == ["failed"]


def test_a_cut_off_json_line_fails_whatever_the_command(scripted):
    fleet = scripted([[{"print": json.dumps(RESULT)[:-3]}]])
    fleet.drop("r2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    run = fleet.gate("r2", 1, "run")
    assert run["status"] == "fail" and "cut-off JSON line" in run["summary"]


@pytest.mark.parametrize("printed", [json.dumps(RESULT),
                                     json.dumps({**RESULT, "result": "a\u2028b"},
                                                ensure_ascii=False),
                                     json.dumps({"type": "system"}) + "\n" + json.dumps(RESULT)])
def test_a_complete_result_passes(scripted, printed):
    """U+2028 is raw in a JSON string as node prints it: ``splitlines`` cut that line."""
    fleet = scripted([[{"print": printed}]],
                     role={"agent_command": [str(FAKES / "scripted"), "--output-format=json"]})
    fleet.drop("r3", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.gate("r3", 1, "run")["status"] == "pass"
    assert fleet.ledger()[0]["usage"] == RESULT["usage"]


def test_an_error_in_a_file_whose_name_holds_a_colon_is_the_agents(scripted):
    """``a:b.py:1:1: ...``: the path stopped at its first colon, the line was unparsed and the
    check a fault (escalated at once, the host's or role's) for an error in the agent's file."""
    fleet = scripted([[{"write": "pkg/a:b.py", "text": BAD}, {"print": "done"}]],
                     check=str(FAKES / "badcheck"))
    fleet.drop("k1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("k1", 1, "check")
    assert check["details"]["fault"] is False
    assert check["details"]["new_errors"] == ["pkg/a:b.py:1:1: E1 BAD marker"]
