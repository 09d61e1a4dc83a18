"""``fleetctl tokens --live`` for people (text), for pages (Markdown) and for machines (JSON,
``docs/tokens.md``), all from the report's one JSON record."""

from __future__ import annotations

import json
import re
from typing import Any

from fleetctl.cli.output.markdown import md_text
from fleetctl.tokens.live import LiveReport


def _n(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _agent_lines(a: dict[str, Any]) -> list[str]:
    """The report of one agent, as plain lines (shared by text and Markdown)."""
    head = f"{a['host']}/{a['agent']} (role {a['role']}): "
    if a["status"] == "host-error":
        return [head + f"host error: {a['error']}"]
    if a["status"] == "unreadable":
        return [head + f"ledger unreadable: {a['error']}"]
    if a["status"] == "missing":
        return [head + f"no ledger yet ({a['path']})"]
    p = a["prefix_tokens"]
    out = [head + f"{a['turns']:,} turns in {a['tasks']:,} tasks"
           + (f" ({a['interrupted']} interrupted)" if a["interrupted"] else "")
           + (f", {a['first']} .. {a['last']}" if a["first"] else "")]
    counters = ", ".join(
        c["name"] + (f" ({c['note']})" if c["note"] else "") for c in a["token_counters"]) or "-"
    out.append(f"  prefix tokens per turn: median {_n(p['median'])}, p95 {_n(p['p95'])}, "
               f"max {_n(p['max'])}, all turns {_n(p['sum'])}; counter {counters}")
    if p["components_median"]:
        out.append("  prefix components (median): " + ", ".join(
            f"{k} {_n(v)}" for k, v in p["components_median"].items()))
    out.append(f"  task prompt tokens (median): {_n(a['task_prompt_tokens_median'])}")
    u = a["usage"]
    if u["turns_with_usage"]:
        out.append(f"  model-reported usage ({u['turns_with_usage']} of {a['turns']} turns), "
                   "per turn: " + ", ".join(f"{k} {_n(v)}" for k, v in u["per_turn_mean"].items()))
    else:
        out.append("  model-reported usage: none (the agent command reported no usage)")
    out.extend(_provider_lines(a["provider"]))
    out.extend(_calls_lines(a["calls"]))
    m = a["malformed"]
    if m["count"]:
        out.append(f"  malformed lines: {m['count']} (skipped)")
        out.extend(f"    line {e['line_number']}: {e['reason']}: {e['line'][:80]!r}"
                   for e in m["examples"])
    if a["partial"]:
        out.append(f"  partial line: {a['partial']} (being written as it was read; skipped)")
    return out


def _provider_lines(p: dict[str, Any]) -> list[str]:
    """The provider's count beside fleetctl's, with the difference."""
    if not p["turns"]:
        return []
    ours = p["fleetctl_tokens_per_call"]
    line = (f"  provider prompt tokens per run (input + cache creation + cache read, median of "
            f"{p['turns']}): {_n(p['prompt_tokens_median'])}; fleetctl per model call: ")
    if ours is None:
        return [line + f"unknown ({p['harness_note']})"]
    sign = "+" if p["difference_tokens"] >= 0 else ""
    return [line + f"{_n(ours)} (runner prefix + harness + task prompt; harness "
                   f"{p['harness_note']}): difference {sign}{_n(p['difference_tokens'])} "
                   f"({sign}{p['difference_pct']}%); a run of several model calls re-sends the "
                   "prefix each time"]


DEAD_SHOWN = 12
"""How many dead-weight items per agent the text names (JSON has all)."""


def _counts(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "not recorded"
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def _calls_lines(c: dict[str, Any]) -> list[str]:
    """Declared, called and dead weight, as plain lines."""
    bridged = ", via bridge"
    servers = ", ".join(
        s["name"] + (f" ({s['tools']} tools{bridged if s.get('via') == 'bridge' else ''})"
                     if s["status"] == "ok"
                     else f" (not listed: {s['status']}: {s['detail']})")
        for s in c["mcp_servers"]) or "(none)"
    out = ["  declared: CLIs " + (", ".join(c["declared_clis"]) or "(none)")
           + "; MCP servers " + servers]
    if c["called"] is None:
        out.append(f"  called: {c['note']}")
        return out
    called = c["called"]
    out.append(f"  called ({c['note']}): CLIs {_counts(called['clis'])}; MCP tools "
               f"{_counts(called['tools'])}")
    und = c["called_undeclared"]
    if und["clis"] or und["tools"]:
        out.append("  called but not declared: " + ", ".join(und["clis"] + und["tools"]))
    dead = c["dead_weight"]
    items = ([("CLI", i) for i in dead["clis"] or []]
             + [("bridged server", i) for i in dead.get("bridged_servers") or []]
             + [("tool", i) for i in dead["tools"] or []])
    unknown = [k for k, v in (("CLIs", dead["clis"]), ("MCP tools", dead["tools"])) if v is None]
    if not items:
        out.append("  dead weight (declared, never called): none"
                   + (f" ({' and '.join(unknown)} not recorded)" if unknown else ""))
        return out
    shown = ", ".join(f"{kind} {i['name']}"
                      + (f" ({i['prefix_tokens']:,})" if i["prefix_tokens"] is not None else "")
                      for kind, i in items[:DEAD_SHOWN])
    more = f", and {len(items) - DEAD_SHOWN} more" if len(items) > DEAD_SHOWN else ""
    total = (f": {dead['prefix_tokens']:,} prefix tokens a turn ({c['prefix_counter']})"
             if dead["prefix_tokens"] is not None else
             f" ({c['prefix_note'] or 'prefix tokens not known'})")
    out.append(f"  dead weight (declared, never called): {shown}{more}{total}"
               + (f"; {' and '.join(unknown)} not recorded" if unknown else ""))
    return out


def _dead_cell(c: dict[str, Any]) -> str:
    """The Markdown table's dead-weight cell: items and their prefix tokens, or why not."""
    if c["called"] is None:
        return "not recorded"
    dead = c["dead_weight"]
    n = sum(len(dead.get(k) or []) for k in ("clis", "bridged_servers", "tools"))
    tokens = f" ({dead['prefix_tokens']:,} tokens)" if dead["prefix_tokens"] is not None else ""
    return f"{n}{tokens}"


def _footer(doc: dict[str, Any]) -> list[str]:
    out = []
    for h in doc["hosts"]:
        if h["status"] != "ok":
            out.append(f"host {h['host']}: {h['status']}: {h['error']}")
    if doc["since"]:
        out.append(f"only turns after {doc['since']}")
    if doc["exit_code"]:
        out.append("incomplete: a host or a ledger could not be read (exit 2)")
    return out


def to_text(report: LiveReport) -> str:
    """The report for people: a block per agent, then the hosts that failed."""
    doc = report.to_json()
    lines: list[str] = []
    for a in doc["agents"]:
        lines.extend(_agent_lines(a))
    lines.extend(_footer(doc))
    return "\n".join(lines) + "\n"


def to_markdown(report: LiveReport) -> str:
    """The report as Markdown: one table of agents, then each agent's details."""
    doc = report.to_json()
    out = ["| agent | status | turns | median prefix | p95 prefix | usage in/turn | "
           "usage out/turn | counter | malformed | partial | dead weight |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for a in doc["agents"]:
        p = a["prefix_tokens"]
        per = a["usage"]["per_turn_mean"]
        out.append(f"| {md_text(a['host'] + '/' + a['agent'])} | {a['status']} | {a['turns']} | "
                   f"{_n(p['median'])} | {_n(p['p95'])} | {_n(per.get('input_tokens'))} | "
                   f"{_n(per.get('output_tokens'))} | "
                   f"{', '.join(c['name'] for c in a['token_counters']) or '-'} | "
                   f"{a['malformed']['count']} | {a['partial']} | {_dead_cell(a['calls'])} |")
    out.append("")
    for a in doc["agents"]:
        lines = _agent_lines(a)
        # A fence longer than any run of backticks in the lines, so none can close it early.
        fence = "`" * max(3, 1 + max((len(run) for line in lines
                                      for run in re.findall(r"`+", line)), default=0))
        out.extend([f"{fence}text", *lines, fence])
    out.extend(f"- {md_text(line)}" for line in _footer(doc))
    return "\n".join(out) + "\n"


def to_json(report: LiveReport) -> str:
    """The report as one JSON document."""
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"
