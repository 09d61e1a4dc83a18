"""Releases on a host, their history, and rollback (docs/releases.md).

A host keeps its releases beside each other (``<root>/releases/<id>``), each with a record of
what it holds and where it came from (docs/provenance.md), and a history line for every ship,
failed ship and rollback (``<root>/.fleetctl/history.jsonl``). Entries of ``releases/`` that
are no release (foreign, a ship's staging, a prune's leftover) are listed apart, never as
releases. A rollback switches ``current`` back to an earlier release under the host's lock,
after checking that release against its record.

What a host returns is not trusted: release ids must be plain names, provenance values must have
the expected types, and history lines that are not JSON objects are skipped with a warning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import HostError, ShipRefused
from fleetctl.hostops import run_op
from fleetctl.inventory import Host
from fleetctl.protocol import RELEASE_ID as _RELEASE_ID
from fleetctl.source import operator, utc_now

_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _commit(source: Any) -> tuple[str | None, bool | None]:
    """(commit, clean) from a record's ``source``, or ``(None, None)`` when not recorded."""
    if not isinstance(source, dict):
        return None, None
    commit = source.get("commit")
    clean = source.get("clean")
    return (commit if isinstance(commit, str) and _COMMIT.fullmatch(commit) else None,
            clean if isinstance(clean, bool) else None)


def _forced(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("paths") or value.get("stale"))
    return bool(value) if isinstance(value, bool) else False


@dataclass(frozen=True, slots=True)
class ReleaseInfo:
    """One release on a host, from its record.

    Attributes:
        id: the release id (``20261130T013857332Z-b9a8ee0c``).
        current: whether ``current`` points to it.
        recorded: whether it has a record (one without is a leftover, never a rollback target).
        created: UTC time of the ship (ISO 8601), if recorded.
        commit: the blueprint commit (40 hex), if recorded.
        clean: whether the source was exactly that commit, if recorded.
        shipped_by: ``user@machine``, if recorded.
        forced: whether hand-patches or a stale checkout were overridden.
        allow_dirty: whether it was shipped from a dirty source with ``--allow-dirty``.
        problem: why its record cannot be used (then it is no rollback target), or ``None``.
        in_use_since: for the current release, the history line that put it in use (a ship
            or a rollback: its time and who), or ``None`` when the history does not say.
        rolled_back: each rollback away from this release, oldest first (time, who, to
            which release): from the history.
    """

    id: str
    current: bool
    recorded: bool
    created: str | None = None
    commit: str | None = None
    clean: bool | None = None
    shipped_by: str | None = None
    forced: bool = False
    allow_dirty: bool = False
    problem: str | None = None
    in_use_since: HistoryEntry | None = None
    rolled_back: tuple[HistoryEntry, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The release as a JSON object (the keys above; history lines as in ``history``)."""
        return {"id": self.id, "current": self.current, "recorded": self.recorded,
                "created": self.created, "commit": self.commit, "clean": self.clean,
                "shipped_by": self.shipped_by, "forced": self.forced,
                "allow_dirty": self.allow_dirty, "problem": self.problem,
                "in_use_since": self.in_use_since.to_json() if self.in_use_since else None,
                "rolled_back": [e.to_json() for e in self.rolled_back]}


@dataclass(frozen=True, slots=True)
class ForeignEntry:
    """An entry of ``releases/`` that is no release: never counted, followed or removed.

    Attributes:
        name: its name as the host sent it (shown escaped: it may hold any byte).
        kind: ``foreign`` (fleetctl did not make it), ``staging`` (a ship in progress, or the
            leftover of one that was interrupted) or ``pruning`` (an old release a prune could
            not remove completely).
        reason: what it is (a file, a symlink, a directory without a record...).
    """

    name: str
    kind: str
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON object (the keys above)."""
        return {"name": self.name, "kind": self.kind, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One ship or rollback on a host, from its history file.

    Attributes:
        host: the inventory name the command came through.
        kind: ``ship`` or ``rollback``.
        time: UTC time (ISO 8601).
        by: ``user@machine``.
        release: the release put in use.
        previous: the release in use before.
        commit: the blueprint commit of ``release``, if recorded.
        clean: whether that source was clean, if recorded.
        forced: whether anything was overridden (hand-patches, a stale checkout, a release
            that differed from its record).
        step: for ``failed``, the step the ship stopped at (``unknown`` when it was killed
            and the next ship found what it left).
        error: for ``failed``, the kind of error (``failed``, ``permission``, ``changed``,
            ``aborted``, ``hangup``, ``interrupted``...).
        message: for ``failed``, the host's error message.
        path: for ``failed``, the path the error names, if any.
        items: for ``failed``, every path the error is about with what was refused there
            (``(path, what)``: an owner that could not be set...), at most the host's 100.
        items_total: how many paths the error was about (``len(items)`` unless cut).
    """

    host: str
    kind: str
    time: str | None
    by: str | None
    release: str | None
    previous: str | None
    commit: str | None
    clean: bool | None
    forced: bool
    step: str | None = None
    error: str | None = None
    message: str | None = None
    path: str | None = None
    items: tuple[tuple[str, str], ...] = ()
    items_total: int = 0

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON object (the keys above; ``items`` as ``[[path, what], ...]``)."""
        return {"host": self.host, "kind": self.kind, "time": self.time, "by": self.by,
                "release": self.release, "previous": self.previous, "commit": self.commit,
                "clean": self.clean, "forced": self.forced, "step": self.step,
                "error": self.error, "message": self.message, "path": self.path,
                "items": [list(item) for item in self.items], "items_total": self.items_total}


@dataclass(slots=True)
class HostReleases:
    """What ``releases`` and ``history`` read from one host.

    Attributes:
        host: the inventory name.
        current: the release in use, or ``None``.
        releases: every release, oldest first.
        history: every ship, failed ship and rollback recorded, oldest first.
        foreign: the entries of ``releases/`` that are no release, by name.
        in_progress: the process holding the host's ship lock (``pid N``) while it was read.
        warnings: lines of the host's answer that were not usable (skipped).
        error: why the host could not be read (then the lists are empty).
    """

    host: str
    current: str | None = None
    releases: list[ReleaseInfo] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)
    foreign: list[ForeignEntry] = field(default_factory=list)
    in_progress: str | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def read_releases(host: Host) -> HostReleases:
    """Read a host's releases and history (read-only; takes no lock).

    Raises:
        HostError: the host cannot be reached or its program failed.
    """
    events = run_op(host, {"op": "releases"}, "releases-end")
    out = HostReleases(host.name)
    for event in events:
        kind = event.get("t")
        if kind == "releases":
            current = event.get("current")
            out.current = current if isinstance(current, str) and _RELEASE_ID.fullmatch(current) \
                else None
            out.in_progress = _text(event.get("ship_in_progress"))
        elif kind == "release" and event.get("kind", "release") != "release":
            name = event.get("id")
            out.foreign.append(ForeignEntry(name if isinstance(name, str) else repr(name),
                                            str(event.get("kind")), _text(event.get("reason"))))
        elif kind == "release":
            rid = event.get("id")
            if not isinstance(rid, str) or not _RELEASE_ID.fullmatch(rid):
                out.warnings.append(f"skipped a release with a name that is not a release id: "
                                    f"{rid!r:.80}")
                continue
            meta = event.get("meta")
            if not isinstance(meta, dict):
                meta = {}
            commit, clean = _commit(meta.get("source"))
            out.releases.append(ReleaseInfo(
                rid, rid == out.current, bool(event.get("recorded")), _text(meta.get("created")),
                commit, clean, _text(meta.get("shipped_by")), _forced(meta.get("forced")),
                meta.get("allow_dirty") is True, _text(event.get("problem"))))
        elif kind == "history":
            entry = history_entry(host.name, event.get("line"))
            if entry is None:
                out.warnings.append("skipped a history line that is not a ship or rollback "
                                    "record")
            else:
                out.history.append(entry)
        elif kind == "warning":
            out.warnings.append(str(event.get("message")))
    out.releases = [_with_history(r, out.history) for r in out.releases]
    return out


def _with_history(release: ReleaseInfo, history: list[HistoryEntry]) -> ReleaseInfo:
    """``release`` with what the history says of it: the line that last put it in use (for the
    current one) and each rollback away from it."""
    from dataclasses import replace

    since = None
    if release.current:
        put = [e for e in history if e.kind in ("ship", "rollback") and e.release == release.id]
        since = put[-1] if put else None
    away = tuple(e for e in history if e.kind == "rollback" and e.previous == release.id)
    return replace(release, in_use_since=since, rolled_back=away)


def history_entry(host: str, line: Any) -> HistoryEntry | None:
    """One line of a host's history (str, JSON) as a :class:`HistoryEntry`, or ``None`` when
    it is no ship, failed ship or rollback line fleetctl can use (``host``: the inventory name,
    used when the line names none)."""
    try:
        data = json.loads(line) if isinstance(line, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("kind") not in ("ship", "rollback", "failed"):
        return None
    release, previous = _text(data.get("release")), _text(data.get("previous"))
    if release is not None and not _RELEASE_ID.fullmatch(release):
        return None
    if previous is not None and not _RELEASE_ID.fullmatch(previous):
        previous = None
    commit, clean = _commit(data.get("source"))
    return HistoryEntry(_text(data.get("host")) or host, data["kind"], _text(data.get("time")),
                        _text(data.get("by")), release, previous, commit, clean,
                        _forced(data.get("forced")), _text(data.get("step")),
                        _text(data.get("error")), _text(data.get("message")),
                        _text(data.get("path")), *_items(data))


def _items(data: dict[str, Any]) -> tuple[tuple[tuple[str, str], ...], int]:
    """A failed line's ``items`` and ``items_total``; malformed items are skipped."""
    raw = data.get("items")
    items = tuple((p, w) for p, w in (x for x in raw if isinstance(x, list) and len(x) == 2)
                  if isinstance(p, str) and isinstance(w, str)) if isinstance(raw, list) else ()
    total = data.get("items_total")
    if not isinstance(total, int) or isinstance(total, bool) or total < len(items):
        total = len(items)
    return items, total


@dataclass(frozen=True, slots=True)
class RollbackResult:
    """What a rollback did.

    Attributes:
        host: the inventory name.
        release: the release now in use.
        previous: the release in use before.
        differences: with ``force``, how the release differed from its record (paths and
            kinds); empty when it matched.
        unchanged: the release asked for was already in use (nothing was done).
    """

    host: str
    release: str
    previous: str
    differences: tuple[str, ...] = ()
    unchanged: bool = False

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object (the keys above)."""
        return {"host": self.host, "release": self.release, "previous": self.previous,
                "differences": list(self.differences), "unchanged": self.unchanged}


def rollback(host: Host, to: str | None = None, force: bool = False) -> RollbackResult:
    """Switch a host back to an earlier release, atomically, under its lock.

    Args:
        host: the host.
        to: the release id; ``None`` for the release the current one replaced (``previous`` in
            its record), or else the newest older one.
        force: switch even when the release differs from its record (recorded).

    Raises:
        InputError-like HostError: no such release, nothing to roll back to.
        ShipRefused: the host is locked by a ship, or the release was changed since it was
            shipped (its differences named) and ``force`` was not given.
    """
    if to is not None and not _RELEASE_ID.fullmatch(to):
        raise HostError(f"{host.name}: {to!r} is not a release id",
                        hint=f"see `fleetctl releases {host.name}`")
    try:
        events = run_op(host, {"op": "rollback", "to": to, "force": force, "host": host.name,
                               "time": utc_now(), "by": operator()}, "done")
    except ShipRefused as exc:
        if exc.step == "verify" and not exc.hint:  # the target differs from its record
            exc.hint = (f"fleetctl rollback {host.name}{' --to ' + to if to else ''} --force "
                        "switches to it as it is now (recorded as forced); or pick another "
                        f"release with --to (fleetctl releases {host.name})")
        raise
    done = events[-1]
    release, previous = _text(done.get("release")), _text(done.get("previous"))
    if release is None or previous is None:
        raise HostError(f"{host.name}: the host's answer to the rollback is not usable")
    differences = done.get("differences")
    if not isinstance(differences, list):
        differences = []
    return RollbackResult(host.name, release, previous, tuple(str(d) for d in differences),
                          done.get("unchanged") is True)

