"""The host program's input, output and the small helpers every other module uses.

Output goes to an *event sink*: a callable taking one event (a JSON-ready dict). On the host it
is a :class:`StdoutSink` writing JSON lines; in a test it can be ``list.append``. Input (the
request, a ship's commands and content) is read from a binary stream with :func:`read_frame`.
Host functions take both as arguments and never touch ``sys.stdin`` or ``sys.stdout``.
"""


import errno
import grp
import os
import pwd

from fleetctl import protocol
from fleetctl.protocol import ERROR

STATE_DIR_B = os.fsencode(protocol.STATE_DIR)  # the state directory's name, as bytes

CHUNK_BYTES = 1 << 20  # bytes read or copied at a time


class StdoutSink:
    """The event sink of the real program: one JSON line per event on a binary stream.

    Events the client waits on (``protocol.FLUSHED``) are flushed at once; the rest (a scan's
    entries) go out as the buffer fills.
    """

    def __init__(self, stream):
        self._stream = stream
        self._gone = False

    def __call__(self, event):
        # Once the client has gone (a broken pipe), events go nowhere: the program still
        # finishes what it must on the way out (clean up, write the history line) instead of
        # stopping at the first event it can no longer send.
        if self._gone:
            return
        try:
            self._stream.write(protocol.encode_json(event) + b"\n")
            if event.get("t") in protocol.FLUSHED:
                self._stream.flush()
        except OSError:
            self._gone = True

    def flush(self):
        """Write out whatever is buffered (at the end of the program)."""
        if self._gone:
            return
        try:
            self._stream.flush()
        except OSError:
            self._gone = True


class Hangup(Exception):
    """The client's connection ended (SIGHUP, SIGTERM) while a ship could still stop cleanly."""


class HangupGuard:
    """While armed, SIGHUP and SIGTERM raise :class:`Hangup` in the program (a ship then
    cleans up and records its failure on the way out); once disarmed (the switch is next)
    they are only noted, so the ship finishes rather than stop half way after the switch.

    Use as a context manager around a ship; the previous handlers come back at the end.
    """

    SIGNALS = ("SIGHUP", "SIGTERM")

    def __init__(self):
        self.armed = False
        self.caught = None
        self._saved = {}

    def __enter__(self):
        import signal

        for name in self.SIGNALS:
            signum = getattr(signal, name)
            try:
                self._saved[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (a test): no signals to catch
                pass
        self.armed = True
        return self

    def __exit__(self, *exc):
        import signal

        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        return False

    def _handle(self, signum, frame):
        import signal

        self.caught = signal.Signals(signum).name
        if self.armed:
            self.armed = False
            raise Hangup(self.caught)


def read_frame(inp):
    """One frame of the client's input (bytes); Stop (step ``receive``) when it ended first."""
    try:
        return protocol.read_frame(inp)
    except protocol.FrameError as exc:
        raise Stop("receive", "failed", str(exc)) from exc


def read_json_frame(inp):
    """One JSON frame of the client's input: a request or a command."""
    return protocol.decode_json(read_frame(inp))


class Aborted(Exception):
    """The client called a prepared ship off (another host of the fleet could not ship)."""


class Stop(Exception):
    """A step failed; carries the error event to emit."""

    def __init__(self, step, kind, message, path=None, items=None):
        Exception.__init__(self, message)
        self.event = {"t": ERROR, "step": step, "kind": kind, "message": message, "path": path}
        if items:  # every thing the error is about: [[path, what], ...], shown one a line
            self.event["items"] = [[p, what] for p, what in items]


def owners_refused(step, refused, context):
    """The Stop naming every path whose owner could not be set.

    Args:
        step: the ship step (``assemble``, ``credentials``, ``users``).
        refused: ``[(path, owner wanted, OSError or message), ...]``, in the order met; the
            path as a person knows it (a tree path, never a staging name).
        context: what this means for the ship, appended to the message.
    Kind ``permission`` when every refusal was EPERM/EACCES (a login that may not give files
    away), ``failed`` otherwise (no such user, a file system without owners).
    """
    items = []
    denied = True
    for path, owner, why in refused:
        if isinstance(why, OSError):
            denied = denied and why.errno in (errno.EPERM, errno.EACCES)
            why = os_error_text(why)
        else:
            denied = False
        items.append([path, f"{owner}: {why}"])
    return Stop(step, "permission" if denied else "failed",
                f"could not set the owner of {len(items)} path(s); {context}", None, items)


def dec(raw):
    """A bytes name as str: UTF-8 with surrogateescape, so every byte survives.

    Never the locale's encoding (``os.fsdecode``): the client decodes names as UTF-8, and a
    login whose locale is latin-1 (``LANG=de_DE.ISO-8859-1``) would otherwise see ``café``
    as ``cafÃ©`` and write it as ``caf\\xe9``.
    """
    return raw.decode("utf-8", "surrogateescape")


def enc(text):
    """A str name back to its bytes (UTF-8, surrogateescape: the inverse of :func:`dec`)."""
    return text.encode("utf-8", "surrogateescape")


_users = {}  # type: dict
_groups = {}  # type: dict


def user_name(uid):
    """The user name of ``uid`` (the number as text if it has none); cached."""
    if uid not in _users:
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = str(uid)
    return _users[uid]


def group_name(gid):
    """The group name of ``gid`` (the number as text if it has none); cached."""
    if gid not in _groups:
        try:
            _groups[gid] = grp.getgrgid(gid).gr_name
        except KeyError:
            _groups[gid] = str(gid)
    return _groups[gid]


def parse_owner(owner, step, path):
    """(uid, gid) of ``"user:group"`` (names or numbers; gid -1 without a group); Stop
    (kind ``failed``, in ``step``, naming ``path``) when the host has no such user or group."""
    user, _, group = owner.partition(":")
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
    except KeyError:
        raise Stop(step, "failed", f"no such user on the host: {user}", path) from None
    if not group:
        return uid, -1
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise Stop(step, "failed", f"no such group on the host: {group}", path) from None
    return uid, gid


def os_error_text(exc):
    """The human part of an OSError (its strerror)."""
    return exc.strerror or str(exc)


def with_path(exc, path):
    """Return ``exc`` (an OSError) naming ``path`` (bytes or str): calls on an fd carry no file
    name, and an error without one cannot say what was refused. Keeps the subclass
    (PermissionError for EACCES/EPERM) and an existing file name."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), path)

