"""Content diffs between a live file and its desired content, safe to show to people.

For each changed file that is not a secret: a unified diff of text (``difflib``), a key-level
structured diff of YAML and JSON files (``deepdiff``: what was added, removed or changed at
which key), and for binaries their sizes and digests. A credential file shows digests only,
always. Everything shown is escaped: a file on a host cannot drive the operator's terminal with
control characters or escape sequences (each becomes ``\\xNN``, ``\\t`` stays a tab).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

import yaml
from deepdiff import DeepDiff

from fleetctl.manifest import sha256_digest
from fleetctl.names import escape_name, printable

TEXT, STRUCTURED, BINARY, SECRET, TOO_LARGE, UNAVAILABLE = (
    "text", "structured", "binary", "secret", "too-large", "unavailable")
MAX_DIFF_LINES = 400
_STRUCTURED_SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


@dataclass(frozen=True, slots=True)
class FileDiff:
    """How one file's live content differs from its desired content.

    Attributes:
        path: relative to the managed tree.
        kind: ``text`` (unified diff), ``structured`` (key-level, YAML/JSON), ``binary``
            (sizes and digests only), ``secret`` (a credential file: digests only),
            ``too-large`` (past the read limit) or ``unavailable`` (the host could not read it:
            ``note`` says why).
        lines: the diff, one escaped line each (no newlines); at most ``MAX_DIFF_LINES``.
        live_digest, desired_digest: ``sha256:...`` or ``None`` when absent.
        live_size, desired_size: bytes, or ``None`` when absent.
        note: what else to know (the diff was cut, a file did not parse as YAML).
    """

    path: str
    kind: str
    lines: tuple[str, ...] = ()
    live_digest: str | None = None
    desired_digest: str | None = None
    live_size: int | None = None
    desired_size: int | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The diff as a JSON object (the keys above; a path that is not valid UTF-8 escaped,
        with ``path_escaped``)."""
        path, escaped = escape_name(self.path)
        return {"path": path, **({"path_escaped": True} if escaped else {}),
                "kind": self.kind, "lines": list(self.lines),
                "live_digest": self.live_digest, "desired_digest": self.desired_digest,
                "live_size": self.live_size, "desired_size": self.desired_size,
                "note": self.note}


def safe_line(text: str) -> str:
    """One line for a terminal: every control character (ESC included) and bad byte escaped,
    tabs kept."""
    return "\t".join(printable(part) for part in text.split("\t"))


def _decode(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def diff_contents(path: str, live: bytes | None, desired: bytes | None,
                  labels: tuple[str, str] = ("live", "desired")) -> FileDiff:
    """Compare a live file's content with the desired content (``None``: the file is absent).

    Args:
        labels: the names of the two sides in a text diff's headers (``live/<path>``, ...).

    Returns a :class:`FileDiff` of kind ``text``, ``structured`` or ``binary``. A YAML or
    JSON file whose data is equal but whose text is not (indentation, comments, key order) is
    shown as text, with a note.
    """
    sizes: dict[str, Any] = dict(live_size=None if live is None else len(live),
                                 desired_size=None if desired is None else len(desired),
                                 live_digest=None if live is None else sha256_digest(live),
                                 desired_digest=None if desired is None else
                                 sha256_digest(desired))
    live_text = "" if live is None else _decode(live)
    want_text = "" if desired is None else _decode(desired)
    if live_text is None or want_text is None:
        return FileDiff(path, BINARY, **sizes)
    flavour = next((f for suffix, f in _STRUCTURED_SUFFIXES.items() if path.endswith(suffix)),
                   None)
    note = None
    if flavour is not None and live is not None and desired is not None:
        try:
            lines = _structured(flavour, live_text, want_text)
            if lines:
                return _cut(FileDiff(path, STRUCTURED, tuple(lines), **sizes))
            note = "the same data, written differently: shown as text"
        except (ValueError, yaml.YAMLError) as exc:
            note = f"not valid {flavour.upper()} ({printable(str(exc).splitlines()[0])}): " \
                   "shown as text"
    lines = [line.rstrip("\n") for line in difflib.unified_diff(
        live_text.splitlines(keepends=True), want_text.splitlines(keepends=True),
        fromfile=f"{labels[0]}/{path}", tofile=f"{labels[1]}/{path}", n=3)]
    return _cut(FileDiff(path, TEXT, tuple(safe_line(line) for line in lines), note=note,
                         **sizes))


def _load(flavour: str, text: str) -> Any:
    if flavour == "json":
        return json.loads(text)
    return yaml.safe_load(text)


def _structured(flavour: str, live: str, desired: str) -> list[str]:
    """Key-level changes from live to desired: ``~ root['a']: 1 -> 2``, ``+ ...``, ``- ...``."""
    found = DeepDiff(_load(flavour, live), _load(flavour, desired), verbose_level=2)
    out = []
    for kind, items in found.items():
        sign = "+" if "added" in kind else "-" if "removed" in kind else "~"
        if isinstance(items, dict):
            for where, value in items.items():
                if isinstance(value, dict) and "old_value" in value:
                    shown = f"{_short(value['old_value'])} -> {_short(value['new_value'])}"
                else:
                    shown = _short(value)
                out.append(safe_line(f"{sign} {where}: {shown}"))
        else:  # a set of paths (e.g. attribute changes)
            out.extend(safe_line(f"{sign} {where}") for where in sorted(map(str, items)))
    return sorted(out, key=lambda line: line[2:])


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _cut(diff: FileDiff) -> FileDiff:
    if len(diff.lines) <= MAX_DIFF_LINES:
        return diff
    note = (diff.note + "; " if diff.note else "") + \
        f"diff cut to {MAX_DIFF_LINES} of {len(diff.lines)} lines"
    return FileDiff(diff.path, diff.kind, diff.lines[:MAX_DIFF_LINES], diff.live_digest,
                    diff.desired_digest, diff.live_size, diff.desired_size, note)


def secret_diff(path: str, live_digest: str | None, desired_digest: str | None) -> FileDiff:
    """A credential file's "diff": its digests, never its content or size."""
    return FileDiff(path, SECRET, live_digest=live_digest, desired_digest=desired_digest,
                    note="a credential file: digests only")


def unavailable(path: str, why: str, live_digest: str | None,
                desired_digest: str | None) -> FileDiff:
    """A file whose live content could not be had (``why``), with its digests."""
    kind = TOO_LARGE if why.startswith("too large") else UNAVAILABLE
    return FileDiff(path, kind, live_digest=live_digest, desired_digest=desired_digest,
                    note=printable(why))


def diffs_for(host: Any, contents: dict[str, bytes], changes: list[Any],
              read: Any = None) -> list[FileDiff]:
    """The content diffs of one host's changes, one per changed file, in path order.

    Args:
        host: the :class:`~fleetctl.inventory.Host`.
        contents: desired content by digest (``DesiredTree.contents``).
        changes: the host's :class:`~fleetctl.drift.Change` list.
        read: ``(host, paths) -> {path: bytes | why}``; default
            :func:`fleetctl.hostops.read_live_files` (one round trip for all paths).

    Only files whose content differs (or that exist on one side only) get a diff; the live
    content read is checked against the digest the scan saw, so a file changed since the scan
    is reported as such rather than diffed.

    Raises:
        HostError: the host cannot be read.
    """
    from fleetctl.credentials import is_credential_path

    if read is None:
        from fleetctl.hostops import read_live_files as read
    picked: dict[str, Any] = {}
    for change in changes:
        was, want = change.live, change.desired
        if (was is None or was.type != "file") and (want is None or want.type != "file"):
            continue
        if was is not None and want is not None and was.type == want.type == "file" and \
                was.digest == want.digest:
            continue
        picked.setdefault(change.path, change)
    out = []
    to_read = [p for p, c in picked.items() if not is_credential_path(p)
               and c.live is not None and c.live.type == "file"]
    found = read(host, to_read) if to_read else {}
    for path, change in sorted(picked.items()):
        live_digest = change.live.digest if change.live is not None else None
        want_digest = change.desired.digest if change.desired is not None else None
        if is_credential_path(path):
            out.append(secret_diff(path, live_digest, want_digest))
            continue
        desired = contents.get(want_digest) if want_digest and change.desired.type == "file" \
            else None
        live: bytes | str | None = None
        if change.live is not None and change.live.type == "file":
            live = found.get(path, "not read")
            if isinstance(live, bytes) and sha256_digest(live) != live_digest:
                live = "changed on the host since the scan; run again"
        if isinstance(live, str):
            out.append(unavailable(path, live, live_digest, want_digest))
            continue
        out.append(diff_contents(path, live, desired))
    return out
