"""``fleetctl tokens --live``: what the runners' ledgers on the hosts say was really sent.

Each runner appends one JSON line per model turn to ``<root>/state/<agent>/ledger.jsonl``
(``blueprint/runner/fleet_runner/ledger.py``). This module reads those files from every host
that has a selected agent, with the host-side program's read-only ``ledgers`` op (one round
trip per host, the same transports as drift, hosts in parallel, one host's failure never stops
the others), and summarises them per agent: turns, median and p95 prefix tokens, the model's
reported usage per turn, the counter the runner used, and the CLIs and MCP tools the role
declares against those its turns actually called (the lines' ``calls`` and ``tool_calls``),
naming the dead weight, declared but never called, with its prefix tokens
(:mod:`fleetctl.tokens.deadweight`). Lines of a runner that does not record calls make the
calls "not recorded", never "never called".

A malformed complete line is counted and quoted, never fatal. A last line without its newline
is a line the runner is writing right now: the host skips it and it is counted as ``partial``,
not malformed. A missing ledger (an agent that has not run a turn yet) is reported and is not
an error. An unreadable ledger or a host that cannot be read makes the report incomplete:
exit 2. There is no live budget, so never exit 1.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetctl.errors import EXIT_ERROR, FleetctlError, InputError
from fleetctl.inventory import Host, load_inventory
from fleetctl.results import HostResult
from fleetctl.session import open_session
from fleetctl.tokens.deadweight import Declared, call_counts_problem, summarise_calls

SCHEMA_VERSION = 1
MALFORMED_QUOTED = 3
"""How many malformed lines per agent are quoted in the report (all are counted)."""
COUNTER_NOTES = {
    "bytes/4-estimate": "UTF-8 bytes / 4, rounded up: an estimate, not a count",
}
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
              "cache_creation_input_tokens")


def normalise_since(text: str) -> str:
    """An ISO 8601 time as the ledger writes it (UTC, milliseconds, ``Z``); naive means UTC.

    Raises:
        InputError: not an ISO 8601 time.
    """
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InputError(f"--since {text!r}: not an ISO 8601 time",
                         hint="e.g. 2026-11-30T01:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{when.microsecond // 1000:03d}Z"


def percentile(values: list[int], pct: float) -> int | None:
    """Nearest-rank percentile: the smallest value with at least ``pct``% of values <= it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


@dataclass
class Malformed:
    """A ledger line that is not a usable record: its line number (in what was read) and why."""

    number: int
    reason: str
    line: str


@dataclass
class AgentLedger:
    """One agent's ledger as read from its host, and its summary.

    ``status``: ``ok`` (read), ``missing`` (no ledger yet), ``unreadable`` (the host could not
    read it), ``host-error`` (the host could not be reached or failed). ``lines`` counts the
    complete lines read (records and malformed ones); ``partial`` the last lines skipped because
    they were still being written (no newline yet: 0 or 1).
    """

    host: str
    agent: str
    role: str
    declared: Declared = field(default_factory=Declared)
    status: str = "ok"
    error: str | None = None
    path: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)
    lines: int = 0
    partial: int = 0
    harness_tokens: int | None = None
    harness_note: str = ""

    def add_line(self, line: str) -> None:
        self.lines += 1
        line = line.encode("utf-8", "replace").decode("utf-8")  # a stray byte: quoted as "?"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            self.malformed.append(Malformed(self.lines, f"not JSON: {exc.msg}", line[:200]))
            return
        reason = _record_problem(record)
        if reason:
            self.malformed.append(Malformed(self.lines, reason, line[:200]))
            return
        self.records.append(record)

    @property
    def incomplete(self) -> bool:
        return self.status in ("unreadable", "host-error")

    def summary(self) -> dict[str, Any]:
        recs = self.records
        prefixes = [_prefix_total(r) for r in recs]
        usage = [r["usage"] for r in recs if isinstance(r.get("usage"), dict)]
        per_turn: dict[str, float] = {}
        totals: dict[str, int] = {}
        for key in USAGE_KEYS:
            values = [u[key] for u in usage if isinstance(u.get(key), (int, float))
                      and not isinstance(u.get(key), bool)]
            if values:
                totals[key] = int(sum(values))
                per_turn[key] = round(sum(values) / len(values), 1)
        counters = sorted({str(r.get("token_counter")) for r in recs})
        components: dict[str, list[int]] = {}
        for r in recs:
            for name, value in (r.get("prefix_tokens") or {}).items():
                components.setdefault(name, []).append(value)
        times = sorted(r["time"] for r in recs if isinstance(r.get("time"), str))
        return {
            "turns": len(recs),
            "tasks": len({r.get("task") for r in recs}),
            "interrupted": sum(1 for r in recs if r.get("interrupted") is True),
            "first": times[0] if times else None,
            "last": times[-1] if times else None,
            "prefix_tokens": {
                "median": _median(prefixes), "p95": percentile(prefixes, 95),
                "max": max(prefixes) if prefixes else None, "sum": sum(prefixes),
                "components_median": {k: _median(v) for k, v in components.items()},
            },
            "task_prompt_tokens_median": _median(
                [r["task_prompt_tokens"] for r in recs
                 if isinstance(r.get("task_prompt_tokens"), int)]),
            "token_counters": [{"name": c, "exact": any(r.get("tokens_exact") is True for r in recs
                                                        if str(r.get("token_counter")) == c),
                                "note": COUNTER_NOTES.get(c, "")} for c in counters],
            "usage": {"turns_with_usage": len(usage), "per_turn_mean": per_turn,
                      "totals": totals},
            "calls": summarise_calls(recs, self.declared),
            "provider": self._provider(recs, prefixes),
        }

    def _provider(self, recs: list[dict[str, Any]], prefixes: list[int]) -> dict[str, Any]:
        """The provider's prompt tokens per run beside fleetctl's count per model call."""
        figures = [p for p in (_provider_prompt(r) for r in recs) if p is not None]
        task = _median([r["task_prompt_tokens"] for r in recs
                        if isinstance(r.get("task_prompt_tokens"), int)])
        ours = None
        median = _median(prefixes)
        if median is not None and self.harness_tokens is not None:
            ours = round(median + self.harness_tokens + (task or 0))
        provider = _median(figures)
        diff = None if provider is None or ours is None else round(provider - ours)
        return {"turns": len(figures), "prompt_tokens_median": provider,
                "fleetctl_tokens_per_call": ours, "harness_tokens": self.harness_tokens,
                "harness_note": self.harness_note, "difference_tokens": diff,
                "difference_pct": None if diff is None or not ours
                else round(100.0 * diff / ours, 1)}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host, "agent": self.agent, "role": self.role, "status": self.status,
            "error": self.error, "path": self.path, "lines": self.lines,
            "partial": self.partial,
            "malformed": {"count": len(self.malformed),
                          "examples": [{"line_number": m.number, "reason": m.reason,
                                        "line": m.line}
                                       for m in self.malformed[:MALFORMED_QUOTED]]},
        }
        out.update(self.summary())
        return out


def _provider_prompt(record: dict[str, Any]) -> int | None:
    """The provider's prompt tokens of a run: the ledger's ``provider_usage`` (runners since
    issue 12), else the same sum made from its verbatim ``usage`` (input + cache creation +
    cache read, as ``fleet_runner.usage``)."""
    given = record.get("provider_usage")
    if isinstance(given, dict) and isinstance(given.get("prompt_tokens"), int):
        return given["prompt_tokens"]
    usage = record.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    return sum(v for k in ("input_tokens", "cache_creation_input_tokens",
                           "cache_read_input_tokens")
               if isinstance(v := usage.get(k), int) and not isinstance(v, bool))


def _prefix_total(record: dict[str, Any]) -> int:
    return int(sum(record["prefix_tokens"].values()))


def _median(values: list[int]) -> float | int | None:
    return statistics.median(values) if values else None


def _record_problem(record: Any) -> str | None:
    """Why a parsed line is not a usable ledger record, or ``None``."""
    if not isinstance(record, dict):
        return "not a JSON object"
    prefix = record.get("prefix_tokens")
    if not isinstance(prefix, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in prefix.values()):
        return "no prefix_tokens object of integers"
    usage = record.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return "usage is not an object"
    return call_counts_problem(record)


@dataclass
class LiveReport:
    """Every selected agent's ledger summary, and each host's outcome."""

    agents: list[AgentLedger]
    hosts: list[HostResult]
    since: str | None = None

    @property
    def exit_code(self) -> int:
        if any(h.status == "error" for h in self.hosts) or any(a.incomplete for a in self.agents):
            return EXIT_ERROR
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "command": "tokens --live",
            "exit_code": self.exit_code, "since": self.since,
            "hosts": [{"host": h.host, "status": h.status, "error": h.error, "hint": h.hint}
                      for h in self.hosts],
            "agents": [a.to_json() for a in self.agents],
        }


def read_host_ledgers(host: Host, ledgers: Iterable[AgentLedger], since: str | None) -> None:
    """Run the ``ledgers`` op on ``host`` and fill each agent's ledger from the events.

    Raises:
        HostError: unreachable host, host-side failure, timeout, or output that ended early.
    """
    by_name = {a.agent: a for a in ledgers}
    request: dict[str, Any] = {"op": "ledgers", "agents": list(by_name)}
    if since is not None:
        request["since"] = since
    with open_session(host, request) as session:
        for host_event in session.events():
            kind, event = host_event.t, host_event.raw
            agent = event.get("agent")
            mine = by_name.get(agent) if isinstance(agent, str) else None
            if kind == "ledger" and mine is not None:
                mine.add_line(event["line"])
            elif kind == "ledger-partial" and mine is not None:
                mine.partial += 1
            elif kind == "ledger-missing" and mine is not None:
                mine.status, mine.path = "missing", event.get("path")
            elif kind == "ledger-unreadable" and mine is not None:
                mine.status, mine.path = "unreadable", event.get("path")
                mine.error = f"{host.name}: {event.get('path')}: {event.get('error')}"
            elif kind == "ledger-end" and mine is not None:
                mine.path = mine.path or f"{host.root}/state/{mine.agent}/ledger.jsonl"
            elif kind == "ledgers-end":
                break
        else:
            raise session.broken("the ledgers ended early")
        session.finish()


def live_tokens(inventory: Path, blueprint: Path, agents: tuple[str, ...] = (),
                since: str | None = None, parallel: int = 8) -> LiveReport:
    """Read and summarise the ledgers of the selected agents (all when none) from their hosts.

    Args:
        inventory: the inventory file.
        blueprint: the blueprint directory (roles, skills, the runner's prefix builder).
        agents: agent names or ``HOST/AGENT``; default every agent.
        since: keep only turns that ended after this ISO 8601 time (no zone: UTC); default all.
        parallel: hosts read at once; default 8.

    The declared CLIs and MCP tools come from the blueprint (each declared MCP server is listed,
    started for real when it is a stdio server); one that cannot be listed is reported in the
    agent's ``calls`` and does not change the exit code.

    Raises:
        InputError: bad inventory, blueprint, agent name or ``since``.
    """
    from fleetctl.ship import run_hosts
    from fleetctl.tokens.audit import _select, load_roles
    from fleetctl.tokens.deadweight import declared_by_role

    blueprint = Path(blueprint)
    roles = load_roles(blueprint)
    inv = load_inventory(Path(inventory), set(roles))
    selected = _select(inv, agents)
    since_norm = normalise_since(since) if since is not None else None
    declared = declared_by_role(blueprint, roles, (a.role for _, a in selected))
    ledgers: list[AgentLedger] = []
    per_host: dict[str, list[AgentLedger]] = {}
    harness = {name: _harness_part(blueprint, roles[name])
               for name in dict.fromkeys(a.role for _, a in selected)}
    for host_name, agent in selected:
        entry = AgentLedger(host_name, agent.name, agent.role, declared[agent.role],
                            harness_tokens=harness[agent.role][0],
                            harness_note=harness[agent.role][1])
        ledgers.append(entry)
        per_host.setdefault(host_name, []).append(entry)
    hosts = [h for h in inv.hosts if h.name in per_host]
    lock = threading.Lock()

    def work(host: Host) -> HostResult:
        mine = per_host[host.name]
        try:
            read_host_ledgers(host, mine, since_norm)
        except Exception:
            with lock:
                for entry in mine:  # nothing half-read is summarised as if it were whole
                    entry.records.clear()
                    entry.malformed.clear()
                    entry.lines = entry.partial = 0
                    entry.status = "host-error"
            raise
        return HostResult(host.name, "ok")

    results = run_hosts(hosts, work, parallel)
    for result in results:
        if result.status != "ok":
            for entry in per_host[result.host]:
                entry.status, entry.error = "host-error", result.error
    return LiveReport(ledgers, results, since_norm)



def _harness_part(blueprint: Path, role: Any) -> tuple[int | None, str]:
    """What the harness adds to each model call of ``role`` (its profile's total, plus the
    provider's tool-use prompt when it has tools), or ``None`` and why not."""
    from fleetctl.tokencount.prefixmodule import load_prefix_module
    from fleetctl.tokens.roleharness import role_harness_part

    try:
        part = role_harness_part(blueprint, role)
    except FleetctlError as exc:
        return None, exc.message
    if part.name is None:
        return 0, "no harness (the role has no agent_command)"
    if part.profile is None:
        return None, part.missing or "no harness profile"
    extra = 0
    if part.profile.tools:
        try:
            extra = load_prefix_module(blueprint).tool_use_prompt(role.model).tokens or 0
        except FleetctlError:
            extra = 0
    return part.profile.total_tokens + extra, (
        f"{part.name} {part.profile.version} {part.toolset}: profile {part.profile.total_tokens:,}"
        + (f" + tool-use prompt {extra:,}" if extra else ""))
