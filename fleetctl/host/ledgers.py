"""Op ``ledgers``: each named agent's token ledger, line by line; read only."""

import errno
import json
import os

from fleetctl.host.wire import dec, enc, os_error_text
from fleetctl.protocol import (
    LEDGER,
    LEDGER_END,
    LEDGER_MISSING,
    LEDGER_PARTIAL,
    LEDGER_UNREADABLE,
    LEDGERS_END,
)


def line_time(line):
    """The ``time`` of a ledger line (str), or None when it has none or is not JSON."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    stamp = record.get("time") if isinstance(record, dict) else None
    return stamp if isinstance(stamp, str) else None


def read_ledgers(emit, root, request):
    """Op ``ledgers``: stream each named agent's ``state/<agent>/ledger.jsonl``; read only.

    A last line without its newline is a line being written (the runner appends each line,
    newline included, with one write): it is not sent as a line but as ``{"t":
    "ledger-partial", "agent", "bytes"}`` (its length in bytes), before ``ledger-end``, whatever
    ``since`` says; ``lines`` in ``ledger-end`` counts the complete lines sent.
    """
    since = request.get("since")
    for agent in request.get("agents", []):
        path = os.path.join(root, b"state", enc(agent), b"ledger.jsonl")
        if not agent or "/" in agent or agent in (".", ".."):
            emit({"t": LEDGER_UNREADABLE, "agent": agent, "path": dec(path),
                  "error": "not an agent name"})
            continue
        lines = 0
        try:
            with open(path, "rb") as fh:
                for raw in fh:
                    if not raw.endswith(b"\n"):  # only the last line can lack it: in progress
                        if raw.strip():
                            emit({"t": LEDGER_PARTIAL, "agent": agent, "bytes": len(raw)})
                        break
                    line = dec(raw.rstrip(b"\n"))
                    if not line.strip():
                        continue
                    if since is not None:
                        stamp = line_time(line)
                        if stamp is not None and stamp <= since:
                            continue
                    emit({"t": LEDGER, "agent": agent, "line": line})
                    lines += 1
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR) and lines == 0:
                emit({"t": LEDGER_MISSING, "agent": agent, "path": dec(path)})
            else:
                emit({"t": LEDGER_UNREADABLE, "agent": agent, "path": dec(path),
                      "error": os_error_text(exc)})
            continue
        emit({"t": LEDGER_END, "agent": agent, "lines": lines})
    emit({"t": LEDGERS_END})
    return 0

