"""Snapshots of the workspace: which files a task changed, from content, not from git.

A snapshot maps each path under the workspace (relative, ``/``-separated) to a fingerprint:
``sha256:<hex>`` for a regular file, ``link:<target>`` for a symlink (never followed), and
``other:<type>`` for anything else. Directories are not entries. Any directory named ``.git`` is
skipped (repository internals are not files a checker reports on). A file that cannot be read
gets ``unreadable:<errno>``.

The changed files of a task are those whose fingerprint differs between the snapshot taken
before its first attempt (kept in ``runs/<task>/baseline.json``, so a restart does not move it)
and the one taken after the attempt being verified: added, modified, or removed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = frozenset({".git"})
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
    return "sha256:" + digest.hexdigest()


def take_snapshot(root: Path) -> dict[str, str]:
    """Fingerprint every file under ``root`` (empty if ``root`` does not exist)."""
    out: dict[str, str] = {}
    root_s = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(root_s):
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                filenames.append(name)  # a symlink to a directory is an entry, not descended
            elif name not in SKIP_DIRS:
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root_s).replace(os.sep, "/")
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
        modified=tuple(sorted(p for p in after if p in before and before[p] != after[p])),
        removed=tuple(sorted(p for p in before if p not in after)))
