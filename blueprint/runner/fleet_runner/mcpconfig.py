"""The MCP servers handed to the agent command: one MCP client config file per attempt.

A role's MCP server is reached one of two ways (its ``via``, rendered into ``agent.yaml`` as
``mcp_servers``):

- ``bridge``: through the ``mcp-bridge`` CLI of the skill of that name (it reads
  ``agents/<agent>/mcp-bridge.json``); the runner only adds the server's line to the CLI index
  (:func:`fleet_runner.prefix.build_prefix`, ``bridged_servers``).
- ``mcp``: the agent host (the agent CLI, ``claude``) talks to the server itself, so its tools'
  definitions are in every turn's prefix. Before each attempt the runner writes
  ``runs/<task>/attempt-N.mcp.json`` (mode 0600) in the shape agent CLIs read (``claude
  --mcp-config FILE``)::

      {"mcpServers": {"tracker": {"command": "tracker-mcp", "args": ["--stdio"],
                                  "env": {"TRACKER_URL": "https://tracker.example"}}}}

  and puts that file's path in place of every ``{mcp_config}`` in the words of the role's
  ``agent_command`` (``["claude", "-p", "--mcp-config", "{mcp_config}"]``). A role that declares
  ``via: mcp`` servers but whose ``agent_command`` has no ``{mcp_config}`` is a config error
  (:mod:`fleet_runner.config`): the tools would be dropped without a word.

Environment values go into the file only, never onto a command line. ``{python}`` in a
server's command stands for the runner's own interpreter (as it stands for fleetctl's when
``fleetctl tokens`` starts the server). The config format has no working directory, so a server
with a ``cwd`` is started through ``/bin/sh``, which changes to it and ``exec``s the server (a
relative ``cwd`` is taken from the workspace, where the agent and ``mcp-bridge`` run).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLACEHOLDER = "{mcp_config}"
"""Replaced in ``agent_command`` by the path of the attempt's MCP config file."""

PYTHON = "{python}"
"""Stands for the runner's interpreter in a server's command."""

_CD_AND_EXEC = 'cd -- "$1" && shift && exec "$@"'


def server_entry(command: Iterable[str], env: dict[str, str], cwd: str | None,
                 workspace: Path, python: str | None = None) -> dict[str, Any]:
    """One server as agent CLIs read it: ``{"command": ARGV0, "args": [...], "env": {...}}``.

    Args:
        command: the server's argv (``{python}`` stands for ``python``).
        env: variables added to the server's environment (into the file, never the argv).
        cwd: the server's working directory, or ``None``; relative to ``workspace``.
        workspace: the agent's workspace.
        python: the interpreter ``{python}`` stands for; default the runner's.
    """
    python = python or sys.executable
    argv = [word.replace(PYTHON, python) for word in command]
    if cwd:
        directory = os.path.join(os.fspath(workspace), cwd)
        argv = ["/bin/sh", "-c", _CD_AND_EXEC, "mcp-server", os.path.normpath(directory), *argv]
    return {"command": argv[0], "args": argv[1:], "env": dict(env)}


def mcp_config_data(servers: Iterable[Any], workspace: Path,
                    python: str | None = None) -> dict[str, Any]:
    """The whole file: ``{"mcpServers": {NAME: entry}}`` for the given servers (objects with
    ``name``, ``command``, ``env`` and ``cwd``, as :class:`fleet_runner.config.McpServer`)."""
    return {"mcpServers": {s.name: server_entry(s.command, s.env, s.cwd, workspace, python)
                           for s in servers}}


def write_mcp_config(path: Path, servers: Iterable[Any], workspace: Path) -> Path:
    """Write the MCP config file for one attempt (mode 0600, replacing any earlier one).

    Raises:
        OSError: it cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)  # a left-over keeps its mode; a new file gets 0600
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(mcp_config_data(servers, workspace), fh, indent=1, sort_keys=True,
                  ensure_ascii=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path
