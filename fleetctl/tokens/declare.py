"""What a role declares for ``fleetctl tokens``: its MCP servers and its tool ceilings.

A role file (``blueprint/roles/<role>.yaml``) may add, beside ``budget_tokens``::

    mcp_servers:
      tracker:                              # the <server> of mcp__<server>__<tool>
        command: ["{python}", "-m", "tracker_mcp"]   # a stdio server: its argv
        env: {TRACKER_URL: "https://tracker.example"}
        cwd: .                              # relative to the blueprint; default the blueprint
        startup_timeout_s: 10               # spawn + initialize; default 10
        request_timeout_s: 10               # each tools/list page; default 10
      wiki:
        snapshot: snapshots/wiki.tools.json # or a saved tools/list result (from the blueprint)
    max_tool_tokens: 600                    # no single tool may cost more (marginal tokens)
    max_tools: 20                           # no more tool definitions than this

``{python}`` in a command stands for the interpreter running fleetctl. A snapshot is the JSON of
a ``tools/list`` result, ``{"tools": [...]}`` (a JSON-RPC response holding one in ``result``
works too), optionally with ``"instructions"`` (the server's, from ``initialize``); pages may be
given as a list of such results.

These models import nothing but pydantic, so :mod:`fleetctl.blueprint` can use them as the
``Role`` fields of the same names (:data:`ROLE_FIELDS`). Until it does, :func:`read_settings`
reads them from the role file itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SERVER_NAME = r"^[A-Za-z0-9_-]{1,64}$"

ROLE_FIELDS = ("mcp_servers", "max_tool_tokens", "max_tools")
"""The role keys this module defines (the rest of a role is ``fleetctl.blueprint.Role``)."""


class McpServerDecl(BaseModel):
    """One MCP server a role declares: a stdio command, or a saved ``tools/list`` snapshot."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = Field(default=None, min_length=1)
    snapshot: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    startup_timeout_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0)

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


class TokenSettings(BaseModel):
    """The ``fleetctl tokens`` keys of one role (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    mcp_servers: dict[str, McpServerDecl] = Field(default_factory=dict)
    max_tool_tokens: int | None = Field(default=None, gt=0)
    max_tools: int | None = Field(default=None, ge=0)

    @field_validator("mcp_servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerDecl]) -> dict[str, McpServerDecl]:
        import re

        for name in value:
            if not re.match(SERVER_NAME, name):
                raise ValueError(f"server name {name!r} must be 1 to 64 letters, digits, "
                                 "'_' or '-'")
        return value


def split_role_data(data: Any) -> tuple[Any, dict[str, Any]]:
    """Split a role file's mapping into ``(the rest, the TokenSettings keys)``."""
    if not isinstance(data, dict):
        return data, {}
    rest = {k: v for k, v in data.items() if k not in ROLE_FIELDS}
    mine = {k: v for k, v in data.items() if k in ROLE_FIELDS}
    return rest, mine


def read_settings(role_file: Path) -> TokenSettings:
    """The ``fleetctl tokens`` keys of one role file, validated.

    Raises:
        InputError: bad YAML, or a bad key (with file, line and key path).
    """
    from fleetctl.yamlfile import load_model, load_yaml

    data, node = load_yaml(role_file)
    _, mine = split_role_data(data)
    return load_model(role_file, TokenSettings, mine, node)
