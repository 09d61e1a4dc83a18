"""What every command's thin CLI layer shares: the stderr console, the output formats, where the
project is, and how a user-facing error is printed."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from fleetctl.errors import FleetctlError
from fleetctl.names import safe_text

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


def print_error(exc: FleetctlError) -> None:
    """Print a user-facing error and its hint on stderr, names escaped, no traceback."""
    label = "refused" if exc.exit_code == 3 else "error"
    err.print(f"{label}: {safe_text(exc.message)}", markup=False, highlight=False, soft_wrap=True)
    if exc.hint:
        err.print(f"hint: {safe_text(exc.hint)}", markup=False, highlight=False, soft_wrap=True)


# The options every command shares (DESIGN.md §4), defined once.
InventoryOpt = typer.Option(None, "--inventory", "-i", envvar="FLEETCTL_INVENTORY",
                            help="Inventory file \\[default: inventory/demo.yaml of the project].")
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
    import traceback

    if debug:
        err.print(traceback.format_exc(), markup=False, highlight=False)
    err.print(f"error: internal error: {exc.__class__.__name__}: {safe_text(str(exc))}",
              markup=False, highlight=False, soft_wrap=True)
    err.print("hint: please report this traceback" if debug else
              "hint: rerun with --debug for the traceback, and report it",
              markup=False, highlight=False)
