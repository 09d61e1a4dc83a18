"""The three-way comparison on hand-written manifests: every kind and every origin."""

from __future__ import annotations

import pytest

from fleetctl.drift import compare, kinds_of
from fleetctl.manifest import Entry, Manifest

OWNER = "root:root"


def f(path, digest="sha256:aa", mode="0644", owner=OWNER, size=1):
    return Entry(path, "file", mode=mode, owner=owner, size=size, digest=digest)


def d(path, mode="0755", owner=OWNER):
    return Entry(path, "dir", mode=mode, owner=owner)


def s(path, target, owner=OWNER):
    return Entry(path, "symlink", owner=owner, target=target)


def triples(changes):
    return [(c.path, c.change, c.origin) for c in changes]


# (name, desired, live, shipped, expected [(path, kind, origin)])
CASES = [
    ("in sync", [f("a")], [f("a")], [f("a")], []),
    ("pending content", [f("a", "sha256:bb")], [f("a")], [f("a")], [("a", "content", "pending")]),
    ("hand-patch content", [f("a")], [f("a", "sha256:bb")], [f("a")],
     [("a", "content", "hand-patch")]),
    ("conflict content", [f("a", "sha256:bb")], [f("a", "sha256:cc")], [f("a")],
     [("a", "content", "conflict")]),
    ("live already equals new desired: nothing", [f("a", "sha256:bb")], [f("a", "sha256:bb")],
     [f("a")], []),
    ("unknown: no record", [f("a")], [f("a", "sha256:bb")], None, [("a", "content", "unknown")]),
    ("pending new file", [f("a"), f("b")], [f("a")], [f("a")], [("b", "missing", "pending")]),
    ("hand-deleted file", [f("a"), f("b")], [f("a")], [f("a"), f("b")],
     [("b", "missing", "hand-patch")]),
    ("hand-added file", [f("a")], [f("a"), f("x")], [f("a")], [("x", "extra", "hand-patch")]),
    ("file removed from blueprint", [f("a")], [f("a"), f("x")], [f("a"), f("x")],
     [("x", "extra", "pending")]),
    ("mode only", [f("a", mode="0755")], [f("a")], [f("a")], [("a", "mode", "pending")]),
    ("mode hand-patch, content pending: per-kind origins", [f("a", "sha256:bb")],
     [f("a", mode="0600")], [f("a")],
     [("a", "content", "pending"), ("a", "mode", "hand-patch")]),
    ("owner hand-patch", [f("a")], [f("a", owner="nobody:nogroup")], [f("a")],
     [("a", "owner", "hand-patch")]),
    ("sticky dir mode", [d("t", "1777")], [d("t", "0777")], [d("t", "1777")],
     [("t", "mode", "hand-patch")]),
    ("file became symlink on host", [f("a")], [s("a", "elsewhere")], [f("a")],
     [("a", "type", "hand-patch")]),
    ("dir to file in blueprint", [f("a")], [d("a")], [d("a")], [("a", "type", "pending")]),
    ("symlink target", [s("l", "x")], [s("l", "y")], [s("l", "x")],
     [("l", "target", "hand-patch")]),
    ("brand-new host: empty shipped state", [f("a")], [], [], [("a", "missing", "pending")]),
]


@pytest.mark.parametrize("name,desired,live,shipped,expected", CASES, ids=[c[0] for c in CASES])
def test_compare(name, desired, live, shipped, expected):
    changes = compare(Manifest(desired), Manifest(live),
                      None if shipped is None else Manifest(shipped))
    assert triples(changes) == expected


def test_changes_come_in_path_order_with_parents_first():
    desired = Manifest([d("b"), f("b/x"), f("a-c"), f("a/z")])
    changes = compare(desired, Manifest(), Manifest())
    assert [c.path for c in changes] == ["a/z", "a-c", "b", "b/x"]


def test_kinds_report_type_alone_when_types_differ():
    # A symlink whose target holds the same bytes is still a different thing: type, nothing else.
    assert kinds_of(s("a", "real"), f("a")) == ["type"]


def test_mtime_is_not_part_of_an_entry():
    # Manifests carry no time at all, so a touched file cannot drift.
    assert not {"mtime", "ctime", "inode"} & set(Entry.__slots__)
