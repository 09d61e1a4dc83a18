"""``fleetctl status`` for people (plain lines) and for machines (one JSON document)."""

from __future__ import annotations

import json
from typing import Any

from fleetctl.names import printable, show_name
from fleetctl.status import SCHEMA_VERSION, FleetStatus, HostStatus


def to_json(report: FleetStatus) -> str:
    """``{"schema_version", "command": "status", "exit_code", "hosts": [...]}``."""
    return json.dumps({"schema_version": SCHEMA_VERSION, "command": "status",
                       "exit_code": report.exit_code,
                       "hosts": [h.to_json() for h in report.hosts]},
                      indent=2, ensure_ascii=False) + "\n"


def _n(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def host_story_lines(h: HostStatus) -> list[str]:
    """What needs a person on the host itself, marked ``!``: a ship in progress, a last ship
    that failed or was killed before its switch (its release id whole on a line of its own,
    then when, step, who, commit and the error), the entries of ``releases/`` fleetctl did
    not make. Each head line fits 80 columns."""
    from fleetctl.cli.releases import failure_detail

    lines = []
    if h.ship_in_progress:
        lines.append(f"! a ship is in progress ({printable(h.ship_in_progress)}): what is "
                     "shown may be about to change")
    if h.failed_ship is not None:
        lines.append("! the last ship failed and never became a release; the one in use "
                     "stayed:")
        lines += [f"    {h.failed_ship.release or '(no id)'}", *failure_detail(h.failed_ship)]
    for e in h.interrupted:
        lines.append("! a ship was killed before its switch; the next ship clears what it "
                     "left:")
        lines += [f"    {e.release or '(no id)'}", *failure_detail(e)]
    if h.foreign:
        lines.append("! entries in releases/ fleetctl did not make (never counted or "
                     "removed):")
        lines += [f"    {show_name(f.name)}: {printable(f.reason or 'not made by fleetctl')}"
                  for f in h.foreign]
    lines += [f"? unreadable: {printable(e)} (whether the last ship failed is not known)"
              for e in h.errors]
    return lines


def to_text(report: FleetStatus) -> str:
    """Plain lines: one per host, one per agent under it; not padded to a width."""
    lines = []
    for h in report.hosts:
        if h.status == "error":
            lines.append(f"{show_name(h.host)}: ERROR: {printable(h.error or '')}")
            if h.agents:
                lines.append("  not read: " + ", ".join(show_name(a.agent) for a in h.agents)
                             + " (their tasks, escalations and turns are not known)")
            continue
        commit = (h.commit or "-")[:12]
        lines.append(f"{show_name(h.host)}: release {h.release or 'none'}, commit {commit}"
                     + (f", shipped {h.shipped_at} by {show_name(h.shipped_by)}"
                        if h.shipped_at and h.shipped_by else ""))
        lines += host_story_lines(h)
        for a in h.agents:
            if not a.known("runs"):
                task = "last task not read"
            elif a.last_task is None:
                task = "no task yet"
            else:
                task = (f"last task {show_name(a.last_task)}: {a.outcome}"
                        + (f" (last attempt {a.verdict})" if a.verdict else "")
                        + f", {a.retries} retr{'y' if a.retries == 1 else 'ies'}")
            esc = ("escalations not read" if not a.known("notify") else
                   f"{a.escalations} escalation(s) waiting" if a.escalations else
                   "no escalation waiting")
            tokens = ("ledger not read" if not a.known("ledger") else
                      f"prefix tokens/turn median {_n(a.prefix_median)}, last "
                      f"{_n(a.prefix_last)} ({a.turns} turn(s))" if a.turns else "no turns yet")
            if not a.known("standing-denials"):
                tokens += "; standing denials not read"
            mark = "! " if a.attention else ("? " if a.unread or not a.read else "  ")
            lines.append(f"{mark}{show_name(a.agent)} ({a.role}): {task}; {esc}; {tokens}")
            for e in a.escalation_list[:3]:
                lines.append(f"    escalation {e.get('kind')}: task {show_name(str(e.get('task')))}"
                             f": {printable(str(e.get('reason') or ''))[:160]}")
            for d in a.standing_denials:
                task = show_name(str(d.get("task") or "?"))
                lines.append(f"    standing denial {printable(str(d.get('permission')))} since "
                             f"{d.get('since') or '?'} (task {task}): "
                             f"no new task starts; clear it with: {printable(str(d.get('clear')))}")
            for error in a.errors:
                lines.append(f"    unreadable: {printable(error)}")
    return "\n".join(lines) + ("\n" if lines else "")
