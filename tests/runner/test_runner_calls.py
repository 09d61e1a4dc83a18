"""Calls per turn in the ledger: shims first on the agent's PATH count the CLIs of its CLI index
and the MCP tools it calls through mcp-bridge, with no cooperation from the CLIs (a real
mcp-bridge talking to the real test tracker MCP server)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.runner.test_runner import REPO, make_fleet  # noqa: F401  (a fixture)

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.calls import count_calls, write_shims  # noqa: E402


def _bridge_config(tmp_path: Path) -> Path:
    config = tmp_path / "mcp-bridge.json"
    config.write_text(json.dumps({"servers": {"tracker": {
        "command": [sys.executable, "-m", "tests.mcp_servers.tracker"],
        "env": {"PYTHONPATH": str(REPO)}}}}))
    return config


def test_the_ledger_counts_cli_and_mcp_tool_calls_per_turn(make_fleet, tmp_path):
    fleet = make_fleet("caller", skills=("reply", "notify", "mcp-bridge"),
                       env={"MCP_BRIDGE_CONFIG": str(_bridge_config(tmp_path))})
    fleet.drop("m1", text="Who am I in the tracker?")
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("m1") == ["done"]
    # The shims passed everything through: arguments, output, exit status.
    bridge = [c for c in fleet.events("cli") if c["argv"][0] == "mcp-bridge"]
    assert [c["status"] for c in fleet.events("cli")] == [0, 0, 0]
    assert json.loads(bridge[0]["stdout"])  # the tool's result, from the real server
    assert sorted(m["text"] for m in fleet.outbox()) == ["Found it: you are the viewer.",
                                                         "Looking it up."]
    [turn] = fleet.ledger()
    assert turn["calls"] == {"mcp-bridge": 1, "reply": 2}
    assert turn["tool_calls"] == {"tracker/get_viewer": 1}
    # The agent's PATH starts with the run's shims; they are gone once the turn is over.
    [start] = fleet.events("start")
    first = start["env"]["PATH"].split(os.pathsep)[0]
    assert first == str(fleet.state / "runs" / "m1" / "attempt-1.shims")
    assert not Path(first).exists()
    assert (fleet.state / "runs" / "m1" / "attempt-1.calls").read_text().count("\n") == 3


def test_a_turn_without_calls_records_empty_counts_and_the_docs_name_the_fields(make_fleet):
    fleet = make_fleet("clean")
    fleet.drop("m2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    [turn] = fleet.ledger()
    assert turn["calls"] == {} and turn["tool_calls"] == {}
    doc = (REPO / "docs" / "runner.md").read_text()
    ledger = doc[doc.index("**Ledger**"):doc.index("**Run record**")]
    assert '"calls"' in ledger and '"tool_calls"' in ledger and "older runners" in ledger


def test_shims_follow_the_path_rules_and_the_bridge_grammar(tmp_path):
    import subprocess
    skills = tmp_path / "skills"
    for skill, clis in (("one", {"tool": 0o755, "quiet": 0o644}), ("two", {"tool": 0o755}),
                        ("mcp-bridge", {"mcp-bridge": 0o755})):
        (skills / skill / "bin").mkdir(parents=True)
        for name, mode in clis.items():
            path = skills / skill / "bin" / name
            path.write_text(f"#!/bin/sh\necho {skill}/{name} \"$#\"\n")
            os.chmod(path, mode)
    shimmed = write_shims(tmp_path / "shims", tmp_path / "calls", ["one", "two", "mcp-bridge"],
                          skills)
    # The first skill's CLI of a name wins; a file that is not executable is not on the PATH.
    assert shimmed == {"tool": str(skills / "one" / "bin" / "tool"),
                       "mcp-bridge": str(skills / "mcp-bridge" / "bin" / "mcp-bridge")}
    env = {**os.environ, "PATH": f"{tmp_path / 'shims'}{os.pathsep}{os.environ['PATH']}"}
    for argv in (["tool", "a b", "c"], ["mcp-bridge", "--config", "f.json", "srv", "t1", "--x"],
                 ["mcp-bridge", "--config=f.json", "srv", "--tool", "t2"],
                 ["mcp-bridge", "srv", "--help"], ["mcp-bridge", "--help"],
                 ["mcp-bridge", "srv", "bad\ttool"]):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        assert out.split()[1] == str(len(argv) - 1)  # every argument reached the real CLI
    assert count_calls(tmp_path / "calls") == (
        {"mcp-bridge": 5, "tool": 1}, {"srv/?": 1, "srv/t1": 1, "srv/t2": 1})
    assert count_calls(tmp_path / "missing") == ({}, {})
