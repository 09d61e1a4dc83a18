"""Run real OpenSSH servers ("boxes") on 127.0.0.1 for tests.

Each box is one ``/usr/sbin/sshd -D -e`` process with its own directory,
config file, ed25519 host key, pid file, log file and port. Logins use
public keys only; the keys a user may log in with live in
``<box dir>/authorized_keys/<user>`` and are read by sshd through
``AuthorizedKeysCommand /bin/cat ...`` (running as root), so the files may sit
in pytest's 0700 temporary directories and still work for non-root users.

Only the standard library is used, plus the ``ssh-keygen`` and
``/usr/sbin/sshd`` executables. The process must run as root for sshd to
accept logins as users other than the one running it.

Typical use::

    key = make_client_key(tmp_path / "client")
    box = start_box(tmp_path, "web1", authorized={"root": key})
    write_known_hosts(tmp_path / "known_hosts", [box])
    ...
    box.stop()
"""

from __future__ import annotations

import atexit
import errno
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

__all__ = [
    "ClientKey",
    "SshdBox",
    "ensure_sshd_prerequisites",
    "free_port",
    "make_client_key",
    "start_box",
    "write_known_hosts",
]

SSHD = pathlib.Path("/usr/sbin/sshd")
PRIVSEP_DIR = pathlib.Path("/run/sshd")
HOST = "127.0.0.1"

START_TIMEOUT = 30.0  # seconds to wait for a box's SSH banner (generous: a busy machine)
STOP_TIMEOUT = 5.0  # seconds to wait for killed processes to disappear
_PORT_ATTEMPTS = 10  # tries with a new port when the chosen one was taken
_POLL_INTERVAL = 0.005  # seconds between readiness checks

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_SAFE_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$")

# Boxes started by this process and not yet stopped (stopped at exit).
_running: dict[int, "SshdBox"] = {}
_running_lock = threading.Lock()


@dataclass(frozen=True)
class ClientKey:
    """A client key pair for logging in to boxes.

    Attributes:
        private_key: Path of the ed25519 private key file (mode 0600, no
            passphrase). Its public half is next to it with a ``.pub`` suffix.
        public_line: The ``ssh-ed25519 AAAA... comment`` line of the public key.
    """

    private_key: pathlib.Path
    public_line: str


@dataclass
class SshdBox:
    """One running sshd listening on 127.0.0.1.

    Attributes:
        name: The box name given to :func:`start_box`.
        port: The TCP port sshd listens on (on 127.0.0.1 only).
        directory: The box's own directory, holding ``sshd_config``, the host
            key, ``sshd.pid``, ``sshd.log`` (sshd's stderr) and
            ``authorized_keys/<user>`` files.
        host_key_pub: ``ssh-ed25519 AAAA...`` of the box's host key (no comment).
        process: The sshd listener process.
    """

    name: str
    port: int
    directory: pathlib.Path
    host_key_pub: str
    process: subprocess.Popen
    _stopped: bool = field(default=False, repr=False, compare=False)

    @property
    def log_path(self) -> pathlib.Path:
        """Path of the file receiving sshd's stderr (its log)."""
        return self.directory / "sshd.log"

    def known_hosts_line(self) -> str:
        """Return this box's known_hosts line.

        Returns:
            ``[127.0.0.1]:PORT ssh-ed25519 AAAA...`` (no trailing newline).
        """
        return f"[{HOST}]:{self.port} {self.host_key_pub}"

    def authorize(self, user: str, key: ClientKey) -> None:
        """Allow ``key`` to log in as ``user``; takes effect for the next login.

        The user must exist on this machine (the box shares it), have a
        usable shell and not be locked (``usermod -p '*'`` after ``useradd``).
        Adding the same key twice is a no-op.

        Args:
            user: Login name.
            key: The client key to accept for that user.

        Raises:
            ValueError: If ``user`` is not a plausible login name.
        """
        _authorize_in(self.directory, user, key)

    def alive(self) -> bool:
        """Return whether the sshd listener is still running.

        Returns:
            False once :meth:`stop` was called or sshd exited on its own.
        """
        return not self._stopped and self.process.poll() is None

    def kill_sessions(self) -> int:
        """SIGKILL every session process of this box (sshd's per-connection
        children, the login shells and what they run); the listener keeps
        accepting. Open connections drop, as when a host's sessions are
        killed. Returns how many processes were killed.
        """
        if not self.alive():
            return 0
        return _kill_tree(self.process, keep_listener=True)

    def stop(self) -> None:
        """Kill sshd and all of its session processes, then wait for them.

        Open SSH sessions to this box are cut, new connections are refused.
        Safe to call more than once. Waits at most about ``STOP_TIMEOUT``
        (5 seconds) for the processes to be gone.
        """
        if self._stopped:
            return
        self._stopped = True
        with _running_lock:
            _running.pop(id(self), None)
        _kill_tree(self.process)


def ensure_sshd_prerequisites() -> None:
    """Check that sshd can be run and prepare the machine for it.

    Creates sshd's privilege separation directory ``/run/sshd`` (mode 0755)
    when running as root and it is missing; sshd refuses to start without it.

    Raises:
        RuntimeError: If ``/usr/sbin/sshd`` or ``ssh-keygen`` is missing, or
            ``/run/sshd`` exists but is not a directory.
    """
    if not (SSHD.is_file() and os.access(SSHD, os.X_OK)):
        raise RuntimeError(
            f"{SSHD} not found: install Debian's openssh-server "
            "(apt-get install -y openssh-server) to run the SSH tests"
        )
    if shutil.which("ssh-keygen") is None:
        raise RuntimeError(
            "ssh-keygen not found: install Debian's openssh-client "
            "(apt-get install -y openssh-client) to run the SSH tests"
        )
    if os.geteuid() != 0:
        return  # a non-root sshd does not use the privilege separation dir
    if PRIVSEP_DIR.exists() and not PRIVSEP_DIR.is_dir():
        raise RuntimeError(f"{PRIVSEP_DIR} exists but is not a directory")
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    if PRIVSEP_DIR.stat().st_mode & 0o7777 != 0o755:
        PRIVSEP_DIR.chmod(0o755)


def make_client_key(directory: pathlib.Path) -> ClientKey:
    """Generate a new passphrase-less ed25519 client key pair.

    The private key is written to ``directory/id_ed25519`` (or
    ``id_ed25519_2``, ``_3``... if that exists) with mode 0600, the public key
    next to it with a ``.pub`` suffix. Takes about 10 milliseconds.

    Args:
        directory: Where to write the key files; created if missing.

    Returns:
        The new key.

    Raises:
        subprocess.CalledProcessError: If ssh-keygen fails.
    """
    directory = pathlib.Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "id_ed25519"
    n = 1
    while path.exists() or path.with_name(path.name + ".pub").exists():
        n += 1
        path = directory / f"id_ed25519_{n}"
    _keygen(path, comment=f"fleetctl-test-{path.name}")
    path.chmod(0o600)
    public_line = path.with_name(path.name + ".pub").read_text().strip()
    return ClientKey(private_key=path, public_line=public_line)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 with nothing listening on it right now.

    The port is found by binding port 0 and closing the socket, so another
    process may take it later; good for "dead host" tests and as a guess for
    new servers (which must retry when the port turns out to be taken).

    Returns:
        The port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_box(
    directory: pathlib.Path,
    name: str,
    authorized: dict[str, ClientKey] | None = None,
    host_key: pathlib.Path | None = None,
    umask: int | None = None,
) -> SshdBox:
    """Start a new sshd box on 127.0.0.1 and wait until it answers.

    The box's files go into ``directory/name`` (created if needed; any
    earlier ``authorized_keys/`` there is cleared). A fresh ed25519 host key is
    generated unless ``host_key`` is given. A free port is picked; if another
    process takes it first, a new port is tried (up to 10 times). The call
    returns once the sshd process owns the listening socket and sends its
    ``SSH-2.0-`` banner, typically 20-30 milliseconds after the start.

    Args:
        directory: Parent directory for the box's directory. The absolute
            path must not contain whitespace (sshd config syntax).
        name: Box name; letters, digits, ``.``, ``_`` and ``-`` only.
        authorized: Map of login name to the client key allowed for it.
        host_key: Existing ed25519 (or other) private host key file to use,
            mode 0600 (e.g. to "restart" a box with the same identity). Its
            public key is derived with ``ssh-keygen -y``.
        umask: The umask sshd runs with (its sessions inherit it: with
            ``UsePAM no`` nothing resets it); ``None`` keeps this process's.

    Returns:
        The running box. Call :meth:`SshdBox.stop` when done (boxes still
        running when the interpreter exits are stopped then).

    Raises:
        ValueError: If ``name``, a user name or the path is unusable.
        RuntimeError: If the prerequisites are missing, a live box already
            uses that directory, sshd dies (the message includes its stderr)
            or no banner arrives within 10 seconds.
    """
    if not _SAFE_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"box name must match {_SAFE_NAME.pattern}: {name!r}")
    ensure_sshd_prerequisites()
    box_dir = (pathlib.Path(directory) / name).absolute()
    if re.search(r"\s", str(box_dir)):
        raise ValueError(f"box directory path must not contain whitespace: {box_dir}")
    with _running_lock:
        if any(b.directory == box_dir for b in _running.values() if b.alive()):
            raise RuntimeError(f"a running box already uses {box_dir}")
    box_dir.mkdir(parents=True, exist_ok=True)

    if host_key is None:
        key_path = box_dir / "ssh_host_ed25519_key"
        for old in (key_path, key_path.with_name(key_path.name + ".pub")):
            old.unlink(missing_ok=True)
        _keygen(key_path, comment=f"box-{name}")
    else:
        key_path = pathlib.Path(host_key).absolute()
        if re.search(r"\s", str(key_path)):
            raise ValueError(f"host key path must not contain whitespace: {key_path}")
    host_key_pub = _public_key_of(key_path)

    keys_dir = box_dir / "authorized_keys"
    if keys_dir.exists():
        shutil.rmtree(keys_dir)
    keys_dir.mkdir(mode=0o700)
    for user, key in (authorized or {}).items():
        _authorize_in(box_dir, user, key)

    config_path = box_dir / "sshd_config"
    log_path = box_dir / "sshd.log"
    failures: list[str] = []
    for _attempt in range(_PORT_ATTEMPTS):
        port = free_port()
        config_path.write_text(_sshd_config(box_dir, port, key_path))
        process = _spawn_sshd(config_path, log_path, umask)
        outcome = _wait_ready(process, port, log_path, START_TIMEOUT)
        if outcome == "ready":
            box = SshdBox(
                name=name,
                port=port,
                directory=box_dir,
                host_key_pub=host_key_pub,
                process=process,
            )
            with _running_lock:
                _running[id(box)] = box
            return box
        log = _read_log(log_path)
        if outcome == "port-taken":
            failures.append(f"port {port} taken")
            continue
        _kill_tree(process)
        if outcome == "timeout":
            raise RuntimeError(
                f"sshd box {name!r} on port {port} sent no SSH banner within "
                f"{START_TIMEOUT:g} s; sshd stderr:\n{log}"
            )
        raise RuntimeError(
            f"sshd box {name!r} exited with status {process.returncode} "
            f"while starting on port {port}; sshd stderr:\n{log}"
        )
    raise RuntimeError(
        f"sshd box {name!r} could not get a port after {_PORT_ATTEMPTS} tries "
        f"({', '.join(failures)}); last sshd stderr:\n{_read_log(log_path)}"
    )


def write_known_hosts(path: pathlib.Path, boxes: Iterable[SshdBox]) -> pathlib.Path:
    """Write a known_hosts file holding the lines of the given boxes.

    An existing file is replaced. The result can be loaded with paramiko's
    ``SSHClient.load_host_keys`` or OpenSSH's ``UserKnownHostsFile``.

    Args:
        path: File to write; its parent directories are created.
        boxes: The boxes to list.

    Returns:
        ``path``.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(box.known_hosts_line() + "\n" for box in boxes))
    return path


# ---------------------------------------------------------------- internals


def _keygen(path: pathlib.Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _public_key_of(private_key: pathlib.Path) -> str:
    """Return ``type base64`` of a private key file (comment dropped)."""
    result = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(private_key)],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"cannot read host key {private_key}: {result.stderr.strip()}"
        )
    return " ".join(result.stdout.split()[:2])


def _authorize_in(box_dir: pathlib.Path, user: str, key: ClientKey) -> None:
    if not _SAFE_USER.match(user) or len(user) > 32:
        raise ValueError(f"not a usable login name: {user!r}")
    path = box_dir / "authorized_keys" / user
    path.parent.mkdir(mode=0o700, exist_ok=True)
    line = key.public_line.strip()
    existing = path.read_text().splitlines() if path.exists() else []
    if line not in existing:
        with path.open("a") as f:
            f.write(line + "\n")


def _sshd_version() -> tuple[int, int]:
    result = subprocess.run(
        [str(SSHD), "-V"], capture_output=True, text=True, check=False
    )
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", result.stdout + result.stderr)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


_version_cache: list[tuple[int, int]] = []


def _sshd_config(box_dir: pathlib.Path, port: int, host_key: pathlib.Path) -> str:
    if not _version_cache:
        _version_cache.append(_sshd_version())
    lines = [
        f"Port {port}",
        f"ListenAddress {HOST}",
        f"HostKey {host_key}",
        f"PidFile {box_dir / 'sshd.pid'}",
        # Key files under /tmp and pytest dirs fail sshd's ownership checks.
        "StrictModes no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # Read keys as root so 0700 test dirs work for every user.
        "AuthorizedKeysFile none",
        f"AuthorizedKeysCommand /bin/cat {box_dir / 'authorized_keys'}/%u",
        "AuthorizedKeysCommandUser root",
        "Subsystem sftp internal-sftp",
        # The default 10:30:100 drops simultaneous connects from tests.
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel INFO",
    ]
    if _version_cache[0] >= (9, 8):
        # Newer sshd throttles clients that fail auth; tests fail on purpose.
        lines.append("PerSourcePenalties no")
    return "\n".join(lines) + "\n"


def _spawn_sshd(config_path: pathlib.Path, log_path: pathlib.Path,
                umask: int | None = None) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            umask=-1 if umask is None else umask,
        )


def _read_log(log_path: pathlib.Path) -> str:
    try:
        return log_path.read_text(errors="replace").strip() or "(empty)"
    except OSError as exc:
        return f"(cannot read {log_path}: {exc})"


def _wait_ready(
    process: subprocess.Popen, port: int, log_path: pathlib.Path, timeout: float
) -> str:
    """Wait until ``process`` listens on ``port`` and sends an SSH banner.

    Returns "ready", "port-taken", "exited" or "timeout". Checking that the
    listening socket belongs to ``process`` matters: when another process
    took the port, a banner could come from that one.
    """
    deadline = time.monotonic() + timeout
    while True:
        returncode = process.poll()
        if returncode is not None:
            if returncode == 255 and _bind_failed(log_path):
                return "port-taken"
            return "exited"
        if _owns_listener(process.pid, port) and _banner_ok(port, deadline):
            if process.poll() is None:
                return "ready"
            continue
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(_POLL_INTERVAL)


def _bind_failed(log_path: pathlib.Path) -> bool:
    log = _read_log(log_path)
    return "Address already in use" in log or "Cannot bind any address" in log


def _listening_inodes(port: int) -> set[str]:
    """Inodes of TCP sockets listening on 127.0.0.1:port (this net namespace)."""
    wanted_addr = "0100007F"  # 127.0.0.1, little-endian hex as in /proc/net/tcp
    wanted_port = f"{port:04X}"
    inodes = set()
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for row in f:
                cols = row.split()
                addr, _, hex_port = cols[1].partition(":")
                if addr == wanted_addr and hex_port == wanted_port and cols[3] == "0A":
                    inodes.add(cols[9])
    except OSError:
        pass
    return inodes


def _owns_listener(pid: int, port: int) -> bool:
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def _banner_ok(port: int, deadline: float) -> bool:
    remaining = max(0.05, deadline - time.monotonic())
    try:
        with socket.create_connection((HOST, port), timeout=min(2.0, remaining)) as sock:
            data = b""
            while b"\n" not in data and len(data) < 1024:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"SSH-2.0-")
    except OSError:
        return False


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """Map pid -> (ppid, session id, state) for all visible processes."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, ppid, _pgrp, sid = fields[0], int(fields[1]), fields[2], int(fields[3])
        table[int(entry)] = (ppid, sid, state)
    return table


def _descendants(root: int, table: dict[int, tuple[int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _sid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _kill_tree(process: subprocess.Popen, keep_listener: bool = False) -> int:
    """Kill an sshd listener and every process that came from it.

    sshd's per-connection children call setsid(), so they leave the
    listener's process group; they are found through /proc instead. The
    listener and its descendants are frozen with SIGSTOP first so nothing new
    is forked (or re-parented away) while the tree is collected, then
    everything is SIGKILLed. Processes left in the sessions of those
    children (e.g. backgrounded commands) are killed too. With
    ``keep_listener`` the listener is let go on (SIGCONT) instead: only the
    sessions die, as when a session's processes are killed on a real host.
    Returns how many processes were killed.
    """
    me = os.getpid()
    own_sid = os.getsid(0)
    victims: set[int] = set()
    sessions: set[int] = set()
    if process.poll() is None:
        _signal(process.pid, signal.SIGSTOP)
        # Freeze the tree until a pass finds nothing new.
        while True:
            table = _proc_table()
            found = _descendants(process.pid, table) - {me}
            new = found - victims
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            victims |= new
        table = _proc_table()
        sessions = {table[p][1] for p in victims | {process.pid} if p in table}
        sessions.discard(own_sid)
        sessions.discard(0)
        victims |= {
            pid for pid, (_pp, sid, _st) in table.items() if sid in sessions
        } - {me}
        if keep_listener:
            victims.discard(process.pid)
        for pid in victims:
            _signal(pid, signal.SIGKILL)
        _signal(process.pid, signal.SIGCONT if keep_listener else signal.SIGKILL)
    killed = len(victims)
    if not keep_listener:
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT
    while victims and time.monotonic() < deadline:
        table = _proc_table()
        # Zombies hold no sockets any more; their new parent reaps them.
        victims = {p for p in victims if p in table and table[p][2] != "Z"}
        if victims:
            time.sleep(_POLL_INTERVAL)
    return killed


@atexit.register
def _stop_leftover_boxes() -> None:
    with _running_lock:
        boxes = list(_running.values())
    for box in boxes:
        try:
            box.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
