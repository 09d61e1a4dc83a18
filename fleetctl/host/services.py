"""The runners' systemd units: a dry run's read-only look, and the ship's ``services``
step that writes, removes, enables and (re)starts them."""

import errno
import hashlib
import os
import shutil
import stat
import subprocess

from fleetctl import protocol
from fleetctl.host.files import fsync_dir, write_all
from fleetctl.host.walk import file_digest
from fleetctl.host.wire import Stop, dec, enc, os_error_text, user_name
from fleetctl.protocol import SERVICES, UNITS

UNIT_PREFIX = os.fsencode(protocol.UNIT_PREFIX)
UNIT_SUFFIX = os.fsencode(protocol.UNIT_SUFFIX)

SYSTEMCTL_TIMEOUT_S = 60


def is_runner_unit(name):
    """Whether a file name in the unit directory is one of fleetctl's runner units."""
    return name.startswith(UNIT_PREFIX) and name.endswith(UNIT_SUFFIX) and \
        len(name) > len(UNIT_PREFIX) + len(UNIT_SUFFIX)


def services_problem(command):
    """Why the services step cannot work on this host: (kind, message), or None."""
    unit_dir = enc(command["unit_dir"])
    if not os.path.isdir(unit_dir):
        return ("failed", (f"the unit directory {dec(unit_dir)} does not exist "
                          "(systemd_unit_dir in the inventory)"))
    if not os.access(unit_dir, os.W_OK):
        return ("permission", (f"cannot write the unit directory {dec(unit_dir)} as "
                f"{user_name(os.geteuid())}"))
    if shutil.which(command["systemctl"]) is None:
        return ("failed", "{}: command not found on the host (is this a systemd host? see "
                "service: in the inventory)".format(command["systemctl"]))
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
    event = {"t": UNITS, "install": [], "remove": [], "problem": None,
             "kind": None}  # type: dict
    problem = services_problem(request)
    if problem:
        event["kind"], event["problem"] = problem
        return event
    try:
        event["install"], event["remove"] = unit_changes(enc(request["unit_dir"]),
                                                         request["units"])
    except OSError as exc:
        event["kind"] = "failed"
        event["problem"] = "cannot read the unit directory {}: {}".format(
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
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"{shown}: no answer after {SYSTEMCTL_TIMEOUT_S} s (ended)"
    except OSError as exc:
        return "{}: cannot run {}: {}".format(shown, command["systemctl"], os_error_text(exc))
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in done.stderr.decode("utf-8", "replace").splitlines()
             if ln.strip()]
    tail = " / ".join(lines[-3:])
    if len(tail) > 600:
        tail = "..." + tail[-600:]
    return f"{shown} exited with status {done.returncode}" + (": " + tail if tail else "")


def services_step(emit, command, restart_all):
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
    wanted = {name: "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
                  for name, text in units.items()}
    done = {"t": SERVICES, "installed": [], "removed": [], "restarted": [],
            "started": []}  # type: dict
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
        raise Stop("services", kind, f"{exc.__class__.__name__}: {os_error_text(exc)}",
                   path) from exc
    finally:
        emit(done)

