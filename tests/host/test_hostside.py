"""Pieces of the host program (fleetctl.host) that stand on their own."""

from __future__ import annotations

import pathspec
import pytest

from fleetctl.host import files as host_files
from fleetctl.host import ship as host_ship
from fleetctl.blueprint import load_blueprint
from fleetctl.drift import Change
from fleetctl.manifest import Entry, Manifest
from fleetctl.plan import plan_digest
from fleetctl.ship import ignore_regexes
from tests.helpers import make_project

PATTERNS = ["__pycache__/", "*.pyc", "!keep.pyc", "/top-only", "logs/**/*.log", "spool/"]
PATHS = [("runner/__pycache__", "dir"), ("runner/__pycache__/a.pyc", "file"), ("a.pyc", "file"),
         ("x/keep.pyc", "file"), ("top-only", "file"), ("sub/top-only", "file"),
         ("logs/a/b/c.log", "file"), ("logs/c.txt", "file"), ("spool", "dir"), ("spool", "file"),
         ("runner/run.sh", "file")]


def test_host_side_ignore_matches_pathspec(tmp_path):
    """The host applies .fleetignore with the regexes pathspec compiled, with its verdicts."""
    bp = make_project(tmp_path, {}, fleetignore="\n".join(PATTERNS) + "\n")
    blueprint = load_blueprint(bp)
    ignore = host_ship.compile_ignore(ignore_regexes(blueprint))
    spec = pathspec.PathSpec.from_lines("gitignore", PATTERNS)
    for path, kind in PATHS:
        expected = spec.match_file(path + "/" if kind == "dir" else path)
        assert host_ship.is_ignored(ignore, {"path": path, "type": kind}) == expected, path


def test_plan_digest_sees_a_hand_patch_edited_again():
    """Regression: a re-edited hand-patch used to give the same plan digest as the one shown."""
    desired = Entry("a", "file", "0644", "root:root", 1, "sha256:aa")
    shown = Change("a", "content", "hand-patch", Entry("a", "file", "0644", "root:root", 1,
                                                       "sha256:bb"), desired, desired)
    now = Change("a", "content", "hand-patch", Entry("a", "file", "0644", "root:root", 1,
                                                     "sha256:cc"), desired, desired)
    m = Manifest([desired])
    assert plan_digest([shown], m, "r1") != plan_digest([now], m, "r1")
    assert plan_digest([shown], m, "r1") == plan_digest([shown], m, "r1")


@pytest.mark.parametrize("data", [b"", b"x", b"y" * (3 << 20)])
def test_copies_are_new_inodes_with_the_same_bytes(tmp_path, data):
    src = tmp_path / "src"
    src.write_bytes(data)
    dest = tmp_path / "dest"
    host_files.write_file(bytes(dest), bytes(src), (-1, -1), 0o640)
    assert dest.read_bytes() == data
    assert dest.stat().st_ino != src.stat().st_ino
    assert dest.stat().st_mode & 0o7777 == 0o640
