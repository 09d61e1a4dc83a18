"""The checker-output parser on real recorded output of each tool whose format it claims.

The recordings are in tests/fake_agents/recorded/ (README there: tool, version, command). The
expected diagnostics below were written down by hand from reading those files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.checkparse import (ERROR, NOTE, WARNING, parse_checker_output,  # noqa: E402
                                     path_keys)
from fleet_runner.gates import classify  # noqa: E402

RECORDED = REPO / "tests" / "fake_agents" / "recorded"
E, W, N = ERROR, WARNING, NOTE

EXPECTED = {
    "ruff_concise": [("pkg/a.py", 1, 8, E), ("pkg/a.py", 2, 8, E), ("pkg/a.py", 6, 5, E),
                     ("pkg/a.py", 7, 12, E)],
    "ruff_full": [("pkg/a.py", 1, 8, E), ("pkg/a.py", 2, 8, E), ("pkg/a.py", 6, 5, E),
                  ("pkg/a.py", 7, 12, E)],
    "ruff_clean": [],
    "flake8": [("./b.py", 2, 13, E), ("./pkg/a.py", 1, 1, E), ("./pkg/a.py", 2, 1, E),
               ("./pkg/a.py", 6, 5, E), ("./pkg/a.py", 7, 12, E)],
    "pyflakes": [("./pkg/a.py", 1, 1, E), ("./pkg/a.py", 2, 1, E), ("./pkg/a.py", 6, 5, E),
                 ("./pkg/a.py", 7, 12, E)],
    "mypy": [("b.py", 1, None, E), ("pkg/a.py", 6, None, E), ("pkg/a.py", 7, None, E),
             ("pkg/a.py", 7, None, E)],
    "mypy_col": [("pkg/a.py", 6, 14, E), ("pkg/a.py", 7, 12, E)],
    "mypy_clean": [],
    "gcc": [("src/m.c", 4, 5, E), ("src/m.c", 5, 12, W), ("src/m.c", 4, 9, W),
            ("src/m.c", 3, 9, W)],
    "gcc_include": [("src/h.h", 1, 24, E), ("src/h.h", 1, 24, N)],
    "eslint": [("/tmp/rec/src/a.js", 1, 7, E), ("/tmp/rec/src/a.js", 2, 5, E),
               ("/tmp/rec/src/a.js", 2, 5, W), ("/tmp/rec/src/a.js", 2, 9, E)],
    "tsc": [("src/a.ts", 1, 5, E), ("src/a.ts", 2, 33, E)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_output_parses_to_the_expected_diagnostics(name):
    parsed = parse_checker_output((RECORDED / f"{name}.txt").read_text("utf-8"))
    got = [(d.path, d.line, d.col, d.severity) for d in parsed.diagnostics]
    assert got == EXPECTED[name]
    assert parsed.unparsed == ()  # every other line is known context or a summary


def test_messages_are_kept_whole():
    ruff = parse_checker_output((RECORDED / "ruff_full.txt").read_text("utf-8"))
    assert ruff.diagnostics[0].message == "F401 [*] `os` imported but unused"
    assert ruff.diagnostics[0].format == "arrow"
    tsc = parse_checker_output((RECORDED / "tsc.txt").read_text("utf-8"))
    assert tsc.diagnostics[0].message.startswith("error TS2322: Type 'string'")
    assert tsc.diagnostics[0].format == "paren"


def test_a_failing_test_run_is_not_a_diagnostic_format():
    # pytest's failure report leaves lines the parser does not know: the gate fails on them
    # instead of calling a failing test in an untouched test file "existing debt".
    parsed = parse_checker_output((RECORDED / "pytest.txt").read_text("utf-8"))
    assert "FAILED test_calc.py::test_add - assert 0 == 4" in parsed.unparsed


def test_clang_and_other_summaries_are_known():
    text = ("a.c:3:5: error: use of undeclared identifier 'x'\n"
            "1 warning and 1 error generated.\n"
            "2 errors generated.\n"
            "pkg/a.py: note: In function \"f\":\n"
            "Success: no issues found in 3 source files\n")
    parsed = parse_checker_output(text)
    assert [(d.path, d.line, d.col) for d in parsed.diagnostics] == [("a.c", 3, 5)]
    assert parsed.unparsed == ()


def test_a_traceback_is_unparsed():
    parsed = parse_checker_output("Traceback (most recent call last):\n"
                                  "  File \"x.py\", line 3, in <module>\n"
                                  "KeyError: 'config'\n")
    assert parsed.diagnostics == ()
    assert parsed.unparsed == ("Traceback (most recent call last):", "KeyError: 'config'")


def test_paths_are_normalised_before_matching(tmp_path):
    real = tmp_path / "real"
    (real / "pkg").mkdir(parents=True)
    (real / "pkg" / "a.py").write_text("x\n")
    link = tmp_path / "ws"
    link.symlink_to(real)
    keys = path_keys("pkg/a.py", str(link))
    assert str(link / "pkg" / "a.py") in keys and str(real / "pkg" / "a.py") in keys
    # ./, absolute through the link, absolute resolved, and ../ all name the same file.
    for shown in ("./pkg/a.py", str(link / "pkg" / "a.py"), str(real / "pkg" / "a.py"),
                  "../ws/pkg/./a.py"):
        assert path_keys(shown, str(link)) & keys, shown
    assert not path_keys("pkg/b.py", str(link)) & keys


def test_classify_splits_touched_files_from_debt(tmp_path):
    # Placed only in files that exist in the workspace: the recording's tree, rebuilt.
    workspace = tmp_path / "rec"
    (workspace / "src").mkdir(parents=True)
    for name in ("a.js", "a.ts"):
        (workspace / "src" / name).write_text("x\n")
    text = ((RECORDED / "eslint.txt").read_text("utf-8").replace("/tmp/rec/", f"{workspace}/")
            + (RECORDED / "tsc.txt").read_text("utf-8"))
    parsed = parse_checker_output(text)
    inside, outside = classify(parsed.diagnostics, ["src/a.js"], workspace, workspace)
    assert {d.path for d in inside} == {f"{workspace}/src/a.js"} and len(inside) == 4
    assert {d.path for d in outside} == {"src/a.ts"}
