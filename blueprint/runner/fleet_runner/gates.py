"""The verify gates: deterministic checks after every run, before the run counts.

Every gate runs after every run, even when an earlier one failed, and each returns a
:class:`GateResult`; the run passes only when no gate failed. The agent's exit status and its
words are never a success signal.

``run``
    the agent command itself: fails when it could not start, timed out, was killed by a signal
    or exited non-zero (a crashed run is not a finished one). Passing it proves nothing else.
``check``
    the role's check command (``sh -c``, in the workspace, its own process group and timeout),
    diff-aware: only errors in files the task changed fail it. Rules, in order:
    the checker timed out or could not start → fail; exit 0 → pass (diagnostics in changed
    files are listed as warnings); otherwise an error diagnostic in a changed file → fail; no
    diagnostic at all, or lines the parser does not understand → fail ("unparseable"); else
    pass, the diagnostics being *existing debt* in untouched files. Paths are compared after
    normalisation (:func:`fleet_runner.checkparse.path_keys`). Skipped when no check is set.
``anti-silence``
    for a task from a human: the reply CLI must have recorded a send for the task. Skipped for
    a task from an agent.
``scope``
    the scope of the writes: every path the task changed (added, modified or removed, from the
    same snapshots as ``check``, which see a git directory's config and hooks but not its
    object store: :mod:`fleet_runner.snapshot`) and, when the workspace is a git repository,
    every path the commits made since the baseline changed
    (:func:`fleet_runner.reposync.committed_paths`), must be inside the role's ``writes``
    patterns (:mod:`fleet_runner.scope`; a path in a ``.git`` directory only through a pattern
    naming ``.git``); fails listing those outside, and when the commits cannot be read.
    Skipped when ``writes`` is unset.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.checkparse import ERROR, Diagnostic, parse_checker_output, path_keys
from fleet_runner.invoke import Invocation, run_in_group
from fleet_runner.records import head_text, tail_text
from fleet_runner.scope import compile_scope
from fleet_runner.snapshot import Changes

PASS, FAIL, SKIP = "pass", "fail", "skip"
LIST_MAX = 50
"""At most this many diagnostics of each kind are listed in a record."""
OUTPUT_MAX_BYTES = 16_000
"""Raw output kept in a gate result (and fed back to the agent), in bytes."""



def reply_command(task: str, channel: str | None) -> str:
    """The reply command line, quoted so it works pasted into a shell (``#chan`` would
    otherwise start a comment)."""
    return (f"reply --task {shlex.quote(task)} --channel {shlex.quote(str(channel))} "
            "'YOUR ANSWER'")

@dataclass(frozen=True, slots=True)
class GateResult:
    """The outcome of one gate.

    Attributes:
        name: ``"run"``, ``"check"``, ``"anti-silence"`` or ``"scope"``.
        status: ``"pass"``, ``"fail"`` or ``"skip"``.
        summary: one line saying why.
        output: the raw output behind the result (fed back to the agent on failure).
        details: structured facts for the run record.
        duration_s: seconds the gate took.
    """

    name: str
    status: str
    summary: str
    output: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether the gate failed."""
        return self.status == FAIL

    def to_json(self) -> dict[str, Any]:
        """The record form."""
        return {"name": self.name, "status": self.status, "summary": self.summary,
                "output": self.output, "details": self.details,
                "duration_s": round(self.duration_s, 3)}


def run_gate(inv: Invocation, stderr_tail_bytes: int = 4000) -> GateResult:
    """The ``run`` gate from the agent command's :class:`Invocation`."""
    ok = inv.start_error is None and inv.stopped is None and inv.signal is None \
        and inv.exit_status == 0
    output = ""
    if not ok and inv.stderr_path is not None:
        output = tail_text(inv.stderr_path, stderr_tail_bytes)
    summary = "the agent command " + inv.describe()
    return GateResult("run", PASS if ok else FAIL, summary, output, inv.to_json(), inv.duration_s)


def _listed(diags: Sequence[Diagnostic]) -> list[str]:
    return [d.render() for d in diags[:LIST_MAX]]


def classify(diagnostics: Sequence[Diagnostic], touched: Sequence[str], workspace: Path,
             cwd: Path) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """Split diagnostics into those in touched files and those elsewhere.

    Args:
        diagnostics: parsed diagnostics, paths as printed by the checker.
        touched: workspace-relative paths the task added or modified.
        workspace: the workspace directory.
        cwd: the checker's working directory (its relative paths are relative to it).
    """
    touched_keys: set[str] = set()
    for rel in touched:
        touched_keys |= path_keys(rel, os.fspath(workspace))
    inside, outside = [], []
    for diag in diagnostics:
        (inside if path_keys(diag.path, os.fspath(cwd)) & touched_keys else outside).append(diag)
    return inside, outside


def check_gate(command: str | None, workspace: Path, touched: Sequence[str], *,
               timeout_s: float, kill_grace_s: float, output_path: Path,
               env: Mapping[str, str],
               should_stop: Callable[[], str | None] | None = None) -> GateResult:
    """Run the check command over the workspace and judge it diff-aware (module docstring).

    Args:
        command: the shell command line, or ``None`` (the gate is skipped).
        workspace: where it runs.
        touched: workspace-relative paths the task added or modified.
        timeout_s: wall-clock seconds for the checker.
        kill_grace_s: seconds between SIGTERM and SIGKILL when it times out.
        output_path: file for its merged stdout and stderr.
        env: its environment.
        should_stop: polled while it runs; a reason ends it early (the result then fails with
            that reason, and the caller is expected to discard it).
    """
    if not command:
        return GateResult("check", SKIP, "no check command is configured for this role")
    inv = run_in_group(["/bin/sh", "-c", command], stdin=b"", cwd=workspace, env=env,
                       timeout_s=timeout_s, kill_grace_s=kill_grace_s, stdout_path=output_path,
                       should_stop=should_stop)
    try:
        text = Path(output_path).read_text("utf-8", "replace")
    except OSError:
        text = ""
    details: dict[str, Any] = {"command": command, "exit_status": inv.exit_status,
                               "outcome": inv.describe(), "touched_files": len(touched)}
    raw = head_text(text, OUTPUT_MAX_BYTES)

    def result(status: str, summary: str) -> GateResult:
        return GateResult("check", status, summary, raw, details, inv.duration_s)

    if inv.start_error or inv.stopped or inv.signal is not None:
        return result(FAIL, f"the check command {inv.describe()}")
    parsed = parse_checker_output(text)
    inside, outside = classify(parsed.diagnostics, touched, workspace, workspace)
    new_errors = [d for d in inside if d.severity == ERROR]
    details.update(
        new_errors=_listed(new_errors), new_error_count=len(new_errors),
        warnings=_listed([d for d in inside if d.severity != ERROR]),
        existing_debt=_listed([d for d in outside if d.severity == ERROR]),
        existing_debt_count=sum(1 for d in outside if d.severity == ERROR),
        unparsed=list(parsed.unparsed[:LIST_MAX]), unparsed_count=len(parsed.unparsed))
    if inv.exit_status == 0:
        return result(PASS, "the check command exited 0"
                      + (f" ({len(inside)} warnings in changed files)" if inside else ""))
    if new_errors:
        return result(FAIL, f"{len(new_errors)} error(s) in files this task changed: "
                      + "; ".join(_listed(new_errors)[:3]))
    if not parsed.diagnostics or parsed.unparsed:
        return result(FAIL, f"the check command exited {inv.exit_status} with output the gate "
                      f"cannot parse ({len(parsed.unparsed)} unparsed line(s)): counted as a "
                      "failure, never a pass")
    return result(PASS, f"the check command exited {inv.exit_status}, but only on existing debt: "
                  f"{details['existing_debt_count']} error(s) in files this task did not change")


def anti_silence_gate(human: bool, task: str, channel: str | None,
                      sends: Sequence[dict[str, Any]]) -> GateResult:
    """The ``anti-silence`` gate: a human's task needs a recorded send.

    Args:
        human: whether the task came from a human.
        task: the task id.
        channel: the channel the message came from.
        sends: the sends recorded for the task (:func:`fleet_runner.evidence.sends_for_task`).
    """
    if not human:
        return GateResult("anti-silence", SKIP, "the task came from an agent")
    details = {"sends": len(sends), "channels": sorted({str(s.get("channel")) for s in sends})}
    if sends:
        return GateResult("anti-silence", PASS,
                          f"{len(sends)} reply(ies) recorded for task {task}", "", details)
    return GateResult(
        "anti-silence", FAIL,
        f"no reply was sent for task {task}: the person who asked has been told nothing",
        "The reply CLI recorded no send for this task. Your final text is not delivered to "
        f"anyone. Send the answer with: {reply_command(task, channel)}", details)


def scope_gate(writes: Sequence[str] | None, changes: Changes, *,
               committed: Sequence[str] | None = None, commit_error: str | None = None,
               start_commit: str | None = None) -> GateResult:
    """The ``scope`` gate: every changed path must be inside the role's ``writes`` patterns.

    Args:
        writes: the role's gitignore-style patterns (workspace-relative), or ``None`` (the
            gate is skipped: the role does not limit its writes).
        changes: what the task changed so far in the workspace (baseline → after this
            attempt).
        committed: the paths the commits made since the baseline changed, or ``None`` (the
            workspace is not a git repository).
        commit_error: why those commits could not be read (the gate then fails), or ``None``.
        start_commit: the commit HEAD was on at the baseline (named in the feedback).

    The output fed back to the agent lists each path outside, with how it changed
    (``added``, ``modified``, ``removed``, ``committed`` or several), and the patterns;
    ``details`` has ``patterns``, ``changed`` (count of paths), ``committed`` (count, or
    ``None``), ``outside`` (up to :data:`LIST_MAX`, ``"path (added)"``) and
    ``outside_count``.
    """
    if writes is None:
        return GateResult("scope", SKIP, "the role sets no writes scope")
    scope = compile_scope(writes)  # validated when the config was read
    kinds: dict[str, list[str]] = {}
    for kind, paths in (("added", changes.added), ("modified", changes.modified),
                        ("removed", changes.removed), ("committed", committed or ())):
        for path in paths:
            kinds.setdefault(path, []).append(kind)
    outside = sorted((p, ", ".join(k)) for p, k in kinds.items() if not scope.allows(p))
    listed = [f"{p} ({kind})" for p, kind in outside]
    details = {"patterns": list(writes), "changed": len(kinds),
               "committed": None if committed is None else len(committed),
               "outside": listed[:LIST_MAX], "outside_count": len(outside)}
    if commit_error:
        details["commit_error"] = commit_error
    if not outside and not commit_error:
        return GateResult("scope", PASS, f"all {len(kinds)} changed path(s) are inside the "
                          "writes scope", "", details)
    allowed = ", ".join(writes) if writes else "(nothing: this role may not change any file)"
    since = f" {start_commit[:12]}" if start_commit else ""
    text = ""
    if outside:
        text = ("These paths changed outside the writes scope of this role:\n"
                + "".join(f"  {line}\n" for line in listed)
                + f"The role may change only: {allowed} (gitignore patterns, relative to the "
                "workspace; a path inside a .git directory only through a pattern naming "
                ".git).\nPut each of these back as it was before the task (delete what you "
                "added, restore what you changed or removed) and write only inside the scope.\n")
        if any("committed" in kind for _, kind in outside):
            text += (f"A path marked committed differs between the commit the task started "
                     f"from{since} and HEAD (or the branch): commit it back to its content "
                     f"there (git checkout{since or ' START'} -- PATH, or git rm a file it did "
                     "not have, then commit).\n")
    if commit_error:
        text += f"The commits made during the task could not be read: {commit_error}\n"
    summary = (f"{len(outside)} path(s) changed outside the writes scope: "
               + ", ".join(listed[:3]) + (" ..." if len(listed) > 3 else "")) if outside else \
        f"the commits made during the task could not be read: {commit_error}"
    return GateResult("scope", FAIL, summary, head_text(text, OUTPUT_MAX_BYTES), details)
