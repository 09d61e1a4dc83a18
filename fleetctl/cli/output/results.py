"""Rendering host results as JSON, Markdown or a rich table, all from the same records.

The JSON document (``schema_version`` 1) is described in ``docs/json.md``. Paths are relative to
the managed tree; a name that is not valid UTF-8 is escaped (:mod:`fleetctl.names`) and carries
``"path_escaped": true``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleetctl.cli.output.markdown import md_code, md_text
from fleetctl.cli.output.text import TABLE_PADDING, path_column_width, wrap_path
from fleetctl.credentials import is_credential_path
from fleetctl.diffs import FileDiff
from fleetctl.drift import Change
from fleetctl.manifest import Entry
from fleetctl.names import escape_name, printable, safe_text, show_name
from fleetctl.records import change_json
from fleetctl.results import HostResult
from fleetctl.source import SourceState

SCHEMA_VERSION = 1


def result_json(result: HostResult, command: str) -> dict[str, Any]:
    """One host's record."""
    record: dict[str, Any] = {
        "host": result.host,
        "status": result.status,
        "exit_code": result.exit_code,
        "error": safe_text(result.error) if result.error else None,
        "hint": safe_text(result.hint) if result.hint else None,
        "release": result.release,
        "commit": result.commit,
        "identity": result.identity,
        "ancestry": result.ancestry.to_json() if result.ancestry else None,
        "ship_in_progress": result.in_progress,
    }
    if command == "ship":
        record.update({"previous": result.previous, "step": result.step,
                       "pruned": result.pruned, "sent_files": result.sent_files,
                       "sent_bytes": result.sent_bytes,
                       "services": result.services.to_json() if result.services else None})
    record["warnings"] = [safe_text(w) for w in result.warnings]
    record["accounts"] = [safe_text(a) for a in result.accounts]
    record["unchecked_grants"] = [{k: safe_text(v) if isinstance(v, str) else v
                                   for k, v in u.to_json().items()} for u in result.unchecked]
    record["unreadable"] = []
    for u in result.unreadable:
        path, escaped = escape_name(u.path)
        record["unreadable"].append({"path": path, **({"path_escaped": True} if escaped else {}),
                                     "error": u.error})
    record["changes"] = [change_json(c) for c in result.changes]
    if result.diffs is not None:
        record["diffs"] = [_diff_json(d) for d in result.diffs]
    return record


def _diff_json(diff: FileDiff) -> dict[str, Any]:
    data = diff.to_json()
    data["path"], escaped = escape_name(diff.path)
    if escaped:
        data["path_escaped"] = True
    return data


def to_json(results: list[HostResult], command: str, exit_code: int,
            source: SourceState | None = None) -> str:
    """The whole machine-readable document for ``command`` (``drift`` or ``ship``)."""
    doc = {"schema_version": SCHEMA_VERSION, "command": command, "exit_code": exit_code,
           "source": source.to_json() if source is not None else None,
           "hosts": [result_json(r, command) for r in results]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _attr_summary(change: Change, entry: Entry | None) -> str:
    if entry is None:
        return "-"
    kind = change.change
    if kind in ("content",):
        if is_credential_path(entry.path):
            return f"{(entry.digest or '')[7:19]} (secret)"
        return f"{(entry.digest or '')[7:19]} ({entry.size} B)"
    if kind == "mode":
        return entry.mode or "-"
    if kind == "owner":
        return entry.owner or "-"
    if kind == "target":
        return "→ " + show_name(entry.target or "")
    if entry.type == "file":  # no digest: a credential file whose secret was not available
        return f"file {entry.mode} {entry.digest[7:19] if entry.digest else '(unchecked)'}"
    if entry.type == "symlink":
        return "symlink → " + show_name(entry.target or "")
    return f"{entry.type} {entry.mode or ''}".strip()


_ORIGIN_STYLE = {"pending": "cyan", "hand-patch": "yellow", "conflict": "red", "unknown": "magenta"}
_STATUS_STYLE = {"in-sync": "green", "drift": "yellow", "shipped": "green", "no-op": "green",
                 "dry-run": "cyan", "refused": "red", "declined": "yellow", "error": "red",
                 "incomplete": "red"}


def services_text(result: HostResult) -> str:
    """``; units: installed ...; restarted ...`` for a systemd host, else ``""``."""
    s = result.services
    if s is None:
        return ""
    verbs = (("install", "installed", s.installed), ("remove", "removed", s.removed),
             ("restart", "restarted", s.restarted), ("start", "started", s.started))
    parts = [f"{'would ' + verb if result.dry_run else done} {', '.join(names)}"
             for verb, done, names in verbs if names]
    return "; units: " + ("; ".join(parts) if parts else "none wanted")


def source_line(source: SourceState) -> str:
    """``source: commit abc123 (clean)`` or what makes it dirty, for people."""
    if source.clean:
        return f"source: commit {source.short} (clean)"
    listed = "; ".join(source.dirty[:5]) + (f"; and {len(source.dirty) - 5} more"
                                            if len(source.dirty) > 5 else "")
    return f"source: commit {source.short}, NOT CLEAN: {listed}"


def _commit_note(result: HostResult) -> str:
    return f", commit {result.commit[:12]}" if result.commit else ""


def summary_line(result: HostResult) -> str:
    """A plain-text summary of a host's result: one line, and for an error about several
    things one more line for each."""
    n = len(result.changes)
    if result.status == "in-sync":
        return f"{result.host}: in sync (release {result.release or 'none'}{_commit_note(result)})"
    if result.status == "drift":
        origins = sorted({c.origin for c in result.changes})
        missing = sum("(ship creates it)" in line for line in result.accounts)
        stops = len(result.accounts) - missing
        accounts = (f", {missing} account(s) missing" if missing else "") + (
            f", {stops} account problem(s) a ship stops on" if stops else "")
        stale = "; stale checkout" if result.ancestry and result.ancestry.stale else ""
        return (f"{result.host}: {n} change(s) ({', '.join(origins) or 'none'}){accounts}"
                f"{stale} (release {result.release or 'none'}{_commit_note(result)})")
    units = services_text(result)
    if result.status == "shipped":
        return (f"{result.host}: shipped release {result.release} ({n} change(s); sent "
                f"{result.sent_files} file(s), {result.sent_bytes} bytes; the rest copied on the "
                f"host; pruned {len(result.pruned)}){units}")
    if result.status == "no-op":
        return (f"{result.host}: nothing to ship; release {result.release} already "
                f"matches{units}")
    if result.status == "dry-run":
        return (f"{result.host}: dry run: would apply {n} change(s) as a new release, sending "
                f"{result.sent_files} file(s), {result.sent_bytes} bytes{units}; nothing written")
    where = f" [stopped at {result.step}]" if result.step else ""
    error = result.error or ""
    if error.startswith(result.host + ": "):
        error = error[len(result.host) + 2:]
    # An error about several things (every missing secret, every path refused) carries one
    # per line after its first: each line is escaped on its own and indented under the host.
    head, *more = error.split("\n")
    return f"{result.host}: {result.status}{where}: {printable(head)}{units}" + "".join(
        f"\n  {printable(line.strip())}" for line in more)


FIRST_SHIP_LISTED = 10
"""A first ship (or its plan) of more paths than this is summarised per top directory unless
all paths are asked for (``ship --all-paths``)."""
_QUIET_OK = ("in-sync", "shipped", "no-op", "dry-run")


def _first_ship(result: HostResult) -> bool:
    """Whether ``result`` is a host's first ship or its plan (no release before it)."""
    if result.status == "shipped":
        return result.previous is None
    return result.status in ("dry-run", "refused", "declined") and result.release is None \
        and bool(result.changes) and all(c.origin == "unknown" or c.change == "missing"
                                         for c in result.changes)


def first_ship_line(result: HostResult) -> str:
    """``HOST: first ship: N path(s): runner/ (n), skills/ (n); --all-paths lists them``."""
    tops: dict[str, int] = {}
    for c in result.changes:
        top = c.path.split("/", 1)[0] + "/"
        tops[top] = tops.get(top, 0) + 1
    listed = ", ".join(f"{show_name(t)} ({n})" for t, n in sorted(tops.items()))
    return (f"{result.host}: first ship: {len(result.changes)} path(s): {listed}; "
            "--all-paths lists them")


def print_text(console: Console, results: list[HostResult], title: str,
               source: SourceState | None = None, quiet: bool = False,
               all_paths: bool = True) -> None:
    """Draw a table of changes per host, then one summary line per host.

    The path column is as wide as the console allows and paths wrap after a ``/``, never inside
    a name. With ``quiet``, only hosts with a problem (not in sync, refused, failed) are shown,
    and the source only when it is not clean. Without ``all_paths``, a first ship of more than
    :data:`FIRST_SHIP_LISTED` paths is one line per host instead of a table.
    """
    if quiet:
        results = [r for r in results if r.status not in _QUIET_OK]
    if source is not None and not (quiet and source.clean):
        console.print(Text(printable(source_line(source)),
                           style="" if source.clean else "yellow"), soft_wrap=True)
    for result in results:
        if result.changes and not all_paths and _first_ship(result) \
                and len(result.changes) > FIRST_SHIP_LISTED:
            console.print(Text(first_ship_line(result)), soft_wrap=True)
        elif result.changes:
            table = Table(title=f"{title}: {result.host}", box=box.SIMPLE_HEAD,
                          title_justify="left")
            paths = [show_name(c.path) for c in result.changes]
            width = path_column_width(paths, console.width)
            table.add_column("path", min_width=width, max_width=width, overflow="fold")
            change_w = max([6] + [len(c.change) for c in result.changes])
            origin_w = max([6] + [len(c.origin) for c in result.changes])
            # What is left goes to live and desired, which wrap at their spaces.
            side_w = max(12, (console.width - width - change_w - origin_w - TABLE_PADDING) // 2)
            table.add_column("change", min_width=change_w, overflow="fold")
            table.add_column("origin", min_width=origin_w, overflow="fold")
            for column in ("live", "desired"):
                table.add_column(column, max_width=side_w, overflow="fold")
            for c, path in zip(result.changes, paths, strict=True):
                table.add_row(Text(wrap_path(path, width)), c.change,
                              Text(c.origin, style=_ORIGIN_STYLE.get(c.origin, "")),
                              Text(_attr_summary(c, c.live)), Text(_attr_summary(c, c.desired)))
            console.print(table)
        for u in result.unreadable:
            console.print(Text(f"{result.host}: unreadable: {show_name(u.path)}: "
                               f"{printable(u.error)}", style="red"))
        for diff in result.diffs or ():
            for line in diff_text(result.host, diff):
                console.print(Text(line, style=_DIFF_STYLE.get(line[:1], "")), soft_wrap=True)
    for result in results:
        summary = Text(summary_line(result), style=_STATUS_STYLE.get(result.status, ""))
        console.print(summary, soft_wrap=True)
        for account in result.accounts:
            console.print(Text(f"  account: {printable(account)}"), soft_wrap=True)
        for g in result.unchecked:
            console.print(Text(f"  unchecked: {printable(g.describe())}; its files were compared "
                               "with the shipped record only", style="yellow"), soft_wrap=True)
        for warning in result.warnings:
            console.print(Text(f"  warning: {printable(warning)}", style="yellow"), soft_wrap=True)
        if result.hint and result.status not in ("in-sync", "shipped", "no-op"):
            console.print(Text(f"  hint: {printable(result.hint)}", style="dim"), soft_wrap=True)


_DIFF_STYLE = {"+": "green", "-": "red", "@": "cyan", "~": "yellow", "#": "bold"}


def diff_text(host: str, diff: FileDiff) -> list[str]:
    """The lines that show one file's diff to people (every line already escaped): a ``#``
    header, its note, the key-level changes, then the unified diff. The diff comes last, so it
    can be cut from ``--- `` to the next ``#`` line and applied after
    :func:`fleetctl.names.unshow_bytes` of each line (``docs/releases.md``)."""
    lines = [f"# {host}: {show_name(diff.path)} ({diff.kind})"]
    if diff.note:
        lines.append(f"  note: {printable(diff.note)}")
    if diff.kind in ("text", "structured"):
        body = [*diff.keys, *diff.lines]
        lines += body if body or diff.note else ["  (no difference in content)"]
    else:
        lines += [f"  live:    {diff.live_digest or 'absent'}"
                  + (f" ({diff.live_size} B)" if diff.live_size is not None else ""),
                  f"  desired: {diff.desired_digest or 'absent'}"
                  + (f" ({diff.desired_size} B)" if diff.desired_size is not None else "")]
    return lines


def to_markdown(results: list[HostResult], title: str,
                source: SourceState | None = None) -> str:
    """A Markdown report: a summary table, then one table of changes per host."""
    lines = [f"# {title}", ""]
    if source is not None:
        lines += [md_text(source_line(source)), ""]
    lines += ["| host | status | changes | commit | note |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        note = printable(r.error) if r.error else (f"release {r.release}" if r.release else "")
        if r.ancestry and r.ancestry.stale:
            note += f" ({r.ancestry.describe()})"
        commit = r.commit[:12] if r.commit else "-"
        lines.append(f"| {md_text(r.host)} | {r.status} | {len(r.changes)} | {commit} | "
                     f"{md_text(note)} |")
    for r in results:
        if not r.changes and not r.unreadable:
            continue
        lines += ["", f"## {md_text(r.host)}", ""]
        if r.changes:
            lines += ["| path | change | origin | live | desired |",
                      "| --- | --- | --- | --- | --- |"]
            for c in r.changes:
                lines.append(f"| {md_code(show_name(c.path))} | {c.change} | {c.origin} | "
                             f"{md_text(_attr_summary(c, c.live))} | "
                             f"{md_text(_attr_summary(c, c.desired))} |")
        for u in r.unreadable:
            lines.append(f"- unreadable: {md_code(show_name(u.path))}: {md_text(u.error)}")
    for r in results:
        for a in r.accounts:
            lines.append(f"- {md_text(r.host)}: account: {md_text(a)}")
    for r in results:
        for diff in r.diffs or ():
            body = diff_text(r.host, diff)
            fence = "`" * max(3, 1 + max((len(run) for line in body
                                          for run in re.findall(r"`+", line)), default=0))
            lines += ["", f"{fence}diff", *body, fence]
    return "\n".join(lines) + "\n"
