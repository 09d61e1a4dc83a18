"""Ops ``releases`` and ``rollback``: listing the releases and history, switching back."""

import errno
import os
import re

from fleetctl.host.lock import lock_holder, lock_root
from fleetctl.host.stage import switch
from fleetctl.host.state import (
    FOREIGN_ENTRY,
    RELEASE_ENTRY,
    append_history,
    classify_releases,
    history_path,
    read_manifest,
    read_state,
    record_meta,
    record_path,
    record_problem,
    recover_attempts,
    rollback_target,
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

RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z: the whole name


def list_releases(emit, root, request):
    """Op ``releases``: every release with its record's provenance, which is current, and the
    host's history lines; read only.

    Emits ``{"t": RELEASES, "current", "identity", "ship_in_progress"}``, per entry of
    ``releases/`` ``{"t": RELEASE, "id", "kind", "recorded", "meta"}`` (``kind`` as
    :func:`~fleetctl.host.state.classify_releases` says; ``reason`` for a foreign entry,
    ``problem`` for a release whose record cannot be used), per history line ``{"t": HISTORY,
    "line"}``, then ``{"t": RELEASES_END}``.
    """
    state = read_state(emit, root)
    emit({"t": RELEASES, "current": state["current"], "identity": state.get("identity"),
          "ship_in_progress": (lock_holder(root).strip(" ()") or None)
          if os.path.isdir(root) else None})
    for entry in classify_releases(root, state["current"]):
        name = entry["id"]
        if entry["kind"] != RELEASE_ENTRY:
            emit({"t": RELEASE, "id": name, "kind": entry["kind"], "reason": entry["reason"],
                  "recorded": False, "meta": {}})
            continue
        recorded = os.path.lexists(record_path(root, enc(name)))
        event = {"t": RELEASE, "id": name, "kind": RELEASE_ENTRY, "recorded": recorded,
                 "meta": record_meta(root, enc(name)) if recorded else {}}
        problem = record_problem(root, enc(name)) if recorded else None
        if problem is not None:
            event["problem"] = f"its record cannot be used: {problem}"
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
        recover_attempts(emit, root, current)  # a killed ship's release is never a target
        if state["current_kind"] != "symlink" or not current:
            raise Stop("rollback", "layout", "the host has no release in use to roll back from")
        entries = {e["id"]: e for e in classify_releases(root, current)}
        good = [name for name, e in sorted(entries.items()) if e["good"]]
        target = request.get("to")
        if target is None:
            target = rollback_target(root, current, good)
            if target is None:
                raise Stop("rollback", "failed", "no earlier release with a record is left on "
                           "the host")
        found = entries.get(target) if isinstance(target, str) else None
        if found is not None and found["kind"] == FOREIGN_ENTRY:
            raise Stop("rollback", "failed", f"releases/{target} is not a release fleetctl made "
                       f"({found['reason']}): it is never a rollback target")
        if not RELEASE_ID.fullmatch(target) or found is None or found["kind"] != RELEASE_ENTRY:
            raise Stop("rollback", "failed", "no release {} on the host (releases: {})".format(
                target, ", ".join(state["releases"]) or "none"))
        if target == current:
            emit({"t": DONE, "release": target, "previous": current, "differences": [],
                  "unchanged": True})
            return 0
        if not os.path.lexists(record_path(root, enc(target))):
            raise Stop("verify", "failed", f"release {target} has no record to verify it against")
        problem = record_problem(root, enc(target))
        if problem is not None:
            raise Stop("verify", "failed", f"the record of release {target} cannot be used "
                       f"({problem}): the release cannot be verified, so it is not rolled back "
                       "to", dec(record_path(root, enc(target))))
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

