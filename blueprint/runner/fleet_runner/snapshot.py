"""Snapshots of the workspace: which files a task changed, from content, not from git.

A snapshot maps each path under the workspace (relative, ``/``-separated) to a fingerprint:
``sha256:<hex>;mode=<octal>`` for a regular file (its permission bits, setuid, setgid and
sticky included: a ``chmod`` is a change), ``link:<target>`` for a symlink (never followed),
and ``other:<type>`` for anything else. Directories are not entries. A file that cannot be read
gets ``unreadable:<errno>``.

**Git directories.** Every ``.git`` below the top of the workspace (``vendor/.git/config``, a
nested clone) is an ordinary directory here: all of it is snapshotted. In the workspace's own
``.git`` directory only git's bookkeeping is skipped, in each git directory of it (the
``.git`` itself, and every directory holding a ``HEAD`` file below ``.git/modules/`` or
``.git/worktrees/``):

- directories :data:`GIT_BOOKKEEPING_DIRS`: the object store, refs and reflogs, and the state
  of an operation under way (rebase, sequencer, rerere, LFS, fsmonitor);
- files :data:`GIT_BOOKKEEPING_FILES` (``index``, ``packed-refs``, ``shallow``, ...), every
  ``*.lock``, ``sharedindex.*``, and every name of capitals and ``_`` only (``HEAD``,
  ``ORIG_HEAD``, ``FETCH_HEAD``, ``COMMIT_EDITMSG``, ``AUTO_MERGE``, ``BISECT_LOG``...).

Everything else there is snapshotted, so a write to what makes git run code or changes where
it reads from is a change like any other: ``.git/config``, ``.git/hooks/*``, ``.git/info/*``,
``.git/commondir``, ``.git/branches/``, ``.git/remotes/``, a submodule's ``config`` and
``hooks/`` under ``.git/modules/``. The history the skipped object store and refs hold is
judged from the commits instead (:func:`fleet_runner.reposync.committed_paths`). A ``.git``
that is a file (a linked worktree or submodule) is a file entry; the directory it points to
is outside the workspace and not seen.

The changed files of a task are those whose fingerprint differs between the snapshot taken
before its first attempt (kept in ``runs/<task>/baseline.json``, so a restart does not move it)
and the one taken after the attempt being verified: added, modified, or removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GIT_DIR = ".git"
GIT_BOOKKEEPING_DIRS = frozenset({
    "objects", "refs", "logs", "rebase-merge", "rebase-apply", "sequencer", "rr-cache", "lfs",
    "fsmonitor--daemon"})
"""Directories of a git directory that are git's bookkeeping, not snapshotted."""
GIT_BOOKKEEPING_FILES = frozenset({
    "index", "packed-refs", "shallow", "gc.log", "gc.pid", "fsmonitor--daemon.ipc"})
"""Files of a git directory that are git's bookkeeping (with ``*.lock``, ``sharedindex.*``
and names of capitals and ``_`` only), not snapshotted."""
_PSEUDO_REF = re.compile(r"[A-Z][A-Z_]*")
CHUNK_BYTES = 1 << 20


def fingerprint(path: str) -> str:
    """The fingerprint of one path (see the module docstring)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    if not stat.S_ISREG(st.st_mode):
        return f"other:{stat.S_IFMT(st.st_mode):o}"
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                digest.update(chunk)
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    return f"sha256:{digest.hexdigest()}{MODE_SEP}{stat.S_IMODE(st.st_mode):04o}"


MODE_SEP = ";mode="
"""Between a regular file's content digest and its mode in a fingerprint."""


def same(before: str, after: str) -> bool:
    """Whether two fingerprints describe the same state (a fingerprint written by an older
    runner, without a mode, is compared by content only)."""
    if before == after:
        return True
    if before.startswith("sha256:") and after.startswith("sha256:") and \
            (MODE_SEP not in before or MODE_SEP not in after):
        return before.split(MODE_SEP)[0] == after.split(MODE_SEP)[0]
    return False


def _git_bookkeeping_file(name: str) -> bool:
    return (name in GIT_BOOKKEEPING_FILES or name.endswith(".lock")
            or name.startswith("sharedindex.") or bool(_PSEUDO_REF.fullmatch(name)))


def _is_git_dir(rel_dir: str, filenames: list[str]) -> bool:
    """Whether ``rel_dir`` is a git directory of the workspace's own ``.git`` (module
    docstring): the bookkeeping rules apply in it."""
    if rel_dir == GIT_DIR:
        return True
    return rel_dir.startswith((GIT_DIR + "/modules/", GIT_DIR + "/worktrees/")) \
        and "HEAD" in filenames


def take_snapshot(root: Path,
                  only: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Fingerprint every file under ``root`` (empty if ``root`` does not exist), but git's
    bookkeeping in the workspace's own ``.git`` (module docstring); with ``only``, just the
    files whose workspace-relative path it accepts (the others are not read)."""
    out: dict[str, str] = {}
    root_s = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(root_s):
        rel_dir = os.path.relpath(dirpath, root_s).replace(os.sep, "/")
        git_dir = rel_dir.split("/", 1)[0] == GIT_DIR and _is_git_dir(rel_dir, filenames)
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                filenames.append(name)  # a symlink to a directory is an entry, not descended
            elif not (git_dir and name in GIT_BOOKKEEPING_DIRS):
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            if git_dir and _git_bookkeeping_file(name):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root_s).replace(os.sep, "/")
            if only is None or only(rel):
                out[rel] = fingerprint(full)
    return out


@dataclass(frozen=True, slots=True)
class Changes:
    """Paths (workspace-relative) that differ between two snapshots, each sorted."""

    added: tuple[str, ...]
    modified: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def touched(self) -> tuple[str, ...]:
        """Added and modified paths: the files a checker can report on."""
        return tuple(sorted(self.added + self.modified))

    def to_json(self) -> dict:
        """The record form."""
        return {"added": list(self.added), "modified": list(self.modified),
                "removed": list(self.removed)}


def diff_snapshots(before: dict[str, str], after: dict[str, str]) -> Changes:
    """What changed from ``before`` to ``after``."""
    return Changes(
        added=tuple(sorted(p for p in after if p not in before)),
        modified=tuple(sorted(p for p in after if p in before
                              and not same(before[p], after[p]))),
        removed=tuple(sorted(p for p in before if p not in after)))
