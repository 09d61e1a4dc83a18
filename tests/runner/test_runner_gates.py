"""The gates cannot be fooled (issue 14): checker paths, the checks' leftovers, the agent CLI's
own result, standing denials, back-off, escaped processes, scope undone.

Each end-to-end test replays a script with the ``scripted`` fake agent (tests/fake_agents/,
zero model calls) through a real rendered release and the real runner process, with real
checkers (ruff and mypy from the venv, tsc from ``.tools/node``: ``scripts/setup.sh --test``
installs them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import WAIT_S
from tests.runner.test_runner import (  # noqa: F401  (make_fleet: a fixture)
    AGENT,
    FAKES,
    REPO,
    _alive,
    make_fleet,
    timed_out_after_setup,
)

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

# The pure parts are imported by the tests that use them, so that the end-to-end tests of
# this file also run against an older runner (each of them must fail there).

BIN = Path(sys.executable).parent
RUFF, MYPY = BIN / "ruff", BIN / "mypy"
TSC = REPO / ".tools" / "node" / "node_modules" / ".bin" / "tsc"
RECORDED = REPO / "tests" / "fake_agents" / "recorded"


def _need(tool: Path) -> str:
    assert tool.exists(), f"{tool} is missing: run scripts/setup.sh --test"
    return str(tool)


@pytest.fixture
def scripted(make_fleet, tmp_path):
    """A fleet whose agent replays ``attempts`` (tests/fake_agents/scripted)."""

    def make(attempts: list[list[dict]], **kw):
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"attempts": attempts}))
        env = {"FAKE_SCRIPT": str(script), **kw.pop("env", {})}
        return make_fleet("scripted", env=env, **kw)

    return make


def _result(fleet, task: str) -> dict:
    return json.loads((fleet.state / "runs" / task / "result.json").read_text())


# -- checker paths ---------------------------------------------------------------------------

LEGACY_PY = "import os\n"  # F401 in a file the task does not touch: existing debt
BAD_PY = "import sys\n\n\ndef f():\n    return 1\n"
GOOD_PY = "def f():\n    return 1\n"


def test_ruff_in_a_subdirectory_is_read_against_its_own_cwd(scripted):
    fleet = scripted([[{"write": "pkg/a.py", "text": BAD_PY}, {"print": "done"}],
                      [{"write": "pkg/a.py", "text": GOOD_PY}, {"print": "done"}]],
                     role={"checks": [{"cwd": "pkg", "command": f"{_need(RUFF)} check",
                                       "format": "ruff"}], "writes": ["pkg/*.py"]},
                     max_retries=2, workspace_files={"pkg/legacy.py": LEGACY_PY,
                                                     "pkg/pyproject.toml": ""})
    fleet.drop("c1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first = fleet.gate("c1", 1, "check")
    assert first["status"] == "fail"
    # ruff printed "a.py:1:8" from pkg/: that is the edited pkg/a.py, not existing debt.
    assert first["details"]["new_errors"] == ["pkg/a.py:1:8: F401 [*] `sys` imported but unused"]
    assert first["details"]["existing_debt"] == [
        "pkg/legacy.py:1:8: F401 [*] `os` imported but unused"]
    second_prompt = fleet.events("start")[1]["prompt"]
    feedback = second_prompt.split("fix exactly this", 1)[1]
    assert "pkg/a.py:1:8: F401" in feedback
    # Only errors in files the run edited; no summary lines, no debt.
    assert "legacy.py" not in feedback and "Found 2 errors" not in feedback
    assert "fixable" not in feedback
    # The retry passes: ruff's cache is neither in the workspace nor counted as a change.
    assert fleet.record("c1", 2)["verdict"] == "pass"
    assert fleet.gate("c1", 2, "scope")["status"] == "pass"
    assert not (fleet.workspace / "pkg" / ".ruff_cache").exists()
    assert fleet.where("c1") == ["done"]


def test_a_cd_in_a_legacy_check_cannot_file_errors_as_debt(scripted):
    # `cd pkg && ruff check` prints paths relative to pkg/: "a.py" is no file of the workspace.
    # The old gate took it for a file the task did not touch and passed broken code.
    fleet = scripted([[{"write": "pkg/a.py", "text": BAD_PY}, {"print": "done"}]],
                     check=f"cd pkg && {_need(RUFF)} check --output-format concise",
                     max_retries=2, workspace_files={"pkg/pyproject.toml": ""})
    fleet.drop("c2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("c2", 1, "check")
    assert check["status"] == "fail" and check["details"]["fault"] is True
    assert check["details"]["unplaced"] == ["a.py:1:8: F401 [*] `sys` imported but unused"]
    assert len(fleet.events("start")) == 1  # escalated at once, not retried
    [notice] = fleet.notices()
    assert notice["kind"] == "check-fault" and "cannot place" in notice["reason"]
    assert fleet.where("c2") == ["failed"]


TSCONFIG = json.dumps({"compilerOptions": {"strict": True, "noEmit": True, "pretty": True},
                       "include": ["src"]})


def test_tsc_in_its_directory_with_pretty_colour_output(scripted):
    fleet = scripted([[{"write": "web/src/a.ts", "text": 'export const x: number = "a";\n'},
                       {"print": "done"}]],
                     role={"checks": [{"cwd": "web", "command": f"{_need(TSC)} -p .",
                                       "format": "tsc"}]},
                     workspace_files={"web/tsconfig.json": TSCONFIG,
                                      "web/src/ok.ts": "export const y = 1;\n"})
    fleet.drop("c3", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("c3", 1, "check")
    out = (fleet.state / "runs" / "c3" / "attempt-1.check.out").read_text()
    assert "\x1b[" in out  # tsconfig's pretty: colours and code frames, even into a file
    assert check["status"] == "fail" and check["details"]["fault"] is False
    assert check["details"]["new_errors"] == [
        "web/src/a.ts:1:14: error TS2322: Type 'string' is not assignable to type 'number'."]
    assert "\x1b" not in check["output"]


def test_a_check_that_cannot_run_escalates_at_once(scripted):
    fleet = scripted([[{"write": "a.py", "text": GOOD_PY}, {"print": "done"}]],
                     check="ruff-is-not-installed check .", max_retries=3)
    fleet.drop("c4", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1  # not four model runs
    check = fleet.gate("c4", 1, "check")
    assert check["details"]["exit_status"] == 127 and check["details"]["fault"] is True
    [notice] = fleet.notices()
    assert notice["kind"] == "check-fault" and "cannot run" in notice["reason"]
    assert "not found" in notice["detail"]


def test_coloured_checker_output_is_read_and_fed_back_plain(scripted):
    fleet = scripted([[{"write": "pkg/mod.py", "text": "BAD = 1\n"}, {"print": "done"}],
                      [{"write": "pkg/mod.py", "text": "GOOD = 1\n"}, {"print": "done"}]],
                     check=f"{FAKES / 'badcheck'} --color", max_retries=1)
    fleet.drop("c5", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert "\x1b[" in (fleet.state / "runs" / "c5" / "attempt-1.check.out").read_text()
    check = fleet.gate("c5", 1, "check")
    assert check["status"] == "fail"
    assert check["details"]["new_errors"] == ["pkg/mod.py:1:1: E1 BAD marker"]
    assert "\x1b" not in fleet.events("start")[1]["prompt"]
    assert fleet.where("c5") == ["done"]


def test_several_checks_each_in_its_cwd(scripted):
    fleet = scripted([[{"write": "api/a.py", "text": GOOD_PY},
                       {"write": "lib/b.py", "text": "BAD = 1\n"}, {"print": "done"}]],
                     role={"checks": [
                         {"cwd": "api", "command": f"{_need(RUFF)} check", "format": "ruff"},
                         {"cwd": "lib", "command": str(FAKES / "badcheck"), "format": "gnu"}]},
                     workspace_files={"api/pyproject.toml": ""})
    fleet.drop("c6", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    checks = [g for g in fleet.record("c6", 1)["gates"] if g["name"] == "check"]
    assert [(g["details"]["cwd"], g["status"]) for g in checks] == [("api", "pass"),
                                                                    ("lib", "fail")]
    assert checks[1]["details"]["new_errors"] == ["lib/b.py:1:1: E1 BAD marker"]
    assert checks[1]["details"]["output_file"] == "attempt-1.check-2.out"


def test_mypy_cache_written_by_the_check_is_not_the_agents_change(scripted):
    # The check names its cache in the workspace explicitly; what it writes there must not
    # fail the scope gate of the retry, which only fixes pkg/a.py.
    mypy = f"{_need(MYPY)} --cache-dir .mypy_cache --ignore-missing-imports pkg"
    fleet = scripted([[{"write": "pkg/a.py", "text": "x: int = 'a'\n"}, {"print": "done"}],
                      [{"write": "pkg/a.py", "text": "x: int = 1\n"}, {"print": "done"}]],
                     check=mypy, role={"writes": ["pkg/"]}, max_retries=1)
    fleet.drop("c7", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.record("c7", 1)["verdict"] == "fail"
    assert (fleet.workspace / ".mypy_cache").is_dir()  # written by the check itself
    second = fleet.record("c7", 2)
    assert second["verdict"] == "pass", second["failed_gates"]
    assert any(p.startswith(".mypy_cache/") for p in second["check_leftovers"])
    assert not any(".mypy_cache" in p for p in second["changes"]["added"])


def test_an_error_the_change_causes_in_a_file_it_did_not_touch_fails(scripted):
    """Changing what ``foo`` returns breaks its caller in b.py, which the task did not touch:
    that error was not there at the baseline, so it is the change's, not existing debt (found
    by a tryout: it passed as debt). The legacy error in old.py still is debt."""
    mypy = f"{_need(MYPY)} --cache-dir=/dev/null --ignore-missing-imports ."
    fleet = scripted([[{"write": "a.py", "text": "def foo() -> str:\n    return 'x'\n"},
                       {"print": "done"}],
                      [{"write": "a.py", "text": "def foo() -> int:\n    return 2\n"},
                       {"print": "done"}]],
                     check=mypy, max_retries=1, workspace_files={
                         "a.py": "def foo() -> int:\n    return 1\n",
                         "b.py": "from a import foo\n\nx: int = foo()\n",
                         "old.py": "y: int = 'legacy'\n"})
    fleet.drop("c9", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first = fleet.gate("c9", 1, "check")
    assert first["status"] == "fail"
    [caused] = first["details"]["caused_errors"]
    assert caused.startswith("b.py:3:") and "Incompatible types" in caused
    assert first["details"]["existing_debt_count"] == 2  # b.py's new one and old.py's
    second_prompt = fleet.events("start")[1]["prompt"]
    assert "not there when the task started" in second_prompt and "b.py:3:" in second_prompt
    second = fleet.gate("c9", 2, "check")
    assert second["status"] == "pass" and "existing debt: 1 error(s)" in second["summary"]
    assert fleet.where("c9") == ["done"]


def test_a_check_that_fails_on_warnings_alone_fails_on_them(scripted):
    """shellcheck -f gcc (or eslint --max-warnings 0) exits 1 on warnings: in a file the task
    wrote they are what failed, not "0 errors of existing debt" (found by a tryout)."""
    check = ("printf '%s\\n' 'run.sh:1:4: warning: Use \"${var:?}\" to fail if empty "
             "[SC2115]'; exit 1")
    fleet = scripted([[{"write": "run.sh", "text": "rm -rf $var/\n"}, {"print": "done"}]],
                     role={"checks": [{"command": check, "format": "gnu"}]})
    fleet.drop("w1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    gate = fleet.gate("w1", 1, "check")
    assert gate["status"] == "fail" and "1 error(s) in files this task changed" in gate["summary"]
    assert "run.sh:1:4: warning: Use" in gate["output"]
    assert fleet.where("w1") == ["failed"]


def test_a_cache_file_the_agent_writes_itself_is_its_change(scripted):
    """Only what the checks wrote is their leftover: a ``pytest.pyc`` the agent planted (which
    ``python -m pytest`` would run instead of pytest) is the agent's change, outside its scope,
    and undone (found by a tryout: it was taken for a check's leftover and kept)."""
    fleet = scripted([[{"write": "src/a.py", "text": "x = 1\n"},
                       {"write": "pytest.pyc", "text": "planted\n"},
                       {"write": "src/__pycache__/a.cpython-311.pyc", "text": "also\n"},
                       {"print": "done"}]],
                     role={"checks": [{"command": "python3 -c 'import sys'", "format": "exit"}],
                           "writes": ["src/*.py"]})
    fleet.drop("l1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    record = fleet.record("l1", 1)
    assert record["failed_gates"] == ["scope"]
    assert record["check_leftovers"] == []
    assert sorted(fleet.gate("l1", 1, "scope")["details"]["outside"]) == [
        "pytest.pyc (added)", "src/__pycache__/a.cpython-311.pyc (added)"]
    assert not (fleet.workspace / "pytest.pyc").exists()  # undone


def test_a_checker_config_the_agent_writes_in_its_home_does_not_reach_the_check(scripted):
    """``~/.config/mypy/config`` with ``ignore_errors`` silenced mypy for this task and every
    later one (found by a tryout): each check run has a new, empty HOME."""
    mypy = f"{_need(MYPY)} --ignore-missing-imports ."
    fleet = scripted([[{"write": "$HOME/.config/mypy/config",
                        "text": "[mypy]\nignore_errors = True\n"},
                       {"write": "a.py", "text": "x: int = 'a'\n"}, {"print": "done"}]],
                     check=mypy)
    fleet.drop("h1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    gate = fleet.gate("h1", 1, "check")
    assert gate["status"] == "fail" and "a.py:1:" in gate["output"]
    assert list((fleet.state / "check-runs").iterdir()) == []  # each run's directory removed


def test_warnings_that_were_there_at_the_baseline_stay_debt_once_the_errors_are_fixed(
        scripted):
    """At the baseline the check fails on an error (a.sh) and also warns about legacy.sh; the
    agent fixes a.sh, and the check then fails on the old warning alone: debt, not the
    change's (a review found it blamed on the agent)."""
    check = ("if grep -q bad a.sh; then echo 'a.sh:1:1: error: bad'; fi; "
             "echo 'legacy.sh:2:1: warning: old'; exit 1")
    fleet = scripted([[{"write": "a.sh", "text": "good\n"}, {"print": "done"}]],
                     role={"checks": [{"command": check, "format": "gnu"}]},
                     workspace_files={"a.sh": "bad\n", "legacy.sh": "x\ny\n"})
    fleet.drop("w2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    gate = fleet.gate("w2", 1, "check")
    assert gate["status"] == "pass" and "existing debt" in gate["summary"], gate
    assert fleet.where("w2") == ["done"]


def test_a_file_named_check_runs_in_the_state_is_not_followed(scripted):
    """A dangling symlink where the check runs' directory goes (one user: the agent can
    write the state) was a crash on every start; it is removed, never followed."""
    fleet = scripted([[{"write": "a.txt", "text": "x\n"}, {"print": "done"}]],
                     role={"checks": [{"command": "true", "format": "exit"}]})
    fleet.state.mkdir(parents=True, exist_ok=True)
    (fleet.state / "check-runs").symlink_to("/nonexistent/elsewhere")
    fleet.drop("s1", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("s1") == ["done"]
    assert (fleet.state / "check-runs").is_dir() and not (fleet.state / "check-runs").is_symlink()


def test_role_declared_check_leftovers_are_not_changes(scripted):
    check = "mkdir -p build && date +%s%N > build/stamp && test -f src/ok"
    fleet = scripted([[{"write": "src/a.txt", "text": "a\n"}, {"print": "done"}],
                      [{"write": "src/ok", "text": "ok\n"}, {"print": "done"}]],
                     role={"checks": [{"command": check, "format": "exit"}], "writes": ["src/"],
                           "check_leftovers": ["build/"]}, max_retries=1)
    fleet.drop("c8", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.record("c8", 1)["failed_gates"] == ["check"]  # format exit: its status
    second = fleet.record("c8", 2)  # build/stamp, the first check's, is no change of the run
    assert second["verdict"] == "pass", second["failed_gates"]
    assert second["check_leftovers"] == ["build/stamp"]


# -- the parser and placement (pure) ----------------------------------------------------------


def test_eslint_stylish_is_parsed():
    from fleet_runner.checkparse import ERROR, WARNING, parse_checker_output

    parsed = parse_checker_output((RECORDED / "eslint_stylish.txt").read_text("utf-8"))
    got = [(d.path, d.line, d.col, d.severity) for d in parsed.diagnostics]
    assert got == [("/tmp/rec/src/a.js", 1, 5, ERROR), ("/tmp/rec/src/a.js", 2, 5, ERROR),
                   ("/tmp/rec/src/a.js", 2, 5, WARNING), ("/tmp/rec/src/a.js", 2, 9, ERROR)]
    assert parsed.unparsed == ()


def test_tsc_pretty_is_parsed():
    from fleet_runner.checkparse import ERROR, parse_checker_output

    parsed = parse_checker_output((RECORDED / "tsc_pretty.txt").read_text("utf-8"))
    assert [(d.path, d.line, d.col, d.severity) for d in parsed.diagnostics] == [
        ("src/a.ts", 1, 7, ERROR), ("src/a.ts", 2, 40, ERROR)]
    assert parsed.diagnostics[0].message.startswith("error TS2322")
    assert parsed.unparsed == ()


def test_a_stylish_row_without_a_file_is_unparsed():
    from fleet_runner.checkparse import parse_checker_output

    parsed = parse_checker_output("  1:5  error  'x' is never used  no-unused-vars\n")
    assert parsed.diagnostics == () and len(parsed.unparsed) == 1


def test_placement_of_printed_paths(tmp_path):
    from fleet_runner.checkparse import place

    ws = tmp_path / "ws"
    (ws / "web" / "src").mkdir(parents=True)
    (ws / "web" / "src" / "a.ts").write_text("x\n")
    (tmp_path / "outside.py").write_text("x\n")
    os.symlink(tmp_path / "outside.py", ws / "escape.py")
    cwd = str(ws / "web")
    want = {"web/src/a.ts"}
    for shown in ("src/a.ts", "./src/a.ts", "src\\a.ts", ".\\src\\a.ts",
                  str(ws / "web" / "src" / "a.ts"), "../web/src/a.ts"):
        assert place(shown, cwd, str(ws)) == want, shown
    for shown in ("a.ts", "../../outside.py", str(tmp_path / "outside.py"), "/etc/passwd",
                  "C:\\src\\a.ts", "../escape.py"):
        assert place(shown, cwd, str(ws)) is None, shown


# -- the agent CLI's own result ---------------------------------------------------------------

DENIED_RESULT = {"type": "result", "subtype": "success", "is_error": False,
                 "result": "I could not run the command.", "session_id": "s-1",
                 "permission_denials": [{"tool_name": "Bash", "tool_use_id": "t1",
                                         "tool_input": {"command": "rm -rf build"}}],
                 "usage": {"input_tokens": 10, "output_tokens": 2}}


def test_a_denial_in_the_agent_clis_result_stops_at_once_and_stands(scripted):
    fleet = scripted([[{"result": DENIED_RESULT}]], max_retries=3)
    fleet.drop("d1", kind="agent", channel=None)
    fleet.drop("d2", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert [s["task"] for s in fleet.events("start")] == ["d1"]  # no retry, d2 not started
    record = fleet.record("d1", 1)
    assert record["verdict"] == "denied"
    assert [(d["what"], d["source"]) for d in record["denials"]] == [("Bash rm -rf build",
                                                                      "result")]
    [notice] = fleet.notices()
    assert notice["kind"] == "denied" and "tool:Bash" in notice["reason"]
    assert "--clear-denial tool:Bash" in notice["reason"]
    assert fleet.where("d2") == ["inbox"]  # waits for a person
    listed = subprocess.run(fleet.argv("--list-denials"), env=fleet.env(), capture_output=True,
                            text=True, timeout=WAIT_S)
    assert [d["permission"] for d in json.loads(listed.stdout)] == ["tool:Bash"]
    again = fleet.run()  # still held
    assert again.returncode == 0 and fleet.where("d2") == ["inbox"]
    assert "standing denial(s) tool:Bash" in again.stderr
    # The command the runner names works as printed: fleet-runner is on no PATH on a host.
    printed = again.stderr.split("(messages wait in the inbox): ", 1)[1].splitlines()[0]
    runner = fleet.root / "current" / "runner" / "bin" / "fleet-runner"
    assert printed == (f"{runner} --agent {AGENT} --root {fleet.root} "
                       f"--clear-denial PERMISSION")
    assert printed.replace("PERMISSION", "tool:Bash") in notice["reason"]
    cleared = subprocess.run(shlex.split(printed.replace("PERMISSION", "tool:Bash")),
                             env=fleet.env(), capture_output=True, text=True, timeout=WAIT_S)
    assert cleared.returncode == 0, cleared.stderr
    # The same script denies again: d2 runs now, and is stopped by its own denial.
    assert fleet.run().returncode == 0
    assert [s["task"] for s in fleet.events("start")] == ["d1", "d2"]
    assert fleet.where("d2") == ["failed"]


def test_the_clear_commands_work_as_pasted_with_odd_paths_and_a_state_dir(scripted, tmp_path):
    """The escalation, the standing-denial file and the log line each name a command that works
    pasted into a shell: the root's path holds a space and the word PERMISSION (only the last
    argument is the permission), and the runner's --state-dir is not the default one."""
    base = tmp_path / "PERMISSION dir"
    fleet = scripted([[{"result": DENIED_RESULT}]], base=base)
    state = base / "elsewhere" / "a1-state"
    state.mkdir(parents=True)
    fleet.state.parent.mkdir(parents=True, exist_ok=True)
    fleet.state.symlink_to(state)  # the test's helpers read it there; the runner is told
    fleet.runner_args = ("--state-dir", str(state))
    fleet.drop("d9", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    [notice] = fleet.notices()
    in_notice = notice["reason"].split("clears each: ", 1)[1].splitlines()[0]
    [standing] = [json.loads(p.read_text()) for p in (state / "standing-denials").iterdir()]
    held = fleet.run()
    in_log = held.stderr.split("(messages wait in the inbox): ", 1)[1].splitlines()[0]
    runner = fleet.root / "current" / "runner" / "bin" / "fleet-runner"
    expected = [str(runner), "--agent", AGENT, "--root", str(fleet.root),
                "--state-dir", str(state), "--clear-denial"]
    assert shlex.split(in_log) == [*expected, "PERMISSION"]
    assert shlex.split(in_notice) == shlex.split(standing["clear"]) == [*expected, "tool:Bash"]
    cleared = subprocess.run(in_notice, shell=True, env=fleet.env(), capture_output=True,
                             text=True, timeout=WAIT_S)
    assert cleared.returncode == 0, cleared.stderr
    assert list((state / "standing-denials").iterdir()) == []


@pytest.mark.parametrize("last", ["denied", "error"])
def test_the_agent_clis_result_inside_a_json_array_is_read(scripted, last):
    """``claude -p --output-format json`` prints the session as one JSON array, the result
    last, with ``--verbose`` or ``viewMode: verbose`` in a settings file the agent may write
    (anthropics/claude-code#84784): its denials and its error count as in a lone result."""
    result = DENIED_RESULT if last == "denied" else {
        **DENIED_RESULT, "is_error": True, "subtype": "error_during_execution",
        "permission_denials": []}
    printed = json.dumps([{"type": "system", "subtype": "init", "session_id": "s-1"},
                          {"type": "assistant", "message": {"content": []}}, result])
    fleet = scripted([[{"print": printed}]], max_retries=1)
    fleet.drop("j1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    record = fleet.record("j1", 1)
    if last == "denied":
        assert record["verdict"] == "denied"
        assert [d["permission"] for d in record["denials"]] == ["tool:Bash"]
        assert len(fleet.events("start")) == 1  # stopped at once, not retried
    else:
        assert fleet.gate("j1", 1, "run")["status"] == "fail"
        assert fleet.where("j1") == ["failed"]


def test_a_name_that_is_not_utf8_outside_the_scope_is_fed_back_escaped(scripted):
    """The scope gate names it in the next attempt's prompt: written escaped (a review found
    the prompt's write raised, on every start)."""
    fleet = scripted([[{"write": "notes/bad\udcffname.txt", "text": "x\n"}, {"print": "done"}],
                      [{"print": "done"}]], role={"writes": ["src/"]}, max_retries=1)
    fleet.drop("u3", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.record("u3", 1)["failed_gates"] == ["scope"]
    assert "notes/bad\\udcffname.txt" in fleet.events("start")[1]["prompt"]
    assert fleet.where("u3") == ["done"]


def test_a_file_name_that_is_not_utf8_is_recorded_not_a_crash(scripted):
    """An agent may create any byte string as a name. The records hold it escaped, and the
    runner goes on (before: UnicodeEncodeError while writing the run record, then on every
    start, the task stuck in processing/)."""
    fleet = scripted([[{"write": "src/bad\udcffname.txt", "text": "x\n"}, {"print": "done"}]],
                     role={"writes": ["src/"]})
    fleet.drop("u1", kind="agent", channel=None)
    fleet.drop("u2", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("u1") == ["done"] and fleet.where("u2") == ["done"]
    record = fleet.record("u1", 1)
    assert record["verdict"] == "pass"
    assert record["changes"]["added"] == ["src/bad\udcffname.txt"]  # the byte, escaped
    assert (fleet.workspace / "src").exists() and os.listdir(
        os.fsencode(fleet.workspace / "src")) == [b"bad\xffname.txt"]


def test_a_denial_only_in_the_saved_transcript_stops_the_task(scripted, tmp_path):
    home = tmp_path / "home"
    refused = {"type": "user", "message": {"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "t9", "is_error": True,
        "content": "Claude requested permissions to use WebFetch, but you haven't granted "
                   "it yet."}]}}
    result = {"type": "result", "subtype": "success", "is_error": False, "result": "ok",
              "session_id": "abc-123"}
    fleet = scripted([[{"transcript": "~/.claude/projects/-ws/abc-123.jsonl",
                        "lines": [refused]}, {"result": result}]],
                     max_retries=2, env={"HOME": str(home)})
    fleet.drop("d3", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1
    record = fleet.record("d3", 1)
    assert record["verdict"] == "denied"
    assert [(d["permission"], d["source"]) for d in record["denials"]] == [
        ("tool:WebFetch", "transcript")]


@pytest.mark.parametrize("steps, why", [
    ([{"write": "a.txt", "text": "x\n"},
      {"result": {"type": "result", "subtype": "error_during_execution", "is_error": True,
                  "result": ""}}], "is_error: true"),
    ([{"write": "a.txt", "text": "x\n"}], "printed nothing"),
])
def test_an_agent_cli_error_or_no_output_never_passes(scripted, steps, why):
    fleet = scripted([steps], max_retries=0)
    fleet.drop("e1", kind="agent", channel=None)  # from another agent: no anti-silence gate
    assert fleet.run().returncode == 0
    run_gate = fleet.gate("e1", 1, "run")
    assert run_gate["status"] == "fail" and why in run_gate["summary"]
    assert fleet.where("e1") == ["failed"]


def test_agent_report_reads_stream_json_and_a_whole_json_document(tmp_path):
    from fleet_runner.agentresult import read_agent_report

    out = tmp_path / "out"
    out.write_text(json.dumps(DENIED_RESULT, indent=2))  # pretty-printed: one document
    report = read_agent_report(out, {"HOME": str(tmp_path)})
    assert report.result and not report.is_error and report.session_id == "s-1"
    assert [d["permission"] for d in report.denials] == ["tool:Bash"]
    refused = {"type": "user", "message": {"content": [{
        "type": "tool_result", "is_error": True,
        "content": [{"type": "text", "text": "Permission to use Bash with command rm -rf / "
                                             "has been denied."}]}]}}
    out.write_text(json.dumps({"type": "system"}) + "\n" + json.dumps(refused) + "\n"
                   + json.dumps({"type": "result", "is_error": True, "result": "x"}) + "\n")
    report = read_agent_report(out, {})
    assert report.is_error
    assert [(d["permission"], d["source"]) for d in report.denials] == [
        ("tool:Bash", "stdout-transcript")]


# -- retries -----------------------------------------------------------------------------------


def test_retries_back_off_and_the_escalation_lists_every_attempt(scripted):
    fleet = scripted([[{"print": "done"}, {"exit": 1}],
                      [{"write": "pkg/mod.py", "text": "BAD = 1\n"}, {"print": "done"}],
                      [{"print": ""}]],
                     check=str(FAKES / "badcheck"), max_retries=2)
    fleet.drop("b1", kind="agent", channel=None)
    assert fleet.run("--retry-backoff-s", "0.15").returncode == 0
    times = [s["time"] for s in fleet.events("start")]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.15 and times[2] - times[1] >= 0.3  # doubled
    [notice] = fleet.notices()
    lines = notice["reason"].split("Attempts:\n", 1)[1].splitlines()
    assert lines[0].startswith("  1: fail: run: the agent command exited with status 1")
    assert lines[1].startswith("  2: fail: check: 1 error(s) in files this task changed")
    assert lines[2].startswith("  3: fail: run:") and "printed nothing" in lines[2]


# -- scope enforced ----------------------------------------------------------------------------

CFG = b"port = 8080\r\nname = \xc3\xa9\n"  # bytes, CRLF and UTF-8 kept exactly


def test_out_of_scope_changes_and_mode_changes_are_undone_and_read_back(scripted):
    fleet = scripted([[{"chmod": "tools/run.sh", "mode": "4755"},
                       {"write": "conf/app.cfg", "text": "port = 1\n"},
                       {"remove": "conf/keep.txt"},
                       {"write": "new/x.txt", "text": "stray\n"},
                       {"write": "src/a.txt", "text": "in scope\n"}, {"print": "done"}]],
                     role={"writes": ["src/"]})
    for rel, data in (("tools/run.sh", b"#!/bin/sh\necho hi\n"), ("conf/app.cfg", CFG),
                      ("conf/keep.txt", b"keep\n")):
        (fleet.workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (fleet.workspace / rel).write_bytes(data)
        os.chmod(fleet.workspace / rel, 0o640)
    fleet.drop("u1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    scope = fleet.gate("u1", 1, "scope")
    assert scope["status"] == "fail"
    assert scope["details"]["outside"] == ["conf/app.cfg (modified)", "conf/keep.txt (removed)",
                                           "new/x.txt (added)", "tools/run.sh (modified)"]
    assert sorted(scope["details"]["undone"]) == ["conf/app.cfg", "conf/keep.txt", "new/x.txt",
                                                  "tools/run.sh"]
    ws = fleet.workspace
    assert (ws / "tools" / "run.sh").stat().st_mode & 0o7777 == 0o640  # setuid gone
    assert (ws / "conf" / "app.cfg").read_bytes() == CFG
    assert (ws / "conf" / "app.cfg").stat().st_mode & 0o7777 == 0o640
    assert (ws / "conf" / "keep.txt").read_bytes() == b"keep\n"
    assert not (ws / "new" / "x.txt").exists()
    assert (ws / "src" / "a.txt").read_text() == "in scope\n"  # in scope: kept


def test_a_mode_change_alone_is_a_change(scripted):
    fleet = scripted([[{"chmod": "bin/tool", "mode": "4755"}, {"print": "done"}]],
                     role={"writes": ["src/"]}, workspace_files={"bin/tool": "#!/bin/sh\n"})
    os.chmod(fleet.workspace / "bin" / "tool", 0o755)
    fleet.drop("u2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    record = fleet.record("u2", 1)
    assert record["changes"]["modified"] == ["bin/tool"]
    assert record["failed_gates"] == ["scope"]
    assert (fleet.workspace / "bin" / "tool").stat().st_mode & 0o7777 == 0o755


# -- processes contained -----------------------------------------------------------------------


def test_a_grandchild_that_calls_setsid_is_killed_and_recorded(scripted):
    fleet = scripted([[{"escape": 300}, {"write": "a.txt", "text": "x\n"}, {"print": "done"}]])
    fleet.drop("p1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    escaped = fleet.wait_for("escaped", timeout=0)
    assert not _alive(escaped["grandchild"])  # killed and reaped, not a zombie
    record = fleet.record("p1", 1)
    assert record["verdict"] == "pass"
    [start] = fleet.events("start")  # non-interactive: CI=1, no terminal
    assert start["env"]["CI"] == "1" and start["tty"] is False
    assert [k["pid"] for k in record["invocation"]["escaped_killed"]] == [escaped["grandchild"]]
    assert "os.setsid()" in record["invocation"]["escaped_killed"][0]["cmd"]


def test_an_escaped_grandchild_of_a_timed_out_run_is_killed(scripted, tmp_path):
    # The grandchild must have left the group before the timeout ends the run.
    fleet, escaped = timed_out_after_setup(
        lambda base, limit: scripted([[{"escape": 300}, {"sleep": 600}]], timeout_s=limit,
                                     base=base), "escaped", tmp_path, "p2")
    assert not _alive(escaped["grandchild"])
    invocation = fleet.record("p2", 1)["invocation"]
    assert invocation["timed_out"] is True
    assert [k["pid"] for k in invocation["escaped_killed"]] == [escaped["grandchild"]]


def test_a_scope_request_is_decided_by_rules_and_a_grant_counts_from_the_next_attempt(
        scripted):
    request = {"paths": ["docs/api.md", "docs/early.md", "secrets/key.txt", "docs/*.md"],
               "why": "the change needs its doc"}
    fleet = scripted([[{"write": "src/a.txt", "text": "a\n"},
                       {"write": "docs/early.md", "text": "written before asking\n"},
                       {"write": "$FLEET_SCOPE_REQUEST", "text": json.dumps(request)},
                       {"print": "asked"}],
                      [{"write": "docs/api.md", "text": "api\n"}, {"print": "done"}]],
                     role={"writes": ["src/"], "scope_requests": ["docs/", "*.md"]},
                     max_retries=1)
    fleet.drop("q1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first_prompt, second_prompt = (s["prompt"] for s in fleet.events("start"))
    assert "Write scope: you may change only src/" in first_prompt
    assert "FLEET_SCOPE_REQUEST" not in first_prompt  # the real path is given
    assert str(fleet.state / "runs" / "q1" / "scope-request.json") in first_prompt
    first = fleet.record("q1", 1)
    assert first["scope_request"]["granted"] == ["docs/api.md"]
    assert [(d["path"], d["why"].split(":")[0]) for d in first["scope_request"]["denied"]] == [
        ("docs/early.md", "this task already changed it"),
        ("secrets/key.txt", "not among the paths this role lets an agent ask for (scope_requests)"),
        ("docs/*.md", "not a literal path relative to the workspace (no wildcard, no ..)")]
    assert first["failed_gates"] == ["scope"]  # docs/early.md: written before it was asked
    assert not (fleet.workspace / "docs" / "early.md").exists()  # undone
    assert "the paths granted on request: docs/api.md" in second_prompt
    assert fleet.record("q1", 2)["verdict"] == "pass"
    assert (fleet.workspace / "docs" / "api.md").read_text() == "api\n"


def test_denied_scope_requests_are_in_the_escalation(scripted):
    fleet = scripted([[{"write": "$FLEET_SCOPE_REQUEST",
                        "text": json.dumps({"paths": ["etc/app.conf"], "why": "x"})},
                       {"print": "asked"}, {"exit": 1}]],
                     role={"writes": ["src/"]}, max_retries=0)
    fleet.drop("q2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    [notice] = fleet.notices()
    assert "Scope requests denied:" in notice["reason"]
    assert "etc/app.conf: this role grants no scope on request" in notice["reason"]


def _host_offers_a_cgroup() -> bool:
    """Whether this process may create a cgroup2 below its own (read from /proc here)."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    mount = next((ln.split()[4] for ln in mounts if " - cgroup2 " in ln), None)
    own = next((ln[3:].strip() for ln in Path("/proc/self/cgroup").read_text().splitlines()
                if ln.startswith("0::")), None)
    if mount is None or own is None:
        return False
    probe = os.path.join(mount, own.lstrip("/"), f"t14-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    os.rmdir(probe)
    return True


def _run_cgroups(fleet) -> set[str]:
    """The run cgroups of this fleet's agent, by the name docs/runner.md gives them
    (``fleet-run-AGENT-STATE-…``, STATE: 8 hex digits of the sha256 of the state directory):
    runs of other fleets (another test process) may come and go meanwhile."""
    mount = next((ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                  if " - cgroup2 " in ln), None)
    if mount is None:
        return set()
    state = hashlib.sha256(os.fsencode(os.path.abspath(fleet.state))).hexdigest()[:8]
    return {os.path.join(d, n) for d, dirs, _ in os.walk(mount) for n in dirs
            if n.startswith(f"fleet-run-{AGENT}-{state}-")}


def test_a_run_is_contained_in_its_own_cgroup_where_the_host_offers_one(scripted):
    fleet = scripted([[{"escape": 300}, {"print": "done"}]])
    fleet.drop("p3", kind="agent", channel=None)
    before = _run_cgroups(fleet)
    assert fleet.run().returncode == 0
    escaped = fleet.wait_for("escaped", timeout=0)
    assert not _alive(escaped["grandchild"])
    invocation = fleet.record("p3", 1)["invocation"]
    assert invocation["containment"] == ("cgroup" if _host_offers_a_cgroup() else "process-tree")
    assert [k["pid"] for k in invocation["escaped_killed"]] == [escaped["grandchild"]]
    assert not (_run_cgroups(fleet) - before)  # each run's cgroup is removed once empty


@pytest.mark.skipif(not _host_offers_a_cgroup(), reason="the host offers no cgroup2 to create")
def test_what_escaped_a_runner_that_died_is_ended_by_its_next_start(scripted):
    import signal as _signal

    fleet = scripted([[{"escape": 300}, {"sleep": 60}], [{"print": "done"}]], max_retries=1)
    fleet.drop("p4", kind="agent", channel=None)
    runner = fleet.start()
    escaped = fleet.wait_for("escaped")
    runner.send_signal(_signal.SIGKILL)  # no cleanup at all
    runner.wait(timeout=WAIT_S)
    assert _alive(escaped["grandchild"])  # out of the group, its runner gone
    again = fleet.run()
    assert again.returncode == 0, again.stderr
    assert not _alive(escaped["grandchild"])
    assert "removed the run cgroup fleet-run-a1-" in again.stderr
    # Both were still in the dead runner's cgroup: the agent (asleep) and its grandchild.
    assert "(2 process(es) killed in it)" in again.stderr
    assert fleet.where("p4") == ["done"]


@pytest.mark.skipif(not _host_offers_a_cgroup(), reason="the host offers no cgroup2 to create")
def test_a_runner_sweeps_only_its_own_roots_run_cgroups(tmp_path):
    """Two roots on one machine with an agent of the same name (two fleets, or two test runs at
    once): a runner sweeps the dead runs of its own state directory, never the other's. (Before,
    cgroups were named by the agent alone, and one root's runner swept the other's, so the
    other's next start found nothing left to end.)"""
    import subprocess as _subprocess

    from fleet_runner import cgroup

    dead = _subprocess.Popen(["true"])
    dead.wait()  # a pid whose runner is gone
    mine = cgroup.owner_key("a1", tmp_path / "one" / "state" / "a1")
    other = cgroup.owner_key("a1", tmp_path / "two" / "state" / "a1")
    assert mine != other and mine.startswith("a1-") and len(mine) == len("a1-") + 8
    where = cgroup.base()
    assert where is not None
    left = where / f"{cgroup.PREFIX}{mine}-{dead.pid}-1"
    os.mkdir(left)
    try:
        assert cgroup.sweep(other) == [] and left.is_dir()
        swept = cgroup.sweep(mine)
        assert [s["cgroup"] for s in swept] == [left.name] and not left.exists()
    finally:
        if left.exists():
            os.rmdir(left)


def test_a_refused_tool_call_is_named_by_the_tool_use_it_answers(tmp_path):
    from fleet_runner.agentresult import read_agent_report

    lines = [
        {"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Write",
             "input": {"file_path": "/etc/hosts"}}]}},
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": "Claude requested permissions to write to /etc/hosts, but you "
                        "haven't granted it yet."}]}},
        {"type": "user", "message": {"content": [  # an ordinary failure: not a denial
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": "Exit code 1: no such file"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "done"}]
    out = tmp_path / "out"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = read_agent_report(out, {})
    assert [(d["permission"], d["source"]) for d in report.denials] == [
        ("tool:Write", "stdout-transcript")]


def test_a_check_directory_the_task_removed_is_a_failure_not_a_fault(scripted):
    fleet = scripted([[{"remove": "lib"}, {"print": "done"}],
                      [{"write": "lib/b.py", "text": "GOOD = 1\n"}, {"print": "done"}]],
                     role={"checks": [{"cwd": "lib", "command": str(FAKES / "badcheck"),
                                       "format": "gnu"}]},
                     max_retries=1, workspace_files={"lib/b.py": "GOOD = 0\n"})
    fleet.drop("c9", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first = fleet.gate("c9", 1, "check")
    assert first["status"] == "fail" and first["details"]["fault"] is False
    assert "this task removed its directory lib" in first["summary"]
    assert fleet.record("c9", 2)["verdict"] == "pass"  # retried, and put back
    assert fleet.where("c9") == ["done"]
