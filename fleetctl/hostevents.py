"""The events of the host program, decoded into types on the client.

The host is not trusted: a line that is not a JSON object with a known shape, or a path that
is not a plain relative path, is refused (:class:`BadEvent`) before anything uses it. Events of
the scan and of a ship get a dataclass each; the events of the short read-only operations
(``ledger``, ``content``, ``release``...) stay :class:`Other`, whose pure parsers live beside
their commands (:mod:`fleetctl.releases`, :mod:`fleetctl.status`, :mod:`fleetctl.tokens.live`).
An ``error`` event is never yielded: :func:`error_from_event` turns it into the exception the
CLI maps to an exit code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl import protocol as p
from fleetctl.errors import HostError, PermissionDenied, ShipRefused
from fleetctl.manifest import Entry
from fleetctl.names import printable, show_name, valid_tree_path


class BadEvent(ValueError):
    """An output line of the host program that is not a well-formed event."""


@dataclass(frozen=True, slots=True)
class HostEvent:
    """One event: its type ``t`` and the fields as sent (``raw``, without ``t``)."""

    t: str
    raw: dict[str, Any] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The event as the host sent it, ``t`` included."""
        return {"t": self.t, **self.raw}


@dataclass(frozen=True, slots=True)
class Hello(HostEvent):
    """The account the program runs as (the default owner of managed entries)."""

    user: str = ""
    group: str = ""


@dataclass(frozen=True, slots=True)
class StateEvent(HostEvent):
    """The layout under the root; see :class:`fleetctl.livestate.LiveState` for the fields."""


@dataclass(frozen=True, slots=True)
class EntryEvent(HostEvent):
    """One manifest entry: of the live tree (``t`` ``entry``) or of the shipped record."""

    entry: Entry | None = None


@dataclass(frozen=True, slots=True)
class UnreadableEvent(HostEvent):
    """A node the scan could not read: its path and the host's reason."""

    path: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class WarningEvent(HostEvent):
    """Something the host noticed and worked around."""

    message: str = ""


@dataclass(frozen=True, slots=True)
class Step(HostEvent):
    """A step of a ship or rollback began (``protocol.STEPS``)."""

    name: str = ""


@dataclass(frozen=True, slots=True)
class Done(HostEvent):
    """The operation finished: the release now in use (``None``: unchanged) and what went."""

    release: str | None = None
    pruned: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Other(HostEvent):
    """Any other event (units, accounts, root, locked, prepared, account, services, scan-end,
    and the events of the read-only operations): read through ``raw``."""


def _str(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise BadEvent(f"event field {key!r} is not a string: {str(value)[:200]!r}")
    return value


def _path(raw: dict[str, Any]) -> str:
    path = raw.get("path")
    if not valid_tree_path(path):
        # A name that climbs out or is not relative never reaches the comparison, a diff or
        # backport.
        raise BadEvent(f"it sent a path that is not a plain relative path: {str(path)[:200]!r}")
    return str(path)


def _entry(t: str, raw: dict[str, Any]) -> HostEvent:
    _path(raw)
    return EntryEvent(t, raw, Entry.from_json(raw))


def _done(t: str, raw: dict[str, Any]) -> HostEvent:
    release = raw.get("release")
    return Done(t, raw, release if isinstance(release, str) else None,
                tuple(raw.get("pruned") or ()))


_DECODERS: dict[str, Callable[[str, dict[str, Any]], HostEvent]] = {
    p.HELLO: lambda t, raw: Hello(t, raw, _str(raw, "user"), _str(raw, "group")),
    p.STATE: StateEvent,
    p.ENTRY: _entry,
    p.SHIPPED: _entry,
    p.UNREADABLE: lambda t, raw: UnreadableEvent(t, raw, _path(raw), str(raw.get("error"))),
    p.WARNING: lambda t, raw: WarningEvent(t, raw, str(raw.get("message"))),
    p.STEP: lambda t, raw: Step(t, raw, _str(raw, "name")),
    p.DONE: _done,
}


def decode_event(line: bytes) -> HostEvent | dict[str, Any]:
    """Decode one output line: a typed event, or the raw dict of an ``error`` event.

    Raises:
        BadEvent: not a JSON object with a string ``t``, or a field of the wrong shape.
    """
    try:
        obj = json.loads(line)
    except ValueError:
        raise BadEvent(f"unexpected output: {line[:200]!r}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise BadEvent(f"unexpected output: {line[:200]!r}")
    t = obj.pop("t")
    if t == p.ERROR:
        return obj
    decoder = _DECODERS.get(t)
    return decoder(t, obj) if decoder is not None else Other(t, obj)


# The hint of a host's error in a step before the switch: it holds while the host had a release.
PREVIOUS_IN_USE = "the previous release is still in use"


def error_from_event(label: str, event: dict[str, Any]) -> Exception:
    """Map a host-side error event to the exception type the CLI turns into an exit code.

    An event's ``items`` (``[[path, what], ...]``: every path the error is about) follow the
    message one a line, each path in the one escape form (``show_name``) and each detail
    escaped (``printable``), so none can pass for another line.
    """
    kind = event.get("kind")
    where = f" ({event['path']})" if event.get("path") else ""
    message = f"{label}: {event.get('step')}: {event.get('message')}{where}"
    if kind == p.KIND_PERMISSION:
        message += "; stopped, nothing was retried"
    items = event.get("items")
    if isinstance(items, list):
        message += "".join(f"\n  {show_name(str(item[0]))}: {printable(str(item[1]))}"
                           if isinstance(item, list) and len(item) == 2
                           else f"\n  {printable(str(item))}" for item in items)
    if kind in p.REFUSALS:
        return ShipRefused(message, step=event.get("step"))
    if kind == p.KIND_PERMISSION:
        return PermissionDenied(message, hint=PREVIOUS_IN_USE,
                                step=event.get("step"))
    return HostError(message, hint=PREVIOUS_IN_USE
                     if event.get("step") not in (None, "scan", "lock") else None,
                     step=event.get("step"))
