"""``fleetctl status`` from real runner records, and the report's prefix-tokens chart from the
same ledger.

The repository's runner is shipped by ``fleetctl ship`` with a scripted fake agent (the one of
``tests/tokens/test_tokens_live_runner.py``: it calls ``reply`` as often as the message asks). Three
messages run with ``--once``: two pass, the last asks for no reply, fails the anti-silence gate,
is retried once and escalated. What status must say is read here from the files the runner
wrote (``runs/<task>/result.json``, ``notify/*.json``, ``ledger.jsonl``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import yaml

from tests.helpers import cli, local_host, write_inventory
from tests.tokens.test_tokens_live_runner import _blueprint, _drop

AGENT = "a1"


def _run_runner(root: Path, log: Path) -> None:
    runner = [str(root / "current" / "runner" / "bin" / "fleet-runner"), "--agent", AGENT,
              "--root", str(root), "--once", "--poll-s", "0.1", "--kill-grace-s", "0.3",
              "--check-timeout-s", "20"]
    done = subprocess.run(runner, env={**os.environ, "FAKE_AGENT_LOG": str(log),
                                       "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


def _ship_tester(tmp_path: Path, role_keys: dict, why: str):
    """Ship the test role of tests/tokens/test_tokens_live_runner.py, with ``role_keys`` set in it
    (committed with message ``why``), to a local host; return ``(bp, root, inventory, ship)``."""
    bp = _blueprint(tmp_path)
    role = bp / "roles" / "tester.yaml"
    role.write_text(yaml.safe_dump({**yaml.safe_load(role.read_text()), **role_keys}))
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qam", why], check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x.invalid",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x.invalid"})
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inventory.yaml", {"h1": local_host(
        root, {AGENT: {"role": "tester", "vars": {"channel": "#support"}}})})
    shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    return bp, root, inv, shipped


def test_status_and_report_chart_from_real_runner_records(tmp_path):
    bp, root, inv, shipped = _ship_tester(tmp_path, {"max_retries": 1}, "retry once")
    release = shipped.host("h1")["release"]
    commit = shipped.doc["source"]["commit"]

    before = cli("status", "--json", inventory=inv, blueprint=bp)
    assert before.code == 0, before.stdout + before.stderr
    a = before.doc["hosts"][0]["agents"][0]
    assert (a["last_task"], a["turns"], a["escalations_waiting"]) == (None, 0, 0)

    state = root / "state" / AGENT
    for mid, n in (("m1", 1), ("m2", 2), ("m3", 0)):
        _drop(state, mid, f"Please reply {n} times.")
    _run_runner(root, tmp_path / "fake.log")

    # What the runner wrote, read here.
    result = json.loads((state / "runs" / "m3" / "result.json").read_text())
    assert result["outcome"] == "gave-up" and result["attempts"] == 2
    spool = sorted(p for p in (state / "notify").iterdir() if p.suffix == ".json")
    assert len(spool) == 1
    escalation = json.loads(spool[0].read_text())
    ledger = [json.loads(line) for line in (state / "ledger.jsonl").read_text().splitlines()]
    totals = [sum(r["prefix_tokens"].values()) for r in ledger]
    last_attempt = json.loads((state / "runs" / "m3" / "attempt-2.json").read_text())

    run = cli("status", "--json", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr  # an escalation waits for a person
    h = run.doc["hosts"][0]
    assert (h["host"], h["status"], h["release"], h["commit"]) == ("h1", "ok", release, commit)
    a = h["agents"][0]
    assert (a["agent"], a["role"], a["last_task"]) == (AGENT, "tester", "m3")
    assert (a["outcome"], a["attempts"], a["retries"]) == ("gave-up", 2, 1)
    assert a["verdict"] == last_attempt["verdict"] == "fail"
    assert a["failed_verifications"] == result["failed_verifications"]
    assert a["escalations_waiting"] == 1
    assert a["escalations"][0]["kind"] == escalation["kind"] == "gave-up"
    assert a["escalations"][0]["task"] == "m3"
    assert a["turns"] == len(ledger) == 4
    assert a["prefix_tokens_per_turn"] == {"median": statistics.median(totals),
                                           "last": totals[-1]}
    text = cli("status", inventory=inv, blueprint=bp)
    assert text.code == 1
    assert f"h1: release {release}, commit {commit[:12]}" in text.stdout
    assert "last task m3: gave-up (last attempt fail), 1 retry; 1 escalation(s) waiting" \
        in text.stdout

    # The pager delivered the escalation, a new message passed: nothing needs attention.
    spool[0].unlink()
    _drop(state, "m4", "Please reply 1 times.")
    _run_runner(root, tmp_path / "fake.log")
    calm = cli("status", "--json", inventory=inv, blueprint=bp)
    assert calm.code == 0, calm.stdout
    a = calm.doc["hosts"][0]["agents"][0]
    assert (a["last_task"], a["outcome"], a["retries"], a["escalations_waiting"]) == \
        ("m4", "pass", 0, 0)

    # The report's chart: one point per ledger turn, in time order, values from the file.
    ledger = [json.loads(line) for line in (state / "ledger.jsonl").read_text().splitlines()]
    rep = cli("report", "--format", "json", inventory=inv, blueprint=bp)
    # The fake agent command has no harness profile: `fleetctl tokens` calls its measurement
    # incomplete (exit 2), and the report's tokens check says the same, with the reason.
    audit = cli("tokens", "--format", "json", inventory=inv, blueprint=bp)
    (tokens_check,) = [c for c in rep.doc["checks"] if c["check"] == "tokens"]
    assert (tokens_check["status"] == "error") == (audit.code == 2), tokens_check
    if audit.code == 2:
        assert rep.code == 2 and "harness" in tokens_check["error"], tokens_check
    else:
        assert rep.code in (0, 1), rep.stdout + rep.stderr
    series = rep.doc["agents"]
    assert [(s["host"], s["agent"], s["status"], s["turns"]) for s in series] == [
        ("h1", AGENT, "ok", len(ledger))]
    assert series[0]["points"] == sorted([r["time"], sum(r["prefix_tokens"].values())]
                                         for r in ledger)
    html = tmp_path / "r.html"
    cli("report", "--html", str(html), "--format", "json", inventory=inv, blueprint=bp)
    page = html.read_text()
    assert page.count("<polyline") == 1
    points = page.split('points="')[1].split('"')[0].split()
    assert len(points) == len(ledger)


def test_status_unreachable_host_is_exit_2(tmp_path):
    inv = write_inventory(tmp_path / "inventory.yaml", {
        "down": {"transport": "ssh", "address": "127.0.0.1", "port": 1, "user": "root",
                 "root": "/srv/fleet", "agents": {}},
        "up": local_host(tmp_path / "up", {})})
    (tmp_path / "blueprint" / "roles").mkdir(parents=True)
    (tmp_path / "blueprint" / "roles" / "worker.yaml").write_text("prompt: work\n")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "agent.yaml.j2").write_text("agent: x\n")
    run = cli("status", "--json", "--timeout", "10", inventory=inv,
              blueprint=tmp_path / "blueprint")
    assert run.code == 2, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.doc["hosts"]}
    assert hosts["down"]["status"] == "error" and hosts["down"]["error"]
    assert hosts["up"]["status"] == "ok" and hosts["up"]["release"] is None


def test_status_events_parsed_as_recorded():
    """The status op's events, recorded in tests/data/status/events.json, and what they mean."""
    from fleetctl.status import AgentStatus, FleetStatus, HostStatus, apply_events

    case = json.loads((Path(__file__).parents[1] / "data" / "status" / "events.json").read_text())
    host = HostStatus("alpha", agents=[AgentStatus("alpha", a, "r") for a in case["agents"]])
    apply_events(host, case["events"])
    want = case["expected"]
    assert {k: getattr(host, k) for k in want["host"]} == want["host"]
    for a in host.agents:
        got = a.to_json()
        assert {k: got[k] for k in want["agents"][a.agent]} == want["agents"][a.agent], a.agent
    assert FleetStatus([host]).exit_code == want["exit_code"]


def test_status_over_ssh(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """The status op over a real sshd box: the release and commit the ship recorded; an agent
    that has not run yet has no task, no escalation, no turns."""
    from tests.helpers import make_project, ssh_host

    bp = make_project(tmp_path, {"runner": {"x.txt": "x\n"}})
    root = tmp_path / "box-root"
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
        sshd_pool[2], ssh_client_key, ssh_known_hosts, root, agents={"w1": {"role": "worker"}})})
    shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    run = cli("status", "--json", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    (h,) = run.doc["hosts"]
    assert (h["host"], h["status"], h["release"], h["commit"]) == (
        "web1", "ok", shipped.host("web1")["release"], shipped.doc["source"]["commit"])
    (a,) = h["agents"]
    assert (a["agent"], a["last_task"], a["escalations_waiting"], a["turns"]) == (
        "w1", None, 0, 0)


DENYING_AGENT = '''#!{python}
"""A fake agent whose CLI result reports a refused tool call (Claude Code's JSON result)."""
import json, sys
sys.stdin.read()
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False,
                  "result": "I could not run the command.", "session_id": "s-1",
                  "permission_denials": [{{"tool_name": "Bash", "tool_use_id": "t1",
                                          "tool_input": {{"command": "rm -rf build"}}}}],
                  "usage": {{"input_tokens": 10, "output_tokens": 2}}}}))
'''


def test_status_shows_standing_denials_and_the_command_that_clears_them(tmp_path):
    """A real runner stops a task on a refused permission and keeps it as a standing denial;
    status names it (permission, since, task) with the command that clears it, and running
    that very command clears it."""
    import shlex
    import sys

    fake = tmp_path / "denying-agent"
    fake.write_text(DENYING_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    bp, root, inv, _ = _ship_tester(tmp_path, {"agent_command": [str(fake)]}, "a denying agent")
    state = root / "state" / AGENT
    _drop(state, "d1", "Clean the build.")
    _drop(state, "d2", "Then this.")
    _run_runner(root, tmp_path / "fake.log")

    # What the runner wrote, read here: one standing denial, d2 still waiting in the inbox.
    [held] = [json.loads(p.read_text()) for p in (state / "standing-denials").iterdir()]
    assert held["permission"] == "tool:Bash" and held["task"] == "d1"
    assert [p.name.endswith("-d2.json") for p in (state / "inbox").iterdir()] == [True]
    runner = root / "current" / "runner" / "bin" / "fleet-runner"
    expected_clear = (f"{runner} --agent {AGENT} --root {root} --clear-denial tool:Bash")

    run = cli("status", "--json", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr  # a person must clear it
    (a,) = run.doc["hosts"][0]["agents"]
    assert a["attention"] is True
    assert a["standing_denials"] == [{
        "permission": "tool:Bash", "since": held["time"], "task": "d1", "run": held["run"],
        "what": held["what"], "clear": expected_clear}]
    text = cli("status", inventory=inv, blueprint=bp)
    assert text.code == 1
    assert (f"    standing denial tool:Bash since {held['time']} (task d1): no new task starts; "
            f"clear it with: {expected_clear}") in text.stdout.splitlines()

    # The command status shows is the one that works.
    cleared = subprocess.run(shlex.split(a["standing_denials"][0]["clear"]),
                             capture_output=True, text=True, timeout=60)
    assert cleared.returncode == 0, cleared.stderr
    assert list((state / "standing-denials").iterdir()) == []
    after = cli("status", "--json", inventory=inv, blueprint=bp)
    (a,) = after.doc["hosts"][0]["agents"]
    assert a["standing_denials"] == []
