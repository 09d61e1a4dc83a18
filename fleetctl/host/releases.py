"""Ops ``releases`` and ``rollback``: listing the releases and history, switching back."""

import errno
import os
import re

from fleetctl.host.lock import lock_root
from fleetctl.host.stage import switch
from fleetctl.host.state import (
    append_history,
    history_path,
    read_manifest,
    read_state,
    record_meta,
    record_path,
)
from fleetctl.host.walk import tree_differences
from fleetctl.host.wire import Stop, dec, enc, os_error_text
from fleetctl.protocol import (
    DONE,
    HISTORY,
    RELEASE,
    RELEASES,
    RELEASES_END,
    STEP,
    WARNING,
    is_credential_path,
)

RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def list_releases(emit, root, request):
    """Op ``releases``: every release with its record's provenance, which is current, and the
    host's history lines; read only.

    Emits ``{"t": RELEASES, "current", "identity"}``, per release ``{"t": RELEASE, "id",
    "recorded", "meta"}``, per history line ``{"t": HISTORY, "line"}``, then
    ``{"t": RELEASES_END}``.
    """
    state = read_state(emit, root)
    emit({"t": RELEASES, "current": state["current"], "identity": state.get("identity")})
    for name in state["releases"]:
        recorded = os.path.lexists(record_path(root, enc(name)))
        event = {"t": RELEASE, "id": name, "recorded": recorded,
                 "meta": record_meta(root, enc(name)) if recorded else {}}
        if recorded:
            try:
                read_manifest(record_path(root, enc(name)))
            except (OSError, ValueError) as exc:
                event["problem"] = f"its record cannot be used: {exc}"
        emit(event)
    try:
        with open(history_path(root), "rb") as fh:
            for raw in fh:
                if raw.endswith(b"\n") and raw.strip():
                    emit({"t": HISTORY, "line": dec(raw.rstrip(b"\n"))})
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            emit({"t": WARNING, "message":
                  f"cannot read {dec(history_path(root))}: {os_error_text(exc)}"})
    emit({"t": RELEASES_END})
    return 0


def release_differences(root, release):
    """How a release on disk differs from its record (paths, kinds); [] when it matches."""
    recorded = [e for e in read_manifest(record_path(root, release))
                if not is_credential_path(e["path"])]
    problems, differences = tree_differences(
        os.path.join(root, b"releases", release), recorded,
        ("type", "mode", "owner", "digest", "target"), vanished_ok=True)
    for path, what, _expected, _got in differences:
        problems.append("{}: {}".format(path, "content" if what == "digest" else what))
    return problems


def rollback(emit, root, request):
    """Op ``rollback``: switch ``current`` to an earlier release under the host's lock.

    The target (``to``, or else the release the current one's record names as ``previous``,
    or else the newest older release with a record) is first compared with its record; a
    release edited in place is refused (kind ``changed``, naming what differs) unless
    ``force``. The switch is one rename; a history line records it.
    """
    if not os.path.isdir(root):
        raise Stop("lock", "failed", f"the root {dec(root)} does not exist")
    lock_fd = lock_root(root)
    try:
        state = read_state(emit, root)
        current = state["current"]
        if state["current_kind"] != "symlink" or not current:
            raise Stop("rollback", "layout", "the host has no release in use to roll back from")
        target = request.get("to")
        if target is None:
            previous = (state.get("meta") or {}).get("previous")
            older = [r for r in state["releases"] if r < current and
                     os.path.lexists(record_path(root, enc(r)))]
            target = previous if previous in state["releases"] else (older[-1] if older else None)
            if target is None:
                raise Stop("rollback", "failed", "no earlier release with a record is left on "
                           "the host")
        if not RELEASE_ID.match(target) or target not in state["releases"]:
            raise Stop("rollback", "failed", "no release {} on the host (releases: {})".format(
                target, ", ".join(state["releases"]) or "none"))
        if target == current:
            emit({"t": DONE, "release": target, "previous": current, "differences": [],
                  "unchanged": True})
            return 0
        if not os.path.lexists(record_path(root, enc(target))):
            raise Stop("verify", "failed", f"release {target} has no record to verify it against")
        emit({"t": STEP, "name": "verify"})
        try:
            problems = release_differences(root, enc(target))
        except (OSError, ValueError) as exc:
            raise Stop("verify", "failed", f"the record of release {target} cannot be used "
                       f"({exc}): the release cannot be verified, so it is not rolled back to",
                       dec(record_path(root, enc(target)))) from exc
        if problems and not request.get("force"):
            more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
            raise Stop("verify", "changed", "release {} was changed since it was shipped: "
                       "{}{}".format(target, "; ".join(problems[:8]), more))
        emit({"t": STEP, "name": "switch"})
        switch(root, enc(target))
        meta = record_meta(root, enc(target))
        append_history(emit, root, {"kind": "rollback", "time": request.get("time"),
                              "by": request.get("by"), "release": target, "previous": current,
                              "host": request.get("host"), "forced": bool(problems),
                              "differences": problems[:20], "source": meta.get("source")})
        emit({"t": DONE, "release": target, "previous": current, "differences": problems})
        return 0
    finally:
        os.close(lock_fd)

