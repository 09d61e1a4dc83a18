"""The roster: every agent of the fleet, where it runs, and how to reach other hosts.

fleetctl renders one ``team.json`` per host into the release (``<release>/runner/team.json``)::

    {"schema_version": 1, "host": "alpha",
     "agents": {"engineer": {"host": "alpha", "role": "engineer"}, ...every agent...},
     "hosts": {"beta": {"relay": true}},
     "relay": {"beta": {"address": "10.0.0.2", "port": 22, "login": "fleet-relay",
                        "root": "/srv/fleet", "key": "<root>/credentials/relay/beta.key",
                        "known_hosts": "<root>/credentials/relay/known_hosts"}}}

``relay`` holds only the hosts this host has a relay key to. A hand-off's ``--to`` is resolved
by :meth:`Roster.resolve`: an agent's name first, then a role (a role with more than one agent
is ambiguous and refused, naming them). Standard library only; no side effects on import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROSTER_FILE = "team.json"
"""The roster's name in ``<release>/runner/``."""


class RosterError(Exception):
    """The roster cannot be read, or a name does not resolve (the text says which)."""


@dataclass(frozen=True, slots=True)
class RosterAgent:
    """One agent of the fleet: its name, host and role."""

    name: str
    host: str
    role: str | None


@dataclass(frozen=True, slots=True)
class RelayEntry:
    """How this host reaches another host's relay (fields as in ``team.json``)."""

    host: str
    address: str
    port: int
    login: str
    root: str
    key: str
    known_hosts: str


@dataclass(frozen=True, slots=True)
class Roster:
    """The fleet as one host sees it (module docstring)."""

    host: str
    agents: dict[str, RosterAgent] = field(default_factory=dict)
    relays: dict[str, RelayEntry] = field(default_factory=dict)
    relay_hosts: dict[str, bool] = field(default_factory=dict)

    def resolve(self, to: str) -> RosterAgent:
        """The agent ``to`` names: an agent's name, else a role held by exactly one agent.

        Raises:
            RosterError: no such agent or role, or a role more than one agent holds.
        """
        if to in self.agents:
            return self.agents[to]
        holders = sorted(a.name for a in self.agents.values() if a.role == to)
        if len(holders) == 1:
            return self.agents[holders[0]]
        if holders:
            raise RosterError(f"--to {to}: the role {to} is held by {len(holders)} agents ("
                              + ", ".join(holders) + "): name one of them")
        known = ", ".join(sorted(self.agents)) or "(none)"
        raise RosterError(f"--to {to}: no agent or role of that name in the fleet (agents: "
                          f"{known})")


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise RosterError(f"{where}: required, a non-empty string")
    return value


def parse_roster(obj: Any, where: str = "team.json") -> Roster:
    """A roster from ``team.json``'s parsed value.

    Raises:
        RosterError: a key missing or of the wrong type (named with ``where``).
    """
    if not isinstance(obj, dict):
        raise RosterError(f"{where}: not a JSON object")
    if obj.get("schema_version") != 1:
        raise RosterError(f"{where}: schema_version: must be 1")
    host = _str(obj.get("host"), f"{where}: host")
    agents_raw = obj.get("agents")
    if not isinstance(agents_raw, dict):
        raise RosterError(f"{where}: agents: required, an object of agent name to "
                          '{"host", "role"}')
    agents = {}
    for name, entry in agents_raw.items():
        if not isinstance(entry, dict):
            raise RosterError(f"{where}: agents.{name}: must be an object")
        role = entry.get("role")
        agents[name] = RosterAgent(name=name, host=_str(entry.get("host"),
                                                        f"{where}: agents.{name}.host"),
                                   role=role if isinstance(role, str) else None)
    hosts_raw = obj.get("hosts") or {}
    relay_hosts = {str(k): bool(isinstance(v, dict) and v.get("relay"))
                   for k, v in hosts_raw.items()} if isinstance(hosts_raw, dict) else {}
    relays = {}
    relay_raw = obj.get("relay") or {}
    if not isinstance(relay_raw, dict):
        raise RosterError(f"{where}: relay: must be an object of host name to connection data")
    for name, entry in relay_raw.items():
        w = f"{where}: relay.{name}"
        if not isinstance(entry, dict):
            raise RosterError(f"{w}: must be an object")
        port = entry.get("port", 22)
        if isinstance(port, bool) or not isinstance(port, int):
            raise RosterError(f"{w}.port: must be a whole number")
        relays[name] = RelayEntry(host=name, address=_str(entry.get("address"), f"{w}.address"),
                                  port=port, login=_str(entry.get("login"), f"{w}.login"),
                                  root=_str(entry.get("root"), f"{w}.root"),
                                  key=_str(entry.get("key"), f"{w}.key"),
                                  known_hosts=_str(entry.get("known_hosts"),
                                                   f"{w}.known_hosts"))
    return Roster(host=host, agents=agents, relays=relays, relay_hosts=relay_hosts)


def load_roster(path: Path) -> Roster:
    """Read ``team.json``.

    Raises:
        RosterError: it cannot be read, is not JSON, or breaks the shape (the text names the
            file and key).
    """
    try:
        obj = json.loads(Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RosterError(f"{path}: cannot read the roster: {exc}") from None
    return parse_roster(obj, str(path))
