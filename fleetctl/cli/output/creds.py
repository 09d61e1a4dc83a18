"""``fleetctl creds audit`` as text blocks, JSON (``docs/credentials-audit.md``) or Markdown, all
from the same findings. Names, paths and host errors are escaped: a host-supplied text reaches a
page as text, never as markup.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

from fleetctl.cli.output.markdown import md_text
from fleetctl.cli.output.text import prose_width, wrap_words
from fleetctl.creds_audit import COMMAND, SCHEMA_VERSION, AuditReport, HostAudit
from fleetctl.names import escape_name, printable, show_name

_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow"}
_STATUS_STYLE = {"clean": "green", "findings": "yellow", "incomplete": "red", "error": "red"}


def host_json(audit: HostAudit) -> dict[str, Any]:
    """One host's record: ``host, status, exit_code, scanned, findings, error, hint,
    unreadable, skipped``."""
    unreadable = []
    for path, error in audit.unreadable:
        shown, escaped = escape_name(path)
        unreadable.append({"path": shown, **({"path_escaped": True} if escaped else {}),
                           "error": error})
    return {"host": audit.host, "status": audit.status, "exit_code": audit.exit_code,
            "scanned": audit.scanned, "findings": len(audit.findings),
            "error": escape_name(audit.error)[0] if audit.error else None,
            "hint": escape_name(audit.hint)[0] if audit.hint else None,
            "unreadable": unreadable, "skipped": [k.to_json() for k in audit.skipped]}


def to_json(report: AuditReport) -> str:
    """The JSON document (``schema_version`` 1, ``docs/credentials-audit.md``), one line each
    key, ending with a newline."""
    doc = {"schema_version": SCHEMA_VERSION, "command": COMMAND, "exit_code": report.exit_code,
           "findings": [f.to_json() for f in report.findings],
           "hosts": [host_json(h) for h in report.hosts],
           "summary": report.summary()}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def to_markdown(report: AuditReport) -> str:
    """A Markdown report: hosts with their status, then one table of findings."""
    scope = "static rules only (--static)" if report.static_only else "static and live rules"
    summary = report.summary()
    lines = [f"# fleetctl {COMMAND}", "",
             f"{summary['findings']} finding(s) on {summary['hosts']} host(s), {scope}; "
             f"exit {report.exit_code}.", "",
             "| host | status | findings | note |", "| --- | --- | --- | --- |"]
    for h in report.hosts:
        lines.append(f"| {md_text(h.host)} | {h.status} | {len(h.findings)} | {md_text(h.error)} |")
        for path, error in h.unreadable:
            lines.append(f"| | | | unreadable: {md_text(path)}: {md_text(error)} |")
        for k in h.skipped:
            lines.append(f"| | | | skipped: {md_text(k.describe())} |")
    if report.findings:
        lines += ["", "## Findings", "",
                  "| severity | host | agent | capability | rule | finding | where |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for f in report.findings:
            lines.append(f"| {f.severity} | {md_text(f.host)} | {md_text(f.agent)} | "
                         f"{md_text(f.capability)} | `{f.rule}` | {md_text(f.message)} | "
                         f"{md_text(f.path or f.where)} |")
    return "\n".join(lines) + "\n"


def print_text(console: Console, report: AuditReport) -> None:
    """One block per finding (a head line: severity, rule, host, agent, capability; the finding
    wrapped at spaces; where: the inventory key or the path on the host, whole on its line),
    then one line per host. Readable at any width (80 columns, a pipe): nothing is folded
    inside a name, a path or a digest."""
    width = prose_width(console)
    if report.findings:
        console.print(Text(f"fleetctl creds audit: {len(report.findings)} finding(s)",
                           style="italic"), soft_wrap=True)
    for f in report.findings:
        about = [show_name(f.host)] + ([f"agent {show_name(f.agent)}"] if f.agent else []) + (
            [f"capability {show_name(f.capability)}"] if f.capability else [])
        head = Text()
        head.append(f.severity, style=_SEVERITY_STYLE.get(f.severity, ""))
        head.append(f" {f.rule}: {', '.join(about)}")
        console.print()
        console.print(head, soft_wrap=True)
        for line in wrap_words(printable(f.message), width, "  "):
            console.print(Text(line), soft_wrap=True)
        where = show_name(f.path) if f.path else printable(f.where or "")
        if where:
            console.print(Text(f"  {'on the host' if f.path else 'at'}: {where}",
                               style="dim"), soft_wrap=True)
    if report.findings:
        console.print()
    for h in report.hosts:
        scope = "" if h.scanned else (" (static only)" if report.static_only else
                                      " (not scanned)")
        line = f"{h.host}: {h.status}, {len(h.findings)} finding(s){scope}"
        if h.error:
            line += f": {h.error}"
        for text in wrap_words(printable(line), width, "", "    "):
            console.print(Text(text, style=_STATUS_STYLE.get(h.status, "")), soft_wrap=True)
        for path, error in h.unreadable:
            console.print(Text(f"  unreadable: {show_name(path)}: {printable(error)}",
                               style="red"), soft_wrap=True)
        for k in h.skipped:
            for text in wrap_words(f"skipped: {printable(k.describe())}", width, "  ", "    "):
                console.print(Text(text, style="yellow"), soft_wrap=True)
        if h.hint and h.status in ("error", "incomplete"):
            for text in wrap_words(f"hint: {printable(h.hint)}", width, "  ", "    "):
                console.print(Text(text, style="dim"), soft_wrap=True)
