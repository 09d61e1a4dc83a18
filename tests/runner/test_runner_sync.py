"""Working-repository sync (DESIGN.md §7) with real git: a bare remote, a person's clone, and
the agent's workspace cloned from it; the runner as a real process with the `gitwork` fake
agent. A person's uncommitted change refuses the task; a conflict restores the pre-sync tree
with the work kept aside; a crash mid-task resumes from the partial commits; the runner only
ever drops the stash it made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner import reposync  # noqa: E402
from fleet_runner.config import SyncConfig  # noqa: E402
from fleet_runner.loop import SYNC_FETCH_ATTEMPTS  # noqa: E402

from tests.helpers import wait_until  # noqa: E402
from tests.runner.test_runner import FAKES, make_fleet  # noqa: E402, F401  (a fixture)

SYNC = {"sync": {"remote": "origin", "branch": "main"}}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _identity(repo: Path, name: str) -> None:
    git(repo, "config", "user.name", name)
    git(repo, "config", "user.email", f"{name.lower()}@example.org")


@dataclass
class Repos:
    remote: Path
    person: Path

    def push(self, rel: str, text: str, to: Path | None = None) -> str:
        """The person commits ``rel`` and pushes (to the remote, or to the bare repository at
        ``to``: the remote moved away); returns the new commit."""
        path = self.person / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git(self.person, "add", "--", rel)
        git(self.person, "commit", "-q", "-m", f"person: {rel}")
        git(self.person, "push", "-q", str(to) if to else "origin", "main")
        return git(self.person, "rev-parse", "HEAD")

    def clone(self, into: Path) -> Path:
        """The agent's workspace: a clone of the remote with the agent's identity."""
        into.parent.mkdir(parents=True, exist_ok=True)
        git(into.parent, "clone", "-q", str(self.remote), str(into))
        _identity(into, "Agent")
        return into


@pytest.fixture
def repos(tmp_path) -> Repos:
    """A bare remote whose main has one commit (README, src/app.py), and a person's clone."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    person = tmp_path / "person"
    git(tmp_path, "clone", "-q", str(remote), str(person))
    _identity(person, "Person")
    found = Repos(remote, person)
    (person / "src").mkdir()
    (person / "src" / "app.py").write_text("x = 1\n")
    found.push("README", "line 1\n")
    return found


def do(*steps: str) -> str:
    return "\n".join("do: " + step for step in steps)


def _progress(fleet, task: str) -> dict:
    return json.loads((fleet.state / "runs" / task / "progress.json").read_text())


def _stashes(ws: Path) -> list[str]:
    return git(ws, "stash", "list", "--format=%H %gs").splitlines()


def test_sync_fast_forwards_rebases_and_puts_its_own_leftovers_back(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    # A person's stash in the workspace: the runner must never touch it.
    (ws / "README").write_text("a person's idea\n")
    git(ws, "stash", "push", "-q", "-m", "person's stash")
    person_stash = git(ws, "rev-parse", "refs/stash")
    news = repos.push("docs/news.md", "news\n")
    fleet.drop("t1", kind="agent", channel=None,
               text=do("commit src/feature.py y = 2", "write wip.txt half done"))
    assert fleet.run().returncode == 0
    sync1 = _progress(fleet, "t1")["sync"]
    assert sync1["status"] == "synced" and sync1["action"] == "fast-forward"
    assert fleet.events("head")[0]["head"] == news == sync1["after"]
    assert fleet.where("t1") == ["done"]
    leftover = json.loads((fleet.state / "sync-leftover.json").read_text())
    assert leftover["task"] == "t1" and set(leftover["dirty"]) == {"wip.txt"}
    assert not (fleet.state / "in-progress.json").exists()  # removed when the task ended

    # The remote moves on while t1's commit is local and wip.txt uncommitted: diverged.
    later = repos.push("docs/later.md", "later\n")
    fleet.drop("t2", kind="agent", channel=None, text=do("write more.txt more"))
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    sync2 = _progress(fleet, "t2")["sync"]
    assert sync2["status"] == "synced" and sync2["action"] == "rebase"
    assert sync2["stash"]["state"] == "applied"
    assert sync2["stash"]["message"] == "fleet-runner a1: left by task t1, before task t2"
    seen = fleet.events("head")[1]
    assert {"docs/later.md", "src/feature.py", "wip.txt"} <= set(seen["files"])
    assert seen["status"] == "?? wip.txt"  # its own leftovers, back where they were
    assert git(ws, "log", "--format=%s", "-1") == "agent: src/feature.py"  # rebased on top
    git(ws, "merge-base", "--is-ancestor", later, "HEAD")
    # Its own stash was dropped; the person's is still there, untouched.
    assert [line.split()[0] for line in _stashes(ws)] == [person_stash]


def test_commits_a_force_push_removed_are_not_brought_back(make_fleet, repos):
    """A person pushed a secret, the agent's workspace fetched it, the person took it back
    with a force-push: a rebase would replay it as the agent's commit and its next push would
    restore it (found by a tryout). Refused, nothing touched, a person decides."""
    fleet = make_fleet("gitwork", role=SYNC)
    leak = repos.push("leak.txt", "s3cret\n")
    ws = repos.clone(fleet.workspace)
    git(repos.person, "reset", "-q", "--hard", "HEAD~1")
    (repos.person / "news.md").write_text("news\n")  # a new commit on top, force-pushed
    git(repos.person, "add", "news.md")
    git(repos.person, "commit", "-q", "-m", "person: news")
    git(repos.person, "push", "-q", "--force", "origin", "main")
    fleet.drop("f9", kind="agent", channel=None, text=do("write x.txt x"))
    assert fleet.run().returncode == 0
    assert fleet.events("start") == []  # the agent never ran
    [notice] = fleet.notices()
    assert notice["kind"] == "refused" and "was rewritten (force-pushed)" in notice["reason"]
    assert leak[:12] in notice["reason"]
    assert git(ws, "rev-parse", "HEAD") == leak  # nothing touched
    assert (ws / "leak.txt").exists() and _stashes(ws) == []
    # The next task too, although the refused fetch (or the agent's own) moved the
    # workspace's remote-tracking ref: the runner keeps what it compares with.
    git(ws, "fetch", "-q", "origin")
    fleet.drop("f10", kind="agent", channel=None, text=do("write y.txt y"))
    assert fleet.run().returncode == 0
    assert fleet.events("start") == [] and fleet.where("f10") == ["failed"]
    assert git(ws, "rev-parse", "HEAD") == leak
    # A person decides: the workspace back on the remote; the next task runs.
    git(ws, "reset", "-q", "--hard", "origin/main")
    fleet.drop("f11", kind="agent", channel=None, text=do("write z.txt z"))
    assert fleet.run().returncode == 0
    assert fleet.where("f11") == ["done"]


def test_a_person_s_uncommitted_change_refuses_the_task(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    before = git(ws, "rev-parse", "HEAD")
    (ws / "README").write_text("line 1\nhalf-typed by a person\n")
    (ws / "notes.txt").write_text("mine\n")
    repos.push("docs/news.md", "news\n")
    fleet.drop("t1", text=do("commit src/app.py x = 2"))
    assert fleet.run().returncode == 0
    assert fleet.events("start") == []  # the agent never ran
    assert fleet.where("t1") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "refused" and "was not run" in notice["reason"]
    assert "README" in notice["reason"] and "notes.txt" in notice["reason"]
    assert "uncommitted change(s) the runner did not make" in notice["reason"]
    assert f"(HEAD at {before[:12]} on main)" in notice["reason"]  # the commit, named
    assert " M README" in notice["detail"] and "?? notes.txt" in notice["detail"]
    # Nothing touched: same commit, same files, no stash, not even a fetch.
    assert git(ws, "rev-parse", "HEAD") == before
    assert (ws / "README").read_text() == "line 1\nhalf-typed by a person\n"
    assert (ws / "notes.txt").read_text() == "mine\n"
    assert _stashes(ws) == []
    assert git(ws, "rev-parse", "origin/main") == before
    result = json.loads((fleet.state / "runs" / "t1" / "result.json").read_text())
    assert result["outcome"] == "refused" and result["sync"]["status"] == "refused"
    assert not (fleet.state / "in-progress.json").exists()


def test_a_conflict_restores_the_pre_sync_tree_and_keeps_the_work_aside(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    fleet.drop("t1", kind="agent", channel=None,
               text=do("commit README the agent's line", "write wip.txt unfinished"))
    assert fleet.run().returncode == 0
    pre_sync = git(ws, "rev-parse", "HEAD")
    upstream = repos.push("README", "the person's line\n")  # the same line: a conflict
    fleet.drop("t2", kind="agent", channel=None, text=do("write more.txt more"))
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert [s["task"] for s in fleet.events("start")] == ["t1"]  # t2 never ran
    assert fleet.where("t2") == ["failed"]
    sync = _progress(fleet, "t2")["sync"]
    assert sync["status"] == "conflict" and sync["action"] == "rebase"
    assert sync["wip_branch"] == "fleet-runner/wip/t2" and sync["stash"]["state"] == "kept"
    # The known-good tree: the pre-sync commit, clean, no rebase left half done.
    assert git(ws, "rev-parse", "HEAD") == pre_sync
    assert git(ws, "symbolic-ref", "--short", "HEAD") == "main"
    assert git(ws, "status", "--porcelain") == ""
    assert (ws / "README").read_text() == "the agent's line\n"
    assert not (ws / ".git" / "rebase-merge").exists()
    assert not (ws / ".git" / "rebase-apply").exists()
    # The work in progress, kept aside where the escalation says.
    assert git(ws, "rev-parse", "fleet-runner/wip/t2") == pre_sync
    [stash] = _stashes(ws)
    assert stash.split()[0] == sync["stash"]["id"]
    assert stash.endswith("fleet-runner a1: left by task t1, before task t2")
    assert git(ws, "show", f"{sync['stash']['id']}^3:wip.txt") == "unfinished"
    [notice] = [n for n in fleet.notices() if n["task"] == "t2"]
    assert notice["kind"] == "sync-conflict"
    assert "fleet-runner/wip/t2" in notice["reason"] and sync["stash"]["id"][:12] in \
        notice["reason"]
    assert upstream[:12] in notice["reason"] and "CONFLICT" in notice["detail"]


def test_a_crash_mid_task_resumes_from_the_partial_commits(make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC, max_retries=2)
    ws = repos.clone(fleet.workspace)
    start = git(ws, "rev-parse", "HEAD")
    fleet.drop("c1", kind="agent", channel=None,
               text=do("commit part1.txt one", "sleep-once", "commit part2.txt two"))
    runner = fleet.start()
    try:
        fleet.wait_for("sleeping")
        sentinel = json.loads((fleet.state / "in-progress.json").read_text())
        assert (sentinel["task"], sentinel["attempt"]) == ("c1", 1)
        assert sentinel["start_commit"] == start and sentinel["branch"] == "main"
        part1 = git(ws, "rev-parse", "HEAD")
        assert part1 != start
    finally:
        runner.kill()  # a crash: no cleanup at all
        runner.wait()
    news = repos.push("docs/news.md", "news\n")  # a re-sync now would rebase part1
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("c1") == ["done"]
    assert fleet.record("c1", 1)["verdict"] == "interrupted"
    second = fleet.events("start")[1]["prompt"]
    assert f"left 1 commit(s), {part1[:7]}" in second and "agent: part1.txt" in second
    assert f"git log {start[:12]}..HEAD" in second and "Do not reset, rebase or redo" in second
    # Resumed on top of its own commit, not synced, reset or redone.
    assert fleet.events("head")[1]["head"] == part1
    assert git(ws, "log", "--format=%s", f"{start}..HEAD").splitlines() == [
        "agent: part2.txt", "agent: part1.txt"]
    assert git(ws, "rev-parse", "origin/main") == start  # not even fetched
    assert subprocess.run(["git", "cat-file", "-e", news], cwd=ws,
                          capture_output=True).returncode != 0
    assert not (fleet.state / "in-progress.json").exists()


def test_a_failed_fetch_refuses_the_task_and_changes_nothing(make_fleet, repos):
    fleet = make_fleet("gitwork", role={"sync": {"remote": "upstream", "branch": "main"}})
    ws = repos.clone(fleet.workspace)  # it has origin, not upstream
    before = git(ws, "rev-parse", "HEAD")
    fleet.drop("f1", kind="agent", channel=None, text=do("write x.txt x"))
    assert fleet.run().returncode == 0
    assert fleet.events("start") == [] and fleet.where("f1") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "refused" and "git fetch upstream main failed" in notice["reason"]
    assert "upstream" in notice["detail"]
    assert git(ws, "rev-parse", "HEAD") == before and git(ws, "status", "--porcelain") == ""


def test_sync_is_skipped_when_the_workspace_is_not_a_repository(make_fleet):
    fleet = make_fleet("clean", role=SYNC)
    fleet.drop("n1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.where("n1") == ["done"]
    sync = _progress(fleet, "n1")["sync"]
    assert sync["status"] == "skipped" and "not the top of a git work tree" in sync["summary"]
    assert not (fleet.state / "in-progress.json").exists()


def test_the_runner_drops_only_the_stash_it_made(repos, tmp_path):
    ws = repos.clone(tmp_path / "ws")
    (ws / "ours.txt").write_text("ours\n")
    ours = reposync.stash_own(ws, "fleet-runner a1: test")
    (ws / "README").write_text("theirs\n")
    git(ws, "stash", "push", "-q", "-m", "a person's, made after ours")
    theirs = git(ws, "rev-parse", "refs/stash")
    assert reposync.find_stash(ws, ours) == "stash@{1}"  # no longer on top
    assert reposync.drop_own_stash(ws, ours) is True
    assert [line.split()[0] for line in _stashes(ws)] == [theirs]
    assert reposync.drop_own_stash(ws, ours) is False  # gone: nothing else is dropped
    assert [line.split()[0] for line in _stashes(ws)] == [theirs]
    assert reposync.stash_own(ws, "nothing to stash") is None  # a clean tree: no stash made
    assert [line.split()[0] for line in _stashes(ws)] == [theirs]


# -- a sync cut short, a fetch that fails for a while, a git failure after the stash ---------

@pytest.mark.parametrize("hold", ["rebase", "stash apply"])
def test_a_crash_in_the_runner_s_own_sync_is_undone_and_the_sync_redone(
        make_fleet, repos, tmp_path, hold):
    """Killed (with its git) in the middle of its rebase, or after it but before applying
    the previous task's stashed leftovers back: the restarted runner undoes its own half-done
    sync, syncs again, and runs the task."""
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    fleet.drop("t1", kind="agent", channel=None,
               text=do("commit src/feature.py y = 2", "write wip.txt half done"))
    assert fleet.run().returncode == 0
    before = git(ws, "rev-parse", "HEAD")
    later = repos.push("docs/later.md", "later\n")  # diverged: t2's sync rebases
    fleet.drop("t2", kind="agent", channel=None, text=do("write more.txt more"))
    held = tmp_path / "held"
    fleet.extra_env = {"PATH": f"{FAKES / 'gitshim'}{os.pathsep}{os.environ['PATH']}",
                       "FAKE_GIT_HOLD": hold, "FAKE_GIT_HELD": str(held)}
    runner = subprocess.Popen(fleet.argv("--once"), env=fleet.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        wait_until(lambda: held.exists() or runner.poll() is not None)
        assert held.exists(), runner.communicate(timeout=60)
        assert len(_stashes(ws)) == 1 and not (ws / "wip.txt").exists()  # stashed
        assert (ws / ".git" / "rebase-merge").is_dir() is (hold == "rebase")
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the runner and its git: no cleanup at all
        runner.communicate()
    fleet.extra_env = None  # the real git again
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("t2") == ["done"] and fleet.notices() == []
    sync = _progress(fleet, "t2")["sync"]
    assert sync["status"] == "synced" and sync["action"] == "rebase", sync
    assert (sync["stash"] or {}).get("state") == "applied"  # its leftovers were not lost
    assert sync["recovered"].startswith("the sync cut short by a runner restart was undone")
    assert sync["before"] == before
    seen = fleet.events("head")[-1]
    assert seen["task"] == "t2" and seen["status"] == "?? wip.txt"
    assert {"docs/later.md", "src/feature.py", "wip.txt"} <= set(seen["files"])
    git(ws, "merge-base", "--is-ancestor", later, "HEAD")
    assert _stashes(ws) == [] and not (ws / ".git" / "rebase-merge").exists()
    assert not (fleet.state / "sync-in-progress.json").exists()


def _deferrals(fleet, task: str) -> list[dict]:
    path = fleet.state / "runs" / task / "progress.json"
    return json.loads(path.read_text())["sync_deferred"] if path.exists() else []


def test_a_failed_fetch_puts_the_task_back_and_is_tried_a_bounded_number_of_times(
        make_fleet, repos):
    fleet = make_fleet("gitwork", role=SYNC)
    ws = repos.clone(fleet.workspace)
    away = repos.remote.with_name("away.git")
    repos.remote.rename(away)  # the remote cannot be reached for a while
    fleet.drop("f1", kind="agent", channel=None, text=do("write x.txt x"))
    done = fleet.run()
    assert done.returncode == 0
    assert fleet.where("f1") == ["inbox"] and fleet.events("start") == []
    assert fleet.notices() == []
    progress = _progress(fleet, "f1")
    assert progress["sync"] is None and progress["final"] is None
    [deferred] = progress["sync_deferred"]
    assert "git fetch origin main failed" in deferred["summary"]
    assert "does not appear to be a git repository" in deferred["detail"]
    assert "back in the inbox, tried again in 60 s (failed fetch 1 of at most 5)" in done.stderr
    # A serving runner tries at once (not a --once run: its wait is in memory), then waits
    # 0.5 s x 2 ** (n - 1) after failed fetch n: 1 s after its own first failure (the second),
    # then 2 s and 4 s, which leaves 7 s to make the remote reachable before the five tries
    # are spent, even when a busy machine keeps this test from noticing the second at once.
    # The news is on the remote before it is reachable again: a try between the two steps
    # would run the task on the old head (seen on a busy machine).
    news = repos.push("docs/news.md", "news\n", to=away)
    runner = fleet.start("--sync-retry-s", "0.5")
    try:
        wait_until(lambda: len(_deferrals(fleet, "f1")) >= 2)
        away.rename(repos.remote)  # reachable again: the next try runs it
        wait_until(lambda: fleet.where("f1") == ["done"])
        assert _progress(fleet, "f1")["sync"]["status"] == "synced"
        assert fleet.events("head")[0]["head"] == news
        second = datetime.strptime(_deferrals(fleet, "f1")[1]["time"] + "+0000",
                                   "%Y-%m-%dT%H:%M:%S.%fZ%z")
        [start] = fleet.events("start")
        assert start["time"] - second.timestamp() >= 1.0  # it waited before trying again
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.communicate(timeout=60)
    # Unreachable for good: refused and escalated at the last try, not before (short waits:
    # nothing races them here).
    repos.remote.rename(away)
    fleet.drop("f2", kind="agent", channel=None, text=do("write y.txt y"))
    runner = fleet.start("--sync-retry-s", "0.02")
    try:
        wait_until(lambda: fleet.where("f2") == ["failed"])
    finally:
        runner.send_signal(signal.SIGTERM)
        _, err = runner.communicate(timeout=60)
    assert "tried again in 0.04 s (failed fetch 2 of at most 5)" in err
    assert "tried again in 0.16 s (failed fetch 4 of at most 5)" in err
    assert len(_deferrals(fleet, "f2")) == SYNC_FETCH_ATTEMPTS
    assert len(fleet.events("start")) == 1
    [notice] = fleet.notices()
    assert notice["task"] == "f2" and notice["kind"] == "refused"
    assert f"({SYNC_FETCH_ATTEMPTS} times" in notice["reason"]
    # f1's leftover was stashed and applied back at each try: still there, no stash left.
    assert git(ws, "status", "--porcelain") == "?? x.txt" and _stashes(ws) == []


def test_a_git_failure_after_the_runner_stashed_puts_its_work_back(repos, tmp_path,
                                                                    monkeypatch):
    ws = repos.clone(tmp_path / "ws")
    (ws / "wip.txt").write_text("half\n")
    (ws / "README").write_text("line 1\nmore\n")
    git(ws, "add", "README")
    dirty = reposync.dirty_state(ws)
    leftover = {"task": "t1", "head": git(ws, "rev-parse", "HEAD"), "dirty": dirty}
    real = reposync.git

    def failing(workspace, *args, **kwargs):
        if args[:1] == ("rev-list",):  # after the stash and the fetch
            assert _stashes(ws), "the runner has stashed by now"
            raise reposync.GitError("git rev-list exited 128: fatal: simulated")
        return real(workspace, *args, **kwargs)

    monkeypatch.setattr(reposync, "git", failing)
    result = reposync.sync_workspace(ws, SyncConfig("main"), agent="a1", task="t2",
                                     leftover=leftover)
    assert result.status == "refused" and "simulated" in result.summary
    assert result.stash["state"] == "applied"
    assert _stashes(ws) == []
    assert reposync.dirty_state(ws) == dirty  # staged README and untracked wip.txt, as before
