"""fleetctl over real SSH: ship and drift against sshd boxes on 127.0.0.1.

Every expectation is computed here, independently of fleetctl: the expected tree from the blueprint
spec (sha256 by hashlib, modes from what the spec says), the live tree by ``snapshot`` (plain
``os.lstat`` walk). Boxes share this machine's filesystem, so each host gets its own root.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    WAIT_S,
    Symlink,
    changes_of,
    cli,
    git,
    make_project,
    snapshot,
    ssh_host,
    wait_until,
    without_inodes,
    write_inventory,
)
from tests.sshd_boxes import free_port, write_known_hosts

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
    the agent config rendered by hand from helpers.AGENT_TEMPLATE.
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
    return out


def live_tree(root: Path) -> dict[bytes, tuple]:
    """What is under ``<root>/current`` now (attributes only, no inodes)."""
    return without_inodes(snapshot(os.path.realpath(root / "current")))


def current_target(root: Path) -> str:
    return os.readlink(root / "current")


def accepted_logins(box) -> list[str]:
    """The logins sshd itself logged as accepted on ``box`` (its own record, not fleetctl's)."""
    return [line for line in box.log_path.read_text(errors="replace").splitlines()
            if line.startswith("Accepted ")]


def commit_all(bp: Path, message: str = "change") -> None:
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", message)


def project(tmp_path: Path, runner: dict | None = None,
            executable: tuple[str, ...] = EXECUTABLE) -> Path:
    return make_project(tmp_path / "proj", {"runner": runner if runner is not None else RUNNER},
                        executable=executable)


def ship(inv: Path, bp: Path, *extra: str):
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


# -- 4, 5: host keys ------------------------------------------------------------------------------


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
    logins = len(accepted_logins(box))
    for run in (drift(inv, bp), ship(inv, bp)):
        assert run.code == 2, run.stdout + run.stderr
        result = run.host("web1")
        assert result["status"] == "error"
        error = result["error"].lower()
        assert "host key" in error or "known_hosts" in error, result["error"]
        assert result["changes"] == []
    assert snapshot(root) == before
    assert wrong.read_bytes() == wrong_text
    assert len(accepted_logins(box)) == logins  # stopped before offering the client key


def test_unknown_host_is_refused_and_not_learned(tmp_path, sshd_pool, ssh_client_key):
    """A host missing from known_hosts is refused (exit 2, error naming known_hosts), whether the
    inventory names an empty known_hosts file or none at all (then ~/.ssh/known_hosts, absent);
    the key is never added anywhere, no login happens and nothing is created on the host."""
    box = sshd_pool[1]
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    empty = tmp_path / "known_hosts.empty"
    empty.write_bytes(b"")
    home = Path(os.environ["HOME"])
    host = ssh_host(box, ssh_client_key, empty, root)
    no_file = dict(host)
    del no_file["known_hosts"]
    logins = len(accepted_logins(box))
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
    assert len(accepted_logins(box)) == logins


# -- 6: one dead host among live ones -------------------------------------------------------------


def test_dead_host_holds_the_fleet_back_unless_skipped(tmp_path, sshd_pool, ssh_client_key,
                                                       ssh_known_hosts):
    """With two live boxes and one port nobody listens on, a ship writes nothing anywhere (the
    fleet ships all or nothing): the dead host is an ``error``, the live ones are ``refused``
    naming it, exit 2. With --skip-unreachable it ships both live hosts (checked on disk),
    reports the dead one as ``error`` and exits 2; drift then says the live ones are in sync,
    the dead one is an error, exit 2."""
    bp = project(tmp_path)
    roots = {"live0": tmp_path / "r0", "live1": tmp_path / "r1"}
    hosts = {name: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[name])
             for name, box in zip(roots, sshd_pool[:2])}
    dead = dict(ssh_host(sshd_pool[2], ssh_client_key, ssh_known_hosts, tmp_path / "rdead"))
    dead["port"] = free_port()
    hosts["dead"] = dead
    inv = write_inventory(tmp_path / "inv.yaml", hosts)
    held = ship(inv, bp, "--timeout", "10")
    assert held.code == 2, held.stdout + held.stderr
    assert held.host("dead")["status"] == "error"
    for name, root in roots.items():
        assert held.host(name)["status"] == "refused"
        assert "dead" in held.host(name)["error"]
        assert "--skip-unreachable" in held.host(name)["hint"]
        assert not root.exists()
    run = ship(inv, bp, "--timeout", "10", "--skip-unreachable")
    assert run.code == 2, run.stdout + run.stderr
    assert run.host("dead")["status"] == "error"
    assert run.host("dead")["error"]
    for name, root in roots.items():
        assert run.host(name)["status"] == "shipped"
        assert live_tree(root) == expected_tree(RUNNER)
    check = drift(inv, bp, "--timeout", "10")
    assert check.code == 2, check.stdout + check.stderr
    assert check.host("dead")["status"] == "error"
    assert [check.host(n)["status"] for n in roots] == ["in-sync", "in-sync"]


# -- 7: ~/.ssh/config -----------------------------------------------------------------------------


def test_ssh_config_alias_is_honoured(tmp_path, sshd_pool, ssh_client_key):
    """An inventory host whose address is an alias from ``~/.ssh/config`` (HostName, Port, User,
    IdentityFile there, none in the inventory) is reached and shipped; its host key is checked
    under the real ``[127.0.0.1]:PORT`` name, as OpenSSH does: a wrong key recorded for that name
    is refused, and so is a known_hosts that lists the right key under the alias only."""
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

    # Safe lookups: the key is checked under the real [127.0.0.1]:PORT, as OpenSSH does. A wrong
    # key there is refused; the right key recorded only under the alias name is not enough.
    impostor = _other_ed25519_pub(tmp_path)
    for name, text in (("wrong", f"[127.0.0.1]:{box.port} {impostor}\n"),
                       ("alias-only", f"myalias {box.host_key_pub}\n"
                                      f"[myalias]:{box.port} {box.host_key_pub}\n")):
        other = tmp_path / f"known_hosts.{name}"
        other.write_text(text)
        write_inventory(inv, {"web1": {
            "transport": "ssh", "address": "myalias", "known_hosts": str(other),
            "root": str(root), "agents": {"w1": {"role": "worker"}}}})
        refused = drift(inv, bp)
        assert refused.code == 2, (name, refused.stdout + refused.stderr)
        assert refused.host("web1")["status"] == "error"
        error = refused.host("web1")["error"].lower()
        assert "known_hosts" in error or "host key" in error, (name, error)
        assert other.read_text() == text


# -- 8, 9: a non-root login -----------------------------------------------------------------------


@pytest.fixture
def unix_user(login_user):
    """A fresh login user's ``pwd`` entry (tests/conftest.py login_user)."""
    return login_user


@pytest.fixture
def user_box(tmp_path, unix_user, sshd_factory, ssh_client_key):
    """(inventory, blueprint, root, user, box) for an extra box the test user logs in to; the
    root is a directory under /tmp owned by that user (pytest's own tmp dirs are 0700 root)."""
    box = sshd_factory("userbox", authorized={unix_user.pw_name: ssh_client_key})
    known = write_known_hosts(tmp_path / "known_hosts", [box])
    root = Path(tempfile.mkdtemp(prefix="fleetctl-user-root-"))
    try:
        os.chown(root, unix_user.pw_uid, unix_user.pw_gid)
        os.chmod(root, 0o755)
        bp = project(tmp_path)
        inv = write_inventory(tmp_path / "inv.yaml", {
            "web1": ssh_host(box, ssh_client_key, known, root, user=unix_user.pw_name)})
        yield inv, bp, root, unix_user, box
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_unreadable_subtree_makes_scan_incomplete(user_box):
    """As a non-root login, a root-owned 0000 directory inside the current release cannot be
    read: drift exits 2 with status ``incomplete`` and lists the path under ``unreadable``, and
    ship refuses with exit 2, writing nothing."""
    inv, bp, root, user, _box = user_box
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
    previous release stays in use, unchanged; no incoming blobs are left behind; and it logged in
    once, as that user only (no retry, no other account: sshd's own log)."""
    inv, bp, root, user, box = user_box
    assert ship(inv, bp).code == 0
    old_target = current_target(root)
    old_tree = snapshot(os.path.realpath(root / "current"))
    os.chown(root / "releases", 0, 0)
    os.chmod(root / "releases", 0o755)
    (bp / "runner" / "README").write_text("second version\n")
    commit_all(bp)
    logins = accepted_logins(box)
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    new_logins = accepted_logins(box)[len(logins):]
    assert len(new_logins) == 1 and new_logins[0].startswith(
        f"Accepted publickey for {user.pw_name} "), new_logins
    result = run.host("web1")
    assert result["status"] == "error"
    assert "Permission denied" in result["error"], result["error"]
    assert str(root / "releases") in result["error"], result["error"]
    assert current_target(root) == old_target
    assert snapshot(os.path.realpath(root / "current")) == old_tree
    assert sorted(os.listdir(root / "releases")) == [old_target.split("/")[1]]
    assert [n for n in os.listdir(root / ".fleetctl") if n.startswith("incoming-")] == []


# -- 10: the host lock ----------------------------------------------------------------------------


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


def test_lock_refusal_names_the_holder(one_box):
    """The lock refusal names the process holding the lock (fleetctl.host.lock.lock_holder's purpose):
    here the pid of this test process, which took the flock."""
    inv, bp, root = one_box
    assert ship(inv, bp).code == 0
    (bp / "runner" / "README").write_text("after the lock\n")
    commit_all(bp)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        run = ship(inv, bp)
    finally:
        os.close(fd)
    assert run.code == 3, run.stdout + run.stderr
    assert f"pid {os.getpid()}" in run.host("web1")["error"], run.host("web1")["error"]


@pytest.fixture
def silent_host():
    """A TCP port on 127.0.0.1 that accepts connections and never says a word, and the time
    (``time.monotonic()`` seconds) each connection was held open by its client: ``held_s``
    gets one entry per connection once the client hangs up. The host never hangs up itself, so
    only a client's own timeout ends a connection (the test measures that, not a process)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held_s: list[float] = []
    conns: list[socket.socket] = []

    def hold(conn: socket.socket) -> None:
        accepted = time.monotonic()
        try:
            while conn.recv(4096):  # the client's own banner, then nothing until it hangs up
                pass
        except OSError:
            return  # closed here at teardown
        held_s.append(time.monotonic() - accepted)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], held_s
    finally:
        stop.set()
        server.close()
        for conn in conns:
            conn.close()


def test_subsecond_timeout_bounds_a_silent_host(tmp_path, silent_host, sshd_pool,
                                                ssh_client_key, ssh_known_hosts):
    """``--timeout 0.5`` gives up on a host that accepts TCP but never sends an SSH banner,
    exit 2. The time is measured where the connection is held (at the silent host), not around
    the whole command, whose start-up a busy machine can slow down by seconds."""
    port, held_s = silent_host
    spec = ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, tmp_path / "root")
    spec["port"] = port
    inv = write_inventory(tmp_path / "inv.yaml", {"mute": spec})
    bp = project(tmp_path)
    run = drift(inv, bp, "--timeout", "0.5")
    assert run.code == 2, run.stdout + run.stderr
    assert run.host("mute")["status"] == "error"
    wait_until(lambda: held_s, what="the client hanging up")  # seen a moment after the run
    # Without the 0.5 s timeout the client would wait the default 120 s (the host never hangs up).
    assert held_s and max(held_s) < 5, f"connections held {held_s} s with --timeout 0.5"


# -- 11: several hosts at once --------------------------------------------------------------------


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


# -- 12: disk full --------------------------------------------------------------------------------


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs(size) -> Path``: a small tmpfs for this test, unmounted at its end (the test
    is skipped where mounting is not allowed)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _ship_too_big(tmp_path, mount_tmpfs, box, key, known_hosts):
    """Ship a small blueprint to a 256 KiB tmpfs root, then one with a 1 MiB file added.

    Returns (root, release id in use before, snapshot of that release, the second run)."""
    root = mount_tmpfs("256k")
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(box, key, known_hosts, root)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    old_target = current_target(root)
    old_tree = snapshot(os.path.realpath(root / "current"))
    (bp / "runner" / "big.bin").write_bytes(os.urandom(1 << 20))
    commit_all(bp)
    return root, old_target, old_tree, ship(inv, bp)


def test_disk_full_keeps_previous_release(tmp_path, mount_tmpfs, sshd_pool, ssh_client_key,
                                          ssh_known_hosts):
    """On a host whose disk fills up during a ship, the ship exits 2 saying where it stopped, the
    previous release stays in use unchanged, and no staging release or incoming blobs remain."""
    root, old_target, old_tree, run = _ship_too_big(tmp_path, mount_tmpfs, sshd_pool[0],
                                                    ssh_client_key, ssh_known_hosts)
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


def test_disk_full_while_receiving_is_reported_at_receive(tmp_path, mount_tmpfs, sshd_pool,
                                                          ssh_client_key, ssh_known_hosts):
    """A 1 MiB file cannot be received on a 256 KiB disk: the ship must say it stopped at the
    ``receive`` step (where the disk filled), not at a later step."""
    _root, _old, _tree, run = _ship_too_big(tmp_path, mount_tmpfs, sshd_pool[0], ssh_client_key,
                                            ssh_known_hosts)
    assert run.code == 2, run.stdout + run.stderr
    assert run.host("web1")["step"] == "receive", run.host("web1")


def test_a_first_ship_that_does_not_fit_claims_no_previous_release(
        tmp_path, mount_tmpfs, sshd_pool, ssh_client_key, ssh_known_hosts):
    """The host's first ship fills the disk: there is no previous release, so the error must not
    say one "is still in use"; it says none is, and the root indeed holds no release."""
    root = mount_tmpfs("256k") / "root"
    bp = project(tmp_path, {**RUNNER, "big.bin": os.urandom(1 << 20)})
    inv = write_inventory(tmp_path / "inv.yaml",
                          {"web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("web1")
    assert "No space left on device" in result["error"], result
    assert "previous release" not in (result["hint"] or "") + result["error"], result
    assert "no release is in use" in result["hint"], result
    assert not os.path.lexists(root / "current")
    assert not (root / "releases").exists() or os.listdir(root / "releases") == []


def test_new_content_takes_its_room_on_the_host_once(tmp_path, mount_tmpfs, sshd_pool,
                                                     ssh_client_key, ssh_known_hosts):
    """A 1.5 MiB file ships to a 2.5 MiB disk: it fits once, not twice. The content received
    is moved into the release (before: copied, so a ship needed twice the room of what it
    sent, and this one failed at assemble with No space left on device). Twice the same
    content in one release is still two files (a copy for the first, the received one for the
    second), and shares no inode with anything."""
    root = mount_tmpfs("2560k") / "root"
    big = os.urandom(1536 << 10)
    bp = project(tmp_path, {**RUNNER, "big.bin": big, "small-a": "same\n", "small-b": "same\n"})
    inv = write_inventory(tmp_path / "inv.yaml",
                          {"web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    release = Path(os.path.realpath(root / "current")) / "runner"
    assert (release / "big.bin").read_bytes() == big
    a, b = os.stat(release / "small-a"), os.stat(release / "small-b")
    assert a.st_ino != b.st_ino and a.st_nlink == b.st_nlink == 1
    assert os.stat(release / "big.bin").st_nlink == 1
    assert [n for n in os.listdir(root / ".fleetctl") if n.startswith("incoming-")] == []
    assert drift(inv, bp).code == 0


# Forty files with long names: the release record (one JSON entry per file) spans several pages.
MANY = {f"file-with-a-long-name-so-the-release-record-spans-pages-{i:03d}": f"{i}\n"
        for i in range(40)}


def _ship_onto_filling_disk(tmp_path, mount_tmpfs, box, key, known_hosts):
    """Ship MANY to a tmpfs root, change one file, then ship again with the disk filled so that
    only N pages are free, N one more on each attempt, until a ship succeeds.

    Every file of the release takes one page and so does the new content, so the attempts walk
    the point where the disk fills through every step, including the release record.
    Returns (root, inventory, blueprint, release id before, attempts) where each attempt is
    ``(free pages, run, names in .fleetctl/releases, names in releases, current target)``.
    """
    mnt = mount_tmpfs("512k")
    root = mnt / "root"
    bp = project(tmp_path, MANY, executable=())
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(box, key, known_hosts, root)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    old = current_target(root).split("/")[1]
    (bp / "runner" / next(iter(MANY))).write_text("changed\n")
    commit_all(bp)
    pages = len(MANY) + 1 + 1  # release files (agent.yaml too) + the one new content
    attempts = []
    for leave in range(pages - 2, pages + 12):
        filler = mnt / "filler"
        st = os.statvfs(mnt)
        with open(filler, "wb") as fh:
            fh.write(bytes((st.f_bavail - leave) * st.f_frsize))
        assert os.statvfs(mnt).f_bavail == leave
        run = ship(inv, bp)
        filler.unlink()
        attempts.append((leave, run, sorted(os.listdir(root / ".fleetctl" / "releases")),
                         sorted(os.listdir(root / "releases")), current_target(root)))
        if run.code == 0:
            break
    return root, inv, bp, old, attempts


def test_ship_never_succeeds_with_a_truncated_record(tmp_path, mount_tmpfs, sshd_pool,
                                                     ssh_client_key, ssh_known_hosts):
    """On a filling disk each ship either fails leaving the previous release in use, or
    succeeds with a complete release record, so drift afterwards is clean (exit 0)."""
    root, inv, bp, old, attempts = _ship_onto_filling_disk(
        tmp_path, mount_tmpfs, sshd_pool[0], ssh_client_key, ssh_known_hosts)
    *failed, (_leave, last, _records, _releases, target) = attempts
    for _leave, run, _records, _releases, failed_target in failed:
        assert run.code == 2, run.stdout + run.stderr
        assert failed_target == f"releases/{old}"
    assert last.code == 0, "no attempt succeeded: " + last.stdout
    new = target.split("/")[1]
    assert new != old
    text = (root / ".fleetctl" / "releases" / f"{new}.json").read_bytes()
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    assert record is not None, f"the record of the release in use is not JSON: ...{text[-80:]!r}"
    assert {e["path"] for e in record["manifest"]} == {
        os.fsdecode(p) for p in expected_tree(MANY, executable=())}
    after = drift(inv, bp)
    assert after.code == 0, after.stdout + after.stderr


def test_failed_ship_leaves_no_partial_record(tmp_path, mount_tmpfs, sshd_pool, ssh_client_key,
                                              ssh_known_hosts):
    """Whatever step a full disk stops a ship at, it leaves nothing behind: the records and the
    releases are exactly the previous ones and ``current`` is unchanged."""
    _root, _inv, _bp, old, attempts = _ship_onto_filling_disk(
        tmp_path, mount_tmpfs, sshd_pool[0], ssh_client_key, ssh_known_hosts)
    failed = [a for a in attempts if a[1].code != 0]
    assert len(failed) >= 3
    for leave, run, records, releases, target in failed:
        assert run.code == 2, run.stdout + run.stderr
        assert (leave, target, releases, records) == (
            leave, f"releases/{old}", [old], [f"{old}.json"])


def test_ssh_agent_key_is_used_when_the_inventory_names_none(tmp_path, sshd_pool, ssh_client_key,
                                                             ssh_known_hosts, monkeypatch):
    """With no identity_file and no key in ~/.ssh, the key held by a real ssh-agent logs in (as
    fabric and OpenSSH do); without the agent the same inventory cannot authenticate."""
    box = sshd_pool[1]
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, what="the ssh-agent socket")
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(ssh_client_key.private_key)], env=env, check=True,
                       capture_output=True)
        root = tmp_path / "host-root"
        bp = project(tmp_path)
        spec = {"transport": "ssh", "address": "127.0.0.1", "port": box.port, "user": "root",
                "known_hosts": str(ssh_known_hosts), "root": str(root),
                "agents": {"w1": {"role": "worker"}}}
        inv = write_inventory(tmp_path / "inv.yaml", {"viaagent": spec})
        without = drift(inv, bp)
        assert without.code == 2 and without.host("viaagent")["status"] == "error"
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        run = ship(inv, bp)
        assert run.code == 0, run.stdout + run.stderr
        assert live_tree(root) == expected_tree(RUNNER)
    finally:
        agent.terminate()
        agent.wait(timeout=WAIT_S)


def test_a_missing_agent_user_without_root_stops_at_users_naming_the_refusal(user_box):
    """Invariant 8 for accounts: a non-root login cannot create an agent's user. The ship stops
    at step ``users`` with exit 2, says root is needed and which file (/etc/passwd) it would have
    changed, never tries sudo, creates nobody, and the previous release stays in use."""
    inv, bp, root, _user, _box = user_box
    assert ship(inv, bp).code == 0
    before = os.readlink(root / "current")
    body = yaml.safe_load(inv.read_text())
    wanted = "fct" + secrets.token_hex(4)
    body["hosts"]["web1"]["agents"]["w1"]["user"] = wanted
    inv.write_text(yaml.safe_dump(body))
    plan = drift(inv, bp)
    assert plan.code == 1 and f"user {wanted} does not exist" in " ".join(plan.host("web1")["accounts"])
    run = ship(inv, bp)
    result = run.host("web1")
    assert run.code == 2 and result["step"] == "users", run.stdout
    assert "needs root" in result["error"] and "/etc/passwd" in result["error"]
    assert "nothing was retried" in result["error"]
    assert os.readlink(root / "current") == before
    with pytest.raises(KeyError):
        pwd.getpwnam(wanted)
