"""Standing denials: a refused permission blocks the agent's next tasks until a person clears it.

When a task is stopped by a permission denial (:mod:`fleet_runner.evidence`,
:mod:`fleet_runner.agentresult`), each refused permission becomes a **standing denial**: one
JSON file in ``STATE/standing-denials/`` named for the permission (``cli:vault``,
``tool:Bash``) in its file-name form (:func:`fleet_runner.names.encode_name`: the tool name is
the agent CLI's, any string; ``tool%3ABash.json``), holding ``{"permission", "task", "run",
"what", "time", "clear"}``. While any is there, the runner starts no new task: the runner
cannot tell before a task runs which permissions it will need, and a refused permission is not
granted by trying again (a new token, a grant, a policy change is a person's job). Messages
wait in ``inbox/``; a task already in ``processing/`` is finished. A person clears a denial
once the permission is granted (or the refusal understood) with
``ROOT/current/runner/bin/fleet-runner --agent NAME --root ROOT --clear-denial PERMISSION`` (or
``all``), which removes the file; ``--list-denials`` prints them. Clearing needs no stop: the
serving runner reads the directory before it takes each message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleet_runner.names import encode_name
from fleet_runner.records import now_iso, read_json, write_json_atomic


def permission_of(denial: dict[str, Any]) -> str:
    """The permission a denial refused: its ``permission`` key when the source gave one
    (``tool:Bash``), else ``cli:NAME`` of the CLI that recorded it."""
    permission = denial.get("permission")
    if isinstance(permission, str) and permission:
        return permission
    return f"cli:{denial.get('cli') or '?'}"


def _file(directory: Path, permission: str) -> Path:
    # Reversible and never shared (the odd characters made "_" and a cut at 120 let two
    # permissions share a file, so clearing one cleared the other).
    return Path(directory) / (encode_name(permission) + ".json")


def record(directory: Path, denials: Sequence[dict[str, Any]], *, task: str, run: str,
           clear: Callable[[str], str]) -> list[str]:
    """Make each denial's permission a standing denial (the first one recorded is kept).

    Args:
        directory: ``STATE/standing-denials``.
        denials: the run's denials.
        task: the task they stopped.
        run: ``TASK/ATTEMPT``.
        clear: the command that clears the standing denial of a permission (kept in its
            file, shown in escalations).

    Returns:
        The permissions, in order, without repeats.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    out: list[str] = []
    for denial in denials:
        permission = permission_of(denial)
        if permission in out:
            continue
        out.append(permission)
        path = _file(directory, permission)
        if not path.exists():
            write_json_atomic(path, {"permission": permission, "task": task, "run": run,
                                     "what": denial.get("what"), "time": now_iso(),
                                     "clear": clear(permission)})
    return out


def standing(directory: Path) -> list[dict[str, Any]]:
    """The standing denials, oldest first (``[]`` when none or no directory)."""
    return [entry for _, entry in _standing_files(directory)]


def _standing_files(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each standing denial with the file it is in, oldest first (a file an older runner
    named its own way included)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            value = read_json(Path(directory) / name)
        except ValueError:
            value = {"permission": name[:-5], "what": "(unreadable file)"}
        if isinstance(value, dict):
            found.append((Path(directory) / name, value))
    return sorted(found, key=lambda pair: str(pair[1].get("time", "")))


def clear(directory: Path, permission: str) -> list[str]:
    """Remove the standing denial of ``permission`` (``all``: every one).

    Returns:
        The permissions cleared (``[]`` when there was no such denial).
    """
    cleared = []
    for path, entry in _standing_files(directory):
        name = str(entry.get("permission"))
        if permission in ("all", name):
            try:
                os.unlink(path)  # the file it was read from: no other denial's
                cleared.append(name)
            except FileNotFoundError:
                pass
    return cleared
