"""An issue-tracker MCP server: 33 tools with schemas like a real tracker's, over stdio.

Written with the official MCP Python SDK (``mcp.server.MCPServer``): the input schemas are what
the SDK derives from the typed signatures (enums, arrays, nested objects under ``$defs``,
optional fields with defaults), the descriptions are written like a real tracker's, and some
tools carry MCP-only annotations and output schemas. State is in memory, so calls work.

    python -m tests.mcp_servers.tracker [--page-size N] [--mode MODE]

``--page-size N`` serves ``tools/list`` in pages of N tools (opaque cursors). ``--mode`` makes a
broken variant for the failure tests:

``ok``               the default
``crash-on-start``   writes a traceback-like line to stderr and exits 3 before reading anything
``crash-on-list``    answers ``initialize``, then exits 4 on ``tools/list``
``garbage``          prints a banner that is not JSON on stdout, then serves normally
``hang-list``        answers ``initialize``, never answers ``tools/list``
``slow-start``       sleeps 30 s before serving
``cursor-loop``      every ``tools/list`` page names the same next cursor
``error-list``       answers ``tools/list`` with a JSON-RPC error
``quirks``           two pages with a repeated tool, dotted/slashed/long names, a normalised
                     name collision and an anyOf-rooted input schema (:func:`_quirks`)
``fail-page-2``      (with ``--page-size``) answers the first page, errors on the next
``env``              one tool whose description shows ``$LANG`` and stdout's encoding
"""

from __future__ import annotations

import argparse
import base64
import itertools
import sys
import threading
from datetime import date
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListToolsResult, PaginatedRequestParams, Tool, ToolAnnotations
from pydantic import BaseModel, Field

INSTRUCTIONS = (
    "Tracker is the team's issue tracker. Issues belong to exactly one team and move through "
    "the states backlog, todo, in_progress, in_review, done and canceled. Use search_issues "
    "before creating an issue to avoid duplicates, reference issues by their identifier "
    "(for example ENG-42), and never change the state of an issue assigned to someone else "
    "without commenting why."
)

Priority = Literal["none", "urgent", "high", "medium", "low"]
State = Literal["backlog", "todo", "in_progress", "in_review", "done", "canceled"]
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                              open_world_hint=False)


class Estimate(BaseModel):
    """An effort estimate."""

    points: Annotated[int, Field(ge=0, le=21, description="Story points on the team's scale.")]
    confidence: Literal["low", "medium", "high"] = "medium"


class DateRange(BaseModel):
    """An inclusive range of calendar dates."""

    start: Annotated[date | None, Field(description="First day, YYYY-MM-DD.")] = None
    end: Annotated[date | None, Field(description="Last day, YYYY-MM-DD.")] = None


class IssueFilter(BaseModel):
    """Conditions an issue must meet; all given conditions must hold."""

    team: Annotated[str | None, Field(description="Team key, e.g. ENG.")] = None
    states: Annotated[list[State] | None, Field(description="Any of these workflow states.")] = None
    assignee: Annotated[str | None, Field(description="User id or 'me'.")] = None
    labels: Annotated[list[str] | None, Field(description="Issues with all these labels.")] = None
    priority_at_least: Annotated[Priority | None, Field(
        description="Minimum priority; urgent is highest.")] = None
    created: Annotated[DateRange | None, Field(description="Creation date range.")] = None
    include_archived: bool = False


class _Store:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.issues: dict[str, dict[str, Any]] = {}
        self.comments: dict[str, list[dict[str, Any]]] = {}
        self.labels = {"bug": "#d73a4a", "feature": "#a2eeef", "chore": "#cccccc"}

    def issue(self, identifier: str) -> dict[str, Any]:
        if identifier not in self.issues:
            raise ToolError(f"no issue {identifier}")
        return self.issues[identifier]


store = _Store()
mcp = MCPServer("tracker", instructions=INSTRUCTIONS, version="1.4.2")


# --- issues ---------------------------------------------------------------------------------

@mcp.tool()
def create_issue(
    team: Annotated[str, Field(description="Key of the team that owns the issue, e.g. ENG.")],
    title: Annotated[str, Field(min_length=1, max_length=255, description="One-line summary.")],
    description: Annotated[str | None, Field(description="Body in Markdown.")] = None,
    priority: Priority = "none",
    state: State = "backlog",
    assignee: Annotated[str | None, Field(description="User id, or 'me' for the caller.")] = None,
    labels: Annotated[list[str] | None, Field(description="Label names to apply.")] = None,
    estimate: Estimate | None = None,
    due_date: Annotated[date | None, Field(description="Due date, YYYY-MM-DD.")] = None,
    parent: Annotated[str | None, Field(description="Identifier of the parent issue.")] = None,
) -> dict[str, Any]:
    """Create a new issue in a team. Search first (search_issues) to avoid duplicates. Returns
    the created issue with its identifier (TEAM-NUMBER) and URL."""
    identifier = f"{team}-{next(store.ids)}"
    issue = {"identifier": identifier, "team": team, "title": title, "description": description,
             "priority": priority, "state": state, "assignee": assignee, "labels": labels or [],
             "estimate": estimate.model_dump() if estimate else None,
             "due_date": due_date.isoformat() if due_date else None, "parent": parent,
             "archived": False, "url": f"https://tracker.example/issue/{identifier}"}
    store.issues[identifier] = issue
    return issue


@mcp.tool()
def update_issue(
    identifier: Annotated[str, Field(description="Issue identifier, e.g. ENG-42.")],
    title: Annotated[str | None, Field(max_length=255)] = None,
    description: Annotated[str | None, Field(description="New body in Markdown.")] = None,
    priority: Priority | None = None,
    state: State | None = None,
    estimate: Estimate | None = None,
    due_date: date | None = None,
) -> dict[str, Any]:
    """Update fields of an existing issue. Only the fields given change; pass null to leave a
    field as it is. Returns the updated issue."""
    issue = store.issue(identifier)
    for key, value in (("title", title), ("description", description), ("priority", priority),
                       ("state", state)):
        if value is not None:
            issue[key] = value
    if estimate is not None:
        issue["estimate"] = estimate.model_dump()
    if due_date is not None:
        issue["due_date"] = due_date.isoformat()
    return issue


@mcp.tool(annotations=READ_ONLY)
def get_issue(
    identifier: Annotated[str, Field(description="Issue identifier, e.g. ENG-42.")],
    include_comments: bool = False,
) -> dict[str, Any]:
    """Get one issue by identifier, with its state, assignee, labels, estimate and links;
    optionally with its comments."""
    issue = dict(store.issue(identifier))
    if include_comments:
        issue["comments"] = store.comments.get(identifier, [])
    return issue


@mcp.tool(annotations=READ_ONLY)
def search_issues(
    query: Annotated[str, Field(description="Full-text query over titles and descriptions.")],
    filter: IssueFilter | None = None,
    order_by: Literal["relevance", "created", "updated", "priority"] = "relevance",
    limit: Annotated[int, Field(ge=1, le=100, description="Page size.")] = 25,
    cursor: Annotated[str | None, Field(description="Cursor from a previous page.")] = None,
) -> dict[str, Any]:
    """Search issues by text and structured filters. Results are ordered by relevance unless
    order_by says otherwise; use the returned cursor to page through them."""
    words = query.lower().split()
    found = [i for i in store.issues.values()
             if all(w in (i["title"] + " " + (i["description"] or "")).lower() for w in words)]
    if filter and filter.team:
        found = [i for i in found if i["team"] == filter.team]
    return {"issues": found[:limit], "next_cursor": None}


@mcp.tool(annotations=READ_ONLY)
def list_issues(
    team: Annotated[str | None, Field(description="Team key; all teams when omitted.")] = None,
    state: State | None = None,
    assignee: Annotated[str | None, Field(description="User id or 'me'.")] = None,
    limit: Annotated[int, Field(ge=1, le=250)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """List issues, newest first, optionally narrowed to a team, a state or an assignee."""
    found = [i for i in store.issues.values() if (team is None or i["team"] == team)
             and (state is None or i["state"] == state)]
    return {"issues": found[:limit], "next_cursor": None}


@mcp.tool(annotations=DESTRUCTIVE)
def archive_issue(
    identifier: Annotated[str, Field(description="Issue identifier.")],
    reason: Annotated[str | None, Field(description="Why; shown in its history.")] = None,
) -> dict[str, Any]:
    """Archive an issue. Archived issues are hidden from lists and searches unless asked for,
    and can be restored from the web app."""
    store.issue(identifier)["archived"] = True
    return {"identifier": identifier, "archived": True}


@mcp.tool()
def assign_issue(
    identifier: str,
    assignee: Annotated[str | None, Field(description="User id, 'me', or null to unassign.")],
) -> dict[str, Any]:
    """Assign an issue to a user, or unassign it."""
    store.issue(identifier)["assignee"] = assignee
    return store.issue(identifier)


@mcp.tool()
def set_issue_priority(identifier: str, priority: Priority) -> dict[str, Any]:
    """Set the priority of an issue: urgent, high, medium, low or none."""
    store.issue(identifier)["priority"] = priority
    return store.issue(identifier)


@mcp.tool()
def set_issue_state(
    identifier: str,
    state: State,
    comment: Annotated[str | None, Field(description="A comment explaining the change.")] = None,
) -> dict[str, Any]:
    """Move an issue to another workflow state, optionally leaving a comment that explains why."""
    store.issue(identifier)["state"] = state
    if comment:
        store.comments.setdefault(identifier, []).append({"body": comment})
    return store.issue(identifier)


@mcp.tool()
def link_issues(
    identifier: str,
    related: Annotated[str, Field(description="The other issue's identifier.")],
    kind: Literal["relates_to", "blocks", "blocked_by", "duplicates"] = "relates_to",
) -> dict[str, Any]:
    """Link two issues: relates to, blocks, is blocked by, or duplicates."""
    return {"identifier": identifier, "related": related, "kind": kind}


@mcp.tool()
def add_subissue(
    parent: Annotated[str, Field(description="Identifier of the parent issue.")],
    child: Annotated[str, Field(description="Identifier of the issue to nest under it.")],
) -> dict[str, Any]:
    """Make an existing issue a sub-issue of another."""
    store.issue(child)["parent"] = parent
    return store.issue(child)


# --- comments -------------------------------------------------------------------------------

@mcp.tool(annotations=READ_ONLY)
def list_comments(identifier: str, limit: Annotated[int, Field(ge=1, le=100)] = 50
                  ) -> dict[str, Any]:
    """List the comments on an issue, oldest first."""
    return {"comments": store.comments.get(identifier, [])[:limit]}


@mcp.tool()
def create_comment(
    identifier: Annotated[str, Field(description="Issue identifier.")],
    body: Annotated[str, Field(min_length=1, description="Comment body in Markdown.")],
    reply_to: Annotated[str | None, Field(description="Id of the comment this replies to.")] = None,
) -> dict[str, Any]:
    """Comment on an issue. Mentions (@user) notify the mentioned users."""
    comments = store.comments.setdefault(identifier, [])
    comment = {"id": f"c{len(comments) + 1}", "body": body, "reply_to": reply_to}
    comments.append(comment)
    return comment


@mcp.tool()
def update_comment(comment_id: str, body: Annotated[str, Field(min_length=1)]) -> dict[str, Any]:
    """Edit the body of one of your own comments."""
    return {"id": comment_id, "body": body}


@mcp.tool(annotations=DESTRUCTIVE)
def delete_comment(comment_id: str) -> dict[str, Any]:
    """Delete one of your own comments. This cannot be undone."""
    return {"id": comment_id, "deleted": True}


# --- labels ---------------------------------------------------------------------------------

@mcp.tool(annotations=READ_ONLY)
def list_labels(team: Annotated[str | None, Field(description="Team key; workspace labels "
                                                               "when omitted.")] = None
                ) -> dict[str, Any]:
    """List the labels available to a team, with their colours."""
    return {"labels": [{"name": k, "color": v} for k, v in store.labels.items()]}


@mcp.tool()
def create_label(
    name: Annotated[str, Field(min_length=1, max_length=64)],
    color: Annotated[str, Field(pattern=r"^#[0-9a-fA-F]{6}$", description="Hex colour, #rrggbb.")],
    team: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """Create a label for a team, or for the whole workspace when no team is given."""
    store.labels[name] = color
    return {"name": name, "color": color}


@mcp.tool()
def add_label(identifier: str, label: str) -> dict[str, Any]:
    """Add a label to an issue."""
    store.issue(identifier)["labels"].append(label)
    return store.issue(identifier)


@mcp.tool()
def remove_label(identifier: str, label: str) -> dict[str, Any]:
    """Remove a label from an issue."""
    labels = store.issue(identifier)["labels"]
    if label in labels:
        labels.remove(label)
    return store.issue(identifier)


# --- cycles ---------------------------------------------------------------------------------

@mcp.tool(annotations=READ_ONLY)
def list_cycles(team: str, include_completed: bool = False) -> dict[str, Any]:
    """List a team's cycles (time-boxed iterations), current and upcoming first."""
    return {"cycles": [{"id": "cy1", "team": team, "number": 12}]}


@mcp.tool(annotations=READ_ONLY)
def get_cycle(cycle_id: str) -> dict[str, Any]:
    """Get one cycle with its dates, scope and progress."""
    return {"id": cycle_id, "progress": 0.4}


@mcp.tool()
def create_cycle(team: str, dates: DateRange, name: str | None = None) -> dict[str, Any]:
    """Create a cycle for a team over a date range."""
    return {"id": "cy2", "team": team, "name": name}


@mcp.tool()
def add_issue_to_cycle(identifier: str, cycle_id: str) -> dict[str, Any]:
    """Add an issue to a cycle, moving it out of any other cycle."""
    return {"identifier": identifier, "cycle": cycle_id}


# --- projects -------------------------------------------------------------------------------

@mcp.tool(annotations=READ_ONLY)
def list_projects(
    state: Literal["planned", "started", "paused", "completed", "canceled"] | None = None,
    limit: Annotated[int, Field(ge=1, le=100)] = 50,
) -> dict[str, Any]:
    """List projects, optionally in one state."""
    return {"projects": []}


@mcp.tool(annotations=READ_ONLY)
def get_project(project_id: str) -> dict[str, Any]:
    """Get a project with its lead, members, target date and milestones."""
    return {"id": project_id}


@mcp.tool()
def create_project(
    name: Annotated[str, Field(min_length=1)],
    teams: Annotated[list[str], Field(min_length=1, description="Keys of the teams involved.")],
    lead: str | None = None,
    target_date: date | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """Create a project spanning one or more teams."""
    return {"id": "p1", "name": name, "teams": teams}


@mcp.tool()
def update_project(
    project_id: str,
    name: str | None = None,
    state: Literal["planned", "started", "paused", "completed", "canceled"] | None = None,
    target_date: date | None = None,
) -> dict[str, Any]:
    """Update a project's name, state or target date."""
    return {"id": project_id, "state": state}


# --- people, teams, links -------------------------------------------------------------------

@mcp.tool(annotations=READ_ONLY)
def list_teams() -> dict[str, Any]:
    """List the teams in the workspace with their keys."""
    return {"teams": [{"key": "ENG", "name": "Engineering"}]}


@mcp.tool(annotations=READ_ONLY)
def list_users(team: str | None = None, active_only: bool = True) -> dict[str, Any]:
    """List users, optionally only the members of one team."""
    return {"users": [{"id": "u1", "name": "Alice"}]}


@mcp.tool(annotations=READ_ONLY)
def get_viewer() -> dict[str, Any]:
    """Get the user the server acts as."""
    return {"id": "bot", "name": "Fleet agent"}


@mcp.tool()
def attach_link(
    identifier: str,
    url: Annotated[str, Field(description="The link, e.g. a pull request URL.")],
    title: str | None = None,
) -> dict[str, Any]:
    """Attach a link (a pull request, a document) to an issue."""
    return {"identifier": identifier, "url": url, "title": title}


@mcp.tool()
def bulk_update_issues(
    identifiers: Annotated[list[str], Field(min_length=1, max_length=50)],
    state: State | None = None,
    priority: Priority | None = None,
    add_labels: list[str] | None = None,
    notify: Annotated[bool, Field(description="Notify subscribers of each change.")] = True,
) -> dict[str, Any]:
    """Change the state, priority or labels of up to 50 issues at once."""
    return {"updated": identifiers}


@mcp.tool()
def create_issue_template(
    team: str,
    name: Annotated[str, Field(min_length=1, description="Template name shown to reporters.")],
    body: Annotated[str, Field(description="Pre-filled description in Markdown.")],
    help: Annotated[str | None, Field(description="Help text shown above the form.")] = None,
    version: Annotated[int, Field(ge=1, description="Template schema version.")] = 1,
) -> dict[str, Any]:
    """Create an issue template for a team's intake form."""
    return {"team": team, "name": name, "body": body, "help": help, "version": version}


def _quirks(tools: list[Any], cursor: str | None) -> ListToolsResult:
    """Two pages with every listing problem the audit flags: a tool on both pages, names with
    a dot and a slash, two names equal once normalised, a name over 64 characters, an input
    schema whose root is anyOf."""
    odd = {"type": "object", "properties": {"id": {"type": "string"}}}
    if not cursor:
        return ListToolsResult(tools=[*tools[:2], Tool(name="get.issue", input_schema=odd,
                                                       description="Get an issue (dotted).")],
                               next_cursor="page2")
    return ListToolsResult(tools=[
        tools[1],  # again
        Tool(name="get_issue", input_schema=odd, description="Get an issue."),
        Tool(name="teams/list", input_schema={"type": "object"}, description="List teams."),
        Tool(name="x" * 60, input_schema={"type": "object"}, description="A long name."),
        Tool(name="find", description="Find by id or by title.",
             input_schema={"type": "object", "anyOf": [{"type": "object", "properties": {"id": {"type": "string"}},
                                      "required": ["id"]},
                                     {"type": "object", "properties": {"title": {
                                         "type": "string"}}, "required": ["title"]}]})])


# --- serving ----------------------------------------------------------------------------------

def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    return int(base64.urlsafe_b64decode(cursor.encode()).decode().split(":")[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--page-size", type=int, default=0)
    parser.add_argument("--mode", default="ok")
    args = parser.parse_args(argv)
    mode = args.mode

    if mode == "crash-on-start":
        print("Traceback (most recent call last):\nRuntimeError: TRACKER_TOKEN is not set",
              file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "slow-start":
        print("tracker: warming the cache...", file=sys.stderr, flush=True)
        threading.Event().wait()  # never ready: the client's startup timeout must end it
    if mode == "garbage":
        print("Tracker MCP server v1.4.2 ready", flush=True)
    print(f"tracker: serving ({mode}, page size {args.page_size or 'all'})", file=sys.stderr,
          flush=True)

    async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
        if mode == "crash-on-list":
            print("tracker: fatal: lost the database connection", file=sys.stderr, flush=True)
            sys.stderr.flush()
            import os

            os._exit(4)
        if mode == "hang-list":
            import anyio

            await anyio.sleep(3600)
        if mode == "error-list":
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=-32603, message="tools are unavailable: index is rebuilding")
        tools = await mcp.list_tools()
        if mode == "quirks":
            return _quirks(tools, params.cursor if params else None)
        if mode == "env":
            import os

            return ListToolsResult(tools=[Tool(
                name="whoami", input_schema={"type": "object"},
                description=f"LANG={os.environ.get('LANG')} "
                            f"stdout={sys.stdout.encoding} née")])
        if mode == "cursor-loop":
            return ListToolsResult(tools=tools[:5], next_cursor="c2FtZQ==")
        if mode == "fail-page-2" and params and params.cursor:
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=-32603, message="page 2: the search index is rebuilding")
        if not args.page_size:
            return ListToolsResult(tools=tools)
        start = _offset(params.cursor if params else None)
        end = start + args.page_size
        return ListToolsResult(tools=tools[start:end],
                               next_cursor=_cursor(end) if end < len(tools) else None)

    # The SDK's MCPServer lists every tool in one page; the low-level server it wraps takes a
    # handler of our own for tools/list (SDK API: Server.add_request_handler).
    mcp._lowlevel_server.add_request_handler(  # noqa: SLF001
        "tools/list", PaginatedRequestParams, list_tools)
    mcp.run("stdio")


if __name__ == "__main__":
    main()
