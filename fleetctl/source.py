"""The source a ship renders from: which commit, whether it is clean, and how it relates to the
commit a host runs (DESIGN.md invariant 11, docs/provenance.md).

A ship renders what git has committed. The blueprint loader reads git's tracked files and the
untracked files git does not ignore, from the work tree; so the work tree renders exactly the
commit when ``git status`` shows nothing for the paths rendered from (the blueprint, the
templates, the inventory when git tracks it) and no file there is hidden from ``git status`` by
``assume-unchanged`` or ``skip-worktree``. Anything else is a dirty source: ship refuses it
unless ``--allow-dirty``, which the release records.

Ancestry is git's own: ``merge-base --is-ancestor`` and ``rev-list --count``.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import InputError

_GIT_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class SourceState:
    """What the local source is.

    Attributes:
        repo: the top of the git work tree holding the blueprint, or ``None`` outside git.
        commit: the full id of ``HEAD`` (40 hex), or ``None`` (outside git, or no commit yet).
        dirty: one line per path that makes the source differ from ``commit``, e.g.
            ``"blueprint/runner/x.py (modified)"``, relative to ``repo``; for a source outside
            git, one line saying so.
    """

    repo: Path | None
    commit: str | None
    dirty: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """Whether what is rendered is exactly ``commit``."""
        return self.commit is not None and not self.dirty

    @property
    def short(self) -> str:
        """The commit's first 12 hex digits, or ``"(none)"``."""
        return self.commit[:12] if self.commit else "(none)"

    def to_json(self) -> dict[str, object]:
        """``{"commit", "clean", "dirty"}`` for machine output and release records."""
        return {"commit": self.commit, "clean": self.clean, "dirty": list(self.dirty)}


@dataclass(frozen=True, slots=True)
class Ancestry:
    """How the commit being shipped relates to the commit a host's release came from.

    Attributes:
        relation: ``same``, ``ahead`` (source descends from the host's commit), ``behind``
            (the host's commit descends from the source), ``diverged``, ``unknown`` (the host's
            commit is not in the local repository, or the source has no commit), or
            ``unrecorded`` (the host's release records no commit: nothing to compare).
        host_commit: the commit recorded in the host's current release, or ``None``.
        source_commit: the commit being shipped, or ``None``.
        ahead: commits in the source not in the host's commit (``rev-list --count``).
        behind: commits in the host's commit not in the source.
    """

    relation: str
    host_commit: str | None
    source_commit: str | None
    ahead: int = 0
    behind: int = 0

    @property
    def stale(self) -> bool:
        """Whether shipping the source would move the host backwards or sideways."""
        return self.relation in ("behind", "diverged", "unknown")

    def describe(self) -> str:
        """One line for people, naming both commits."""
        src = (self.source_commit or "(none)")[:12]
        host = (self.host_commit or "(none)")[:12]
        if self.relation == "same":
            return f"the host runs {host}, the commit being compared"
        if self.relation == "ahead":
            return f"the source {src} is {self.ahead} commit(s) ahead of the host's {host}"
        if self.relation == "behind":
            return (f"the source {src} is {self.behind} commit(s) behind the host's {host}: "
                    "shipping it would move the host backwards")
        if self.relation == "diverged":
            return (f"the source {src} and the host's {host} have diverged ({self.ahead} "
                    f"ahead, {self.behind} behind): shipping would drop {self.behind} commit(s)")
        if self.relation == "unknown":
            if self.source_commit is None:
                return (f"the host runs {host}, but the source is not a git commit, so it "
                        "cannot be told whether it descends from it")
            return (f"the host runs {host}, a commit the local repository does not have: "
                    "the checkout may be stale")
        return "the host's release records no commit"

    def to_json(self) -> dict[str, object]:
        """``{"relation", "host_commit", "source_commit", "ahead", "behind"}``."""
        return {"relation": self.relation, "host_commit": self.host_commit,
                "source_commit": self.source_commit, "ahead": self.ahead,
                "behind": self.behind}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, check=False,
                              timeout=_GIT_TIMEOUT_S, env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        raise InputError("git: not found; fleetctl needs git to know what commit it ships",
                         hint="install git, or ship with --allow-dirty") from None
    except subprocess.TimeoutExpired:
        raise InputError(f"git in {cwd}: no answer in {_GIT_TIMEOUT_S} s") from None


def inspect_source(blueprint_root: Path, templates: Path | None = None,
                   inventory: Path | None = None) -> SourceState:
    """Find the commit the blueprint renders from and every path that makes it dirty.

    Args:
        blueprint_root: the blueprint directory.
        templates: fleetctl's template directory; checked when it is inside the same work
            tree (a templates directory outside it is reported as dirty: the commit does not
            hold it).
        inventory: the inventory file; checked only when git tracks it (an inventory kept
            outside the repository is not part of the commit, by choice).

    Raises:
        InputError: git is missing or does not answer.
    """
    top = _git(blueprint_root, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return SourceState(None, None, (f"{blueprint_root} is not in a git repository",))
    repo = Path(os.fsdecode(top.stdout.rstrip(b"\n")))
    head = _git(repo, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    commit = head.stdout.decode().strip() if head.returncode == 0 else None
    paths = [Path(blueprint_root).resolve()]
    dirty: list[str] = []
    if commit is None:
        dirty.append("the repository has no commit yet")
    if templates is not None and Path(templates).is_dir():
        resolved = Path(templates).resolve()
        if _inside(resolved, repo.resolve()):
            paths.append(resolved)
        else:
            dirty.append(f"{templates} (templates outside the repository {repo})")
    if inventory is not None and _inside(Path(inventory).resolve(), repo.resolve()):
        tracked = _git(repo, "ls-files", "--error-unmatch", "--", str(Path(inventory).resolve()))
        if tracked.returncode == 0:
            paths.append(Path(inventory).resolve())
    specs = [str(p) for p in paths]
    status = _git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all",
                  "--ignore-submodules=none", "--", *specs)
    if status.returncode != 0:
        raise InputError(f"git status in {repo} failed: "
                         f"{status.stderr.decode(errors='replace').strip()}")
    records = status.stdout.split(b"\0")
    i = 0
    while i < len(records):
        record = records[i]
        i += 1
        if len(record) < 4:
            continue
        xy, name = record[:2].decode(), os.fsdecode(record[3:])
        if xy[0] in "RC":
            i += 1  # a rename's original name follows as its own record
        dirty.append(f"{name} ({_why(xy)})")
    hidden = _git(repo, "ls-files", "-v", "-z", "--", *specs)
    for record in hidden.stdout.split(b"\0"):
        # ls-files -v: a lowercase tag is assume-unchanged, "S" is skip-worktree; git status
        # does not look at such files, so their content cannot be vouched for.
        if len(record) > 2 and (record[:1].islower() or record[:1] == b"S"):
            dirty.append(f"{os.fsdecode(record[2:])} (hidden from git status by "
                         f"{'skip-worktree' if record[:1] == b'S' else 'assume-unchanged'})")
    return SourceState(repo, commit, tuple(dirty))


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _why(xy: str) -> str:
    if xy == "??":
        return "untracked"
    if "D" in xy:
        return "deleted"
    if "A" in xy and xy[1] == " ":
        return "added, not committed"
    if xy[0] in "RC":
        return "renamed, not committed"
    if "U" in xy or xy in ("AA", "DD"):
        return "unmerged"
    if xy[0] != " " and xy[1] == " ":
        return "staged, not committed"
    return "modified"


def ancestry(source: SourceState, host_commit: str | None) -> Ancestry:
    """Relate the source's commit to the commit a host's current release came from.

    Raises:
        InputError: git does not answer.
    """
    if host_commit is None:
        return Ancestry("unrecorded", None, source.commit)
    if source.commit is None or source.repo is None:
        return Ancestry("unknown", host_commit, source.commit)
    if host_commit == source.commit:
        return Ancestry("same", host_commit, source.commit)
    known = _git(source.repo, "cat-file", "-e", f"{host_commit}^{{commit}}")
    if known.returncode != 0:
        return Ancestry("unknown", host_commit, source.commit)
    counts = _git(source.repo, "rev-list", "--left-right", "--count",
                  f"{source.commit}...{host_commit}")
    if counts.returncode != 0:
        return Ancestry("unknown", host_commit, source.commit)
    ahead, behind = (int(n) for n in counts.stdout.split())
    relation = "ahead" if behind == 0 else "behind" if ahead == 0 else "diverged"
    return Ancestry(relation, host_commit, source.commit, ahead, behind)


def operator() -> str:
    """Who runs fleetctl, for provenance: ``user@machine`` (``"unknown"`` if it cannot be told)."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return "unknown"


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second (``2026-12-01T15:36:43Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
