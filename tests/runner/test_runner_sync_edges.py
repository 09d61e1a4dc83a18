"""Sync edge cases (issue 14), with real git and the real runner: untracked files of the
runner's work that the sync brings in too (decided per file), a stale or held
``.git/index.lock``, a runner stash that vanished during a crash, and refusals that name the
commit and the real state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.runner.test_runner import make_fleet  # noqa: F401  (a fixture)
from tests.runner.test_runner_sync import SYNC, _progress, _stashes, do, git, repos  # noqa: F401

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "blueprint", "runner"))


def _leave_untracked(fleet, text: str) -> None:
    """Task t1 leaves notes.txt untracked (recorded as the runner's leftover)."""
    fleet.drop("t1", kind="agent", channel=None, text=do(f"write notes.txt {text}"))
    assert fleet.run().returncode == 0
    assert fleet.where("t1") == ["done"]


def test_an_identical_untracked_file_brought_in_by_the_sync_is_fine(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    _leave_untracked(fleet, "same")
    pushed = repos.push("notes.txt", "same\n")  # a person commits the very same file
    fleet.drop("t2", kind="agent", channel=None, text=do("write other.txt x"))
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    sync = _progress(fleet, "t2")["sync"]
    assert sync["status"] == "synced", sync
    assert "identical to what the sync brought in: notes.txt" in sync["summary"]
    assert git(ws, "rev-parse", "HEAD") == pushed
    assert (ws / "notes.txt").read_text() == "same\n"
    assert fleet.where("t2") == ["done"] and _stashes(ws) == []


def test_a_different_untracked_file_brought_in_by_the_sync_fails_clean(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    before = git(ws, "rev-parse", "HEAD")
    _leave_untracked(fleet, "mine")
    repos.push("notes.txt", "theirs\n")
    fleet.drop("t2", kind="agent", channel=None, text=do("write other.txt x"))
    assert fleet.run().returncode == 0
    sync = _progress(fleet, "t2")["sync"]
    assert sync["status"] == "conflict"
    assert "notes.txt" in sync["detail"]
    assert git(ws, "rev-parse", "HEAD") == before  # back where it was
    assert sync["stash"]["state"] == "kept"  # the work aside, in the runner's stash
    assert git(ws, "show", f"{sync['stash']['id']}^3:notes.txt") == "mine"
    assert fleet.where("t2") == ["failed"]


def test_a_stale_index_lock_is_removed_and_the_sync_goes_on(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    _leave_untracked(fleet, "mine")  # a dirty tree: the runner must stash, which needs the lock
    (ws / ".git" / "index.lock").write_text("")  # a git killed mid-write left it
    pushed = repos.push("docs/a.md", "a\n")
    fleet.drop("t2", kind="agent", channel=None, text=do("write other.txt x"))
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    sync = _progress(fleet, "t2")["sync"]
    assert sync["status"] == "synced", sync
    assert "removed a stale" in sync["summary"] and "index.lock" in sync["summary"]
    assert git(ws, "rev-parse", "HEAD") == pushed and not (ws / ".git" / "index.lock").exists()


def test_a_held_index_lock_names_its_holder_and_is_left(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    lock = ws / ".git" / "index.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import signal, sys\n"
                               "f = open(sys.argv[1], 'w'); print('held', flush=True)\n"
                               "signal.pause()\n", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        fleet.drop("t1", kind="agent", channel=None, text=do("write a.txt x"))
        assert fleet.run().returncode == 0
    finally:
        holder.kill()
        holder.wait()
    sync = _progress(fleet, "t1")["sync"]
    assert sync["status"] == "refused"
    assert f"held by pid {holder.pid}" in sync["summary"]
    assert lock.exists()  # never removed from under its holder
    [notice] = fleet.notices()
    assert f"pid {holder.pid}" in notice["reason"]


def test_a_rebase_in_progress_is_named_as_such_with_the_commit(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    (ws / "README").write_text("agent's line\n")
    git(ws, "commit", "-qam", "agent: README")
    repos.push("README", "person's line\n")
    git(ws, "fetch", "-q")
    rebase = subprocess.run(["git", "rebase", "origin/main"], cwd=ws, capture_output=True)
    assert rebase.returncode != 0  # a conflict: the rebase stops midway, HEAD detached
    at = git(ws, "rev-parse", "HEAD")
    fleet.drop("t1", kind="agent", channel=None, text=do("write a.txt x"))
    assert fleet.run().returncode == 0
    sync = _progress(fleet, "t1")["sync"]
    assert sync["status"] == "refused"
    assert "a rebase is in progress" in sync["summary"] and "detached" not in sync["summary"]
    assert at[:12] in sync["summary"]


def test_a_runner_stash_that_vanished_in_a_crash_is_not_nothing(repos, tmp_path):
    from fleet_runner import reposync
    from fleet_runner.config import SyncConfig

    ws = repos.clone(tmp_path / "ws")
    head = git(ws, "rev-parse", "HEAD")
    sentinel = tmp_path / "sync-in-progress.json"
    # What a sync cut short by a crash recorded: it had stashed wip.txt (its id known), and
    # the stash is no longer there, nor is its work in the tree.
    sentinel.write_text(json.dumps({
        "task": "t2", "before": head, "remote": "origin", "branch": "main",
        "stash_ref_before": None, "stash_message": "fleet-runner a1: left by task t1, before "
        "task t2", "stash_id": "0" * 40, "stash_dirty": {"wip.txt": "?? sha256:x"},
        "recoveries": 0}))
    result = reposync.sync_workspace(ws, SyncConfig("main"), agent="a1", task="t2",
                                     leftover=None, sentinel=sentinel)
    assert result.status == "refused"
    assert "is gone and its work is not in the tree" in result.summary
