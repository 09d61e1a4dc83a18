"""The prompt prefix: what the model receives before the task on every turn (DESIGN.md §2).

One builder, used by the runner to make the prefix it sends and by ``fleetctl tokens`` to
measure the very same text (docs/invariants.md, invariant 9). It reads only its arguments and
the skills directory, holds no state, imports only the standard library, and importing it does
nothing.

The runner itself sends three text components, kept apart so each can be measured on its own:

``role_prompt``
    the role's system prompt, as written in the role file (trailing whitespace removed).
``skills_index``
    one line per skill: its name and the ``summary:`` from the front matter of its ``SKILL.md``.
``cli_index``
    one line per CLI in ``skills/<name>/bin/``: its name, its skill, and how to get its usage
    (``<cli> --help``); and one line per MCP server reached through the ``mcp-bridge`` CLI (a
    role's ``via: bridge`` servers), in name order. Usage itself is not in the prefix: it costs
    nothing until asked for.

The text (:attr:`Prefix.text`) is the non-empty components joined by one blank line, in that
order. The skills directory has the same layout in the blueprint (``blueprint/skills``) and in a
release (``<release>/skills``), so both give the same prefix. A CLI is any regular file or symlink
in ``bin/`` whose name does not start with ``.``, whatever its mode on disk (a checkout's mode bits
are not the shipped ones).

The agent host (the agent CLI the runner starts) adds the rest of what the model receives, and the
builder describes that too, so the audit can measure it (none of it is in :attr:`Prefix.text`):

``shell_tool``
    the one shell tool's definition (:data:`SHELL_TOOL` unless the caller gives another).
``mcp_tools``
    one definition per tool of each MCP server a role still declares, as the model receives it:
    ``{"name": "mcp__<server>__<tool>", "description": ..., "input_schema": ...}``. Fields that
    only MCP knows (``annotations``, ``outputSchema``, ``title``, ``_meta``, ``icons``...) are not
    sent to the model; they are kept apart in :attr:`ToolDef.mcp_only`.
``mcp_instructions``
    each MCP server's ``instructions`` (from its ``initialize`` result), added to the system
    prompt under a heading per server.
``tool_use_system_prompt``
    the fixed prompt the provider adds once when any tool is present; its size comes from a
    per-model table (:func:`tool_use_prompt`), never from text.

Tool definitions are measured as the JSON the Messages API receives in its ``tools`` array
(:func:`tool_json`: compact separators, UTF-8 kept, keys in the order above).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPONENTS = ("role_prompt", "skills_index", "cli_index")
"""The runner's text components, in the order they appear in the text."""

TOOL_COMPONENTS = ("shell_tool", "mcp_tools", "mcp_instructions", "tool_use_system_prompt")
"""What the agent host adds, in the order :meth:`Prefix.parts` lists the text ones."""

NO_SUMMARY = "(no summary in SKILL.md)"

BRIDGE_SKILL = "mcp-bridge"
"""The skill whose CLI reaches MCP servers' tools as subcommands (``mcp-bridge SERVER TOOL``)."""

MCP_TOOL_PREFIX = "mcp__{server}__{tool}"
"""How an agent host names an MCP tool to the model (Claude Code's convention)."""

MCP_SENT_FIELDS = ("name", "description", "inputSchema")
"""The fields of an MCP tool that reach the model; every other field is MCP-only."""

SHELL_TOOL: dict[str, Any] = {
    "name": "bash",
    "description": ("Run a command line with /bin/sh in your workspace and get back its output "
                    "and exit status. The CLIs of your skills are on PATH: run `CLI --help` "
                    "before first use."),
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command line to run."}},
        "required": ["command"],
    },
}
"""The one shell tool an agent is given: its whole definition, as the model receives it."""

TOOL_USE_DOCS = "https://docs.claude.com/en/docs/agents-and-tools/tool-use/overview#pricing"

_TOOL_USE_TABLE: tuple[tuple[str, str, int, int], ...] = (
    # (model id prefix, family, tokens with tool_choice auto/none, tokens with any/tool)
    ("claude-opus-4", "Claude Opus 4.x", 346, 313),
    ("claude-sonnet-4", "Claude Sonnet 4.x", 346, 313),
    ("claude-haiku-4", "Claude Haiku 4.x", 346, 313),
    ("claude-3-7-sonnet", "Claude Sonnet 3.7", 346, 313),
    ("claude-3-5-haiku", "Claude Haiku 3.5", 264, 340),
    ("claude-3-opus", "Claude Opus 3", 530, 281),
    ("claude-3-sonnet", "Claude Sonnet 3", 159, 235),
    ("claude-3-haiku", "Claude Haiku 3", 264, 340),
    ("opus", "Claude Opus 4.x (alias)", 346, 313),
    ("sonnet", "Claude Sonnet 4.x (alias)", 346, 313),
    ("haiku", "Claude Haiku 4.x (alias)", 346, 313),
)


class PrefixError(Exception):
    """A skill named by the config is missing from the skills directory."""


@dataclass(frozen=True)
class ToolUsePrompt:
    """The fixed system prompt the provider adds once when any tool is present.

    Attributes:
        tokens: its size in the provider's tokens, or ``None`` when the model is not in the table.
        model: the model it was looked up for (``None``: the agent CLI's default model).
        family: the table row used, or ``None``.
        tool_choice: ``auto``, ``none``, ``any`` or ``tool``.
        source: where the number comes from.
    """

    tokens: int | None
    model: str | None
    family: str | None
    tool_choice: str
    source: str = TOOL_USE_DOCS


def tool_use_prompt(model: str | None, tool_choice: str = "auto") -> ToolUsePrompt:
    """Look up the tool-use system prompt's size for ``model``.

    Source: Anthropic, "Tool use with Claude", section *Pricing*, table "Tool use system prompt
    token count" (:data:`TOOL_USE_DOCS`): Claude Opus 4.5, 4.1 and 4, Sonnet 4.5 and 4, Haiku 4.5
    and Sonnet 3.7 add 346 tokens with ``tool_choice`` ``auto`` or ``none`` and 313 with ``any``
    or ``tool``; Haiku 3.5 and Haiku 3 add 264/340, Opus 3 530/281, Sonnet 3 159/235. The table
    assumes at least one tool; with no tools nothing is added. Model ids are matched by prefix
    (``claude-sonnet-4-5-20250929`` is a ``claude-sonnet-4`` row); the aliases ``opus``,
    ``sonnet`` and ``haiku`` (agent CLIs accept them) and ``None`` (a role that sets no model:
    the agent CLI's default) are taken to be Claude 4.x. Any other model gives ``tokens=None``.

    Args:
        model: the model id, or ``None``.
        tool_choice: ``auto`` (default), ``none``, ``any`` or ``tool``.

    Raises:
        ValueError: ``tool_choice`` is none of those.
    """
    if tool_choice not in ("auto", "none", "any", "tool"):
        raise ValueError(f"tool_choice must be auto, none, any or tool, got {tool_choice!r}")
    forced = tool_choice in ("any", "tool")
    if model is None:
        return ToolUsePrompt(313 if forced else 346, None, "Claude 4.x (the agent CLI's default "
                             "model, assumed)", tool_choice)
    wanted = model.strip().lower()
    for prefix, family, auto, any_ in _TOOL_USE_TABLE:
        if wanted == prefix or wanted.startswith(prefix + "-") or wanted.startswith(prefix + "@"):
            return ToolUsePrompt(any_ if forced else auto, model, family, tool_choice)
    return ToolUsePrompt(None, model, None, tool_choice)


def tool_json(tool: Mapping[str, Any]) -> str:
    """One tool definition as the Messages API receives it: compact JSON, UTF-8 kept."""
    return json.dumps(tool, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class ToolDef:
    """One tool definition the model receives.

    Attributes:
        name: the name the model sees (``bash``, ``mcp__tracker__create_issue``).
        description: its description (``None``: none given).
        input_schema: its JSON schema.
        server: the MCP server it comes from, or ``None`` for the shell tool.
        mcp_name: the tool's name as the MCP server gave it (``None`` for the shell tool).
        mcp_only: the MCP fields that are not sent to the model (``annotations``...).
    """

    name: str
    description: str | None
    input_schema: dict[str, Any]
    server: str | None = None
    mcp_name: str | None = None
    mcp_only: dict[str, Any] = field(default_factory=dict)

    def sent(self) -> dict[str, Any]:
        """The definition as sent: ``name``, ``description`` (if any), ``input_schema``."""
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        out["input_schema"] = self.input_schema
        return out


@dataclass(frozen=True)
class McpServerTools:
    """What one MCP server offers the model: its tools (as listed) and its instructions.

    Attributes:
        name: the server's name in the role (the ``<server>`` of ``mcp__<server>__<tool>``).
        tools: the tools as ``tools/list`` returned them (JSON objects: ``name``,
            ``description``, ``inputSchema``, ``annotations``...).
        instructions: the ``instructions`` of its ``initialize`` result, or ``None``.
    """

    name: str
    tools: Sequence[Mapping[str, Any]] = ()
    instructions: str | None = None


def mcp_tool_def(server: str, tool: Mapping[str, Any]) -> ToolDef:
    """The definition the model receives for one MCP tool, with its MCP-only fields kept apart."""
    schema = tool.get("inputSchema")
    return ToolDef(
        name=MCP_TOOL_PREFIX.format(server=server, tool=tool.get("name", "")),
        description=tool.get("description"),
        input_schema=dict(schema) if isinstance(schema, Mapping) else {"type": "object"},
        server=server, mcp_name=str(tool.get("name", "")),
        mcp_only={k: v for k, v in tool.items() if k not in MCP_SENT_FIELDS})


@dataclass(frozen=True)
class Prefix:
    """A built prompt prefix.

    Attributes:
        components: the runner's text components, name → text, in ``COMPONENTS`` order (empty
            text if none).
        text: the runner's text as sent (the non-empty components joined by a blank line).
        tools: the tool definitions the model receives: the shell tool, then each MCP server's
            tools in the role's order (empty when the caller gave none).
        instructions: ``(server, instructions)`` for each MCP server that has some.
        tool_use: the fixed tool-use system prompt, when there is any tool.
    """

    components: dict[str, str]
    text: str
    tools: tuple[ToolDef, ...] = ()
    instructions: tuple[tuple[str, str], ...] = ()
    tool_use: ToolUsePrompt | None = None

    def tokens(self, counter: Callable[[str], int]) -> dict[str, int]:
        """Tokens per runner text component with ``counter`` (text → tokens)."""
        return {name: counter(text) for name, text in self.components.items()}

    def instructions_text(self) -> str:
        """The MCP servers' instructions as added to the system prompt (empty if none)."""
        if not self.instructions:
            return ""
        return "MCP server instructions:\n\n" + "\n\n".join(
            f"## {server}\n{text.rstrip()}" for server, text in self.instructions)

    def system_text(self, without: str | None = None) -> str:
        """The whole system text the model receives: the runner's text, then the MCP servers'
        instructions; ``without`` leaves out one part (a ``COMPONENTS`` name or
        ``mcp_instructions``), joined the same way."""
        parts = [t for name, t in self.components.items() if name != without]
        if without != "mcp_instructions":
            parts.append(self.instructions_text())
        return "\n\n".join(t for t in parts if t)

    def sent_tools(self, without: Container[int] = ()) -> list[dict[str, Any]]:
        """The ``tools`` array as sent, leaving out the tools at the indexes in ``without``."""
        return [t.sent() for i, t in enumerate(self.tools) if i not in without]

    def tools_json(self, without: Container[int] = ()) -> str:
        """The ``tools`` array as JSON (empty text when no tool is left)."""
        kept = [tool_json(t) for t in self.sent_tools(without)]
        return "[" + ",".join(kept) + "]" if kept else ""

    def parts(self) -> dict[str, str]:
        """Every measurable text part, name → text: the runner's components, then
        ``mcp_instructions``, ``shell_tool`` and ``mcp_tools`` (each tool's JSON, joined by
        commas as in the array). The tool-use system prompt has no text: see :attr:`tool_use`."""
        out = dict(self.components)
        out["mcp_instructions"] = self.instructions_text()
        out["shell_tool"] = ",".join(tool_json(t.sent()) for t in self.tools if t.server is None)
        out["mcp_tools"] = ",".join(tool_json(t.sent()) for t in self.tools
                                    if t.server is not None)
        return out


def skill_summary(skill_md: Path) -> str:
    """The ``summary:`` value in the front matter of a ``SKILL.md``, or ``NO_SUMMARY``.

    Front matter is the block between a first line ``---`` and the next ``---``; the value may
    be quoted with ``"`` or ``'``.
    """
    try:
        lines = skill_md.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return NO_SUMMARY
    if not lines or lines[0].strip() != "---":
        return NO_SUMMARY
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, sep, value = line.partition(":")
        if sep and key.strip() == "summary":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return value or NO_SUMMARY
    return NO_SUMMARY


def skill_clis(skill_dir: Path) -> list[str]:
    """Names of the CLIs in ``<skill_dir>/bin``, sorted."""
    bin_dir = skill_dir / "bin"
    try:
        names = os.listdir(bin_dir)
    except OSError:
        return []
    out = []
    for name in names:
        path = bin_dir / name
        if not name.startswith(".") and (path.is_symlink() or path.is_file()):
            out.append(name)
    return sorted(out)


def build_prefix(role_prompt: str, skills: Sequence[str], skills_dir: Path, *,
                 shell_tool: Mapping[str, Any] | None = None,
                 mcp_servers: Sequence[McpServerTools] = (),
                 bridged_servers: Sequence[str] = (),
                 model: str | None = None, tool_choice: str = "auto") -> Prefix:
    """Build the prompt prefix for a role.

    With only the first three arguments (as the runner calls it) the prefix is the runner's text
    alone: no tools, no tool-use prompt.

    Args:
        role_prompt: the role's system prompt.
        skills: skill names in the role's order.
        skills_dir: the directory holding ``<name>/SKILL.md`` and ``<name>/bin/``.
        shell_tool: the shell tool's definition (``name``, ``description``, ``input_schema``),
            usually :data:`SHELL_TOOL`; default ``None``, no shell tool.
        mcp_servers: the MCP servers the role declares, with their listed tools; default none.
        bridged_servers: MCP servers reached through the ``mcp-bridge`` CLI instead: each adds
            one CLI-index line (``mcp-bridge SERVER --help``), in name order whatever the order
            given (the runner reads them from a JSON object whose keys are sorted, ``fleetctl
            tokens`` from the role file: both get the same text); needs the ``mcp-bridge``
            skill in ``skills``. Default none.
        model: the model, for the tool-use prompt's size; default ``None`` (the agent CLI's
            default model).
        tool_choice: ``auto`` (default), ``none``, ``any`` or ``tool``.

    Raises:
        PrefixError: a skill has no directory under ``skills_dir``, or ``bridged_servers`` are
            given without the ``mcp-bridge`` skill.
        ValueError: a bad ``tool_choice``.
    """
    skills_dir = Path(skills_dir)
    missing = [s for s in skills if not (skills_dir / s).is_dir()]
    if missing:
        raise PrefixError(f"{skills_dir}: no skill directory for {', '.join(missing)}")
    if bridged_servers and BRIDGE_SKILL not in skills:
        raise PrefixError(f"MCP servers {', '.join(bridged_servers)} are bridged but the role "
                          f"does not use the {BRIDGE_SKILL} skill")
    skill_lines = [f"- {name}: {skill_summary(skills_dir / name / 'SKILL.md')}" for name in skills]
    cli_lines = [f"- {cli} (skill {name}): `{cli} --help`"
                 for name in skills for cli in skill_clis(skills_dir / name)]
    cli_lines += [f"- {BRIDGE_SKILL} {server} (MCP server {server}, skill {BRIDGE_SKILL}): "
                  f"`{BRIDGE_SKILL} {server} --help`"
                  for server in sorted(dict.fromkeys(bridged_servers))]
    components = {
        "role_prompt": role_prompt.rstrip(),
        "skills_index": ("Skills you can use:\n" + "\n".join(skill_lines)) if skill_lines else "",
        "cli_index": ("CLIs on your PATH (run the command shown for usage before first use):\n"
                      + "\n".join(cli_lines)) if cli_lines else "",
    }
    text = "\n\n".join(t for t in components.values() if t)
    tools: list[ToolDef] = []
    if shell_tool is not None:
        schema = shell_tool.get("input_schema") or {"type": "object"}
        tools.append(ToolDef(name=str(shell_tool["name"]),
                             description=shell_tool.get("description"), input_schema=dict(schema)))
    for server in mcp_servers:
        tools.extend(mcp_tool_def(server.name, tool) for tool in server.tools)
    instructions = tuple((s.name, s.instructions) for s in mcp_servers
                         if s.instructions and s.instructions.strip())
    use = tool_use_prompt(model, tool_choice)
    return Prefix(components=components, text=text, tools=tuple(tools), instructions=instructions,
                  tool_use=use if tools else None)
