"""``fleetctl tokens`` end to end through typer's CliRunner: tables per agent, budgets and exit
codes, ``--compare mcp``, ``--baseline``, the formats, and a real MCP server that fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from fleetctl.cli.tokens import tokens_command
from fleetctl.tokencount.offline import PUBLISHED_SHA256
from tests.mcp_servers.project import REPO, SNAPSHOT, make_tokens_project, tracker


def _app() -> typer.Typer:
    import fleetctl.cli

    registered = {c.name for c in fleetctl.cli.app.registered_commands}
    if "tokens" in registered:
        return fleetctl.cli.app
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.callback()(lambda: None)
    app.command("tokens")(tokens_command)
    return app


class Run:
    def __init__(self, result) -> None:
        self.code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    @property
    def doc(self) -> dict:
        return json.loads(self.stdout)

    def agent(self, name: str) -> dict:
        return next(a for a in self.doc["agents"] if a["agent"] == name)


def tokens(*args: str, project: tuple[Path, Path] | None = None) -> Run:
    argv = ["tokens", *args]
    if project is not None:
        argv += ["--inventory", str(project[0]), "--blueprint", str(project[1])]
    return Run(CliRunner().invoke(_app(), argv, catch_exceptions=False))


PROMPT = "You triage incoming issues: find duplicates, set priority and state, and comment why."


def _triager(**extra) -> dict:
    return {"prompt": PROMPT, "skills": ["reply"], **extra}


def test_the_repository_blueprint(monkeypatch):
    monkeypatch.chdir(REPO)
    run = tokens("--format", "json")
    assert run.code == 0, run.stderr
    doc = run.doc
    assert doc["schema_version"] == 1 and doc["command"] == "tokens" and doc["exit_code"] == 0
    assert doc["counter"]["name"] == "o200k_base"
    assert doc["counter"]["data_sha256"] == PUBLISHED_SHA256
    assert doc["estimate"]["estimate"] is True
    assert {a["agent"] for a in doc["agents"]} == {"concierge", "engineer", "reviewer", "qa"}
    eng = run.agent("engineer")
    assert eng["budgets"]["budget_tokens"] == 9000 and eng["status"] == "ok"
    assert sum(c["tokens"] for c in eng["components"]) == eng["total_tokens"]
    assert eng["context_window_tokens"] == 200_000
    # The harness's built-in tools replace the runner's shell tool: exactly the role's tools:.
    declared = yaml.safe_load((REPO / "blueprint" / "roles" / "engineer.yaml").read_text())["tools"]
    assert sorted(t["name"] for t in eng["tools"]) == sorted(declared)
    assert eng["harness"]["name"] == "claude-code" and eng["harness_missing"] is None


def test_text_report_names_everything(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager(
        mcp_servers={"tracker": {"snapshot": str(SNAPSHOT)}})})
    run = tokens(project=project)
    assert run.code == 0, run.stderr
    out = run.stdout
    for word in ("h1/triager", "role_prompt", "mcp_tools", "tool_use_system_prompt", "% context",
                 "heaviest tools (34 in all", "mcp__tracker__create_issue",
                 "MCP server tracker: ok",
                 PUBLISHED_SHA256, "Claude estimate", "estimate, not a count"):
        assert word in out, word


def test_budget_ceilings_and_exit_1(tmp_path):
    project = make_tokens_project(tmp_path, {
        "small": _triager(budget_tokens=100),
        "ceilings": _triager(max_tool_tokens=300, max_tools=10,
                             mcp_servers={"tracker": {"snapshot": str(SNAPSHOT)}}),
        "fine": _triager(budget_tokens=5000)})
    run = tokens("--format", "json", project=project)
    assert run.code == 1
    small = run.agent("small")
    assert small["status"] == "over"
    assert [f["kind"] for f in small["findings"]] == ["budget_tokens"]
    assert small["findings"][0]["actual"] == small["total_tokens"] > 100
    ceilings = run.agent("ceilings")
    kinds = [f["kind"] for f in ceilings["findings"]]
    assert kinds.count("max_tools") == 1 and ceilings["findings"][-1]["actual"] == 34
    heavy = {f["subject"] for f in ceilings["findings"] if f["kind"] == "max_tool_tokens"}
    assert heavy == {t["name"] for t in ceilings["tools"] if t["marginal_tokens"] > 300}
    assert heavy  # create_issue is among them
    assert run.agent("fine")["status"] == "ok"
    # One agent selected: only its verdict counts.
    assert tokens("fine", project=project).code == 0
    assert tokens("h1/small", project=project).code == 1


def test_compare_mcp_with_a_real_server(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager(
        budget_tokens=20000, mcp_servers={"tracker": tracker("--page-size", "10")})})
    run = tokens("--compare", "mcp", "--format", "json", project=project)
    assert run.code == 0, run.stderr
    agent = run.agent("triager")
    assert agent["servers"][0]["status"] == "ok" and agent["servers"][0]["pages"] == 4
    compare = agent["compare"]
    assert compare["tools_moved"] == 33
    assert compare["declared_total_tokens"] == agent["total_tokens"]
    assert compare["saving_tokens"] == agent["total_tokens"] - compare["bridge_total_tokens"] > 0
    assert compare["tool_cut_pct"] >= 85
    bridge = {c["name"]: c["tokens"] for c in compare["bridge_components"]}
    assert bridge["mcp_tools"] == 0 and bridge["mcp_instructions"] == 0
    assert bridge["tool_use_system_prompt"] == 346  # the shell tool is still there


def test_an_unmeasurable_server_is_exit_2_and_never_a_saving(tmp_path):
    project = make_tokens_project(tmp_path, {
        "broken": _triager(mcp_servers={"tracker": tracker("--mode", "crash-on-list")}),
        "fine": _triager()})
    run = tokens("--compare", "mcp", "--format", "json", project=project)
    assert run.code == 2
    broken = run.agent("broken")
    assert broken["status"] == "incomplete"
    server = broken["servers"][0]
    assert server["status"] == "crashed" and server["tools"] == 0
    assert "lost the database connection" in server["stderr_tail"]
    assert broken["compare"]["saving_tokens"] is None
    assert broken["compare"]["tool_cut_pct"] is None
    assert any("lower bound" in w for w in broken["warnings"])
    assert run.agent("fine")["status"] == "ok"
    text = tokens("--compare", "mcp", project=project)
    assert text.code == 2 and "stderr| tracker: fatal: lost the database connection" in text.stdout
    assert "never counted as a saving" in text.stdout


def test_baseline_growth(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager(
        mcp_servers={"tracker": {"snapshot": str(SNAPSHOT)}})})
    base = tmp_path / "base.json"
    assert tokens("--format", "json", "--output", str(base), project=project).code == 0
    assert tokens("--baseline", str(base), project=project).code == 0  # unchanged
    # Grow the prompt a little (within 5%), then a lot, and add a tool to the snapshot.
    role = project[1] / "roles" / "triager.yaml"
    role.write_text(role.read_text().replace("comment why.", "comment why. Be concise."))
    assert tokens("--baseline", str(base), project=project).code == 0
    snap = json.loads(SNAPSHOT.read_text())
    snap["tools"].append({"name": "export_issues", "description": "Export every issue as CSV, "
                          "with all fields and history. " * 20,
                          "inputSchema": {"type": "object", "properties": {}}})
    grown = tmp_path / "grown.json"
    grown.write_text(json.dumps(snap))
    role.write_text(role.read_text().replace(str(SNAPSHOT), str(grown)))
    run = tokens("--baseline", str(base), "--format", "json", project=project)
    assert run.code == 1
    finding = run.agent("triager")["findings"][0]
    assert finding["kind"] == "growth"
    assert "tool mcp__tracker__export_issues (new)" in finding["message"]
    assert "mcp_tools +" in finding["message"] and "role_prompt +" in finding["message"]
    assert tokens("--baseline", str(base), "--max-growth", "1000", project=project).code == 0


def test_a_baseline_from_another_counter_is_refused(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager()})
    base = tmp_path / "base.json"
    tokens("--format", "json", "--output", str(base), project=project)
    doc = json.loads(base.read_text())
    doc["counter"]["data_sha256"] = "0" * 64
    base.write_text(json.dumps(doc))
    run = tokens("--baseline", str(base), project=project)
    assert run.code == 2 and "not comparable" in run.stderr
    base.write_text("{}")
    assert tokens("--baseline", str(base), project=project).code == 2


def test_markdown(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager(
        mcp_servers={"tracker": {"snapshot": str(SNAPSHOT)}})})
    run = tokens("--format", "markdown", "--compare", "mcp", project=project)
    assert run.code == 0
    assert run.stdout.startswith("# fleetctl tokens\n")
    assert "| component | tokens | % prefix | % context | how |" in run.stdout
    assert "`mcp__tracker__create_issue`" in run.stdout
    assert "--compare mcp (tracker)" in run.stdout and PUBLISHED_SHA256 in run.stdout


@pytest.mark.parametrize("args, role, message", [
    (["nosuch"], _triager(), "no agent named nosuch"),
    ([], {**_triager(), "mcp_servers": {"t": {"env": {"A": "1"}}}},
     "triager.yaml:6: mcp_servers.t: value error, give a command"),
    ([], {**_triager(), "tools": ["Bash"]}, "triager.yaml:5: tools: needs an agent_command"),
    ([], {**_triager(), "agent_command": ["claude", "--tools", "Bash"], "tools": ["Bash"]},
     "--tools is already in agent_command"),
    ([], {**_triager(), "harness": "nosuch"}, "unknown harness 'nosuch'"),
    ([], {**_triager(), "max_tools": "many"}, "max_tools"),
    ([], {**_triager(), "skills": ["nosuch"]}, "no skill 'nosuch'"),
    (["--counter", "claude-api"], _triager(), "ANTHROPIC_API_KEY"),
    (["--live", "--compare", "mcp"], _triager(), "it takes no --compare"),
    (["--live", "--since", "yesterday"], _triager(), "not an ISO 8601 time"),
])
def test_bad_input_is_exit_2(tmp_path, monkeypatch, args, role, message):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    project = make_tokens_project(tmp_path, {"triager": role})
    run = tokens(*args, project=project)
    assert run.code == 2
    assert message in run.stderr


def test_a_blueprint_without_the_runner_is_exit_2(tmp_path):
    project = make_tokens_project(tmp_path, {"triager": _triager()})
    shutil.rmtree(project[1] / "runner")
    run = tokens(project=project)
    assert run.code == 2 and "prefix builder" in run.stderr


def test_claude_api_counter_with_an_injected_client(tmp_path):
    # The library accepts any client object; the CLI would build anthropic.Anthropic().
    from fleetctl.tokens.audit import TokensOptions, audit_tokens
    from tests.tokens.test_tokens_measure import ScriptedCounts

    project = make_tokens_project(tmp_path, {"triager": _triager(budget_tokens=400)})
    client = ScriptedCounts({"bash": 90})
    report = audit_tokens(*project, TokensOptions(
        counter="claude-api", claude_client=client, claude_cache=tmp_path / "cache.json"))
    agent = report.agents[0]
    assert report.counter["name"] == "claude-count-tokens"
    assert report.counter["model"] == "claude-sonnet-4-5" and report.estimate is None
    words = len(PROMPT.split()) + len("Skills you can use:\n- reply: x".split()) - 1
    assert agent.measurement.component("shell_tool").tokens == 90
    assert agent.measurement.total_tokens >= 90 + 346 + words
    assert agent.status == ("over" if agent.measurement.total_tokens > 400 else "ok")
    sent = len(client.requests)
    cached = json.loads((tmp_path / "cache.json").read_text())
    assert len(cached) == sent
    # A second run is answered from the cache file: nothing is sent.
    audit_tokens(*project, TokensOptions(counter="claude-api", claude_client=client,
                                         claude_cache=tmp_path / "cache.json"))
    assert len(client.requests) == sent


def test_the_documented_example_is_what_the_command_measures(capsys):
    # docs/tokens.md quotes `python -m tests.mcp_servers.example`; the numbers must still hold.
    from tests.mcp_servers import example

    assert example.main(["--format", "json"]) == 0
    agent = json.loads(capsys.readouterr().out)["agents"][0]
    compare = agent["compare"]
    assert compare["tool_cut_pct"] >= 85  # the target, every tool still reachable
    docs = (REPO / "docs" / "tokens.md").read_text()
    assert (f"as declared {compare['declared_total_tokens']:,} tokens, with the bridge CLI "
            f"{compare['bridge_total_tokens']:,}: saves {compare['saving_tokens']:,} "
            f"({compare['saving_pct']:.1f}%) a turn") in docs
    assert (f"tool-definition tokens {compare['tool_tokens_declared']:,} -> "
            f"{compare['tool_tokens_bridge']:,} (cut {compare['tool_cut_pct']:.1f}%)") in docs


def test_an_internal_error_in_tokens_takes_the_one_way_out(tmp_path, monkeypatch):
    """tokens ends like every other command: an unexpected error (here in its JSON renderer,
    after the audit) prints "internal error" and a hint, exits 2 and shows the traceback only
    with --debug. (Before, a renderer's error escaped as a raw traceback with exit 1, which CI
    reads as "over budget", and the audit's own had another message.)"""
    import fleetctl.cli.output.tokens as rendering

    def broken(*_args, **_kw):
        raise ValueError("renderer exploded")

    monkeypatch.setattr(rendering, "to_json", broken)
    project = make_tokens_project(tmp_path, {"triager": _triager()})
    plain = tokens("--format", "json", project=project)
    assert plain.code == 2
    assert "error: internal error: ValueError: renderer exploded" in plain.stderr
    assert "rerun with --debug" in plain.stderr and "Traceback" not in plain.stderr
    debug = tokens("--format", "json", "--debug", project=project)
    assert debug.code == 2 and "Traceback" in debug.stderr and "renderer exploded" in debug.stderr
