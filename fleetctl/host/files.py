"""Writing files: copies with explicit owner and mode, JSON records, temporary names."""

import errno
import hashlib
import json
import os

from fleetctl.host.wire import CHUNK_BYTES, with_path


def write_file(dest, source, owner, mode, owner_refused=None):
    """Create ``dest`` as a copy of the file ``source`` with explicit owner and mode.

    Created 0600 from the first byte (O_EXCL, no umask involved), so it is never wider than its
    final mode while content is written; chown before chmod, since chown clears setuid bits.
    The copy is made in the kernel (copy_file_range; a reflink where the filesystem can):
    always a new inode, never a hard link. With ``owner_refused`` (a callable taking the
    OSError), a refused chown is passed to it and the file is still completed (its mode set),
    so a caller can name every file whose owner could not be set, not only the first.

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
        _own(fd, owner, mode, owner_refused)
    except OSError as exc:
        raise with_path(exc, dest) from exc
    finally:
        os.close(fd)


def _own(fd, owner, mode, owner_refused):
    """Give the open file ``fd`` its owner (``(-1, -1)``: leave it), then its mode (chown
    clears setuid bits); a refused chown goes to ``owner_refused`` when given."""
    uid, gid = owner
    if uid != -1:
        try:
            os.fchown(fd, uid, gid)
        except OSError as exc:
            if owner_refused is None:
                raise
            owner_refused(exc)
    os.fchmod(fd, mode)


def move_file(dest, source, owner, mode, owner_refused=None):
    """Make the file ``source`` (received content, the shipping account's, not in any
    release) ``dest``, with explicit owner and mode, as :func:`write_file` does, but without a
    copy: a ship then needs the room of what it sent once, not twice. Linked to ``dest`` (which
    must not exist, as with O_EXCL) and unlinked, so ``dest`` is its only name; where the two
    are on different file systems, or hard links are refused, it is copied instead.

    Raises:
        OSError naming ``dest`` (or ``source``).
    """
    try:
        os.link(source, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise with_path(exc, dest) from exc
        write_file(dest, source, owner, mode, owner_refused)
        return
    os.unlink(source)
    fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        _own(fd, owner, mode, owner_refused)
    except OSError as exc:
        raise with_path(exc, dest) from exc
    finally:
        os.close(fd)


def make_dir(path, mode):
    """``mkdir path`` with exactly ``mode`` (the login's umask narrows what mkdir sets: 077
    would leave a 0755 directory 0700, unreadable to the agents' users).

    Created 0700, then set to ``mode`` through an fd opened without following links, so it is
    never wider than asked on the way.

    Raises:
        OSError naming ``path`` (FileExistsError when it exists).
    """
    os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        raise with_path(exc, path) from exc
    finally:
        os.close(fd)


def make_dirs(path, mode):
    """Create ``path`` (bytes or str) and each of its missing parents, every one with exactly
    ``mode`` whatever the umask (``os.makedirs`` leaves them to it); directories that were
    already there, or that another process makes meanwhile, are left as they are.

    Raises:
        FileExistsError: ``path`` exists (as with ``os.makedirs``); OSError naming the
            directory that could not be made.
    """
    sep = b"/" if isinstance(path, bytes) else "/"
    here = path.rstrip(sep) or sep
    missing = []
    while not os.path.lexists(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent in (here, b"", ""):
            break
        here = parent
    if not missing:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
    for directory in reversed(missing):
        try:
            make_dir(directory, mode)
        except FileExistsError:
            if directory is missing[0]:
                raise
            # made by another process since: its mode is not ours to set


def create_file(path, flags, mode):
    """Open ``path`` with ``flags`` (``O_CREAT`` implied, never ``O_EXCL``), giving it exactly
    ``mode`` when this call creates it (whatever the umask); an existing file keeps its mode.
    Returns the fd.

    Raises:
        OSError naming ``path``.
    """
    flags &= ~(os.O_CREAT | os.O_EXCL)
    while True:
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode & 0o700)
        except FileExistsError:
            continue  # made between the two opens: open it as it is
        try:
            os.fchmod(fd, mode)
        except OSError as exc:
            os.close(fd)
            raise with_path(exc, path) from exc
        return fd


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
    """Copy the whole file ``src`` (fd) to ``dst`` (fd): in the kernel where it can, else in
    blocks."""
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


def write_json(final, body, mode):
    """Write ``body`` as JSON to ``final`` (bytes path) with ``mode``: to json_tmp_path(final),
    fsynced, then renamed over ``final``. OSError names ``final`` (the file a person knows),
    never the temporary name."""
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
        raise OSError(exc.errno, exc.strerror, final) from exc
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
        raise with_path(exc, path) from exc
    finally:
        os.close(fd)

