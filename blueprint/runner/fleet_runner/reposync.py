"""Syncing the working repository before a task, in a way that fails clean (DESIGN.md §7).

When the agent's config has ``sync`` (``{"remote": "origin", "branch": "main"}``) and the
workspace is the top of a git work tree, a new task starts with :func:`sync_workspace`, before
its baseline snapshot (so what the sync brings in is not counted as the task's change):

1. **Preconditions**: HEAD is on ``branch`` (not detached, not another branch) and no rebase,
   merge, cherry-pick, revert or bisect is in progress. Otherwise: *refused*.
2. **Uncommitted changes** (``git status``, untracked files included, ignored ones not):
   none, go on; exactly those the runner's previous task left (recorded when it ended, see
   :func:`record_leftover`: same HEAD, same paths, same content), stashed with the runner's
   own message (``fleet-runner AGENT: left by task T, before task U``) and known from then on
   by the stash commit's id; anything else is a person's work: *refused*, nothing touched
   (the runner never commits, stashes or resets over a person's uncommitted changes).
3. **Fetch** ``+refs/heads/BRANCH:refs/remotes/REMOTE/BRANCH`` (no prompts: no terminal).
   A failure: *refused* (the runner's own stash, if any, is applied back first).
4. **Integrate**: up to date or only ahead, nothing; behind, ``merge --ff-only``; diverged
   (local commits not on the remote), ``rebase`` of the local commits onto the remote branch.
5. The runner's stash, if it made one, is applied back (``stash apply --index``) and dropped,
   as the ``stash@{n}`` whose id is the one it made: never blindly ``stash@{0}``, never a
   stash it did not make.

A **conflict** (the rebase, or the stash applied back) restores the known-good tree: the
rebase is aborted, the branch reset to the commit it had before the sync (its own commits are
on it, and also kept on a branch ``fleet-runner/wip/TASK``), the files the failed apply added
are removed, and the runner's stash is kept (not dropped). The result says where each is; the
task is not run and a person is told (*conflict*).

The **in-progress sentinel** (``STATE/in-progress.json``, :func:`write_sentinel`) names the
task, the attempt and the commit the task started from; it is written after the sync and
before every attempt, and removed when the task ends. A runner that finds it (after a crash)
resumes the task without syncing again: it does not reset, rebase or redo over the commits
the interrupted attempt left, and the next attempt is told which they are
(:func:`commits_since`).

Every git command runs in the workspace with a timeout (:data:`GIT_TIMEOUT_S`), no terminal
prompts, no editor and autostash off (the runner stashes explicitly, or not at all).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.config import SyncConfig
from fleet_runner.records import SCHEMA_VERSION, now_iso, read_json, write_json_atomic
from fleet_runner.snapshot import fingerprint

GIT_TIMEOUT_S = 120.0
"""Wall-clock seconds for one git command (a fetch included)."""
STASH_MESSAGE = "fleet-runner {agent}: left by task {left_by}, before task {task}"
WIP_BRANCH_PREFIX = "fleet-runner/wip/"
DIRTY_LISTED_MAX = 20
"""At most this many uncommitted paths are named in a refusal."""

SYNCED, SKIPPED, REFUSED, CONFLICT = "synced", "skipped", "refused", "conflict"
_OPERATIONS = (("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or am"),
               ("MERGE_HEAD", "a merge"), ("CHERRY_PICK_HEAD", "a cherry-pick"),
               ("REVERT_HEAD", "a revert"), ("BISECT_LOG", "a bisect"))


class GitError(Exception):
    """A git command failed or timed out (the message has the command and its output)."""


@dataclass
class SyncResult:
    """What :func:`sync_workspace` did.

    Attributes:
        status: ``"synced"``, ``"skipped"`` (not a git work tree's top), ``"refused"`` or
            ``"conflict"``; the task runs on the first two only.
        summary: one line for people (the escalation's reason).
        before: the commit HEAD was on before the sync, or ``None``.
        after: the commit the task starts from, or ``None`` when it does not run.
        action: ``"none"``, ``"fast-forward"`` or ``"rebase"`` (``None`` when not reached).
        upstream: the remote branch's commit after the fetch, or ``None``.
        stash: ``{"id", "message", "state"}`` of the runner's own stash (``"applied"`` then
            dropped, or ``"kept"``), or ``None`` when it made none.
        wip_branch: the branch keeping the local commits after a conflict, or ``None``.
        dirty: uncommitted paths behind a refusal, ``"XY path"`` as ``git status`` shows them.
        detail: git's own output behind a refusal or conflict.
    """

    status: str
    summary: str
    before: str | None = None
    after: str | None = None
    action: str | None = None
    upstream: str | None = None
    stash: dict[str, Any] | None = None
    wip_branch: str | None = None
    dirty: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def runs(self) -> bool:
        """Whether the task may run."""
        return self.status in (SYNCED, SKIPPED)

    def to_json(self) -> dict[str, Any]:
        """The record form."""
        return {"status": self.status, "summary": self.summary, "before": self.before,
                "after": self.after, "action": self.action, "upstream": self.upstream,
                "stash": self.stash, "wip_branch": self.wip_branch, "dirty": self.dirty,
                "detail": self.detail}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_TERMINAL_PROMPT="0", GIT_EDITOR="true", GIT_SEQUENCE_EDITOR="true",
               GIT_MERGE_AUTOEDIT="no", LC_ALL="C")
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def git(workspace: Path, *args: str, check: bool = True,
        timeout_s: float = GIT_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``git ARGS`` in ``workspace`` (autostash off); return the finished process.

    Raises:
        GitError: git is missing, timed out, or (with ``check``) exited non-zero.
    """
    argv = ["git", "-c", "rebase.autoStash=false", "-c", "merge.autoStash=false", *args]
    try:
        done = subprocess.run(argv, cwd=workspace, env=_env(), capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)}: no answer within {timeout_s:g} s") from None
    if check and done.returncode != 0:
        raise GitError(f"git {' '.join(args)} exited {done.returncode}: "
                       f"{(done.stderr or done.stdout).strip()}")
    return done


def _out(workspace: Path, *args: str) -> str:
    return git(workspace, *args).stdout.strip()


def is_repo_top(workspace: Path) -> bool:
    """Whether ``workspace`` is the top directory of a git work tree.

    Raises:
        GitError: git is not installed.
    """
    done = git(workspace, "rev-parse", "--show-toplevel", check=False)
    return done.returncode == 0 and os.path.realpath(done.stdout.strip()) == \
        os.path.realpath(workspace)


def head(workspace: Path) -> str:
    """The commit id HEAD is on.

    Raises:
        GitError: no commit yet, or git failed.
    """
    return _out(workspace, "rev-parse", "--verify", "HEAD")


def dirty_state(workspace: Path) -> dict[str, str]:
    """Uncommitted changes: path → ``"XY <fingerprint>"`` (untracked included, ignored not).

    The fingerprint (:func:`fleet_runner.snapshot.fingerprint`) makes two states with the same
    paths but different content differ. Both sides of a rename are listed.
    """
    raw = git(workspace, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    fields = raw.split("\0")
    out: dict[str, str] = {}
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        out[path] = f"{code} {fingerprint(os.path.join(workspace, path))}"
        if code[0] in "RC" and i < len(fields):  # the next field is the rename's origin
            out[fields[i]] = f"{code} origin"
            i += 1
    return out


def _operation_in_progress(workspace: Path) -> str | None:
    git_dir = Path(_out(workspace, "rev-parse", "--absolute-git-dir"))
    for name, what in _OPERATIONS:
        if (git_dir / name).exists():
            return what
    return None


def stash_own(workspace: Path, message: str) -> str | None:
    """Stash every uncommitted change (untracked included) under ``message``; return the
    stash commit's id, or ``None`` if there was nothing to stash.

    Raises:
        GitError: the stash failed.
    """
    before = git(workspace, "rev-parse", "-q", "--verify", "refs/stash", check=False)
    git(workspace, "stash", "push", "--include-untracked", "-m", message)
    after = git(workspace, "rev-parse", "-q", "--verify", "refs/stash", check=False)
    if after.returncode != 0 or after.stdout == before.stdout:
        return None
    return after.stdout.strip()


def find_stash(workspace: Path, stash_id: str) -> str | None:
    """The ``stash@{n}`` whose commit is ``stash_id``, or ``None`` if it is no longer there."""
    done = git(workspace, "stash", "list", "--format=%H", check=False)
    for n, line in enumerate(done.stdout.split()):
        if line == stash_id:
            return f"stash@{{{n}}}"
    return None


def drop_own_stash(workspace: Path, stash_id: str) -> bool:
    """Drop the stash whose commit is ``stash_id`` (found by id, whatever its position);
    return whether it was there and is gone. Other stashes are never touched."""
    ref = find_stash(workspace, stash_id)
    if ref is None:
        return False
    # Checked again right before the drop: the positions move if a person stashes meanwhile.
    if _out(workspace, "rev-parse", ref) != stash_id:
        return False
    git(workspace, "stash", "drop", "-q", ref)
    return True


def commits_since(workspace: Path, start: str) -> list[str]:
    """``"<short id> <subject>"`` of each commit on HEAD since ``start``, oldest first (empty
    when there are none, or when ``start`` is no longer an ancestor of HEAD)."""
    done = git(workspace, "log", "--reverse", "--format=%h %s", f"{start}..HEAD", check=False)
    if done.returncode != 0:
        return []
    return [line for line in done.stdout.splitlines() if line.strip()]


def _wip_branch(workspace: Path, task: str, commit: str) -> str:
    """Create ``fleet-runner/wip/TASK[-N]`` at ``commit``; return its name."""
    base = WIP_BRANCH_PREFIX + (re.sub(r"[^A-Za-z0-9._-]", "-", task).strip(".-") or "task")
    for n in range(1, 100):
        name = base if n == 1 else f"{base}-{n}"
        if git(workspace, "branch", name, commit, check=False).returncode == 0:
            return name
    raise GitError(f"cannot create a branch {base}: 99 of that name exist")


def _untracked_of(workspace: Path, stash_id: str) -> list[str]:
    """The untracked files a stash holds (its third parent), or none."""
    done = git(workspace, "ls-tree", "-r", "-z", "--name-only", f"{stash_id}^3", check=False)
    return [p for p in done.stdout.split("\0") if p] if done.returncode == 0 else []


def _restore(workspace: Path, before: str, stash_id: str | None) -> str:
    """Back to ``before`` with a clean tree after a failed rebase or stash apply; the runner's
    stash is kept. Returns what was done, for the detail."""
    notes = []
    for what in ("rebase-merge", "rebase-apply"):
        git_dir = Path(_out(workspace, "rev-parse", "--absolute-git-dir"))
        if (git_dir / what).exists():
            done = git(workspace, "rebase", "--abort", check=False)
            notes.append(f"rebase --abort: exit {done.returncode}")
            break
    git(workspace, "reset", "-q", "--hard", before)
    if stash_id:
        # Only files the failed apply brought back from the runner's stash: the tree was
        # clean (but for ignored files) when the stash was made, so nothing else is removed.
        for rel in _untracked_of(workspace, stash_id):
            path = os.path.join(workspace, rel)
            if os.path.lexists(path) and git(workspace, "ls-files", "--error-unmatch", "--",
                                             rel, check=False).returncode != 0:
                os.remove(path)
    notes.append(f"reset --hard {before[:12]}")
    return "; ".join(notes)


def sync_workspace(workspace: Path, sync: SyncConfig, *, agent: str, task: str,
                   leftover: dict[str, Any] | None) -> SyncResult:
    """Sync the workspace repository before task ``task`` (module docstring, steps 1-5).

    Args:
        workspace: the agent's workspace.
        sync: the remote and branch to follow.
        agent: the agent's name (in the stash message).
        task: the task about to start (in the stash message and the wip branch name).
        leftover: what the runner's previous task left uncommitted (:func:`record_leftover`),
            or ``None``.

    Returns:
        The result; a git failure is a ``"refused"`` result, never an exception.
    """
    made: dict[str, Any] = {}
    try:
        return _sync(workspace, sync, agent, task, leftover, made)
    except GitError as exc:
        stash = made.get("stash")
        where = (f"; the runner's uncommitted work is in stash {stash['id'][:12]} "
                 f"(\"{stash['message']}\")") if stash and stash["state"] == "kept" else ""
        return SyncResult(REFUSED, f"the working repository could not be synced: {exc}{where}",
                          stash=stash, detail=str(exc))


def _sync(workspace: Path, sync: SyncConfig, agent: str, task: str,
          leftover: dict[str, Any] | None, made: dict[str, Any]) -> SyncResult:
    if not is_repo_top(workspace):
        return SyncResult(SKIPPED, f"sync is set but the workspace {workspace} is not the top of "
                          "a git work tree: not synced")
    upstream_ref = f"refs/remotes/{sync.remote}/{sync.branch}"
    before = head(workspace)
    branch = git(workspace, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    if branch != sync.branch:
        return SyncResult(REFUSED, f"the workspace is on {branch or 'a detached HEAD'}, not on "
                          f"{sync.branch}; not synced (a person's choice is not undone)",
                          before=before)
    operation = _operation_in_progress(workspace)
    if operation:
        return SyncResult(REFUSED, f"{operation} is in progress in the workspace: not synced, "
                          "nothing touched", before=before)
    dirty = dirty_state(workspace)
    stash = None
    if dirty:
        ours = bool(leftover) and leftover.get("head") == before and \
            leftover.get("dirty") == dirty
        if not ours:
            listed = [f"{v[:2]} {p}" for p, v in sorted(dirty.items())]
            return SyncResult(
                REFUSED, f"the workspace has {len(dirty)} uncommitted change(s) the runner did "
                "not make (" + ", ".join(p for p in sorted(dirty)[:5])
                + (" ..." if len(dirty) > 5 else "") + "); nothing was touched, so no commit "
                "lands on top of a person's work",
                before=before, dirty=listed[:DIRTY_LISTED_MAX])
        message = STASH_MESSAGE.format(agent=agent, left_by=leftover.get("task"), task=task)
        stash_id = stash_own(workspace, message)
        if stash_id:
            stash = made["stash"] = {"id": stash_id, "message": message, "state": "kept"}
    fetch = git(workspace, "fetch", "--quiet", "--no-tags", sync.remote,
                f"+refs/heads/{sync.branch}:{upstream_ref}", check=False)
    if fetch.returncode != 0:
        kept = _apply_back(workspace, before, stash)
        return SyncResult(REFUSED, f"git fetch {sync.remote} {sync.branch} failed: not synced"
                          + kept, before=before, stash=stash,
                          detail=(fetch.stderr or fetch.stdout).strip())
    upstream = head_of(workspace, upstream_ref)
    ahead, behind = (int(n) for n in _out(
        workspace, "rev-list", "--left-right", "--count", f"HEAD...{upstream_ref}").split())
    action = "none"
    if behind and not ahead:
        action = "fast-forward"
        done = git(workspace, "merge", "--ff-only", "--quiet", upstream_ref, check=False)
        if done.returncode != 0:  # e.g. a file git will not overwrite: restore, keep aside
            return _conflict(workspace, task, before, upstream, stash, action, ahead,
                             _no_hints(done), sync, what="the fast-forward failed")
    elif behind:
        action = "rebase"
        done = git(workspace, "rebase", "--quiet", upstream_ref, check=False)
        if done.returncode != 0:
            return _conflict(workspace, task, before, upstream, stash, action, ahead,
                             _no_hints(done), sync)
    if stash:
        applied = git(workspace, "stash", "apply", "--index", "--quiet", stash["id"], check=False)
        if applied.returncode != 0:
            return _conflict(workspace, task, before, upstream, stash, action, ahead,
                             _no_hints(applied), sync,
                             what="the runner's uncommitted work did not apply back")
        if drop_own_stash(workspace, stash["id"]):
            stash["state"] = "applied"
    after = head(workspace)
    summary = {"none": f"{sync.branch} is up to date with {sync.remote}"
                       + (f" ({ahead} local commit(s) not pushed)" if ahead else ""),
               "fast-forward": f"{sync.branch} fast-forwarded {before[:12]}..{after[:12]} from "
                               f"{sync.remote}",
               "rebase": f"{ahead} local commit(s) rebased onto {sync.remote}/{sync.branch} "
                         f"({upstream[:12]})"}[action]
    if stash:
        summary += "; the previous task's uncommitted work was stashed and applied back"
    return SyncResult(SYNCED, summary, before=before, after=after, action=action,
                      upstream=upstream, stash=stash)


def _no_hints(done: subprocess.CompletedProcess) -> str:
    """git's output without its ``hint:`` lines (they suggest steps the runner has undone)."""
    return "\n".join(line for line in (done.stdout + done.stderr).splitlines()
                     if not line.startswith("hint:")).strip()


def head_of(workspace: Path, ref: str) -> str:
    """The commit ``ref`` names.

    Raises:
        GitError: no such ref.
    """
    return _out(workspace, "rev-parse", "--verify", ref + "^{commit}")


def _apply_back(workspace: Path, before: str, stash: dict[str, Any] | None) -> str:
    """Put the runner's stash back after a sync that changed nothing; say where it is if not."""
    if not stash:
        return ""
    done = git(workspace, "stash", "apply", "--index", "--quiet", stash["id"], check=False)
    if done.returncode == 0 and drop_own_stash(workspace, stash["id"]):
        stash["state"] = "applied"
        return ""
    _restore(workspace, before, stash["id"])
    return f"; the runner's uncommitted work is kept in stash {stash['id'][:12]}"


def _conflict(workspace: Path, task: str, before: str, upstream: str,
              stash: dict[str, Any] | None, action: str, ahead: int, detail: str,
              sync: SyncConfig, what: str = "") -> SyncResult:
    restored = _restore(workspace, before, stash["id"] if stash else None)
    wip = _wip_branch(workspace, task, before) if ahead else None
    where = []
    if wip:
        where.append(f"its {ahead} local commit(s) are on {sync.branch} as before and kept on "
                     f"branch {wip}")
    if stash:
        where.append(f"the uncommitted work is kept in stash {stash['id'][:12]} "
                     f"(\"{stash['message']}\")")
    summary = (f"syncing {sync.branch} with {sync.remote}/{sync.branch} ({upstream[:12]}) "
               f"conflicted{': ' + what if what else ''}; the workspace is back at "
               f"{before[:12]}, as before the sync" + ("; " + "; ".join(where) if where else "")
               + "; a person must resolve the conflict")
    return SyncResult(CONFLICT, summary, before=before, after=None, action=action,
                      upstream=upstream, stash=stash, wip_branch=wip,
                      detail=f"{detail}\n[{restored}]".strip())


# -- the sentinel and the leftover record ------------------------------------------------------

def write_sentinel(path: Path, *, task: str, message_file: str, attempt: int,
                   start_commit: str, sync: SyncConfig) -> None:
    """Write the in-progress sentinel atomically (``attempt`` 0: synced, no attempt yet)."""
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "task": task,
                             "message_file": message_file, "attempt": attempt,
                             "start_commit": start_commit, "remote": sync.remote,
                             "branch": sync.branch, "updated": now_iso()})


def read_sentinel(path: Path) -> dict[str, Any] | None:
    """The sentinel, or ``None`` when there is none (or it is unreadable: then it is ignored
    and the task is treated as new, which refuses rather than overwrites)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_file(path: Path) -> None:
    """Remove ``path`` if it exists."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def record_leftover(path: Path, workspace: Path, task: str) -> None:
    """Record what task ``task`` leaves uncommitted (HEAD and :func:`dirty_state`), so the
    next task's sync knows the runner made it; no record when the tree is clean.

    Raises:
        GitError: git failed.
    """
    dirty = dirty_state(workspace)
    if not dirty:
        remove_file(path)
        return
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "task": task,
                             "head": head(workspace), "dirty": dirty, "recorded": now_iso()})
