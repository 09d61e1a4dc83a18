"""What a role declares for ``fleetctl tokens``: its MCP servers and its tool ceilings.

A role file (``blueprint/roles/<role>.yaml``) may add, beside ``budget_tokens``::

    mcp_servers:
      tracker:                              # the <server> of mcp__<server>__<tool>
        via: bridge                         # mcp (default): tools in the prefix; bridge: CLI
        command: ["{python}", "-m", "tracker_mcp"]   # a stdio server: its argv
        env: {TRACKER_URL: "https://tracker.example"}
        cwd: .                              # relative to the blueprint; default the blueprint
        startup_timeout_s: 10               # spawn + initialize; default 10
        request_timeout_s: 10               # each tools/list page; default 10
      wiki:
        snapshot: snapshots/wiki.tools.json # or a saved tools/list result (from the blueprint)
      issues:                               # both: hosts start the command, the audit (offline,
        command: ["issues-mcp", "--stdio"]  # no credentials) reads the snapshot
        snapshot: snapshots/issues.tools.json
    max_tool_tokens: 600                    # no single tool may cost more (marginal tokens)
    max_tools: 20                           # no more tool definitions than this

``{python}`` in a command stands for the interpreter running fleetctl (on a host: the runner's,
in the MCP config it writes, and the bridge's). A snapshot is the JSON of
a ``tools/list`` result, ``{"tools": [...]}`` (a JSON-RPC response holding one in ``result``
works too), optionally with ``"instructions"`` (the server's, from ``initialize``); pages may be
given as a list of such results.

``via`` says how the agent reaches the server, and so what it costs in the prefix:

- ``mcp`` (the default): the agent host (``claude``) is handed the server in an MCP config file
  (the runner substitutes ``{mcp_config}`` in the role's ``agent_command``), so every tool's
  definition is in every turn's prefix; ``fleetctl tokens`` measures them as tool schemas.
- ``bridge``: the server sits behind the ``mcp-bridge`` CLI (``agents/<agent>/mcp-bridge.json``);
  the prefix has one CLI-index line for it and no tool schema. Needs a ``command`` (the bridge
  starts the server) and the ``mcp-bridge`` skill in the role's ``skills``
  (:func:`check_bridged_servers`).

This module imports nothing but pydantic when it is imported, so :mod:`fleetctl.blueprint` uses
it for the ``Role`` fields ``mcp_servers`` (names matching :data:`SERVER_NAME`),
``max_tool_tokens`` and ``max_tools``, validated with the rest of the role by ``load_blueprint``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

SERVER_NAME = r"^[A-Za-z0-9_-]{1,64}$"

VIA_MCP: Literal["mcp"] = "mcp"
VIA_BRIDGE: Literal["bridge"] = "bridge"
BRIDGE_SKILL = "mcp-bridge"
"""The skill whose CLI reaches a ``via: bridge`` server (the runner's ``prefix.BRIDGE_SKILL``)."""


class McpServerDecl(BaseModel):
    """One MCP server a role declares: a stdio command, or a saved ``tools/list`` snapshot."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = Field(default=None, min_length=1)
    snapshot: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    startup_timeout_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0)
    via: Literal["mcp", "bridge"] = VIA_MCP

    @field_validator("via")
    @classmethod
    def _bridge_needs_command(cls, value: str, info: ValidationInfo) -> str:
        # Fields validate in order, so command and snapshot are in info.data when they were
        # valid; a bad command has its own error already.
        if value == VIA_BRIDGE and "command" in info.data and info.data["command"] is None:
            raise ValueError("bridge needs a command: the mcp-bridge CLI starts the server (a "
                             "snapshot cannot be started)")
        return value

    @field_validator("command")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value[0].strip():
            raise ValueError("the command's first word is empty")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> McpServerDecl:
        if self.command is None and self.snapshot is None:
            raise ValueError("give a command (a stdio server) or a snapshot (a saved "
                             "tools/list result), or both (the agent's host starts the "
                             "command; the audit reads the snapshot)")
        if self.command is None and (self.env or self.cwd):
            raise ValueError("env and cwd apply to a command, not to a snapshot")
        return self


def bridged_servers(servers: dict[str, McpServerDecl]) -> list[str]:
    """The names of the ``via: bridge`` servers, in the role's order."""
    return [name for name, decl in servers.items() if decl.via == VIA_BRIDGE]


def mcp_servers(servers: dict[str, McpServerDecl]) -> dict[str, McpServerDecl]:
    """The ``via: mcp`` servers (their tools are in the prefix), in the role's order."""
    return {name: decl for name, decl in servers.items() if decl.via == VIA_MCP}


def check_bridged_servers(role_file: Path, role: Any) -> None:
    """Refuse a role whose ``via: bridge`` servers it cannot reach: without the ``mcp-bridge``
    skill the agent has no bridge CLI, and the tools would be neither in the prefix nor callable.

    Args:
        role_file: the role's file (``blueprint/roles/<role>.yaml``), read again for the line
            of the key only when there is a problem.
        role: the loaded role (``fleetctl.blueprint.Role``: ``skills``, ``mcp_servers``).

    Raises:
        InputError: naming the file, the line and the key (``mcp_servers.SERVER.via``).
    """
    missing = [name for name in bridged_servers(role.mcp_servers)
               if BRIDGE_SKILL not in role.skills]
    if not missing:
        return
    from fleetctl.errors import InputError
    from fleetctl.yamlfile import input_error, load_yaml

    try:
        _, node = load_yaml(Path(role_file))
    except InputError:
        node = None
    raise input_error(Path(role_file), node, ["mcp_servers", missing[0], "via"],
                      f"bridge needs the {BRIDGE_SKILL} skill in skills (the agent reaches "
                      f"the server through the {BRIDGE_SKILL} CLI)"
                      + (f"; so do {', '.join(missing[1:])}" if missing[1:] else ""),
                      hint=f"add {BRIDGE_SKILL} to the role's skills, or set via: mcp")


# --- The agent harness (issue 12): which agent CLI a role runs, and the built-in tools it needs.

TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
"""A built-in tool's name as a role lists it under ``tools:`` (``Bash``, ``Read``)."""


class HarnessKind(BaseModel):
    """What fleetctl knows about one agent harness (an agent CLI).

    Attributes:
        name: the harness's name in profiles and role files (``claude-code``).
        executables: basenames of ``agent_command[0]`` that mean this harness.
        base_url_env: the variable that points the harness at a model endpoint.
        key_env: the variable holding its API key.
        quiet_env: variables that stop it from phoning home (telemetry, updates, reports).
        tools_flag: the option that limits its built-in tools to a comma-separated list.
        strict_flags: options that keep it from adding MCP servers found outside the command
            (user or project settings).
        instructions_kept_chars: how many characters of an MCP server's instructions it
            passes to the model (the rest is cut), or ``None`` (not measured).
    """

    model_config = ConfigDict(frozen=True)
    name: str
    executables: tuple[str, ...]
    base_url_env: str
    key_env: str
    quiet_env: dict[str, str]
    tools_flag: str
    strict_flags: tuple[str, ...]
    instructions_kept_chars: int | None = None

    def tool_flags(self, tools: list[str]) -> list[str]:
        """The options that give the harness exactly ``tools`` (an empty list: none)."""
        return [self.tools_flag, ",".join(tools), *self.strict_flags]


CLAUDE_CODE = HarnessKind(
    name="claude-code", executables=("claude",), base_url_env="ANTHROPIC_BASE_URL",
    key_env="ANTHROPIC_API_KEY",
    # Claude Code's documented switches (docs.claude.com, Claude Code settings, *Environment
    # variables*): no telemetry, no error reports, no auto-update, no other nonessential traffic.
    quiet_env={"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
               "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    tools_flag="--tools", strict_flags=("--strict-mcp-config",),
    # Measured by probing Claude Code 2.1.197 with a server whose instructions are 16,000
    # characters: the model got the first 2,048, then "… [truncated]".
    instructions_kept_chars=2048)

HARNESSES: dict[str, HarnessKind] = {CLAUDE_CODE.name: CLAUDE_CODE}
"""Every harness fleetctl can probe and give tool flags to, by name."""


def role_harness(role: Any) -> HarnessKind | None:
    """The harness a role runs: its ``harness:`` key (``claude-code``, or ``NAME@VERSION``),
    else the one whose executable is the basename of ``agent_command[0]``; ``None`` when the
    role has no agent command or runs an agent CLI fleetctl does not know."""
    declared = getattr(role, "harness", None)
    if declared:
        return HARNESSES.get(declared.partition("@")[0])
    command = getattr(role, "agent_command", None)
    if not command:
        return None
    exe = Path(command[0]).name
    return next((h for h in HARNESSES.values() if exe in h.executables), None)


def pinned_version(role: Any) -> str | None:
    """The harness version a role pins (``harness: claude-code@2.1.197``), or ``None``."""
    declared = getattr(role, "harness", None) or ""
    return declared.partition("@")[2] or None


def toolset_key(tools: list[str] | None) -> str:
    """The name of a built-in tool set in profile file names: ``default`` (no ``tools:`` key:
    the harness's own default set), ``none`` (``tools: []``), else ``tools-`` and the sorted
    names joined by ``+`` (``tools-Bash+Read``)."""
    if tools is None:
        return "default"
    return "tools-" + "+".join(sorted(dict.fromkeys(tools))) if tools else "none"


def harness_command(role: Any) -> list[str] | None:
    """The agent command as rendered into ``agent.yaml``: the role's ``agent_command`` plus,
    when the role lists ``tools:``, its harness's flags for exactly those built-in tools (for
    Claude Code ``--tools Bash,Read --strict-mcp-config``). ``None`` when the role has no
    command. Roles are checked at load (:func:`check_harness`), so a role with ``tools:`` has a
    known harness here."""
    command = getattr(role, "agent_command", None)
    if command is None:
        return None
    tools = getattr(role, "tools", None)
    harness = role_harness(role)
    if tools is None or harness is None:
        return list(command)
    return [*command, *harness.tool_flags(list(dict.fromkeys(tools)))]


def harness_problem(role: Any) -> tuple[str, str] | None:
    """What is wrong with a role's ``harness``/``tools`` keys, as ``(key, message)``, or
    ``None``: an unknown ``harness:``; ``tools:`` without an agent command or for an agent CLI
    fleetctl cannot give tool flags to; an ``agent_command`` that already limits the tools
    itself while ``tools:`` is set."""
    declared = getattr(role, "harness", None)
    if declared and declared.partition("@")[0] not in HARNESSES:
        return ("harness", f"unknown harness {declared.partition('@')[0]!r} (known: "
                           f"{', '.join(HARNESSES)})")
    tools = getattr(role, "tools", None)
    if tools is None:
        return None
    harness = role_harness(role)
    if harness is None:
        return ("tools", "needs an agent_command whose harness fleetctl knows (known: "
                         f"{', '.join(HARNESSES)}; or set harness:)")
    if harness.tools_flag in (getattr(role, "agent_command", None) or []):
        return ("agent_command", f"{harness.tools_flag} is already in agent_command: list the "
                                 "built-in tools under tools: instead (rendering adds the flags)")
    return None
