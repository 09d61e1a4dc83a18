"""A cgroup per run, where the host offers one: nothing a run starts can leave it.

A process can leave its process group (``setsid``) and its parent (a double fork), but not
its cgroup: only a process allowed to write a ``cgroup.procs`` file may move it. So when the
host lets the runner create a cgroup (version 2) below its own, every run of a command gets
one (``fleet-run-AGENT-STATE-PID-N``, STATE 8 hex digits naming the agent's state directory,
so two roots with an agent of the same name on one machine never sweep each other's), the
command is moved into it as soon as it has started, and everything it starts is born there.
When the command is over, every process still in it is listed (pid and command line, for the
run record) and killed at once (``cgroup.kill``, Linux 5.14; else SIGKILL to each), and the
cgroup removed once empty.

A runner that died leaves its run's cgroup behind, maybe with processes in it: the agent's
next runner removes those of its agent whose runner is gone (:func:`sweep`), killing what is
left in them, when it starts.

The host offers one when a cgroup2 hierarchy is mounted (``/proc/self/mountinfo``) and the
runner may create a directory in its own cgroup there (``/proc/self/cgroup``: root, or a
systemd unit with ``Delegate=yes``). Otherwise :func:`create` returns ``None`` and the runner's
other containment (the process group, the subreaper and the process tree followed through
``/proc``: :mod:`fleet_runner.invoke`) is all there is; it also stays in force with a cgroup,
for the instant between the command's start and its move.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

WAIT_S = 5.0
"""Seconds to wait for a killed cgroup to be empty."""
_COUNTER = itertools.count(1)
_BASE: list[Path | None] = []  # memo of :func:`base` ([] until first asked)
_OWNER = ["-"]  # the agent this process runs for (:func:`set_owner`)
PREFIX = "fleet-run-"


def owner_key(agent: str, state_dir: Path) -> str:
    """``AGENT-XXXXXXXX``: the agent and the first 8 hex digits of the sha256 of its state
    directory's absolute path. The agent's next runner (same root) finds its runs' cgroups by it;
    a runner of an agent of the same name under another root does not."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(state_dir))).hexdigest()[:8]
    return f"{agent}-{digest}"


def set_owner(owner: str) -> None:
    """Name this process's run cgroups for ``owner`` (:func:`owner_key`), so its next runner
    can sweep them."""
    _OWNER[0] = owner


def _mount_point() -> Path | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                dash = fields.index("-") if "-" in fields else -1
                if dash > 0 and fields[dash + 1] == "cgroup2":
                    return Path(fields[4])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _own_path() -> str | None:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


def base() -> Path | None:
    """This process's cgroup2 directory when the runner may create cgroups in it, else
    ``None`` (decided once per process)."""
    if _BASE:
        return _BASE[0]
    found = None
    mount, own = _mount_point(), _own_path()
    if mount is not None and own is not None:
        candidate = mount / own.lstrip("/")
        probe = candidate / f"fleet-probe-{os.getpid()}"
        try:
            os.mkdir(probe)
            os.rmdir(probe)
            found = candidate
        except OSError:
            found = None
    _BASE.append(found)
    return found


@dataclass
class RunCgroup:
    """One run's cgroup (:func:`create`).

    Attributes:
        path: its directory.
    """

    path: Path

    def add(self, pid: int) -> bool:
        """Move process ``pid`` into it; return whether that worked."""
        try:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The processes in it now."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> list[dict]:
        """Kill every process in it and wait until it is empty (at most :data:`WAIT_S`);
        return ``{"pid", "cmd"}`` of each process killed."""
        from fleet_runner.invoke import _cmdline, reap_orphans  # one module, one cycle

        found = self.pids()
        killed = [{"pid": pid, "cmd": _cmdline(pid)} for pid in found]
        if not found:
            return []
        try:
            (self.path / "cgroup.kill").write_text("1\n")
        except OSError:
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        deadline = time.monotonic() + WAIT_S
        while self.pids() and time.monotonic() < deadline:
            reap_orphans()
            time.sleep(0.01)
        reap_orphans()
        return killed

    def remove(self) -> None:
        """Remove it (nothing if it is not empty or gone)."""
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def create() -> RunCgroup | None:
    """A new cgroup for one run, or ``None`` when the host offers none (module docstring)."""
    where = base()
    if where is None:
        return None
    path = where / f"{PREFIX}{_OWNER[0]}-{os.getpid()}-{next(_COUNTER)}"
    try:
        os.mkdir(path)
    except OSError:
        return None
    return RunCgroup(path)


def sweep(agent: str) -> list[dict]:
    """Remove the run cgroups of ``agent`` (an :func:`owner_key`) whose runner process is
    gone, killing what is still in them; return ``{"cgroup", "killed"}`` for each removed
    (nothing without a cgroup base). A runner whose pid is alive (even reused by another
    process) is left alone."""
    where = base()
    if where is None:
        return []
    out = []
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return []
    for name in names:
        if not name.startswith(f"{PREFIX}{agent}-"):
            continue
        try:
            owner, pid, _ = name[len(PREFIX):].rsplit("-", 2)
            alive = owner == agent and os.path.exists(f"/proc/{int(pid)}")
        except ValueError:
            continue
        if owner != agent or alive:
            continue
        stale = RunCgroup(where / name)
        killed = stale.kill()
        stale.remove()
        out.append({"cgroup": name, "killed": killed})
    return out
