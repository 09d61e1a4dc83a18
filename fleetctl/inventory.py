"""The inventory: which hosts exist, how to reach them, and which agents run on each.

``inventory/fleet.yaml`` is the documented example; ``inventory/demo.yaml`` holds local boxes
(directories on this machine). Keys are documented in ``docs/inventory.md``. A host's settings
are its own keys over ``defaults:``; ``vars`` merge key by key (host over defaults, agent over
host). Relative paths (``identity_file``, ``known_hosts``, and ``root`` of a local host) are
resolved against the inventory file's directory.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from fleetctl.blueprint import Blueprint, Owner
from fleetctl.errors import InputError
from fleetctl.names import show_name
from fleetctl.protocol import ACCOUNT_NAME_PATTERN
from fleetctl.secrets import SecretSource, SecretStore
from fleetctl.yamlfile import display_path, input_error, load_model, load_yaml

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# What useradd accepts on Debian by default (NAME_REGEX), at most 32 characters.
_ACCOUNT = ACCOUNT_NAME_PATTERN
_HOME = re.compile(r"^/[A-Za-z0-9/._+@-]*$")


def _check_name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{what} name {value!r} must be letters, digits, '.', '_' or '-'")
    return value


def _one_line(value: str | None) -> str | None:
    """Refuse a setting that holds a control character (Unicode category Cc: a newline, CR,
    tab, ESC, DEL...).

    No host, login, path or command a person means holds one, but YAML makes them easily: a
    block scalar (``root: |``) ends in a newline, a quoted ``"web1\\n"`` holds one. Taken as
    written, the root would be another directory (``/srv/fleet\\n``, made by the first ship)
    and the address or login would fail at SSH with the value split over two lines.

    Raises:
        PydanticCustomError: the value holds one; the message shows it in the escape form.
    """
    if value is not None and any(unicodedata.category(c) == "Cc" for c in value):
        raise PydanticCustomError(
            "control_character",
            "must not hold a control character (a newline, CR, tab, ESC...): got {shown}; "
            "write the value on the key's own line, not as a block scalar (| or >)",
            {"shown": show_name(value)})
    return value


class GrantSpec(BaseModel):
    """One grant as written: the capability's scope values and where its secret comes from."""

    model_config = ConfigDict(extra="forbid")
    scope: dict[str, Any] = Field(default_factory=dict)
    secret: SecretSource


class AgentSpec(BaseModel):
    """One agent as written in the inventory."""

    model_config = ConfigDict(extra="forbid")
    role: str
    user: str | None = Field(default=None, pattern=_ACCOUNT)
    group: str | None = Field(default=None, pattern=_ACCOUNT)
    home: str | None = None
    grants: dict[str, GrantSpec] = Field(default_factory=dict)
    vars: dict[str, Any] = Field(default_factory=dict)

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, value: str | None) -> str | None:
        # /etc/passwd is colon-separated lines and the unit file reads whitespace and % itself:
        # a HOME carrying one would be misread, so only plain path characters pass.
        if value is not None and (not _HOME.fullmatch(value) or value.rstrip("/") == "" or
                                  ".." in value.split("/")):
            raise ValueError("must be an absolute path on the host (not /) of letters, digits "
                             f"and / . _ + @ -, got {value!r}")
        return value


class HostSettings(BaseModel):
    """Keys allowed both under ``defaults:`` and on a host."""

    model_config = ConfigDict(extra="forbid")
    port: int | None = Field(default=None, ge=1, le=65535, strict=True)
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    root: str | None = None
    transport: Literal["ssh", "local"] | None = None
    python: str | None = Field(default=None, pattern=r"^\S+$")
    become: Literal["sudo", "none"] | None = None
    owner: Owner | None = None
    keep_releases: int | None = Field(default=None, ge=1, strict=True)
    service: Literal["none", "systemd"] | None = None
    systemd_unit_dir: str | None = None
    systemctl: str | None = Field(default=None, pattern=r"^\S+$")
    vars: dict[str, Any] = Field(default_factory=dict)

    _one_line_settings = field_validator("user", "identity_file", "known_hosts", "root", "python",
                                         "systemd_unit_dir", "systemctl")(_one_line)

    @field_validator("systemd_unit_dir")
    @classmethod
    def _absolute_unit_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path on the host, got {value!r}")
        return value


class HostSpec(HostSettings):
    """One host as written in the inventory."""

    address: str | None = None
    agents: dict[str, AgentSpec] = Field(default_factory=dict)

    _one_line_address = field_validator("address")(_one_line)

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, agents: dict[str, AgentSpec]) -> dict[str, AgentSpec]:
        for name in agents:
            _check_name(name, "agent")
        return agents


class InventoryFile(BaseModel):
    """The whole inventory file."""

    model_config = ConfigDict(extra="forbid")
    defaults: HostSettings = Field(default_factory=HostSettings)
    hosts: dict[str, HostSpec]

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, hosts: dict[str, HostSpec]) -> dict[str, HostSpec]:
        for name in hosts:
            _check_name(name, "host")
        return hosts


@dataclass(frozen=True, slots=True)
class Grant:
    """One capability given to one agent (DESIGN.md §2).

    Attributes:
        capability: the capability's name in ``blueprint/credentials/``.
        scope: the scope values, valid for the capability's schema when the inventory was
            loaded with its blueprint.
        secret: where the secret comes from (resolved only when credentials are rendered).
        where: ``file:line: key.path`` of the grant, for messages.
    """

    capability: str
    scope: dict[str, Any]
    secret: Any
    where: str = ""


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent on a host.

    Attributes:
        name: the agent's name.
        role: its role's name.
        vars: the host's vars with the agent's own on top.
        user: its own Linux user on the host, or ``None`` (it then has none: the runner and its
            credential files belong to the host's default owner, which ``creds audit`` reports).
        group: the user's primary group (default: the user's name).
        home: its HOME (default ``/home/<user>``).
        grants: its capabilities, in inventory order.
    """

    name: str
    role: str
    vars: dict[str, Any] = field(default_factory=dict)
    user: str | None = None
    group: str | None = None
    home: str | None = None
    grants: tuple[Grant, ...] = ()

    @property
    def owner(self) -> str | None:
        """``"user:group"`` of the agent's own files, or ``None`` without a user of its own."""
        return f"{self.user}:{self.group or self.user}" if self.user else None


@dataclass(frozen=True, slots=True)
class Host:
    """One host with every setting resolved.

    Attributes:
        name: the inventory name.
        address: hostname or IP to connect to (default: the name; ``~/.ssh/config`` aliases work).
        port: SSH port, or ``None`` for ``~/.ssh/config``/22.
        user: SSH user, or ``None`` for ``~/.ssh/config``/the local user.
        identity_file: private key path, or ``None`` for ssh-agent and ``~/.ssh`` keys.
        known_hosts: known_hosts path, or ``None`` for ``~/.ssh/known_hosts``.
        root: the managed root on the host (absolute).
        transport: ``ssh`` or ``local``.
        python: the interpreter on the host that runs the host-side program (default
            ``python3``; ``/usr/bin/python3`` with ``become: sudo``, whose sudoers entry names
            an absolute program).
        become: ``"sudo"``: the login becomes root through ``sudo -n`` to run the host-side
            program (``docs/inventory.md``, become); ``None``: it runs as the login.
        owner: ``"user:group"`` of managed entries, or ``None`` for the connecting user.
        keep_releases: how many releases to keep (current always kept); default 5.
        service: ``none`` (fleetctl installs no service) or ``systemd`` (ship installs and
            restarts one ``fleet-runner-<agent>.service`` unit per agent); default ``none``.
        systemd_unit_dir: where ship writes the units; default ``/etc/systemd/system``.
        systemctl: the ``systemctl`` command on the host (a name or an absolute path).
        vars: template variables for the host.
        agents: the host's agents in inventory order.
        timeout_s: seconds per connection and per host operation, or ``None`` for none.
        secrets: the run's secret store, shared by every host of the inventory.
    """

    name: str
    address: str
    root: str
    transport: str = "ssh"
    port: int | None = None
    user: str | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    python: str = "python3"
    become: str | None = None
    owner: Owner | None = None
    keep_releases: int = 5
    service: str = "none"
    systemd_unit_dir: str = "/etc/systemd/system"
    systemctl: str = "systemctl"
    vars: dict[str, Any] = field(default_factory=dict)
    agents: tuple[Agent, ...] = ()
    timeout_s: float | None = None
    secrets: SecretStore | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Inventory:
    """A loaded inventory: its file and its hosts in file order."""

    path: Path
    hosts: tuple[Host, ...]

    def select(self, names: list[str] | None) -> list[Host]:
        """Return the named hosts (all when ``names`` is empty).

        Raises:
            InputError: a name is not in the inventory.
        """
        if not names:
            return list(self.hosts)
        by_name = {h.name: h for h in self.hosts}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise InputError(
                f"{display_path(self.path)}: no host named {', '.join(unknown)}",
                hint=f"hosts in this inventory: {', '.join(by_name) or '(none)'}",
            )
        return [by_name[n] for n in dict.fromkeys(names)]


def _setting(host: Any, defaults: Any, key: str) -> Any:
    """A host's own setting ``key``, else the inventory's default for it."""
    value = getattr(host, key)
    return value if value is not None else getattr(defaults, key)


def load_inventory(path: Path, roles: set[str] | None = None,
                   blueprint: Blueprint | None = None) -> Inventory:
    """Load and validate an inventory file.

    Args:
        path: the YAML file.
        roles: role names the blueprint defines; an agent naming another role is an error.
            ``None`` skips that check.
        blueprint: the blueprint; when given, its roles are checked as ``roles`` are, and each
            grant against it: the capability exists, the agent's role declares it, and the scope
            fits the capability's schema.

    Raises:
        InputError: bad YAML, unknown key, wrong type, missing role, relative SSH root, a bad
            grant, a systemd host with an agent without ``user``, ``become: sudo`` with a
            relative ``python``; each names the file, the line and the key path.
    """
    if blueprint is not None:
        roles = set(blueprint.roles)
    data, node = load_yaml(path)
    spec = load_model(path, InventoryFile, data, node)
    base = path.parent
    store = SecretStore(base)
    hosts = []
    for name, h in spec.hosts.items():
        d = spec.defaults
        pick = functools.partial(_setting, h, d)
        transport = pick("transport") or "ssh"
        root = pick("root")
        if not root:
            raise input_error(path, node, ["hosts", name, "root"], "required key is missing "
                              "(set it on the host or under defaults)")
        if transport == "local":
            root = str((base / Path(root).expanduser()).resolve())
        elif not root.startswith("/"):
            raise input_error(path, node, ["hosts", name, "root"],
                              f"must be an absolute path on the host, got {root!r}")
        host_vars = {**d.vars, **h.vars}
        agents: list[Agent] = []
        for agent_name, a in h.agents.items():
            if roles is not None and a.role not in roles:
                raise input_error(
                    path, node, ["hosts", name, "agents", agent_name, "role"],
                    f"no role {a.role!r} in the blueprint",
                    hint=f"roles defined: {', '.join(sorted(roles)) or '(none)'}")
            key = ["hosts", name, "agents", agent_name]
            if (pick("service") or "none") == "systemd" and not a.user:
                raise input_error(path, node, key, "service: systemd runs each agent's command "
                                  "as the agent's own user (its runner as root): set user: for "
                                  "this agent")
            grants = tuple(_grant(path, node, [*key, "grants", cap], cap, g, a.role, blueprint)
                           for cap, g in a.grants.items())
            agent = Agent(agent_name, a.role, {**host_vars, **a.vars}, user=a.user,
                          group=(a.group or a.user) if a.user else a.group,
                          home=(a.home or f"/home/{a.user}") if a.user else a.home,
                          grants=grants)
            # One user is one account: agents sharing it (an audit finding in itself) must at
            # least agree on its group and HOME, or one of them would silently not get its own.
            same = next((b for b in agents if agent.user and b.user == agent.user), None)
            if same is not None and (same.group, same.home) != (agent.group, agent.home):
                raise input_error(path, node, [*key, "user"], f"user {agent.user} is also agent "
                                  f"{same.name}'s, with group {same.group} and HOME {same.home}: "
                                  "agents sharing a user must agree on group: and home:",
                                  hint="better: give each agent a user of its own")
            # Two users under one HOME would each own the other's files.
            for other in agents:
                if agent.user and other.user and other.user != agent.user and \
                        _overlap(agent.home or "", other.home or ""):
                    raise input_error(path, node, [*key, "home"], f"HOME {agent.home} of user "
                                      f"{agent.user} overlaps HOME {other.home} of user "
                                      f"{other.user} (agent {other.name})")
            agents.append(agent)
        become = pick("become")
        become = None if become in (None, "none") else become
        python = pick("python") or ("/usr/bin/python3" if become == "sudo" else "python3")
        if become == "sudo" and not python.startswith("/"):
            where = ["hosts", name, "python"] if h.python is not None else ["defaults", "python"]
            raise input_error(path, node, where, f"with become: sudo, python must be an "
                              f"absolute path (got {python!r}): the sudoers entry names the "
                              "exact program sudo runs", hint="e.g. python: /usr/bin/python3")
        identity = pick("identity_file")
        known = pick("known_hosts")
        hosts.append(Host(
            name=name,
            address=h.address or name,
            root=root,
            transport=transport,
            port=pick("port"),
            user=pick("user"),
            identity_file=(base / Path(identity).expanduser()) if identity else None,
            known_hosts=(base / Path(known).expanduser()) if known else None,
            python=python,
            become=become,
            owner=pick("owner"),
            keep_releases=pick("keep_releases") or 5,
            service=pick("service") or "none",
            systemd_unit_dir=pick("systemd_unit_dir") or "/etc/systemd/system",
            systemctl=pick("systemctl") or "systemctl",
            vars=host_vars,
            agents=tuple(agents),
            secrets=store,
        ))
    return Inventory(path=path, hosts=tuple(hosts))


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _grant(path: Path, node: Any, key: list[Any], capability: str, spec: GrantSpec, role: str,
           blueprint: Blueprint | None) -> Grant:
    where = input_error(path, node, key, "").message.rstrip(": ")
    if blueprint is not None:
        known = blueprint.capabilities.get(capability)
        if known is None:
            raise input_error(path, node, key, f"no capability {capability!r} in the blueprint",
                              hint="capabilities defined: "
                              f"{', '.join(blueprint.capabilities) or '(none)'}")
        if capability not in blueprint.roles[role].capabilities:
            raise input_error(path, node, key, f"role {role!r} does not declare capability "
                              f"{capability!r}", hint="add it to capabilities: in the role file "
                              "if a skill of the role needs it")
        problems = known.scope_problems(spec.scope)
        if problems:
            inner, problem = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise input_error(path, node, [*key, "scope", *inner],
                              f"does not fit capability {capability!r}: {problem}{more}",
                              hint=f"the scope schema is in {display_path(known.source)}"
                              if known.source else None)
    return Grant(capability, dict(spec.scope), spec.secret, where)
