"""``fleetctl tokens --live`` end to end: a real runner writes the ledger, ``--live`` reads it.

A blueprint with the repository's runner, ``reply`` and ``notify`` skills and a role whose
agent command is a scripted fake agent (written here: it calls ``reply`` as many times as the
message asks and prints a usage line) is shipped by ``fleetctl ship`` to a local host. Messages
go into the inbox the documented way, ``<root>/current/runner/bin/fleet-runner --once`` runs
them, and ``fleetctl tokens --live`` must give back what this test computes from the ledger file
itself. No model is called.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.helpers import cli, commit_project, local_host, write_inventory
from tests.mcp_servers.project import REPO
from tests.tokens.test_tokens_cli import tokens

AGENT = "a1"
FAKE = '''#!{python}
"""A fake agent: reads its prompt, calls `reply` N times (N: the digit in the task text),
logs each call to $FAKE_AGENT_LOG, prints a usage line."""
import json, os, re, subprocess, sys
prompt = sys.stdin.read()
n = int(re.search(r"reply (\\d) times", prompt).group(1))
for i in range(n):
    done = subprocess.run(["reply", f"answer {{i}}"], capture_output=True, text=True)
    with open(os.environ["FAKE_AGENT_LOG"], "a") as fh:
        fh.write(json.dumps({{"task": os.environ["FLEET_TASK_ID"], "cli": "reply",
                             "status": done.returncode, "stderr": done.stderr}}) + "\\n")
print(json.dumps({{"usage": {{"input_tokens": 1000 + 10 * n, "output_tokens": 7 * n}}}}))
'''


def _blueprint(base: Path) -> Path:
    bp = base / "blueprint"
    shutil.copytree(REPO / "blueprint" / "runner", bp / "runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for skill in ("reply", "notify"):
        shutil.copytree(REPO / "blueprint" / "skills" / skill, bp / "skills" / skill,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if (REPO / "blueprint" / "credentials").is_dir():  # what the skills' capabilities name
        shutil.copytree(REPO / "blueprint" / "credentials", bp / "credentials")
    shutil.copytree(REPO / "templates", base / "templates")
    fake = base / "fake-agent"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    (bp / "roles").mkdir()
    (bp / "roles" / "tester.yaml").write_text(yaml.safe_dump({
        "prompt": "You answer questions with the reply CLI.", "skills": ["reply", "notify"],
        "max_retries": 0, "agent_command": [str(fake)], "timeout_s": 30}))
    (bp / "attributes.yaml").write_text(yaml.safe_dump({"files": [
        {"match": "skills/*/bin/*", "mode": "0755"}, {"match": "runner/bin/*", "mode": "0755"}]}))
    commit_project(base)
    return bp


def _drop(state: Path, mid: str, text: str) -> None:
    """A person's message, dropped as a bridge would: a dot-file, then a rename to *.json."""
    inbox = state / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{mid}.tmp"
    tmp.write_text(json.dumps({"id": mid, "from": {"kind": "human", "name": "alice"},
                               "channel": "#support", "text": text, "reply_to": None}))
    os.rename(tmp, inbox / f"{time.time_ns()}-{mid}.json")


def _expected(records: list[dict]) -> dict:
    """What --live must say, computed here from the ledger's own lines."""
    prefixes = sorted(sum(r["prefix_tokens"].values()) for r in records)
    rank = math.ceil(0.95 * len(prefixes)) - 1
    inputs = [r["usage"]["input_tokens"] for r in records]
    outputs = [r["usage"]["output_tokens"] for r in records]
    return {"turns": len(records), "tasks": len({r["task"] for r in records}),
            "first": min(r["time"] for r in records), "last": max(r["time"] for r in records),
            "prefix_tokens": {"median": statistics.median(prefixes), "p95": prefixes[rank],
                              "max": prefixes[-1], "sum": sum(prefixes),
                              "components_median": {
                                  k: statistics.median(r["prefix_tokens"][k] for r in records)
                                  for k in records[0]["prefix_tokens"]}},
            "task_prompt_tokens_median": statistics.median(r["task_prompt_tokens"]
                                                           for r in records),
            "usage": {"turns_with_usage": len(records),
                      "per_turn_mean": {"input_tokens": round(sum(inputs) / len(inputs), 1),
                                        "output_tokens": round(sum(outputs) / len(outputs), 1)},
                      "totals": {"input_tokens": sum(inputs), "output_tokens": sum(outputs)}}}


def test_the_runners_own_ledger_read_back(tmp_path):
    """Three messages (1, 2 and 0 replies asked; the last fails the anti-silence gate) run by
    the shipped runner; --live's turns, prefix statistics, usage and (when the runner records
    them) calls and dead weight equal what the ledger file says; a line then half-appended is
    partial and changes nothing else."""
    bp = _blueprint(tmp_path)
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inventory.yaml", {"h1": local_host(
        root, {AGENT: {"role": "tester", "vars": {"channel": "#support"}}})})
    shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    state = root / "state" / AGENT
    asked = {"m1": 1, "m2": 2, "m3": 0}
    for mid, n in asked.items():
        _drop(state, mid, f"Please reply {n} times.")
    log = tmp_path / "fake-agent.log"
    runner = [str(root / "current" / "runner" / "bin" / "fleet-runner"), "--agent", AGENT,
              "--root", str(root), "--once", "--poll-s", "0.1", "--kill-grace-s", "0.3",
              "--check-timeout-s", "20"]
    done = subprocess.run(runner, env={**os.environ, "FAKE_AGENT_LOG": str(log),
                                       "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    calls_made = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["status"] for c in calls_made] == [0, 0, 0], calls_made

    ledger = state / "ledger.jsonl"
    raw = ledger.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.decode().splitlines()]
    assert sorted(r["task"] for r in records) == ["m1", "m2", "m3"]

    run = tokens("--live", "--format", "json", project=(inv, bp))
    assert run.code == 0, run.stdout + run.stderr
    a = run.agent(AGENT)
    assert a["status"] == "ok" and a["path"] == str(ledger)
    assert (a["lines"], a["partial"], a["malformed"]["count"]) == (3, 0, 0)
    expected = _expected(records)
    assert {k: a[k] for k in expected} == expected
    assert a["token_counters"][0]["name"] == records[0]["token_counter"] == "o200k_base"
    assert a["token_counters"][0]["exact"] is True
    c = a["calls"]
    assert c["declared_clis"] == ["notify", "reply"]
    recorded = [r for r in records if isinstance(r.get("calls"), dict)]
    if recorded:  # a runner that records each turn's CLI calls
        summed: dict[str, int] = {}
        for r in recorded:
            for name, count in r["calls"].items():
                if count:
                    summed[name] = summed.get(name, 0) + count
        assert c["recorded_turns"]["calls"] == len(recorded)
        assert c["called"]["clis"] == dict(sorted(summed.items()))
        assert summed.get("reply") == sum(asked.values()) == len(calls_made)
        assert [d["name"] for d in c["dead_weight"]["clis"]] == [
            n for n in ("notify", "reply") if n not in summed]
    else:  # not yet: the ledger has no calls, and --live must not guess
        assert c["called"] is None and c["note"].startswith("not recorded")
        assert c["dead_weight"]["clis"] is None

    # The runner appending its next line, caught half-way.
    with open(ledger, "ab") as fh:
        fh.write(raw.splitlines(keepends=True)[0][:40])
    again = tokens("--live", "--format", "json", project=(inv, bp)).agent(AGENT)
    assert (again["lines"], again["partial"], again["malformed"]["count"]) == (3, 1, 0)
    assert again["prefix_tokens"] == a["prefix_tokens"] and again["turns"] == 3
