"""drift, ship, backport and rollback across the environment matrix (tests/hostenv.py): the
result never depends on the login's umask, start-up output, locale, interpreter path or a
noexec TMPDIR. Every claim is read back from the host's disk (os.lstat, os.listdir of bytes),
never from fleetctl's own report."""

from __future__ import annotations

import os
import stat

import pytest

from tests.helpers import changes_of, cli, git, make_project, write_inventory
from tests.hostenv import FILES, MATRIX, expected_modes, modes_under


def owners_under(top) -> set[int]:
    """The uids of ``top`` and of everything under it (links included)."""
    uids = {os.lstat(top).st_uid}
    for dirpath, dirnames, filenames in os.walk(top):
        uids |= {os.lstat(os.path.join(dirpath, n)).st_uid for n in dirnames + filenames}
    return uids


@pytest.mark.parametrize("env", MATRIX, ids=str)
def test_ship_drift_backport_and_rollback_hold_in_every_login_environment(env, env_hosts,
                                                                         tmp_path):
    host = env_hosts(env)
    bp = make_project(tmp_path, FILES, executable=("runner/run.sh",))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": host.inventory()})

    def run(*args: str):
        return cli(*args, "--format", "json", inventory=inv,
                   blueprint=None if args[0] == "rollback" else bp)

    first = run("ship", "--yes")
    assert first.code == 0, first.stdout + first.stderr
    first_release = os.readlink(host.root / "current")
    # Modes as docs/layout.md says, the parent the ship made included; all the login's...
    assert modes_under(host.root) == expected_modes(host.root)
    assert stat.S_IMODE(os.lstat(host.root.parent).st_mode) == 0o755
    # ... root's when it ran through sudo.
    owner = 0 if host.inventory().get("become") == "sudo" else host.user.pw_uid
    assert owners_under(host.root.parent) == {owner}
    # A name's bytes on the host are its UTF-8 bytes, whatever the login's locale.
    assert "café.txt".encode() in os.listdir(os.fsencode(host.root / "current" / "runner"))
    assert run("drift").code == 0

    # A change of the blueprint ships over it.
    (bp / "runner" / "conf").write_text("a=1b\n")
    git(bp, "commit", "-q", "-am", "change")
    assert run("ship", "--yes").code == 0
    assert (host.root / "current" / "runner" / "conf").read_text() == "a=1b\n"

    # A hand-patch is seen as one, backported, shipped without --force.
    (host.root / "current" / "runner" / "conf").write_text("a=2\n")
    seen = run("drift")
    assert seen.code == 1 and changes_of(seen, "h") == {("runner/conf", "content",
                                                          "hand-patch")}, seen.stdout
    back = run("backport", "h")
    assert back.code == 0, back.stdout + back.stderr
    assert (bp / "runner" / "conf").read_text() == "a=2\n"
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "backport")
    third = run("ship", "--yes")
    assert third.code == 0, third.stdout + third.stderr
    assert modes_under(host.root) == expected_modes(host.root)
    assert run("drift").code == 0

    # Rolled back: the first release in use again, the blueprint ahead of it.
    rolled = run("rollback", "h", "--to", first_release.split("/", 1)[1])
    assert rolled.code == 0, rolled.stdout + rolled.stderr
    assert os.readlink(host.root / "current") == first_release
    assert (host.root / "current" / "runner" / "conf").read_text() == "a=1\n"
    after = run("drift")
    assert after.code == 1 and {c["origin"] for c in after.host("h")["changes"]} == {"pending"}
    assert stat.S_IMODE(os.lstat(host.root / ".fleetctl" / "history.jsonl").st_mode) == 0o644
