"""The day-two commands, each a few lines over a library function: ``releases HOST``,
``rollback HOST [--to RELEASE]``, ``history [HOST...]`` (:mod:`fleetctl.releases`) and
``backport HOST [PATH...]`` (:mod:`fleetctl.backport`). Added to the main app by
:func:`register`; loading, error mapping and ``--output`` come from :mod:`fleetctl.cli.common`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
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

if TYPE_CHECKING:
    from fleetctl.releases import HistoryEntry, HostReleases

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

# -- text: one block per release or history line, ids at the start of a line so they stay whole
# and copyable at 80 columns (a table folded them) ---------------------------------------------


WIDTH = 80  # the terminal width the text is laid out for (ids whole and copyable)


def _commit_text(commit: str | None, clean: bool | None, allow_dirty: bool = False) -> str:
    if commit is None:
        return "commit not recorded"
    state = "" if clean is None else ", clean" if clean else \
        ", dirty (--allow-dirty)" if allow_dirty else ", dirty"
    return f"commit {commit[:12]}{state}"


def release_lines(found: HostReleases) -> list[str]:
    """The text of ``releases HOST``: per release (oldest first) its id, then indented how it
    was shipped, whether it is in use (since when, by whom) and each rollback away from it;
    then the entries of ``releases/`` that are no release, and the failed ships."""
    lines = [f"releases on {show_name(found.host)}, oldest first (* in use):"]
    if found.in_progress:
        lines.append(f"  a ship is in progress on this host ({printable(found.in_progress)}): "
                     "what is listed may be about to change")
    for r in found.releases:
        lines.append(("* " if r.current else "  ") + r.id)
        if r.recorded:
            forced = "; forced" if r.forced else ""
            lines.append(f"    shipped {r.created or '(time not recorded)'} by "
                         f"{show_name(r.shipped_by or '(not recorded)')}; "
                         f"{_commit_text(r.commit, r.clean, r.allow_dirty)}{forced}")
        else:
            lines.append("    no record: never a rollback target")
        if r.problem:
            lines.append(f"    {printable(r.problem)}: not a rollback target")
        if r.in_use_since is not None:
            e = r.in_use_since
            lines.append(f"    in use since {e.time or '(time not recorded)'} ({e.kind} by "
                         f"{show_name(e.by or '(not recorded)')})")
        for e in r.rolled_back:
            lines.append(f"    rolled back from it on {e.time or '(time not recorded)'} by "
                         f"{show_name(e.by or '(not recorded)')}")
    if not found.releases:
        lines.append("  no release")
    if found.foreign:
        lines.append("not releases (never counted, followed or removed by fleetctl):")
        for f in found.foreign:
            what = {"staging": "a ship in progress, or the leftover of an interrupted one "
                    "(the next ship removes it)",
                    "pruning": "an old release a prune could not remove completely (the "
                    "next prune tries again)"}.get(f.kind, f.reason or "not made by fleetctl")
            lines += [f"  {show_name(f.name)}", f"    {f.kind}: {printable(what)}"]
    failed = [e for e in found.history if e.kind == "failed"]
    if failed:
        lines.append("ships that failed on this host (none became a release):")
        for e in failed:
            lines += [f"  {e.release or '(no id)'}", *failure_detail(e)]
    lines += [f"warning: {printable(w)}" for w in found.warnings]
    return lines


def failure_detail(e: HistoryEntry) -> list[str]:
    """A failed ship's when, step, who and commit, then its error and path: two lines,
    indented four spaces."""
    where = f" ({show_name(e.path)})" if e.path else ""
    return [f"    {e.time or '(time not recorded)'} at step {e.step or '(unknown)'} by "
            f"{show_name(e.by or '(not recorded)')}; {_commit_text(e.commit, e.clean)}",
            f"    {printable(e.error or 'failed')}: {printable(e.message or '')}{where}",
            *(f"      {show_name(path)}: {printable(what)}" for path, what in e.items),
            *([f"      ... and {e.items_total - len(e.items)} more"]
              if e.items_total > len(e.items) else [])]


def history_lines(e: HistoryEntry) -> list[str]:
    """One history line as text: time, host, what and the release on the first line (the id
    last, whole), then indented where from, the commit, who and whether anything was forced;
    for a failed ship the step, the error and its path."""
    head = f"{e.time or '(time not recorded)':20}  {show_name(e.host)}  {e.kind:8}"
    release = e.release or "-"
    # The id ends the first line while that fits 80 columns; after a long host name it gets a
    # line of its own rather than be cut in two by the terminal.
    head = f"{head}  {release}" if len(head) + 2 + len(release) <= WIDTH else \
        f"{head}\n    {release}"
    if e.kind == "failed":
        return [head, *failure_detail(e)]
    forced = ", forced" if e.forced else ""
    return [head, f"    from {e.previous or '(none)'}; {_commit_text(e.commit, e.clean)}; by "
                  f"{show_name(e.by or '(not recorded)')}{forced}"]



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
                                   foreign=[f.to_json() for f in found.foreign],
                                   failed=[e.to_json() for e in found.history
                                           if e.kind == "failed"],
                                   ship_in_progress=found.in_progress,
                                   warnings=found.warnings))
            return EXIT_OK
        target.write("\n".join(release_lines(found)) + "\n")
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
        lines = [line for e in entries for line in history_lines(e)] or ["no history recorded"]
        for f in found:
            if f.error:
                lines.append(printable(f.error))
            lines += [f"{show_name(f.host)}: warning: {printable(w)}" for w in f.warnings]
        target.write("\n".join(lines) + "\n")
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
