"""The agent's config: ``<release>/agents/<agent>/agent.yaml``, read with the standard library.

fleetctl renders the file from ``templates/agent.yaml.j2``: one top-level ``key: value`` per line,
where every value is JSON (Jinja2's ``tojson``). JSON is a subset of YAML, so the file is valid
YAML for people and tools, and the runner needs no YAML parser on the host. Blank lines and
lines starting with ``#`` are skipped; any other line that is not ``key: <JSON>`` is an error
naming the file and line. Keys the runner does not know are ignored, so a newer template never
stops an older runner.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.mcpconfig import PLACEHOLDER as MCP_CONFIG
from fleet_runner.prefix import BRIDGE_SKILL
from fleet_runner.scope import ScopeError, compile_scope

DEFAULT_TIMEOUT_S = 600.0
"""Wall-clock seconds per agent run when the config's ``timeout_s`` is null."""

DEFAULT_MAX_RETRIES = 2
"""Retries after a failed verification when the config has no ``max_retries``."""

_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):\s?(.*)")  # each pattern: fullmatch, whole value
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
VIA_MCP, VIA_BRIDGE = "mcp", "bridge"


class ConfigError(Exception):
    """The agent's config is missing, unreadable or invalid (the message names file and line)."""


@dataclass(frozen=True, slots=True)
class SyncConfig:
    """``sync``: the remote branch the workspace repository follows (:mod:`fleet_runner.reposync`).

    Attributes:
        branch: the branch, both local and on the remote (``main``).
        remote: the remote's name in the workspace repository (default ``origin``).
    """

    branch: str
    remote: str = "origin"


CHECK_FORMATS = ("auto", "gnu", "tsc", "ruff", "mypy", "eslint", "exit")
"""The output formats a check may declare (:mod:`fleet_runner.checkparse`): ``exit`` reads no
diagnostics (the exit status alone decides, the output is fed back whole: test runners);
every other name parses the output and places each diagnostic in a file."""


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check of the role (``checks`` in ``agent.yaml``; the check gate).

    Attributes:
        command: a shell command line (``/bin/sh -c``).
        cwd: where it runs, relative to the workspace (``"."``, ``"web"``); the paths it prints
            are read relative to it.
        format: one of :data:`CHECK_FORMATS`.
    """

    command: str
    cwd: str = "."
    format: str = "auto"

    def to_json(self) -> dict[str, str]:
        """The record form."""
        return {"command": self.command, "cwd": self.cwd, "format": self.format}


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server of the role (``mcp_servers`` in ``agent.yaml``; docs/tokens.md).

    Attributes:
        name: the server's name in the role (``mcp__NAME__TOOL``, ``mcp-bridge NAME``).
        via: ``mcp`` (handed to the agent command in its MCP config file) or ``bridge``
            (reached through the ``mcp-bridge`` CLI; one line in the CLI index).
        command: its argv (``{python}``: the runner's interpreter).
        env: variables added to its environment.
        cwd: its working directory (relative: to the workspace), or ``None``.
    """

    name: str
    via: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What the runner needs from ``agent.yaml``.

    Attributes:
        agent: the agent's name.
        role: its role's name.
        prompt: the role's system prompt.
        skills: the skills it may use, in the role's order.
        check: the legacy single check command (a shell command line), or ``None``.
        checks: the checks the check gate runs, in order: ``checks`` from the config, or
            ``check`` as one check in the workspace with format ``auto``; ``()`` for none.
        check_leftovers: gitignore-style patterns (workspace-relative) of what the role's
            checks write besides the caches the runner knows (never counted as a change).
        max_retries: retries after a failed verification (0 = one attempt only).
        agent_command: argv of the command that runs the model; ``None`` if not configured.
        timeout_s: wall-clock seconds per run (``DEFAULT_TIMEOUT_S`` when null).
        model: the model name, or ``None``; replaces ``{model}`` in ``agent_command``.
        budget_tokens: token budget of the prompt prefix, or ``None``.
        host: the host's name, if the config says.
        vars: the agent's merged vars (for example ``channel``).
        credentials_dir: absolute path of the agent's credentials directory, exported to the
            agent and its CLIs as ``FLEET_CREDENTIALS``; ``None`` (also when the key is
            missing, as in configs rendered before it existed) exports nothing.
        writes: gitignore-style patterns (workspace-relative) of what a run may change, or
            ``None`` for anywhere (the scope gate is then skipped); ``[]`` allows nothing.
        scope_requests: gitignore-style patterns of the paths an agent may be granted on
            request beyond ``writes`` (:mod:`fleet_runner.scoperequest`), or ``None``: none.
        sync: the working repository to sync before a task, or ``None``.
        mcp_servers: the role's MCP servers that can be started, in name order (``()`` when
            the key is missing, as in configs rendered before it existed).
        path: the file it was read from.
        lines: the line of each key in that file (for error messages), or empty.
    """

    agent: str
    role: str
    prompt: str
    skills: tuple[str, ...] = ()
    check: str | None = None
    checks: tuple[CheckSpec, ...] = ()
    check_leftovers: tuple[str, ...] = ()
    max_retries: int = DEFAULT_MAX_RETRIES
    agent_command: tuple[str, ...] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    model: str | None = None
    budget_tokens: int | None = None
    host: str | None = None
    vars: dict[str, Any] = field(default_factory=dict)
    credentials_dir: str | None = None
    writes: tuple[str, ...] | None = None
    scope_requests: tuple[str, ...] | None = None
    sync: SyncConfig | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    path: Path | None = None
    lines: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def bridged_servers(self) -> list[str]:
        """The names of the ``via: bridge`` servers (each one line in the CLI index)."""
        return [s.name for s in self.mcp_servers if s.via == VIA_BRIDGE]

    @property
    def direct_servers(self) -> list[McpServer]:
        """The ``via: mcp`` servers, handed to the agent command in its MCP config file."""
        return [s for s in self.mcp_servers if s.via == VIA_MCP]

    @property
    def expects_result(self) -> bool:
        """Whether ``agent_command`` asks its agent CLI for a JSON result (``--output-format
        json`` or ``stream-json``, also as ``--output-format=...``): its output must then end
        in one, complete, or the run did not finish (:func:`fleet_runner.gates.run_gate`)."""
        argv = list(self.agent_command or ())
        for i, arg in enumerate(argv):
            value = arg.split("=", 1)[1] if arg.startswith("--output-format=") else \
                argv[i + 1] if arg == "--output-format" and i + 1 < len(argv) else None
            if value in ("json", "stream-json"):
                return True
        return False

    @property
    def uses_mcp_config(self) -> bool:
        """Whether a word of ``agent_command`` holds ``{mcp_config}``."""
        return any(MCP_CONFIG in arg for arg in self.agent_command or ())

    def argv(self, mcp_config: str | os.PathLike[str] | None = None) -> list[str]:
        """The agent command's argv with ``{model}`` and ``{mcp_config}`` replaced.

        Args:
            mcp_config: the path of the attempt's MCP config file, for ``{mcp_config}``.

        Raises:
            ConfigError: no ``agent_command``, ``{model}`` used while ``model`` is null, or
                ``{mcp_config}`` used without a file.
        """
        if not self.agent_command:
            raise ConfigError(f"{self.path}: agent_command is not set: the runner has no command "
                              "to run the model (set agent_command in the role)")
        out = []
        for arg in self.agent_command:
            if "{model}" in arg:
                if not self.model:
                    raise ConfigError(
                        f"{self.path}: agent_command uses {{model}} but model is null")
                arg = arg.replace("{model}", self.model)
            if MCP_CONFIG in arg:
                if mcp_config is None:
                    raise ConfigError(f"{self.path}: agent_command uses {MCP_CONFIG} but no MCP "
                                      "config file was written")
                arg = arg.replace(MCP_CONFIG, os.fspath(mcp_config))
            out.append(arg)
        return out


def parse_config_text(text: str, where: str = "agent.yaml") -> dict[str, Any]:
    """Parse ``key: <JSON>`` lines into a dict.

    Raises:
        ConfigError: a line that is not ``key: <JSON>``, or a key given twice.
    """
    return _parse_lines(text, where)[0]


def _parse_lines(text: str, where: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse ``key: <JSON>`` lines into a dict and the line number of each key (1-based).

    Raises:
        ConfigError: a line that is not ``key: <JSON>``, or a key given twice.
    """
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if not match:
            raise ConfigError(f"{where}:{number}: expected 'key: <JSON value>', got {line[:60]!r}")
        key, raw = match.group(1), match.group(2).strip()
        if key in data:
            raise ConfigError(f"{where}:{number}: {key}: given twice")
        try:
            data[key] = json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}:{number}: {key}: not a JSON value ({exc.msg}); "
                              "agent.yaml values are rendered with tojson") from None
        lines[key] = number
    return data, lines


_Where = Callable[[str], str]
"""Where a key is, for an error message: ``FILE:LINE`` when the line is known, else ``FILE``."""


def _locator(where: str, lines: Mapping[str, int] | None) -> _Where:
    known = dict(lines or {})
    return lambda key: f"{where}:{known[key]}" if key in known else where


def _want(data: dict[str, Any], key: str, kinds: tuple[type, ...], at: _Where,
          required: bool = False) -> Any:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{at(key)}: {key}: required")
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{at(key)}: {key}: expected {names}, got {type(value).__name__}")
    return value


_REF_NAME = re.compile(r"[A-Za-z0-9._/-]+")


def _sync(data: dict[str, Any], at: _Where) -> SyncConfig | None:
    """``sync: {"remote": "origin", "branch": "main"}`` (remote optional) or null.

    Raises:
        ConfigError: not an object, no branch, or a name git would take for an option or a
            range (the same patterns as fleetctl's role schema).
    """
    value = _want(data, "sync", (dict,), at)
    if value is None:
        return None
    where = at("sync")
    unknown = set(value) - {"remote", "branch"}
    if unknown:
        raise ConfigError(f"{where}: sync: unknown key(s) {', '.join(sorted(unknown))}")
    branch, remote = value.get("branch"), value.get("remote") or "origin"
    for key, name in (("branch", branch), ("remote", remote)):
        if not isinstance(name, str) or not _REF_NAME.fullmatch(name) or name.startswith("-") \
                or ".." in name or (key == "remote" and "/" in name):
            raise ConfigError(f"{where}: sync.{key}: expected a {key} name, got {name!r}")
    return SyncConfig(branch=branch, remote=remote)


def _checks(data: dict[str, Any], at: _Where) -> tuple[CheckSpec, ...]:
    """``checks: [{"command": ..., "cwd": ..., "format": ...}]``, else ``check`` as one check.

    Raises:
        ConfigError: not that shape; a ``cwd`` that is absolute or leaves the workspace; an
            unknown format; ``check`` and ``checks`` both set.
    """
    legacy = _want(data, "check", (str,), at) or None
    value = _want(data, "checks", (list,), at)
    if value is None:
        return (CheckSpec(legacy),) if legacy else ()
    where = at("checks")
    if legacy:
        raise ConfigError(f"{where}: checks: set together with check ({legacy!r}): give the "
                          "command as one item of checks instead")
    out = []
    for i, item in enumerate(value):
        spot = f"{where}: checks[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{spot}: expected an object with command, cwd and format")
        unknown = set(item) - {"command", "cwd", "format"}
        if unknown:
            raise ConfigError(f"{spot}: unknown key(s) {', '.join(sorted(unknown))}")
        command = item.get("command")
        cwd, fmt = item.get("cwd") or ".", item.get("format") or "auto"
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"{spot}.command: expected a non-empty shell command line")
        parts = cwd.split("/") if isinstance(cwd, str) else []
        if not isinstance(cwd, str) or cwd.startswith("/") or ".." in parts or "\\" in cwd:
            raise ConfigError(f"{spot}.cwd: expected a directory relative to the workspace, "
                              f"inside it, got {cwd!r}")
        if fmt not in CHECK_FORMATS:
            raise ConfigError(f"{spot}.format: expected one of {', '.join(CHECK_FORMATS)}, "
                              f"got {fmt!r}")
        out.append(CheckSpec(command, os.path.normpath(cwd), fmt))
    return tuple(out)


def _mcp_servers(data: dict[str, Any], at: _Where) -> tuple[McpServer, ...]:
    """``mcp_servers: {NAME: {"via": ..., "command": [...], "env": {...}, "cwd": ...}}`` or null.

    Raises:
        ConfigError: not that shape (names the server and the key).
    """
    value = _want(data, "mcp_servers", (dict,), at)
    where = at("mcp_servers")
    out = []
    for name, spec in sorted((value or {}).items()):
        spot = f"{where}: mcp_servers.{name}"
        if not _SERVER_NAME.fullmatch(name):
            raise ConfigError(f"{spot}: a server name is 1 to 64 letters, digits, '_' or '-'")
        if not isinstance(spec, dict):
            raise ConfigError(f"{spot}: expected an object")
        unknown = set(spec) - {"via", "command", "env", "cwd"}
        if unknown:
            raise ConfigError(f"{spot}: unknown key(s) {', '.join(sorted(unknown))}")
        via = spec.get("via") or VIA_MCP
        if via not in (VIA_MCP, VIA_BRIDGE):
            raise ConfigError(f"{spot}.via: expected mcp or bridge, got {via!r}")
        command = spec.get("command")
        if not (isinstance(command, list) and command
                and all(isinstance(w, str) for w in command) and command[0].strip()):
            raise ConfigError(f"{spot}.command: expected a non-empty list of strings")
        env = spec.get("env") or {}
        if not (isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ConfigError(f"{spot}.env: expected an object of strings")
        cwd = spec.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ConfigError(f"{spot}.cwd: expected a string or null")
        out.append(McpServer(name, via, tuple(command), dict(env), cwd or None))
    return tuple(out)


def _check_mcp(config: AgentConfig, at: _Where) -> AgentConfig:
    """Refuse MCP servers the agent could not reach.

    Raises:
        ConfigError: ``via: bridge`` servers without the ``mcp-bridge`` skill, or ``via: mcp``
            servers while ``agent_command`` has no ``{mcp_config}`` (their tools would be
            dropped without a word).
    """
    bridged = config.bridged_servers
    if bridged and BRIDGE_SKILL not in config.skills:
        raise ConfigError(f"{at('mcp_servers')}: mcp_servers: {', '.join(bridged)} are via: "
                          f"bridge but skills has no {BRIDGE_SKILL} (the CLI that reaches them)")
    direct = [s.name for s in config.direct_servers]
    if direct and config.agent_command and not config.uses_mcp_config:
        raise ConfigError(
            f"{at('agent_command')}: agent_command has no {MCP_CONFIG}, so the MCP server(s) "
            f"{', '.join(direct)} (via: mcp) would never reach the agent: add the agent CLI's "
            f"option with {MCP_CONFIG} to agent_command (for claude: \"--mcp-config\", "
            f"\"{MCP_CONFIG}\"), or declare the servers via: bridge")
    return config


def config_from_data(data: dict[str, Any], where: str = "agent.yaml",
                     path: Path | None = None,
                     lines: Mapping[str, int] | None = None) -> AgentConfig:
    """Validate parsed config data.

    Args:
        data: the parsed keys (:func:`parse_config_text`).
        where: the file's name, for error messages.
        path: the file it was read from, kept in the config.
        lines: the line of each key in the file; an error about a key then names its line
            (``agent.yaml:7: max_retries: expected int, got str``). Default none: the file only.

    Raises:
        ConfigError: a missing required key or a value of the wrong type (names the key), or
            MCP servers the agent could not reach (``via: bridge`` without the ``mcp-bridge``
            skill; ``via: mcp`` while ``agent_command`` has no ``{mcp_config}``).
    """
    at = _locator(where, lines)
    skills = _want(data, "skills", (list,), at) or []
    command = _want(data, "agent_command", (list,), at)
    for name, items in (("skills", skills), ("agent_command", command or [])):
        if not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{at(name)}: {name}: every item must be a string")
    if command is not None and not command:
        raise ConfigError(f"{at('agent_command')}: agent_command: must not be empty")
    retries = _want(data, "max_retries", (int,), at)
    if retries is not None and retries < 0:
        raise ConfigError(f"{at('max_retries')}: max_retries: must be 0 or more")
    timeout = _want(data, "timeout_s", (int, float), at)
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"{at('timeout_s')}: timeout_s: must be a number of seconds above 0")
    credentials_dir = _want(data, "credentials_dir", (str,), at) or None
    if credentials_dir is not None and not os.path.isabs(credentials_dir):
        raise ConfigError(f"{at('credentials_dir')}: credentials_dir: must be an absolute path, "
                          f"got {credentials_dir!r}")
    writes = _want(data, "writes", (list,), at)
    if writes is not None:
        if not all(isinstance(item, str) for item in writes):
            raise ConfigError(f"{at('writes')}: writes: every item must be a string")
        try:
            compile_scope(writes)
        except ScopeError as exc:
            raise ConfigError(f"{at('writes')}: writes: {exc}") from None
    requestable = _want(data, "scope_requests", (list,), at)
    if requestable is not None:
        if not all(isinstance(item, str) for item in requestable):
            raise ConfigError(f"{at('scope_requests')}: scope_requests: every item must be a "
                              "string")
        try:
            compile_scope(requestable)
        except ScopeError as exc:
            raise ConfigError(f"{at('scope_requests')}: scope_requests: {exc}") from None
    leftovers = _want(data, "check_leftovers", (list,), at) or []
    if not all(isinstance(item, str) for item in leftovers):
        raise ConfigError(f"{at('check_leftovers')}: check_leftovers: every item must be a "
                          "string")
    try:
        compile_scope(leftovers)
    except ScopeError as exc:
        raise ConfigError(f"{at('check_leftovers')}: check_leftovers: {exc}") from None
    return _check_mcp(AgentConfig(
        agent=_want(data, "agent", (str,), at, required=True),
        role=_want(data, "role", (str,), at) or "",
        prompt=_want(data, "prompt", (str,), at, required=True),
        skills=tuple(skills),
        check=_want(data, "check", (str,), at) or None,
        checks=_checks(data, at),
        check_leftovers=tuple(leftovers),
        max_retries=DEFAULT_MAX_RETRIES if retries is None else retries,
        agent_command=tuple(command) if command else None,
        timeout_s=float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S,
        model=_want(data, "model", (str,), at) or None,
        budget_tokens=_want(data, "budget_tokens", (int,), at),
        host=_want(data, "host", (str,), at),
        vars=_want(data, "vars", (dict,), at) or {},
        credentials_dir=credentials_dir,
        writes=tuple(writes) if writes is not None else None,
        scope_requests=tuple(requestable) if requestable is not None else None,
        sync=_sync(data, at),
        mcp_servers=_mcp_servers(data, at),
        path=path,
        lines=dict(lines or {}),
    ), at)


def check_servable(config: AgentConfig, agent: str, skills_dir: Path) -> None:
    """Refuse a config the runner could not serve a single task with, before any is claimed.

    :func:`load_config` checks each key on its own; this checks what only the whole config,
    the agent served and the release together say.

    Args:
        config: the loaded config.
        agent: the agent the runner serves (``--agent``).
        skills_dir: the release's ``skills`` directory.

    Raises:
        ConfigError: the config is another agent's, ``agent_command`` is not set, it uses
            ``{model}`` while ``model`` is null, or a skill of the role has no directory in
            the release.
    """
    at = _locator(os.fspath(config.path or "agent.yaml"), config.lines)
    if config.agent != agent:
        raise ConfigError(f"{at('agent')}: agent: this is the config of agent {config.agent!r}, "
                          f"not of {agent!r} (--agent): give the config of the agent served")
    if not config.agent_command:
        raise ConfigError(f"{at('agent_command')}: agent_command is not set: the runner has no "
                          "command to run the model (set agent_command in the role)")
    if any("{model}" in arg for arg in config.agent_command) and not config.model:
        raise ConfigError(f"{at('agent_command')}: agent_command uses {{model}} but model is "
                          "null (set model in the role, or drop {model})")
    missing = [s for s in config.skills if not (Path(skills_dir) / s).is_dir()]
    if missing:
        raise ConfigError(f"{at('skills')}: skills: {', '.join(missing)} not in the release (no "
                          f"directory {Path(skills_dir) / missing[0]})")


def load_config(path: Path) -> AgentConfig:
    """Read and validate ``agent.yaml`` at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, or is invalid.
    """
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: agent config not found (is the agent in this release?)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the agent config: {exc}") from None
    data, lines = _parse_lines(text, str(path))
    return config_from_data(data, str(path), path, lines)
