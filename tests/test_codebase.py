"""The codebase's own checks, run with the suite: ruff, mypy and the import contract.

Each tool runs from the venv that runs the tests (``scripts/setup.sh --test`` installs them,
pinned), in the repository root, with its configuration from ``pyproject.toml``: ruff over
``fleetctl/`` and ``tests/``, mypy over ``fleetctl/``, and ``lint-imports`` for the layers
(docs/design.md, *Layers*). A failure prints the tool's own report.
"""

from __future__ import annotations

import ast
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


def _dollar_anchored(node) -> bool:
    """A regex literal that ends in an unescaped ``$``."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, (str, bytes)):
        return False
    text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
    body = text[:-1]
    return text.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0


def _compiled_anchored(tree: ast.AST) -> set[str]:
    """The names bound at module level to ``re.compile("...$")``."""
    return {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "compile" and node.value.args
            and _dollar_anchored(node.value.args[0])
            for t in node.targets if isinstance(t, ast.Name)}


def _anchored_matches(path: Path, tree: ast.AST, anchored: set[str]) -> list[str]:
    """``NAME.match(...)`` (``NAME``, ``module.NAME`` or an import alias) of a pattern in
    ``anchored``, and ``re.match("...$", ...)``, in one file: ``path:line: code``."""
    names = set(anchored)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname for a in node.names if a.asname and a.name in anchored)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "match"):
            continue
        owner = node.func.value
        name = owner.id if isinstance(owner, ast.Name) else \
            owner.attr if isinstance(owner, ast.Attribute) else None
        if name in names or (name == "re" and node.args and _dollar_anchored(node.args[0])):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_whole_value_check_is_a_dollar_anchored_match():
    """With ``re.match`` a ``$`` also matches before a trailing newline: ``"t1\\n"`` passed the
    runner's task-id pattern and split its log (issue 19). A rule over a whole value is a
    ``fullmatch``, or its pattern ends in ``\\Z``."""
    files = [*(REPO / "fleetctl").rglob("*.py"), *(REPO / "blueprint").rglob("*.py"),
             *(p for p in (REPO / "blueprint" / "skills").glob("*/bin/*") if p.is_file()
               and p.read_bytes().startswith(b"#!/usr/bin/env python3"))]
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    anchored = set().union(*(_compiled_anchored(tree) for tree in trees.values()))
    found = [hit for path, tree in trees.items()
             for hit in _anchored_matches(path, tree, anchored)]
    assert found == [], "\n".join(found)
