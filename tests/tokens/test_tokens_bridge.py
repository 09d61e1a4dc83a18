"""The MCP → CLI bridge (blueprint/skills/mcp-bridge/bin/mcp-bridge) end to end against the real
test tracker MCP server: listing, usage from the schema, typed arguments, required arguments,
enums, aliases, errors, and UTF-8 output whatever the locale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mcp_servers.project import REPO, TRACKER_ENV

BRIDGE = REPO / "blueprint" / "skills" / "mcp-bridge" / "bin" / "mcp-bridge"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bridge") / "mcp-bridge.json"
    # The server's own locale is its business: it gets UTF-8 whatever the bridge runs under.
    server_env = {**TRACKER_ENV, "PYTHONUTF8": "1"}
    path.write_text(json.dumps({"servers": {
        "tracker": {"command": [sys.executable, "-m", "tests.mcp_servers.tracker",
                                "--page-size", "9"], "env": server_env, "cwd": str(REPO)},
        "broken": {"command": [sys.executable, "-m", "tests.mcp_servers.tracker", "--mode",
                               "crash-on-list"], "env": TRACKER_ENV, "cwd": str(REPO)}}}))
    return path


def bridge(config: Path, *args: str, locale: str | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO"))}
    env["MCP_BRIDGE_TIMEOUT_S"] = "20"
    if locale:
        env.update(LANG=locale, LC_ALL=locale, PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    # The host's python3 runs it: standard library only, no fleetctl on the path.
    return subprocess.run(["python3", str(BRIDGE), "--config", str(config), *args],
                          capture_output=True, env=env, timeout=60, cwd="/")


def test_lists_servers_and_tools(config):
    done = bridge(config, "--help")
    assert done.returncode == 0 and b"  tracker\n" in done.stdout and b"  broken" in done.stdout
    done = bridge(config, "tracker", "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 33  # every page of the listing, one line per tool
    assert lines[0].split()[0] == "create_issue"
    assert lines[0].endswith("Create a new issue in a team.")


def test_usage_derived_from_the_schema(config):
    done = bridge(config, "tracker", "create_issue", "--help")
    assert done.returncode == 0
    usage = done.stdout.decode()
    assert "usage: mcp-bridge tracker create_issue --team TEXT --title TEXT" in usage
    assert "[--priority none|urgent|high|medium|low]" in usage
    assert "[--labels TEXT (repeatable)]" in usage
    assert "--estimate JSON {points: INT, confidence?: low|medium|high}" in usage  # $ref resolved
    assert "--team TEXT  (required)  Key of the team that owns the issue" in usage


def test_a_call_with_typed_arguments(config):
    done = bridge(config, "tracker", "create_issue", "--team", "ENG", "--title", "Ünïcödé 日本",
                  "--priority", "high", "--labels", "bug", "--labels", "ui",
                  "--estimate", '{"points": 3}', "--due-date", "2026-12-01", locale="C")
    assert done.returncode == 0, done.stderr
    issue = json.loads(done.stdout.decode("utf-8"))  # UTF-8 although the locale is C
    assert issue["identifier"] == "ENG-1" and issue["title"] == "Ünïcödé 日本"
    assert issue["labels"] == ["bug", "ui"] and issue["priority"] == "high"
    assert issue["estimate"] == {"points": 3, "confidence": "medium"}
    assert issue["due_date"] == "2026-12-01"


def test_json_types_are_sent_as_the_schema_says(config):
    done = bridge(config, "tracker", "search_issues", "--query", "crash", "--limit", "5",
                  "--filter", '{"team": "ENG", "include_archived": true}', "--dry-run")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"name": "search_issues", "arguments": {
        "query": "crash", "limit": 5, "filter": {"team": "ENG", "include_archived": True}}}
    done = bridge(config, "tracker", "list_cycles", "--team", "ENG", "--include_completed",
                  "--dry-run")
    assert json.loads(done.stdout)["arguments"] == {"team": "ENG", "include_completed": True}
    done = bridge(config, "tracker", "list_users", "--no-active_only", "--dry-run")
    assert json.loads(done.stdout)["arguments"] == {"active_only": False}
    done = bridge(config, "tracker", "get_issue", "--identifier", "A", "--include_comments",
                  "false", "--dry-run")
    assert json.loads(done.stdout)["arguments"] == {"identifier": "A", "include_comments": False}


@pytest.mark.parametrize("args, message", [
    (["create_issue", "--team", "ENG"], "create_issue: missing required --title"),
    (["search_issues", "--query", "x", "--limit", "five"], "--limit: 'five' is not an integer"),
    (["set_issue_priority", "--identifier", "X", "--priority", "bogus"],
     "--priority: 'bogus' must be one of none, urgent, high, medium, low"),
    (["create_issue", "--team", "E", "--title", "t", "--estimate", "3"], "--estimate"),
    (["get_issue", "--nosuch", "1"], "unknown option --nosuch"),
    (["no_such_tool"], "tracker has no tool 'no_such_tool'"),
])
def test_usage_errors_before_any_call(config, args, message):
    done = bridge(config, "tracker", *args)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert message in err and err.count("\n") == 1  # one line


def test_properties_named_like_the_bridges_options(config):
    done = bridge(config, "tracker", "create_issue_template", "--team", "ENG", "--name", "Bug",
                  "--body", "Steps:", "--arg-help", "Tell us what broke", "--version", "2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"team": "ENG", "name": "Bug", "body": "Steps:",
                                       "help": "Tell us what broke", "version": 2}
    usage = bridge(config, "tracker", "create_issue_template", "--help").stdout.decode()
    assert "--help TEXT  (give it as --arg-help)" in usage


def test_server_errors_exit_non_zero_with_one_line(config):
    done = bridge(config, "tracker", "get_issue", "--identifier", "NOPE-1")
    assert done.returncode == 1
    assert done.stderr.decode() == ("mcp-bridge: tracker get_issue: Error executing tool "
                                    "get_issue: no issue NOPE-1\n")
    done = bridge(config, "broken", "--help")
    assert done.returncode == 2
    assert "the server exited" in done.stderr.decode()
    assert done.stderr.decode().count("\n") == 1
    done = bridge(config, "nosuch")
    assert done.returncode == 2 and "no server 'nosuch'" in done.stderr.decode()


# -- issue 12: the bridge holds up --------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    # Nested objects are checked against the schema before any call: types, enums, arrays.
    (["search_issues", "--query", "x", "--filter", '{"team": 5}'],
     "--filter.team: 5 is not string"),
    (["search_issues", "--query", "x", "--filter", '{"states": ["todo", "someday"]}'],
     '--filter.states[1]: "someday" must be one of'),
    (["search_issues", "--query", "x", "--filter", '{"include_archived": "yes"}'],
     '--filter.include_archived: "yes" is not boolean'),
    (["create_issue", "--team", "E", "--title", "t", "--estimate", '{"confidence": "low"}'],
     "--estimate: missing required points"),
    # Booleans take true or false only.
    (["get_issue", "--identifier", "A", "--include_comments", "yes"],
     "--include_comments: 'yes' is not true or false"),
    (["get_issue", "--identifier", "A", "--include_comments", "1"],
     "--include_comments: '1' is not true or false"),
])
def test_arguments_checked_against_the_schema_before_the_call(config, args, message):
    done = bridge(config, "tracker", *args)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert message in err and err.count("\n") == 1, err


def test_help_shows_required_arguments_and_defaults(config):
    usage = bridge(config, "tracker", "search_issues", "--help").stdout.decode()
    assert "--query TEXT  (required)" in usage
    assert "--limit INT  (default 25)" in usage


@pytest.fixture(scope="module")
def paging(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("paging") / "mcp-bridge.json"
    base = [sys.executable, "-m", "tests.mcp_servers.tracker"]
    path.write_text(json.dumps({"servers": {
        "half": {"command": [*base, "--page-size", "9", "--mode", "fail-page-2"],
                 "env": TRACKER_ENV, "cwd": str(REPO)},
        "loop": {"command": [*base, "--mode", "cursor-loop"], "env": TRACKER_ENV,
                 "cwd": str(REPO)}}}))
    return path


def test_a_failing_page_keeps_the_tools_listed_before_it(paging):
    listed = bridge(paging, "half", "--help")
    assert listed.returncode == 1
    assert len(listed.stdout.decode().splitlines()) == 9  # the first page
    assert "tools/list page 2 failed" in listed.stderr.decode()
    assert "the search index is rebuilding" in listed.stderr.decode()
    # A tool of the first page is still called (tools/list order: create_issue is first).
    first = listed.stdout.decode().splitlines()[0].split()[0]
    done = bridge(paging, "half", first, "--team", "ENG", "--title", "x")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["identifier"] == "ENG-1"
    assert "warning" in done.stderr.decode() and "page 2 failed" in done.stderr.decode()
    # One after it cannot be found: said so, with the failure.
    done = bridge(paging, "half", "list_users")
    assert done.returncode == 1 and "listed before the listing failed" in done.stderr.decode()


def test_a_cursor_loop_ends_the_listing_as_the_audit_does(paging):
    done = bridge(paging, "loop", "--help")
    assert len(done.stdout.decode().splitlines()) == 5
    assert done.returncode == 1 and "repeats cursor" in done.stderr.decode()


def test_servers_get_a_utf8_environment_and_a_crash_its_status(tmp_path):
    path = tmp_path / "mcp-bridge.json"
    base = [sys.executable, "-m", "tests.mcp_servers.tracker"]
    path.write_text(json.dumps({"servers": {
        "env": {"command": [*base, "--mode", "env"], "env": TRACKER_ENV, "cwd": str(REPO)},
        "crash": {"command": [*base, "--mode", "crash-on-start"], "env": TRACKER_ENV,
                  "cwd": str(REPO)}}}))
    done = bridge(path, "env", "--help", locale="C")
    assert done.returncode == 0, done.stderr
    assert "LANG=C.UTF-8 stdout=utf-8 née" in done.stdout.decode("utf-8")
    done = bridge(path, "crash", "--help")
    assert done.returncode == 2
    assert "the server exited with status 3 (RuntimeError: TRACKER_TOKEN is not set)" in \
        done.stderr.decode()
