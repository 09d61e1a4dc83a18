"""The two users (issue 14): the agent command runs as the agent's own Linux user
(``--agent-user``), cannot write the runner's state, records or evidence, and a send counts
only when the runner recorded it through its socket. Real users (useradd), the real runner as
root (the runner's user here), scripted fake agents."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys

import pytest

from tests.runner.test_runner import (  # noqa: F401  (make_fleet: a fixture)
    REPO,
    _alive,
    make_fleet,
    timed_out_after_setup,
)
from tests.runner.test_runner_clis import _owned_dir, needs_root, open_base  # noqa: F401


def _two_users(fleet, user: pwd.struct_passwd) -> None:
    """The workspace is the agent user's; the fake agents' own log too."""
    _owned_dir(fleet.workspace, user)
    fleet.log.touch()
    os.chown(fleet.log, user.pw_uid, user.pw_gid)


def _agent_user_fleet(real_users, open_base, make_fleet, fake: str):
    """A fleet whose agent is a new real user's (workspace and log its own): ``(fleet, user)``."""
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet(fake, base=open_base)
    _two_users(fleet, user)
    return fleet, user


def setpriv_caps(caps) -> str:
    """``CAP_KILL``-style names as util-linux's setpriv takes them: ``+kill,+...``."""
    return ",".join("+" + c.lower().removeprefix("cap_") for c in caps)


def _sends(fleet) -> list[dict]:
    path = fleet.state / "sends.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


@needs_root
def test_a_reply_counts_when_the_runner_recorded_it(real_users, open_base, make_fleet):
    fleet, user = _agent_user_fleet(real_users, open_base, make_fleet, "replier")
    fleet.drop("h1", text="What is 6 x 7?")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 0, done.stderr
    [start] = fleet.events("start")
    assert start["uid"] == user.pw_uid  # the agent command ran as the agent's user
    assert fleet.where("h1") == ["done"]
    [sent] = fleet.outbox()
    [send] = _sends(fleet)  # the runner's own record, through its socket
    assert send["via"] == "runner" and send["task"] == "h1" and send["run"] == "h1/1"
    assert send["message_id"] == sent["id"] and send["outbox_file"] == f"{sent['id']}.json"
    # The reply CLI's own line went to the agent's directory: a claim, not evidence.
    claimed = (fleet.state / "agent" / "sends-claimed.jsonl").read_text()
    assert sent["id"] in claimed
    # The runner's state is not the agent's to write.
    for path in (fleet.state / "sends.jsonl", fleet.state / "ledger.jsonl",
                 fleet.state / "runs" / "h1" / "attempt-1.json"):
        st = path.stat()
        assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    assert stat.S_IMODE((fleet.state / "runs").stat().st_mode) == 0o700
    assert fleet.ledger()[0]["calls"] == {"reply": 1}  # the send shim counts the call


@needs_root
def test_a_forged_send_fails_anti_silence(real_users, open_base, make_fleet):
    fleet, user = _agent_user_fleet(real_users, open_base, make_fleet, "forges_send")
    fleet.drop("h2", text="What is 6 x 7?")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 0, done.stderr
    [forged] = fleet.events("forged")
    assert forged["runner_log"].startswith("PermissionError")  # cannot write its evidence
    assert forged["socket"].startswith("refused: not the runner's send shim")
    assert _sends(fleet) == []
    gate = fleet.gate("h2", 1, "anti-silence")
    assert gate["status"] == "fail"
    assert fleet.where("h2") == ["failed"]
    assert "refused a report" in done.stderr


@needs_root
def test_state_left_by_a_one_user_runner_is_taken_back(real_users, open_base, make_fleet):
    """A host upgraded from the unit that ran the runner as the agent's user: the state is the
    agent's. With --agent-user the runner gives the records, ledger, spools and evidence to
    itself, and the agent's own directories (with what is in them) to the agent user."""
    fleet, user = _agent_user_fleet(real_users, open_base, make_fleet, "replier")
    old = {  # what a one-user runner left, relative to STATE
        "ledger.jsonl": '{"task": "t0"}\n', "sends.jsonl": "", "runs/t0/attempt-1.json": "{}",
        "done/1-t0.json": "{}", "agent/sends-claimed.jsonl": "", "outbox/m0.json": "{}"}
    for rel, text in old.items():
        path = fleet.state / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [fleet.state, *fleet.state.rglob("*")]:
        os.lchown(path, user.pw_uid, user.pw_gid)
    os.chmod(fleet.state / "ledger.jsonl", 0o666)  # writable by anyone, too
    # A symlink the agent planted is re-owned as a link; its target is not touched.
    outside = open_base / "outside"
    outside.write_text("not the runner's\n")
    os.chown(outside, user.pw_uid, user.pw_gid)
    os.symlink(outside, fleet.state / "runs" / "planted")
    fleet.drop("h3", text="What is 6 x 7?")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 0, done.stderr
    assert fleet.where("h3") == ["done"]
    me, agent = (os.geteuid(), os.getegid()), (user.pw_uid, user.pw_gid)
    for rel in ("ledger.jsonl", "sends.jsonl", "runs", "runs/t0/attempt-1.json", "done",
                "done/1-t0.json", "runs/planted"):
        st = (fleet.state / rel).lstat()
        assert (st.st_uid, st.st_gid) == me, rel
    assert not (fleet.state / "ledger.jsonl").stat().st_mode & 0o022
    for rel in ("agent", "agent/sends-claimed.jsonl", "outbox", "outbox/m0.json"):
        st = (fleet.state / rel).lstat()
        assert (st.st_uid, st.st_gid) == agent, rel
    st = outside.stat()
    assert (st.st_uid, st.st_gid) == agent and outside.read_text() == "not the runner's\n"
    assert "state re-owned for two users" in done.stderr
    # The ledger is the runner's again: the new task's line was added to the old one.
    assert [line["task"] for line in fleet.ledger()] == ["t0", "h3"]


@needs_root
def test_an_agent_user_that_is_root_is_refused(real_users, open_base, make_fleet):
    """Root under its own name or another (a second uid-0 entry in /etc/passwd), or the
    runner's own user: the agent could write the runner's records, so the runner does not
    start, names the user and leaves the task in the inbox."""
    alias = real_users.name("uid0")
    subprocess.run(["useradd", "--non-unique", "--uid", "0", "--gid", "0", "--no-create-home",
                    "--shell", "/bin/sh", alias], check=True, capture_output=True)
    try:
        fleet = make_fleet("replier", base=open_base)
        fleet.drop("h9", text="What is 6 x 7?")
        for name in ("root", alias):
            done = fleet.run("--agent-user", name)
            assert done.returncode == 2, done.stderr
            assert f"--agent-user {name}: uid 0 is root" in done.stderr
        assert fleet.events("start") == [] and fleet.where("h9") == ["inbox"]
    finally:
        # userdel refuses a user "in use" by a process: every uid-0 process counts.
        subprocess.run(["userdel", "--force", alias], capture_output=True)
    assert alias not in {p.pw_name for p in pwd.getpwall()}


def _unit_bounding_set() -> list[str]:
    """The capabilities the shipped unit leaves the root runner (its CapabilityBoundingSet=)."""
    unit = (REPO / "templates" / "fleet-runner.service.j2").read_text()
    [line] = [ln for ln in unit.splitlines() if ln.startswith("CapabilityBoundingSet=")]
    return line.split("=", 1)[1].split()


@needs_root
def test_the_units_capabilities_are_enough_to_undo_and_to_end_the_agents_processes(
        real_users, open_base, make_fleet):
    """The runner as root with only the unit's capability bounding set (applied with
    util-linux's setpriv, as systemd applies it): it still restores the mode of a file the
    agent's user owns (CAP_FOWNER), and ends the process group of that user's agent at its
    timeout and what escaped it (CAP_KILL); tests/commands/test_services.py runs the unit's
    own lines for the rest."""
    user = pwd.getpwnam(real_users.create("agent"))
    script = open_base / "script.json"
    script.write_text(json.dumps({"attempts": [[
        {"chmod": "docs/guide.md", "mode": "0777"}, {"escape": 300}, {"sleep": 600}]]}))
    keep = setpriv_caps(_unit_bounding_set())

    def build(base, timeout_s):
        base.mkdir(mode=0o755)
        fleet = make_fleet("scripted", base=base, role={"writes": ["src/"]},
                           timeout_s=timeout_s, env={"FAKE_SCRIPT": str(script)},
                           workspace_files={"docs/guide.md": "read me\n"})
        _two_users(fleet, user)
        for path in (fleet.workspace / "docs", fleet.workspace / "docs" / "guide.md"):
            os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(fleet.workspace / "docs" / "guide.md", 0o644)
        fleet.runner_prefix = ("setpriv", f"--bounding-set=-all,{keep}", "--inh-caps=-all",
                               "--no-new-privs", "--")
        fleet.runner_args = ("--agent-user", user.pw_name)
        return fleet

    fleet, escaped = timed_out_after_setup(build, "escaped", open_base, "k1")
    record = fleet.record("k1", 1)
    assert record["invocation"]["group_gone"] is True
    assert record["failed_gates"] == ["run", "scope"]
    assert stat.S_IMODE((fleet.workspace / "docs" / "guide.md").stat().st_mode) == 0o644
    assert [k["pid"] for k in record["invocation"]["escaped_killed"]] == [escaped["grandchild"]]
    assert not _alive(escaped["grandchild"])


def test_the_units_bounding_set_is_what_the_runner_checks_for():
    sys.path.insert(0, str(REPO / "blueprint" / "runner"))
    from fleet_runner.loop import AGENT_USER_CAPS

    assert sorted(_unit_bounding_set()) == sorted(AGENT_USER_CAPS)


@needs_root
@pytest.mark.parametrize("dropped", ["CAP_KILL", "CAP_SYS_PTRACE"])
def test_a_runner_without_a_capability_it_needs_says_so_at_start(real_users, open_base,
                                                                  make_fleet, dropped):
    """Without CAP_KILL a timed-out agent of another user could not be ended (the runner
    waited on it for ever); without CAP_SYS_PTRACE every send through the socket would be
    refused. Exit 2 at start, naming it; the task stays in the inbox."""
    fleet, user = _agent_user_fleet(real_users, open_base, make_fleet, "replier")
    fleet.drop("c1", text="What is 6 x 7?")
    keep = setpriv_caps(c for c in _unit_bounding_set() if c != dropped)
    fleet.runner_prefix = ("setpriv", f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 2, done.stderr
    assert f"lacks {dropped}, which it needs" in done.stderr
    assert fleet.events("start") == [] and fleet.where("c1") == ["inbox"]


@needs_root
def test_a_runner_that_is_not_root_is_refused_even_with_the_capabilities(real_users, open_base,
                                                                          make_fleet):
    """A runner of another uid holding the seven capabilities as ambient ones (as setpriv or
    systemd's AmbientCapabilities= give them) would pass them on to the agent, which could
    then write the runner's ledger (seen in a tryout): exit 2 before anything is touched."""
    runner_user = pwd.getpwnam(real_users.create("runner"))
    fleet, agent = _agent_user_fleet(real_users, open_base, make_fleet, "replier")
    fleet.drop("n1", text="What is 6 x 7?")
    caps = setpriv_caps(_unit_bounding_set())
    fleet.runner_prefix = ("setpriv", f"--reuid={runner_user.pw_uid}",
                           f"--regid={runner_user.pw_gid}", "--clear-groups",
                           f"--inh-caps={caps}", f"--ambient-caps={caps}", "--")
    done = fleet.run("--agent-user", agent.pw_name)
    assert done.returncode == 2, done.stderr
    assert f"the runner must run as root (uid 0) to start the agent as another user, not as " \
           f"uid {runner_user.pw_uid}" in done.stderr
    assert "Traceback" not in done.stderr
    assert fleet.events("start") == [] and fleet.where("n1") == ["inbox"]
