"""One short read-only (or lock-taking) operation of the host-side program, run to its end.

``drift`` and ``ship`` keep a :class:`~fleetctl.session.HostSession` open across phases
(:mod:`fleetctl.scan`, :mod:`fleetctl.ship`); the day-two commands (``releases``, ``history``,
``rollback``, the live content behind ``drift --diff`` and ``backport``) each need one request
and its events.
"""

from __future__ import annotations

from typing import Any

from fleetctl.inventory import Host
from fleetctl.session import open_session, run_to


def run_op(host: Host, request: dict[str, Any], end: str) -> list[dict[str, Any]]:
    """Run the host-side program with ``request`` and return its events up to ``end``.

    Args:
        host: the host.
        request: the JSON request (``op`` and its keys; ``root`` is added).
        end: the event type (``t``) that ends the operation; ``done`` for a rollback.

    Returns the events before ``end`` and ``end`` itself, in order.

    Raises:
        HostError: unreachable host, bad host key, the program failed or ended early, timeout.
        ShipRefused: the operation needs the host's lock and another ship holds it, or it was
            refused by the host (a changed release).
    """
    with open_session(host, request) as session:
        return [event.as_dict() for event in run_to(session, end)]


def read_live_files(host: Host, paths: list[str], max_bytes: int = 1 << 20
                    ) -> dict[str, bytes | str]:
    """The content of files of a host's release in use, by path (never credential files).

    Args:
        host: the host.
        paths: paths relative to the managed tree.
        max_bytes: files larger than this are not sent (1 MiB by default).

    Returns path → content (bytes), or path → why it is not there (str: the host's error,
    ``"too large (N bytes)"``). Only the paths asked for are kept: anything else the host
    sends is ignored, and content that is not valid base64 or not of the stated size is
    reported as unusable.

    Raises:
        HostError: the host cannot be reached or its program failed.
    """
    import base64
    import binascii

    wanted = set(paths)
    events = run_op(host, {"op": "read", "paths": list(paths), "max_bytes": max_bytes},
                    "read-end")
    out: dict[str, bytes | str] = {}
    for event in events:
        path = event.get("path")
        if event.get("t") != "content" or path not in wanted or path in out:
            continue
        if "data" in event:
            try:
                data = base64.b64decode(event["data"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                out[path] = "the host sent content that is not valid base64"
                continue
            out[path] = data if len(data) == event.get("size") else \
                "the host sent content of another size than it stated"
        elif event.get("too_large"):
            out[path] = f"too large ({event.get('size')} bytes) to show"
        else:
            out[path] = str(event.get("error") or "not sent")
    for path in paths:
        out.setdefault(path, "not sent by the host")
    return out
