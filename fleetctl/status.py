"""``fleetctl status``: the fleet at a glance, from the releases and the runners' own records.

One read-only round trip per host (the host-side ``status`` op, hosts in parallel, one host's
failure never stops the others) gives:

- per host: the release ``current`` points to, and the blueprint commit its record names
  (``docs/provenance.md``);
- per agent, from ``<root>/state/<agent>/`` (``docs/runner.md``, Records): its last task (the
  ``runs/<task>/`` most recently written), that task's outcome from ``result.json`` (``pass``,
  ``gave-up``, ``denied``, ``refused``; ``running`` while there is none) and the verdict of its
  last attempt, its retries (attempts after the first), the escalations waiting for a person
  (files in the ``notify/`` spool, which the pager removes once delivered), and its prefix
  tokens per turn (median and last of the ledger's last 200 turns), and its standing denials
  (``standing-denials/``: a refused permission that holds every new task until a person clears
  it) with the command that clears each on the host.

- per host, what needs a person besides its agents: entries of ``releases/`` fleetctl did not
  make (foreign), a last ship that failed (the newest history line is ``failed``) or was
  killed before its switch (an attempt file no ship holds the lock for), a ship in progress
  (the lock held), each with its release id whole.

Exit codes (DESIGN.md §4): 0 nothing needs attention, 1 attention needed (an escalation
waiting, a standing denial, a last task that gave up, was denied or refused, a host with no
release, foreign entries, a failed or killed last ship, a ship in progress), 2 a host, or an
agent's records, could not be read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK
from fleetctl.releases import ForeignEntry, HistoryEntry, history_entry

SCHEMA_VERSION = 1
ATTENTION_OUTCOMES = ("gave-up", "denied", "refused")
"""Outcomes of a last task that need a person."""


@dataclass(slots=True)
class AgentStatus:
    """One agent as its runner's records say.

    Attributes:
        host, agent, role: who.
        last_task: the id of the last task, or ``None`` (no task yet).
        outcome: ``pass``, ``gave-up``, ``denied``, ``refused`` or ``running`` (no result yet).
        verdict: the last attempt's verdict (``pass``, ``fail``, ``denied``, ``interrupted``).
        attempts: attempts of the last task; ``retries`` is ``attempts - 1`` (0 when none).
        failed_verifications: of the last task, from its result.
        escalations: escalations waiting in the notify spool (count); ``escalation_list``
            describes the first 20 (``task, kind, time, reason, via``).
        turns: ledger turns; ``prefix_median`` and ``prefix_last``: prefix tokens per turn
            over the last 200 turns, ``None`` without turns.
        standing_denials: the runner's standing denials, oldest first: ``permission``,
            ``since`` (ISO time), ``task``, ``run``, ``what`` and ``clear`` (the command a
            person runs on the host to clear it).
        errors: records that could not be read (path: error).
        read: whether the host's records of this agent were read at all (``False`` when the
            host could not be read).
        unread: the parts of them that could not be read: ``runs`` (the last task),
            ``notify`` (escalations), ``ledger`` (turns), ``standing-denials``. What was not
            read is ``None`` in the JSON and "not read" in the text, never "none".
    """

    host: str
    agent: str
    role: str
    state_exists: bool = False
    last_task: str | None = None
    outcome: str | None = None
    verdict: str | None = None
    attempts: int = 0
    failed_verifications: int | None = None
    reason: str | None = None
    escalations: int = 0
    escalation_list: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    prefix_median: float | None = None
    prefix_last: int | float | None = None
    standing_denials: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    read: bool = False
    unread: list[str] = field(default_factory=list)

    def known(self, part: str) -> bool:
        """Whether ``part`` (``runs``, ``notify``, ``ledger``, ``standing-denials``) was read."""
        return self.read and part not in self.unread

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)

    @property
    def attention(self) -> bool:
        return (bool(self.escalations) or bool(self.standing_denials)
                or self.outcome in ATTENTION_OUTCOMES)

    def to_json(self) -> dict[str, Any]:
        """The agent as JSON; a count or flag of a part not read is ``null``, never 0."""
        return {"host": self.host, "agent": self.agent, "role": self.role,
                "read": self.read, "unread": self.unread,
                "state_exists": self.state_exists if self.read else None,
                "last_task": self.last_task,
                "outcome": self.outcome, "verdict": self.verdict, "attempts": self.attempts,
                "retries": self.retries, "failed_verifications": self.failed_verifications,
                "reason": self.reason,
                "escalations_waiting": self.escalations if self.known("notify") else None,
                "escalations": self.escalation_list,
                "turns": self.turns if self.known("ledger") else None,
                "prefix_tokens_per_turn": {"median": self.prefix_median,
                                           "last": self.prefix_last},
                "standing_denials": self.standing_denials,
                "attention": self.attention or (None if self.unread or not self.read
                                                else False),
                "errors": self.errors}


@dataclass(slots=True)
class HostStatus:
    """One host: ``status`` ``ok`` or ``error`` (could not be read), its release and commit.

    Attributes:
        host: the inventory name.
        status: ``ok`` (read) or ``error`` (could not be read: ``error`` says why).
        release, commit, shipped_by, shipped_at: the release in use and its record's
            provenance; ``release`` ``None`` when none is in use.
        foreign: the entries of ``releases/`` fleetctl did not make (never counted, followed
            or removed): their names (as the host sent them) and reasons.
        failed_ship: the newest line of the host's history when it is a failed ship (no later
            ship or rollback settled it), or ``None``.
        interrupted: the ships killed before their switch (an attempt file left, no ship
            holding the lock), as the history line the next ship will write for each.
        ship_in_progress: the process holding the host's ship lock (``pid N``) while it was
            read, or ``None``.
        errors: the host's own records that could not be read (``PATH: error``: the history,
            the state directory): whether its last ship failed is then not known (exit 2).
        agents: each agent's runner records.
    """

    host: str
    status: str = "ok"
    error: str | None = None
    release: str | None = None
    commit: str | None = None
    shipped_by: str | None = None
    shipped_at: str | None = None
    foreign: list[ForeignEntry] = field(default_factory=list)
    failed_ship: HistoryEntry | None = None
    interrupted: list[HistoryEntry] = field(default_factory=list)
    ship_in_progress: str | None = None
    errors: list[str] = field(default_factory=list)
    agents: list[AgentStatus] = field(default_factory=list)

    @property
    def attention(self) -> bool:
        """Whether the host itself needs a person: no release in use, foreign entries in
        ``releases/``, a last ship that failed or was killed, a ship in progress."""
        return (self.release is None or bool(self.foreign) or self.failed_ship is not None
                or bool(self.interrupted) or self.ship_in_progress is not None)

    def to_json(self) -> dict[str, Any]:
        read = self.status != "error"
        return {"host": self.host, "status": self.status, "error": self.error,
                "release": self.release, "commit": self.commit, "shipped_by": self.shipped_by,
                "shipped_at": self.shipped_at,
                "attention": self.attention if read else None,
                "foreign": [f.to_json() for f in self.foreign] if read else None,
                "failed_ship": self.failed_ship.to_json() if self.failed_ship else None,
                "interrupted_ships": [e.to_json() for e in self.interrupted] if read else None,
                "ship_in_progress": self.ship_in_progress, "errors": self.errors,
                "agents": [a.to_json() for a in self.agents]}


@dataclass(slots=True)
class FleetStatus:
    hosts: list[HostStatus]

    @property
    def exit_code(self) -> int:
        """2 when a host, its history or an agent's records could not be read, 1 when
        something needs a person, else 0."""
        if any(h.status == "error" or h.errors or any(a.errors for a in h.agents)
               for h in self.hosts):
            return EXIT_ERROR
        if any(h.attention or any(a.attention for a in h.agents) for h in self.hosts):
            return EXIT_FINDINGS
        return EXIT_OK


def apply_events(status: HostStatus, events: list[dict[str, Any]]) -> None:
    """Fill ``status`` from the ``status`` op's events (a pure parser: recorded events in
    tests)."""
    by_name = {a.agent: a for a in status.agents}
    for e in events:
        if e.get("t") == "release":
            status.release = e.get("current")
            _host_story(status, e)
            meta = e.get("meta") or {}
            source = meta.get("source")
            status.commit = source.get("commit") if isinstance(source, dict) else None
            status.shipped_by = meta.get("shipped_by")
            status.shipped_at = meta.get("created")
        elif e.get("t") == "agent-status" and e.get("agent") in by_name:
            a = by_name[e["agent"]]
            a.read = True
            a.unread = [str(u) for u in e.get("unread") or []]
            a.state_exists = bool(e.get("state_exists"))
            a.escalations = int(e.get("escalations") or 0)
            a.escalation_list = list(e.get("escalation_list") or [])
            a.turns = int(e.get("turns") or 0)
            totals = [t for t in e.get("prefix_totals") or [] if isinstance(t, (int, float))]
            a.prefix_median = statistics.median(totals) if totals else None
            a.prefix_last = totals[-1] if totals else None
            a.errors = list(e.get("errors") or [])
            a.standing_denials = [d for d in e.get("standing_denials") or []
                                  if isinstance(d, dict)]
            last = e.get("last_task")
            if isinstance(last, dict):
                a.last_task = last.get("task")
                result = last.get("result") if isinstance(last.get("result"), dict) else None
                a.verdict = last.get("last_verdict")
                if result is not None:
                    a.outcome = result.get("outcome")
                    a.attempts = int(result.get("attempts") or 0)
                    a.failed_verifications = result.get("failed_verifications")
                    a.reason = result.get("reason")
                else:
                    a.outcome = "running"
                    a.attempts = int(last.get("attempts_recorded") or 0)


def _host_story(status: HostStatus, event: dict[str, Any]) -> None:
    """The foreign entries of ``releases/``, a failed or killed last ship and a ship in
    progress, from the ``status`` op's ``release`` event, into ``status``."""
    for f in event.get("foreign") or []:
        if isinstance(f, dict):
            name = f.get("name")
            reason = f.get("reason")
            status.foreign.append(ForeignEntry(name if isinstance(name, str) else repr(name),
                                               "foreign", reason if isinstance(reason, str)
                                               else None))
    failed = history_entry(status.host, event.get("failed"))
    status.failed_ship = failed if failed is not None and failed.kind == "failed" else None
    status.interrupted = [e for e in (history_entry(status.host, line)
                                      for line in event.get("interrupted") or [])
                          if e is not None]
    holder = event.get("ship_in_progress")
    status.ship_in_progress = holder if isinstance(holder, str) and holder else None
    status.errors = [str(e) for e in event.get("errors") or []]


def _read_host(host: Any, status: HostStatus) -> None:
    from fleetctl.hostops import run_op

    events = run_op(host, {"op": "status", "agents": [a.agent for a in status.agents]},
                    "status-end")
    apply_events(status, events[:-1])


def fleet_status(hosts: list[Any], parallel: int = 8) -> FleetStatus:
    """Read every selected host's release and runner records (read only), ``parallel`` at once.

    A host that cannot be reached or read is ``error`` (with the message); the others are
    still read.
    """
    from fleetctl.results import HostResult
    from fleetctl.ship import run_hosts

    out = {h.name: HostStatus(h.name, agents=[AgentStatus(h.name, a.name, a.role)
                                              for a in h.agents]) for h in hosts}

    def work(host: Any) -> HostResult:
        _read_host(host, out[host.name])
        return HostResult(host.name, "in-sync")

    for r in run_hosts(hosts, work, parallel):
        if r.status == "error":
            out[r.host].status, out[r.host].error = "error", r.error
    return FleetStatus([out[h.name] for h in hosts])
