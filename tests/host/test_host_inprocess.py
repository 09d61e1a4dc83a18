"""The host program's functions run in this test process: a list as their event sink, a real
file system under tmp_path, no transport at all.

Expected values are computed here with os.lstat, pwd/grp and hashlib, never with fleetctl's
code; ``fleetctl.protocol.frame``/``encode_json`` only build the input a client would send.
"""

from __future__ import annotations

import ast
import fcntl
import grp
import hashlib
import io
import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl import bundle
from fleetctl.host import credentials as host_credentials
from fleetctl.host import ledgers, lock, main, releases, state, status, walk
from fleetctl.host.wire import Stop
from fleetctl.protocol import encode_json, frame
from tests.helpers import Symlink, build_tree

ME = f"{pwd.getpwuid(os.geteuid()).pw_name}:{grp.getgrgid(os.getegid()).gr_name}"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def mode_of(path: Path) -> str:
    return "%04o" % (os.lstat(path).st_mode & 0o7777)


def make_release(root: Path, release: str, files: dict, record: bool = True) -> None:
    """A release under ``root`` as a ship leaves it (current switched to it, a record)."""
    build_tree(root / "releases" / release, files)
    (root / ".fleetctl" / "releases").mkdir(parents=True, exist_ok=True)
    if record:
        manifest = [{"path": name, "type": "file", "digest": sha(data.encode())}
                    for name, data in files.items() if isinstance(data, str)]
        (root / ".fleetctl" / "releases" / f"{release}.json").write_text(json.dumps(
            {"schema_version": 1, "release": release, "manifest": manifest,
             "created": "2026-01-01T00:00:00Z", "shipped_by": "tester"}))
    current = root / "current"
    if current.is_symlink():
        current.unlink()
    current.symlink_to(f"releases/{release}")


def run_main(request: dict, *more: bytes) -> tuple[int, list[dict]]:
    """The entry point on an in-memory stdin; returns the exit status and the events."""
    events: list[dict] = []
    stdin = io.BytesIO(frame(encode_json(request)) + b"".join(more))
    return main.main(events.append, stdin), events


# -- scan --------------------------------------------------------------------------------------


def test_a_scan_emits_every_entry_of_the_release_in_use_with_its_digest(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a.txt": "alpha\n", "sub": {"b.bin": b"\x00\x01"},
                              "link": Symlink("a.txt")})
    os.chmod(root / "releases" / "r1" / "a.txt", 0o640)
    code, events = run_main({"op": "scan", "root": str(root)})
    assert code == 0
    kinds = [e["t"] for e in events]
    assert kinds[0] == "hello" and kinds[1] == "state" and kinds[-1] == "scan-end"
    live = {e["path"]: e for e in events if e["t"] == "entry"}
    top = root / "releases" / "r1"
    assert live == {
        "a.txt": {"t": "entry", "path": "a.txt", "type": "file", "owner": ME,
                  "mode": "0640", "size": 6, "digest": sha(b"alpha\n")},
        "sub": {"t": "entry", "path": "sub", "type": "dir", "owner": ME,
                "mode": mode_of(top / "sub")},
        "sub/b.bin": {"t": "entry", "path": "sub/b.bin", "type": "file", "owner": ME,
                      "mode": mode_of(top / "sub" / "b.bin"), "size": 2,
                      "digest": sha(b"\x00\x01")},
        "link": {"t": "entry", "path": "link", "type": "symlink", "owner": ME,
                 "target": "a.txt"},
    }
    st = next(e for e in events if e["t"] == "state")
    assert (st["current"], st["current_kind"], st["releases"], st["shipped"]) == \
        ("r1", "symlink", ["r1"], True)
    assert st["meta"] == {"created": "2026-01-01T00:00:00Z", "shipped_by": "tester"}
    assert [e["path"] for e in events if e["t"] == "shipped"] == ["a.txt"]  # the record's
    end = events[-1]
    assert (end["entries"], end["unreadable"]) == (4, 0)
    # The digest of the live manifest: entries in path-byte order ("/" first), canonical JSON.
    ordered = sorted(({k: v for k, v in e.items() if k != "t"} for e in live.values()),
                     key=lambda e: e["path"].encode().replace(b"/", b"\x00"))
    assert end["digest"] == sha(json.dumps(ordered, sort_keys=True,
                                           separators=(",", ":")).encode())


def test_a_root_that_is_a_file_is_a_layout_error(tmp_path):
    (tmp_path / "root").write_text("not a directory")
    code, events = run_main({"op": "scan", "root": str(tmp_path / "root")})
    assert code == 1
    assert events[-1]["t"] == "error" and events[-1]["kind"] == "layout"


def test_a_scan_reports_an_unusable_record_as_a_warning(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    (root / ".fleetctl" / "releases" / "r1.json").write_text("[1, 2]")
    events: list[dict] = []
    found = state.read_state(events.append, os.fsencode(root))
    assert found["shipped"] is False and found["current"] == "r1"
    assert [e["t"] for e in events] == ["warning"]
    assert "r1.json cannot be used" in events[0]["message"]


# -- lock --------------------------------------------------------------------------------------


def test_the_lock_is_refused_while_another_process_holds_it(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(root)!r}, os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(Stop) as refused:
            lock.take_ship_lock(os.fsencode(root))
        assert refused.value.event["kind"] == "locked"
        assert f"(pid {holder.pid})" in refused.value.event["message"]
        # The whole ship op refuses the same way, with exit status 3 and nothing written.
        code, events = run_main({"op": "ship", "root": str(root)}, frame(encode_json(
            {"cmd": "lock"})))
        assert code == 3 and events[-1]["kind"] == "locked"
        assert os.listdir(root) == []
    finally:
        holder.communicate(b"")
    fd = lock.lock_root(os.fsencode(root))  # free again once the holder is gone
    other = os.open(root, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        os.close(fd)


# -- a whole ship, in process ------------------------------------------------------------------


def test_a_ship_in_process_builds_records_and_switches_a_release(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"keep.txt": "kept\n"})
    new = b"new content\n"
    desired = [
        {"path": "keep.txt", "type": "file", "mode": "0644", "size": 5,
         "digest": sha(b"kept\n")},
        {"path": "new.txt", "type": "file", "mode": "0600", "size": len(new),
         "digest": sha(new)},
    ]
    command = {"cmd": "ship", "release": "r2", "keep": 5, "desired": desired,
               "sources": {"keep.txt": "keep.txt"}, "blob_count": 1, "secret_count": 0,
               "ignore": [], "meta": {"created": "2026-01-02T00:00:00Z", "shipped_by": "t"}}
    blob = sha(new).encode() + b"\n%d\n" % len(new) + new
    code, events = run_main({"op": "ship", "root": str(root)},
                            frame(encode_json({"cmd": "lock"})),
                            frame(encode_json(command)), blob,
                            frame(encode_json({"cmd": "commit"})))
    assert code == 0, events[-1]
    steps = [e["name"] for e in events if e["t"] == "step"]
    assert steps == ["prepare", "receive", "assemble", "verify", "record", "switch", "prune"]
    assert events[-1] == {"t": "done", "release": "r2", "pruned": []}
    assert os.readlink(root / "current") == "releases/r2"
    assert (root / "current" / "new.txt").read_bytes() == new
    assert mode_of(root / "current" / "new.txt") == "0600"
    assert os.lstat(root / "releases/r2/keep.txt").st_ino != \
        os.lstat(root / "releases/r1/keep.txt").st_ino
    record = json.loads((root / ".fleetctl/releases/r2.json").read_text())
    assert [e["path"] for e in record["manifest"]] == ["keep.txt", "new.txt"]
    history = (root / ".fleetctl/history.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["release"] == "r2"


def test_a_ship_called_off_after_prepare_leaves_nothing(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    command = {"cmd": "ship", "release": "r2", "desired": [], "sources": {}, "blob_count": 0}
    code, events = run_main({"op": "ship", "root": str(root)},
                            frame(encode_json({"cmd": "lock"})), frame(encode_json(command)),
                            frame(encode_json({"cmd": "abort"})))
    assert code == 0 and events[-1]["aborted"] is True
    assert sorted(os.listdir(root / "releases")) == ["r1"]
    assert os.readlink(root / "current") == "releases/r1"


def test_a_first_ship_that_stops_at_a_step_leaves_no_root_behind(tmp_path):
    """The root a ship created is removed again when it stops before using it, with the
    ``releases/`` and state directories its prepare step made (before, they stayed, and with
    them the root: an empty tree that drift then called a host with a release missing)."""
    root = tmp_path / "new-root"
    command = {"cmd": "ship", "release": "r1", "desired": [], "sources": {}, "blob_count": 0,
               "users": [{"user": "root", "group": "root", "home": "/root"}]}
    code, events = run_main({"op": "ship", "root": str(root)},
                            frame(encode_json({"cmd": "lock"})), frame(encode_json(command)))
    assert code == 1 and events[-1]["step"] == "users" and "uid 0" in events[-1]["message"]
    assert not root.exists()


# -- credentials: the leftover of an interrupted ship ------------------------------------------


def test_a_leftover_credential_file_is_removed_and_the_wanted_one_written_0600(tmp_path):
    root = tmp_path / "root"
    agent_dir = root / "credentials" / "a"
    agent_dir.mkdir(parents=True)
    os.chmod(root / "credentials", 0o755)
    os.chmod(agent_dir, 0o700)
    leftover = agent_dir / ".fleetctl-new-key"  # the protocol's leftover prefix, spelled out
    leftover.write_bytes(b"half")
    secret = b"KEY=value\n"
    events: list[dict] = []
    scanned, bad = walk.scan_credentials(events.append, os.fsencode(root), False)
    assert bad == 0 and "credentials/a/.fleetctl-new-key" in {e["path"] for e in scanned}
    wanted = [{"path": "credentials", "type": "dir", "mode": "0755", "owner": ME},
              {"path": "credentials/a", "type": "dir", "mode": "0700", "owner": ME},
              {"path": "credentials/a/key", "type": "file", "mode": "0600", "owner": ME,
               "size": len(secret), "digest": sha(secret)}]
    host_credentials.apply_credentials(events.append, os.fsencode(root), wanted,
                                       {sha(secret): secret}, scanned)
    assert os.listdir(agent_dir) == ["key"]
    assert (agent_dir / "key").read_bytes() == secret and mode_of(agent_dir / "key") == "0600"
    assert events == []


# -- the read-only operations ------------------------------------------------------------------


def test_releases_lists_each_release_with_its_record_and_the_history(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    make_release(root, "r2", {"a": "2"}, record=False)
    (root / ".fleetctl" / "history.jsonl").write_text('{"kind":"ship"}\n{"kind":"half"')
    events: list[dict] = []
    assert releases.list_releases(events.append, os.fsencode(root), {}) == 0
    assert events[0] == {"t": "releases", "current": "r2", "identity": None,
                         "ship_in_progress": None}
    listed = {e["id"]: (e["recorded"], e["meta"]) for e in events if e["t"] == "release"}
    assert listed == {"r1": (True, {"created": "2026-01-01T00:00:00Z", "shipped_by": "tester"}),
                      "r2": (False, {})}
    assert [e["line"] for e in events if e["t"] == "history"] == ['{"kind":"ship"}']
    assert events[-1] == {"t": "releases-end"}


def test_a_rollback_to_a_release_edited_in_place_is_refused(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    make_release(root, "r2", {"a": "2"})
    (root / "releases" / "r1" / "a").write_text("edited")
    code, events = run_main({"op": "rollback", "root": str(root), "to": "r1"})
    assert code == 3 and events[-1]["kind"] == "changed" and "a: content" in \
        events[-1]["message"]
    assert os.readlink(root / "current") == "releases/r2"


def test_ledgers_stream_complete_lines_and_report_a_partial_one(tmp_path):
    root = tmp_path / "root"
    state_dir = root / "state" / "a"
    state_dir.mkdir(parents=True)
    (state_dir / "ledger.jsonl").write_bytes(
        b'{"time":"2026-01-01T00:00:00Z","n":1}\n\n{"time":"2026-01-03T00:00:00Z","n":2}\n'
        b'{"time":"2026-01-04')
    events: list[dict] = []
    ledgers.read_ledgers(events.append, os.fsencode(root),
                         {"agents": ["a", "b", "../x"], "since": "2026-01-02T00:00:00Z"})
    assert events == [
        {"t": "ledger", "agent": "a", "line": '{"time":"2026-01-03T00:00:00Z","n":2}'},
        {"t": "ledger-partial", "agent": "a", "bytes": len(b'{"time":"2026-01-04')},
        {"t": "ledger-end", "agent": "a", "lines": 1},
        {"t": "ledger-missing", "agent": "b",
         "path": str(root / "state" / "b" / "ledger.jsonl")},
        {"t": "ledger-unreadable", "agent": "../x",
         "path": str(root / "state" / "../x" / "ledger.jsonl"), "error": "not an agent name"},
        {"t": "ledgers-end"},
    ]


def test_status_reads_the_last_task_escalations_and_prefix_totals(tmp_path):
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    agent = root / "state" / "a"
    build_tree(agent, {
        "runs": {"t1": {"attempt-1.json": json.dumps({"verdict": "pass", "started": "s"}),
                        "result.json": json.dumps({"ok": True})}},
        "notify": {"e1.json": json.dumps({"task": "t1", "kind": "stuck", "extra": 1}),
                   ".tmp.json": "{}"},
        "ledger.jsonl": '{"prefix_tokens":{"system":3,"tools":4}}\nnot json\n{"prefix_tokens"',
    })
    events: list[dict] = []
    assert status.read_status(events.append, os.fsencode(root), {"agents": ["a"]}) == 0
    assert events[0]["t"] == "release" and events[0]["current"] == "r1"
    agent_status = events[1]
    assert agent_status["last_task"] == {
        "task": "t1", "result": {"ok": True}, "attempts_recorded": 1, "last_verdict": "pass",
        "last_started": "s", "last_finished": None}
    assert agent_status["escalations"] == 1
    assert agent_status["escalation_list"] == [
        {"task": "t1", "kind": "stuck", "time": None, "reason": None, "via": None}]
    assert (agent_status["turns"], agent_status["prefix_totals"]) == (1, [7])
    assert events[-1] == {"t": "status-end"}


# -- what is sent to a host --------------------------------------------------------------------


def test_the_payload_holds_every_module_of_the_host_package_and_the_protocol():
    sources = bundle.host_sources()
    on_disk = {f"fleetctl.host.{p.stem}" for p in
               (Path(bundle.__file__).parent / "host").glob("*.py") if p.stem != "__init__"}
    assert set(sources) == {"fleetctl", "fleetctl.host", "fleetctl.protocol"} | on_disk
    assert bundle.program() == bundle.program()  # the same bytes on every call
    imported = set()
    for (_is_package, source) in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    # Every fleetctl module the host program imports is in the payload; nothing else of it.
    assert {m for m in imported if m.split(".")[0] == "fleetctl"} <= set(sources)
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in imported
               if m.split(".")[0] != "fleetctl"), imported


def test_the_host_program_runs_on_python_3_8():
    """vermin reads the minimum Python version off the code: at most 3.8 (a host's python3)."""
    paths = [str(Path(bundle.__file__).parent / "host"), str(Path(bundle.__file__).parent /
                                                             "protocol.py")]
    vermin = str(Path(sys.executable).parent / "vermin")  # installed by scripts/setup.sh --test
    done = subprocess.run([vermin, "--no-tips", "--eval-annotations",
                           "-t=3.8-", "--violations", *paths], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"Minimum required versions: 3\.(\d+)", done.stdout)
    assert found and int(found.group(1)) <= 8, done.stdout
    for (_is_package, source) in bundle.host_sources().values():
        ast.parse(source, feature_version=(3, 8))


def test_the_program_runs_from_memory_through_the_bootstrap(tmp_path):
    """The bootstrap a sudoers rule names, the payload, a scan: as a transport runs it, with
    no site-packages (-S), so no installed fleetctl could be what runs."""
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    done = subprocess.run(
        [sys.executable, "-S", "-c", bundle.BOOTSTRAP],
        input=frame(bundle.program()) + frame(encode_json({"op": "scan", "root": str(root)})),
        capture_output=True, check=False, cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    # A newline first (it ends a line a login's start-up file printed), then one event a line.
    assert done.stdout.startswith(b"\n{")
    events = [json.loads(line) for line in done.stdout[1:].splitlines()]
    assert [e["path"] for e in events if e["t"] == "entry"] == ["a"]
    assert events[-1]["t"] == "scan-end"


def test_status_lists_standing_denials_and_names_a_corrupt_one(tmp_path):
    """Standing denials come oldest first with the command that clears each; a file the runner
    left that is not a JSON object still holds tasks (the runner goes by its name), so it is
    listed under its name and also named in ``errors`` (status exits 2 for unreadable records:
    docs/report.md). Before, the corrupt file was listed with no error."""
    root = tmp_path / "root"
    make_release(root, "r1", {"a": "1"})
    build_tree(root / "state" / "a" / "standing-denials", {
        "tool_Bash.json": json.dumps({"permission": "tool:Bash", "time": "2026-12-01T10:00:00Z",
                                      "task": "t7", "run": "r", "what": "denied"}),
        "cli_vault.json": "{bad",
    })
    events: list[dict] = []
    assert status.read_status(events.append, os.fsencode(root), {"agents": ["a"]}) == 0
    agent = events[1]
    assert [(d["permission"], d["since"], d["task"]) for d in agent["standing_denials"]] == [
        ("cli_vault", None, None), ("tool:Bash", "2026-12-01T10:00:00Z", "t7")]
    runner = f"{root}/current/runner/bin/fleet-runner"
    assert agent["standing_denials"][1]["clear"] == (
        f"{runner} --agent a --root {root} --clear-denial tool:Bash")
    corrupt = root / "state" / "a" / "standing-denials" / "cli_vault.json"
    assert agent["errors"] == [f"{corrupt}: not a readable standing denial (JSON object)"]
