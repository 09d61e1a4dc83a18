"""Undoing a run's changes outside its write scope, byte for byte, and reading them back.

The scope gate (:func:`fleet_runner.gates.scope_gate`) fails a run that changed a path outside
the role's ``writes``; this module puts each such path back as it was at the task's baseline,
the way a careful reviewer would before handing the work on:

- a file the run **created** is removed;
- a file it **modified** (content, or mode: a ``chmod`` is a change) or **removed** is written
  back from the baseline's copy, with its mode; a symlink is made again with its target;
- every path is then fingerprinted again and compared with the baseline: only a path that
  reads back as it was counts as undone.

The copies: when the task's baseline is taken, every regular file outside the scope is copied
once into ``runs/<task>/baseline-store/<sha256>`` (content-addressed, so equal files share one
copy; 0600). Files larger than :data:`STORE_MAX_FILE_BYTES` are not copied, and a change to one
of them cannot be undone (it is reported). Paths are never written through a symlink: a
parent directory that is a symlink, or that resolves outside the workspace, makes the path
fail to undo rather than write elsewhere. Committed changes are not undone here (history is
never rewritten); the scope gate reports them.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleet_runner.scope import Scope
from fleet_runner.snapshot import MODE_SEP, fingerprint, same

STORE_MAX_FILE_BYTES = 64 << 20
"""Out-of-scope files larger than this are not copied at the baseline (their changes cannot be
undone)."""


def store_baseline(workspace: Path, snapshot: dict[str, str], scope: Scope,
                   store: Path) -> int:
    """Copy every regular file of ``snapshot`` that ``scope`` does not allow into ``store``.

    Args:
        workspace: the workspace.
        snapshot: its baseline snapshot.
        scope: the role's compiled ``writes``.
        store: the directory for the copies (created 0700).

    Returns:
        How many files were copied (a content already there is not copied again).
    """
    os.makedirs(store, mode=0o700, exist_ok=True)
    copied = 0
    for rel, print_ in snapshot.items():
        if not print_.startswith("sha256:") or scope.allows(rel):
            continue
        digest = print_.split(MODE_SEP)[0][len("sha256:"):]
        target = Path(store) / digest
        if target.exists():
            continue
        source = Path(workspace) / rel
        try:
            if os.lstat(source).st_size > STORE_MAX_FILE_BYTES:
                continue
            tmp = target.with_name(f".{digest}.tmp")
            shutil.copyfile(source, tmp, follow_symlinks=False)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
            copied += 1
        except OSError:
            continue  # reported when a change to it cannot be undone
    return copied


@dataclass
class UndoResult:
    """What :func:`undo_changes` did.

    Attributes:
        undone: paths that now read back as at the baseline.
        failed: ``"path: why"`` for each path that could not be put back.
    """

    undone: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _inside(workspace: Path, rel: str) -> bool:
    """Whether ``rel``'s parent directory is reached without a symlink and lies inside the
    workspace (so writing ``rel`` writes in the workspace)."""
    ws_real = os.path.realpath(workspace)
    parent = os.path.dirname(rel)
    lexical = os.path.normpath(os.path.join(ws_real, parent))
    real = os.path.realpath(lexical)
    return real == lexical and (real == ws_real or real.startswith(ws_real + os.sep))


def _remove(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _makedirs(path: str, owner: tuple[int, int] | None) -> None:
    """Create ``path`` and its missing parents, each given to ``owner``."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory)
        if owner is not None:
            os.chown(directory, *owner)


def _put_back(workspace: Path, rel: str, print_: str, store: Path,
              owner: tuple[int, int] | None = None) -> None:
    """Write ``rel`` back to the baseline state ``print_``.

    Raises:
        OSError: it cannot be (the reason in the message).
    """
    path = os.path.join(workspace, rel)
    if print_.startswith("link:"):
        if os.path.lexists(path):
            _remove(path)
        _makedirs(os.path.dirname(path), owner)
        os.symlink(print_[len("link:"):], path)
        if owner is not None:
            os.lchown(path, *owner)
        return
    if not print_.startswith("sha256:"):
        raise OSError(f"its baseline ({print_.split(':')[0]}) is not a file the runner can "
                      "write back")
    digest, _, mode = print_[len("sha256:"):].partition(MODE_SEP)
    copy = Path(store) / digest
    if not copy.is_file():
        raise OSError("no copy of its baseline content was kept (too large, unreadable, or a "
                      "baseline from an older runner)")
    _makedirs(os.path.dirname(path), owner)
    tmp = os.path.join(os.path.dirname(path), f".fleet-runner-undo.{os.getpid()}.tmp")
    shutil.copyfile(copy, tmp)
    if owner is not None:
        os.chown(tmp, *owner)  # before the mode: chown clears setuid and setgid bits
    os.chmod(tmp, int(mode, 8) if mode else 0o644)
    if os.path.lexists(path) and stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    os.replace(tmp, path)


def undo_changes(workspace: Path, paths: Sequence[str], baseline: dict[str, str],
                 store: Path, owner: tuple[int, int] | None = None) -> UndoResult:
    """Put each of ``paths`` back as in ``baseline``, then read each back (module docstring).

    Args:
        workspace: the workspace.
        paths: workspace-relative paths the run changed outside its scope.
        baseline: the task's baseline snapshot.
        store: the baseline's copies (:func:`store_baseline`).
        owner: ``(uid, gid)`` to give what is written back (the agent's user, when the runner
            runs as another), or ``None``: the runner's.

    Never raises: a path that cannot be put back is in ``failed`` with the reason.
    """
    result = UndoResult()
    # Created paths first, deepest first: a created symlinked directory is gone before a
    # path below its name is written back.
    ordered = sorted(paths, key=lambda p: (p in baseline, -p.count("/"), p))
    for rel in ordered:
        path = os.path.join(workspace, rel)
        try:
            if not _inside(workspace, rel):
                raise OSError("a directory on its path is a symlink or leads out of the "
                              "workspace: not written through")
            if rel not in baseline:
                if os.path.lexists(path):
                    _remove(path)
            else:
                _put_back(workspace, rel, baseline[rel], store, owner)
        except OSError as exc:
            result.failed.append(f"{rel}: {exc.strerror or exc}")
            continue
        now = fingerprint(path) if os.path.lexists(path) else None
        want = baseline.get(rel)
        if (now is None and want is None) or (now and want and same(want, now)):
            result.undone.append(rel)
        else:
            result.failed.append(f"{rel}: reads back as {now or 'absent'}, not as at the "
                                 "baseline")
    return result
