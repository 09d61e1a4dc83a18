"""``fleetctl report [HOST...]`` and ``fleetctl status [HOST...]``, as thin commands.

``report`` loads the project, calls :func:`fleetctl.nightly.collect` and
:func:`fleetctl.nightly.judge`, keeps the night in ``--history DIR``, and writes the document in
every format asked for, each file whole or not at all (a temporary file and a rename). When the
run fails before it can report (a bad inventory, an unknown host, a bad allowlist), each output
file asked for is replaced by a short error document in its format, so a CI job never publishes
last night's file as tonight's. Exit 0 clean, 1 findings that fail, 2 error.

``status`` calls :func:`fleetctl.status.fleet_status`. Both are added to the main app by
:func:`register`; the documents are rendered by :mod:`fleetctl.cli.output.nightly` and
:mod:`fleetctl.cli.output.status`.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer

from fleetctl.cli.common import (
    BlueprintOpt,
    DebugOpt,
    InventoryOpt,
    ParallelOpt,
    TimeoutOpt,
    err,
    guard,
    load_project,
    print_error,
    print_internal_error,
    source_state,
    with_progress,
)
from fleetctl.errors import EXIT_ERROR, FleetctlError


class ReportFormat(str, Enum):
    """``--format`` of ``fleetctl report``."""

    text = "text"
    json = "json"
    markdown = "markdown"
    junit = "junit"
    html = "html"


def _render(fmt: str, doc: dict, quiet: bool = False, elsewhere: tuple[str, ...] = ()) -> str:
    """``doc`` in ``fmt``; ``elsewhere``: the run's other output files, which the Markdown
    names as where every finding is when it had to be cut."""
    from fleetctl.cli.output import nightly as r

    if fmt == "json":
        return r.to_json(doc)
    if fmt == "markdown":
        return r.to_markdown(doc, elsewhere=elsewhere)
    if fmt == "junit":
        return r.to_junit(doc)
    if fmt == "html":
        return r.to_html(doc)
    return r.to_text(doc, quiet=quiet)


def report_command(
    hosts: list[str] | None = typer.Argument(None, help="Hosts to report on \\[default: all]."),
    fmt: ReportFormat = typer.Option(ReportFormat.text, "--format", "-f",
                                     help="Format of stdout (or --output)."),
    output: Path | None = typer.Option(None, "--output", "-o",
                                          help="Write the --format document to FILE."),
    json_out: Path | None = typer.Option(None, "--json", metavar="FILE",
                                            help="Also write the JSON document to FILE."),
    markdown_out: Path | None = typer.Option(None, "--markdown", metavar="FILE",
                                                help="Also write the Markdown summary to FILE."),
    junit_out: Path | None = typer.Option(None, "--junit", metavar="FILE",
                                             help="Also write JUnit XML to FILE."),
    html_out: Path | None = typer.Option(None, "--html", metavar="FILE",
                                            help="Also write the HTML page to FILE."),
    history: Path | None = typer.Option(
        None, "--history", metavar="DIR", help="Keep each night's JSON in DIR and mark findings "
        "new, persisting or resolved against the last one."),
    keep: int = typer.Option(90, "--keep", min=1, help="Nights kept in --history."),
    allowlist: Path | None = typer.Option(
        None, "--allowlist", metavar="FILE", help="Accepted findings (host, path or rule, kind, "
        "reason, expires): shown, marked, and not failing until they expire."),
    fail_on: str = typer.Option(
        "all", "--fail-on", metavar="WORDS", help="What fails the run (exit 1), comma-separated: "
        "all, none, new, a check (drift, creds, tokens) or finding kinds (hand-patch, "
        "conflict, readable-by-others...)."),
    no_ledgers: bool = typer.Option(
        False, "--no-ledgers", help="Do not read the runners' records (no tokens chart; "
        "whether an agent waits on a person is not known)."),
    now: str | None = typer.Option(
        None, "--now", metavar="TIME", help="Date the report TIME (ISO 8601, UTC) instead of "
        "the clock, for replays and tests; allowlist expiry is judged on its date."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="Text: print only what fails or could not be checked."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """The nightly report: drift, credentials and token budgets of every host in one document
    (exit 0 clean, 1 findings that fail, 2 error)."""
    from fleetctl import nightly
    from fleetctl.cli.output.nightly import failure_document

    outputs: list[tuple[str, Path]] = [(f, p) for f, p in (
        ("json", json_out), ("markdown", markdown_out), ("junit", junit_out),
        ("html", html_out)) if p is not None]
    if output is not None:
        outputs.append((fmt.value, output))
    try:
        generated = nightly.now_utc(now)
    except FleetctlError:
        generated = nightly.now_utc()
    try:
        nightly.now_utc(now)
        code = _report_body(hosts, fmt.value, output is None, outputs, history, keep, allowlist,
                            fail_on, not no_ledgers, quiet, inventory, blueprint, parallel,
                            timeout, generated)
    except FleetctlError as exc:
        print_error(exc)
        for kind, path in outputs:
            try:
                nightly.write_whole(path, failure_document(kind, exc.message, generated))
            except FleetctlError as again:
                print_error(again)
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:  # noqa: BLE001 - an internal error: no traceback without --debug
        print_internal_error(exc, debug)
        for kind, path in outputs:
            try:
                nightly.write_whole(path, failure_document(
                    kind, f"internal error: {exc.__class__.__name__}: {exc}", generated))
            except FleetctlError:
                pass
        raise typer.Exit(EXIT_ERROR) from None
    raise typer.Exit(code)


def _report_body(hosts, fmt, to_stdout, outputs, history, keep, allowlist, fail_on, ledgers,
                 quiet, inventory, blueprint, parallel, timeout, generated) -> int:
    from fleetctl import nightly

    rule = nightly.parse_fail_on(fail_on)
    accepted = nightly.load_allowlist(allowlist) if allowlist is not None else None
    nights = nightly.load_history(history) if history is not None else []
    inv, bp = load_project(inventory, blueprint, timeout)
    selected = inv.select(hosts)
    source = source_state(inv, bp)
    report = with_progress(lambda progress: nightly.collect(
        bp, inv, selected, source, parallel, progress, ledgers, generated))
    # Compare with the latest run kept (one of the same second is the run this one replaces);
    # the chart shows the nights before this one.
    earlier = [d for d in nights if d["generated"] <= report.generated]
    before = [d for d in earlier if d["generated"] < report.generated]
    nightly.judge(report, earlier[-1] if earlier else None, accepted, rule, allowlist,
                  before[-(keep - 1):] if keep > 1 else [])
    doc = nightly.report_document(report)
    whole = tuple(str(path) for kind, path in outputs if kind in ("json", "html", "junit"))
    for kind, path in outputs:
        nightly.write_whole(path, _render(kind, doc, quiet, whole))
    if history is not None:
        nightly.save_night(history, doc, keep)
    if to_stdout:
        sys.stdout.write(_render(fmt, doc, quiet, whole))
        sys.stdout.flush()
    if not selected:
        err.print("no hosts selected: the inventory has none")
    return doc["exit_code"]


def status_command(
    hosts: list[str] | None = typer.Argument(None, help="Hosts to show \\[default: all]."),
    json_format: bool = typer.Option(False, "--json", help="Write one JSON document."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """The fleet at a glance: per host the release and commit in use; per agent its last task,
    verdict, retries, escalations waiting and prefix tokens per turn (exit 0, 1 attention
    needed, 2 error)."""
    from fleetctl.cli.output.status import to_json, to_text
    from fleetctl.status import fleet_status

    def body() -> int:
        inv, _bp = load_project(inventory, blueprint, timeout)
        selected = inv.select(hosts)
        report = fleet_status(selected, parallel)
        sys.stdout.write(to_json(report) if json_format else to_text(report))
        sys.stdout.flush()
        return report.exit_code

    guard(body, debug)


def register(app: typer.Typer) -> None:
    """Add ``report`` and ``status`` to the main app."""
    app.command("report")(report_command)
    app.command("status")(status_command)
