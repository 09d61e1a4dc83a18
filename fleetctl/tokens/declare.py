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

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

SERVER_NAME = r"^[A-Za-z0-9_-]{1,64}$"

VIA_MCP, VIA_BRIDGE = "mcp", "bridge"
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
        if (self.command is None) == (self.snapshot is None):
            raise ValueError("give exactly one of command (a stdio server) or snapshot "
                             "(a saved tools/list result)")
        if self.snapshot is not None and (self.env or self.cwd):
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
