"""The runner end to end, with scripted fake agents (tests/fake_agents/) and zero model calls.

Each test renders a real release with fleetctl (the repository's runner, skills and
``templates/agent.yaml.j2``, plus a test role whose ``agent_command`` is a fake agent), drops
messages into the inbox the documented way, runs ``<root>/current/runner/bin/fleet-runner`` as
a separate process, and checks what it left: the spools, the finished messages, the fake
agent's own log ($FAKE_AGENT_LOG), the records, and which processes are still alive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from fleetctl.blueprint import load_blueprint
from fleetctl.inventory import load_inventory
from fleetctl.render import render_host, write_tree
from tests.helpers import WAIT_S, wait_until
from tests.runner_python import precompile_runner, reachable_copy

REPO = Path(__file__).resolve().parents[2]
FAKES = reachable_copy("tests/fake_agents")  # run as the agents' users too
AGENT = "a1"
ROLE_PROMPT = "You are a test agent. Do the task in the workspace.\n"
FIRST_TIMEOUT_S = 1.0
"""The first role timeout (seconds) tried by :func:`timed_out_after_setup`: enough for a fake
agent to start and spawn its child on an idle machine."""
LAST_TIMEOUT_S = 32.0
"""The longest one it tries: about 1 s per interpreter start was seen with every core busy."""


def timed_out_after_setup(build: Callable[[Path, float], Fleet], event: str, base: Path,
                          task: str) -> tuple[Fleet, dict]:
    """Run one task whose fake agent must log ``event`` (its setup: a child spawned) before
    the role timeout ends the run, and return ``(fleet, that event)``.

    ``build(base, timeout_s)`` makes a fresh fleet in ``base`` with that role timeout. The
    timeout starts at :data:`FIRST_TIMEOUT_S`; while a run was ended before the agent logged
    ``event`` (a busy machine), it doubles, up to :data:`LAST_TIMEOUT_S`, on a new fleet. So
    the test waits for its condition, not for a limit long enough for the slowest machine.

    Raises:
        AssertionError: a run failed, or no run got as far as ``event``.
    """
    timeout_s = FIRST_TIMEOUT_S
    while True:
        fleet = build(base / f"timeout-{timeout_s:g}s", timeout_s)
        fleet.drop(task, kind="agent", channel=None)
        done = fleet.run(timeout=timeout_s + WAIT_S)
        assert done.returncode == 0, done.stderr
        assert fleet.record(task, 1)["invocation"]["timed_out"] is True
        if fleet.events(event):
            return fleet, fleet.events(event)[-1]
        if timeout_s >= LAST_TIMEOUT_S:
            raise AssertionError(f"the fake agent never logged {event!r} within {timeout_s:g} s")
        timeout_s *= 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _jsons(directory: Path) -> list[dict]:
    if not directory.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(directory.iterdir())
            if p.name.endswith(".json") and not p.name.startswith(".")]


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@dataclass
class Fleet:
    """One host root with one agent, rendered by fleetctl, and helpers to drive its runner."""

    root: Path
    log: Path
    extra_env: dict[str, str] | None = None
    runner_prefix: tuple[str, ...] = ()
    """What the runner's command line starts with (``setpriv ... --``: run it in its unit's
    bounds)."""
    runner_args: tuple[str, ...] = ()
    """Options every runner run gets (``--agent-user NAME``)."""

    @property
    def state(self) -> Path:
        return self.root / "state" / AGENT

    @property
    def workspace(self) -> Path:
        return self.root / "workspace" / AGENT

    def drop(self, mid: str, text: str = "What is 6 x 7?", kind: str = "human",
             channel: str | None = "#support", reply_to: str | None = None,
             raw: bytes | None = None) -> None:
        """Drop a message as a bridge would: a dot-file, then a rename to *.json."""
        inbox = self.state / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        body = raw if raw is not None else json.dumps(
            {"id": mid, "from": {"kind": kind, "name": "alice" if kind == "human" else "planner"},
             "channel": channel, "text": text, "reply_to": reply_to}).encode()
        tmp = inbox / f".{mid}.tmp"
        tmp.write_bytes(body)
        os.rename(tmp, inbox / f"{time.time_ns()}-{mid}.json")

    def argv(self, *extra: str) -> list[str]:
        return [*self.runner_prefix,
                str(self.root / "current" / "runner" / "bin" / "fleet-runner"), "--agent", AGENT,
                "--root", str(self.root), "--kill-grace-s", "0.3", "--check-timeout-s", "20",
                "--poll-s", "0.1", "--retry-backoff-s", "0", *self.runner_args, *extra]

    def env(self) -> dict[str, str]:
        return {**os.environ, "FAKE_AGENT_LOG": str(self.log), "PYTHONDONTWRITEBYTECODE": "1",
                **(self.extra_env or {})}

    def run(self, *extra: str, timeout: float = 2 * WAIT_S) -> subprocess.CompletedProcess:
        """Run the runner until the inbox is drained (--once)."""
        return subprocess.run(self.argv("--once", *extra), env=self.env(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def start(self, *extra: str) -> subprocess.Popen:
        """Start a serving runner (no --once)."""
        return subprocess.Popen(self.argv(*extra), env=self.env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def events(self, event: str | None = None) -> list[dict]:
        """The fake agents' own log."""
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in rows if event is None or r["event"] == event]

    def wait_for(self, event: str, timeout: float = WAIT_S) -> dict:
        """The last ``event`` in the fake agents' log, waiting up to ``timeout`` seconds for one."""
        return wait_until(lambda: self.events(event), timeout, poll_s=0.05,
                          what=f"a {event!r} event")[-1]

    def outbox(self) -> list[dict]:
        return _jsons(self.state / "outbox")

    def notices(self) -> list[dict]:
        return _jsons(self.state / "notify")

    def record(self, task: str, attempt: int) -> dict:
        return json.loads((self.state / "runs" / task / f"attempt-{attempt}.json").read_text())

    def gate(self, task: str, attempt: int, name: str) -> dict:
        return next(g for g in self.record(task, attempt)["gates"] if g["name"] == name)

    def ledger(self) -> list[dict]:
        path = self.state / "ledger.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def where(self, mid: str) -> list[str]:
        """Which spool directories hold message ``mid`` (by file name)."""
        return [d for d in ("inbox", "processing", "done", "failed")
                for name in _names(self.state / d) if name.endswith(f"-{mid}.json")]


@pytest.fixture
def make_fleet(tmp_path):
    """Render a release for one agent whose role runs a fake agent; return a :class:`Fleet`."""

    def make(fake: str, *, check: str | None = None, max_retries: int = 0,
             timeout_s: float = 20, skills: tuple[str, ...] = ("reply", "notify"),
             workspace_files: dict[str, str] | None = None, role: dict | None = None,
             config: dict | None = None, env: dict[str, str] | None = None,
             base: Path | None = None) -> Fleet:
        """``role``: more role keys (``writes``, ``sync``); ``config``: keys set in the rendered
        agent.yaml (JSON values, for keys the template does not have yet); ``env``: more
        variables for the runner (and so the agent); ``base``: where to build (default
        ``tmp_path``)."""
        base = base or tmp_path
        bp = base / "blueprint"
        shutil.copytree(REPO / "blueprint" / "runner", bp / "runner",
                        ignore=shutil.ignore_patterns("__pycache__"))
        if (REPO / "blueprint" / "credentials").is_dir():  # what the skills' capabilities name
            shutil.copytree(REPO / "blueprint" / "credentials", bp / "credentials")
        for skill in dict.fromkeys(("reply", "notify", *skills)):
            if skill != "vault":
                shutil.copytree(REPO / "blueprint" / "skills" / skill, bp / "skills" / skill,
                                ignore=shutil.ignore_patterns("__pycache__"))
        (bp / "skills" / "vault" / "bin").mkdir(parents=True)
        (bp / "skills" / "vault" / "SKILL.md").write_text(
            "---\nname: vault\nsummary: Read secrets you are granted.\n---\n# vault\n")
        shutil.copy(FAKES / "vault", bp / "skills" / "vault" / "bin" / "vault")
        (bp / "roles").mkdir()
        (bp / "roles" / "tester.yaml").write_text(yaml.safe_dump({
            "prompt": ROLE_PROMPT, "skills": list(skills), "check": check,
            "max_retries": max_retries, "agent_command": [str(FAKES / fake)],
            "timeout_s": timeout_s, **(role or {})}))
        # Outside git only declared modes apply (docs/blueprint.md): declare the executables.
        (bp / "attributes.yaml").write_text(yaml.safe_dump({"files": [
            {"match": "skills/*/bin/*", "mode": "0755"},
            {"match": "runner/bin/*", "mode": "0755"}]}))
        root = base / "root"
        inv = base / "inventory.yaml"
        inv.write_text(yaml.safe_dump({"hosts": {"h1": {
            "transport": "local", "root": str(root),
            "agents": {AGENT: {"role": "tester", "vars": {"channel": "#support"}}}}}}))
        blueprint = load_blueprint(bp, REPO / "templates")
        host = load_inventory(inv, set(blueprint.roles)).hosts[0]
        write_tree(render_host(blueprint, host, with_credentials=False), root / "releases" / "r1")
        precompile_runner(root / "releases" / "r1" / "runner")  # tests/runner_python.py
        os.symlink("releases/r1", root / "current")
        if config:
            path = root / "releases" / "r1" / "agents" / AGENT / "agent.yaml"
            lines = [ln for ln in path.read_text().splitlines()
                     if ln.split(":", 1)[0] not in config]
            os.chmod(path, 0o644)
            path.write_text("\n".join(lines + [f"{k}: {json.dumps(v)}" for k, v in
                                               config.items()]) + "\n")
        fleet = Fleet(root=root, log=base / "fake-agent.log", extra_env=env)
        for rel, text in (workspace_files or {}).items():
            path = fleet.workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return fleet

    return make


def test_a_clean_run_passes_and_is_recorded(make_fleet):
    fleet = make_fleet("clean", check=f"{FAKES / 'badcheck'}")
    fleet.drop("t1", kind="agent", channel=None, text="write hello.py")
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert fleet.where("t1") == ["done"]
    assert (fleet.workspace / "hello.py").read_text() == "print('hello')\n"
    [start] = fleet.events("start")
    # The agent ran in the workspace, in its own process group, with the task in its env.
    assert start["cwd"] == str(fleet.workspace)
    assert start["pgid"] == start["pid"]
    assert start["env"]["FLEET_TASK_ID"] == "t1" and start["env"]["FLEET_RUN_ID"] == "t1/1"
    path = start["env"]["PATH"].split(os.pathsep)  # the call-counting shims, then the skills
    assert path[0].endswith("runs/t1/attempt-1.shims") and path[1].endswith("skills/reply/bin")
    # The prompt: role prompt, skills index from SKILL.md, CLI index, then the task.
    prompt = start["prompt"]
    assert prompt.startswith(ROLE_PROMPT.rstrip())
    skill_md = (REPO / "blueprint" / "skills" / "reply" / "SKILL.md").read_text()
    summary = next(ln.split(":", 1)[1].strip() for ln in skill_md.splitlines()
                   if ln.startswith("summary:"))
    assert f"- reply: {summary}" in prompt
    assert "`reply --help`" in prompt and "`notify --help`" in prompt
    assert "write hello.py" in prompt
    assert "NOT delivered" not in prompt  # an agent's task: no anti-silence instruction
    record = fleet.record("t1", 1)
    assert record["verdict"] == "pass"
    assert {g["name"]: g["status"] for g in record["gates"]} == {
        "run": "pass", "check": "pass", "anti-silence": "skip", "scope": "skip"}
    assert record["changes"]["added"] == ["hello.py"]
    [turn] = fleet.ledger()
    assert turn["task"] == "t1" and turn["attempt"] == 1
    # Exact: fleetctl counted the same components at render (prefix-tokens.json); the count is
    # checked here with the offline encoder on the prompt the agent really received.
    assert turn["token_counter"] == "o200k_base" and turn["tokens_exact"] is True
    from fleetctl.tokencount.offline import load_o200k

    enc, _ = load_o200k()
    sections = prompt.split("\n\n")
    assert turn["prefix_tokens"] == {
        name: len(enc.encode_ordinary(text))
        for name, text in zip(("role_prompt", "skills_index", "cli_index"), sections)}
    assert turn["task_prompt_counter"] == "bytes/4-estimate"
    assert turn["usage"] == {"input_tokens": 120, "output_tokens": 7}
    assert fleet.notices() == [] and fleet.outbox() == []


def test_a_check_error_fails_the_gate_and_the_retry_fixes_it(make_fleet):
    fleet = make_fleet("fix_on_retry", check=f"{FAKES / 'badcheck'} --style dot", max_retries=2)
    fleet.drop("t2", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    starts = fleet.events("start")
    assert [s["attempt"] for s in starts] == ["1", "2"]
    # The second attempt was fed the checker's errors in the files it changed, with paths
    # relative to the workspace, and nothing else (not the checker's summary line).
    assert "verification failed: fix exactly this" in starts[1]["prompt"]
    assert "\n  pkg/mod.py:2:5: E1 BAD marker\n" in starts[1]["prompt"]
    assert "Found 1 errors" not in starts[1]["prompt"]
    check1 = fleet.gate("t2", 1, "check")
    assert check1["status"] == "fail"
    assert check1["details"]["new_errors"] == ["pkg/mod.py:2:5: E1 BAD marker"]
    assert fleet.record("t2", 1)["verdict"] == "fail"
    assert fleet.record("t2", 2)["verdict"] == "pass"
    assert fleet.where("t2") == ["done"]
    assert (fleet.workspace / "pkg" / "mod.py").read_text() == "def f():\n    return 1\n"
    assert fleet.notices() == []


def test_spent_retry_budget_escalates_and_clears_the_task(make_fleet):
    fleet = make_fleet("always_bad", check=str(FAKES / "badcheck"), max_retries=1)
    fleet.drop("t3", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 2  # max_retries 1: two attempts, no more
    assert fleet.where("t3") == ["failed"]
    [notice] = fleet.notices()
    assert notice["task"] == "t3" and notice["kind"] == "gave-up" and notice["failures"] == 2
    assert notice["agent"] == AGENT and notice["via"] == "notify-cli"
    assert "2 failed verification(s)" in notice["reason"]
    assert "pkg/mod.py:2:5: E1 BAD marker" in notice["reason"]  # the last failure, named
    assert "pkg/mod.py:2:5: E1 BAD marker" in notice["detail"]  # and its raw output
    # Cleared: a later runner start does not pick it up again.
    fleet.drop("t3b", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert [s["task"] for s in fleet.events("start")] == ["t3", "t3", "t3b"]
    assert fleet.where("t3") == ["failed"]


def test_errors_only_in_untouched_files_are_existing_debt(make_fleet):
    legacy = "x = 1  # BAD old code\n"
    fleet = make_fleet("clean", check=str(FAKES / "badcheck"),
                       workspace_files={"legacy.py": legacy})
    fleet.drop("t4", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.where("t4") == ["done"]
    check = fleet.gate("t4", 1, "check")
    assert check["status"] == "pass"
    assert check["details"]["exit_status"] == 1  # the checker did fail ...
    col = legacy.index("BAD") + 1
    assert check["details"]["existing_debt"] == [f"legacy.py:1:{col}: E1 BAD marker"]  # ... on debt
    assert check["details"]["new_errors"] == []
    assert "existing debt" in check["summary"]


def test_checker_paths_are_normalised_absolute_and_through_symlinks(make_fleet, tmp_path):
    # The workspace is reached through a symlink; the checker prints resolved absolute paths.
    fleet = make_fleet("always_bad", check=f"{FAKES / 'badcheck'} --style abs",
                       workspace_files={"legacy.py": "BAD = 0\n"})
    real = tmp_path / "real-workspace"
    os.rename(fleet.workspace, real)
    os.symlink(real, fleet.workspace)
    fleet.drop("t5", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("t5", 1, "check")
    assert check["status"] == "fail"
    # Placed in the workspace: listed (and fed back) relative to it.
    assert check["details"]["new_errors"] == ["pkg/mod.py:2:5: E1 BAD marker"]
    assert check["details"]["existing_debt"] == ["legacy.py:1:1: E1 BAD marker"]


def test_unparseable_output_of_a_failing_checker_fails_closed_and_escalates_at_once(make_fleet):
    fleet = make_fleet("clean", check=f"{FAKES / 'badcheck'} --crash", max_retries=2)
    fleet.drop("t6", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    check = fleet.gate("t6", 1, "check")
    assert check["status"] == "fail" and "cannot parse" in check["summary"]
    assert check["details"]["fault"] is True
    assert "KeyError: 'config'" in check["output"]
    assert len(fleet.events("start")) == 1  # no retry: no model run can make it readable
    assert fleet.where("t6") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "check-fault" and "KeyError: 'config'" in notice["detail"]


def test_an_answer_never_sent_fails_anti_silence(make_fleet):
    fleet = make_fleet("silent", max_retries=1)
    fleet.drop("t7", text="What is 6 x 7?")
    assert fleet.run().returncode == 0
    starts = fleet.events("start")
    assert len(starts) == 2
    for start in starts:  # the explicit instruction, with the exact command, every attempt
        assert "Your final text is NOT delivered" in start["prompt"]
        # Pasted into a shell it must still be one reply to #support (unquoted, "#support"
        # started a comment and reply failed for want of a channel).
        line = start["prompt"].split("Send your answer with: ", 1)[1].splitlines()[0]
        out = subprocess.run(["sh", "-c", "printf '%s\\n' " + line], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        assert out == ["reply", "--task", "t7", "--channel", "#support", "YOUR ANSWER"]
    assert "no reply was sent for task t7" in starts[1]["prompt"]  # fed back
    gate = fleet.gate("t7", 2, "anti-silence")
    assert gate["status"] == "fail"
    assert fleet.gate("t7", 2, "run")["status"] == "pass"  # exit 0 and "I have sent it": no proof
    assert fleet.outbox() == []
    assert fleet.where("t7") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "gave-up" and "anti-silence" in notice["reason"]


def test_a_sent_reply_passes_anti_silence(make_fleet):
    fleet = make_fleet("replier")
    fleet.drop("t8", text="What is 6 x 7?", reply_to="m0")
    assert fleet.run().returncode == 0
    [sent] = fleet.outbox()
    assert sent["task"] == "t8" and sent["channel"] == "#support"
    assert sent["text"] == "The answer is 42."
    assert fleet.gate("t8", 1, "anti-silence")["status"] == "pass"
    assert fleet.where("t8") == ["done"]
    sends = [json.loads(ln) for ln in (fleet.state / "sends.jsonl").read_text().splitlines()]
    assert [(s["task"], s["run"], s["message_id"]) for s in sends] == [("t8", "t8/1", sent["id"])]


def test_permission_denied_stops_at_once_without_retry(make_fleet):
    fleet = make_fleet("denied", max_retries=3, timeout_s=30, skills=("reply", "notify", "vault"))
    fleet.drop("t9", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    [start] = fleet.events("start")  # no retry
    assert [e["what"] for e in fleet.events("vault-refused")] == ["vault read secret/prod-db"]
    # The agent meant to carry on for 20 s after the refusal (less than its 30 s limit); the
    # runner ended it first, at the denial. Its log says so, not a clock a busy machine slows.
    assert fleet.events("finished") == [] and not (fleet.workspace / "after.txt").exists()
    assert not _alive(start["pid"])
    record = fleet.record("t9", 1)
    assert record["verdict"] == "denied" and record["invocation"]["stopped"] == "denied"
    assert [d["what"] for d in record["denials"]] == ["vault read secret/prod-db"]
    assert fleet.where("t9") == ["failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "denied" and "vault read secret/prod-db" in notice["reason"]
    assert "403 Forbidden" in notice["reason"] and "Not retried" in notice["reason"]


def test_exit_status_77_of_the_agent_is_a_denial(make_fleet):
    fleet = make_fleet("exit77", max_retries=2)
    fleet.drop("t10", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1
    assert fleet.record("t10", 1)["verdict"] == "denied"
    [notice] = fleet.notices()
    assert notice["kind"] == "denied" and "status 77" in notice["reason"]
    assert "access to the repository was refused" in notice["detail"]


def test_a_hung_agent_times_out_and_its_whole_group_is_gone(make_fleet, tmp_path):
    # The agent hangs for ever: only the timeout ends it, so the run returning proves it. The
    # timeout must come after the agent spawned its child (the child is what the test checks).
    fleet, spawned = timed_out_after_setup(
        lambda base, limit: make_fleet("hang", timeout_s=limit, base=base), "spawned",
        tmp_path, "t11")
    # Both ignored SIGTERM; both are gone (killed and reaped, not zombies).
    assert not _alive(spawned["pid"])
    assert not _alive(spawned["grandchild"])
    invocation = fleet.record("t11", 1)["invocation"]
    assert invocation["timed_out"] is True and invocation["group_gone"] is True
    assert fleet.where("t11") == ["failed"]
    [notice] = fleet.notices()
    assert "timed out" in notice["reason"]


def test_processes_left_behind_by_a_finished_agent_are_killed(make_fleet):
    fleet = make_fleet("leaves_child")
    fleet.drop("t12", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    spawned = fleet.wait_for("spawned", timeout=0)
    assert not _alive(spawned["grandchild"])
    record = fleet.record("t12", 1)
    assert record["invocation"]["leftovers_killed"] is True and record["verdict"] == "pass"


def test_a_crashing_agent_is_retried_then_escalated(make_fleet):
    fleet = make_fleet("crash", max_retries=1)
    fleet.drop("t13", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    starts = fleet.events("start")
    assert len(starts) == 2
    assert "RuntimeError: boom" in starts[1]["prompt"]  # its stderr, fed back
    run_gate = fleet.gate("t13", 2, "run")
    assert run_gate["status"] == "fail" and "exited with status 1" in run_gate["summary"]
    assert fleet.where("t13") == ["failed"]
    [notice] = fleet.notices()
    assert "exited with status 1" in notice["reason"] and "boom" in notice["detail"]


def test_the_inbox_survives_a_killed_runner_nothing_lost_or_doubled(make_fleet):
    fleet = make_fleet("slow", max_retries=2)
    fleet.drop("r1", text="first")
    fleet.drop("r2", text="second")
    runner = fleet.start()
    sleeping = fleet.wait_for("sleeping")
    assert fleet.where("r1") == ["processing"] and fleet.where("r2") == ["inbox"]
    runner.kill()  # SIGKILL: no cleanup at all
    runner.wait()
    assert _alive(sleeping["pid"])  # the agent outlived its runner ...
    done = fleet.run()
    assert done.returncode == 0, done.stderr
    assert not _alive(sleeping["pid"])  # ... until the restarted runner ended its group
    assert fleet.where("r1") == ["done"] and fleet.where("r2") == ["done"]
    assert _names(fleet.state / "inbox") == [] and _names(fleet.state / "processing") == []
    assert sorted(m["task"] for m in fleet.outbox()) == ["r1", "r2"]  # one reply each
    starts = [(s["task"], s["attempt"]) for s in fleet.events("start")]
    assert starts == [("r1", "1"), ("r1", "2"), ("r2", "1")]
    resumed = fleet.events("start")[1]["prompt"]
    assert "was interrupted" in resumed
    assert fleet.record("r1", 1)["verdict"] == "interrupted"
    assert fleet.record("r1", 1)["stale_group_killed"] is True
    assert fleet.record("r1", 2)["verdict"] == "pass"
    turns = [(t["task"], t["attempt"], t["interrupted"]) for t in fleet.ledger()]
    assert turns == [("r1", 1, True), ("r1", 2, False), ("r2", 1, False)]
    # Calls per turn, the cut-short turn's too (it made none before it slept).
    assert [t["calls"] for t in fleet.ledger()] == [{}, {"reply": 1}, {"reply": 1}]


def test_a_task_decided_before_a_crash_is_not_run_again(make_fleet):
    fleet = make_fleet("replier")
    fleet.drop("d1")
    assert fleet.run().returncode == 0
    assert fleet.where("d1") == ["done"]
    # Put the state back as a crash between deciding and moving would leave it.
    [name] = _names(fleet.state / "done")
    os.rename(fleet.state / "done" / name, fleet.state / "processing" / name)
    progress_path = fleet.state / "runs" / "d1" / "progress.json"
    progress = json.loads(progress_path.read_text())
    progress["final"].pop("moved")
    progress_path.write_text(json.dumps(progress))
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1  # not run again
    assert fleet.where("d1") == ["done"] and len(fleet.outbox()) == 1
    # The same id dropped again later is a duplicate: not run, moved to failed/.
    fleet.drop("d1")
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1
    assert fleet.where("d1") == ["done", "failed"]


def test_an_invalid_message_is_set_aside_and_escalated(make_fleet):
    fleet = make_fleet("clean")
    fleet.drop("bad", raw=b'{"id": "bad", "text": "no sender"}')
    fleet.drop("ok", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    assert fleet.where("bad") == ["failed"] and fleet.where("ok") == ["done"]
    [notice] = fleet.notices()
    assert notice["kind"] == "invalid" and "from:" in notice["reason"]
    assert [s["task"] for s in fleet.events("start")] == ["ok"]


def _drop_caps(argv: list[str]) -> list[str]:
    """``argv`` run as root without the capabilities that let root read any file."""
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *argv]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv (to drop the read-anything capabilities)")
def test_an_unreadable_message_stays_in_the_inbox_and_is_retried(make_fleet):
    import pwd
    nobody = pwd.getpwnam("nobody")
    fleet = make_fleet("clean")
    fleet.drop("u1", kind="agent", channel=None)
    [name] = _names(fleet.state / "inbox")
    locked = fleet.state / "inbox" / name
    # As the user trial found it: mode 0600, owned by another user.
    os.chown(locked, nobody.pw_uid, nobody.pw_gid)
    os.chmod(locked, 0o600)
    fleet.drop("u2", kind="agent", channel=None)
    runner = subprocess.Popen(_drop_caps(fleet.argv()), env=fleet.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: fleet.where("u2") == ["done"])
        assert fleet.where("u2") == ["done"]  # the message behind it is not held up
        # Later scans pass it by too: a message dropped after it is taken and done first.
        fleet.drop("u3", kind="agent", channel=None)
        wait_until(lambda: fleet.where("u3") == ["done"])
        assert fleet.where("u3") == ["done"]
        assert fleet.where("u1") == ["inbox"] and locked.exists()  # not moved
        assert fleet.notices() == []  # not escalated as invalid
        os.chmod(locked, 0o644)  # readable now: the next scan takes it
        wait_until(lambda: fleet.where("u1") == ["done"])
        assert runner.poll() is None
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=WAIT_S)
    stderr = runner.stderr.read()
    assert fleet.where("u1") == ["done"]
    lines = [ln for ln in stderr.splitlines() if str(locked) in ln]
    assert len(lines) == 1, stderr  # logged once, not at every scan
    assert "Permission denied" in lines[0]
    assert [s["task"] for s in fleet.events("start")] == ["u2", "u3", "u1"]


def test_a_directory_or_symlink_named_json_is_set_aside_once(make_fleet, tmp_path):
    fleet = make_fleet("clean")
    inbox = fleet.state / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "adir.json").mkdir()
    outside = tmp_path / "outside.json"
    body = json.dumps({"id": "outside", "from": {"kind": "agent", "name": "x"}, "text": "hi"})
    outside.write_text(body)
    os.symlink(outside, inbox / "alink.json")
    fleet.drop("ok", kind="agent", channel=None)
    first = fleet.run()
    assert first.returncode == 0, first.stderr
    assert fleet.where("ok") == ["done"]
    assert _names(fleet.state / "inbox") == []
    failed = fleet.state / "failed"
    assert (failed / "adir.json").is_dir() and (failed / "alink.json").is_symlink()
    assert outside.read_text() == body  # the link was not followed, its target left alone
    assert [s["task"] for s in fleet.events("start")] == ["ok"]
    notices = sorted(fleet.notices(), key=lambda n: n["task"])
    assert [(n["kind"], n["task"]) for n in notices] == [("invalid", "adir"), ("invalid", "alink")]
    assert "directory" in notices[0]["reason"] and "symlink" in notices[1]["reason"]
    assert sum("adir.json" in ln for ln in first.stderr.splitlines()) == 1
    assert sum("alink.json" in ln for ln in first.stderr.splitlines()) == 1
    again = fleet.run()
    assert again.returncode == 0 and len(fleet.notices()) == 2  # escalated once only


def test_a_reused_id_from_a_person_is_escalated_not_dropped(make_fleet):
    fleet = make_fleet("replier")
    fleet.drop("h1", text="First question?")
    assert fleet.run().returncode == 0
    fleet.drop("h1", text="A new question under the same id?")
    assert fleet.run().returncode == 0
    assert len(fleet.events("start")) == 1  # not run again
    assert fleet.where("h1") == ["done", "failed"]
    [notice] = fleet.notices()
    assert notice["kind"] == "duplicate" and notice["task"] == "h1"
    assert "h1" in notice["reason"] and "#support" in notice["reason"]
    assert notice["detail"] == "A new question under the same id?"


def test_a_reused_id_from_an_agent_is_only_set_aside(make_fleet):
    fleet = make_fleet("clean")
    fleet.drop("g1", kind="agent", channel=None)
    assert fleet.run().returncode == 0
    fleet.drop("g1", kind="agent", channel=None)
    done = fleet.run()
    assert done.returncode == 0
    assert fleet.where("g1") == ["done", "failed"] and fleet.notices() == []
    assert "duplicate" in done.stderr


def test_sigterm_ends_the_attempt_and_keeps_the_task(make_fleet):
    fleet = make_fleet("slow", max_retries=1)
    fleet.drop("s1")
    runner = fleet.start()
    sleeping = fleet.wait_for("sleeping")
    second = subprocess.run(fleet.argv("--once"), env=fleet.env(), capture_output=True,
                            text=True, timeout=WAIT_S)
    assert second.returncode == 3 and "another runner" in second.stderr  # one runner per agent
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=WAIT_S) == 0
    assert not _alive(sleeping["pid"])
    assert fleet.where("s1") == ["processing"]  # kept for the next start, not lost
    assert fleet.run().returncode == 0
    assert fleet.where("s1") == ["done"] and len(fleet.outbox()) == 1


def test_a_switched_release_is_picked_up_between_tasks(make_fleet, tmp_path):
    fleet = make_fleet("clean")
    fleet.drop("v1", kind="agent", channel=None)
    # stderr to a file, read while the runner serves: the test waits for its restart line.
    stderr_path = tmp_path / "runner.stderr"
    with open(stderr_path, "w") as stderr:
        runner = subprocess.Popen(fleet.argv(), env=fleet.env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        wait_until(lambda: fleet.where("v1") == ["done"])
        # A ship: a new release beside the old one, then current switched by rename.
        shutil.copytree(fleet.root / "releases" / "r1", fleet.root / "releases" / "r2",
                        symlinks=True)
        os.symlink("releases/r2", fleet.root / "current.tmp")
        os.rename(fleet.root / "current.tmp", fleet.root / "current")
        # Idle: the runner notices and execs the new release's runner before v2 is dropped.
        wait_until(lambda: "restarting into it" in stderr_path.read_text())
        fleet.drop("v2", kind="agent", channel=None)
        wait_until(lambda: fleet.where("v2") == ["done"])
        assert runner.poll() is None  # the same process (exec keeps the pid), still serving
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=60)
    assert fleet.record("v1", 1)["release"] == str(fleet.root / "releases" / "r1")
    assert fleet.record("v2", 1)["release"] == str(fleet.root / "releases" / "r2")


def test_a_switched_release_is_picked_up_under_steady_load(make_fleet):
    fleet = make_fleet("waits")
    fleet.drop("w1", kind="agent", channel=None)
    fleet.drop("w2", kind="agent", channel=None)
    runner = fleet.start()
    try:
        assert fleet.wait_for("start")["task"] == "w1"
        # Ship while w1 runs and w2 waits: the inbox is never empty when w1 is decided.
        shutil.copytree(fleet.root / "releases" / "r1", fleet.root / "releases" / "r2",
                        symlinks=True)
        os.symlink("releases/r2", fleet.root / "current.tmp")
        os.rename(fleet.root / "current.tmp", fleet.root / "current")
        Path(str(fleet.log) + ".go").touch()
        wait_until(lambda: fleet.where("w2") == ["done"])
        assert fleet.where("w2") == ["done"]
        assert runner.poll() is None  # the same process (exec keeps the pid), still serving
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=WAIT_S)
    lines = runner.stderr.read().splitlines()

    def first(text: str) -> int:
        return next(i for i, ln in enumerate(lines) if text in ln)

    # The restart comes between the two tasks, not only once the inbox is empty.
    assert first("task w1 attempt 1/1: pass") < first("restarting into it") \
        < first("task w2 attempt 1/1")
    assert fleet.record("w1", 1)["release"] == str(fleet.root / "releases" / "r1")
    assert fleet.record("w2", 1)["release"] == str(fleet.root / "releases" / "r2")


RUN_RECORD_KEYS = {"schema_version", "agent", "task", "from", "attempt", "max_attempts", "run",
                   "release", "started", "finished", "verdict", "durations", "invocation",
                   "changes", "change_counts", "gates", "failed_gates", "denials", "files",
                   "stale_group_killed", "note", "check_leftovers", "scope_request"}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_every_run_record_has_the_documented_keys(make_fleet, how):
    doc = (REPO / "docs" / "runner.md").read_text()
    paragraph = doc[doc.index("**Run record**"):].split("\n\n")[0]
    for key in RUN_RECORD_KEYS - {"schema_version"}:
        assert f"`{key}`" in paragraph, key
    fleet = make_fleet("slow", max_retries=1)
    fleet.drop("k1")  # from a person: the slow agent's reply passes anti-silence
    runner = fleet.start()
    fleet.wait_for("sleeping")
    if how == "SIGKILL":
        runner.kill()  # the runner dies: the next start records the attempt
    else:
        runner.send_signal(signal.SIGTERM)  # the runner ends the attempt and records it
    runner.wait(timeout=WAIT_S)
    assert fleet.run().returncode == 0
    interrupted, passed = fleet.record("k1", 1), fleet.record("k1", 2)
    assert interrupted["verdict"] == "interrupted" and passed["verdict"] == "pass"
    assert set(interrupted) == RUN_RECORD_KEYS and set(passed) == RUN_RECORD_KEYS
    assert interrupted["from"] == {"kind": "human", "name": "alice"}
    assert interrupted["max_attempts"] == 2 and interrupted["finished"] is None
    assert interrupted["changes"] == {} and interrupted["change_counts"] == {}
    assert interrupted["denials"] == [] and interrupted["gates"] == []
    assert interrupted["files"] == {"prompt": "attempt-1.prompt.txt",
                                    "stdout": "attempt-1.stdout", "stderr": "attempt-1.stderr"}
    assert (fleet.state / "runs" / "k1" / "attempt-1.prompt.txt").is_file()
    assert interrupted["durations"]["gates_s"] is None
    if how == "SIGKILL":
        assert interrupted["invocation"] is None and interrupted["durations"]["agent_s"] is None
    else:
        assert interrupted["invocation"]["stopped"] == "shutdown"
        assert interrupted["durations"]["agent_s"] > 0
    assert passed["stale_group_killed"] is False and passed["note"] is None


def test_show_prefix_prints_the_components_and_exact_counts(make_fleet):
    fleet = make_fleet("clean")
    done = subprocess.run(fleet.argv("--show-prefix"), env=fleet.env(), capture_output=True,
                          text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["token_counter"] == "o200k_base" and shown["tokens_exact"] is True
    assert shown["text"] == "\n\n".join(v for v in shown["components"].values() if v)
    assert shown["tokens_total"] == sum(shown["tokens"].values())


def test_a_prefix_that_differs_from_what_fleetctl_counted_is_only_estimated(make_fleet):
    """A hand-edited SKILL.md on the host changes the skills index: fleetctl's counts no longer
    describe it, so the runner falls back to its labelled estimate for every component."""
    fleet = make_fleet("clean")
    skill_md = fleet.root / "current" / "skills" / "reply" / "SKILL.md"
    os.chmod(skill_md, 0o644)
    skill_md.write_text(skill_md.read_text().replace("summary:", "summary: (patched)", 1))
    done = subprocess.run(fleet.argv("--show-prefix"), env=fleet.env(), capture_output=True,
                          text=True, timeout=WAIT_S)
    shown = json.loads(done.stdout)
    assert shown["token_counter"] == "bytes/4-estimate" and shown["tokens_exact"] is False
    assert shown["tokens"] == {name: -(-len(text.encode()) // 4)
                               for name, text in shown["components"].items()}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
