"""The task sentinel: how far a task got, so a restarted runner resumes it exactly once.

``runs/<task>/progress.json`` is rewritten atomically at every step::

    {
      "schema_version": 1,
      "task": "m-17",
      "message_file": "m-17.json",         the file in processing/
      "attempts": [
        {"attempt": 1, "run": "m-17/1", "state": "finished", "verdict": "fail", ...},
        {"attempt": 2, "run": "m-17/2", "state": "running", "pid": 4242,
         "proc_start": 991823, "prefix_tokens": {...}, "task_prompt_tokens": 310}
      ],
      "sync": null,                        the repository sync's result (reposync.py)
      "sync_deferred": [],                 each sync put off by a failed fetch
      "final": null
    }

- An attempt is ``"running"`` from just before the agent starts (``pid`` and ``proc_start``
  are added as soon as it runs) until its run record is written, then ``"finished"`` with its
  verdict. A restarted runner finding a ``"running"`` attempt kills what is left of that
  process group, marks the attempt ``"interrupted"`` with ``"interrupted_by": "runner-died"``
  (it counts against ``max_retries``, not as a failed verification) and goes on with the next
  attempt, told that the workspace may hold the interrupted work. An attempt a stop request
  ended is marked by the stopping runner itself, ``"interrupted_by": "runner-stop"``.
- ``final`` is set once the task's outcome is decided (``{"outcome": "pass"|"gave-up"|
  "denied", ...}``), before escalating and before the message leaves ``processing/``. A runner
  finding ``final`` set never runs the agent again: it only completes what is missing
  (the escalation, if ``"escalated"`` is not yet true, then the move).

So a message is never lost (it stays in ``processing/`` until its outcome is recorded) and
never run to completion twice (``final`` is written before anything that follows it). The one
step that can repeat after a crash is an escalation interrupted between sending and recording
it: a person may be told twice, never zero times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.records import SCHEMA_VERSION, read_json, write_json_atomic

RUNNING, FINISHED, INTERRUPTED = "running", "finished", "interrupted"


@dataclass
class TaskProgress:
    """The sentinel of one task, bound to its file (mutable; :meth:`save` after each change).

    Attributes:
        path: ``runs/<task>/progress.json``.
        task: the task id.
        message_file: the message's file name in ``processing/``.
        attempts: one dict per attempt (see the module docstring).
        final: the outcome once decided, else ``None``.
        sync: the result of the working-repository sync before the first attempt
            (:meth:`fleet_runner.reposync.SyncResult.to_json`), or ``None`` (not synced: no
            ``sync`` in the config, or not yet).
        sync_deferred: one ``{"time", "summary", "detail"}`` per sync put off because the
            fetch failed (the message went back to the inbox to be tried again later).
    """

    path: Path
    task: str
    message_file: str
    attempts: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    sync: dict[str, Any] | None = None
    sync_deferred: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, task: str, message_file: str) -> TaskProgress:
        """Read the sentinel at ``path``, or start a new one (not saved yet).

        Raises:
            ValueError: the file exists but is not valid JSON.
        """
        data = read_json(path)
        if not isinstance(data, dict):
            return cls(Path(path), task, message_file)
        return cls(Path(path), task, data.get("message_file", message_file),
                   list(data.get("attempts", [])), data.get("final"), data.get("sync"),
                   list(data.get("sync_deferred") or []))

    def save(self) -> None:
        """Write the sentinel atomically."""
        write_json_atomic(self.path, {"schema_version": SCHEMA_VERSION, "task": self.task,
                                      "message_file": self.message_file,
                                      "attempts": self.attempts, "sync": self.sync,
                                      "sync_deferred": self.sync_deferred,
                                      "final": self.final})

    @property
    def running(self) -> dict[str, Any] | None:
        """The attempt left ``"running"`` (by a runner that stopped), if any."""
        if self.attempts and self.attempts[-1].get("state") == RUNNING:
            return self.attempts[-1]
        return None

    @property
    def next_attempt(self) -> int:
        """The number of the next attempt (1-based)."""
        return len(self.attempts) + 1
