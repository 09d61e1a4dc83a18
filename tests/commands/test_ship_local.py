"""Ship and drift end to end on local boxes (a directory as the host): the tree model's edge
cases, each checked against an independent snapshot of the host's directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (Symlink, build_tree, changes_of, cli, git, local_host, make_project,
                           snapshot, without_inodes, write_inventory)


class Fleet:
    """One blueprint (a git repo) and one local host, driven through the CLI."""

    def __init__(self, tmp_path: Path, files: dict, **project_kw) -> None:
        self.base = tmp_path
        self.bp = make_project(tmp_path, files, **project_kw)
        self.root = tmp_path / "box"
        self.inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(self.root)})

    def run(self, *args: str):
        return cli(*args, "--format", "json", inventory=self.inv, blueprint=self.bp)

    def ship(self, *extra: str):
        return self.run("ship", "--yes", *extra)

    def drift(self):
        return self.run("drift")

    @property
    def current(self) -> Path:
        return self.root / "current"

    def commit(self, files: dict | None = None, remove: tuple[str, ...] = ()) -> None:
        if files:
            build_tree(self.bp, files)
        for rel in remove:
            p = self.bp / rel
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        git(self.bp, "add", "-A")
        git(self.bp, "commit", "-q", "-m", "change", "--allow-empty")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path, {"runner": {"run.sh": "#!/bin/sh\necho run\n", "conf": "a=1\n",
                                    "link": Symlink("conf"), "sub": {"x": "x\n"}}},
              executable=("runner/run.sh",))
    first = f.ship()
    assert first.code == 0, first.stderr
    return f


def test_first_ship_lays_out_the_exact_tree(fleet):
    snap = snapshot(fleet.current)
    uid, gid = os.getuid(), os.getgid()
    expected = {
        b"runner": ("dir", 0o755, uid, gid, None),
        b"runner/run.sh": ("file", 0o755, uid, gid, sha(b"#!/bin/sh\necho run\n")),
        b"runner/conf": ("file", 0o644, uid, gid, sha(b"a=1\n")),
        b"runner/link": ("symlink", None, uid, gid, b"conf"),
        b"runner/sub": ("dir", 0o755, uid, gid, None),
        b"runner/sub/x": ("file", 0o644, uid, gid, sha(b"x\n")),
        b"agents": ("dir", 0o755, uid, gid, None),
        b"agents/w1": ("dir", 0o755, uid, gid, None),
        b"agents/w1/agent.yaml": ("file", 0o644, uid, gid, sha(b"agent: w1\nrole: worker\n")),
    }
    assert without_inodes(snap) == expected
    assert os.readlink(fleet.current).startswith(b"releases/".decode())
    assert fleet.drift().code == 0


def test_second_ship_is_a_no_op_that_says_so(fleet):
    before = snapshot(fleet.root)
    run = fleet.ship()
    assert run.code == 0 and run.host("h")["status"] == "no-op"
    assert snapshot(fleet.root) == before
    text = cli("ship", "--yes", inventory=fleet.inv, blueprint=fleet.bp)
    assert "nothing to ship" in text.stdout


def test_every_pending_kind_is_applied(fleet):
    # conf content changes, a new file appears, link points elsewhere, sub/ is gone
    fleet.commit({"runner": {"conf": "a=2\n", "new": "n\n"}},
                 remove=("runner/sub", "runner/link"))
    os.symlink("new", fleet.bp / "runner" / "link")
    fleet.commit()
    drift = fleet.drift()
    assert drift.code == 1
    assert changes_of(drift, "h") == {
        ("runner/conf", "content", "pending"), ("runner/new", "missing", "pending"),
        ("runner/link", "target", "pending"), ("runner/sub", "extra", "pending"),
        ("runner/sub/x", "extra", "pending")}
    assert fleet.ship().code == 0
    snap = snapshot(fleet.current)
    assert b"runner/sub" not in snap and b"runner/sub/x" not in snap
    assert snap[b"runner/link"][4] == b"new"
    assert snap[b"runner/conf"][4] == sha(b"a=2\n")
    assert fleet.drift().code == 0


def test_refusal_writes_nothing_and_names_the_paths(fleet):
    (fleet.current / "runner" / "conf").write_text("patched on the box\n")
    (fleet.current / "runner" / "stray").write_text("left by a person\n")
    before = snapshot(fleet.root)
    run = fleet.ship()
    assert run.code == 3
    host = run.host("h")
    assert host["status"] == "refused"
    assert "runner/conf" in host["error"] and "runner/stray" in host["error"]
    assert snapshot(fleet.root) == before  # inodes included: nothing touched at all
    assert changes_of(run, "h") == {("runner/conf", "content", "hand-patch"),
                                    ("runner/stray", "extra", "hand-patch")}


def test_conflict_and_force(fleet):
    fleet.commit({"runner": {"conf": "a=blueprint\n"}})
    (fleet.current / "runner" / "conf").write_text("a=box\n")
    drift = fleet.drift()
    assert changes_of(drift, "h") == {("runner/conf", "content", "conflict")}
    assert fleet.ship().code == 3
    forced = fleet.ship("--force")
    assert forced.code == 0
    assert (fleet.current / "runner" / "conf").read_bytes() == b"a=blueprint\n"
    assert fleet.drift().code == 0


def test_unknown_origin_for_a_tree_without_record(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}})
    # A box set up by something else: a release and a current link, but no fleetctl record.
    build_tree(f.root / "releases" / "old", {"runner": {"a": "old\n"}})
    os.symlink("releases/old", f.root / "current")
    drift = f.drift()
    assert drift.code == 1
    origins = {c["origin"] for c in drift.host("h")["changes"]}
    assert origins == {"unknown"}
    assert f.ship().code == 3
    assert f.ship("--force").code == 0
    assert f.drift().code == 0


def test_mode_only_change_is_reported_as_mode_only(fleet):
    os.chmod(fleet.current / "runner" / "conf", 0o600)
    assert changes_of(fleet.drift(), "h") == {("runner/conf", "mode", "hand-patch")}


def test_owner_change_is_drift_and_declared_owner_is_applied(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n", "b": "b\n"}},
              attributes={"files": [{"match": "runner/b", "owner": "nobody:nogroup"}]})
    assert f.ship().code == 0
    st = os.lstat(f.current / "runner" / "b")
    import grp
    import pwd
    assert (st.st_uid, st.st_gid) == (pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid)
    os.chown(f.current / "runner" / "a", pwd.getpwnam("nobody").pw_uid, -1)
    assert changes_of(f.drift(), "h") == {("runner/a", "owner", "hand-patch")}


def test_mtime_only_change_is_not_drift(fleet):
    os.utime(fleet.current / "runner" / "conf", (1, 1))
    assert fleet.drift().code == 0


def test_live_symlink_to_identical_bytes_is_a_type_change(fleet):
    conf = fleet.current / "runner" / "conf"
    data = conf.read_bytes()
    (fleet.base / "same").write_bytes(data)
    conf.unlink()
    os.symlink(fleet.base / "same", conf)
    assert changes_of(fleet.drift(), "h") == {("runner/conf", "type", "hand-patch")}
    assert fleet.ship("--force").code == 0
    assert not (fleet.current / "runner" / "conf").is_symlink()
    assert (fleet.current / "runner" / "conf").read_bytes() == data


@pytest.mark.parametrize("new", ["file", "symlink"])
def test_directory_replaced_by_file_or_symlink_and_back(fleet, new):
    fleet.commit(remove=("runner/sub",))
    if new == "file":
        fleet.commit({"runner": {"sub": "now a file\n"}})
    else:
        os.symlink("conf", fleet.bp / "runner" / "sub")
        fleet.commit()
    assert changes_of(fleet.drift(), "h") >= {("runner/sub", "type", "pending")}
    assert fleet.ship().code == 0
    snap = snapshot(fleet.current)
    assert snap[b"runner/sub"][0] == new and b"runner/sub/x" not in snap
    # and back to a directory
    fleet.commit(remove=("runner/sub",))
    fleet.commit({"runner": {"sub": {"x": "x\n"}}})
    assert fleet.ship().code == 0
    assert snapshot(fleet.current)[b"runner/sub"][0] == "dir"
    assert fleet.drift().code == 0


def test_empty_directories_keep_exact_modes_including_sticky(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}},
              attributes={"dirs": [{"path": "runner/spool", "mode": "1777"},
                                   {"path": "runner/locked", "mode": "0500"},
                                   {"path": "runner/sgid", "mode": "2750"}]})
    old_umask = os.umask(0o077)  # the host's umask must not leak into modes
    try:
        assert f.ship().code == 0
    finally:
        os.umask(old_umask)
    snap = snapshot(f.current)
    assert snap[b"runner/spool"][1] == 0o1777
    assert snap[b"runner/locked"][1] == 0o500
    assert snap[b"runner/sgid"][1] == 0o2750
    assert snap[b"runner/a"][1] == 0o644
    assert f.drift().code == 0


def test_releases_share_no_inode_and_hard_links_on_host_are_not_followed(fleet):
    old_release = os.path.realpath(fleet.current)
    conf, x = fleet.current / "runner" / "conf", fleet.current / "runner" / "sub" / "x"
    # Someone hard-links two managed files together on the host: x now is conf's inode.
    x.unlink()
    os.link(conf, x)
    fleet.ship("--force")
    new_release = os.path.realpath(fleet.current)
    assert new_release != old_release
    old_inodes = {v[5] for v in snapshot(old_release).values()}
    new_inodes = {v[5] for v in snapshot(new_release).values()}
    assert not old_inodes & new_inodes
    # Editing one file of the new release in place changes nothing else anywhere.
    with open(fleet.current / "runner" / "conf", "r+b") as fh:
        fh.write(b"Z")
    assert (fleet.current / "runner" / "sub" / "x").read_bytes() == b"x\n"
    assert Path(old_release, "runner", "conf").read_bytes() == b"a=1\n"


def test_dry_run_prints_the_plan_and_writes_nothing(fleet):
    fleet.commit({"runner": {"conf": "a=3\n", "added": "+\n"}})
    before = snapshot(fleet.root)
    dry = fleet.ship("--dry-run")
    assert dry.code == 0 and dry.host("h")["status"] == "dry-run"
    assert snapshot(fleet.root) == before
    real = fleet.ship()
    assert real.host("h")["status"] == "shipped"
    assert changes_of(dry, "h") == changes_of(real, "h") == {
        ("runner/conf", "content", "pending"), ("runner/added", "missing", "pending")}


def test_dry_run_on_a_new_host_creates_nothing(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}})
    assert f.ship("--dry-run").code == 0
    assert not f.root.exists()


def test_undefined_variable_aborts_before_touching_the_host(fleet):
    fleet.commit({"runner": {"conf.j2": "x={{ not_defined_anywhere }}\n"}})
    before = snapshot(fleet.root)
    run = fleet.ship()
    assert run.code == 2
    assert "runner/conf.j2:1: undefined variable 'not_defined_anywhere'" in run.host("h")["error"]
    assert snapshot(fleet.root) == before


def test_keeps_last_five_releases_and_never_prunes_current(fleet):
    for i in range(6):
        fleet.commit({"runner": {"conf": f"a={i + 10}\n"}})
        assert fleet.ship().code == 0
    releases = sorted(os.listdir(fleet.root / "releases"))
    assert len(releases) == 5
    assert os.path.basename(os.readlink(fleet.current)) == releases[-1]
    records = sorted(os.listdir(fleet.root / ".fleetctl" / "releases"))
    assert records == [r + ".json" for r in releases]


def test_only_missing_content_is_sent(fleet):
    fleet.commit({"runner": {"conf": "a=1\n", "copy-of-conf": "a=1\n", "fresh": "new bytes\n"}})
    run = fleet.ship()
    host = run.host("h")
    assert host["sent_files"] == 1 and host["sent_bytes"] == len(b"new bytes\n")


def test_record_holds_digests_not_contents(fleet):
    (record,) = (fleet.root / ".fleetctl" / "releases").iterdir()
    text = record.read_text()
    assert "echo run" not in text and sha(b"#!/bin/sh\necho run\n") in text


def test_fleetignore_paths_never_drift(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a.py": "print(1)\n"}}, fleetignore="__pycache__/\n*.pyc\n")
    assert f.ship().code == 0
    build_tree(f.current / "runner", {"__pycache__": {"a.cpython-311.pyc": b"\x00"}, "b.pyc": b"1"})
    assert f.drift().code == 0


def test_markdown_and_text_reports(fleet):
    (fleet.current / "runner" / "conf").write_text("x\n")
    md = cli("drift", "--format", "markdown", inventory=fleet.inv, blueprint=fleet.bp)
    assert md.code == 1
    assert "| `runner/conf` | content | hand-patch |" in md.stdout
    text = cli("drift", inventory=fleet.inv, blueprint=fleet.bp)
    assert text.code == 1 and "runner/conf" in text.stdout and "hand-patch" in text.stdout


def test_output_file(fleet, tmp_path):
    out = tmp_path / "report.json"
    run = cli("drift", "--format", "json", "--output", str(out), inventory=fleet.inv,
              blueprint=fleet.bp)
    assert run.code == 0 and run.stdout == ""
    import json
    assert json.loads(out.read_text())["hosts"][0]["status"] == "in-sync"


def test_leftovers_of_an_interrupted_ship_are_removed(fleet):
    """A killed ship can leave a staging release and received content; the next ship (which
    holds the lock) removes both."""
    (fleet.root / "releases" / ".staging-x" / "runner").mkdir(parents=True)
    (fleet.root / ".fleetctl" / "incoming-x").mkdir()
    (fleet.root / ".fleetctl" / "incoming-x" / "blob").write_bytes(b"partial")
    fleet.commit({"runner": {"conf": "a=4\n"}})
    assert fleet.ship().code == 0
    assert not (fleet.root / "releases" / ".staging-x").exists()
    assert not (fleet.root / ".fleetctl" / "incoming-x").exists()


def test_a_failed_ship_keeps_the_plan_and_the_release_in_use(fleet):
    """A failure on the host reports its step and keeps the plan and previous release."""
    in_use = os.readlink(fleet.current)
    (fleet.bp / "attributes.yaml").write_text(
        "files:\n  - match: runner/conf\n    owner: \"nosuchuser:nosuchgroup\"\n")
    fleet.commit({"runner": {"conf": "a=5\n"}})
    run = fleet.ship()
    host = run.host("h")
    assert run.code == 2 and host["status"] == "error"
    assert host["step"] == "assemble" and "nosuchuser" in host["error"]
    assert host["previous"] == os.path.basename(in_use) and host["changes"]
    assert os.readlink(fleet.current) == in_use
    assert os.listdir(fleet.root / "releases") == [os.path.basename(in_use)]


def test_a_root_that_is_a_file_is_an_error_not_an_empty_host(tmp_path):
    """Regression: a root that exists as a file used to scan as an empty host (drift: all
    pending) and a ship then failed with a raw NotADirectoryError."""
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}})
    f.root.write_text("not a directory\n")
    for run in (f.drift(), f.ship()):
        host = run.host("h")
        assert run.code == 2 and host["status"] == "error"
        assert "exists and is not a directory" in host["error"]
    assert f.root.read_text() == "not a directory\n"


def test_a_ship_refused_for_edits_made_during_it_names_every_edited_path(fleet, monkeypatch):
    """A person edits the release in use while a ship is prepared (after the host's scan and
    checks, before the switch): a file changed, one added, one removed. The host re-hashes
    ``current`` under the lock before switching (docs/design.md (f)), refuses (exit 3), and the
    error names exactly those three paths, each with what happened to it; the release in use
    and its files stay as the person left them, and no new release is kept. Before: "the
    current release was edited during the ship", no path."""
    from fleetctl.ship import HostShip

    in_use = os.readlink(fleet.current)
    fleet.commit({"runner": {"conf": "a=2\n"}})
    real_commit = HostShip.commit

    def edit_then_commit(ship):
        (fleet.current / "runner" / "run.sh").write_text("#!/bin/sh\necho patched\n")
        (fleet.current / "runner" / "sub" / "new").write_text("new\n")
        (fleet.current / "runner" / "sub" / "x").unlink()
        real_commit(ship)

    monkeypatch.setattr(HostShip, "commit", edit_then_commit)
    run = fleet.ship()
    host = run.host("h")
    assert run.code == 3, run.stdout + run.stderr
    head, *lines = host["error"].split("\n")
    assert head.startswith("h: switch: the current release was edited during the ship "
                           "(3 path(s)); nothing was switched"), host["error"]
    assert lines == ["  runner/run.sh: changed", "  runner/sub/new: added",
                     "  runner/sub/x: removed"], host["error"]
    assert os.readlink(fleet.current) == in_use
    assert os.listdir(fleet.root / "releases") == [os.path.basename(in_use)]
    assert (fleet.current / "runner" / "run.sh").read_text() == "#!/bin/sh\necho patched\n"


def test_every_home_that_cannot_be_given_to_its_agent_is_named(tmp_path, real_users):
    """The host program runs as root of a user namespace (``unshare -r``: uid 0, but the agents'
    uids are not mapped, so chown is refused with EINVAL, as on a file system without owners).
    Two agents whose HOMEs the ship must create: it stops at ``users`` naming both HOMEs with
    the owner each wanted (before: "OSError: Invalid argument", no path, only the first)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-r", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces not allowed here: {probe.stderr.decode().strip()}")
    python = tmp_path / "ns-python"
    python.write_text(f"#!/bin/sh\nexec unshare -r {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    homes = {a: tmp_path / "homes" / a for a in ("a", "b")}
    homes["a"].parent.mkdir()
    users = {a: real_users.create(f"h{a}", home=str(homes[a])) for a in homes}
    for home in homes.values():  # the ship makes them
        shutil.rmtree(home)
    agents = {a: {"role": "worker", "user": u, "home": str(homes[a])} for a, u in users.items()}
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box", agents,
                                                                  python=str(python))})
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    result = run.host("h")
    assert result["step"] == "users", result
    head, *lines = result["error"].split("\n")
    assert head == "h: users: could not set the owner of 2 path(s); nothing was switched", \
        result["error"]
    assert lines == [f"  {homes[a]}: {u}:{u}: Invalid argument" for a, u in users.items()], \
        result["error"]
    assert not (tmp_path / "box" / "current").exists()


def test_a_failed_ship_about_several_paths_keeps_every_one_in_the_history(tmp_path):
    """An error about every path whose owner could not be set (two here) is recorded in the
    host's history with each path and the owner refused, and ``history`` shows them all
    (before: the line kept no path at all once the error named more than one)."""
    f = Fleet(tmp_path, {"runner": {"a": "a\n", "b": "b\n", "c": "c\n"}})
    assert f.ship().code == 0
    build_tree(f.bp, {"attributes.yaml": (
        "files:\n  - match: runner/a\n    owner: no-such-user-qa:root\n"
        "  - match: runner/b\n    owner: no-such-user-qb:root\n")})
    f.commit()
    assert f.ship().code == 2
    import json
    lines = [json.loads(x) for x in (f.root / ".fleetctl" / "history.jsonl").read_text()
             .splitlines()]
    failed = lines[-1]
    assert (failed["kind"], failed["step"], failed["items_total"]) == ("failed", "assemble", 2)
    assert [p for p, _ in failed["items"]] == ["runner/a", "runner/b"]
    assert "no-such-user-qa" in failed["items"][0][1]
    assert "no-such-user-qb" in failed["items"][1][1]
    doc = cli("history", "--format", "json", inventory=f.inv).doc
    (entry,) = [e for e in doc["entries"] if e["kind"] == "failed"]
    assert entry["items"] == failed["items"] and entry["path"] == "runner/a"
    shown = cli("history", inventory=f.inv).stdout
    assert "runner/a: no-such-user-qa" in shown and "runner/b: no-such-user-qb" in shown
