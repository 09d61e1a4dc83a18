"""The two users (issue 14): the agent command runs as the agent's own Linux user
(``--agent-user``), cannot write the runner's state, records or evidence, and a send counts
only when the runner recorded it through its socket. Real users (useradd), the real runner as
root (the runner's user here), scripted fake agents."""

from __future__ import annotations

import json
import os
import pwd
import stat

from tests.runner.test_runner import make_fleet  # noqa: F401  (a fixture)
from tests.runner.test_runner_clis import _owned_dir, needs_root, open_base  # noqa: F401


def _two_users(fleet, user: pwd.struct_passwd) -> None:
    """The workspace is the agent user's; the fake agents' own log too."""
    _owned_dir(fleet.workspace, user)
    fleet.log.touch()
    os.chown(fleet.log, user.pw_uid, user.pw_gid)


def _sends(fleet) -> list[dict]:
    path = fleet.state / "sends.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


@needs_root
def test_a_reply_counts_when_the_runner_recorded_it(real_users, open_base, make_fleet):
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("replier", base=open_base)
    _two_users(fleet, user)
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
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("forges_send", base=open_base)
    _two_users(fleet, user)
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
