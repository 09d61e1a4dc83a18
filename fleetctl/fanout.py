"""Work over many hosts at once: one result per host, every host attempted, Ctrl-C handled.

Python delivers Ctrl-C to the main thread only, so the main thread waits here in short slices;
on Ctrl-C it ends every running host-side program (:func:`fleetctl.session.interrupt_all`: a
ship not yet switched leaves the previous release in use), no new one starts, and every host is
still reported.
"""

from __future__ import annotations

import concurrent.futures
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from fleetctl.session import interrupt_all

T = TypeVar("T")
R = TypeVar("R")


def wait_interruptible(futures: Sequence[concurrent.futures.Future]) -> None:
    """Wait for every future; on Ctrl-C, interrupt the host programs and keep waiting.

    After the first Ctrl-C, further ones are ignored until the process ends: the host programs
    are already being ended, and what remains (aborting prepared hosts, the report saying where
    each host stopped) takes seconds and must not itself be cut short.
    """
    pending = set(futures)
    while pending:
        try:
            _, pending = concurrent.futures.wait(pending, timeout=0.2)
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            interrupt_all()


def fan_out(items: Sequence[T], work: Callable[[T], R], parallel: int) -> list[R]:
    """Run ``work`` on every item, ``parallel`` at a time; results in input order.

    ``work`` must turn its own failures into a result: an exception it lets out is raised here
    after every item has finished.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(work, item) for item in items]
        wait_interruptible(futures)
        return [f.result() for f in futures]
