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

from fleetctl.session import INTERRUPTED, interrupt_all

T = TypeVar("T")
R = TypeVar("R")


def wait_interruptible(futures: Sequence[concurrent.futures.Future]) -> None:
    """Wait for every future; on Ctrl-C, interrupt the host programs and keep waiting.

    In the main thread, Ctrl-C only sets a flag here (a SIGINT handler for the length of the
    wait), and the wait, in 0.2 s slices, then ends the host programs. A KeyboardInterrupt
    raised wherever the main thread happened to be could land inside
    ``concurrent.futures.wait`` while it held a future's lock: the worker finishing that
    future then blocked for ever, and so did fleetctl (seen in the Ctrl-C test under load).

    After the first Ctrl-C, further ones are ignored until the process ends: the host programs
    are already being ended, and what remains (aborting prepared hosts, the report saying where
    each host stopped) takes seconds and must not itself be cut short. Outside the main thread
    (a phase of a ship waiting on its hosts) it only waits: Ctrl-C reaches the main thread.
    """
    pending = set(futures)
    if threading.current_thread() is not threading.main_thread():
        concurrent.futures.wait(pending)
        return
    pressed = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: pressed.set())
    try:
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=0.2)
            if pressed.is_set() and not INTERRUPTED.is_set():
                interrupt_all()
    finally:
        if pressed.is_set():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def fan_out(items: Sequence[T], work: Callable[[T], R], parallel: int) -> list[R]:
    """Run ``work`` on every item, ``parallel`` at a time; results in input order.

    ``work`` must turn its own failures into a result: an exception it lets out is raised here
    after every item has finished.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(work, item) for item in items]
        wait_interruptible(futures)
        return [f.result() for f in futures]
