"""Op ``status``: the release in use and each agent's runner records; read only."""

import errno
import json
import os
import re
import shlex

from fleetctl.host.state import (
    FOREIGN_ENTRY,
    classify_releases,
    read_identity,
    record_meta,
    ship_story,
)
from fleetctl.host.wire import dec, enc, os_error_text
from fleetctl.protocol import AGENT_STATUS, RELEASE, STATUS_END

STATUS_TURNS = 200  # the last turns of a ledger whose prefix totals ``status`` sends


STATUS_ESCALATIONS = 20  # escalations described per agent (all are counted)


def _read_json_file(path):
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _agent_status(root, agent):
    """One agent's runner records, read only: its last task, escalations waiting, ledger,
    standing denials."""
    state = os.path.join(root, b"state", enc(agent))
    out = {"t": AGENT_STATUS, "agent": agent, "state_exists": os.path.isdir(state),
           "last_task": None, "escalations": 0, "escalation_list": [], "turns": 0,
           "prefix_totals": [], "errors": [],
           # The parts that could not be read (runs, notify, ledger, standing-denials): the
           # client then says "not read", never "no task" or "no escalation waiting".
           "unread": []}
    if not out["state_exists"]:
        return out
    runs = os.path.join(state, b"runs")
    try:
        tasks = []
        for name in os.listdir(runs):
            full = os.path.join(runs, name)
            if name.startswith(b".") or not os.path.isdir(full):
                continue
            stamps = [os.lstat(full).st_mtime]
            for leaf in (b"result.json", b"progress.json"):
                try:
                    stamps.append(os.lstat(os.path.join(full, leaf)).st_mtime)
                except OSError:
                    pass
            tasks.append((max(stamps), name))
        if tasks:
            _, name = max(tasks)
            task_dir = os.path.join(runs, name)
            attempts = []
            for leaf in os.listdir(task_dir):
                m = re.fullmatch(rb"attempt-(\d+)\.json", leaf)
                if m:
                    attempts.append(int(m.group(1)))
            last = _read_json_file(os.path.join(task_dir, b"attempt-%d.json" % max(attempts))) \
                if attempts else None
            result = _read_json_file(os.path.join(task_dir, b"result.json"))
            # The directory is the id's encoded form (a ":" would split the agent's PATH):
            # the id itself is in the records.
            named = [d["task"] for d in (result, last)
                     if isinstance(d, dict) and isinstance(d.get("task"), str)]
            out["last_task"] = {
                "task": named[0] if named else dec(name), "result": result,
                "attempts_recorded": len(attempts),
                "last_verdict": (last or {}).get("verdict"),
                "last_started": (last or {}).get("started"),
                "last_finished": (last or {}).get("finished")}
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append(f"{dec(runs)}: {os_error_text(exc)}")
            out["unread"].append("runs")
    spool = os.path.join(state, b"notify")
    try:
        names = sorted(n for n in os.listdir(spool)
                       if n.endswith(b".json") and not n.startswith(b"."))
        out["escalations"] = len(names)
        for n in names[:STATUS_ESCALATIONS]:
            e = _read_json_file(os.path.join(spool, n)) or {}
            out["escalation_list"].append({
                k: e.get(k) for k in ("task", "kind", "time", "reason", "via")})
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append(f"{dec(spool)}: {os_error_text(exc)}")
            out["unread"].append("notify")
    ledger = os.path.join(state, b"ledger.jsonl")
    totals = []
    try:
        with open(ledger, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break
                try:
                    record = json.loads(raw.decode("utf-8", "replace"))
                    total = sum(record["prefix_tokens"].values())
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                totals.append(total)
                if len(totals) > STATUS_TURNS * 4:
                    out["turns"] += len(totals) - STATUS_TURNS
                    totals = totals[-STATUS_TURNS:]
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append(f"{dec(ledger)}: {os_error_text(exc)}")
            out["unread"].append("ledger")
    out["turns"] += len(totals)
    out["prefix_totals"] = totals[-STATUS_TURNS:]
    out["standing_denials"] = _standing_denials(root, state, agent, out["errors"],
                                                out["unread"])
    return out


def _standing_denials(root, state, agent, errors, unread):
    """The runner's standing denials (``STATE/standing-denials/*.json``, written by
    blueprint/runner/fleet_runner/standing.py), oldest first, each with the command that
    clears it on this host; a directory that cannot be read is added to ``errors`` and
    ``unread``."""
    folder = os.path.join(state, b"standing-denials")
    try:
        names = sorted(n for n in os.listdir(folder)
                       if n.endswith(b".json") and not n.startswith(b"."))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            errors.append(f"{dec(folder)}: {os_error_text(exc)}")
            unread.append("standing-denials")
        return []
    runner = os.path.join(root, b"current", b"runner", b"bin", b"fleet-runner")
    found = []
    for name in names:
        path = os.path.join(folder, name)
        d = _read_json_file(path)
        if d is None:  # still a standing denial (the runner holds tasks on the file's name)
            errors.append(f"{dec(path)}: not a readable standing denial (JSON object)")
            d = {"what": "(unreadable file)"}
        permission = d.get("permission")
        if not isinstance(permission, str) or not permission:
            permission = dec(name[:-5])
        found.append({"permission": permission, "since": d.get("time"), "task": d.get("task"),
                      "run": d.get("run"), "what": d.get("what"),
                      "clear": " ".join(shlex.quote(a) for a in (
                          dec(runner), "--agent", agent, "--root", dec(root),
                          "--clear-denial", permission))})
    return sorted(found, key=lambda d: str(d["since"] or ""))


def read_status(emit, root, request):
    """Op ``status``: the release in use and its provenance, the entries of ``releases/``
    fleetctl did not make (``foreign``: ``{"name", "reason"}`` each) and what the history and
    the lock say of the last ships (``ship_in_progress``, ``failed``, ``interrupted``:
    :func:`~fleetctl.host.state.ship_story`), then for each named agent its runner's records
    (last task, escalations in the notify spool, the ledger's last prefix totals, standing
    denials); read only."""
    current = None
    try:
        target = os.readlink(os.path.join(root, b"current"))
        head, name = os.path.split(target.rstrip(b"/"))
        if head == b"releases":
            current = name
    except OSError:
        pass
    event = {"t": RELEASE, "root_exists": os.path.isdir(root),
             "current": dec(current) if current else None,
             "meta": record_meta(root, current) if current else {},
             "identity": read_identity(root),
             # What needs a person besides the agents: entries of releases/ fleetctl did not
             # make, a last ship that failed or was killed, a ship under way.
             "foreign": [{"name": e["id"], "reason": e["reason"]}
                         for e in classify_releases(root, dec(current) if current else None)
                         if e["kind"] == FOREIGN_ENTRY]}
    event.update(ship_story(root, dec(current) if current else None))
    emit(event)
    for agent in request.get("agents", []):
        if not agent or "/" in agent or agent in (".", ".."):
            continue
        emit(_agent_status(root, agent))
    emit({"t": STATUS_END})
    return 0

