"""Ship can never regress or damage a fleet by an ordinary mistake (issue 9), against real sshd
boxes and real git repositories: stale checkouts, dirty sources, wrong hosts, concurrent ships
over the same hosts, a ship in progress seen by drift, and the provenance every release records.

Expected values come from git itself (``rev-parse``, ``rev-list``) and from the files on the
boxes read here with plain ``json``/``os``, never from fleetctl's code.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import git, make_project, snapshot, ssh_host, write_inventory
from tests.transport.test_ssh import RUNNER, EXECUTABLE, drift, ship

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def commit_change(bp: Path, name: str, text: str) -> str:
    (bp / "runner" / name).write_text(text)
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", f"change {name}")
    return head(bp)


def records(root: Path) -> dict[str, dict]:
    """Release id → its record on the host, read with plain json."""
    out = {}
    for path in (root / ".fleetctl" / "releases").glob("*.json"):
        if not path.name.endswith(".credentials.json"):
            out[path.stem] = json.loads(path.read_text())
    return out


def current_record(root: Path) -> dict:
    return records(root)[os.readlink(root / "current").rsplit("/", 1)[1]]


@pytest.fixture
def fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """A committed blueprint and one sshd box (``web1``), shipped once."""
    root = tmp_path / "root-web1"
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, root)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    return inv, bp, root


# -- provenance ----------------------------------------------------------------------------------


def test_every_release_records_where_it_came_from(fleet):
    inv, bp, root = fleet
    record = current_record(root)
    assert record["source"] == {"commit": head(bp), "clean": True, "dirty": []}
    assert record["host"] == "web1" and len(record["host_id"]) == 32
    assert record["allow_dirty"] is False and record["forced"] is None
    assert record["shipped_by"].startswith(os.environ.get("USER", "root") + "@") or \
        "@" in record["shipped_by"]
    identity = json.loads((root / ".fleetctl" / "identity.json").read_text())
    assert identity["name"] == "web1" and identity["id"] == record["host_id"]
    seen = drift(inv, bp)
    assert seen.code == 0, seen.stdout
    assert seen.host("web1")["commit"] == head(bp)
    assert seen.doc["source"]["commit"] == head(bp) and seen.doc["source"]["clean"] is True


# -- stale checkout ------------------------------------------------------------------------------


def test_a_checkout_behind_the_host_is_refused_and_drift_says_how_far(fleet, tmp_path):
    inv, bp, root = fleet
    base_commit = head(bp)
    for i in range(3):
        commit_change(bp, f"f{i}", f"{i}\n")
    assert ship(inv, bp).code == 0
    newest = head(bp)
    old = tmp_path / "old-clone"
    subprocess.run(["git", "clone", "-q", str(bp.parent), str(old)], check=True)
    git(old, "checkout", "-q", base_commit)
    old_bp = old / "blueprint"
    before = snapshot(root)
    for args in (("--dry-run",), ()):
        run = ship(inv, old_bp, *args)
        assert run.code == 3, run.stdout + run.stderr
        host = run.host("web1")
        assert host["status"] == "refused"
        assert base_commit[:12] in host["error"] and newest[:12] in host["error"]
        assert "3 commit(s) behind" in host["error"]
        assert snapshot(root) == before
    seen = drift(inv, old_bp)
    assert seen.code == 1, seen.stdout
    assert seen.host("web1")["ancestry"] == {"relation": "behind", "host_commit": newest,
                                            "source_commit": base_commit, "ahead": 0,
                                            "behind": 3}
    forced = ship(inv, old_bp, "--force")
    assert forced.code == 0, forced.stdout
    record = current_record(root)
    assert record["forced"]["stale"]["relation"] == "behind"
    assert record["source"]["commit"] == base_commit


def test_a_diverged_checkout_and_an_unknown_commit_are_refused(fleet, tmp_path):
    inv, bp, root = fleet
    start = head(bp)
    shipped = commit_change(bp, "main-only", "m\n")
    assert ship(inv, bp).code == 0
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(bp.parent), str(other)], check=True)
    git(other, "checkout", "-q", "-b", "side", start)
    commit_change(other / "blueprint", "side-only", "s\n")
    run = ship(inv, other / "blueprint")
    assert run.code == 3, run.stdout
    assert "diverged (1 ahead, 1 behind)" in run.host("web1")["error"]
    # A clone that never saw the shipped commit cannot tell: it says so and suggests fetching.
    lonely = tmp_path / "lonely"
    git(bp, "branch", "old", start)
    subprocess.run(["git", "clone", "-q", "--no-local", "--single-branch", "-b", "old",
                    str(bp.parent), str(lonely)], check=True)
    assert subprocess.run(["git", "-C", str(lonely), "cat-file", "-e", shipped],
                          capture_output=True).returncode != 0  # it really lacks the commit
    unknown = ship(inv, lonely / "blueprint")
    assert unknown.code == 3, unknown.stdout
    assert "does not have" in unknown.host("web1")["error"]
    assert shipped[:12] in unknown.host("web1")["error"]
    assert "git fetch" in unknown.host("web1")["hint"]


# -- dirty source --------------------------------------------------------------------------------


def test_a_dirty_source_is_refused_naming_the_files_and_allow_dirty_is_recorded(fleet):
    inv, bp, root = fleet
    before = snapshot(root)
    (bp / "runner" / "README").write_text("edited, not committed\n")
    (bp / "runner" / "scratch.txt").write_text("password=hunter2\n")
    run = ship(inv, bp)
    assert run.code == 3, run.stdout
    error = run.host("web1")["error"]
    assert "blueprint/runner/README (modified)" in error
    assert "blueprint/runner/scratch.txt (untracked)" in error
    assert "hunter2" not in run.stdout + run.stderr
    assert snapshot(root) == before
    seen = drift(inv, bp)
    assert seen.doc["source"]["clean"] is False
    assert "blueprint/runner/scratch.txt (untracked)" in seen.doc["source"]["dirty"]
    text = subprocess.run([FLEETCTL, "drift", "--inventory", str(inv), "--blueprint", str(bp)],
                          capture_output=True, text=True)
    assert "NOT CLEAN" in text.stdout
    allowed = ship(inv, bp, "--allow-dirty")
    assert allowed.code == 0, allowed.stdout
    record = current_record(root)
    assert record["allow_dirty"] is True and record["source"]["clean"] is False
    assert (Path(os.path.realpath(root / "current")) / "runner" / "scratch.txt").exists()


def test_ignored_files_are_never_rendered_and_a_blueprint_outside_git_needs_allow_dirty(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    (bp.parent / ".gitignore").write_text((bp.parent / ".gitignore").read_text() +
                                          "*.pyc\n*~\n")
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "ignore")
    (bp / "runner" / "lib" / "util.pyc").write_bytes(b"\0compiled")
    (bp / "runner" / "README~").write_text("editor backup\n")
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[1], ssh_client_key, ssh_known_hosts, root)})
    run = ship(inv, bp)
    assert run.code == 0, run.stdout
    live = Path(os.path.realpath(root / "current"))
    assert not (live / "runner" / "lib" / "util.pyc").exists()
    assert not (live / "runner" / "README~").exists()
    loose = tmp_path / "loose"
    shutil.copytree(bp.parent / "blueprint", loose / "blueprint")
    shutil.copytree(bp.parent / "templates", loose / "templates")
    shutil.rmtree(loose / "blueprint" / ".git", ignore_errors=True)
    refused = ship(inv, loose / "blueprint", "--dry-run")
    assert refused.code == 3 and "not in a git repository" in refused.host("web1")["error"]


# -- host identity -------------------------------------------------------------------------------


def test_an_entry_that_reaches_another_host_is_stopped(tmp_path, sshd_pool, ssh_client_key,
                                                       ssh_known_hosts):
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    roots = {"alpha": tmp_path / "alpha", "beta": tmp_path / "beta"}
    good = write_inventory(tmp_path / "inv.yaml", {
        name: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[name])
        for name, box in zip(roots, sshd_pool)})
    assert ship(good, bp).code == 0
    commit_change(bp, "new", "n\n")
    # beta's entry now points at alpha's box and root (a copy-paste slip).
    wrong = write_inventory(tmp_path / "wrong.yaml", {
        "alpha": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, roots["alpha"]),
        "beta": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, roots["alpha"])})
    before = {n: snapshot(r) for n, r in roots.items()}
    seen = drift(wrong, bp, "beta")
    assert seen.code == 2, seen.stdout
    assert "'alpha'" in seen.host("beta")["error"] and "'beta'" in seen.host("beta")["error"]
    alone = ship(wrong, bp, "beta")
    assert alone.code == 2, alone.stdout
    assert alone.host("beta")["status"] == "error"
    assert "records itself as 'alpha'" in alone.host("beta")["error"]
    run = ship(wrong, bp)  # both entries: they reach one root, seen before any identity check
    assert run.code == 2, run.stdout
    assert run.host("beta")["status"] == "error"
    assert "reaches the same root on the same machine as alpha" in run.host("beta")["error"]
    assert run.host("alpha")["status"] == "refused"  # held back: all or nothing
    assert {n: snapshot(r) for n, r in roots.items()} == before
    # A deliberate rename is explicit, and recorded.
    renamed = write_inventory(tmp_path / "renamed.yaml", {
        "alpha-2": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, roots["alpha"])})
    assert ship(renamed, bp).code == 2
    moved = ship(renamed, bp, "--renamed-from", "alpha")
    assert moved.code == 0, moved.stdout
    identity = json.loads((roots["alpha"] / ".fleetctl" / "identity.json").read_text())
    assert identity["name"] == "alpha-2"
    assert current_record(roots["alpha"])["host"] == "alpha-2"
    assert current_record(roots["alpha"])["renamed_from"] == "alpha"
    history = (roots["alpha"] / ".fleetctl" / "history.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["renamed_from"] == "alpha"
    assert drift(renamed, bp).code == 0


# -- all or nothing across the fleet -------------------------------------------------------------


def _three_box_fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    roots = {f"h{i}": tmp_path / f"root{i}" for i in range(3)}
    inv = write_inventory(tmp_path / "inv.yaml", {
        name: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[name])
        for name, box in zip(roots, sshd_pool)})
    return inv, roots


def test_concurrent_ships_never_split_the_fleet(tmp_path, sshd_pool, ssh_client_key,
                                                ssh_known_hosts):
    """Two ships of different blueprints (two branches from what the fleet runs, each in its
    own git worktree) started together over the same three hosts, ten times: every time the
    three hosts end on one and the same commit, at most one run ships, and the other says why
    (exit 3: the lock held, or a checkout that no longer descends from what the fleet runs)
    and wrote nothing."""
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv, roots = _three_box_fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts)
    assert ship(inv, bp).code == 0
    base = head(bp)
    for race in range(10):
        trees = []
        for side in ("a", "b"):
            tree = tmp_path / f"race{race}{side}"
            git(bp, "worktree", "add", "-q", "--detach", str(tree), base)
            trees.append((commit_change(tree / "blueprint", f"race-{side}", f"{race}{side}\n"),
                          tree / "blueprint"))
        procs = [subprocess.Popen([FLEETCTL, "ship", "--yes", "--format", "json",
                                   "--inventory", str(inv), "--blueprint", str(src)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _, src in trees]
        outs = [p.communicate(timeout=120) for p in procs]
        codes = [p.returncode for p in procs]
        commits = {current_record(r)["source"]["commit"] for r in roots.values()}
        assert len(commits) == 1, (race, commits, outs)
        assert sorted(codes) in ([0, 3], [3, 3]), (codes, outs)
        for code, (out, _err) in zip(codes, outs):
            if code == 3:
                errors = " ".join(h["error"] or "" for h in json.loads(out)["hosts"])
                assert "lock" in errors or "diverged" in errors, errors
        (winner,) = commits
        assert winner in (base, trees[0][0], trees[1][0])
        base = winner


def test_a_held_lock_refuses_the_whole_run_and_drift_says_a_ship_is_in_progress(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv, roots = _three_box_fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts)
    assert ship(inv, bp).code == 0
    commit_change(bp, "next", "n\n")
    before = {n: snapshot(r) for n, r in roots.items()}
    # Another ship's lock: a real flock on h1's root, held by this test's process (the host
    # programs run in sshd's sessions, other processes).
    holder = os.open(roots["h1"], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        seen = drift(inv, bp)
        assert seen.host("h1")["ship_in_progress"] is not None
        assert any("ship is in progress" in w for w in seen.host("h1")["warnings"])
        assert seen.host("h0")["ship_in_progress"] is None
        run = ship(inv, bp)
        assert run.code == 3, run.stdout
        assert run.host("h1")["status"] == "refused"
        assert "another ship holds the lock" in run.host("h1")["error"]
        assert "pid" in run.host("h1")["error"]
        for name in ("h0", "h2"):
            assert run.host(name)["status"] == "refused"
            assert "h1" in run.host(name)["error"]
        assert {n: snapshot(r) for n, r in roots.items()} == before
    finally:
        os.close(holder)
    assert ship(inv, bp).code == 0
    assert drift(inv, bp).code == 0


def test_a_failure_while_preparing_one_host_switches_none(tmp_path, sshd_pool, ssh_client_key,
                                                          ssh_known_hosts):
    """Two-phase: h1 cannot assemble (its releases directory is immutable), so h0 and h2, which
    prepared fine, are told to abort: every host keeps the release it had, with no leftovers."""
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv, roots = _three_box_fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts)
    assert ship(inv, bp).code == 0
    commit_change(bp, "next", "n\n")
    before = {n: snapshot(r) for n, r in roots.items()}
    releases = roots["h1"] / "releases"
    if subprocess.run(["chattr", "+i", str(releases)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this filesystem")
    try:
        run = ship(inv, bp)
    finally:
        subprocess.run(["chattr", "-i", str(releases)], check=True)
    assert run.code == 2, run.stdout
    assert run.host("h1")["status"] == "error"
    for name in ("h0", "h2"):
        assert run.host(name)["status"] == "refused", run.stdout
        assert "h1" in run.host(name)["error"]
    # Nothing changed but one line more in each host's history: the failed attempt, at the
    # step it stopped (h1) or called off (the others).
    history = b".fleetctl/history.jsonl"
    assert {n: {k: v for k, v in snapshot(r).items() if k != history}
            for n, r in roots.items()} == {n: {k: v for k, v in s.items() if k != history}
                                           for n, s in before.items()}
    for name, root in roots.items():
        line = json.loads((root / ".fleetctl" / "history.jsonl").read_text().splitlines()[-1])
        assert (line["kind"], line["error"], line["step"]) == (
            ("failed", "permission", "assemble") if name == "h1" else
            ("failed", "aborted", "commit"))
    assert ship(inv, bp).code == 0


def test_an_unreachable_host_does_not_hide_another_hosts_own_refusal(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """One host is unreachable and another has a hand-patch: the hand-patched host reports its
    own refusal (with its changes), not only "held back"; nothing is written anywhere."""
    from tests.sshd_boxes import free_port

    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    roots = {"a-patched": tmp_path / "ra", "b-fine": tmp_path / "rb"}
    hosts = {name: ssh_host(box, ssh_client_key, ssh_known_hosts, roots[name])
             for name, box in zip(roots, sshd_pool)}
    inv = write_inventory(tmp_path / "inv.yaml", hosts)
    assert ship(inv, bp).code == 0
    live = Path(os.path.realpath(roots["a-patched"] / "current")) / "runner" / "README"
    live.write_text("patched\n")
    dead = dict(ssh_host(sshd_pool[2], ssh_client_key, ssh_known_hosts, tmp_path / "rdead"))
    dead["port"] = free_port()
    inv = write_inventory(tmp_path / "inv2.yaml", {**hosts, "c-dead": dead})
    commit_change(bp, "next", "n\n")
    before = {n: snapshot(r) for n, r in roots.items()}
    run = ship(inv, bp, "--timeout", "10")
    assert run.code == 2, run.stdout
    patched = run.host("a-patched")
    assert patched["status"] == "refused" and "runner/README" in patched["error"]
    assert patched["step"] == "plan" and patched["changes"]
    assert run.host("b-fine")["status"] == "refused"
    assert run.host("b-fine")["step"] == "held-back"
    assert run.host("c-dead")["status"] == "error"
    assert {n: snapshot(r) for n, r in roots.items()} == before
