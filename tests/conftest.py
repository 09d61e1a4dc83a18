"""Shared fixtures: real sshd boxes (tests/ssh_fixtures.py) and an isolated user environment."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.ssh_fixtures", "tests.runner_python", "tests.hostenv"]


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores this process may use, at most 4 (pytest-xdist
    hook). The tests spend a quarter of their time waiting on processes they start (sshd
    boxes, runners, fake agents): a third worker on 2 cores took the runner's tests from 48 s
    to 43 s."""
    import os

    return min(4, len(os.sched_getaffinity(0)) + 1)


@pytest.fixture(autouse=True)
def isolated_user(tmp_path_factory, monkeypatch):
    """No ~/.ssh/config, known_hosts, agent or fleetctl settings from the real user leak in."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for var in ("SSH_AUTH_SOCK", "FLEETCTL_INVENTORY", "FLEETCTL_BLUEPRINT"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def real_users():
    """Unique real Linux users (see tests.helpers.RealUsers), removed after the test."""
    from tests.helpers import RealUsers

    users = RealUsers()
    try:
        yield users
    finally:
        users.cleanup()


@pytest.fixture
def login_user():
    """A fresh login user (shell /bin/sh, HOME made, unlocked: sshd without PAM refuses the
    locked account useradd leaves), as its ``pwd`` entry; deleted with its HOME afterwards,
    tried until it works (a session process may not have exited yet, slowly when busy)."""
    import pwd
    import secrets
    import shutil
    import subprocess

    from tests.helpers import wait_until

    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd")
    name = "flu" + secrets.token_hex(4)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        yield pwd.getpwnam(name)
    finally:
        wait_until(lambda: subprocess.run(["userdel", "-r", name], capture_output=True)
                   .returncode in (0, 6), poll_s=0.1, what=f"userdel -r {name}")  # 6: no such user
