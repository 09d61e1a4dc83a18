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
