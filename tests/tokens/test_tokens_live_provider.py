"""The provider's own numbers in the live ledger: a real runner, shipped by ``fleetctl ship``,
runs a fake agent that prints a Claude Code-like JSON result (input, cache-creation, cache-read
and output tokens); the ledger records ``provider_usage`` beside the runner's count, and
``fleetctl tokens --live`` shows both with the harness's profile and the difference, each figure
checked against what this test computes from the ledger file and the profile file."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import yaml

from tests.helpers import cli, git, local_host, write_inventory
from tests.mcp_servers.project import REPO
from tests.tokens.test_tokens_cli import tokens
from tests.tokens.test_tokens_live_runner import AGENT, _blueprint, _drop

CLAUDE_LIKE = '''#!{python}
"""Prints what `claude -p --output-format json` prints last: a result with the run's usage."""
import json, sys
prompt = sys.stdin.read()
n = len(prompt)
print(json.dumps({{"type": "result", "num_turns": 1, "result": "done", "usage": {{
    "input_tokens": 3, "cache_creation_input_tokens": 2000 + n, "cache_read_input_tokens": 500,
    "output_tokens": 9}}}}))
'''


def test_provider_usage_beside_fleetctls_count(tmp_path):
    bp = _blueprint(tmp_path)
    agent_dir = tmp_path / "agentbin"
    agent_dir.mkdir()
    fake = agent_dir / "claude"  # the harness is told by the command's name: claude-code
    fake.write_text(CLAUDE_LIKE.format(python=sys.executable))
    fake.chmod(0o755)
    role = yaml.safe_load((bp / "roles" / "tester.yaml").read_text())
    role["agent_command"] = [str(fake), "-p", "--output-format", "json"]
    (bp / "roles" / "tester.yaml").write_text(yaml.safe_dump(role))
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inventory.yaml", {"h1": local_host(
        root, {AGENT: {"role": "tester", "vars": {"channel": "#support"}}})})
    # The harness profile, from the scripted harness (tests/harnesses/claude).
    probed = tokens("--probe", "--harness-bin", str(REPO / "tests" / "harnesses" / "claude"),
                    project=(inv, bp))
    assert probed.code == 0, probed.stderr
    profile = json.loads((bp / "harnesses" / "claude-code-9.9.9-default.json").read_text())

    git(tmp_path, "add", "-A")  # a ship renders what git has committed (docs/provenance.md)
    git(tmp_path, "commit", "-q", "-m", "agent command and harness profile")
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    state = root / "state" / AGENT
    for mid in ("m1", "m2"):
        _drop(state, mid, f"Please answer {mid}.")
    runner = [str(root / "current" / "runner" / "bin" / "fleet-runner"), "--agent", AGENT,
              "--root", str(root), "--once", "--poll-s", "0.1", "--kill-grace-s", "0.3",
              "--check-timeout-s", "20"]
    subprocess.run(runner, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                   capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    records = [json.loads(line) for line in (state / "ledger.jsonl").read_text().splitlines()]
    assert records
    for r in records:
        u = r["usage"]
        assert r["provider_usage"]["prompt_tokens"] == (
            u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"])
        assert r["provider_usage"]["output_tokens"] == 9

    got = tokens("--live", "--format", "json", project=(inv, bp))
    assert got.code == 0, got.stderr
    p = got.agent(AGENT)["provider"]
    provider = statistics.median(r["provider_usage"]["prompt_tokens"] for r in records)
    # No tools of its own but the harness's: the runner's shell tool is not sent; the
    # provider adds its tool-use prompt (346 for Claude 4.x, docs/tokens.md) for them.
    ours = round(statistics.median(sum(r["prefix_tokens"].values()) for r in records)
                 + profile["total_tokens"] + 346
                 + statistics.median(r["task_prompt_tokens"] for r in records))
    assert p["turns"] == len(records) and p["prompt_tokens_median"] == provider
    assert p["fleetctl_tokens_per_call"] == ours
    assert p["difference_tokens"] == round(provider - ours)
    text = tokens("--live", project=(inv, bp)).stdout
    assert f"fleetctl per model call: {ours:,}" in text
    assert "difference " in text
