"""``fleetctl status`` tells what needs a person on the host itself, not only on its agents:
entries of ``releases/`` fleetctl did not make, a last ship that failed (the newest history
line is ``failed``) or was killed before its switch (an attempt file left), a ship in progress
(the lock held). Each makes ``status`` say so for that host, with the release id whole, and
exit 1; ``report`` carries the failed last ship and the foreign entries as drift findings
whose identity holds from night to night.

Real hosts: the local transport (a real host program process) for most, a real sshd box for
the ship held at its lock. Expected values come from the host's files read here with plain
``json``/``os`` (the history, the attempt files, ``releases/``), never from fleetctl's code.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetctl.cli.common import load_project, source_state
from fleetctl.results import NoProgress
from fleetctl.ship import HostShip, ShipOptions
from tests.commands.test_ship_guards import commit_change
from tests.commands.test_ship_guards import fleet  # noqa: F401  (a fixture: web1 over sshd)
from tests.helpers import cli, local_host, make_project, write_inventory
from tests.transport.test_ssh import EXECUTABLE, RUNNER, drift, ship

ID = re.compile(r"\d{8}T\d{9}Z-[0-9a-f]{8}")


def history(root: Path) -> list[dict]:
    path = root / ".fleetctl" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def status(inv: Path, bp: Path, *args: str):
    return cli("status", *args, inventory=inv, blueprint=bp)


@pytest.fixture
def local(tmp_path):
    """A committed blueprint and one local host (``web1``), shipped once."""
    root = tmp_path / "root-web1"
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": local_host(root)})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    return inv, bp, root


@contextmanager
def prepared(inv: Path, bp: Path, host: str = "web1") -> Iterator[HostShip]:
    """A real ship of ``host``, locked and staged (``prepared``, waiting for its commit):
    the body paces what comes next; the session is closed at the end."""
    inventory, blueprint = load_project(inv, bp, 120.0)
    (found,) = inventory.select([host])
    held = HostShip(blueprint, found, ShipOptions(force=True),
                    source_state(inventory, blueprint), NoProgress())
    try:
        held.open()
        held.lock()
        held.plan()
        held.prepare()
        yield held
    finally:
        held.close()


def fail_a_ship(inv: Path, bp: Path) -> None:
    """A real ship with something to change, staged and then called off (as the fleet does
    when another host could not prepare): the host records it as failed."""
    with prepared(inv, bp) as held:
        held.abort()


def kill_lock_holder(root: Path) -> None:
    """SIGKILL the process holding the flock on ``root`` (the host program of a ship; read
    from /proc/locks), never this one."""
    key = os.stat(root)
    tag = f" {os.major(key.st_dev):02x}:{os.minor(key.st_dev):02x}:{key.st_ino} "
    holders = [int(line.split()[4]) for line in Path("/proc/locks").read_text().splitlines()
               if "FLOCK" in line and tag in line + " "]
    assert holders and os.getpid() not in holders
    for pid in holders:
        os.kill(pid, signal.SIGKILL)


def test_a_failed_last_ship_needs_attention_until_a_ship_settles_it(local):
    """Before: status said the release in use and exit 0 after a ship had failed there."""
    inv, bp, root = local
    calm = status(inv, bp, "--json")
    assert calm.code == 0, calm.stdout + calm.stderr
    in_use = os.readlink(root / "current").rsplit("/", 1)[1]
    commit_change(bp, "next", "n\n")
    fail_a_ship(inv, bp)
    line = history(root)[-1]
    assert line["kind"] == "failed" and line["release"] != in_use, line
    run = status(inv, bp, "--json")
    assert run.code == 1, run.stdout + run.stderr
    h = run.host("web1")
    assert h["release"] == in_use and h["attention"] is True
    got = h["failed_ship"]
    assert (got["release"], got["step"], got["error"], got["by"], got["time"]) == (
        line["release"], line["step"], line["error"], line["by"], line["time"])
    assert got["commit"] == line["source"]["commit"]
    text = status(inv, bp)
    assert text.code == 1
    lines = text.stdout.splitlines()
    assert any(x.startswith("! the last ship failed") for x in lines), lines
    assert all(len(x) <= 80 for x in lines if x.startswith("! ")), lines
    assert f"    {line['release']}" in lines, lines  # the id whole, on a line of its own
    assert any(f"at step {line['step']} by {line['by']}" in x for x in lines), lines
    again = ship(inv, bp)
    assert again.code == 0, again.stdout
    assert history(root)[-1]["kind"] == "ship"
    settled = status(inv, bp, "--json")
    assert settled.code == 0, settled.stdout
    assert settled.host("web1")["failed_ship"] is None


def test_foreign_entries_in_releases_need_attention(local):
    """Before: status exit 0 with a directory and a file fleetctl did not make in releases/."""
    inv, bp, root = local
    (root / "releases" / "runtime").mkdir()
    (root / "releases" / "notes.txt").write_text("mine\n")
    os.symlink("/etc", root / "releases" / "etc-link")
    made = {n for n in os.listdir(root / "releases") if ID.fullmatch(n)}
    want = sorted(set(os.listdir(root / "releases")) - made)
    assert want == ["etc-link", "notes.txt", "runtime"]
    run = status(inv, bp, "--json")
    assert run.code == 1, run.stdout + run.stderr
    h = run.host("web1")
    assert sorted(f["name"] for f in h["foreign"]) == want
    assert all(f["kind"] == "foreign" and f["reason"] for f in h["foreign"])
    assert h["failed_ship"] is None and h["ship_in_progress"] is None
    text = status(inv, bp)
    assert text.code == 1
    assert "! entries in releases/ fleetctl did not make" in text.stdout
    for name in want:
        assert re.search(rf"^    {re.escape(name)}: ", text.stdout, re.M), text.stdout
    for name in want:  # nothing of them was touched
        assert os.path.lexists(root / "releases" / name)


def test_a_killed_ship_is_interrupted_not_in_progress(local):
    """SIGKILL of the host program after it staged: its attempt file stays, no process holds
    the lock. Before: status exit 0. Now: the killed ship, by its release id, exit 1; the next
    ship records and clears it, and status is calm again."""
    inv, bp, root = local
    commit_change(bp, "next", "n\n")
    with prepared(inv, bp):
        attempts = [n for n in os.listdir(root / ".fleetctl") if n.startswith("attempt-")]
        assert len(attempts) == 1
        kill_lock_holder(root)
    release = attempts[0][len("attempt-"):-len(".json")]
    left = json.loads((root / ".fleetctl" / attempts[0]).read_text())
    run = status(inv, bp, "--json")
    assert run.code == 1, run.stdout + run.stderr
    h = run.host("web1")
    assert h["ship_in_progress"] is None
    (got,) = h["interrupted_ships"]
    assert (got["release"], got["by"], got["time"], got["step"], got["error"]) == (
        release, left["by"], left["started"], "unknown", "interrupted")
    text = status(inv, bp)
    assert "! a ship was killed before its switch" in text.stdout
    assert f"\n    {release}\n" in text.stdout
    assert ship(inv, bp).code == 0
    recorded = [e for e in history(root) if e["kind"] == "failed"]
    assert [(e["release"], e["error"]) for e in recorded] == [(release, "interrupted")]
    calm = status(inv, bp, "--json")
    assert calm.code == 0, calm.stdout
    assert calm.host("web1")["interrupted_ships"] == []


@pytest.mark.parametrize("how", ["called-off", "killed"])
def test_a_failed_first_ship_into_a_root_it_created_is_never_ok(tmp_path, how):
    """The first ship of a host creates its root and stages. Called off, it removes the root
    again and writes no history; killed, it leaves the root with its attempt file. Nothing
    may then say the host is fine: status exits 1 (no release in use; a killed ship is named),
    drift finds every path missing, never in-sync."""
    root = tmp_path / "new-root"
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)}, executable=EXECUTABLE)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": local_host(root)})
    with prepared(inv, bp) as held:
        if how == "called-off":
            held.abort()
        else:
            kill_lock_holder(root)
    attempts = sorted(n for n in os.listdir(root / ".fleetctl") if n.startswith("attempt-")) \
        if os.path.isdir(root / ".fleetctl") else []
    if how == "called-off":
        assert not os.path.lexists(root) or history(root) == []
        assert attempts == []
    else:
        assert len(attempts) == 1 and history(root) == []
    run = status(inv, bp, "--json")
    assert run.code == 1, run.stdout + run.stderr
    h = run.host("web1")
    assert (h["status"], h["release"], h["attention"]) == ("ok", None, True)
    assert [e["release"] for e in h["interrupted_ships"]] == [
        a[len("attempt-"):-len(".json")] for a in attempts]
    seen = drift(inv, bp)
    assert seen.code == 1, seen.stdout + seen.stderr
    assert seen.host("web1")["status"] == "drift"
    assert seen.host("web1")["changes"] and all(
        c["change"] == "missing" for c in seen.host("web1")["changes"])


def test_a_ship_held_at_its_lock_on_an_sshd_box_is_in_progress(fleet):  # noqa: F811
    """A real ship holds web1's lock over sshd: status says a ship is in progress with its
    process, and exit 1 (before: exit 0); called off, it leaves the failed line status then
    shows; the next ship settles it."""
    inv, bp, root = fleet
    commit_change(bp, "next", "n\n")
    with prepared(inv, bp) as held:
        seen = status(inv, bp, "--json")
        assert seen.code == 1, seen.stdout + seen.stderr
        h = seen.host("web1")
        assert h["ship_in_progress"] and re.fullmatch(r"pid \d+", h["ship_in_progress"])
        assert h["interrupted_ships"] == [] and h["failed_ship"] is None
        text = status(inv, bp)
        assert "! a ship is in progress (pid " in text.stdout
        held.abort()
    line = history(root)[-1]
    assert line["kind"] == "failed"
    after = status(inv, bp, "--json")
    assert after.code == 1
    assert after.host("web1")["ship_in_progress"] is None
    assert after.host("web1")["failed_ship"]["release"] == line["release"]
    assert ship(inv, bp).code == 0
    assert status(inv, bp, "--json").code == 0


KINDS = st.sampled_from(["ship", "rollback", "failed"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(KINDS, max_size=6), junk=st.booleans())
def test_only_the_newest_history_line_decides_a_failed_last_ship(tmp_path, kinds, junk):
    """For any history, the host says its last ship failed exactly when the newest usable line
    is a failed ship, and names that line's release (a line that is no JSON object is
    skipped)."""
    from fleetctl.host.state import ship_story

    root = tmp_path / f"h{len(kinds)}{junk}"
    (root / ".fleetctl").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": k, "release": f"20260101T00000000{i}Z-0000000{i}"})
             for i, k in enumerate(kinds)]
    if junk:
        lines.append("not json {")
    (root / ".fleetctl" / "history.jsonl").write_text("".join(x + "\n" for x in lines))
    story = ship_story(os.fsencode(root), None)
    if kinds and kinds[-1] == "failed":
        assert json.loads(story["failed"])["release"] == json.loads(lines[len(kinds) - 1])[
            "release"]
    else:
        assert story["failed"] is None
    assert story["interrupted"] == [] and story["ship_in_progress"] is None


def test_report_carries_a_failed_last_ship_and_foreign_entries_as_drift_findings(local,
                                                                                   tmp_path):
    """Night 1: a ship failed on web1 and releases/ holds a file fleetctl did not make: two
    drift findings, new (before: none; drift's check said ok). Night 2: the same two, by the
    same ids, persisting. Night 3, after a good ship and the file moved out: both resolved."""
    import hashlib

    inv, bp, root = local
    commit_change(bp, "next", "n\n")
    fail_a_ship(inv, bp)
    (root / "releases" / "notes.txt").write_text("mine\n")
    failed = history(root)[-1]
    assert failed["kind"] == "failed"
    nights = tmp_path / "nights"

    def night(when: str) -> dict:
        run = cli("report", "--format", "json", "--history", str(nights), "--now", when,
                  "--no-ledgers", inventory=inv, blueprint=bp)
        assert run.code in (1, 2), run.stdout + run.stderr
        return {(f["kind"], f["subject"]): f for f in run.doc["findings"]
                if f["check"] == "drift" and f["kind"] in ("failed-ship", "foreign-entry")}

    want = {("failed-ship", failed["release"]), ("foreign-entry", "releases/notes.txt")}
    first = night("2026-12-01T02:00:00Z")
    assert set(first) == want, first
    assert {f["state"] for f in first.values()} == {"new"}
    for (kind, subject), f in first.items():  # the identity, computed here
        key = "\0".join(("drift", "web1", kind, subject)).encode()
        assert f["id"] == hashlib.sha256(key).hexdigest()[:16]
        assert f["fails"] is True
    assert first[("failed-ship", failed["release"])]["detail"]["history"]["step"] == \
        failed["step"]
    out = tmp_path / "out"
    out.mkdir()
    every = cli("report", "--format", "text", "--no-ledgers", "--markdown",
                str(out / "r.md"), "--html", str(out / "r.html"), "--junit",
                str(out / "r.xml"), "--now", "2026-12-01T02:00:00Z", inventory=inv, blueprint=bp)
    assert every.code in (1, 2), every.stdout + every.stderr
    for text in (every.stdout, *(p.read_text() for p in sorted(out.iterdir()))):
        assert failed["release"] in text and "notes" in text, text[:2000]
    second = night("2026-12-02T02:00:00Z")
    assert {k: (f["id"], f["state"], f["nights"]) for k, f in second.items()} == {
        k: (f["id"], "persisting", 2) for k, f in first.items()}
    assert ship(inv, bp).code == 0
    (root / "releases" / "notes.txt").unlink()
    third = night("2026-12-03T02:00:00Z")
    assert {k: f["state"] for k, f in third.items()} == {k: "resolved" for k in want}


def test_the_host_story_events_parsed_as_recorded():
    """The status op's release event with a failed last ship, a killed one and a foreign
    entry (recorded in tests/data/status/host-story.json), and what they mean."""
    from fleetctl.status import FleetStatus, HostStatus, apply_events

    case = json.loads((Path(__file__).parents[1] / "data" / "status" / "host-story.json")
                      .read_text())
    host = HostStatus(case["host"])
    apply_events(host, case["events"])
    got, want = host.to_json(), case["expected"]
    assert got["release"] == want["release"] and got["foreign"] == want["foreign"]
    assert {k: got["failed_ship"][k] for k in want["failed_ship"]} == want["failed_ship"]
    assert [{k: e[k] for k in w} for e, w in zip(got["interrupted_ships"],
                                                  want["interrupted_ships"])] == \
        want["interrupted_ships"] and len(got["interrupted_ships"]) == 1
    assert (got["ship_in_progress"], got["attention"]) == (want["ship_in_progress"],
                                                            want["attention"])
    assert FleetStatus([host]).exit_code == want["exit_code"]


def test_a_history_that_cannot_be_read_is_not_a_calm_host(local):
    """The history is there but cannot be read (here a directory stands in its place, so
    open() fails with EISDIR even for root): whether the last ship failed is not known, so
    status names the path and exits 2, never 0 (before: exit 0, nothing said)."""
    inv, bp, root = local
    path = root / ".fleetctl" / "history.jsonl"
    path.rename(root / ".fleetctl" / "history.kept")
    path.mkdir()
    run = status(inv, bp, "--json")
    assert run.code == 2, run.stdout + run.stderr
    (error,) = run.host("web1")["errors"]
    assert error.startswith(f"{path}: ")
    text = status(inv, bp)
    assert text.code == 2 and f"? unreadable: {path}: " in text.stdout
    seen = drift(inv, bp)
    assert any(str(path) in w and "not known" in w for w in seen.host("web1")["warnings"])
