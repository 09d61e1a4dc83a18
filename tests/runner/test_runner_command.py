"""A person in command (issue 20), with real runners: the person's action that clears a thread
(``fleet-runner --clear-command``), and, with two real users, an agent that cannot clear it
(it may neither delete the flag nor run the person's action). fleet_runner/team.py's decisions
are tested in test_runner_team.py."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time

from tests.helpers import wait_until
from tests.runner.test_runner import REPO, make_fleet  # noqa: F401  (make_fleet: a fixture)
from tests.runner.test_runner_clis import _as_user, needs_root, open_base  # noqa: F401
from tests.runner.test_runner_users import _two_users

sys.path.insert(0, str(REPO / "blueprint" / "runner"))
from fleet_runner import team  # noqa: E402


def _agent_message(fleet, mid: str, thread: str) -> str:
    """An agent's message of ``thread`` dropped into the inbox (a later mtime each)."""
    inbox = fleet.state / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{mid}.json"
    tmp = inbox / f".{mid}"
    tmp.write_text(json.dumps({"id": mid, "thread": thread, "from": {"kind": "agent",
                                                                     "name": "planner"},
                               "text": f"step {mid}"}))
    os.rename(tmp, inbox / name)
    return name


def _commanded(fleet, thread: str, mids: list[str]) -> team.TeamFiles:
    """What a runner leaves when a person took command of ``thread`` with ``mids`` paused."""
    files = team.TeamFiles(fleet.state, fleet.state / "inbox")
    files.set_flag(team.Flag(thread=thread, set=time.time(), by_message="p1", person="alice",
                             channel="#support"))
    for mid in mids:
        files.pause(fleet.state / "inbox" / _agent_message(fleet, mid, thread), thread)
    return files


def _cli(fleet, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(fleet.argv(*args), env=fleet.env(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_the_persons_clear_resumes_the_paused_hand_offs_in_their_order(make_fleet):
    fleet = make_fleet("clean")
    fleet.state.mkdir(parents=True)
    _commanded(fleet, "t1", ["a1", "a2", "a3"])
    later = _agent_message(fleet, "a4", "t1")  # arrived after the last scan: behind them
    listed = json.loads(_cli(fleet, "--list-commands").stdout)
    assert [(c["thread"], c["person"], len(c["paused"])) for c in listed] == [("t1", "alice", 3)]
    done = _cli(fleet, "--clear-command", "t1")
    assert done.returncode == 0, done.stderr
    assert "3 paused hand-off(s) back in the inbox in their order" in done.stderr
    assert not (fleet.state / "team" / "command" / "t1.json").exists()
    assert not (fleet.state / "team" / "paused" / "t1").exists()
    assert later in os.listdir(fleet.state / "inbox")
    ran = fleet.run()
    assert ran.returncode == 0, ran.stderr
    assert [e["task"] for e in fleet.events("start")] == ["a1", "a2", "a3", "a4"]
    journal = [json.loads(ln)["event"] for ln in
               (fleet.state / "team" / "command.jsonl").read_text().splitlines()]
    assert journal == ["set", "cleared"]


def test_clearing_a_thread_no_person_commands_names_those_that_are(make_fleet):
    fleet = make_fleet("clean")
    fleet.state.mkdir(parents=True)
    _commanded(fleet, "slack:C1:1.2", ["a1"])
    done = _cli(fleet, "--clear-command", "t9")
    assert done.returncode == 2
    assert "thread t9: no person is in command of it" in done.stderr
    assert "(in command: slack:C1:1.2)" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(json.loads(_cli(fleet, "--list-commands").stdout)[0]["paused"]) == 1


@needs_root
def test_an_agent_cannot_clear_a_persons_command(real_users, open_base, make_fleet):
    """Two users: the agent, running as its own user, tries to delete the flag (EACCES), and
    the person's action run as that user fails too (exit 2, said plainly); the flag and the
    paused hand-offs stay, and the person (the runner's user) then clears it."""
    user = pwd.getpwnam(real_users.create("agent"))
    script = open_base / "script.json"
    fleet = make_fleet("scripted", base=open_base, env={"FAKE_SCRIPT": str(script)})
    _two_users(fleet, user)
    fleet.runner_args = ("--agent-user", user.pw_name)
    flag = fleet.state / "team" / "command" / "t1.json"
    script.write_text(json.dumps({"attempts": [[{"remove": str(flag)}]]}))
    fleet.state.mkdir(parents=True)
    _commanded(fleet, "t1", ["a1", "a2"])
    _agent_message(fleet, "x1", "other")  # another thread: it runs
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    [start] = fleet.events("start")
    assert (start["task"], start["uid"]) == ("x1", user.pw_uid)
    assert fleet.events("step") == [{**fleet.events("step")[0], "step": {"remove": str(flag)}}]
    assert fleet.where("x1") == ["failed"]  # the agent's remove raised: its run failed
    assert flag.exists()
    # The person's action, run by the agent's user: refused by the files' owner, said plainly.
    env = {"FLEET_ROOT": str(fleet.root)}
    denied = _as_user(user, [str(fleet.root / "current" / "runner" / "bin" / "fleet-runner"),
                             "--agent", "a1", "--root", str(fleet.root), "--clear-command",
                             "t1"], env)
    assert denied.returncode == 2, denied.stderr
    assert "Permission denied" in denied.stderr and "Traceback" not in denied.stderr
    assert flag.exists()
    assert len(os.listdir(fleet.state / "team" / "paused" / "t1")) == 2
    cleared = _cli(fleet, "--clear-command", "t1")  # the person, as the runner's user
    assert cleared.returncode == 0, cleared.stderr
    assert not flag.exists()


def _person(fleet, mid: str, thread: str, text: str = "Stop, I will take it from here.") -> None:
    inbox = fleet.state / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{mid}"
    tmp.write_text(json.dumps({"id": mid, "thread": thread, "channel": "#support",
                               "from": {"kind": "human", "name": "alice"}, "text": text}))
    os.rename(tmp, inbox / f"{time.time_ns()}-{mid}.json")


def _in_command_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "is in command of thread" in ln]


def test_a_person_speaking_into_a_thread_takes_command_before_anything_runs(make_fleet):
    """An agent's item of thread m1 waits, an older message of another thread too; the person
    speaks into m1. The flag is set first, m1's item paused, the person's message runs first,
    the other thread next; one line says so (logged and posted), and a second run of the
    runner, with more of m1 arriving, says nothing again and pauses it behind. The person's
    clear resumes them in their order."""
    fleet = make_fleet("replier")
    _agent_message(fleet, "x1", "other")
    _agent_message(fleet, "a1", "m1")
    _person(fleet, "m2", "m1")
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert [e["task"] for e in fleet.events("start")] == ["m2", "x1"]
    [line] = _in_command_lines(done.stderr)
    assert "alice is in command of thread m1 (message m2)" in line
    assert "--clear-command m1" in line  # the person's action, ready to paste
    posted = [m for m in fleet.outbox() if "is in command" in m["text"]]
    assert [(m["channel"], m["task"]) for m in posted] == [("#support", "m2")]
    flag = json.loads((fleet.state / "team" / "command" / "m1.json").read_text())
    assert (flag["by_message"], flag["person"], flag["channel"]) == ("m2", "alice", "#support")
    paused = fleet.state / "team" / "paused" / "m1"
    assert [n.split("-", 1)[0] for n in sorted(os.listdir(paused))] == ["000001"]
    # More of the thread arrives, the runner starts again: paused behind, no second line.
    _agent_message(fleet, "a3", "m1")
    again = fleet.run()
    assert again.returncode == 0, again.stderr
    assert _in_command_lines(again.stderr) == []
    assert len([e for e in fleet.events("start")]) == 2
    assert len(os.listdir(paused)) == 2
    cleared = _cli(fleet, "--clear-command", "m1")
    assert cleared.returncode == 0, cleared.stderr
    resumed = fleet.run()
    assert resumed.returncode == 0, resumed.stderr
    assert [e["task"] for e in fleet.events("start")] == ["m2", "x1", "a1", "a3"]


def test_a_person_who_speaks_while_a_task_runs_is_not_lost(make_fleet):
    """The failure of an interrupt path that popped the person's message and lost it when the
    agent finished on its own: here the message is a file until it runs. While an agent item
    of the thread runs, the person speaks and another agent item of the thread arrives: the
    person's message is the next run, the agent's item waits paused."""
    fleet = make_fleet("waits")
    _agent_message(fleet, "a1", "m1")
    runner = fleet.start()
    try:
        fleet.wait_for("start")
        _agent_message(fleet, "a2", "m1")
        _agent_message(fleet, "x1", "other")
        _person(fleet, "m3", "m1")
        fleet.log.with_name(fleet.log.name + ".go").touch()  # a1 may finish now
        wait_until(lambda: fleet.where("x1") in (["done"], ["failed"])
                   and not os.listdir(fleet.state / "inbox"), 60, poll_s=0.05,
                   what="x1 finished and the inbox empty")
    finally:
        runner.terminate()
        out, err = runner.communicate(timeout=60)
    assert [e["task"] for e in fleet.events("start")] == ["a1", "m3", "x1"]
    assert len(_in_command_lines(err)) == 1
    assert [n for n in os.listdir(fleet.state / "team" / "paused" / "m1")][0].endswith(
        "-a2.json")
