"""Names from outside stay data (issue 19): task ids, channels, senders and reply-to ids from a
message reach the runner's paths, the agent's PATH, argv, environment and log lines only in a
form any character survives. Real runner, real users, scripted fake agents."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetctl.host import status
from tests.helpers import git
from tests.runner.test_runner import REPO, make_fleet  # noqa: F401  (a fixture)
from tests.runner.test_runner_clis import needs_root, open_base  # noqa: F401
from tests.runner.test_runner_users import _sends, _two_users

sys.path.insert(0, str(REPO / "blueprint" / "runner"))

from fleet_runner.gates import reply_command  # noqa: E402
from fleet_runner.inbox import MessageError, parse_message  # noqa: E402
from fleet_runner.names import NAME_MAX_CHARS, decode_name, encode_name, one_line  # noqa: E402
from fleet_runner.reposync import _wip_branch  # noqa: E402

CHAT_ID = "slack:C042:1732950000.1234"  # the form docs/runner.md shows


@needs_root
def test_a_chat_id_with_colons_is_answered_once(real_users, open_base, make_fleet):
    """The id named the attempt's shim directory, first on the agent's PATH: its colons split
    it, so ``reply`` ran without the send shim, the send was not recorded, the retry answered
    the person a second time and the escalation said nobody was told."""
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("replier", base=open_base, max_retries=2)
    _two_users(fleet, user)
    fleet.drop(CHAT_ID, text="What is 6 x 7?")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 0, done.stderr
    assert len(fleet.events("start")) == 1  # no retry
    assert len(fleet.outbox()) == 1  # the person is answered once
    [send] = _sends(fleet)
    assert send["via"] == "runner" and send["task"] == CHAT_ID and send["run"] == f"{CHAT_ID}/1"
    assert fleet.notices() == []  # no escalation
    assert fleet.where(CHAT_ID) == ["done"]
    [start] = fleet.events("start")
    assert start["env"]["FLEET_TASK_ID"] == CHAT_ID
    first = start["env"]["PATH"].split(":")[0]
    assert first.startswith(str(fleet.state / "shims") + "/") and first.endswith(".1")
    assert fleet.ledger()[0]["calls"] == {"reply": 1}
    assert json.loads((fleet.state / "runs" / "slack%3AC042%3A1732950000.1234"
                       / "result.json").read_text())["outcome"] == "pass"
    # fleetctl status names the task by its id, not by its directory's encoded name.
    events: list[dict] = []
    assert status.read_status(events.append, os.fsencode(fleet.root), {"agents": ["a1"]}) == 0
    [agent] = [e for e in events if e["t"] == "agent-status"]
    assert agent["last_task"]["task"] == CHAT_ID


def expected_form(name: str) -> str:
    """The documented encoding (docs/runner.md), computed with the standard library's own
    percent-encoding: RFC 3986's unreserved characters and ``@+`` kept, but ``~`` (the cut
    marker) and a leading ``.``."""
    form = urllib.parse.quote(name.encode("utf-8", "surrogateescape"), safe="@+")
    form = form.replace("~", "%7E")
    return "%2E" + form[1:] if form.startswith(".") else form


ANY_NAME = st.text(min_size=1, max_size=80) | st.binary(min_size=1, max_size=80).map(
    lambda b: b.decode("utf-8", "surrogateescape"))


@settings(max_examples=300, deadline=None)
@given(ANY_NAME)
@example(CHAT_ID)
@example("..")
@example(".hidden")
@example("a/../b c'$`\n")
def test_a_name_encodes_to_a_plain_file_name_and_back(name):
    form = encode_name(name)
    if len(expected_form(name)) > NAME_MAX_CHARS:
        return  # cut: the next test
    assert form == expected_form(name)
    assert set(form) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                            "._-@+%")  # no ":" (PATH), "/", space, quote, "$", newline
    assert not form.startswith(".")
    assert decode_name(form) == name


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=400), st.text(min_size=1, max_size=400))
@example(":" * 128, ":" * 127 + ";")
@example("a" * 300, "a" * 301)
def test_long_names_are_cut_with_a_digest_and_never_collide(a, b):
    forms = encode_name(a), encode_name(b)
    for name, form in zip((a, b), forms):
        assert len(form) <= NAME_MAX_CHARS
        if len(expected_form(name)) > NAME_MAX_CHARS:
            assert "~" in form and form.split("~")[0] == expected_form(name)[:len(
                form.split("~")[0])]
            with pytest.raises(ValueError):
                decode_name(form)
    assert (forms[0] == forms[1]) == (a == b)


def test_a_one_line_text_keeps_one_record_per_line():
    text = "task t1\nfleet-runner[a1]: forged line\r\x1b[2J \\ \udc80 ok"
    line = one_line(text)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line == "task t1\\nfleet-runner[a1]: forged line\\r\\x1b[2J \\\\ \\x80 ok"


def _message(**fields) -> bytes:
    body = {"id": "t1", "from": {"kind": "human", "name": "alice"}, "channel": "#support",
            "text": "hi", **fields}
    return json.dumps(body).encode()


@pytest.mark.parametrize("bad", ["t1\n", "t1\r", "\nt1", "t1 ", "a/b", "x" * 129])
def test_an_id_is_checked_on_the_whole_value(bad):
    """``re.match`` with ``$`` let ``"t1\\n"`` through (its newline then split the log)."""
    with pytest.raises(MessageError, match="^id: "):
        parse_message(_message(id=bad))


@pytest.mark.parametrize("field, value, why", [
    ("channel", "#a\x00b", "NUL"), ("reply_to", "x\x00", "NUL"),
    ("text", "lone \ud800 half", "lone surrogate"), ("channel", "\udc80", "lone surrogate")])
def test_a_value_no_argument_or_file_can_carry_is_an_invalid_message(field, value, why):
    with pytest.raises(MessageError, match=f"^{field}: .*{why}"):
        parse_message(_message(**{field: value}))


def test_a_sender_name_with_a_nul_is_invalid():
    with pytest.raises(MessageError, match="^from.name: .*NUL"):
        parse_message(_message(**{"from": {"kind": "human", "name": "al\x00ice"}}))


@pytest.mark.parametrize("agent", ["a1\n", "a1/../b", "-a1"])
def test_an_agent_name_is_checked_on_the_whole_value(agent, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "blueprint" / "runner" / "bin" /
                                               "fleet-runner"), f"--agent={agent}", "--root",
                           str(tmp_path), "--once"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "letters, digits" in done.stderr and not (tmp_path / "state").exists()


CHANNELS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                   min_size=1, max_size=60)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}", fullmatch=True),
       channel=CHANNELS)
@example(task=CHAT_ID, channel="-general")
@example(task="a..b", channel="#a b'c\"$(touch x)`id`\n")
def test_the_prompts_reply_command_sends_to_that_task_and_channel(task, channel, tmp_path_factory):
    """The command the prompt gives, run by a shell: the real reply CLI gets the task and the
    channel byte for byte (a channel starting with "-" was read as an option)."""
    outbox = tmp_path_factory.mktemp("outbox")
    line = reply_command(task, channel).replace("reply ", shlex.quote(
        str(REPO / "blueprint" / "skills" / "reply" / "bin" / "reply")) + " ", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(["/bin/sh", "-c", line], env={**env, "FLEET_OUTBOX": str(outbox)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [sent] = [json.loads(p.read_text()) for p in Path(outbox).glob("*.json")]
    assert (sent["task"], sent["channel"], sent["text"]) == (task, channel, "YOUR ANSWER")


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}", fullmatch=True))
@example(task="a..b")
@example(task="x.lock")
@example(task=":" * 128)
def test_a_wip_branch_is_a_ref_name_git_accepts(task, tmp_path):
    repo = tmp_path / f"repo-{os.urandom(4).hex()}"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "start")
    head = git(repo, "rev-parse", "HEAD").strip()
    name = _wip_branch(repo, task, head)
    assert git(repo, "rev-parse", f"refs/heads/{name}").strip() == head
    if "~" not in encode_name(task):  # the id can be read back from the branch name
        assert decode_name(name.removeprefix("fleet-runner/wip/").replace("%2E", ".")) == task


HOSTILE = ["-general", "#a:b:c", "a\nb", "../../etc", "..", "a b", "'\"", "$(touch x)$HOME",
           "`id`", "\\x80\\", "é\u2028ü", "\t"]


@needs_root
def test_hostile_names_are_answered_once_without_retry_or_escalation(real_users, open_base,
                                                                     make_fleet):
    """A person's message with ids, channels, sender and reply-to names that hold colons,
    newlines, slashes, ``..``, spaces, quotes, ``$``, backticks, bytes that are not ASCII and
    128-character ids, through the real runner with two users: the reply is recorded once
    (through the runner's socket), sent once to that channel, with no retry and no
    escalation, and every line of the runner's log is one of its records."""
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("replier", base=open_base, max_retries=2)
    _two_users(fleet, user)
    seq = iter(range(10_000))
    names = CHANNELS | st.sampled_from(HOSTILE)

    @settings(max_examples=6, deadline=None, database=None)
    @given(tail=st.from_regex(r"[A-Za-z0-9._:@+-]{0,126}", fullmatch=True), channel=names,
           sender=names, reply_to=st.none() | names)
    @example(tail=CHAT_ID, channel="-general", sender="a\nb", reply_to="../..")
    @example(tail=":" * 126, channel="$(touch x)`id`'\"", sender="..", reply_to=CHAT_ID)
    @example(tail="..", channel="a b\nc", sender="é\u2028ü", reply_to=None)
    def one(tail, channel, sender, reply_to):
        n = next(seq)
        task = f"{n}{tail}"[:128]
        fleet.drop(f"p{n}", raw=json.dumps({
            "id": task, "from": {"kind": "human", "name": sender}, "channel": channel,
            "text": "What is 6 x 7?", "reply_to": reply_to}).encode())
        done = fleet.run("--agent-user", user.pw_name)
        assert done.returncode == 0, done.stderr
        assert all(ln.startswith("fleet-runner") for ln in done.stderr.splitlines()), done.stderr
        assert fleet.where(f"p{n}") == ["done"]
        assert len([e for e in fleet.events("start") if e["task"] == task]) == 1  # no retry
        sent = [m for m in fleet.outbox() if m["task"] == task]
        assert [m["channel"] for m in sent] == [channel]  # once, to that channel
        assert [s["via"] for s in _sends(fleet) if s["task"] == task] == ["runner"]
        assert [x for x in fleet.notices() if x.get("task") == task] == []  # no escalation
        results = [json.loads(p.read_text()) for p in (fleet.state / "runs").glob("*/result.json")]
        assert [r["outcome"] for r in results if r.get("task") == task] == ["pass"]
        if len(expected_form(task)) <= NAME_MAX_CHARS:
            assert (fleet.state / "runs" / expected_form(task) / "result.json").is_file()

    one()


def test_standing_denials_of_permissions_that_differ_only_in_odd_characters_stay_apart(
        tmp_path):
    """A permission is a name from the agent CLI's result (``tool:NAME``): its file name was
    the permission with every odd character as ``_``, cut at 120, so two permissions shared a
    file; the second was never recorded, and clearing one cleared the other."""
    from fleet_runner import standing

    long_a, long_b = "tool:" + "x" * 150 + "a", "tool:" + "x" * 150 + "b"
    perms = ["tool:my tool", "tool:my_tool", "tool:a/b", long_a, long_b]
    directory = tmp_path / "standing-denials"
    got = standing.record(directory, [{"permission": p, "what": p} for p in perms], task="t1",
                          run="t1/1", clear=lambda p: f"clear {p}")
    assert got == perms
    assert sorted(d["permission"] for d in standing.standing(directory)) == sorted(perms)
    assert standing.clear(directory, "tool:my tool") == ["tool:my tool"]
    assert sorted(d["permission"] for d in standing.standing(directory)) == sorted(
        p for p in perms if p != "tool:my tool")
    assert standing.clear(directory, long_a) == [long_a]
    assert long_b in [d["permission"] for d in standing.standing(directory)]


def test_a_standing_denial_file_an_older_runner_named_is_still_cleared(tmp_path):
    from fleet_runner import standing

    directory = tmp_path / "standing-denials"
    directory.mkdir()
    (directory / "tool_Bash.json").write_text(json.dumps(
        {"permission": "tool:Bash", "task": "t0", "time": "2026-01-01T00:00:00Z"}))
    assert [d["permission"] for d in standing.standing(directory)] == ["tool:Bash"]
    assert standing.clear(directory, "tool:Bash") == ["tool:Bash"]
    assert standing.standing(directory) == []


@pytest.mark.parametrize("detail", ["--> pkg/a.py:1:1", "-1 is not an answer", "-"])
def test_an_escalation_whose_detail_starts_with_a_dash_goes_through_the_notify_cli(
        detail, tmp_path):
    """The detail is a check's raw output (ruff's ``--> path``) or a person's text: as its own
    argument after ``--detail`` the notify CLI took it for an option and refused."""
    from fleet_runner.escalate import escalate

    spool = tmp_path / "notify"
    done = escalate(release=REPO / "blueprint", spool=spool, env=dict(os.environ), agent="a1",
                    task="t1", kind="gave-up", failures=1, reason="-why", detail=detail)
    assert done["via"] == "notify-cli", done
    [sent] = [json.loads(p.read_text()) for p in spool.glob("*.json")]
    assert (sent["detail"], sent["reason"], sent["via"]) == (detail, "-why", "notify-cli")


def test_a_server_name_with_a_line_separator_is_one_call(tmp_path):
    """The calls log was read with ``splitlines``: U+2028 in an MCP server name cut the line,
    and its second half was counted as a call of a CLI named ``b``."""
    from fleet_runner.calls import count_calls

    log = tmp_path / "attempt-1.calls"
    log.write_text("reply\nmcp-bridge\ta\u2028b\ttool\n", "utf-8")
    assert count_calls(log) == ({"mcp-bridge": 1, "reply": 1}, {"a\u2028b/tool": 1})


def test_an_escalation_that_cannot_be_delivered_is_one_log_line(tmp_path, capsys):
    from fleet_runner.escalate import escalate

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    done = escalate(release=tmp_path, spool=blocker / "notify", env={}, agent="a1", task="t1",
                    kind="gave-up", failures=3, reason="gave up.\nAttempts:\n  1: fail",
                    detail="")
    assert done["via"] is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gave up.\\nAttempts:\\n  1: fail" in err


def test_a_root_with_a_newline_in_its_name_is_one_error_line(tmp_path):
    root = tmp_path / "a\nfleet-runner[a1]: forged"
    root.mkdir()
    done = subprocess.run([sys.executable, str(REPO / "blueprint" / "runner" / "bin" /
                                               "fleet-runner"), "--agent", "a1", "--root",
                           str(root), "--once"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "a\\nfleet-runner[a1]: forged" in done.stderr


@needs_root
def test_records_an_older_runner_kept_under_the_id_itself_are_found(real_users, open_base,
                                                                    make_fleet):
    """An older runner named runs/<task> by the id itself: after an upgrade, a finished chat
    id sent again must still be a duplicate (not run and answered a second time)."""
    user = pwd.getpwnam(real_users.create("agent"))
    fleet = make_fleet("replier", base=open_base)
    _two_users(fleet, user)
    fleet.drop(CHAT_ID, text="What is 6 x 7?")
    assert fleet.run("--agent-user", user.pw_name).returncode == 0
    runs = fleet.state / "runs"
    os.rename(runs / "slack%3AC042%3A1732950000.1234", runs / CHAT_ID)  # as it was left
    fleet.drop(CHAT_ID, text="Another question under the same id")
    done = fleet.run("--agent-user", user.pw_name)
    assert done.returncode == 0, done.stderr
    assert len(fleet.events("start")) == 1 and len(fleet.outbox()) == 1
    [notice] = fleet.notices()
    assert notice["kind"] == "duplicate" and CHAT_ID in notice["reason"]
    assert (runs / "slack%3AC042%3A1732950000.1234" / "progress.json").is_file()
    assert not (runs / CHAT_ID).exists()


def test_an_id_ending_in_a_newline_is_an_invalid_message_and_the_log_stays_whole(make_fleet):
    """It passed the documented id pattern (``re.match`` and ``$``), was run, and its newline
    split the runner's log lines."""
    fleet = make_fleet("replier")
    fleet.drop("n1", raw=json.dumps({"id": "t1\n", "from": {"kind": "human", "name": "alice"},
                                     "channel": "#support", "text": "hi"}).encode())
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.events("start") == [] and fleet.where("n1") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "invalid" and "id: required" in notice["reason"]
    assert done.stderr and all(ln.startswith("fleet-runner") for ln in done.stderr.splitlines())
