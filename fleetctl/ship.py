"""Drift and ship for one host, and the fan-out over many.

Ship is plan, then act (DESIGN.md §3): under the host's lock, the host-side program scans, the
plan is made from that scan with the same engine as ``drift``, and only then is the command sent.
Refusals, no-ops and dry runs send ``abort`` and write nothing; the managed root is not even
created. A ship sends only content the host does not already have; every other file is copied on
the host from the current release (never hard-linked: invariant 4).

On a host with ``service: systemd`` the runners' units (:mod:`fleetctl.services`) go with the
command, and the host installs and restarts them after the switch; a ship with nothing to change
in the tree still sends them (command ``services``), so units that are missing, differ or are
stopped are put right without a new release. A dry run asks the host, read-only, which unit
files differ.
"""

from __future__ import annotations

import concurrent.futures
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetctl import __version__
from fleetctl.blueprint import Blueprint
from fleetctl.diffs import diffs_for
from fleetctl.drift import REFUSED_ORIGINS, Change
from fleetctl.errors import (
    FleetctlError,
    HostError,
    IncompleteScan,
    InputError,
    ShipRefused,
)
from fleetctl.fanout import fan_out, wait_interruptible
from fleetctl.hostevents import PREVIOUS_IN_USE, Done, Step, WarningEvent
from fleetctl.inventory import Host
from fleetctl.livestate import LiveState, read_scan
from fleetctl.manifest import Manifest
from fleetctl.names import show_name
from fleetctl.plan import (
    ERROR,
    INCOMPLETE,
    NO_OP,
    REFUSED,
    PlanOptions,
    ShipPlan,
    describe_target,
    identity_problem,
    plan_ship,
)
from fleetctl.protocol import ACCOUNT, PREPARED, SERVICES
from fleetctl.render import render_host
from fleetctl.results import HostResult, NoProgress, Progress, ServiceActions
from fleetctl.scan import (
    account_problems,
    account_stops,
    accounts_request,
    changes_for,
    desired_for,
    host_session,
)
from fleetctl.services import render_units, services_request
from fleetctl.session import HostSession
from fleetctl.source import SourceState, ancestry, operator, utc_now
from fleetctl.transport import Transport, open_transport

# The hint of a ship that fails before the switch on a host that had no release: the host
# program's own hint (hostevents.PREVIOUS_IN_USE) would name a previous release there is not.
FIRST_SHIP_FAILED = ("no release is in use: this was the host's first ship; fix the cause and "
                     "ship again")


def drift_host(blueprint: Blueprint, host: Host, progress: Progress,
               source: SourceState | None = None, diff: bool = False) -> HostResult:
    """Scan one host and compare it with its desired tree (read-only: takes no lock).

    Besides the changes, the result names the commit the host runs and how the source relates
    to it (a stale checkout is drift: shipping it would be refused), and a ship in progress.

    Raises:
        FleetctlError: bad input (render), host trouble, or a host whose recorded identity is
            not the inventory's (:class:`~fleetctl.errors.HostError`); :func:`run_hosts` turns
            it into a result.
    """
    tree = render_host(blueprint, host, missing_secrets_ok=True)
    progress.host_step(host.name, "scan")
    with host_session(host, "scan") as (_session, state):
        changes = changes_for(blueprint, tree, state)
    problem = identity_problem(host, state)
    if problem:
        raise HostError(problem[0], hint=problem[1], step="scan")
    found = ancestry(source, state.commit) if source is not None else None
    warnings = list(state.warnings)
    in_progress = None
    if state.ship_in_progress:
        in_progress = (f"a ship is in progress on this host ({state.ship_in_progress}): what "
                       "was scanned may be about to change, so the host cannot be called in "
                       "sync; run drift again when the ship has ended")
        warnings.append(in_progress)
    if found is not None and found.stale:
        warnings.append(found.describe())
    common: dict[str, Any] = dict(release=state.current, warnings=warnings, commit=state.commit,
                  ancestry=found, identity=_identity_name(state),
                  in_progress=state.ship_in_progress, unchecked=list(tree.unchecked),
                  foreign=list(state.foreign), failed_ships=list(state.failed_ships))
    if in_progress:  # never in-sync with exit 0 while a ship may be changing the host
        return HostResult(host.name, "incomplete", changes, unreadable=state.unreadable,
                          error=in_progress, **common)
    if state.unreadable:
        return HostResult(host.name, "incomplete", changes, unreadable=state.unreadable,
                          error=f"{len(state.unreadable)} path(s) could not be read; the scan "
                          "is incomplete, so the host cannot be called in sync", **common)
    accounts = account_problems(host, state)
    stale = found is not None and found.stale
    result = HostResult(host.name, "drift" if changes or accounts or stale else "in-sync",
                        changes, accounts=accounts, **common)
    if diff:
        progress.host_step(host.name, "diff")
        result.diffs = diffs_for(host, tree.contents, changes)
    return result


def _identity_name(state: LiveState) -> str | None:
    ident = state.identity
    return ident.get("name") if isinstance(ident, dict) else None


@dataclass(frozen=True, slots=True)
class ShipOptions:
    """How to ship.

    Attributes:
        force: apply even hand-patches, conflicts and unknown origins (they are overwritten),
            and ship over a stale checkout; recorded in the release.
        dry_run: plan only; take no lock and write nothing.
        approved: host → plan digest the user confirmed; a host whose plan is now different
            is refused rather than shipped unseen. ``None``: no confirmation was asked.
        confirmed: host → the changes of that confirmed plan (the refusal names the paths
            that differ).
        allow_dirty: ship a source that is not exactly a commit; recorded in the release.
        renamed_from: the identity the (single) selected host recorded before a deliberate
            rename; the ship records the inventory's name instead.
        skip_unreachable: ship the hosts that can be reached when others cannot be connected
            to (the fleet then ends split until those are shipped); otherwise an unreachable
            host holds every host back.
        force_paths: overwrite the changes made on the host at these paths only (a directory
            covers what is below it); other hand-patches still refuse. Recorded.
    """

    force: bool = False
    dry_run: bool = False
    approved: dict[str, str] | None = None
    confirmed: dict[str, tuple[Change, ...]] | None = None
    allow_dirty: bool = False
    renamed_from: str | None = None
    skip_unreachable: bool = False
    force_paths: tuple[str, ...] = ()

    def for_host(self, host: str) -> PlanOptions:
        """The options one host's plan depends on."""
        return PlanOptions(force=self.force, force_paths=self.force_paths,
                           renamed_from=self.renamed_from,
                           approved=None if self.approved is None else
                           self.approved.get(host, ""),
                           confirmed=(self.confirmed or {}).get(host, ()))


def _release_id(desired: Manifest) -> str:
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}Z"
    return f"{stamp}-{desired.digest()[7:15]}"


def source_refusal(source: SourceState, options: ShipOptions) -> ShipRefused | None:
    """The refusal of a ship from a dirty source (exit 3), or ``None`` when it may go on."""
    if source.clean or options.allow_dirty:
        return None
    shown = "; ".join(source.dirty[:8]) + (f"; and {len(source.dirty) - 8} more"
                                            if len(source.dirty) > 8 else "")
    hint = ("put the blueprint under git and commit it, or ship with --allow-dirty (recorded "
            "in the release)" if source.repo is None else "commit (or remove) these files and "
            "ship again; --allow-dirty ships the work tree as it is and records that in the "
            "release")
    return ShipRefused(f"the source is not a clean commit: {shown}", hint=hint)


class HostShip:
    """One host's part of a fleet ship, carried out in phases the fleet keeps in step.

    ``open`` (render, connect, start the host-side program), ``lock`` (take the host's lock;
    called for one host at a time in a fixed order), ``plan`` (read the scan, check identity,
    ancestry and hand-patches, build the command), ``prepare`` (send it and the content: the
    host assembles, verifies and records the release, then waits), ``commit`` (the host
    switches) or ``abort`` (the host removes what it prepared), ``close``.

    Every phase leaves its outcome in :attr:`result`; a phase that fails raises a
    :class:`~fleetctl.errors.FleetctlError`, and the fleet then aborts every host.
    """

    def __init__(self, blueprint: Blueprint, host: Host, options: ShipOptions,
                 source: SourceState, progress: Progress) -> None:
        self.blueprint, self.host, self.options = blueprint, host, options
        self.source, self.progress = source, progress
        self.result = HostResult(host.name, "planning")
        self._transport: Transport | None = None
        self._session: HostSession | None = None
        self._state = LiveState()
        self._command: dict | None = None
        self._blobs: list[str] = []
        self._secrets: list[str] = []
        self._phase = "new"

    def open(self) -> None:
        """Render (a template error stops before the host is touched), connect, start."""
        self.result.step = "render"
        self.tree = render_host(self.blueprint, self.host)
        self.units = render_units(self.blueprint, self.host)
        self.result.step = "connect"
        self.progress.host_step(self.host.name, "connect")
        self._transport = open_transport(self.host)
        self._transport.connect()
        request = {"op": "ship", "root": self.host.root, **accounts_request(self.host)}
        self._session = HostSession(self._transport, self.host.python, request,
                                    self.host.timeout_s)
        self._session.pause()
        self._phase = "open"
        self.result.step = None

    def lock(self) -> None:
        """Take the host's lock (ShipRefused, kind ``locked``, when another ship holds it)."""
        assert self._session is not None
        self.progress.host_step(self.host.name, "lock")
        self._session.arm()
        self._send({"cmd": "lock"})
        read_scan(self._session, self._state, until="locked")
        self._session.pause()
        self._phase = "locked"

    def plan(self) -> None:
        """Read the scan and decide: ``ready``, ``no-op``, ``services``, or a refusal/error."""
        assert self._session is not None
        self.progress.host_step(self.host.name, "scan")
        self._session.arm()
        state = read_scan(self._session, self._state)
        self._session.pause()
        self._phase = "scanned"
        host, options, tree = self.host, self.options, self.tree
        result = self.result
        desired = desired_for(tree, state)
        changes = changes_for(self.blueprint, tree, state)
        found = ancestry(self.source, state.commit)
        plan = plan_ship(host, state, desired, changes, found, account_problems(host, state),
                         options.for_host(host.name), account_stops(state))
        result.changes, result.release, result.previous = changes, state.current, state.current
        result.unreadable, result.warnings = state.unreadable, list(state.warnings)
        result.commit, result.ancestry, result.identity = state.commit, found, _identity_name(state)
        result.plan_digest, result.accounts = plan.digest, list(plan.accounts)
        result.warnings += _unused_force_paths(options, changes)
        _raise_stop(plan)
        if plan.status == NO_OP:
            result.status = "no-op"
            if self.units is not None:
                self._command = {"cmd": "services",
                                 **services_request(host, self.units, with_content=True)}
            return
        self._blobs, self._secrets = list(plan.sends), list(plan.secrets)
        release = _release_id(desired)
        identity = dict(state.identity) if state.identity else {
            "id": uuid.uuid4().hex, "adopted": utc_now()}
        identity["name"] = host.name
        forced = plan.forced
        sources = dict(plan.copies)
        self._command = {
            "cmd": "ship", "release": release, "keep": host.keep_releases,
            "desired": desired.to_json(), "sources": sources, "blob_count": len(self._blobs),
            "secret_count": len(self._secrets), "users": accounts_request(host)["accounts"],
            "ignore": ignore_regexes(self.blueprint), "identity": identity,
            "meta": {"kind": "ship", "created": utc_now(), "fleetctl": __version__,
                     "shipped_by": operator(), "previous": state.current,
                     "desired_digest": desired.digest(), "source": self.source.to_json(),
                     "allow_dirty": options.allow_dirty and not self.source.clean,
                     "forced": forced, "host": host.name, "host_id": identity["id"],
                     "renamed_from": state.identity.get("name") if state.identity and
                     state.identity.get("name") != host.name else None},
        }
        if self.units is not None:
            self._command.update(services_request(host, self.units, with_content=True))
        result.status = "ready"

    def prepare(self) -> None:
        """Send the command and the content; follow the host's steps up to ``prepared``."""
        if self._command is None or self._command["cmd"] != "ship":
            return
        assert self._session is not None
        self.progress.host_step(self.host.name, "send")
        self.result.accounts = []  # from here on: what the ship created (events from the host)
        self._phase = "preparing"
        self._session.arm()
        try:
            self._session.send_json(self._command)
            for blob in self._blobs:
                self._send_content(blob, self.tree.contents[blob])
            for digest in self._secrets:
                self._send_content(digest, self.tree.secrets[digest].reveal())
        except OSError:
            pass  # the host stopped reading; its error event below says why
        self._follow(until="prepared")
        self._session.pause()
        self._phase = "prepared"

    def commit(self) -> None:
        """Tell a prepared host to switch (or a no-op systemd host to fix its units)."""
        assert self._session is not None
        self._phase = "committing"
        self._session.arm()
        if self._command is None:  # nothing to do: let the host-side program end cleanly
            self._send({"cmd": "abort"})
        elif self._command["cmd"] == "services":
            self._send(self._command)
        else:
            self._send({"cmd": "commit"})
        self._follow(until="done")
        self._phase = "done"

    def abort(self) -> None:
        """Call this host's part off; whatever it prepared is removed, nothing switches."""
        if self._session is None or self._phase in ("done", "new"):
            return
        try:
            self._session.arm()
            if self._phase in ("open", "locked", "scanned", "prepared"):
                message = {"open": {"cmd": "stop"}}.get(self._phase, {"cmd": "abort"})
                self._session.send_json(message)
                for _ in self._session.events():
                    pass
            self._session.finish()
        except (OSError, FleetctlError):
            pass
        finally:
            self._session.kill()
            self._phase = "done"

    def _send_content(self, digest: str, data: bytes) -> None:
        """Send one content frame (in bounded slices: :meth:`HostSession.send_content`)."""
        assert self._session is not None
        self._session.send_content(digest, data)
        self.result.sent_bytes += len(data)
        self.result.sent_files += 1

    def _send(self, command: dict) -> None:
        """Send one command to the host program; if it has gone, its events say why."""
        assert self._session is not None
        try:
            self._session.send_json(command)
        except OSError:
            pass

    def close(self) -> None:
        """End the host-side program (if still running) and the connection."""
        if self._session is not None:
            self._session.kill()
        if self._transport is not None:
            self._transport.close()

    def _follow(self, until: str) -> None:
        """Read the host's events up to ``until`` (``prepared`` or ``done``).

        Raises:
            HostError, ShipRefused: the host's error, or the output ended early.
        """
        assert self._session is not None
        result, command = self.result, self._command or {}
        try:
            for event in self._session.events():
                if isinstance(event, Step):
                    result.step = event.name
                    self.progress.host_step(result.host, event.name)
                elif isinstance(event, WarningEvent):
                    result.warnings.append(event.message)
                elif event.t == ACCOUNT:
                    result.accounts.append(_account_line(event.raw))
                elif event.t == SERVICES:
                    result.services = ServiceActions(*(tuple(event.raw[k]) for k in (
                        "installed", "removed", "restarted", "started")))
                elif event.t == PREPARED and until == PREPARED:
                    return
                elif isinstance(event, Done):
                    if command.get("cmd") == "ship":
                        result.status, result.release = "shipped", event.release
                    result.pruned = list(event.pruned)
                    result.step = None
                    self._session.finish()
                    return
        except HostError as exc:
            self._fail(exc)
            raise
        except ShipRefused:
            raise
        if command.get("cmd") != "ship":
            after = "the release in use is unchanged"
        elif result.step in ("services", "prune"):
            after = "the new release is in use"  # these steps come after the switch
        elif result.previous is None:
            after = FIRST_SHIP_FAILED
        else:
            after = "the previous release stays in use"
        ended = self._session.broken(f"it ended during step {result.step or 'send'}; {after}")
        self._fail(ended)
        raise ended

    def _fail(self, exc: HostError) -> None:
        """Keep what is known (the plan, the release in use) beside a host error."""
        result, command = self.result, self._command or {}
        result.step = exc.step or result.step
        if command.get("cmd") == "ship" and result.step in ("services", "prune"):
            result.release = command["release"]  # after the switch: the new release stays
        elif (command.get("cmd") == "ship" and result.previous is None
              and exc.hint == PREVIOUS_IN_USE):
            exc.hint = FIRST_SHIP_FAILED  # the host's first ship: there is no previous one
        if result.step == "services":
            exc.hint = (f"the new release {command['release']} is in use; fix the cause and "
                        "ship again: a ship with nothing to change still installs and starts "
                        "the units" if command.get("cmd") == "ship" else
                        "the release in use is unchanged; fix the cause and ship again")


def _account_line(event: dict) -> str:
    if event.get("created"):
        return f"created user {event['user']}"
    if event.get("group_created"):
        return f"created group {event['group_created']} of {event['user']}"
    return f"created HOME {event['home_created']} of {event['user']}"


def plan_host(blueprint: Blueprint, host: Host, options: ShipOptions, source: SourceState,
              progress: Progress, diff: bool = False) -> HostResult:
    """A dry run of one host: scan (read-only, no lock), plan, report what a ship would do.

    Raises:
        FleetctlError: bad input, host trouble, a refusal the ship would meet.
    """
    tree = render_host(blueprint, host)
    units = render_units(blueprint, host)
    progress.host_step(host.name, "scan")
    probe = services_request(host, units, with_content=False) if units is not None else None
    with host_session(host, "scan", probe) as (_session, state):
        desired = desired_for(tree, state)
        changes = changes_for(blueprint, tree, state)
    found = ancestry(source, state.commit)
    plan = plan_ship(host, state, desired, changes, found, account_problems(host, state),
                     options.for_host(host.name), account_stops(state))
    result = HostResult(host.name, "dry-run", changes, release=state.current,
                        previous=state.current, unreadable=state.unreadable,
                        plan_digest=plan.digest, warnings=list(state.warnings), dry_run=True,
                        commit=state.commit, ancestry=found, identity=_identity_name(state),
                        in_progress=state.ship_in_progress, accounts=list(plan.accounts))
    result.warnings += _unused_force_paths(options, changes)
    if diff:
        progress.host_step(host.name, "diff")
        result.diffs = diffs_for(host, tree.contents, changes)
    if plan.status in (REFUSED, ERROR, INCOMPLETE):
        result.status, result.error, result.hint = plan.status, plan.reason, plan.hint
        result.step = plan.step if plan.status != INCOMPLETE else None
        return result
    if state.ship_in_progress:
        result.warnings.append(f"a ship is in progress on this host ({state.ship_in_progress})")
    no_op = plan.status == NO_OP
    if units is not None:
        result.services, problem_text = _planned_services(state.units, units, not no_op)
        if problem_text:
            result.status, result.error = "error", problem_text
            result.step = "services" if no_op else "prepare"
            return result
    if no_op:
        result.status = "no-op"
        return result
    # What the ship would send; the JSON fields mean "would send" for a dry run.
    result.sent_files = len(plan.sends) + len(plan.secrets)
    result.sent_bytes = sum(len(tree.contents[b]) for b in plan.sends) + sum(
        len(tree.secrets[d].reveal()) for d in plan.secrets)
    return result


def _unused_force_paths(options: ShipOptions, changes: list[Change]) -> list[str]:
    """A warning for each --force-path that matches no change made on this host."""
    on_host = [c.path for c in changes if c.origin in REFUSED_ORIGINS]
    return [f"--force-path {show_name(p)}: no change made on the host there" for p in
            options.force_paths if not any(c == p or c.startswith(p + "/") for c in on_host)]


def _raise_stop(plan: ShipPlan) -> None:
    """Turn a plan that cannot ship into the error the fleet ship reports for that host."""
    if plan.status == REFUSED:
        raise ShipRefused(plan.reason or "refused", hint=plan.hint, step=plan.step)
    if plan.status == INCOMPLETE:
        raise IncompleteScan(plan.reason or "incomplete scan")
    if plan.status == ERROR:
        raise HostError(plan.reason or "error", hint=plan.hint, step=plan.step)


HELD_BACK = "held-back"


def ship_fleet(blueprint: Blueprint, hosts: list[Host], options: ShipOptions,
               source: SourceState, parallel: int,
               progress: Progress | None = None) -> list[HostResult]:
    """Ship every selected host, all or nothing (docs/invariants.md, invariants 2, 5, 11).

    The source is checked first (a dirty one is refused before any host is contacted). Then
    every host is opened, locked one at a time in name order (so two runs over the same hosts
    cannot each win some), scanned and planned; if any host cannot ship (refused, error,
    unreachable), every lock is released and nothing is written anywhere. Otherwise every host
    prepares its release (sent, assembled, verified, recorded, not yet in use), and only when
    all are prepared is each told to switch.

    Returns one result per host, in input order. A host that could ship but was held back by
    another host's failure has status ``refused`` and says which host stopped the fleet.
    """
    progress = progress or NoProgress()
    refusal = source_refusal(source, options)
    if refusal is not None:
        return [HostResult(h.name, "refused", error=refusal.message, hint=refusal.hint,
                           step="source") for h in hosts]
    if options.renamed_from is not None and len(hosts) != 1:
        raise InputError("--renamed-from names the old identity of one host: select exactly "
                         "one host")
    ships = [HostShip(blueprint, h, options, source, progress) for h in hosts]
    for s in ships:
        progress.host_started(s.host.name)
    # The phases run in a worker so that Ctrl-C, which Python delivers to the main thread,
    # ends the host-side programs (interrupt_all) and the run still aborts and reports.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        done = pool.submit(_run_phases, ships, options, parallel)
        wait_interruptible([done])
        done.result()
    for s in ships:
        if s.result.status in ("planning", "ready"):
            s.result.status = "error"
            s.result.error = s.result.error or f"{s.host.name}: the ship ended unexpectedly"
        progress.host_finished(s.result)
    return [s.result for s in ships]


def _run_phases(ships: list[HostShip], options: ShipOptions, parallel: int) -> None:
    """open → lock (in name order) → plan → prepare → commit, or abort every host.

    Every reachable host is locked and planned even when another cannot be reached, so the
    report names each host's own refusal (a hand-patch) rather than only "held back".
    """
    try:
        _each(ships, HostShip.open, parallel)
        locked = True
        for s in sorted(ships, key=lambda s: s.host.name):  # the fixed lock order
            if _active(s) and not _guarded(s, HostShip.lock):
                _same_root(s, ships)
                locked = False
                break
        if locked:
            _each([s for s in ships if s._phase == "locked"], HostShip.plan, parallel)

        ok = locked and not any(stops_fleet(s.result, options.skip_unreachable) for s in ships) \
            and any(_active(s) for s in ships)
        ok = ok and _each(ships, HostShip.prepare, parallel)
        if ok:
            _each(ships, HostShip.commit, parallel)
        else:
            _each(ships, HostShip.abort, parallel, guard=False)
            _hold_back(ships)
    finally:
        for s in ships:
            s.close()


def _same_root(failed: HostShip, ships: list[HostShip]) -> None:
    """A lock refused because this very run holds it: two entries reach one root (exit 2)."""
    key = failed._state.root_key
    twin = next((s for s in ships if s is not failed and key and s._state.root_key == key
                 and s._phase == "locked"), None)
    if twin is None:
        return
    failed.result.status = "error"
    failed.result.error = (
        f"{failed.host.name} ({describe_target(failed.host)}) reaches the same root "
        f"on the same machine as {twin.host.name} ({describe_target(twin.host)}): "
        "the inventory points two entries at one host; nothing was written")
    failed.result.hint = f"check the address, port and root of {failed.host.name!r}"


def stops_fleet(result: HostResult, skip_unreachable: bool) -> bool:
    """Whether a host's result (of a plan or a ship) stops the whole fleet, which ships all or
    nothing: anything but a host that can ship (or has nothing to ship), unless it is a host
    that could not be connected to and ``skip_unreachable`` leaves it out."""
    if result.status in ("planning", "ready", "no-op", "dry-run"):
        return False
    return not (skip_unreachable and result.status == "error" and result.step == "connect")


def hold_back(results: list[HostResult], could_ship: Callable[[HostResult], bool]) -> None:
    """Say why the hosts that could ship (``could_ship``) did not: which hosts stopped the
    fleet. Each becomes ``refused`` at step ``held-back``, naming them, with nothing sent."""
    failed = [r.host for r in results if r.status in ("refused", "error", "incomplete")
              and r.step != HELD_BACK]
    hint = "fix {names} (see their errors) and ship again"
    if any(r.step == "connect" for r in results):
        hint += "; --skip-unreachable ships the hosts that can be reached"
    names = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
    for r in results:
        if could_ship(r):
            r.status = "refused"
            r.step = HELD_BACK
            r.release = r.previous
            r.sent_bytes = r.sent_files = 0
            r.error = (f"not shipped: a fleet ships all or nothing, and {names} could "
                       "not be shipped; nothing was written")
            r.hint = hint.format(names=names)


def _hold_back(ships: list[HostShip]) -> None:
    """:func:`hold_back` for the hosts of a ship that were ready, or had units to write."""
    commanded = {id(s.result) for s in ships if s._command is not None}
    hold_back([s.result for s in ships], lambda r: r.status in ("planning", "ready") or (
        r.status == "no-op" and id(r) in commanded))


def _active(ship: HostShip) -> bool:
    """Whether the host is still in the run (not failed, refused or skipped)."""
    return ship.result.status in ("planning", "ready", "no-op")


def _guarded(ship: HostShip, phase: Callable[[HostShip], None]) -> bool:
    """Run one phase of one host; a failure becomes its result. True when it went through."""
    try:
        phase(ship)
        return True
    except ShipRefused as exc:
        ship.result.status, ship.result.error, ship.result.hint = "refused", exc.message, exc.hint
        ship.result.step = exc.step or ship.result.step
    except FleetctlError as exc:
        ship.result.status, ship.result.error = "error", exc.message
        ship.result.hint = exc.hint
        if isinstance(exc, HostError):
            ship.result.step = exc.step or ship.result.step
        if isinstance(exc, IncompleteScan):
            ship.result.status = "incomplete"
    except Exception as exc:  # noqa: BLE001 - one host's bug must not lose the others
        ship.result.status = "error"
        ship.result.error = (f"{ship.host.name}: internal error: {exc.__class__.__name__}: "
                             f"{exc}")
        ship.result.hint = "run with --debug for the traceback and report it"
        ship.result.debug = traceback.format_exc()
    return False


def _each(ships: list[HostShip], phase: Callable[[HostShip], None], parallel: int,
          guard: bool = True) -> bool:
    """Run ``phase`` on every host still in the run, ``parallel`` at a time; True if all did."""
    def one(ship: HostShip) -> bool:
        if guard:
            return _guarded(ship, phase)
        try:
            phase(ship)
        except Exception:  # noqa: BLE001 - aborting: every host must be tried
            pass
        return True

    running = [s for s in ships if _active(s)] if guard else ships
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(one, s) for s in running]
        wait_interruptible(futures)
        return all(f.result() for f in futures)


def _planned_services(probe: dict | None, units: dict[str, bytes],
                      restart_all: bool) -> tuple[ServiceActions | None, str | None]:
    """What a ship would do to a host's units, from the dry run's probe; or why it would fail."""
    if probe is None:
        return None, "the host-side program did not report on the units"
    if probe.get("problem"):
        return None, probe["problem"]
    install = tuple(probe["install"])
    restarted = tuple(units) if restart_all else install
    started = tuple(name for name in units if name not in restarted)
    return ServiceActions(install, tuple(probe["remove"]), restarted, started), None


def ignore_regexes(blueprint: Blueprint) -> list[tuple[str, bool]]:
    """The ``.fleetignore`` patterns as (regex, include) pairs the host-side program can apply.

    pathspec compiles gitignore patterns to Python regexes; sending those keeps one
    implementation of the gitignore rules.
    """
    return [(p.regex.pattern, bool(p.include)) for p in blueprint.ignore.patterns
            if getattr(p, "regex", None) is not None and p.include is not None]


def run_hosts(hosts: list[Host], work: Callable[[Host], HostResult], parallel: int,
              progress: Progress | None = None) -> list[HostResult]:
    """Run ``work`` on every host, ``parallel`` at a time; one result per host, in input order.

    A host that fails gives an ``error`` (or ``refused``) result and never stops the others.
    """
    progress = progress or NoProgress()

    def one(host: Host) -> HostResult:
        progress.host_started(host.name)
        try:
            result = work(host)
        except ShipRefused as exc:
            result = HostResult(host.name, "refused", error=exc.message, hint=exc.hint,
                                step=exc.step)
        except FleetctlError as exc:
            step = exc.step if isinstance(exc, HostError) else None
            result = HostResult(host.name, "error", error=exc.message, hint=exc.hint, step=step)
        except Exception as exc:  # noqa: BLE001 - one host's bug must not lose the others
            result = HostResult(host.name, "error", error=f"{host.name}: internal error: "
                                f"{exc.__class__.__name__}: {exc}",
                                hint="run with --debug for the traceback and report it",
                                debug=traceback.format_exc())
        progress.host_finished(result)
        return result

    return fan_out(hosts, one, parallel)
