"""One run of the host program on a host, seen from the client: :class:`HostSession`.

A session is one process on the host and one round trip: the program (:mod:`fleetctl.bundle`)
and the request go down stdin, the events come back as JSON lines and are decoded into types
(:mod:`fleetctl.hostevents`) while the host works, and for a ship the commands and the content
follow on the same stdin while the host holds its lock. Every command that talks to a host goes
through this class: ``drift`` and ``ship`` (:mod:`fleetctl.scan`, :mod:`fleetctl.ship`), the
day-two operations (:mod:`fleetctl.hostops`) and ``tokens --live``.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from fleetctl import bundle
from fleetctl.errors import HostError
from fleetctl.hostevents import BadEvent, Hello, HostEvent, decode_event, error_from_event
from fleetctl.protocol import encode_json, frame
from fleetctl.transport import open_transport
from fleetctl.transport.base import Channel, ChannelTimeout, Transport

#: Content is written to the host in slices of this size: the transport blocks while the
#: host's pipe is full (that is the flow control), and no slice copies the content.
SEND_CHUNK_BYTES = 1 << 18
#: Seconds a program whose output ended is given to finish its stderr and exit before the
#: channel is closed (so the reason it wrote last is not cut off).
END_WAIT_S = 10.0
#: What is kept of the login's output before the program's hello (quoted in an error): the
#: last lines, each cut to this many bytes; and the bytes searched for a hello at most.
NOISE_LINES = 20
NOISE_LINE_BYTES = 300
NOISE_BUFFER_BYTES = 1 << 20

_ACTIVE: set[HostSession] = set()
_ACTIVE_LOCK = threading.Lock()
INTERRUPTED = threading.Event()


def interrupt_all() -> None:
    """End every running host program at once (Ctrl-C) and refuse to start new ones.

    A ship killed before its switch leaves the previous release in use; the host's lock goes
    with the process.
    """
    INTERRUPTED.set()
    with _ACTIVE_LOCK:
        sessions = list(_ACTIVE)
    for session in sessions:
        session.kill()


class HostSession:
    """One run of the host program.

    Args:
        transport: a connected transport.
        python: the interpreter on the host (``python3`` unless the inventory says otherwise).
        request: the JSON request (``op`` and its keys; ``root`` the managed root).
        timeout_s: seconds after which the whole run is ended; ``None`` for no limit.

    Raises:
        HostError: Ctrl-C was pressed before (nothing is started); a program that does not
            read its input shows when the events are read (timed out, or its output ended).
    """

    def __init__(self, transport: Transport, python: str, request: dict[str, Any],
                 timeout_s: float | None) -> None:
        self.label = transport.label
        #: What the transport noticed while connecting (a known_hosts line skipped); a scan
        #: reports them among its warnings.
        self.transport_warnings: list[str] = list(getattr(transport, "warnings", ()))
        self._transport = transport
        self._timed_out = False
        #: The type of the last event the program sent (``None`` before its hello).
        self._last_event: str | None = None
        if INTERRUPTED.is_set():
            raise HostError(f"{self.label}: interrupted; not started")
        self._chan: Channel = transport.start([python, "-c", bundle.BOOTSTRAP])
        self._timeout_s = timeout_s
        self._timer: threading.Timer | None = None
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        # A Ctrl-C while the program was being started (an SSH channel takes a round trip)
        # found no session to end: the flag is set before interrupt_all looks, so seen here.
        if INTERRUPTED.is_set():
            self.kill()
            raise HostError(f"{self.label}: interrupted; ended as it started")
        self.arm()
        self._buffer = b""
        self._python = python
        self._nonce = secrets.token_hex(16)
        self._started = False
        self._output_ended = False
        self._noise: list[bytes] = []
        self._events = self._read_events()
        # Sent from a thread while stdout is read here: a login whose start-up prints more than
        # a pipe holds (64 KiB) blocks until its stdout is read, and would never read the
        # program meanwhile. What arrives is kept for the events (noise, then the hello).
        self._send_failed = False
        self._first_send = threading.Thread(
            target=self._send_quietly, daemon=True,
            args=(frame(bundle.program()) + frame(encode_json({**request,
                                                                "nonce": self._nonce})),))
        self._first_send.start()
        # Read only until the hello: the program says hello once it has read the whole request,
        # so the send is over by then, and a program that then waits for the client (a ship
        # waits for its turn to lock) has nothing more to say. Reading on while the sending
        # thread had not yet returned blocked here for ever (the demo's ship timed out).
        nonce = self._nonce.encode("ascii")
        while self._first_send.is_alive() and nonce not in self._buffer:
            try:
                with self._timing():
                    block = self._chan.read(1 << 16)
            except OSError:
                break
            if not block:
                break
            self._buffer += block
        self._first_send.join()
        if self._send_failed and (self._timed_out or INTERRUPTED.is_set()):
            raise self.broken("it did not read its input")
        # otherwise a program that died at once: the events report why from its stderr

    # -- time ----------------------------------------------------------------------------------

    def arm(self) -> None:
        """Start (or restart) the timeout: the run is ended ``timeout_s`` from now.

        A fleet ship re-arms it for each phase of a host's work and pauses it while the host
        waits for the others, so the limit is on this host's work, not the fleet's.
        """
        self.pause()
        if self._timeout_s:
            self._timer = threading.Timer(self._timeout_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def pause(self) -> None:
        """Stop the timeout until :meth:`arm` (the host waits on the client, not working)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timed_out = True
        self._chan.kill()

    # -- input ---------------------------------------------------------------------------------

    def _send_quietly(self, data: bytes) -> None:
        try:
            with self._timing():
                self._chan.send(data)
        except OSError:
            self._send_failed = True

    def send(self, data: bytes) -> None:
        """Write raw bytes to the program's stdin (blocks while its pipe is full), after the
        program and the request.

        Raises:
            OSError: the program no longer reads (it stopped: its events say why), or it read
                nothing for the host's timeout (the run is then ended as timed out).
        """
        self._first_send.join()
        with self._timing():
            self._chan.send(data)

    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        """A channel that gives up waiting (its own timeout) ends the run as the timer would."""
        try:
            yield
        except ChannelTimeout:
            self._expire()
            raise

    def send_json(self, obj: Any) -> None:
        """Send one JSON frame (a command of a ship); OSError as :meth:`send`."""
        self.send(frame(encode_json(obj)))

    def send_content(self, digest: str, data: bytes) -> None:
        """Send one content frame (``<digest>\\n<size>\\n<bytes>``) in bounded slices.

        Slices of a memoryview share the buffer: sending a large file packet by packet costs no
        copy of it (a ``bytes`` slice per packet made a 64 MiB file take 30 s).

        Raises:
            OSError: the program no longer reads.
        """
        self._first_send.join()
        with self._timing():
            self._chan.send(b"%s\n%d\n" % (digest.encode("ascii"), len(data)))
            view = memoryview(data)
            for start in range(0, len(view), SEND_CHUNK_BYTES):
                self._chan.send(view[start:start + SEND_CHUNK_BYTES])

    # -- output --------------------------------------------------------------------------------

    def events(self) -> Iterator[HostEvent]:
        """The events the host reports, until its output ends; one iterator per session, so
        a caller may stop and go on reading later (a ship reads in phases).

        Raises:
            HostError: the output ended mid-line or was not an event; the host's ``error``
                event as its exception (:func:`~fleetctl.hostevents.error_from_event`:
                ShipRefused, PermissionDenied or HostError).
        """
        return self._events

    def _read_events(self) -> Iterator[HostEvent]:
        while True:
            newline = self._buffer.find(b"\n")
            while newline < 0:
                if not self._started and len(self._buffer) > NOISE_BUFFER_BYTES:
                    # A login that prints without a newline: keep looking, in bounded memory.
                    self._note_noise(self._buffer[:-NOISE_BUFFER_BYTES])
                    self._buffer = self._buffer[-NOISE_BUFFER_BYTES:]
                try:
                    with self._timing():
                        block = self._chan.read(1 << 16)
                except OSError as exc:
                    raise self.broken(str(exc)) from None
                if not block:
                    self._output_ended = True
                    if self._buffer or self._timed_out or not self._started:
                        if not self._started:
                            self._note_noise(self._buffer)
                        raise self.broken("output ended mid-line" if self._started else
                                          "it ended before it started")
                    return
                self._buffer += block
                newline = self._buffer.find(b"\n")
            line, self._buffer = self._buffer[:newline], self._buffer[newline + 1:]
            if not self._started:
                # Before the program's first frame, stdout is the login's: what a shell
                # start-up file or banner printed. Only the hello carrying this run's nonce
                # starts the protocol; noise cannot know the nonce, so it cannot forge one.
                hello = self._hello_in(line)
                if hello is None:
                    self._note_noise(line)
                    continue
                self._started = True
                self._last_event = hello.t
                yield hello
                continue
            try:
                event = decode_event(line)
            except BadEvent as exc:
                raise self.broken(str(exc)) from None
            if isinstance(event, dict):  # the host stopped: its error event
                self.finish()
                raise error_from_event(self.label, event)
            self._last_event = event.t
            yield event

    def _hello_in(self, line: bytes) -> HostEvent | None:
        """The program's hello if ``line`` is it (a ``hello`` event with this run's nonce)."""
        if self._nonce.encode("ascii") not in line:
            return None
        try:
            event = decode_event(line)
        except BadEvent:
            return None
        if isinstance(event, Hello) and event.raw.get("nonce") == self._nonce:
            return event
        return None

    def _note_noise(self, data: bytes) -> None:
        """Keep the last lines the login printed before the program started (for an error)."""
        for line in data.splitlines():
            if line.strip():
                self._noise.append(line[:NOISE_LINE_BYTES])
        del self._noise[:-NOISE_LINES]

    def broken(self, why: str) -> HostError:
        """Build the error for a run that ended abnormally, with the tail of its stderr.

        When the program's output has ended, its stderr is read to its end (up to
        :data:`END_WAIT_S` seconds) before the channel is closed, so the last thing the host
        wrote, the reason, is in the message. A program that never sent its hello did not
        start: the shell's exit status 127 or 126 (POSIX: command not found, not executable)
        means the inventory's ``python:`` names no interpreter the host can run.
        """
        if INTERRUPTED.is_set():
            return HostError(f"{self.label}: interrupted; if a ship was under way, the previous "
                             "release stays in use unless it had already switched (check with "
                             "drift)")
        if self._timed_out:
            return HostError(f"{self.label}: timed out after {self._timeout_s:g} s: "
                             f"{self._awaited()}; the operation was ended")
        status = None
        if self._output_ended:
            tail = self._chan.stderr_tail(END_WAIT_S)
            status = self._chan.ended(END_WAIT_S)
            self._chan.kill()
        else:
            self._chan.kill()
            tail = self._chan.stderr_tail()
        tail = tail.strip()
        where = self._transport.lost()
        if where is not None:
            return HostError(f"{self.label}: the connection to {where} was lost ({why})",
                             hint="check that the host is up and its sshd running, then run "
                             "again (a ship that had not switched left the previous release "
                             "in use: drift says)")
        if not self._started:  # it never started: e.g. sudo refused (become: sudo)
            explained = self._transport.explain(tail)
            if explained is not None:
                return explained
        detail = f": {tail.splitlines()[-1]}" if tail else ""
        if self._started:
            return HostError(f"{self.label}: the host-side program failed ({why}){detail}")
        return self._not_started(status, detail)

    def _not_started(self, status: int | None, detail: str) -> HostError:
        """The error for a program that never sent its hello (exit ``status``, stderr line)."""
        noise = ""
        if self._noise:
            noise = (f"; before that the login printed {len(self._noise)} line(s), the last "
                     f"{self._noise[-1].decode('utf-8', 'replace')!r}")
        hint = (f"set `python:` for {self.label} in the inventory to the path of a Python 3.8 "
                "or newer on the host (e.g. python: /usr/bin/python3)")
        if status in (126, 127):
            why = "not found" if status == 127 else "found but cannot be run"
            return HostError(f"{self.label}: the interpreter {self._python!r} (the inventory's "
                             f"`python:` setting) was {why} on the host (exit status {status})"
                             f"{detail}{noise}", hint=hint)
        shown = "unknown" if status is None or status < 0 else str(status)
        if status is not None and self._interpreter_runs():
            return HostError(
                f"{self.label}: {self._python!r} runs on the host (Python 3.8 or newer), but "
                "the host-side program sent on its stdin did not arrive whole (exit status "
                f"{shown}){detail}{noise}: something the login runs before it read from "
                "stdin (a start-up file: ~/.bashrc, /etc/bash.bashrc, or a python: wrapper)",
                hint="make the login's start-up read nothing for a command run over ssh: in "
                "~/.bashrc, put such lines after `[ -t 0 ] || return`")
        return HostError(f"{self.label}: the host-side program did not start under "
                         f"{self._python!r} (the inventory's `python:` setting; exit status "
                         f"{shown}){detail}{noise}", hint=hint)

    def _interpreter_runs(self) -> bool:
        """Whether the inventory's interpreter, run as the login with nothing on its stdin,
        runs a Python 3.8+ program (it prints a random token only then)."""
        token = "fleetctl-probe-" + secrets.token_hex(8)
        program = f"import sys;sys.stdout.write({token!r} if sys.version_info >= (3, 8) else '')"
        found = self._transport.probe([self._python, "-c", program])
        return found.status == 0 and token.encode() in found.stdout

    def _awaited(self) -> str:
        """What the run was waiting for when its time ran out, in words."""
        if self._started:
            return (f"the host program did not answer (its last report was "
                    f"{self._last_event!r})")
        if self._transport.become == "sudo":
            return ("sudo did not start the host program (not a word came from it: sudo waits "
                    "on something, e.g. PAM, LDAP/sssd or a wrapper, or the interpreter hangs "
                    "as it starts)")
        return "the host program did not start (not a word came from it)"

    # -- end -----------------------------------------------------------------------------------

    def finish(self) -> int:
        """Wait for the program to end and return its exit status."""
        try:
            status = self._chan.wait()
        finally:
            self._forget()
        return status

    def _forget(self) -> None:
        self.pause()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self)

    def kill(self) -> None:
        """End the program at once (used when the caller gives up part-way)."""
        self._chan.kill()
        self._forget()


class HostTarget(Protocol):
    """What a session needs of an inventory host (:class:`fleetctl.inventory.Host` has it).

    A protocol rather than an import, so this layer stays below the inventory (docs/design.md,
    (u)).
    """

    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def root(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def timeout_s(self) -> float | None: ...


@contextlib.contextmanager
def open_session(host: HostTarget, request: dict[str, Any]) -> Iterator[HostSession]:
    """Connect to ``host`` and start the host program with ``request`` (``root`` added).

    The program is ended and the connection closed on exit, whatever happened.

    Raises:
        HostError: unreachable host, bad host key, the program could not start.
    """
    transport = open_transport(host)
    transport.connect()
    session = None
    try:
        session = HostSession(transport, host.python, {"root": host.root, **request},
                              host.timeout_s)
        yield session
    finally:
        if session is not None:
            session.kill()
        transport.close()


def run_to(session: HostSession, end: str) -> list[HostEvent]:
    """Read the events of ``session`` up to the one of type ``end`` (included) and wait for the
    program to end.

    Raises:
        HostError: the output ended first (or as :meth:`HostSession.events`).
    """
    events = []
    for event in session.events():
        events.append(event)
        if event.t == end:
            session.finish()
            return events
    raise session.broken(f"it ended before {end!r}")
