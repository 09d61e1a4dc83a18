"""The runner's code passes its own linter and type checker (issue 14).

ruff and mypy run on ``blueprint/runner`` with the settings in ``blueprint/runner/pyproject.toml``
(apart from the repository's: the runner is shipped to hosts and needs Python 3.10 and the
standard library only). Their caches go to the test's temporary directory, never into the
blueprint: a cache there would be shipped to every host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "blueprint" / "runner"
BIN = Path(sys.executable).parent


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_ruff_finds_nothing_in_the_runner(tmp_path):
    before = _listing(RUNNER)
    done = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--output-format",
                           "concise", "fleet_runner", "bin/fleet-runner"],
                          cwd=RUNNER, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All checks passed!" in done.stdout
    assert _listing(RUNNER) == before  # no cache left in the shipped tree


def test_mypy_finds_nothing_in_the_runner(tmp_path):
    before = _listing(RUNNER)
    done = subprocess.run([str(BIN / "mypy"), "--cache-dir", str(tmp_path / "mypy-cache")],
                          cwd=RUNNER, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # "files" in the config names the package: every module was checked, none skipped.
    modules = len(list((RUNNER / "fleet_runner").glob("*.py")))
    assert f"Success: no issues found in {modules} source files" in done.stdout
    assert _listing(RUNNER) == before
