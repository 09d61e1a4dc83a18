"""The local transport: a directory on this machine acts as the host (demo boxes, tests)."""

from __future__ import annotations

import os
import signal
import subprocess

from fleetctl.errors import HostError
from fleetctl.transport.base import Channel, StderrTail, Transport


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
        self._stderr = StderrTail(self._proc.stderr.read1)

    def send(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass

    def read(self, size: int) -> bytes:
        return self._proc.stdout.read1(size)

    def wait(self) -> int:
        self.close_stdin()
        return self._proc.wait()

    def kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stderr_tail(self) -> str:
        return self._stderr.text()


class LocalTransport(Transport):
    """Runs the host-side program as a local process; the host's root is a local directory."""

    def __init__(self, label: str) -> None:
        self.label = label

    def connect(self) -> None:
        return None

    def start(self, argv: list[str]) -> Channel:
        try:
            return LocalChannel(argv)
        except OSError as exc:
            raise HostError(f"{self.label}: cannot start {argv[0]}: {exc.strerror}",
                            hint="set `python:` for this host in the inventory") from None

    def close(self) -> None:
        return None
