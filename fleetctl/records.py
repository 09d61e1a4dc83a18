"""JSON records of core types that more than one document carries.

A change (:class:`fleetctl.drift.Change`) is one record in the drift and ship document
(``docs/json.md``) and in the nightly report, so both build it here, below the renderers and the
report alike. A credential file's record carries its digest alone: never content, never size.
"""

from __future__ import annotations

from typing import Any

from fleetctl.credentials import is_credential_path
from fleetctl.drift import Change
from fleetctl.manifest import Entry
from fleetctl.names import escape_name


def entry_json(entry: Entry | None) -> dict[str, Any] | None:
    """The before/after attributes of an entry: type, mode, owner, size, digest or target.

    A credential file carries no size: its digest alone stands for it.
    """
    if entry is None:
        return None
    data = entry.to_json()
    data.pop("path", None)
    if is_credential_path(entry.path):
        data.pop("size", None)
    if "target" in data:
        data["target"], escaped = escape_name(data["target"])
        if escaped:
            data["target_escaped"] = True
    return data


def change_json(change: Change) -> dict[str, Any]:
    """One change as a JSON record (``before`` is live, ``after`` is desired)."""
    path, escaped = escape_name(change.path)
    record: dict[str, Any] = {"path": path}
    if escaped:
        record["path_escaped"] = True
    record.update({
        "change": change.change,
        "origin": change.origin,
        # A credential file: only ever a digest, never its content or size.
        "secret": is_credential_path(change.path),
        "before": entry_json(change.live),
        "after": entry_json(change.desired),
        "shipped": entry_json(change.shipped),
    })
    return record
