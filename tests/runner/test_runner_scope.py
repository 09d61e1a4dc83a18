"""The scope-of-writes gate: the gitignore-style subset of fleet_runner.scope, its config
checks, and the gate end to end (it runs beside a failing check, is recorded, feeds the retry)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner import reposync  # noqa: E402
from fleet_runner.config import ConfigError, config_from_data  # noqa: E402
from fleet_runner.scope import ScopeError, compile_scope  # noqa: E402

from tests.runner.test_runner import FAKES, make_fleet  # noqa: E402, F401  (a fixture)
from tests.runner.test_runner_sync import SYNC, do, git, repos  # noqa: E402, F401  (a fixture)

CASES = [
    # pattern(s), path, in scope
    (["*.md"], "README.md", True),
    (["*.md"], "docs/deep/guide.md", True),  # no slash: any depth
    (["*.md"], "docs/guide.mdx", False),
    (["/*.md"], "README.md", True),
    (["/*.md"], "docs/guide.md", False),  # leading slash: anchored to the root
    (["docs/*.md"], "docs/a.md", True),
    (["docs/*.md"], "docs/api/a.md", False),  # a middle slash anchors; * never crosses /
    (["docs/*.md"], "sub/docs/a.md", False),
    (["src/"], "src/a/b.py", True),  # trailing slash: a directory, everything below
    (["src/"], "src", False),  # ... never a file of that name
    (["src"], "src", True),
    (["src"], "lib/src/x.py", True),  # a matched directory covers what is below it
    (["src/**"], "src/a/b/c.py", True),
    (["src/**"], "src", False),
    (["**/test_*.py"], "test_a.py", True),
    (["**/test_*.py"], "a/b/test_a.py", True),
    (["a/**/b.txt"], "a/b.txt", True),
    (["a/**/b.txt"], "a/x/y/b.txt", True),
    (["a/**/b.txt"], "c/a/b.txt", False),
    (["file?.txt"], "file1.txt", True),
    (["file?.txt"], "file10.txt", False),
    (["?"], "a/b", True),
    (["[ab].py"], "b.py", True),
    (["[ab].py"], "c.py", False),
    (["[!ab].py"], "c.py", True),
    (["[a-c]x"], "bx", True),
    (["src/", "!src/generated/"], "src/generated/x.py", False),  # negation carves out
    (["src/", "!src/generated/"], "src/main.py", True),
    (["src/", "!src/generated/", "src/generated/keep.py"], "src/generated/keep.py", True),
    (["*", "!*.lock"], "deps/poetry.lock", False),
    (["**"], "any/where/at/all", True),
    ([], "anything", False),  # an empty scope allows nothing
    (["# a comment", ""], "a", False),
    (["\\#hash"], "#hash", True),
    (["\\!bang"], "!bang", True),
    (["trailing   "], "trailing", True),
    (["a\\*b"], "a*b", True),
    (["a\\*b"], "axb", False),
    # a git directory is in scope only through a pattern naming .git
    (["**"], ".git/config", False),
    (["*"], ".git/hooks/post-merge", False),
    (["*", "!*.lock"], ".git/hooks/pre-commit", False),
    (["vendor/"], "vendor/lib/.git/hooks/pre-commit", False),
    (["vendor/"], "vendor/lib/src.c", True),
    ([".git/hooks/"], ".git/hooks/pre-commit", True),
    ([".git/hooks/"], ".git/config", False),
    (["vendor/*/.git/"], "vendor/lib/.git/HEAD", True),
    (["**/.git/**"], "a/b/.git/config", True),
    (["**/.git/**", "!.git/hooks/"], ".git/hooks/x", False),
    (["src/"], "src/.git", False),  # a file named .git (a submodule's gitfile) too
]


@pytest.mark.parametrize("patterns, path, expected", CASES)
def test_scope_patterns(patterns, path, expected):
    assert compile_scope(patterns).allows(path) is expected


@pytest.mark.parametrize("bad", ["!", "/", "!/", "a\\"])
def test_scope_patterns_that_match_nothing_are_errors(bad):
    with pytest.raises(ScopeError):
        compile_scope([bad])


def test_writes_sync_and_credentials_are_checked_when_the_config_is_read():
    base = {"agent": "a", "prompt": "p"}
    config = config_from_data(base)  # a config rendered before the keys existed
    assert (config.writes, config.sync, config.credentials_dir) == (None, None, None)
    config = config_from_data({**base, "writes": ["src/"], "sync": {"branch": "main"},
                               "credentials_dir": "/srv/fleet/credentials/a"})
    assert config.writes == ("src/",) and config.credentials_dir == "/srv/fleet/credentials/a"
    assert (config.sync.remote, config.sync.branch) == ("origin", "main")
    for bad, message in [
        ({"writes": "src/"}, "writes: expected list"),
        ({"writes": [1]}, "writes: every item must be a string"),
        ({"writes": ["!"]}, "writes: '!': matches nothing"),
        ({"credentials_dir": "creds"}, "credentials_dir: must be an absolute path"),
        ({"sync": {"remote": "origin"}}, "sync.branch"),
        ({"sync": {"branch": "--upload-pack=x"}}, "sync.branch"),
        ({"sync": {"branch": "a..b"}}, "sync.branch"),
        ({"sync": {"branch": "main", "remote": "a/b"}}, "sync.remote"),
        ({"sync": {"branch": "main", "push": True}}, "unknown key"),
    ]:
        with pytest.raises(ConfigError, match=message):
            config_from_data({**base, **bad})


def test_changes_outside_the_scope_fail_the_gate_beside_the_check_and_feed_the_retry(
        make_fleet):
    fleet = make_fleet("strays", check=str(FAKES / "badcheck"), max_retries=1,
                       role={"writes": ["src/", "!src/generated/", "*.md"]},
                       workspace_files={"legacy/old.txt": "old\n"})
    fleet.drop("s1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    first = fleet.record("s1", 1)
    assert first["verdict"] == "fail" and first["failed_gates"] == ["check", "scope"]
    scope = fleet.gate("s1", 1, "scope")
    assert scope["status"] == "fail"
    assert scope["details"]["outside"] == ["legacy/old.txt (removed)", "notes/todo.txt (added)"]
    assert scope["details"]["outside_count"] == 2 and scope["details"]["changed"] == 3
    assert "2 path(s) changed outside the writes scope" in scope["summary"]
    # Both failures were fed back; the agent put things right and the task passed.
    second_prompt = fleet.events("start")[1]["prompt"]
    assert "### gate scope:" in second_prompt and "notes/todo.txt (added)" in second_prompt
    assert "### gate check:" in second_prompt
    # The runner undid both stray changes after attempt 1, and said so.
    assert sorted(scope["details"]["undone"]) == ["legacy/old.txt", "notes/todo.txt"]
    assert scope["details"]["undo_failed"] == []
    assert "The runner has put each of these back" in second_prompt
    assert fleet.events("found") == [{**fleet.events("found")[0], "todo": False, "old": "old\n"}]
    assert fleet.record("s1", 2)["verdict"] == "pass"
    assert fleet.gate("s1", 2, "scope")["status"] == "pass"
    assert fleet.where("s1") == ["done"]


def test_a_spent_budget_names_the_scope_in_the_escalation(make_fleet):
    fleet = make_fleet("clean", role={"writes": ["docs/"]})
    fleet.drop("s2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.gate("s2", 1, "scope")["details"]["outside"] == ["hello.py (added)"]
    [notice] = fleet.notices()
    assert notice["kind"] == "gave-up" and "scope: 1 path(s) changed outside" in notice["reason"]
    assert "hello.py (added)" in notice["detail"]


# -- git directories and commits ------------------------------------------------------------

def test_writes_to_git_hooks_config_and_nested_repositories_fail_the_scope_gate(
        make_fleet, repos, tmp_path):
    ran = tmp_path / "hook-ran"
    fleet = make_fleet("gitwork", role={**SYNC, "writes": ["src/", "vendor/"]})
    ws = repos.clone(fleet.workspace)
    fleet.drop("g1", kind="agent", channel=None, text=do(
        "write src/ok.py ok", f"hook post-merge {ran}", f"hook post-checkout {ran}",
        "git config fleet.planted yes",
        "write vendor/lib/.git/config [core]", "write vendor/lib/main.c int x;"))
    assert fleet.run().returncode == 0
    scope = fleet.gate("g1", 1, "scope")
    assert scope["status"] == "fail"
    # src/ok.py and vendor/lib/main.c are in scope; vendor/ does not cover vendor/lib/.git/
    assert scope["details"]["outside"] == [
        ".git/config (modified)", ".git/hooks/post-checkout (added)",
        ".git/hooks/post-merge (added)", "vendor/lib/.git/config (added)"]
    assert "only through a pattern naming .git" in scope["output"]
    assert fleet.where("g1") == ["failed"]
    # The runner's next sync fast-forwards: the hook the agent planted does not run in it.
    repos.push("docs/news.md", "news\n")
    fleet.drop("g2", kind="agent", channel=None, text=do("write src/more.py more"))
    assert fleet.run().returncode == 0
    sync = json.loads((fleet.state / "runs" / "g2" / "progress.json").read_text())["sync"]
    assert sync["status"] == "synced" and sync["action"] == "fast-forward"
    assert (ws / "docs" / "news.md").exists() and not ran.exists()


def test_a_commit_that_leaves_the_work_tree_as_it_was_is_still_judged(make_fleet, repos):
    fleet = make_fleet("gitwork", role={"writes": ["src/"]})  # a repository, not synced
    ws = repos.clone(fleet.workspace)
    start = git(ws, "rev-parse", "HEAD")
    fleet.drop("c1", kind="agent", channel=None,
               text=do("commit src/ok.py ok", "sneak notes/secret.txt s3cret"))
    assert fleet.run().returncode == 0
    # The branch holds notes/secret.txt; the work tree has no trace of it.
    assert git(ws, "show", "HEAD:notes/secret.txt") == "s3cret"
    assert not (ws / "notes").exists()
    record = fleet.record("c1", 1)
    assert record["changes"]["added"] == ["src/ok.py"]
    scope = fleet.gate("c1", 1, "scope")
    assert scope["status"] == "fail" and scope["details"]["committed"] == 2
    assert scope["details"]["outside"] == ["notes/secret.txt (committed)"]
    assert f"task started from {start[:12]}" in scope["output"]
    assert fleet.where("c1") == ["failed"]


def test_a_replace_ref_does_not_hide_a_commit_from_the_scope_gate(make_fleet, repos):
    """``git replace NEW OLD`` makes git show OLD's tree for NEW (found by a tryout); the
    branch, and a push, still hold NEW's files."""
    fleet = make_fleet("gitwork", role={"writes": ["src/"]})
    repos.clone(fleet.workspace)
    fleet.drop("c2", kind="agent", channel=None,
               text=do("sneak notes/secret.txt s3cret", "git replace HEAD HEAD~1"))
    assert fleet.run().returncode == 0
    scope = fleet.gate("c2", 1, "scope")
    assert scope["status"] == "fail"
    assert scope["details"]["outside"] == ["notes/secret.txt (committed)"]
    assert fleet.where("c2") == ["failed"]


def test_committed_paths_follow_head_and_the_branch_it_left(repos, tmp_path):
    ws = repos.clone(tmp_path / "ws")
    start = git(ws, "rev-parse", "HEAD")
    assert reposync.committed_paths(ws, start, "main") == []
    (ws / "new.txt").write_text("n\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "two")
    git(ws, "mv", "README", "README.md")
    git(ws, "commit", "-q", "-m", "rename")
    assert reposync.committed_paths(ws, start, "main") == [
        "README", "README.md", "new.txt"]  # both sides of a rename
    # HEAD detached back at the start: what the branch holds still counts.
    git(ws, "checkout", "-q", "--detach", start)
    assert reposync.committed_paths(ws, start, "main") == ["README", "README.md", "new.txt"]
    # The branch moved to a commit that does not descend from the start: every file differing.
    git(ws, "checkout", "-q", "--orphan", "other")
    git(ws, "rm", "-rq", "--cached", ".")
    (ws / "only.txt").write_text("o\n")
    git(ws, "add", "only.txt")
    git(ws, "commit", "-q", "-m", "unrelated")
    git(ws, "branch", "-f", "main", "HEAD")
    assert reposync.committed_paths(ws, start, "main") == ["README", "only.txt"]
    # A repository with no commit at the start: every file committed since.
    assert reposync.committed_paths(ws, None, None) == ["only.txt"]
    with pytest.raises(reposync.GitError):
        reposync.committed_paths(ws, "0" * 40, None)
