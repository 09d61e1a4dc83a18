"""The ``fleetctl`` command line: a thin typer layer over the library.

Each command loads its input, calls one library function, renders the results and exits with the
code DESIGN.md §4 gives. Errors become a message and an exit code here and nowhere else.
Data goes to stdout (or ``--output``); messages, progress and prompts go to stderr.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.progress import Progress as RichBar
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from fleetctl import __version__
from fleetctl.blueprint import Blueprint, load_blueprint
from fleetctl.cli_common import (
    BlueprintOpt,
    DebugOpt,
    Format,
    FormatOpt,
    InventoryOpt,
    OutputOpt,
    ParallelOpt,
    TimeoutOpt,
    err,
    find_project,
    print_error,
    print_internal_error,
)
from fleetctl.cli_releases import register as register_day_two
from fleetctl.cli_tokens import tokens_command
from fleetctl.errors import (
    EXIT_ERROR,
    EXIT_REFUSED,
    FleetctlError,
    InputError,
    worst_exit,
)
from fleetctl.inventory import Inventory, load_inventory
from fleetctl.names import tree_path
from fleetctl.render import render_host, write_tree
from fleetctl.report import print_text, to_json, to_markdown
from fleetctl.results import HostResult, NoProgress, Progress
from fleetctl.ship import (
    ShipOptions,
    drift_host,
    plan_host,
    run_hosts,
    ship_fleet,
    source_refusal,
)
from fleetctl.source import SourceState, inspect_source

app = typer.Typer(
    name="fleetctl",
    help="Keep a fleet of AI-agent hosts identical to one blueprint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _load(inventory: Optional[Path], blueprint: Optional[Path],
          timeout_s: float | None) -> tuple[Inventory, Blueprint]:
    project = find_project(inventory)  # the inventory's own repository, wherever we are
    bp = load_blueprint(blueprint or project / "blueprint")
    inv = load_inventory(inventory or project / "inventory" / "demo.yaml", blueprint=bp)
    if timeout_s is not None:
        inv = Inventory(inv.path, tuple(replace(h, timeout_s=timeout_s) for h in inv.hosts))
    return inv, bp


def _source(inv: Inventory, bp: Blueprint) -> SourceState:
    return inspect_source(bp.root, bp.templates, inv.path)


class BarProgress:
    """Draws one line per host on a terminal: its current step, then its outcome."""

    def __init__(self, bar: RichBar) -> None:
        self._bar = bar
        self._tasks: dict[str, int] = {}

    def host_started(self, host: str) -> None:
        self._tasks[host] = self._bar.add_task(host, step="connect", total=None)

    def host_step(self, host: str, step: str) -> None:
        self._bar.update(self._tasks[host], step=step)

    def host_finished(self, result: HostResult) -> None:
        self._bar.update(self._tasks[result.host], step=result.status, total=1, completed=1)


def _with_progress(fn: Callable[[Progress], list[HostResult]]) -> list[HostResult]:
    if not err.is_terminal:
        return fn(NoProgress())
    with RichBar(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[step]}"),
                 TimeElapsedColumn(), console=err, transient=True) as bar:
        return fn(BarProgress(bar))


class ReportTarget:
    """Where the report goes: stdout, or a file opened before any host is contacted, so an
    unwritable ``--output`` stops the command before it changes anything."""

    def __init__(self, output: Optional[Path]) -> None:
        self.path = output
        self._fh = None
        if output is not None:
            try:
                self._fh = open(output, "w", encoding="utf-8")  # noqa: SIM115 - kept open
            except OSError as exc:
                raise InputError(f"{output}: cannot write the report: {exc.strerror}") from None

    def write(self, text: str) -> None:
        """Write the whole report and close the file."""
        fh = self._fh or sys.stdout
        fh.write(text)
        fh.flush()
        if self._fh is not None:
            self._fh.close()

    def console(self) -> Console:
        """A console for the text format: the file, or stdout (wide when not a terminal); lines
        to a file or a pipe carry no padding."""
        from fleetctl.textout import RStripWriter

        if self._fh is not None:
            return Console(file=RStripWriter(self._fh), width=160, no_color=True)
        out = Console()
        return out if out.is_terminal else Console(file=RStripWriter(sys.stdout), width=160)


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


def _guard(fn: Callable[[], int], debug: bool = False) -> None:
    """Run a command body: the one way out of every command.

    A user-facing error prints its message and hint and exits with its code; anything else is
    an internal error: one line saying so and how to see more, exit 2 (never 1, which CI reads
    as "findings"), the traceback only with ``--debug``.
    """
    try:
        code = fn()
    except FleetctlError as exc:
        print_error(exc)
        raise typer.Exit(exc.exit_code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error is reported
        print_internal_error(exc, debug)
        raise typer.Exit(EXIT_ERROR) from None
    raise typer.Exit(code)


@app.command()
def drift(
    hosts: Optional[list[str]] = typer.Argument(None, help="Hosts to check \\[default: all]."),
    diff: bool = typer.Option(False, "--diff", help="Show each changed file's content diff "
                              "(text, key-level YAML/JSON; binaries and secrets by digest)."),
    inventory: Optional[Path] = InventoryOpt,
    blueprint: Optional[Path] = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Optional[Path] = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Show what on each host differs from the blueprint, and why (exit 0 none, 1 drift, 2 error)."""

    def body() -> int:
        inv, bp = _load(inventory, blueprint, timeout)
        selected = inv.select(hosts)
        target = ReportTarget(output)
        source = _source(inv, bp)
        results = _with_progress(lambda p: run_hosts(
            selected, lambda h: drift_host(bp, h, p, source, diff), parallel, p))
        return _report(results, "drift", fmt, target, debug, source, quiet)

    _guard(body, debug)


@app.command()
def ship(
    hosts: Optional[list[str]] = typer.Argument(None, help="Hosts to ship \\[default: all]."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n",
                                 help="Print the plan ship would carry out; write nothing."),
    force: bool = typer.Option(False, "--force",
                               help="Overwrite hand-patches, conflicts and unknown content, and "
                               "ship over a stale checkout (recorded)."),
    force_path: Optional[list[str]] = typer.Option(
        None, "--force-path", metavar="PATH", help="Overwrite the hand-patch at PATH only (a "
        "directory covers what is below it; repeatable); other hand-patches still refuse."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Ship a blueprint with uncommitted or untracked files, or "
        "outside git (recorded in the release)."),
    renamed_from: Optional[str] = typer.Option(
        None, "--renamed-from", metavar="OLD_NAME",
        help="The one selected host was renamed on purpose: it records OLD_NAME as its identity; "
        "record the inventory's name instead."),
    diff: bool = typer.Option(False, "--diff", help="With the plan (--dry-run or the prompt), "
                              "show each changed file's content diff."),
    skip_unreachable: bool = typer.Option(
        False, "--skip-unreachable", help="Ship the hosts that can be reached even when others "
        "cannot be connected to (the fleet is then split until they are shipped)."),
    inventory: Optional[Path] = InventoryOpt,
    blueprint: Optional[Path] = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Optional[Path] = OutputOpt,
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
        inv, bp = _load(inventory, blueprint, timeout)
        known = {h.name for h in inv.hosts}
        for name in hosts or ():
            if name not in known and "/" in name:  # `ship --force runner/README` read as a host
                raise InputError(f"{name!r} is not a host of {inv.path.name}",
                                 hint=f"to overwrite only the hand-patch at that path, use "
                                 f"--force-path {name} (or --force={name})")
        selected = inv.select(hosts)
        target = ReportTarget(output)
        source = _source(inv, bp)
        options = ShipOptions(force=force, dry_run=dry_run, allow_dirty=allow_dirty,
                              renamed_from=renamed_from, skip_unreachable=skip_unreachable,
                              force_paths=tuple(tree_path(p, "--force-path")
                                                for p in force_path or ()))
        refusal = source_refusal(source, options)
        if dry_run or refusal is not None:
            results = [HostResult(h.name, "refused", error=refusal.message, hint=refusal.hint,
                                  step="source") for h in selected] if refusal else \
                _with_progress(lambda p: run_hosts(
                    selected, lambda h: plan_host(bp, h, options, source, p, diff), parallel, p))
            return _report(results, "ship", fmt, target, debug, source, quiet, all_paths)
        if not yes and sys.stdin.isatty() and err.is_terminal:
            plans = _with_progress(lambda p: run_hosts(
                selected, lambda h: plan_host(bp, h, options, source, p, diff), parallel, p))
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
                                                 if p.plan_digest})
        results = _with_progress(lambda p: ship_fleet(bp, selected, options, source,
                                                      parallel, p))
        return _report(results, "ship", fmt, target, debug, source, quiet, all_paths)

    _guard(body, debug)


@app.command()
def render(
    host: str = typer.Argument(..., help="The host whose desired tree to write."),
    out: Path = typer.Option(..., "--out", help="An empty or new directory to write it to."),
    inventory: Optional[Path] = InventoryOpt,
    blueprint: Optional[Path] = BlueprintOpt,
    debug: bool = DebugOpt,
) -> None:
    """Write one host's desired tree locally (exit 0, or 2 on error).

    Credential files are left out: secrets never go to local disk.
    """

    def body() -> int:
        inv, bp = _load(inventory, blueprint, None)
        (selected,) = inv.select([host])
        tree = render_host(bp, selected, with_credentials=False)
        write_tree(tree, out)
        err.print(f"wrote {len(tree.manifest)} entries for {host} to {out}")
        granted = sum(len(a.grants) for a in selected.agents)
        if granted:
            err.print(f"left out the credentials of {granted} grant(s): secrets are never "
                      "written to local disk (`fleetctl drift` shows their digests)")
        return 0

    _guard(body, debug)


app.command("tokens")(tokens_command)
register_day_two(app)

from fleetctl.cli_creds import creds_app  # noqa: E402 - `fleetctl creds audit`

app.add_typer(creds_app, name="creds")

from fleetctl.cli_report import report_command, status_command  # noqa: E402 - issue 13

app.command("report")(report_command)
app.command("status")(status_command)


@app.command()
def version() -> None:
    """Print fleetctl's version."""
    typer.echo(__version__)


def main() -> None:
    """Console-script entry point.

    ``--force=PATH`` (with ``=``) is read as ``--force-path PATH``: overwrite that path's
    hand-patch only. ``--force PATH`` cannot mean that, since ``--force`` alone overwrites all
    and a following word is a host (docs/design.md (r)).
    """
    sys.argv[1:] = [f"--force-path={arg[len('--force='):]}" if arg.startswith("--force=")
                    else arg for arg in sys.argv[1:]]
    app()
