"""Writing ``<root>/credentials``: secrets in memory only, each file new, 0600 from its
first byte, renamed into place once all are written (see ``fleetctl/credentials.py``)."""

import os
import stat

from fleetctl import protocol
from fleetctl.host.files import name_max, temp_name, write_all
from fleetctl.host.remove import force_rmtree
from fleetctl.host.walk import CREDS_DIR, scan_credentials
from fleetctl.host.wire import (
    Stop,
    dec,
    enc,
    group_name,
    owners_refused,
    parse_owner,
    user_name,
    with_path,
)
from fleetctl.protocol import manifest_digest

# The prefix of a new file before its rename: a leftover of an interrupted ship starts with it.
CREDS_NEW = os.fsencode(protocol.LEFTOVER_PREFIX)


def apply_credentials(emit, root, wanted, secrets, scanned):
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
        now, problems = scan_credentials(emit, root, emit_events=False)
        for entry in now:  # the owner and mode the scan saw, not the ones taking them set
            if entry["path"] in held:
                _, uid, gid, mode = held[entry["path"]]
                entry["owner"] = user_name(uid) + ":" + group_name(gid)
                entry["mode"] = f"{mode:04o}"
        if problems or manifest_digest(now) != manifest_digest(scanned):
            raise Stop("credentials", "changed", "the credential files were edited during the "
                       "ship; nothing was switched, run again to see the change")
        write_credentials(emit, root, top, wanted, secrets, now, held)
    finally:
        for path, (fd, uid, gid, mode) in held.items():
            if fd is None:  # already given to its agent
                continue
            try:  # give back what this step did not finish; remove what it made
                if uid is None:
                    force_rmtree(emit, os.path.join(root, enc(path)))
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
        raise OSError(exc.errno, exc.strerror, path) from exc
    return fd, st.st_uid, st.st_gid, mode


def owner_ids(entry):
    """(uid, gid) of an entry's owner; this process's own when the entry names none."""
    if not entry.get("owner"):
        return os.geteuid(), os.getegid()
    return parse_owner(entry["owner"], "credentials", entry["path"])


def write_credentials(emit, root, top, wanted, secrets, live_list, held):
    """The writing part of :func:`apply_credentials`, once the agents' directories are
    ``held`` (path -> (fd, uid, gid, mode)): new files first, renamed over the old ones once
    all are written, then what is no longer wanted removed, last each directory given back."""
    live = {e["path"]: e for e in live_list}
    want = {e["path"]: e for e in wanted}

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
            force_rmtree(emit, os.path.join(root, enc(path)))
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
            raise with_path(exc, top) from exc
        finally:
            os.close(fd)
    for entry in (e for e in wanted if e["type"] == "dir" and e["path"].count("/") == 1):
        if entry["path"] not in held:  # a new agent directory: this account's until the end
            full = os.path.join(root, enc(entry["path"]))
            os.mkdir(full, 0o700)
            fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            held[entry["path"]] = (fd, None, None, None)  # made here: removed on failure
    staged = []
    refused = []  # type: list  # (path, owner, OSError): every file whose owner could not be set
    try:
        for entry in (e for e in wanted if e["type"] == "file"):
            full = os.path.join(root, enc(entry["path"]))
            uid, gid = owner_ids(entry)
            mode = int(entry["mode"], 8)
            have = live.get(entry["path"])
            if have is not None and have.get("digest") == entry["digest"]:
                if have.get("mode") != entry["mode"] or have.get("owner") != entry.get("owner"):
                    fix_file(full, uid, gid, mode, entry["path"], refused)
                continue
            head, name = os.path.split(full)
            tmp = os.path.join(head, temp_name(CREDS_NEW, name, limit=name_max(head)))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            staged.append((tmp, full))
            try:
                os.fchmod(fd, 0o600 & mode)
                try:
                    os.fchown(fd, uid, gid)
                except OSError as exc:  # named with the others once all were tried
                    refused.append((entry["path"], entry.get("owner"), exc))
                    continue
                data = secrets.get(entry["digest"])
                if data is None:
                    raise Stop("credentials", "failed", "the content of a credential file was "
                               "not sent", entry["path"])
                write_all(fd, data)
                os.fsync(fd)
                os.fchmod(fd, mode)
            except OSError as exc:
                raise with_path(exc, tmp) from exc
            finally:
                os.close(fd)
        if refused:
            raise owners_refused("credentials", refused, "no credential file was changed")
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
        except OSError as exc:  # every directory is tried; all refused are named below
            refused.append((path, entry.get("owner"), exc))
            continue
        try:
            os.fchmod(fd, int(entry["mode"], 8))
        except OSError as exc:
            raise with_path(exc, os.path.join(root, enc(path))) from exc
        os.close(fd)
        held[path] = (None, 0, 0, 0)
    if refused:
        raise owners_refused("credentials", refused, "the new credential files are in place, "
                             "but these directories could not be given to their agents")


def fix_file(full, uid, gid, mode, path, refused):
    """Owner and mode of a credential file whose content is right, through its own fd; a
    refused chown is added to ``refused`` (path, owner, OSError) and the mode still set."""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise Stop("credentials", "changed", "a credential file is no longer a plain file "
                       "with one link; nothing was switched, run again", path)
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
        try:
            os.fchown(fd, uid, gid)
        except OSError as exc:
            refused.append((path, f"{user_name(uid)}:{group_name(gid)}", exc))
            return
        os.fchmod(fd, mode)
    except OSError as exc:
        raise with_path(exc, full) from exc
    finally:
        os.close(fd)

