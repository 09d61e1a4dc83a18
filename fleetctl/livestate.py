"""What one scan of a host found (:class:`LiveState`), read from the host program's events.

The scan's events (``hello``, ``state``, ``entry``, ``shipped``, ``unreadable``, ``warning``,
``units``, ``accounts``, ``root``, ``locked``, ``scan-end``) are folded into one state; a ship
reads them in two parts (up to ``locked``, then on to ``scan-end``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl import protocol as p
from fleetctl.hostevents import (
    EntryEvent,
    Hello,
    HostEvent,
    UnreadableEvent,
    WarningEvent,
)
from fleetctl.manifest import Entry, Manifest
from fleetctl.names import show_name
from fleetctl.session import HostSession


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A node the scan could not read: its path and the host's reason."""

    path: str
    error: str


@dataclass(slots=True)
class LiveState:
    """What one scan of a host found.

    Attributes:
        user, group: the account the host-side program ran as (the default owner).
        root_exists: whether the managed root exists.
        current: the release id ``current`` points to, or ``None``.
        current_kind: ``symlink``, ``dir``, ``other``, ``foreign-symlink`` or ``None`` (absent).
        releases: release ids present on the host, oldest first.
        shipped: the shipped manifest (record of the current release) or ``None``.
        live: the live manifest of ``<root>/current``.
        unreadable: nodes the scan could not read; any makes the scan incomplete.
        warnings: what the host noticed but could work around (an unusable release record).
        units: for a request that asked (a dry run on a systemd host), the host's answer about
            the runners' units: ``install`` and ``remove`` (unit names), ``problem`` and
            ``kind`` (why the services step would fail, or ``None``); otherwise ``None``.
        accounts: the agents' own accounts as the host has them, by user name: ``exists``,
            ``group_exists``, ``home``, ``home_exists``, ``home_mode`` (``"0700"`` or
            ``None``), ``home_owner`` (``"user:group"`` or ``None``); ``None`` when the
            request named no account.
        identity: the host identity recorded at adoption, ``{"name", "id", "adopted"}``;
            ``{"problem": ...}`` when the file is there but unusable; ``None`` if none.
        meta: the provenance of the current release from its record (``source``, ``created``,
            ``shipped_by``, ``forced``, ``host``...; docs/provenance.md); ``{}`` if it has none.
        ship_in_progress: for a scan, the process holding the host's ship lock (``"pid N"``) at
            the start or the end of the scan, or why else a ship was seen (``current`` switched
            while the tree was walked); ``None`` when none was.
        foreign: the entries of ``releases/`` fleetctl did not make, as the host sent them
            (``{"name", "reason"}`` each).
        failed_ships: for a scan, the host's history lines (JSON text, as
            ``fleetctl.releases.history_entry`` reads them) of a last ship that failed and of
            ships killed before their switch; empty when the last ship went well.
        created_root: for a ship, whether taking the lock created the (empty) root.
        root_key: for a ship, the machine and inode of the root (equal keys: same directory).
    """

    user: str = ""
    group: str = ""
    root_exists: bool = False
    current: str | None = None
    current_kind: str | None = None
    releases: list[str] = field(default_factory=list)
    shipped: Manifest | None = None
    live: Manifest = field(default_factory=Manifest)
    unreadable: list[Unreadable] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    units: dict[str, Any] | None = None
    accounts: dict[str, dict[str, Any]] | None = None
    identity: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    ship_in_progress: str | None = None
    foreign: list[dict[str, Any]] = field(default_factory=list)
    failed_ships: list[str] = field(default_factory=list)
    created_root: bool = False
    root_key: str | None = None

    @property
    def commit(self) -> str | None:
        """The blueprint commit the current release was rendered from, if its record says."""
        source = self.meta.get("source")
        commit = source.get("commit") if isinstance(source, dict) else None
        return commit if isinstance(commit, str) else None

    @property
    def owner(self) -> str:
        """The default owner of managed entries on this host, ``"user:group"``."""
        return f"{self.user}:{self.group}"


def read_scan(session: HostSession, state: LiveState | None = None,
              until: str = p.SCAN_END) -> LiveState:
    """Read the session's events up to ``until`` and return the host's :class:`LiveState`.

    A ship reads twice into one state: up to ``locked`` (its turn in the fleet's lock order),
    then on to ``scan-end``.

    Raises:
        HostError: the output ended first; ShipRefused: the host's lock is held.
    """
    state = state if state is not None else LiveState()
    live: list[Entry] = []
    shipped: list[Entry] = []
    for event in session.events():
        if event.t == until == p.LOCKED:
            state.created_root = bool(event.raw.get("created_root"))
            return state
        if isinstance(event, EntryEvent) and event.entry is not None:
            (live if event.t == p.ENTRY else shipped).append(event.entry)
        elif isinstance(event, UnreadableEvent):
            state.unreadable.append(Unreadable(event.path, event.error))
        elif isinstance(event, WarningEvent):
            state.warnings.append(event.message)
        elif isinstance(event, Hello):
            state.user, state.group = event.user, event.group
        elif event.t == p.STATE:
            _fill(state, event)
        elif event.t == p.UNITS:
            state.units = event.raw
        elif event.t == p.ACCOUNTS:
            state.accounts = event.raw["accounts"]
        elif event.t == p.ROOT:
            state.root_key = event.raw["key"]
        elif event.t == p.SCAN_END:
            state.warnings[:0] = [w for w in session.transport_warnings
                                  if w not in state.warnings]
            _ship_seen(state, event.raw)
            state.live = Manifest(live)
            if state.shipped is not None:
                state.shipped = Manifest(shipped)
            return state
    raise session.broken("the scan ended early" if until == p.SCAN_END else
                         "the host-side program ended before taking the lock")


def _ship_seen(state: LiveState, end: dict[str, Any]) -> None:
    """What the end of a drift's scan adds: a ship that took the lock, or a ``current``
    switched, while the tree was walked, is a ship in progress too."""
    holder = end.get("ship_in_progress")
    if isinstance(holder, str) and holder and not state.ship_in_progress:
        state.ship_in_progress = holder
    if end.get("current_changed") is True and not state.ship_in_progress:
        state.ship_in_progress = "the release in use changed while drift scanned it"


def foreign_warning(foreign: list[Any]) -> str:
    """One line naming the entries of ``releases/`` fleetctl did not make (``{"name",
    "reason"}`` each, as the host sent them): kept, never counted, followed or removed."""
    shown = [f"{show_name(str(f.get('name')))} ({f.get('reason')})" for f in foreign[:5]
             if isinstance(f, dict)]
    more = f", and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    return ("releases/ holds entries fleetctl did not make, never counted, followed or "
            "removed (see `fleetctl releases`): " + "; ".join(shown) + more)


def _fill(state: LiveState, event: HostEvent) -> None:
    """The ``state`` event's fields, into ``state``."""
    raw = event.raw
    state.root_exists = raw["root_exists"]
    state.current = raw["current"]
    state.current_kind = raw["current_kind"]
    state.releases = raw["releases"]
    foreign = raw.get("foreign")
    if isinstance(foreign, list) and foreign:
        state.warnings.append(foreign_warning(foreign))
        state.foreign = [f for f in foreign if isinstance(f, dict)]
    for error in raw.get("story_errors") or []:
        state.warnings.append(f"{error}: whether the last ship failed is not known")
    failed = raw.get("failed_ships")
    state.failed_ships = [x for x in failed if isinstance(x, str)] \
        if isinstance(failed, list) else []
    staging = raw.get("staging")
    if isinstance(staging, list) and staging and not raw.get("ship_in_progress") and \
            "ship_in_progress" in raw:
        state.warnings.append("releases/ holds what an interrupted ship left ({}): never in "
                              "use, and the next ship removes it".format(
                                  ", ".join(show_name(str(n)) for n in staging[:5])))
    state.identity = raw.get("identity")
    state.meta = raw.get("meta") or {}
    state.ship_in_progress = raw.get("ship_in_progress")
    if raw["shipped"]:
        state.shipped = Manifest()
