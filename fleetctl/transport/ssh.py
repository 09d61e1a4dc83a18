"""The SSH transport: fabric for configuration (``~/.ssh/config``, ssh-agent, identity files,
ProxyJump), paramiko underneath, and a raw exec channel for binary-safe streaming.

Host keys are checked against the inventory's ``known_hosts`` file, or the user's
``~/.ssh/known_hosts`` when the inventory names none, with paramiko's ``RejectPolicy``: fabric's
default ``AutoAddPolicy`` would accept any key (SSH-BOXES.md), so it is replaced before
connecting. Data goes through ``Channel.sendall``/``recv`` rather than fabric's ``run``, which reads
its input stream one byte per 10 ms as text (SSH-BOXES.md).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from fabric import Config, Connection
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from fleetctl.errors import HostError, HostKeyError
from fleetctl.transport.base import Channel, ChannelTimeout, ProbeResult, StderrTail, Transport
from fleetctl.transport.become import become_argv
from fleetctl.transport.sudoprobe import sudo_refusal

# paramiko logs a failed handshake with a traceback through the ``paramiko`` logger; with no
# handler anywhere, Python's last-resort handler would print it on stderr. fleetctl reports the
# failure itself, per host, so those records go nowhere.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def marked(argv: list[str]) -> tuple[str, list[str]]:
    """``argv`` run behind a random line on stderr, and that line.

    The login's shell runs its start-up files (``.bashrc``, a motd-style banner) before every
    command, and what they print on stderr would pass for the command's own last words. The
    line is printed by ``/bin/sh`` once they are done, just before it ``exec``s ``argv``, so
    whatever follows it is the command's (:func:`last_words`).
    """
    mark = "fleetctl-probe-" + secrets.token_hex(8)
    return mark, ["/bin/sh", "-c", 'printf "%s\\n" "$0" >&2; exec "$@"', mark, *argv]


def last_words(stderr: str, mark: str = "") -> str:
    """The last non-blank line of ``stderr`` after the line ``mark`` (all of it when ``mark``
    is empty); ``""`` when the command printed nothing there, or the mark is not in the tail.
    """
    lines = stderr.splitlines()
    if mark:
        if mark not in lines:
            return ""
        lines = lines[len(lines) - lines[::-1].index(mark):]
    said = [ln for ln in lines if ln.strip()]
    return said[-1].strip() if said else ""


class SshChannel(Channel):
    """One ``exec`` session on an open SSH connection."""

    def __init__(self, chan: paramiko.Channel, timeout_s: float | None) -> None:
        self._chan = chan
        chan.settimeout(timeout_s)
        self._stderr = StderrTail(chan.recv_stderr)

    def send(self, data: bytes | memoryview) -> None:
        try:
            # paramiko sends slices of what it is given; a memoryview slices without copying
            # (its stubs say bytes only).
            self._chan.sendall(data)  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise ChannelTimeout("timed out sending to the host") from exc

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def read(self, size: int) -> bytes:
        try:
            return self._chan.recv(size)
        except TimeoutError as exc:
            raise ChannelTimeout("timed out waiting for the host") from exc

    def wait(self) -> int:
        self.close_stdin()
        return self._chan.recv_exit_status()

    def ended(self, wait_s: float) -> int | None:
        if not self._chan.status_event.wait(wait_s):
            return None
        return self._chan.exit_status

    def kill(self) -> None:
        # Closing the channel makes sshd hang up the session; the host-side program then gets
        # EOF/SIGHUP and its flock is released by the kernel. A connection already going (the
        # timer and a channel's own timeout may both end a run) has nothing left to close.
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            self._chan.close()

    def stderr_tail(self, wait_s: float = 1.0) -> str:
        return self._stderr.text(wait_s)


@dataclass
class KnownHosts:
    """What fleetctl takes from one known_hosts file.

    Attributes:
        keys: the usable host keys (hashed host names kept as they are).
        problems: one ``"FILE:LINE: problem; line skipped"`` per line skipped.
        revoked: ``(key type, base64)`` → ``"FILE:LINE"`` of each key marked ``@revoked``: such
            a key is never trusted, for any host, even where another line lists it.
    """

    keys: paramiko.HostKeys
    problems: list[str] = field(default_factory=list)
    revoked: dict[tuple[str, str], str] = field(default_factory=dict)


def load_known_hosts(path: Path) -> KnownHosts:
    """Read an OpenSSH known_hosts file line by line, as OpenSSH does: a line that cannot be
    parsed is skipped (and reported) instead of spoiling the whole file.

    ``@revoked`` lines are honoured (their keys are refused); ``@cert-authority`` lines are not
    supported and are skipped like a malformed line.

    Args:
        path: the file.

    Returns:
        The keys, the lines skipped (bad base64, an unknown key type, too few fields, an
        unsupported marker) and the revoked keys.

    Raises:
        OSError: the file cannot be opened or read.
    """
    found = KnownHosts(paramiko.HostKeys())
    with open(path, "rb") as fh:
        data = fh.read()
    for lineno, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
        problem = None
        entry = None
        if marker not in (None, "@revoked"):
            problem = f"marker {marker} is not supported by fleetctl"
        else:
            try:
                entry = HostKeyEntry.from_line(line, lineno)
            except Exception as exc:  # noqa: BLE001 - any line paramiko cannot parse is
                problem = _key_problem(exc)  # skipped, as OpenSSH does; never the whole file
            else:
                if entry is None or entry.key is None:
                    fields = line.split()
                    problem = (f"unknown or unsupported key type {fields[1]!r}"
                               if len(fields) >= 3 else
                               "not a known_hosts line (want: HOSTS KEYTYPE BASE64-KEY)")
        if problem is not None:
            found.problems.append(f"{path}:{lineno}: {problem}; line skipped")
            continue
        assert entry is not None and entry.key is not None  # no problem: parsed with a key
        if marker == "@revoked":
            found.revoked[(entry.key.get_name(), entry.key.get_base64())] = f"{path}:{lineno}"
            continue
        for name in entry.hostnames:
            found.keys.add(name, entry.key.get_name(), entry.key)
    return found


def _key_problem(exc: BaseException) -> str:
    if isinstance(exc, InvalidHostKey):
        return f"malformed key ({exc.exc})"
    return f"malformed line ({exc.__class__.__name__}: {exc})"


class RevokedHostKey(paramiko.SSHException):
    """The host offered a key that known_hosts marks ``@revoked`` (``where`` is FILE:LINE)."""

    def __init__(self, key: paramiko.PKey, where: str) -> None:
        super().__init__(f"host key {key.get_name()} {key.fingerprint} is revoked ({where})")
        self.key, self.where = key, where


class _RejectPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse every key known_hosts does not list, naming a revoked one as such."""

    def __init__(self, revoked: dict[tuple[str, str], str]) -> None:
        self._revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        where = self._revoked.get((key.get_name(), key.get_base64()))
        if where is not None:
            raise RevokedHostKey(key, where)
        raise paramiko.SSHException(f"Server {hostname!r} not found in known_hosts")


def _strict_client(known: KnownHosts) -> paramiko.SSHClient:
    """An SSH client that knows only ``known``'s keys, none of them revoked, and rejects any
    other key."""
    client = paramiko.SSHClient()
    for name in known.keys.keys():
        for key_type, key in known.keys[name].items():
            if (key_type, key.get_base64()) not in known.revoked:
                client.get_host_keys().add(name, key_type, key)
    client.set_missing_host_key_policy(_RejectPolicy(known.revoked))
    return client


def _unreadable_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (``"does not exist"``...), or ``None``."""
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        return "does not exist"
    except IsADirectoryError:
        return "is a directory, not a key file"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None


class SshTransport(Transport):
    """Reaches one inventory host over SSH.

    Args:
        host: a :class:`fleetctl.inventory.Host` with ``address``, ``port``, ``user``,
            ``identity_file``, ``known_hosts`` and ``timeout_s`` (seconds, connect and per read).
    """

    def __init__(self, host) -> None:
        self.label = host.name
        self._host = host
        self._conn: Connection | None = None
        self._argv: list[str] | None = None
        self.become = getattr(host, "become", None)
        #: What the connection noticed but worked around (a known_hosts line skipped).
        self.warnings: list[str] = []

    def connect(self) -> None:
        """Open the connection.

        Raises:
            HostKeyError: the host's key is not in known_hosts, or differs from it; the
                known_hosts file does not exist or cannot be read.
            HostError: the identity file is missing or unreadable, the port does not speak
                SSH, the host cannot be reached or refuses authentication. Each message names
                the host and the file or setting concerned.
        """
        host = self._host
        known_hosts = Path(host.known_hosts).expanduser() if host.known_hosts else (
            Path.home() / ".ssh" / "known_hosts")
        setting = ("the inventory's known_hosts:" if host.known_hosts else
                   "the default, as the inventory sets no known_hosts:")
        try:
            known = load_known_hosts(known_hosts)
        except FileNotFoundError:
            raise HostKeyError(
                f"{host.name}: known_hosts file {known_hosts} ({setting}) does not exist, so no "
                "host key can be checked; refusing to connect",
                hint="create it with the hosts' keys, each checked out of band "
                "(ssh-keyscan -p PORT HOST), or set known_hosts: for this host") from None
        except OSError as exc:
            raise HostKeyError(f"{host.name}: known_hosts file {known_hosts} ({setting}) cannot "
                               f"be read: {exc.strerror or exc}; refusing to connect") from None
        skipped = known.problems
        self.warnings = list(skipped)
        if host.identity_file:
            problem = _unreadable_file(Path(host.identity_file))
            if problem:
                raise HostError(f"{host.name}: identity_file {host.identity_file} (the "
                                f"inventory's identity_file:) {problem}",
                                hint="fix identity_file: for this host or under defaults: (a "
                                "relative path is taken from the inventory's directory)")
        connect_kwargs: dict = {}
        if host.timeout_s:
            # As floats through paramiko itself: fabric's connect_timeout is int()ed, so a
            # sub-second timeout would become 0, which means none.
            connect_kwargs.update(timeout=host.timeout_s, banner_timeout=host.timeout_s,
                                  auth_timeout=host.timeout_s)
        if host.identity_file:
            connect_kwargs["key_filename"] = [str(host.identity_file)]
        conn = Connection(
            host.address,
            user=host.user,
            port=host.port,
            config=Config(),
            connect_kwargs=connect_kwargs,
        )
        if host.timeout_s:
            conn.connect_timeout = None  # ours is in connect_kwargs; fabric refuses both
        # Fresh clients, for the host and every ProxyJump hop: fabric's own are set to
        # AutoAddPolicy, which trusts any key.
        hop = conn
        while isinstance(hop, Connection):
            hop.client = _strict_client(known)
            hop = hop.gateway
        where = f"{conn.user}@{conn.host}:{conn.port}"
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{host.name}: the host key of {where} does not match {known_hosts} "
                f"(got {exc.key.get_name()} {exc.key.fingerprint}); refusing to connect",
                hint="if the host was rebuilt, verify the new key out of band and update "
                "known_hosts",
            ) from None
        except RevokedHostKey as exc:
            raise HostKeyError(
                f"{host.name}: the host key of {where} ({exc.key.get_name()} "
                f"{exc.key.fingerprint}) is marked @revoked in {exc.where}; refusing to connect",
                hint="the key was revoked on purpose: check the host out of band") from None
        except paramiko.SSHException as exc:
            if "known_hosts" in str(exc) or "not found in" in str(exc):
                also = (f" ({len(skipped)} line(s) of it were skipped as malformed: "
                        f"{'; '.join(skipped[:3])})" if skipped else "")
                raise HostKeyError(
                    f"{host.name}: {where} is not in {known_hosts}{also}; refusing to connect "
                    "to an unknown host",
                    hint="add its key to known_hosts after checking its fingerprint "
                    "(ssh-keyscan -p PORT HOST, then compare out of band)"
                    + ("; fix or remove the malformed line(s)" if skipped else ""),
                ) from None
            if "protocol banner" in str(exc):
                raise HostError(
                    f"{host.name}: {conn.host}:{conn.port} does not speak SSH (no SSH protocol "
                    "banner came back); check the address and port: settings of this host",
                    hint="an SSH server answers with a line starting 'SSH-2.0-'; try "
                    f"`ssh -p {conn.port} {conn.host}` to see what listens there") from None
            raise HostError(f"{host.name}: SSH to {where} failed: {exc}") from None
        except (OSError, EOFError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
                str(exc) or exc.__class__.__name__)
            if isinstance(exc, OSError) and exc.filename:  # a key file from ~/.ssh/config
                raise HostError(f"{host.name}: cannot read {exc.filename}: {reason}",
                                hint="check IdentityFile in ~/.ssh/config (and identity_file: "
                                "in the inventory)") from None
            raise HostError(f"{host.name}: cannot reach {where}: {reason}") from None
        self._conn = conn

    def start(self, argv: list[str]) -> Channel:
        """Start ``argv`` on the host (behind ``sudo -n --`` for ``become: sudo``).

        Raises:
            HostError: not connected, or the session could not be opened.
        """
        if self._conn is None:
            raise HostError(f"{self.label}: not connected")
        self._argv = list(argv)
        argv = become_argv(argv, getattr(self._host, "become", None))
        try:
            chan = self._conn.client.get_transport().open_session(timeout=self._host.timeout_s)
            # The remote side always runs a command line through the login user's shell;
            # every word is quoted so no name or value is ever interpreted by it.
            chan.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"{self.label}: cannot start a command: {exc}") from None
        return SshChannel(chan, self._host.timeout_s)

    def probe(self, argv: list[str], tty: bool = False, stdin: bytes = b"") -> ProbeResult:
        """Run ``argv`` as the login on its own exec channel (a pty on request) and wait for it,
        at most the host's timeout (30 s when it has none)."""
        if self._conn is None:
            return ProbeResult(None)
        timeout_s = self._host.timeout_s or 30.0
        chan = None
        try:
            chan = self._conn.client.get_transport().open_session(timeout=timeout_s)
            chan.settimeout(timeout_s)
            mark = ""
            if tty:
                chan.get_pty()
            else:  # a pty merges stderr into stdout: nothing of sudo's own to set apart there
                mark, argv = marked(argv)
            chan.exec_command(shlex.join(argv))
            stderr = StderrTail(chan.recv_stderr)
            # A program that ends without reading its input (a missing interpreter: the shell's
            # exit 127) closes the channel under the send: that is its answer, read below, not
            # a probe without one (which made the python3 probe of sudo's table say nothing).
            with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
            out = b""
            while block := chan.recv(1 << 16):
                out += block
            status = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError):  # timed out, or the link went
            return ProbeResult(None)
        finally:
            if chan is not None:
                with contextlib.suppress(Exception):
                    chan.close()
        return ProbeResult(status, out, last_words(stderr.text(), mark))

    def lost(self) -> str | None:
        """``user@host:port`` when the SSH connection dropped (sshd or the session killed, the
        network gone: paramiko's transport is no longer active), else ``None``."""
        conn = self._conn
        if conn is None:
            return None
        link = conn.client.get_transport()
        if link is not None and link.is_active():
            return None
        return f"{conn.user}@{conn.host}:{conn.port}"

    def explain(self, stderr_tail: str) -> HostError | None:
        """For a ``become: sudo`` host whose program never started: what sudo wanted, found
        by probing sudo's behaviour (:mod:`.sudoprobe`), as an error naming the host, the
        login, what sudo wanted and the exact fix; ``None`` when sudo is not what stopped it."""
        host = self._host
        if self.become != "sudo" or self._argv is None:
            return None
        login = (self._conn.user if self._conn is not None else host.user) or "LOGIN"
        where = f"{login}@{host.address}{':' + str(host.port) if host.port else ''}"
        return sudo_refusal(self.probe, host.name, login, where, self._argv,
                            budget_s=host.timeout_s or 30.0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
