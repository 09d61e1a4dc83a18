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
import getpass
import json
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from fleetctl import __version__
from fleetctl.blueprint import Blueprint
from fleetctl.credentials import is_credential_path
from fleetctl.drift import REFUSED_ORIGINS, Change
from fleetctl.errors import FleetctlError, HostError, ShipRefused
from fleetctl.hostcall import encode_json, frame, interrupt_all
from fleetctl.inventory import Host
from fleetctl.manifest import FILE, Manifest, sha256_digest
from fleetctl.names import printable
from fleetctl.render import DesiredTree, render_host
from fleetctl.results import HostResult, NoProgress, Progress, ServiceActions
from fleetctl.scan import (account_problems, accounts_request, changes_for, desired_for,
                           host_session, layout_problem)
from fleetctl.services import render_units, services_request


def plan_digest(changes: list[Change], desired: Manifest, current: str | None) -> str:
    """Identify a plan: same changes, same desired tree, same starting release."""
    # Live and desired attributes are part of it: a hand-patch edited again after the plan was
    # confirmed is a different plan, even with the same paths, kinds and origins.
    body = json.dumps([[c.path, c.change, c.origin, c.live and c.live.to_json(),
                        c.desired and c.desired.to_json()] for c in changes] +
                      [desired.digest(), current], ensure_ascii=True)
    return sha256_digest(body.encode("ascii"))


def drift_host(blueprint: Blueprint, host: Host, progress: Progress) -> HostResult:
    """Scan one host and compare it with its desired tree (read-only: takes no lock).

    Raises:
        FleetctlError: bad input (render) or host trouble; :func:`run_hosts` turns it into a
            result.
    """
    tree = render_host(blueprint, host)
    progress.host_step(host.name, "scan")
    with host_session(host, "scan") as (call, _events, state):
        changes = changes_for(blueprint, tree, state)
    if state.unreadable:
        return HostResult(host.name, "incomplete", changes, unreadable=state.unreadable,
                          release=state.current, warnings=state.warnings,
                          error=f"{len(state.unreadable)} path(s) could not be read; the scan "
                          "is incomplete, so the host cannot be called in sync")
    accounts = account_problems(host, state)
    return HostResult(host.name, "drift" if changes or accounts else "in-sync", changes,
                      release=state.current, warnings=state.warnings, accounts=accounts)


@dataclass(frozen=True, slots=True)
class ShipOptions:
    """How to ship.

    Attributes:
        force: apply even hand-patches, conflicts and unknown origins (they are overwritten).
        dry_run: plan only; take no lock and write nothing.
        approved: host → plan digest the user confirmed; a host whose plan is now different
            is refused rather than shipped unseen. ``None``: no confirmation was asked.
    """

    force: bool = False
    dry_run: bool = False
    approved: dict[str, str] | None = None


def _release_id(desired: Manifest) -> str:
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}Z"
    return f"{stamp}-{desired.digest()[7:15]}"


def ship_host(blueprint: Blueprint, host: Host, options: ShipOptions,
              progress: Progress) -> HostResult:
    """Plan and (unless refused, unchanged or a dry run) ship one host.

    Rendering happens first (the tree, and the units of a systemd host), so a template error
    stops before the host is touched.

    Raises:
        FleetctlError: bad input, host trouble, or a refusal raised by the host (lock held).
    """
    tree = render_host(blueprint, host)
    units = render_units(blueprint, host)
    progress.host_step(host.name, "lock" if not options.dry_run else "scan")
    op = "scan" if options.dry_run else "ship"
    probe = (services_request(host, units, with_content=False)
             if units is not None and options.dry_run else None)
    with host_session(host, op, probe) as (call, events, state):
        desired = desired_for(tree, state)
        changes = changes_for(blueprint, tree, state)
        digest = plan_digest(changes, desired, state.current)
        result = HostResult(host.name, "dry-run", changes, release=state.current,
                            previous=state.current, unreadable=state.unreadable,
                            plan_digest=digest, warnings=list(state.warnings),
                            dry_run=options.dry_run)

        def stop(status: str, error: str | None = None, hint: str | None = None) -> HostResult:
            if op == "ship":
                call.send(frame(encode_json({"cmd": "abort"})))
                call.finish()
            result.status, result.error, result.hint = status, error, hint
            return result

        problem = layout_problem(host, state)
        if problem:  # the host-side program refuses this itself; a dry run must say the same
            result.step = "scan"
            return stop("error", problem)
        if state.unreadable:
            return stop("incomplete", f"{len(state.unreadable)} path(s) could not be read; "
                        "refusing to ship over a tree that was not fully seen")
        refused = [c for c in changes if c.origin in REFUSED_ORIGINS]
        if refused and not options.force:
            paths = sorted({printable(c.path) for c in refused})
            shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            secret_only = all(is_credential_path(c.path) for c in refused)
            return stop("refused", f"{len(paths)} path(s) would lose changes made on the host "
                        f"({', '.join(sorted({c.origin for c in refused}))}): {shown}",
                        hint="review with `fleetctl drift`; a credential file changed on the "
                        "host is never backported: ship with --force to put the granted one back"
                        if secret_only else "review with `fleetctl drift`, then backport the "
                        "hand-patch into the blueprint or ship with --force to overwrite it")
        result.accounts = account_problems(host, state)
        no_op = not changes and state.shipped == desired and not result.accounts
        if units is not None and options.dry_run:
            result.services, problem = _planned_services(state.units, units, not no_op)
            if problem:
                result.step = "services" if no_op else "prepare"
                return stop("error", problem)
        if no_op and (units is None or options.dry_run):
            return stop("no-op")
        if no_op:
            result.status = "no-op"
            command = {"cmd": "services", **services_request(host, units, with_content=True)}
            return _send(call, events, command, [], tree, result, progress)
        sources, blobs = _content_plan(desired, state.live)
        if options.dry_run:
            # What the ship would send; the JSON fields mean "would send" for a dry run.
            result.sent_files = len(blobs)
            secrets = _secret_plan(desired, state.live)
            result.sent_files += len(secrets)
            result.sent_bytes = sum(len(tree.contents[b]) for b in blobs) + sum(
                len(tree.secrets[d].reveal()) for d in secrets)
            return stop("dry-run")
        if options.approved is not None and options.approved.get(host.name) != digest:
            return stop("refused", "the host changed after the plan was confirmed; nothing "
                        "was shipped", hint="run ship again to see the new plan")
        release = _release_id(desired)
        secrets = _secret_plan(desired, state.live)
        command = {
            "cmd": "ship", "release": release, "keep": host.keep_releases,
            "desired": desired.to_json(), "sources": sources, "blob_count": len(blobs),
            "secret_count": len(secrets), "users": accounts_request(host)["accounts"],
            "ignore": ignore_regexes(blueprint),
            "meta": {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "fleetctl": __version__, "shipped_by": _who(),
                     "previous": state.current, "desired_digest": desired.digest()},
        }
        if units is not None:
            command.update(services_request(host, units, with_content=True))
        result.accounts = []  # from here on: what the ship created (events from the host)
        return _send(call, events, command, blobs, tree, result, progress, secrets)


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


def _send(call, events, command: dict, blobs: list[str], tree: DesiredTree,
          result: HostResult, progress: Progress, secrets: list[str] = ()) -> HostResult:
    """Run one command on the host; a failure becomes the result, beside what is known."""
    progress.host_step(result.host, "send")
    try:
        return _execute(call, events, command, blobs, tree, result, progress, secrets)
    except HostError as exc:
        # Keep what is known (the plan, the release still in use) beside the error.
        result.status, result.error = "error", exc.message
        result.hint = exc.hint if result.previous else None
        result.step = exc.step or result.step
        if command["cmd"] == "ship" and result.step in ("services", "prune"):
            # These steps come after the switch: the new release stays in use.
            result.release = command["release"]
        if result.step == "services":
            result.hint = (f"the new release {command['release']} is in use; fix the cause and "
                           "ship again: a ship with nothing to change still installs and starts "
                           "the units" if command["cmd"] == "ship" else
                           "the release in use is unchanged; fix the cause and ship again")
        return result
    except ShipRefused as exc:
        result.status, result.error, result.hint = "refused", exc.message, exc.hint
        result.step = exc.step or result.step
        return result


def _execute(call, events, command: dict, blobs: list[str], tree: DesiredTree,
             result: HostResult, progress: Progress, secrets: list[str] = ()) -> HostResult:
    """Send the command and the missing content, then follow the host's steps to the end.

    Credential files go last, over the same stdin (never a command line), and are counted in
    ``sent_files``/``sent_bytes`` like any content.
    """
    host = result.host
    try:
        call.send(frame(encode_json(command)))
        for blob in blobs:
            data = tree.contents[blob]
            call.send(b"%s\n%d\n" % (blob.encode("ascii"), len(data)) + data)
            result.sent_bytes += len(data)
            result.sent_files += 1
        for digest in secrets:
            data = tree.secrets[digest].reveal()
            call.send(b"%s\n%d\n" % (digest.encode("ascii"), len(data)) + data)
            result.sent_bytes += len(data)
            result.sent_files += 1
    except OSError:
        pass  # the host stopped reading; its error event below says why
    for event in events:  # raises the host's error (with its step) if any
        if event.get("t") == "step":
            result.step = event["name"]
            progress.host_step(host, event["name"])
        elif event.get("t") == "warning":
            result.warnings.append(event["message"])
        elif event.get("t") == "account":
            if event.get("created"):
                result.accounts.append(f"created user {event['user']}")
            elif event.get("group_created"):
                result.accounts.append(f"created group {event['group_created']} of "
                                       f"{event['user']}")
            else:
                result.accounts.append(f"created HOME {event['home_created']} of "
                                       f"{event['user']}")
        elif event.get("t") == "services":
            result.services = ServiceActions(*(tuple(event[k]) for k in (
                "installed", "removed", "restarted", "started")))
        elif event.get("t") == "done":
            if command["cmd"] == "ship":
                result.status, result.release = "shipped", event["release"]
            result.pruned = event["pruned"]
            result.step = None
            call.finish()
            return result
    if command["cmd"] != "ship":
        after = "the release in use is unchanged"
    elif result.step in ("services", "prune"):
        after = "the new release is in use"  # these steps come after the switch
    else:
        after = "the previous release stays in use"
    raise call.broken(f"it ended during step {result.step or 'send'}; {after}")


def ignore_regexes(blueprint: Blueprint) -> list[tuple[str, bool]]:
    """The ``.fleetignore`` patterns as (regex, include) pairs the host-side program can apply.

    pathspec compiles gitignore patterns to Python regexes; sending those keeps one
    implementation of the gitignore rules.
    """
    return [(p.regex.pattern, bool(p.include)) for p in blueprint.ignore.patterns
            if getattr(p, "regex", None) is not None and p.include is not None]


def _content_plan(desired: Manifest, live: Manifest) -> tuple[dict[str, str], list[str]]:
    """Return (path → live path to copy from, digests to send) for the release tree.

    Prefers the same path. Credential files are not part of it (:func:`_secret_plan`).
    """
    have: dict[str, str] = {}
    for entry in live:
        if entry.type == FILE and not is_credential_path(entry.path):
            have.setdefault(entry.digest, entry.path)
    sources, blobs = {}, []
    for entry in desired:
        if entry.type != FILE or is_credential_path(entry.path):
            continue
        same = live.get(entry.path)
        if same is not None and same.type == FILE and same.digest == entry.digest:
            sources[entry.path] = entry.path
        elif entry.digest in have:
            sources[entry.path] = have[entry.digest]
        elif entry.digest not in blobs:
            blobs.append(entry.digest)
    return sources, blobs


def _secret_plan(desired: Manifest, live: Manifest) -> list[str]:
    """Digests of the credential files the host must write (new content or new path)."""
    wanted = []
    for entry in desired:
        if entry.type != FILE or not is_credential_path(entry.path):
            continue
        same = live.get(entry.path)
        if (same is None or same.type != FILE or same.digest != entry.digest) and \
                entry.digest not in wanted:
            wanted.append(entry.digest)
    return wanted


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return "unknown"


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

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(one, host) for host in hosts]
        pending = set(futures)
        while pending:
            try:
                _, pending = concurrent.futures.wait(pending, timeout=0.2)
            except KeyboardInterrupt:
                # Ctrl-C: end the host-side programs (a ship not yet switched leaves the
                # previous release in use), start no new host, and still report every host.
                interrupt_all()
        return [f.result() for f in futures]
