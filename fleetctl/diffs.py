"""Content diffs between a live file and its desired content, safe to show and exact to apply.

For each changed file that is not a secret:

- text (valid UTF-8 without NUL): a unified diff made here, not by ``difflib.unified_diff``:
  lines are split only at ``\\n`` (a CR, a form feed, U+2028 ... are content), a last line
  without a newline is followed by ``\\ No newline at end of file`` as GNU diff and git write it,
  so the patch applies with ``git apply`` (or ``patch``) and gives the other side's bytes
  exactly. A note says when only line endings (CRLF vs LF) or only the final newline differ.
- YAML and JSON: a key-level summary of what changed at which key, type-strict (``1`` to
  ``1.0``, ``"1"`` to ``1``, ``true`` to ``"true"`` are changes, and say their types), lists
  compared item by item (a removed repeated item is named), then always the text diff: a key-level
  view cannot see comments, formatting, key order, anchors or a duplicate key, so it never
  stands alone.
- binary (a NUL byte) or not UTF-8: a note with both sizes and both digests, no patch (a patch
  of such bytes could not be carried in JSON or shown to a person without changing them).

The diff shown to a person is the patch with each line's content in the escape form of
:func:`fleetctl.names.show_name` (a CR is ``\\x0d``, a tab ``\\x09``, an ESC ``\\x1b``, a backslash
``\\\\``), so a file on a host cannot drive the operator's terminal, and
:func:`fleetctl.names.unshow_bytes` of each line gives the patch's bytes back. A credential file
shows digests only, always.

The rule every diff keeps: when the two digests differ, the diff is not empty (it has lines or a
note).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import yaml

from fleetctl.manifest import sha256_digest
from fleetctl.names import printable, show_name
from fleetctl.yamlfile import RealDaysLoader

TEXT, STRUCTURED, BINARY, SECRET, TOO_LARGE, UNAVAILABLE = (
    "text", "structured", "binary", "secret", "too-large", "unavailable")
MAX_DIFF_LINES = 400
CONTEXT_LINES = 3
NO_NEWLINE = "\\ No newline at end of file"
_STRUCTURED_SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


@dataclass(frozen=True, slots=True)
class FileDiff:
    """How one file's live content differs from its desired content.

    Attributes:
        path: relative to the managed tree.
        kind: ``text`` (unified diff), ``structured`` (YAML/JSON: key-level lines, then the
            unified diff), ``binary`` (not text: sizes and digests only), ``secret`` (a
            credential file: digests only), ``too-large`` (past the read limit) or
            ``unavailable`` (the host could not read it: ``note`` says why).
        lines: the unified diff for people, one line each (no newlines), every line's content in
            the :func:`fleetctl.names.show_name` form; at most ``MAX_DIFF_LINES``.
        keys: the key-level changes of a YAML or JSON file, ``~ root['a']: 1 -> 2`` each
            (escaped for a terminal); empty for other kinds.
        patch: the unified diff exactly, lines ending in ``\\n``, ready for ``git apply``; ``None``
            when there is none to apply (not text, cut, secret, unread, or an empty file on one
            side only).
        live_digest, desired_digest: ``sha256:...`` or ``None`` when absent.
        live_size, desired_size: bytes, or ``None`` when absent or not told.
        note: what else to know (only line endings differ, the diff was cut, a file did not
            parse as YAML); a note about a file without a patch carries both sizes and digests.
    """

    path: str
    kind: str
    lines: tuple[str, ...] = ()
    live_digest: str | None = None
    desired_digest: str | None = None
    live_size: int | None = None
    desired_size: int | None = None
    note: str | None = None
    keys: tuple[str, ...] = ()
    patch: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The diff as a JSON object (the keys above; a path that is not valid UTF-8 escaped,
        with ``path_escaped``)."""
        from fleetctl.names import escape_name

        path, escaped = escape_name(self.path)
        return {"path": path, **({"path_escaped": True} if escaped else {}),
                "kind": self.kind, "lines": list(self.lines), "keys": list(self.keys),
                "patch": self.patch,
                "live_digest": self.live_digest, "desired_digest": self.desired_digest,
                "live_size": self.live_size, "desired_size": self.desired_size,
                "note": self.note}


def split_lines(text: str) -> list[str]:
    """``text`` cut after each ``\\n`` only (each line keeps its ``\\n``; the last may have
    none). ``str.splitlines`` would also cut at a CR, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``,
    ``\\x85``, U+2028 and U+2029, which are content to diff and patch."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, stop: int) -> str:
    """A hunk side's ``start,length`` as unified diffs write it (``N`` for one line, and the
    line before for none)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def unified_diff(old: str, new: str, fromfile: str, tofile: str,
                 context: int = CONTEXT_LINES) -> list[tuple[str, str]]:
    """The unified diff from ``old`` to ``new``: ``(exact, shown)`` per line, without newlines.

    ``exact`` is the patch line; ``shown`` the same line with its content in the
    :func:`~fleetctl.names.show_name` form (the marker, ``---``/``+++``/``@@`` headers and
    ``\\ No newline at end of file`` as they are). Empty when ``old == new``.
    """
    a, b = split_lines(old), split_lines(new)
    groups = list(SequenceMatcher(None, a, b).get_grouped_opcodes(context))
    if not groups:
        return []
    out = [(f"--- {fromfile}", f"--- {fromfile}"), (f"+++ {tofile}", f"+++ {tofile}")]

    def body(marker: str, line: str) -> None:
        content = line[:-1] if line.endswith("\n") else line
        out.append((marker + content, show_diff_line(marker + content)))
        if not line.endswith("\n"):
            out.append((NO_NEWLINE, NO_NEWLINE))

    for group in groups:
        first, last = group[0], group[-1]
        header = f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@"
        out.append((header, header))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for line in a[i1:i2]:
                    body(" ", line)
                continue
            for line in a[i1:i2]:
                body("-", line)
            for line in b[j1:j2]:
                body("+", line)
    return out


def show_diff_line(line: str) -> str:
    """One line of a unified diff for people: its first character (the marker) as it is, the
    rest in the :func:`~fleetctl.names.show_name` form but for a leading space (the marker is
    before it); ``\\ No newline at end of file`` as it is. :func:`fleetctl.names.unshow_bytes`
    gives the line back."""
    if not line or line == NO_NEWLINE:
        return line
    return line[0] + show_name(line[1:], lead=False)


def _decode(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _sides(live: bytes | None, desired: bytes | None, labels: tuple[str, str]) -> str:
    """``live 12 B sha256:..., desired absent``: both sizes and digests, for a note."""
    def one(label: str, data: bytes | None) -> str:
        return f"{label} absent" if data is None else \
            f"{label} {len(data)} B {sha256_digest(data)}"
    return f"{one(labels[0], live)}, {one(labels[1], desired)}"


def _endings(data: bytes) -> str:
    crlf, lf = data.count(b"\r\n"), data.count(b"\n")
    return "LF" if not crlf else "CRLF" if crlf == lf else f"CRLF on {crlf} of {lf} lines"


def _whitespace_note(live: bytes, desired: bytes, labels: tuple[str, str]) -> str | None:
    """Whether only line endings, or only the final newline, differ."""
    if live.replace(b"\r\n", b"\n") == desired.replace(b"\r\n", b"\n"):
        return (f"only line endings differ ({labels[0]}: {_endings(live)}, "
                f"{labels[1]}: {_endings(desired)})")
    if live.rstrip(b"\r\n") == desired.rstrip(b"\r\n"):
        return "only the final newline differs"
    return None


def diff_contents(path: str, live: bytes | None, desired: bytes | None,
                  labels: tuple[str, str] = ("live", "desired")) -> FileDiff:
    """Compare a live file's content with the desired content (``None``: the file is absent).

    Args:
        labels: the names of the two sides (the first is the old one), in a text diff's headers
            (``live/<path>``, ``desired/<path>``; ``/dev/null`` for an absent side) and in notes.

    Returns a :class:`FileDiff` of kind ``text``, ``structured`` or ``binary``; whenever the
    two contents differ, its ``lines`` or its ``note`` say so (never both empty).
    """
    sizes: dict[str, Any] = dict(live_size=None if live is None else len(live),
                                 desired_size=None if desired is None else len(desired),
                                 live_digest=None if live is None else sha256_digest(live),
                                 desired_digest=None if desired is None else
                                 sha256_digest(desired))
    live_text = "" if live is None else _decode(live)
    want_text = "" if desired is None else _decode(desired)
    if live_text is None or want_text is None:
        return FileDiff(path, BINARY, note="not text (a NUL byte, or not UTF-8): no patch; "
                        + _sides(live, desired, labels), **sizes)
    notes = []
    keys: list[str] = []
    flavour = next((f for suffix, f in _STRUCTURED_SUFFIXES.items() if path.endswith(suffix)),
                   None)
    if flavour is not None and live is not None and desired is not None:
        try:
            (old, old_dups), (new, new_dups) = (_load(flavour, live_text),
                                                _load(flavour, want_text))
            keys = [printable(line) for line in key_changes(old, new)]
            notes += [f"{label}: {dup}: the key-level view sees only the last"
                      for label, dups in zip(labels, (old_dups, new_dups), strict=True)
                      for dup in dups]
            if not keys:
                notes.append("the same data, written differently")
        except (ValueError, yaml.YAMLError, RecursionError) as exc:
            first = (str(exc).split("\n") or [""])[0]
            notes.append(f"not valid {flavour.upper()} ({printable(first)}): shown as text")
    if live is not None and desired is not None:
        notes += filter(None, [_whitespace_note(live, desired, labels)])
    name = show_name(path)
    pairs = unified_diff(live_text, want_text,
                         "/dev/null" if live is None else f"{labels[0]}/{name}",
                         "/dev/null" if desired is None else f"{labels[1]}/{name}")
    if not pairs and live != desired:  # an empty file on one side only: no hunk to show
        notes.append(f"an empty file, {labels[0] if desired is None else labels[1]} only")
    patch = "".join(exact + "\n" for exact, _ in pairs) or None
    diff = FileDiff(path, STRUCTURED if keys else TEXT, tuple(s for _, s in pairs),
                    note="; ".join(notes) or None, keys=tuple(keys), patch=patch, **sizes)
    return _cut(diff, _sides(live, desired, labels))


class _YamlLoader(RealDaysLoader):
    """The loader fleetctl reads YAML with (an impossible day such as ``2026-13-01`` stays a
    string, as YAML 1.2 reads it, instead of a bare ValueError), that also notes duplicate keys,
    which PyYAML keeps silently (the last wins), so the key-level view can say it does not see
    the others."""

    duplicates: list[str]


def _yaml_mapping(loader: _YamlLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[tuple[str, str]] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            key = (key_node.tag, key_node.value)
            if key in seen:
                loader.duplicates.append(f"duplicate key {key_node.value!r} on line "
                                         f"{key_node.start_mark.line + 1}")
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _yaml_mapping)


def _load(flavour: str, text: str) -> tuple[Any, list[str]]:
    """The data of a JSON or YAML text (several YAML documents: a list of them), and the
    duplicate keys it holds.

    Raises:
        ValueError, yaml.YAMLError: it does not parse.
    """
    duplicates: list[str] = []
    if flavour == "json":
        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            keys = [k for k, _ in items]
            duplicates.extend(f"duplicate key {k!r}" for k in sorted(set(keys))
                              if keys.count(k) > 1)
            return dict(items)
        return json.loads(text, object_pairs_hook=pairs), duplicates
    loader = _YamlLoader(text)
    loader.duplicates = duplicates
    try:
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
    finally:
        loader.dispose()
    return (docs[0] if len(docs) == 1 else docs if docs else None), duplicates


def _canon(value: Any) -> str:
    """A type-strict form of ``value``: equal only for the same data of the same types (``1``,
    ``1.0``, ``True`` and ``"1"`` all differ, as do their places in lists and mappings)."""
    if isinstance(value, dict):
        return "{" + ",".join(sorted(f"{_canon(k)}:{_canon(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_canon(v) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return "set{" + ",".join(sorted(_canon(v) for v in value)) + "}"
    return f"{type(value).__name__}:{value!r}"


def key_changes(old: Any, new: Any, where: str = "root") -> list[str]:
    """The key-level changes from ``old`` to ``new`` (loaded YAML or JSON data).

    Lines: ``~ root['a']: 1 -> 2`` (changed; ``(int -> float)`` added when the type changed),
    ``+ root['b']: ...`` (only in ``new``), ``- root['c'][1]: ...`` (only in ``old``; a list
    item by its index there). Lists are aligned item by item, so removing one of two equal
    items is one ``-`` line. Unlike deepdiff (9.1: ``[2]`` and ``[2.0]`` equal), nothing equal
    in Python but different in type is hidden.
    """
    if _canon(old) == _canon(new):
        return []
    out: list[str] = []
    if isinstance(old, dict) and isinstance(new, dict):
        # Keys by their type-strict form: 1 and True are one key to a dict, not to a file.
        olds = {_canon(k): k for k in old}
        news = {_canon(k): k for k in new}
        for tag in [*olds, *(t for t in news if t not in olds)]:
            key = olds.get(tag, news.get(tag))
            at = f"{where}[{key!r}]"
            if tag not in news:
                out.append(f"- {at}: {_short(old[key])}")
            elif tag not in olds:
                out.append(f"+ {at}: {_short(new[news[tag]])}")
            else:
                out += key_changes(old[key], new[news[tag]], at)
        return out
    if isinstance(old, list) and isinstance(new, list):
        matcher = SequenceMatcher(None, [_canon(v) for v in old], [_canon(v) for v in new],
                                  autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            if op == "replace" and i2 - i1 == j2 - j1:
                for k in range(i2 - i1):
                    out += key_changes(old[i1 + k], new[j1 + k], f"{where}[{i1 + k}]")
                continue
            out += [f"- {where}[{i}]: {_short(old[i])}" for i in range(i1, i2)]
            out += [f"+ {where}[{j}]: {_short(new[j])}" for j in range(j1, j2)]
        return out
    types = "" if type(old) is type(new) else \
        f" ({type(old).__name__} -> {type(new).__name__})"
    return [f"~ {where}: {_short(old)} -> {_short(new)}{types}"]


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # a mapping with keys JSON cannot have
        text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _cut(diff: FileDiff, sides: str) -> FileDiff:
    """``diff`` with at most :data:`MAX_DIFF_LINES` lines and keys; a cut one has no patch and
    a note with both sizes and digests."""
    if len(diff.lines) <= MAX_DIFF_LINES and len(diff.keys) <= MAX_DIFF_LINES:
        return diff
    note = (diff.note + "; " if diff.note else "") + \
        f"diff cut to {MAX_DIFF_LINES} of {max(len(diff.lines), len(diff.keys))} lines, " \
        f"no patch: {sides}"
    return FileDiff(diff.path, diff.kind, diff.lines[:MAX_DIFF_LINES], diff.live_digest,
                    diff.desired_digest, diff.live_size, diff.desired_size, note,
                    diff.keys[:MAX_DIFF_LINES], None)


def secret_diff(path: str, live_digest: str | None, desired_digest: str | None) -> FileDiff:
    """A credential file's "diff": its digests, never its content or size."""
    return FileDiff(path, SECRET, live_digest=live_digest, desired_digest=desired_digest,
                    note="a credential file: digests only")


def unavailable(path: str, why: str, live_digest: str | None, desired_digest: str | None,
                live_size: int | None = None, desired_size: int | None = None) -> FileDiff:
    """A file whose live content could not be had (``why``), with both sizes and digests (in
    the note too)."""
    kind = TOO_LARGE if why.startswith("too large") else UNAVAILABLE

    def side(label: str, size: int | None, digest: str | None) -> str:
        return f"{label} absent" if digest is None and size is None else \
            f"{label} {'?' if size is None else size} B {digest or '(no digest)'}"
    return FileDiff(path, kind, live_digest=live_digest, desired_digest=desired_digest,
                    live_size=live_size, desired_size=desired_size,
                    note=f"{printable(why)}: {side('live', live_size, live_digest)}, "
                         f"{side('desired', desired_size, desired_digest)}")


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
        is_live = change.live is not None and change.live.type == "file"
        is_want = change.desired is not None and change.desired.type == "file"
        live_digest = change.live.digest if is_live else None
        want_digest = change.desired.digest if is_want else None
        if is_credential_path(path):
            out.append(secret_diff(path, live_digest, want_digest))
            continue
        desired = contents.get(want_digest) if want_digest else None
        live: bytes | str | None = None
        if is_live:
            live = found.get(path, "not read")
            if isinstance(live, bytes) and sha256_digest(live) != live_digest:
                live = "changed on the host since the scan; run again"
        if isinstance(live, str):
            out.append(unavailable(path, live, live_digest, want_digest,
                                   change.live.size if is_live else None,
                                   change.desired.size if is_want else None))
            continue
        out.append(diff_contents(path, live, desired))
    return out
