"""The layout under the root as it is now: ``current``, the releases, their records, the
host's identity and history, and the scan that streams all of it to the client.

Layout (DESIGN.md §5)::

    <root>/current -> releases/<id>        the release in use (symlink, switched by rename)
    <root>/releases/<id>/                  complete releases
    <root>/.fleetctl/releases/<id>.json    each release's manifest (digests only, no contents)
    <root>/.fleetctl/history.jsonl         one line per ship and rollback
    <root>/credentials/<agent>/<file>      granted credentials (0755/0700/0600), in no release

The shipped manifest is the record of the release ``current`` points to, so the switch of one
symlink changes the tree in use and the base of the three-way comparison together.
"""

import errno
import json
import os
import stat
import time

from fleetctl import protocol
from fleetctl.host.accounts import read_accounts
from fleetctl.host.files import create_file, make_dir, write_all, write_json
from fleetctl.host.lock import lock_holder
from fleetctl.host.remove import force_rmtree
from fleetctl.host.walk import scan_credentials, scan_tree
from fleetctl.host.wire import STATE_DIR_B, dec, enc, os_error_text
from fleetctl.protocol import (
    ACCOUNTS,
    SCAN_END,
    SHIPPED,
    STATE,
    UNREADABLE,
    WARNING,
    manifest_digest,
)

RECORD_SCHEMA = 1


def read_state(emit, root):
    """Describe the layout under ``root`` without writing anything."""
    state = {"t": STATE, "root_exists": os.path.isdir(root), "current": None,
             "current_kind": None, "releases": [], "shipped": False}
    current = os.path.join(root, b"current")
    try:
        st = os.lstat(current)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            # Not knowing whether a tree exists is not the same as having none.
            state["current_kind"] = "unreadable"
            emit({"t": UNREADABLE, "path": ".", "error": os_error_text(exc)})
        return state
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(current)
        state["_current_target"] = target
        state["current_kind"] = "symlink"
        head, name = os.path.split(target.rstrip(b"/"))
        if not os.path.isdir(os.path.join(root, target)):
            state["current_kind"] = "dangling"  # nothing in use: a forced ship may replace it
        elif head == b"releases":
            state["current"] = dec(name)
        else:
            state["current_kind"] = "foreign-symlink"
    else:
        state["current_kind"] = "dir" if stat.S_ISDIR(st.st_mode) else "other"
    entries = classify_releases(root, state["current"])
    state["releases"] = [e["id"] for e in entries if e["kind"] == RELEASE_ENTRY]
    state["foreign"] = [{"name": e["id"], "reason": e["reason"]} for e in entries
                        if e["kind"] == FOREIGN_ENTRY]
    state["staging"] = [e["id"] for e in entries if e["kind"] == STAGING_ENTRY]
    state["identity"] = read_identity(root)
    state["meta"] = None
    if state["current"] and os.path.lexists(record_path(root, enc(state["current"]))):
        try:
            state["_manifest"] = load_record(root, enc(state["current"]))
            state["meta"] = record_meta(root, enc(state["current"]))
            state["shipped"] = True
        except (OSError, ValueError) as exc:
            emit({"t": WARNING, "message": "the record {} cannot be used ({}): treated as "
                  "missing, so changes have origin unknown; ship --force writes a new one".format(
                      dec(record_path(root, enc(state["current"]))), exc)})
    return state


RELEASE_ENTRY, FOREIGN_ENTRY, STAGING_ENTRY, PRUNING_ENTRY = (
    "release", "foreign", "staging", "pruning")
STAGING_PREFIX = b".staging-"
PRUNING_PREFIX = b".pruning-"


def classify_releases(root, current=None):
    """What each entry of ``<root>/releases/`` is, sorted by name (read only, nothing followed).

    Returns a list of ``{"id", "kind", "reason", "good"}`` (``id`` the name as str):

    - kind ``release``: a directory (not a symlink) whose name is a release id and which has a
      record naming it, or which ``current`` points to (in use, recorded or not). ``good`` when
      its record is a usable fleetctl release record that names this release: only good
      releases are rollback targets and count towards retention.
    - kind ``staging``: ``.staging-<id>``, a directory: the release a ship is assembling, or
      the leftover of one that was interrupted (the next ship removes it); also ``<id>``
      itself while a ship's attempt file names it and it is not current (recorded, not yet
      switched to, or left so by a ship that was killed).
    - kind ``pruning``: ``.pruning-<id>``, a directory: a release being removed by a prune,
      or what a prune could not remove (the next prune tries again).
    - kind ``foreign``: anything fleetctl did not make: a file, a symlink, a special file, a
      name that is not a release id, a directory without a record (copied in, or left by a
      ship whose clean-up failed). ``reason`` says which. Never counted, followed or removed.

    A ``releases/`` that is missing or not a directory has no entries.
    """
    top = os.path.join(root, b"releases")
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return []
        names = sorted(os.listdir(top))
    except OSError:
        return []
    out = []
    for name in names:
        text = dec(name)
        entry = {"id": text, "kind": FOREIGN_ENTRY, "reason": None, "good": False}
        out.append(entry)
        try:
            st = os.lstat(os.path.join(top, name))
        except OSError as exc:  # vanished, or unreadable: not fleetctl's to judge or touch
            entry["reason"] = f"cannot be examined: {os_error_text(exc)}"
            continue
        if stat.S_ISLNK(st.st_mode):
            entry["reason"] = "a symlink, not a release directory (never followed)"
        elif not stat.S_ISDIR(st.st_mode):
            entry["reason"] = "a file, not a release directory" if stat.S_ISREG(st.st_mode) \
                else "a special file, not a release directory"
        elif name.startswith(STAGING_PREFIX) and protocol.RELEASE_ID.match(
                text[len(STAGING_PREFIX):]):
            entry["kind"] = STAGING_ENTRY
        elif name.startswith(PRUNING_PREFIX) and protocol.RELEASE_ID.match(
                text[len(PRUNING_PREFIX):]):
            entry["kind"] = PRUNING_ENTRY
        elif not protocol.RELEASE_ID.match(text):
            entry["reason"] = "a directory whose name is not a release id"
        elif text != current and os.path.lexists(attempt_path(root, name)):
            # Recorded, but the ship that made it has not switched to it (yet, or ever).
            entry["kind"] = STAGING_ENTRY
        elif not os.path.lexists(record_path(root, name)):
            if text == current:
                entry["kind"] = RELEASE_ENTRY  # in use, so not foreign; but no rollback target
            else:
                entry["reason"] = ("a directory without a record (copied in, or left by a ship "
                                   "that failed)")
        else:
            entry["kind"] = RELEASE_ENTRY
            entry["good"] = record_problem(root, name) is None
    return out


def record_problem(root, release):
    """Why the record of ``release`` (bytes) cannot vouch for it, or ``None`` when it can: it
    must be a fleetctl release record (:func:`read_manifest`) whose ``release`` is that name."""
    try:
        named = _read_record(record_path(root, release))[0].get("release")
    except (OSError, ValueError) as exc:
        return str(exc)
    if named != dec(release):
        return f"it is the record of release {named!r}, not of {dec(release)!r}"
    return None


def good_releases(root, current=None):
    """The ids (str) of the good releases under ``root``, oldest first (see
    :func:`classify_releases`)."""
    return [e["id"] for e in classify_releases(root, current) if e["good"]]


def rollback_target(root, current, good):
    """The release a rollback from ``current`` (str) goes back to by default, or ``None``: the
    one its record names as ``previous`` when that is good, or else the newest good release
    older than it. ``good``: the good release ids, oldest first (:func:`good_releases`)."""
    if not current:
        return None
    previous = record_meta(root, enc(current)).get("previous")
    if previous in good and previous != current:
        return previous
    older = [r for r in good if r < current]
    return older[-1] if older else None


def identity_path(root):
    """``<root>/.fleetctl/identity.json`` (bytes)."""
    return os.path.join(root, STATE_DIR_B, b"identity.json")


def read_identity(root):
    """The host identity recorded at adoption (``{"name", "id", "adopted"}``), or ``None``.

    A file that is there but unreadable or not an identity is reported as
    ``{"problem": ...}``: fleetctl must not take such a host for a new one.
    """
    path = identity_path(root)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
        if isinstance(data, dict) and isinstance(data.get("name"), str) and \
                isinstance(data.get("id"), str):
            return {"name": data["name"], "id": data["id"], "adopted": data.get("adopted")}
        problem = "not a fleetctl host identity"
    except (OSError, ValueError) as exc:
        problem = str(exc)
    return {"problem": f"{dec(path)}: {problem}"}


def write_identity(root, identity):
    """Record the host's identity (its inventory name and id), replacing any earlier one."""
    state_dir = os.path.join(root, STATE_DIR_B)
    if not os.path.isdir(state_dir):
        make_dir(state_dir, 0o755)
    write_json(identity_path(root), identity, 0o644)


RECORD_META_KEYS = ("created", "fleetctl", "shipped_by", "previous", "desired_digest",
                    "source", "forced", "allow_dirty", "host", "host_id", "kind", "renamed_from")


def record_meta(root, release):
    """The provenance part of a release record (everything but the manifest), or ``{}``."""
    try:
        with open(record_path(root, release), "rb") as fh:
            record = json.loads(fh.read().decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {k: record[k] for k in RECORD_META_KEYS if k in record}


def record_path(root, release):
    """The record of a release (bytes id): ``.fleetctl/releases/<id>.json``."""
    return os.path.join(root, STATE_DIR_B, b"releases", release + b".json")


def creds_record_path(root, release):
    """The credentials part of a release's record (0600): ``<id>.credentials.json``."""
    return os.path.join(root, STATE_DIR_B, b"releases", release + b".credentials.json")


def load_record(root, release):
    """Return the manifest list of a release's record (with its credentials part when there is
    one); ValueError if it is not one. A credentials part this account cannot read is left out:
    the credential files themselves are then unreadable too, and the scan says so."""
    manifest = read_manifest(record_path(root, release))
    side = creds_record_path(root, release)
    if os.path.lexists(side):
        try:
            manifest = manifest + read_manifest(side)
        except PermissionError:
            pass
    return manifest


def read_manifest(path):
    """The manifest list of a record file; ValueError if it is not a fleetctl release record."""
    return _read_record(path)[1]


def _read_record(path):
    """``(record, manifest)`` of a record file; ValueError if it is not a release record."""
    with open(path, "rb") as fh:
        record = json.loads(fh.read().decode("utf-8", "surrogateescape"))
    manifest = record.get("manifest") if isinstance(record, dict) else None
    if not isinstance(manifest, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and e.get("type") in
            ("file", "dir", "symlink", "other") for e in manifest):
        raise ValueError("not a fleetctl release record")
    return record, manifest


def emit_shipped(emit, manifest):
    """One ``shipped`` event per entry of the shipped manifest."""
    for entry in manifest:
        event = dict(entry)
        event["t"] = SHIPPED
        emit(event)


def scan(emit, root, state, request=None):
    """Emit the live manifest of ``<root>/current`` and of ``<root>/credentials``, the shipped
    manifest, and (when the request names them) the agents' accounts.

    Returns the entries of ``current``; the credentials tree's go to ``state["_creds"]``.
    """
    entries = []
    unreadable = 0
    if state["current_kind"] in ("symlink", "foreign-symlink"):
        if state["shipped"]:
            emit_shipped(emit, state["_manifest"])
        entries, unreadable = scan_tree(emit, os.path.join(root, b"current/"))
    elif state["current_kind"] == "dir":
        entries, unreadable = scan_tree(emit, os.path.join(root, b"current"))
    creds, bad = scan_credentials(emit, root, emit_events=True)
    state["_creds"] = creds
    unreadable += bad
    if request and request.get("accounts"):
        emit({"t": ACCOUNTS, "accounts": read_accounts(request["accounts"])})
    end = {"t": SCAN_END, "entries": len(entries) + len(creds), "unreadable": unreadable,
           "digest": manifest_digest(entries + creds)}
    if "ship_in_progress" in state:
        # A drift: a ship (or rollback) may have taken the lock, or switched ``current``,
        # while this scan walked the tree; the client must not call such a scan in sync.
        end["ship_in_progress"] = lock_holder(root).strip(" ()") or None
        end["current_changed"] = _current_target(root) != state.get("_current_target")
    emit(end)
    return entries


def _current_target(root):
    """Where ``<root>/current`` points now (bytes), or ``None`` when it is no symlink."""
    try:
        return os.readlink(os.path.join(root, b"current"))
    except OSError:
        return None


HISTORY_FILE = b"history.jsonl"


def last_shipped(root):
    """The release the last successful ship put in use, from the history (bytes), or None."""
    found = _history_releases(root, "ship")
    return enc(found[-1]) if found else None


def _history_releases(root, kind):
    """The ``release`` of each history line of ``kind``, oldest first (unreadable lines and a
    missing history are skipped)."""
    return [entry["release"] for _line, entry in read_history(root)
            if entry.get("kind") == kind and isinstance(entry.get("release"), str)]


def read_history(root, errors=None):
    """Every usable line of the history, oldest first: ``(line, entry)``, the line as str
    (without its newline) and the JSON object it holds. A line that is no JSON object (one
    cut short included) and a missing history are skipped; a history that is there but
    cannot be read adds ``"PATH: error"`` to ``errors`` (a list) when one is given."""
    found = []
    try:
        with open(history_path(root), "rb") as fh:
            for raw in fh:
                line = raw.rstrip(b"\n").decode("utf-8", "surrogateescape")
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    found.append((line, entry))
    except OSError as exc:
        if errors is not None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            errors.append(f"{dec(history_path(root))}: {os_error_text(exc)}")
    return found


def shipped_releases(root):
    """The ids (str) of every release a ship line of the history says was put in use."""
    return set(_history_releases(root, "ship"))


def history_path(root):
    """``<root>/.fleetctl/history.jsonl`` (bytes)."""
    return os.path.join(root, STATE_DIR_B, HISTORY_FILE)


def append_history(emit, root, entry):
    """Append one line to ``.fleetctl/history.jsonl`` (0644): who shipped or rolled back what.

    Appended with one write of a whole line (O_APPEND), so readers never see half a line from
    a finished write; a failure here is a warning, never undoing what was done. A file that
    ends in half a line (a hand edit, a disk that filled mid-write) gets a newline first, so
    this line is one of its own, not glued onto that one and lost with it.
    """
    line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode(
        "utf-8", "surrogateescape") + b"\n"
    try:
        fd = create_file(history_path(root), os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            write_all(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        emit({"t": WARNING, "message": "could not record the history line in "
              f"{dec(history_path(root))}: {os_error_text(exc)}"})



ATTEMPT_PREFIX = b"attempt-"


def attempt_path(root, release):
    """``.fleetctl/attempt-<id>.json`` (bytes): written when a ship of ``release`` begins on
    the host, removed when it ends either way; one left behind names a ship that was killed."""
    return os.path.join(root, STATE_DIR_B, ATTEMPT_PREFIX + release + b".json")


def host_now():
    """The host's UTC time, ISO 8601 to the second (``2026-12-01T15:36:43Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def failure_entry(release, previous, meta):
    """The history line of a failed ship of ``release`` (bytes) before its step is known:
    ``kind`` ``failed``, the release it would have made, the one in use, and who, when
    (``started``, the client's time) and from which commit, from the command's ``meta``."""
    return {"kind": "failed", "release": dec(release), "previous": previous,
            "by": meta.get("shipped_by"), "started": meta.get("created"),
            "host": meta.get("host"), "source": meta.get("source"),
            "forced": meta.get("forced"), "allow_dirty": meta.get("allow_dirty")}


#: At most this many of an error's paths go into its history line (an error about every file
#: of a large tree must not make one line of megabytes); ``items_total`` says how many there were.
FAILURE_PATHS_MAX = 100


def record_failure(emit, root, entry, step, kind, message, path=None, items=None):
    """Append the history line of a failed ship: ``entry`` (:func:`failure_entry`) with the
    host's ``time``, the ``step`` it stopped at, the error's ``kind``, ``message`` and
    ``path``. An error about several paths (``items``, ``[[path, what], ...]`` as
    :class:`~fleetctl.host.wire.Stop` carries them) records them as ``items`` (at most
    :data:`FAILURE_PATHS_MAX`, and ``items_total``), its first path as ``path``. Best effort:
    nothing is written through a state directory that is not a real directory of the root (a
    symlink), and a failure to write is at most a warning."""
    try:
        if not stat.S_ISDIR(os.lstat(os.path.join(root, STATE_DIR_B)).st_mode):
            return
    except OSError:
        return
    line = dict(entry)
    if items:
        if path is None:
            path = items[0][0]
        line["items"] = [list(item) for item in items[:FAILURE_PATHS_MAX]]
        line["items_total"] = len(items)
    line.update({"time": host_now(), "step": step, "error": kind, "message": message,
                 "path": path})
    append_history(emit, root, line)


def read_attempts(root, current, errors=None):
    """The attempt files under ``.fleetctl/`` (read only), sorted by name: ``{"release"
    (bytes), "path" (bytes), "entry" (the failure line it holds, :func:`failure_entry`),
    "killed"}``. ``killed``: the ship never switched to its release (it is neither
    ``current`` nor named by a ship line of the history), so unless a ship holds the lock now
    it was killed before its switch; otherwise the ship did switch and only the file is left.
    A state directory that cannot be listed has none (and adds ``"PATH: error"`` to
    ``errors``, a list, when one is given and the directory is there)."""
    state_dir = os.path.join(root, STATE_DIR_B)
    try:
        names = sorted(os.listdir(state_dir))
    except OSError as exc:
        if errors is not None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            errors.append(f"{dec(state_dir)}: {os_error_text(exc)}")
        return []
    found, shipped = [], None
    for name in names:
        if not (name.startswith(ATTEMPT_PREFIX) and name.endswith(b".json")):
            continue
        if shipped is None:
            shipped = shipped_releases(root)
        release = name[len(ATTEMPT_PREFIX):-len(b".json")]
        path = os.path.join(state_dir, name)
        try:
            with open(path, "rb") as fh:
                entry = json.loads(fh.read().decode("utf-8", "surrogateescape"))
        except (OSError, ValueError):
            entry = None
        if not isinstance(entry, dict):
            entry = failure_entry(release, None, {})
        found.append({"release": release, "path": path, "entry": entry,
                      "killed": dec(release) != current and dec(release) not in shipped
                      and bool(protocol.RELEASE_ID.match(dec(release)))})
    return found


INTERRUPTED_MESSAGE = ("the ship ended without a word (its process was killed, or the host "
                       "went down); found and cleared by the next ship")


def recover_attempts(emit, root, current, write_history=True):
    """Under the lock, before a ship: close what a killed ship left (its attempt file).

    For each ``.fleetctl/attempt-<id>.json`` (:func:`read_attempts`): when the ship never
    switched to ``<id>``, its release (if it got so far) and records are removed and a
    history line (kind ``failed``, step ``unknown``, error ``interrupted``) says so, with who,
    when and which commit from the attempt file; otherwise the ship did switch and only the
    file goes. Best effort: trouble here is a warning, never a failed ship.
    """
    for attempt in read_attempts(root, current):
        release, path = attempt["release"], attempt["path"]
        try:
            if attempt["killed"]:
                for record in (record_path(root, release), creds_record_path(root, release)):
                    if os.path.lexists(record):
                        os.unlink(record)
                force_rmtree(emit, os.path.join(root, b"releases", release))
                if write_history:
                    record_failure(emit, root, attempt["entry"], "unknown", "interrupted",
                                   INTERRUPTED_MESSAGE)
            os.unlink(path)
        except OSError as exc:
            emit({"t": WARNING, "message": f"could not clear {dec(path)}, left by an "
                  f"interrupted ship: {os_error_text(exc)}"})


def ship_story(root, current):
    """What the host says of its last ships, read only (the lock is read from /proc/locks,
    never tried): ``{"ship_in_progress", "failed", "interrupted", "errors"}``.

    - ``ship_in_progress``: the process holding the ship lock (``"pid N"``), or ``None``.
    - ``failed``: the newest history line (str, :func:`read_history`) when it is a ``failed``
      ship, else ``None``: a later ship or rollback settles it.
    - ``interrupted``: per ship killed before its switch (an attempt file no ship holds the
      lock for, :func:`read_attempts`), the line the next ship will write for it (str; kind
      ``failed``, step ``unknown``, error ``interrupted``, ``time`` when it began), oldest
      first. While a ship holds the lock its attempt file is its own: none is listed.
    - ``errors``: ``"PATH: error"`` for the history or state directory that is there but
      could not be read: then neither "failed" nor "interrupted" can be known.

    ``current``: the release in use (str) or ``None``.
    """
    errors = []  # type: list
    attempts = [a for a in read_attempts(root, current, errors) if a["killed"]]
    holder = lock_holder(root).strip(" ()") or None if os.path.isdir(root) else None
    interrupted = []
    if holder is None:
        for attempt in attempts:
            if not os.path.lexists(attempt["path"]):
                continue  # the ship ended (and removed it) since the directory was listed
            line = dict(attempt["entry"])
            line.update({"kind": "failed", "time": line.get("started"), "step": "unknown",
                         "error": "interrupted", "message": INTERRUPTED_MESSAGE.split(";")[0],
                         "path": None})
            interrupted.append(json.dumps(line, sort_keys=True, separators=(",", ":")))
    history = read_history(root, errors)
    last = history[-1] if history else None
    failed = last[0] if last is not None and last[1].get("kind") == "failed" else None
    return {"ship_in_progress": holder, "failed": failed, "interrupted": interrupted,
            "errors": errors}
