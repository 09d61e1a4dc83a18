"""The outer loop: take one message, attempt the task, verify, retry or finish, never silently.

For each message, oldest first, one at a time (none while a standing denial waits for a
person: :mod:`fleet_runner.standing`):

1. read it, claim it (``inbox/ → processing/``) and parse it; a message that cannot be read or
   claimed now (an ``OSError``) stays in the inbox, is logged (at most every
   :data:`UNREADABLE_LOG_INTERVAL_S`) and is tried again at the next scan; an invalid message
   (bad JSON or shape, or a directory, symlink or other non-regular file named ``*.json``) is
   escalated and moved to ``failed/``; a message whose id already finished is moved to
   ``failed/`` as a duplicate, escalated (kind ``duplicate``) when a person sent it;
2. pin the release (``current`` resolved once), read the agent's config; with ``sync`` set,
   sync the working repository (:mod:`fleet_runner.reposync`: a person's uncommitted changes
   or a conflict end the task here as ``refused``, escalated, never run; a failed fetch puts
   the message back in the inbox, tried again later, at most :data:`SYNC_FETCH_ATTEMPTS`
   times); snapshot the workspace once per task (the baseline, kept across restarts, with the
   commit and branch HEAD is on when the workspace is the top of a git work tree);
3. for attempt 1 .. ``max_retries + 1``: build the prefix (with a CLI-index line per
   ``via: bridge`` MCP server) and the task prompt, write the attempt's MCP config file for the
   ``via: mcp`` servers when ``agent_command`` asks for it (:mod:`fleet_runner.mcpconfig`), run
   the agent command (with the call-counting shims of :mod:`fleet_runner.calls` first on its PATH),
   snapshot, write the ledger line, read the agent CLI's own result
   (:mod:`fleet_runner.agentresult`), then either stop at once on a permission denial (from a
   CLI, the result or the transcript; it becomes a standing denial) or run every gate (the
   scope gate first: what is outside the write scope is undone, :mod:`fleet_runner.undo`,
   before the checks judge what is left) and write the run record;
   a pass finishes the task, a fault of a check (it cannot run, or its output cannot be read
   or placed) stops it at once, a failure waits the bounded back-off and retries;
4. when the last attempt failed: escalate through notify (task, failed verifications and
   interrupted attempts counted apart, last failure, every attempt's reason), clear the task
   (``processing/ → failed/``), and go on with the next message.

Between tasks (after one is decided, and when the inbox is empty) the caller may ask for a
restart into a newly shipped release (``serve(release_changed=...)``).

The sentinel (:mod:`fleet_runner.progress`) makes each step resumable; a runner started with a
message left in ``processing/`` finishes it first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner import (
    calls,
    evidence,
    gates,
    reposync,
    scoperequest,
    sendproof,
    standing,
    stateowner,
    team,
)
from fleet_runner.agentresult import read_agent_report
from fleet_runner.config import AgentConfig, ConfigError, check_servable, load_config
from fleet_runner.escalate import escalate
from fleet_runner.inbox import Message, MessageError, Spool, parse_message, read_message_file
from fleet_runner.invoke import kill_stale_group, process_start_ticks, reap_orphans, run_in_group
from fleet_runner.ledger import ledger_record, parse_usage
from fleet_runner.mcpconfig import write_mcp_config
from fleet_runner.names import encode_name, one_line
from fleet_runner.paths import AgentPaths
from fleet_runner.prefix import PrefixError, build_prefix
from fleet_runner.progress import FINISHED, INTERRUPTED, RUNNING, TaskProgress
from fleet_runner.prompt import build_task_prompt
from fleet_runner.records import (
    SCHEMA_VERSION,
    append_jsonl,
    now_iso,
    read_json,
    tail_text,
    write_json_atomic,
)
from fleet_runner.scope import compile_scope
from fleet_runner.snapshot import Changes, diff_snapshots, same, take_snapshot
from fleet_runner.tokens import TOKEN_COUNTER, count_tokens
from fleet_runner.tokens import prefix_tokens as counted_prefix
from fleet_runner.undo import store_baseline, undo_changes

PREFIX_COUNTS = "prefix-tokens.json"  # fleetctl/tokencount/prefix_counts.py writes it at render

PASSED, FAILED, DENIED, STOPPED, FAULT = "pass", "fail", "denied", "stopped", "fault"
GAVE_UP, REFUSED = "gave-up", "refused"
CHANGES_LISTED_MAX = 200
"""At most this many paths per kind of change in a run record."""
UNREADABLE_LOG_INTERVAL_S = 600.0
"""An inbox message that stays unreadable with the same error is logged again after this long."""
SYNC_FETCH_ATTEMPTS = 5
"""A task whose sync's fetch failed this many times is refused (escalated); before that its
message goes back to the inbox and is tried again later."""
SYNC_RETRY_MAX_S = 900.0
"""The longest wait before a put-off sync is tried again, in seconds."""
RUNNER_STOPPED, RUNNER_DIED = "runner-stop", "runner-died"
"""Why an attempt was interrupted (``interrupted_by`` in progress.json): this runner was asked to
stop (SIGTERM/SIGINT) and recorded it, or a runner died during it and the next start found it."""
_INTERRUPTION_TEXT = {RUNNER_STOPPED: "interrupted by a runner stop",
                      RUNNER_DIED: "interrupted: the runner died during this attempt"}


AGENT_DIR, SHIMS_DIR, EVIDENCE_SOCKET = "agent", "shims", "evidence.sock"
"""With two users (``--agent-user``): the agent user's directory in the state, the runner's
directory of shims it may read, and the runner's evidence socket (sendproof.py)."""
BASELINE_STORE = "baseline-store"
"""Under ``runs/<task>/``: copies of the files outside the write scope at the baseline
(:mod:`fleet_runner.undo`)."""
AGENT_USER_CAPS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_KILL": 5,
                   "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SYS_PTRACE": 19}
"""The capabilities a runner with ``--agent-user`` uses, by bit number (``linux/capability.h``):
start the agent's processes as its user (SETUID, SETGID), give it its directories in the state
(CHOWN), read, snapshot and restore its files (DAC_OVERRIDE, FOWNER: modes), end its processes
(KILL), and see which program sends through the evidence socket (SYS_PTRACE: another user's
``/proc/PID/exe``). The systemd unit's ``CapabilityBoundingSet=`` is exactly these."""
CHECK_RUNS_DIR = "check-runs"
"""Under ``STATE``: one new directory per check run, its HOME and tool caches, removed after."""
CHECK_WRITTEN = "check-written.json"
"""In a task's directory: what its checks wrote in the workspace (:func:`check_written`)."""
RETRY_BACKOFF_MAX_S = 120.0
"""The longest wait before a retry after a failed verification, in seconds."""


def _leftover_scope(declared: Sequence[str]) -> Any:
    """What checks may leave: :data:`fleet_runner.gates.CHECK_LEFTOVERS` and the role's
    ``check_leftovers``, as one compiled scope."""
    return compile_scope([*gates.CHECK_LEFTOVERS, *declared])


def without_leftovers(changes: Changes, declared: Sequence[str] = (),
                      written: Mapping[str, str] | None = None,
                      now: Mapping[str, str] | None = None) -> tuple[Changes, list[str]]:
    """``changes`` without what the checks wrote (paths matching
    :data:`fleet_runner.gates.CHECK_LEFTOVERS` or the role's ``check_leftovers``), and the
    paths taken out, sorted.

    With ``written`` (path → fingerprint of what the task's check runs left, as seen right
    after them) and ``now`` (the snapshot ``changes`` ends at), such a path is taken out only
    when the checks wrote it and nothing changed it since (or it is gone): a ``*.pyc`` or a
    ``__pycache__/`` the agent itself wrote is its change, judged by scope and undone (a
    planted ``pytest.pyc`` ran instead of the check: found by a tryout). Without them (a
    task begun by an older runner), every path matching the patterns is taken out."""
    leftovers = _leftover_scope(declared)

    def checks_wrote(path: str) -> bool:
        if not leftovers.allows(path):
            return False
        if written is None or now is None:
            return True
        return path in written and (path not in now or same(written[path], now[path]))

    kept = [tuple(p for p in paths if not checks_wrote(p))
            for paths in (changes.added, changes.modified, changes.removed)]
    dropped = sorted(p for paths in (changes.added, changes.modified, changes.removed)
                     for p in paths if checks_wrote(p))
    return Changes(*kept), dropped


def check_written(before: Mapping[str, str], workspace: Path,
                  declared: Sequence[str] = ()) -> dict[str, str]:
    """The paths matching the leftover patterns that the checks changed since the snapshot
    ``before`` their runs, with their fingerprints now (only those files are read)."""
    leftovers = _leftover_scope(declared)
    after = take_snapshot(workspace, only=leftovers.allows)
    return {p: fp for p, fp in after.items() if p not in before or not same(before[p], fp)}


def _attempt_history(attempts: Sequence[dict[str, Any]]) -> str:
    """One line per attempt: its number, verdict and why (every failed gate's summary, the
    denials, or how it was interrupted)."""
    lines = []
    for entry in attempts:
        verdict = entry.get("verdict") or entry.get("state")
        if verdict == INTERRUPTED:
            why = _interruption_text(entry)
        elif entry.get("denials"):
            why = "denied: " + "; ".join(f"{d.get('cli', '?')}: {d.get('what', '?')}"
                                         for d in entry["denials"])
        else:
            why = "; ".join(f"{g['name']}: {g['summary']}"
                            for g in entry.get("failed_gates", [])) or "all gates passed"
        lines.append(f"  {entry.get('attempt')}: {verdict}: {why}")
    return "\n".join(lines)


def _check_key(spec: Any) -> str:
    """A check, by what it runs: its baseline debt follows it when a new release reorders the
    role's checks."""
    return json.dumps([spec.command, spec.cwd, spec.format])


def _remove_tree(path: Path) -> None:
    """Remove ``path`` and all in it, never following a symlink out; a directory a tool made
    read-only (Go's module cache: 0555) is made writable first, so it goes too."""
    def retry(function: Callable[..., Any], failed: str, _exc: Any) -> None:
        parent = os.path.dirname(failed)
        if not os.path.islink(parent):
            os.chmod(parent, 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        function(failed)

    try:
        shutil.rmtree(path, onerror=retry)
    except OSError as exc:
        _log("-", f"could not remove {path}: {exc}")


def not_root_refusal(agent_user: str) -> str | None:
    """Why a runner that is not root (uid 0) must not start the agent as ``agent_user``, or
    ``None`` when it is root. A runner of another uid holds its capabilities as ambient ones
    (setpriv, systemd's ``AmbientCapabilities=``) and the agent would inherit them, and with
    them the runner's records; root's are dropped when the kernel switches to the agent's
    user."""
    if os.geteuid() == 0:
        return None
    return (f"--agent-user {agent_user}: the runner must run as root (uid 0) to start the agent "
            f"as another user, not as uid {os.geteuid()}: a runner of another uid passes its "
            "capabilities on to the agent (docs/runner.md, The two users)")


def missing_capabilities() -> list[str]:
    """The names of :data:`AGENT_USER_CAPS` this process does not have in effect (read from
    ``/proc/self/status``, ``CapEff``), in bit order; ``[]`` where there is no such file."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return []
    effective = int(next((ln.split()[1] for ln in status.splitlines()
                          if ln.startswith("CapEff:")), "0"), 16)
    return [name for name, bit in sorted(AGENT_USER_CAPS.items(), key=lambda kv: kv[1])
            if not effective >> bit & 1]


class RunnerError(Exception):
    """The runner cannot work for this agent (bad config, broken release); exit 2."""


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """Knobs that are not part of the agent's config.

    Attributes:
        kill_grace_s: seconds between SIGTERM and SIGKILL when a group is ended (default 5).
        check_timeout_s: wall-clock seconds for the check command (default 300).
        poll_s: seconds between looks at an empty inbox (default 1).
        sync_retry_s: seconds before a task whose sync's fetch failed is tried again (default
            60), doubled at each failure up to :data:`SYNC_RETRY_MAX_S`. Kept in memory only:
            a restarted runner tries at once.
        retry_backoff_s: seconds to wait before the retry that follows a failed verification
            (default 5), doubled at each further failure of the task up to
            :data:`RETRY_BACKOFF_MAX_S`; 0 retries at once.
    """

    kill_grace_s: float = 5.0
    check_timeout_s: float = 300.0
    poll_s: float = 1.0
    sync_retry_s: float = 60.0
    retry_backoff_s: float = 5.0


def _log(agent: str, text: str) -> None:
    # One event, one line: ids, channels, paths and tool output may hold newlines.
    print(f"fleet-runner[{one_line(agent)}]: {one_line(text)}", file=sys.stderr, flush=True)


def _interruption_text(entry: dict[str, Any]) -> str:
    """Why an interrupted attempt ended, from its progress entry (``interrupted`` alone for an
    entry written by an older runner, which did not record it)."""
    return _INTERRUPTION_TEXT.get(entry.get("interrupted_by", ""), "interrupted")


def _escalation_text(escalation: dict[str, Any]) -> str:
    """How an escalation went, for the log (``escalate()``'s ``via`` is ``None`` when nothing,
    not even the runner's own spool file, got through)."""
    via, error = escalation.get("via"), escalation.get("error")
    if via is None:
        return f"escalation NOT delivered ({error})"
    return f"escalated via {via}" + (f" (notify CLI: {error})" if error else "")


@dataclass(frozen=True)
class AgentUser:
    """The agent's own Linux user, when it is not the runner's (``--agent-user``).

    Attributes:
        name: the user name.
        uid: its uid.
        gid: its primary gid.
        home: its home directory (``HOME`` of the agent command and the checks).
        python: the interpreter its send shims run with (one it can execute).
        server: the runner's evidence socket (:class:`fleet_runner.sendproof.EvidenceServer`).
    """

    name: str
    uid: int
    gid: int
    home: str
    python: str
    server: sendproof.EvidenceServer


@dataclass
class _Task:
    """Everything one task's attempts share."""

    message: Message
    path: Path
    progress: TaskProgress
    config: AgentConfig
    release: Path
    dir: Path
    baseline: dict[str, str]
    git_start: dict[str, Any] | None = None
    """``{"repo": bool, "head": id|None, "branch": name|None}`` at the baseline, or ``None``
    (a baseline written by an older runner, not in a synced repository)."""
    deferred: bool = False
    """The sync was put off (a failed fetch): the message goes back to the inbox."""
    check_debt: dict[str, list[str] | None] = field(default_factory=dict)
    """Per declared check (:func:`_check_key`), the errors it reported at the baseline, or
    ``None`` when not known (:func:`fleet_runner.gates.baseline_debt`)."""
    check_written: dict[str, str] | None = None
    """What the checks of the task's attempts wrote (:func:`check_written`), or ``None`` for a
    task begun by an older runner (:func:`without_leftovers`)."""


class Runner:
    """Serves one agent's inbox (see the module docstring)."""

    def __init__(self, paths: AgentPaths, options: RunnerOptions = RunnerOptions(),
                 log: Callable[[str, str], None] = _log) -> None:
        self.paths = paths
        self.options = options
        self.spool = Spool(paths.inbox, paths.processing, paths.done, paths.failed)
        self.stop_reason: str | None = None
        self._log = log
        self._unreadable: dict[str, tuple[str, float]] = {}  # name -> (error, last logged)
        self._deferred: dict[str, float] = {}  # inbox name -> monotonic time to try again
        self._held = ""  # the standing denials last logged as holding new tasks
        self.users: AgentUser | None = None

    def log(self, text: str) -> None:
        """One line on stderr (the journal)."""
        self._log(self.paths.agent, text)

    def split_users(self, name: str) -> None:
        """Run the agent command and the checks as the Linux user ``name``, apart from the
        runner (sendproof.py, docs/runner.md "The two users"): what is under ``STATE`` is
        re-owned (stateowner.py: a state written with one user is taken back), ``STATE``
        becomes 0711 (the agent's user may reach only what it is given), ``STATE/agent/`` and
        the outbox and
        notify spools are its own, the shims directory is the runner's (readable), the
        evidence socket listens, and git in the workspace runs as that user.

        Raises:
            RunnerError: this runner is not root, no such user, the user is root (uid 0),
                this process lacks one of :data:`AGENT_USER_CAPS`, the workspace is not the user's,
                or no Python interpreter the user may run is found.
            OSError: the state could not be re-owned (no root or ``CAP_CHOWN``).
        """
        import pwd
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise RunnerError(f"--agent-user {name}: no such user") from None
        refusal = not_root_refusal(name)
        if refusal:
            raise RunnerError(refusal)
        if entry.pw_uid == 0:
            # The split exists to keep the runner's records out of the agent's reach.
            raise RunnerError(f"--agent-user {name}: uid 0 is root: the agent would be able to "
                              "write the runner's state, records and evidence; give the agent "
                              "an unprivileged user")
        # Checked now: without them the first attempt would fail late or worse (without
        # CAP_KILL a timed-out agent cannot be ended, and the runner waits on it for ever).
        missing = missing_capabilities()
        if missing:
            raise RunnerError(f"--agent-user {name}: this runner (uid {os.geteuid()}) lacks "
                              f"{', '.join(missing)}, which it needs to run the agent as "
                              "another user and keep it in bounds (docs/runner.md, The two "
                              "users)")
        try:
            owner = os.stat(self.paths.workspace).st_uid
        except OSError as exc:
            raise RunnerError(f"{self.paths.workspace}: {exc}") from None
        if owner != entry.pw_uid:
            raise RunnerError(f"{self.paths.workspace}: the workspace must belong to the agent "
                              f"user {name} (it belongs to uid {owner})")
        python = sendproof.interpreter_for(entry.pw_uid, entry.pw_gid, (
            sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"))
        if python is None:
            raise RunnerError(f"--agent-user {name}: no Python interpreter that user may run "
                              "(for its send shims)")
        agent_dirs = (self.paths.state / AGENT_DIR, self.paths.outbox, self.paths.notify,
                      self.paths.workspace)
        taken = stateowner.claim_state(self.paths.state, agent_dirs,
                                       (os.geteuid(), os.getegid()),
                                       (entry.pw_uid, entry.pw_gid))
        if taken:
            self.log(f"state re-owned for two users: {len(taken)} entries (the runner's "
                     f"unless in {AGENT_DIR}/, the outbox or notify), first {taken[0]}")
        os.chmod(self.paths.state, 0o711)
        for path in (self.paths.state / AGENT_DIR, self.paths.outbox, self.paths.notify):
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.makedirs(self.paths.state / SHIMS_DIR, mode=0o711, exist_ok=True)
        os.chmod(self.paths.state / SHIMS_DIR, 0o711)
        server = sendproof.EvidenceServer(
            self.paths.state / EVIDENCE_SOCKET,
            {"reply": self.paths.sends_log, "notify": self.paths.state / "notifies.jsonl"},
            uid=entry.pw_uid, python=python, log=self.log)
        self.users = AgentUser(name, entry.pw_uid, entry.pw_gid, entry.pw_dir, python, server)
        reposync.run_as(entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def request_stop(self) -> None:
        """Stop soon: the running attempt's group is ended and the task stays in processing/."""
        self.stop_reason = "shutdown"

    # -- the loop -------------------------------------------------------------------------

    def recover(self) -> int:
        """Finish what a stopped runner left in ``processing/``; return how many."""
        count = 0
        for path in self.spool.in_processing():
            if self.stop_reason:
                break
            self.log(f"resuming {path.name} left in processing/")
            self.process(path)
            count += 1
        return count

    def step(self) -> bool:
        """Take the oldest readable inbox message and process it; ``False`` if there is none.

        A message that cannot be read or moved into ``processing/`` (an ``OSError``) is left in
        the inbox for the next scan, and the next message is taken.
        """
        first = self._take_command()  # before anything else: a person may be in command
        held = standing.standing(self.paths.standing_denials)
        if held:
            self._note_held(held)
            return False
        self._held = ""
        pending = self.spool.pending()
        if first:  # the person's message is the next run's input
            pending = [*first, *(p for p in pending if p not in first)]
        names = {p.name for p in pending}
        for name in [n for n in self._unreadable if n not in names]:
            del self._unreadable[name]  # gone or taken: forget it
        for name in [n for n in self._deferred if n not in names]:
            del self._deferred[name]
        now = time.monotonic()
        for path in pending:
            if self._deferred.get(path.name, now) > now:
                continue  # its sync was put off: not yet
            try:
                read_message_file(path)
            except MessageError:
                pass  # not a message file: claimed, then set aside as invalid by process()
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._note_unreadable(path, exc)
                continue
            try:
                claimed = self.spool.claim(path)
            except OSError as exc:
                # It cannot be moved now (a directory the agent's user may not move, a full
                # disk...): like an unreadable message, it stays and the next one is taken.
                self._note_unreadable(path, exc, doing="move this message into processing/")
                continue
            self._unreadable.pop(path.name, None)
            if claimed is not None:
                self.process(claimed)
                return True
        return False

    def _take_command(self) -> list[Path]:
        """Set a person's flag and pause its thread's agent items (team.py), before anything
        else runs; return the person messages to take first. A failure to do so now (an
        ``OSError``) is logged and takes nothing first (the next look tries again)."""
        files = team.TeamFiles(self.paths.state, self.paths.inbox, self.paths.processing)
        try:
            return team.take_command(
                files, log=self.log, release=Path(os.path.realpath(self.paths.release)),
                outbox=self.paths.outbox, agent=self.paths.agent,
                clear_hint=lambda thread: self._clear_command(thread, "--clear-command"))
        except OSError as exc:
            self.log(f"cannot read or write the team's files in {files.team}: {exc}; a "
                     "person's command of a thread is not checked until it can be")
            return []

    def _clear_command(self, permission: str = "PERMISSION",
                       option: str = "--clear-denial") -> str:
        """The command that clears the standing denial of ``permission`` (by default the
        placeholder ``PERMISSION``), ready to paste: the runner by its full path in the release
        in use (``fleet-runner`` is on no one's PATH on a host, and ``fleetctl status`` shows
        the same), with ``--state-dir`` when this runner's is not the default one."""
        runner = self.paths.root / "current" / "runner" / "bin" / "fleet-runner"
        argv = [os.fspath(runner), "--agent", self.paths.agent, "--root",
                os.fspath(self.paths.root)]
        if self.paths.state != self.paths.root / "state" / self.paths.agent:
            argv += ["--state-dir", os.fspath(self.paths.state)]
        return shlex.join([*argv, option, permission])

    def _note_held(self, held: list[dict[str, Any]]) -> None:
        """Log once per set of standing denials that new tasks wait for a person."""
        names = ", ".join(str(d.get("permission")) for d in held)
        if names == self._held:
            return
        self._held = names
        clear = self._clear_command()
        self.log(f"standing denial(s) {names}: no new task starts until a person clears each "
                 f"(messages wait in the inbox): {clear}")

    def _note_unreadable(self, path: Path, exc: OSError, doing: str = "read this message") -> None:
        """Log an inbox message that cannot be read or claimed now (``doing`` says which) once,
        then at most every UNREADABLE_LOG_INTERVAL_S while the error stays the same."""
        error, now = f"{doing}: {exc}", time.monotonic()
        seen = self._unreadable.get(path.name)
        if seen is not None and seen[0] == error and now - seen[1] < UNREADABLE_LOG_INTERVAL_S:
            return
        self._unreadable[path.name] = (error, now)
        self.log(f"{path}: cannot {doing} ({exc}); left in the inbox and tried "
                 f"again at each scan (logged again after {UNREADABLE_LOG_INTERVAL_S:g} s)")

    def serve(self, once: bool = False, release_changed: Callable[[], bool] | None = None) -> str:
        """Recover, then process messages until stopped.

        Args:
            once: return ``"drained"`` when the inbox is empty instead of waiting.
            release_changed: polled between tasks; when true, return ``"release-changed"``
                so the caller can start the new release's runner.

        Returns:
            ``"drained"``, ``"stopped"`` or ``"release-changed"``.

        Raises:
            RunnerError: the config or the release is broken (the message stays in processing/).
        """
        self._take_command()  # what a stopped runner left in processing/ may be paused
        self.recover()
        while not self.stop_reason:
            if self.step():
                # Between tasks too, not only when idle: under steady load the runner must
                # still move to a newly shipped release.
                if (not self.stop_reason and release_changed is not None
                        and release_changed()):
                    return "release-changed"
                continue
            if once:
                return "drained"
            if release_changed is not None and release_changed():
                return "release-changed"
            deadline = time.monotonic() + self.options.poll_s
            while not self.stop_reason and time.monotonic() < deadline:
                time.sleep(min(0.1, self.options.poll_s))
        return "stopped"

    # -- one task -------------------------------------------------------------------------

    def process(self, path: Path) -> str:
        """Process one message in ``processing/`` to its end (or until a stop request).

        Returns:
            ``"pass"``, ``"gave-up"``, ``"denied"``, ``"invalid"``, ``"duplicate"``,
            ``"unreadable"`` or ``"deferred"`` (moved back to the inbox: it cannot be read now,
            or its sync's fetch failed) or ``"stopped"`` (left in processing/ for the next
            start).

        Raises:
            RunnerError: the config or release is broken.
        """
        try:
            message = parse_message(read_message_file(path))
        except MessageError as exc:
            return self._invalid(path, str(exc))
        except OSError as exc:
            # Not its content: it cannot be read now. Back to the inbox, tried again later.
            try:
                back = self.spool.unclaim(path)
            except OSError as move_exc:
                self.log(f"{path}: cannot read this message ({exc}) nor move it back to the "
                         f"inbox ({move_exc}); left in processing/ for the next start")
                return "unreadable"
            self._note_unreadable(back, exc)
            return "unreadable"
        task_dir = self._task_dir(message.id)
        os.makedirs(task_dir, mode=0o700, exist_ok=True)
        try:
            progress = TaskProgress.load(task_dir / "progress.json", message.id, path.name)
        except ValueError as exc:
            raise RunnerError(f"{task_dir / 'progress.json'}: unreadable sentinel: {exc}") from None
        if progress.final and progress.final.get("moved"):
            if message.human:
                # A person's new question under a reused id must not vanish: tell someone
                # (before the move, as for an invalid message).
                escalate(release=Path(os.path.realpath(self.paths.release)),
                         spool=self.paths.notify, env=os.environ, agent=self.paths.agent,
                         task=message.id, kind="duplicate", failures=0,
                         reason=f"inbox message {path.name} from {message.sender_name} in "
                         f"{message.channel} reuses id {message.id}, which already finished; "
                         f"it was not run and is in failed/", detail=message.text)
            dest = self.spool.finish(path, ok=False)
            self.log(f"task {message.id}: duplicate of a finished task, moved to {dest}")
            return "duplicate"
        task = self._open_task(message, path, progress, task_dir)
        if task is None:  # stopped while the baseline was being taken
            return STOPPED
        if task.deferred:
            return self._defer(task)
        if progress.final:
            return self._complete(task)
        if progress.sync and progress.sync.get("status") in (reposync.REFUSED,
                                                             reposync.CONFLICT):
            return self._refuse(task)
        if progress.running:
            self._mark_interrupted(task)
        max_attempts = task.config.max_retries + 1
        while progress.next_attempt <= max_attempts:
            if self.stop_reason:
                return STOPPED
            if not task.release.is_dir():
                # A ship pruned the release this task started on: go on with the one in use
                # rather than die on a missing skills directory.
                task.release = Path(os.path.realpath(self.paths.release))
                self.log(f"task {task.message.id}: its release was pruned; continuing with "
                         f"{task.release.name}")
            verdict = self._attempt(task, progress.next_attempt, max_attempts)
            if verdict == STOPPED:
                return STOPPED
            if verdict in (PASSED, DENIED, FAULT):
                return self._decide(task, verdict)
            if verdict == FAILED and progress.next_attempt <= max_attempts:
                self._back_off(task, failures=sum(1 for a in progress.attempts
                                                  if a.get("verdict") == FAILED))
        return self._decide(task, GAVE_UP)

    def _task_dir(self, task: str) -> Path:
        """``runs/<task>/``, named by the id's encoded form (names.py: a ":" would split the
        agent's PATH). A directory an older runner named by the id itself (a valid id is one
        plain name) is moved to it first, so its progress, records and "finished" mark are
        found: a task under way goes on, a finished id is still a duplicate."""
        encoded = self.paths.runs / encode_name(task)
        legacy = self.paths.runs / task
        if encoded != legacy and not os.path.lexists(encoded) and legacy.is_dir() \
                and not legacy.is_symlink():
            os.rename(legacy, encoded)
            self.log(f"task {task}: its records moved from runs/{task} to {encoded.name}")
        return encoded

    def _open_task(self, message: Message, path: Path, progress: TaskProgress,
                   task_dir: Path) -> _Task | None:
        release = Path(os.path.realpath(self.paths.release))
        config_path = Path(self.paths.config)
        try:
            config_path = release / config_path.relative_to(self.paths.release)
        except ValueError:
            pass  # a config given outside the release
        try:
            config = load_config(config_path)
            check_servable(config, self.paths.agent, release / "skills")
        except ConfigError as exc:
            raise RunnerError(str(exc)) from None
        baseline_path = task_dir / "baseline.json"
        stored = read_json(baseline_path)
        if config.sync is not None and progress.sync is None and not progress.attempts \
                and progress.final is None:
            if self._sync(message, path, progress, config):
                return _Task(message, path, progress, config, release, task_dir, {},
                             deferred=True)
        elif progress.sync is not None:
            # Recorded, but a crash came before the sync sentinel was removed.
            syncing = reposync.read_sentinel(self.paths.sync_sentinel)
            if syncing and syncing.get("task") == message.id:
                reposync.remove_file(self.paths.sync_sentinel)
        check_debt: dict[str, list[str] | None] = {}
        written: dict[str, str] | None = {}
        if isinstance(stored, dict) and isinstance(stored.get("files"), dict):
            baseline, git_start = stored["files"], stored.get("git")
            debt = stored.get("check_debt")
            check_debt = dict(debt) if isinstance(debt, dict) else {}
            saved = read_json(task_dir / CHECK_WRITTEN)
            written = saved if isinstance(saved, dict) else {} if "check_debt" in stored \
                else None
        elif isinstance(stored, dict):  # written by an older runner: the files only
            baseline, git_start, written = stored, None, None
            after = (progress.sync or {}).get("after")
            if after and config.sync:
                git_start = {"repo": True, "head": after, "branch": config.sync.branch}
        else:
            git_start = self._git_start()
            refused = progress.sync is not None and progress.sync.get("status") in (
                reposync.REFUSED, reposync.CONFLICT)
            # Before the snapshot, so that what these runs leave is part of the baseline; not
            # for a task the sync refused (it never runs).
            check_debt = {} if refused else self._baseline_checks(config, task_dir)
            if self.stop_reason:
                # A check cut short said nothing: the next start takes the baseline again.
                return None
            baseline = take_snapshot(self.paths.workspace)
            if config.writes is not None:
                # Copies of what the run may not change, to undo a change it makes anyway.
                store_baseline(self.paths.workspace, baseline, compile_scope(config.writes),
                               task_dir / BASELINE_STORE)
            write_json_atomic(baseline_path, {"files": baseline, "git": git_start,
                                              "check_debt": check_debt})
        if not progress.attempts:
            progress.save()
        return _Task(message, path, progress, config, release, task_dir, baseline, git_start,
                     check_debt=check_debt, check_written=written)

    @contextlib.contextmanager
    def _check_environment(self) -> Iterator[dict[str, str]]:
        """The environment of one check run: plain output, and a HOME and tool caches of its
        own, new and empty (``STATE/check-runs/<random>/``, the agent user's with two users),
        removed afterwards.

        Fresh for every run because the agent may write anything it can reach: a config in
        its own HOME (``~/.config/mypy/config`` with ``ignore_errors``) or a crafted entry in a
        cache the checks kept from run to run (bytecode, mypy's cache) would decide what the
        next check reports. Its processes are gone before a check starts, and the directory's
        name is drawn after that. ``PYTHONNOUSERSITE`` keeps the agent user's site-packages
        out too.
        """
        parent = self.paths.state / CHECK_RUNS_DIR
        if os.path.islink(parent) or (os.path.lexists(parent) and not parent.is_dir()):
            os.unlink(parent)  # not the runner's: never followed, never written through
        os.makedirs(parent, mode=0o711, exist_ok=True)
        os.chmod(parent, 0o711)
        where = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
        try:
            home = where / "home"
            os.mkdir(home, 0o700)
            if self.users is not None:
                for path in (where, home):
                    os.chown(path, self.users.uid, self.users.gid)
            env = gates.check_env({**os.environ,
                                   "FLEET_WORKSPACE": os.fspath(self.paths.workspace)},
                                  cache_dir=where / "cache")
            env.update(HOME=os.fspath(home), PYTHONNOUSERSITE="1")
            for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
                env.pop(name, None)
            if self.users is not None:
                env.update(USER=self.users.name, LOGNAME=self.users.name)
            yield env
        finally:
            _remove_tree(where)

    def _baseline_checks(self, config: AgentConfig,
                         task_dir: Path) -> dict[str, list[str] | None]:
        """Run each declared check once on the workspace as the task finds it: the errors it
        reports then are the existing debt later attempts are judged against
        (:func:`fleet_runner.gates.baseline_debt`), by :func:`_check_key`; ``None`` for a check
        that did not say."""
        out: dict[str, list[str] | None] = {}
        for i, spec in enumerate(config.checks or ()):
            with self._check_environment() as env:
                result = gates.check_gate(
                    spec, self.paths.workspace, (), timeout_s=self.options.check_timeout_s,
                    kill_grace_s=self.options.kill_grace_s,
                    output_path=task_dir / (f"baseline.check-{i + 1}.out"),
                    env=env, should_stop=lambda: self.stop_reason, user=self._as_user,
                    keep_debt_keys=True)
            out[_check_key(spec)] = gates.baseline_debt(result)
        reap_orphans()
        return out

    def _git_start(self) -> dict[str, Any]:
        """Where HEAD is at the baseline, for the commits check of the scope gate."""
        workspace = self.paths.workspace
        if not os.path.lexists(workspace / ".git"):
            return {"repo": False}
        try:
            if not reposync.is_repo_top(workspace):
                return {"repo": False}
            return {"repo": True, "head": reposync.head_or_none(workspace),
                    "branch": reposync.current_branch(workspace)}
        except reposync.GitError as exc:
            self.log(f"cannot read the workspace repository's HEAD ({exc}); commits made "
                     "during the task are not checked against the writes scope")
            return {"repo": False, "error": str(exc)}

    def _defer(self, task: _Task) -> str:
        """Put a task whose sync's fetch failed back in the inbox, to be tried again later."""
        tries = task.progress.sync_deferred
        delay = min(self.options.sync_retry_s * 2 ** (len(tries) - 1), SYNC_RETRY_MAX_S)
        dest = self.spool.unclaim(task.path)
        self._deferred[dest.name] = time.monotonic() + delay
        last = tries[-1]
        self.log(f"task {task.message.id}: {last['summary']}; back in the inbox, tried again in "
                 f"{delay:g} s (failed fetch {len(tries)} of at most {SYNC_FETCH_ATTEMPTS}): "
                 f"{last['detail']}")
        return "deferred"

    def _sync(self, message: Message, path: Path, progress: TaskProgress,
              config: AgentConfig) -> bool:
        """Sync the working repository before a new task's baseline; record the result.

        Returns:
            ``True`` when the sync was put off (a failed fetch, fewer than
            :data:`SYNC_FETCH_ATTEMPTS` times): the task is not run now.
        """
        sentinel = reposync.read_sentinel(self.paths.in_progress)
        if sentinel and sentinel.get("task") == message.id and sentinel.get("start_commit"):
            # Synced before a crash that came before the result was recorded: never again.
            progress.sync = {"status": reposync.SYNCED, "after": sentinel["start_commit"],
                             "summary": "synced before a runner restart (in-progress "
                             "sentinel)"}
            progress.save()
            reposync.remove_file(self.paths.sync_sentinel)
            return False
        if sentinel:
            # A task that ended without removing it (its message is gone from processing/):
            # what it left is not known to be the runner's, so a dirty tree is refused.
            self.log(f"stale in-progress sentinel of task {sentinel.get('task')} removed")
            reposync.remove_file(self.paths.in_progress)
        syncing = reposync.read_sentinel(self.paths.sync_sentinel)
        if syncing and syncing.get("task") != message.id:
            # A sync of a task no longer in processing/: not undone (it may not be the last
            # thing that happened in the repository); the sync below refuses what it left.
            self.log(f"stale sync sentinel of task {syncing.get('task')} removed (its stash, if "
                     f"any: {syncing.get('stash_id') or syncing.get('stash_message')})")
            reposync.remove_file(self.paths.sync_sentinel)
        try:
            leftover = read_json(self.paths.sync_leftover)
        except ValueError:
            leftover = None
        sync = config.sync
        if sync is None:  # the caller syncs only a role with ``sync``
            return False
        synced = read_json(self.paths.synced_upstream)
        known = synced.get("commit") if isinstance(synced, dict) and [
            synced.get("remote"), synced.get("branch")] == [sync.remote, sync.branch] else None
        result = reposync.sync_workspace(
            self.paths.workspace, sync, agent=self.paths.agent, task=message.id,
            leftover=leftover if isinstance(leftover, dict) else None,
            sentinel=self.paths.sync_sentinel,
            known_upstream=known if isinstance(known, str) else None)
        if result.recovered:
            self.log(f"task {message.id}: {result.recovered}")
        if result.status == reposync.RETRY:
            progress.sync_deferred.append({"time": now_iso(), "summary": result.summary,
                                           "detail": result.detail})
            if len(progress.sync_deferred) < SYNC_FETCH_ATTEMPTS:
                progress.save()
                reposync.remove_file(self.paths.sync_sentinel)
                return True
            result.status = reposync.REFUSED
            result.summary += (f" ({len(progress.sync_deferred)} times, the last "
                               f"{len(progress.sync_deferred) - 1} tried again after a wait)")
        progress.sync = result.to_json()
        progress.save()
        reposync.remove_file(self.paths.sync_sentinel)
        self.log(f"task {message.id}: sync {result.status}: {result.summary}")
        # What the next sync compares a rewritten remote with: the commit this one went
        # through to, or, refused for a rewrite, the one before it (refused until a person
        # decides, whatever the workspace's remote-tracking ref says by then).
        compare = result.upstream if result.status == reposync.SYNCED else result.rewritten_from
        if compare:
            write_json_atomic(self.paths.synced_upstream, {
                "remote": sync.remote, "branch": sync.branch, "commit": compare})
        if result.status == reposync.SYNCED:
            reposync.remove_file(self.paths.sync_leftover)  # applied back: now this task's
            reposync.write_sentinel(self.paths.in_progress, task=message.id,
                                    message_file=path.name, attempt=0,
                                    start_commit=result.after or "",  # set when synced
                                    sync=sync)
        return False

    def _synced(self, task: _Task) -> bool:
        """Whether this task runs in a synced repository (the sentinel and commits apply)."""
        return bool(task.progress.sync and task.progress.sync.get("status") == reposync.SYNCED)

    def _refuse(self, task: _Task) -> str:
        """End a task the sync refused (a person's changes, a conflict): never run, escalated."""
        sync = task.progress.sync or {}
        detail = "\n".join(filter(None, [
            "uncommitted changes:\n" + "\n".join(sync["dirty"]) if sync.get("dirty") else "",
            sync.get("detail", "")]))
        task.progress.final = {
            "outcome": REFUSED, "decided": now_iso(), "attempts": 0, "failed_verifications": 0,
            "interrupted_attempts": 0, "escalated": False,
            "kind": "sync-conflict" if sync.get("status") == reposync.CONFLICT else REFUSED,
            "reason": f"Task {task.message.id} ({task.config.agent}) was not run: "
                      f"{sync.get('summary', 'the working repository could not be synced')}",
            "detail": detail}
        task.progress.save()
        return self._complete(task)

    def _mark_interrupted(self, task: _Task, write_ledger: bool = True,
                          inv: Any = None) -> None:
        """Record the attempt left running as interrupted, killing what is left of its group.

        ``inv`` is the attempt's invocation when this runner saw it end (a stop request), else
        ``None`` (a runner that died): what is not known is ``null`` or empty in the record.
        """
        entry = task.progress.running
        assert entry is not None
        killed = False
        if entry.get("pid"):
            killed = kill_stale_group(int(entry["pid"]), entry.get("proc_start"))
        entry.update(state=INTERRUPTED, verdict=INTERRUPTED, ended=now_iso(),
                     stale_group_killed=killed,
                     interrupted_by=RUNNER_STOPPED if inv is not None else RUNNER_DIED)
        why = _interruption_text(entry)
        n = entry["attempt"]
        message = task.message
        write_json_atomic(task.dir / f"attempt-{n}.json", {
            "schema_version": SCHEMA_VERSION, "agent": self.paths.agent, "task": message.id,
            "from": {"kind": message.sender_kind, "name": message.sender_name},
            "attempt": n, "max_attempts": task.config.max_retries + 1, "run": entry["run"],
            "release": entry.get("release"), "started": entry.get("started"),
            "finished": None, "verdict": INTERRUPTED,
            "durations": {"agent_s": round(inv.duration_s, 3) if inv is not None else None,
                          "gates_s": None, "total_s": None},
            "invocation": inv.to_json() if inv is not None else None,
            "changes": {}, "change_counts": {},
            "gates": [], "failed_gates": [], "denials": [],
            "files": {"prompt": f"attempt-{n}.prompt.txt", "stdout": f"attempt-{n}.stdout",
                      "stderr": f"attempt-{n}.stderr"},
            "stale_group_killed": killed, "check_leftovers": [], "scope_request": None,
            "note": f"{why}; it counts against max_retries"})
        calls.remove_shims(self._shim_dir(task, n))
        if write_ledger:  # the turn's line was never written: the runner died before it
            # The calls log survives the runner: the calls made before the crash still count.
            called, tool_calls = calls.count_calls(self._calls_log(task, n))
            append_jsonl(self.paths.ledger, ledger_record(
                agent=self.paths.agent, host=task.config.host, model=task.config.model,
                task=task.message.id, attempt=n, run=entry["run"],
                prefix_tokens=entry.get("prefix_tokens", {}),
                task_prompt_tokens=entry.get("task_prompt_tokens", 0), usage=None,
                duration_s=None, outcome=why, interrupted=True,
                calls=called, tool_calls=tool_calls,
                token_counter=entry.get("token_counter", TOKEN_COUNTER),
                tokens_exact=entry.get("tokens_exact", False)))
        task.progress.save()
        self.log(f"task {task.message.id} attempt {n}: {why} "
                 f"(left-over process group killed: {killed})")

    # -- where the agent's files are (one user, or two: sendproof.py) ------------------------

    @property
    def _as_user(self) -> tuple[int, int] | None:
        """``(uid, gid)`` the agent command and the checks run as, or ``None`` (ours)."""
        return (self.users.uid, self.users.gid) if self.users is not None else None

    @property
    def _agent_dir(self) -> Path:
        """What the agent's user may write in the state: ``STATE`` with one user, else
        ``STATE/agent`` (its own)."""
        return self.paths.state / AGENT_DIR if self.users is not None else self.paths.state

    @property
    def _denials_log(self) -> Path:
        """Where the CLIs record a refusal (they run as the agent's user)."""
        return self._agent_dir / "denials.jsonl" if self.users is not None \
            else self.paths.denials_log

    @property
    def _claimed_sends_log(self) -> Path:
        """``FLEET_SENDS_LOG``: with two users, only the reply CLI's claim (not evidence);
        the runner's own ``sends.jsonl`` is written through its socket."""
        return self._agent_dir / "sends-claimed.jsonl" if self.users is not None \
            else self.paths.sends_log

    def _agent_files(self, task: _Task) -> Path:
        """The task's files the agent writes or reads (calls log, MCP config, scope request):
        ``runs/<task>/`` with one user, ``STATE/agent/<task>/`` (the agent's) with two."""
        if self.users is None:
            return task.dir
        path = self._agent_dir / encode_name(task.message.id)
        if not path.is_dir():
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chown(path, self.users.uid, self.users.gid)
        return path

    def _shim_dir(self, task: _Task, n: int) -> Path:
        """The attempt's shims: readable, never writable, by the agent's user."""
        if self.users is None:
            return task.dir / f"attempt-{n}.shims"
        return self.paths.state / SHIMS_DIR / f"{encode_name(task.message.id)}.{n}"

    def _calls_log(self, task: _Task, n: int) -> Path:
        return self._agent_files(task) / f"attempt-{n}.calls"

    def _agent_env(self, task: _Task, attempt: int, run: str,
                   shim_dir: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        # Non-interactive: agent CLIs and the tools they run must never wait for a person.
        env["CI"] = "1"
        bins = [os.fspath(task.release / "skills" / s / "bin") for s in task.config.skills]
        # The call-counting shims first (calls.py), so the agent's PATH lookups reach them.
        shims = [os.fspath(shim_dir)] if shim_dir is not None else []
        env["PATH"] = os.pathsep.join(shims + bins + [env.get("PATH", os.defpath)])
        env.update(
            FLEET_AGENT=self.paths.agent, FLEET_TASK_ID=task.message.id, FLEET_RUN_ID=run,
            FLEET_ATTEMPT=str(attempt), FLEET_WORKSPACE=os.fspath(self.paths.workspace),
            FLEET_RELEASE=os.fspath(task.release), FLEET_OUTBOX=os.fspath(self.paths.outbox),
            FLEET_NOTIFY_SPOOL=os.fspath(self.paths.notify),
            FLEET_SENDS_LOG=os.fspath(self._claimed_sends_log),
            FLEET_DENIALS_LOG=os.fspath(self._denials_log))
        if task.config.writes is not None:
            env["FLEET_SCOPE_REQUEST"] = os.fspath(self._agent_files(task)
                                                   / scoperequest.REQUEST_FILE)
        if self.users is not None:
            env.update(HOME=self.users.home, USER=self.users.name, LOGNAME=self.users.name)
        if task.message.channel:
            env["FLEET_CHANNEL"] = task.message.channel
        if task.config.model:
            env["FLEET_MODEL"] = task.config.model
        if task.config.credentials_dir:
            env["FLEET_CREDENTIALS"] = task.config.credentials_dir
        return env

    def _attempt(self, task: _Task, n: int, max_attempts: int) -> str:
        """Run attempt ``n``; return ``"pass"``, ``"fail"``, ``"denied"`` or ``"stopped"``."""
        message, config, progress = task.message, task.config, task.progress
        run = f"{message.id}/{n}"
        mcp_config = None
        try:
            if config.uses_mcp_config:
                # The via-mcp servers, for the agent CLI (mcpconfig.py); env values stay in it.
                mcp_config = write_mcp_config(self._agent_files(task) / f"attempt-{n}.mcp.json",
                                              config.direct_servers, self.paths.workspace)
                if self.users is not None:  # the agent CLI reads it as the agent's user
                    os.chown(mcp_config, self.users.uid, self.users.gid)
            argv = config.argv(mcp_config=mcp_config)
            prefix = build_prefix(config.prompt, config.skills, task.release / "skills",
                                  bridged_servers=config.bridged_servers)
        except (ConfigError, PrefixError) as exc:
            raise RunnerError(str(exc)) from None
        except OSError as exc:
            raise RunnerError(f"cannot write the MCP config file: {exc}") from None
        previous = progress.attempts[-1] if progress.attempts else None
        failed_gates = [gates.GateResult(g["name"], gates.FAIL, g["summary"], g.get("output", ""))
                        for g in (previous or {}).get("failed_gates", [])]
        sends_before = evidence.sends_for_task(self.paths.sends_log, message.id)
        prior_commits: list[str] = []
        start_commit = (progress.sync or {}).get("after")
        if self._synced(task) and start_commit:
            try:
                prior_commits = reposync.commits_since(self.paths.workspace, start_commit)
            except reposync.GitError as exc:
                self.log(f"task {message.id}: cannot list its earlier commits: {exc}")
        task_prompt = build_task_prompt(
            message, n, max_attempts, replied=len(sends_before),
            interrupted=bool(previous and previous.get("state") == INTERRUPTED),
            failed_gates=failed_gates, failed_attempt=previous["attempt"] if previous else None,
            prior_commits=prior_commits, since=(start_commit or "")[:12],
            branch=config.sync.branch if config.sync else None,
            writes=config.writes, granted=scoperequest.grants(task.dir)["granted"],
            scope_file=os.fspath(self._agent_files(task) / scoperequest.REQUEST_FILE))
        full_prompt = prefix.text + "\n\n" + task_prompt
        # A file name that is not UTF-8 (in the feedback of a gate) is shown escaped.
        prompt_bytes = full_prompt.encode("utf-8", "backslashreplace")
        (task.dir / f"attempt-{n}.prompt.txt").write_bytes(prompt_bytes)
        prefix_tokens, counter, exact = counted_prefix(
            prefix.components, task.release / "agents" / self.paths.agent / PREFIX_COUNTS)
        entry: dict[str, Any] = {
            "attempt": n, "run": run, "state": RUNNING, "started": now_iso(),
            "release": os.fspath(task.release), "prefix_tokens": prefix_tokens,
            "task_prompt_tokens": count_tokens(task_prompt), "token_counter": counter,
            "tokens_exact": exact}
        progress.attempts.append(entry)
        progress.save()
        if self._synced(task) and start_commit and config.sync:
            reposync.write_sentinel(self.paths.in_progress, task=message.id,
                                    message_file=task.path.name, attempt=n,
                                    start_commit=start_commit, sync=config.sync)

        def on_start(pid: int) -> None:
            entry.update(pid=pid, proc_start=process_start_ticks(pid))
            progress.save()
            if self.users is not None:
                self.users.server.expect(task=message.id, run=run, leader=pid, scripts=scripts)

        watch = evidence.DenialWatch(self._denials_log, run)

        def should_stop() -> str | None:
            return self.stop_reason or watch()

        shim_dir = self._shim_dir(task, n)
        calls_log = self._calls_log(task, n)
        shimmed = calls.write_shims(shim_dir, calls_log, config.skills, task.release / "skills")
        agent_env = self._agent_env(task, n, run, shim_dir)
        scripts: list[str] = []
        if self.users is not None:
            # Sends count only when the runner records them (sendproof.py): the sending CLIs
            # get a send shim, readable by the agent's user, writable only by the runner.
            os.chmod(shim_dir, 0o755)
            for path in shim_dir.iterdir():
                os.chmod(path, 0o755)
            os.chown(calls_log, self.users.uid, self.users.gid)
            scripts = sendproof.write_send_shims(
                shim_dir, shimmed, python=self.users.python,
                socket_path=self.paths.state / EVIDENCE_SOCKET, env=agent_env,
                calls_log=calls_log)
        started = time.monotonic()
        inv = run_in_group(
            argv, stdin=prompt_bytes, cwd=self.paths.workspace,
            env=agent_env, timeout_s=config.timeout_s,
            kill_grace_s=self.options.kill_grace_s,
            stdout_path=task.dir / f"attempt-{n}.stdout",
            stderr_path=task.dir / f"attempt-{n}.stderr", on_start=on_start,
            should_stop=should_stop, user=self._as_user)
        if self.users is not None:
            self.users.server.clear()
        reap_orphans()
        calls.remove_shims(shim_dir)  # the group is gone: no call can come in any more
        called, tool_calls = calls.count_calls(calls_log)
        append_jsonl(self.paths.ledger, ledger_record(
            agent=self.paths.agent, host=config.host, model=config.model, task=message.id,
            attempt=n, run=run, prefix_tokens=prefix_tokens,
            task_prompt_tokens=entry["task_prompt_tokens"],
            usage=parse_usage(inv.stdout_path), duration_s=inv.duration_s,
            outcome=inv.describe(), interrupted=inv.stopped == "shutdown",
            calls=called, tool_calls=tool_calls, token_counter=entry["token_counter"],
            tokens_exact=entry["tokens_exact"]))
        if inv.stopped == "shutdown":
            self._mark_interrupted(task, write_ledger=False, inv=inv)
            return STOPPED

        after = take_snapshot(self.paths.workspace)
        all_changes = diff_snapshots(task.baseline, after)
        changes, leftovers = without_leftovers(all_changes, config.check_leftovers,
                                               task.check_written, after)
        report = read_agent_report(inv.stdout_path, agent_env)
        # The scope this attempt is judged by: the role's, plus what earlier attempts were
        # granted on request; this attempt's own request counts from the next one.
        writes = self._writes(task)
        committed, commit_error = self._committed(task)
        scope_request = None
        if config.writes is not None:
            scope_request = scoperequest.decide(
                task.dir, n, [*all_changes.added, *all_changes.modified, *all_changes.removed,
                              *(committed or ())], config.scope_requests,
                request=self._agent_files(task) / scoperequest.REQUEST_FILE)
        # Every place a refusal shows: the CLIs' own record, the agent CLI's structured result
        # and its transcript, and the agent command's exit status 77.
        denials = evidence.denials_for_run(self._denials_log, run) + report.denials
        denied = bool(denials) or inv.exit_status == evidence.DENIED_EXIT_STATUS
        if denied and not denials:
            denials = [{"cli": "(agent command)", "what": "the agent command exited with "
                        f"status {evidence.DENIED_EXIT_STATUS} (permission refused)"}]
        gates_started = time.monotonic()
        if denied:
            # Stop at once: no verification, no retry.
            results = [gates.run_gate(inv, report=report,
                                      expect_result=config.expects_result)]
            verdict = DENIED
        else:
            results = [gates.run_gate(inv, report=report,
                                      expect_result=config.expects_result)]
            # The scope gate first: what it undoes is gone before the checks judge, so their
            # feedback never names a file that is no longer there.
            scope_result = self._scope_gate(task, changes, writes, committed, commit_error)
            judged, judged_after = changes, after
            if scope_result.details.get("undone_count"):
                judged_after = take_snapshot(self.paths.workspace)
                judged, _ = without_leftovers(diff_snapshots(task.baseline, judged_after),
                                              config.check_leftovers, task.check_written,
                                              judged_after)
            for i, spec in enumerate(config.checks or (None,)):
                with self._check_environment() as check_env:
                    results.append(gates.check_gate(
                        spec, self.paths.workspace, judged.touched,
                        timeout_s=self.options.check_timeout_s,
                        kill_grace_s=self.options.kill_grace_s,
                        output_path=task.dir / (f"attempt-{n}.check.out" if i == 0
                                                else f"attempt-{n}.check-{i + 1}.out"),
                        env=check_env, should_stop=lambda: self.stop_reason,
                        user=self._as_user, cwd_was_there=spec is not None and any(
                            p.startswith(spec.cwd.rstrip("/") + "/") for p in task.baseline),
                        baseline_debt=task.check_debt.get(_check_key(spec))
                        if spec is not None else None))
            if config.checks and task.check_written is not None:
                # What the checks wrote now is theirs at the next attempt, unless changed.
                task.check_written.update(check_written(
                    judged_after, self.paths.workspace, config.check_leftovers))
                write_json_atomic(task.dir / CHECK_WRITTEN, task.check_written)
            results += [
                gates.anti_silence_gate(message.human, message.id, message.channel,
                                        evidence.sends_for_task(self.paths.sends_log, message.id)),
                scope_result,
            ]
            reap_orphans()
            if self.stop_reason:  # stopped while verifying: the attempt is redone next start
                self._mark_interrupted(task, write_ledger=False, inv=inv)
                return STOPPED
            if any(r.details.get("fault") for r in results):
                verdict = FAULT  # the check itself cannot judge: no retry can help
            else:
                verdict = FAILED if any(r.failed for r in results) else PASSED
        finished = time.monotonic()
        failed = [r for r in results if r.failed]
        write_json_atomic(task.dir / f"attempt-{n}.json", {
            "schema_version": SCHEMA_VERSION, "agent": self.paths.agent, "task": message.id,
            "from": {"kind": message.sender_kind, "name": message.sender_name},
            "attempt": n, "max_attempts": max_attempts, "run": run,
            "release": os.fspath(task.release), "started": entry["started"],
            "finished": now_iso(), "verdict": verdict,
            "durations": {"agent_s": round(inv.duration_s, 3),
                          "gates_s": round(finished - gates_started, 3),
                          "total_s": round(finished - started, 3)},
            "invocation": inv.to_json(),
            "changes": {k: v[:CHANGES_LISTED_MAX] for k, v in changes.to_json().items()},
            "change_counts": {k: len(v) for k, v in changes.to_json().items()},
            "check_leftovers": leftovers[:CHANGES_LISTED_MAX],
            "scope_request": scope_request,
            "gates": [r.to_json() for r in results], "failed_gates": [r.name for r in failed],
            "denials": denials,
            "files": {"prompt": f"attempt-{n}.prompt.txt", "stdout": f"attempt-{n}.stdout",
                      "stderr": f"attempt-{n}.stderr"},
            "stale_group_killed": False, "note": None})
        entry.update(state=FINISHED, verdict=verdict, ended=now_iso(),
                     failed_gates=[{"name": r.name, "summary": r.summary, "output": r.output,
                                    "fault": bool(r.details.get("fault"))} for r in failed],
                     denials=denials)
        progress.save()
        self.log(f"task {message.id} attempt {n}/{max_attempts}: {verdict}"
                 + "".join(f"; {r.name}: {r.summary}" for r in failed))
        return verdict

    def _back_off(self, task: _Task, failures: int) -> None:
        """Wait before the retry that follows failed verification number ``failures``:
        ``retry_backoff_s`` doubled per earlier failure, at most :data:`RETRY_BACKOFF_MAX_S`;
        a stop request ends the wait."""
        base = self.options.retry_backoff_s
        if base <= 0 or failures < 1:
            return
        delay = min(base * 2 ** (failures - 1), RETRY_BACKOFF_MAX_S)
        self.log(f"task {task.message.id}: retrying in {delay:g} s (failed verification "
                 f"{failures})")
        deadline = time.monotonic() + delay
        while not self.stop_reason and time.monotonic() < deadline:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def _writes(self, task: _Task) -> list[str] | None:
        """The role's ``writes`` and a literal pattern per path granted on request so far."""
        if task.config.writes is None:
            return None
        granted = scoperequest.grants(task.dir)["granted"]
        return [*task.config.writes, *map(scoperequest.literal_pattern, granted)]

    def _committed(self, task: _Task) -> tuple[list[str] | None, str | None]:
        """The paths the commits made since the baseline changed (``None`` outside a git
        repository or without ``writes``), and why they could not be read, or ``None``."""
        start = task.git_start or {}
        if task.config.writes is None or not start.get("repo"):
            return None, None
        try:
            return list(reposync.committed_paths(self.paths.workspace, start.get("head"),
                                                 start.get("branch"))), None
        except reposync.GitError as exc:
            return None, str(exc)

    def _scope_gate(self, task: _Task, changes: Any, writes: list[str] | None,
                    committed: list[str] | None, error: str | None) -> gates.GateResult:
        """The scope gate over the workspace's changes and, in a git repository, the files
        the commits made since the baseline changed; what it finds outside is undone."""
        start = task.git_start or {}
        result = gates.scope_gate(writes, changes, committed=committed, commit_error=error,
                                  start_commit=start.get("head"))
        if writes is None or not result.failed:
            return result
        scope = compile_scope(writes)
        stray = [p for p in (*changes.added, *changes.modified, *changes.removed)
                 if not scope.allows(p)]
        if not stray:
            return result
        undone = undo_changes(self.paths.workspace, stray, task.baseline,
                              task.dir / BASELINE_STORE, owner=self._as_user)
        details = {**result.details, "undone": undone.undone[:gates.LIST_MAX],
                   "undone_count": len(undone.undone), "undo_failed": undone.failed}
        text = result.output.replace(
            "Put each of these back as it was before the task (delete what you added, restore "
            "what you changed or removed) and write only inside the scope.",
            "The runner has put each of these back as it was before the task (what you added "
            "is deleted, what you changed or removed is restored, modes included): do not "
            "change them again, write only inside the scope.")
        summary = result.summary + f"; {len(undone.undone)} undone"
        if undone.failed:
            # The workspace is not as the baseline says outside the scope: no retry should
            # build on it.
            details["fault"] = True
            summary += (f", {len(undone.failed)} could not be undone: "
                        + "; ".join(undone.failed[:3]))
        return dataclasses.replace(result, summary=summary, output=text, details=details)

    # -- the end of a task ----------------------------------------------------------------

    def _decide(self, task: _Task, outcome: str) -> str:
        attempts = task.progress.attempts
        # A failed verification is an attempt whose gates ran and failed; an interrupted one
        # counts against max_retries but verified nothing.
        failures = sum(1 for a in attempts if a.get("verdict") == FAILED)
        interrupted = sum(1 for a in attempts if a.get("verdict") == INTERRUPTED)
        last = attempts[-1] if attempts else {}
        final: dict[str, Any] = {"outcome": outcome, "decided": now_iso(),
                                 "attempts": len(attempts), "failed_verifications": failures,
                                 "interrupted_attempts": interrupted, "escalated": False}
        history = _attempt_history(attempts)
        if outcome == FAULT:
            faults = [g for g in last.get("failed_gates", []) if g.get("fault")] or \
                last.get("failed_gates", [])
            final["kind"] = "check-fault"
            final["reason"] = (
                f"Task {task.message.id} ({task.config.agent}) stopped on attempt "
                f"{last.get('attempt')}: the check cannot judge the work, a fault of the host "
                f"or the role, not of the agent: "
                + "; ".join(f"{g['name']}: {g['summary']}" for g in faults)
                + ". Not retried (no model run can fix it).\nAttempts:\n" + history)
            final["detail"] = "\n\n".join(f"[{g['name']}]\n{g.get('output', '')}"
                                           for g in faults)
        elif outcome == GAVE_UP:
            if last.get("verdict") == INTERRUPTED:
                last_failure = _interruption_text(last)
                detail = ""
            else:
                last_failure = "; ".join(f"{g['name']}: {g['summary']}"
                                         for g in last.get("failed_gates", []))
                detail = "\n\n".join(f"[{g['name']}]\n{g.get('output', '')}"
                                     for g in last.get("failed_gates", []))
            counts = f"{failures} failed verification(s)" + (
                f" and {interrupted} interrupted attempt(s)" if interrupted else "")
            final["reason"] = (
                f"Task {task.message.id} ({task.config.agent}) gave up after {counts} in "
                f"{len(attempts)} attempt(s) (max_retries="
                f"{task.config.max_retries}). Last failure (attempt {last.get('attempt')}): "
                f"{last_failure}\nAttempts:\n{history}")
            final["detail"] = detail
        elif outcome == DENIED:
            blocked = "; ".join(f"{d.get('cli', '?')}: {d.get('what', '?')}"
                                + (f" ({d['detail']})" if d.get("detail") else "")
                                for d in last.get("denials", []))
            held = standing.record(self.paths.standing_denials, last.get("denials", []),
                                   task=task.message.id, run=str(last.get("run")),
                                   clear=self._clear_command)
            final["reason"] = (f"Task {task.message.id} ({task.config.agent}) stopped: permission "
                               f"denied on attempt {last.get('attempt')}: {blocked}. Not retried. "
                               f"Standing denial(s) {', '.join(held)}: no new task of this "
                               f"agent starts until a person clears each: "
                               + "; ".join(self._clear_command(p) for p in held)
                               + f"\nAttempts:\n{history}")
            final["standing_denials"] = held
            final["detail"] = tail_text(task.dir / f"attempt-{last.get('attempt')}.stderr", 4000)
            final["blocked"] = last.get("denials", [])
        denied_requests = scoperequest.grants(task.dir)["denied"]
        if denied_requests and outcome != PASSED:
            final["reason"] = final.get("reason", "") + "\nScope requests denied:\n" + "\n".join(
                f"  attempt {d.get('attempt')}: {d.get('path')}: {d.get('why')}"
                for d in denied_requests)
        task.progress.final = final
        task.progress.save()
        return self._complete(task)

    def _complete(self, task: _Task) -> str:
        """Escalate if needed and not done yet, write the result, move the message."""
        progress, final = task.progress, task.progress.final
        assert final is not None
        outcome = final["outcome"]
        if outcome != PASSED and not final.get("escalated"):
            # The notify CLI may need the agent's chat credentials, as when the agent runs it.
            env = dict(os.environ)
            if task.config.credentials_dir:
                env["FLEET_CREDENTIALS"] = task.config.credentials_dir
            final["escalation"] = escalate(
                release=task.release, spool=self.paths.notify, env=env,
                agent=self.paths.agent, task=task.message.id, kind=final.get("kind", outcome),
                failures=final.get("failed_verifications", 0), reason=final.get("reason", ""),
                detail=final.get("detail", ""))
            final["escalated"] = True
            progress.save()
            self.log(f"task {task.message.id}: {outcome}; "
                     + _escalation_text(final["escalation"]))
        write_json_atomic(task.dir / "result.json", {
            "schema_version": SCHEMA_VERSION, "agent": self.paths.agent, "task": task.message.id,
            "outcome": outcome, "attempts": final.get("attempts"),
            "failed_verifications": final.get("failed_verifications"),
            "interrupted_attempts": final.get("interrupted_attempts"),
            "reason": final.get("reason"), "escalation": final.get("escalation"),
            "decided": final.get("decided"), "sync": progress.sync})
        if self._synced(task):
            # Before the message moves: a crash in between redoes this, never skips it.
            try:
                reposync.record_leftover(self.paths.sync_leftover, self.paths.workspace,
                                         task.message.id)
            except reposync.GitError as exc:
                self.log(f"task {task.message.id}: cannot record what it left uncommitted "
                         f"({exc}); the next task will refuse a dirty tree")
        sentinel = reposync.read_sentinel(self.paths.in_progress)
        if sentinel and sentinel.get("task") == task.message.id:
            reposync.remove_file(self.paths.in_progress)
        dest = self.spool.finish(task.path, ok=outcome == PASSED)
        final.update(moved=True, moved_to=os.path.relpath(dest, self.paths.state))
        progress.save()
        return outcome

    def _invalid(self, path: Path, why: str) -> str:
        # Escalate before the move: after a crash in between, a person may hear twice, never
        # not at all.
        escalate(release=Path(os.path.realpath(self.paths.release)), spool=self.paths.notify,
                 env=os.environ, agent=self.paths.agent, task=path.name[:-5], kind="invalid",
                 failures=0, reason=f"inbox message {path.name} is invalid ({why}); it was not "
                 f"run and is in failed/", detail="")
        dest = self.spool.finish(path, ok=False)
        self.log(f"{path.name}: invalid message ({why}); moved to {dest}")
        return "invalid"
