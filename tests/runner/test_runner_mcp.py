"""The runner and a role's MCP servers: via-mcp servers reach the agent command in an MCP config
file whose path replaces ``{mcp_config}`` (a real MCP server started from that file by the fake
agent), via-bridge servers are lines of the CLI index built exactly as ``fleetctl tokens``
builds them, and a role that would silently drop its MCP tools is refused at startup."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.mcp_servers.project import SNAPSHOT
from tests.runner.test_runner import FAKES, REPO, make_fleet  # noqa: F401  (a fixture)

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.config import ConfigError, config_from_data  # noqa: E402

TRACKER = {"command": [sys.executable, "-m", "tests.mcp_servers.tracker"],
           "env": {"PYTHONPATH": str(REPO), "TRACKER_SECRET": "s3cr3t-not-on-argv"}}
SNAPSHOT_TOOLS = [t["name"] for t in json.loads(SNAPSHOT.read_text())["tools"]]
SKILLS = ("reply", "notify", "mcp-bridge")


def test_via_mcp_servers_reach_the_agent_in_the_mcp_config_file(make_fleet):
    fleet = make_fleet("mcp_reader", skills=SKILLS, role={
        "agent_command": [str(FAKES / "mcp_reader"), "--mcp-config", "{mcp_config}",
                          "--again={mcp_config}"],
        "mcp_servers": {
            "tracker": TRACKER,
            # {python}: the runner's interpreter; cwd relative to the workspace
            "here": {"command": ["{python}", "-c", "import os; print(os.getcwd())"],
                     "cwd": "srv"},
            "wiki": {"via": "bridge", **TRACKER}}},
        workspace_files={"srv/.keep": ""})
    fleet.drop("t1", kind="agent", channel=None, text="list the tracker's tools")
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("t1") == ["done"]
    [mcp] = fleet.events("mcp")
    path = str(fleet.state / "runs" / "t1" / "attempt-1.mcp.json")
    # {mcp_config} replaced in every word that holds it; the env values are on no command line.
    assert mcp["argv"][1:] == ["--mcp-config", path, f"--again={path}"]
    assert mcp["path"] == path and mcp["mode"] == "0o600"
    assert fleet.record("t1", 1)["invocation"]["argv"][1:] == mcp["argv"][1:]
    assert "s3cr3t" not in json.dumps(fleet.record("t1", 1)["invocation"])
    # The file: the via-mcp servers only (wiki is behind the bridge), in the usual shape.
    here = mcp["config"]["mcpServers"]["here"]
    assert mcp["config"] == {"mcpServers": {
        "tracker": {"command": sys.executable, "args": ["-m", "tests.mcp_servers.tracker"],
                    "env": TRACKER["env"]},
        "here": here}}
    assert os.path.realpath(here["args"][4]) == mcp["runner_exe"]  # {python}, after the cd
    assert here["command"] == "/bin/sh" and here["env"] == {}
    assert here["args"][3] == str(fleet.workspace / "srv")
    # What the servers answered when the agent started them from the file: the tracker's
    # tools (as many as its saved snapshot lists), and the other one's working directory.
    assert mcp["servers"]["tracker"] == {"tools": SNAPSHOT_TOOLS}
    assert mcp["servers"]["here"] == {"output": str(fleet.workspace / "srv")}
    # The bridged server is a line of the CLI index, not in the file.
    [start] = fleet.events("start")
    assert ("- mcp-bridge wiki (MCP server wiki, skill mcp-bridge): `mcp-bridge wiki --help`"
            in start["prompt"])
    assert "mcp-bridge tracker" not in start["prompt"]
    # The agent.yaml the runner read carries the servers (rendered by fleetctl).
    agent_yaml = (fleet.root / "current" / "agents" / "a1" / "agent.yaml").read_text()
    assert '"via": "bridge"' in agent_yaml and '"cwd": "srv"' in agent_yaml


def test_the_runners_prefix_with_a_bridged_server_is_fleetctl_tokens_prefix(make_fleet):
    from fleetctl.tokens.audit import load_roles
    from fleetctl.roledecl import bridged_servers
    from fleetctl.tokencount.offline import load_o200k
    from fleetctl.tokencount.prefixmodule import load_prefix_module
    from tests.tokens.test_tokens_cli import tokens

    fleet = make_fleet("clean", skills=SKILLS, role={
        "agent_command": [str(FAKES / "clean"), "{mcp_config}"],
        "mcp_servers": {"tracker": TRACKER, "wiki": {"via": "bridge", **TRACKER},
                        "docs": {"via": "bridge", **TRACKER}}})
    fleet.drop("t1", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    [start] = fleet.events("start")
    blueprint, inventory = fleet.root.parent / "blueprint", fleet.root.parent / "inventory.yaml"
    # The text fleetctl tokens builds (its loader of the blueprint's builder, its roles).
    role = load_roles(blueprint)["tester"]
    builder = load_prefix_module(blueprint)
    built = builder.build_prefix(role.prompt, role.skills, blueprint / "skills",
                                 bridged_servers=bridged_servers(role.mcp_servers))
    assert start["prompt"].startswith(built.text + "\n\n")
    assert built.components["cli_index"].endswith(
        "- mcp-bridge docs (MCP server docs, skill mcp-bridge): `mcp-bridge docs --help`\n"
        "- mcp-bridge wiki (MCP server wiki, skill mcp-bridge): `mcp-bridge wiki --help`")
    # And fleetctl tokens' own report counts exactly the runner's sections.
    run = tokens("a1", "--format", "json", project=(inventory, blueprint))
    # The fake agent is no harness fleetctl can profile: its own part is not counted, so the
    # total is a lower bound (exit 2, issue 12); the runner's sections are counted all the same.
    assert run.code == 2 and run.agent("a1")["harness_missing"], run.stdout + run.stderr
    counted = {c["name"]: c["tokens"] for c in run.agent("a1")["components"]}
    enc, _ = load_o200k()
    sections = start["prompt"].split("\n\n")
    for name, text in zip(("role_prompt", "skills_index", "cli_index"), sections):
        assert counted[name] == len(enc.encode_ordinary(text)), name
    assert run.agent("a1")["bridged_servers"] == ["docs", "wiki"]  # the role file's order
    assert len(run.agent("a1")["tools"]) == 1 + len(SNAPSHOT_TOOLS)  # bash + tracker's
    # The ledger has fleetctl's render-time counts of the very same components.
    [turn] = fleet.ledger()
    assert turn["tokens_exact"] is True
    assert turn["prefix_tokens"]["cli_index"] == counted["cli_index"]


def test_via_mcp_servers_without_the_placeholder_stop_the_runner_at_startup(make_fleet):
    # fleetctl refuses such a role when the blueprint loads; the runner must refuse an
    # agent.yaml that says so all the same (hand-edited, or rendered by an older fleetctl).
    fleet = make_fleet("clean", config={"mcp_servers": {"tracker": {"via": "mcp", **TRACKER}}})
    fleet.drop("t1", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 2
    assert "agent_command has no {mcp_config}" in done.stderr
    assert "MCP server(s) tracker (via: mcp) would never reach the agent" in done.stderr
    assert '"--mcp-config", "{mcp_config}"' in done.stderr
    assert fleet.where("t1") == ["inbox"] and fleet.events() == []


@pytest.mark.parametrize("data, problem", [
    ({"skills": ["reply"], "mcp_servers": {"w": {"via": "bridge", "command": ["x"]}}},
     "mcp_servers: w are via: bridge but skills has no mcp-bridge"),
    ({"mcp_servers": {"w": {"via": "cli", "command": ["x"]}}},
     "mcp_servers.w.via: expected mcp or bridge"),
    ({"mcp_servers": {"w": {"command": []}}}, "mcp_servers.w.command: expected a non-empty"),
    ({"mcp_servers": {"w": {"command": ["x"], "env": {"K": 1}}}},
     "mcp_servers.w.env: expected an object of strings"),
])
def test_bad_mcp_servers_in_agent_yaml_are_config_errors(data, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        config_from_data({"agent": "a", "prompt": "p", **data})


def test_placeholder_without_servers_gets_an_empty_config_and_older_configs_still_load():
    config = config_from_data({"agent": "a", "prompt": "p", "agent_command": ["x", "{mcp_config}"]})
    assert config.mcp_servers == () and config.uses_mcp_config
    assert config.argv(mcp_config=Path("/s/f.json")) == ["x", "/s/f.json"]
    with pytest.raises(ConfigError, match="no MCP config file"):
        config.argv()
    from fleet_runner.mcpconfig import mcp_config_data

    assert mcp_config_data(config.direct_servers, Path("/w")) == {"mcpServers": {}}
