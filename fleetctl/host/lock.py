"""The host's ship lock: an flock on the root directory itself, held by the process."""

import errno
import fcntl
import os

from fleetctl.host.files import make_dirs
from fleetctl.host.wire import STATE_DIR_B, Stop, dec, os_error_text


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
            raise Stop("lock", "locked",
                       f"another ship holds the lock on {dec(root)}{lock_holder(root)}") from exc
        raise
    return fd


def lock_holder(root):
    """`` (pid N)`` naming the process that holds the lock on ``root``, or ``""``.

    /proc/locks names the pid holding a flock on the root's inode; best effort only.
    """
    try:
        st = os.stat(root)
        key = f" {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
        with open("/proc/locks") as fh:
            for line in fh:
                if "FLOCK" in line and key in line + " ":
                    return f" (pid {line.split()[4]})"
    except OSError:
        pass
    return ""


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
                make_dirs(root, 0o755)  # the root and its parents 0755 whatever the umask
                created = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise Stop("lock", "permission" if exc.errno in (errno.EACCES, errno.EPERM)
                           else "failed", f"cannot create the root: {os_error_text(exc)}",
                           dec(root)) from exc
        fd = lock_root(root)
        try:
            st, held = os.stat(root), os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if same:
            return fd, created
        os.close(fd)
    raise Stop("lock", "changed", f"the root {dec(root)} kept changing while it was being locked")


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
    return f"{machine}:{st.st_dev}:{st.st_ino}"


def remove_empty_root(root):
    """Undo the creation of a root a ship made and then did not use: the ``releases/`` and
    state directories its prepare step made, then the root (each left alone unless empty; a
    symlink in their place is not followed: rmdir refuses it)."""
    for name in (b"releases", STATE_DIR_B):
        try:
            os.rmdir(os.path.join(root, name))
        except OSError:
            pass
    try:
        os.rmdir(root)
    except OSError:
        pass

