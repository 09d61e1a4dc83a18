"""The codebase's own checks, run with the suite: ruff, mypy and the import contract.

Each tool runs from the venv that runs the tests (``scripts/setup.sh --test`` installs them,
pinned), in the repository root, with its configuration from ``pyproject.toml``: ruff over
``fleetctl/`` and ``tests/``, mypy over ``fleetctl/``, and ``lint-imports`` for the layers
(docs/design.md, *Layers*). A failure prints the tool's own report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("tool, args", [
    ("ruff", ["check", "--no-cache", "fleetctl", "tests"]),
    ("mypy", []),
    ("lint-imports", ["--no-cache"]),
])
def test_tool_passes(tool, args):
    exe = BIN / tool
    assert exe.is_file(), f"{exe} is missing: run scripts/setup.sh --test"
    run = subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, f"{tool} {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
