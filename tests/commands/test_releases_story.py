"""Releases and history tell the whole story, on a real sshd box: a real ship held at a step
(the library's own ship phases, paced by the test), drift while it runs, the connection cut
while the host waits for commit, foreign entries in ``releases/``, and the text of
``releases`` and ``history`` at 80 columns.

Expected values come from the tree the test built and from plain ``json``/``os`` reads of the
host's files, never from fleetctl's own listing.
"""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fleetctl.cli.common import load_project, source_state
from fleetctl.results import NoProgress
from fleetctl.ship import HostShip, ShipOptions
from tests.commands.test_ship_guards import commit_change, current_record, head
from tests.commands.test_ship_guards import fleet  # noqa: F401  (a fixture: web1, shipped once)
from tests.helpers import wait_until
from tests.transport.test_ssh import _ship_too_big, drift, mount_tmpfs, ship  # noqa: F401

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
ID = re.compile(r"\b\d{8}T\d{9}Z-[0-9a-f]{8}\b")


def held_ship(inv: Path, bp: Path) -> HostShip:
    """A real ship of web1, opened and locked: the caller paces its next phases."""
    inventory, blueprint = load_project(inv, bp, 120.0)
    (host,) = inventory.select(["web1"])
    held = HostShip(blueprint, host, ShipOptions(), source_state(inventory, blueprint),
                    NoProgress())
    held.open()
    held.lock()
    return held


def history(root: Path) -> list[dict]:
    return [json.loads(line) for line in
            (root / ".fleetctl" / "history.jsonl").read_text().splitlines()]


def text(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a person runs it, on an 80-column terminal's width (COLUMNS)."""
    return subprocess.run([FLEETCTL, *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"})


def test_drift_during_a_held_ship_is_never_in_sync_and_a_cut_connection_is_recorded(fleet):
    """A ship held after its lock and then at ``prepared`` (staged, waiting for commit):
    drift says a ship is in progress and exits 2 both times (before: ``in-sync``, exit 0,
    with a warning). Then the connection is cut while the host waits for commit: the host
    removes the staged release and writes the history line itself (before: nothing recorded),
    and ``releases``/``history`` show the failed ship, which never became a release."""
    inv, bp, root = fleet
    before = current_record(root)
    releases_before = sorted(os.listdir(root / "releases"))
    held = held_ship(inv, bp)  # nothing to change: the tree in use matches the blueprint
    try:
        seen = drift(inv, bp)
        assert seen.code == 2, seen.stdout
        assert seen.host("web1")["status"] == "incomplete"
        assert "ship is in progress" in seen.host("web1")["error"]
    finally:
        held.abort()
        held.close()
    wait_until(lambda: drift(inv, bp).code == 0, what="drift clean once the held ship ended")
    commit = commit_change(bp, "next", "n\n")
    held = held_ship(inv, bp)
    try:
        held.plan()
        held.prepare()
        assert [n for n in os.listdir(root / "releases") if n.startswith(".staging-")]
        seen = drift(inv, bp)
        assert seen.code == 2 and "ship is in progress" in seen.host("web1")["error"]
        listed = json.loads(text("releases", "web1", "--inventory", str(inv), "--format",
                                 "json").stdout)
        assert listed["ship_in_progress"] is not None
        assert [f["kind"] for f in listed["foreign"]] == ["staging"]
        release = held.result.release if held.result.release != before["release"] else None
        assert held._session is not None
        held._session.kill()  # the connection is cut: sshd hangs up the session
    finally:
        held.close()
    failed = wait_until(lambda: [e for e in history(root) if e["kind"] == "failed"],
                        what="the host's history line of the failed ship")
    (line,) = failed
    assert line["step"] == "commit" and line["previous"] == before["release"]
    assert line["source"]["commit"] == commit and "@" in line["by"] and line["host"] == "web1"
    assert release is None or line["release"] != before["release"]
    wait_until(lambda: sorted(os.listdir(root / "releases")) == releases_before,
               what="the staged release removed")
    assert current_record(root)["release"] == before["release"]
    assert not [n for n in os.listdir(root / ".fleetctl") if n.startswith("attempt-")]
    doc = json.loads(text("releases", "web1", "--inventory", str(inv), "--format",
                          "json").stdout)
    assert [r["id"] for r in doc["releases"]] == releases_before
    assert [(e["release"], e["step"]) for e in doc["failed"]] == [(line["release"], "commit")]
    hist = json.loads(text("history", "--inventory", str(inv), "--format", "json").stdout)
    assert [e["kind"] for e in hist["entries"]] == ["ship", "failed"]
    again = ship(inv, bp)  # the failed attempt takes no slot and leaves nothing in the way
    assert again.code == 0, again.stdout
    assert drift(inv, bp).code == 0
    assert current_record(root)["source"]["commit"] == head(bp)


def test_releases_and_history_at_80_columns_keep_ids_whole_and_tell_who_rolled_back(fleet):
    """Three ships, a rollback, a foreign directory and a file in ``releases/``: at 80 columns
    every release id is whole on its line, the release in use says since when and by whom,
    the one rolled back from says when and by whom, the foreign entries are named as such."""
    inv, bp, root = fleet
    for n in (2, 3):
        commit_change(bp, f"c{n}", f"{n}\n")
        assert ship(inv, bp).code == 0
    ids = sorted(n for n in os.listdir(root / "releases") if ID.fullmatch(n))
    assert len(ids) == 3
    (root / "releases" / "runtime").mkdir()
    (root / "releases" / "notes.txt").write_text("mine\n")
    back = text("rollback", "web1", "--inventory", str(inv))
    assert back.returncode == 0, back.stderr
    out = text("releases", "web1", "--inventory", str(inv))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if ID.search(line) and
               line.strip() in ids), lines
    for rid in ids:  # each id whole at the start of its own line
        assert any(line.strip(" *") == rid for line in lines), (rid, lines)
    block = "\n".join(lines)
    current = os.readlink(root / "current").rsplit("/", 1)[1]
    assert current == ids[1]
    assert f"* {ids[1]}" in block
    by = history(root)[-1]["by"]
    assert re.search(rf"\* {ids[1]}\n(    .*\n)*    in use since \S+Z \(rollback by "
                     rf"{re.escape(by)}\)", block), block
    assert re.search(rf"  {ids[2]}\n(    .*\n)*    rolled back from it on \S+Z by "
                     rf"{re.escape(by)}", block), block
    assert "  runtime\n    foreign: a directory without a record" in block or \
        "  runtime\n    foreign:" in block, block
    assert "  notes.txt\n    foreign: a file" in block, block
    hist = text("history", "--inventory", str(inv))
    assert hist.returncode == 0
    hlines = hist.stdout.splitlines()
    for rid in ids:
        assert any(line.endswith(rid) or f" {rid};" in line for line in hlines), (rid, hlines)
    assert all(len(line) <= 80 for line in hlines if "web1" in line), hlines
    seen = drift(inv, bp)  # drift warns about what fleetctl did not make
    assert any("notes.txt" in w and "runtime" in w for w in seen.host("web1")["warnings"])


def test_a_full_disk_is_recorded_once_the_half_received_content_is_gone(
        tmp_path, mount_tmpfs, sshd_pool, ssh_client_key, ssh_known_hosts):
    """The disk fills while a 1 MiB file is received: the host removes what it received first,
    so there is room again for the history line that says so (step, error, who, commit)."""
    root, old_target, _tree, run = _ship_too_big(tmp_path, mount_tmpfs, sshd_pool[0],
                                                 ssh_client_key, ssh_known_hosts)
    assert run.code == 2 and run.host("web1")["step"] == "receive", run.stdout
    (line,) = [e for e in history(root) if e["kind"] == "failed"]
    assert (line["step"], line["error"], line["previous"]) == \
        ("receive", "failed", old_target.split("/")[1])
    assert "No space left on device" in line["message"] and "@" in line["by"]
    assert line["source"]["commit"] == run.doc["source"]["commit"]
    assert sorted(os.listdir(root / "releases")) == [old_target.split("/")[1]]


def test_a_ship_after_a_cut_off_history_line_is_recorded_on_a_line_of_its_own(fleet):
    """The history file ends in half a line (a hand edit, a disk that filled mid-write, a
    crash): the next ship's line starts on a new line, so it is recorded and ``history`` and
    ``releases`` show it (before: it was glued onto the half line and both lost it)."""
    inv, bp, root = fleet
    hist = root / ".fleetctl" / "history.jsonl"
    with open(hist, "ab") as fh:
        fh.write(b'{"kind": "ship", "release": "2026')
    commit_change(bp, "c2", "2\n")
    assert ship(inv, bp).code == 0
    current = os.readlink(root / "current").rsplit("/", 1)[1]
    lines = hist.read_bytes().splitlines()
    assert lines[-2] == b'{"kind": "ship", "release": "2026', lines
    assert json.loads(lines[-1])["release"] == current
    shown = text("history", "web1", "--inventory", str(inv))
    assert shown.returncode == 0 and current in shown.stdout, shown.stdout + shown.stderr
    listed = text("releases", "web1", "--inventory", str(inv))
    assert re.search(rf"\* {current}\n(    .*\n)*    in use since \S+Z \(ship by ",
                     listed.stdout), listed.stdout


@given(host=st.text(alphabet=string.ascii_lowercase + "-.", min_size=1, max_size=60),
       by=st.text(min_size=0, max_size=40), kind=st.sampled_from(("ship", "rollback", "failed")))
def test_history_text_keeps_every_id_whole_on_a_line_of_at_most_80_columns(host, by, kind):
    """Whatever the host and user names, each release id of a history entry is whole on one
    line, and a line that holds an id is no wider than 80 columns up to the end of the id."""
    from fleetctl.cli.releases import history_lines
    from fleetctl.releases import HistoryEntry

    ids = ("20261202T052023035Z-0197452c", "20261202T052027911Z-741f5a03")
    entry = HistoryEntry(host, kind, "2026-12-02T05:20:41Z", by, ids[1], ids[0], "ab" * 20,
                         True, False, "verify" if kind == "failed" else None)
    lines = "\n".join(history_lines(entry)).split("\n")
    for rid in ids if kind != "failed" else ids[1:]:
        holding = [line for line in lines if rid in line]
        assert holding, (rid, lines)
        assert all(line.index(rid) + len(rid) <= 80 for line in holding), lines
