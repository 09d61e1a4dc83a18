"""What a broken host, a broken input or an interrupted command does: a clear result, the right
exit code, and nothing lost. Each case was found by trying to break fleetctl as a new user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    WAIT_S,
    cli,
    local_host,
    make_project,
    wait_until,
    write_inventory,
)
from tests.commands.test_ship_local import Fleet, fleet  # noqa: F401 - the fixture


def test_corrupt_record_is_treated_as_missing_and_force_repairs_it(fleet):
    (record,) = (fleet.root / ".fleetctl" / "releases").iterdir()
    record.write_text("{ not json")
    drift = fleet.drift()
    host = drift.host("h")
    assert drift.code == 0 and host["status"] == "in-sync"  # live still equals desired
    assert any(str(record.name) in w and "cannot be used" in w for w in host["warnings"])
    (fleet.current / "runner" / "conf").write_text("patched\n")
    assert {c["origin"] for c in fleet.drift().host("h")["changes"]} == {"unknown"}
    assert fleet.ship().code == 3
    assert fleet.ship("--force").code == 0
    assert fleet.drift().host("h")["warnings"] == []


def test_dangling_current_is_unknown_and_force_replaces_it(fleet):
    os.unlink(fleet.current)
    os.symlink("releases/nosuch", fleet.current)
    drift = fleet.drift()
    assert drift.code == 1
    assert {c["origin"] for c in drift.host("h")["changes"]} == {"unknown"}
    assert fleet.ship().code == 3
    assert fleet.ship("--force").code == 0
    assert os.path.isdir(fleet.current) and fleet.drift().code == 0


def test_dry_run_agrees_with_ship_when_current_is_a_directory(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}})
    (f.root / "current" / "runner").mkdir(parents=True)
    dry = f.ship("--force", "--dry-run")
    real = f.ship("--force")
    assert dry.code == real.code == 2
    assert "is a directory, not a release symlink" in dry.host("h")["error"]
    assert "is a directory, not a release symlink" in real.host("h")["error"]


@pytest.fixture
def immutable(tmp_path):
    marked = []

    def mark(path: Path) -> bool:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if done.returncode == 0:
            marked.append(path)
        return done.returncode == 0

    yield mark
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_one_stuck_release_does_not_stop_pruning_the_others(tmp_path, immutable):
    f = Fleet(tmp_path, {"runner": {"a": "0\n"}})
    f.inv.write_text(f.inv.read_text().replace("transport: local", "keep_releases: 1\n    transport: local"))
    assert f.ship().code == 0
    stuck = os.path.realpath(f.current)
    if not immutable(Path(stuck) / "runner" / "a"):
        pytest.skip("chattr +i is not supported on this filesystem")
    shipped = []
    for i in range(1, 5):
        f.commit({"runner": {"a": f"{i}\n"}})
        run = f.ship()
        assert run.code == 0
        shipped.append(os.path.basename(os.readlink(f.current)))
        # The first ship keeps the stuck release: it is the one to roll back to.
        assert any("could not prune release" in w for w in run.host("h")["warnings"]) == \
            (i > 1), run.host("h")["warnings"]
    releases = sorted(os.listdir(f.root / "releases"))
    name = os.path.basename(stuck)
    # Renamed to .pruning-<id> and its record removed: never mistaken for a rollback target or
    # for a directory fleetctl did not make, and each later ship tries again.
    subprocess.run(["chattr", "-i", str(f.root / "releases" / f".pruning-{name}" / "runner" /
                                        "a")], check=False)  # the fixture knows the old path
    assert releases == sorted([f".pruning-{name}", shipped[-2], shipped[-1]])
    assert not (f.root / ".fleetctl" / "releases" / (name + ".json")).exists()
    f.commit({"runner": {"a": "5\n"}})
    assert f.ship().host("h")["warnings"] == []  # once it can go, the next prune removes it
    assert f".pruning-{name}" not in os.listdir(f.root / "releases")


def test_unwritable_output_stops_before_any_host_is_touched(tmp_path):
    f = Fleet(tmp_path, {"runner": {"a": "a\n"}})
    for fmt in ("text", "json"):
        run = cli("ship", "--yes", "--format", fmt, "--output", str(tmp_path / "no" / "dir.txt"),
                  inventory=f.inv, blueprint=f.bp)
        assert run.code == 2 and "cannot write the report" in run.stderr
        assert "Traceback" not in run.stderr
    assert not f.root.exists()


def test_template_runtime_errors_name_the_template_and_line(tmp_path):
    f = Fleet(tmp_path, {"runner": {"x.j2": "a\n{{ 1 // 0 }}\n", "y.j2": "{% include 'z' %}"}})
    run = f.drift()
    error = run.host("h")["error"]
    assert run.code == 2
    assert "x.j2:2: template error: ZeroDivisionError" in error or "y.j2:1" in error
    render = cli("render", "h", "--out", str(tmp_path / "out"), inventory=f.inv, blueprint=f.bp)
    assert render.code == 2 and "template error" in render.stderr and "Traceback" not in render.stderr


def test_duplicate_keys_in_the_inventory_are_refused(tmp_path):
    bp = make_project(tmp_path, {})
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a:\n    transport: local\n    root: r1\n"
                   "  a:\n    transport: local\n    root: r2\n")
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 2 and "inv.yaml:5: invalid YAML: duplicate key 'a' (first on line 2)" in run.stderr


@pytest.mark.parametrize("path", ["../../etc/evil", "/abs/dir", "", "a//b", "a/./b"])
def test_declared_dirs_must_stay_inside_the_tree(tmp_path, path):
    bp = make_project(tmp_path, {}, attributes={"dirs": [{"path": path}]})
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box")})
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 2 and "attributes.yaml:" in run.stderr and "dirs[0].path" in run.stderr
    assert not (tmp_path / "box").exists()


def test_names_that_are_not_utf8_in_a_refusal_stay_valid_utf8(fleet, tmp_path):
    bad = os.path.join(os.fsencode(fleet.current), b"runner", b"caf\xe9\\x.txt")
    with open(bad, "wb") as fh:
        fh.write(b"z")
    with open(os.path.join(os.fsencode(fleet.current), b"runner", b"new\nline"), "wb") as fh:
        fh.write(b"z")
    out = tmp_path / "report.json"
    run = cli("ship", "--yes", "--format", "json", "--output", str(out), inventory=fleet.inv,
              blueprint=fleet.bp)
    assert run.code == 3
    doc = json.loads(out.read_bytes().decode("utf-8"))  # strict UTF-8
    assert "runner/caf\\xe9\\\\x.txt" in doc["hosts"][0]["error"]
    text = cli("ship", "--yes", inventory=fleet.inv, blueprint=fleet.bp)
    (summary,) = [line for line in text.stdout.splitlines() if line.startswith("h: refused")]
    # The one escape form for names shown to a person (docs/json.md): a newline is \x0a.
    assert "runner/new\\x0aline" in summary


def test_ctrl_c_stops_every_host_reports_them_and_loses_nothing(tmp_path):
    files = {"runner": {f"d{i % 20}": {} for i in range(20)}}
    for i in range(1500):
        files["runner"][f"d{i % 20}"][f"f{i}"] = f"{i}\n" * 500
    bp = make_project(tmp_path, files)
    # Host h2's interpreter says it has started, then never answers: Ctrl-C surely lands while
    # the ship is under way (waiting for a whole ship to start on a busy machine, it could come
    # after the end).
    started = tmp_path / "h2-started"
    stuck = tmp_path / "stuck-python"
    stuck.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 600\n")
    stuck.chmod(0o755)
    hosts = {f"h{i}": local_host(tmp_path / f"box{i}") for i in range(3)}
    inv = write_inventory(tmp_path / "inv.yaml", {
        **hosts, "h2": {**hosts["h2"], "python": str(stuck)}})
    exe = str(Path(sys.executable).parent / "fleetctl")
    argv = [exe, "ship", "--yes", "--parallel", "1", "--format", "json", "--inventory", str(inv),
            "--blueprint", str(bp)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(started.exists, what="the ship reaching the last host")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT_S)
    doc = json.loads(out)
    statuses = {h["host"]: h["status"] for h in doc["hosts"]}
    assert proc.returncode == 2, err
    assert set(statuses) == {"h0", "h1", "h2"}  # every host reported
    assert "interrupted" in " ".join(h["error"] or "" for h in doc["hosts"]), doc
    for i in range(3):  # the fleet was still locking: nothing was put in use anywhere
        assert statuses[f"h{i}"] in ("error", "refused"), doc
        box = tmp_path / f"box{i}"
        assert not (box / "current").exists()
        assert not box.exists() or not any((box / "releases").glob("*"))
    inv = write_inventory(tmp_path / "inv.yaml", hosts)  # h2 answers now
    again = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert again.code == 0, again.stdout
    assert cli("drift", inventory=inv, blueprint=bp).code == 0
