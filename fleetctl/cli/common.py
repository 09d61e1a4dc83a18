"""What every command's thin CLI layer shares: the stderr console, the output formats, where the
project is, loading it, progress on a terminal, where the report goes, and the one way out of a
command (:func:`guard`: a user-facing error becomes its message and exit code, anything else an
internal error)."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import IO, TypeVar, cast

import typer
from rich.console import Console
from rich.progress import Progress as RichBar
from rich.progress import SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from fleetctl.blueprint import Blueprint, load_blueprint
from fleetctl.cli.output.text import RStripWriter
from fleetctl.errors import EXIT_ERROR, FleetctlError, InputError
from fleetctl.inventory import Inventory, load_inventory
from fleetctl.names import printable, show_name
from fleetctl.results import HostResult, NoProgress, Progress
from fleetctl.source import SourceState, inspect_source
from fleetctl.yamlfile import display_path

T = TypeVar("T")

err = Console(stderr=True)
"""Messages, progress and prompts go to stderr; data goes to stdout or ``--output``."""


class Format(str, Enum):
    """``--format``: one document for people or machines, built from the same records."""

    text = "text"
    json = "json"
    markdown = "markdown"


def find_project(inventory: Path | None = None) -> Path:
    """Where the fleet repository is, so the blueprint and templates are found next to it.

    With ``inventory`` (a file named by ``--inventory``): the nearest directory holding
    ``blueprint/``, from the inventory file's own directory up, so ``fleetctl drift -i
    /path/to/fleet/inventory/x.yaml`` works from any current directory. Otherwise, or when no
    directory above the inventory holds one: the nearest directory, from the current one up,
    holding ``blueprint/`` and ``inventory/`` (the current directory when none does).
    """
    if inventory is not None:
        start = Path(inventory).expanduser().absolute().parent
        for candidate in (start, *start.parents):
            if (candidate / "blueprint").is_dir():
                return candidate
    here = Path.cwd()
    for candidate in (here, *here.parents):
        if (candidate / "blueprint").is_dir() and (candidate / "inventory").is_dir():
            return candidate
    return here


def inventory_path(inventory: Path | None) -> Path:
    """The inventory file a command uses: ``inventory`` (``--inventory``), else
    ``$FLEETCTL_INVENTORY``, else ``inventory/demo.yaml`` of the project (find_project()).

    Unless it came from the command line, one line on stderr says which file it is and where
    it came from: a user who forgot ``--inventory`` sees at once that the demo fleet, not
    theirs, was read. (The variable is read here, not by typer's ``envvar``, which would not
    say where a value came from.)
    """
    if inventory is not None:
        return inventory
    from_env = os.environ.get(INVENTORY_ENV)
    if from_env:
        chosen, why = Path(from_env), f"from ${INVENTORY_ENV}"
    else:
        chosen = find_project() / "inventory" / "demo.yaml"
        why = f"default; --inventory or ${INVENTORY_ENV} to change"
    shown = show_name(display_path(chosen.expanduser().absolute()))
    err.print(f"inventory: {shown} ({why})", markup=False, highlight=False, soft_wrap=True)
    return chosen


def _lines(text: str) -> str:
    """A message for the terminal: each of its lines with control characters (ESC, CR, bidi
    overrides) and bad bytes escaped (:func:`fleetctl.names.printable`), its newlines kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def print_error(exc: FleetctlError) -> None:
    """Print a user-facing error and its hint on stderr, names escaped, no traceback."""
    label = "refused" if exc.exit_code == 3 else "error"
    err.print(f"{label}: {_lines(exc.message)}", markup=False, highlight=False, soft_wrap=True)
    if exc.hint:
        err.print(f"hint: {_lines(exc.hint)}", markup=False, highlight=False, soft_wrap=True)


# The options every command shares (DESIGN.md §4), defined once.
INVENTORY_ENV = "FLEETCTL_INVENTORY"
InventoryOpt = typer.Option(None, "--inventory", "-i",
                            help="Inventory file \\[default: $FLEETCTL_INVENTORY, else "
                            "inventory/demo.yaml of the project].")
BlueprintOpt = typer.Option(None, "--blueprint", "-b", envvar="FLEETCTL_BLUEPRINT",
                            help="Blueprint directory \\[default: blueprint/ of the project].")
FormatOpt = typer.Option(Format.text, "--format", "-f", help="Output format.")
OutputOpt = typer.Option(None, "--output", "-o", help="Write the report to FILE, not stdout.")
ParallelOpt = typer.Option(8, "--parallel", "-p", min=1, help="Hosts at once.")
TimeoutOpt = typer.Option(120.0, "--timeout", min=0.1,
                          help="Seconds per host for connecting and each operation.")
DebugOpt = typer.Option(False, "--debug", help="Show tracebacks of internal errors.")


def print_internal_error(exc: BaseException, debug: bool) -> None:
    """Print an unexpected error as one line and a hint; the traceback only with ``--debug``.

    Call from inside the ``except`` block (the traceback is the one being handled).
    """
    if debug:
        err.print(traceback.format_exc(), markup=False, highlight=False)
    err.print(f"error: internal error: {exc.__class__.__name__}: {_lines(str(exc))}",
              markup=False, highlight=False, soft_wrap=True)
    err.print("hint: please report this traceback" if debug else
              "hint: rerun with --debug for the traceback, and report it",
              markup=False, highlight=False)


def load_project(inventory: Path | None, blueprint: Path | None,
                 timeout_s: float | None) -> tuple[Inventory, Blueprint]:
    """The blueprint and inventory a command works on: the paths given, or the project's
    defaults (``blueprint/``, ``inventory/demo.yaml``); ``timeout_s`` (seconds, when given)
    replaces every host's own timeout.

    Raises:
        InputError: a blueprint or inventory that does not load.
    """
    inventory = inventory_path(inventory)
    project = find_project(inventory)  # the inventory's own repository, wherever we are
    bp = load_blueprint(blueprint or project / "blueprint")
    inv = load_inventory(inventory, blueprint=bp)
    if timeout_s is not None:
        inv = Inventory(inv.path, tuple(replace(h, timeout_s=timeout_s) for h in inv.hosts))
    return inv, bp


def source_state(inv: Inventory, bp: Blueprint) -> SourceState:
    """Where the blueprint came from (its git commit and cleanliness), for provenance."""
    return inspect_source(bp.root, bp.templates, inv.path)


class BarProgress:
    """Draws one line per host on a terminal: its current step, then its outcome."""

    def __init__(self, bar: RichBar) -> None:
        self._bar = bar
        self._tasks: dict[str, TaskID] = {}

    def host_started(self, host: str) -> None:
        self._tasks[host] = self._bar.add_task(host, step="connect", total=None)

    def host_step(self, host: str, step: str) -> None:
        self._bar.update(self._tasks[host], step=step)

    def host_finished(self, result: HostResult) -> None:
        self._bar.update(self._tasks[result.host], step=result.status, total=1, completed=1)


def with_progress(fn: Callable[[Progress], T], show: bool = True) -> T:
    """Call ``fn`` with a progress observer and return what it returns: a rich bar per host
    when ``show`` and stderr is a terminal, else an observer that draws nothing."""
    if not show or not err.is_terminal:
        return fn(NoProgress())
    with RichBar(SpinnerColumn(), TextColumn("{task.description}"),
                 TextColumn("{task.fields[step]}"), TimeElapsedColumn(), console=err,
                 transient=True) as bar:
        return fn(BarProgress(bar))


class ReportTarget:
    """Where the report goes: stdout, or a file opened before any host is contacted, so an
    unwritable ``--output`` stops the command before it changes anything."""

    def __init__(self, output: Path | None) -> None:
        self.path = output
        self._fh: IO[str] | None = None
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
        if self._fh is not None:
            return Console(file=cast(IO[str], RStripWriter(self._fh)), width=160, no_color=True)
        out = Console()
        return out if out.is_terminal else Console(file=cast(IO[str], RStripWriter(sys.stdout)),
                                                   width=160)


def guard(fn: Callable[[], int], debug: bool = False) -> None:
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
