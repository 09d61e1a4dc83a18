"""``fleetctl tokens --live`` against real hosts: the local transport and an sshd box.

The ledgers are written by the test with the runner's own record function
(``blueprint/runner/fleet_runner/ledger.py``'s ``ledger_record``), so every line has the runner's
exact fields; the statistics are computed here from the numbers the test chose.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from tests.helpers import local_host, snapshot, ssh_host, write_inventory
from tests.mcp_servers.project import REPO, make_tokens_project
from tests.sshd_boxes import free_port
from tests.tokens.test_tokens_cli import tokens

sys.path.insert(0, str(REPO / "blueprint" / "runner"))
from fleet_runner.ledger import ledger_record  # noqa: E402

ROLE = {"prompt": "You triage incoming issues.", "skills": ["reply"]}


def record(agent: str, host: str, i: int, role_prompt: int, usage: dict | None = None,
           time: str | None = None) -> dict:
    rec = ledger_record(agent=agent, host=host, model=None, task=f"m-{i}", attempt=1,
                        run=f"m-{i}/1", prefix_tokens={"role_prompt": role_prompt,
                                                       "skills_index": 30, "cli_index": 20},
                        task_prompt_tokens=15, usage=usage, duration_s=0.5,
                        outcome="exited with status 0")
    if time is not None:
        rec["time"] = time
    return rec


def write_ledger(root: Path, agent: str, lines: list[str]) -> Path:
    path = root / "state" / agent / "ledger.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def project(tmp_path: Path, hosts: dict[str, dict]) -> tuple[Path, Path]:
    _inv, bp = make_tokens_project(tmp_path, {"triager": ROLE})
    return write_inventory(tmp_path / "live.yaml", hosts), bp


def test_local_and_ssh_hosts_are_summarised(tmp_path, sshd_pool, ssh_client_key,
                                            ssh_known_hosts):
    """20 turns on a local host and 7 on an sshd box: turns, median and p95 of the prefix sums,
    usage per turn, the counter named as an estimate, a malformed line counted, a missing ledger
    reported, and nothing on either host changed by reading."""
    local_root, ssh_root = tmp_path / "local", tmp_path / "sshbox"
    # Local agent: role_prompt 1..20 in a shuffled order, so the prefix sums are 51..70.
    sizes = list(range(1, 21))
    random.Random(4).shuffle(sizes)
    usage = {"input_tokens": 1000, "output_tokens": 50}
    lines = [json.dumps(record("t1", "local", i, n, usage if i < 4 else None))
             for i, n in enumerate(sizes)]
    lines.insert(7, '{"time": "2026-11-30T00:00:00.000Z", "agent": "t1"')  # cut short
    lines.insert(9, json.dumps({"agent": "t1", "prefix_tokens": "many"}))  # not a record
    write_ledger(local_root, "t1", lines)
    # The sshd box: 7 turns with prefixes 60, 70, ..., 120.
    write_ledger(ssh_root, "s1", [json.dumps(record("s1", "box", i, 10 * i + 10))
                                  for i in range(7)])
    inv, bp = project(tmp_path, {
        "local": local_host(local_root, {"t1": {"role": "triager"},
                                         "t2": {"role": "triager"}}),
        "box": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, ssh_root,
                        {"s1": {"role": "triager"}})})
    before = (snapshot(local_root), snapshot(ssh_root))

    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 0, run.stdout + run.stderr
    assert (snapshot(local_root), snapshot(ssh_root)) == before
    doc = run.doc
    assert doc["command"] == "tokens --live" and doc["exit_code"] == 0
    assert [h["status"] for h in doc["hosts"]] == ["ok", "ok"]

    t1 = run.agent("t1")
    prefixes = sorted(n + 50 for n in sizes)
    assert t1["status"] == "ok" and t1["turns"] == 20
    assert t1["prefix_tokens"]["median"] == (prefixes[9] + prefixes[10]) / 2 == 60.5
    assert t1["prefix_tokens"]["p95"] == prefixes[18] == 69  # nearest rank: the 19th of 20
    assert t1["prefix_tokens"]["max"] == 70 and t1["prefix_tokens"]["sum"] == sum(prefixes)
    assert t1["malformed"]["count"] == 2 and t1["lines"] == 22
    assert [e["line_number"] for e in t1["malformed"]["examples"]] == [8, 10]
    assert t1["usage"]["turns_with_usage"] == 4
    assert t1["usage"]["per_turn_mean"] == {"input_tokens": 1000, "output_tokens": 50}
    assert t1["token_counters"] == [{"name": "bytes/4-estimate", "exact": False,
                                     "note": "UTF-8 bytes / 4, rounded up: an estimate, "
                                             "not a count"}]
    assert t1["calls"]["declared_clis"] == ["reply"] and t1["calls"]["called"] is None
    assert t1["calls"]["note"].startswith("not recorded")

    s1 = run.agent("s1")
    assert s1["status"] == "ok" and s1["host"] == "box" and s1["turns"] == 7
    assert s1["prefix_tokens"]["median"] == 90 and s1["prefix_tokens"]["p95"] == 120
    assert s1["malformed"]["count"] == 0 and s1["usage"]["turns_with_usage"] == 0

    t2 = run.agent("t2")
    assert t2["status"] == "missing" and t2["turns"] == 0
    assert t2["path"] == str(local_root / "state" / "t2" / "ledger.jsonl")

    text = tokens("--live", project=(inv, bp))
    assert text.code == 0
    assert "local/t1 (role triager): 20 turns" in text.stdout
    assert "median 60.5, p95 69" in text.stdout
    assert "bytes/4-estimate (UTF-8 bytes / 4, rounded up: an estimate, not a count)" \
        in text.stdout
    assert "malformed lines: 2 (skipped)" in text.stdout
    assert "local/t2 (role triager): no ledger yet" in text.stdout
    assert "box/s1 (role triager): 7 turns" in text.stdout
    assert "called: not recorded" in text.stdout
    md = tokens("--live", "--format", "markdown", project=(inv, bp))
    assert md.code == 0 and "| local/t1 | ok | 20 | 60.5 | 69 | 1,000 | 50 |" in md.stdout

    only = tokens("--live", "--format", "json", "box/s1", project=(inv, bp))
    assert [a["agent"] for a in only.doc["agents"]] == ["s1"]


def test_dead_host_among_live_ones_is_exit_2(tmp_path, sshd_pool, ssh_client_key,
                                             ssh_known_hosts):
    """A port nobody listens on: that host's agents are host errors, exit 2, and the live
    local host and sshd box are still summarised."""
    roots = {"local": tmp_path / "l", "box": tmp_path / "b"}
    write_ledger(roots["local"], "t1", [json.dumps(record("t1", "local", i, 5)) for i in range(3)])
    write_ledger(roots["box"], "s1", [json.dumps(record("s1", "box", i, 7)) for i in range(4)])
    dead = ssh_host(sshd_pool[1], ssh_client_key, ssh_known_hosts, tmp_path / "d",
                    {"d1": {"role": "triager"}})
    dead["port"] = free_port()
    inv, bp = project(tmp_path, {
        "local": local_host(roots["local"], {"t1": {"role": "triager"}}),
        "dead": dead,
        "box": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, roots["box"],
                        {"s1": {"role": "triager"}}),
    })
    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 2, run.stdout + run.stderr
    assert {h["host"]: h["status"] for h in run.doc["hosts"]} == {
        "local": "ok", "dead": "error", "box": "ok"}
    assert run.agent("d1")["status"] == "host-error" and run.agent("d1")["error"]
    assert run.agent("t1")["turns"] == 3 and run.agent("t1")["prefix_tokens"]["median"] == 55
    assert run.agent("s1")["turns"] == 4 and run.agent("s1")["prefix_tokens"]["p95"] == 57
    text = tokens("--live", project=(inv, bp))
    assert text.code == 2
    assert "dead/d1 (role triager): host error:" in text.stdout
    assert "incomplete: a host or a ledger could not be read (exit 2)" in text.stdout


def test_unreadable_ledger_is_exit_2(tmp_path):
    """A ledger the host cannot read (here a directory in its place) is reported with the
    host's reason and makes the report incomplete; the other agent is summarised."""
    root = tmp_path / "r"
    (root / "state" / "t1" / "ledger.jsonl").mkdir(parents=True)
    write_ledger(root, "t2", [json.dumps(record("t2", "local", 0, 9))])
    inv, bp = project(tmp_path, {"local": local_host(root, {"t1": {"role": "triager"},
                                                            "t2": {"role": "triager"}})})
    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 2
    assert run.doc["hosts"][0]["status"] == "ok"
    assert run.agent("t1")["status"] == "unreadable"
    assert "Is a directory" in run.agent("t1")["error"]
    assert run.agent("t2")["turns"] == 1


def test_since_keeps_only_later_turns(tmp_path):
    """``--since`` (any ISO 8601 form) is applied on the host: only turns that ended after it."""
    root = tmp_path / "r"
    times = ["2026-11-30T00:59:59.999Z", "2026-11-30T01:00:00.000Z",
             "2026-11-30T01:00:00.001Z", "2026-11-30T03:00:00.000Z"]
    write_ledger(root, "t1", [json.dumps(record("t1", "local", i, 10 * i, time=t))
                              for i, t in enumerate(times)])
    inv, bp = project(tmp_path, {"local": local_host(root, {"t1": {"role": "triager"}})})
    run = tokens("--live", "--format", "json", "--since", "2026-11-30T02:00:00+01:00",
                 project=(inv, bp))
    assert run.code == 0
    assert run.doc["since"] == "2026-11-30T01:00:00.000Z"
    assert run.agent("t1")["turns"] == 2
    assert run.agent("t1")["first"] == times[2]


# -- dead weight: declared CLIs and MCP tools against the calls the ledger records -------------

TOOLS = ("search_issues", "create_issue", "get_viewer")


def _snapshot(path: Path) -> Path:
    """A tools/list snapshot of three small tools."""
    path.write_text(json.dumps({"tools": [
        {"name": n, "description": f"{n.replace('_', ' ')}.",
         "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}
        for n in TOOLS]}))
    return path


def _dw_project(base: Path, snapshot_path: Path, with_notify_cli: bool = True
                ) -> tuple[Path, Path]:
    """One triager (skills reply and notify, the snapshot's MCP server) on a local host."""
    inv, bp = make_tokens_project(
        base, {"triager": {"prompt": "You triage incoming issues.", "skills": ["reply", "notify"],
                           "mcp_servers": {"tracker": {"snapshot": str(snapshot_path)}}}},
        skills={"reply": "Send your answer.", "notify": "Escalate to a person."})
    if not with_notify_cli:
        (bp / "skills" / "notify" / "bin" / "notify").unlink()
    return inv, bp


def _with_calls(rec: dict, calls: dict | None, tool_calls: dict | None = None) -> str:
    if calls is not None:
        rec["calls"] = calls
    if tool_calls is not None:
        rec["tool_calls"] = tool_calls
    return json.dumps(rec)


def test_dead_weight_is_declared_minus_called_with_prefix_tokens(tmp_path):
    """Calls summed over the turns that record them; notify and two of the three tracker tools
    never called are the dead weight, each with the tokens the audit gives it (the CLI's line:
    the audit's total with and without that CLI; a tool: the audit's marginal cost)."""
    snap = _snapshot(tmp_path / "tracker.tools.json")
    inv, bp = _dw_project(tmp_path / "p", snap)
    root = tmp_path / "p" / "box"
    t = "2026-11-30T01:00:0{}.000Z"
    write_ledger(root, "triager", [
        _with_calls(record("triager", "h1", 0, 10, time=t.format(0)), None),  # an older runner
        _with_calls(record("triager", "h1", 1, 10, time=t.format(1)), {"reply": 1, "notify": 0},
                    {}),
        _with_calls(record("triager", "h1", 2, 10, time=t.format(2)), {"reply": 2},
                    {"tracker/search_issues": 3, "wiki/find": 1}),
        _with_calls(record("triager", "h1", 3, 10, time=t.format(3)), {"reply": 1, "forge": 2},
                    {"tracker/search_issues": 1}),
        _with_calls(record("triager", "h1", 4, 10, time=t.format(4)), {"reply": "one"}),
        _with_calls(record("triager", "h1", 5, 10, time=t.format(5)), None),  # an older runner
    ])
    audit = tokens("--format", "json", project=(inv, bp))
    assert audit.code == 0, audit.stderr
    without = tokens("--format", "json", project=_dw_project(tmp_path / "q", snap, False))
    notify_tokens = (audit.agent("triager")["total_tokens"]
                     - without.agent("triager")["total_tokens"])
    marginal = {t["name"]: t["marginal_tokens"] for t in audit.agent("triager")["tools"]}
    assert notify_tokens > 0 and marginal["mcp__tracker__create_issue"] > 0

    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 0, run.stdout + run.stderr
    a = run.agent("triager")
    assert a["turns"] == 5 and a["malformed"]["count"] == 1
    assert a["malformed"]["examples"][0]["reason"] == "calls is not an object of counts"
    c = a["calls"]
    assert c["declared_clis"] == ["notify", "reply"]
    assert c["declared_mcp_servers"] == ["tracker"]
    assert c["declared_mcp_tools"] == [f"tracker/{n}" for n in TOOLS]
    assert c["mcp_servers"] == [{"name": "tracker", "via": "mcp", "status": "ok", "tools": 3,
                                 "detail": ""}]
    assert c["recorded_turns"] == {"calls": 3, "tool_calls": 3}
    assert c["called"] == {"clis": {"forge": 2, "reply": 4},
                           "tools": {"tracker/search_issues": 4, "wiki/find": 1}}
    assert c["called_undeclared"] == {"clis": ["forge"], "tools": ["wiki/find"]}
    dead = c["dead_weight"]
    assert dead["clis"] == [{"name": "notify", "skill": "notify", "prefix_tokens": notify_tokens}]
    assert dead["tools"] == [
        {"name": "tracker/create_issue", "server": "tracker",
         "prefix_tokens": marginal["mcp__tracker__create_issue"]},
        {"name": "tracker/get_viewer", "server": "tracker",
         "prefix_tokens": marginal["mcp__tracker__get_viewer"]}]
    total = notify_tokens + marginal["mcp__tracker__create_issue"] \
        + marginal["mcp__tracker__get_viewer"]
    assert dead["prefix_tokens"] == total and c["prefix_counter"] == "o200k_base"
    assert c["note"] == ("recorded in 3 of 5 turns; the other lines are from a runner that did "
                         "not record calls")

    text = tokens("--live", project=(inv, bp))
    assert "declared: CLIs notify, reply; MCP servers tracker (3 tools)" in text.stdout
    assert ("called (recorded in 3 of 5 turns; the other lines are from a runner that did not "
            "record calls): CLIs forge 2, reply 4; MCP tools tracker/search_issues 4, "
            "wiki/find 1") in text.stdout
    assert (f"dead weight (declared, never called): CLI notify ({notify_tokens}), tool "
            f"tracker/create_issue ({marginal['mcp__tracker__create_issue']}), tool "
            f"tracker/get_viewer ({marginal['mcp__tracker__get_viewer']}): {total} prefix "
            "tokens a turn (o200k_base)") in text.stdout
    md = tokens("--live", "--format", "markdown", project=(inv, bp))
    assert f"| 1 | 0 | 3 ({total} tokens) |" in md.stdout

    # Only the last turn, from an older runner: not recorded, never "never called".
    old = tokens("--live", "--format", "json", "--since", t.format(4), project=(inv, bp))
    c = old.agent("triager")["calls"]
    assert old.agent("triager")["turns"] == 1
    assert c["called"] is None and c["recorded_turns"] == {"calls": 0, "tool_calls": 0}
    assert c["dead_weight"] == {"clis": None, "tools": None, "bridged_servers": [],
                                "prefix_tokens": None}
    assert c["note"].startswith("not recorded")
    old_text = tokens("--live", "--since", t.format(4), project=(inv, bp)).stdout
    assert "called: not recorded" in old_text and "dead weight (declared" not in old_text
    assert "| not recorded |" in tokens("--live", "--format", "markdown", "--since", t.format(4),
                                        project=(inv, bp)).stdout


def test_what_cannot_be_counted_or_listed_is_said(tmp_path):
    """A server whose snapshot is gone is reported (its tools are not dead weight) and a
    blueprint without the runner's prefix builder leaves the prefix tokens unknown; both are
    said, the ledger is still summarised and the exit code stays 0."""
    inv, bp = _dw_project(tmp_path, tmp_path / "gone.tools.json")
    (bp / "runner" / "fleet_runner" / "prefix.py").unlink()
    write_ledger(tmp_path / "box", "triager", [
        _with_calls(record("triager", "h1", 0, 10), {"reply": 1}, {"tracker/get_viewer": 1})])
    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 0, run.stdout + run.stderr
    c = run.agent("triager")["calls"]
    assert [s["status"] for s in c["mcp_servers"]] == ["bad-snapshot"]
    assert c["declared_mcp_tools"] == [] and c["called_undeclared"]["tools"] == []
    assert c["dead_weight"]["clis"] == [{"name": "notify", "skill": "notify",
                                         "prefix_tokens": None}]
    assert c["dead_weight"]["prefix_tokens"] is None and c["prefix_counter"] is None
    assert "prefix tokens not counted" in c["prefix_note"] and "prefix.py" in c["prefix_note"]
    assert "MCP server(s) tracker could not be listed" in c["note"]
    text = tokens("--live", project=(inv, bp)).stdout
    assert "MCP servers tracker (not listed: bad-snapshot:" in text
    assert "dead weight (declared, never called): CLI notify (prefix tokens not counted:" in text


# -- a line being written while --live reads ------------------------------------------------------


def test_last_line_without_newline_is_partial_not_malformed(tmp_path, sshd_pool, ssh_client_key,
                                                            ssh_known_hosts):
    """On a local host and an sshd box: a cut-short complete line is malformed (counted,
    quoted), a last line without its newline is partial (skipped, counted apart), also with
    --since, and a file that is only a partial line has no turns and no malformed line."""
    roots = {"local": tmp_path / "l", "box": tmp_path / "b"}
    for name, root in roots.items():
        lines = [json.dumps(record("t1", name, i, 10 + i)) for i in range(4)]
        lines.insert(2, '{"schema_version": 1, "time": "2026')  # cut short, newline after it
        path = write_ledger(root, "t1", lines)
        with open(path, "a") as fh:
            fh.write(json.dumps(record("t1", name, 9, 99)))  # being written: no newline yet
        write_ledger(root, "t2", [])
        (root / "state" / "t2" / "ledger.jsonl").write_text('{"schema_version": 1, "ti')
    inv, bp = project(tmp_path, {
        "local": local_host(roots["local"], {"t1": {"role": "triager"},
                                             "t2": {"role": "triager"}}),
        "box": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, roots["box"],
                        {"t1": {"role": "triager"}, "t2": {"role": "triager"}})})
    for args in ((), ("--since", "2000-01-01T00:00:00Z")):
        run = tokens("--live", "--format", "json", *args, project=(inv, bp))
        assert run.code == 0, run.stdout + run.stderr
        for a in run.doc["agents"]:
            if a["agent"] == "t1":
                assert (a["turns"], a["lines"], a["partial"]) == (4, 5, 1)
                assert a["malformed"]["count"] == 1
                assert a["malformed"]["examples"][0]["line_number"] == 3
                assert a["prefix_tokens"]["max"] == 63  # not the partial line's 149
            else:
                assert (a["status"], a["turns"], a["lines"], a["partial"]) == ("ok", 0, 0, 1)
                assert a["malformed"]["count"] == 0
    text = tokens("--live", project=(inv, bp)).stdout
    assert text.count("partial line: 1 (being written as it was read; skipped)") == 4
    assert text.count("malformed lines: 1 (skipped)") == 2


def test_a_line_appended_in_pieces_is_partial_until_its_newline(tmp_path):
    """The runner's line format appended in pieces with O_APPEND writes (cut inside a
    multi-byte character and just before the newline): every read between two pieces sees the
    complete turns and one partial line, never a malformed one."""
    root = tmp_path / "r"
    path = write_ledger(root, "t1", [])
    inv, bp = project(tmp_path, {"local": local_host(root, {"t1": {"role": "triager"}})})
    for i in range(3):
        rec = record("t1", "local", i, 10 * i + 10)
        rec["outcome"] = "exited with status 0 — résumé ✓"
        data = (json.dumps(rec, sort_keys=True, ensure_ascii=False) + "\n").encode()
        cut = data.index("✓".encode()) + 1  # inside the character
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for piece in (data[:cut], data[cut:-1], data[-1:]):
                os.write(fd, piece)
                a = tokens("--live", "--format", "json", project=(inv, bp)).agent("t1")
                done = piece == data[-1:]
                assert a["malformed"]["count"] == 0, a["malformed"]
                assert (a["turns"], a["partial"]) == (i + 1 if done else i, 0 if done else 1)
        finally:
            os.close(fd)
    assert a["prefix_tokens"]["sum"] == 60 + 70 + 80
