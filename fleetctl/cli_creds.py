"""``fleetctl creds audit [HOST...]``: the least-privilege audit of credentials, as a thin command.

It parses options, calls :func:`fleetctl.creds_audit.audit_credentials`, renders the report
(a rich table, JSON or Markdown, all from the same findings) and exits 0 (clean), 1 (findings)
or 2 (bad input, a host that could not be scanned, an incomplete scan). Registered on the main
app by ``fleetctl/cli.py``::

    from fleetctl.cli_creds import creds_app
    app.add_typer(creds_app, name="creds")

The loading, error mapping, ``--output`` handling and progress of the other commands are reused
from :mod:`fleetctl.cli`, imported when the command runs (that module imports this one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import Progress as RichBar, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fleetctl.cli_common import (BlueprintOpt, DebugOpt, Format, FormatOpt, InventoryOpt, OutputOpt,
                                 ParallelOpt, TimeoutOpt, err)
from fleetctl.creds_audit import AuditOptions, AuditReport, to_json, to_markdown
from fleetctl.names import printable

creds_app = typer.Typer(
    name="creds",
    help="Credentials: the least-privilege audit of grants and of secret files on hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow"}
_STATUS_STYLE = {"clean": "green", "findings": "yellow", "incomplete": "red", "error": "red"}


@creds_app.command("audit")
def audit(
    hosts: Optional[list[str]] = typer.Argument(None, help="Hosts to audit \\[default: all]."),
    static: bool = typer.Option(False, "--static",
                                help="Blueprint and inventory only: contact no host."),
    inventory: Optional[Path] = InventoryOpt,
    blueprint: Optional[Path] = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Optional[Path] = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Audit grants (static) and secret files on the hosts (live): exit 0 clean, 1 findings,
    2 error."""
    from fleetctl.cli import ReportTarget, _guard, _load

    def body() -> int:
        inv, bp = _load(inventory, blueprint, timeout)
        selected = inv.select(hosts)
        target = ReportTarget(output)
        from fleetctl.creds_audit import audit_credentials

        options = AuditOptions(static_only=static, parallel=parallel)
        report = _with_progress(lambda p: audit_credentials(bp, inv, selected, options, p),
                                static)
        if debug:
            for h in report.hosts:
                if h.debug:
                    err.print(h.debug, markup=False, highlight=False)
        if fmt is Format.json:
            target.write(to_json(report))
        elif fmt is Format.markdown:
            target.write(to_markdown(report))
        else:
            print_text(target.console(), report)
            target.write("")
        if not report.hosts:
            err.print("no hosts selected: the inventory has none")
        return report.exit_code

    _guard(body, debug)


def _with_progress(fn, static: bool) -> AuditReport:
    from fleetctl.cli import BarProgress

    if static or not err.is_terminal:
        return fn(None)
    with RichBar(SpinnerColumn(), TextColumn("{task.description}"),
                 TextColumn("{task.fields[step]}"), TimeElapsedColumn(), console=err,
                 transient=True) as bar:
        return fn(BarProgress(bar))


def print_text(console: Console, report: AuditReport) -> None:
    """One table of findings (severity, host, agent, capability, rule, finding, where), then one
    line per host."""
    if report.findings:
        table = Table(title="fleetctl creds audit", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("severity", "host", "agent", "capability", "rule", "finding", "where"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            table.add_row(Text(f.severity, style=_SEVERITY_STYLE.get(f.severity, "")),
                          Text(printable(f.host)), Text(printable(f.agent or "")),
                          Text(f.capability or ""), Text(f.rule), Text(printable(f.message)),
                          Text(printable(f.path or f.where or "")))
        console.print(table)
    for h in report.hosts:
        scope = "" if h.scanned else (" (static only)" if report.static_only else
                                      " (not scanned)")
        line = f"{h.host}: {h.status}, {len(h.findings)} finding(s){scope}"
        if h.error:
            line += f": {h.error}"
        console.print(Text(printable(line), style=_STATUS_STYLE.get(h.status, "")),
                      soft_wrap=True)
        for path, error in h.unreadable:
            console.print(Text(f"  unreadable: {printable(path)}: {error}", style="red"),
                          soft_wrap=True)
        for k in h.skipped:
            console.print(Text(f"  skipped: {printable(k.describe())}", style="yellow"),
                          soft_wrap=True)
        if h.hint and h.status in ("error", "incomplete"):
            console.print(Text(f"  hint: {printable(h.hint)}", style="dim"), soft_wrap=True)
