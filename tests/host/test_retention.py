"""Retention, rollback targets and foreign entries in ``releases/``, run in this process on a
real file system under tmp_path (the host program's functions, a list as their event sink).

The cases come from other deploy tools' bug reports: deployer counted a ``runtime/`` directory
and a ``<id>.bak`` copy in ``releases/`` as releases and pruned the good ones
(deployphp/deployer#558); Capistrano's cleanup removed the release ``current`` used when
symlinks sat in ``releases/`` (capistrano/capistrano#68), and after failed deploys kept the
failed release directories and deleted the last working one (capistrano#1907, #2120,
deployer#579); an unfinished release became a rollback target (ansistrano/deploy#209).
Expected values are what the test builds, never fleetctl's own listing.
"""

from __future__ import annotations

import grp
import hashlib
import io
import json
import os
import pwd
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetctl.host import main, releases, ship
from fleetctl.protocol import encode_json, frame
from tests.helpers import build_tree

ME = f"{pwd.getpwuid(os.geteuid()).pw_name}:{grp.getgrgid(os.getegid()).gr_name}"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rid(n: int) -> str:
    """A release id as fleetctl makes them (time order is text order)."""
    return f"2026010{n // 10}T0000000{n % 10}0Z-0000000{n % 10}"


def good_release(root: Path, release: str, previous: str | None, data: str = "x") -> None:
    """A release as a ship leaves it: its directory, a record naming it, current switched,
    and the history line."""
    build_tree(root / "releases" / release, {"a": data})
    os.chmod(root / "releases" / release / "a", 0o644)
    records = root / ".fleetctl" / "releases"
    records.mkdir(parents=True, exist_ok=True)
    (records / f"{release}.json").write_text(json.dumps({
        "schema_version": 1, "release": release, "previous": previous,
        "manifest": [{"path": "a", "type": "file", "mode": "0644", "owner": ME,
                      "size": len(data), "digest": sha(data.encode())}]}))
    switch_to(root, release)
    with open(root / ".fleetctl" / "history.jsonl", "a") as fh:
        fh.write(json.dumps({"kind": "ship", "release": release, "previous": previous}) + "\n")


def switch_to(root: Path, release: str) -> None:
    current = root / "current"
    if current.is_symlink():
        current.unlink()
    current.symlink_to(f"releases/{release}")


def ship_in_process(root: Path, release: str, keep: int, previous: str) -> tuple[int, list]:
    """One whole ship of a one-file tree through the host program's entry point."""
    data = release.encode()
    command = {"cmd": "ship", "release": release, "keep": keep, "sources": {},
               "desired": [{"path": "a", "type": "file", "mode": "0644", "size": len(data),
                            "digest": sha(data)}], "blob_count": 1, "secret_count": 0,
               "ignore": [], "meta": {"previous": previous, "shipped_by": "t"}}
    stdin = io.BytesIO(frame(encode_json({"op": "ship", "root": str(root)})) +
                       frame(encode_json({"cmd": "lock"})) + frame(encode_json(command)) +
                       sha(data).encode() + b"\n%d\n" % len(data) + data +
                       frame(encode_json({"cmd": "commit"})))
    events: list[dict] = []
    return main.main(events.append, stdin), events


def rollback(root: Path, request: dict) -> tuple[int, list]:
    """The ``rollback`` op through the host program's entry point."""
    events: list[dict] = []
    return main.main(events.append, io.BytesIO(frame(encode_json(
        {"op": "rollback", "root": str(root), **request})))), events


def foreign_entries(root: Path, outside: Path) -> dict[str, str]:
    """What a person or another program leaves in ``releases/``: name → what it is."""
    top = root / "releases"
    build_tree(top / "runtime", {"cache": "c"})  # deployer#558: misconfigured app's garbage
    build_tree(top / f"{rid(2)}.bak", {"a": "copy"})  # a hand-made backup copy
    build_tree(top / rid(99), {"a": "future"})  # named like a release, newest, no record
    (top / "notes.txt").write_text("a file\n")
    outside.mkdir()
    (outside / "precious").write_text("outside the root\n")
    os.symlink(outside, top / "project1")  # capistrano#68: symlinks to elsewhere
    os.symlink(f"{rid(1)}", top / rid(98))  # a symlink named like a release, to a good one
    return {"runtime": "dir", f"{rid(2)}.bak": "dir", rid(99): "dir", "notes.txt": "file",
            "project1": "symlink", rid(98): "symlink"}


def test_foreign_entries_are_not_counted_followed_or_removed_and_the_rollback_target_stays(
        tmp_path):
    """Before: every name in ``releases/`` counted, so with keep 2 the foreign entries sorted
    last pushed the good releases out: the rollback target (rid 3) and rid 1 and 2 were
    pruned, and so were the foreign ``.bak`` copy, the future-named directory, the file and
    the symlink to the good release."""
    root = tmp_path / "root"
    for n in (1, 2, 3):
        good_release(root, rid(n), rid(n - 1) if n > 1 else None)
    made = foreign_entries(root, tmp_path / "outside")
    code, events = ship_in_process(root, rid(4), keep=2, previous=rid(3))
    assert code == 0, events[-1]
    assert events[-1]["pruned"] == [rid(1), rid(2)]
    assert sorted(os.listdir(root / "releases")) == sorted([rid(3), rid(4), *made])
    assert (tmp_path / "outside" / "precious").read_text() == "outside the root\n"
    assert (root / "releases" / "runtime" / "cache").read_text() == "c"
    assert os.readlink(root / "current") == f"releases/{rid(4)}"


def test_failed_release_directories_never_push_the_last_good_release_out(tmp_path):
    """capistrano#1907: four failed deploys left release directories without records; then a
    good ship with keep 2. Before: the four counted, so the previous good release (the one to
    roll back to) was pruned and the failed ones kept."""
    root = tmp_path / "root"
    good_release(root, rid(1), None)
    good_release(root, rid(2), rid(1))
    for n in (3, 4, 5, 6):
        build_tree(root / "releases" / rid(n), {"a": "half"})
    code, events = ship_in_process(root, rid(7), keep=2, previous=rid(2))
    assert code == 0, events[-1]
    assert events[-1]["pruned"] == [rid(1)]
    assert sorted(os.listdir(root / "releases")) == [rid(n) for n in (2, 3, 4, 5, 6, 7)]
    assert os.path.exists(root / ".fleetctl" / "releases" / f"{rid(2)}.json")


def test_keep_one_still_keeps_the_rollback_target(tmp_path):
    """The last good release before the one in use is never pruned, even with keep 1: before,
    it was removed and the host had nothing to go back to."""
    root = tmp_path / "root"
    good_release(root, rid(1), None)
    good_release(root, rid(2), rid(1))
    code, events = ship_in_process(root, rid(3), keep=1, previous=rid(2))
    assert code == 0, events[-1]
    assert events[-1]["pruned"] == [rid(1)]
    assert sorted(os.listdir(root / "releases")) == [rid(2), rid(3)]
    code, events = rollback(root, {})
    assert code == 0 and os.readlink(root / "current") == f"releases/{rid(2)}"


def test_a_rollback_never_goes_to_an_entry_fleetctl_did_not_make(tmp_path):
    """The default target skips a directory without a record (an unfinished release:
    ansistrano#209), and naming a foreign entry is refused, a symlink never followed even
    when a record was copied in for it."""
    root = tmp_path / "root"
    good_release(root, rid(1), None)
    good_release(root, rid(3), rid(2))
    build_tree(root / "releases" / rid(2), {"a": "unfinished"})  # the record's previous
    records = root / ".fleetctl" / "releases"
    os.symlink(rid(1), root / "releases" / rid(9))
    copied = json.loads((records / f"{rid(1)}.json").read_text())
    (records / f"{rid(9)}.json").write_text(json.dumps({**copied, "release": rid(9)}))
    for target in (rid(2), rid(9)):
        code, events = rollback(root, {"to": target})
        assert code == 1 and "not a release fleetctl made" in events[-1]["message"], events
        assert os.readlink(root / "current") == f"releases/{rid(3)}"
    code, events = rollback(root, {})
    assert code == 0, events[-1]
    assert events[-1]["release"] == rid(1)
    assert os.readlink(root / "current") == f"releases/{rid(1)}"


def test_releases_reports_each_foreign_entry_with_what_it_is(tmp_path):
    root = tmp_path / "root"
    good_release(root, rid(1), None)
    made = foreign_entries(root, tmp_path / "outside")
    (root / "releases" / f".staging-{rid(5)}").mkdir()
    events: list[dict] = []
    assert releases.list_releases(events.append, os.fsencode(root), {}) == 0
    listed = {e["id"]: e for e in events if e["t"] == "release"}
    assert {k: e["kind"] for k, e in listed.items()} == {
        rid(1): "release", f".staging-{rid(5)}": "staging",
        **{name: "foreign" for name in made}}
    for name, what in made.items():
        reason = listed[name]["reason"]
        assert what in reason or (what == "dir" and ("record" in reason or "name" in reason)), \
            (name, reason)


# -- the rule over every mix of entries ---------------------------------------------------------

KINDS = ("good", "no-record", "bad-record", "file", "symlink", "bad-name")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=9),
       keep=st.integers(min_value=1, max_value=4), current_pick=st.integers(min_value=0))
def test_prune_removes_only_good_releases_and_keeps_current_target_and_the_newest(
        kinds, keep, current_pick):
    """For any mix of entries: only good releases are removed; current, its rollback target
    and the ``keep`` newest good ones stay; nothing else in ``releases/`` changes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "releases").mkdir(parents=True)
        good: list[str] = []
        for n, kind in enumerate(kinds):
            name = rid(n + 10)
            if kind == "good":
                good_release(root, name, good[-1] if good else None)
                good.append(name)
            elif kind == "no-record":
                build_tree(root / "releases" / name, {"a": "x"})
            elif kind == "bad-record":
                build_tree(root / "releases" / name, {"a": "x"})
                (root / ".fleetctl" / "releases").mkdir(parents=True, exist_ok=True)
                (root / ".fleetctl" / "releases" / f"{name}.json").write_text("{truncated")
            elif kind == "file":
                (root / "releases" / name).write_text("f")
            elif kind == "symlink":
                os.symlink("/", root / "releases" / name)
            else:
                build_tree(root / "releases" / f"backup {n}", {"a": "x"})
        if not good:
            return
        current = good[current_pick % len(good)]
        switch_to(root, current)
        before = set(os.listdir(root / "releases"))
        events: list[dict] = []
        removed = ship.prune(events.append, os.fsencode(root), keep, os.fsencode(current))
        index = good.index(current)
        must_stay = set(good[-keep:]) | {current} | ({good[index - 1]} if index else set())
        must_stay.add(good[-1])  # the last ship's (its history line is the newest)
        assert set(removed) <= set(good) - must_stay
        assert set(removed) == set(good) - must_stay
        assert set(os.listdir(root / "releases")) == before - set(removed)
        assert os.readlink(root / "current") == f"releases/{current}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.binary(min_size=1, max_size=40).filter(
    lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b"..")),
    kind=st.sampled_from(("dir", "file", "symlink")))
def test_a_foreign_name_of_any_bytes_stays_data_and_stays_put(name, kind):
    """Whatever bytes an entry's name holds, ``releases`` reports it under those very bytes
    (decoded back), never as a release; a prune leaves it as it was."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        good_release(root, rid(1), None)
        good_release(root, rid(2), rid(1))
        path = os.path.join(os.fsencode(root / "releases"), name)
        if os.path.lexists(path):  # the name of one of the releases themselves
            return
        if kind == "dir":
            os.mkdir(path)
        elif kind == "file":
            with open(path, "wb") as fh:
                fh.write(b"x")
        else:
            os.symlink(b"/", path)
        events: list[dict] = []
        releases.list_releases(events.append, os.fsencode(root), {})
        listed = {os.fsencode(e["id"]): e["kind"] for e in events if e["t"] == "release"}
        assert listed[name] in ("foreign", "staging", "pruning")
        assert {k for k, v in listed.items() if v == "release"} == {rid(1).encode(),
                                                                    rid(2).encode()}
        assert ship.prune(events.append, os.fsencode(root), 1, rid(2).encode()) == []
        assert os.path.lexists(path)
