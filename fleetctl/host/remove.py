"""Removing a tree without following a link or leaving its mount (invariant 10).

Every recursive removal goes through remove_tree (docs/invariants.md, invariant 10): nothing
outside the managed root is removed, followed or written. It works on directory fds only
(openat with O_NOFOLLOW, unlinkat, rmdir at an fd), so a symlink swapped in at any moment is
removed as a link, never followed, and it stops at every mount point: a directory on another
file system, or a bind mount of the same one (same st_dev, so the mount id and
/proc/self/mountinfo decide), is neither entered nor removed. shutil.rmtree crossed into a bind
mount inside an old release and deleted its source's files.
"""

import errno
import os
import re
import stat

from fleetctl.host.walk import _DIR_FLAGS
from fleetctl.host.wire import dec, with_path
from fleetctl.protocol import WARNING


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
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
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


class _Removal:
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
                raise with_path(exc, full) from exc
            pin = os.open(name, o_path | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=pfd)
            try:
                magic = b"/proc/self/fd/%d" % pin
                os.chmod(magic, 0o700)
                return os.open(magic, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                raise with_path(exc, full) from exc
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
                    raise with_path(exc, full) from exc
                try:
                    os.fchmod(pfd, stat.S_IMODE(os.fstat(pfd).st_mode) | 0o700)
                except OSError:
                    raise with_path(exc, full) from exc
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
            raise with_path(exc, full) from exc
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
            raise with_path(exc, full) from exc
        try:
            fst = os.fstat(fd)
            here = (fst.st_dev, mount_id(fd))
            if here != pmount:  # a mount point: neither entered nor removed
                self.kept.append(full)
                os.close(fd)
                return False
            # listdir(fd) gives str names in the locale's decoding: back to their bytes
            names = [os.fsencode(n) for n in os.listdir(fd)]
        except OSError as exc:
            os.close(fd)
            raise with_path(exc, full) from exc
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
            raise with_path(exc, head) from exc
        frames = []  # type: list
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


def force_rmtree(emit, path):
    """remove_tree, with a ``warning`` event per mount point kept; returns those paths."""
    kept = remove_tree(path)
    for point in kept:
        emit({"t": WARNING, "message": f"could not remove all of {dec(path)}: {dec(point)} "
              "is a mount point, and "
              "fleetctl removes nothing on another mount; it stays until it is unmounted"})
    return kept

