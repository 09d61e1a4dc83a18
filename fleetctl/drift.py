"""Drift: the three-way comparison of desired, live and shipped manifests (DESIGN.md §2).

For each path where live and desired differ, one :class:`Change` per kind of difference, each
with its origin found by comparing that same attribute three ways:

==================  ==================  ==============
desired vs shipped  live vs shipped     origin
==================  ==================  ==============
differs             same                ``pending``
same                differs             ``hand-patch``
differs             differs             ``conflict``
no shipped record   (live not empty)    ``unknown``
==================  ==================  ==============

A host with nothing under its root (no ``current`` at all) has an empty shipped state rather than
an unknown one: nothing on it can be lost, so a first ship of a new box is ``pending``, not a
refusal. ``unknown`` is kept for adopting a box that has content but no record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pathspec

from fleetctl.credentials import is_credential_path
from fleetctl.manifest import Entry, Manifest

MISSING, EXTRA, TYPE, CONTENT, MODE, OWNER, TARGET = (
    "missing", "extra", "type", "content", "mode", "owner", "target")
KINDS = (MISSING, EXTRA, TYPE, CONTENT, MODE, OWNER, TARGET)

PENDING, HAND_PATCH, CONFLICT, UNKNOWN = "pending", "hand-patch", "conflict", "unknown"
ORIGINS = (PENDING, HAND_PATCH, CONFLICT, UNKNOWN)
# Origins ship refuses without --force: applying them would discard what is on the host.
REFUSED_ORIGINS = (HAND_PATCH, CONFLICT, UNKNOWN)


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between the live and the desired tree.

    Attributes:
        path: relative to the managed tree.
        change: the kind: ``missing`` (desired only), ``extra`` (live only), ``type``,
            ``content``, ``mode``, ``owner``, ``target``.
        origin: ``pending``, ``hand-patch``, ``conflict`` or ``unknown``.
        live: the live entry (``None`` when missing).
        desired: the desired entry (``None`` when extra).
        shipped: the entry in the shipped manifest (``None`` when absent or no record).
    """

    path: str
    change: str
    origin: str
    live: Entry | None
    desired: Entry | None
    shipped: Entry | None


def _presence(e: Entry | None) -> object:
    return None if e is None else e.type


_PROJECTIONS: dict[str, Callable[[Entry | None], object]] = {
    MISSING: _presence,
    EXTRA: _presence,
    TYPE: _presence,
    CONTENT: lambda e: None if e is None else e.digest,
    MODE: lambda e: None if e is None else e.mode,
    OWNER: lambda e: None if e is None else e.owner,
    TARGET: lambda e: None if e is None else e.target,
}


def kinds_of(live: Entry | None, desired: Entry | None) -> list[str]:
    """Return the kinds of change between a live and a desired entry (empty when equal)."""
    if live is None and desired is None:
        return []
    if live is None:
        return [MISSING]
    if desired is None:
        return [EXTRA]
    if live.type != desired.type:
        return [TYPE]
    kinds = []
    if live.digest != desired.digest:
        kinds.append(CONTENT)
    if live.target != desired.target:
        kinds.append(TARGET)
    if live.mode != desired.mode:
        kinds.append(MODE)
    if live.owner != desired.owner:
        kinds.append(OWNER)
    return kinds


def origin_of(kind: str, live: Entry | None, desired: Entry | None,
              shipped: Entry | None, has_record: bool) -> str:
    """Return the origin of one change by comparing the kind's attribute three ways."""
    if not has_record:
        return UNKNOWN
    project = _PROJECTIONS[kind]
    base = project(shipped)
    desired_moved = project(desired) != base
    live_moved = project(live) != base
    if desired_moved and live_moved:
        return CONFLICT
    if live_moved:
        return HAND_PATCH
    return PENDING


def compare(desired: Manifest, live: Manifest, shipped: Manifest | None,
            ignore: pathspec.PathSpec | None = None) -> list[Change]:
    """Compare the trees and return every change in path order.

    Args:
        desired: the desired manifest with owners resolved.
        live: the live manifest of the host's managed tree.
        shipped: the shipped manifest, or ``None`` when the host has content but no record;
            an empty manifest for a host with nothing on it.
        ignore: ``.fleetignore`` patterns; matching paths present only live never drift.
    """
    changes = []
    has_record = shipped is not None
    base = shipped if shipped is not None else Manifest()
    for path in Manifest([*(e for e in desired),
                          *(e for e in live if e.path not in desired)]).paths():
        want, have = desired.get(path), live.get(path)
        if want is None and ignore is not None and _ignored(ignore, path, have):
            continue
        for kind in kinds_of(have, want):
            was = base.get(path)
            changes.append(Change(path, kind, origin_of(kind, have, want, was, has_record),
                                  have, want, was))
    return changes


def _ignored(ignore: pathspec.PathSpec, path: str, entry: Entry | None) -> bool:
    # .fleetignore is for the release tree's runtime files; nothing under credentials/ may hide
    # from drift (ship removes what no grant renders, whatever its name).
    if is_credential_path(path):
        return False
    return ignore.match_file(path + "/" if entry is not None and entry.type == "dir" else path)
