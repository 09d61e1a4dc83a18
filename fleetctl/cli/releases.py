"""The day-two commands, each a few lines over a library function: ``releases HOST``,
``rollback HOST [--to RELEASE]``, ``history [HOST...]`` (:mod:`fleetctl.releases`) and
``backport HOST [PATH...]`` (:mod:`fleetctl.backport`). Added to the main app by
:func:`register`; loading, error mapping and ``--output`` come from :mod:`fleetctl.cli.common`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

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
    inventory_path,
    load_project,
)
from fleetctl.errors import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    FleetctlError,
    worst_exit,
)
from fleetctl.names import printable, show_name

SCHEMA_VERSION = 1


def _inventory(inventory: Path | None, timeout_s: float) -> Any:
    """The inventory alone (these commands render nothing, so no blueprint is loaded)."""
    from dataclasses import replace

    from fleetctl.inventory import Inventory, load_inventory

    inv = load_inventory(inventory_path(inventory))
    return Inventory(inv.path, tuple(replace(h, timeout_s=timeout_s) for h in inv.hosts))


def _or_document(command: str, fmt: Format, target: Any, host: str, fn: Any) -> Any:
    """Run ``fn``; with ``--format json``, a failure still writes a document (its error, hint
    and exit code) before it is reported and exits: CI always gets something to parse."""
    try:
        return fn()
    except FleetctlError as exc:
        if fmt is Format.json:
            target.write(_document(command, exc.exit_code, host=host, error=exc.message,
                                   hint=exc.hint))
        raise


def _document(command: str, exit_code: int, **body: Any) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, "command": command,
                       "exit_code": exit_code, **body}, indent=2, ensure_ascii=False) + "\n"


def releases_command(
    host: str = typer.Argument(..., help="The host whose releases to list."),
    inventory: Path | None = InventoryOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """List a host's releases: time, commit, source, who, forced, current (exit 0, 2 error)."""
    from fleetctl.releases import read_releases

    def body() -> int:
        inv = _inventory(inventory, timeout)
        (selected,) = inv.select([host])
        target = ReportTarget(output)
        found = _or_document("releases", fmt, target, host, lambda: read_releases(selected))
        if fmt is Format.json:
            target.write(_document("releases", EXIT_OK, host=found.host, current=found.current,
                                   releases=[r.to_json() for r in found.releases],
                                   warnings=found.warnings))
            return EXIT_OK
        console = target.console()
        table = Table(title=f"releases on {show_name(found.host)}", box=box.SIMPLE_HEAD,
                      title_justify="left")
        for column in ("", "release", "created", "commit", "source", "shipped by", "forced"):
            table.add_column(column, overflow="fold")
        for r in found.releases:
            source = "-" if r.clean is None else "clean" if r.clean else \
                "dirty (--allow-dirty)" if r.allow_dirty else "dirty"
            table.add_row("*" if r.current else "", r.id, r.created or "-",
                          (r.commit or "-")[:12], source, show_name(r.shipped_by or "-"),
                          "yes" if r.forced else "" if r.recorded else "no record")
        console.print(table)
        for r in found.releases:
            if r.problem:
                console.print(Text(f"warning: release {r.id}: {printable(r.problem)} (not a "
                                   "rollback target)", style="yellow"), soft_wrap=True)
        for warning in found.warnings:
            console.print(Text(f"warning: {printable(warning)}", style="yellow"))
        target.write("")
        return EXIT_OK

    guard(body, debug)


def rollback_command(
    host: str = typer.Argument(..., help="The host to roll back."),
    to: str | None = typer.Option(None, "--to", metavar="RELEASE",
                                     help="The release to switch to \\[default: the one the "
                                     "current release replaced]."),
    force: bool = typer.Option(False, "--force", help="Switch even to a release that was "
                               "changed since it was shipped (recorded)."),
    inventory: Path | None = InventoryOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Switch a host back to an earlier verified release (exit 0, 3 refused, 2 error).

    The release is checked against its record first; the switch is atomic, under the host's
    lock, and recorded in the host's history.
    """
    from fleetctl.releases import rollback

    def body() -> int:
        inv = _inventory(inventory, timeout)
        (selected,) = inv.select([host])
        target = ReportTarget(output)
        done = _or_document("rollback", fmt, target, host,
                            lambda: rollback(selected, to, force))
        if fmt is Format.json:
            target.write(_document("rollback", EXIT_OK, **done.to_json()))
        elif done.unchanged:
            target.write(f"{done.host}: release {done.release} is already in use; nothing "
                         "to do\n")
        else:
            target.write(f"{done.host}: rolled back from {done.previous} to {done.release}\n")
            for difference in done.differences:
                err.print(Text(f"  forced over: {printable(difference)}", style="yellow"))
        return EXIT_OK

    guard(body, debug)


def history_command(
    hosts: list[str] | None = typer.Argument(None, help="Hosts \\[default: all]."),
    inventory: Path | None = InventoryOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Who shipped or rolled back what, when, from which commit (exit 0, 2 unreadable host)."""
    from fleetctl.fanout import fan_out
    from fleetctl.releases import HostReleases, read_releases

    def body() -> int:
        inv = _inventory(inventory, timeout)
        selected = inv.select(hosts)
        target = ReportTarget(output)

        def one(h: Any) -> HostReleases:
            try:
                return read_releases(h)
            except FleetctlError as exc:
                return HostReleases(h.name, error=exc.message)

        found = fan_out(selected, one, parallel)
        code = worst_exit([EXIT_ERROR if f.error else EXIT_OK for f in found])
        entries = sorted((e for f in found for e in f.history),
                         key=lambda e: (e.time or "", e.host))
        if fmt is Format.json:
            target.write(_document("history", code, entries=[e.to_json() for e in entries],
                                   hosts=[{"host": f.host, "error": f.error,
                                           "warnings": f.warnings} for f in found]))
            return code
        console = target.console()
        table = Table(title="fleetctl history", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("time", "host", "what", "release", "from", "commit", "by", "forced"):
            table.add_column(column, overflow="fold")
        for e in entries:
            commit = (e.commit or "-")[:12] + ("" if e.clean in (None, True) else " (dirty)")
            table.add_row(e.time or "-", show_name(e.host), e.kind, e.release or "-",
                          e.previous or "-", commit, show_name(e.by or "-"),
                          "yes" if e.forced else "")
        console.print(table)
        for f in found:
            if f.error:
                console.print(Text(f"{printable(f.error)}", style="red"), soft_wrap=True)
            for warning in f.warnings:
                console.print(Text(f"{f.host}: warning: {printable(warning)}", style="yellow"))
        target.write("")
        return code

    guard(body, debug)


def backport_command(
    host: str = typer.Argument(..., help="The host whose hand-patches to bring home."),
    paths: list[str] | None = typer.Argument(None, help="Only these paths \\[default: every "
                                                "hand-patch]; name a conflict to take it."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Bring a host's hand-patches into the blueprint work tree (exit 0, 1 some refused, 2).

    Shows the resulting git diff and never commits: review, commit, then ship without --force.
    Files rendered from templates and credential files are refused, with the reason.
    """
    from fleetctl.backport import NOTHING, REFUSED, backport
    from fleetctl.cli.output.results import diff_text

    def body() -> int:
        inv, bp = load_project(inventory, blueprint, timeout)
        (selected,) = inv.select([host])
        target = ReportTarget(output)
        done = backport(bp, selected, list(paths or ()))
        code = EXIT_FINDINGS if any(i.action in (REFUSED, NOTHING) for i in done.items) \
            else EXIT_OK
        if fmt is Format.json:
            target.write(_document("backport", code, host=done.host,
                                   items=[i.to_json() for i in done.items],
                                   git_diff=done.git_diff))
            return code
        lines = []
        for item in done.items:
            note = f": {item.reason}" if item.reason else ""
            lines.append(f"{done.host}: {show_name(item.path)}: {item.action}{printable(note)}")
            if item.diff is not None:
                lines += diff_text(done.host, item.diff)  # not indented: it cuts as a patch
        if not done.items:
            lines.append(f"{done.host}: no hand-patch to bring home")
        if done.git_diff:
            lines += ["", f"git diff ({len(done.written)} path(s) changed in {bp.root}; review, "
                      "commit and ship: nothing was committed):", *done.git_diff]
        target.write("\n".join(lines) + "\n")
        return code

    guard(body, debug)


def register(app: typer.Typer) -> None:
    """Add the day-two commands to the main app."""
    app.command("releases")(releases_command)
    app.command("rollback")(rollback_command)
    app.command("history")(history_command)
    app.command("backport")(backport_command)
