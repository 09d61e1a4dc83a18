"""The skills' CLIs and the denial contract of docs/runner.md (exit 77 plus one line in
$FLEET_DENIALS_LOG), run for real: `forge` against a scripted fake `gh` on PATH, `reply` and
`notify` as a real unprivileged Linux user who may not write to their spool."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import WAIT_S
from tests.runner_python import reachable_copy
from tests.runner.test_runner import make_fleet  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]
SKILLS = reachable_copy("blueprint/skills")  # run as the agents' users too
FAKE_BIN = reachable_copy("tests/fake_agents") / "bin"
TOKEN = "ghs_" + "S3cr3tT0k3n" * 3


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _forge(tmp_path: Path, *args: str, mode: str = "ok", env: dict | None = None,
           creds: str | None = f"FORGE_TOKEN={TOKEN}\nFORGE_REPOSITORIES=acme/api\n"
                               "FORGE_PERMISSION=write\n") -> subprocess.CompletedProcess:
    """Run forge as an agent would: fake gh first on PATH, the runner's FLEET_* variables."""
    cred_dir = tmp_path / "credentials"
    if creds is not None:
        cred_dir.mkdir(exist_ok=True)
        (cred_dir / "forge-token.env").write_text(creds)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("FLEET_", "FORGE_", "GH_", "GITHUB_"))}
    full = {**base, "PATH": f"{FAKE_BIN}{os.pathsep}{base['PATH']}", "FAKE_GH_MODE": mode,
            "FAKE_GH_LOG": str(tmp_path / "gh.log"), "FLEET_CREDENTIALS": str(cred_dir),
            "FLEET_DENIALS_LOG": str(tmp_path / "denials.jsonl"), "FLEET_TASK_ID": "t1",
            "FLEET_RUN_ID": "t1/1", **(env or {})}
    return subprocess.run([str(SKILLS / "forge" / "bin" / "forge"), *args], env=full,
                          capture_output=True, text=True, timeout=WAIT_S)


# -- forge ------------------------------------------------------------------------------------

def test_forge_passes_through_with_the_token_from_the_credentials_file(tmp_path):
    done = _forge(tmp_path, "pr-create", "--repo", "acme/api", "--title", "Fix")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "https://forge.example/acme/api/pull/7\n"
    [call] = _lines(tmp_path / "gh.log")
    # forge's word becomes gh's two; the token reaches gh in GH_TOKEN only.
    assert call["argv"] == ["pr", "create", "--repo", "acme/api", "--title", "Fix"]
    assert call["gh_token"] == TOKEN and call["forge_token_in_env"] is False
    assert TOKEN not in done.stdout + done.stderr
    assert not (tmp_path / "denials.jsonl").exists()


def test_forge_prefers_the_token_in_its_environment(tmp_path):
    done = _forge(tmp_path, "pr-status", env={"FORGE_TOKEN": "from-env"})
    assert done.returncode == 0, done.stderr
    assert _lines(tmp_path / "gh.log")[0]["gh_token"] == "from-env"


@pytest.mark.parametrize("mode, detail", [
    ("forbidden", "HTTP 403: Resource not accessible by integration"),
    ("push", "remote: Permission to acme/api.git denied to bot."),
    ("auth", "gh exited 4 (authentication required): To get started"),
])
def test_forge_reports_a_refusal_with_exit_77_and_a_denial_line(tmp_path, mode, detail):
    done = _forge(tmp_path, "pr-create", "--repo", "acme/api", "--title", "Fix", mode=mode)
    assert done.returncode == 77, done.stderr
    [denial] = _lines(tmp_path / "denials.jsonl")
    assert denial["cli"] == "forge" and denial["task"] == "t1" and denial["run"] == "t1/1"
    assert denial["what"] == "forge pr-create on acme/api"  # never the title or body
    assert detail in denial["detail"]
    assert set(denial) == {"time", "task", "run", "cli", "what", "detail"}
    # The token gh echoed is masked everywhere forge writes.
    assert TOKEN not in done.stdout + done.stderr + (tmp_path / "denials.jsonl").read_text()
    assert "forge: permission denied" in done.stderr


@pytest.mark.parametrize("mode, status", [("notfound", 1), ("ok-noisy", 0)])
def test_forge_does_not_read_other_failures_or_a_noisy_success_as_a_denial(tmp_path, mode,
                                                                          status):
    done = _forge(tmp_path, "pr-comment", "99", "--body", "permission denied", mode=mode)
    assert done.returncode == status
    assert not (tmp_path / "denials.jsonl").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv (to drop the read-anything capabilities)")
def test_forge_an_unreadable_credentials_file_is_a_denial(tmp_path):
    _forge(tmp_path, "--help")
    os.chmod(tmp_path / "credentials" / "forge-token.env", 0o000)
    caps = "-dac_override,-dac_read_search"
    done = subprocess.run(
        ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}",
         str(SKILLS / "forge" / "bin" / "forge"), "pr-status"],
        env={"PATH": f"{FAKE_BIN}{os.pathsep}/usr/bin:/bin",
             "FLEET_CREDENTIALS": str(tmp_path / "credentials"),
             "FLEET_DENIALS_LOG": str(tmp_path / "denials.jsonl"), "FLEET_RUN_ID": "t1/1"},
        capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 77, done.stderr
    [denial] = _lines(tmp_path / "denials.jsonl")
    assert "forge-token.env" in denial["what"] and not (tmp_path / "gh.log").exists()


def test_forge_help_names_the_refusals_it_recognises(tmp_path):
    done = _forge(tmp_path, "--help")
    assert done.returncode == 0
    for phrase in ("pr-create", "exit status 4", "HTTP 403", "Resource not accessible by",
                   "77", "FLEET_DENIALS_LOG", "forge-token.env"):
        assert phrase in " ".join(done.stdout.split()), phrase
    assert not (tmp_path / "gh.log").exists()  # help never runs gh


# -- reply and notify as a real unprivileged user --------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(c) for c in ("useradd", "userdel", "runuser")),
    reason="needs root, useradd, userdel and runuser (to act as a real unprivileged user)")


@pytest.fixture(scope="module")
def agent_user():
    """A real Linux user for this module's tests (unique name), removed with ``userdel -r``."""
    name = f"fltest{os.getpid() % 100000}{secrets.token_hex(2)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture
def open_base():
    """A directory every user may traverse (pytest's own base is 0700 to root)."""
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="fleet-user-test-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as_user(user: pwd.struct_passwd, argv: list[str], env: dict[str, str],
             timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` with only ``env`` (``env -i``: nothing of root's leaks)."""
    base_env = {"HOME": user.pw_dir, "PATH": "/usr/local/bin:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE": "1"}
    pairs = [f"{k}={v}" for k, v in {**base_env, **env}.items()]
    return subprocess.run(["runuser", "-u", user.pw_name, "--", "env", "-i", *pairs, *argv],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _owned_dir(path: Path, user: pwd.struct_passwd, mode: int = 0o700) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(path, mode)
    return path


@needs_root
@pytest.mark.parametrize("cli, spool_var, args", [
    ("reply", "FLEET_OUTBOX", ["--task", "t1", "--channel", "#support", "hello"]),
    ("notify", "FLEET_NOTIFY_SPOOL", ["--task", "t1", "--reason", "stuck"]),
])
def test_a_spool_the_user_may_not_write_is_a_denial(agent_user, open_base, cli, spool_var, args):
    spool = open_base / "spool"
    spool.mkdir(mode=0o755)  # root's: the user may read it, not write it
    evidence = _owned_dir(open_base / "state", agent_user)
    done = _as_user(agent_user, [str(SKILLS / cli / "bin" / cli), *args], {
        spool_var: str(spool), "FLEET_DENIALS_LOG": str(evidence / "denials.jsonl"),
        "FLEET_SENDS_LOG": str(evidence / "sends.jsonl"), "FLEET_TASK_ID": "t1",
        "FLEET_RUN_ID": "t1/1"})
    assert done.returncode == 77, done.stderr
    assert f"{cli}: permission denied" in done.stderr
    [denial] = _lines(evidence / "denials.jsonl")
    assert denial["cli"] == cli and (denial["task"], denial["run"]) == ("t1", "t1/1")
    assert str(spool) in denial["what"] and denial["detail"] == "Permission denied"
    assert list(spool.iterdir()) == []  # nothing half-written
    assert not (evidence / "sends.jsonl").exists()  # a refused reply is not a send


@needs_root
def test_the_runner_as_the_agent_user_stops_a_denied_reply_without_retry(agent_user, open_base,
                                                                          make_fleet):
    fleet = make_fleet("replier", max_retries=2, base=open_base)
    fleet.drop("u1", text="What is 6 x 7?")
    for path in (fleet.state, fleet.workspace):  # as docs/runner.md says: install -d -o NAME
        _owned_dir(path, agent_user)
    for path in fleet.state.rglob("*"):
        os.chown(path, agent_user.pw_uid, agent_user.pw_gid)
    fleet.log.touch()
    os.chown(fleet.log, agent_user.pw_uid, agent_user.pw_gid)
    locked = open_base / "outbox"
    locked.mkdir(mode=0o755)  # the chat bridge's, not the agent's
    done = _as_user(agent_user, fleet.argv("--once", "--outbox", str(locked)),
                    {"FAKE_AGENT_LOG": str(fleet.log)})
    assert done.returncode == 0, done.stderr
    [start] = fleet.events("start")  # one attempt: no retry after a denial
    assert int(start["env"]["FLEET_ATTEMPT"]) == 1
    # The runner ends the agent as soon as the denial is recorded, which may be before the fake
    # agent logs the CLI's exit status: when it did, that status is 77.
    assert all(c["argv"][0] == "reply" and c["status"] == 77 for c in fleet.events("cli"))
    record = fleet.record("u1", 1)
    assert record["verdict"] == "denied" and record["gates"][0]["name"] == "run"
    [denial] = record["denials"]
    assert denial["cli"] == "reply" and str(locked) in denial["what"]
    assert fleet.where("u1") == ["failed"] and list(locked.iterdir()) == []
    [notice] = fleet.notices()
    assert notice["kind"] == "denied" and "Not retried" in notice["reason"]
    assert str(locked) in notice["reason"]
    result = json.loads((fleet.state / "runs" / "u1" / "result.json").read_text())
    assert result["outcome"] == "denied" and result["attempts"] == 1


# -- the runner: FLEET_CREDENTIALS, and forge's refusal stops the task --------------------------

def test_the_runner_exports_credentials_and_a_forge_refusal_stops_the_task(make_fleet, tmp_path):
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    (creds / "forge-token.env").write_text(
        f"FORGE_TOKEN={TOKEN}\nFORGE_REPOSITORIES=acme/api\nFORGE_PERMISSION=write\n")
    fleet = make_fleet("forger", max_retries=2, timeout_s=30,
                       skills=("reply", "notify", "forge"),
                       config={"credentials_dir": str(creds)},
                       env={"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
                            "FAKE_GH_MODE": "forbidden", "FAKE_GH_LOG": str(tmp_path / "gh.log"),
                            "FLEET_CREDENTIALS": "/not/this/one"})
    fleet.drop("f1", kind="agent", channel=None, text="open the pull request")
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    [start] = fleet.events("start")  # no retry
    assert start["env"]["FLEET_CREDENTIALS"] == str(creds)  # from agent.yaml, not the runner's
    [call] = _lines(tmp_path / "gh.log")
    assert call["gh_token"] == TOKEN  # forge found the token through FLEET_CREDENTIALS
    # The agent meant to carry on for 20 s (less than its 30 s limit): the runner ended it first.
    assert fleet.events("finished") == [] and not (fleet.workspace / "after.txt").exists()
    record = fleet.record("f1", 1)
    assert record["verdict"] == "denied" and record["invocation"]["stopped"] == "denied"
    [denial] = record["denials"]
    assert denial["cli"] == "forge" and denial["what"] == "forge pr-create on acme/api"
    assert fleet.where("f1") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "denied" and "forge pr-create on acme/api" in notice["reason"]
    assert "HTTP 403" in notice["reason"] and "Not retried" in notice["reason"]
    for path in fleet.state.rglob("*"):  # the token is in no record, log or escalation
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def test_without_credentials_dir_nothing_is_exported(make_fleet):
    fleet = make_fleet("clean", env={"FLEET_CREDENTIALS": "/the/runner/own"})
    fleet.drop("f2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    [start] = fleet.events("start")
    assert "FLEET_CREDENTIALS" not in start["env"]


# -- JSONL records after a line cut short -------------------------------------------------------

HALF = b'{"task": "t0", "channel": "#sup'  # a writer killed mid-line, or a full disk


def _records(path: Path) -> list[dict]:
    """The JSON objects of ``path``, one per ``\\n``-ended line (broken lines skipped)."""
    out = []
    for raw in path.read_bytes().split(b"\n"):
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def test_a_reply_recorded_after_a_line_cut_short_is_not_lost(tmp_path):
    """Before: reply's send line was appended to the half line, and the one broken line hid it
    from the runner (a reply that was sent counted as not sent: retried, answered twice)."""
    log = tmp_path / "sends.jsonl"
    log.write_bytes(HALF)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_SENDS_LOG": str(log), "FLEET_TASK_ID": "t1", "FLEET_RUN_ID": "t1/1",
                "FLEET_OUTBOX": str(tmp_path / "outbox")})
    done = subprocess.run([str(SKILLS / "reply" / "bin" / "reply"), "--task", "t1",
                           "--channel", "#support", "hello"], env=env, capture_output=True,
                          text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    (record,) = _records(log)
    assert (record["task"], record["message_id"]) == ("t1", done.stdout.strip())
    assert log.read_bytes().startswith(HALF + b"\n")


def test_a_denial_recorded_after_a_line_cut_short_is_not_lost(tmp_path):
    (tmp_path / "denials.jsonl").write_bytes(HALF)
    done = _forge(tmp_path, "pr-create", "--repo", "acme/api", "--title", "Fix", mode="forbidden")
    assert done.returncode == 77, done.stderr
    (denial,) = _records(tmp_path / "denials.jsonl")
    assert (denial["cli"], denial["task"]) == ("forge", "t1")


def test_the_runners_own_records_after_a_line_cut_short_are_not_lost(tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "blueprint" / "runner"))
    from fleet_runner.records import append_jsonl

    log = tmp_path / "ledger.jsonl"
    log.write_bytes(HALF)
    append_jsonl(log, {"task": "t1"})
    append_jsonl(log, {"task": "t2"})
    assert [r["task"] for r in _records(log)] == ["t1", "t2"]
    assert log.read_bytes() == HALF + b'\n{"task": "t1"}\n{"task": "t2"}\n'
