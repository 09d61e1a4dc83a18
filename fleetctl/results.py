"""Per-host results and the progress protocol every command reports through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fleetctl.diffs import FileDiff
from fleetctl.drift import Change
from fleetctl.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, EXIT_REFUSED
from fleetctl.livestate import Unreadable
from fleetctl.source import Ancestry

if TYPE_CHECKING:
    from fleetctl.credentials import UncheckedGrant

# status -> exit code (DESIGN.md §4)
STATUS_EXIT = {
    "in-sync": EXIT_OK,
    "drift": EXIT_FINDINGS,
    "shipped": EXIT_OK,
    "no-op": EXIT_OK,
    "dry-run": EXIT_OK,
    "refused": EXIT_REFUSED,
    "declined": EXIT_REFUSED,
    "incomplete": EXIT_ERROR,
    "error": EXIT_ERROR,
    # Internal states of a fleet ship; a result never leaves ship_fleet in them.
    "planning": EXIT_ERROR,
    "ready": EXIT_ERROR,
}


@dataclass(frozen=True, slots=True)
class ServiceActions:
    """What a ship did (or, for a dry run, would do) to a systemd host's runner units.

    Attributes:
        installed: unit files written: new, or differing in content or mode.
        removed: ``fleet-runner-*.service`` files no agent wants any more: disabled, stopped,
            deleted.
        restarted: units restarted (a new release, or their file was written).
        started: units only started, because nothing about them changed (``systemctl start``
            leaves a running unit alone).
    """

    installed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    started: tuple[str, ...] = ()

    @property
    def changes_files(self) -> bool:
        """Whether unit files are (to be) written or removed."""
        return bool(self.installed or self.removed)

    def to_json(self) -> dict[str, list[str]]:
        """The four lists, as JSON."""
        return {"installed": list(self.installed), "removed": list(self.removed),
                "restarted": list(self.restarted), "started": list(self.started)}


@dataclass(slots=True)
class HostResult:
    """What one command did on one host.

    Attributes:
        host: the inventory name.
        status: ``in-sync``, ``drift``, ``incomplete``, ``error`` (drift); ``shipped``,
            ``no-op``, ``dry-run``, ``refused``, ``declined``, ``incomplete``, ``error`` (ship).
        changes: the differences found (drift) or planned/applied (ship), in path order.
        error: a one-line message when status is ``error``, ``incomplete`` or ``refused``.
        hint: what the user can do about ``error``.
        step: for a failed ship, the step where it stopped (``lock``, ``receive``, ``assemble``,
            ``verify``, ``record``, ``switch``...).
        release: the release in use after the command.
        previous: the release in use before it.
        pruned: releases removed by the ship.
        unreadable: nodes the scan could not read.
        sent_bytes: content bytes sent to the host (ship), not counting framing.
        sent_files: distinct contents sent; the rest was copied on the host.
        plan_digest: identifies the plan, so a confirmed plan can be checked before shipping.
        warnings: trouble after the switch that did not undo it (a failed prune).
        services: for a ship of a host with ``service: systemd``, what was done to its runner
            units (for a dry run, what would be); ``None`` for other hosts and for drift.
        accounts: the agents' own accounts: for drift and a plan, what is missing (one line
            each); for a ship, what it created.
        dry_run: the result of ``ship --dry-run`` (or of the plan shown before asking).
        debug: an internal error's traceback, shown only with ``--debug``.
        commit: the blueprint commit the host's current release was rendered from, as its
            record says (``None``: not recorded).
        ancestry: how the source relates to ``commit`` (stale checkouts), when it was checked.
        identity: the name the host records as its own (``None``: not adopted yet).
        in_progress: the process holding the host's ship lock while drift scanned, if any.
        diffs: with ``--diff``, each changed file's content diff (secrets: digests only);
            ``None`` when not asked for.
        foreign: for drift, the entries of ``releases/`` fleetctl did not make
            (``{"name", "reason"}`` each, as the host sent them).
        failed_ships: for drift, the host's history lines (JSON text) of a last ship that
            failed and of ships killed before their switch (``fleetctl.releases.history_entry``
            reads them).
        unchecked: for drift, the grants whose secret was not available
            (:class:`~fleetctl.credentials.UncheckedGrant`): their files were compared with
            the shipped record alone.
    """

    host: str
    status: str
    changes: list[Change] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None
    step: str | None = None
    release: str | None = None
    previous: str | None = None
    pruned: list[str] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    sent_bytes: int = 0
    sent_files: int = 0
    plan_digest: str | None = None
    warnings: list[str] = field(default_factory=list)
    services: ServiceActions | None = None
    accounts: list[str] = field(default_factory=list)
    dry_run: bool = False
    debug: str | None = None
    commit: str | None = None
    ancestry: Ancestry | None = None
    identity: str | None = None
    in_progress: str | None = None
    diffs: list[FileDiff] | None = None
    unchecked: list[UncheckedGrant] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    failed_ships: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The exit code this host alone would give."""
        return STATUS_EXIT[self.status]


class Progress(Protocol):
    """Observer of long work; the CLI draws it, the core only calls it."""

    def host_started(self, host: str) -> None: ...

    def host_step(self, host: str, step: str) -> None: ...

    def host_finished(self, result: HostResult) -> None: ...


class NoProgress:
    """The default observer: does nothing."""

    def host_started(self, host: str) -> None:
        return None

    def host_step(self, host: str, step: str) -> None:
        return None

    def host_finished(self, result: HostResult) -> None:
        return None
