"""The ``fleetctl tokens`` report as JSON, Markdown or text tables, all from the same rows.

Every format says which counter made the numbers (encoding, library, data file digest, or
Claude's endpoint and model), labels the Claude band as an estimate with its source, and shows
each agent's status: ``ok``, ``over`` (findings) or ``incomplete`` (a server not measured; the
totals are then a lower bound). The JSON document is described in ``docs/tokens.md``.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from fleetctl.cli.output.markdown import md_code, md_line
from fleetctl.tokens.audit import (
    SCHEMA_VERSION,
    AgentReport,
    Comparison,
    DefaultComparison,
    TokensReport,
)
from fleetctl.tokens.measure import Measurement

ERROR_KINDS = ("server", "harness", "counter")
"""Finding kinds that mean "not measured" (printed ERROR), not "over a limit" (OVER)."""

HEAVIEST = 10
"""How many tools the text and Markdown reports list (JSON lists all)."""


def _share(tokens: int | None, whole: int | None) -> float | None:
    if tokens is None or not whole:
        return None
    return round(tokens / whole, 6)


def component_rows(m: Measurement, window: int | None) -> list[dict[str, Any]]:
    """One row per component: name, tokens, method, note, share of prefix and of context."""
    return [{"name": c.name, "tokens": c.tokens, "method": c.method, "note": c.note,
             "share_of_prefix": _share(c.tokens, m.total_tokens),
             "share_of_context": _share(c.tokens, window)} for c in m.components]


def tool_rows(m: Measurement) -> list[dict[str, Any]]:
    """One row per tool, in prefix order."""
    return [{"name": t.name, "server": t.server, "marginal_tokens": t.marginal_tokens,
             "share_of_prefix": _share(t.marginal_tokens, m.total_tokens),
             "mcp_only_tokens": t.mcp_only_tokens, "mcp_only_fields": list(t.mcp_only_fields)}
            for t in m.tools]


def compare_json(c: Comparison, window: int | None) -> dict[str, Any]:
    """A comparison as JSON."""
    return {"servers": list(c.servers), "tools_moved": c.tools_moved,
            "declared_total_tokens": c.declared_total,
            "bridge_total_tokens": c.bridge.total_tokens,
            "saving_tokens": c.saving_tokens,
            "saving_pct": None if c.saving_pct is None else round(c.saving_pct, 2),
            "tool_tokens_declared": c.tool_tokens_declared,
            "tool_tokens_bridge": c.tool_tokens_bridge,
            "tool_cut_pct": None if c.tool_cut_pct is None else round(c.tool_cut_pct, 2),
            "bridge_components": component_rows(c.bridge, window)}


def agent_json(a: AgentReport) -> dict[str, Any]:
    """One agent's record."""
    m = a.measurement
    window = a.window.tokens
    return {
        "agent": a.agent, "host": a.host, "role": a.role, "model": a.model,
        "status": a.status, "exit_code": a.exit_code,
        "total_tokens": m.total_tokens, "counter": m.counter,
        "estimate": None if m.estimate is None else
        {"name": "claude", "estimate": True, "low": m.estimate[0], "high": m.estimate[1]},
        "context_window_tokens": window, "context_window_source": a.window.source,
        "share_of_context": _share(m.total_tokens, window),
        "components": component_rows(m, window),
        "tools": tool_rows(m),
        "tool_use_system_prompt": m.tool_use,
        "budgets": {"budget_tokens": a.budget_tokens, "max_tool_tokens": a.max_tool_tokens,
                    "max_tools": a.max_tools},
        "servers": [{"name": s.name, "status": s.status, "source": s.source,
                     "tools": len(s.tools), "pages": s.pages, "detail": s.detail,
                     "stderr_tail": s.stderr_tail, "elapsed_s": s.elapsed_s,
                     "instructions": s.instructions is not None} for s in a.servers],
        "bridged_servers": list(a.bridged),
        "findings": [{"kind": f.kind, "message": f.message, "subject": f.subject,
                      "limit": f.limit, "actual": f.actual} for f in a.findings],
        "warnings": list(a.warnings),
        "compare": None if a.compare is None else compare_json(a.compare, window),
        "harness": a.harness, "harness_missing": a.harness_missing,
        "instructions": list(a.instructions),
        "compare_default": None if a.compare_default is None
        else compare_default_json(a.compare_default),
    }


def compare_default_json(c: DefaultComparison) -> dict[str, Any]:
    """``--compare default`` as JSON: per component before/after, the cuts in percent."""
    before = {r.name: r.tokens for r in c.before.components} if c.before else {}
    after = {r.name: r.tokens for r in c.after.components}
    names = list(dict.fromkeys([*before, *after]))
    return {"before_total_tokens": c.before.total_tokens if c.before else None,
            "after_total_tokens": c.after.total_tokens,
            "before_tools": len(c.before.tools) if c.before else None,
            "after_tools": len(c.after.tools),
            "tool_tokens_before": c.tool_tokens_before, "tool_tokens_after": c.tool_tokens_after,
            "tool_cut_pct": None if c.tool_cut_pct is None else round(c.tool_cut_pct, 2),
            "prefix_cut_pct": None if c.prefix_cut_pct is None else round(c.prefix_cut_pct, 2),
            "components": [{"name": n, "before": before.get(n), "after": after.get(n)}
                           for n in names],
            "reason": c.reason}


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def harness_line(a: AgentReport) -> str | None:
    """One line on the harness's part of the prefix (``None``: the role runs none)."""
    h = a.harness
    if h is None:
        return None
    if h["profile"] is None:
        return f"harness {h['name']} (tool set {h['toolset']}): not counted: {a.harness_missing}"
    line = (f"harness {h['name']} {h['version']}, tool set {h['toolset']} ({h['profile']}): "
            f"{h['total_tokens']:,} tokens a turn, {_count(len(h['tools']), 'built-in tool')}")
    if h["toolset"] != "default" and h["default_total_tokens"] is not None:
        line += (f"; its default set ({h['default_tools']} tools): "
                 f"{h['default_total_tokens']:,}: stripping saves {h['saving_tokens']:,} a turn")
    elif h["toolset"] != "default":
        line += "; its default set is not profiled (no saving shown)"
    return line


def to_json(report: TokensReport) -> str:
    """The whole report as one JSON document (``schema_version`` 1)."""
    doc = {"schema_version": SCHEMA_VERSION, "command": "tokens", "exit_code": report.exit_code,
           "counter": report.counter, "estimate": report.estimate,
           "baseline": report.baseline, "max_growth_pct": report.max_growth_pct,
           "agents": [agent_json(a) for a in report.agents]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def provenance_line(report: TokensReport) -> str:
    """Which counter made the numbers, in one line."""
    c = report.counter
    if c.get("name") == "o200k_base":
        return (f"counted with {c['encoding']} ({c['library']}, offline; data "
                f"{c['data_source']} {c['data_file']}, sha256 {c['data_sha256']})")
    return (f"counted with Claude's count_tokens (model {c.get('model')}; deltas, cached by "
            f"request digest; {c.get('requests_sent', 0)} request(s) sent)")


def estimate_line(report: TokensReport) -> str | None:
    """The estimate band's label and source, when there is one."""
    e = report.estimate
    if not e:
        return None
    return (f"Claude estimate = {e['base']} x {e['low_factor']:.2f}..{e['high_factor']:.2f} "
            f"(+ the tabled tool-use prompt): {e['source']}")


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _n(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _headline(a: AgentReport) -> str:
    m = a.measurement
    est = f"; Claude estimate {m.estimate[0]:,}-{m.estimate[1]:,}" if m.estimate else ""
    model = a.model or "default model"
    budget = f", budget {a.budget_tokens:,}" if a.budget_tokens is not None else ""
    lower = " (lower bound)" if a.status == "incomplete" else ""
    return (f"{a.host}/{a.agent} (role {a.role}, {model}): {m.total_tokens:,} tokens{lower}"
            f"{budget} [{a.status}]{est}")


def _heaviest(m: Measurement) -> list[Any]:
    return sorted(m.tools, key=lambda t: (-t.marginal_tokens, t.name))[:HEAVIEST]


def print_text(console: Console, report: TokensReport) -> None:
    """Tables for people: per agent its components, heaviest tools, servers and findings."""
    for a in report.agents:
        m = a.measurement
        window = a.window.tokens
        console.print(_headline(a), markup=False, highlight=False)
        table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
        for column, justify in (("component", "left"), ("tokens", "right"),
                                ("% prefix", "right"), ("% context", "right"),
                                ("how", "left")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for row in component_rows(m, window):
            table.add_row(row["name"], _n(row["tokens"]), _pct(row["share_of_prefix"]),
                          _pct(row["share_of_context"], 2), row["method"])
        table.add_row("total", f"{m.total_tokens:,}", "100.0%",
                      _pct(_share(m.total_tokens, window), 2), m.counter)
        console.print(table)
        if m.tools:
            tools = Table(box=box.SIMPLE, show_edge=False, pad_edge=False,
                          title=f"heaviest tools ({len(m.tools)} in all; marginal tokens)",
                          title_justify="left")
            tools.add_column("tool")
            tools.add_column("tokens", justify="right")
            tools.add_column("% prefix", justify="right")
            tools.add_column("MCP-only (not sent)", justify="right")
            for t in _heaviest(m):
                tools.add_row(t.name, f"{t.marginal_tokens:,}",
                              _pct(_share(t.marginal_tokens, m.total_tokens)),
                              f"{t.mcp_only_tokens:,}" if t.mcp_only_tokens else "")
            console.print(tools)
        for s in a.servers:
            line = f"  MCP server {s.name}: {s.status}, {len(s.tools)} tools in {s.pages} page(s)"
            console.print(line + (f": {s.detail}" if s.detail else ""), markup=False,
                          highlight=False)
            if not s.measured and s.stderr_tail:
                for err_line in s.stderr_tail.splitlines():
                    console.print(f"    stderr| {err_line}", markup=False, highlight=False)
        for row in a.instructions:
            console.print(f"  {_instructions_line(row)}", markup=False, highlight=False)
        for name in a.bridged:
            console.print(f"  {_bridged_line(name)}", markup=False, highlight=False)
        hl = harness_line(a)
        if hl:
            console.print(f"  {hl}", markup=False, highlight=False)
        if a.compare is not None:
            _print_compare(console, a.compare)
        if a.compare_default is not None:
            _print_compare_default(console, a.compare_default)
        for f in a.findings:
            console.print(f"  OVER {f.message}" if f.kind not in ERROR_KINDS
                          else f"  ERROR {f.message}",
                          markup=False, highlight=False)
        for w in a.warnings:
            console.print(f"  note: {w}", markup=False, highlight=False)
        console.print()
    console.print(provenance_line(report), markup=False, highlight=False)
    est = estimate_line(report)
    if est:
        console.print(est, markup=False, highlight=False)


def _instructions_line(row: dict[str, Any]) -> str:
    cut = (f"; cut to {row['harness_keeps_chars']:,} by the harness"
           if row["cut"] else "")
    return (f"MCP server {row['server']}: instructions {row['tokens']:,} tokens "
            f"({row['chars']:,} characters{cut})")


def _bridged_line(name: str) -> str:
    return (f"MCP server {name}: via bridge, one CLI-index line (`mcp-bridge {name} --help`); "
            "its tools are in no prefix (not started)")


def _compare_lines(c: Comparison) -> list[str]:
    servers = ", ".join(c.servers)
    if c.saving_tokens is None:
        return [f"--compare mcp ({servers}): not measured (a server could not be listed); "
                f"never counted as a saving. With the bridge: {c.bridge.total_tokens:,} tokens."]
    if not c.tools_moved:
        return [f"--compare mcp ({servers}): every server is already behind the bridge CLI "
                f"(via: bridge): nothing to move; the prefix is {c.bridge.total_tokens:,} tokens"]
    return [f"--compare mcp ({servers}): as declared {c.declared_total:,} tokens, with the "
            f"bridge CLI {c.bridge.total_tokens:,}: saves {c.saving_tokens:,} "
            f"({c.saving_pct:.1f}%) a turn",
            f"  tool-definition tokens {c.tool_tokens_declared:,} -> {c.tool_tokens_bridge:,} "
            f"(cut {c.tool_cut_pct:.1f}%); {c.tools_moved} tools still reachable as "
            f"`mcp-bridge SERVER TOOL`"]


def _compare_default_lines(c: DefaultComparison) -> list[str]:
    if c.before is None:
        return [f"--compare default: not measured: {c.reason}"]
    return [f"--compare default: before (harness default tools, every MCP server mounted) "
            f"{c.before.total_tokens:,} tokens, {_count(len(c.before.tools), 'tool')}; after (as "
            f"declared) {c.after.total_tokens:,}, {_count(len(c.after.tools), 'tool')}: prefix cut "
            f"{c.prefix_cut_pct:.1f}%",
            f"  tool-definition tokens {c.tool_tokens_before:,} -> {c.tool_tokens_after:,} "
            f"(cut {c.tool_cut_pct:.1f}%)"]


def _print_compare_default(console: Console, c: DefaultComparison) -> None:
    if c.before is not None:
        table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False,
                      title="before (harness default, MCP servers mounted) and after (as "
                            "declared)", title_justify="left")
        for column, justify in (("component", "left"), ("before", "right"),
                                ("after", "right"), ("cut", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for row in compare_default_json(c)["components"]:
            b, a = row["before"], row["after"]
            cut = "-" if not b or a is None else f"{100 * (b - a) / b:.1f}%"
            table.add_row(row["name"], _n(b), _n(a), cut)
        table.add_row("total", f"{c.before.total_tokens:,}", f"{c.after.total_tokens:,}",
                      f"{c.prefix_cut_pct:.1f}%")
        console.print(table)
    for line in _compare_default_lines(c):
        console.print("  " + line, markup=False, highlight=False)


def _print_compare(console: Console, c: Comparison) -> None:
    for line in _compare_lines(c):
        console.print("  " + line, markup=False, highlight=False)


def to_markdown(report: TokensReport) -> str:
    """The report as Markdown: a section per agent."""
    out = ["# fleetctl tokens", ""]
    for a in report.agents:
        m = a.measurement
        window = a.window.tokens
        out += [f"## {md_line(_headline(a))}", "",
                "| component | tokens | % prefix | % context | how |",
                "| --- | ---: | ---: | ---: | --- |"]
        for row in component_rows(m, window):
            out.append(f"| {row['name']} | {_n(row['tokens'])} | {_pct(row['share_of_prefix'])} "
                       f"| {_pct(row['share_of_context'], 2)} | {row['method']} |")
        out.append(f"| **total** | **{m.total_tokens:,}** | 100.0% | "
                   f"{_pct(_share(m.total_tokens, window), 2)} | {m.counter} |")
        out.append("")
        if m.tools:
            out += [f"Heaviest tools ({len(m.tools)} in all, marginal tokens):", "",
                    "| tool | tokens | % prefix | MCP-only (not sent) |",
                    "| --- | ---: | ---: | ---: |"]
            for t in _heaviest(m):
                out.append(f"| {md_code(t.name)} | {t.marginal_tokens:,} | "
                           f"{_pct(_share(t.marginal_tokens, m.total_tokens))} | "
                           f"{t.mcp_only_tokens or ''} |")
            out.append("")
        for s in a.servers:
            out.append(f"- MCP server `{s.name}`: {s.status}, {len(s.tools)} tools"
                       + (f": {md_line(s.detail)}" if s.detail else ""))
        out += [f"- {md_line(_instructions_line(row))}" for row in a.instructions]
        out += [f"- {md_line(_bridged_line(name))}" for name in a.bridged]
        hl = harness_line(a)
        if hl:
            out.append(f"- {md_line(hl)}")
        if a.compare is not None:
            out += [f"- {md_line(line.strip())}" for line in _compare_lines(a.compare)]
        if a.compare_default is not None:
            out += [f"- {md_line(line.strip())}"
                    for line in _compare_default_lines(a.compare_default)]
        out += [f"- **over**: {md_line(f.message)}" if f.kind not in ERROR_KINDS else
                f"- **error**: {md_line(f.message)}" for f in a.findings]
        out += [f"- note: {md_line(w)}" for w in a.warnings]
        out.append("")
    out.append(f"_{md_line(provenance_line(report))}_")
    est = estimate_line(report)
    if est:
        out += ["", f"_{md_line(est)}_"]
    return "\n".join(out) + "\n"


def probe_json(runs: list[Any]) -> str:
    """``fleetctl tokens --probe`` as one JSON document (counts and digests only)."""
    doc = {"schema_version": SCHEMA_VERSION, "command": "tokens --probe",
           "exit_code": 1 if any(r.unexpected or r.missing for r in runs) else 0,
           "probes": [{"role": r.role, "argv": list(r.result.argv),
                       "exit_code": r.result.exit_code, "elapsed_s": r.result.elapsed_s,
                       "written": str(r.path) if r.path else None,
                       "declared_tools": None if r.declared_tools is None
                       else list(r.declared_tools),
                       "unexpected_tools": list(r.unexpected), "missing_tools": list(r.missing),
                       "profile": r.result.profile.to_json()} for r in runs]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def probe_text(runs: list[Any]) -> str:
    """``fleetctl tokens --probe`` for people: one block per tool set probed."""
    out = []
    for r in runs:
        p = r.result.profile
        c = {k: v["tokens"] for k, v in p.components.items()}
        out.append(f"{p.harness} {p.version}, tool set {p.toolset} (role {r.role}; "
                   f"{' '.join(r.result.argv)}; exit {r.result.exit_code}, "
                   f"{r.result.elapsed_s:.1f} s)")
        out.append(f"  system prompt {c['system_prompt']:,}, built-in tools {c['tools']:,} "
                   f"({len(p.tools)}), reminders {c['reminders']:,}: {p.total_tokens:,} "
                   f"o200k_base tokens a turn")
        heavy = sorted(p.tools, key=lambda t: (-t["tokens"], t["name"]))[:HEAVIEST]
        if heavy:
            out.append("  heaviest tools: " + ", ".join(f"{t['name']} {t['tokens']:,}"
                                                        for t in heavy))
        if r.unexpected:
            out.append(f"  FINDING: sent built-in tools not declared: {', '.join(r.unexpected)}")
        if r.missing:
            out.append(f"  FINDING: declared tools not sent: {', '.join(r.missing)}")
        out.append(f"  profile: {r.path}" if r.path else "  profile: not written")
    return "\n".join(out) + "\n"
