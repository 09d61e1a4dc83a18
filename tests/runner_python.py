"""A plain ``python3`` first on PATH for the runner's tests (``tests/runner/test_runner*.py``).

The runner, the fake agents and the skills' CLIs start with ``#!/usr/bin/env python3``, so each
of their processes runs whatever ``python3`` PATH finds first. On a development machine that is
often a version manager's shim (pyenv: a bash script that runs more bash before the
interpreter) and an interpreter whose site-packages hold ``.pth`` hooks; measured here, a bare
``python3 -c pass`` cost 102 ms of CPU through the pyenv shim against 12 ms for the same
interpreter in a venv with nothing installed, and the runner's suite starts several hundred of
them. Hosts run the runner with a plain system ``python3`` and no pip installs, so a venv of
this interpreter with an empty site-packages is also the closer stand-in for a host: a runner,
fake agent or CLI that imported anything beyond the standard library would fail here.

The venv lives in a directory of its own, readable by every user, because the two-user tests
run the agent command as an unprivileged account that must be able to run it too.

Bytecode: the runner never writes any (``sys.dont_write_bytecode`` in ``bin/fleet-runner``: the
release stays as shipped), and the tests set ``PYTHONDONTWRITEBYTECODE`` for every process they
start, so each runner start compiled its 7,000 lines again (129 ms of CPU per start against
87 ms with bytecode, measured with ``perf stat``). Here the runner tests read bytecode from a
per-session cache outside every tree (``PYTHONPYCACHEPREFIX``): the standard-library modules
the runner, the fake agents and the CLIs import are compiled into it once per session, and the
runner's modules once per session too, then copied to the cache path of each test's release
(:func:`precompile_runner`). The copies are checked-hash pycs (PEP 552): an interpreter that
finds the source changed (a test that edits the runner) compiles it again, so a stale copy is
never run.
"""

from __future__ import annotations

import ast
import atexit
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER_PACKAGE = REPO / "blueprint" / "runner" / "fleet_runner"


def reachable_copy(relative: str) -> Path:
    """A copy of the checkout's ``relative`` directory that every user can reach and read.

    The two-user tests run the fake agents, the checkers and the skills' CLIs as unprivileged
    accounts. A checkout may sit where only root can enter (under a 0700 home, in a
    ``mktemp -d``, cloned with umask 077); changing the user's own directories to let the
    agents in would be done behind their back. So these run from a copy in a temporary
    directory of this process (0755, files made readable and directories traversable by all),
    one per directory and process, removed when the process exits.
    """
    global _REACHABLE
    if _REACHABLE is None:
        _REACHABLE = Path(tempfile.mkdtemp(prefix="fleetctl-reachable-"))
        os.chmod(_REACHABLE, 0o755)
        atexit.register(shutil.rmtree, _REACHABLE, True)
    copy = _REACHABLE / relative
    if not copy.exists():
        shutil.copytree(REPO / relative, copy, symlinks=True)
        for path in [copy, *copy.rglob("*")]:
            if not path.is_symlink():
                mode = path.stat().st_mode
                # Everyone reads what the owner reads, executes what the owner executes.
                os.chmod(path, mode | ((mode & 0o500) >> 3) | ((mode & 0o500) >> 6))
        for parent in copy.relative_to(_REACHABLE).parents:
            os.chmod(_REACHABLE / parent, 0o755)
    return copy


_REACHABLE: Path | None = None
_SESSION: dict[str, object] = {}  # "prefix": Path, "runner_pycs": {module file name: bytes}


@pytest.fixture(scope="session")
def plain_python3_bin():
    """The ``bin`` directory of a venv of this interpreter without pip or site-packages (made
    once per session, removed at its end)."""
    where = Path(tempfile.mkdtemp(prefix="fleet-python3-"))
    os.chmod(where, 0o755)  # mkdtemp makes it 0700; the agent users must reach it
    venv.EnvBuilder(with_pip=False, symlinks=True, system_site_packages=False).create(where)
    python3 = where / "bin" / "python3"
    assert python3.exists(), f"venv made no {python3}"
    try:
        yield where / "bin"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _stdlib_imports() -> list[str]:
    """Standard-library modules the fake agents and the skills' CLIs import (read with ast)."""
    sources = [*(REPO / "tests" / "fake_agents").iterdir(),
               *(REPO / "blueprint" / "skills").glob("*/bin/*")]
    names: set[str] = set()
    for path in sources:
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, IsADirectoryError):
            continue  # a shell script
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] in sys.stdlib_module_names)


@pytest.fixture(scope="session")
def runner_bytecode(plain_python3_bin, tmp_path_factory):
    """The session's bytecode cache (``PYTHONPYCACHEPREFIX``), holding the standard library the
    runner and the fakes import; the runner's own checked-hash pycs kept in memory."""
    prefix = Path(tempfile.mkdtemp(prefix="fleet-pycache-"))
    try:
        yield _fill_cache(prefix, plain_python3_bin / "python3",
                          tmp_path_factory.mktemp("runner-pycs"))
    finally:
        _SESSION.clear()
        shutil.rmtree(prefix, ignore_errors=True)


def _fill_cache(prefix: Path, python3: Path, scratch: Path) -> Path:
    """Compile the standard library into ``prefix`` (by importing it) and the runner into
    ``scratch``; return ``prefix``."""
    os.chmod(prefix, 0o755)  # read by the agent users too
    warm = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib, pkgutil, "
            "fleet_runner; [importlib.import_module('fleet_runner.' + m.name) for m in "
            "pkgutil.iter_modules(fleet_runner.__path__) "
            "if m.name != '__main__']; "
            "[importlib.import_module(n) for n in sys.argv[2:]]")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(python3), "-c", warm, str(RUNNER_PACKAGE.parent),
                    *_stdlib_imports()],
                   env={**env, "PYTHONPYCACHEPREFIX": str(prefix)}, check=True, timeout=120)
    # The warm-up wrote the runner's own pycs for the repository's path: not what tests run.
    shutil.rmtree(prefix / str(RUNNER_PACKAGE).lstrip("/"), ignore_errors=True)
    pycs = {}
    for source in sorted(RUNNER_PACKAGE.glob("*.py")):
        target = scratch / f"{source.stem}.pyc"
        py_compile.compile(str(source), cfile=str(target), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        pycs[source.name] = target.read_bytes()
    _SESSION.update(prefix=prefix, runner_pycs=pycs)
    return prefix


def precompile_runner(runner_dir: Path) -> None:
    """Put the session's runner pycs where an interpreter with the session's
    ``PYTHONPYCACHEPREFIX`` looks for ``runner_dir/fleet_runner/*.py`` (nothing outside the
    runner tests, which have no such session cache)."""
    prefix, pycs = _SESSION.get("prefix"), _SESSION.get("runner_pycs")
    if not isinstance(prefix, Path) or not isinstance(pycs, dict):
        return
    package = Path(os.path.abspath(runner_dir / "fleet_runner"))
    where = prefix / str(package).lstrip("/")
    where.mkdir(parents=True, exist_ok=True)
    for name, data in pycs.items():
        if (package / name).is_file():
            (where / f"{name[:-3]}.{sys.implementation.cache_tag}.pyc").write_bytes(data)
    for path in [where, *where.parents]:  # readable by the agent users along the way
        if path == prefix:
            break
        os.chmod(path, 0o755)


@pytest.fixture(autouse=True)
def _plain_python3_for_runner_tests(request, monkeypatch):
    """In ``tests/runner/test_runner*.py`` only: put :func:`plain_python3_bin` first on PATH and read
    bytecode from :func:`runner_bytecode`'s cache."""
    if not request.module.__name__.rpartition(".")[2].startswith("test_runner"):
        return
    bin_dir = request.getfixturevalue("plain_python3_bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(request.getfixturevalue("runner_bytecode")))
