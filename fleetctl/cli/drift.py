"""``fleetctl drift``, ``ship`` and ``render``: the commands over the desired tree, thin ones.

Each loads its input, calls one library function (:mod:`fleetctl.ship`, :mod:`fleetctl.render`),
renders the results (:mod:`fleetctl.cli.output.results`) and exits with the code DESIGN.md §4
gives. Data goes to stdout (or ``--output``); messages, progress and prompts go to stderr.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer

from fleetctl.cli.common import (
    BlueprintOpt,
    DebugOpt,
    Format,
    FormatOpt,
    InventoryOpt,
    OutputOpt,
    ParallelOpt,
    ReportTarget,
    TimeoutOpt,
    err,
    guard,
    load_project,
    source_state,
    with_progress,
)
from fleetctl.cli.output.results import print_text, to_json, to_markdown
from fleetctl.errors import EXIT_REFUSED, InputError, worst_exit
from fleetctl.names import tree_path
from fleetctl.render import render_host, write_tree
from fleetctl.results import HostResult
from fleetctl.ship import (
    ShipOptions,
    drift_host,
    hold_back,
    plan_host,
    run_hosts,
    ship_fleet,
    source_refusal,
    stops_fleet,
)
from fleetctl.source import SourceState

QuietOpt = typer.Option(False, "--quiet", "-q",
                        help="Text: show only the hosts with a problem.")


def _report(results: list[HostResult], command: str, fmt: Format, target: ReportTarget,
            debug: bool, source: SourceState | None = None, quiet: bool = False,
            all_paths: bool = True) -> int:
    code = worst_exit([r.exit_code for r in results])
    if debug:
        for r in results:
            if r.debug:
                err.print(r.debug, markup=False, highlight=False)
    if fmt is Format.json:
        target.write(to_json(results, command, code, source))
    elif fmt is Format.markdown:
        target.write(to_markdown(results, f"fleetctl {command}", source))
    else:
        print_text(target.console(), results, command, source, quiet, all_paths)
        target.write("")
    if not results:
        err.print("no hosts selected: the inventory has none")
    return code


def drift_command(
    hosts: list[str] | None = typer.Argument(None, help="Hosts to check \\[default: all]."),
    diff: bool = typer.Option(False, "--diff", help="Show each changed file's content diff "
                              "(text, key-level YAML/JSON; binaries and secrets by digest)."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Show what on each host differs from the blueprint, and why (exit 0 none, 1 drift, 2 error).
    """

    def body() -> int:
        inv, bp = load_project(inventory, blueprint, timeout)
        selected = inv.select(hosts)
        target = ReportTarget(output)
        source = source_state(inv, bp)
        results = with_progress(lambda p: run_hosts(
            selected, lambda h: drift_host(bp, h, p, source, diff), parallel, p))
        return _report(results, "drift", fmt, target, debug, source, quiet)

    guard(body, debug)


def ship_command(
    hosts: list[str] | None = typer.Argument(None, help="Hosts to ship \\[default: all]."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n",
                                 help="Print the plan ship would carry out; write nothing."),
    force: bool = typer.Option(False, "--force",
                               help="Overwrite hand-patches, conflicts and unknown content, and "
                               "ship over a stale checkout (recorded)."),
    force_path: list[str] | None = typer.Option(
        None, "--force-path", metavar="PATH", help="Overwrite the hand-patch at PATH only (a "
        "directory covers what is below it; repeatable); other hand-patches still refuse."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Ship a blueprint with uncommitted or untracked files, or "
        "outside git (recorded in the release)."),
    renamed_from: str | None = typer.Option(
        None, "--renamed-from", metavar="OLD_NAME",
        help="The one selected host was renamed on purpose: it records OLD_NAME as its identity; "
        "record the inventory's name instead."),
    diff: bool = typer.Option(False, "--diff", help="With the plan (--dry-run or the prompt), "
                              "show each changed file's content diff."),
    skip_unreachable: bool = typer.Option(
        False, "--skip-unreachable", help="Ship the hosts that can be reached even when others "
        "cannot be connected to (the fleet is then split until they are shipped)."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
    quiet: bool = QuietOpt,
    all_paths: bool = typer.Option(False, "--all-paths", help="List every path of a first "
                                   "ship, not one summary line per host."),
) -> None:
    """Make each host's managed tree equal the blueprint: a new release, switched atomically.

    Exit 0 shipped (or nothing to do), 3 refused with nothing written, 2 error.
    """

    def body() -> int:
        inv, bp = load_project(inventory, blueprint, timeout)
        known = {h.name for h in inv.hosts}
        for name in hosts or ():
            if name not in known and "/" in name:  # `ship --force runner/README` read as a host
                raise InputError(f"{name!r} is not a host of {inv.path.name}",
                                 hint=f"to overwrite only the hand-patch at that path, use "
                                 f"--force-path {name} (or --force={name})")
        selected = inv.select(hosts)
        target = ReportTarget(output)
        source = source_state(inv, bp)
        options = ShipOptions(force=force, dry_run=dry_run, allow_dirty=allow_dirty,
                              renamed_from=renamed_from, skip_unreachable=skip_unreachable,
                              force_paths=tuple(tree_path(p, "--force-path")
                                                for p in force_path or ()))
        refusal = source_refusal(source, options)
        if dry_run or refusal is not None:
            results = [HostResult(h.name, "refused", error=refusal.message, hint=refusal.hint,
                                  step="source") for h in selected] if refusal else \
                with_progress(lambda p: run_hosts(
                    selected, lambda h: plan_host(bp, h, options, source, p, diff), parallel, p))
            return _report(results, "ship", fmt, target, debug, source, quiet, all_paths)
        if not yes and sys.stdin.isatty() and err.is_terminal:
            plans = with_progress(lambda p: run_hosts(
                selected, lambda h: plan_host(bp, h, options, source, p, diff), parallel, p))
            stoppers = [p.host for p in plans if stops_fleet(p, skip_unreachable)]
            if stoppers:
                # The fleet ships all or nothing: never ask to ship what would be refused.
                hold_back(plans, lambda p: p.status == "dry-run" or (
                    p.status == "no-op" and p.services is not None))
                print_text(err, plans, "ship plan", all_paths=all_paths)
                err.print(f"refused: {', '.join(stoppers)} cannot be shipped, and a fleet ships "
                          "all or nothing; nothing was asked or written", markup=False,
                          highlight=False, soft_wrap=True)
                return _report(plans, "ship", fmt, target, debug, source, quiet, all_paths) \
                    if fmt is not Format.text else worst_exit([p.exit_code for p in plans])
            print_text(err, plans, "ship plan", all_paths=all_paths)
            # Changes to confirm: a new release, or runner unit files to write or remove. A
            # systemd host with neither is still shipped (its units enabled and started, which
            # changes nothing that is running), without asking.
            todo = [p for p in plans if p.status == "dry-run"
                    or (p.status == "no-op" and p.services and p.services.changes_files)]
            units_only = [p for p in plans if p.status == "no-op" and p.services is not None]
            if not todo and not units_only:
                return _report(plans, "ship", fmt, target, debug, source, quiet, all_paths) \
                    if fmt is not Format.text else worst_exit([p.exit_code for p in plans])
            count = sum(len(p.changes) for p in todo)
            unit_count = sum(len(p.services.installed) + len(p.services.removed)
                             for p in todo if p.services)
            question = f"Ship {count} change(s)" + (
                f" and {unit_count} runner unit file change(s)" if unit_count else "") + \
                f" to {len(todo)} host(s)?"
            if todo and not typer.confirm(question, err=True):
                for p in todo:
                    p.status, p.error = "declined", "not confirmed; nothing was written"
                err.print("nothing shipped")
                return _report(plans, "ship", fmt, target, debug, source, quiet, all_paths) \
                    if fmt is not Format.text else EXIT_REFUSED
            options = replace(options, approved={p.host: p.plan_digest for p in plans
                                                 if p.plan_digest},
                              confirmed={p.host: tuple(p.changes) for p in plans})
        results = with_progress(lambda p: ship_fleet(bp, selected, options, source,
                                                      parallel, p))
        return _report(results, "ship", fmt, target, debug, source, quiet, all_paths)

    guard(body, debug)


def render_command(
    host: str = typer.Argument(..., help="The host whose desired tree to write."),
    out: Path = typer.Option(..., "--out", help="An empty or new directory to write it to."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    debug: bool = DebugOpt,
) -> None:
    """Write one host's desired tree locally (exit 0, or 2 on error).

    Credential files are left out: secrets never go to local disk.
    """

    def body() -> int:
        inv, bp = load_project(inventory, blueprint, None)
        (selected,) = inv.select([host])
        tree = render_host(bp, selected, with_credentials=False)
        write_tree(tree, out)
        err.print(f"wrote {len(tree.manifest)} entries for {host} to {out}")
        granted = sum(len(a.grants) for a in selected.agents)
        if granted:
            err.print(f"left out the credentials of {granted} grant(s): secrets are never "
                      "written to local disk (`fleetctl drift` shows their digests)")
        return 0

    guard(body, debug)


def register(app: typer.Typer) -> None:
    """Add ``drift``, ``ship`` and ``render`` to the main app."""
    app.command("drift")(drift_command)
    app.command("ship")(ship_command)
    app.command("render")(render_command)
