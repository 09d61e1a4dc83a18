"""Ship installs, updates, removes and restarts the runners' systemd units (``service: systemd``).

systemd cannot run in this sandbox: PID 1 is not systemd, so a real ``systemctl`` has nothing to
talk to. Each test therefore puts a scripted stand-in in its place through the inventory's
``systemctl:`` key: a small executable written into the test's temporary directory that appends
one JSON line per call to a log (its arguments, the ``fleet-runner-*.service`` files in the unit
directory at that moment, and where ``current`` points) and exits 0, or, for the one command a
test chooses, prints a message on stderr and exits with a chosen status. The unit files are
written for real into a temporary ``systemd_unit_dir``.

Every expectation is computed here, independently of fleetctl: the unit text is written out by
hand from the template's lines, the systemctl calls as literal lists, file modes and inodes by
``os.stat``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import (build_tree, cli, git, local_host, make_project, snapshot, ssh_host,
                           write_inventory)
from tests.runner.test_runner_clis import open_base  # noqa: F401  (a fixture)
from tests.runner.test_runner_users import setpriv_caps

UNIT_TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "fleet-runner.service.j2"
U1, U2 = "fleet-runner-a1.service", "fleet-runner-a2.service"
ROLES = {"worker": {"prompt": "work"}, "helper": {"prompt": "help"}}


# Real users of this machine, one per agent, created once for the module (a systemd host needs
# user: for every agent, and ship creates missing ones).
# Unique per test process: two pytest processes (xdist workers, two checkouts) on one machine
# must not share, or delete, each other's accounts.
_TAG = secrets.token_hex(3)
USERS = {"a1": f"fltsvc{_TAG}-a1", "a2": f"fltsvc{_TAG}-a2"}


@pytest.fixture(scope="module", autouse=True)
def agent_users():
    for name in USERS.values():
        subprocess.run(["useradd", "--user-group", "--create-home", "--shell", "/bin/sh", name],
                       check=True, capture_output=True)
    yield USERS
    for name in USERS.values():
        subprocess.run(["userdel", "-r", name], capture_output=True)


def expected_unit(agent: str, role: str, host: str, root: str) -> bytes:
    """The unit templates/fleet-runner.service.j2 must render to, written out by hand."""
    state, workspace = f"{root}/state/{agent}", f"{root}/workspace/{agent}"
    user = USERS[agent]
    return f"""\
# Rendered by fleetctl for agent {agent} on host {host}; the next ship overwrites edits.
# One runner per agent: fleet-runner-{agent}.service in the host's systemd_unit_dir (docs/runner.md).
[Unit]
Description=fleet runner for agent {agent} (role {role}) on {host}
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
Type=simple
# Two users (docs/runner.md, "The two users"): the runner runs as root and starts the agent
# command, its checks and git as the agent's own user ({user}, --agent-user), so the
# agent cannot write the runner's state, records, ledger or evidence.
User=root
Group=root
# Root, but with only the capabilities the runner uses: start the agent's processes as its
# user (SETUID, SETGID), give it its directories in the state (CHOWN, FOWNER), read, snapshot
# and restore its workspace (DAC_OVERRIDE), end its processes (KILL), and
# check which process sends through the evidence socket (SYS_PTRACE: /proc/PID/exe of another
# user's process). The ExecStartPre= lines ("+") are not bound by it.
CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL CAP_SETGID CAP_SETUID CAP_SYS_PTRACE
Environment="FLEET_ROOT={root}"
Environment=PYTHONDONTWRITEBYTECODE=1
UMask=0077
# The agent's HOME and workspace are its own (0700); the state directory is root's (0700: the
# runner opens it to 0711 and gives the agent its own directories in it). Both live outside
# the release tree. "+" runs these lines with full privileges; "-" lets the working directory
# be missing until they have run.
ExecStartPre=+/usr/bin/install -d -m 0700 -o {user} -g {user} "/home/{user}" "{workspace}"
ExecStartPre=+/usr/bin/install -d -m 0700 -o root -g root "{state}"
WorkingDirectory=-{workspace}
ExecStart="{root}/current/runner/bin/fleet-runner" --agent {agent} --root "{root}" --state-dir "{state}" --workspace "{workspace}" --agent-user {user}
# Restart after a crash; not after exit 2 (broken config or release: a restart cannot help)
# or exit 3 (another runner already serves this agent).
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=2 3
# Stop: SIGTERM to the runner (it ends the running attempt's process group and keeps the task
# in processing/ for the next start), then SIGKILL to everything left in the unit's cgroup,
# including processes that left the runner's process groups with setsid().
KillMode=control-group
KillSignal=SIGTERM
TimeoutStopSec=30
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full

[Install]
WantedBy=multi-user.target
""".encode()


FAKE = """#!{python}
# Stands in for systemctl (PID 1 is not systemd here): logs each call, exits 0 or as told.
import json, os, sys
unit_dir, root, log, rule = {unit_dir!r}, {root!r}, {log!r}, {rule!r}
try:
    units = sorted(n for n in os.listdir(unit_dir)
                   if n.startswith("fleet-runner-") and n.endswith(".service"))
except OSError:
    units = None
try:
    current = os.readlink(os.path.join(root, "current"))
except OSError:
    current = None
with open(log, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "units": units, "current": current}}) + "\\n")
if os.path.exists(rule):
    with open(rule) as fh:
        fail = json.load(fh)
    if fail["argv"] == sys.argv[1:]:
        sys.stderr.write(fail["stderr"])
        sys.exit(fail["status"])
"""


class FakeSystemctl:
    """The stand-in executable, its log and its failure rule."""

    def __init__(self, base: Path, unit_dir: Path, root: Path) -> None:
        self.path = base / "fake-systemctl"
        self.log = base / "systemctl.log"
        self.rule = base / "systemctl.fail.json"
        self.path.write_text(FAKE.format(python=sys.executable, unit_dir=str(unit_dir),
                                         root=str(root), log=str(self.log), rule=str(self.rule)))
        os.chmod(self.path, 0o755)

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def calls(self) -> list[list[str]]:
        return [r["argv"] for r in self.records()]

    def clear(self) -> None:
        if self.log.exists():
            self.log.unlink()

    def fail(self, argv: list[str], status: int, stderr: str) -> None:
        self.rule.write_text(json.dumps({"argv": argv, "status": status, "stderr": stderr}))

    def heal(self) -> None:
        self.rule.unlink()


class Box:
    """A blueprint, a local host and its unit directory, driven through the CLI."""

    def __init__(self, tmp_path: Path, service: str | None = "systemd",
                 agents: dict | None = None) -> None:
        self.base = tmp_path
        self.bp = make_project(tmp_path, {"runner": {"run.sh": "#!/bin/sh\necho run\n"}},
                               roles=ROLES)
        shutil.copy(UNIT_TEMPLATE, tmp_path / "templates" / UNIT_TEMPLATE.name)
        git(self.bp, "add", "-A")
        git(self.bp, "commit", "-q", "-m", "unit template")
        self.root = tmp_path / "box"
        self.unit_dir = tmp_path / "units"
        self.unit_dir.mkdir()
        self.fake = FakeSystemctl(tmp_path, self.unit_dir, self.root)
        self.inv = tmp_path / "inv.yaml"
        self.configure(service, agents)

    def configure(self, service: str | None = "systemd", agents: dict | None = None,
                  unit_dir: Path | None = None) -> None:
        extra = {"systemd_unit_dir": str(unit_dir or self.unit_dir),
                 "systemctl": str(self.fake.path)}
        if service is not None:
            extra["service"] = service
        agents = agents if agents is not None else {"a1": {"role": "worker", "user": USERS["a1"]},
                                                    "a2": {"role": "worker", "user": USERS["a2"]}}
        write_inventory(self.inv, {"h": local_host(self.root, agents, **extra)})

    def ship(self, *extra: str):
        return cli("ship", "--yes", "--format", "json", *extra, inventory=self.inv,
                   blueprint=self.bp)

    def unit(self, name: str) -> Path:
        return self.unit_dir / name

    def units(self) -> set[str]:
        return set(os.listdir(self.unit_dir))

    def release(self) -> str:
        return os.path.basename(os.readlink(self.root / "current"))

    def change_blueprint(self) -> None:
        build_tree(self.bp, {"runner": {"run.sh": "#!/bin/sh\necho run again\n"}})
        git(self.bp, "add", "-A")
        git(self.bp, "commit", "-q", "-m", "change")


def enable_restart(*units: str) -> list[list[str]]:
    return [call for u in units for call in (["enable", u], ["restart", u])]


def enable_start(*units: str) -> list[list[str]]:
    return [call for u in units for call in (["enable", u], ["start", u])]


def identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path)
    first = b.ship()
    assert first.code == 0, first.stdout + first.stderr
    b.fake.clear()
    return b


def test_first_ship_installs_one_unit_per_agent_then_reloads_enables_and_restarts(tmp_path):
    b = Box(tmp_path)
    run = b.ship()
    assert run.code == 0, run.stdout + run.stderr
    host = run.host("h")
    assert host["status"] == "shipped"
    root = str(b.root.resolve())
    assert b.units() == {U1, U2}
    for agent, name in (("a1", U1), ("a2", U2)):
        st = os.lstat(b.unit(name))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert b.unit(name).read_bytes() == expected_unit(agent, "worker", "h", root)
    assert b.fake.calls() == [["daemon-reload"], *enable_restart(U1, U2)]
    # After the switch (every call saw the new release in use), with both files in place.
    release = host["release"]
    assert all(r["current"] == f"releases/{release}" for r in b.fake.records())
    assert all(r["units"] == [U1, U2] for r in b.fake.records())
    assert host["services"] == {"installed": [U1, U2], "removed": [], "restarted": [U1, U2],
                                "started": []}
    # Units are not part of the release tree, and so not of drift.
    assert not any(b"service" in path for path in snapshot(b.root / "current"))
    drift = cli("drift", "--format", "json", inventory=b.inv, blueprint=b.bp)
    assert drift.code == 0 and "services" not in drift.host("h")


def test_a_second_ship_without_changes_rewrites_nothing_and_starts_without_restarting(box):
    before_units = {n: identity(box.unit(n)) for n in (U1, U2)}
    before_root = snapshot(box.root)
    run = cli("ship", "--yes", inventory=box.inv, blueprint=box.bp)  # text output
    assert run.code == 0, run.stdout + run.stderr
    assert f"h: nothing to ship; release {box.release()} already matches; units: started " \
        f"{U1}, {U2}" in run.stdout
    assert {n: identity(box.unit(n)) for n in (U1, U2)} == before_units
    assert snapshot(box.root) == before_root
    # No daemon-reload and no restart: running runners are not interrupted.
    assert box.fake.calls() == enable_start(U1, U2)
    box.fake.clear()
    again = box.ship()
    assert again.host("h")["status"] == "no-op"
    assert again.host("h")["services"] == {"installed": [], "removed": [], "restarted": [],
                                           "started": [U1, U2]}


def test_removing_an_agent_disables_stops_and_deletes_its_unit(box):
    box.configure(agents={"a1": {"role": "worker", "user": USERS["a1"]}})
    run = box.ship()
    assert run.code == 0, run.stdout + run.stderr
    assert box.units() == {U1}
    assert box.fake.calls() == [["disable", "--now", U2], ["daemon-reload"], *enable_restart(U1)]
    records = box.fake.records()
    assert records[0]["units"] == [U1, U2]  # disabled while its file still existed
    assert records[1]["units"] == [U1]  # the reload comes after the file is gone
    assert run.host("h")["services"] == {"installed": [], "removed": [U2], "restarted": [U1],
                                         "started": []}


def test_a_role_change_rewrites_only_that_unit(box):
    u1_before = identity(box.unit(U1))
    u2_before = box.unit(U2).read_bytes()
    box.configure(agents={"a1": {"role": "worker", "user": USERS["a1"]}, "a2": {"role": "helper", "user": USERS["a2"]}})
    units_before = snapshot(box.unit_dir)
    dry = box.ship("--dry-run")
    assert dry.code == 0 and dry.host("h")["status"] == "dry-run"
    assert dry.host("h")["services"] == {"installed": [U2], "removed": [], "restarted": [U1, U2],
                                         "started": []}
    assert snapshot(box.unit_dir) == units_before and box.fake.calls() == []  # read-only
    run = box.ship()
    assert run.code == 0, run.stdout + run.stderr
    assert identity(box.unit(U1)) == u1_before
    root = str(box.root.resolve())
    assert box.unit(U2).read_bytes() == expected_unit("a2", "helper", "h", root) != u2_before
    assert box.fake.calls() == [["daemon-reload"], *enable_restart(U1, U2)]
    assert run.host("h")["services"]["installed"] == [U2]
    assert not [n for n in os.listdir(box.unit_dir) if n.startswith(".")]  # no temporary left


def test_a_failing_systemctl_is_an_error_at_services_with_the_new_release_in_use(box):
    previous = box.release()
    box.change_blueprint()
    stderr = ("Job for fleet-runner-a1.service failed because the control process exited with "
              "error code.\nSee \"systemctl status fleet-runner-a1.service\" and "
              "\"journalctl -xeu fleet-runner-a1.service\" for details.\n")
    box.fake.fail(["restart", U1], 1, stderr)
    run = box.ship()
    assert run.code == 2
    host = run.host("h")
    assert host["status"] == "error" and host["step"] == "services"
    assert host["release"] == box.release() != previous and host["previous"] == previous
    assert "systemctl restart fleet-runner-a1.service exited with status 1" in host["error"]
    assert "journalctl -xeu fleet-runner-a1.service" in host["error"]  # the stderr tail
    assert "in use" in host["hint"] and box.release() in host["hint"]
    # The other unit was still handled; nothing was pruned after the failure.
    assert box.fake.calls() == enable_restart(U1, U2)
    assert host["services"] == {"installed": [], "removed": [], "restarted": [U2],
                                "started": []}
    assert sorted(os.listdir(box.root / "releases")) == sorted([previous, box.release()])
    # Once the cause is fixed, a ship with nothing to change starts the unit again.
    box.fake.heal()
    box.fake.clear()
    again = box.ship()
    assert again.code == 0 and again.host("h")["status"] == "no-op"
    assert box.fake.calls() == enable_start(U1, U2)


def test_a_failure_is_named_in_the_text_summary(box):
    box.change_blueprint()
    box.fake.fail(["daemon-reload"], 1, "Failed to reload daemon: Access denied\n")
    box.unit(U1).write_text("edited on the host\n")
    run = cli("ship", "--yes", inventory=box.inv, blueprint=box.bp)
    assert run.code == 2
    assert ("h: error [stopped at services]: " in run.stdout
            and "systemctl daemon-reload exited with status 1: Failed to reload daemon: Access "
                "denied" in run.stdout)
    assert box.fake.calls() == [["daemon-reload"]]  # nothing enabled or restarted on stale units


def test_turning_systemd_on_installs_units_on_a_ship_with_nothing_else_to_do(tmp_path):
    b = Box(tmp_path, service=None)
    assert b.ship().code == 0
    releases = os.listdir(b.root / "releases")
    b.configure(service="systemd")
    dry = b.ship("--dry-run")
    assert dry.code == 0 and dry.host("h")["status"] == "no-op"
    assert dry.host("h")["services"] == {"installed": [U1, U2], "removed": [],
                                         "restarted": [U1, U2], "started": []}
    text = cli("ship", "--dry-run", inventory=b.inv, blueprint=b.bp)
    assert f"units: would install {U1}, {U2}; would restart {U1}, {U2}" in text.stdout
    assert b.units() == set() and b.fake.calls() == []
    run = b.ship()
    assert run.code == 0 and run.host("h")["status"] == "no-op"
    assert b.units() == {U1, U2}
    assert b.fake.calls() == [["daemon-reload"], *enable_restart(U1, U2)]
    assert os.listdir(b.root / "releases") == releases  # no new release


def test_a_no_op_ship_repairs_edited_units_and_removes_stray_ones(box):
    box.unit(U1).write_text("edited on the host\n")
    os.chmod(box.unit(U2), 0o600)
    box.unit("fleet-runner-old.service").write_text("[Service]\n")
    box.unit("other.service").write_text("not fleetctl's\n")
    run = box.ship()
    assert run.code == 0 and run.host("h")["status"] == "no-op"
    root = str(box.root.resolve())
    assert box.unit(U1).read_bytes() == expected_unit("a1", "worker", "h", root)
    assert stat.S_IMODE(os.stat(box.unit(U2)).st_mode) == 0o644
    assert box.units() == {U1, U2, "other.service"}
    assert box.fake.calls() == [["disable", "--now", "fleet-runner-old.service"],
                                ["daemon-reload"], *enable_restart(U1, U2)]


def test_service_none_writes_no_unit_and_runs_no_systemctl(tmp_path):
    b = Box(tmp_path, service=None)  # the default, with a unit dir and systemctl configured
    before = snapshot(b.unit_dir), os.stat(b.unit_dir).st_mtime_ns
    assert b.ship("--dry-run").code == 0
    run = b.ship()
    assert run.code == 0 and run.host("h")["services"] is None
    b.change_blueprint()
    assert b.ship().host("h")["status"] == "shipped"
    assert b.ship().host("h")["status"] == "no-op"
    assert (snapshot(b.unit_dir), os.stat(b.unit_dir).st_mtime_ns) == before
    assert not b.fake.log.exists()


def test_a_missing_unit_dir_stops_before_the_switch(box):
    previous = box.release()
    box.change_blueprint()
    box.configure(unit_dir=box.base / "no-such-dir")
    dry = box.ship("--dry-run")
    assert dry.code == 2 and dry.host("h")["step"] == "prepare"
    run = box.ship()
    assert run.code == 2
    host = run.host("h")
    assert host["status"] == "error" and host["step"] == "prepare"
    assert "the unit directory" in host["error"] and "no-such-dir" in host["error"]
    assert box.release() == previous and os.listdir(box.root / "releases") == [previous]
    assert box.fake.calls() == []


def test_a_root_systemd_would_misread_is_refused_before_the_host_is_touched(tmp_path):
    b = Box(tmp_path)
    b.root = tmp_path / "my box"
    b.configure()
    run = b.ship()
    assert run.code == 2
    assert "cannot go into a systemd unit" in run.host("h")["error"]
    assert not b.root.exists() and b.units() == set() and b.fake.calls() == []


@pytest.mark.parametrize("body, line, problem", [
    ("hosts:\n  h:\n    root: /r\n    service: upstart\n", 4,
     "hosts.h.service: input should be 'none' or 'systemd'"),
    ("hosts:\n  h:\n    root: /r\n    service: systemd\n    systemd_unit_dir: etc/systemd\n", 5,
     "hosts.h.systemd_unit_dir: value error, must be an absolute path on the host, "
     "got 'etc/systemd'"),
    ("defaults:\n  systemd_unit_dir: units\nhosts:\n  h: {root: /r}\n", 2,
     "defaults.systemd_unit_dir: value error, must be an absolute path on the host, "
     "got 'units'"),
    ("hosts:\n  h:\n    root: /r\n    systemctl: sudo systemctl\n", 4,
     "hosts.h.systemctl: string should match pattern"),
])
def test_bad_service_settings_are_input_errors_with_file_line_and_key(tmp_path, body, line,
                                                                      problem):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = tmp_path / "inv.yaml"
    inv.write_text(body)
    assert yaml.safe_load(body)  # the test's own YAML is valid
    run = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert run.code == 2
    assert f"inv.yaml:{line}: {problem}" in run.stderr


def test_ship_over_ssh_installs_and_restarts_units(tmp_path, sshd_pool, ssh_client_key,
                                                  ssh_known_hosts):
    b = Box(tmp_path)
    write_inventory(b.inv, {"web1": ssh_host(
        sshd_pool[0], ssh_client_key, ssh_known_hosts, b.root,
        agents={"a1": {"role": "worker", "user": USERS["a1"]}, "a2": {"role": "worker", "user": USERS["a2"]}}, service="systemd",
        systemd_unit_dir=str(b.unit_dir), systemctl=str(b.fake.path))})
    run = b.ship()
    assert run.code == 0, run.stdout + run.stderr
    assert run.host("web1")["status"] == "shipped"
    for agent, name in (("a1", U1), ("a2", U2)):
        assert b.unit(name).read_bytes() == expected_unit(agent, "worker", "web1", str(b.root))
        assert stat.S_IMODE(os.stat(b.unit(name)).st_mode) == 0o644
    assert b.fake.calls() == [["daemon-reload"], *enable_restart(U1, U2)]


def test_on_a_terminal_unit_files_are_confirmed_and_starting_units_is_not(tmp_path):
    """At a terminal, unit files to write are a change to confirm even when the tree has none;
    a host with nothing at all to change is shipped without a question (enable and start only)."""
    from tests.commands.test_cli_behaviour import _run_in_pty

    b = Box(tmp_path, service=None)
    assert b.ship().code == 0
    b.configure(service="systemd")
    exe = str(Path(sys.executable).parent / "fleetctl")
    argv = [exe, "ship", "--inventory", str(b.inv), "--blueprint", str(b.bp)]
    status, out = _run_in_pty(argv, b"y", tmp_path)
    assert status == 0, out.decode(errors="replace")
    assert b"Ship 0 change(s) and 2 runner unit file change(s) to 1 host(s)?" in out
    assert b.units() == {U1, U2}
    assert b.fake.calls() == [["daemon-reload"], *enable_restart(U1, U2)]
    b.fake.clear()
    status, out = _run_in_pty(argv, b"n", tmp_path)
    assert status == 0, out.decode(errors="replace")
    assert b"[y/N]" not in out
    assert b.fake.calls() == enable_start(U1, U2)


def test_the_unit_run_as_systemd_would_serves_with_two_users(open_base):
    """The shipped unit's own lines, run the way systemd runs them (PID 1 is not systemd here:
    Environment= lines, ExecStartPre= with full privileges, ExecStart= as User=root in
    WorkingDirectory= with UMask=0077, its CapabilityBoundingSet= and NoNewPrivileges=, through
    util-linux's setpriv), on a host whose state a one-user runner left owned by
    the agent's user: the repository's runner serves a person's message, the agent runs as
    its own user, and the state ends up the runner's, out of the agent's reach."""
    import pwd
    import shlex

    from tests.tokens.test_tokens_live_runner import _blueprint, _drop

    user = pwd.getpwnam(USERS["a1"])
    agent_ids = (user.pw_uid, user.pw_gid)
    bp = _blueprint(open_base)  # the real runner, reply and notify; a fake agent that replies
    # The agent's user cannot run this venv's interpreter (under /root): a plain python3 (the
    # fake is outside the blueprint, so the checkout stays clean).
    fake_agent = open_base / "fake-agent"
    body = fake_agent.read_text().split("\n", 1)[1]
    fake_agent.write_text("#!/usr/bin/env python3\n" + body)
    root, unit_dir = open_base / "root", open_base / "units"
    unit_dir.mkdir()
    fake = FakeSystemctl(open_base, unit_dir, root)
    inv = write_inventory(open_base / "inv.yaml", {"h": local_host(
        root, {"a1": {"role": "tester", "user": user.pw_name, "vars": {"channel": "#support"}}},
        service="systemd", systemd_unit_dir=str(unit_dir), systemctl=str(fake.path))})
    shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    lines = [ln.split("=", 1) for ln in (unit_dir / U1).read_text().splitlines()
             if "=" in ln and not ln.startswith("#")]
    assert ["User", "root"] in lines and ["UMask", "0077"] in lines
    env = {"PATH": os.environ["PATH"]}
    for key, value in lines:
        if key == "Environment":
            name, _, val = shlex.split(value)[0].partition("=")
            env[name] = val

    state = root / "state" / "a1"
    (state / "runs").mkdir(parents=True)  # left by the one-user unit: the agent's
    (state / "ledger.jsonl").write_text("")
    for path in (state, state / "runs", state / "ledger.jsonl"):
        os.chown(path, *agent_ids)
    for key, value in lines:
        if key == "ExecStartPre":
            assert value.startswith("+")  # full privileges, as root
            subprocess.run(shlex.split(value[1:]), check=True, timeout=30)
    workspace = root / "workspace" / "a1"
    assert (os.stat(workspace).st_uid, stat.S_IMODE(os.stat(workspace).st_mode)) == \
        (user.pw_uid, 0o700)
    _drop(state, "m1", "Please reply 1 times.")
    log = open_base / "fake.log"
    log.touch()
    os.chown(log, *agent_ids)
    [start] = [shlex.split(v) for k, v in lines if k == "ExecStart"]
    [workdir] = [v.lstrip("-") for k, v in lines if k == "WorkingDirectory"]
    # The unit's capability bounding set, applied as systemd applies it: root keeps only those.
    [bounding] = [v.split() for k, v in lines if k == "CapabilityBoundingSet"]
    keep = setpriv_caps(bounding)
    start = ["setpriv", f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--no-new-privs",
             "--", *start]
    umask = os.umask(0o077)
    try:
        done = subprocess.run([*start, "--once", "--poll-s", "0.1"], cwd=workdir,
                              env={**env, "FAKE_AGENT_LOG": str(log)}, capture_output=True,
                              text=True, timeout=180, stdin=subprocess.DEVNULL)
    finally:
        os.umask(umask)
    assert done.returncode == 0, done.stderr
    result = json.loads((state / "runs" / "m1" / "result.json").read_text())
    assert result["outcome"] == "pass", result
    # The reply was written by the agent's user, and counted through the runner's socket.
    [sent] = [p for p in (state / "outbox").iterdir() if p.suffix == ".json"]
    assert os.stat(sent).st_uid == user.pw_uid
    [send] = [json.loads(ln) for ln in (state / "sends.jsonl").read_text().splitlines()]
    assert send["via"] == "runner" and send["outbox_file"] == sent.name
    # The runner's state is root's and not writable by the agent, the old files included.
    st = os.stat(state)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711)
    for path in (state / "runs", state / "ledger.jsonl", state / "sends.jsonl",
                 state / "runs" / "m1" / "result.json"):
        st = os.lstat(path)
        assert st.st_uid == 0 and not st.st_mode & 0o022, path
