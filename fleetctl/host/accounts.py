"""The agents' own accounts: reading them for a scan, creating missing ones in a ship
(``useradd --system``, root only; never escalating)."""

import grp
import os
import pwd
import stat
import subprocess

from fleetctl.host.files import make_dirs
from fleetctl.host.wire import Stop, group_name, os_error_text, user_name
from fleetctl.protocol import ACCOUNT, ACCOUNT_NAME


def read_accounts(wanted):
    """Describe each agent's account: ``{user: {exists, group_exists, home, home_exists,
    home_mode, home_owner, passwd_home, uid}}`` (read-only; ``passwd_home`` and ``uid`` only
    for an existing user)."""
    out = {}
    for account in wanted:
        user, group, home = account["user"], account["group"], account["home"]
        info = {"exists": True, "group_exists": True, "home": home, "home_exists": False,
                "home_mode": None, "home_owner": None}
        try:
            pw = pwd.getpwnam(user)
            info["passwd_home"], info["uid"] = pw.pw_dir, pw.pw_uid
        except KeyError:
            info["exists"] = False
        try:
            grp.getgrnam(group)
        except KeyError:
            info["group_exists"] = False
        try:
            st = os.lstat(home)
            info["home_exists"] = stat.S_ISDIR(st.st_mode)
            info["home_mode"] = f"{stat.S_IMODE(st.st_mode):04o}"
            info["home_owner"] = user_name(st.st_uid) + ":" + group_name(st.st_gid)
        except OSError:
            pass
        out[user] = info
    return out


def nologin_shell():
    """The shell of a created user: the host's nologin, else /bin/false."""
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        if os.path.exists(shell):
            return shell
    return "/bin/false"


def run_admin(argv, what, path):
    """Run useradd/groupadd (argv, no shell); Stop (step ``users``) naming ``path`` if it fails."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=60, check=False)
    except OSError as exc:
        raise Stop("users", "failed", f"{what}: cannot run {argv[0]}: {os_error_text(exc)}",
                   path) from exc
    except subprocess.TimeoutExpired:
        raise Stop("users", "failed", f"{what}: {argv[0]} did not finish in 60 s", path) from None
    if done.returncode:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise Stop("users", admin_failure_kind(done.returncode, os.access(path, os.W_OK)),
                   f"{what}: {argv[0]} exited with status {done.returncode}: {tail[0][:300]}",
                   path)


def admin_failure_kind(returncode, writable):
    """``permission`` or ``failed`` for useradd/groupadd ending with ``returncode``.

    Decided from the exit status (shadow-utils: 1 "can't update password file", 10 "can't
    update group file") and a probe of the account file (``writable``: ``os.access(path,
    W_OK)``, false for a non-root login, a read-only or immutable file), never from the
    program's message, which is in the host's language ("Permission denied" is "Keine
    Berechtigung" under a German locale).
    """
    return "permission" if returncode in (1, 10) and not writable else "failed"


def account_missing(account):
    """Whether ensure_account would create anything for this account."""
    try:
        pwd.getpwnam(account["user"])
        grp.getgrnam(account["group"])
    except KeyError:
        return True
    return not os.path.lexists(account["home"])


def refuse_superuser(account):
    """Stop when the agent's user exists with uid 0: root under another name.

    The runner runs as root and the agent as its own user so that the agent cannot write the
    runner's state, records or evidence (docs/runner.md, *The two users*); an agent user with
    uid 0 would undo that. Checked for every account before any is created, so nothing is
    written.
    """
    try:
        pw = pwd.getpwnam(account["user"])
    except KeyError:
        return
    if pw.pw_uid == 0:
        raise Stop("users", "failed", f"user {account['user']} has uid 0 in /etc/passwd (root "
                   "in all but name): an agent runs as an unprivileged user of its own, so that "
                   "it cannot write the runner's records; give this agent another user",
                   "/etc/passwd")


def ensure_account(emit, account, refused=None):
    """Create the agent's user, group and HOME (0700) when missing; leave existing ones alone.

    Never escalates: without root, a missing account stops the ship naming what was refused.
    A new HOME that cannot be given to its user is added to ``refused`` (``(home, owner,
    OSError)``), so the caller can name every one after trying all accounts; without
    ``refused`` the OSError is raised, naming the HOME.
    """
    user, group, home = account["user"], account["group"], account["home"]
    if not (ACCOUNT_NAME.fullmatch(user) and ACCOUNT_NAME.fullmatch(group)) \
            or not home.startswith("/"):
        raise Stop("users", "failed", f"refusing a bad account name or home: {account!r}")
    root_needed = (f"creating %s needs root; this connection runs as {user_name(os.geteuid())} "
                   "(fleetctl does not use sudo or any other account on its own)")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        pw = None
    if pw is not None and pw.pw_dir.rstrip("/") != home.rstrip("/"):
        raise Stop("users", "failed", f"user {user} exists with HOME {pw.pw_dir} in /etc/passwd, "
                   f"not {home} as the inventory says; fleetctl does not change an existing "
                   "user: fix home: in the inventory (or the account)", "/etc/passwd")
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
        emit({"t": ACCOUNT, "user": user, "created": True})
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:  # the user exists, its named group does not: create the group only
        if os.geteuid() != 0:
            raise Stop("users", "permission", root_needed % ("group " + group),
                       "/etc/group") from None
        run_admin(["groupadd", "--system", group], "creating group " + group, "/etc/group")
        gid = grp.getgrnam(group).gr_gid
        emit({"t": ACCOUNT, "user": user, "group_created": group})
    try:
        st = os.lstat(home)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        # A symlink too: its target would be chowned to the agent (here, and by the unit's
        # install -d), and drift could never call the HOME a directory.
        raise Stop("users", "failed", f"the HOME of {user} exists and is not a directory (a "
                   "symlink or a file): move it aside", home)
    if st is None:
        if os.geteuid() != 0 and os.geteuid() != pw.pw_uid:
            raise Stop("users", "permission", root_needed % ("the HOME of " + user), home)
        parent = os.path.dirname(home.rstrip("/"))
        if parent and not os.path.isdir(parent):
            make_dirs(parent, 0o755)
        os.mkdir(home, 0o700)
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            try:
                os.fchown(fd, pw.pw_uid, gid)
            except OSError as exc:
                if refused is None:
                    raise OSError(exc.errno, exc.strerror, home) from exc
                refused.append((home, user + ":" + group, exc))
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        emit({"t": ACCOUNT, "user": user, "home_created": home})

