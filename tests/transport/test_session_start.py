"""The start of a session: the program and request are sent from a thread while the host's
first output is read, and that reading must end at the hello.

A ship's host program says hello and then waits for the client's turn to lock. The client used
to go on reading while its sending thread had not yet returned, so when that thread was slow to
finish (a busy machine: the demo's ship of its second box timed out after 120 s in a full run)
the client waited in a read the host would never answer. The thread's slowness is made
deterministic here: its first send returns only once the client is either reading again after
the hello (the old behaviour: then the host never answers) or joining the thread (the fixed
one). The channel is the real local one; only the sending thread's return is held.
"""

from __future__ import annotations

import sys
import threading

from fleetctl.protocol import HELLO, LOCKED
from fleetctl.session import HostSession
from fleetctl.transport.local import LocalTransport
from tests.helpers import wait_until


def _in_join(thread_id: int) -> bool:
    """Whether the thread ``thread_id`` is waiting in :meth:`threading.Thread.join`."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code.co_name == "_wait_for_tstate_lock":
            return True
        frame = frame.f_back
    return False


class SlowToReturn:
    """A real channel whose first ``send`` returns only when the reader has moved on."""

    def __init__(self, inner, reader: int) -> None:
        self._inner = inner
        self._reader = reader
        self._first = True
        self._seen = b""
        self.read_after_hello = threading.Event()

    def send(self, data):
        self._inner.send(data)
        if self._first:
            self._first = False
            wait_until(lambda: self.read_after_hello.is_set() or _in_join(self._reader),
                       what="the client reading after the hello, or joining the sender")

    def read(self, size):
        if f'"t":"{HELLO}"'.encode() in self._seen.replace(b" ", b""):
            self.read_after_hello.set()
        block = self._inner.read(size)
        self._seen += block
        return block

    def __getattr__(self, name):
        return getattr(self._inner, name)


class HeldTransport(LocalTransport):
    def start(self, argv):
        self.channel = SlowToReturn(super().start(argv), threading.get_ident())
        return self.channel


def test_the_start_stops_reading_at_the_hello_when_the_host_then_waits(tmp_path):
    transport = HeldTransport("h")
    transport.connect()
    session = HostSession(transport, sys.executable,
                          {"op": "ship", "root": str(tmp_path / "root")}, timeout_s=20)
    try:
        # The constructor returned at all: before, it waited in a read until the timeout.
        assert not transport.channel.read_after_hello.is_set()
        session.send_json({"cmd": "lock"})
        events = session.events()
        assert next(events).t == HELLO
        assert next(e for e in events if e.t == LOCKED).raw["created_root"] is True
    finally:
        session.kill()
