"""Rendering the blueprint into one host's desired tree.

The desired tree of a host (DESIGN.md §2, layout in ``docs/layout.md``)::

    runner/...                       blueprint/runner, templates rendered
    skills/<name>/...                each skill a role on this host uses
    agents/<agent>/agent.yaml        the agent's config, from templates/agent.yaml.j2
    agents/<agent>/prefix-tokens.json  exact o200k counts of its runner prefix
                                     (:mod:`fleetctl.tokencount.prefix_counts`)
    agents/<agent>/mcp-bridge.json   its role's ``via: bridge`` MCP servers, for the mcp-bridge CLI
    credentials/<agent>/<file>       its granted credentials (:mod:`fleetctl.credentials`),
                                     beside the releases on the host, never inside one

Files ending in ``.j2`` are Jinja2 templates and lose the suffix; everything else is copied byte
for byte. Templates are read as bytes and decoded as UTF-8; the output keeps the template's final
newline and its line endings (CRLF if the template uses CRLF), and a template that renders to
nothing makes an empty file. An undefined variable is an error naming the template, line and name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.blueprint import Blueprint, Role
from fleetctl.credentials import UncheckedGrant, credentials_dir, render_credentials
from fleetctl.errors import InputError
from fleetctl.inventory import Agent, Host
from fleetctl.manifest import DIR, FILE, SYMLINK, Entry, Manifest, sha256_digest
from fleetctl.secrets import Secret
from fleetctl.templating import render_template
from fleetctl.tokencount.prefix_counts import PREFIX_COUNTS, prefix_counts

TEMPLATE_SUFFIX = ".j2"
AGENT_CONFIG_TEMPLATE = "agent.yaml.j2"
DEFAULT_DIR_MODE = "0755"
DEFAULT_FILE_MODE = "0644"


@dataclass(frozen=True, slots=True)
class DesiredTree:
    """What the blueprint renders to for one host.

    Attributes:
        host: the host's name.
        manifest: every entry; owners are ``None`` where the host's default owner applies.
        contents: file content by digest (``"sha256:..."``), bytes; never a credential file.
        secrets: credential file content by digest, as :class:`~fleetctl.secrets.Secret`.
        unchecked: grants whose secret was not available (``render_host(missing_secrets_ok=
            True)`` only); their files are in ``manifest`` without a digest.
    """

    host: str
    manifest: Manifest
    contents: dict[str, bytes] = field(default_factory=dict)
    secrets: dict[str, Secret] = field(default_factory=dict)
    unchecked: tuple[UncheckedGrant, ...] = ()


class _Builder:
    def __init__(self, blueprint: Blueprint, host: Host) -> None:
        self.blueprint = blueprint
        self.host = host
        self.entries: dict[str, Entry] = {}
        self.contents: dict[str, bytes] = {}
        self.origin: dict[str, str] = {}

    def _attrs(self, tree_path: str, default_mode: str) -> tuple[str, str | None]:
        rule = self.blueprint.file_rule(tree_path)
        mode = rule.mode if rule and rule.mode else default_mode
        owner = rule.owner if rule and rule.owner else self.host.owner
        return mode, owner

    def _add(self, entry: Entry, source: str) -> None:
        if entry.path in self.entries and self.entries[entry.path] != entry:
            raise InputError(f"{source}: renders to {entry.path!r}, which "
                             f"{self.origin[entry.path]} also produces")
        self.entries[entry.path] = entry
        self.origin[entry.path] = source
        self.add_parents(entry.path)

    def add_parents(self, path: str) -> None:
        parent = path.rpartition("/")[0]
        while parent and parent not in self.entries:
            mode, owner = self._attrs(parent, DEFAULT_DIR_MODE)
            self.entries[parent] = Entry(parent, DIR, mode=mode, owner=owner)
            self.origin[parent] = "(parent directory)"
            parent = parent.rpartition("/")[0]

    def add_dir(self, path: str, mode: str | None, owner: str | None, source: str) -> None:
        default_mode, default_owner = self._attrs(path, DEFAULT_DIR_MODE)
        self._add(Entry(path, DIR, mode=mode or default_mode, owner=owner or default_owner), source)

    def add_file(self, path: str, data: bytes, default_mode: str, source: str) -> None:
        mode, owner = self._attrs(path, default_mode)
        digest = sha256_digest(data)
        self.contents[digest] = data
        self._add(Entry(path, FILE, mode=mode, owner=owner, size=len(data), digest=digest), source)

    def add_symlink(self, path: str, target: str, source: str) -> None:
        _, owner = self._attrs(path, DEFAULT_FILE_MODE)
        self._add(Entry(path, SYMLINK, owner=owner, target=target), source)


def _agent_data(host: Host, agent: Agent) -> dict[str, Any]:
    return {"name": agent.name, "role": agent.role, "vars": agent.vars, "user": agent.user,
            "group": agent.group, "home": agent.home,
            "grants": [g.capability for g in agent.grants],
            "credentials_dir": credentials_dir(host, agent)}


def _context_for_host(host: Host) -> dict[str, Any]:
    agents = [_agent_data(host, a) for a in host.agents]
    return {**host.vars, "host": {"name": host.name, "address": host.address, "root": host.root,
                                  "vars": host.vars}, "agents": agents}


def agent_context(blueprint: Blueprint, host: Host, agent: Agent) -> dict[str, Any]:
    """The variables of a per-agent template (``agent.yaml.j2``, ``fleet-runner.service.j2``).

    ``agent.vars`` already holds the host's vars with the agent's own on top; the structured
    names come last so no var can hide them.
    """
    context = _context_for_host(host)
    return {**agent.vars, "host": context["host"], "agents": context["agents"],
            "agent": _agent_data(host, agent),
            "role": _role_data(blueprint.roles[agent.role])}


def _role_data(role: Role) -> dict[str, Any]:
    """The role for templates; its ``agent_command`` with the harness's tool flags for the
    role's ``tools:`` (:func:`fleetctl.roledecl.harness_command`)."""
    from fleetctl.roledecl import harness_command

    return {**role.model_dump(), "agent_command": harness_command(role)}


def template_of(blueprint: Blueprint, host: Host,
                path: str) -> tuple[bytes, str, dict[str, Any]] | None:
    """The template a rendered path of ``host``'s tree comes from: ``(source, name, variables)``
    as :func:`render_host` renders it (``agents/<agent>/agent.yaml`` from fleetctl's own
    ``agent.yaml.j2``, a blueprint ``*.j2`` with the host's variables); ``None`` for a path no
    template renders.

    Raises:
        OSError: the template cannot be read.
    """
    parts = path.split("/")
    if len(parts) == 3 and parts[0] == "agents" and parts[2] == "agent.yaml":
        agent = next((a for a in host.agents if a.name == parts[1]), None)
        if agent is None:
            return None
        return ((blueprint.templates / AGENT_CONFIG_TEMPLATE).read_bytes(),
                f"templates/{AGENT_CONFIG_TEMPLATE}", agent_context(blueprint, host, agent))
    src = blueprint.files.get(path + TEMPLATE_SUFFIX)
    if src is None:
        return None
    return (src.path.read_bytes(), f"{blueprint.root.name}/{path}{TEMPLATE_SUFFIX}",
            _context_for_host(host))


def render_host(blueprint: Blueprint, host: Host, with_credentials: bool = True,
                missing_secrets_ok: bool = False) -> DesiredTree:
    """Render the desired tree of ``host``, its credential files included.

    Args:
        blueprint: the loaded blueprint.
        host: the host, with its agents and their grants.
        with_credentials: ``False`` leaves the credentials tree out (and resolves no secret).
        missing_secrets_ok: ``True`` (drift, audits): a grant whose secret is not available is
            listed in ``unchecked`` instead of stopping the render; ``False`` (ship, default).

    Raises:
        SecretsMissing: (an ``InputError``) without ``missing_secrets_ok``, one or more grants'
            secrets are not available; it names every one of them.
        InputError: a template fails to render, two sources produce one path, a declared
            directory clashes with a file, or a blueprint file cannot be read.
    """
    b = _Builder(blueprint, host)
    context = _context_for_host(host)
    used_skills = []
    for agent in host.agents:
        for skill in blueprint.roles[agent.role].skills:
            if skill not in used_skills:
                used_skills.append(skill)
    prefixes = ["runner/"] + [f"skills/{s}/" for s in used_skills]
    for rel, src in sorted(blueprint.files.items()):
        if not any(rel.startswith(p) for p in prefixes):
            continue
        where = f"{blueprint.root.name}/{rel}"
        try:
            if src.git_mode == "120000" or os.path.islink(src.path):
                target = (os.readlink(src.path) if os.path.islink(src.path)
                          else os.fsdecode(src.path.read_bytes()))
                b.add_symlink(rel, target, where)
                continue
            data = src.path.read_bytes()
        except OSError as exc:
            raise InputError(f"{where}: cannot read: {exc.strerror}") from None
        default_mode = "0755" if src.git_mode == "100755" else DEFAULT_FILE_MODE
        if rel.endswith(TEMPLATE_SUFFIX):
            data = render_template(data, where, context)
            rel = rel[: -len(TEMPLATE_SUFFIX)]
        b.add_file(rel, data, default_mode, where)

    for dir_rule in blueprint.attributes.dirs:
        path = dir_rule.path
        existing = b.entries.get(path)
        if existing is not None and existing.type != DIR:
            raise InputError(f"{blueprint.root.name}/attributes.yaml: dirs: {path!r} is a "
                             f"{existing.type} in the tree")
        b.entries.pop(path, None)
        b.add_dir(path, dir_rule.mode, dir_rule.owner, "attributes.yaml")

    config_template = blueprint.templates / AGENT_CONFIG_TEMPLATE
    try:
        config_source = config_template.read_bytes()
    except OSError as exc:
        raise InputError(f"{config_template}: cannot read the agent config template: "
                         f"{exc.strerror}") from None
    counts_by_role: dict[str, Any] = {}
    for agent in host.agents:
        data = render_template(config_source, f"templates/{AGENT_CONFIG_TEMPLATE}",
                               agent_context(blueprint, host, agent))
        base = f"agents/{agent.name}"
        b.add_dir("agents", None, None, "(agents)")
        b.add_dir(base, None, None, "(agents)")
        b.add_file(f"{base}/agent.yaml", data, DEFAULT_FILE_MODE, f"agent {agent.name}")
        counts = counts_by_role.get(agent.role, False)
        if counts is False:
            counts = counts_by_role[agent.role] = prefix_counts(blueprint,
                                                                blueprint.roles[agent.role])
        if counts is not None:
            b.add_file(f"{base}/{PREFIX_COUNTS}", counts, DEFAULT_FILE_MODE, f"agent {agent.name}")
        bridge = bridge_config(blueprint.roles[agent.role],
                               blueprint.root / "roles" / f"{agent.role}.yaml")
        if bridge is not None:
            b.add_file(f"{base}/{BRIDGE_CONFIG}", bridge, DEFAULT_FILE_MODE, f"agent {agent.name}")
    secrets: dict[str, Secret] = {}
    unchecked: tuple[UncheckedGrant, ...] = ()
    if with_credentials:
        creds = render_credentials(blueprint, host, agent_context, missing_ok=missing_secrets_ok)
        for entry in creds.entries:
            b.entries[entry.path] = entry
        secrets, unchecked = creds.secrets, tuple(creds.unchecked)
    return DesiredTree(host=host.name, manifest=Manifest(b.entries.values()), contents=b.contents,
                       secrets=secrets, unchecked=unchecked)


BRIDGE_CONFIG = "mcp-bridge.json"


def bridge_config(role: Role, role_file: Path | None = None) -> bytes | None:
    """The ``mcp-bridge`` CLI's server list for an agent of ``role``, or ``None`` when the role
    has no ``via: bridge`` server.

    ``{"servers": {NAME: {"command": [...], "env": {...}, "cwd": ...}}}`` (sorted keys, one
    final newline), from the role's ``mcp_servers`` declared ``via: bridge`` (each has a
    ``command``: a snapshot cannot be started). A ``via: mcp`` server is handed to the agent
    command by the runner instead (``mcp_servers`` in ``agent.yaml``), so it is not here. The
    bridge reads the file from ``$FLEET_RELEASE/agents/$FLEET_AGENT/mcp-bridge.json``.

    Args:
        role: the role.
        role_file: its file, named by the error below; ``None`` skips that check.

    Raises:
        InputError: a ``via: bridge`` server in a role without the ``mcp-bridge`` skill (file,
            line and key).
    """
    from fleetctl.roledecl import VIA_BRIDGE, check_bridged_servers

    if role_file is not None:
        check_bridged_servers(role_file, role)
    servers = {}
    for name, decl in role.mcp_servers.items():
        if decl.via != VIA_BRIDGE or decl.command is None:
            continue
        spec: dict[str, Any] = {"command": list(decl.command)}
        if decl.env:
            spec["env"] = dict(decl.env)
        if decl.cwd:
            spec["cwd"] = decl.cwd
        servers[name] = spec
    if not servers:
        return None
    return (json.dumps({"servers": servers}, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_tree(tree: DesiredTree, out: Path) -> None:
    """Write a desired tree under ``out`` (``render --out``): files, dirs, symlinks and modes.

    Owners are not applied (a local render is for reading and diffing). Credential files are
    never written to local disk: render the tree with ``with_credentials=False``.

    Raises:
        InputError: ``out`` exists and is not an empty directory.
    """
    out = Path(out)
    try:
        _write_tree(tree, out)
    except OSError as exc:
        raise InputError(f"{out}: cannot write the tree: {exc.strerror}"
                         + (f" ({exc.filename})" if exc.filename else "")) from None


def _write_tree(tree: DesiredTree, out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"{out}: exists and is not an empty directory",
                         hint="choose a new directory; render never overwrites")
    out.mkdir(parents=True, exist_ok=True)
    dirs = []
    for entry in tree.manifest:
        dest = os.path.join(os.fsencode(out), os.fsencode(entry.path))
        if entry.type == DIR:
            assert entry.mode is not None  # a desired tree gives every directory and file a mode
            os.mkdir(dest, 0o700)
            dirs.append((dest, int(entry.mode, 8)))
        elif entry.type == SYMLINK:
            assert entry.target is not None  # and every symlink a target
            os.symlink(os.fsencode(entry.target), dest)
        else:
            data = tree.contents.get(entry.digest or "")
            if data is None:  # a secret: never written here (see the docstring)
                raise InputError(f"{entry.path}: a credential file; render without credentials")
            assert entry.mode is not None
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), int(entry.mode, 8))
    for dest, mode in reversed(dirs):
        os.chmod(dest, mode)
