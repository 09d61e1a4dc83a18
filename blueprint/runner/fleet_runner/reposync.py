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
   A failure (the runner's own stash, if any, is applied back first) is *retry* (the caller
   tries the task again later, a bounded number of times), but when ``REMOTE`` is not a
   configured remote or the remote has no ``BRANCH``: those are *refused* at once.
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

Any other git failure once the runner has stashed its work (:class:`GitError`) restores the
pre-sync commit and applies that stash back before the task is refused.

The **sync sentinel** (``STATE/sync-in-progress.json``) is written before the sync changes
anything: the task, the commit before, the stash ref before and the stash message, then the
runner's stash id once it has one. A runner that crashes mid-sync finds it when it takes the
same task again and first undoes its own half-done sync (:func:`_recover`): it aborts its own
rebase (only one whose ``orig-head`` is the commit before, on the branch), restores the commit
before, applies its own stash back and drops it, then syncs again. Anything it cannot account
for (an operation it did not start, uncommitted changes with HEAD moved and no stash of its
own) refuses the task with nothing touched. At most :data:`SYNC_RECOVERIES_MAX` recoveries
per task.

The **in-progress sentinel** (``STATE/in-progress.json``, :func:`write_sentinel`) names the
task, the attempt and the commit the task started from; it is written after the sync and
before every attempt, and removed when the task ends. A runner that finds it (after a crash)
resumes the task without syncing again: it does not reset, rebase or redo over the commits
the interrupted attempt left, and the next attempt is told which they are
(:func:`commits_since`).

Every git command runs in the workspace with a timeout (:data:`GIT_TIMEOUT_S`), no terminal
prompts, no editor, autostash off (the runner stashes explicitly, or not at all), and no hooks
and no fsmonitor (``core.hooksPath=/dev/null``, ``core.fsmonitor=false``): what an agent put
in ``.git/hooks`` does not run in the runner's git commands.

:func:`committed_paths` lists the files commits made during a task changed, for the scope gate.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.config import SyncConfig
from fleet_runner.names import encode_name
from fleet_runner.records import SCHEMA_VERSION, now_iso, read_json, write_json_atomic
from fleet_runner.snapshot import fingerprint

GIT_TIMEOUT_S = 120.0
"""Wall-clock seconds for one git command (a fetch included)."""
STASH_MESSAGE = "fleet-runner {agent}: left by task {left_by}, before task {task}"
WIP_BRANCH_PREFIX = "fleet-runner/wip/"
DIRTY_LISTED_MAX = 20
"""At most this many uncommitted paths are named in a refusal."""

SYNC_RECOVERIES_MAX = 3
"""At most this many syncs of one task cut short by a crash are undone and redone."""

SYNCED, SKIPPED, REFUSED, CONFLICT, RETRY = "synced", "skipped", "refused", "conflict", "retry"
_OPERATIONS = (("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or am"),
               ("MERGE_HEAD", "a merge"), ("CHERRY_PICK_HEAD", "a cherry-pick"),
               ("REVERT_HEAD", "a revert"), ("BISECT_LOG", "a bisect"))


class GitError(Exception):
    """A git command failed or timed out (the message has the command and its output)."""


@dataclass
class SyncResult:
    """What :func:`sync_workspace` did.

    Attributes:
        status: ``"synced"``, ``"skipped"`` (not a git work tree's top), ``"refused"``,
            ``"conflict"`` or ``"retry"`` (the fetch failed, maybe for a while: try the task
            again later); the task runs on the first two only.
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
        recovered: what was undone of a sync a crash cut short before this one, or ``None``.
        rewritten_from: when the sync was refused because the remote branch was rewritten,
            the commit it had before (what the next sync must compare with again).
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
    recovered: str | None = None
    rewritten_from: str | None = None

    @property
    def runs(self) -> bool:
        """Whether the task may run."""
        return self.status in (SYNCED, SKIPPED)

    def to_json(self) -> dict[str, Any]:
        """The record form."""
        return {"status": self.status, "summary": self.summary, "before": self.before,
                "after": self.after, "action": self.action, "upstream": self.upstream,
                "stash": self.stash, "wip_branch": self.wip_branch, "dirty": self.dirty,
                "detail": self.detail, "recovered": self.recovered}


_RUN_AS: dict[str, Any] = {}
"""``subprocess`` arguments that run git as the agent's user (:func:`run_as`), or none."""
_HOME: dict[str, str] = {}


def run_as(uid: int, gid: int, home: str) -> None:
    """Run every git command of this module as user ``uid`` (group ``gid``, ``HOME``
    ``home``): the workspace belongs to the agent's user, and its objects and index must stay
    its own (two users: docs/runner.md)."""
    _RUN_AS.update(user=uid, group=gid, extra_groups=[])
    _HOME.update(HOME=home)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(_HOME)
    # GIT_NO_REPLACE_OBJECTS: an agent's `git replace NEW OLD` would show the runner OLD's
    # tree for a commit that holds NEW's (and a push sends NEW): the scope gate would pass it.
    env.update(GIT_TERMINAL_PROMPT="0", GIT_EDITOR="true", GIT_SEQUENCE_EDITOR="true",
               GIT_MERGE_AUTOEDIT="no", LC_ALL="C", GIT_NO_REPLACE_OBJECTS="1")
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def git(workspace: Path, *args: str, check: bool = True,
        timeout_s: float = GIT_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``git ARGS`` in ``workspace`` (autostash, hooks and fsmonitor off); return the
    finished process.

    Raises:
        GitError: git is missing, timed out, or (with ``check``) exited non-zero.
    """
    argv = ["git", "-c", "rebase.autoStash=false", "-c", "merge.autoStash=false",
            "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", *args]
    try:
        done = subprocess.run(argv, cwd=workspace, env=_env(), capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, stdin=subprocess.DEVNULL,
                              **_RUN_AS)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)}: no answer within {timeout_s:g} s") from None
    if check and done.returncode != 0:
        raise GitError(f"git {' '.join(args)} exited {done.returncode}: "
                       f"{(done.stderr or done.stdout).strip() or '(git printed nothing)'}")
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


def head_or_none(workspace: Path) -> str | None:
    """The commit id HEAD is on, or ``None`` when it is on no commit (an unborn branch)."""
    done = git(workspace, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def current_branch(workspace: Path) -> str | None:
    """The branch HEAD is on (``main``), or ``None`` when it is detached."""
    done = git(workspace, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _tree_diff(workspace: Path, start: str | None, tip: str) -> set[str]:
    if start is None:
        raw = git(workspace, "ls-tree", "-r", "-z", "--name-only", tip).stdout
    else:
        raw = git(workspace, "diff", "--no-renames", "--no-ext-diff", "--name-only", "-z",
                  start, tip, "--").stdout
    return {p for p in raw.split("\0") if p}


def committed_paths(workspace: Path, start: str | None, branch: str | None = None) -> list[str]:
    """The workspace-relative paths commits made since ``start`` changed, sorted.

    That is every path that differs between ``start``'s tree and HEAD's (``git diff
    --no-renames --name-only``: both sides of a rename), whether HEAD descends from ``start``
    or was moved anywhere else; and, when ``branch`` (the branch HEAD was on at ``start``)
    still exists at another commit than HEAD, every path that differs between ``start`` and
    its tip too (detaching HEAD does not hide what was committed on the branch). ``start``
    ``None`` (the repository had no commit then): every file of those commits. What happened
    in between (a file added, then removed by a later commit) is not judged: the trees are.

    Raises:
        GitError: git failed (``start`` unknown, or no repository any more).
    """
    tips: list[str] = []
    now = head_or_none(workspace)
    if now is not None:
        tips.append(now)
    if branch:
        done = git(workspace, "rev-parse", "-q", "--verify", f"refs/heads/{branch}^{{commit}}",
                   check=False)
        if done.returncode == 0 and done.stdout.strip() not in tips:
            tips.append(done.stdout.strip())
    paths: set[str] = set()
    for tip in tips:
        if tip != start:
            paths |= _tree_diff(workspace, start, tip)
    return sorted(paths)


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


def lock_holders(path: Path) -> list[str]:
    """``"pid N (command line)"`` of each process with ``path`` open (``/proc/*/fd``)."""
    target = os.path.realpath(path)
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
                    found.append(f"pid {pid} ({cmd.strip()[:120]})")
                    break
            except OSError:
                continue
    return found


def clear_stale_index_lock(workspace: Path) -> str | None:
    """Remove ``.git/index.lock`` when no process holds it open (a git killed mid-write left
    it); return what was done, or ``None`` when there was none.

    Raises:
        GitError: a process holds it (named: pid and command line); nothing touched.
    """
    git_dir = Path(_out(workspace, "rev-parse", "--absolute-git-dir"))
    lock = git_dir / "index.lock"
    if not os.path.lexists(lock):
        return None
    holders = lock_holders(lock)
    if holders:
        raise GitError(f"{lock} is held by {', '.join(holders)}: a git command is under way "
                       "in the workspace; not synced, nothing touched")
    os.unlink(lock)
    return f"removed a stale {lock} (no process held it)"


def _untracked_collisions(workspace: Path, stash_id: str) -> dict[str, list[str]]:
    """The untracked files of the runner's stash that are now in the work tree (the sync
    brought them in), by whether their content is ``identical`` or ``different``. Identical
    ones are removed from the work tree so that the stash applies back (it writes the same
    bytes); different ones are left for the caller to fail clean on."""
    out: dict[str, list[str]] = {"identical": [], "different": []}
    for rel in _untracked_of(workspace, stash_id):
        path = os.path.join(workspace, rel)
        if not os.path.lexists(path):
            continue
        stashed = subprocess.run(
            ["git", "cat-file", "blob", f"{stash_id}^3:{rel}"], cwd=workspace, env=_env(),
            capture_output=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False,
            **_RUN_AS)
        try:
            same = stashed.returncode == 0 and not os.path.islink(path) and \
                Path(path).read_bytes() == stashed.stdout
        except OSError:
            same = False
        out["identical" if same else "different"].append(rel)
    if not out["different"]:
        for rel in out["identical"]:
            os.unlink(os.path.join(workspace, rel))
    return out


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
    # The id's encoded form (names.py), with every "." as %2E too: git refuses ".." and a
    # ".lock" ending in a ref name, and "~" (only in a cut form).
    base = WIP_BRANCH_PREFIX + encode_name(task).replace(".", "%2E").replace("~", "-")
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
                   leftover: dict[str, Any] | None,
                   sentinel: Path | None = None,
                   known_upstream: str | None = None) -> SyncResult:
    """Sync the workspace repository before task ``task`` (module docstring, steps 1-5).

    Args:
        workspace: the agent's workspace.
        sync: the remote and branch to follow.
        agent: the agent's name (in the stash message).
        task: the task about to start (in the stash message and the wip branch name).
        leftover: what the runner's previous task left uncommitted (:func:`record_leftover`),
            or ``None``.
        sentinel: the sync sentinel's path (module docstring), or ``None`` for none. When it
            names ``task``, the sync it records was cut short by a crash: that is undone first.
            The caller removes it once the result is recorded.
        known_upstream: the remote branch's commit at the last sync that went through, as
            the runner recorded it, or ``None`` (then the remote-tracking ref before the
            fetch): commits the remote had then and has no more are not brought back.

    Returns:
        The result; a git failure is a ``"refused"`` result, never an exception.
    """
    made: dict[str, Any] = {}
    recovered: str | None = None
    try:
        prior = read_sentinel(sentinel) if sentinel is not None else None
        if prior and prior.get("task") == task:
            made["recoveries"] = int(prior.get("recoveries") or 0) + 1
            undone = _recover(workspace, sync, prior, made)
            if isinstance(undone, SyncResult):
                return undone
            recovered = undone
        result = _sync(workspace, sync, agent, task, leftover, made, sentinel, known_upstream)
        result.recovered = recovered
        return result
    except GitError as exc:
        stash = made.get("stash")
        where = ""
        if stash and stash["state"] == "kept":
            where = (f"; the runner's uncommitted work is in stash {stash['id'][:12]} "
                     f"(\"{stash['message']}\")")
            if made.get("before") and not made.get("given_back"):
                # Never leave the runner's own work stashed behind a refusal: back to the
                # commit before the sync, the stash applied back.
                try:
                    where = _give_back(workspace, made["before"], stash) and where
                except GitError as again:
                    where += f", not applied back: {again}"
        return SyncResult(REFUSED, f"the working repository could not be synced: {exc}{where}",
                          before=made.get("before"), stash=stash, detail=str(exc),
                          recovered=recovered)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text("utf-8").strip()
    except OSError:
        return None


def _stash_made_since(workspace: Path, ref_before: str | None, message: str,
                      before: str) -> str | None:
    """The runner's stash when ``refs/stash`` moved from ``ref_before`` to a stash of
    ``before`` with ``message`` (a stash push a crash interrupted before it was recorded)."""
    done = git(workspace, "rev-parse", "-q", "--verify", "refs/stash", check=False)
    now = done.stdout.strip()
    if done.returncode != 0 or now == (ref_before or ""):
        return None
    subject = git(workspace, "log", "-1", "--format=%s", now, check=False).stdout.strip()
    parent = git(workspace, "rev-parse", "-q", "--verify", now + "^1", check=False).stdout.strip()
    return now if subject.endswith(": " + message) and parent == before else None


def _recover(workspace: Path, sync: SyncConfig, prior: dict[str, Any],
             made: dict[str, Any]) -> str | SyncResult:
    """Undo the runner's own sync a crash cut short (its sentinel ``prior``); return what was
    done, or the result when that sync had in fact finished (its stash applied and dropped,
    HEAD moved on).

    Raises:
        GitError: what is there is not the runner's to undo, or git failed (nothing of a
            person's is touched).
    """
    before = prior.get("before")
    if not isinstance(before, str) or not before:
        raise GitError("the sync sentinel names no commit: not recovered")
    if made["recoveries"] > SYNC_RECOVERIES_MAX:
        raise GitError(f"the sync of this task was cut short {made['recoveries'] - 1} times: "
                       "not tried again")
    notes: list[str] = []
    stash_id = prior.get("stash_id") if isinstance(prior.get("stash_id"), str) else None
    message = prior.get("stash_message")
    if not stash_id and message:
        stash_id = _stash_made_since(workspace, prior.get("stash_ref_before"), message, before)
    stashed = stash_id is not None and find_stash(workspace, stash_id) is not None
    if stashed:
        # Named in a refusal; not applied back by it (what is there is not the runner's).
        made["stash"] = {"id": stash_id, "message": message, "state": "kept"}
        made["given_back"] = True
    git_dir = Path(_out(workspace, "rev-parse", "--absolute-git-dir"))
    for name in ("rebase-merge", "rebase-apply"):
        state = git_dir / name
        if not state.is_dir():
            continue
        if _read_text(state / "orig-head") != before or \
                _read_text(state / "head-name") != f"refs/heads/{sync.branch}":
            raise GitError("a rebase the runner did not start is in progress: nothing touched")
        git(workspace, "rebase", "--abort")
        notes.append("aborted its rebase")
        break
    operation = _operation_in_progress(workspace)
    if operation:
        raise GitError(f"{operation} the runner did not start is in progress: nothing touched")
    now = head(workspace)
    if stash_id and not stashed and prior.get("stash_dirty") is not None:
        # Told apart by the work itself: applied back (the tree holds exactly what was
        # stashed) or lost (it does not).
        if dirty_state(workspace) == prior["stash_dirty"]:
            return SyncResult(SYNCED, "synced before a runner restart (the sync had finished "
                              "when the runner stopped)", before=before, after=now,
                              recovered="nothing to undo: the sync had finished")
        raise GitError(f"the runner's stash {stash_id[:12]} (\"{message}\"), made by the sync "
                       "a crash cut short, is gone and its work is not in the tree: it is not "
                       "taken as 'nothing had changed'; nothing touched")
    if stash_id and not stashed and now != before:
        # Applied back and dropped: the sync had reached its end.
        return SyncResult(SYNCED, "synced before a runner restart (the sync had finished "
                          "when the runner stopped)", before=before, after=now,
                          recovered="nothing to undo: the sync had finished")
    if stashed and stash_id is not None:
        stash = made["stash"]
        notes.append(_restore(workspace, before, stash_id))
        if _give_back(workspace, before, stash, restore=False):
            # Tried: the workspace is back at ``before``, the stash kept (named in the refusal).
            raise GitError("the runner's stash of the sync cut short did not apply back")
        del made["stash"], made["given_back"]
        notes.append(f"applied its stash {stash_id[:12]} back")
    elif now != before:
        # No stash of its own: the tree was clean when the sync began.
        if dirty_state(workspace):
            raise GitError(f"HEAD moved from {before[:12]} during the sync cut short, and there "
                           "are uncommitted changes the runner cannot account for: nothing "
                           "touched")
        git(workspace, "reset", "-q", "--hard", before)
        notes.append(f"reset --hard {before[:12]}")
    return "the sync cut short by a runner restart was undone: " + (
        "; ".join(notes) if notes else "nothing had changed")


def _write_sync_sentinel(sentinel: Path | None, **fields: Any) -> None:
    if sentinel is not None:
        write_json_atomic(sentinel, {"schema_version": SCHEMA_VERSION, **fields,
                                     "updated": now_iso()})


def _remote_is_missing(workspace: Path, sync: SyncConfig, detail: str) -> bool:
    """Whether a failed fetch is one waiting will not mend: no such remote, or no such branch
    on it."""
    if git(workspace, "remote", "get-url", sync.remote, check=False).returncode != 0:
        return True
    return "couldn't find remote ref" in detail


def _sync(workspace: Path, sync: SyncConfig, agent: str, task: str,
          leftover: dict[str, Any] | None, made: dict[str, Any],
          sentinel: Path | None = None, known: str | None = None) -> SyncResult:
    if not is_repo_top(workspace):
        return SyncResult(SKIPPED, f"sync is set but the workspace {workspace} is not the top of "
                          "a git work tree: not synced")
    upstream_ref = f"refs/remotes/{sync.remote}/{sync.branch}"
    before = head(workspace)
    # The real state first: during a rebase HEAD is detached, but the rebase is the news.
    operation = _operation_in_progress(workspace)
    if operation:
        return SyncResult(REFUSED, f"{operation} is in progress in the workspace (HEAD at "
                          f"{before[:12]}): not synced, nothing touched", before=before)
    branch = git(workspace, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    if branch != sync.branch:
        where = f"branch {branch}" if branch else "a detached HEAD"
        return SyncResult(REFUSED, f"the workspace is on {where} at {before[:12]}, not on "
                          f"{sync.branch}; not synced (a person's choice is not undone)",
                          before=before)
    lock_note = clear_stale_index_lock(workspace)
    if lock_note is not None:
        made["lock"] = lock_note
    dirty = dirty_state(workspace)
    stash = None
    message = None
    if dirty:
        if leftover is None or not (leftover.get("head") == before
                                    and leftover.get("dirty") == dirty):  # not the runner's
            listed = [f"{v[:2]} {p}" for p, v in sorted(dirty.items())]
            return SyncResult(
                REFUSED, f"the workspace (HEAD at {before[:12]} on {sync.branch}) has "
                f"{len(dirty)} uncommitted change(s) the runner did "
                "not make (" + ", ".join(p for p in sorted(dirty)[:5])
                + (" ..." if len(dirty) > 5 else "") + "); nothing was touched, so no commit "
                "lands on top of a person's work",
                before=before, dirty=listed[:DIRTY_LISTED_MAX])
        message = STASH_MESSAGE.format(agent=agent, left_by=leftover.get("task"), task=task)
    made["before"] = before
    ref_before = git(workspace, "rev-parse", "-q", "--verify", "refs/stash",
                     check=False).stdout.strip() or None
    marks = {"task": task, "before": before, "remote": sync.remote, "branch": sync.branch,
             "stash_ref_before": ref_before, "stash_message": message, "stash_id": None,
             "stash_dirty": dirty if message else None,
             "recoveries": made.get("recoveries", 0)}
    _write_sync_sentinel(sentinel, **marks)  # before anything changes
    if message:
        stash_id = stash_own(workspace, message)
        if stash_id:
            stash = made["stash"] = {"id": stash_id, "message": message, "state": "kept"}
            _write_sync_sentinel(sentinel, **{**marks, "stash_id": stash_id})
    known_upstream = known
    if known_upstream is None:
        try:
            known_upstream = head_of(workspace, upstream_ref)  # before the fetch moves it
        except GitError:
            known_upstream = None  # never fetched
    try:
        fetch = git(workspace, "fetch", "--quiet", "--no-tags", sync.remote,
                    f"+refs/heads/{sync.branch}:{upstream_ref}", check=False)
        fetch_error = (fetch.stderr or fetch.stdout).strip() if fetch.returncode else None
    except GitError as exc:  # a timeout
        fetch_error = str(exc)
    if fetch_error is not None:
        kept = _apply_back(workspace, before, stash)
        status = REFUSED if _remote_is_missing(workspace, sync, fetch_error) else RETRY
        return SyncResult(status, f"git fetch {sync.remote} {sync.branch} failed: not synced"
                          + kept, before=before, stash=stash, detail=fetch_error)
    upstream = head_of(workspace, upstream_ref)
    dropped = _dropped_by_remote(workspace, known_upstream, upstream)
    if dropped:
        # A rebase would replay them as the agent's own commits, and its next push would put
        # back what a person removed from the remote (a force-push).
        kept = _apply_back(workspace, before, stash)
        shown = ", ".join(c[:12] for c in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
        return SyncResult(REFUSED, f"{sync.remote}/{sync.branch} was rewritten (force-pushed): "
                          f"{len(dropped)} commit(s) it no longer has are in this workspace's "
                          f"history ({shown}); syncing would bring them back as the agent's "
                          "own: not synced, a person decides" + kept, before=before,
                          stash=stash, upstream=upstream, rewritten_from=known_upstream)
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
        collided = _untracked_collisions(workspace, stash["id"])
        if collided["different"]:
            return _conflict(workspace, task, before, upstream, stash, action, ahead,
                             "untracked file(s) of the runner's work that the sync brought in "
                             "with other content: " + ", ".join(collided["different"]), sync,
                             what="an untracked file of the runner's work differs from the "
                             "one the sync brought in")
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
        if collided["identical"]:
            summary += (" (identical to what the sync brought in: "
                        + ", ".join(collided["identical"]) + ")")
    if made.get("lock"):
        summary += f"; {made['lock']}"
    return SyncResult(SYNCED, summary, before=before, after=after, action=action,
                      upstream=upstream, stash=stash)


def _dropped_by_remote(workspace: Path, known: str | None, upstream: str | None) -> list[str]:
    """The commits the remote branch had at the last fetch (``known``), no longer has now
    (``upstream``: it was rewritten) and this workspace's HEAD still contains, oldest first;
    ``[]`` when the branch only moved forward, or nothing is known."""
    if not known or not upstream or known == upstream:
        return []
    if git(workspace, "cat-file", "-e", f"{known}^{{commit}}", check=False).returncode != 0:
        return []  # not in this repository (a recorded commit of another clone)
    if git(workspace, "merge-base", "--is-ancestor", known, upstream,
           check=False).returncode == 0:
        return []
    gone = set(_out(workspace, "rev-list", known, f"^{upstream}").split())
    local = _out(workspace, "rev-list", "--reverse", "HEAD", f"^{upstream}").split()
    return [c for c in local if c in gone]


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
    return _give_back(workspace, before, stash, restore=False)


def _give_back(workspace: Path, before: str, stash: dict[str, Any], restore: bool = True) -> str:
    """Back to ``before`` (with ``restore``: :func:`_restore` first), the runner's stash
    applied back and dropped; ``""``, or where the stash is kept when it did not apply."""
    if restore:
        _restore(workspace, before, stash["id"])
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
