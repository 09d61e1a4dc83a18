"""Telling a person: escalation through the notify CLI, never a silent drop.

The runner runs ``<release>/skills/notify/bin/notify`` (the same CLI agents use) with the
notify spool in ``FLEET_NOTIFY_SPOOL``. When the CLI is not in the release (no role on the host
uses the notify skill) or fails, the runner writes the same message into the spool itself
(``"via": "runner-fallback"``), and if even that fails it says so on stderr (the journal).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet_runner.names import one_line

NOTIFY_TIMEOUT_S = 30.0
"""Seconds the notify CLI may take."""
DETAIL_MAX_CHARS = 8000
"""The end of the raw failure output kept in an escalation, in characters."""


def escalate(*, release: Path, spool: Path, env: Mapping[str, str], agent: str, task: str,
             kind: str, failures: int, reason: str, detail: str) -> dict[str, Any]:
    """Send one escalation; return ``{"via", "id", "error"}`` for the task's records.

    Args:
        release: the release directory (where ``skills/notify/bin/notify`` is looked for).
        spool: the notify spool directory.
        env: base environment for the CLI.
        agent: the agent's name.
        task: the task id.
        kind: ``"gave-up"``, ``"denied"``, ``"invalid"``, ``"duplicate"`` (a person's message
            reusing an id that already finished), ``"refused"`` (the repository sync found a
            person's uncommitted changes or could not run) or ``"sync-conflict"``.
        failures: how many verifications failed.
        reason: one paragraph: what gave up and why.
        detail: the last failure's raw output.
    """
    cli = Path(release) / "skills" / "notify" / "bin" / "notify"
    detail = detail if len(detail) <= DETAIL_MAX_CHARS else detail[-DETAIL_MAX_CHARS:]
    # OPTION=VALUE: a value that starts with "-" (a check's "--> path", a person's text) is
    # never taken for an option.
    args = [f"--task={task}", f"--agent={agent}", f"--kind={kind}", f"--failures={failures}",
            f"--reason={reason}", f"--detail={detail}"]
    error = None
    if os.path.isfile(cli):
        try:
            # Run it directly when executable, else with this interpreter (the notify CLI is
            # Python): a missing mode bit must not stop an escalation.
            argv = [os.fspath(cli)] if os.access(cli, os.X_OK) else [sys.executable, os.fspath(cli)]
            done = subprocess.run([*argv, *args], capture_output=True,
                                  env={**env, "FLEET_NOTIFY_SPOOL": os.fspath(spool)},
                                  timeout=NOTIFY_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if done.returncode == 0:
                return {"via": "notify-cli", "id": done.stdout.decode().strip(), "error": None}
            stderr = done.stderr.decode(errors="replace")[-500:]
            error = f"notify exited {done.returncode}: {stderr}"
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            # ValueError: an argument no argv can carry (a NUL in a message's text): the
            # runner writes the same message into the spool itself, below.
            error = f"notify failed: {exc}"
    else:
        error = f"{cli}: not in this release"
    message = {"id": str(uuid.uuid4()), "task": task, "agent": agent, "kind": kind,
               "failures": failures, "reason": reason, "detail": detail, "time": time.time(),
               "via": "runner-fallback"}
    try:
        os.makedirs(spool, exist_ok=True)
        tmp = Path(spool) / f".{message['id']}"
        tmp.write_text(json.dumps(message), "utf-8")
        os.rename(tmp, Path(spool) / f"{message['id']}.json")
    except OSError as exc:
        print("fleet-runner: " + one_line(f"ESCALATION NOT DELIVERED for task {task} ({kind}): "
                                          f"{reason} [{error}; spool: {exc}]"),
              file=sys.stderr, flush=True)  # one line: the reason lists every attempt
        return {"via": None, "id": None, "error": f"{error}; spool: {exc}"}
    return {"via": "runner-fallback", "id": message["id"], "error": error}
