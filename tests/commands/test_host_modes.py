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
