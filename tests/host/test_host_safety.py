"""Issue 9, the host side: nothing outside the managed root is removed or followed (mount
points, symlinks), files that vanish during a scan are not errors, a failing ship names the path
it failed on, and every temporary name fits the file system's name limit.

Real sshd boxes (tests/ssh_fixtures.py), real mounts (bind mounts and tmpfs, unmounted at the
end of each test), real racing files (a separate process creating and deleting them), real
permission errors (a non-root login) and a real full disk (a small tmpfs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import cli, make_project, snapshot, ssh_host, write_inventory
from tests.transport.test_ssh import (  # noqa: F401 - fixtures
    RUNNER,
    commit_all,
    current_target,
    drift,
    mount_tmpfs,
    project,
    ship,
    unix_user,
    user_box,
)


# -- mounts -----------------------------------------------------------------------------------


@pytest.fixture
def mounts():
    """``mounts.bind(source, target)`` / ``mounts.tmpfs(target)``: real mounts for one test, all
    unmounted at its end (``umount -l`` if a plain umount fails); skipped where not allowed."""

    class Mounts:
        def __init__(self) -> None:
            self.points: list[Path] = []

        def _mount(self, argv: list[str], target: Path) -> None:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount here: {done.stderr.strip()}")
            self.points.append(target)

        def bind(self, source: Path, target: Path) -> None:
            self._mount(["mount", "--bind", str(source), str(target)], target)

        def tmpfs(self, target: Path) -> None:
            self._mount(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], target)

        def unmount(self, target: Path) -> None:
            subprocess.run(["umount", str(target)], check=True)
            self.points.remove(target)

    m = Mounts()
    try:
        yield m
    finally:
        for point in reversed(m.points):
            if subprocess.run(["umount", str(point)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(point)], capture_output=True)


# -- files that vanish during a scan ---------------------------------------------------------

# A runtime's temp files: created, written, then deleted, in a loop bounded by a count; a
# directory of them comes and goes too. It runs as its own process (no GIL shared with the
# scans) and says "ready" once its first round is done.
CHURN = textwrap.dedent("""
    import os, shutil, sys
    top, rounds = os.path.realpath(sys.argv[1]), int(sys.argv[2])  # stays in this release
    for r in range(rounds):
        names = [os.path.join(top, "t%d.tmp" % i) for i in range(100)]
        for name in names:
            with open(name, "w") as fh:
                fh.write("x" * 100)
        scratch = os.path.join(top, "scratch")
        os.mkdir(scratch)
        for i in range(20):
            with open(os.path.join(scratch, "s%d" % i), "w") as fh:
                fh.write("s")
        for name in names:
            os.unlink(name)
        shutil.rmtree(scratch)
        if r == 0:
            print("ready", flush=True)
""")
SCANS = 20


@pytest.fixture
def churn():
    """``churn(directory)``: start the churning process there and wait until it runs; it is
    ended with the test."""
    procs: list[subprocess.Popen] = []

    def start(top: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", CHURN, str(top), "1000000"],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _credential_project(where: Path, file_name: str = "key.env.j2") -> Path:
    """A committed project whose one role, ``worker``, is granted capability ``lk``: one
    credential file, ``file_name`` (a template of the secret)."""
    import yaml

    cap = {"capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
           file_name: "KEY={{ secret }}\n"}
    return make_project(where, {"runner": {"run": "r\n"}, "credentials": {"lk": cap}},
                        roles={"worker": {"prompt": "w", "capabilities": ["lk"]}})

def test_files_vanishing_during_the_scan_are_not_errors(tmp_path, sshd_pool, ssh_client_key,
                                                        ssh_known_hosts, churn):
    """Temp files and a directory created and deleted under ``current`` while drift scans over
    SSH (paths in .fleetignore): every one of SCANS drifts exits 0, in sync, nothing unreadable;
    a ship made meanwhile succeeds. (Before: "incomplete", exit 2, in most runs.)"""
    root = tmp_path / "host-root"
    bp = make_project(tmp_path / "proj", {"runner": RUNNER}, executable=("runner/run.sh",),
                      fleetignore="*.tmp\nscratch/\n")
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    assert ship(inv, bp).code == 0
    proc = churn(root / "current" / "runner")
    results = []
    for _ in range(SCANS):
        run = drift(inv, bp)
        results.append((run.code, run.host("web1")["status"], run.host("web1").get("unreadable")))
    assert proc.poll() is None, "the churn ended before the scans did"
    clean = sum(1 for r in results if r[0] == 0)
    seen = [u["path"] for r in results if r[0] != 0 for u in (r[2] or [])]
    assert clean == SCANS, f"{clean}/{SCANS} clean; unreadable: {seen[:3]} ({len(seen)} in all)"
    (bp / "runner" / "README").write_text("second\n")
    commit_all(bp)
    shipped = ship(inv, bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    assert proc.poll() is None


# -- never outside the root: mount points and symlinks ---------------------------------------


def _box(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts, **extra):
    """(inventory, blueprint, root) for pool box 0 as root, after a first ship."""
    root = tmp_path / "host-root"
    bp = project(tmp_path)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root, **extra)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    return inv, bp, root


def _outside(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """A directory outside the root with a few files; returns it and its snapshot."""
    out = tmp_path / name
    (out / "album").mkdir(parents=True)
    (out / "photo.jpg").write_bytes(b"\xff\xd8 a photo")
    (out / "album" / "b.jpg").write_bytes(b"\xff\xd8 another")
    return out, snapshot(out)


@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_prune_stops_at_a_mount_point_and_keeps_that_release(tmp_path, sshd_pool, ssh_client_key,
                                                             ssh_known_hosts, mounts, kind):
    """A bind mount of a directory outside the root (same file system: same st_dev), or a tmpfs,
    mounted inside an old release: the ship that prunes that release exits 0 with a warning
    naming the mount point, keeps the release and its record, and removes nothing outside the
    root (a symlink to outside in the release is not followed either). After the unmount the
    next ship prunes it. (Before: the bind mount's files were deleted; exit 0, an EBUSY
    warning.)"""
    inv, bp, root = _box(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts, keep_releases=2)
    old = current_target(root).split("/")[1]
    (bp / "runner" / "README").write_text("second\n")
    commit_all(bp)
    assert ship(inv, bp).code == 0  # ``old`` is no longer in use; the next ship prunes it
    media = root / "releases" / old / "runner" / "media"
    media.mkdir()
    source, before = _outside(tmp_path, "media-source")
    if kind == "bind":
        mounts.bind(source, media)
    else:
        mounts.tmpfs(media)
        (media / "on-tmpfs").write_text("keep me\n")
    victim, victim_before = _outside(tmp_path, "victim")
    os.symlink(victim, root / "releases" / old / "runner" / "to-outside")
    (bp / "runner" / "README").write_text("third\n")
    commit_all(bp)
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    result = run.host("web1")
    assert snapshot(source) == before and snapshot(victim) == victim_before
    assert old not in result["pruned"]
    assert any(str(media) in w and "mount point" in w for w in result["warnings"]), result
    assert (root / "releases" / old / "runner" / "run.sh").exists()  # kept whole
    assert (root / ".fleetctl" / "releases" / f"{old}.json").exists()  # and its record
    if kind == "tmpfs":
        assert (media / "on-tmpfs").read_text() == "keep me\n"
    mounts.unmount(media)
    (bp / "runner" / "README").write_text("fourth\n")
    commit_all(bp)
    again = ship(inv, bp)
    assert again.code == 0, again.stdout + again.stderr
    assert old in again.host("web1")["pruned"] and again.host("web1")["warnings"] == []
    assert not (root / "releases" / old).exists()
    assert snapshot(source) == before and snapshot(victim) == victim_before


def test_a_leftover_staging_release_with_a_mount_inside_is_kept_not_emptied(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts, mounts):
    """A ``releases/.staging-*`` left by a killed ship, with a bind mount and a symlink to
    outside the root in it: the next ship removes what is its own, keeps the mount point (a
    warning names it), touches nothing outside, and succeeds. (Before: the bind mount's files
    were deleted and the ship failed at prepare with EBUSY.)"""
    inv, bp, root = _box(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts)
    staging = root / "releases" / ".staging-20260101T000000000Z-deadbeef"
    (staging / "runner" / "mnt").mkdir(parents=True)
    (staging / "runner" / "half-written").write_text("x")
    source, before = _outside(tmp_path, "media-source")
    mounts.bind(source, staging / "runner" / "mnt")
    victim, victim_before = _outside(tmp_path, "victim")
    os.symlink(victim, staging / "to-outside")
    (bp / "runner" / "README").write_text("second\n")
    commit_all(bp)
    run = ship(inv, bp)
    assert run.code == 0, run.stdout + run.stderr
    warnings = run.host("web1")["warnings"]
    assert any(str(staging / "runner" / "mnt") in w for w in warnings), warnings
    assert snapshot(source) == before and snapshot(victim) == victim_before
    assert sorted(os.listdir(staging)) == ["runner"] and os.listdir(staging / "runner") == ["mnt"]
    assert drift(inv, bp).code == 0


def test_revoking_credentials_never_empties_a_mount_inside_them(
        tmp_path, real_users, monkeypatch, sshd_pool, ssh_client_key, ssh_known_hosts, mounts):
    """A directory bind-mounted inside an agent's credentials directory (its files are scanned
    like the agent's own): revoking the agent's grant with --force removes the credential files
    but never enters the mount: its source's files stay, a warning names it. (Before: each of
    its files was unlinked through the mount, then the ship failed with EBUSY.)"""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="fleetctl-credmount-"))
    os.chmod(base, 0o755)
    try:
        root = base / "box"
        bp = _credential_project(tmp_path / "proj")
        user = real_users.name("cm")
        monkeypatch.setenv("LK_SECRET", "s3cret")

        def configure(grants: dict) -> Path:
            agents = {"a": {"role": "worker", "user": user, "grants": grants}}
            return write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
                sshd_pool[0], ssh_client_key, ssh_known_hosts, root, agents)})

        inv = configure({"lk": {"scope": {}, "secret": {"env": "LK_SECRET"}}})
        assert ship(inv, bp).code == 0
        mnt = root / "credentials" / "a" / "mnt"
        mnt.mkdir()
        source, before = _outside(tmp_path, "media-source")
        mounts.bind(source, mnt)
        inv = configure({})
        run = ship(inv, bp, "--force")
        assert snapshot(source) == before
        assert run.code == 0, run.stdout + run.stderr
        assert any(str(mnt) in w for w in run.host("web1")["warnings"]), run.host("web1")
        assert not (root / "credentials" / "a" / "key.env").exists()
    finally:
        for point in list(mounts.points):
            mounts.unmount(point)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


# -- errors that name the path ---------------------------------------------------------------


def test_a_refused_chown_names_every_path_and_its_owner(user_box):
    """As a non-root login, files, a directory and a symlink declared ``owner: root:root``
    cannot be given away, and one names a user the host lacks: the ship stops at ``assemble``
    with exit 2, and the error names the host, the step and every one of those paths as the
    tree knows it, each with the owner it wanted and why (before: only the first file, by its
    staging name ``releases/.staging-<id>/...``); nothing is left."""
    inv, bp, root, _user, _box = user_box
    import yaml

    (bp / "attributes.yaml").write_text(yaml.safe_dump({"files": [
        {"match": "runner/README", "owner": "root:root"},
        {"match": "runner/lib", "owner": "root:root"},
        {"match": "runner/lib/util.py", "owner": "root:root"},
        {"match": "runner/latest", "owner": "root:root"},
        {"match": "runner/run.sh", "owner": "nosuchuser-fleetctl:root"}]}))
    commit_all(bp)
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("web1")
    assert result["step"] == "assemble", result
    head, *lines = result["error"].split("\n")
    assert head == "web1: assemble: could not set the owner of 5 path(s); nothing was switched", \
        result["error"]
    assert lines == [
        "  runner/README: root:root: Operation not permitted",
        "  runner/latest: root:root: Operation not permitted",
        "  runner/lib: root:root: Operation not permitted",
        "  runner/lib/util.py: root:root: Operation not permitted",
        "  runner/run.sh: nosuchuser-fleetctl:root: no such user on the host: "
        "nosuchuser-fleetctl"], result["error"]
    assert ".staging-" not in result["error"]
    text = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert "  runner/lib/util.py: root:root: Operation not permitted" in text.stdout.splitlines()
    assert not (root / "releases").exists() or os.listdir(root / "releases") == []


def test_refused_credential_owners_are_all_named(user_box, real_users, monkeypatch):
    """As a non-root login, two agents with users of their own are granted a credential each:
    neither file can be given to its agent. The ship stops at ``credentials`` (exit 2) naming
    both files, each with the owner it wanted; nothing is switched and no credential file is
    left behind (before: only the first, by its temporary name ``.fleetctl-new-...``)."""
    inv, _bp, root, unix_user, box = user_box
    import yaml

    bp = _credential_project(inv.parent / "credproj")
    users = {a: real_users.create(f"c{a}") for a in ("a", "b")}
    monkeypatch.setenv("LK_SECRET", "s3cret-for-both")
    spec = yaml.safe_load(inv.read_text())
    spec["hosts"]["web1"]["agents"] = {
        a: {"role": "worker", "user": u, "grants": {"lk": {"scope": {}, "secret":
                                                            {"env": "LK_SECRET"}}}}
        for a, u in users.items()}
    inv.write_text(yaml.safe_dump(spec))
    run = ship(inv, bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("web1")
    assert result["step"] == "credentials", result
    head, *lines = result["error"].split("\n")
    assert head == ("web1: credentials: could not set the owner of 2 path(s); no credential "
                    "file was changed; stopped, nothing was retried"), result["error"]
    assert lines == [f"  credentials/{a}/key.env: {u}:{u}: Operation not permitted"
                     for a, u in users.items()], result["error"]
    assert not (root / "current").exists()
    leftovers = [n for _d, _s, names in os.walk(root) for n in names if ".fleetctl-new" in n]
    assert leftovers == []


def test_a_full_disk_while_receiving_names_the_file(tmp_path, mount_tmpfs, sshd_pool,
                                                    ssh_client_key, ssh_known_hosts):
    """A 1 MiB file does not fit a 256 KiB disk: the error names the host, ``receive`` and the
    tree path that did not fit, in the release being made (``releases/<id>/runner/big.bin``),
    never the internal name it was received under (before: ``.fleetctl/incoming-<id>/<sha>``)."""
    from tests.transport.test_ssh import _ship_too_big

    root, _old, _tree, run = _ship_too_big(tmp_path, mount_tmpfs, sshd_pool[0], ssh_client_key,
                                           ssh_known_hosts)
    assert run.code == 2, run.stdout + run.stderr
    error = run.host("web1")["error"]
    assert error.startswith("web1: receive: OSError: No space left on device ("), error
    assert f"({root}/releases/" in error and error.endswith("/runner/big.bin)"), error
    assert "incoming-" not in error


def test_a_disk_filling_at_any_step_names_the_path(tmp_path, mount_tmpfs, sshd_pool,
                                                   ssh_client_key, ssh_known_hosts):
    """On a disk with one page more free at each attempt, the ship stops at receive, assemble,
    record...; every failure names its step and an absolute path under the root, the one a
    person knows (before: ``releases/.staging-<id>/...``, ``incoming-<id>/...``,
    ``<record>.json.tmp``)."""
    from tests.transport.test_ssh import _ship_onto_filling_disk

    root, _inv, _bp, _old, attempts = _ship_onto_filling_disk(
        tmp_path, mount_tmpfs, sshd_pool[0], ssh_client_key, ssh_known_hosts)
    failed = [(leave, run.host("web1")) for leave, run, *_ in attempts if run.code != 0]
    assert len(failed) >= 3
    for leave, result in failed:
        assert f"web1: {result['step']}: " in result["error"], (leave, result["error"])
        assert f"({root}/" in result["error"], (leave, result["error"])
        # A path a person knows, never an internal staging or temporary name.
        for internal in (".staging-", "incoming-", ".tmp)"):
            assert internal not in result["error"], (leave, result["error"])


def test_a_refused_credential_fix_names_the_credential_file(
        tmp_path, real_users, monkeypatch, sshd_pool, ssh_client_key, ssh_known_hosts):
    """A credential file whose mode was changed by hand and which is immutable (``chattr +i``):
    ``ship --force`` cannot put its mode back (fchmod on its fd is refused) and the error names
    the host, ``credentials`` and the file (before: no path)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="fleetctl-credfix-"))
    os.chmod(base, 0o755)
    target = None
    try:
        root = base / "box"
        bp = _credential_project(tmp_path / "proj")
        monkeypatch.setenv("LK_SECRET", "s3cret")
        agents = {"a": {"role": "worker", "user": real_users.name("cf"),
                        "grants": {"lk": {"scope": {}, "secret": {"env": "LK_SECRET"}}}}}
        inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
            sshd_pool[0], ssh_client_key, ssh_known_hosts, root, agents)})
        assert ship(inv, bp).code == 0
        target = root / "credentials" / "a" / "key.env"
        os.chmod(target, 0o400)
        if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode:
            target = None
            pytest.skip("chattr +i is not supported on this filesystem")
        run = ship(inv, bp, "--force")
        assert run.code == 2, run.stdout + run.stderr
        error = run.host("web1")["error"]
        assert error.startswith(
            "web1: credentials: PermissionError: Operation not permitted ("), error
        assert f"({target})" in error, error
    finally:
        if target is not None:
            subprocess.run(["chattr", "-i", str(target)], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


# -- temporary names within the name limit ---------------------------------------------------

LONG_NAME = "k" * 238 + ".env"  # 242 bytes: valid, but ".fleetctl-new-" + it is 256


def test_a_credential_file_with_a_242_byte_name_ships_rotates_and_leaves_nothing(
        tmp_path, real_users, monkeypatch, sshd_pool, ssh_client_key, ssh_known_hosts):
    """A credential file whose name is 242 bytes (its old temporary name was 256, over NAME_MAX)
    ships over SSH, is rotated by a second ship with no leftover, and a leftover a killed ship
    would leave (the shortened temporary name, same prefix) is fleetctl's own: drift calls it
    ``pending`` and the next ship removes it without --force. (Before: ship failed,
    "File name too long".)"""
    import tempfile

    from fleetctl.credentials import LEFTOVER_PREFIX
    from fleetctl.host.credentials import CREDS_NEW
    from fleetctl.host.files import temp_name

    assert len(LONG_NAME.encode()) == 242
    base = Path(tempfile.mkdtemp(prefix="fleetctl-longname-"))
    os.chmod(base, 0o755)  # the agent's user must reach its directory
    try:
        root = base / "box"
        bp = _credential_project(tmp_path / "proj", LONG_NAME + ".j2")
        user = real_users.name("lk")
        agents = {"a": {"role": "worker", "user": user,
                        "grants": {"lk": {"scope": {}, "secret": {"env": "LK_SECRET"}}}}}
        inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
            sshd_pool[0], ssh_client_key, ssh_known_hosts, root, agents)})
        agent_dir = root / "credentials" / "a"
        for value in ("first-value", "rotated-value"):
            monkeypatch.setenv("LK_SECRET", value)
            run = ship(inv, bp)
            assert run.code == 0, run.stdout + run.stderr
            assert os.listdir(agent_dir) == [LONG_NAME]
            assert (agent_dir / LONG_NAME).read_bytes() == f"KEY={value}\n".encode()
            assert drift(inv, bp).code == 0
        leftover_name = temp_name(CREDS_NEW, LONG_NAME.encode())
        assert len(leftover_name) <= 255 and leftover_name.startswith(LEFTOVER_PREFIX.encode())
        (agent_dir / os.fsdecode(leftover_name)).write_bytes(b"KEY=first-value\n")
        found = drift(inv, bp)
        assert {(c["path"], c["change"], c["origin"]) for c in found.host("web1")["changes"]} == {
            (f"credentials/a/{os.fsdecode(leftover_name)}", "extra", "pending")}
        assert ship(inv, bp).code == 0
        assert os.listdir(agent_dir) == [LONG_NAME]
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


@pytest.mark.parametrize("prefix,suffix", [(b".fleetctl-new-", b""), (b".staging-", b""),
                                           (b".current.", b""), (b"", b".tmp")])
def test_every_temporary_name_fits_for_any_valid_final_name(prefix, suffix):
    """For every final name length 1..255 the temporary name is at most 255 bytes, keeps its
    prefix and suffix, is the plain ``prefix + name + suffix`` whenever that fits, and differs
    for different names."""
    from fleetctl.host.files import temp_name

    seen = set()
    for length in range(1, 256):
        name = b"n" * length
        tmp = temp_name(prefix, name, suffix)
        assert len(tmp) <= 255 and tmp.startswith(prefix) and tmp.endswith(suffix)
        if len(prefix + name + suffix) <= 255:
            assert tmp == prefix + name + suffix
        seen.add(tmp)
    assert len(seen) == 255


# -- the walk itself, with the race made deterministic ---------------------------------------


def _walk(top: Path, on_entry=None):
    from fleetctl.host.walk import walk

    seen, bad = [], []

    def sink(entry):
        seen.append(entry["path"])
        if on_entry:
            on_entry(entry)

    walk(os.fsencode(top), sink, lambda rel, exc: bad.append((rel, exc.errno)))
    return sorted(seen), bad


def test_what_vanishes_after_the_listing_is_absent_and_unreadable_stays_unreadable(tmp_path):
    """The first entry the walk describes removes every other file and directory of the tree
    (listed, not yet read): only that entry (and what is under it) is seen, nothing is
    unreadable. (What cannot be read is
    still unreadable: tests/transport/test_ssh.py::test_unreadable_subtree_makes_scan_incomplete.)"""
    import shutil

    top = tmp_path / "t"
    for name in ("a", "b", "c"):
        (top / "d" / name).mkdir(parents=True)
        (top / "d" / name / "f").write_text("x")
        (top / f"f{name}").write_text("x")
        os.symlink("nowhere", top / f"l{name}")

    def sweep(entry):
        if len(seen_once) == 0:
            seen_once.append(entry["path"])
            for child in top.iterdir():
                if child.name != entry["path"]:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() \
                        else child.unlink()

    seen_once: list[str] = []
    seen, bad = _walk(top, sweep)
    (first,) = seen_once
    assert bad == []
    assert all(p == first or p.startswith(first + "/") for p in seen), (first, seen)


def test_a_tree_removed_while_it_is_walked_is_unreadable_not_empty(tmp_path):
    """If the scanned tree itself goes (a release pruned under a drift), the walk does not end
    as if it had been empty: it reports the top as unreadable."""
    import errno
    import shutil

    top = tmp_path / "t"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "f").write_text("x")
    seen, bad = _walk(top, lambda entry: shutil.rmtree(top) if top.exists() else None)
    assert bad == [(b"", errno.ENOENT)]


def test_a_directory_swapped_for_a_symlink_during_the_walk_is_never_followed(tmp_path):
    """Right after the walk has described ``d`` as a directory, ``d`` is replaced by a symlink
    to a directory outside the tree: nothing of that outside directory is ever read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the tree's\n")
    top = tmp_path / "t"
    (top / "d").mkdir(parents=True)
    (top / "d" / "f").write_text("x")

    def swap(entry):
        if entry["path"] == "d":
            os.rename(top / "d", tmp_path / "d-aside")
            os.symlink(outside, top / "d")

    seen, bad = _walk(top, swap)
    assert seen == ["d"] and bad == []


def test_a_non_root_login_prunes_releases_with_read_only_and_closed_directories(user_box):
    """As a non-root login, an old release holding 0555 directories with files, and a staging
    release a killed ship left with a 0000 directory and a 0555 one in it, are removed
    completely: each directory is opened up through its own file descriptor; no warning.
    (With keep_releases 1 the old release is pruned once it is no longer the rollback
    target.)"""
    import yaml

    inv, bp, root, user, _box = user_box
    inv.write_text(inv.read_text().replace("transport: ssh",
                                           "keep_releases: 1\n    transport: ssh"))
    (bp / "attributes.yaml").write_text(yaml.safe_dump(
        {"dirs": [{"path": "runner/ro", "mode": "0555"}],
         "files": [{"match": "runner/lib", "mode": "0555"}]}))
    commit_all(bp)
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    old = root / current_target(root)
    assert os.lstat(old / "runner" / "lib").st_mode & 0o777 == 0o555
    staging = root / "releases" / ".staging-20260101T000000000Z-0badf00d"
    for d in (staging / "closed", staging / "ro"):
        d.mkdir(parents=True)
        (d / "f").write_text("x")
    for p in (staging, staging / "closed", staging / "closed" / "f", staging / "ro",
              staging / "ro" / "f"):
        os.chown(p, user.pw_uid, user.pw_gid)
    os.chmod(staging / "closed", 0)
    os.chmod(staging / "ro", 0o555)
    (bp / "runner" / "README").write_text("second\n")
    commit_all(bp)
    second = ship(inv, bp)
    assert second.code == 0, second.stdout + second.stderr
    # keep_releases 1 still keeps the release to roll back to: the old one goes a ship later.
    assert second.host("web1")["pruned"] == [] and second.host("web1")["warnings"] == []
    assert not staging.exists()
    (bp / "runner" / "README").write_text("third\n")
    commit_all(bp)
    third = ship(inv, bp)
    assert third.code == 0, third.stdout + third.stderr
    assert third.host("web1")["pruned"] == [old.name] and third.host("web1")["warnings"] == []
    assert not old.exists()


@pytest.mark.parametrize("name", ["releases", ".fleetctl"])
def test_releases_or_state_dir_swapped_for_a_symlink_is_never_written_through(
        tmp_path, name, sshd_pool, ssh_client_key, ssh_known_hosts):
    """A host where ``releases/`` or ``.fleetctl/`` was replaced by a symlink to a directory
    outside the root: the ship stops at prepare (exit 2) naming it, and nothing is written in
    the directory it points to."""
    from tests.commands.test_ship_guards import commit_change

    bp = make_project(tmp_path / "proj", {"runner": {"a": "a\n"}})
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    first = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert first.code == 0, first.stdout
    outside = tmp_path / "outside"
    os.rename(root / name, outside)
    os.symlink(outside, root / name)
    before = snapshot(outside)
    commit_change(bp, "b", "b\n")
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout
    host = json.loads(run.stdout)["hosts"][0]
    assert host["step"] == "prepare" and name in host["error"]
    assert snapshot(outside) == before
