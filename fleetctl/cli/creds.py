"""``fleetctl creds audit [HOST...]``: the least-privilege audit of credentials, as a thin command.

It parses options, calls :func:`fleetctl.creds_audit.audit_credentials`, renders the report
(a rich table, JSON or Markdown, all from the same findings) and exits 0 (clean), 1 (findings)
or 2 (bad input, a host that could not be scanned, an incomplete scan). Added to the main app by
:func:`register`. The loading, error mapping, ``--output`` handling and progress of the other
commands are reused from :mod:`fleetctl.cli.common`; the report is rendered by
:mod:`fleetctl.cli.output.creds`.
"""

from __future__ import annotations

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
    with_progress,
)
from fleetctl.cli.output.creds import print_text, to_json, to_markdown
from fleetctl.creds_audit import AuditOptions

creds_app = typer.Typer(
    name="creds",
    help="Credentials: the least-privilege audit of grants and of secret files on hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@creds_app.command("audit")
def audit(
    hosts: list[str] | None = typer.Argument(None, help="Hosts to audit \\[default: all]."),
    static: bool = typer.Option(False, "--static",
                                help="Blueprint and inventory only: contact no host."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    parallel: int = ParallelOpt,
    timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Audit grants (static) and secret files on the hosts (live): exit 0 clean, 1 findings,
    2 error."""

    def body() -> int:
        inv, bp = load_project(inventory, blueprint, timeout)
        selected = inv.select(hosts)
        target = ReportTarget(output)
        from fleetctl.creds_audit import audit_credentials

        options = AuditOptions(static_only=static, parallel=parallel)
        report = with_progress(lambda p: audit_credentials(bp, inv, selected, options, p),
                               show=not static)
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

    guard(body, debug)


def register(app: typer.Typer) -> None:
    """Add ``creds audit`` to the main app."""
    app.add_typer(creds_app, name="creds")
