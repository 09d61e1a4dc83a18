"""Reading a tree without following links: the fd walk and the live manifest of a scan.

Every node is described as a manifest entry dict (``path``, ``type``, ``mode``, ``owner``,
``size``, ``digest``, ``target``); ``walk`` never follows a symlink out of the tree and leaves out
what vanishes while it is read.
"""

import errno
import hashlib
import os
import stat

from fleetctl import protocol
from fleetctl.host.wire import (
    CHUNK_BYTES,
    dec,
    group_name,
    os_error_text,
    user_name,
)
from fleetctl.protocol import ENTRY, UNREADABLE

CREDS_DIR = os.fsencode(protocol.CREDENTIALS_TOP)

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
        entry["mode"] = f"{mode:04o}"
    elif stat.S_ISREG(st.st_mode):
        entry["type"] = "file"
        entry["mode"] = f"{mode:04o}"
        entry["size"] = st.st_size
        entry["digest"] = file_digest(name, dir_fd)
    else:
        entry["type"] = "other"
        entry["mode"] = f"{mode:04o}"
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
    # listdir of an fd gives str names decoded in the locale's encoding: os.fsencode gives back
    # their bytes (wire.enc is UTF-8 whatever the locale, right for names from the client only).
    try:
        try:
            stack.append((top_fd, b"", [os.fsencode(n) for n in os.listdir(top_fd)]))
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
                names = [os.fsencode(n) for n in os.listdir(child)]
                stack.append((child, rel, names))
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


def scan_tree(emit, top, event_type=ENTRY, prefix=b"", emit_events=True):
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
            emit({"t": UNREADABLE, "path": dec(prefix + rel).rstrip("/") or ".",
                  "error": os_error_text(exc)})

    walk(top, sink, bad)
    return entries, unreadable[0]


def scan_credentials(emit, root, emit_events):
    """The entries of ``<root>/credentials`` (paths ``credentials/...``), and the unreadable count.

    Beside the releases, never inside one: see ``fleetctl/credentials.py``.
    """
    top = os.path.join(root, CREDS_DIR)
    try:
        first = describe_path(top, CREDS_DIR)
    except OSError as exc:
        if emit_events:
            emit({"t": UNREADABLE, "path": dec(CREDS_DIR), "error": os_error_text(exc)})
        return [], 1
    if first is None:  # none, or it vanished as it was looked at
        return [], 0
    if emit_events:
        event = dict(first)
        event["t"] = ENTRY
        emit(event)
    if first["type"] != "dir":
        return [first], 0
    entries, bad = scan_tree(emit, top + b"/", prefix=CREDS_DIR + b"/", emit_events=emit_events)
    return [first] + entries, bad



def tree_differences(top, recorded, keys, vanished_ok):
    """Walk ``top`` and compare it with the manifest ``recorded`` (entry dicts).

    Returns ``(unreadable, differences)``: ``"REL: unreadable (REASON)"`` strings (a node that
    vanished during the walk is left out when ``vanished_ok``), and ``(path, what, expected,
    found)`` tuples in path order, ``what`` being ``"missing"``, ``"extra"`` or a key of
    ``keys`` whose value differs (a key the record leaves unset is compared too: callers that
    only check what the record sets skip those). Used by the ship's verify step and by a
    rollback's check of the release it switches to.
    """
    found = {}
    unreadable = []

    def sink(entry):
        found[entry["path"]] = entry

    def bad(rel, exc):
        if not (vanished_ok and exc.errno in (errno.ENOENT, errno.ENOTDIR)):
            unreadable.append(f"{dec(rel)}: unreadable ({os_error_text(exc)})")

    walk(top, sink, bad)
    wanted = {e["path"]: e for e in recorded}
    differences = []
    for path in sorted(set(found) | set(wanted)):
        a, b = wanted.get(path), found.get(path)
        if a is None or b is None:
            differences.append((path, "extra" if a is None else "missing", None, None))
            continue
        for key in keys:
            if a.get(key) != b.get(key):
                differences.append((path, key, a.get(key), b.get(key)))
    return unreadable, differences
