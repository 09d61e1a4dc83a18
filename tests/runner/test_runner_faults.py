"""Faults a new user met, run for real (a rendered release, the runner as a separate process,
a real Linux user where permissions matter): an inbox entry the agent's user cannot move, a
config no task could run with, another agent's config, an escalation that got nowhere, and
attempts cut short by a runner that died or was asked to stop."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess

import pytest

from tests.helpers import WAIT_S, wait_until
from tests.runner.test_runner import AGENT, make_fleet  # noqa: F401  (a fixture)
from tests.runner.test_runner_clis import _as_user, _owned_dir, needs_root, open_base  # noqa: F401


def _result(fleet, task: str) -> dict:
    return json.loads((fleet.state / "runs" / task / "result.json").read_text())


# -- an inbox entry that cannot be moved -----------------------------------------------------


@needs_root
def test_an_inbox_entry_the_agent_user_cannot_move_is_left_and_logged_not_fatal(
        real_users, open_base, make_fleet):
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("clean", base=open_base)
    inbox = fleet.state / "inbox"
    inbox.mkdir(parents=True)
    # root's directory: moving a directory to another parent rewrites its "..", which needs
    # write permission on it, so the agent's user gets EACCES from rename(2).
    stuck = inbox / "adir.json"
    stuck.mkdir(mode=0o755)
    fleet.drop("ok", kind="agent", channel=None)  # behind it (newer): must not be held up
    for path in (fleet.state, fleet.workspace):
        _owned_dir(path, user)
    for path in fleet.state.rglob("*"):
        if path != stuck:
            os.chown(path, user.pw_uid, user.pw_gid)
    fleet.log.touch()
    os.chown(fleet.log, user.pw_uid, user.pw_gid)
    for _ in range(2):  # it crashed on every restart
        done = _as_user(user, fleet.argv("--once"), {"FAKE_AGENT_LOG": str(fleet.log)})
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        # Logged once per run although each run scans the inbox twice (before and after "ok").
        lines = [ln for ln in done.stderr.splitlines() if "adir.json" in ln]
        assert len(lines) == 1, done.stderr
        assert "cannot move this message into processing/" in lines[0]
        assert "Permission denied" in lines[0]
    assert fleet.where("ok") == ["done"]
    assert stuck.is_dir() and stuck.stat().st_uid == 0  # left where it was
    assert fleet.notices() == []  # not escalated: it may be movable later
    assert [s["task"] for s in fleet.events("start")] == ["ok"]


# -- a config no task could run with ---------------------------------------------------------


@pytest.mark.parametrize("change, problem", [
    ({"agent_command": None}, "agent_command is not set"),
    ({"agent_command": ["x", "--model", "{model}"], "model": None},
     "agent_command uses {model} but model is null"),
    ("no-skill", "skills: vault not in the release"),
])
def test_a_config_no_task_could_run_with_stops_the_runner_before_any_message(
        make_fleet, change, problem):
    fleet = make_fleet("clean", skills=("reply", "notify", "vault"),
                       config=change if isinstance(change, dict) else None)
    if change == "no-skill":
        shutil.rmtree(fleet.root / "current" / "skills" / "vault")
    empty = fleet.run()  # --once with nothing in the inbox: still a broken config
    assert empty.returncode == 2 and problem in empty.stderr, empty.stderr
    fleet.drop("c1", kind="agent", channel=None)
    runner = fleet.start()  # a serving runner: it must not wait for a message to say so
    try:
        assert runner.wait(timeout=WAIT_S) == 2
    finally:
        if runner.poll() is None:
            runner.kill()
    assert problem in runner.stderr.read()
    assert fleet.where("c1") == ["inbox"]  # not claimed: nothing waits in processing/
    assert fleet.events() == [] and fleet.ledger() == []


def test_another_agent_s_config_is_refused(make_fleet):
    fleet = make_fleet("clean")
    config = fleet.root / "current" / "agents" / AGENT / "agent.yaml"
    line = next(n for n, text in enumerate(config.read_text().splitlines(), 1)
                if text.startswith("agent:"))
    inbox = fleet.root / "state" / "concierge" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "m1.json").write_text(json.dumps(
        {"id": "m1", "from": {"kind": "agent", "name": "p"}, "text": "hi"}))
    argv = [str(fleet.root / "current" / "runner" / "bin" / "fleet-runner"), "--agent",
            "concierge", "--root", str(fleet.root), "--config", str(config), "--once"]
    done = subprocess.run(argv, env=fleet.env(), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert f"agent.yaml:{line}: agent: this is the config of agent 'a1', not of 'concierge'" \
        in done.stderr
    assert (inbox / "m1.json").exists() and fleet.events() == []
    assert not (fleet.root / "state" / "concierge" / "ledger.jsonl").exists()


# -- an escalation that got nowhere ----------------------------------------------------------


def test_an_undelivered_escalation_is_logged_as_not_delivered(make_fleet):
    fleet = make_fleet("waits")  # never replies: anti-silence fails, max_retries 0: gives up
    fleet.drop("e1")
    runner = subprocess.Popen(fleet.argv("--once"), env=fleet.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fleet.wait_for("start")
        # The spool becomes a plain file: the notify CLI and the runner's own fallback fail.
        spool = fleet.state / "notify"
        spool.rmdir()
        spool.write_text("not a directory\n")
        (fleet.log.parent / (fleet.log.name + ".go")).touch()
        _, stderr = runner.communicate(timeout=WAIT_S)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, stderr
    assert "ESCALATION NOT DELIVERED for task e1" in stderr
    [line] = [ln for ln in stderr.splitlines() if "task e1: gave-up" in ln]
    assert "escalation NOT delivered" in line and "via None" not in line, line
    assert "escalated" not in line
    assert _result(fleet, "e1")["escalation"]["via"] is None
    assert fleet.where("e1") == ["failed"]


# -- attempts cut short ----------------------------------------------------------------------


def test_interrupted_attempts_are_not_failed_verifications_and_say_how_they_ended(make_fleet):
    fleet = make_fleet("waits", max_retries=1)  # two attempts
    fleet.drop("i1", kind="agent", channel=None)
    runner = fleet.start()
    wait_until(lambda: len(fleet.events("start")) == 1)
    runner.send_signal(signal.SIGTERM)  # attempt 1: a stop request, recorded by this runner
    assert runner.wait(timeout=WAIT_S) == 0
    runner = fleet.start()
    wait_until(lambda: len(fleet.events("start")) == 2)
    runner.kill()  # attempt 2: the runner dies; the next start finds it
    runner.wait(timeout=WAIT_S)
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert len(fleet.events("start")) == 2  # the budget was spent: no third attempt
    stopped, died = fleet.record("i1", 1), fleet.record("i1", 2)
    assert stopped["verdict"] == died["verdict"] == "interrupted"
    assert stopped["note"].startswith("interrupted by a runner stop;")
    assert died["note"].startswith("interrupted: the runner died during this attempt;")
    assert "attempt 2: interrupted: the runner died during this attempt" in done.stderr
    assert "runner stop" not in done.stderr
    [turn2] = [t for t in fleet.ledger() if t["attempt"] == 2]
    assert turn2["outcome"] == "interrupted: the runner died during this attempt"
    result = _result(fleet, "i1")
    assert result["outcome"] == "gave-up" and result["attempts"] == 2
    assert result["failed_verifications"] == 0 and result["interrupted_attempts"] == 2
    assert "gave up after 0 failed verification(s) and 2 interrupted attempt(s) in 2 " \
        "attempt(s)" in result["reason"]
    assert "Last failure (attempt 2): interrupted: the runner died during this attempt" \
        in result["reason"]
    [notice] = fleet.notices()
    assert notice["failures"] == 0 and notice["reason"] == result["reason"]
