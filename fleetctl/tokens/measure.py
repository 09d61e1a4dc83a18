"""A prefix measured: its components, its total, and what each tool costs at the margin.

The prefix comes from the runner's own builder, loaded from the blueprint being audited
(``<blueprint>/runner/fleet_runner/prefix.py``, :func:`load_prefix_module`), so the audit measures
what that runner sends (docs/invariants.md, invariant 9).

Two ways to measure, each labelling its numbers:

- **offline** (:func:`measure_offline`), with an exact counter (``o200k_base``): each text part is
  counted on its exact text; the total is the system text plus the ``tools`` array (as JSON) plus
  the fixed tool-use prompt from the per-model table; ``joins`` is what the separators between
  parts add (blank lines, brackets, commas; BPE merges across a boundary can make it negative).
- **Claude's count** (:func:`measure_claude`), through ``count_tokens``: each part is the delta
  between the request with everything and the request without that part, so the fixed tool-use
  prompt is counted once, as its own row, and never per tool.

A tool's cost is **marginal**: the prefix with every tool minus the prefix without that one tool.
Fields only MCP knows (annotations, output schemas...) are not sent; their size is reported apart
(``mcp_only_tokens``) and is in no total.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fleetctl.tokencount.counters import CLAUDE_ESTIMATE, ClaudeCountTokens, Counter, EstimateBand

ORDER = ("role_prompt", "skills_index", "cli_index", "mcp_instructions", "shell_tool",
         "mcp_tools", "tool_use_system_prompt", "joins")
"""Components in report order."""

TOOL_PARTS = ("shell_tool", "mcp_tools", "mcp_instructions", "tool_use_system_prompt",
              "harness_tools")
"""The components that exist because of tools (what the bridge and stripping cut); the
harness's built-in tools (``harness_tools``) come from its profile."""

@dataclass(frozen=True, slots=True)
class Component:
    """One component's tokens.

    Attributes:
        name: the component (:data:`ORDER`).
        tokens: its tokens, or ``None`` when unknown (a model missing from the table).
        method: ``counted`` (its exact text), ``table`` (the per-model table), ``delta``
            (with minus without, from Claude's count) or ``remainder`` (total minus the rest).
        note: what the number is, when that needs saying.
    """

    name: str
    tokens: int | None
    method: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class ToolCost:
    """One tool definition's cost.

    Attributes:
        name: the name the model sees.
        server: its MCP server, or ``None`` for the shell tool.
        marginal_tokens: the prefix with every tool minus the prefix without this one.
        mcp_only_tokens: tokens of its MCP-only fields (not sent; in no total).
        mcp_only_fields: the names of those fields.
    """

    name: str
    server: str | None
    marginal_tokens: int
    mcp_only_tokens: int = 0
    mcp_only_fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Measurement:
    """A measured prefix.

    Attributes:
        counter: the counter's name (``o200k_base``, ``claude-count-tokens``).
        total_tokens: the whole prefix.
        components: every component, in :data:`ORDER`.
        tools: each tool's cost, in prefix order.
        tool_use: the tool-use prompt lookup (``tokens``, ``model``, ``family``, ``tool_choice``,
            ``source``), or ``None`` when there is no tool.
        estimate: for the offline counter, the Claude estimate band ``(low, high)`` of the total.
    """

    counter: str
    total_tokens: int
    components: tuple[Component, ...]
    tools: tuple[ToolCost, ...]
    tool_use: dict[str, Any] | None = None
    estimate: tuple[int, int] | None = None

    def component(self, name: str) -> Component:
        """The component called ``name``."""
        return next(c for c in self.components if c.name == name)

    def tokens_of(self, names: tuple[str, ...]) -> int:
        """The summed tokens of the named components (unknown counts as 0)."""
        return sum(c.tokens or 0 for c in self.components if c.name in names)


def _tool_use(prefix: Any) -> tuple[int | None, dict[str, Any] | None]:
    use = prefix.tool_use
    if use is None:
        return 0, None
    return use.tokens, {"tokens": use.tokens, "model": use.model, "family": use.family,
                        "tool_choice": use.tool_choice, "source": use.source}


def _mcp_only(prefix_module: ModuleType, counter: Counter, tool: Any
              ) -> tuple[int, tuple[str, ...]]:
    if not tool.mcp_only:
        return 0, ()
    return counter.count(prefix_module.tool_json(tool.mcp_only)), tuple(sorted(tool.mcp_only))


def measure_offline(prefix: Any, counter: Counter, prefix_module: ModuleType,
                    band: EstimateBand | None = CLAUDE_ESTIMATE) -> Measurement:
    """Measure ``prefix`` with an exact text counter.

    Args:
        prefix: a ``Prefix`` from the runner's builder.
        counter: the counter (``O200kCounter``).
        prefix_module: the builder's module (for ``tool_json``).
        band: the estimate band to derive (default the Claude band), or ``None``.
    """
    fixed, use = _tool_use(prefix)
    components = [Component(name, counter.count(text), "counted")
                  for name, text in prefix.parts().items()]
    if prefix.tool_use is not None and use is not None:
        note = (f"{use['family']}, tool_choice {use['tool_choice']}: the provider's tokens, from "
                f"its table" if fixed is not None else
                f"unknown: model {use['model']!r} is not in the table; counted as 0")
        components.append(Component("tool_use_system_prompt", fixed, "table", note))
    else:
        components.append(Component("tool_use_system_prompt", 0, "table", "no tools"))
    system = counter.count(prefix.system_text())
    fixed_n = fixed or 0
    total = system + counter.count(prefix.tools_json()) + fixed_n
    joins = total - sum(c.tokens or 0 for c in components)
    components.append(Component("joins", joins, "remainder",
                                "separators between parts (blank lines, brackets, commas)"))
    tools = []
    for i, tool in enumerate(prefix.tools):
        rest = counter.count(prefix.tools_json(without={i}))
        without = system + rest + (fixed_n if len(prefix.tools) > 1 else 0)
        only, fields = _mcp_only(prefix_module, counter, tool)
        tools.append(ToolCost(tool.name, tool.server, total - without, only, fields))
    estimate = None
    if band is not None:
        low, high = band.of(total - fixed_n)
        estimate = (low + fixed_n, high + fixed_n)
    by_name = {c.name: c for c in components}
    return Measurement(counter.name, total, tuple(by_name[n] for n in ORDER), tuple(tools), use,
                       estimate)


def measure_claude(prefix: Any, api: ClaudeCountTokens, counter: Counter,
                   prefix_module: ModuleType) -> Measurement:
    """Measure ``prefix`` with Claude's own count, part by part as deltas.

    A text part's tokens: the prefix minus the prefix without that part. The tools: all tools
    minus the tools without the shell tool (or without the MCP tools), so the fixed tool-use
    prompt stays in both and cancels; it is then the tools block minus those deltas, counted once.
    When one group is all the tools, the fixed prompt cannot be separated by deltas and the
    table's number is used for it (and said so). ``counter`` only sizes the MCP-only fields.
    """
    fixed_table, use = _tool_use(prefix)
    system = prefix.system_text()
    everything = prefix.sent_tools()
    if everything:  # refused, before any other count, when the endpoint drops tool definitions
        api.check_tools_counted(system, everything)
    total = api.prefix_tokens(system, everything)
    components: dict[str, Component] = {}
    parts = prefix.parts()
    for name in ("role_prompt", "skills_index", "cli_index", "mcp_instructions"):
        if parts[name]:
            delta = total - api.prefix_tokens(prefix.system_text(without=name), everything)
            components[name] = Component(name, delta, "delta")
        else:
            components[name] = Component(name, 0, "delta", "empty")
    tools_block = total - api.prefix_tokens(system, [])
    groups = {"shell_tool": {i for i, t in enumerate(prefix.tools) if t.server is None},
              "mcp_tools": {i for i, t in enumerate(prefix.tools) if t.server is not None}}
    used_table = False
    for name, members in groups.items():
        if not members:
            components[name] = Component(name, 0, "delta", "none")
        elif len(members) < len(prefix.tools):
            delta = total - api.prefix_tokens(system, prefix.sent_tools(without=members))
            components[name] = Component(name, delta, "delta")
        else:
            used_table = True
            delta = tools_block - (fixed_table or 0)
            components[name] = Component(name, delta, "delta",
                                         "all the tools: tools block minus the tabled fixed prompt")
    if not prefix.tools:
        components["tool_use_system_prompt"] = Component("tool_use_system_prompt", 0, "delta",
                                                         "no tools")
    elif used_table:
        components["tool_use_system_prompt"] = Component(
            "tool_use_system_prompt", fixed_table, "table",
            "one group of tools only: the fixed prompt cannot be separated by deltas")
    else:
        fixed = tools_block - (components["shell_tool"].tokens or 0) \
            - (components["mcp_tools"].tokens or 0)
        components["tool_use_system_prompt"] = Component(
            "tool_use_system_prompt", fixed, "remainder",
            "measured once: the tools block minus each group's delta")
    joins = total - sum(c.tokens or 0 for c in components.values())
    components["joins"] = Component("joins", joins, "remainder", "what no single part accounts for")
    tools = []
    for i, tool in enumerate(prefix.tools):
        if len(prefix.tools) > 1:
            marginal = total - api.prefix_tokens(system, prefix.sent_tools(without={i}))
        else:
            marginal = tools_block - (fixed_table or 0)
        only, fields = _mcp_only(prefix_module, counter, tool)
        tools.append(ToolCost(tool.name, tool.server, marginal, only, fields))
    return Measurement(api.name, total, tuple(components[n] for n in ORDER), tuple(tools), use)
