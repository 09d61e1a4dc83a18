"""Manifests: the description of a tree that every comparison in fleetctl works on.

A manifest is a list of :class:`Entry` sorted by path (DESIGN.md §2). Paths are relative to the
managed tree, ``/``-separated, and held as ``str`` decoded with ``surrogateescape`` (the same
convention as :func:`os.fsdecode`), so a name with any byte except ``/`` and NUL survives a round
trip through JSON and back to the exact bytes on disk. Only type, mode (all 12 bits), owner, size,
sha256 digest and link target are recorded: never mtime, ctime or inode, which change without the
tree changing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleetctl.protocol import manifest_digest, path_sort_key

FILE = "file"
DIR = "dir"
SYMLINK = "symlink"
OTHER = "other"  # fifo, socket or device: never desired, always reported
TYPES = (FILE, DIR, SYMLINK, OTHER)


@dataclass(frozen=True, slots=True)
class Entry:
    """One node of a tree.

    Attributes:
        path: relative path, ``/``-separated, surrogateescape-decoded.
        type: one of ``file``, ``dir``, ``symlink``, ``other``.
        mode: permission bits including setuid/setgid/sticky as a 4-digit octal string
            (``"0644"``, ``"1777"``); ``None`` for symlinks, whose mode Linux ignores.
        owner: ``"user:group"`` names (numeric ids where a name is unknown); ``None`` in a
            desired tree until the host's default owner is known.
        size: content length in bytes for files, else ``None``.
        digest: ``"sha256:<hex>"`` of the content for files, else ``None``.
        target: link target for symlinks (surrogateescape-decoded), else ``None``.
    """

    path: str
    type: str
    mode: str | None = None
    owner: str | None = None
    size: int | None = None
    digest: str | None = None
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the entry as a JSON-ready dict without ``None`` fields."""
        return {k: getattr(self, k) for k in _FIELDS if getattr(self, k) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """Build an entry from :meth:`to_json` output (unknown keys are ignored)."""
        fields: dict[str, Any] = {k: data.get(k) for k in _FIELDS}
        return cls(**fields)


_FIELDS = ("path", "type", "mode", "owner", "size", "digest", "target")


def sha256_digest(data: bytes) -> str:
    """Return ``"sha256:<hex>"`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Manifest:
    """An immutable set of entries keyed by path, iterated in path order.

    Args:
        entries: the entries; a duplicate path raises ``ValueError``.
    """

    __slots__ = ("_by_path",)

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        by_path: dict[str, Entry] = {}
        for entry in entries:
            if entry.path in by_path:
                raise ValueError(f"duplicate path in manifest: {entry.path!r}")
            by_path[entry.path] = entry
        self._by_path = dict(sorted(by_path.items(), key=lambda kv: _sort_key(kv[0])))

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._by_path.values())

    def __len__(self) -> int:
        return len(self._by_path)

    def __contains__(self, path: object) -> bool:
        return path in self._by_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Manifest) and self._by_path == other._by_path

    def get(self, path: str) -> Entry | None:
        """Return the entry at ``path`` or ``None``."""
        return self._by_path.get(path)

    def paths(self) -> list[str]:
        """Return every path in sorted order."""
        return list(self._by_path)

    def with_default_owner(self, owner: str) -> Manifest:
        """Return a copy where entries without an owner get ``owner`` (``"user:group"``)."""
        return Manifest(e if e.owner else replace(e, owner=owner) for e in self)

    def to_json(self) -> list[dict[str, Any]]:
        """Return the manifest as a JSON-ready list of entry dicts, in path order."""
        return [e.to_json() for e in self]

    @classmethod
    def from_json(cls, data: Iterable[Mapping[str, Any]]) -> Manifest:
        """Build a manifest from :meth:`to_json` output."""
        return cls(Entry.from_json(d) for d in data)

    def digest(self) -> str:
        """Return a sha256 digest of the canonical JSON form; equal manifests, equal digests
        (the host computes the same one: :func:`fleetctl.protocol.manifest_digest`)."""
        return manifest_digest(self.to_json())


# Sorted by the on-disk bytes so the order is the same on every machine and locale, and a
# parent directory always sorts before its children; the host sorts the same way.
_sort_key = path_sort_key
