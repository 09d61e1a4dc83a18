"""The SSH transport: fabric for configuration (``~/.ssh/config``, ssh-agent, identity files,
ProxyJump), paramiko underneath, and a raw exec channel for binary-safe streaming.

Host keys are checked against the inventory's ``known_hosts`` file, or the user's
``~/.ssh/known_hosts`` when the inventory names none, with paramiko's ``RejectPolicy``: fabric's
default ``AutoAddPolicy`` would accept any key (SSH-BOXES.md), so it is replaced before
connecting. Data goes through ``Channel.sendall``/``recv`` rather than fabric's ``run``, which reads
its input stream one byte per 10 ms as text (SSH-BOXES.md).
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import paramiko
from fabric import Config, Connection

from fleetctl.errors import HostError, HostKeyError
from fleetctl.transport.base import Channel, StderrTail, Transport


class SshChannel(Channel):
    """One ``exec`` session on an open SSH connection."""

    def __init__(self, chan: paramiko.Channel, timeout_s: float | None) -> None:
        self._chan = chan
        chan.settimeout(timeout_s)
        self._stderr = StderrTail(chan.recv_stderr)

    def send(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except socket.timeout as exc:
            raise OSError("timed out sending to the host") from exc

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def read(self, size: int) -> bytes:
        try:
            return self._chan.recv(size)
        except socket.timeout as exc:
            raise OSError("timed out waiting for the host") from exc

    def wait(self) -> int:
        self.close_stdin()
        return self._chan.recv_exit_status()

    def kill(self) -> None:
        # Closing the channel makes sshd hang up the session; the host-side program then gets
        # EOF/SIGHUP and its flock is released by the kernel.
        self._chan.close()

    def stderr_tail(self) -> str:
        return self._stderr.text()


def _strict_client(known_hosts: Path) -> paramiko.SSHClient:
    """An SSH client that knows only ``known_hosts`` and rejects any other key."""
    client = paramiko.SSHClient()
    if known_hosts.is_file():
        client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


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

    def connect(self) -> None:
        """Open the connection.

        Raises:
            HostKeyError: the host's key is not in known_hosts, or differs from it.
            HostError: the host cannot be reached or refuses authentication.
        """
        host = self._host
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
        known_hosts = Path(host.known_hosts).expanduser() if host.known_hosts else (
            Path.home() / ".ssh" / "known_hosts")
        # Fresh clients, for the host and every ProxyJump hop: fabric's own are set to
        # AutoAddPolicy, which trusts any key.
        hop = conn
        while isinstance(hop, Connection):
            hop.client = _strict_client(known_hosts)
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
        except paramiko.SSHException as exc:
            if "known_hosts" in str(exc) or "not found in" in str(exc):
                raise HostKeyError(
                    f"{host.name}: {where} is not in {known_hosts}; refusing to connect to an "
                    "unknown host",
                    hint="add its key to known_hosts after checking its fingerprint "
                    "(ssh-keyscan -p PORT HOST, then compare out of band)",
                ) from None
            raise HostError(f"{host.name}: SSH to {where} failed: {exc}") from None
        except (OSError, EOFError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
                str(exc) or exc.__class__.__name__)
            raise HostError(f"{host.name}: cannot reach {where}: {reason}") from None
        self._conn = conn

    def start(self, argv: list[str]) -> Channel:
        if self._conn is None:
            raise HostError(f"{self.label}: not connected")
        try:
            chan = self._conn.client.get_transport().open_session(timeout=self._host.timeout_s)
            # The remote side always runs a command line through the login user's shell;
            # every word is quoted so no name or value is ever interpreted by it.
            chan.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"{self.label}: cannot start a command: {exc}") from None
        return SshChannel(chan, self._host.timeout_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
