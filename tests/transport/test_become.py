"""Deploying through a non-root login (issue 11): ``become: sudo`` runs the host-side program as
``sudo -n -- /usr/bin/python3 -c BOOTSTRAP``; with the one sudoers entry the docs give, a
``deploy`` login ships (agents' users created as root, files owned right); without it, or when
sudo wants a password, the host stops with an error naming it and the sudoers entry, exit 2,
nothing written.

Everything real: a real login user on a real sshd box, real sudo (Debian's, installed by
``scripts/setup.sh --test``) reading a real drop-in file in /etc/sudoers.d (removed afterwards),
real agent users created by the ship. The sudoers line is built here from ``BOOTSTRAP`` with
sudoers' escaping rules, independently of fleetctl's own helper, and checked with ``visudo``.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import cli, make_project, snapshot, ssh_host, sudoers_args, write_inventory
from tests.sshd_boxes import write_known_hosts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/sudo") or not shutil.which("visudo"),
    reason="needs root and sudo (scripts/setup.sh --test installs it)")

TOKEN_CAP = {
    "capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
    "tok.env.j2": "TOKEN={{ secret }}\n",
}


@pytest.fixture
def deploy(login_user):
    """The deploy user's name (tests/conftest.py login_user)."""
    return login_user.pw_name


@pytest.fixture
def setup(tmp_path, deploy, sshd_factory, ssh_client_key, real_users, monkeypatch):
    """(inventory, root, agent user, secret value, box) for a host reached as ``deploy`` with
    ``become: sudo`` under defaults; one agent with its own user and one credential."""
    box = sshd_factory("becomebox", authorized={deploy: ssh_client_key})
    known = write_known_hosts(tmp_path / "known_hosts", [box])
    top = Path(tempfile.mkdtemp(prefix="fleetctl-become-"))
    os.chmod(top, 0o755)
    root = top / "box"
    bp = make_project(tmp_path, {"runner": {"run.sh": "#!/bin/sh\necho run\n"},
                                 "credentials": {"tok": TOKEN_CAP}},
                      roles={"worker": {"prompt": "w", "capabilities": ["tok"]}},
                      executable=("runner/run.sh",))
    agent_user = real_users.name("w1")
    value = "planted-" + secrets.token_hex(12)
    monkeypatch.setenv("BECOME_TOK", value)
    agents = {"w1": {"role": "worker", "user": agent_user,
                     "grants": {"tok": {"scope": {}, "secret": {"env": "BECOME_TOK"}}}}}
    host = ssh_host(box, ssh_client_key, known, root, agents, user=deploy)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": host}, defaults={"become": "sudo"})
    try:
        yield inv, bp, root, agent_user, value, box
    finally:
        shutil.rmtree(top, ignore_errors=True)


def logins(box) -> list[str]:
    return [ln for ln in box.log_path.read_text().splitlines() if "Accepted publickey" in ln]


def test_a_nopasswd_entry_for_the_exact_command_lets_a_deploy_login_ship(setup, deploy,
                                                                        sudoers):
    """With ``DEPLOY ALL=(root) NOPASSWD: /usr/bin/python3 -c BOOTSTRAP`` and nothing else, a
    ship as ``deploy`` creates the agent's user, writes its credential 0600 owned by it, the
    release as root; drift is then clean; sshd saw only ``deploy`` log in."""
    inv, bp, root, agent_user, value, box = setup
    sudoers(f"{deploy} ALL=(root) NOPASSWD: /usr/bin/python3 {sudoers_args()}")
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    assert f"created user {agent_user}" in run.host("web1")["accounts"]
    pw = pwd.getpwnam(agent_user)
    cred = root / "credentials" / "w1" / "tok.env"
    st = os.lstat(cred)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, pw.pw_uid, pw.pw_gid)
    assert cred.read_bytes() == f"TOKEN={value}\n".encode()
    script = root / "current" / "runner" / "run.sh"
    st = os.stat(script)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o755, 0, 0)
    assert script.read_text() == "#!/bin/sh\necho run\n"
    assert cli("drift", inventory=inv, blueprint=bp).code == 0
    accepted = logins(box)
    assert accepted and all(f"for {deploy} " in ln for ln in accepted), accepted
    assert value not in run.stdout + run.stderr


@pytest.mark.parametrize("entry", ["none", "password"])
def test_sudo_that_would_prompt_stops_the_host_with_the_entry_it_needs(setup, deploy, sudoers,
                                                                       entry):
    """No sudoers entry at all, or the right command without NOPASSWD: ship and drift exit 2
    with an error naming the host, the login and that sudo wants a password, and a hint giving
    the exact NOPASSWD line; nothing is written (no root, no agent user)."""
    inv, bp, root, agent_user, value, box = setup
    if entry == "password":
        sudoers(f"{deploy} ALL=(root) /usr/bin/python3 {sudoers_args()}")
    before = snapshot(root.parent)
    for args in (("ship", "--yes"), ("drift",)):
        run = cli(*args, "--format", "json", inventory=inv, blueprint=bp)
        assert run.code == 2, run.stdout + run.stderr
        host = run.host("web1")
        assert host["status"] == "error"
        assert host["error"].startswith(f"web1: become: sudo: `sudo -n` on {deploy}@127.0.0.1:"
                                        f"{box.port} refused"), host["error"]
        assert "sudo wants a password" in host["error"]
        assert host["hint"].endswith(
            f"{deploy} ALL=(root) NOPASSWD: /usr/bin/python3 {sudoers_args()}"), host["hint"]
    assert snapshot(root.parent) == before and not root.exists()
    with pytest.raises(KeyError):
        pwd.getpwnam(agent_user)
    text = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert text.code == 2 and "sudo wants a password" in text.stdout
    assert value not in text.stdout + text.stderr


def test_an_entry_for_another_command_is_refused_too(setup, deploy, sudoers):
    """A NOPASSWD entry for some other program does not let fleetctl in: same error, exit 2."""
    inv, bp, root, _agent_user, _value, _box = setup
    sudoers(f"{deploy} ALL=(root) NOPASSWD: /usr/bin/id")
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    assert "refused to run fleetctl's host-side program as root" in run.host("web1")["error"]
    assert not root.exists()


@pytest.mark.parametrize("settings,key,problem", [
    ({"become": "su"}, "hosts.h.become", "'sudo' or 'none'"),
    ({"become": "sudo", "python": "python3"}, "hosts.h.python", "must be an absolute path"),
])
def test_become_is_validated_with_the_inventory(tmp_path, settings, key, problem):
    bp = make_project(tmp_path, {"runner": {"run.sh": "x\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h": {
        "transport": "ssh", "address": "127.0.0.1", "root": "/srv/fleet",
        "agents": {"w1": {"role": "worker"}}, **settings}})
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 2 and "Traceback" not in run.stderr
    assert "inv.yaml:" in run.stderr and key in run.stderr and problem in run.stderr, run.stderr


def test_a_host_may_opt_out_of_the_defaults_become(tmp_path):
    """``become: none`` on a host overrides ``become: sudo`` under defaults (its python stays
    the plain default)."""
    from fleetctl.inventory import load_inventory

    inv = write_inventory(tmp_path / "inv.yaml", {
        "a": {"address": "127.0.0.1", "root": "/srv/fleet"},
        "b": {"address": "127.0.0.1", "root": "/srv/fleet", "become": "none"}},
        defaults={"become": "sudo"})
    a, b = load_inventory(inv).hosts
    assert (a.become, a.python) == ("sudo", "/usr/bin/python3")
    assert (b.become, b.python) == (None, "python3")


def test_the_documented_sudoers_entry_is_the_one_that_works():
    """docs/inventory.md gives the same line the NOPASSWD test above installs (for ``deploy``),
    so the documented entry is the tested one."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "inventory.md").read_text()
    assert f"\ndeploy ALL=(root) NOPASSWD: /usr/bin/python3 {sudoers_args()}\n" in docs


def test_a_local_host_runs_through_sudo_too(tmp_path):
    """``transport: local`` with ``become: sudo`` starts the host-side program through sudo as
    well: a wrapper named as ``python`` records the ``SUDO_COMMAND`` sudo sets, and the ship
    goes through (root may run anything through sudo)."""
    bp = make_project(tmp_path, {"runner": {"run.sh": "x\n"}})
    marker = tmp_path / "sudo-command"
    wrapper = tmp_path / "py"
    wrapper.write_text(f'#!/bin/sh\necho "$SUDO_USER $SUDO_COMMAND" > {marker}\n'
                       'exec /usr/bin/python3 "$@"\n')
    wrapper.chmod(0o755)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": {
        "transport": "local", "root": str(tmp_path / "box"), "become": "sudo",
        "python": str(wrapper), "agents": {"w1": {"role": "worker"}}}})
    run = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    assert marker.read_text().startswith(f"root {wrapper} -c import sys;")
    assert (tmp_path / "box" / "current" / "runner" / "run.sh").read_text() == "x\n"


def test_a_missing_secret_stops_the_ship_before_any_login(setup, deploy, sudoers, monkeypatch):
    """Ship needs every secret it writes: with BECOME_TOK unset it names the grant, agent and
    source kind and stops before it even logs in (sshd saw no login at all), exit 2."""
    inv, bp, root, _agent_user, _value, box = setup
    sudoers(f"{deploy} ALL=(root) NOPASSWD: /usr/bin/python3 {sudoers_args()}")
    monkeypatch.delenv("BECOME_TOK")
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    error = run.host("web1")["error"]
    assert "grant tok of agent w1" in error and "environment variable BECOME_TOK" in error
    assert logins(box) == [] and not root.exists()
