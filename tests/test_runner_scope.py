"""The scope-of-writes gate: the gitignore-style subset of fleet_runner.scope, its config
checks, and the gate end to end (it runs beside a failing check, is recorded, feeds the retry)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.config import ConfigError, config_from_data  # noqa: E402
from fleet_runner.scope import ScopeError, compile_scope  # noqa: E402

from tests.test_runner import FAKES, make_fleet  # noqa: E402, F401  (a fixture)

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
