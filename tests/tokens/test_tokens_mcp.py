"""Listing real MCP servers over stdio (the test tracker, built with the official SDK) and its
broken variants: every failure has its own status and the tail of its stderr."""

from __future__ import annotations

import json
import math

import pytest

from fleetctl.blueprint import Role
from fleetctl.roledecl import McpServerDecl
from fleetctl.tokens.mcp_list import list_servers, read_snapshot
from tests.mcp_servers import tracker as tracker_module
from tests.mcp_servers.project import REPO, SERVER, SNAPSHOT, TRACKER_ENV

TOOL_NAMES = {
    "create_issue", "update_issue", "get_issue", "search_issues", "list_issues", "archive_issue",
    "assign_issue", "set_issue_priority", "set_issue_state", "link_issues", "add_subissue",
    "list_comments", "create_comment", "update_comment", "delete_comment", "list_labels",
    "create_label", "add_label", "remove_label", "list_cycles", "get_cycle", "create_cycle",
    "add_issue_to_cycle", "list_projects", "get_project", "create_project", "update_project",
    "list_teams", "list_users", "get_viewer", "attach_link", "bulk_update_issues",
    "create_issue_template"}


def _decl(*args: str, **kw) -> McpServerDecl:
    return McpServerDecl(command=[*SERVER, *args], env=dict(TRACKER_ENV), **kw)


@pytest.fixture(scope="module")
def paged():
    return list_servers({"tracker": _decl("--page-size", "7")}, REPO)["tracker"]


def test_all_pages_of_a_real_server(paged):
    assert paged.status == "ok", paged.detail
    assert paged.pages == math.ceil(len(TOOL_NAMES) / 7) == 5
    assert {t["name"] for t in paged.tools} == TOOL_NAMES
    assert len(paged.tools) == len(TOOL_NAMES)  # no page read twice
    assert paged.instructions == tracker_module.INSTRUCTIONS
    assert paged.server_info.get("name") == "tracker"
    create = next(t for t in paged.tools if t["name"] == "create_issue")
    schema = create["inputSchema"]
    assert schema["required"] == ["team", "title"]
    assert schema["properties"]["priority"]["enum"] == ["none", "urgent", "high", "medium", "low"]
    assert "$defs" in schema and "Estimate" in schema["$defs"]
    get = next(t for t in paged.tools if t["name"] == "get_issue")
    assert get["annotations"]["readOnlyHint"] is True


def test_the_saved_snapshot_is_what_the_server_lists(paged):
    snap = read_snapshot("tracker", SNAPSHOT)
    assert snap.status == "ok" and snap.pages == 1
    assert list(snap.tools) == list(paged.tools)
    assert snap.instructions == paged.instructions


def test_failures_each_have_a_status():
    decls = {
        "crash-on-start": _decl("--mode", "crash-on-start"),
        "crash-on-list": _decl("--mode", "crash-on-list"),
        "garbage": _decl("--mode", "garbage"),
        "hang-list": _decl("--mode", "hang-list", request_timeout_s=1.5),
        "slow-start": _decl("--mode", "slow-start", startup_timeout_s=2),
        "cursor-loop": _decl("--mode", "cursor-loop"),
        "error-list": _decl("--mode", "error-list"),
        "missing": McpServerDecl(command=["/nonexistent/tracker-mcp"]),
    }
    got = list_servers(decls, REPO)
    status = {name: r.status for name, r in got.items()}
    assert status == {"crash-on-start": "crashed", "crash-on-list": "crashed",
                      "garbage": "non-json", "hang-list": "timeout", "slow-start": "slow-start",
                      "cursor-loop": "cursor-loop", "error-list": "protocol-error",
                      "missing": "start-failed"}
    assert all(r.tools == () and not r.measured for r in got.values())  # never a silent zero
    assert "TRACKER_TOKEN is not set" in got["crash-on-start"].stderr_tail
    assert "lost the database connection" in got["crash-on-list"].stderr_tail
    assert "Tracker MCP server v1.4.2 ready" in got["garbage"].detail
    assert "within 1.5 s" in got["hang-list"].detail
    assert "initialize" in got["slow-start"].detail
    assert "c2FtZQ==" in got["cursor-loop"].detail and got["cursor-loop"].pages == 2
    assert "index is rebuilding" in got["error-list"].detail
    assert "No such file" in got["missing"].detail


def test_bad_snapshots(tmp_path):
    (tmp_path / "garbage.json").write_text("not json")
    (tmp_path / "notools.json").write_text(json.dumps({"result": {"items": []}}))
    (tmp_path / "noname.json").write_text(json.dumps({"tools": [{"description": "x"}]}))
    (tmp_path / "rpc.json").write_text(json.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "a", "inputSchema": {}}]}}))
    (tmp_path / "pages.json").write_text(json.dumps(
        [{"tools": [{"name": "a"}], "nextCursor": "x"}, {"tools": [{"name": "b"}]}]))
    assert read_snapshot("s", tmp_path / "garbage.json").status == "bad-snapshot"
    assert read_snapshot("s", tmp_path / "notools.json").status == "bad-snapshot"
    assert "name" in read_snapshot("s", tmp_path / "noname.json").detail
    assert read_snapshot("s", tmp_path / "missing.json").status == "bad-snapshot"
    assert [t["name"] for t in read_snapshot("s", tmp_path / "rpc.json").tools] == ["a"]
    pages = read_snapshot("s", tmp_path / "pages.json")
    assert [t["name"] for t in pages.tools] == ["a", "b"] and pages.pages == 2


@pytest.mark.parametrize("bad, message", [
    ({"mcp_servers": {"t": {}}}, "give a command"),
    ({"mcp_servers": {"t": {"snapshot": "y", "env": {"A": "1"}}}}, "env and cwd"),
    ({"mcp_servers": {"t t": {"snapshot": "y"}}}, "should match pattern"),
    ({"mcp_servers": {"t": {"command": ["x"], "startup_timeout_s": 0}}}, "greater than 0"),
    ({"max_tools": -1}, "greater than or equal to 0"),
])
def test_declarations_are_validated(bad, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        Role.model_validate({"prompt": "p", **bad})
