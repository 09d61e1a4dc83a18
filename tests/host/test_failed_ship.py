"""What a ship that fails after it began on a host leaves: nothing of the release, and one
``failed`` line in the host's history (step, error, path, who, when, commit), also when the
client went away (its input ended, SIGHUP, SIGTERM) or the program was killed outright (the
next ship or rollback writes the line from the attempt file).

The host program runs in this process (a list as its event sink) or as a real process on
pipes; the root is a real directory under tmp_path. Expected values are what the test built.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.host import main
from fleetctl.protocol import encode_json, frame
from tests.host.test_retention import good_release, rid, sha

SOURCE = {"commit": "ab" * 20, "clean": True}
WORKTREE = str(Path(__file__).resolve().parents[2])


def command(release: str, data: bytes, previous: str | None, **more) -> dict:
    meta = {"created": "2026-02-01T10:00:00Z", "shipped_by": "alice@desk", "host": "web1",
            "previous": previous, "source": SOURCE}
    return {"cmd": "ship", "release": release, "keep": 5, "sources": {}, "ignore": [],
            "desired": [{"path": "a", "type": "file", "mode": "0644", "size": len(data),
                         "digest": sha(data)}, *more.pop("extra", [])],
            "blob_count": 1, "secret_count": 0, "meta": meta, **more}


def blob(data: bytes) -> bytes:
    return sha(data).encode() + b"\n%d\n" % len(data) + data


def history(root: Path) -> list[dict]:
    path = root / ".fleetctl" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def unchanged(root: Path, releases: list[str], current: str) -> None:
    """Only the releases there were, current as it was, no attempt file or staging left."""
    assert sorted(os.listdir(root / "releases")) == releases
    assert os.readlink(root / "current") == f"releases/{current}"
    assert not [n for n in os.listdir(root / ".fleetctl") if n.startswith(("attempt-",
                                                                           "incoming-"))]
    assert sorted(os.listdir(root / ".fleetctl" / "releases")) == [f"{r}.json" for r in releases]


def in_process(root: Path, *frames: bytes) -> tuple[int, list[dict]]:
    events: list[dict] = []
    stdin = io.BytesIO(frame(encode_json({"op": "ship", "root": str(root)})) +
                       frame(encode_json({"cmd": "lock"})) + b"".join(frames))
    return main.main(events.append, stdin), events


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    good_release(root, rid(1), None)
    return root


def test_a_ship_that_fails_at_assemble_is_recorded_and_leaves_no_release(host):
    """Before: nothing in the history said a ship had been tried (the error went only to a
    client that may not be there)."""
    data = b"new\n"
    bad = command(rid(2), data, rid(1), extra=[{"path": "b", "type": "file", "mode": "0644",
                                                "owner": "no-such-user-zz", "size": 4,
                                                "digest": sha(data)}])
    code, events = in_process(host, frame(encode_json(bad)), blob(data))
    assert code == 1 and events[-1]["step"] == "assemble", events[-1]
    unchanged(host, [rid(1)], rid(1))
    line = history(host)[-1]
    assert {k: line[k] for k in ("kind", "release", "previous", "by", "started", "host",
                                 "source", "step", "error", "path")} == {
        "kind": "failed", "release": rid(2), "previous": rid(1), "by": "alice@desk",
        "started": "2026-02-01T10:00:00Z", "host": "web1", "source": SOURCE,
        "step": "assemble", "error": "failed", "path": "b"}
    # The error names every path it is about, each with the owner refused (one here).
    (item,) = line["items"]
    assert item[0] == "b" and "no-such-user-zz" in item[1] and line["items_total"] == 1
    assert line["time"].endswith("Z")


@pytest.mark.parametrize("cut, step", [("receive", "receive"), ("commit", "commit")])
def test_a_client_that_vanishes_is_recorded_at_the_step_it_left(host, cut, step):
    """The input ends in the middle of the content, or while the host waits for commit."""
    data = b"x" * 1000
    frames = [frame(encode_json(command(rid(2), data, rid(1))))]
    frames.append(blob(data)[:500] if cut == "receive" else blob(data))
    code, events = in_process(host, *frames)
    assert code == 1 and events[-1]["step"] == step, events[-1]
    unchanged(host, [rid(1)], rid(1))
    line = history(host)[-1]
    assert (line["kind"], line["step"], line["release"]) == ("failed", step, rid(2))
    assert "ended" in line["message"] or "went away" in line["message"], line


def test_a_ship_called_off_is_recorded_as_aborted(host):
    data = b"y\n"
    code, events = in_process(host, frame(encode_json(command(rid(2), data, rid(1)))),
                              blob(data), frame(encode_json({"cmd": "abort"})))
    assert code == 0 and events[-1]["aborted"] is True
    unchanged(host, [rid(1)], rid(1))
    assert (history(host)[-1]["kind"], history(host)[-1]["error"]) == ("failed", "aborted")


def host_process(root: Path, ship: dict, data: bytes) -> subprocess.Popen:
    """The host program as a real process on pipes, driven up to ``prepared``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from fleetctl.host.main import run; sys.exit(run())", WORKTREE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(frame(encode_json({"op": "ship", "root": str(root)})) +
                     frame(encode_json({"cmd": "lock"})) + frame(encode_json(ship)) +
                     blob(data))
    proc.stdin.flush()
    for raw in proc.stdout:
        if raw.strip() and json.loads(raw)["t"] == "prepared":  # blank: run()'s first line
            return proc
    raise AssertionError(proc.stderr.read() if proc.stderr else "no prepared event")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_hangup_while_prepared_is_recorded_on_the_way_out(host, signum):
    """sshd hangs up the session, or the process is told to stop: the host program removes
    the staged release and writes the history line before it exits."""
    proc = host_process(host, command(rid(2), b"z\n", rid(1)), b"z\n")
    assert (host / "releases" / f".staging-{rid(2)}").is_dir()
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    unchanged(host, [rid(1)], rid(1))
    line = history(host)[-1]
    assert (line["kind"], line["step"], line["error"], line["by"]) == \
        ("failed", "commit", "hangup", "alice@desk")
    assert signal.Signals(signum).name in line["message"]


def test_a_ship_killed_outright_is_recorded_by_the_next_ship(host):
    """SIGKILL leaves the staging release and the attempt file; the next ship removes both and
    writes the line with who, when and the commit the killed ship had."""
    proc = host_process(host, command(rid(2), b"k\n", rid(1)), b"k\n")
    proc.kill()
    proc.communicate(timeout=60)
    assert (host / ".fleetctl" / f"attempt-{rid(2)}.json").exists()
    data = b"next\n"
    code, events = in_process(host, frame(encode_json(command(rid(3), data, rid(1)))),
                              blob(data), frame(encode_json({"cmd": "commit"})))
    assert code == 0, events[-1]
    unchanged(host, [rid(1), rid(3)], rid(3))
    failed, shipped = history(host)[-2:]
    assert (failed["kind"], failed["release"], failed["error"], failed["step"],
            failed["by"], failed["source"]) == ("failed", rid(2), "interrupted", "unknown",
                                                "alice@desk", SOURCE)
    assert (shipped["kind"], shipped["release"]) == ("ship", rid(3))


def test_a_release_recorded_but_never_switched_to_is_no_release(host):
    """Killed between its record step and its switch: the release directory and its record
    are there, with the attempt file. It is no rollback target, is not counted, and the next
    rollback or ship removes it and records the failure."""
    good_release(host, rid(2), rid(1))
    good_release(host, rid(3), rid(2))
    (host / ".fleetctl" / f"attempt-{rid(3)}.json").write_text(json.dumps(
        {"kind": "failed", "release": rid(3), "previous": rid(2), "by": "bob@desk"}))
    os.unlink(host / "current")
    os.symlink(f"releases/{rid(2)}", host / "current")
    lines = (host / ".fleetctl" / "history.jsonl").read_text().splitlines()
    (host / ".fleetctl" / "history.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    events: list[dict] = []
    code = main.main(events.append, io.BytesIO(frame(encode_json(
        {"op": "rollback", "root": str(host), "to": rid(3)}))))
    assert code == 1 and "no release" in events[-1]["message"], events[-1]
    unchanged(host, [rid(1), rid(2)], rid(2))
    line = history(host)[-1]
    assert (line["kind"], line["release"], line["by"], line["error"]) == \
        ("failed", rid(3), "bob@desk", "interrupted")
