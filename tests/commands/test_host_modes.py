"""Every mode fleetctl creates on a host is its own, whatever the umask of the login.

A login with a strict umask (077, 027: hardened images, deploy users) or a loose one (002: a
user-private-group default in /etc/profile) runs the host program with that umask, and every
``mkdir``/``open`` it makes is narrowed (or left wide) by it. Ansible's temporary directories
made by ``mkdir -p`` under umask 077 were unreadable to the become user (ansible/ansible#11764,
#2998), and deployer's release directories took the login's 002 (deployphp/deployer#1977). Here
a local ship runs with the umask set in this process (the local transport's host program
inherits it), and each mode is read back with ``os.lstat``: the managed root and every parent
the ship made (0755), ``releases/``, the release, ``.fleetctl/`` and its records and history.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import cli, local_host, make_project, write_inventory
from tests.commands.test_credentials import host_root  # noqa: F401 (a fixture)
from tests.hostenv import FILES, expected_modes, modes_under


def ship_under_umask(base: Path, umask: int) -> tuple[Path, Path]:
    """Make a blueprint under ``base`` and ship it to a root three missing directories deep,
    with ``umask`` set for the ship; return (root, the topmost directory the ship created)."""
    bp = make_project(base, FILES, executable=("runner/run.sh",))
    top = base / "srv"
    root = top / "fleet" / "box"
    inv = write_inventory(base / "inv.yaml", {"h": local_host(root)})
    old = os.umask(umask)
    try:
        shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
        drift = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    finally:
        os.umask(old)
    assert shipped.code == 0, shipped.stderr
    assert drift.code == 0, drift.stdout
    return root, top


def test_a_strict_umask_leaves_root_parents_records_and_history_readable(tmp_path):
    root, top = ship_under_umask(tmp_path, 0o077)
    assert modes_under(root) == expected_modes(root)
    # The parents the ship made for the root are traversable by the agents' users.
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(top / "fleet").st_mode) == 0o755


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(umask=st.integers(min_value=0, max_value=0o777))
def test_the_modes_a_ship_creates_do_not_depend_on_the_umask(tmp_path_factory, umask):
    base = tmp_path_factory.mktemp("umask")
    root, top = ship_under_umask(base, umask)
    assert modes_under(root) == expected_modes(root)
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o755


def test_credentials_users_and_homes_get_their_modes_under_any_umask(
        tmp_path, host_root, real_users, monkeypatch):
    """Secrets 0600 in 0700 directories, the agent's; a HOME 0700 the agent's, and the parent
    a ship made for it 0755: under umask 077 (narrower than some) and 000 (wider than all)."""
    import pwd

    from tests.commands.test_credentials import Fleet, tok

    for umask in (0o077, 0o000):
        fleet = Fleet(tmp_path / f"u{umask:o}", host_root.parent / f"box{umask:o}", real_users,
                      monkeypatch)
        fleet.a, fleet.b = real_users.name(f"a{umask:o}"), real_users.name(f"b{umask:o}")
        fleet.secret("TOK_A")
        homes = host_root.parent / f"homes{umask:o}"  # missing: the ship makes it
        agents = {"a": {"role": "worker", "user": fleet.a, "home": str(homes / "a"),
                        "grants": tok("TOK_A")},
                  "b": {"role": "worker", "user": fleet.b, "home": str(homes / "b")}}
        write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
        old = os.umask(umask)
        try:
            shipped = fleet.run("ship", "--yes")
        finally:
            os.umask(old)
        assert shipped.code == 0, shipped.stdout + shipped.stderr
        pw = pwd.getpwnam(fleet.a)
        creds = fleet.root / "credentials"
        for path, mode, uid in ((creds, 0o755, 0), (creds / "a", 0o700, pw.pw_uid),
                                (creds / "a" / "tok.env", 0o600, pw.pw_uid),
                                (homes, 0o755, 0), (homes / "a", 0o700, pw.pw_uid)):
            st_ = os.lstat(path)
            assert (path, stat.S_IMODE(st_.st_mode), st_.st_uid) == (path, mode, uid)
        assert fleet.run("drift").code == 0
