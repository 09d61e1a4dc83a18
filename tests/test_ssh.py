"""fleetctl over real SSH: ship and drift against sshd boxes on 127.0.0.1.

Every expectation is computed here, independently of fleetctl: the expected tree from the blueprint
spec (sha256 by hashlib, modes from what the spec says), the live tree by ``snapshot`` (plain
``os.lstat`` walk). Boxes share this machine's filesystem, so each host gets its own root.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import (
    Symlink,
    changes_of,
    cli,
    git,
    make_project,
    snapshot,
    ssh_host,
    without_inodes,
    write_inventory,
)
from tests.sshd_boxes import free_port, write_known_hosts

AGENT_YAML = b"agent: w1\nrole: worker\n"

# The blueprint most tests ship: a script (executable through git's index), a plain file,
# a symlink and a nested directory.
RUNNER = {
    "run.sh": "#!/bin/sh\necho run\n",
    "README": "the runner\n",
    "lib": {"util.py": "X = 1\n"},
    "latest": Symlink("run.sh"),
}
EXECUTABLE = ("runner/run.sh",)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_tree(runner: dict, executable: tuple[str, ...] = EXECUTABLE, uid: int = 0,
                  gid: int = 0, agents: tuple[str, ...] = ("w1",)) -> dict[bytes, tuple]:
    """The tree ship must produce under ``current/``, in ``without_inodes(snapshot())`` form.

    ``runner`` is the spec of ``blueprint/runner`` with templates already rendered by hand.
    Files are 0644 unless listed in ``executable`` (0755), directories 0755, the agent's
    credentials directory 0700, the agent config rendered by hand from helpers.AGENT_TEMPLATE.
    """
    out: dict[bytes, tuple] = {}

    def add(prefix: bytes, spec: dict) -> None:
        for name, value in spec.items():
            rel = prefix + b"/" + os.fsencode(name)
            if isinstance(value, dict):
                out[rel] = ("dir", 0o755, uid, gid, None)
                add(rel, value)
            elif isinstance(value, Symlink):
                out[rel] = ("symlink", None, uid, gid, os.fsencode(value.target))
            else:
                data = value.encode() if isinstance(value, str) else value
                mode = 0o755 if os.fsdecode(rel) in executable else 0o644
                out[rel] = ("file", mode, uid, gid, _sha(data))

    out[b"runner"] = ("dir", 0o755, uid, gid, None)
    add(b"runner", runner)
    out[b"agents"] = ("dir", 0o755, uid, gid, None)
    for agent in agents:
        base = b"agents/" + agent.encode()
        out[base] = ("dir", 0o755, uid, gid, None)
        out[base + b"/agent.yaml"] = ("file", 0o644, uid, gid,
                                      _sha(f"agent: {agent}\nrole: worker\n".encode()))
        out[base + b"/credentials"] = ("dir", 0o700, uid, gid, None)
    return out


def live_tree(root: Path) -> dict[bytes, tuple]:
    """What is under ``<root>/current`` now (attributes only, no inodes)."""
    return without_inodes(snapshot(os.path.realpath(root / "current")))


def current_target(root: Path) -> str:
    return os.readlink(root / "current")


def commit_all(bp: Path, message: str = "change") -> None:
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", message)


def project(tmp_path: Path, runner: dict | None = None,
            executable: tuple[str, ...] = EXECUTABLE) -> Path:
    return make_project(tmp_path / "proj", {"runner": runner if runner is not None else RUNNER},
                        executable=executable)


def ship(inv: Path, bp: Path, *extra: str):  # noqa
    return cli("ship", "--yes", "--format", "json", *extra, inventory=inv, blueprint=bp)


def drift(inv: Path, bp: Path, *extra: str):
    return cli("drift", "--format", "json", *extra, inventory=inv, blueprint=bp)


@pytest.fixture
def one_box(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """(inventory path, blueprint, host root) for pool box 0 as root; the root does not exist."""
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    return inv, bp, root


# -- 1, 2, 3: the ordinary life of a host ---------------------------------------------------------


def test_first_ship_produces_exact_tree_and_drift_is_clean(one_box):
    """A first ship over SSH to an empty root builds exactly the blueprint's tree (paths, bytes,
    modes incl. the git-index executable bit, the symlink, owners), switches ``current`` to a
    release under ``releases/``, and drift then reports nothing (exit 0)."""
    inv, bp, root = one_box
    assert not root.exists()
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    assert run.host("web1")["status"] == "shipped"
    target = current_target(root)
    assert target.startswith("releases/") and "/" not in target[len("releases/"):]
    assert (root / target).is_dir() and not (root / target).is_symlink()
    assert live_tree(root) == expected_tree(RUNNER)
    with open(root / "current" / "runner" / "run.sh", "rb") as fh:
        assert fh.read() == b"#!/bin/sh\necho run\n"
    after = drift(inv, bp)
    assert after.code == 0, after.stdout + after.stderr
    assert after.host("web1")["status"] == "in-sync"
    assert after.host("web1")["changes"] == []


def test_second_ship_is_a_noop(one_box):
    """Shipping an unchanged blueprint again writes nothing: status ``no-op``, exit 0, and the
    whole root (releases, records, ``current``) is byte- and inode-identical."""
    inv, bp, root = one_box
    assert ship(inv, bp).code == 0
    before = snapshot(root)
    releases_before = sorted(os.listdir(root / "releases"))
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    assert run.host("web1")["status"] == "no-op"
    assert sorted(os.listdir(root / "releases")) == releases_before
    assert snapshot(root) == before


def test_hand_patch_is_refused_then_forced(one_box):
    """A file edited in place under ``current/`` shows as drift (exit 1, origin ``hand-patch``);
    ship refuses it (exit 3) and writes nothing at all; ``ship --force`` overwrites it (exit 0)
    and drift is clean again."""
    inv, bp, root = one_box
    assert ship(inv, bp).code == 0
    with open(root / "current" / "runner" / "README", "wb") as fh:
        fh.write(b"patched on the host\n")
    found = drift(inv, bp)
    assert found.code == 1, found.stdout + found.stderr
    assert changes_of(found, "web1") == {("runner/README", "content", "hand-patch")}
    before = snapshot(root)
    refused = ship(inv, bp)
    assert refused.code == 3, refused.stdout + refused.stderr
    assert refused.host("web1")["status"] == "refused"
    assert "runner/README" in refused.host("web1")["error"]
    assert snapshot(root) == before
    forced = ship(inv, bp, "--force")
    assert forced.code == 0, forced.stdout + forced.stderr
    assert live_tree(root) == expected_tree(RUNNER)
    clean = drift(inv, bp)
    assert clean.code == 0, clean.stdout + clean.stderr


# -- 4, 5: host keys --------------------------------------------------------------------------------


def _other_ed25519_pub(directory: Path) -> str:
    key = directory / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def test_changed_host_key_stops_the_host(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """When known_hosts holds another ed25519 key for ``[127.0.0.1]:PORT``, drift and ship stop
    that host with exit 2 and an error naming the host key / known_hosts, write nothing on the
    host and leave the known_hosts file as it was."""
    box = sshd_pool[0]
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(box, ssh_client_key, ssh_known_hosts, root)})
    assert ship(inv, bp).code == 0
    wrong = tmp_path / "known_hosts.wrong"
    wrong_pub = _other_ed25519_pub(tmp_path)
    assert wrong_pub != box.host_key_pub
    wrong.write_text(f"[127.0.0.1]:{box.port} {wrong_pub}\n")
    wrong_text = wrong.read_bytes()
    write_inventory(inv, {"web1": ssh_host(box, ssh_client_key, wrong, root)})
    (bp / "runner" / "README").write_text("new content\n")
    commit_all(bp)
    before = snapshot(root)
    for run in (drift(inv, bp), ship(inv, bp)):
        assert run.code == 2, run.stdout + run.stderr
        result = run.host("web1")
        assert result["status"] == "error"
        error = result["error"].lower()
        assert "host key" in error or "known_hosts" in error, result["error"]
        assert result["changes"] == []
    assert snapshot(root) == before
    assert wrong.read_bytes() == wrong_text


def test_unknown_host_is_refused_and_not_learned(tmp_path, sshd_pool, ssh_client_key):
    """A host missing from known_hosts is refused (exit 2, error naming known_hosts), whether the
    inventory names an empty known_hosts file or none at all (then ~/.ssh/known_hosts, absent);
    the key is never added anywhere and nothing is created on the host."""
    box = sshd_pool[1]
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    empty = tmp_path / "known_hosts.empty"
    empty.write_bytes(b"")
    home = Path(os.environ["HOME"])
    host = ssh_host(box, ssh_client_key, empty, root)
    no_file = dict(host)
    del no_file["known_hosts"]
    for spec in (host, no_file):
        inv = write_inventory(tmp_path / "inv.yaml", {"web1": spec})
        for run in (drift(inv, bp), ship(inv, bp)):
            assert run.code == 2, run.stdout + run.stderr
            result = run.host("web1")
            assert result["status"] == "error"
            assert "known_hosts" in result["error"], result["error"]
        assert empty.read_bytes() == b""
        assert not (home / ".ssh" / "known_hosts").exists()
        assert not (home / ".ssh").exists()
        assert not root.exists()


# -- 6: one dead host among live ones -----------------------------------------------------------


def test_dead_host_does_not_stop_the_others(tmp_path, sshd_pool, ssh_client_key,
                                            ssh_known_hosts):
    """With two live boxes and one port nobody listens on, ship ships both live hosts (checked
    on disk), reports the dead one as ``error`` and exits 2; drift then says the live ones are
    in sync, the dead one is an error, exit 2."""
    bp = project(tmp_path)
    roots = {"live0": tmp_path / "r0", "live1": tmp_path / "r1"}
    hosts = {name: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[name])
             for name, box in zip(roots, sshd_pool[:2])}
    dead = dict(ssh_host(sshd_pool[2], ssh_client_key, ssh_known_hosts, tmp_path / "rdead"))
    dead["port"] = free_port()
    hosts["dead"] = dead
    inv = write_inventory(tmp_path / "inv.yaml", hosts)
    run = ship(inv, bp, "--timeout", "10")
    assert run.code == 2, run.stdout + run.stderr
    assert run.host("dead")["status"] == "error"
    assert run.host("dead")["error"]
    for name, root in roots.items():
        assert run.host(name)["status"] == "shipped"
        assert live_tree(root) == expected_tree(RUNNER)
    assert not (tmp_path / "rdead").exists()
    check = drift(inv, bp, "--timeout", "10")
    assert check.code == 2, check.stdout + check.stderr
    assert check.host("dead")["status"] == "error"
    assert [check.host(n)["status"] for n in roots] == ["in-sync", "in-sync"]


# -- 7: ~/.ssh/config ------------------------------------------------------------------------------


def test_ssh_config_alias_is_honoured(tmp_path, sshd_pool, ssh_client_key):
    """An inventory host whose address is an alias from ``~/.ssh/config`` (HostName, Port, User,
    IdentityFile there, none in the inventory) is reached and shipped; its host key is checked
    under the real ``[127.0.0.1]:PORT`` name: the same alias with a wrong key recorded for that
    name is refused (the alias is no way around the check)."""
    box = sshd_pool[2]
    ssh_dir = Path(os.environ["HOME"]) / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(
        "Host myalias\n"
        "    HostName 127.0.0.1\n"
        f"    Port {box.port}\n"
        "    User root\n"
        f"    IdentityFile {ssh_client_key.private_key}\n")
    known = write_known_hosts(tmp_path / "known_hosts", [box])
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": {
        "transport": "ssh", "address": "myalias", "known_hosts": str(known), "root": str(root),
        "agents": {"w1": {"role": "worker"}}}})
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    assert live_tree(root) == expected_tree(RUNNER)
    assert drift(inv, bp).code == 0

    wrong = tmp_path / "known_hosts.wrong"
    wrong.write_text(f"[127.0.0.1]:{box.port} {_other_ed25519_pub(tmp_path)}\n"
                     f"myalias {box.host_key_pub}\n[myalias]:{box.port} {box.host_key_pub}\n")
    write_inventory(inv, {"web1": {
        "transport": "ssh", "address": "myalias", "known_hosts": str(wrong), "root": str(root),
        "agents": {"w1": {"role": "worker"}}}})
    refused = drift(inv, bp)
    assert refused.code == 2, refused.stdout + refused.stderr
    assert refused.host("web1")["status"] == "error"


# -- 8, 9: a non-root login ----------------------------------------------------------------------


@pytest.fixture
def unix_user():
    """A fresh login user (unlocked, no password) removed with its home afterwards."""
    name = "fct" + secrets.token_hex(4)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


@pytest.fixture
def user_box(tmp_path, unix_user, sshd_factory, ssh_client_key):
    """(inventory, blueprint, root, user) for an extra box the test user logs in to; the root is
    a directory under /tmp owned by that user (pytest's own tmp dirs are 0700 root)."""
    box = sshd_factory("userbox", authorized={unix_user.pw_name: ssh_client_key})
    known = write_known_hosts(tmp_path / "known_hosts", [box])
    root = Path(tempfile.mkdtemp(prefix="fleetctl-user-root-"))
    try:
        os.chown(root, unix_user.pw_uid, unix_user.pw_gid)
        os.chmod(root, 0o755)
        bp = project(tmp_path)
        inv = write_inventory(tmp_path / "inv.yaml", {
            "web1": ssh_host(box, ssh_client_key, known, root, user=unix_user.pw_name)})
        yield inv, bp, root, unix_user
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_unreadable_subtree_makes_scan_incomplete(user_box):
    """As a non-root login, a root-owned 0000 directory inside the current release cannot be
    read: drift exits 2 with status ``incomplete`` and lists the path under ``unreadable``, and
    ship refuses with exit 2, writing nothing."""
    inv, bp, root, user = user_box
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    assert live_tree(root) == expected_tree(RUNNER, uid=user.pw_uid, gid=user.pw_gid)
    locked = root / "current" / "runner" / "locked"
    locked.mkdir()
    (locked / "inside").write_text("hidden\n")
    os.chmod(locked, 0)
    found = drift(inv, bp)
    assert found.code == 2, found.stdout + found.stderr
    result = found.host("web1")
    assert result["status"] == "incomplete"
    assert "runner/locked" in [u["path"] for u in result["unreadable"]]
    before = snapshot(root)
    refused = ship(inv, bp)
    assert refused.code == 2, refused.stdout + refused.stderr
    assert refused.host("web1")["status"] == "incomplete"
    assert snapshot(root) == before


def test_permission_denied_stops_and_keeps_previous_release(user_box):
    """As a non-root login, when ``releases/`` belongs to root (0755) a ship of a changed
    blueprint stops with exit 2, an error naming the refused path / "Permission denied", and the
    previous release stays in use, unchanged; no incoming blobs are left behind."""
    inv, bp, root, user = user_box
    assert ship(inv, bp).code == 0
    old_target = current_target(root)
    old_tree = snapshot(os.path.realpath(root / "current"))
    os.chown(root / "releases", 0, 0)
    os.chmod(root / "releases", 0o755)
    (bp / "runner" / "README").write_text("second version\n")
    commit_all(bp)
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("web1")
    assert result["status"] == "error"
    assert "Permission denied" in result["error"], result["error"]
    assert str(root / "releases") in result["error"], result["error"]
    assert current_target(root) == old_target
    assert snapshot(os.path.realpath(root / "current")) == old_tree
    assert sorted(os.listdir(root / "releases")) == [old_target.split("/")[1]]
    assert [n for n in os.listdir(root / ".fleetctl") if n.startswith("incoming-")] == []


# -- 10: the host lock ------------------------------------------------------------------------------


def test_lock_held_refuses_then_ship_works(one_box):
    """While another process holds the flock on the host root, ship exits 3 saying the lock is
    held and writes nothing; once released, the same ship succeeds."""
    inv, bp, root = one_box
    assert ship(inv, bp).code == 0
    (bp / "runner" / "README").write_text("after the lock\n")
    commit_all(bp)
    before = snapshot(root)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        run = ship(inv, bp)
        assert run.code == 3, run.stdout + run.stderr
        result = run.host("web1")
        assert result["status"] == "refused"
        assert "lock" in result["error"] and ("held" in result["error"] or
                                               "holds" in result["error"]), result["error"]
        assert snapshot(root) == before
    finally:
        os.close(fd)
    again = ship(inv, bp)
    assert again.code == 0, again.stdout + again.stderr
    assert (root / "current" / "runner" / "README").read_bytes() == b"after the lock\n"


# -- 11: several hosts at once ---------------------------------------------------------------------


def test_parallel_ship_renders_per_host(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """Three boxes shipped with ``--parallel 3`` all succeed, each with its own rendered
    ``runner/host.env`` (``HOST=<its name>``) and otherwise the same tree."""
    runner = {**RUNNER, "host.env.j2": "HOST={{ host.name }}\n"}
    bp = project(tmp_path, runner)
    names = ["alpha", "beta", "gamma"]
    roots = {n: tmp_path / f"root-{n}" for n in names}
    inv = write_inventory(tmp_path / "inv.yaml", {
        n: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[n])
        for n, box in zip(names, sshd_pool)})
    run = ship(inv, bp, "--parallel", "3")
    assert run.code == 0, run.stdout + run.stderr
    for name in names:
        assert run.host(name)["status"] == "shipped"
        rendered = {**RUNNER, "host.env": f"HOST={name}\n"}
        assert live_tree(roots[name]) == expected_tree(rendered)
        assert (roots[name] / "current/runner/host.env").read_bytes() == f"HOST={name}\n".encode()


# -- 12: disk full ----------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs mounted for the test (skipped where mounting is not allowed)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_keeps_previous_release(tmp_path, small_tmpfs, sshd_pool, ssh_client_key,
                                          ssh_known_hosts):
    """On a host whose disk fills up during a ship, the ship exits 2 saying where it stopped, the
    previous release stays in use unchanged, and no staging release or incoming blobs remain."""
    root = small_tmpfs
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    old_target = current_target(root)
    old_tree = snapshot(os.path.realpath(root / "current"))
    (bp / "runner" / "big.bin").write_bytes(os.urandom(1 << 20))
    commit_all(bp)
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("web1")
    assert result["status"] == "error"
    assert result["step"], result
    assert "No space left on device" in result["error"], result["error"]
    assert current_target(root) == old_target
    assert snapshot(os.path.realpath(root / "current")) == old_tree
    assert sorted(os.listdir(root / "releases")) == [old_target.split("/")[1]]
    assert [n for n in os.listdir(root / ".fleetctl") if n.startswith("incoming-")] == []
    records = sorted(os.listdir(root / ".fleetctl" / "releases"))
    assert records == [old_target.split("/")[1] + ".json"]
