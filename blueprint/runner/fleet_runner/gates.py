"""The verify gates: deterministic checks after every run, before the run counts.

Every gate runs after every run, even when an earlier one failed, and each returns a
:class:`GateResult`; the run passes only when no gate failed. The agent's exit status and its
words are never a success signal.

``run``
    the agent command itself: fails when it could not start, timed out, was killed by a signal
    or exited non-zero (a crashed run is not a finished one), when the agent CLI's own result
    says ``is_error``, when it printed nothing, when its output ends in a cut-off JSON line,
    or, when the agent command asks for a JSON result, when there is no complete one
    (:mod:`fleet_runner.agentresult`). Passing it proves nothing else.
``check``
    one result per declared check (``sh -c``, in the check's ``cwd``, its own process group
    and timeout, plain output forced: :func:`check_env`), diff-aware: only errors placed in
    files the task changed fail it. Rules, in order: the command cannot run (could not start,
    exit 126 or 127) → **fault**; timed out or killed → fail; exit 0 → pass; format ``exit``
    → fail; an error in a changed file → fail (the feedback lists only those, with
    workspace-relative paths); an error whose path cannot be placed in the workspace
    (:func:`fleet_runner.checkparse.place`) → fault; no diagnostic, or lines the parser does
    not understand → fault; else pass, the errors being *existing debt*. A checker that
    failed with warnings only failed on them: they are judged as errors would be. Existing
    debt is what the same check reported at the task's baseline (run once before the first
    attempt): an error in an untouched file that was not there then is the change's, and
    fails. A fault
    (``details["fault"]``) is the host's or the role's: the task stops and is escalated.
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
    Skipped when ``writes`` is unset. The runner then undoes what is outside
    (:mod:`fleet_runner.undo`), before the checks run: they judge what is left, and their
    feedback never names a file that is gone.
``claims``
    claimed versus actual: the files the agent's result file (``$FLEET_RESULT``,
    :mod:`fleet_runner.claims`) says it touched must be exactly the files the task changed
    (the same snapshots as ``scope``, the checks' leftovers taken out, and in a git
    repository what its commits since the baseline changed); fails listing both
    differences, claimed but not changed and changed but not claimed. The role's ``claims``
    key: ``checked`` (the default: judged when the result states files), ``required`` (a
    result that states none fails), ``off``.
"""

from __future__ import annotations

import json
import os
import shlex
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.agentresult import AgentReport
from fleet_runner.checkparse import (
    ERROR,
    Diagnostic,
    parse_checker_output,
    place,
    strip_ansi,
    workspace_keys,
)
from fleet_runner.claims import RESULT_ENV, StatedResult
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
    otherwise start a comment); a channel that starts with ``-`` is given as
    ``--channel=VALUE``, or the reply CLI would read it as an option."""
    shown = str(channel)
    option = f"--channel={shlex.quote(shown)}" if shown.startswith("-") \
        else f"--channel {shlex.quote(shown)}"
    return f"reply --task {shlex.quote(task)} {option} 'YOUR ANSWER'"


@dataclass(frozen=True, slots=True)
class GateResult:
    """The outcome of one gate.

    Attributes:
        name: ``"run"``, ``"check"``, ``"anti-silence"``, ``"scope"`` or ``"claims"``.
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


def run_gate(inv: Invocation, stderr_tail_bytes: int = 4000,
             report: AgentReport | None = None, expect_result: bool = False) -> GateResult:
    """The ``run`` gate from the agent command's :class:`Invocation` and, when given, the
    agent CLI's own report (:mod:`fleet_runner.agentresult`): a result with ``is_error:
    true``, nothing printed on stdout, or output ending in a cut-off JSON line fails it too;
    so does output with no complete JSON result when ``expect_result`` (the agent command
    asks for one: :attr:`fleet_runner.config.AgentConfig.expects_result`), such as prose."""
    ok = inv.start_error is None and inv.stopped is None and inv.signal is None \
        and inv.exit_status == 0
    output = ""
    details = inv.to_json()
    summary = "the agent command " + inv.describe()
    if report is not None:
        details["agent_report"] = report.to_json()
        if ok and report.is_error:
            ok = False
            summary += (", but its result says is_error: true"
                        + (f" ({report.subtype})" if report.subtype else ""))
        elif ok and not report.printed:
            ok = False
            summary += ", but printed nothing: a run with no output is not a finished run"
        elif ok and report.cut_off:
            ok = False
            summary += (", but its output ends in a cut-off JSON line: the agent CLI did not "
                        "finish printing its result")
        elif ok and expect_result and not report.result:
            ok = False
            summary += (", but its output holds no complete JSON result (the agent command "
                        "asks for --output-format json): prose or a cut-off result is not a "
                        "finished run")
    if not ok and inv.stderr_path is not None:
        output = tail_text(inv.stderr_path, stderr_tail_bytes)
    return GateResult("run", PASS if ok else FAIL, summary, output, details, inv.duration_s)


def _listed(diags: Sequence[Diagnostic]) -> list[str]:
    return [d.render() for d in diags[:LIST_MAX]]


def classify(diagnostics: Sequence[Diagnostic], touched: Sequence[str], workspace: Path,
             cwd: Path) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """Split diagnostics into those in touched files and those elsewhere (unplaceable ones
    included: :func:`place_diagnostics` tells those apart).

    Args:
        diagnostics: parsed diagnostics, paths as printed by the checker.
        touched: workspace-relative paths the task added or modified.
        workspace: the workspace directory.
        cwd: the checker's working directory (its relative paths are relative to it).
    """
    placed = place_diagnostics(diagnostics, touched, workspace, cwd)
    return placed.inside, placed.outside + placed.unplaced


@dataclass(frozen=True, slots=True)
class Placed:
    """Diagnostics placed in the workspace (:func:`place_diagnostics`).

    Attributes:
        inside: in a file the task touched.
        outside: in another file of the workspace.
        unplaced: in no file of the workspace (none there, or outside it).
        where: each placed diagnostic's workspace-relative path (by position in the input).
    """

    inside: list[Diagnostic]
    outside: list[Diagnostic]
    unplaced: list[Diagnostic]
    where: dict[int, str]


def place_diagnostics(diagnostics: Sequence[Diagnostic], touched: Sequence[str],
                      workspace: Path, cwd: Path) -> Placed:
    """Place every diagnostic in the workspace (:func:`fleet_runner.checkparse.place`) and
    split them by whether the file is one the task touched."""
    ws = os.fspath(workspace)
    owner: dict[str, str] = {}
    for rel in touched:
        for key in workspace_keys(rel, ws):
            owner.setdefault(key, rel)
    inside: list[Diagnostic] = []
    outside: list[Diagnostic] = []
    unplaced: list[Diagnostic] = []
    where: dict[int, str] = {}
    for diag in diagnostics:
        forms = place(diag.path, os.fspath(cwd), ws)
        if forms is None:
            unplaced.append(diag)
            continue
        hit = next((owner[f] for f in sorted(forms) if f in owner), None)
        where[id(diag)] = hit or min(forms)
        (inside if hit else outside).append(diag)
    return Placed(inside, outside, unplaced, where)


CHECK_LEFTOVERS = (".mypy_cache/", ".ruff_cache/", ".pytest_cache/", "__pycache__/", "*.pyc",
                   ".dmypy.json", ".eslintcache", "*.tsbuildinfo", "node_modules/.cache/",
                   ".hypothesis/")
"""What the supported checkers write in the workspace (gitignore patterns): never counted as a
change of the agent's (the role adds its own with ``check_leftovers``)."""

PLAIN_ENV = {"NO_COLOR": "1", "TERM": "dumb", "CLICOLOR": "0", "CI": "1"}
"""Set for every check: tools that honour them print no colour and no pretty layout."""
COLOUR_FORCING = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "MYPY_FORCE_COLOR",
                  "TTY_COMPATIBLE", "TTY_INTERACTIVE")
"""Removed from every check's environment: each makes some tool colour its output anyway."""
DEBT_KEYS_MAX = 20000
"""The most errors of one check kept from a task's baseline (more: not compared)."""
CANNOT_RUN_STATUSES = (126, 127)
"""Exit statuses of ``sh -c`` when the command is not executable or not found."""


def check_env(base: Mapping[str, str], cache_dir: Path | None = None) -> dict[str, str]:
    """A check's environment: ``base`` with plain output forced (:data:`PLAIN_ENV`, without
    :data:`COLOUR_FORCING`) and, with ``cache_dir``, the caches of the supported tools
    (ruff, mypy, Python bytecode, pytest) moved out of the workspace into it."""
    env = {k: v for k, v in base.items() if k not in COLOUR_FORCING}
    env.update(PLAIN_ENV)
    if cache_dir is not None:
        env.update(RUFF_CACHE_DIR=os.fspath(cache_dir / "ruff"),
                   MYPY_CACHE_DIR=os.fspath(cache_dir / "mypy"),
                   PYTHONPYCACHEPREFIX=os.fspath(cache_dir / "pycache"),
                   PYTEST_ADDOPTS=(env.get("PYTEST_ADDOPTS", "") + " -p no:cacheprovider"
                                   ).strip())
    return env


def check_gate(spec: Any, workspace: Path, touched: Sequence[str], *,
               timeout_s: float, kill_grace_s: float, output_path: Path,
               env: Mapping[str, str],
               should_stop: Callable[[], str | None] | None = None,
               user: tuple[int, int] | None = None, cwd_was_there: bool = False,
               baseline_debt: Sequence[str] | None = None,
               keep_debt_keys: bool = False) -> GateResult:
    """Run one check over the workspace and judge it diff-aware (module docstring).

    Args:
        spec: the check (:class:`fleet_runner.config.CheckSpec`: ``command``, ``cwd``,
            ``format``), a bare command line (run in the workspace, format ``auto``), or
            ``None`` (the gate is skipped).
        workspace: the workspace; the check runs in ``workspace/spec.cwd``.
        touched: workspace-relative paths the task added or modified.
        timeout_s: wall-clock seconds for the checker.
        kill_grace_s: seconds between SIGTERM and SIGKILL when it times out.
        output_path: file for its merged stdout and stderr.
        env: its environment (give it :func:`check_env`'s).
        should_stop: polled while it runs; a reason ends it early (the result then fails with
            that reason, and the caller is expected to discard it).
        user: ``(uid, gid)`` to run it as (it runs the agent's code: the agent's user), or
            ``None``.
        cwd_was_there: the check's directory held files at the task's baseline: when it is
            gone, the task removed it (a failure the agent can undo), not a fault.
        baseline_debt: the errors this check reported at the task's baseline
            (:func:`baseline_debt`, ``details["debt_keys"]``), or ``None`` when not known: an
            error in a file the task did not change passes as existing debt only when it was
            there then (in an untouched file its line cannot have moved).
        keep_debt_keys: put every error of the debt in ``details["debt_keys"]`` (for
            :func:`baseline_debt`; left out of attempts' records, where it could be long).

    Returns:
        The gate's result. ``output`` is what the next attempt is told: only the errors in
        files the task changed, with workspace-relative paths (for format ``exit``, the
        output's tail). ``details["fault"]`` is true when the check itself, not the agent's
        work, is at fault (it could not run, or its failing output cannot be read or placed):
        the task then stops and is escalated, ``output`` holding the raw output for a person.
    """
    if not spec:
        return GateResult("check", SKIP, "no check command is configured for this role")
    if isinstance(spec, str):
        command, rel_cwd, fmt = spec, ".", "auto"
    else:
        command, rel_cwd, fmt = spec.command, spec.cwd, spec.format
    cwd = Path(os.path.normpath(os.path.join(workspace, rel_cwd)))
    details: dict[str, Any] = {"command": command, "cwd": rel_cwd, "format": fmt,
                               "output_file": Path(output_path).name, "fault": False,
                               "touched_files": len(touched)}
    where = f"`{command}`" + (f" in {rel_cwd}/" if rel_cwd != "." else "")
    if not cwd.is_dir():
        details.update(exit_status=None, outcome="not run")
        if cwd_was_there:
            return GateResult("check", FAIL, f"the check {where} cannot run: this task removed "
                              f"its directory {rel_cwd}",
                              f"This task removed {rel_cwd}/, where the check `{command}` runs: "
                              "put it back.", details)
        return GateResult("check", FAIL, f"the check {where} cannot run: its directory "
                          f"{rel_cwd} is not in the workspace", "",
                          {**details, "fault": True})
    inv = run_in_group(["/bin/sh", "-c", command], stdin=b"", cwd=cwd, env=env,
                       timeout_s=timeout_s, kill_grace_s=kill_grace_s, stdout_path=output_path,
                       should_stop=should_stop, user=user)
    try:
        text = strip_ansi(Path(output_path).read_text("utf-8", "replace"))
    except OSError:
        text = ""
    details.update(exit_status=inv.exit_status, outcome=inv.describe())
    raw = head_text(text, OUTPUT_MAX_BYTES)

    def result(status: str, summary: str, output: str = "", fault: bool = False) -> GateResult:
        details["fault"] = fault
        return GateResult("check", status, summary, output, details, inv.duration_s)

    if inv.start_error or inv.exit_status in CANNOT_RUN_STATUSES:
        return result(FAIL, f"the check {where} cannot run ({inv.describe()}): a fault of the "
                      "host or the role, not of the agent's work", raw, fault=True)
    if inv.stopped or inv.signal is not None:
        return result(FAIL, f"the check {where} {inv.describe()}", tail_text_of(text))
    if inv.exit_status == 0:
        return result(PASS, f"the check {where} exited 0")
    if fmt == "exit":
        return result(FAIL, f"the check {where} exited {inv.exit_status}", tail_text_of(text))
    parsed = parse_checker_output(text)
    placed = place_diagnostics(parsed.diagnostics, touched, workspace, cwd)

    def shown(diag: Diagnostic) -> str:
        col = f"{diag.col}:" if diag.col is not None else ""
        return f"{placed.where.get(id(diag), diag.path)}:{diag.line}:{col} {diag.message}"

    # Each diagnostic once: two tools in one check, or one file printed by two paths
    # (pkg/a.py, ./pkg/a.py, a symlink), report the same one twice.
    inside, outside = _once(placed.inside, shown), _once(placed.outside, shown)
    unplaced = _once(placed.unplaced, Diagnostic.render)
    # A checker that failed with warnings only (shellcheck, eslint --max-warnings 0) failed on
    # them: they are what must be placed, or its non-zero exit would pass unexplained.
    failing = ERROR if any(d.severity == ERROR for d in parsed.diagnostics) else None
    new_errors = [d for d in inside if failing is None or d.severity == failing]
    unplaced_errors = [d for d in unplaced if failing is None or d.severity == failing]
    debt = [d for d in outside if failing is None or d.severity == failing]

    details.update(
        new_errors=[shown(d) for d in new_errors[:LIST_MAX]], new_error_count=len(new_errors),
        warnings=[shown(d) for d in inside if failing is not None
                  and d.severity != ERROR][:LIST_MAX],
        existing_debt=[shown(d) for d in debt[:LIST_MAX]], existing_debt_count=len(debt),
        unplaced=_listed(unplaced_errors), unplaced_count=len(unplaced_errors),
        unparsed=list(parsed.unparsed[:LIST_MAX]), unparsed_count=len(parsed.unparsed))
    if keep_debt_keys:
        # Every diagnostic, warnings too: a later run that fails on warnings alone (its errors
        # fixed) is judged by them.
        every = outside
        details["debt_keys"] = [shown(d) for d in every] if len(every) <= DEBT_KEYS_MAX \
            else None
    known_debt = set(baseline_debt) if baseline_debt is not None else None
    caused = [] if known_debt is None else [d for d in debt if shown(d) not in known_debt]
    if new_errors:
        feedback = (f"The check {where} reports {len(new_errors)} error(s) in files this task "
                    "changed (paths relative to the workspace):\n"
                    + "".join(f"  {shown(d)}\n" for d in new_errors))
        return result(FAIL, f"{len(new_errors)} error(s) in files this task changed: "
                      + "; ".join(details["new_errors"][:3]),
                      head_text(feedback, OUTPUT_MAX_BYTES))
    if unplaced_errors:
        return result(FAIL, f"the check {where} exited {inv.exit_status} with "
                      f"{len(unplaced_errors)} error(s) in files the gate cannot place in the "
                      f"workspace (first: {unplaced_errors[0].path}): a wrong cwd or format "
                      "for this check, never taken as existing debt", raw, fault=True)
    if not parsed.diagnostics or parsed.unparsed:
        return result(FAIL, f"the check {where} exited {inv.exit_status} with output the gate "
                      f"cannot parse ({len(parsed.unparsed)} unparsed line(s)): counted as a "
                      "failure, never a pass", raw, fault=True)
    if caused:
        details.update(caused_errors=[shown(d) for d in caused[:LIST_MAX]],
                       caused_error_count=len(caused))
        feedback = (f"The check {where} reports {len(caused)} error(s) in files this task did "
                    "not change that were not there when the task started: your change caused "
                    "them (paths relative to the workspace):\n"
                    + "".join(f"  {shown(d)}\n" for d in caused))
        return result(FAIL, f"{len(caused)} new error(s) in files this task did not change: "
                      + "; ".join(details["caused_errors"][:3]),
                      head_text(feedback, OUTPUT_MAX_BYTES))
    known = "" if baseline_debt is not None else " (not compared with the baseline: unknown)"
    return result(PASS, f"the check {where} exited {inv.exit_status}, but only on existing "
                  f"debt: {len(debt)} error(s) in files this task did not change{known}")


def _once(diags: Sequence[Diagnostic], key: Callable[[Diagnostic], str]) -> list[Diagnostic]:
    """``diags`` in order, each ``(key, severity)`` kept the first time only."""
    seen: set[tuple[str, str]] = set()
    out = []
    for diag in diags:
        mark = (key(diag), diag.severity)
        if mark not in seen:
            seen.add(mark)
            out.append(diag)
    return out


def baseline_debt(result: GateResult) -> list[str] | None:
    """The errors a check reported on the workspace at a task's baseline (run there with no
    touched files, so every error is debt), to judge later attempts by (``baseline_debt`` of
    :func:`check_gate`); ``None`` when that run did not say (it failed, timed out, could not
    be parsed or placed, or listed more than :data:`DEBT_KEYS_MAX` errors)."""
    if result.status == PASS:
        keys = result.details.get("debt_keys")
        if result.details.get("exit_status") == 0:
            return []
        return list(keys) if isinstance(keys, list) else None
    return None


def tail_text_of(text: str, max_bytes: int = OUTPUT_MAX_BYTES) -> str:
    """The last ``max_bytes`` of ``text`` (whole lines)."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    cut = data[-max_bytes:].decode("utf-8", "replace")
    return cut.split("\n", 1)[-1]


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


def shown_path(path: str) -> str:
    """``path`` as a JSON string, the form a result file takes it in: quoted, a control
    character, a line or paragraph separator and a byte that is not UTF-8 (``\\udcXX``)
    escaped, other text as it is."""
    out = []
    for ch in json.dumps(path, ensure_ascii=False):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF or not (ch.isprintable() or ch == " "):
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _claim_hint(path: str, unclaimed: Sequence[str]) -> str:
    """Why a claimed path may match no change: a directory, or a name that differs from a
    changed one only by its Unicode form or its case."""
    under = [p for p in unclaimed if p.startswith(path + "/")]
    if under:
        return (f" (a directory: claim the files in it, {len(under)} changed: "
                + ", ".join(map(shown_path, under[:3])) + (" ..." if len(under) > 3 else "") + ")")
    form = unicodedata.normalize("NFC", path)
    for other in unclaimed:
        if other != path and unicodedata.normalize("NFC", other) == form:
            return (f" (the file that changed is {shown_path(other)}: the same letters in "
                    "another Unicode form, a different name)")
    for other in unclaimed:
        if other.casefold() == path.casefold():
            return f" (the file that changed is {shown_path(other)}: names differ in case)"
    return ""


def claims_gate(result: StatedResult | None, changes: Changes,
                committed: Sequence[str] | None = None, *, required: bool = False,
                error: str | None = None, commit_error: str | None = None,
                result_file: str = "$" + RESULT_ENV) -> GateResult:
    """The ``claims`` gate: the files the agent's result claims (:mod:`fleet_runner.claims`)
    must be exactly the files the task changed.

    Args:
        result: what the result file states, or ``None`` (the agent wrote none).
        changes: what the task changed in the workspace (baseline → after this attempt,
            the checks' leftovers taken out).
        committed: the paths the commits made since the baseline changed, or ``None`` (not
            a git repository).
        required: the role's ``claims: required``: a result that states no files fails.
        error: why the result file cannot be used (:class:`fleet_runner.claims.ClaimError`),
            or ``None``.
        commit_error: why the commits could not be read (the gate then fails), or ``None``.
        result_file: the result file's path, named in the feedback.

    Changed is every path added, modified or removed, or changed by the commits; the gate
    passes when that set and the claimed one are equal, else it fails listing both
    differences (``details``: ``claimed_not_changed``, ``changed_not_claimed``, each up to
    :data:`LIST_MAX`, with their counts). Skipped when the result states no files and the
    claim is not required.
    """
    how = (f"Write the result file {result_file} as one JSON object, "
           '{"state": "completed", "summary": "...", "files": ["src/a.py", ...]}, listing in '
           '"files" every file this task added, modified or removed in the workspace '
           "(relative to it; since the task started, earlier attempts and commits included; "
           "both names of a renamed file; a removed file too), and only those.\n")
    if error:
        return GateResult("claims", FAIL, f"the result file cannot be used: {error}",
                          f"The result file cannot be used: {error}\n{how}",
                          {"error": error, "required": required})
    if result is None or result.files is None:
        what = "no result file" if result is None else "a result that states no files"
        if not required:
            return GateResult("claims", SKIP, f"{what}: no claim to check",
                              details={"required": False})
        return GateResult("claims", FAIL, f"{what}, and this role requires the files to be "
                          "claimed", f"The runner found {what}: this role requires every run "
                          f"to state the files it changed.\n{how}", {"required": True})
    kinds: dict[str, list[str]] = {}
    for kind, paths in (("added", changes.added), ("modified", changes.modified),
                        ("removed", changes.removed), ("committed", committed or ())):
        for path in paths:
            kinds.setdefault(path, []).append(kind)
    claimed = set(result.files)
    false_claims = sorted(claimed - kinds.keys())
    unclaimed = sorted(kinds.keys() - claimed)
    listed_false = [shown_path(p) + _claim_hint(p, unclaimed) for p in false_claims]
    listed_unclaimed = [f"{shown_path(p)} ({', '.join(kinds[p])})" for p in unclaimed]
    details: dict[str, Any] = {
        "required": required, "claimed": len(claimed), "changed": len(kinds),
        "committed": None if committed is None else len(committed),
        "claimed_not_changed": listed_false[:LIST_MAX],
        "claimed_not_changed_count": len(false_claims),
        "changed_not_claimed": listed_unclaimed[:LIST_MAX],
        "changed_not_claimed_count": len(unclaimed)}
    if commit_error:
        details["commit_error"] = commit_error
    if not false_claims and not unclaimed and not commit_error:
        return GateResult("claims", PASS, f"the {len(claimed)} claimed file(s) are the files "
                          "the task changed", "", details)
    text = ("The files your result claims are not the files this task changed (paths "
            "relative to the workspace, as JSON strings).\n")
    text += f"Claimed but not changed ({len(false_claims)}):\n" + (
        "".join(f"  {line}\n" for line in listed_false) or "  (none)\n")
    text += f"Changed but not claimed ({len(unclaimed)}):\n" + (
        "".join(f"  {line}\n" for line in listed_unclaimed) or "  (none)\n")
    if false_claims:
        text += ("A claimed file counts as changed only when its content, mode or kind "
                 "differs from the start of the task: an edit that failed, or one undone "
                 "later, is no change. Make the change, or drop the claim.\n")
    if commit_error:
        text += f"The commits made during the task could not be read: {commit_error}\n"
    text += how
    parts = []
    if false_claims:
        parts.append(f"{len(false_claims)} claimed but not changed: "
                     + ", ".join(map(shown_path, false_claims[:3]))
                     + (" ..." if len(false_claims) > 3 else ""))
    if unclaimed:
        parts.append(f"{len(unclaimed)} changed but not claimed: "
                     + ", ".join(map(shown_path, unclaimed[:3]))
                     + (" ..." if len(unclaimed) > 3 else ""))
    if commit_error:
        parts.append(f"the commits made during the task could not be read: {commit_error}")
    return GateResult("claims", FAIL, "; ".join(parts), head_text(text, OUTPUT_MAX_BYTES),
                      details)
