"""The nightly report (``fleetctl report``): drift, the credentials audit and the token budgets of
every host in one document, compared with the nights before.

The run has three stages, each a plain function, none of which imports typer or rich:

1. :func:`collect` runs the three checks on the selected hosts (drift through
   :func:`fleetctl.ship.drift_host`, :func:`fleetctl.creds_audit.audit_credentials`,
   :func:`fleetctl.tokens.audit.audit_tokens`) and reads the runners' ledgers (the host-side
   ``ledgers`` op, read only) for the prefix-tokens chart. Every result becomes a
   :class:`Finding` with a stable identity ``(check, host, kind, subject)``: ``subject`` is the
   path for drift and for live credential findings, ``AGENT/CAPABILITY`` (or the agent) for a
   static credential rule, ``AGENT`` or ``AGENT/TOOL`` for a token budget. A check that could
   not run on a host is a :class:`CheckResult` with status ``error`` (exit 2), never a finding.
2. :func:`judge` compares with the previous night (``--history DIR``): each finding is ``new``,
   ``persisting`` (``since`` the first night it was seen, for ``nights`` nights) or, when it was
   there last night and the check ran cleanly tonight, ``resolved``; a finding of a check that
   could not run tonight keeps its history as ``unchecked``. It applies the allowlist (accepted
   findings stay in the report, marked, and do not fail; an entry past its expiry date accepts
   nothing and its findings fail again) and ``--fail-on``.
3. :func:`report_document` turns it into the JSON document (``docs/report.md``,
   ``docs/report.schema.json``); :mod:`fleetctl.cli.output.nightly` renders that document as
   Markdown, JUnit XML, HTML or text, so every format says the same thing.

Exit codes (DESIGN.md §4): 0 nothing fails, 1 a finding fails, 2 a check could not run on a host
(unreachable, incomplete scan, a token measurement that could not be made).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, InputError
from fleetctl.names import escape_name, printable, safe_text, show_name
from fleetctl.yamlfile import display_path, input_error, line_of, load_yaml

SCHEMA_VERSION = 1
COMMAND = "report"
CHECKS = ("drift", "creds", "tokens")

DRIFT_KINDS = ("pending", "hand-patch", "conflict", "unknown", "stale-checkout",
               "account-missing", "failed-ship", "foreign-entry")
"""Kinds of a drift finding: the origin of a changed path (DESIGN.md §2), a host whose commit
is behind or diverged from the source (``stale-checkout``), an agent account missing, a last
ship that failed or was killed before its switch (``failed-ship``), an entry of ``releases/``
fleetctl did not make (``foreign-entry``)."""
TOKENS_KINDS = ("budget_tokens", "max_tool_tokens", "max_tools", "growth", "server")
"""Kinds of a token-budget finding (:class:`fleetctl.tokens.audit.Finding`)."""

STATES = ("new", "persisting", "resolved", "unchecked")
SERIES_POINTS_MAX = 400
"""At most this many ledger turns per agent go into a document (evenly thinned, last kept)."""
HISTORY_KEEP = 90
"""Nights kept in ``--history DIR`` by default."""


def creds_kinds() -> tuple[str, ...]:
    """The credentials audit's rule ids, each a finding kind."""
    from fleetctl.creds_audit import RULES

    return tuple(RULES)


def all_kinds() -> tuple[str, ...]:
    """Every finding kind, drift's first."""
    return DRIFT_KINDS + creds_kinds() + TOKENS_KINDS


@dataclass(slots=True)
class Finding:
    """One finding of one check on one host.

    Attributes:
        check: ``drift``, ``creds`` or ``tokens``.
        host: the inventory name.
        kind: see :data:`DRIFT_KINDS`, the credential rule ids, :data:`TOKENS_KINDS`.
        subject: the path (relative to the managed root; escaped when not UTF-8) or the rule's
            subject (``AGENT/CAPABILITY``, ``AGENT``, ``AGENT/TOOL``, ``commit``).
        message: one line for people; names and digests only, never a secret.
        severity: ``high``, ``medium`` or ``low``.
        detail: check-specific data (drift: the change records), JSON-ready.
        state, since, nights: set by :func:`judge` (``since``: ISO time of the first night it
            was seen; ``nights``: nights in a row it was seen, tonight included).
        accepted: the allowlist entry that accepts it (live), or ``None``.
        expired: the allowlist entry that accepted it and is past its expiry date, or ``None``.
        fails: whether it makes the run fail (exit 1), under ``--fail-on``.
    """

    check: str
    host: str
    kind: str
    subject: str
    message: str
    severity: str = "medium"
    detail: dict[str, Any] = field(default_factory=dict)
    state: str = "new"
    since: str | None = None
    nights: int = 1
    accepted: dict[str, Any] | None = None
    expired: dict[str, Any] | None = None
    fails: bool = True

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The stable identity ``(check, host, kind, subject)``."""
        return (self.check, self.host, self.kind, self.subject)

    @property
    def id(self) -> str:
        """A short stable id of :attr:`key` (16 hex digits of its sha256), for anchors."""
        return finding_id(self.key)

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON record (documented in ``docs/report.md``)."""
        return {"id": self.id, "check": self.check, "host": self.host, "kind": self.kind,
                "subject": self.subject, "message": safe_text(self.message),
                "severity": self.severity, "state": self.state, "since": self.since,
                "nights": self.nights, "accepted": self.accepted, "expired": self.expired,
                "fails": self.fails, "detail": self.detail}


def finding_id(key: Iterable[str]) -> str:
    """16 hex digits of the sha256 of the identity fields joined by NUL."""
    return hashlib.sha256("\0".join(key).encode("utf-8", "surrogateescape")).hexdigest()[:16]


@dataclass(slots=True)
class CheckResult:
    """How one check went on one host: ``ok``, ``findings``, ``error`` (it could not run, or
    what it is about could not be read: exit 2) or ``skipped`` (nothing to check: tokens on a
    host without agents). ``error`` carries a one-line ``error``.

    ``not_checked``: the parts of a check that otherwise ran which could not be checked, one
    line each with its reason (a grant whose secret the run did not have); the check is then
    never shown as plainly ``ok`` or as a passing test case. ``unchecked_subjects``: the
    finding subjects those parts cover (the grant's credential paths for drift,
    ``AGENT/CAPABILITY`` for the credentials audit): last night's findings on them are carried
    as ``unchecked``, never ``resolved`` (not part of the document).
    """

    host: str
    check: str
    status: str
    error: str | None = None
    hint: str | None = None
    not_checked: list[str] = field(default_factory=list)
    unchecked_subjects: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "check": self.check, "status": self.status,
                "error": safe_text(self.error) if self.error else None,
                "hint": safe_text(self.hint) if self.hint else None,
                "not_checked": [safe_text(n) for n in self.not_checked]}


def settle_checks(checks: list[CheckResult]) -> list[CheckResult]:
    """The checks as they may be reported: a check whose subject could not be read is not
    checked, whatever it found offline (a pure function; returns new records).

    The token audit measures each agent's prefix from the blueprint, offline; what it says is
    about the host only when the host runs that blueprint, which drift tells. When drift could
    not run on a host (unreachable, host key refused, timed out), the host's ``tokens`` check
    becomes ``error`` naming why: an unreachable host's tokens column once said ``ok``. Its
    findings stay (they hold for the blueprint), and, as for any check that did not run, last
    night's findings of it are carried as ``unchecked``, never ``resolved``.
    """
    drift_down = {c.host: c for c in checks if c.check == "drift" and c.status == "error"}
    out = []
    for c in checks:
        down = drift_down.get(c.host)
        if c.check == "tokens" and down is not None and c.status in ("ok", "findings"):
            c = CheckResult(c.host, c.check, "error",
                            "not checked: the host could not be read (drift: "
                            f"{down.error or 'error'}), so what its agents run is not known",
                            down.hint, list(c.not_checked), list(c.unchecked_subjects))
        out.append(c)
    return out


@dataclass(slots=True)
class AgentSeries:
    """One agent's prefix tokens per turn from its runner's ledger.

    ``points``: ``(time, tokens)`` per turn, oldest first, at most :data:`SERIES_POINTS_MAX`;
    ``status``: as :class:`fleetctl.tokens.live.AgentLedger` (``ok``, ``missing``,
    ``unreadable``, ``host-error``).
    """

    host: str
    agent: str
    role: str
    status: str
    turns: int = 0
    median: float | None = None
    last: int | None = None
    points: list[tuple[str, int]] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "agent": self.agent, "role": self.role,
                "status": self.status, "turns": self.turns, "median_prefix_tokens": self.median,
                "last_prefix_tokens": self.last, "points": [list(p) for p in self.points],
                "error": safe_text(self.error) if self.error else None}


@dataclass(slots=True)
class NightlyReport:
    """Everything one run found, before and after :func:`judge`.

    Attributes:
        generated: when the run started, ISO 8601 UTC (``2026-12-01T02:00:00Z``).
        source: the blueprint checkout (``{"commit", "clean", "dirty"}``).
        hosts: per host: ``host, status`` (drift's), ``release, commit, identity, ancestry,
            ship_in_progress, unchecked_grants``.
        checks: one :class:`CheckResult` per host and check.
        findings: tonight's findings, in host then check order.
        resolved: last night's findings not seen tonight (state ``resolved``), and those of
            checks that could not run tonight (state ``unchecked``).
        agents: each agent's ledger series.
        nights: the history's nights, oldest first, tonight last: ``{"generated", "findings",
            "failing", "new", "by_check"}``.
        fail_on: the ``--fail-on`` words in force.
        allowlist: ``{"path", "entries", "unused", "expired"}`` or ``None``.
        previous: the ``generated`` time of the night compared with, or ``None``.
        runners: what the runners' own records say needs a person (:func:`runners_record`).
    """

    generated: str
    source: dict[str, Any] | None
    hosts: list[dict[str, Any]]
    checks: list[CheckResult]
    findings: list[Finding]
    resolved: list[Finding] = field(default_factory=list)
    agents: list[AgentSeries] = field(default_factory=list)
    nights: list[dict[str, Any]] = field(default_factory=list)
    fail_on: list[str] = field(default_factory=lambda: ["all"])
    allowlist: dict[str, Any] | None = None
    previous: str | None = None
    runners: dict[str, Any] = field(default_factory=lambda: runners_record(None))

    @property
    def exit_code(self) -> int:
        """2 when a check could not run on a host, else 1 when a finding fails, else 0."""
        if any(c.status == "error" for c in self.checks):
            return EXIT_ERROR
        return EXIT_FINDINGS if any(f.fails for f in self.findings) else EXIT_OK


# -- stage 1: collect ---------------------------------------------------------------------------


def now_utc(text: str | None = None) -> str:
    """The current time, or ``text`` (ISO 8601; no zone means UTC), as
    ``YYYY-MM-DDTHH:MM:SSZ``.

    Raises:
        InputError: ``text`` is not an ISO 8601 time.
    """
    if text is None:
        when = dt.datetime.now(dt.UTC)
    else:
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"--now {text!r}: not an ISO 8601 time",
                             hint="e.g. 2026-12-01T03:00:00Z") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drift_findings(result: Any) -> list[Finding]:
    """The findings of one host's drift result (:class:`fleetctl.results.HostResult`): one per
    path and origin (its change kinds together), one for a stale checkout, one per missing
    account."""
    from fleetctl.credentials import is_credential_path
    from fleetctl.records import change_json

    grouped: dict[tuple[str, str], list[Any]] = {}
    for change in result.changes:
        grouped.setdefault((change.path, change.origin), []).append(change)
    out = []
    for (path, origin), changes in grouped.items():
        shown, _ = escape_name(path)
        kinds = ", ".join(c.change for c in changes)
        secret = " (secret: digests only)" if is_credential_path(path) else ""
        out.append(Finding("drift", result.host, origin, shown,
                           f"{show_name(path)}: {kinds} ({origin}){secret}",
                           "low" if origin == "pending" else "high",
                           {"changes": [change_json(c) for c in changes]}))
    if result.ancestry is not None and result.ancestry.stale:
        out.append(Finding("drift", result.host, "stale-checkout", "commit",
                           f"the source is {result.ancestry.describe()}", "high",
                           {"ancestry": result.ancestry.to_json()}))
    for account in result.accounts:
        out.append(Finding("drift", result.host, "account-missing", safe_text(account),
                           printable(account), "medium"))
    return out + release_findings(result)


def release_findings(result: Any) -> list[Finding]:
    """What a host's ``releases/`` and history say needs a person, from its drift result: one
    finding per ship that failed last or was killed before its switch (subject: the release id
    it would have made, so the finding persists until a ship or rollback settles it), one per
    entry of ``releases/`` fleetctl did not make (subject ``releases/NAME``, escaped)."""
    from fleetctl.releases import history_entry

    out = []
    for line in getattr(result, "failed_ships", []):
        e = history_entry(result.host, line)
        if e is None or e.kind != "failed" or e.release is None:
            continue
        what = "was killed before its switch" if e.error == "interrupted" else \
            f"failed at step {e.step or '(unknown)'}"
        where = f" ({show_name(e.path)})" if e.path else ""
        out.append(Finding(
            "drift", result.host, "failed-ship", e.release,
            f"the last ship (release {e.release}, {e.time or 'time not recorded'}, by "
            f"{show_name(e.by or '(not recorded)')}) {what}: {printable(e.error or 'failed')}: "
            f"{printable(e.message or '')}{where}; it never became a release",
            "high", {"history": {k: safe_text(v) if isinstance(v, str) else v
                                 for k, v in e.to_json().items()}}))
    for f in getattr(result, "foreign", []):
        name = str(f.get("name"))
        reason = printable(str(f.get("reason") or "not made by fleetctl"))
        out.append(Finding(
            "drift", result.host, "foreign-entry", "releases/" + escape_name(name)[0],
            f"releases/{show_name(name)}: {reason}: fleetctl did not make it (never counted, "
            "followed or removed); move it out of releases/", "medium",
            {"name": escape_name(name)[0], "reason": reason}))
    return out


def creds_findings(audit: Any) -> list[Finding]:
    """The findings of one host's credentials audit (:class:`fleetctl.creds_audit.HostAudit`)."""
    out = []
    for f in audit.findings:
        subject = escape_name(f.path)[0] if f.path else \
            "/".join(x for x in (f.agent, f.capability) if x) or f.host
        out.append(Finding("creds", audit.host, f.rule, subject, printable(f.message),
                           f.severity, {"agent": f.agent, "capability": f.capability,
                                        "where": f.where}))
    return out


def tokens_findings(agent: Any) -> list[Finding]:
    """The findings of one agent's budget audit (:class:`fleetctl.tokens.audit.AgentReport`)."""
    out = []
    for f in agent.findings:
        subject = agent.agent if not f.subject or f.subject == agent.agent \
            else f"{agent.agent}/{f.subject}"
        out.append(Finding("tokens", agent.host, f.kind, subject, printable(f.message),
                           "medium", {"agent": agent.agent, "limit": f.limit,
                                      "actual": f.actual}))
    return out


def host_record(result: Any) -> dict[str, Any]:
    """What the report says about a host's release, from its drift result."""
    return {"host": result.host, "status": result.status, "release": result.release,
            "commit": result.commit, "identity": result.identity,
            "ancestry": result.ancestry.to_json() if result.ancestry else None,
            "ship_in_progress": result.in_progress,
            # Grants whose secret was not available: their files were compared with the
            # shipped record alone (docs/json.md, unchecked_grants). Never a value.
            "unchecked_grants": [{k: safe_text(v) if isinstance(v, str) else v
                                  for k, v in u.to_json().items()}
                                 for u in getattr(result, "unchecked", [])]}


def unchecked_grant_text(u: dict[str, Any]) -> str:
    """One grant whose secret was not available, as a part of drift not checked."""
    return printable(f"{u.get('agent')}/{u.get('capability')}: {u.get('source_name')}: "
                     f"{u.get('reason')}; its files were compared with the shipped record only")


def thin(points: list[tuple[str, int]], limit: int = SERIES_POINTS_MAX) -> list[tuple[str, int]]:
    """At most ``limit`` points, evenly spaced, the first and last kept."""
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def read_series(hosts: list[Any], parallel: int) -> list[AgentSeries]:
    """Every agent's prefix tokens per turn, from its ledger on its host (read only).

    A host that cannot be read gives its agents status ``host-error``; that is not an error of
    the report (drift already says the host could not be reached).
    """
    import statistics

    from fleetctl.results import HostResult
    from fleetctl.ship import run_hosts
    from fleetctl.tokens.live import AgentLedger, read_host_ledgers

    per_host = {h.name: [AgentLedger(h.name, a.name, a.role) for a in h.agents]
                for h in hosts if h.agents}
    lock = threading.Lock()

    def work(host: Any) -> HostResult:
        try:
            read_host_ledgers(host, per_host[host.name], None)
        except Exception:
            with lock:
                for entry in per_host[host.name]:
                    entry.records.clear()
                    entry.status = "host-error"
            raise
        return HostResult(host.name, "in-sync")

    results = run_hosts([h for h in hosts if h.name in per_host], work, parallel)
    errors = {r.host: r.error for r in results if r.status == "error"}
    out = []
    for ledgers in per_host.values():
        for entry in ledgers:
            points = [(r["time"], int(sum(r["prefix_tokens"].values()))) for r in entry.records
                      if isinstance(r.get("time"), str)]
            points.sort()
            totals = [p[1] for p in points]
            out.append(AgentSeries(
                entry.host, entry.agent, entry.role, entry.status, len(points),
                statistics.median(totals) if totals else None,
                totals[-1] if totals else None, thin(points),
                entry.error or errors.get(entry.host)))
    return out


def runners_record(status: Any) -> dict[str, Any]:
    """What the report says about the runners, from :func:`fleetctl.status.fleet_status`'s
    result (or ``None``: not read, ``--no-ledgers``); a pure function.

    ``{"read": bool, "agents": N read, "attention": [...], "errors": [...]}``: ``attention``
    lists the agents that need a person (a last task that gave up, was denied or refused, an
    escalation waiting, a standing denial) as ``{host, agent, role, last_task, outcome,
    reason, escalations_waiting, escalations, standing_denials}`` (the first 3 escalations:
    ``task, kind, reason``; standing denials counted); ``errors`` the records that could not be
    read, ``{host, agent, error}`` (``agent`` ``None`` for a whole host): never "nobody waits".
    """
    if status is None:
        return {"read": False, "agents": 0, "attention": [], "errors": []}
    attention, errors, read = [], [], 0
    for h in status.hosts:
        if h.status == "error":
            errors.append({"host": h.host, "agent": None,
                           "error": safe_text(h.error or "could not be read")})
            continue
        for a in h.agents:
            read += 1
            if a.errors:
                errors.append({"host": h.host, "agent": a.agent,
                               "error": safe_text("; ".join(a.errors))})
            if a.attention:
                attention.append({
                    "host": h.host, "agent": a.agent, "role": a.role,
                    "last_task": safe_text(a.last_task) if a.last_task else None,
                    "outcome": a.outcome, "reason": safe_text(a.reason) if a.reason else None,
                    "escalations_waiting": a.escalations,
                    "escalations": [{k: safe_text(str(e.get(k))) if e.get(k) is not None
                                     else None for k in ("task", "kind", "reason")}
                                    for e in a.escalation_list[:3]],
                    "standing_denials": len(a.standing_denials)})
    return {"read": True, "agents": read, "attention": attention, "errors": errors}


def collect(blueprint: Any, inventory: Any, hosts: list[Any], source: Any, parallel: int = 8,
            progress: Any = None, ledgers: bool = True,
            generated: str | None = None) -> NightlyReport:
    """Run drift, the credentials audit and the token budgets on ``hosts``; read the ledgers.

    Args:
        blueprint: the loaded :class:`fleetctl.blueprint.Blueprint`.
        inventory: the loaded :class:`fleetctl.inventory.Inventory`.
        hosts: the selected hosts, in report order.
        source: the blueprint checkout (:class:`fleetctl.source.SourceState`).
        parallel: hosts at once; default 8.
        progress: a :class:`fleetctl.results.Progress` for the drift scans, or ``None``.
        ledgers: read the runners' records: the ledgers for the prefix-tokens chart, and the
            last tasks and escalations for the agents that need a person; default yes.
        generated: the time the report is dated (:func:`now_utc`); default now.

    Every host is attempted by every check; a host or check that fails is a
    :class:`CheckResult` ``error`` and the rest go on.
    """
    from fleetctl.creds_audit import AuditOptions, audit_credentials
    from fleetctl.results import NoProgress
    from fleetctl.ship import drift_host, run_hosts

    generated = generated or now_utc()
    progress = progress or NoProgress()
    drift = run_hosts(hosts, lambda h: drift_host(blueprint, h, progress, source), parallel,
                      progress)
    creds = audit_credentials(blueprint, inventory, hosts, AuditOptions(parallel=parallel))
    checks: list[CheckResult] = []
    findings: dict[str, list[Finding]] = {h.name: [] for h in hosts}
    for r in drift:
        found = drift_findings(r)
        findings[r.host] += found
        error = r.status in ("error", "incomplete")
        message = r.error
        if r.status == "incomplete" and r.unreadable:
            message = (message or "") + "; unreadable: " + ", ".join(
                show_name(u.path) for u in r.unreadable[:5])
        checks.append(CheckResult(r.host, "drift", "error" if error else
                                  ("findings" if found else "ok"), message, r.hint,
                                  [unchecked_grant_text(u.to_json())
                                   for u in getattr(r, "unchecked", [])],
                                  [escape_name(p)[0] for u in getattr(r, "unchecked", [])
                                   for p in u.paths]))
    for a in creds.hosts:
        found = creds_findings(a)
        findings[a.host] += found
        error = a.status in ("error", "incomplete")
        message = a.error
        if a.unreadable:
            message = (message or "incomplete") + "; unreadable: " + ", ".join(
                show_name(p) for p, _ in a.unreadable[:5])
        checks.append(CheckResult(a.host, "creds", "error" if error else
                                  ("findings" if found else "ok"), message, a.hint,
                                  [printable(k.describe()) for k in a.skipped],
                                  [f"{k.agent}/{k.capability}" for k in a.skipped]))
    checks = settle_checks(checks + _tokens_checks(blueprint, inventory, hosts, findings))
    order = {c: i for i, c in enumerate(CHECKS)}
    checks.sort(key=lambda c: ([h.name for h in hosts].index(c.host), order[c.check]))
    return NightlyReport(
        generated=generated, source=source.to_json() if source is not None else None,
        hosts=[host_record(r) for r in drift], checks=checks,
        findings=[f for h in hosts for f in sorted(findings[h.name],
                                                   key=lambda f: (order[f.check], f.kind,
                                                                  f.subject))],
        agents=read_series(hosts, parallel) if ledgers else [],
        runners=_read_runners(hosts, parallel) if ledgers else runners_record(None))


def _read_runners(hosts: list[Any], parallel: int) -> dict[str, Any]:
    from fleetctl.status import fleet_status

    return runners_record(fleet_status([h for h in hosts if h.agents], parallel))


def _tokens_checks(blueprint: Any, inventory: Any, hosts: list[Any],
                   findings: dict[str, list[Finding]]) -> list[CheckResult]:
    from fleetctl.errors import FleetctlError
    from fleetctl.tokens.audit import TokensOptions, audit_tokens

    with_agents = [h for h in hosts if h.agents]
    checks = [CheckResult(h.name, "tokens", "skipped") for h in hosts if not h.agents]
    if not with_agents:
        return checks
    names = tuple(f"{h.name}/{a.name}" for h in with_agents for a in h.agents)
    try:
        report = audit_tokens(inventory.path, blueprint.root, TokensOptions(agents=names))
    except FleetctlError as exc:
        return checks + [CheckResult(h.name, "tokens", "error", exc.message, exc.hint)
                         for h in with_agents]
    except Exception as exc:  # noqa: BLE001 - the other checks' results are still reported
        return checks + [CheckResult(h.name, "tokens", "error",
                                     f"internal error: {exc.__class__.__name__}: {exc}")
                         for h in with_agents]
    for h in with_agents:
        agents = [a for a in report.agents if a.host == h.name]
        found = [f for a in agents for f in tokens_findings(a)]
        findings[h.name] += found
        bad = [a for a in agents if a.status == "incomplete"]
        if bad:
            checks.append(CheckResult(h.name, "tokens", "error",
                                      "incomplete (a lower bound): " + "; ".join(
                                          f"{a.agent}: {_incomplete_reason(a)}" for a in bad),
                                      "see `fleetctl tokens` (docs/tokens.md)"))
        else:
            checks.append(CheckResult(h.name, "tokens", "findings" if found else "ok"))
    return checks


def _incomplete_reason(agent: Any) -> str:
    """Why an agent's prefix could not be measured whole (``fleetctl tokens``' reasons)."""
    reasons = [f"MCP server {s.name} not measured" for s in agent.servers
               if not getattr(s, "measured", True)]
    if getattr(agent, "harness_missing", None):
        reasons.append(f"harness: {agent.harness_missing}")
    if getattr(agent, "counter_error", None):
        reasons.append(f"counter: {agent.counter_error}")
    return ", ".join(printable(r) for r in reasons) or "not measured"


# -- stage 2: judge -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acceptance:
    """One allowlist entry: a finding accepted until ``expires`` (a date, inclusive).

    ``host`` may be ``*`` (every host); ``check`` ``None`` matches every check; ``subject`` is
    the finding's path or subject (the file's ``path`` or ``subject`` key); ``kind`` the
    finding's kind (``kind``, or ``rule`` for a credentials rule id).
    ``where`` is ``FILE:LINE`` of the entry.
    """

    host: str
    kind: str
    subject: str
    reason: str
    expires: dt.date
    check: str | None = None
    where: str = ""

    def matches(self, f: Finding) -> bool:
        return ((self.host == "*" or self.host == f.host) and self.kind == f.kind
                and self.subject == f.subject and (self.check is None or self.check == f.check))

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "check": self.check, "kind": self.kind,
                "subject": self.subject, "reason": self.reason,
                "expires": self.expires.isoformat(), "where": self.where}


_ENTRY_KEYS = {"host", "check", "kind", "path", "rule", "subject", "reason", "expires"}
_DATE_HINT = "expires: YYYY-MM-DD, the last day the entry holds (UTC), e.g. expires: 2026-12-31"


def parse_expires(value: Any) -> dt.date:
    """The day an allowlist entry's ``expires`` names: a ``YYYY-MM-DD`` string, or the
    ``datetime.date`` PyYAML makes of an unquoted one.

    Raises:
        ValueError: anything else, its text saying what was found: a date and time (PyYAML's
            ``datetime``, with or without a zone: an acceptance ends with a day, in UTC), a
            number (``20261201``), yes/no, a string that is no day of the calendar
            (``2026-13-01``, ``2026-02-30``: :mod:`fleetctl.yamlfile` keeps those as written)
            or not a date at all (``yesterday``).
    """
    if isinstance(value, dt.datetime):
        zone = " with a time zone" if value.tzinfo is not None else ""
        raise ValueError(f"{value.isoformat(sep=' ')} is a date and time{zone}, not a day")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is yes/no to YAML, not a date")
    if isinstance(value, (int, float)):
        raise ValueError(f"{value} is a number to YAML, not a date")
    if not isinstance(value, str):
        raise ValueError(f"expected a date, got a {type(value).__name__}")
    text = value
    if text.strip() != text:  # the rule holds on the whole value: '2026-12-31\n' is no date
        raise ValueError(f"{printable(text)!r} has white space around the date")
    if not (len(text) == 10 and text[4] == text[7] == "-"
            and (text[:4] + text[5:7] + text[8:]).isdigit() and text.isascii()):
        raise ValueError(f"{printable(text)!r} is not a date")
    try:
        return dt.date.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is no day of the calendar ({exc})") from None


def load_allowlist(path: Path) -> list[Acceptance]:
    """Read an allowlist file: YAML, ``accept:`` a list of entries (``docs/report.md``).

    Each entry: ``host`` (or ``*``); ``kind`` (or ``rule``, the same for a credentials rule);
    ``path`` (a path finding) or ``subject`` (``AGENT``, ``AGENT/CAPABILITY``, ``AGENT/TOOL``,
    ``commit``, an account line); ``reason`` (not empty); ``expires`` (``YYYY-MM-DD``, the last
    day it holds, see :func:`parse_expires`); optional ``check``.

    Raises:
        InputError: the file is missing or not YAML, or an entry lacks a key, has an unknown
            one, an unknown kind or check, or a bad date; the message names the file, the line
            of the key (of the entry for a missing key) and the key (``accept[2].expires``).
    """
    data, node = load_yaml(path)
    where = display_path(path)
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) - {"accept"}:
        raise InputError(f"{where}: expected one key, accept: a list of entries",
                         hint="see docs/report.md#the-allowlist")
    entries = data.get("accept") or []
    if not isinstance(entries, list):
        raise input_error(path, node, ["accept"], "expected a list")
    kinds = set(all_kinds())
    out = []
    for i, e in enumerate(entries):
        def bad(key: str | None, problem: str, hint: str | None = None,
                i: int = i) -> InputError:
            return input_error(path, node, ["accept", i] + ([key] if key else []), problem,
                               hint)

        if not isinstance(e, dict):
            raise bad(None, "expected a mapping")
        unknown = sorted(set(map(str, e)) - _ENTRY_KEYS)
        if unknown:
            raise bad(unknown[0], f"unknown key {', '.join(unknown)}",
                      "keys: " + ", ".join(sorted(_ENTRY_KEYS)))
        subjects = [k for k in ("path", "subject") if k in e]
        if len(subjects) != 1:
            raise bad(None, "give exactly one of path, subject")
        kind_keys = [k for k in ("kind", "rule") if k in e]
        if len(kind_keys) != 1:
            raise bad(None, "give exactly one of kind, rule (a credentials rule id)")
        for key in ("host", kind_keys[0], "reason", "expires", subjects[0]):
            if e.get(key) in (None, ""):
                hint = _DATE_HINT if key == "expires" else None
                raise bad(key, "empty", hint) if key in e else \
                    bad(None, f"{key}: missing", hint)
        kind = e[kind_keys[0]]
        if kind not in kinds:
            raise bad(kind_keys[0], f"unknown kind {printable(str(kind))!r}",
                      "kinds: " + ", ".join(all_kinds()))
        if e.get("check") is not None and e["check"] not in CHECKS:
            raise bad("check", f"expected one of {', '.join(CHECKS)}")
        try:
            expires = parse_expires(e["expires"])
        except ValueError as exc:
            raise bad("expires", f"{exc}: expected a date, YYYY-MM-DD", _DATE_HINT) from None
        out.append(Acceptance(str(e["host"]), str(kind), str(e[subjects[0]]),
                              str(e["reason"]), expires, e.get("check"),
                              f"{where}:{line_of(node, ['accept', i]) or 1}"))
    return out


@dataclass(frozen=True, slots=True)
class FailOn:
    """``--fail-on``: which findings make the run fail.

    ``new_only``: only findings new tonight (and those whose acceptance expired); ``kinds``:
    only these kinds (check names stand for all their kinds), ``None`` for every kind.
    """

    words: tuple[str, ...] = ("all",)
    new_only: bool = False
    kinds: frozenset[str] | None = None

    def fails(self, f: Finding) -> bool:
        if f.accepted is not None or f.state in ("resolved", "unchecked"):
            return False
        if self.new_only and f.state != "new" and f.expired is None:
            return False
        return self.kinds is None or f.kind in self.kinds or f.check in self.kinds


def parse_fail_on(text: str | None) -> FailOn:
    """Parse ``--fail-on``: comma-separated ``all``, ``none``, ``new``, check names
    (``drift``, ``creds``, ``tokens``) and finding kinds; default ``all``.

    Raises:
        InputError: an unknown word (the hint lists the known ones).
    """
    words = tuple(w.strip() for w in (text or "all").split(",") if w.strip()) or ("all",)
    known = {"all", "none", "new", *CHECKS, *all_kinds()}
    bad = [w for w in words if w not in known]
    if bad:
        raise InputError(f"--fail-on: unknown {', '.join(bad)}",
                         hint="use all, none, new, a check (" + ", ".join(CHECKS) +
                         ") or a finding kind: " + ", ".join(all_kinds()))
    if "none" in words:
        return FailOn(words, False, frozenset())
    kinds = frozenset(w for w in words if w not in ("all", "new"))
    return FailOn(words, "new" in words, kinds or None)


def judge(report: NightlyReport, previous: dict[str, Any] | None,
          allowlist: list[Acceptance] | None, fail_on: FailOn,
          allowlist_path: Path | None = None, history: list[dict[str, Any]] | None = None
          ) -> NightlyReport:
    """Mark tonight's findings against the previous night's document, the allowlist and
    ``--fail-on`` (in place; returns ``report``).

    Args:
        report: from :func:`collect`.
        previous: the previous night's JSON document, or ``None`` (every finding is new).
        allowlist: the accepted findings, or ``None``.
        fail_on: from :func:`parse_fail_on`.
        allowlist_path: the allowlist's file, for the report.
        history: the earlier nights' documents (oldest first), for the findings-per-night chart.

    An entry is live through its ``expires`` date (UTC) and expired from the next day on.
    """
    today = dt.date.fromisoformat(report.generated[:10])
    prev: dict[tuple[str, ...], dict[str, Any]] = {}
    if previous is not None:
        report.previous = previous.get("generated")
        for f in previous.get("findings", []):
            if f.get("state") != "resolved":
                prev[(f["check"], f["host"], f["kind"], f["subject"])] = f
    used: set[int] = set()
    for f in report.findings:
        before = prev.pop(f.key, None)
        if before is not None:
            f.state, f.since = "persisting", before.get("since") or report.previous
            f.nights = int(before.get("nights") or 1) + 1
        else:
            f.state, f.since, f.nights = "new", report.generated, 1
        for i, entry in enumerate(allowlist or ()):
            if entry.matches(f):
                used.add(i)
                if entry.expires >= today:
                    f.accepted, f.expired = entry.to_json(), None
                    break
                f.expired = f.expired or entry.to_json()
        f.fails = fail_on.fails(f)
    ran = {(c.host, c.check): set(c.unchecked_subjects) for c in report.checks
           if c.status in ("ok", "findings")}
    for key, old in prev.items():
        check, host, kind, subject = key
        gone = Finding(check, host, kind, subject, old.get("message", ""),
                       old.get("severity", "medium"), old.get("detail") or {},
                       since=old.get("since"), nights=int(old.get("nights") or 1))
        if (host, check) in ran and subject not in ran[(host, check)]:
            gone.state = "resolved"
        else:  # not checked tonight: its history is kept, and it neither fails nor resolves
            gone.state = "unchecked"
        gone.fails = False
        report.resolved.append(gone)
    report.fail_on = list(fail_on.words)
    if allowlist is not None:
        report.allowlist = {
            "path": str(allowlist_path) if allowlist_path else None,
            "entries": len(allowlist),
            "unused": [e.to_json() for i, e in enumerate(allowlist) if i not in used],
            "expired": [e.to_json() for e in allowlist if e.expires < today],
        }
    report.nights = [night_summary(d) for d in (history or [])] + [night_summary(
        {"generated": report.generated,
         "findings": [f.to_json() for f in report.findings + report.resolved]})]
    return report


def night_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """``{"generated", "findings", "failing", "new", "by_check", "unchecked"}`` of one
    night's document; ``unchecked`` counts the earlier findings that night could not check
    (carried), so a night with a host down does not look like a night with fewer findings."""
    found = [f for f in doc.get("findings", []) if f.get("state") not in ("resolved",
                                                                         "unchecked")]
    return {"generated": doc.get("generated"), "findings": len(found),
            "failing": sum(1 for f in found if f.get("fails")),
            "new": sum(1 for f in found if f.get("state") == "new"),
            "by_check": {c: sum(1 for f in found if f.get("check") == c) for c in CHECKS},
            "unchecked": sum(1 for f in doc.get("findings", [])
                             if f.get("state") == "unchecked")}


# -- stage 3: the document ----------------------------------------------------------------------


def report_document(report: NightlyReport) -> dict[str, Any]:
    """The JSON document (``docs/report.md``); every renderer works from it."""
    findings = [f.to_json() for f in report.findings]
    by_state = {s: sum(1 for f in report.findings if f.state == s) for s in ("new", "persisting")}
    by_state["resolved"] = sum(1 for f in report.resolved if f.state == "resolved")
    return {
        "schema_version": SCHEMA_VERSION, "command": COMMAND,
        "generated": report.generated, "exit_code": report.exit_code,
        "source": report.source, "fail_on": report.fail_on, "previous": report.previous,
        "summary": {"hosts": len(report.hosts), "findings": len(findings),
                    "failing": sum(1 for f in report.findings if f.fails),
                    "accepted": sum(1 for f in report.findings if f.accepted),
                    "errors": sum(1 for c in report.checks if c.status == "error"),
                    **by_state},
        "hosts": report.hosts,
        "checks": [c.to_json() for c in report.checks],
        "findings": findings + [f.to_json() for f in report.resolved],
        "agents": [a.to_json() for a in report.agents],
        "nights": report.nights,
        "allowlist": report.allowlist,
        "runners": report.runners,
    }


# -- history ------------------------------------------------------------------------------------


def _night_file_name(generated: str) -> str:
    return generated.replace(":", "") + ".json"


def load_history(directory: Path) -> list[dict[str, Any]]:
    """The nights kept in ``directory``, oldest first (by their ``generated`` time).

    A file that is not a report document of this schema is skipped; a directory that does not
    exist yet is an empty history.

    Raises:
        InputError: ``directory`` exists and is not a readable directory.
    """
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise InputError(f"--history {display_path(directory)}: not a directory")
    docs = []
    try:
        names = sorted(p for p in directory.iterdir() if p.suffix == ".json"
                       and not p.name.startswith("."))
    except OSError as exc:
        raise InputError(f"--history {display_path(directory)}: cannot read: "
                         f"{exc.strerror}") from None
    for p in names:
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("command") == COMMAND and \
                doc.get("schema_version") == SCHEMA_VERSION and isinstance(doc.get("generated"),
                                                                           str):
            docs.append(doc)
    docs.sort(key=lambda d: d["generated"])
    return docs


def save_night(directory: Path, doc: dict[str, Any], keep: int = HISTORY_KEEP) -> Path:
    """Write tonight's document into ``directory`` (whole, or not at all) and remove the
    oldest nights beyond ``keep``. Returns the file written.

    Raises:
        InputError: the directory cannot be created or written.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--history {display_path(directory)}: cannot create: "
                         f"{exc.strerror}") from None
    path = directory / _night_file_name(doc["generated"])
    write_whole(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    nights = sorted(p for p in directory.iterdir() if p.suffix == ".json"
                    and not p.name.startswith("."))
    for old in nights[:max(0, len(nights) - keep)]:
        try:
            old.unlink()
        except OSError:
            pass
    return path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename:
    readers see the old file or the new one, never a part.

    Raises:
        InputError: the file cannot be written (the message names it).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"{display_path(path)}: cannot write the report: "
                         f"{exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
