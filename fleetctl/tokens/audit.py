"""The library function behind ``fleetctl tokens``: measure each agent's prefix, judge it.

For every selected agent of the inventory: build its role's prefix with the runner's builder
(the shell tool, and the tools of every MCP server the role declares, listed for real), measure
it (:mod:`fleetctl.tokens.measure`), and hold it to the role's budgets:

- ``budget_tokens``: the whole always-on prefix;
- ``max_tool_tokens``: any one tool's marginal cost;
- ``max_tools``: the number of tool definitions.

Over any of them is a finding (exit 1). An MCP server that cannot be measured makes the agent
``incomplete`` (exit 2): its tools are missing from the numbers, which are then a lower bound,
and a comparison never counts them as a saving. A server declared ``via: bridge`` is in the
prefix as one CLI-index line (``mcp-bridge SERVER --help``), passed to the builder as a bridged
server; it is not started. ``--compare mcp`` measures the same role with all its MCP servers
reached through the ``mcp-bridge`` CLI (the ``via: mcp`` servers' tools and instructions leave
the prefix; one CLI-index line per server comes in). ``--baseline FILE`` compares with a
previous JSON report and fails on growth beyond a threshold, naming what grew.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.blueprint import Role, load_blueprint
from fleetctl.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, InputError, worst_exit
from fleetctl.inventory import load_inventory
from fleetctl.roledecl import McpServerDecl, bridged_servers, check_bridged_servers, mcp_servers
from fleetctl.tokencount.counters import (
    CLAUDE_ESTIMATE,
    ClaudeCountTokens,
    CounterError,
    JsonFileCache,
    O200kCounter,
    anthropic_client,
)
from fleetctl.tokencount.prefixmodule import load_prefix_module
from fleetctl.tokens.mcp_list import ServerListing, list_servers
from fleetctl.tokens.measure import TOOL_PARTS, Measurement, measure_claude, measure_offline
from fleetctl.tokens.models import ContextWindow, context_window
from fleetctl.tokens.roleharness import RoleHarness, role_harness_part
from fleetctl.yamlfile import display_path

SCHEMA_VERSION = 1
DEFAULT_CLAUDE_MODEL = "claude-sonnet-4-5"
"""The model Claude's count uses for a role that sets none."""

STATUS_EXIT = {"ok": EXIT_OK, "over": EXIT_FINDINGS, "incomplete": EXIT_ERROR}


@dataclass(frozen=True, slots=True)
class TokensOptions:
    """What to audit and how.

    Attributes:
        agents: agent names (or ``HOST/AGENT``) to audit; empty: every agent.
        counter: ``o200k`` (default: offline, exact for o200k_base) or ``claude-api`` (Claude's
            ``count_tokens``, needs an API key or ``claude_client``).
        compare_mcp: also measure each role with its MCP servers behind the bridge CLI.
        startup_timeout_s: seconds every stdio MCP server may take to start, over what its
            role says when longer (``--startup-timeout``, for a slow server); default ``None``.
        compare_default: also measure each role as its harness runs by default: every
            built-in tool (the default set's profile) and every MCP server mounted (``via:
            mcp``), the "before" of stripping and bridging.
        baseline: a previous JSON report to compare with, or ``None``.
        max_growth_pct: growth of an agent's prefix over the baseline that is a finding;
            default 5 (percent).
        claude_client: a client object for ``count_tokens`` (tests pass a stand-in); default
            ``anthropic.Anthropic()``.
        claude_model: the model Claude's count uses for roles that set none; default
            :data:`DEFAULT_CLAUDE_MODEL`.
        claude_cache: a JSON file caching Claude's counts by request digest; default
            ``$XDG_CACHE_HOME/fleetctl/claude-count-tokens.json``.
    """

    agents: tuple[str, ...] = ()
    counter: str = "o200k"
    compare_mcp: bool = False
    compare_default: bool = False
    startup_timeout_s: float | None = None
    baseline: Path | None = None
    max_growth_pct: float = 5.0
    claude_client: Any = None
    claude_model: str | None = None
    claude_cache: Path | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing over a limit, or wrong.

    Attributes:
        kind: ``budget_tokens``, ``max_tool_tokens``, ``max_tools``, ``growth`` or ``server``.
        message: one line for people.
        subject: the tool, server or agent it is about.
        limit: the limit crossed, if any.
        actual: the measured value, if any.
    """

    kind: str
    message: str
    subject: str | None = None
    limit: float | None = None
    actual: float | None = None


@dataclass(frozen=True, slots=True)
class Comparison:
    """A role's prefix as declared versus with all its MCP servers behind the bridge CLI.

    Attributes:
        servers: every MCP server of the role, all behind the bridge on that side (the
            ``via: bridge`` ones are there already).
        tools_moved: how many tool definitions left the prefix (the ``via: mcp`` servers'
            tools, still reachable as ``mcp-bridge SERVER TOOL``).
        bridge: the measurement with the bridge.
        declared_total: the declared prefix's total; ``None`` when it is incomplete.
        saving_tokens: declared minus bridged total, or ``None`` (never a saving when a server
            could not be measured).
        tool_tokens_declared: tool-definition tokens as declared (shell tool, MCP tools, MCP
            instructions, fixed tool-use prompt).
        tool_tokens_bridge: the same with the bridge, plus what the bridge adds to the skills and
            CLI indexes.
    """

    servers: tuple[str, ...]
    tools_moved: int
    bridge: Measurement
    declared_total: int | None
    saving_tokens: int | None
    tool_tokens_declared: int | None
    tool_tokens_bridge: int

    @property
    def saving_pct(self) -> float | None:
        """The prefix saving as a percentage of the declared prefix."""
        if self.saving_tokens is None or not self.declared_total:
            return None
        return 100.0 * self.saving_tokens / self.declared_total

    @property
    def tool_cut_pct(self) -> float | None:
        """The cut of always-on tool-definition tokens, in percent."""
        if self.tool_tokens_declared is None or not self.tool_tokens_declared:
            return None
        return 100.0 * (self.tool_tokens_declared - self.tool_tokens_bridge) \
            / self.tool_tokens_declared


@dataclass(slots=True)
class AgentReport:
    """One agent's audit.

    Attributes:
        agent, host, role, model: who it is (``model`` ``None``: the agent CLI's default).
        measurement: the prefix measured.
        window: the model's context window.
        budget_tokens, max_tool_tokens, max_tools: the role's limits (``None``: none).
        servers: each ``via: mcp`` server's listing (their tools are in the prefix).
        bridged: the ``via: bridge`` servers (one CLI-index line each; not started).
        findings: what is over, or failed.
        warnings: what the reader should know but is not a finding.
        compare: the bridge comparison, when asked for.
        harness: the harness's part (``name``, ``version``, ``toolset``, ``profile``,
            ``total_tokens``, ``default_total_tokens``, ``saving_tokens``...), or ``None``
            when the role runs no known harness.
        harness_missing: why the harness's part is not counted (no profile, unknown harness),
            which makes the totals a lower bound; ``None`` when it is counted or not needed.
        compare_default: before (the harness's default tool set, every MCP server mounted)
            and after (as declared), when ``--compare default`` asked for it.
        counter_error: why Claude's count failed (the numbers are then offline counts).
        instructions: one row per ``via: mcp`` server with instructions: ``server``,
            ``tokens`` (o200k_base), ``chars``, ``harness_keeps_chars``, ``cut``.
    """

    agent: str
    host: str
    role: str
    model: str | None
    measurement: Measurement
    window: ContextWindow
    budget_tokens: int | None = None
    max_tool_tokens: int | None = None
    max_tools: int | None = None
    servers: tuple[ServerListing, ...] = ()
    bridged: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    compare: Comparison | None = None
    harness: dict[str, Any] | None = None
    harness_missing: str | None = None
    compare_default: Any = None
    counter_error: str | None = None
    instructions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``incomplete`` (a server not measured, or the harness's part unknown: a lower
        bound), ``over`` (a finding) or ``ok``."""
        if any(not s.measured for s in self.servers) or self.harness_missing \
                or self.counter_error:
            return "incomplete"
        return "over" if self.findings else "ok"

    @property
    def exit_code(self) -> int:
        """0 ok, 1 over, 2 incomplete."""
        return STATUS_EXIT[self.status]


@dataclass(slots=True)
class TokensReport:
    """The whole audit.

    Attributes:
        counter: the counter's name and provenance.
        estimate: the estimate band's definition (offline counter), or ``None``.
        agents: one report per selected agent, in inventory order.
        baseline: the baseline file compared with, or ``None``.
        max_growth_pct: the growth threshold used with the baseline.
    """

    counter: dict[str, Any]
    estimate: dict[str, Any] | None
    agents: list[AgentReport]
    baseline: str | None = None
    max_growth_pct: float | None = None

    @property
    def exit_code(self) -> int:
        """The worst agent's exit code (2 over 1 over 0)."""
        return worst_exit([a.exit_code for a in self.agents])


def load_roles(blueprint: Path) -> dict[str, Role]:
    """Every role of the blueprint, loaded and checked by :func:`fleetctl.blueprint.load_blueprint`
    (whose ``Role`` carries the ``fleetctl tokens`` keys: ``mcp_servers``, ``max_tool_tokens``,
    ``max_tools``), and each role's ``via: bridge`` servers checked against its skills.

    Raises:
        InputError: no blueprint, a bad role file, a role naming a missing skill, or a
            ``via: bridge`` server in a role without the ``mcp-bridge`` skill.
    """
    loaded = load_blueprint(blueprint)
    for name, role in loaded.roles.items():
        check_bridged_servers(loaded.root / "roles" / f"{name}.yaml", role)
    return loaded.roles


def _select(inventory: Any, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """``(host name, agent)`` for the named agents (all when none), in inventory order."""
    every = [(h.name, a) for h in inventory.hosts for a in h.agents]
    if not names:
        return every
    chosen: list[tuple[str, Any]] = []
    unknown = []
    for name in dict.fromkeys(names):
        host, _, agent = name.rpartition("/")
        found = [(h, a) for h, a in every if a.name == agent and (not host or h == host)]
        if not found:
            unknown.append(name)
        chosen.extend(f for f in found if f not in chosen)
    if unknown:
        listed = ", ".join(sorted({a.name for _, a in every})) or "(none)"
        raise InputError(f"{display_path(inventory.path)}: no agent named {', '.join(unknown)}",
                         hint=f"agents in this inventory: {listed} (or HOST/AGENT)")
    return [e for e in every if e in chosen]


def _decl_key(decl: McpServerDecl) -> str:
    return decl.model_dump_json()


def _budget_findings(report: AgentReport) -> None:
    m = report.measurement
    if report.budget_tokens is not None and m.total_tokens > report.budget_tokens:
        report.findings.append(Finding(
            "budget_tokens", f"prefix {m.total_tokens:,} tokens is over budget_tokens "
            f"{report.budget_tokens:,} by {m.total_tokens - report.budget_tokens:,}",
            report.agent, report.budget_tokens, m.total_tokens))
    if report.max_tool_tokens is not None:
        for tool in m.tools:
            if tool.marginal_tokens > report.max_tool_tokens:
                report.findings.append(Finding(
                    "max_tool_tokens", f"tool {tool.name} costs {tool.marginal_tokens:,} tokens, "
                    f"over max_tool_tokens {report.max_tool_tokens:,}", tool.name,
                    report.max_tool_tokens, tool.marginal_tokens))
    if report.max_tools is not None and len(m.tools) > report.max_tools:
        report.findings.append(Finding(
            "max_tools", f"{len(m.tools)} tool definitions, over max_tools {report.max_tools}",
            report.agent, report.max_tools, len(m.tools)))


def _read_baseline(path: Path, counter: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The agents of a previous JSON report, keyed by ``(host, agent)``.

    Raises:
        InputError: unreadable, not a ``fleetctl tokens`` JSON report, or made with another
            counter or data file (not comparable).
    """
    import json

    where = display_path(path)
    try:
        doc = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise InputError(f"{where}: cannot read the baseline: {exc.strerror}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{where}: the baseline is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("command") != "tokens" \
            or not isinstance(doc.get("agents"), list):
        raise InputError(f"{where}: not a `fleetctl tokens --format json` report",
                         hint="make one with: fleetctl tokens --format json --output FILE")
    theirs = doc.get("counter") or {}
    for key in ("name", "data_sha256", "model"):
        if theirs.get(key) != counter.get(key):
            raise InputError(f"{where}: the baseline was counted with {key} "
                             f"{theirs.get(key)!r}, this run with {counter.get(key)!r}: not "
                             "comparable", hint="make a new baseline with this counter")
    out = {}
    for agent in doc["agents"]:
        try:
            out[(str(agent["host"]), str(agent["agent"]))] = agent
        except (KeyError, TypeError):
            raise InputError(f"{where}: an agent record without host and agent") from None
    return out


def _growth_findings(report: AgentReport, base: dict[str, Any], max_growth_pct: float) -> None:
    try:
        before = int(base["total_tokens"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"baseline: agent {report.agent} has no total_tokens") from None
    now = report.measurement.total_tokens
    if now <= before:
        return
    growth = 100.0 * (now - before) / before if before else float("inf")
    if growth <= max_growth_pct:
        return
    grew = []
    old_parts = {c.get("name"): c.get("tokens") or 0 for c in base.get("components", [])}
    for c in report.measurement.components:
        delta = (c.tokens or 0) - int(old_parts.get(c.name, 0))
        if delta > 0 and c.name != "joins":
            grew.append((delta, f"{c.name} +{delta:,}"))
    old_tools = {t.get("name"): t.get("marginal_tokens") or 0 for t in base.get("tools", [])}
    for t in report.measurement.tools:
        if t.name not in old_tools:
            grew.append((t.marginal_tokens, f"tool {t.name} (new) +{t.marginal_tokens:,}"))
        elif t.marginal_tokens > old_tools[t.name]:
            delta = t.marginal_tokens - int(old_tools[t.name])
            grew.append((delta, f"tool {t.name} +{delta:,}"))
    grew.sort(key=lambda g: -g[0])
    what = "; ".join(g[1] for g in grew[:8]) + ("; ..." if len(grew) > 8 else "")
    shown = f"{growth:.1f}%" if before else "from 0"
    report.findings.append(Finding(
        "growth", f"prefix grew {shown} ({before:,} -> {now:,} tokens, threshold "
        f"{max_growth_pct:g}%): {what or 'joins'}", report.agent, max_growth_pct,
        round(growth, 2) if before else None))


def audit_tokens(inventory: Path, blueprint: Path, options: TokensOptions = TokensOptions()
                 ) -> TokensReport:
    """Measure and judge the prefix of each selected agent.

    Args:
        inventory: the inventory file.
        blueprint: the blueprint directory (its runner's prefix builder is the one used).
        options: what to audit and how (:class:`TokensOptions`).

    Raises:
        InputError: bad inventory, role, blueprint, agent name, baseline or counter setup.
        TokenizerError: the offline tokenizer or its data cannot be loaded or verified.
    """
    blueprint = Path(blueprint)
    roles = load_roles(blueprint)
    inv = load_inventory(Path(inventory), set(roles))
    selected = _select(inv, options.agents)
    if options.counter not in ("o200k", "claude-api"):
        raise InputError(f"unknown counter {options.counter!r}", hint="o200k or claude-api")
    prefix_module = load_prefix_module(blueprint)
    skills_dir = blueprint / "skills"
    counter = O200kCounter()
    api: dict[str, ClaudeCountTokens] = {}
    cache = None
    if options.counter == "claude-api":
        client = options.claude_client or anthropic_client()
        cache_path = options.claude_cache or Path(
            os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleetctl" \
            / "claude-count-tokens.json"
        cache = JsonFileCache(cache_path)

    # List each distinct server once, all at the same time. A bridged server is not listed:
    # its tools are not in the prefix.
    used_roles = list(dict.fromkeys(a.role for _, a in selected))
    decls: dict[str, McpServerDecl] = {}
    for role_name in used_roles:
        # --compare default mounts every server, the bridged ones too: list them as well.
        wanted = roles[role_name].mcp_servers if options.compare_default \
            else mcp_servers(roles[role_name].mcp_servers)
        for decl in wanted.values():
            decls.setdefault(_decl_key(decl), decl)
    if options.startup_timeout_s is not None:
        decls = {k: d.model_copy(update={"startup_timeout_s": max(d.startup_timeout_s,
                                                                  options.startup_timeout_s)})
                 for k, d in decls.items()}
    listed = list_servers(decls, blueprint)

    def measure(prefix: Any, model: str | None) -> Measurement:
        if options.counter == "o200k":
            return measure_offline(prefix, counter, prefix_module)
        chosen = model or options.claude_model or DEFAULT_CLAUDE_MODEL
        if chosen not in api:
            api[chosen] = ClaudeCountTokens(client, chosen, cache)
        return measure_claude(prefix, api[chosen], counter, prefix_module)

    per_role: dict[str, tuple[Measurement, tuple[ServerListing, ...], Comparison | None,
                              RoleHarness, Any]] = {}
    counter_failures: dict[str, list[tuple[str | None, str]]] = {}
    for role_name in used_roles:
        role = roles[role_name]
        listings = tuple(_renamed(listed[_decl_key(d)], name)
                         for name, d in mcp_servers(role.mcp_servers).items())
        servers = [prefix_module.McpServerTools(s.name, s.tools, s.instructions)
                   for s in listings if s.measured]
        harness = role_harness_part(blueprint, role)
        try:
            prefix = prefix_module.build_prefix(
                role.prompt, role.skills, skills_dir,
                shell_tool=None if harness.kind is not None else prefix_module.SHELL_TOOL,
                mcp_servers=servers, bridged_servers=bridged_servers(role.mcp_servers),
                model=role.model)
        except prefix_module.PrefixError as exc:
            raise InputError(f"role {role_name}: {exc}") from None
        try:
            measurement = harness.add(measure(prefix, role.model), prefix_module, role.model)
        except CounterError as exc:
            chosen = role.model or options.claude_model or DEFAULT_CLAUDE_MODEL
            counter_failures[role_name] = _counter_culprits(api[chosen], prefix, exc)
            measurement = harness.add(measure_offline(prefix, counter, prefix_module),
                                      prefix_module, role.model)
            per_role[role_name] = (measurement, listings, None, harness, None)
            continue
        comparison = None
        if options.compare_mcp and role.mcp_servers:
            comparison = _compare(prefix_module, role, skills_dir, measurement, listings,
                                  measure, harness)
        before = None
        if options.compare_default:
            before = _compare_default(prefix_module, role, skills_dir, listed, measure,
                                      harness, measurement, listings)
        per_role[role_name] = (measurement, listings, comparison, harness, before)

    counter_info: dict[str, Any] = {"name": counter.name, "exact": True, **counter.provenance()}
    if options.counter == "claude-api":
        models = sorted(api)
        counter_info = {"name": "claude-count-tokens", "exact": True,
                        "model": models[0] if len(models) == 1 else models,
                        "method": "Messages count_tokens, measured as deltas (with minus "
                                  "without each part), cached by request sha256",
                        "requests_sent": sum(a.requests_sent for a in api.values()),
                        "mcp_only_sized_with": counter.provenance()}
        if cache is not None:
            cache.save()
    baseline = _read_baseline(options.baseline, counter_info) if options.baseline else None

    agents = []
    for host, agent in selected:
        role = roles[agent.role]
        measurement, listings, comparison, harness, before = per_role[agent.role]
        report = AgentReport(
            agent=agent.name, host=host, role=agent.role, model=role.model,
            measurement=measurement, window=context_window(role.model),
            budget_tokens=role.budget_tokens, max_tool_tokens=role.max_tool_tokens,
            max_tools=role.max_tools, servers=listings,
            bridged=tuple(bridged_servers(role.mcp_servers)), compare=comparison,
            harness=harness.info(), harness_missing=harness.missing, compare_default=before)
        if harness.missing:
            report.findings.append(Finding("harness", harness.missing, harness.name))
            report.warnings.append("lower bound: the harness's own part (system prompt, "
                                   "built-in tools, reminders) is not counted")
        report.warnings.extend(harness.warnings)
        for server, message in counter_failures.get(agent.role, []):
            report.counter_error = message
            report.findings.append(Finding(
                "counter", (f"MCP server {server}: " if server else "") + message, server))
        if agent.role in counter_failures:
            report.warnings.append("Claude's count failed: these numbers are o200k_base counts "
                                   "made offline instead (a lower bound for Claude's)")
        for s in listings:
            if not s.measured:
                report.findings.append(Finding(
                    "server", f"MCP server {s.name} could not be measured ({s.status}): "
                    f"{s.detail}", s.name))
        for s in listings:
            report.warnings.extend(f"MCP server {s.name}: {flag}" for flag in s.flags)
            if s.measured and s.instructions and s.instructions.strip():
                kept = harness.kind.instructions_kept_chars if harness.kind else None
                cut = kept is not None and len(s.instructions) > kept
                report.instructions.append({
                    "server": s.name, "tokens": counter.count(s.instructions),
                    "chars": len(s.instructions), "harness_keeps_chars": kept, "cut": cut})
                if cut:
                    report.warnings.append(
                        f"MCP server {s.name}: its instructions are {len(s.instructions):,} "
                        f"characters; {harness.name} keeps the first {kept:,} (the rest is cut "
                        "before the model sees it)")
        if any(not s.measured for s in listings):
            report.warnings.append("incomplete: the totals leave out the tools of the servers "
                                   "that could not be measured (a lower bound)")
        use = measurement.tool_use
        if use is not None and use["tokens"] is None:
            report.warnings.append(f"model {use['model']!r} is not in the tool-use prompt table: "
                                   "that prompt is counted as 0")
        _budget_findings(report)
        if baseline is not None:
            base = baseline.get((host, agent.name))
            if base is None:
                report.warnings.append("not in the baseline")
            else:
                _growth_findings(report, base, options.max_growth_pct)
        agents.append(report)
    return TokensReport(counter=counter_info,
                        estimate=CLAUDE_ESTIMATE.to_json() if options.counter == "o200k" else None,
                        agents=agents,
                        baseline=display_path(options.baseline) if options.baseline else None,
                        max_growth_pct=options.max_growth_pct if options.baseline else None)


def _counter_culprits(api: ClaudeCountTokens, prefix: Any, failure: CounterError
                      ) -> list[tuple[str | None, str]]:
    """Which MCP servers' tools Claude's count refuses, each with the provider's message: each
    server's tools are counted alone; when none fails alone (a connection failure, a proxy
    that drops tools), the whole request's failure is reported, for every server it had."""
    servers = list(dict.fromkeys(t.server for t in prefix.tools if t.server is not None))
    out: list[tuple[str | None, str]] = []
    for server in servers:
        tools = [t.sent() for t in prefix.tools if t.server == server]
        try:
            api.check_tools_counted("", tools)
        except CounterError as exc:
            out.append((server, exc.message))
    if not out:
        out = [(server, failure.message) for server in servers] or [(None, failure.message)]
    return out


def _renamed(listing: ServerListing, name: str) -> ServerListing:
    """The same listing under the name this role gives the server."""
    from dataclasses import replace

    return listing if listing.name == name else replace(listing, name=name)


def _compare(prefix_module: Any, role: Role, skills_dir: Path, declared: Measurement,
             listings: tuple[ServerListing, ...], measure: Any,
             harness: RoleHarness | None = None) -> Comparison:
    bridge_skill = prefix_module.BRIDGE_SKILL
    skills = list(role.skills) + ([bridge_skill] if bridge_skill not in role.skills else [])
    servers = tuple(role.mcp_servers)
    try:
        prefix = prefix_module.build_prefix(
            role.prompt, skills, skills_dir,
            shell_tool=None if harness is not None and harness.kind is not None
            else prefix_module.SHELL_TOOL, bridged_servers=servers, model=role.model)
    except prefix_module.PrefixError as exc:
        raise InputError(f"--compare mcp: {exc}",
                         hint=f"the blueprint needs skills/{bridge_skill}/") from None
    bridge = measure(prefix, role.model)
    if harness is not None:
        bridge = harness.add(bridge, prefix_module, role.model)
    complete = all(s.measured for s in listings)
    indexes = ("skills_index", "cli_index")
    added = bridge.tokens_of(indexes) - declared.tokens_of(indexes)
    bridge_tools = bridge.tokens_of(TOOL_PARTS) + added
    return Comparison(
        servers=servers, tools_moved=sum(len(s.tools) for s in listings), bridge=bridge,
        declared_total=declared.total_tokens if complete else None,
        saving_tokens=declared.total_tokens - bridge.total_tokens if complete else None,
        tool_tokens_declared=declared.tokens_of(TOOL_PARTS) if complete else None,
        tool_tokens_bridge=bridge_tools)


@dataclass(frozen=True, slots=True)
class DefaultComparison:
    """A role as its harness runs by default (before) versus as declared (after).

    Before: the harness's default tool set (its profile), every MCP server of the role mounted
    (``via: mcp``: every tool's definition in the prefix), no ``mcp-bridge`` skill. After: the
    role as declared (its ``tools:``, its ``via``).

    Attributes:
        before: the measurement before, or ``None`` when it cannot be made (``reason``).
        after: the measurement as declared.
        tool_tokens_before: always-on tool-definition tokens before (:data:`TOOL_PARTS`).
        tool_tokens_after: the same after, plus what the bridge adds to the skills and CLI
            indexes.
        reason: why there is no ``before`` (no default profile, a server not listed).
    """

    before: Measurement | None
    after: Measurement
    tool_tokens_before: int | None
    tool_tokens_after: int
    reason: str = ""

    @property
    def tool_cut_pct(self) -> float | None:
        """The cut of tool-definition tokens, in percent of before."""
        if not self.tool_tokens_before:
            return None
        return 100.0 * (self.tool_tokens_before - self.tool_tokens_after) \
            / self.tool_tokens_before

    @property
    def prefix_cut_pct(self) -> float | None:
        """The cut of the whole prefix, in percent of before."""
        if self.before is None or not self.before.total_tokens:
            return None
        return 100.0 * (self.before.total_tokens - self.after.total_tokens) \
            / self.before.total_tokens


def _compare_default(prefix_module: Any, role: Role, skills_dir: Path,
                     listed: dict[str, ServerListing], measure: Any, harness: RoleHarness,
                     after: Measurement, listings: tuple[ServerListing, ...]
                     ) -> DefaultComparison:
    bridge_skill = prefix_module.BRIDGE_SKILL
    indexes = ("skills_index", "cli_index")

    def result(before: Measurement | None, reason: str = "") -> DefaultComparison:
        added = 0
        if before is not None:
            added = max(0, after.tokens_of(indexes) - before.tokens_of(indexes)) \
                if bridged_servers(role.mcp_servers) else 0
        return DefaultComparison(before, after,
                                 before.tokens_of(TOOL_PARTS) if before is not None else None,
                                 after.tokens_of(TOOL_PARTS) + added, reason)

    if harness.kind is None:
        return result(None, "the role runs no harness fleetctl can profile")
    if harness.default_profile is None:
        return result(None, f"no profile of {harness.name}'s default tool set in "
                            "harnesses/: run fleetctl tokens --probe")
    if any(not s.measured for s in listings):
        return result(None, "an MCP server could not be listed")
    every = [_renamed(listed[_decl_key(d)], name) for name, d in role.mcp_servers.items()]
    failed = [s.name for s in every if not s.measured]
    if failed:
        return result(None, f"MCP server {', '.join(failed)} could not be listed")
    skills = list(role.skills)
    if bridged_servers(role.mcp_servers) and bridge_skill in skills:
        skills.remove(bridge_skill)  # before bridging, the role had no use for the bridge
    try:
        prefix = prefix_module.build_prefix(
            role.prompt, skills, skills_dir, shell_tool=None,
            mcp_servers=[prefix_module.McpServerTools(s.name, s.tools, s.instructions)
                         for s in every], model=role.model)
    except prefix_module.PrefixError as exc:
        raise InputError(f"--compare default: {exc}") from None
    before = harness.add(measure(prefix, role.model), prefix_module, role.model,
                         harness.default_profile)
    return result(before)
