"""Sends proven through the runner: evidence the agent cannot write (the two users).

With ``--agent-user`` the agent command runs as the agent's own Linux user, and the runner's
state (records, ledger, evidence) is not writable by it. A send then counts only when the
runner itself recorded it, on word from its own send shim:

- before each attempt the runner writes, into a directory of its own that the agent may read
  but not write (``STATE/shims/TASK.N/``), a shim per sending CLI (``reply``, ``notify``): a
  ``/bin/sh`` wrapper first on the agent's PATH that runs ``INTERPRETER -I NAME.py`` beside it
  (no ``LD_*`` variables, no ``PYTHON*`` ones: ``-I``). ``NAME.py`` holds as constants the real
  CLI's path, the spool it writes, the runner's socket, and the values of ``FLEET_OUTBOX``,
  ``FLEET_NOTIFY_SPOOL``, ``FLEET_TASK_ID``, ``FLEET_RUN_ID``, ``FLEET_AGENT``,
  ``FLEET_SENDS_LOG`` and ``FLEET_DENIALS_LOG``, which it pins (the agent cannot point the CLI
  at a spool nobody delivers). It runs the real CLI and, when it exits 0, reports each new file
  of the spool (``{"cli", "file", "task", "channel", "message_id"}``) on the runner's Unix
  socket ``STATE/evidence.sock``;
- the runner accepts a report only from a peer (``SO_PEERCRED``) with the agent user's uid,
  running the expected interpreter (``/proc/PID/exe``) on exactly ``-I`` and one of the
  current attempt's shim files (``/proc/PID/cmdline``), and descending from the current
  attempt's process (``/proc/PID/stat`` parents). It then appends the send to its own log
  (``STATE/sends.jsonl``, ``STATE/notifies.jsonl``), which the anti-silence gate reads.

A line the agent writes anywhere, a report from any other program (``python3 -c ...``), or a
report outside an attempt proves nothing. Not covered: an agent that attaches a debugger to its
own shim process (``ptrace``, allowed between processes of one user unless the host's Yama
``ptrace_scope`` is 2 or more).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fleet_runner.records import append_jsonl, now_iso

SENDING_CLIS = {"reply": "FLEET_OUTBOX", "notify": "FLEET_NOTIFY_SPOOL"}
"""The CLIs whose sends are recorded through the runner, with the variable naming their spool."""
PINNED = ("FLEET_OUTBOX", "FLEET_NOTIFY_SPOOL", "FLEET_TASK_ID", "FLEET_RUN_ID", "FLEET_AGENT",
          "FLEET_SENDS_LOG", "FLEET_DENIALS_LOG")
"""Variables a send shim sets to the runner's values whatever the caller's environment."""
REPORT_MAX_BYTES = 8192
SOCKET_PATH_MAX_BYTES = 107
"""The longest path a Unix socket can be bound to on Linux (``sun_path`` less its NUL)."""

_SH = """#!/bin/sh
# fleet-runner send shim: runs {name} and has the runner record what it sent.
exec /usr/bin/env -u LD_PRELOAD -u LD_LIBRARY_PATH -u LD_AUDIT {q_python} -I {q_script} "$@"
"""

_PY = '''"""fleet-runner send shim for {name} (written by the runner: fleet_runner/sendproof.py).
"""
import json, os, socket, subprocess, sys
REAL, SPOOL, SOCKET, CLI = {real!r}, {spool!r}, {socket!r}, {name!r}
PINNED = {pinned!r}
CALLS_LOG = {calls_log!r}
try:
    with open(CALLS_LOG, "a", encoding="utf-8") as fh:
        fh.write(CLI + "\\n")
except OSError:
    pass
env = {{k: v for k, v in os.environ.items() if not k.startswith(("LD_", "PYTHON"))}}
env.update(PINNED)


def listing():
    try:
        return set(os.listdir(SPOOL))
    except OSError:
        return set()


before = listing()
status = subprocess.run([REAL, *sys.argv[1:]], env=env).returncode
if status == 0:
    for name in sorted(listing() - before):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(SPOOL, name), encoding="utf-8") as fh:
                sent = json.load(fh)
        except (OSError, ValueError):
            sent = {{}}
        report = {{"cli": CLI, "file": name, "task": sent.get("task"),
                  "channel": sent.get("channel"), "message_id": sent.get("id")}}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(SOCKET)
                conn.sendall(json.dumps(report).encode() + b"\\n")
                answer = conn.makefile().readline().strip()
        except OSError as exc:
            answer = f"not delivered ({{exc}})"
        if answer != "ok":
            print(f"{{CLI}}: the runner did not record this send: {{answer}}", file=sys.stderr)
sys.exit(status)
'''


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def usable_by(path: str, uid: int, gid: int) -> bool:
    """Whether user ``uid`` (group ``gid``, no supplementary groups) can execute ``path``:
    every directory on the way searchable and the file executable, by the mode bits."""

    def allows(st: os.stat_result, bit: int) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & (bit << 6))
        if st.st_gid == gid:
            return bool(st.st_mode & (bit << 3))
        return bool(st.st_mode & bit)

    real = os.path.realpath(path)
    parts = real.split(os.sep)
    try:
        for i in range(1, len(parts)):
            if not allows(os.stat(os.sep.join(parts[:i]) or os.sep), 1):
                return False
        st = os.stat(real)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and allows(st, 1)


def interpreter_for(uid: int, gid: int, candidates: Iterable[str]) -> str | None:
    """The first of ``candidates`` (Python interpreters) the user can run, or ``None``."""
    for path in candidates:
        if path and usable_by(path, uid, gid):
            return os.path.realpath(path)
    return None


def write_send_shims(shim_dir: Path, real: Mapping[str, str], *, python: str,
                     socket_path: Path, env: Mapping[str, str], calls_log: Path) -> list[str]:
    """Write a send shim for each sending CLI in ``real`` (``{name: real path}``); return the
    ``NAME.py`` files written (the scripts a report must come from).

    Args:
        shim_dir: the attempt's shim directory (the runner's; the agent may only read it).
        real: the CLIs the agent may call, by name (only :data:`SENDING_CLIS` get a send shim).
        python: the interpreter the agent's user runs the shim with.
        socket_path: the runner's evidence socket.
        env: the agent's environment (the values of :data:`PINNED` are taken from it).
        calls_log: the attempt's calls log (the shim counts the call as the others do).
    """
    scripts = []
    pinned = {k: env[k] for k in PINNED if k in env}
    for name, var in SENDING_CLIS.items():
        if name not in real or var not in env:
            continue
        script = Path(shim_dir) / f".{name}.py"
        script.write_text(_PY.format(name=name, real=real[name], spool=env[var],
                                     socket=os.fspath(socket_path), pinned=pinned,
                                     calls_log=os.fspath(calls_log)), "utf-8")
        os.chmod(script, 0o644)
        wrapper = Path(shim_dir) / name
        wrapper.write_text(_SH.format(name=name, q_python=_quote(python),
                                      q_script=_quote(os.fspath(script))), "utf-8")
        os.chmod(wrapper, 0o755)
        scripts.append(os.fspath(script))
    return scripts


def _proc_argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is ``pid`` or one of its parents (``/proc``)."""
    seen = 0
    current: int | None = pid
    while current and seen < 4096:
        if current == ancestor:
            return True
        current = _parent(current)
        seen += 1
    return False


class EvidenceServer:
    """The runner's end of the socket (module docstring): one thread, one report at a time.

    Args:
        socket_path: where to listen (created 0666 in a directory of the runner's: the agent
            user may connect, not replace it).
        logs: ``{cli: trusted log path}`` (``reply`` → ``sends.jsonl``).
        uid: the agent user's uid (the only peer accepted).
        python: the interpreter the shims run with.
        log: where to say what was refused (the runner's log).

    Raises:
        OSError: the socket cannot be bound (its path too long, or not writable).
    """

    def __init__(self, socket_path: Path, logs: Mapping[str, Path], *, uid: int, python: str,
                 log: Any = None) -> None:
        self.path = Path(socket_path)
        self.logs = dict(logs)
        self.uid = uid
        self.python = os.path.realpath(python)
        self._log = log or (lambda text: None)
        self._lock = threading.Lock()
        self._expect: dict[str, Any] | None = None
        if len(os.fsencode(self.path)) > SOCKET_PATH_MAX_BYTES:
            raise OSError(f"{self.path}: too long for a Unix socket (at most "
                          f"{SOCKET_PATH_MAX_BYTES} bytes): give a shorter --state-dir")
        if os.path.lexists(self.path):
            os.unlink(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(os.fspath(self.path))
        os.chmod(self.path, 0o666)
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="evidence", daemon=True)
        self._thread.start()

    def expect(self, *, task: str, run: str, leader: int, scripts: Iterable[str]) -> None:
        """Accept reports of this attempt from now on (``leader``: its process)."""
        with self._lock:
            self._expect = {"task": task, "run": run, "leader": leader,
                            "scripts": set(scripts)}

    def clear(self) -> None:
        """Accept no report (between attempts)."""
        with self._lock:
            self._expect = None

    def close(self) -> None:
        """Stop listening and remove the socket."""
        self._stopped = True
        self._thread.join(timeout=2)
        self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(5)
                    answer = self._handle(conn)
                    conn.sendall((answer + "\n").encode())
                except OSError:
                    pass

    def _handle(self, conn: socket.socket) -> str:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        data = b""
        while not data.endswith(b"\n") and len(data) < REPORT_MAX_BYTES:
            chunk = conn.recv(REPORT_MAX_BYTES)
            if not chunk:
                break
            data += chunk
        why = self._refusal(pid, uid)
        try:
            report = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            report = None
        if why is None and not (isinstance(report, dict) and report.get("cli") in self.logs):
            why = "not a report of a sending CLI"
        if why is not None:
            self._log(f"evidence socket: refused a report from pid {pid} (uid {uid}): {why}")
            return f"refused: {why}"
        with self._lock:
            expect = self._expect or {}
        append_jsonl(self.logs[report["cli"]], {
            "time": now_iso(), "task": report.get("task"), "run": expect.get("run"),
            "channel": report.get("channel"), "message_id": report.get("message_id"),
            "outbox_file": report.get("file"), "via": "runner", "pid": pid})
        return "ok"

    def _refusal(self, pid: int, uid: int) -> str | None:
        """Why a peer may not report, or ``None``."""
        with self._lock:
            expect = dict(self._expect) if self._expect else None
        if expect is None:
            return "no attempt is running"
        if uid != self.uid:
            return f"uid {uid} is not the agent user's ({self.uid})"
        try:
            exe = os.path.realpath(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        argv = _proc_argv(pid)
        if exe != self.python or len(argv) < 3 or argv[1] != "-I" \
                or argv[2] not in expect["scripts"]:
            return "not the runner's send shim of this attempt (" + " ".join(argv[:3]) + ")"
        if not descends_from(pid, expect["leader"]):
            return "not a process of the current attempt"
        return None
