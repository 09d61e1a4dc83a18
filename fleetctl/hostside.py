"""The program fleetctl runs on a host, one process per operation, over any transport.

This file is sent as source over the transport's stdin and executed by the host's ``python3``
(see :mod:`fleetctl.hostcall`), so it imports only the standard library and runs on Python 3.8+.
Running the same code for the local and the SSH transport is what keeps them equivalent.

Wire format. stdin carries frames ``<length>\\n<bytes>``: first a JSON request, then (for a
ship) a JSON command, then ``blob_count`` content blobs the host does not already have, then
``secret_count`` secret frames (the credential files to write), both framed
``<digest>\\n<size>\\n<bytes>`` and checked against their sha256 on arrival. Blobs go to
``.fleetctl/incoming-<id>/``; secret frames are kept in this process's memory only and written
nowhere but their final file. stdout carries one JSON event per line; paths are
``surrogateescape``-decoded and JSON-escaped, so any byte in a name, newline included,
survives. Events:

- ``{"t": "hello", "user", "group", "uid", "python"}``
- ``{"t": "state", "root_exists", "current", "current_kind", "releases", "shipped"}``
- ``{"t": "entry", ...manifest entry...}`` for ``current``, then for ``<root>/credentials``
  (paths ``credentials/...``); ``{"t": "shipped", ...}``; ``{"t": "unreadable", "path",
  "error"}``; ``{"t": "warning", "message"}``
- ``{"t": "units", "install", "remove", "problem", "kind"}`` before ``scan-end`` when the
  request carries ``unit_dir`` (a dry run's read-only look at the runners' systemd units)
- ``{"t": "accounts", "accounts": {<user>: {"exists", "group_exists", "home", "home_exists",
  "home_mode", "home_owner"}}}`` before ``scan-end`` when the request's ``accounts`` (a list of
  ``{"user", "group", "home"}``) is not empty: the agents' own accounts, read only
- ``{"t": "scan-end", "entries", "unreadable", "digest"}`` then, for a ship, after the
  command: ``{"t": "step", "name"}`` for ``prepare``, ``receive``, ``users`` (when the command
  lists ``users``), ``assemble``, ``verify``, ``record``, ``credentials`` (when the desired or
  the live tree has credential entries), ``switch``, ``services`` (with ``units``), ``prune``;
  then ``{"t": "done", "release", "pruned"}``. The ``users`` step creates each missing user
  (``useradd --system``, a nologin shell, its group too when that is missing; root only) and
  each missing HOME (0700, owned by the user), emitting ``{"t": "account", "user", "created":
  true}`` or ``{"t": "account", "user", "home_created"}`` for each; without root a missing
  user stops it with kind ``permission`` naming ``/etc/passwd`` (a missing HOME: naming the
  HOME, unless this process runs as that user); nothing is retried with sudo. The
  ``credentials`` step, between ``record`` and ``switch``, first checks the credentials tree
  against the scan (kind ``changed`` if it was edited), writes each changed file as a new 0600
  file (``O_EXCL``, given its owner before its first byte), renames them all over the old ones
  once all are written, then removes what is no longer wanted. A command with ``units`` also
  gets ``{"t": "services", "installed", "removed", "restarted", "started"}`` at the end of its
  ``services`` step, also when that step fails
- ``{"t": "error", "step", "kind", "message", "path"}`` (kind: ``locked``, ``changed``,
  ``permission``, ``layout``, ``failed``); the process then exits non-zero.

Op ``ledgers`` (read-only, no lock, no scan; request ``agents``, optional ``since``): after
``hello``, per agent ``{"t": "ledger", "agent", "line"}`` for each non-empty line of
``<root>/state/<agent>/ledger.jsonl`` (only lines whose ``time`` is later than ``since`` when
given), a last line without its newline (being written) as ``{"t": "ledger-partial",
"agent", "bytes"}`` instead of a line, then ``{"t": "ledger-end", "agent", "lines"}``, or
instead ``{"t": "ledger-missing", "agent", "path"}`` / ``{"t": "ledger-unreadable", "agent",
"path", "error"}``; last ``{"t": "ledgers-end"}``.

Layout on the host (DESIGN.md §5)::

    <root>/current -> releases/<id>        the release in use (symlink, switched by rename)
    <root>/releases/<id>/                  complete releases
    <root>/.fleetctl/releases/<id>.json    each release's manifest (digests only, no contents)
    <root>/credentials/<agent>/<file>      granted credentials (0755/0700/0600), in no release

The shipped manifest is the record of the release ``current`` points to, so the switch of one
symlink changes the tree in use and the base of the three-way comparison together.
"""

import errno
import fcntl
import grp
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys

CHUNK_BYTES = 1 << 20
SYSTEMCTL_TIMEOUT_S = 60
UNIT_PREFIX = b"fleet-runner-"
UNIT_SUFFIX = b".service"
RECORD_SCHEMA = 1
STATE_DIR = ".fleetctl"
CREDS_DIR = b"credentials"
CREDS_NEW = b".fleetctl-new-"  # = fleetctl.credentials.LEFTOVER_PREFIX (this file imports no fleetctl)
ACCOUNT_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")

_out = sys.stdout.buffer
_in = sys.stdin.buffer


class Aborted(Exception):
    """The client called a prepared ship off (another host of the fleet could not ship)."""


class Stop(Exception):
    """A step failed; carries the error event to emit."""

    def __init__(self, step, kind, message, path=None):
        Exception.__init__(self, message)
        self.event = {"t": "error", "step": step, "kind": kind, "message": message, "path": path}


def emit(event):
    _out.write(json.dumps(event, ensure_ascii=True, separators=(",", ":")).encode("ascii"))
    _out.write(b"\n")


def flush():
    _out.flush()


def read_frame():
    header = _in.readline()
    if not header:
        raise Stop("receive", "failed", "input ended early (connection lost?)")
    size = int(header)
    data = _in.read(size)
    if len(data) != size:
        raise Stop("receive", "failed", "input ended early (connection lost?)")
    return data


def dec(raw):
    return os.fsdecode(raw)


def enc(text):
    return os.fsencode(text)


# -- names -------------------------------------------------------------------------------------

_users = {}
_groups = {}


def user_name(uid):
    if uid not in _users:
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = str(uid)
    return _users[uid]


def group_name(gid):
    if gid not in _groups:
        try:
            _groups[gid] = grp.getgrgid(gid).gr_name
        except KeyError:
            _groups[gid] = str(gid)
    return _groups[gid]


def parse_owner(owner, step, path):
    user, _, group = owner.partition(":")
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
    except KeyError:
        raise Stop(step, "failed", "no such user on the host: %s" % user, path)
    if not group:
        return uid, -1
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise Stop(step, "failed", "no such group on the host: %s" % group, path)
    return uid, gid


# -- scanning ----------------------------------------------------------------------------------


# A directory opened to be walked or emptied: never through a symlink at its own name.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def file_digest(path, dir_fd=None):
    """sha256 (``"sha256:<hex>"``) of the regular file ``path`` (relative to the directory fd
    ``dir_fd`` when given), opened without following a link. Raises OSError: EAGAIN when it is
    no longer a regular file, ELOOP when it is now a symlink."""
    h = hashlib.sha256()
    # O_NONBLOCK: a FIFO swapped in after the lstat must not hang the scan (and the host lock).
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0),
                 dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EAGAIN, "changed while it was scanned (no longer a file)")
        while True:
            block = os.read(fd, CHUNK_BYTES)
            if not block:
                break
            h.update(block)
    finally:
        os.close(fd)
    return "sha256:" + h.hexdigest()


def describe(name, rel, st, dir_fd=None):
    """Return the manifest entry dict of one lstat'ed node: ``name`` is its path, relative to
    the directory fd ``dir_fd`` when given; ``rel`` its path in the manifest (bytes)."""
    mode = stat.S_IMODE(st.st_mode)
    entry = {"path": dec(rel), "owner": user_name(st.st_uid) + ":" + group_name(st.st_gid)}
    if stat.S_ISLNK(st.st_mode):
        entry["type"] = "symlink"
        entry["target"] = dec(os.readlink(name, dir_fd=dir_fd))
    elif stat.S_ISDIR(st.st_mode):
        entry["type"] = "dir"
        entry["mode"] = "%04o" % mode
    elif stat.S_ISREG(st.st_mode):
        entry["type"] = "file"
        entry["mode"] = "%04o" % mode
        entry["size"] = st.st_size
        entry["digest"] = file_digest(name, dir_fd)
    else:
        entry["type"] = "other"
        entry["mode"] = "%04o" % mode
    return entry


# A path that disappears between the listing of its directory and its reading (a runtime temp
# file) is not an error: it is absent from that scan, as rsync says "vanished" and goes on.
VANISHED = (errno.ENOENT, errno.ENOTDIR)
# Replaced by another type since its lstat (a file by a link: ELOOP from O_NOFOLLOW; a link by
# a file: EINVAL from readlink; a file by a FIFO: file_digest's EAGAIN): looked at again.
REPLACED = (errno.ELOOP, errno.EINVAL, errno.EAGAIN)
DESCRIBE_ATTEMPTS = 3


def describe_path(name, rel, dir_fd=None):
    """lstat and describe the node ``name`` (relative to ``dir_fd`` when given); None when it
    vanished (ENOENT/ENOTDIR) before it could be read. One replaced by another type meanwhile
    is looked at again, up to ``DESCRIBE_ATTEMPTS`` times. Raises OSError when it cannot be
    read (EACCES, EIO, ...)."""
    for attempt in range(1, DESCRIBE_ATTEMPTS + 1):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            return describe(name, rel, st, dir_fd)
        except OSError as exc:
            if exc.errno in VANISHED:
                return None
            if exc.errno not in REPLACED or attempt == DESCRIBE_ATTEMPTS:
                raise
    return None


def walk(top, sink, on_unreadable):
    """Describe every node under ``top`` (bytes path), never following symlinks.

    Calls ``sink(entry)`` per node in no particular order and ``on_unreadable(rel, error)`` for
    a node or directory that cannot be read; the scan goes on past it. A node or directory below
    ``top`` that vanishes while it is scanned is left out, silently (see ``VANISHED``); ``top``
    itself missing, or removed before the walk ends (the whole tree went, not a file in it), is
    unreadable, with ``rel`` ``b""``.

    ``top`` is opened once (following a link there: ``current/``); from it each directory is
    opened relative to its parent's fd without following a link, and each node is read
    relative to its directory's fd. So a directory swapped for a symlink during the walk is
    never followed out of the tree, and the walk stays in the tree ``top`` was when it began.
    Open fds: one per directory level being walked.
    """
    try:
        top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        on_unreadable(b"", exc)
        return
    stack = []  # (directory fd, its rel path, names not yet described), deepest last
    try:
        try:
            stack.append((top_fd, b"", [enc(n) for n in os.listdir(top_fd)]))
        except OSError as exc:
            on_unreadable(b"", exc)
        while stack:
            fd, rel_dir, names = stack[-1]
            if not names:
                stack.pop()
                if fd != top_fd:
                    os.close(fd)
                continue
            name = names.pop()
            rel = rel_dir + b"/" + name if rel_dir else name
            try:
                entry = describe_path(name, rel, fd)
            except OSError as exc:
                on_unreadable(rel, exc)
                continue
            if entry is None:
                continue
            sink(entry)
            if entry["type"] != "dir":
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                # Gone, or swapped for a link since it was described: nothing under it now.
                if exc.errno not in VANISHED + (errno.ELOOP,):
                    on_unreadable(rel, exc)
                continue
            try:
                stack.append((child, rel, [enc(n) for n in os.listdir(child)]))
            except OSError as exc:
                os.close(child)
                on_unreadable(rel, exc)
        # Held open to tell whether the tree itself was removed meanwhile (a pruned release).
        if os.fstat(top_fd).st_nlink == 0:
            on_unreadable(b"", OSError(errno.ENOENT, "removed while it was scanned"))
    finally:
        for fd, _rel, _names in stack:
            if fd != top_fd:
                os.close(fd)
        os.close(top_fd)


def os_error_text(exc):
    return exc.strerror or str(exc)


def scan_tree(top, event_type="entry", prefix=b"", emit_events=True):
    """Describe the entries of ``top`` (streamed as events unless ``emit_events`` is false);
    return (list of entry dicts, unreadable count).

    ``prefix`` is put before every path (the credentials tree is reported as ``credentials/...``).
    """
    entries = []
    unreadable = [0]

    def sink(entry):
        if prefix:
            entry["path"] = dec(prefix) + entry["path"]
        entries.append(entry)
        if emit_events:
            entry_event = dict(entry)
            entry_event["t"] = event_type
            emit(entry_event)

    def bad(rel, exc):
        unreadable[0] += 1
        if emit_events:
            emit({"t": "unreadable", "path": dec(prefix + rel).rstrip("/") or ".",
                  "error": os_error_text(exc)})

    walk(top, sink, bad)
    return entries, unreadable[0]


def manifest_digest(entries):
    ordered = sorted(entries, key=lambda e: enc(e["path"]).replace(b"/", b"\x00"))
    canonical = json.dumps(ordered, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()


def read_state(root):
    """Describe the layout under ``root`` without writing anything."""
    state = {"t": "state", "root_exists": os.path.isdir(root), "current": None,
             "current_kind": None, "releases": [], "shipped": False}
    current = os.path.join(root, b"current")
    try:
        st = os.lstat(current)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            # Not knowing whether a tree exists is not the same as having none.
            state["current_kind"] = "unreadable"
            emit({"t": "unreadable", "path": ".", "error": os_error_text(exc)})
        return state
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(current)
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
    try:
        state["releases"] = sorted(
            dec(n) for n in os.listdir(os.path.join(root, b"releases")) if not n.startswith(b".")
        )
    except OSError:
        pass
    state["identity"] = read_identity(root)
    state["meta"] = None
    if state["current"] and os.path.lexists(record_path(root, enc(state["current"]))):
        try:
            state["_manifest"] = load_record(root, enc(state["current"]))
            state["meta"] = record_meta(root, enc(state["current"]))
            state["shipped"] = True
        except (OSError, ValueError) as exc:
            emit({"t": "warning", "message": "the record %s cannot be used (%s): treated as "
                  "missing, so changes have origin unknown; ship --force writes a new one"
                  % (dec(record_path(root, enc(state["current"]))), exc)})
    return state


def identity_path(root):
    return os.path.join(root, enc(STATE_DIR), b"identity.json")


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
    return {"problem": "%s: %s" % (dec(path), problem)}


def write_identity(root, identity):
    """Record the host's identity (its inventory name and id), replacing any earlier one."""
    state_dir = os.path.join(root, enc(STATE_DIR))
    if not os.path.isdir(state_dir):
        os.mkdir(state_dir, 0o755)
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
    return dict((k, record[k]) for k in RECORD_META_KEYS if k in record)


def record_path(root, release):
    return os.path.join(root, enc(STATE_DIR), b"releases", release + b".json")


def creds_record_path(root, release):
    return os.path.join(root, enc(STATE_DIR), b"releases", release + b".credentials.json")


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
    with open(path, "rb") as fh:
        record = json.loads(fh.read().decode("utf-8", "surrogateescape"))
    manifest = record.get("manifest") if isinstance(record, dict) else None
    if not isinstance(manifest, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and e.get("type") in
            ("file", "dir", "symlink", "other") for e in manifest):
        raise ValueError("not a fleetctl release record")
    return manifest


def emit_shipped(manifest):
    for entry in manifest:
        event = dict(entry)
        event["t"] = "shipped"
        emit(event)


def scan(root, state, request=None):
    """Emit the live manifest of ``<root>/current`` and of ``<root>/credentials``, the shipped
    manifest, and (when the request names them) the agents' accounts.

    Returns the entries of ``current``; the credentials tree's go to ``state["_creds"]``.
    """
    entries = []
    unreadable = 0
    if state["current_kind"] in ("symlink", "foreign-symlink"):
        if state["shipped"]:
            emit_shipped(state["_manifest"])
        entries, unreadable = scan_tree(os.path.join(root, b"current/"))
    elif state["current_kind"] == "dir":
        entries, unreadable = scan_tree(os.path.join(root, b"current"))
    creds, bad = scan_credentials(root, emit_events=True)
    state["_creds"] = creds
    unreadable += bad
    if request and request.get("accounts"):
        emit({"t": "accounts", "accounts": read_accounts(request["accounts"])})
    emit({"t": "scan-end", "entries": len(entries) + len(creds), "unreadable": unreadable,
          "digest": manifest_digest(entries + creds)})
    flush()
    return entries


def scan_credentials(root, emit_events):
    """The entries of ``<root>/credentials`` (paths ``credentials/...``), and the unreadable count.

    Beside the releases, never inside one: see ``fleetctl/credentials.py``.
    """
    top = os.path.join(root, CREDS_DIR)
    try:
        first = describe_path(top, CREDS_DIR)
    except OSError as exc:
        if emit_events:
            emit({"t": "unreadable", "path": dec(CREDS_DIR), "error": os_error_text(exc)})
        return [], 1
    if first is None:  # none, or it vanished as it was looked at
        return [], 0
    if emit_events:
        event = dict(first)
        event["t"] = "entry"
        emit(event)
    if first["type"] != "dir":
        return [first], 0
    entries, bad = scan_tree(top + b"/", prefix=CREDS_DIR + b"/", emit_events=emit_events)
    return [first] + entries, bad


def read_accounts(wanted):
    """Describe each agent's account: ``{user: {exists, group_exists, home, home_exists,
    home_mode, home_owner, passwd_home}}`` (read-only; ``passwd_home`` only for an existing
    user)."""
    out = {}
    for account in wanted:
        user, group, home = account["user"], account["group"], account["home"]
        info = {"exists": True, "group_exists": True, "home": home, "home_exists": False,
                "home_mode": None, "home_owner": None}
        try:
            info["passwd_home"] = pwd.getpwnam(user).pw_dir
        except KeyError:
            info["exists"] = False
        try:
            grp.getgrnam(group)
        except KeyError:
            info["group_exists"] = False
        try:
            st = os.lstat(home)
            info["home_exists"] = stat.S_ISDIR(st.st_mode)
            info["home_mode"] = "%04o" % stat.S_IMODE(st.st_mode)
            info["home_owner"] = user_name(st.st_uid) + ":" + group_name(st.st_gid)
        except OSError:
            pass
        out[user] = info
    return out


# -- locking -----------------------------------------------------------------------------------


def lock_root(root):
    """Take an exclusive, non-blocking flock on the root directory itself.

    Locking the directory rather than a lock file means a refused or dry-run ship writes
    nothing; the kernel drops the lock when this process ends, however it ends.
    """
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise Stop("lock", "locked", "another ship holds the lock on %s%s"
                       % (dec(root), lock_holder(root)))
        raise
    return fd


def lock_holder(root):
    # /proc/locks names the pid holding a flock on the root's inode; best effort only.
    try:
        st = os.stat(root)
        key = " %02x:%02x:%d " % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        with open("/proc/locks") as fh:
            for line in fh:
                if "FLOCK" in line and key in line + " ":
                    return " (pid %s)" % line.split()[4]
    except OSError:
        pass
    return ""


# -- removing ----------------------------------------------------------------------------------
#
# Every recursive removal goes through remove_tree (docs/invariants.md, invariant 10): nothing outside the
# managed root is removed, followed or written. It works on directory fds only (openat with
# O_NOFOLLOW, unlinkat, rmdir at an fd), so a symlink swapped in at any moment is removed as a
# link, never followed, and it stops at every mount point: a directory on another file system,
# or a bind mount of the same one (same st_dev, so the mount id and /proc/self/mountinfo decide),
# is neither entered nor removed. shutil.rmtree crossed into a bind mount inside an old release
# and deleted its source's files.

def with_path(exc, path):
    """Return ``exc`` (an OSError) naming ``path`` (bytes or str): calls on an fd carry no file
    name, and an error without one cannot say what was refused. Keeps the subclass
    (PermissionError for EACCES/EPERM) and an existing file name."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), path)


def mount_points():
    """The mount points of this process's mount namespace, as absolute bytes paths, read from
    ``/proc/self/mountinfo`` (field 5, octal escapes undone); an empty set without /proc."""
    points = set()
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            for line in fh:
                fields = line.split(b" ")
                if len(fields) > 4:
                    points.add(re.sub(br"\\([0-7]{3})",
                                      lambda m: bytes([int(m.group(1), 8)]), fields[4]))
    except OSError:
        pass
    return points


def mounts_under(points, top):
    """The mount points in ``points`` at or below the absolute path ``top`` (bytes), sorted."""
    top = top.rstrip(b"/")
    return sorted(p for p in points if p == top or p.startswith(top + b"/"))


def mount_id(fd):
    """The id of the mount the open file ``fd`` is on (``mnt_id`` in /proc/self/fdinfo, Linux
    3.15+), or None where that cannot be read. Unlike st_dev it tells a bind mount of the same
    file system from its surroundings."""
    try:
        with open("/proc/self/fdinfo/%d" % fd, "rb") as fh:
            for line in fh:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def fd_path(fd, fallback):
    """The absolute path, symlinks resolved, of the directory open as ``fd`` (bytes)."""
    try:
        path = os.readlink(b"/proc/self/fd/%d" % fd)
        if path.startswith(b"/") and not path.endswith(b" (deleted)"):
            return path
    except OSError:
        pass
    return os.path.realpath(fallback)


def real_path(path):
    """The absolute path of ``path`` with its directory's symlinks resolved but not its own last
    component (a release that is a symlink is that link, not its target)."""
    head, name = os.path.split(path.rstrip(b"/"))
    return os.path.join(os.path.realpath(head or b"."), name)


class _Removal(object):
    """The state of one remove_tree call: mount points seen and kept."""

    def __init__(self):
        self.points = mount_points()
        self.kept = []

    def open_dir(self, pfd, name, full):
        """Open the directory ``name`` in ``pfd`` without following a link; one this account
        cannot read (0000, 0300) is opened up to 0700 first, through an O_PATH fd of that very
        inode (never by path, which could be swapped for a link)."""
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=pfd)
        except PermissionError as exc:
            o_path = getattr(os, "O_PATH", None)
            if o_path is None:
                raise with_path(exc, full)
            pin = os.open(name, o_path | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=pfd)
            try:
                magic = b"/proc/self/fd/%d" % pin
                os.chmod(magic, 0o700)
                return os.open(magic, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                raise with_path(exc, full)
            finally:
                os.close(pin)

    def unlink(self, pfd, name, full, is_dir):
        """Remove one file, link or empty directory; True once it is gone, False when it is a
        mount point (EBUSY: kept). A parent this account may not write (a shipped 0555 dir) is
        opened up through its fd, once."""
        for attempt in (1, 2):
            try:
                if is_dir:
                    os.rmdir(name, dir_fd=pfd)
                else:
                    os.unlink(name, dir_fd=pfd)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno == errno.EBUSY:  # a mount point mountinfo did not list (no /proc)
                    self.kept.append(full)
                    return False
                if exc.errno not in (errno.EACCES, errno.EPERM) or attempt == 2:
                    raise with_path(exc, full)
                try:
                    os.fchmod(pfd, stat.S_IMODE(os.fstat(pfd).st_mode) | 0o700)
                except OSError:
                    raise with_path(exc, full)
        return False

    def start(self, pfd, pmount, ppath, name, frames):
        """Remove ``name`` in ``pfd`` if it is not a directory (True: gone, False: kept), or
        push a frame to empty it (None)."""
        full = os.path.join(ppath, name)
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError as exc:
            raise with_path(exc, full)
        if full in self.points:
            self.kept.append(full)
            return False
        if not stat.S_ISDIR(st.st_mode):
            return self.unlink(pfd, name, full, is_dir=False)
        try:
            fd = self.open_dir(pfd, name, full)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or file: unlink
                return self.unlink(pfd, name, full, is_dir=False)
            raise with_path(exc, full)
        try:
            fst = os.fstat(fd)
            here = (fst.st_dev, mount_id(fd))
            if here != pmount:  # a mount point: neither entered nor removed
                self.kept.append(full)
                os.close(fd)
                return False
            names = [enc(n) for n in os.listdir(fd)]  # listdir(fd) gives str names
        except OSError as exc:
            os.close(fd)
            raise with_path(exc, full)
        frames.append([fd, here, full, names, True, pfd, name])
        return None

    def remove(self, path):
        """Remove ``path``; return whether it is gone."""
        head, name = os.path.split(path.rstrip(b"/"))
        head = head or b"."
        try:
            pfd = os.open(head, _DIR_FLAGS)
        except FileNotFoundError:
            return True
        except OSError as exc:
            raise with_path(exc, head)
        frames = []
        try:
            pst = os.fstat(pfd)
            gone = self.start(pfd, (pst.st_dev, mount_id(pfd)), fd_path(pfd, head), name, frames)
            while frames:
                frame = frames[-1]
                fd, here, full, names = frame[:4]
                if names:
                    if self.start(fd, here, full, names.pop(), frames) is False:
                        frame[4] = False
                    continue
                frames.pop()
                os.close(fd)
                gone = frame[4] and self.unlink(frame[5], frame[6], full, is_dir=True)
                if frames and not gone:
                    frames[-1][4] = False
            return gone
        finally:
            for frame in frames:
                os.close(frame[0])
            os.close(pfd)


def remove_tree(path):
    """Remove ``path`` (bytes: a file, a link or a whole directory tree) without following any
    symlink and without leaving the mount it is on.

    The directory holding ``path`` is opened without following a link at its own name; from
    there every step is relative to a directory fd. A directory (or a file) that is a mount
    point, or is on another mount than that holding directory (another file system, or a bind
    mount of the same one), is neither entered nor removed, and so the directories above it
    stay too. A directory whose mode forbids emptying it (a shipped 0555 directory) is opened up
    through its own fd. What is already gone is not an error.

    Returns:
        The absolute paths of the mount points kept (empty when ``path`` is gone).
    Raises:
        OSError naming the path that could not be removed (an immutable file, permission
        denied); what was removed before stays removed.
    """
    removal = _Removal()
    removal.remove(path)
    return removal.kept


def force_rmtree(path):
    """remove_tree, with a ``warning`` event per mount point kept; returns those paths."""
    kept = remove_tree(path)
    for point in kept:
        emit({"t": "warning", "message": "could not remove all of %s: %s is a mount point, and "
              "fleetctl removes nothing on another mount; it stays until it is unmounted"
              % (dec(path), dec(point))})
    return kept


# -- shipping ----------------------------------------------------------------------------------


def write_file(dest, source, owner, mode):
    """Create ``dest`` as a copy of the file ``source`` with explicit owner and mode.

    Created 0600 from the first byte (O_EXCL, no umask involved), so it is never wider than its
    final mode while content is written; chown before chmod, since chown clears setuid bits.
    The copy is made in the kernel (copy_file_range; a reflink where the filesystem can):
    always a new inode, never a hard link.

    Raises:
        OSError naming ``dest`` (or ``source`` when that cannot be opened), also for the calls
        on an fd (copy, fchown, fchmod), which carry no file name of their own.
    """
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            copy_fd(src, fd)
        finally:
            os.close(src)
        uid, gid = owner
        if uid != -1:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    except OSError as exc:
        raise with_path(exc, dest)
    finally:
        os.close(fd)


NAME_MAX = 255  # bytes in one name: the limit of Linux's common file systems (ext4, xfs, tmpfs)
TEMP_HASH_HEX = 32  # hex digits of sha256 standing in for a final name too long to extend


def name_max(directory):
    """The longest name (bytes) the file system of ``directory`` allows; NAME_MAX if unknown."""
    try:
        return min(os.pathconf(directory, "PC_NAME_MAX"), NAME_MAX)
    except (OSError, ValueError):
        return NAME_MAX


def temp_name(prefix, name, suffix=b"", limit=NAME_MAX):
    """The temporary name (bytes) of the final name ``name``: ``prefix + name + suffix``, or,
    when that is longer than ``limit`` bytes, ``prefix`` + the first TEMP_HASH_HEX hex digits
    of sha256(name) + ``suffix``. Any valid final name thus has a temporary name that fits, the
    same one each time, and it always starts with ``prefix``, which is how a leftover of an
    interrupted ship is recognised (``CREDS_NEW``)."""
    full = prefix + name + suffix
    if len(full) <= limit:
        return full
    return prefix + hashlib.sha256(name).hexdigest()[:TEMP_HASH_HEX].encode("ascii") + suffix


def write_all(fd, data):
    """Write all of ``data``: os.write may write less (a nearly full disk), never assume it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_fd(src, dst):
    size = os.fstat(src).st_size
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            left = size
            while left > 0:
                done = copy_range(src, dst, min(left, 1 << 30))
                if done == 0:
                    break
                left -= done
            if left == 0:
                return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        os.lseek(src, 0, os.SEEK_SET)
        os.lseek(dst, 0, os.SEEK_SET)
        os.ftruncate(dst, 0)
    while True:
        block = os.read(src, CHUNK_BYTES)
        if not block:
            return
        write_all(dst, block)


def receive_blobs(blob_dir, count):
    """Read ``count`` blob frames (``<digest>\\n<size>\\n<bytes>``) into ``blob_dir``.

    Raises:
        Stop when the input ends early or a blob's digest does not match; OSError naming the
        blob's file when it cannot be written (a full disk).
    """
    os.mkdir(blob_dir, 0o700)
    for _ in range(count):
        digest = _in.readline().strip().decode("ascii")
        size = int(_in.readline())
        h = hashlib.sha256()
        name = os.path.join(blob_dir, digest.split(":", 1)[1].encode("ascii"))
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = size
            while left:
                block = _in.read(min(left, CHUNK_BYTES))
                if not block:
                    raise Stop("receive", "failed", "input ended early (connection lost?)")
                h.update(block)
                try:
                    write_all(fd, block)
                except OSError as exc:  # a full disk: say where
                    raise with_path(exc, name)
                left -= len(block)
        finally:
            os.close(fd)
        if "sha256:" + h.hexdigest() != digest:
            raise Stop("receive", "failed", "content arrived corrupted (digest mismatch)")


def assemble(stage, desired, sources, blob_dir, current_dir):
    """Build the release in ``stage`` from the desired manifest; modes and owners explicit."""
    os.mkdir(stage, 0o700)
    dirs = []
    for entry in desired:
        rel = enc(entry["path"])
        dest = os.path.join(stage, rel)
        owner = parse_owner(entry["owner"], "assemble", entry["path"]) if entry.get("owner") else (-1, -1)
        kind = entry["type"]
        if kind == "dir":
            os.mkdir(dest, 0o700)
            dirs.append((dest, owner, int(entry["mode"], 8)))
        elif kind == "symlink":
            os.symlink(enc(entry["target"]), dest)
            if owner[0] != -1:
                os.lchown(dest, owner[0], owner[1])
        elif kind == "file":
            source = sources.get(entry["path"])
            if source is None:
                source_path = os.path.join(blob_dir, entry["digest"].split(":", 1)[1].encode("ascii"))
            else:
                # Copied from the current release, never hard-linked: releases must share no
                # inode (docs/invariants.md, invariant 4).
                source_path = os.path.join(current_dir, enc(source))
            write_file(dest, source_path, owner, int(entry["mode"], 8))
        else:
            raise Stop("assemble", "failed", "cannot ship an entry of type %s" % kind, entry["path"])
    # Directory modes last and deepest first, so a 0555 directory is filled before it closes.
    for dest, owner, mode in reversed(dirs):
        if owner[0] != -1:
            os.chown(dest, owner[0], owner[1])
        os.chmod(dest, mode)
    os.chmod(stage, 0o755)


def verify(stage, desired):
    """Compare the staged release with the desired manifest; raise Stop on any difference."""
    found = {}
    problems = []

    def sink(entry):
        found[entry["path"]] = entry

    def bad(rel, exc):
        problems.append("%s: unreadable (%s)" % (dec(rel), os_error_text(exc)))

    walk(stage, sink, bad)
    wanted = dict((e["path"], e) for e in desired)
    for path in sorted(set(found) | set(wanted)):
        a, b = wanted.get(path), found.get(path)
        if a is None or b is None:
            problems.append("%s: %s" % (path, "unexpected" if a is None else "missing"))
            continue
        for key in ("type", "mode", "owner", "size", "digest", "target"):
            if a.get(key) is not None and a.get(key) != b.get(key):
                problems.append("%s: %s is %s, expected %s" % (path, key, b.get(key), a.get(key)))
    if problems:
        raise Stop("verify", "failed", "staged release differs from the plan: " +
                   "; ".join(problems[:5]) + (" (and %d more)" % (len(problems) - 5)
                                              if len(problems) > 5 else ""))


def write_record(root, release, desired, meta):
    """Write the release's record (0644) and, when it has credentials, their part (0600).

    The credential files' digests go to a side file only the shipping account can read: a
    digest of a guessable secret (a short password in a public template) must not be readable by
    every user of the host.
    """
    state_dir = os.path.join(root, enc(STATE_DIR), b"releases")
    os.makedirs(state_dir, 0o755, exist_ok=True)
    tree = [e for e in desired if not is_credential(e["path"])]
    creds = [e for e in desired if is_credential(e["path"])]
    if creds:
        write_json(creds_record_path(root, release), {"schema_version": RECORD_SCHEMA,
                                                      "release": dec(release),
                                                      "manifest": creds}, 0o600)
    body = {"schema_version": RECORD_SCHEMA, "release": dec(release), "manifest": tree}
    body.update(meta)
    write_json(record_path(root, release), body, 0o644)


def write_json(final, body, mode):
    """Write ``body`` as JSON to ``final`` (bytes path) with ``mode``: to json_tmp_path(final),
    fsynced, then renamed over ``final``. OSError names the file that failed."""
    tmp = json_tmp_path(final)
    if os.path.lexists(tmp):
        os.unlink(tmp)
    data = json.dumps(body, sort_keys=True, indent=1).encode("utf-8", "surrogateescape")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        raise with_path(exc, tmp)
    finally:
        os.close(fd)
    os.rename(tmp, final)


def json_tmp_path(final):
    """Where write_json writes ``final`` before renaming it: ``<final>.tmp``, name shortened by
    temp_name when too long."""
    head, name = os.path.split(final)
    return os.path.join(head, temp_name(b"", name, b".tmp"))


def fsync_dir(path):
    """fsync the directory ``path``; OSError names it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        raise with_path(exc, path)
    finally:
        os.close(fd)


def switch(root, release):
    """Point ``current`` at the release with one atomic rename of a fresh symlink."""
    tmp = os.path.join(root, temp_name(b".current.", release))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(b"releases/" + release, tmp)
    os.rename(tmp, os.path.join(root, b"current"))
    try:
        fsync_dir(root)
    except OSError:
        pass  # the switch has happened; durability of the rename is best effort past this


def prune(root, keep, current):
    """Remove all but the newest ``keep`` releases, never ``current``; return removed ids.

    A release with a mount point inside it (a directory someone mounted there) is kept whole,
    record included, and reported in a ``warning`` naming the mount point: it stays a complete
    release, pruned by the first ship after the unmount. Nothing is removed on another mount
    (see remove_tree), and a release that cannot be removed does not stop the others.
    """
    releases_dir = os.path.join(root, b"releases")
    names = sorted(n for n in os.listdir(releases_dir) if not n.startswith(b"."))
    points = mount_points()
    removed = []
    # Never the release in use, nor the last one a ship put in use (after a rollback the
    # newer release is kept: it is the way forward again).
    protected = set([current, last_shipped(root)])
    for name in names[:-keep] if keep > 0 else names:
        if name in protected:
            continue
        top = os.path.join(releases_dir, name)
        inside = mounts_under(points, real_path(top))
        if inside:
            emit({"t": "warning", "message": "kept release %s: %s is a mount point inside it "
                  "(fleetctl removes nothing on another mount); unmount it and the next ship "
                  "prunes the release" % (dec(name), ", ".join(dec(p) for p in inside))})
            continue
        # The record goes first: a half-removed release must never look like a rollback target.
        try:
            for record in (record_path(root, name), creds_record_path(root, name)):
                if os.path.lexists(record):
                    os.unlink(record)
            if not force_rmtree(top):  # a mount that appeared since the check: reported there
                removed.append(dec(name))
        except OSError as exc:  # one stuck release must not stop the others being pruned
            path = exc.filename.decode("utf-8", "surrogateescape") if isinstance(
                exc.filename, bytes) else exc.filename
            emit({"t": "warning", "message": "could not prune release %s: %s (%s)"
                  % (dec(name), os_error_text(exc), path)})
    return removed


def unchanged_since_scan(root, scanned, ignore):
    """Re-hash ``current`` under the lock: a hand-patch made during the ship is never lost.

    Paths ``.fleetignore`` hides (runtime files such as ``__pycache__/``) may come and go.
    """
    again = []
    problems = []
    walk(os.path.join(root, b"current/"), again.append, lambda rel, exc: problems.append(rel))
    kept = lambda entries: [e for e in entries if not is_ignored(ignore, e)]  # noqa: E731
    return not problems and manifest_digest(kept(again)) == manifest_digest(kept(scanned))


def layout_problem(root, state):
    what = "directory" if state["current_kind"] == "dir" else "file or special file"
    return ("%s/current is a %s, not a release symlink; move it aside to adopt this host"
            % (dec(root), what))


def compile_ignore(patterns):
    return [(re.compile(rx), include) for rx, include in patterns]


def is_ignored(ignore, entry):
    # gitignore semantics as pathspec compiles them: the last matching pattern decides.
    path = entry["path"] + ("/" if entry["type"] == "dir" else "")
    verdict = False
    for rx, include in ignore:
        if rx.match(path):
            verdict = include
    return verdict


def do_ship(root, request, state, scanned, lock_fd, created_root):
    """Read the client's command and carry it out under the lock taken before the scan."""
    try:
        command = json.loads(read_frame().decode("utf-8", "surrogateescape"))
        if command.get("cmd") == "services":
            # Nothing to ship, but the runners' units are brought in line (under the lock).
            emit({"t": "step", "name": "services"})
            flush()
            services_step(command, restart_all=False)
            emit({"t": "done", "release": None, "pruned": []})
            return 0
        if command.get("cmd") != "ship":
            emit({"t": "done", "release": None, "pruned": []})
            return 0
        return ship_locked(root, command, state, scanned)
    finally:
        os.close(lock_fd)


def take_ship_lock(root):
    """Lock the root for a ship, creating it (0755) when it does not exist yet.

    Returns ``(fd, created)``. The lock is checked to be on the directory the path names now:
    a ship that created a root and gave up removes it again, and a lock on a removed directory
    would protect nothing.

    Raises:
        Stop: ``locked`` when another ship holds the lock; ``permission``/``failed`` when the
            root cannot be created.
    """
    created = False
    for _ in range(3):
        if not os.path.lexists(root):
            try:
                os.makedirs(root, 0o755)
                created = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise Stop("lock", "permission" if exc.errno in (errno.EACCES, errno.EPERM)
                           else "failed", "cannot create the root: %s" % os_error_text(exc),
                           dec(root))
        fd = lock_root(root)
        try:
            st, held = os.stat(root), os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if same:
            return fd, created
        os.close(fd)
    raise Stop("lock", "changed", "the root %s kept changing while it was being locked" % dec(root))


def root_key(root):
    """What tells this root apart from every other on any host: the machine and the inode.

    Two inventory entries whose keys are equal reach the same directory, however their
    addresses, ports or paths are spelled.
    """
    machine = ""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as fh:
                machine = fh.read().strip()
            if machine:
                break
        except OSError:
            pass
    st = os.stat(root)
    return "%s:%d:%d" % (machine, st.st_dev, st.st_ino)


def remove_empty_root(root):
    """Undo the creation of a root a ship made and then did not use (left alone unless empty)."""
    try:
        os.rmdir(root)
    except OSError:
        pass


def ship_locked(root, command, state, scanned):
    ignore = compile_ignore(command.get("ignore", []))
    release = enc(command["release"])
    releases_dir = os.path.join(root, b"releases")
    stage = os.path.join(releases_dir, temp_name(b".staging-", release))
    blob_dir = os.path.join(root, enc(STATE_DIR), temp_name(b"incoming-", release))
    current_dir = os.path.join(root, b"current")
    step = "prepare"
    try:
        emit({"t": "step", "name": step})
        flush()
        if command.get("units") is not None:
            # A unit directory or systemctl that cannot work fails here, before anything is
            # written, rather than in the services step after the switch.
            problem = services_problem(command)
            if problem:
                raise Stop(step, problem[0], problem[1])
        for path in (os.path.join(root, enc(STATE_DIR)), releases_dir):
            if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
                # Assembling and recording would write through it, outside the root.
                raise Stop(step, "layout", "%s is not a directory of the root (a symlink or a "
                           "file): fleetctl writes nothing through it; move it aside"
                           % dec(path), dec(path))
            if not os.path.isdir(path):
                os.mkdir(path, 0o755)
                os.chmod(path, 0o755)
        # Left by an interrupted ship; we hold the lock, so nothing else is using them.
        for name in os.listdir(releases_dir):
            if name.startswith(b".staging-"):
                force_rmtree(os.path.join(releases_dir, name))
        state_dir = os.path.join(root, enc(STATE_DIR))
        for name in os.listdir(state_dir):
            if name.startswith(b"incoming-"):
                force_rmtree(os.path.join(state_dir, name))
        if os.path.lexists(os.path.join(releases_dir, release)):
            raise Stop(step, "failed", "release %s already exists" % dec(release))
        tree = [e for e in command["desired"] if not is_credential(e["path"])]
        creds = [e for e in command["desired"] if is_credential(e["path"])]
        step = "receive"
        emit({"t": "step", "name": step})
        flush()
        receive_blobs(blob_dir, command["blob_count"])
        # Secrets stay in this process's memory: never in the blob directory, never on disk
        # anywhere but their final file.
        secrets = receive_secrets(command.get("secret_count", 0))
        if command.get("users"):
            step = "users"
            emit({"t": "step", "name": step})
            flush()
            missing = [a for a in command["users"] if account_missing(a)]
            if missing and edited_during_ship(root, state, scanned, ignore):
                # A refusal (exit 3) writes nothing: checked before accounts are created.
                raise Stop(step, "changed", "the current release was edited during the ship; "
                           "nothing was switched, run again to see the hand-patch")
            for account in command["users"]:
                ensure_account(account)
        step = "assemble"
        emit({"t": "step", "name": step})
        flush()
        assemble(stage, tree, command["sources"], blob_dir, current_dir)
        step = "verify"
        emit({"t": "step", "name": step})
        flush()
        try:
            verify(stage, tree)
        except Stop:
            # A file copied from the release in use after a person edited it differs from
            # the plan: that is a hand-patch made during the ship, refused like one.
            if edited_during_ship(root, state, scanned, ignore):
                raise Stop(step, "changed", "the current release was edited during the ship; "
                           "nothing was switched, run again to see the hand-patch")
            raise
        # One flush of every filesystem instead of an fsync per file (2,000 fsyncs took most
        # of a ship's time): the release must be on disk before it can become current.
        os.sync()
        if edited_during_ship(root, state, scanned, ignore):
            raise Stop(step, "changed", "the current release was edited during the ship; "
                       "nothing was switched, run again to see the hand-patch")
        # Two-phase across the fleet: this host is ready to switch; the client says commit
        # only once every host it ships is ready, so no host switches while another failed.
        # Until then the release stays a staging directory: a ship killed here leaves only a
        # leftover the next ship removes, never a release that looks shipped.
        emit({"t": "prepared", "release": dec(release)})
        flush()
        step = "commit"
        go = json.loads(read_frame().decode("utf-8", "surrogateescape"))
        if go.get("cmd") != "commit":
            raise Aborted()
        step = "record"
        emit({"t": "step", "name": step})
        flush()
        os.rename(stage, os.path.join(releases_dir, release))
        write_record(root, release, command["desired"], command.get("meta", {}))
        fsync_dir(releases_dir)
        if edited_during_ship(root, state, scanned, ignore):
            step = "switch"
            raise Stop(step, "changed", "the current release was edited during the ship; "
                       "nothing was switched, run again to see the hand-patch")
        if creds or state.get("_creds"):
            step = "credentials"
            emit({"t": "step", "name": step})
            flush()
            apply_credentials(root, creds, secrets, state.get("_creds") or [])
        step = "switch"
        emit({"t": "step", "name": step})
        flush()
        if command.get("identity") and command["identity"] != state.get("identity"):
            write_identity(root, command["identity"])
        switch(root, release)
        meta = command.get("meta", {})
        append_history(root, {"kind": "ship", "time": meta.get("created"),
                              "by": meta.get("shipped_by"), "release": dec(release),
                              "previous": state["current"], "host": meta.get("host"),
                              "forced": meta.get("forced"), "source": meta.get("source"),
                              "allow_dirty": meta.get("allow_dirty"),
                              "renamed_from": meta.get("renamed_from")})
    except Aborted:
        cleanup(stage, blob_dir, root, release)
        emit({"t": "done", "release": None, "pruned": [], "aborted": True})
        return 0
    except Stop:
        cleanup(stage, blob_dir, root, release)
        raise
    except OSError as exc:
        cleanup(stage, blob_dir, root, release)
        kind = "permission" if exc.errno in (errno.EACCES, errno.EPERM) else "failed"
        path = exc.filename
        if isinstance(path, bytes):
            path = dec(path)
        raise Stop(step, kind, "%s: %s" % (exc.__class__.__name__, os_error_text(exc)), path)
    # The new release is in use from here on: later trouble is a warning, never a rollback.
    try:
        force_rmtree(blob_dir)
    except OSError as exc:
        emit({"t": "warning", "message": "could not remove %s: %s" % (dec(blob_dir),
                                                                        os_error_text(exc))})
    if command.get("units") is not None:
        # Before the prune: the runners move to the new release before older releases go, and
        # a failure here stops the ship with every release still on disk.
        emit({"t": "step", "name": "services"})
        flush()
        services_step(command, restart_all=True)
    emit({"t": "step", "name": "prune"})
    try:
        pruned = prune(root, int(command.get("keep", 5)), release)
    except OSError as exc:  # the new release is in use; a failed prune is only reported
        pruned = []
        emit({"t": "warning", "message": "prune failed: %s" % os_error_text(exc)})
    emit({"t": "done", "release": dec(release), "pruned": pruned})
    return 0


def edited_during_ship(root, state, scanned, ignore):
    """Whether the release in use changed since the scan (a hand-patch made during the ship)."""
    return state["current_kind"] in ("symlink", "foreign-symlink") and \
        not unchanged_since_scan(root, scanned, ignore)


def is_credential(path):
    return path == dec(CREDS_DIR) or path.startswith(dec(CREDS_DIR) + "/")


def receive_secrets(count):
    """Read ``count`` secret frames (``<digest>\\n<size>\\n<bytes>``) into memory only."""
    secrets = {}
    for _ in range(count):
        digest = _in.readline().strip().decode("ascii")
        size = int(_in.readline())
        data = _in.read(size)
        if len(data) != size:
            raise Stop("receive", "failed", "input ended early (connection lost?)")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise Stop("receive", "failed", "a credential arrived corrupted (digest mismatch)")
        secrets[digest] = data
    return secrets


def nologin_shell():
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        if os.path.exists(shell):
            return shell
    return "/bin/false"


def run_admin(argv, what, path):
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
    except OSError as exc:
        raise Stop("users", "failed", "%s: cannot run %s: %s" % (what, argv[0],
                                                                os_error_text(exc)), path)
    except subprocess.TimeoutExpired:
        raise Stop("users", "failed", "%s: %s did not finish in 60 s" % (what, argv[0]), path)
    if done.returncode:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise Stop("users", "permission" if done.returncode == 1 and "ermission" in tail[0]
                   else "failed", "%s: %s exited with status %d: %s"
                   % (what, argv[0], done.returncode, tail[0][:300]), path)


def account_missing(account):
    """Whether ensure_account would create anything for this account."""
    try:
        pwd.getpwnam(account["user"])
        grp.getgrnam(account["group"])
    except KeyError:
        return True
    return not os.path.lexists(account["home"])


def ensure_account(account):
    """Create the agent's user, group and HOME (0700) when missing; leave existing ones alone.

    Never escalates: without root, a missing account stops the ship naming what was refused.
    """
    user, group, home = account["user"], account["group"], account["home"]
    if not (ACCOUNT_NAME.match(user) and ACCOUNT_NAME.match(group)) or not home.startswith("/"):
        raise Stop("users", "failed", "refusing a bad account name or home: %r" % (account,))
    root_needed = "creating %%s needs root; this connection runs as %s (fleetctl does not " \
        "use sudo or any other account on its own)" % user_name(os.geteuid())
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        pw = None
    if pw is not None and pw.pw_dir.rstrip("/") != home.rstrip("/"):
        raise Stop("users", "failed", "user %s exists with HOME %s in /etc/passwd, not %s as the "
                   "inventory says; fleetctl does not change an existing user: fix home: in the "
                   "inventory (or the account)" % (user, pw.pw_dir, home), "/etc/passwd")
    if pw is None:
        if os.geteuid() != 0:
            raise Stop("users", "permission", root_needed % ("user " + user), "/etc/passwd")
        try:
            grp.getgrnam(group)
            group_args = ["--gid", group]
        except KeyError:
            if group == user:
                group_args = ["--user-group"]
            else:
                run_admin(["groupadd", "--system", group], "creating group " + group,
                          "/etc/group")
                group_args = ["--gid", group]
        run_admin(["useradd", "--system", "--no-create-home", "--home-dir", home, "--shell",
                   nologin_shell()] + group_args + [user], "creating user " + user, "/etc/passwd")
        pw = pwd.getpwnam(user)
        emit({"t": "account", "user": user, "created": True})
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:  # the user exists, its named group does not: create the group only
        if os.geteuid() != 0:
            raise Stop("users", "permission", root_needed % ("group " + group), "/etc/group")
        run_admin(["groupadd", "--system", group], "creating group " + group, "/etc/group")
        gid = grp.getgrnam(group).gr_gid
        emit({"t": "account", "user": user, "group_created": group})
    try:
        st = os.lstat(home)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        # A symlink too: its target would be chowned to the agent (here, and by the unit's
        # install -d), and drift could never call the HOME a directory.
        raise Stop("users", "failed", "the HOME of %s exists and is not a directory (a "
                   "symlink or a file): move it aside" % user, home)
    if st is None:
        if os.geteuid() != 0 and os.geteuid() != pw.pw_uid:
            raise Stop("users", "permission", root_needed % ("the HOME of " + user), home)
        parent = os.path.dirname(home.rstrip("/"))
        if parent and not os.path.isdir(parent):
            os.makedirs(parent, 0o755)
        os.mkdir(home, 0o700)
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, pw.pw_uid, gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        emit({"t": "account", "user": user, "home_created": home})


def apply_credentials(root, wanted, secrets, scanned):
    """Make ``<root>/credentials`` equal the wanted entries, never wider than 0600/0700.

    Each agent owns its directory, so first every existing agent directory is taken from it
    (opened without following links, narrowed to 0700 and given to this account): from then on
    nothing in it can change or be swapped under this program, and the re-check against the
    scan is of a tree that stays put. Each changed file is then written to a new file created
    0600 (``O_EXCL``, owned by the agent before the first byte) and renamed over the old one, so
    the old secret's file is gone the moment the new one is in place; files no longer wanted are
    removed; last, each directory is given (back) to its agent. All new files are written before
    any is renamed: a refusal while writing leaves every credential as it was.
    """
    top = os.path.join(root, CREDS_DIR)
    held = {}  # path -> (fd, uid, gid, mode) as found, to give back whatever happens
    try:
        for entry in scanned:
            if entry["type"] == "dir" and entry["path"].count("/") == 1:
                held[entry["path"]] = take_dir(os.path.join(root, enc(entry["path"])))
        now, problems = scan_credentials(root, emit_events=False)
        for entry in now:  # the owner and mode the scan saw, not the ones taking them set
            if entry["path"] in held:
                _, uid, gid, mode = held[entry["path"]]
                entry["owner"] = user_name(uid) + ":" + group_name(gid)
                entry["mode"] = "%04o" % mode
        if problems or manifest_digest(now) != manifest_digest(scanned):
            raise Stop("credentials", "changed", "the credential files were edited during the "
                       "ship; nothing was switched, run again to see the change")
        write_credentials(root, top, wanted, secrets, now, held)
    finally:
        for path, (fd, uid, gid, mode) in held.items():
            if fd is None:  # already given to its agent
                continue
            try:  # give back what this step did not finish; remove what it made
                if uid is None:
                    force_rmtree(os.path.join(root, enc(path)))
                else:
                    os.fchown(fd, uid, gid)
                    os.fchmod(fd, mode)
            except OSError:
                pass
            finally:
                os.close(fd)


def take_dir(path):
    """Open an agent's credentials directory (never through a link) and hold it: 0700, owned
    by this account. Returns ``(fd, uid, gid, mode)`` as found."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        os.fchmod(fd, mode & 0o700)
        if st.st_uid != os.geteuid() or st.st_gid != os.getegid():
            os.fchown(fd, os.geteuid(), os.getegid())
    except OSError as exc:  # name the directory: an fd call's error has no file name
        os.close(fd)
        raise OSError(exc.errno, exc.strerror, path)
    return fd, st.st_uid, st.st_gid, mode


def owner_ids(entry):
    if not entry.get("owner"):
        return os.geteuid(), os.getegid()
    return parse_owner(entry["owner"], "credentials", entry["path"])


def write_credentials(root, top, wanted, secrets, live_list, held):
    live = dict((e["path"], e) for e in live_list)
    want = dict((e["path"], e) for e in wanted)

    def remove(paths):
        """Remove the manifest ``paths`` (of ``live``), each topmost one as one tree."""
        going = set(paths)
        for path in sorted(going):
            if any(path.startswith(p + "/") for p in going):
                continue  # goes with the tree above it
            for inside in [p for p in held if p == path or p.startswith(path + "/")]:
                fd = held.pop(inside)[0]
                if fd is not None:
                    os.close(fd)
            # One fd-based removal per topmost path, never file by file by path: no link
            # followed, nothing chmodded or retried by a path the agent could swap, and a mount
            # point inside (whose files the scan listed too) is kept and reported, not emptied.
            force_rmtree(os.path.join(root, enc(path)))
        for path in list(live):
            if any(path == p or path.startswith(p + "/") for p in paths):
                live.pop(path)

    # In the way of what is wanted: a path of another type, a leftover of an interrupted ship.
    remove([p for p, e in live.items() if (p in want and want[p]["type"] != e["type"]) or
            os.path.basename(enc(p)).startswith(CREDS_NEW)])
    top_entry = want.get(dec(CREDS_DIR))
    if top_entry is not None:
        if dec(CREDS_DIR) not in live:
            os.mkdir(top, 0o700)
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & int(top_entry["mode"], 8))
            os.fchown(fd, *owner_ids(top_entry))
            os.fchmod(fd, int(top_entry["mode"], 8))
        except OSError as exc:
            raise with_path(exc, top)
        finally:
            os.close(fd)
    for entry in (e for e in wanted if e["type"] == "dir" and e["path"].count("/") == 1):
        if entry["path"] not in held:  # a new agent directory: this account's until the end
            full = os.path.join(root, enc(entry["path"]))
            os.mkdir(full, 0o700)
            fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            held[entry["path"]] = (fd, None, None, None)  # made here: removed on failure
    staged = []
    try:
        for entry in (e for e in wanted if e["type"] == "file"):
            full = os.path.join(root, enc(entry["path"]))
            uid, gid = owner_ids(entry)
            mode = int(entry["mode"], 8)
            have = live.get(entry["path"])
            if have is not None and have.get("digest") == entry["digest"]:
                if have.get("mode") != entry["mode"] or have.get("owner") != entry.get("owner"):
                    fix_file(full, uid, gid, mode, entry["path"])
                continue
            head, name = os.path.split(full)
            tmp = os.path.join(head, temp_name(CREDS_NEW, name, limit=name_max(head)))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            staged.append((tmp, full))
            try:
                os.fchmod(fd, 0o600 & mode)
                os.fchown(fd, uid, gid)
                data = secrets.get(entry["digest"])
                if data is None:
                    raise Stop("credentials", "failed", "the content of a credential file was "
                               "not sent", entry["path"])
                write_all(fd, data)
                os.fsync(fd)
                os.fchmod(fd, mode)
            except OSError as exc:
                raise with_path(exc, tmp)
            finally:
                os.close(fd)
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    for tmp, full in staged:
        os.rename(tmp, full)
    # What is no longer wanted goes now: a revoked secret does not outlive the ship revoking it.
    remove([p for p in live if p not in want])
    for path, (fd, _uid, _gid, _mode) in list(held.items()):
        entry = want.get(path)
        if entry is None:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        # Given to its agent last: its contents are complete and checked by now.
        try:
            os.fchown(fd, *owner_ids(entry))
            os.fchmod(fd, int(entry["mode"], 8))
        except OSError as exc:
            raise with_path(exc, os.path.join(root, enc(path)))
        os.close(fd)
        held[path] = (None, 0, 0, 0)


def fix_file(full, uid, gid, mode, path):
    """Owner and mode of a credential file whose content is right, through its own fd."""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise Stop("credentials", "changed", "a credential file is no longer a plain file "
                       "with one link; nothing was switched, run again", path)
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    except OSError as exc:
        raise with_path(exc, full)
    finally:
        os.close(fd)


def cleanup(stage, blob_dir, root, release):
    """Remove what a failed ship made: the staging release, the received content, the new
    release and its records (temporary ones too). Best effort: an error here must not hide the
    one that stopped the ship; a mount point met is kept and reported (force_rmtree)."""
    for path in (stage, blob_dir, os.path.join(root, b"releases", release)):
        try:
            force_rmtree(path)
        except OSError:
            pass
    for record in (record_path(root, release), json_tmp_path(record_path(root, release)),
                   creds_record_path(root, release),
                   json_tmp_path(creds_record_path(root, release))):
        try:
            os.unlink(record)
        except OSError:
            pass


# -- services ----------------------------------------------------------------------------------


def is_runner_unit(name):
    """Whether a file name in the unit directory is one of fleetctl's runner units."""
    return name.startswith(UNIT_PREFIX) and name.endswith(UNIT_SUFFIX) and \
        len(name) > len(UNIT_PREFIX) + len(UNIT_SUFFIX)


def services_problem(command):
    """Why the services step cannot work on this host: (kind, message), or None."""
    unit_dir = enc(command["unit_dir"])
    if not os.path.isdir(unit_dir):
        return ("failed", "the unit directory %s does not exist (systemd_unit_dir in the "
                "inventory)" % dec(unit_dir))
    if not os.access(unit_dir, os.W_OK):
        return ("permission", "cannot write the unit directory %s as %s"
                % (dec(unit_dir), user_name(os.geteuid())))
    if shutil.which(command["systemctl"]) is None:
        return ("failed", "%s: command not found on the host (is this a systemd host? see "
                "service: in the inventory)" % command["systemctl"])
    return None


def unit_digest(path):
    """sha256 of a unit file if it is a regular file of mode 0644, else None (rewrite it)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o644:
        return None
    return file_digest(path)


def unit_changes(unit_dir, wanted):
    """Return (names to write, names to remove) for ``wanted`` (unit name -> sha256 digest)."""
    install = [name for name in wanted
               if unit_digest(os.path.join(unit_dir, enc(name))) != wanted[name]]
    remove = sorted(dec(n) for n in os.listdir(unit_dir)
                    if is_runner_unit(n) and dec(n) not in wanted)
    return install, remove


def probe_units(request):
    """The read-only look a dry run takes: which units a ship would write and remove."""
    event = {"t": "units", "install": [], "remove": [], "problem": None, "kind": None}
    problem = services_problem(request)
    if problem:
        event["kind"], event["problem"] = problem
        return event
    try:
        event["install"], event["remove"] = unit_changes(enc(request["unit_dir"]),
                                                         request["units"])
    except OSError as exc:
        event["kind"] = "failed"
        event["problem"] = "cannot read the unit directory %s: %s" % (
            request["unit_dir"], os_error_text(exc))
    return event


def write_unit(unit_dir, name, data):
    """Replace one unit file atomically: a temporary file in the same directory, renamed."""
    final = os.path.join(unit_dir, enc(name))
    tmp = os.path.join(unit_dir, b"." + enc(name) + b".tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        write_all(fd, data)
        os.fchmod(fd, 0o644)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)


def systemctl(command, *args):
    """Run ``systemctl ARGS`` (an argv list, no shell); return None or what went wrong."""
    argv = [command["systemctl"]] + list(args)
    shown = " ".join(["systemctl"] + list(args))
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=SYSTEMCTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "%s: no answer after %d s (ended)" % (shown, SYSTEMCTL_TIMEOUT_S)
    except OSError as exc:
        return "%s: cannot run %s: %s" % (shown, command["systemctl"], os_error_text(exc))
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in done.stderr.decode("utf-8", "replace").splitlines()
             if ln.strip()]
    tail = " / ".join(lines[-3:])
    if len(tail) > 600:
        tail = "..." + tail[-600:]
    return "%s exited with status %d%s" % (shown, done.returncode, ": " + tail if tail else "")


def services_step(command, restart_all):
    """Bring the runners' units in line with ``command["units"]`` (unit name -> text).

    Writes the units that differ (content, mode 0644, or not a regular file), disables, stops
    and removes ``fleet-runner-*.service`` files no agent wants, reloads systemd if a file
    changed, then enables every wanted unit and restarts it (``restart_all``: a new release is
    in use; otherwise only units whose file was written) or starts it (a running unit is left
    alone). One failing systemctl command does not keep the other units from being handled;
    all failures are reported together. The ``services`` event says what was done.
    """
    unit_dir = enc(command["unit_dir"])
    units = command["units"]
    wanted = dict((name, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest())
                  for name, text in units.items())
    done = {"t": "services", "installed": [], "removed": [], "restarted": [], "started": []}
    failures = []
    try:
        problem = services_problem(command)
        if problem:
            raise Stop("services", problem[0], problem[1])
        for name in os.listdir(unit_dir):  # left by an interrupted ship; we hold the lock
            if name.startswith(b"." + UNIT_PREFIX) and name.endswith(UNIT_SUFFIX + b".tmp"):
                os.unlink(os.path.join(unit_dir, name))
        install, remove = unit_changes(unit_dir, wanted)
        for name in install:
            write_unit(unit_dir, name, units[name].encode("utf-8"))
            done["installed"].append(name)
        for name in remove:
            # Disabled and stopped while its file still exists, then removed.
            failure = systemctl(command, "disable", "--now", name)
            if failure:
                failures.append(failure)
                continue
            os.unlink(os.path.join(unit_dir, enc(name)))
            done["removed"].append(name)
        if done["installed"] or done["removed"]:
            try:
                fsync_dir(unit_dir)
            except OSError:
                pass
            failure = systemctl(command, "daemon-reload")
            if failure:  # systemd would act on stale unit definitions: go no further
                raise Stop("services", "failed", "; ".join(failures + [failure]))
        for name in units:
            failure = systemctl(command, "enable", name)
            if failure is None:
                restart = restart_all or name in done["installed"]
                failure = systemctl(command, "restart" if restart else "start", name)
                if failure is None:
                    done["restarted" if restart else "started"].append(name)
            if failure:
                failures.append(failure)
        if failures:
            raise Stop("services", "failed", "; ".join(failures))
    except OSError as exc:
        kind = "permission" if exc.errno in (errno.EACCES, errno.EPERM) else "failed"
        path = exc.filename
        if isinstance(path, bytes):
            path = dec(path)
        raise Stop("services", kind, "%s: %s" % (exc.__class__.__name__, os_error_text(exc)),
                   path)
    finally:
        emit(done)
        flush()


def line_time(line):
    try:
        record = json.loads(line)
    except ValueError:
        return None
    stamp = record.get("time") if isinstance(record, dict) else None
    return stamp if isinstance(stamp, str) else None


def read_ledgers(root, request):
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
            emit({"t": "ledger-unreadable", "agent": agent, "path": dec(path),
                  "error": "not an agent name"})
            continue
        lines = 0
        try:
            with open(path, "rb") as fh:
                for raw in fh:
                    if not raw.endswith(b"\n"):  # only the last line can lack it: in progress
                        if raw.strip():
                            emit({"t": "ledger-partial", "agent": agent, "bytes": len(raw)})
                        break
                    line = dec(raw.rstrip(b"\n"))
                    if not line.strip():
                        continue
                    if since is not None:
                        stamp = line_time(line)
                        if stamp is not None and stamp <= since:
                            continue
                    emit({"t": "ledger", "agent": agent, "line": line})
                    lines += 1
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR) and lines == 0:
                emit({"t": "ledger-missing", "agent": agent, "path": dec(path)})
            else:
                emit({"t": "ledger-unreadable", "agent": agent, "path": dec(path),
                      "error": os_error_text(exc)})
            continue
        emit({"t": "ledger-end", "agent": agent, "lines": lines})
    emit({"t": "ledgers-end"})
    return 0


STATUS_TURNS = 200  # the last turns of a ledger whose prefix totals ``status`` sends
STATUS_ESCALATIONS = 20  # escalations described per agent (all are counted)


def _read_json_file(path):
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _agent_status(root, agent):
    """One agent's runner records, read only: its last task, escalations waiting, ledger,
    standing denials."""
    state = os.path.join(root, b"state", enc(agent))
    out = {"t": "agent-status", "agent": agent, "state_exists": os.path.isdir(state),
           "last_task": None, "escalations": 0, "escalation_list": [], "turns": 0,
           "prefix_totals": [], "errors": []}
    if not out["state_exists"]:
        return out
    runs = os.path.join(state, b"runs")
    try:
        tasks = []
        for name in os.listdir(runs):
            full = os.path.join(runs, name)
            if name.startswith(b".") or not os.path.isdir(full):
                continue
            stamps = [os.lstat(full).st_mtime]
            for leaf in (b"result.json", b"progress.json"):
                try:
                    stamps.append(os.lstat(os.path.join(full, leaf)).st_mtime)
                except OSError:
                    pass
            tasks.append((max(stamps), name))
        if tasks:
            _, name = max(tasks)
            task_dir = os.path.join(runs, name)
            attempts = []
            for leaf in os.listdir(task_dir):
                m = re.match(rb"^attempt-(\d+)\.json$", leaf)
                if m:
                    attempts.append(int(m.group(1)))
            last = _read_json_file(os.path.join(task_dir, b"attempt-%d.json" % max(attempts))) \
                if attempts else None
            out["last_task"] = {
                "task": dec(name), "result": _read_json_file(os.path.join(task_dir,
                                                                          b"result.json")),
                "attempts_recorded": len(attempts),
                "last_verdict": (last or {}).get("verdict"),
                "last_started": (last or {}).get("started"),
                "last_finished": (last or {}).get("finished")}
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append("%s: %s" % (dec(runs), os_error_text(exc)))
    spool = os.path.join(state, b"notify")
    try:
        names = sorted(n for n in os.listdir(spool)
                       if n.endswith(b".json") and not n.startswith(b"."))
        out["escalations"] = len(names)
        for n in names[:STATUS_ESCALATIONS]:
            e = _read_json_file(os.path.join(spool, n)) or {}
            out["escalation_list"].append(dict(
                (k, e.get(k)) for k in ("task", "kind", "time", "reason", "via")))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append("%s: %s" % (dec(spool), os_error_text(exc)))
    ledger = os.path.join(state, b"ledger.jsonl")
    totals = []
    try:
        with open(ledger, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break
                try:
                    record = json.loads(raw.decode("utf-8", "replace"))
                    total = sum(record["prefix_tokens"].values())
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                totals.append(total)
                if len(totals) > STATUS_TURNS * 4:
                    out["turns"] += len(totals) - STATUS_TURNS
                    totals = totals[-STATUS_TURNS:]
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            out["errors"].append("%s: %s" % (dec(ledger), os_error_text(exc)))
    out["turns"] += len(totals)
    out["prefix_totals"] = totals[-STATUS_TURNS:]
    out["standing_denials"] = _standing_denials(root, state, agent, out["errors"])
    return out


def _standing_denials(root, state, agent, errors):
    """The runner's standing denials (``STATE/standing-denials/*.json``, written by
    blueprint/runner/fleet_runner/standing.py), oldest first, each with the command that
    clears it on this host; a directory that cannot be read is added to ``errors``."""
    folder = os.path.join(state, b"standing-denials")
    try:
        names = sorted(n for n in os.listdir(folder)
                       if n.endswith(b".json") and not n.startswith(b"."))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            errors.append("%s: %s" % (dec(folder), os_error_text(exc)))
        return []
    runner = os.path.join(root, b"current", b"runner", b"bin", b"fleet-runner")
    found = []
    for name in names:
        d = _read_json_file(os.path.join(folder, name)) or {"what": "(unreadable file)"}
        permission = d.get("permission")
        if not isinstance(permission, str) or not permission:
            permission = dec(name[:-5])
        found.append({"permission": permission, "since": d.get("time"), "task": d.get("task"),
                      "run": d.get("run"), "what": d.get("what"),
                      "clear": " ".join(shlex.quote(a) for a in (
                          dec(runner), "--agent", agent, "--root", dec(root),
                          "--clear-denial", permission))})
    return sorted(found, key=lambda d: str(d["since"] or ""))


def read_status(root, request):
    """Op ``status``: the release in use and its provenance, and for each named agent its
    runner's records (last task, escalations in the notify spool, the ledger's last prefix
    totals, standing denials); read only."""
    current = None
    try:
        target = os.readlink(os.path.join(root, b"current"))
        head, name = os.path.split(target.rstrip(b"/"))
        if head == b"releases":
            current = name
    except OSError:
        pass
    emit({"t": "release", "root_exists": os.path.isdir(root),
          "current": dec(current) if current else None,
          "meta": record_meta(root, current) if current else {},
          "identity": read_identity(root)})
    for agent in request.get("agents", []):
        if not agent or "/" in agent or agent in (".", ".."):
            continue
        emit(_agent_status(root, agent))
    emit({"t": "status-end"})
    return 0


# -- day two: reading files, releases, history, rollback -------------------------------------

READ_LIMIT_BYTES = 1 << 20
HISTORY_FILE = b"history.jsonl"
RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def open_beneath(top_fd, rel):
    """Open ``rel`` (bytes, ``/``-separated) below the directory ``top_fd`` without following
    any symlink on the way or at the end; return the fd.

    Raises:
        OSError: a component is missing, a symlink (ELOOP), not a directory, or not a plain name.
    """
    parts = rel.split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        raise OSError(errno.EINVAL, "not a plain relative path")
    fd = os.dup(top_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def current_release_dir(root, state):
    """The directory of the release in use, only when ``current`` is fleetctl's own symlink
    into ``releases/`` (never a symlink that leads out of the root)."""
    if state["current_kind"] != "symlink" or not state["current"]:
        raise Stop("read", "layout", "the host has no release in use (%s)"
                   % (state["current_kind"] or "no current"))
    return os.path.join(root, b"releases", enc(state["current"]))


def read_files(root, request):
    """Op ``read``: the content of regular files of the release in use, by path; read only.

    Emits ``{"t": "content", "path", "size", "data"}`` (``data`` base64) per path, or
    ``{"t": "content", "path", "error"}``, or ``{"t": "content", "path", "size", "too_large":
    true}`` past ``max_bytes`` (default 1 MiB); then ``{"t": "read-end"}``. Credential files
    are never read: their content is only ever compared by digest.
    """
    import base64

    limit = int(request.get("max_bytes", READ_LIMIT_BYTES))
    state = read_state(root)
    top = os.open(current_release_dir(root, state), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for path in request.get("paths", []):
            event = {"t": "content", "path": path}
            if is_credential(path):
                event["error"] = "a credential file is never read"
                emit(event)
                continue
            try:
                fd = open_beneath(top, enc(path))
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        event["error"] = "not a regular file"
                    elif st.st_size > limit:
                        event["size"], event["too_large"] = st.st_size, True
                    else:
                        blocks, got = [], 0
                        while got <= limit:
                            block = os.read(fd, CHUNK_BYTES)
                            if not block:
                                break
                            blocks.append(block)
                            got += len(block)
                        data = b"".join(blocks)
                        if len(data) > limit:
                            event["size"], event["too_large"] = len(data), True
                        else:
                            event["size"] = len(data)
                            event["data"] = base64.b64encode(data).decode("ascii")
                finally:
                    os.close(fd)
            except OSError as exc:
                event["error"] = os_error_text(exc)
            emit(event)
    finally:
        os.close(top)
    emit({"t": "read-end"})
    return 0


def last_shipped(root):
    """The release the last successful ship put in use, from the history (bytes), or None."""
    found = None
    try:
        with open(history_path(root), "rb") as fh:
            for raw in fh:
                try:
                    entry = json.loads(raw.decode("utf-8", "surrogateescape"))
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("kind") == "ship" and \
                        isinstance(entry.get("release"), str):
                    found = enc(entry["release"])
    except OSError:
        pass
    return found


def history_path(root):
    return os.path.join(root, enc(STATE_DIR), HISTORY_FILE)


def append_history(root, entry):
    """Append one line to ``.fleetctl/history.jsonl`` (0644): who shipped or rolled back what.

    Appended with one write of a whole line (O_APPEND), so readers never see half a line from
    a finished write; a failure here is a warning, never undoing what was done.
    """
    line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode(
        "utf-8", "surrogateescape") + b"\n"
    try:
        fd = os.open(history_path(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                     0o644)
        try:
            write_all(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        emit({"t": "warning", "message": "could not record the history line in %s: %s"
              % (dec(history_path(root)), os_error_text(exc))})


def list_releases(root, request):
    """Op ``releases``: every release with its record's provenance, which is current, and the
    host's history lines; read only.

    Emits ``{"t": "releases", "current", "identity"}``, per release ``{"t": "release", "id",
    "recorded", "meta"}``, per history line ``{"t": "history", "line"}``, then
    ``{"t": "releases-end"}``.
    """
    state = read_state(root)
    emit({"t": "releases", "current": state["current"], "identity": state.get("identity")})
    for name in state["releases"]:
        recorded = os.path.lexists(record_path(root, enc(name)))
        event = {"t": "release", "id": name, "recorded": recorded,
                 "meta": record_meta(root, enc(name)) if recorded else {}}
        if recorded:
            try:
                read_manifest(record_path(root, enc(name)))
            except (OSError, ValueError) as exc:
                event["problem"] = "its record cannot be used: %s" % exc
        emit(event)
    try:
        with open(history_path(root), "rb") as fh:
            for raw in fh:
                if raw.endswith(b"\n") and raw.strip():
                    emit({"t": "history", "line": dec(raw.rstrip(b"\n"))})
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            emit({"t": "warning", "message": "cannot read %s: %s"
                  % (dec(history_path(root)), os_error_text(exc))})
    emit({"t": "releases-end"})
    return 0


def release_differences(root, release):
    """How a release on disk differs from its record (paths, kinds); [] when it matches."""
    recorded = [e for e in read_manifest(record_path(root, release))
                if not is_credential(e["path"])]
    found = {}
    problems = []

    def sink(entry):
        found[entry["path"]] = entry

    def bad(rel, exc):
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            problems.append("%s: unreadable (%s)" % (dec(rel), os_error_text(exc)))

    walk(os.path.join(root, b"releases", release), sink, bad)
    wanted = dict((e["path"], e) for e in recorded)
    for path in sorted(set(found) | set(wanted)):
        a, b = wanted.get(path), found.get(path)
        if a is None or b is None:
            problems.append("%s: %s" % (path, "extra" if a is None else "missing"))
            continue
        for key in ("type", "mode", "owner", "digest", "target"):
            if a.get(key) != b.get(key):
                problems.append("%s: %s" % (path, "content" if key == "digest" else key))
    return problems


def rollback(root, request):
    """Op ``rollback``: switch ``current`` to an earlier release under the host's lock.

    The target (``to``, or else the release the current one's record names as ``previous``,
    or else the newest older release with a record) is first compared with its record; a
    release edited in place is refused (kind ``changed``, naming what differs) unless
    ``force``. The switch is one rename; a history line records it.
    """
    if not os.path.isdir(root):
        raise Stop("lock", "failed", "the root %s does not exist" % dec(root))
    lock_fd = lock_root(root)
    try:
        state = read_state(root)
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
        if not RELEASE_NAME.match(target) or target not in state["releases"]:
            raise Stop("rollback", "failed", "no release %s on the host (releases: %s)"
                       % (target, ", ".join(state["releases"]) or "none"))
        if target == current:
            emit({"t": "done", "release": target, "previous": current, "differences": [],
                  "unchanged": True})
            return 0
        if not os.path.lexists(record_path(root, enc(target))):
            raise Stop("verify", "failed", "release %s has no record to verify it against"
                       % target)
        emit({"t": "step", "name": "verify"})
        flush()
        try:
            problems = release_differences(root, enc(target))
        except (OSError, ValueError) as exc:
            raise Stop("verify", "failed", "the record of release %s cannot be used (%s): the "
                       "release cannot be verified, so it is not rolled back to"
                       % (target, exc), dec(record_path(root, enc(target))))
        if problems and not request.get("force"):
            raise Stop("verify", "changed", "release %s was changed since it was shipped: %s%s"
                       % (target, "; ".join(problems[:8]),
                          " (and %d more)" % (len(problems) - 8) if len(problems) > 8 else ""))
        emit({"t": "step", "name": "switch"})
        flush()
        switch(root, enc(target))
        meta = record_meta(root, enc(target))
        append_history(root, {"kind": "rollback", "time": request.get("time"),
                              "by": request.get("by"), "release": target, "previous": current,
                              "host": request.get("host"), "forced": bool(problems),
                              "differences": problems[:20], "source": meta.get("source")})
        emit({"t": "done", "release": target, "previous": current, "differences": problems})
        return 0
    finally:
        os.close(lock_fd)


def main():
    request = json.loads(read_frame().decode("utf-8", "surrogateescape"))
    root = enc(request["root"])
    uid, gid = os.geteuid(), os.getegid()
    emit({"t": "hello", "user": user_name(uid), "group": group_name(gid), "uid": uid,
          "python": "%d.%d.%d" % sys.version_info[:3]})
    lock_fd = None
    created_root = False
    try:
        if request["op"] == "ledgers":
            return read_ledgers(root, request)
        if request["op"] == "status":
            return read_status(root, request)
        if request["op"] == "read":
            return read_files(root, request)
        if request["op"] == "releases":
            return list_releases(root, request)
        if request["op"] == "rollback":
            return rollback(root, request)
        if os.path.lexists(root) and not os.path.isdir(root):
            raise Stop("scan", "layout", "the root %s exists and is not a directory" % dec(root))
        if request["op"] == "ship":
            # The client takes the locks of a fleet one host at a time, in a fixed order: this
            # host waits for its turn, then answers whether it got the lock.
            go = json.loads(read_frame().decode("utf-8", "surrogateescape"))
            if go.get("cmd") != "lock":
                emit({"t": "done", "release": None, "pruned": []})
                return 0
            if os.path.isdir(root):
                emit({"t": "root", "key": root_key(root)})
                flush()
            lock_fd, created_root = take_ship_lock(root)
            emit({"t": "locked", "created_root": created_root})
            flush()
        state = read_state(root)
        if request["op"] == "scan" and os.path.isdir(root):
            # Read from /proc/locks, never by trying the lock: a drift must not make a ship
            # starting at the same moment find its host locked.
            state["ship_in_progress"] = lock_holder(root).strip(" ()") or None
        emit(dict((k, v) for k, v in state.items() if not k.startswith("_")))
        if request.get("unit_dir") is not None:
            emit(probe_units(request))
        if request["op"] == "ship" and state["current_kind"] in ("dir", "other"):
            raise Stop("scan", "layout", layout_problem(root, state))
        scanned = scan(root, state, request)
        if request["op"] == "ship":
            fd, lock_fd = lock_fd, None  # do_ship closes it
            return do_ship(root, request, state, scanned, fd, created_root)
        return 0
    except Stop as stop:
        emit(stop.event)
        return 3 if stop.event["kind"] in ("locked", "changed") else 1
    except OSError as exc:  # anything the steps did not name: still one clear event
        path = exc.filename.decode("utf-8", "surrogateescape") if isinstance(
            exc.filename, bytes) else exc.filename
        emit({"t": "error", "step": request["op"], "message": "%s: %s" % (
            exc.__class__.__name__, os_error_text(exc)), "path": path,
            "kind": "permission" if exc.errno in (errno.EACCES, errno.EPERM) else "failed"})
        return 1
    finally:
        if created_root:
            remove_empty_root(root)
        if lock_fd is not None:
            os.close(lock_fd)
        flush()


if __name__ == "__main__":  # run by hostcall's bootstrap; importable for tests
    sys.exit(main())
