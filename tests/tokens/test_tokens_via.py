"""``via: mcp | bridge`` in ``fleetctl tokens``: a via-mcp server's tools are measured as tool
schemas, a via-bridge server is one CLI-index line (never started); ``--compare mcp`` sets the
role as declared against all its servers behind the bridge; ``--live`` counts a bridged server's
tools as reached through ``mcp-bridge``; and a via that cannot work is an input error naming the
role file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

from tests.mcp_servers.project import SNAPSHOT, make_tokens_project, tracker
from tests.tokens.test_tokens_cli import tokens
from tests.tokens.test_tokens_live import _with_calls, record, write_ledger

PROMPT = "You triage incoming issues: find duplicates, set priority and state, and comment why."
SKILLS = {"reply": "Send your answer to the person who asked."}
NOWHERE = ["/nonexistent/fleetctl-test/mcp-server"]  # starting it would fail: start-failed
SNAPSHOT_TOOLS = [t["name"] for t in json.loads(SNAPSHOT.read_text())["tools"]]
INDEX = "CLIs on your PATH (run the command shown for usage before first use):"


def _n(text: str) -> int:
    """Tokens of ``text``, counted with the encoder itself (not through fleetctl's counter)."""
    from fleetctl.tokencount.offline import load_o200k

    enc, _ = load_o200k()
    return len(enc.encode_ordinary(text))


def _role(servers: dict, skills: tuple[str, ...] = ("reply", "mcp-bridge")) -> dict:
    return {"prompt": PROMPT, "skills": list(skills), "mcp_servers": servers}


def _bridge_line(server: str) -> str:
    return f"- mcp-bridge {server} (MCP server {server}, skill mcp-bridge): " \
           f"`mcp-bridge {server} --help`"


def test_bridged_servers_are_cli_index_lines_and_mcp_servers_are_tools(tmp_path):
    project = make_tokens_project(tmp_path, {
        # tracker's tools in the prefix; wiki behind the bridge (its command cannot start: it
        # must not be started at all)
        "mixed": _role({"tracker": {"snapshot": str(SNAPSHOT)},
                        "wiki": {"via": "bridge", "command": NOWHERE}}),
        "bridged": _role({"tracker": {"via": "bridge", "command": NOWHERE},
                          "wiki": {"via": "bridge", "command": NOWHERE}}),
        "tracker_only": _role({"tracker": {"snapshot": str(SNAPSHOT)}})}, skills=SKILLS)
    mixed = tokens("mixed", "--compare", "mcp", "--format", "json", project=project)
    assert mixed.code == 0, mixed.stdout + mixed.stderr
    a = mixed.agent("mixed")
    assert a["status"] == "ok"
    # via mcp: one tool schema per tool of the snapshot (33, counted from the file), and the
    # server is listed; via bridge: no schema, not listed, named as bridged.
    assert [t["name"] for t in a["tools"]] == ["bash"] + [f"mcp__tracker__{t}"
                                                          for t in SNAPSHOT_TOOLS]
    assert len(SNAPSHOT_TOOLS) == 33
    assert [s["name"] for s in a["servers"]] == ["tracker"]
    assert a["bridged_servers"] == ["wiki"]
    parts = {c["name"]: c["tokens"] for c in a["components"]}
    clis = [INDEX, "- reply (skill reply): `reply --help`",
            "- mcp-bridge (skill mcp-bridge): `mcp-bridge --help`"]
    assert parts["cli_index"] == _n("\n".join(clis + [_bridge_line("wiki")]))

    # The bridged server adds exactly its line: an independent run of the role without it.
    alone = tokens("tracker_only", "--format", "json", project=project)
    assert alone.code == 0, alone.stderr
    assert a["total_tokens"] - alone.agent("tracker_only")["total_tokens"] == \
        _n("\n".join(clis + [_bridge_line("wiki")])) - _n("\n".join(clis))

    # --compare mcp: as declared against every server behind the bridge, which is what an
    # independent run of the role declaring both via bridge measures.
    bridged = tokens("bridged", "--format", "json", project=project)
    assert bridged.code == 0, bridged.stderr
    b = bridged.agent("bridged")
    assert [t["name"] for t in b["tools"]] == ["bash"] and b["servers"] == []
    assert {c["name"]: c["tokens"] for c in b["components"]}["cli_index"] == _n(
        "\n".join(clis + [_bridge_line("tracker"), _bridge_line("wiki")]))
    c = a["compare"]
    assert c["servers"] == ["tracker", "wiki"] and c["tools_moved"] == 33
    assert c["declared_total_tokens"] == a["total_tokens"]
    assert c["bridge_total_tokens"] == b["total_tokens"]
    assert c["saving_tokens"] == a["total_tokens"] - b["total_tokens"] > 0

    text = tokens("mixed", project=project).stdout
    assert "MCP server tracker: ok, 33 tools" in text
    assert "MCP server wiki: via bridge, one CLI-index line (`mcp-bridge wiki --help`)" in text


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1)
                if ln.strip() == needle)


def test_a_via_that_cannot_work_is_an_input_error_naming_file_line_and_key(tmp_path):
    no_skill = make_tokens_project(tmp_path / "a", {"triager": _role(
        {"tracker": {"snapshot": str(SNAPSHOT)},
         "wiki": {"command": NOWHERE, "via": "bridge"}}, skills=("reply",))}, skills=SKILLS)
    run = tokens("--format", "json", project=no_skill)
    line = _line_of(no_skill[1] / "roles" / "triager.yaml", "via: bridge")
    assert run.code == 2
    assert f"triager.yaml:{line}: mcp_servers.wiki.via: bridge needs the mcp-bridge " \
           "skill in skills" in run.stderr
    assert "add mcp-bridge to the role's skills, or set via: mcp" in run.stderr

    snapshot = make_tokens_project(tmp_path / "b", {"triager": _role(
        {"wiki": {"snapshot": str(SNAPSHOT), "via": "bridge"}})}, skills=SKILLS)
    run = tokens(project=snapshot)
    line = _line_of(snapshot[1] / "roles" / "triager.yaml", "via: bridge")
    assert run.code == 2
    assert (f"triager.yaml:{line}: mcp_servers.wiki.via: value error, bridge needs a command"
            in run.stderr)

    typo = make_tokens_project(tmp_path / "c", {"triager": _role(
        {"wiki": {"command": NOWHERE, "via": "cli"}})}, skills=SKILLS)
    run = tokens(project=typo)
    assert run.code == 2 and "mcp_servers.wiki.via: input should be 'mcp' or 'bridge'" \
        in run.stderr


def test_live_dead_weight_counts_bridged_tools_as_reached_through_the_bridge(tmp_path):
    """wiki is a real stdio server behind the bridge (started to list its tools): its tools
    add nothing to a turn, its CLI-index line is dead weight until one of them is called."""
    snap = tmp_path / "three.tools.json"
    snap.write_text(json.dumps({"tools": [
        {"name": n, "description": f"{n}.", "inputSchema": {"type": "object"}}
        for n in ("search_issues", "create_issue")]}))
    role = _role({"tracker": {"snapshot": str(snap)}, "wiki": tracker(via="bridge")})
    inv, bp = make_tokens_project(tmp_path / "p", {"triager": role}, skills=SKILLS)
    without = make_tokens_project(tmp_path / "q", {"triager": _role(
        {"tracker": {"snapshot": str(snap)}})}, skills=SKILLS)
    audit = tokens("--format", "json", project=(inv, bp))
    assert audit.code == 0, audit.stderr
    wiki_line = audit.agent("triager")["total_tokens"] - tokens(
        "--format", "json", project=without).agent("triager")["total_tokens"]
    marginal = {t["name"]: t["marginal_tokens"] for t in audit.agent("triager")["tools"]}
    assert wiki_line > 0

    t = "2026-11-30T01:00:0{}.000Z"
    write_ledger(tmp_path / "p" / "box", "triager", [
        _with_calls(record("triager", "h1", 0, 10, time=t.format(0)),
                    {"reply": 1, "mcp-bridge": 1}, {"tracker/search_issues": 1}),
        _with_calls(record("triager", "h1", 1, 10, time=t.format(1)),
                    {"mcp-bridge": 2}, {"wiki/get_viewer": 2})])

    first = tokens("--live", "--format", "json", project=(inv, bp))
    assert first.code == 0, first.stdout + first.stderr
    c = first.agent("triager")["calls"]
    assert [(s["name"], s["via"], s["status"]) for s in c["mcp_servers"]] == [
        ("tracker", "mcp", "ok"), ("wiki", "bridge", "ok")]
    wiki_tools = [f"wiki/{n}" for n in SNAPSHOT_TOOLS]  # the stdio server lists the same 33
    assert c["declared_mcp_tools"] == ["tracker/search_issues", "tracker/create_issue",
                                       *wiki_tools]
    assert c["called_undeclared"] == {"clis": [], "tools": []}
    dead = c["dead_weight"]
    assert dead["bridged_servers"] == []  # one of its tools was called
    assert dead["tools"] == [
        {"name": "tracker/create_issue", "server": "tracker",
         "prefix_tokens": marginal["mcp__tracker__create_issue"]},
        *({"name": n, "server": "wiki", "prefix_tokens": 0}
          for n in wiki_tools if n != "wiki/get_viewer")]
    assert dead["prefix_tokens"] == marginal["mcp__tracker__create_issue"]

    # Only the first turn: no wiki tool called, so its line is dead weight, at its tokens.
    path = tmp_path / "p" / "box" / "state" / "triager" / "ledger.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    early = tokens("--live", "--format", "json", project=(inv, bp))
    c = early.agent("triager")["calls"]
    assert c["dead_weight"]["bridged_servers"] == [{"name": "wiki", "prefix_tokens": wiki_line}]
    assert c["dead_weight"]["prefix_tokens"] == wiki_line + marginal["mcp__tracker__create_issue"]
    text = tokens("--live", project=(inv, bp)).stdout
    assert "MCP servers tracker (2 tools), wiki (33 tools, via bridge)" in text
    assert f"bridged server wiki ({wiki_line})" in text



def test_compare_on_a_role_already_behind_the_bridge_says_there_is_nothing_to_move(tmp_path):
    project = make_tokens_project(tmp_path, {"bridged": _role(
        {"tracker": {"via": "bridge", "command": NOWHERE}})}, skills=SKILLS)
    run = tokens("bridged", "--compare", "mcp", project=project)
    assert run.code == 0, run.stdout + run.stderr
    assert "every server is already behind the bridge CLI (via: bridge): nothing to move" \
        in run.stdout
    assert "0 tools still reachable" not in run.stdout
