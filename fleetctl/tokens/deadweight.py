"""Dead weight: what a role puts in every turn's prefix that its agent never uses.

A role declares CLIs (each executable in its skills' ``bin/``, one line each in the CLI index)
and MCP servers: a ``via: mcp`` server's tools are one definition each in the tools array, a
``via: bridge`` server is one line in the CLI index (``mcp-bridge SERVER --help``) and its tools
are reached through the ``mcp-bridge`` CLI, at no cost per tool. Every turn pays for all of it.
Since the runner records, per ledger line, the CLIs a turn invoked (``"calls": {"<cli>":
<count>}``) and the MCP tools it called through the ``mcp-bridge`` CLI (``"tool_calls":
{"<server>/<tool>": <count>}``), ``fleetctl tokens --live`` can set the two side by side:
**dead weight** is what is declared and was never called in the turns read.

Two halves:

- :func:`declared_by_role`: what each role declares, from the same sources as the audit
  (:mod:`fleetctl.tokens.audit`): the skills' ``bin/`` directories, the MCP servers listed for
  real (:func:`fleetctl.tokens.mcp_list.list_servers`), and each item's prefix tokens counted
  with the offline ``o200k_base`` counter on the prefix the runner's own builder makes (a
  bridged server's tools add 0 each; its CLI-index line is dead weight when none of its tools
  was called);
- :func:`summarise_calls`: the calls summed over ledger records, set against a declaration.

Lines written by a runner that does not record calls have neither key. When no line read has
``calls`` the calls are *not recorded*, never "never called": nothing is guessed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetctlError

CALLS_KEY = "calls"
"""A ledger line's CLI calls: ``{"<cli name>": <count>}`` (the skills' ``bin/`` executables)."""
TOOL_CALLS_KEY = "tool_calls"
"""A ledger line's MCP tool calls through ``mcp-bridge``: ``{"<server>/<tool>": <count>}``."""


@dataclass(frozen=True, slots=True)
class DeclaredItem:
    """One declared CLI or MCP tool, and what it adds to every turn's prefix.

    Attributes:
        name: the CLI's name, or ``SERVER/TOOL`` for an MCP tool (the keys of a ledger line's
            ``calls`` and ``tool_calls``).
        owner: the skill the CLI comes from, or the tool's MCP server.
        prefix_tokens: ``o200k_base`` tokens it adds to each turn's prefix: for a CLI, its line
            in the CLI index (the index with it minus the index without it, header included when
            it is the only one); for a tool, its marginal cost (the prefix with every tool minus
            the prefix without it, as in ``fleetctl tokens``). ``None`` when not known.
    """

    name: str
    owner: str
    prefix_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ServerState:
    """How listing one declared MCP server went.

    Attributes:
        name: the server's name in the role.
        status: ``ok`` or a failure status of :mod:`fleetctl.tokens.mcp_list`.
        tools: how many tools it listed (0 unless ``ok``).
        detail: one line when not ``ok``, else empty.
        via: ``mcp`` (its tools in the prefix) or ``bridge`` (one CLI-index line).
        line_tokens: for a bridged server, ``o200k_base`` tokens of its CLI-index line (the
            system text with it minus without it); ``None`` otherwise or when not counted.
    """

    name: str
    status: str
    tools: int = 0
    detail: str = ""
    via: str = "mcp"
    line_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Declared:
    """What one role declares, for dead weight.

    Attributes:
        clis: its CLIs, sorted by name (a name in two skills once, with the first skill).
        tools: the MCP tools of its servers that could be listed, in the role's server order
            then the server's order.
        servers: each declared MCP server and how listing it went.
        counter: the counter of ``prefix_tokens`` (``o200k_base``), or ``None`` when none
            could be counted.
        note: why prefix tokens are not known (empty when they are).
    """

    clis: tuple[DeclaredItem, ...] = ()
    tools: tuple[DeclaredItem, ...] = ()
    servers: tuple[ServerState, ...] = ()
    counter: str | None = None
    note: str = ""


def _skill_clis(bin_dir: Path) -> list[str]:
    """The CLIs of one ``bin/`` directory, by the builder's rule (a regular file or symlink
    whose name does not start with ``.``), sorted; none when it cannot be read."""
    try:
        names = os.listdir(bin_dir)
    except OSError:
        return []
    return sorted(n for n in names if not n.startswith(".") and (
        (bin_dir / n).is_symlink() or (bin_dir / n).is_file()))


def _cli_line_tokens(prefix: Any, counter: Any, cli: str, start: str | None = None
                     ) -> int | None:
    """``o200k_base`` tokens of ``cli``'s CLI-index line (or of the line starting with
    ``start``): the system text with it minus the system text without it (the index's header
    goes with the last line); ``None`` when the index has no line for it."""
    start = start or f"- {cli} (skill "
    lines = prefix.components.get("cli_index", "").split("\n")
    mine = {i for i, line in enumerate(lines) if i and line.startswith(start)}
    if not mine:
        return None
    rest = [line for i, line in enumerate(lines) if i not in mine]
    without = replace(prefix, components={**prefix.components,
                                          "cli_index": "\n".join(rest) if len(rest) > 1 else ""})
    return counter.count(prefix.system_text()) - counter.count(without.system_text())


def declared_by_role(blueprint: Path, roles: dict[str, Any], role_names: Iterable[str]
                     ) -> dict[str, Declared]:
    """What each named role declares, with each CLI's and MCP tool's prefix tokens.

    Each distinct MCP server is listed once, all at the same time (a stdio server is started,
    as ``fleetctl tokens`` does). Never fails on a prefix that cannot be counted: a missing
    runner prefix builder, a tokenizer that cannot be loaded, or a role whose prefix cannot be
    built leaves ``prefix_tokens`` ``None`` and says why in ``note``; a server that cannot be
    listed has its status in ``servers`` and no tools.

    Args:
        blueprint: the blueprint directory (skills, the runner's prefix builder).
        roles: role name → ``fleetctl.blueprint.Role``.
        role_names: the roles wanted.

    Returns:
        role name → :class:`Declared`.
    """
    from fleetctl.roledecl import VIA_BRIDGE, bridged_servers
    from fleetctl.tokens.audit import _decl_key, _renamed

    blueprint = Path(blueprint)
    wanted = list(dict.fromkeys(role_names))
    skills_dir = blueprint / "skills"
    decls: dict[str, Any] = {}
    for name in wanted:
        for decl in roles[name].mcp_servers.values():
            decls.setdefault(_decl_key(decl), decl)
    listed: dict[str, Any] = {}
    if decls:
        from fleetctl.tokens.mcp_list import list_servers

        listed = list_servers(decls, blueprint)
    prefix_module = counter = None
    why = ""
    try:
        from fleetctl.tokencount.prefixmodule import load_prefix_module

        prefix_module = load_prefix_module(blueprint)
        from fleetctl.tokencount.counters import O200kCounter

        counter = O200kCounter()
    except FleetctlError as exc:  # no builder (InputError), no tokenizer (TokenizerError)
        why = f"prefix tokens not counted: {exc}"
    out: dict[str, Declared] = {}
    for name in wanted:
        role = roles[name]
        owner: dict[str, str] = {}
        for skill in role.skills:
            for cli in _skill_clis(skills_dir / skill / "bin"):
                owner.setdefault(cli, skill)
        listings = [_renamed(listed[_decl_key(d)], server)
                    for server, d in role.mcp_servers.items()]
        via = {server: d.via for server, d in role.mcp_servers.items()}
        bridged = bridged_servers(role.mcp_servers)
        cli_tokens: dict[str, int | None] = {}
        tool_tokens: dict[str, int | None] = {}
        line_tokens: dict[str, int | None] = {}
        note = why
        if prefix_module is not None and counter is not None:
            try:
                prefix = prefix_module.build_prefix(
                    role.prompt, role.skills, skills_dir, shell_tool=prefix_module.SHELL_TOOL,
                    mcp_servers=[prefix_module.McpServerTools(s.name, s.tools, s.instructions)
                                 for s in listings if s.measured and via[s.name] != VIA_BRIDGE],
                    bridged_servers=bridged, model=role.model)
            except prefix_module.PrefixError as exc:
                note = f"prefix tokens not counted: role {name}: {exc}"
            else:
                cli_tokens = {cli: _cli_line_tokens(prefix, counter, cli) for cli in owner}
                bridge = prefix_module.BRIDGE_SKILL
                line_tokens = {server: _cli_line_tokens(
                    prefix, counter, bridge, f"- {bridge} {server} (MCP server {server},")
                    for server in bridged}
                # Behind the bridge a tool is in no prefix: it adds nothing a turn.
                tool_tokens.update({f"{s.name}/{t.get('name', '')}": 0
                                    for s in listings if s.measured and s.name in bridged
                                    for t in s.tools})
                if any(t.server is not None for t in prefix.tools):
                    from fleetctl.tokens.measure import measure_offline

                    costs = measure_offline(prefix, counter, prefix_module, band=None).tools
                    tool_tokens.update({f"{t.server}/{t.mcp_name}": c.marginal_tokens
                                        for t, c in zip(prefix.tools, costs, strict=True)
                                        if t.server is not None})
        servers = tuple(ServerState(s.name, s.status, len(s.tools) if s.measured else 0,
                                    s.detail, via[s.name], line_tokens.get(s.name))
                        for s in listings)
        clis = tuple(DeclaredItem(cli, owner[cli], cli_tokens.get(cli)) for cli in sorted(owner))
        tools = tuple(DeclaredItem(f"{s.name}/{t.get('name', '')}", s.name,
                                   tool_tokens.get(f"{s.name}/{t.get('name', '')}"))
                      for s in listings if s.measured for t in s.tools)
        out[name] = Declared(clis, tools, servers,
                             counter.name if counter is not None and not note else None, note)
    return out


def call_counts_problem(record: dict[str, Any]) -> str | None:
    """Why a ledger record's ``calls`` or ``tool_calls`` is unusable, or ``None`` (absent or
    ``null`` is fine: a line from an older runner)."""
    for key in (CALLS_KEY, TOOL_CALLS_KEY):
        value = record.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0
                for n in value.values()):
            return f"{key} is not an object of counts"
    return None


def _tally(records: list[dict[str, Any]], key: str) -> tuple[int, dict[str, int]]:
    """``(turns whose line has key, name → calls summed over them)``; zero counts dropped."""
    turns = 0
    counts: dict[str, int] = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, dict):
            turns += 1
            for name, n in value.items():
                if n:
                    counts[str(name)] = counts.get(str(name), 0) + n
    return turns, dict(sorted(counts.items()))


def _dead(items: tuple[DeclaredItem, ...], owner_key: str, called: dict[str, int] | None
          ) -> list[dict[str, Any]] | None:
    if not items:
        return []
    if called is None:
        return None
    return [{"name": i.name, owner_key: i.owner, "prefix_tokens": i.prefix_tokens}
            for i in items if i.name not in called]


def _dead_bridged(servers: tuple[ServerState, ...], called: dict[str, int] | None
                  ) -> list[dict[str, Any]] | None:
    """The bridged servers none of whose tools was called: their CLI-index lines."""
    bridged = [s for s in servers if s.via == "bridge"]
    if not bridged:
        return []
    if called is None:
        return None
    return [{"name": s.name, "prefix_tokens": s.line_tokens} for s in bridged
            if not any(n.partition("/")[0] == s.name for n in called)]


def summarise_calls(records: list[dict[str, Any]], declared: Declared) -> dict[str, Any]:
    """The calls of the turns in ``records`` against what the role declares (JSON-ready).

    Args:
        records: the ledger records of the turns read (already filtered by ``--since``).
        declared: the role's declaration (:func:`declared_by_role`).

    Returns:
        ``declared_clis`` and ``declared_mcp_servers`` (names), ``declared_mcp_tools``
        (``SERVER/TOOL``, bridged servers' too), ``mcp_servers`` (``name``, ``via``,
        ``status``, ``tools``, ``detail``),
        ``recorded_turns`` (``calls``, ``tool_calls``: how many turns' lines have each key),
        ``called`` (``None`` when no line has either key, else ``clis`` and ``tools``: name →
        calls summed, each ``None`` when not recorded), ``called_undeclared`` (``clis``,
        ``tools``: called but not declared), ``dead_weight`` (``clis``: ``[{name, skill,
        prefix_tokens}]``, ``tools``: ``[{name, server, prefix_tokens}]`` (0 for a bridged
        server's tool), ``bridged_servers``: ``[{name, prefix_tokens}]`` (bridged servers none
        of whose tools was called: their CLI-index lines), each ``None`` when the calls are not
        recorded and something is declared; ``prefix_tokens``: theirs summed,
        tokens per turn, ``None`` when neither list is known or nothing could be counted),
        ``prefix_counter`` (``o200k_base`` or ``None``), ``prefix_note`` and ``note`` (one line
        for people). An empty declaration is never dead weight: its list is ``[]``.
    """
    cli_turns, cli_calls = _tally(records, CALLS_KEY)
    tool_turns, tool_calls = _tally(records, TOOL_CALLS_KEY)
    clis = cli_calls if cli_turns else None
    tools = tool_calls if tool_turns else None
    dead_clis = _dead(declared.clis, "skill", clis)
    dead_tools = _dead(declared.tools, "server", tools)
    dead_bridged = _dead_bridged(declared.servers, tools)
    dead_tokens = None
    if (dead_clis is not None or dead_tools is not None) and declared.counter is not None:
        dead_tokens = sum(i["prefix_tokens"] or 0 for d in (dead_clis, dead_tools, dead_bridged)
                          if d for i in d)
    declared_names = {i.name for i in declared.clis}
    declared_tools = {i.name for i in declared.tools}
    turns = len(records)
    if clis is None and tools is None:
        note = ("not recorded (no ledger line read has \"calls\": written by a runner that does "
                "not record them): the dead weight, declared but never called, cannot be told")
    else:
        note = (f"recorded in {max(cli_turns, tool_turns)} of {turns} turns"
                + ("" if max(cli_turns, tool_turns) == turns
                   else "; the other lines are from a runner that did not record calls"))
    unlisted = [s.name for s in declared.servers if s.status != "ok"]
    if unlisted:
        note += (f"; MCP server(s) {', '.join(unlisted)} could not be listed: their tools are "
                 "not in the dead weight")
    return {
        "declared_clis": [i.name for i in declared.clis],
        "declared_mcp_servers": [s.name for s in declared.servers],
        "declared_mcp_tools": [i.name for i in declared.tools],
        "mcp_servers": [{"name": s.name, "via": s.via, "status": s.status, "tools": s.tools,
                         "detail": s.detail} for s in declared.servers],
        "recorded_turns": {"calls": cli_turns, "tool_calls": tool_turns},
        "called": None if clis is None and tools is None else {"clis": clis, "tools": tools},
        "called_undeclared": {
            "clis": sorted(n for n in clis or {} if n not in declared_names),
            "tools": sorted(n for n in tools or {} if n not in declared_tools
                            and n.partition("/")[0] not in unlisted)},
        "dead_weight": {"clis": dead_clis, "tools": dead_tools,
                        "bridged_servers": dead_bridged, "prefix_tokens": dead_tokens},
        "prefix_counter": declared.counter,
        "prefix_note": declared.note,
        "note": note,
    }
