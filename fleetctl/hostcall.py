"""Running :mod:`fleetctl.hostside` on a host and reading what it reports.

One call is one process on the host and one round trip: the host-side source and the request go
down stdin, the live manifest streams back as JSON lines while the host hashes, and for a ship the
command and the missing content follow on the same stdin while the host holds its lock.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterator

from fleetctl.errors import HostError, PermissionDenied, ShipRefused
from fleetctl.manifest import Entry, Manifest
from fleetctl.names import valid_tree_path
from fleetctl.transport.base import Channel, Transport

# Reads the host-side program from stdin and runs it, so nothing is installed on the host and no
# data ever appears on a command line.
BOOTSTRAP = (
    "import sys;n=int(sys.stdin.buffer.readline());"
    "exec(compile(sys.stdin.buffer.read(n),'fleetctl-hostside','exec'),{'__name__':'__main__'})"
)


_ACTIVE: set["HostCall"] = set()
_ACTIVE_LOCK = threading.Lock()
INTERRUPTED = threading.Event()


def interrupt_all() -> None:
    """End every running host-side program at once (Ctrl-C) and refuse to start new ones.

    A ship killed before its switch leaves the previous release in use; the host's lock goes
    with the process.
    """
    INTERRUPTED.set()
    with _ACTIVE_LOCK:
        calls = list(_ACTIVE)
    for call in calls:
        call.kill()


def _hostside_source() -> bytes:
    return resources.files("fleetctl").joinpath("hostside.py").read_bytes()


def frame(data: bytes) -> bytes:
    """Return ``data`` as one stdin frame: ``<length>\\n<bytes>``."""
    return b"%d\n" % len(data) + data


def encode_json(obj: Any) -> bytes:
    """JSON with ASCII escapes, so surrogateescape-decoded names survive exactly."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A node the scan could not read: its path and the host's reason."""

    path: str
    error: str


@dataclass(slots=True)
class LiveState:
    """What one scan of a host found.

    Attributes:
        user, group: the account the host-side program ran as (the default owner).
        root_exists: whether the managed root exists.
        current: the release id ``current`` points to, or ``None``.
        current_kind: ``symlink``, ``dir``, ``other``, ``foreign-symlink`` or ``None`` (absent).
        releases: release ids present on the host, oldest first.
        shipped: the shipped manifest (record of the current release) or ``None``.
        live: the live manifest of ``<root>/current``.
        unreadable: nodes the scan could not read; any makes the scan incomplete.
        warnings: what the host noticed but could work around (an unusable release record).
        units: for a request that asked (a dry run on a systemd host), the host's answer about
            the runners' units: ``install`` and ``remove`` (unit names), ``problem`` and
            ``kind`` (why the services step would fail, or ``None``); otherwise ``None``.
        accounts: the agents' own accounts as the host has them, by user name: ``exists``,
            ``group_exists``, ``home``, ``home_exists``, ``home_mode`` (``"0700"`` or
            ``None``), ``home_owner`` (``"user:group"`` or ``None``); ``None`` when the
            request named no account.
        identity: the host identity recorded at adoption, ``{"name", "id", "adopted"}``;
            ``{"problem": ...}`` when the file is there but unusable; ``None`` if none.
        meta: the provenance of the current release from its record (``source``, ``created``,
            ``shipped_by``, ``forced``, ``host``...; docs/provenance.md); ``{}`` if it has none.
        ship_in_progress: for a scan, the process holding the host's ship lock (``"pid N"``),
            or ``None``.
        created_root: for a ship, whether taking the lock created the (empty) root.
        root_key: for a ship, the machine and inode of the root (equal keys: same directory).
    """

    user: str = ""
    group: str = ""
    root_exists: bool = False
    current: str | None = None
    current_kind: str | None = None
    releases: list[str] = field(default_factory=list)
    shipped: Manifest | None = None
    live: Manifest = field(default_factory=Manifest)
    unreadable: list[Unreadable] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    units: dict[str, Any] | None = None
    accounts: dict[str, dict[str, Any]] | None = None
    identity: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    ship_in_progress: str | None = None
    created_root: bool = False
    root_key: str | None = None

    @property
    def commit(self) -> str | None:
        """The blueprint commit the current release was rendered from, if its record says."""
        source = self.meta.get("source")
        commit = source.get("commit") if isinstance(source, dict) else None
        return commit if isinstance(commit, str) else None

    @property
    def owner(self) -> str:
        """The default owner of managed entries on this host, ``"user:group"``."""
        return f"{self.user}:{self.group}"


class HostCall:
    """One run of the host-side program.

    Args:
        transport: a connected transport.
        python: the interpreter on the host (``python3`` unless the inventory says otherwise).
        request: the JSON request (``op`` is ``scan`` or ``ship``, ``root`` the managed root).
        timeout_s: seconds after which the whole call is ended; ``None`` for no limit.
    """

    def __init__(self, transport: Transport, python: str, request: dict,
                 timeout_s: float | None) -> None:
        self.label = self._label = transport.label
        #: What the transport noticed while connecting (a known_hosts line skipped); a scan
        #: reports them among its warnings.
        self.transport_warnings: list[str] = list(getattr(transport, "warnings", ()))
        self._transport = transport
        self._timed_out = False
        if INTERRUPTED.is_set():
            raise HostError(f"{self.label}: interrupted; not started")
        self._chan: Channel = transport.start([python, "-c", BOOTSTRAP])
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        self._timeout_s = timeout_s
        self._timer: threading.Timer | None = None
        self.arm()
        self._buffer = b""
        try:
            self.send(frame(_hostside_source()) + frame(encode_json(request)))
        except OSError:
            if self._timed_out:
                raise self.broken("it did not read its input") from None
            # otherwise the process died at once; events() reports why from its stderr

    def arm(self) -> None:
        """Start (or restart) the timeout: the call is ended ``timeout_s`` from now.

        A fleet ship re-arms it for each phase of a host's work and pauses it while the host
        waits for the others, so the limit is on this host's work, not the fleet's.
        """
        self.pause()
        if self._timeout_s:
            self._timer = threading.Timer(self._timeout_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def pause(self) -> None:
        """Stop the timeout until :meth:`arm` (the host waits on the client, not working)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timed_out = True
        self._chan.kill()

    def send(self, data: bytes) -> None:
        """Write raw bytes to the host-side program's stdin."""
        self._chan.send(data)

    def events(self) -> Iterator[dict]:
        """Yield each event the host reports until its output ends.

        Raises:
            HostError: the output ended without a final event, or was not JSON.
        """
        while True:
            newline = self._buffer.find(b"\n")
            while newline < 0:
                try:
                    block = self._chan.read(1 << 16)
                except OSError as exc:
                    raise self.broken(str(exc)) from None
                if not block:
                    if self._buffer or self._timed_out:
                        raise self.broken("output ended mid-line")
                    return
                self._buffer += block
                newline = self._buffer.find(b"\n")
            line, self._buffer = self._buffer[:newline], self._buffer[newline + 1:]
            try:
                event = json.loads(line)
            except ValueError:
                raise self.broken(f"unexpected output: {line[:200]!r}") from None
            if event.get("t") == "error":
                self.finish()
                raise error_from_event(self._label, event)
            yield event

    def broken(self, why: str) -> HostError:
        """Build the error for a call that ended abnormally, with the tail of its stderr."""
        if INTERRUPTED.is_set():
            return HostError(f"{self._label}: interrupted; if a ship was under way, the previous "
                             "release stays in use unless it had already switched (check with "
                             "drift)")
        if self._timed_out:
            return HostError(f"{self._label}: timed out; the operation was ended")
        self._chan.kill()
        tail = self._chan.stderr_tail().strip()
        explained = self._transport.explain(tail)  # e.g. sudo refused (become: sudo)
        if explained is not None:
            return explained
        detail = f": {tail.splitlines()[-1]}" if tail else ""
        return HostError(f"{self._label}: the host-side program failed ({why}){detail}")

    def finish(self) -> int:
        """Close stdin, wait for the program to end, and return its exit status."""
        try:
            status = self._chan.wait()
        finally:
            self._forget()
        return status

    def _forget(self) -> None:
        self.pause()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self)

    def kill(self) -> None:
        """End the program at once (used when the caller gives up part-way)."""
        self._chan.kill()
        self._forget()


def error_from_event(label: str, event: dict) -> Exception:
    """Map a host-side error event to the exception type the CLI turns into an exit code."""
    kind = event.get("kind")
    where = f" ({event['path']})" if event.get("path") else ""
    message = f"{label}: {event.get('step')}: {event.get('message')}{where}"
    if kind in ("locked", "changed"):
        return ShipRefused(message, step=event.get("step"))
    if kind == "permission":
        return PermissionDenied(message + "; stopped, nothing was retried",
                                hint="the previous release is still in use", step=event.get("step"))
    return HostError(message, hint="the previous release is still in use"
                     if event.get("step") not in (None, "scan", "lock") else None,
                     step=event.get("step"))


def read_scan(call: HostCall, events: Iterator[dict], state: LiveState | None = None,
              until: str = "scan-end") -> LiveState:
    """Consume events up to ``until`` and return the host's :class:`LiveState`.

    A ship reads twice into one state: up to ``locked`` (its turn in the fleet's lock order),
    then on to ``scan-end``.

    Raises:
        HostError: the output ended first; ShipRefused: the host's lock is held.
    """
    state = state if state is not None else LiveState()
    live: list[Entry] = []
    shipped: list[Entry] = []
    for event in events:
        kind = event.pop("t")
        if kind in ("entry", "shipped", "unreadable") and not valid_tree_path(event.get("path")):
            # The host is not trusted: a name that climbs out or is not relative never reaches
            # the comparison, a diff or backport.
            raise call.broken(f"it sent a path that is not a plain relative path: "
                              f"{str(event.get('path'))[:200]!r}")
        if kind == until == "locked":
            state.created_root = bool(event.get("created_root"))
            return state
        if kind == "entry":
            live.append(Entry.from_json(event))
        elif kind == "shipped":
            shipped.append(Entry.from_json(event))
        elif kind == "unreadable":
            state.unreadable.append(Unreadable(event["path"], event["error"]))
        elif kind == "warning":
            state.warnings.append(event["message"])
        elif kind == "units":
            state.units = event
        elif kind == "accounts":
            state.accounts = event["accounts"]
        elif kind == "root":
            state.root_key = event["key"]
        elif kind == "hello":
            state.user, state.group = event["user"], event["group"]
        elif kind == "state":
            state.root_exists = event["root_exists"]
            state.current = event["current"]
            state.current_kind = event["current_kind"]
            state.releases = event["releases"]
            state.identity = event.get("identity")
            state.meta = event.get("meta") or {}
            state.ship_in_progress = event.get("ship_in_progress")
            if event["shipped"]:
                state.shipped = Manifest()
        elif kind == "scan-end":
            state.warnings[:0] = [w for w in call.transport_warnings if w not in state.warnings]
            state.live = Manifest(live)
            if state.shipped is not None:
                state.shipped = Manifest(shipped)
            return state
    raise call.broken("the scan ended early" if until == "scan-end" else
                      "the host-side program ended before taking the lock")
