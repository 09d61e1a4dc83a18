"""Listings, servers and output that hold up: each class from public bug reports, against the
scripted tracker server (tests/mcp_servers/tracker.py) started for real over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetctl.tokens.declare import McpServerDecl
from fleetctl.tokens.mcp_list import list_servers
from tests.mcp_servers.project import REPO, TRACKER_ENV, make_tokens_project, tracker
from tests.test_tokens_harness import run


def _decl(*args: str, **settings) -> McpServerDecl:
    return McpServerDecl.model_validate(tracker(*args, **settings))


def test_listing_problems_are_flagged_and_a_repeated_tool_counted_once(tmp_path):
    got = list_servers({"t": _decl("--mode", "quirks")}, REPO)["t"]
    assert got.status == "ok" and got.pages == 2
    names = [t["name"] for t in got.tools]
    # 8 listings in two pages, one tool twice: 7 tools, each once.
    assert len(names) == 7 and len(set(names)) == 7
    flags = "\n".join(got.flags)
    assert f"tool {names[1]!r} is listed 2 times: counted once" in flags
    assert "tool 'get.issue': name rejected by some providers (characters '.')" in flags
    assert "tool 'teams/list': name rejected by some providers (characters '/')" in flags
    assert f"tool {'x' * 60!r}: name rejected by some providers (68 characters as mcp__t__" in flags
    assert "tools 'get.issue', 'get_issue' collide once normalised (all become 'get_issue')" \
        in flags
    assert "tool 'find': input schema root is anyOf" in flags

    # In the audit: counted once, flagged as notes, the rest measured (exit 0).
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"], "mcp_servers": {"t": tracker("--mode", "quirks")}}})
    audit = run("--format", "json", project=project)
    assert audit.code == 0, audit.stderr
    agent = audit.agent("r")
    assert agent["servers"][0]["tools"] == 7
    assert sum(1 for t in agent["tools"] if t["server"] == "t") == 7
    assert any("collide once normalised" in w for w in agent["warnings"])


def test_a_crashed_server_shows_its_exit_status():
    got = list_servers({"start": _decl("--mode", "crash-on-start"),
                        "list": _decl("--mode", "crash-on-list")}, REPO)
    assert got["start"].status == "crashed" and got["start"].exit_status == 3
    assert "exit status 3" in got["start"].detail
    assert got["list"].status == "crashed" and "exit status 4" in got["list"].detail
    # The wrapper's own line is not shown as the server's stderr.
    assert "exited with status" not in got["list"].stderr_tail
    assert "lost the database connection" in got["list"].stderr_tail


def test_a_slow_server_gets_a_hint_and_a_flag_to_wait_longer(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "slow-start", startup_timeout_s=1)}}})
    slow = run("--format", "json", project=project)
    assert slow.code == 2
    detail = slow.agent("r")["servers"][0]["detail"]
    assert "no answer to initialize within 1 s" in detail and "--startup-timeout" in detail


def test_the_startup_timeout_flag_raises_the_roles(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "env", startup_timeout_s=0.001)}}})
    assert run("--format", "json", project=project).code == 2
    raised = run("--format", "json", "--startup-timeout", "30", project=project)
    assert raised.code == 0, raised.stdout


def test_servers_start_with_a_utf8_environment():
    # Started from an environment with no locale at all (as cron or systemd start fleetctl).
    got = list_servers({"t": _decl("--mode", "env")}, REPO)["t"]
    description = got.tools[0]["description"]
    assert "LANG=C.UTF-8" in description and "stdout=utf-8" in description
    assert description.endswith("née")


def test_output_never_crashes_in_an_ascii_locale(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "Réponds en français — «toujours».", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "quirks")}}})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C", "LC_ALL": "C",
           "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0", **TRACKER_ENV}
    for fmt in ("text", "json", "markdown"):
        done = subprocess.run([sys.executable, "-m", "fleetctl", "tokens", "--format", fmt,
                               "--inventory", str(project[0]), "--blueprint", str(project[1])],
                              capture_output=True, env=env, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr.decode()
        assert b"Traceback" not in done.stderr and b"internal error" not in done.stderr
        if fmt == "json":
            json.loads(done.stdout)
