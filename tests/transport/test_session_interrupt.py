"""Ctrl-C while a host program is being started: the session that was not yet known to
``interrupt_all`` ends its own program instead of leaving it to run (a real local host program,
the interrupt injected at the racy moment; an SSH channel open widens that moment to a round
trip)."""

from __future__ import annotations

import sys

import pytest

from fleetctl.errors import HostError
from fleetctl.session import INTERRUPTED, HostSession, interrupt_all
from fleetctl.transport.local import LocalTransport


class _InterruptedWhileStarting(LocalTransport):
    """A local transport whose start is overtaken by a Ctrl-C (``interrupt_all``)."""

    started: list = []

    def start(self, argv):
        channel = super().start(argv)
        self.started.append(channel)
        interrupt_all()  # the program runs; the session has not registered it yet
        return channel


@pytest.fixture
def interrupted_flag():
    """``INTERRUPTED`` is process-wide: cleared after the test."""
    yield INTERRUPTED
    INTERRUPTED.clear()


def test_a_program_started_as_ctrl_c_lands_is_ended_not_left_running(tmp_path, interrupted_flag):
    transport = _InterruptedWhileStarting("h1")
    with pytest.raises(HostError, match="interrupted"):
        HostSession(transport, sys.executable, {"op": "scan", "root": str(tmp_path)},
                    timeout_s=None)
    [channel] = transport.started
    # Ended: its exit status is there at once (it would wait for its input for ever).
    assert channel._proc.wait(timeout=60) < 0
