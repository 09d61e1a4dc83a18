"""The local transport: a directory on this machine acts as the host (demo boxes, tests)."""

from __future__ import annotations

import io
import os
import pwd
import signal
import subprocess
from typing import cast

from fleetctl.errors import HostError
from fleetctl.transport.base import Channel, ProbeResult, StderrTail, Transport
from fleetctl.transport.become import become_argv
from fleetctl.transport.sudoprobe import sudo_refusal


class LocalChannel(Channel):
    """A subprocess in its own process group, so :meth:`kill` ends everything it started."""

    def __init__(self, argv: list[str]) -> None:
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        # Popen with PIPE gives buffered binary streams (read1 included), never None.
        self._stdin = cast(io.BufferedWriter, self._proc.stdin)
        self._stdout = cast(io.BufferedReader, self._proc.stdout)
        self._stderr = StderrTail(cast(io.BufferedReader, self._proc.stderr).read1)

    def send(self, data: bytes | memoryview) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close_stdin(self) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass

    def read(self, size: int) -> bytes:
        return self._stdout.read1(size)

    def wait(self) -> int:
        self.close_stdin()
        return self._proc.wait()

    def ended(self, wait_s: float) -> int | None:
        try:
            return self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stderr_tail(self, wait_s: float = 1.0) -> str:
        return self._stderr.text(wait_s)


class LocalTransport(Transport):
    """Runs the host-side program as a local process; the host's root is a local directory.

    Args:
        label: the host's name, for messages.
        become: ``"sudo"`` runs every command through ``sudo -n --``; ``None`` as is.
    """

    def __init__(self, label: str, become: str | None = None) -> None:
        self.label = label
        self.become = become
        self._argv: list[str] | None = None

    def connect(self) -> None:
        return None

    def explain(self, stderr_tail: str) -> HostError | None:
        if self.become != "sudo" or self._argv is None:
            return None
        login = pwd.getpwuid(os.geteuid()).pw_name
        return sudo_refusal(self.probe, self.label, login, login, self._argv)

    def probe(self, argv: list[str], tty: bool = False, stdin: bytes = b"") -> ProbeResult:
        """Run ``argv`` here and wait for it (30 s at most); no terminal is offered (status
        ``None`` for ``tty``), so requiretty is not told apart on a local host."""
        if tty:
            return ProbeResult(None)
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, timeout=30)
        except FileNotFoundError:
            return ProbeResult(127)
        except (OSError, subprocess.TimeoutExpired):
            return ProbeResult(None)
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return ProbeResult(done.returncode, done.stdout, lines[-1] if lines else "")

    def start(self, argv: list[str]) -> Channel:
        self._argv = list(argv)
        argv = become_argv(argv, self.become)
        try:
            return LocalChannel(argv)
        except OSError as exc:
            raise HostError(f"{self.label}: cannot start {argv[0]}: {exc.strerror}",
                            hint="set `python:` for this host in the inventory") from None

    def close(self) -> None:
        return None
