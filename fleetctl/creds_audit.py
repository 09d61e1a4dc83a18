"""The least-privilege audit of credentials (``fleetctl creds audit``, DESIGN.md §2 grant, §3.6).

Two kinds of finding, each a :class:`Finding` with a stable rule id (see :data:`RULES`):

- **static**, from the blueprint and the inventory alone (no host is contacted): a grant whose
  scope reaches more than named resources, a write scope where every skill of the role that
  uses the capability only reads, a capability granted that no skill of the role uses, one
  secret value granted to two agents, an agent without its own Linux user (none, shared, root);
- **live**, from one read-only scan of each host (the same round trip as ``drift``): a
  credential file or directory that group or others may read, one owned by someone other than
  its agent, a file under ``credentials/`` the desired tree does not have (a revoked grant, a
  removed agent, a leftover temporary file), and an agent's HOME that others may read or that
  someone else owns.

A rule that needs a secret value (``shared-secret``) is skipped for a grant whose secret source
gives no value (an unset variable, a missing program, an unreadable file): the audit names each
skip (:class:`Skipped`) and runs every other rule, static and live, which need no value.

No secret value ever reaches a finding: secrets are compared by :attr:`Secret.digest` and shown
by a short digest prefix. This module returns records; the text table, the JSON and the Markdown
are rendered in the CLI layer (:mod:`fleetctl.cli.output.creds`). See
``docs/credentials-audit.md``.
"""

from __future__ import annotations

import concurrent.futures
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.credentials import CREDENTIALS_TOP, LEFTOVER_PREFIX, is_credential_path
from fleetctl.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, FleetctlError, worst_exit
from fleetctl.inventory import Agent, Grant, Host, Inventory
from fleetctl.manifest import DIR, Manifest
from fleetctl.names import escape_name, show_name
from fleetctl.secrets import SecretUnavailable, source_kind
from fleetctl.yamlfile import display_path, key_path_text, line_of, load_yaml

SCHEMA_VERSION = 1
COMMAND = "creds audit"

HIGH = "high"
MEDIUM = "medium"
SEVERITIES = (HIGH, MEDIUM)

#: How many hex digits of a secret's sha256 a finding shows (never the value, never all of it).
SHORT_DIGEST_HEX = 12

#: rule id → (kind, severity, one line for people). The ids are stable: CI may match on them.
RULES: dict[str, tuple[str, str, str]] = {
    "broad-scope": ("static", HIGH, "a grant's scope reaches more than named resources "
                                    "(a wildcard, a whole organisation or bucket)"),
    "write-not-needed": ("static", MEDIUM, "the grant allows writing, but every skill of the "
                                           "role that uses the capability only reads"),
    "unused-grant": ("static", MEDIUM, "the capability is granted, but no skill of the role "
                                       "uses it"),
    "shared-secret": ("static", HIGH, "one secret value is granted to two or more agents"),
    "no-own-user": ("static", HIGH, "the agent has no Linux user of its own"),
    "shared-user": ("static", HIGH, "two or more agents on one host run as the same user"),
    "root-user": ("static", HIGH, "the agent runs as root"),
    "readable-by-others": ("live", HIGH, "a credential file or directory gives group or others "
                                         "some access (files must be 0600, directories 0700)"),
    "wrong-owner": ("live", HIGH, "a credential file or directory is not owned by its agent's "
                                  "user and group"),
    "stale-secret-file": ("live", HIGH, "a file under credentials/ that no grant renders any "
                                        "more: a revoked grant, a removed agent, a leftover"),
    "user-missing": ("live", HIGH, "the agent's user does not exist on the host"),
    "home-readable": ("live", MEDIUM, "an agent's HOME gives group or others read or execute "
                                      "access, or is owned by someone else"),
}

# Host statuses and their exit codes (DESIGN.md §4: 0 clean, 1 findings, 2 error).
STATUS_EXIT = {"clean": EXIT_OK, "findings": EXIT_FINDINGS, "incomplete": EXIT_ERROR,
               "error": EXIT_ERROR}

FILE_MASK = 0o077
"""Bits of a credential file or directory that group and others must not have."""
HOME_MASK = 0o055
"""Bits of a HOME that group and others must not have: read and execute (search)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the audit found.

    Attributes:
        host: the host's inventory name.
        rule: the stable rule id, a key of :data:`RULES`.
        message: one line for people; names agents, capabilities, paths and short digests,
            never a secret value.
        agent: the agent concerned, or ``None`` (a file of no current agent).
        capability: the capability concerned, or ``None``.
        where: ``file:line: key.path`` in the inventory, or ``None`` for a live finding.
        path: for a live finding, the path on the host relative to the managed root
            (``credentials/<agent>/<file>``) or the HOME (absolute); else ``None``.
    """

    host: str
    rule: str
    message: str
    agent: str | None = None
    capability: str | None = None
    where: str | None = None
    path: str | None = None
    live: bool = False
    """Found by the scan although the rule is static (``root-user``: uid 0 under another name)."""

    @property
    def kind(self) -> str:
        """``static`` or ``live``."""
        return "live" if self.live else RULES[self.rule][0]

    @property
    def severity(self) -> str:
        """``high`` or ``medium``."""
        return RULES[self.rule][1]

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON record (a path that is not UTF-8 is escaped and says so)."""
        record: dict[str, Any] = {
            "host": self.host, "agent": self.agent, "capability": self.capability,
            "rule": self.rule, "kind": self.kind, "severity": self.severity,
            "message": escape_name(self.message)[0], "where": self.where, "path": None}
        if self.path is not None:
            record["path"], escaped = escape_name(self.path)
            if escaped:
                record["path_escaped"] = True
        return record


@dataclass(frozen=True, slots=True)
class Skipped:
    """A rule the audit could not run for one grant, because its secret was not available.

    Attributes:
        host: the host's inventory name.
        rule: the rule skipped (a key of :data:`RULES`, e.g. ``shared-secret``).
        agent: the agent.
        capability: the granted capability.
        source: the kind of secret source: ``env``, ``file`` or ``command``.
        source_name: how the source is named (``environment variable GH_TOKEN``); no value.
        reason: why it gave no value.
        where: ``file:line: key.path`` of the grant in the inventory.
    """

    host: str
    rule: str
    agent: str
    capability: str
    source: str
    source_name: str
    reason: str
    where: str | None = None

    def describe(self) -> str:
        """One line for people."""
        return (f"{self.rule} for grant {self.capability} of agent {self.agent}: {self.reason}")

    def to_json(self) -> dict[str, Any]:
        """``{rule, agent, capability, source, source_name, reason, where}``."""
        return {"rule": self.rule, "agent": self.agent, "capability": self.capability,
                "source": self.source, "source_name": self.source_name,
                "reason": escape_name(self.reason)[0], "where": self.where}


@dataclass(slots=True)
class HostAudit:
    """The audit of one host.

    Attributes:
        host: the inventory name.
        status: ``clean``, ``findings``, ``incomplete`` (some credential path or HOME could not
            be read) or ``error`` (bad input for this host, or the host could not be scanned).
        findings: static then live, each in a stable order.
        scanned: whether the host was scanned (``False`` with ``--static`` or after an error
            before the scan).
        error: one line saying what went wrong, for ``error`` and ``incomplete``.
        hint: what the user can do about it.
        unreadable: ``(path, error)`` of each credential path or HOME the scan could not read.
        skipped: rules not run for a grant whose secret was not available; they do not change
            the status (every other rule ran).
        debug: an internal error's traceback, shown only with ``--debug``.
    """

    host: str
    status: str = "clean"
    findings: list[Finding] = field(default_factory=list)
    scanned: bool = False
    error: str | None = None
    hint: str | None = None
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    debug: str | None = None

    @property
    def exit_code(self) -> int:
        """The exit code this host alone would give."""
        return STATUS_EXIT[self.status]

    def settle(self) -> None:
        """Set ``status`` from the findings, unless an error or an incomplete scan set it."""
        if self.status not in ("error", "incomplete"):
            self.status = "findings" if self.findings else "clean"


@dataclass(slots=True)
class AuditReport:
    """The whole audit: one :class:`HostAudit` per selected host, in selection order."""

    hosts: list[HostAudit]
    static_only: bool = False

    @property
    def findings(self) -> list[Finding]:
        """Every finding, host by host."""
        return [f for h in self.hosts for f in h.findings]

    @property
    def exit_code(self) -> int:
        """The worst host's code: 2 over 1 over 0 (0 when no host is selected)."""
        return worst_exit([h.exit_code for h in self.hosts])

    def summary(self) -> dict[str, Any]:
        """Counts: findings in all, by severity, by rule; hosts in all and by status."""
        findings = self.findings
        by_rule: dict[str, int] = {}
        for f in findings:
            by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
        by_status: dict[str, int] = {}
        for h in self.hosts:
            by_status[h.status] = by_status.get(h.status, 0) + 1
        return {"findings": len(findings),
                "by_severity": {s: sum(1 for f in findings if f.severity == s)
                                for s in SEVERITIES},
                "by_rule": dict(sorted(by_rule.items())),
                "hosts": len(self.hosts), "hosts_by_status": dict(sorted(by_status.items())),
                "skipped": sum(len(h.skipped) for h in self.hosts),
                "static_only": self.static_only}


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """How to audit.

    Attributes:
        static_only: ``--static``: the blueprint and inventory only; no host is contacted.
        parallel: hosts scanned at once (default 8).
    """

    static_only: bool = False
    parallel: int = 8


def short_digest(digest: str) -> str:
    """``sha256:<first 12 hex>`` of a ``sha256:<hex>`` digest: enough to tell values apart."""
    algo, _, hexpart = digest.partition(":")
    return f"{algo}:{hexpart[:SHORT_DIGEST_HEX]}"


# --- static rules -----------------------------------------------------------------------------


class _Locator:
    """Finds ``file:line: key.path`` of agent keys in the inventory, for agent findings."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.node = None
        if path is not None:
            try:
                self.node = load_yaml(path)[1]
            except FleetctlError:  # it loaded a moment ago; without lines the key still helps
                self.node = None

    def where(self, key_path: list[Any]) -> str | None:
        if self.path is None:
            return None
        line = line_of(self.node, key_path)
        return f"{display_path(self.path)}{':' + str(line) if line else ''}: " \
               f"{key_path_text(key_path)}"


def _agent_key(host: Host, agent: Agent, key: str | None = None) -> list[Any]:
    return ["hosts", host.name, "agents", agent.name, *([key] if key else [])]


def grant_findings(blueprint: Blueprint, host: Host, agent: Agent,
                   grant: Grant) -> list[Finding]:
    """The scope rules for one grant: ``broad-scope``, ``unused-grant``, ``write-not-needed``.

    A grant of a capability the blueprint does not define gives nothing here (loading the
    inventory with its blueprint refuses it).
    """
    capability = blueprint.capabilities.get(grant.capability)
    role = blueprint.roles.get(agent.role)
    if capability is None or role is None:
        return []
    where = grant.where or None
    out = []
    broad = capability.broad_values(grant.scope)
    if broad:
        values = ", ".join(f"{key}={value!r}" for key, value in broad)
        out.append(Finding(host.name, "broad-scope", f"{agent.name}: {grant.capability}: scope "
                           f"reaches more than named resources: {values}", agent.name,
                           grant.capability, where))
    needs = {skill: blueprint.skill_needs.get(skill, {}).get(grant.capability)
             for skill in role.skills}
    users = {skill: need for skill, need in needs.items() if need}
    if not users:
        skills = ", ".join(role.skills) or "none"
        out.append(Finding(host.name, "unused-grant", f"{agent.name}: {grant.capability} is "
                           f"granted, but no skill of role {agent.role} uses it (skills: "
                           f"{skills})", agent.name, grant.capability, where))
        return out
    writes = capability.allows_write(grant.scope)
    if writes and all(need == "read" for need in users.values()):
        shown = ", ".join(f"{key}={value!r}" for key, value in writes)
        readers = ", ".join(sorted(users))
        out.append(Finding(host.name, "write-not-needed", f"{agent.name}: {grant.capability}: "
                           f"scope allows writing ({shown}), but the role's skills that use it "
                           f"only read ({readers})", agent.name, grant.capability, where))
    return out


def user_findings(host: Host, locate: Callable[[list[Any]], str | None]) -> list[Finding]:
    """The account rules of one host: ``no-own-user``, ``root-user``, ``shared-user``."""
    out = []
    by_user: dict[str, list[Agent]] = {}
    for agent in host.agents:
        if not agent.user:
            granted = (f", and so do the credential files of its {len(agent.grants)} grant(s)"
                       if agent.grants else "")
            out.append(Finding(host.name, "no-own-user", f"{agent.name}: has no user of its own "
                               f"(no user: key): it runs as the host's default owner{granted}",
                               agent.name, where=locate(_agent_key(host, agent))))
            continue
        by_user.setdefault(agent.user, []).append(agent)
        if agent.user == "root":
            out.append(Finding(host.name, "root-user", f"{agent.name}: runs as root, which can "
                               "read every other agent's credentials", agent.name,
                               where=locate(_agent_key(host, agent, "user"))))
    for user, agents in by_user.items():
        if len(agents) < 2:
            continue
        for agent in agents:
            others = ", ".join(a.name for a in agents if a is not agent)
            out.append(Finding(host.name, "shared-user", f"{agent.name}: user {user} is also the "
                               f"user of {others}: each can read the other's credentials and "
                               "HOME", agent.name, where=locate(_agent_key(host, agent, "user"))))
    return out


def shared_secret_findings(resolved: Iterable[tuple[Host, Agent, Grant, str]]) -> list[Finding]:
    """``shared-secret``: one finding per grant whose value another agent is also granted.

    Args:
        resolved: ``(host, agent, grant, secret digest)`` of every grant that resolved.

    Two grants of one agent with the same value are not a finding here (one user reads both).
    """
    by_digest: dict[str, list[tuple[Host, Agent, Grant]]] = {}
    for host, agent, grant, digest in resolved:
        by_digest.setdefault(digest, []).append((host, agent, grant))
    out = []
    for digest, grants in by_digest.items():
        holders = {(h.name, a.name) for h, a, _ in grants}
        if len(holders) < 2:
            continue
        for host, agent, grant in grants:
            others = ", ".join(f"{h.name}/{a.name} ({g.capability})" for h, a, g in grants
                               if (h.name, a.name) != (host.name, agent.name))
            out.append(Finding(host.name, "shared-secret", f"{agent.name}: {grant.capability}: "
                               f"the same secret value ({short_digest(digest)}) is granted to "
                               f"{others}", agent.name, grant.capability, grant.where or None))
    return out


def static_audit(blueprint: Blueprint, hosts: list[Host],
                 inventory_path: Path | None = None) -> list[HostAudit]:
    """Run every static rule over ``hosts``; no host is contacted.

    Each grant's secret is resolved (through the host's secret store) to compare values; a
    grant whose secret is not available is left out of that comparison and named in the host's
    ``skipped`` (every other rule still runs).
    The shared-secret comparison spans ``hosts`` (all of the inventory when none are named).

    Args:
        blueprint: the loaded blueprint.
        hosts: the selected hosts.
        inventory_path: the inventory file, to name the line of agent findings.

    Returns:
        One :class:`HostAudit` per host, in order, with ``status`` settled.
    """
    locator = _Locator(inventory_path)
    audits = []
    resolved: list[tuple[Host, Agent, Grant, str]] = []
    for host in hosts:
        audit = HostAudit(host.name)
        audits.append(audit)
        try:
            host_resolved = []
            for agent in host.agents:
                for grant in agent.grants:
                    audit.findings += grant_findings(blueprint, host, agent, grant)
                    if host.secrets is not None:
                        try:
                            digest = host.secrets.resolve(grant.secret).digest
                        except SecretUnavailable as exc:
                            audit.skipped.append(Skipped(
                                host.name, "shared-secret", agent.name, grant.capability,
                                source_kind(grant.secret), grant.secret.describe(), exc.message,
                                grant.where or None))
                            continue
                        host_resolved.append((host, agent, grant, digest))
            audit.findings += user_findings(host, locator.where)
            resolved += host_resolved
        except FleetctlError as exc:
            audit.status, audit.error, audit.hint = "error", exc.message, exc.hint
    shared = shared_secret_findings(resolved)
    for audit in audits:
        audit.findings += [f for f in shared if f.host == audit.host]
        audit.findings.sort(key=_finding_order)
        audit.settle()
    return audits


def _finding_order(f: Finding) -> tuple:
    return (f.kind != "static", f.agent or "", f.capability or "", f.path or "", f.rule)


# --- live rules -------------------------------------------------------------------------------


def _mode_bits(mode: str | None) -> int:
    try:
        return int(mode or "0", 8)
    except ValueError:
        return 0


def _file_grants(blueprint: Blueprint, host: Host) -> tuple[dict[str, Grant], dict[str, str]]:
    """``credentials/<agent>/<file>`` → the grant that renders it; and file name → the one
    capability that renders a file of that name (for files no grant renders any more)."""
    by_path = {}
    for agent in host.agents:
        for grant in agent.grants:
            capability = blueprint.capabilities.get(grant.capability)
            for name in (capability.templates if capability else ()):
                by_path[f"{CREDENTIALS_TOP}/{agent.name}/{name}"] = grant
    by_name: dict[str, str | None] = {}
    for capability in blueprint.capabilities.values():
        for name in capability.templates:
            by_name[name] = capability.name if name not in by_name else None
    return by_path, {k: v for k, v in by_name.items() if v}


def credential_findings(blueprint: Blueprint, host: Host, desired: Manifest,
                        live: Manifest) -> list[Finding]:
    """The live rules for the credentials tree: ``readable-by-others``, ``wrong-owner``,
    ``stale-secret-file``.

    Args:
        blueprint: the blueprint (which capability renders which file).
        host: the host (its agents name the owners of the findings).
        desired: the desired manifest with the host's default owner filled in
            (``desired_for`` in :mod:`fleetctl.scan`).
        live: the live manifest of the host; only ``credentials/...`` entries are read.

    Entries the desired tree lacks are ``stale-secret-file`` (every non-directory one; a
    stale directory only holds them); the mode and owner rules apply to desired entries under
    ``credentials/<agent>/`` (and the owner rule to ``credentials/`` itself). A finding about a
    file a grant renders carries that grant's capability and inventory line.
    """
    agents = {a.name for a in host.agents}
    by_path, by_name = _file_grants(blueprint, host)
    out = []
    for entry in live:
        if not is_credential_path(entry.path):
            continue
        parts = entry.path.split("/")
        agent = parts[1] if len(parts) > 1 else None
        want = desired.get(entry.path)
        shown = show_name(entry.path)
        grant = by_path.get(entry.path)
        capability = grant.capability if grant else None
        where = (grant.where or None) if grant else None
        if want is None:
            if entry.type == DIR:
                continue
            whose = (f"agent {agent}" if agent in agents else f"{agent}, which is no agent of "
                     "this host") if agent else "no agent"
            capability = by_name.get(parts[-1]) if len(parts) == 3 else None
            if parts[-1].startswith(LEFTOVER_PREFIX):
                what = "a leftover temporary file of an interrupted ship"
            elif capability:
                what = f"a {capability} file that no grant renders any more"
            else:
                what = "rendered by no grant"
            attrs = " ".join(x for x in (entry.type, entry.mode, entry.owner) if x)
            out.append(Finding(host.name, "stale-secret-file", f"{shown}: {what} ({whose}; "
                               f"{attrs}); remove it, or ship to remove it",
                               agent if agent in agents else None, capability, path=entry.path))
            continue
        if agent is None and entry.type == DIR and _mode_bits(entry.mode) & 0o022:
            # Whoever may write credentials/ may rename an agent's 0700 directory away and put
            # their own in its place.
            out.append(Finding(host.name, "readable-by-others", f"{shown}: mode {entry.mode} lets "
                               "group or others write it (and so replace an agent's directory); "
                               "it must be 0755", None, None, None, entry.path))
        if agent is not None and entry.type in (DIR, "file") and \
                _mode_bits(entry.mode) & FILE_MASK:
            should = "0700" if entry.type == DIR else "0600"
            out.append(Finding(host.name, "readable-by-others", f"{shown}: mode {entry.mode} "
                               f"gives group or others access; it must be {should}", agent,
                               capability, where, entry.path))
        if want.owner and entry.owner != want.owner:
            out.append(Finding(host.name, "wrong-owner", f"{shown}: owned by {entry.owner}, not "
                               f"{want.owner}", agent, capability, where, entry.path))
    return out


def home_findings(host: Host, accounts: dict[str, dict[str, Any]]) -> list[Finding]:
    """The live rules for the agents' accounts: ``user-missing``, ``root-user`` (uid 0 under
    another name than root, which only the host can tell) and ``home-readable``.

    Args:
        host: the host; each agent with a ``user`` is checked once per user.
        accounts: user name → ``{"exists", "uid", "home", "home_exists", "home_mode",
            "home_owner"}`` as the scan reports them.
    """
    out = []
    seen = set()
    for agent in host.agents:
        if not agent.user or agent.user in seen:
            continue
        seen.add(agent.user)
        info = accounts.get(agent.user)
        if info is None:
            continue
        if not info.get("exists"):
            out.append(Finding(host.name, "user-missing", f"{agent.name}: user {agent.user} does "
                               "not exist on the host, so no file can be owned by it",
                               agent.name))
            continue
        if info.get("uid") == 0 and agent.user != "root":  # root by name: the static rule
            out.append(Finding(host.name, "root-user", f"{agent.name}: user {agent.user} has "
                               "uid 0 on the host: root under another name, which can read "
                               "every other agent's credentials", agent.name, live=True))
        home = info.get("home") or agent.home
        if not info.get("home_exists"):
            continue
        problems = []
        mode = info.get("home_mode")
        if _mode_bits(mode) & HOME_MASK:
            problems.append(f"mode {mode} gives group or others read or execute access "
                            "(use 0700)")
        owner = info.get("home_owner")
        if owner and owner.split(":")[0] != agent.user:
            problems.append(f"owned by {owner}, not {agent.user}")
        if problems:
            out.append(Finding(host.name, "home-readable", f"{agent.name}: HOME {home}: "
                               + "; ".join(problems), agent.name, path=home))
    return out


def live_findings(blueprint: Blueprint, host: Host, desired: Manifest, live: Manifest,
                  accounts: dict[str, dict[str, Any]] | None) -> list[Finding]:
    """Every live rule for one scanned host (a pure function of the scan; no I/O).

    Args:
        blueprint: the blueprint.
        host: the host.
        desired: the desired manifest with the host's default owner filled in.
        live: the live manifest (its ``credentials/...`` entries).
        accounts: ``LiveState.accounts``, or ``None`` when the scan did not report them.
    """
    return (credential_findings(blueprint, host, desired, live)
            + home_findings(host, accounts or {}))


def scan_host(blueprint: Blueprint, host: Host, audit: HostAudit) -> None:
    """Scan one host read-only (no lock) and add its live findings to ``audit``.

    A credential path the scan could not read makes the host ``incomplete``: what was not
    seen cannot be called clean.

    Raises:
        FleetctlError: bad input (render) or host trouble (unreachable, host key, timeout).
    """
    from fleetctl.render import render_host  # render pulls in jinja2; --static needs neither
    from fleetctl.scan import desired_for, host_session

    tree = render_host(blueprint, host, missing_secrets_ok=True)  # live rules need no value
    with host_session(host, "scan") as (_session, state):
        pass
    audit.scanned = True
    audit.findings += live_findings(blueprint, host, desired_for(tree, state), state.live,
                                     state.accounts)
    unseen = [(u.path, u.error) for u in state.unreadable if is_credential_path(u.path)]
    if unseen:
        audit.unreadable = unseen
        audit.status = "incomplete"
        audit.error = (f"{len(unseen)} credential path(s) could not be read; the audit of "
                       "this host is incomplete")
        audit.hint = ("scan as root or as the owner of the credentials tree; fleetctl does "
                      "not escalate on its own")


def audit_credentials(blueprint: Blueprint, inventory: Inventory, hosts: list[Host],
                      options: AuditOptions = AuditOptions(),
                      progress: Any = None) -> AuditReport:
    """Audit the credentials of ``hosts``: the static rules, then (unless ``static_only``) one
    read-only scan per host, ``options.parallel`` at a time.

    Every host is attempted; one that cannot be reached is ``error`` (exit 2) and the others
    are still audited. Its static findings are kept.

    Args:
        blueprint: the loaded blueprint.
        inventory: the loaded inventory (its file names the lines of agent findings).
        hosts: the selected hosts, in report order.
        options: see :class:`AuditOptions`.
        progress: an observer with ``host_started(name)``, ``host_step(name, step)`` and
            ``host_finished(result)`` (``result`` has ``host`` and ``status``), or ``None``.
    """
    from fleetctl.fanout import wait_interruptible

    audits = static_audit(blueprint, hosts, inventory.path)
    if options.static_only:
        return AuditReport(audits, static_only=True)

    def one(host: Host, audit: HostAudit) -> None:
        if progress is not None:
            progress.host_started(host.name)
            progress.host_step(host.name, "scan")
        if audit.status != "error":
            try:
                scan_host(blueprint, host, audit)
            except FleetctlError as exc:
                audit.status, audit.error, audit.hint = "error", exc.message, exc.hint
            except Exception as exc:  # noqa: BLE001 - one host's bug must not lose the others
                audit.status = "error"
                audit.error = f"{host.name}: internal error: {exc.__class__.__name__}: {exc}"
                audit.hint = "run with --debug for the traceback and report it"
                audit.debug = traceback.format_exc()
        audit.findings.sort(key=_finding_order)
        audit.settle()
        if progress is not None:
            progress.host_finished(audit)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.parallel)) as pool:
        # Ctrl-C ends the scans; every host is still reported.
        wait_interruptible([pool.submit(one, h, a) for h, a in zip(hosts, audits, strict=True)])
    return AuditReport(audits)
