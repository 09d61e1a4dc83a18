"""The transport interface: start a process on a host and talk to it over pipes."""

from __future__ import annotations

import collections
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.errors import HostError

STDERR_TAIL_BYTES = 8192


class ChannelTimeout(OSError):
    """Nothing could be read from or written to the process for the host's timeout."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One short command's outcome (:meth:`Transport.probe`).

    Attributes:
        status: its exit status; ``None`` when it did not end within the timeout, or when a
            terminal was asked for and the transport has none.
        stdout: what it wrote to stdout.
        said: the last line it wrote to stderr (for messages; never parsed).
    """

    status: int | None
    stdout: bytes = b""
    said: str = ""


class Channel(ABC):
    """A running process on a host: bytes to its stdin, bytes from its stdout, an exit status."""

    @abstractmethod
    def send(self, data: bytes | memoryview) -> None:
        """Write all of ``data`` to the process's stdin.

        Raises:
            OSError: the process or the connection is gone.
        """

    @abstractmethod
    def close_stdin(self) -> None:
        """Signal end of input to the process."""

    @abstractmethod
    def read(self, size: int) -> bytes:
        """Return up to ``size`` bytes of stdout; ``b""`` at end of output."""

    @abstractmethod
    def wait(self) -> int:
        """Wait for the process to end and return its exit status (-1 if unknown)."""

    @abstractmethod
    def ended(self, wait_s: float) -> int | None:
        """Wait up to ``wait_s`` seconds for the process to end, without closing its input;
        return its exit status (-1 if unknown), or ``None`` while it still runs."""

    @abstractmethod
    def kill(self) -> None:
        """End the process (and anything it started); safe to call more than once."""

    @abstractmethod
    def stderr_tail(self, wait_s: float = 1.0) -> str:
        """Return the last :data:`STDERR_TAIL_BYTES` bytes of stderr, decoded leniently,
        after waiting up to ``wait_s`` seconds for stderr to end (so what the process wrote
        last is in it)."""


class Transport(ABC):
    """A way to reach one host. ``connect`` may raise :class:`fleetctl.errors.HostError`."""

    label: str

    @abstractmethod
    def connect(self) -> None:
        """Open the connection; checks the host key for SSH (docs/invariants.md, invariant 7)."""

    @abstractmethod
    def start(self, argv: list[str]) -> Channel:
        """Start ``argv`` on the host with no shell involved locally; return its channel."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection; safe to call more than once."""

    #: ``"sudo"`` when every command runs through ``sudo -n --`` (``become: sudo``).
    become: str | None = None

    def lost(self) -> str | None:
        """Where the connection went, if it dropped (``"user@host:port"``); ``None`` while it
        is up, and always for a transport with no connection (local)."""
        return None

    def explain(self, stderr_tail: str) -> HostError | None:
        """Why a started command ended before the program in it said a word, if the transport
        can find out (sudo refusing a ``become: sudo`` host: :mod:`.sudoprobe`); ``None``
        otherwise."""
        return None

    def probe(self, argv: list[str], tty: bool = False, stdin: bytes = b"") -> ProbeResult:
        """Run a short command on the host as the login itself (never through sudo) and wait
        for it, at most the host's timeout.

        Args:
            argv: the command (for SSH, each word quoted for the login's shell).
            tty: on a pseudo-terminal (stdout and stderr then arrive mixed on stdout).
            stdin: all of its input.

        Returns:
            Its exit status and output; status ``None`` when it did not end in time or no
            terminal could be had.
        """
        return ProbeResult(None)

    def __enter__(self) -> Transport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StderrTail:
    """Drain a stderr source on a thread, keeping only the last bytes (so it never blocks)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._thread = threading.Thread(target=self._drain, args=(read,), daemon=True)
        self._thread.start()

    def _drain(self, read: Callable[[int], bytes]) -> None:
        try:
            while True:
                block = read(4096)
                if not block:
                    return
                self._chunks.append(block)
                self._size += len(block)
                while self._size > STDERR_TAIL_BYTES and len(self._chunks) > 1:
                    self._size -= len(self._chunks.popleft())
        except (OSError, EOFError, ValueError):
            return

    def text(self, wait_s: float = 1.0) -> str:
        """Return the tail, waiting up to ``wait_s`` seconds for the source to end."""
        self._thread.join(wait_s)
        return b"".join(self._chunks)[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
