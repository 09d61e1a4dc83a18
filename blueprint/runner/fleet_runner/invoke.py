"""Running a command in its own process group, with a wall-clock timeout, and nothing left over.

Used for the agent command and for the check command alike:

- the command gets a new session (``start_new_session``), so it leads its own process group and
  has no controlling terminal; everything it starts is in that group unless it leaves on purpose;
- its stdin is a pipe: the input is written by a helper thread (a command that never reads
  cannot block the runner) and the pipe is closed once written, so the command sees end of file;
- stdout and stderr go to files (no pipe to fill, nothing lost when a grandchild keeps them
  open), optionally merged into one;
- the wall-clock timeout, a caller's stop request (a permission denial, a shutdown) or the
  leader's exit ends the whole group: SIGTERM to the group, ``kill_grace_s`` seconds for the
  leader to exit, then SIGKILL to the group; members left after the leader exited get SIGKILL;
- every member is then reaped: the runner makes itself a child subreaper
  (:func:`become_subreaper`, Linux) so orphaned grandchildren are reparented to it and it can
  wait for them, until ``killpg(pgid, 0)`` says the group is gone.

A process that calls ``setsid()`` (or ``setpgid()``) leaves the group, so the group alone does
not contain a run. Every descendant is also followed by its parentage: while the command runs,
its process tree (``/proc``) is read at every poll, and once the group is gone every process
seen in that tree, and every child of this process that started during the run (an orphan
reparented to the subreaper), is killed (SIGKILL) with all its own descendants and reaped. The
record lists each one (``escaped_killed``: pid and command line). Where the host offers
one, each run also gets its own cgroup (:mod:`fleet_runner.cgroup`), which no process can leave:
what is still in it is killed first. The systemd unit (``KillMode=control-group``) also ends
anything left when the service stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet_runner import cgroup

PR_SET_CHILD_SUBREAPER = 36
REAP_WAIT_S = 5.0
"""Seconds to wait for a killed group's members to be gone before giving up (reported)."""


@dataclass(frozen=True, slots=True)
class Invocation:
    """What happened to one command run.

    Attributes:
        argv: the command.
        pid: the leader's pid (= the group id), or ``None`` if it could not start.
        exit_status: the leader's exit status, or ``None`` if a signal ended it or it never ran.
        signal: the signal number that ended the leader, or ``None``.
        stopped: why the runner ended the group early: ``"timeout"``, or a reason returned by
            ``should_stop`` (``"denied"``, ``"shutdown"``), or ``None``.
        leftovers_killed: members were still alive after the leader exited and got SIGKILL.
        group_gone: every member of the group was reaped before returning.
        start_error: why the command could not start (``OSError`` text), or ``None``.
        duration_s: wall-clock seconds from start to the leader's end.
        stdout_path: captured stdout (stdout and stderr when merged).
        stderr_path: captured stderr, or ``None`` when merged.
        limit_s: the wall-clock limit it ran with.
        escaped_killed: descendants that had left the group and had to be killed, each
            ``{"pid", "cmd"}``.
        containment: ``"cgroup"`` (the run had its own cgroup: :mod:`fleet_runner.cgroup`)
            or ``"process-tree"`` (the group, the subreaper and ``/proc`` only); ``None``
            when it never ran.
    """

    argv: tuple[str, ...]
    pid: int | None
    exit_status: int | None
    signal: int | None
    stopped: str | None
    leftovers_killed: bool
    group_gone: bool
    start_error: str | None
    duration_s: float
    stdout_path: Path
    stderr_path: Path | None
    limit_s: float | None = None
    escaped_killed: tuple[dict, ...] = ()
    containment: str | None = None

    @property
    def timed_out(self) -> bool:
        """Whether the wall-clock timeout ended it."""
        return self.stopped == "timeout"

    def describe(self) -> str:
        """One line: how the command ended."""
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.stopped == "timeout":
            limit = f" (limit {self.limit_s:g} s)" if self.limit_s is not None else ""
            return (f"timed out{limit}; its process group was killed "
                    f"{self.duration_s:.1f} s after the start, grace period included")
        if self.stopped:
            return f"stopped by the runner ({self.stopped}); its process group was killed"
        if self.signal is not None:
            return f"killed by signal {_signal_name(self.signal)}"
        return f"exited with status {self.exit_status}"

    def to_json(self) -> dict:
        """The record form (paths as strings)."""
        return {"argv": list(self.argv), "pid": self.pid, "exit_status": self.exit_status,
                "signal": _signal_name(self.signal) if self.signal else None,
                "stopped": self.stopped, "timed_out": self.timed_out,
                "leftovers_killed": self.leftovers_killed, "group_gone": self.group_gone,
                "start_error": self.start_error, "duration_s": round(self.duration_s, 3),
                "escaped_killed": list(self.escaped_killed), "containment": self.containment,
                "outcome": self.describe()}


def _signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


_SUBREAPER = False


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``prctl``), so orphaned descendants are
    reparented to it and can be reaped. Returns whether it worked."""
    global _SUBREAPER
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _SUBREAPER = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _SUBREAPER = False
    return _SUBREAPER


def _process_table() -> dict[int, tuple[int, int]]:
    """Every process: pid → (parent pid, start ticks), from ``/proc`` (empty elsewhere)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
            fields = data[data.rindex(b")") + 2:].split()
            table[int(name)] = (int(fields[1]), int(fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    """The pids below ``roots`` in ``table`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return ""


def _end_escaped(seen: dict[int, int], since_ticks: int | None) -> list[dict]:
    """Kill and reap what is left of a run outside its group: every process in ``seen``
    (pid → start ticks) still alive as that process, every child of this subreaper started at
    or after ``since_ticks``, and all their descendants. Returns ``{"pid", "cmd"}`` of each."""
    table = _process_table()
    targets = {pid for pid, ticks in seen.items() if table.get(pid, (0, None))[1] == ticks}
    if _SUBREAPER and since_ticks is not None:
        me = os.getpid()
        targets |= {pid for pid, (ppid, ticks) in table.items()
                    if ppid == me and ticks >= since_ticks}
    targets |= _descendants(targets, table)
    killed = []
    for pid in sorted(targets):
        killed.append({"pid": pid, "cmd": _cmdline(pid)})
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + REAP_WAIT_S
    while targets and time.monotonic() < deadline:
        reap_orphans()
        now = _process_table()
        targets = {p for p in targets if p in now and now[p][1] == table[p][1]
                   and not _zombie(p)}
        if targets:
            time.sleep(0.01)
    reap_orphans()
    return killed


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].split()[0] == b"Z"
    except (OSError, ValueError, IndexError):
        return True


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has any member (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_orphans() -> int:
    """Reap every child that has exited (reparented orphans); return how many. Call it only
    when no ``Popen`` of this process is outstanding."""
    count = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return count
        if pid == 0:
            return count
        count += 1


def reap_group(pgid: int, wait_s: float = REAP_WAIT_S) -> bool:
    """SIGKILL group ``pgid`` and reap until it has no member; return whether it is gone."""
    deadline = time.monotonic() + wait_s
    while group_alive(pgid):
        _killpg(pgid, signal.SIGKILL)
        reap_orphans()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    reap_orphans()
    return True


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    ``None``: with the pid it identifies a process across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def kill_stale_group(pgid: int, start_ticks: int | None) -> bool:
    """End what is left of a group started by an earlier runner process (after a crash).

    The group is killed only if it is still that group: its leader has the recorded start time,
    or the leader is gone while members remain (a pid equal to a live group id is never handed
    out again, so such members can only be the old group's). Returns whether a group was killed.
    """
    if not group_alive(pgid):
        return False
    ticks = process_start_ticks(pgid)
    if ticks is not None and start_ticks is not None and ticks != start_ticks:
        return False  # the pid is someone else's now
    if ticks is None and os.path.exists(f"/proc/{pgid}"):
        return False  # cannot tell: leave it alone
    _killpg(pgid, signal.SIGKILL)
    reap_group(pgid)
    return True


def run_in_group(argv: Sequence[str], *, stdin: bytes, cwd: Path, env: Mapping[str, str],
                 timeout_s: float, kill_grace_s: float, stdout_path: Path,
                 stderr_path: Path | None = None,
                 on_start: Callable[[int], None] | None = None,
                 should_stop: Callable[[], str | None] | None = None,
                 poll_s: float = 0.05, user: tuple[int, int] | None = None) -> Invocation:
    """Run ``argv`` in a new process group and return how it ended.

    Args:
        argv: the command.
        stdin: bytes written to its stdin, which is then closed.
        cwd: its working directory.
        env: its whole environment.
        timeout_s: wall-clock seconds before the group is ended.
        kill_grace_s: seconds between SIGTERM and SIGKILL to the group.
        stdout_path: file for stdout (created or truncated).
        stderr_path: file for stderr, or ``None`` to merge it into stdout.
        on_start: called with the pid as soon as the command runs (to record it).
        should_stop: polled every ``poll_s`` seconds; a non-empty string ends the group early
            and is recorded as the reason.
        poll_s: seconds between polls.
        user: ``(uid, gid)`` to run the command as (no supplementary groups), or ``None``:
            this process's user. Switching needs root or ``CAP_SETUID``/``CAP_SETGID``.

    A command that cannot start (not found, not executable) is reported in ``start_error``;
    nothing is raised for it.
    """
    argv = tuple(argv)
    started = time.monotonic()
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(stdout_path, "wb"))
        err = files.enter_context(open(stderr_path, "wb")) if stderr_path else subprocess.STDOUT
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd,
                                    env=dict(env), start_new_session=True, close_fds=True,
                                    user=user[0] if user else None,
                                    group=user[1] if user else None,
                                    extra_groups=[] if user else None)
        except OSError as exc:
            return Invocation(argv, None, None, None, None, False, True,
                              f"{exc.strerror or exc} ({argv[0]})", 0.0, Path(stdout_path),
                              Path(stderr_path) if stderr_path else None)
    pgid = proc.pid
    run_cgroup = cgroup.create()  # where the host offers one: nothing can leave it
    if run_cgroup is not None and not run_cgroup.add(pgid):
        run_cgroup.remove()
        run_cgroup = None
    since_ticks = process_start_ticks(pgid)
    seen: dict[int, int] = {}  # every descendant seen while it ran: pid -> start ticks
    if on_start is not None:
        on_start(pgid)
    feeder = threading.Thread(target=_feed, args=(proc, stdin), daemon=True)
    feeder.start()

    deadline = started + timeout_s
    stopped = None
    while True:
        try:
            proc.wait(timeout=poll_s)
            break
        except subprocess.TimeoutExpired:
            pass
        _note_tree(pgid, seen)
        if time.monotonic() >= deadline:
            stopped = "timeout"
        elif should_stop is not None:
            stopped = should_stop() or None
        if stopped:
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=kill_grace_s)
            except subprocess.TimeoutExpired:
                pass
            _killpg(pgid, signal.SIGKILL)
            proc.wait()
            break
    duration = time.monotonic() - started
    leftovers = not stopped and group_alive(pgid)
    gone = reap_group(pgid)
    # The group is gone: what is left escaped it. The cgroup holds all of it; the process tree
    # seen and the subreaper's children catch what started before the move into it.
    escaped = run_cgroup.kill() if run_cgroup is not None else []
    if run_cgroup is not None:
        run_cgroup.remove()
    known = {e["pid"] for e in escaped}
    escaped += [e for e in _end_escaped(seen, since_ticks) if e["pid"] not in known]
    feeder.join(timeout=1.0)
    status = proc.returncode
    return Invocation(
        argv=argv, pid=pgid,
        exit_status=status if status is not None and status >= 0 else None,
        signal=-status if status is not None and status < 0 else None,
        stopped=stopped, leftovers_killed=leftovers, group_gone=gone, start_error=None,
        duration_s=duration, stdout_path=Path(stdout_path),
        stderr_path=Path(stderr_path) if stderr_path else None, limit_s=timeout_s,
        escaped_killed=tuple(escaped),
        containment="cgroup" if run_cgroup is not None else "process-tree")


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children`` (``[]`` when it is gone), or
    ``None`` when the kernel does not offer those files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(c) for c in fh.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except (OSError, ValueError):
            continue
    return out


def _note_tree(root: int, seen: dict[int, int]) -> None:
    """Add every process now below ``root`` to ``seen`` (pid → start ticks): through the
    children files (cheap: only the tree is read), else the whole process table."""
    found: list[int] = []
    todo = [root]
    while todo:
        children = _children(todo.pop())
        if children is None:
            table = _process_table()
            for pid in _descendants({root}, table):
                seen.setdefault(pid, table[pid][1])
            return
        found += children
        todo += children
    for pid in found:
        if pid not in seen:
            ticks = process_start_ticks(pid)
            if ticks is not None:
                seen[pid] = ticks


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    stdin = proc.stdin
    if stdin is None:  # started without a pipe: nothing to feed
        return
    try:
        if data:
            stdin.write(data)
    except OSError:  # the command ended or closed stdin without reading it all
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass
