"""The entry point of the host program: read the request, run its operation.

Operations (request ``op``): ``scan`` (read only), ``ship`` (lock, scan, then the commands of
:mod:`fleetctl.host.ship`), ``read``, ``releases``, ``rollback``, ``ledgers``, ``status``. Each
starts with a ``hello`` event naming the account it runs as; a failure ends with one ``error``
event (:class:`~fleetctl.host.wire.Stop`) and a non-zero exit status.
"""

import errno
import os
import sys

from fleetctl.host.ledgers import read_ledgers
from fleetctl.host.lock import remove_empty_root, root_key, take_ship_lock
from fleetctl.host.readops import read_files
from fleetctl.host.releases import list_releases, rollback
from fleetctl.host.services import probe_units
from fleetctl.host.ship import do_ship, layout_problem
from fleetctl.host.state import read_state, scan, ship_story
from fleetctl.host.status import read_status
from fleetctl.host.wire import (
    StdoutSink,
    Stop,
    dec,
    enc,
    group_name,
    os_error_text,
    read_json_frame,
    user_name,
)
from fleetctl.protocol import (
    DONE,
    ERROR,
    EXIT_FAILED,
    EXIT_REFUSED,
    HELLO,
    LOCKED,
    REFUSALS,
    ROOT,
)


def main(emit, inp):
    """Read the request from ``inp``, carry out its op, report to ``emit``; return the exit
    status (0, 1 a failure, 3 a refusal: the error event says which)."""
    request = read_json_frame(inp)
    root = enc(request["root"])
    uid, gid = os.geteuid(), os.getegid()
    # The nonce is the client's, from the request: the client takes this line, and no line the
    # login's shell printed before it, as the start of the protocol.
    emit({"t": HELLO, "nonce": request.get("nonce"), "user": user_name(uid),
          "group": group_name(gid), "uid": uid,
          "python": ".".join(str(n) for n in sys.version_info[:3])})
    lock_fd = None
    created_root = False
    try:
        if request["op"] == "ledgers":
            return read_ledgers(emit, root, request)
        if request["op"] == "status":
            return read_status(emit, root, request)
        if request["op"] == "read":
            return read_files(emit, root, request)
        if request["op"] == "releases":
            return list_releases(emit, root, request)
        if request["op"] == "rollback":
            return rollback(emit, root, request)
        if os.path.lexists(root) and not os.path.isdir(root):
            raise Stop("scan", "layout", f"the root {dec(root)} exists and is not a directory")
        if request["op"] == "ship":
            # The client takes the locks of a fleet one host at a time, in a fixed order: this
            # host waits for its turn, then answers whether it got the lock.
            go = read_json_frame(inp)
            if go.get("cmd") != "lock":
                emit({"t": DONE, "release": None, "pruned": []})
                return 0
            if os.path.isdir(root):
                emit({"t": ROOT, "key": root_key(root)})
            lock_fd, created_root = take_ship_lock(root)
            emit({"t": LOCKED, "created_root": created_root})
        state = read_state(emit, root)
        if request["op"] == "scan" and os.path.isdir(root):
            # The lock read from /proc/locks, never by trying it: a drift must not make a ship
            # starting at the same moment find its host locked. A failed or killed last ship
            # is told too (the report makes it a finding).
            story = ship_story(root, state["current"])
            state["ship_in_progress"] = story["ship_in_progress"]
            state["failed_ships"] = ([story["failed"]] if story["failed"] else []) + \
                story["interrupted"]
            state["story_errors"] = story["errors"]
        emit({k: v for k, v in state.items() if not k.startswith("_")})
        if request.get("unit_dir") is not None:
            emit(probe_units(request))
        if request["op"] == "ship" and state["current_kind"] in ("dir", "other"):
            raise Stop("scan", "layout", layout_problem(root, state))
        scanned = scan(emit, root, state, request)
        if request["op"] == "ship":
            fd, lock_fd = lock_fd, None  # do_ship closes it
            return do_ship(emit, inp, root, request, state, scanned, fd, created_root)
        return 0
    except Stop as stop:
        emit(stop.event)
        return EXIT_REFUSED if stop.event["kind"] in REFUSALS else EXIT_FAILED
    except OSError as exc:  # anything the steps did not name: still one clear event
        path = exc.filename.decode("utf-8", "surrogateescape") if isinstance(
            exc.filename, bytes) else exc.filename
        emit({"t": ERROR, "step": request["op"],
              "message": f"{exc.__class__.__name__}: {os_error_text(exc)}", "path": path,
            "kind": "permission" if exc.errno in (errno.EACCES, errno.EPERM) else "failed"})
        return EXIT_FAILED
    finally:
        if created_root:
            remove_empty_root(root)
        if lock_fd is not None:
            os.close(lock_fd)


def run():
    """Run the program on this process's stdin and stdout; return the exit status."""
    # A newline first: a shell start-up file that printed without one (``printf Welcome``)
    # would otherwise share its line with the hello.
    sys.stdout.buffer.write(b"\n")
    sink = StdoutSink(sys.stdout.buffer)
    try:
        return main(sink, sys.stdin.buffer)
    finally:
        sink.flush()
