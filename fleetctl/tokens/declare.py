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

This module imports nothing but pydantic, so :mod:`fleetctl.blueprint` uses it for the
``Role`` fields ``mcp_servers`` (names matching :data:`SERVER_NAME`), ``max_tool_tokens`` and
``max_tools``, validated with the rest of the role by ``load_blueprint``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SERVER_NAME = r"^[A-Za-z0-9_-]{1,64}$"


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
