"""The host protocol: what fleetctl and the program it runs on a host must agree on.

Both sides import this one module: the client (:mod:`fleetctl.session` and the modules that read
what a host reports) and the host-side program (:mod:`fleetctl.host`), which is sent to the host
on each run together with this file. So it imports only the standard library and runs on Python
3.8 (no ``match``, no ``X | Y`` at run time, no ``str.removeprefix``).

Wire format. stdin carries frames ``<length>\\n<bytes>``: first the program itself (read by the
bootstrap), then a JSON request, then (for a ship) JSON commands, ``blob_count`` content blobs
the host does not already have and ``secret_count`` secret frames (the credential files to
write), both framed ``<digest>\\n<size>\\n<bytes>`` and checked against their sha256 on arrival.
stdout carries one JSON event per line (:func:`encode_json`); paths are ``surrogateescape``-
decoded and JSON-escaped, so any byte in a name, newline included, survives. The events of each
operation are listed in ``docs/design.md`` and in the docstrings of :mod:`fleetctl.host`.

Rules both sides apply: the manifest order and digest (:func:`path_sort_key`,
:func:`manifest_digest`), where credentials live and how a leftover of an interrupted ship is
named (:data:`CREDENTIALS_TOP`, :data:`LEFTOVER_PREFIX`), the names of the runners' units
(:data:`UNIT_PREFIX`, :data:`UNIT_SUFFIX`), of agents' accounts (:data:`ACCOUNT_NAME_PATTERN`)
and of releases (:data:`RELEASE_ID`), and the host's state directory (:data:`STATE_DIR`).
"""

import hashlib
import json
import re

# -- framing -----------------------------------------------------------------------------------


def frame(data):
    """Return ``data`` (bytes) as one stdin frame: ``<length>\\n<bytes>``."""
    return b"%d\n" % len(data) + data


def encode_json(obj):
    """``obj`` as compact JSON bytes with ASCII escapes, so surrogateescape-decoded names
    survive exactly (one event line, one request or command frame)."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def decode_json(data):
    """The object of a JSON frame or event line (bytes); ValueError when it is not JSON."""
    return json.loads(data.decode("utf-8", "surrogateescape"))


class FrameError(Exception):
    """The input ended before a whole frame arrived (the connection was lost)."""


def read_frame(stream):
    """Read one ``<length>\\n<bytes>`` frame from the binary ``stream``; return the bytes.

    Raises:
        FrameError: the stream ended first; ValueError: the header is not a length.
    """
    header = stream.readline()
    if not header:
        raise FrameError("input ended early (connection lost?)")
    size = int(header)
    data = stream.read(size)
    if len(data) != size:
        raise FrameError("input ended early (connection lost?)")
    return data


# -- events ------------------------------------------------------------------------------------

# Every event is a JSON object whose ``t`` is one of these.
HELLO = "hello"  # nonce (the request's), user, group, uid, python: the account it runs as
STATE = "state"  # root_exists, current, current_kind, releases, shipped, identity, meta
ENTRY = "entry"  # one manifest entry of the live tree (current/, then credentials/)
SHIPPED = "shipped"  # one manifest entry of the shipped record
UNREADABLE = "unreadable"  # path, error
WARNING = "warning"  # message
UNITS = "units"  # install, remove, problem, kind (a dry run's look at the runners' units)
ACCOUNTS = "accounts"  # accounts: {user: {...}}
SCAN_END = "scan-end"  # entries, unreadable, digest
ROOT = "root"  # key: machine and inode of the root (ship)
LOCKED = "locked"  # created_root (ship)
STEP = "step"  # name: one of STEPS
PREPARED = "prepared"  # release: staged and verified, waiting for commit
ACCOUNT = "account"  # user, created | group_created | home_created
SERVICES = "services"  # installed, removed, restarted, started
DONE = "done"  # release, pruned (ship); release, previous, differences (rollback)
ERROR = "error"  # step, kind, message, path: the operation stopped
LEDGER = "ledger"
LEDGER_PARTIAL = "ledger-partial"
LEDGER_END = "ledger-end"
LEDGER_MISSING = "ledger-missing"
LEDGER_UNREADABLE = "ledger-unreadable"
LEDGERS_END = "ledgers-end"
RELEASE = "release"  # status: the release in use; releases: one release
AGENT_STATUS = "agent-status"
STATUS_END = "status-end"
CONTENT = "content"  # read: path, size, data (base64) | error | too_large
READ_END = "read-end"
RELEASES = "releases"
HISTORY = "history"
RELEASES_END = "releases-end"

# Events after which the host flushes its output: the client waits on them (the hello while it
# sends the program, a step's progress, the lock order of a fleet, the two-phase commit), so
# they must not sit in a buffer.
FLUSHED = frozenset([HELLO, STEP, SCAN_END, ROOT, LOCKED, PREPARED, SERVICES, DONE, ERROR])

# The operations (request ``op``) and the commands of a ship (``cmd``).
OPS = ("scan", "ship", "read", "releases", "rollback", "ledgers", "status")
CMD_LOCK, CMD_SHIP, CMD_SERVICES, CMD_COMMIT, CMD_ABORT, CMD_STOP = (
    "lock", "ship", "services", "commit", "abort", "stop")

# The steps of a ship, in order (``users`` and ``credentials`` only when needed); a rollback
# has ``verify`` and ``switch``; ``scan``, ``lock``, ``receive``, ``read`` and ``commit`` name
# where an error stopped.
STEPS = ("prepare", "receive", "users", "assemble", "verify", "record", "credentials", "switch",
         "services", "prune")

# Error kinds. ``locked`` and ``changed`` are refusals (exit 3); the others are failures.
KIND_LOCKED = "locked"
KIND_CHANGED = "changed"
KIND_PERMISSION = "permission"
KIND_LAYOUT = "layout"
KIND_FAILED = "failed"
REFUSALS = (KIND_LOCKED, KIND_CHANGED)
EXIT_REFUSED = 3
EXIT_FAILED = 1

# -- shared rules ------------------------------------------------------------------------------

#: The host's own state directory under the root: records, history, identity, incoming blobs.
STATE_DIR = ".fleetctl"
#: The credentials tree under the root, beside the releases, never inside one.
CREDENTIALS_TOP = "credentials"
#: The name prefix of a credential file a ship writes before renaming it into place; one left
#: behind by an interrupted ship is fleetctl's own (drift origin ``pending``).
LEFTOVER_PREFIX = ".fleetctl-new-"
#: The runners' systemd units are ``fleet-runner-<agent>.service``.
UNIT_PREFIX = "fleet-runner-"
UNIT_SUFFIX = ".service"
#: A user or group name fleetctl creates (useradd's portable subset).
#: (pydantic's pattern: its regex engine's ``$`` is the end of the value.)
ACCOUNT_NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
#: The same, whole value even with ``match``: Python's ``$`` also matches before a final newline.
ACCOUNT_NAME = re.compile(ACCOUNT_NAME_PATTERN[:-1] + r"\Z")
#: A release id: a directory name under ``releases/`` (``\Z``: the whole value, with ``match``).
RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")
#: The manifest entry types.
ENTRY_TYPES = ("file", "dir", "symlink", "other")


def is_credential_path(path):
    """Whether a manifest path (str) belongs to the credentials tree (not to a release)."""
    return path == CREDENTIALS_TOP or path.startswith(CREDENTIALS_TOP + "/")


def path_sort_key(path):
    """The manifest order of ``path`` (str): by its bytes on disk, ``/`` first, so the order is
    the same on every machine and locale and a directory sorts before its children."""
    return path.encode("utf-8", "surrogateescape").replace(b"/", b"\x00")


def manifest_digest(entries):
    """``"sha256:<hex>"`` of a manifest: its entry dicts (without ``None`` fields) in manifest
    order, as canonical JSON. Equal manifests, equal digests, on either side."""
    ordered = sorted(entries, key=lambda e: path_sort_key(e["path"]))
    canonical = json.dumps(ordered, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
