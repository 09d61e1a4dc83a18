"""What the CLIs record for the runner: each reply sent, each permission refused.

The runner cannot take an agent's word for anything, so the CLIs leave evidence in the agent's
state directory, in files whose paths the runner passes in the environment:

``FLEET_SENDS_LOG`` (``<state>/sends.jsonl``)
    the reply CLI appends one line per message it put in the outbox:
    ``{"time", "task", "run", "channel", "message_id", "outbox_file"}``.
    The anti-silence gate passes when the task has at least one send.
``FLEET_DENIALS_LOG`` (``<state>/denials.jsonl``)
    a CLI whose request was refused (HTTP 401/403, ``EACCES``/``EPERM``, a policy refusal)
    appends ``{"time", "task", "run", "cli", "what", "detail"}`` and exits with status 77
    (``EX_NOPERM`` in sysexits.h). The runner watches this file while the agent runs and stops
    the run at once when a line for the current run appears.

The agent command itself exiting with status 77 is the same signal (for agents that are scripts
and see the refusal themselves). Other exit statuses and messages are not read as a denial: a
recognised phrase such as "permission denied" in free text is too easy to print by accident.

Lines are matched to the current task by ``task`` and to the current attempt by ``run``
(``FLEET_RUN_ID``). Both files are append-only; the runner never rewrites them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleet_runner.records import read_jsonl

DENIED_EXIT_STATUS = 77
"""The exit status that means "permission refused" (sysexits ``EX_NOPERM``)."""


def sends_for_task(sends_log: Path, task: str) -> list[dict[str, Any]]:
    """Every recorded send for ``task``, in order."""
    return [r for r in read_jsonl(sends_log) if r.get("task") == task]


def denials_for_run(denials_log: Path, run: str) -> list[dict[str, Any]]:
    """Every recorded denial for run ``run``, in order."""
    return [r for r in read_jsonl(denials_log) if r.get("run") == run]


class DenialWatch:
    """Polls the denials log for new lines of one run (cheap: one ``stat`` when nothing new)."""

    def __init__(self, denials_log: Path, run: str) -> None:
        self.path = Path(denials_log)
        self.run = run
        self._size = self._current_size()

    def _current_size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def __call__(self) -> str | None:
        """``"denied"`` once a denial for the run has been recorded, else ``None``."""
        size = self._current_size()
        if size == self._size:
            return None
        self._size = size
        return "denied" if denials_for_run(self.path, self.run) else None
