"""Asking for more write scope: the request file an agent writes, and the rules that decide it.

A role with ``writes`` limits what a run may change. The task prompt states that scope and how
to ask for more: the agent writes a JSON file at ``$FLEET_SCOPE_REQUEST``
(``STATE/runs/<task>/scope-request.json``)::

    {"paths": ["docs/api.md", "CHANGELOG.md"], "why": "the API change needs its doc"}

After the run the runner reads it (and keeps it as ``attempt-N.scope-request.json``) and
decides each path by rules, never by asking the model:

1. it must be a literal workspace path (relative, no ``..``, no wildcard), else **denied**;
2. a path the task already changed (in the work tree or in its commits) is **denied**: scope
   is asked for before the write, never after the fact;
3. it must match the role's ``scope_requests`` patterns (gitignore-style, as ``writes``; a
   path in ``.git`` only through a pattern naming ``.git``); a role without
   ``scope_requests`` grants nothing;
4. otherwise it is **granted** for the rest of the task, from the next attempt on.

Grants and denials are kept per task in ``runs/<task>/scope-grants.json``, listed in the run
record (``scope_request``) and, when the task is escalated, in the escalation.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fleet_runner.records import read_json, write_json_atomic
from fleet_runner.scope import compile_scope

REQUEST_FILE = "scope-request.json"
GRANTS_FILE = "scope-grants.json"
_GLOB = re.compile(r"[*?\[\]!#\\]")


def literal_pattern(path: str) -> str:
    """A ``writes`` pattern matching exactly the workspace path ``path`` (anchored, every
    wildcard character escaped)."""
    return "/" + re.sub(r"([*?\[\]!#\\ ])", r"\\\1", path)


def grants(task_dir: Path) -> dict[str, Any]:
    """The task's decisions so far: ``{"granted": [path...], "denied": [{"path", "why",
    "attempt"}...]}`` (empty lists when none)."""
    try:
        value = read_json(Path(task_dir) / GRANTS_FILE)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        value = {}
    return {"granted": list(value.get("granted") or []),
            "denied": list(value.get("denied") or [])}


def decide(task_dir: Path, attempt: int, changed: Iterable[str],
           requestable: Sequence[str] | None, request: Path | None = None
           ) -> dict[str, Any] | None:
    """Read and decide the request file left by attempt ``attempt``, if any.

    Args:
        task_dir: ``runs/<task>``.
        attempt: the attempt that wrote it.
        changed: every path the task changed so far (work tree and commits).
        requestable: the role's ``scope_requests`` patterns, or ``None`` (nothing can be
            granted).
        request: the request file (default ``task_dir/scope-request.json``; with two users it
            is in the agent's directory).

    Returns:
        ``None`` when there was no request; else ``{"paths", "why", "granted", "denied"}``
        (``denied``: ``{"path", "why"}`` each), also added to the task's grants file.
    """
    source = Path(request) if request is not None else Path(task_dir) / REQUEST_FILE
    if not os.path.lexists(source):
        return None
    kept = Path(task_dir) / f"attempt-{attempt}.{REQUEST_FILE}"
    try:
        os.replace(source, kept)
        data = json.loads(kept.read_text("utf-8")) if kept.is_file() and not kept.is_symlink() \
            else None
    except (OSError, ValueError):
        data = None
    paths = data.get("paths") if isinstance(data, dict) else None
    why = data.get("why") if isinstance(data, dict) else None
    why = why if isinstance(why, str) else ""
    decision: dict[str, Any] = {"paths": [], "why": why[:500], "granted": [], "denied": []}
    if not (isinstance(paths, list) and paths and all(isinstance(p, str) for p in paths)):
        decision["denied"].append({"path": None, "why": f"{REQUEST_FILE} is not JSON of the "
                                   'shape {"paths": ["a/b.txt", ...], "why": "..."}'})
    else:
        done = set(changed)
        scope = compile_scope(list(requestable or []))
        for raw in paths[:100]:
            path = raw.strip()
            decision["paths"].append(path)
            parts = path.split("/")
            if not path or path.startswith("/") or ".." in parts or "" in parts \
                    or "." in parts or _GLOB.search(path):
                reason = "not a literal path relative to the workspace (no wildcard, no ..)"
            elif path in done:
                reason = ("this task already changed it: scope is asked for before a write, "
                          "never after the fact")
            elif requestable is None:
                reason = "this role grants no scope on request (no scope_requests)"
            elif not scope.allows(path):
                reason = "not among the paths this role lets an agent ask for (scope_requests)"
            else:
                decision["granted"].append(path)
                continue
            decision["denied"].append({"path": path, "why": reason})
    so_far = grants(task_dir)
    so_far["granted"] = sorted(set(so_far["granted"]) | set(decision["granted"]))
    so_far["denied"] += [{**d, "attempt": attempt} for d in decision["denied"]]
    write_json_atomic(Path(task_dir) / GRANTS_FILE, so_far)
    return decision
