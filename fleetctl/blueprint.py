"""The blueprint: the authoritative source of every managed file (DESIGN.md §1).

Layout::

    blueprint/runner/               the agent runner, copied to every host
    blueprint/skills/<name>/        SKILL.md and the CLIs in bin/, copied where a role uses them
    blueprint/roles/<role>.yaml     prompt, skills, capabilities, check command, budgets
    blueprint/credentials/<cap>/    one capability: capability.yaml and its credential templates
    blueprint/attributes.yaml       declared modes/owners and empty directories (optional)
    blueprint/.fleetignore          live paths that change by design, never drift (optional)

File modes come from the blueprint's own metadata, never from the checkout's filesystem: a
mode declared in ``attributes.yaml`` wins, then the executable bit git records in its index
(``100755``), else ``0644``; directories are ``0755`` unless declared. Where the blueprint is not
in a git repository only declared modes apply.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pathspec
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from fleetctl.capabilities import Capability, load_capabilities, skill_needs
from fleetctl.errors import InputError
from fleetctl.roledecl import (
    SERVER_NAME,
    TOOL_NAME,
    McpServerDecl,
    check_bridged_servers,
    harness_problem,
)
from fleetctl.yamlfile import display_path, input_error, load_model, load_yaml

_MODE = re.compile(r"^[0-7]{3,4}$")
_OWNER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*:[A-Za-z_][A-Za-z0-9_.-]*$")


def _mode(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        # YAML reads an unquoted 0644 as the integer 420: refuse rather than guess.
        raise ValueError("mode must be a quoted octal string such as \"0644\"")
    if not _MODE.fullmatch(value):
        raise ValueError("mode must be 3 or 4 octal digits such as \"0644\" or \"1777\" "
                         f"(quoted), got {value!r}")
    return value.rjust(4, "0")


def _owner(value: str | None) -> str | None:
    # Both names, as the host's passwd and group files know them: a scan reports owners as
    # "user:group" names, so a bare user or a numeric id would drift forever.
    if value is not None and not _OWNER.fullmatch(value):
        raise ValueError(f"owner must be \"user:group\" names, got {value!r}")
    return value


Mode = Annotated[str, BeforeValidator(_mode)]
Owner = Annotated[str, AfterValidator(_owner)]


class RepoSync(BaseModel):
    """How the runner syncs a role's working repository before and after a task (docs/runner.md)."""

    model_config = ConfigDict(extra="forbid")
    remote: str = Field(default="origin", pattern=r"^[A-Za-z0-9._-]+$")
    branch: str = Field(pattern=r"^[A-Za-z0-9._/-]+$")


def _check_cwd(value: str) -> str:
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\\" in value:
        raise ValueError(f"must be a directory relative to the workspace, inside it, got {value!r}")
    return value


class CheckDecl(BaseModel):
    """One of a role's ``checks``: a command the runner's check gate runs (docs/runner.md)."""

    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1)
    # Where it runs, relative to the workspace; the paths it prints are read relative to it.
    cwd: Annotated[str, AfterValidator(_check_cwd)] = "."
    format: Literal["auto", "gnu", "tsc", "ruff", "mypy", "eslint", "exit"] = "auto"


class Role(BaseModel):
    """One ``roles/<role>.yaml``: what an agent of this role is and may do.

    Later issues (runner, tokens, credentials) read the fields beyond ``prompt`` and ``skills``;
    they are validated here so a typo is caught on the first ``drift``.
    """

    model_config = ConfigDict(extra="forbid")
    description: str = ""
    prompt: str
    skills: list[str] = Field(default_factory=list)
    capabilities: list[str] = Field(default_factory=list)
    check: str | None = None
    # The check gate's commands (each with its cwd and output format); `check` is one command
    # run in the workspace with format auto. check_leftovers: what they write besides the
    # caches the runner knows, never counted as the agent's change.
    checks: list[CheckDecl] | None = None
    check_leftovers: list[str] = Field(default_factory=list)
    max_retries: int = Field(default=2, ge=0)
    agent_command: list[str] | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    budget_tokens: int | None = Field(default=None, gt=0)
    model: str | None = None
    mcp_servers: dict[Annotated[str, StringConstraints(pattern=SERVER_NAME)], McpServerDecl] = \
        Field(default_factory=dict)
    max_tool_tokens: int | None = Field(default=None, gt=0)
    max_tools: int | None = Field(default=None, ge=0)
    # Gitignore-style patterns, relative to the workspace, of what a run may change; a change
    # elsewhere fails the runner's scope gate. None: every path of the workspace.
    writes: list[str] | None = None
    # Patterns of paths beyond `writes` the runner grants when an agent asks (its scope
    # request file); None: none.
    scope_requests: list[str] | None = None
    sync: RepoSync | None = None
    # The agent harness (docs/tokens.md, *Harness profiles*): its name (default: from
    # agent_command[0]; NAME@VERSION pins a profile), and the built-in tools the role needs
    # (None: the harness's default set; rendered as the harness's tool flags).
    harness: str | None = Field(default=None, pattern=r"^[a-z0-9-]+(@[A-Za-z0-9._-]+)?$")
    tools: list[Annotated[str, StringConstraints(pattern=TOOL_NAME)]] | None = None

    @model_validator(mode="after")
    def _one_way_to_check(self) -> Role:
        if self.check and self.checks is not None:
            raise ValueError("check and checks are both set: give the command as one item of "
                             "checks instead")
        return self


class FileRule(BaseModel):
    """A declared mode/owner for tree paths matching a gitignore-style pattern."""

    model_config = ConfigDict(extra="forbid")
    match: str
    mode: Mode | None = None
    owner: Owner | None = None


def _tree_path(value: str) -> str:
    parts = value.split("/")
    if not value or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"must be a relative path inside the tree, without '.', '..', empty or "
                         f"leading '/' parts, got {value!r}")
    return value


class DirRule(BaseModel):
    """A directory created even when empty (git cannot record one), with its mode."""

    model_config = ConfigDict(extra="forbid")
    path: Annotated[str, AfterValidator(_tree_path)]
    mode: Mode = "0755"
    owner: Owner | None = None


class Attributes(BaseModel):
    """``blueprint/attributes.yaml``."""

    model_config = ConfigDict(extra="forbid")
    files: list[FileRule] = Field(default_factory=list)
    dirs: list[DirRule] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of the blueprint: its path relative to the blueprint and its recorded metadata.

    Attributes:
        rel: path relative to the blueprint root, ``/``-separated.
        path: the file on disk.
        git_mode: the index mode (``100644``, ``100755``, ``120000``) or ``None`` if untracked.
    """

    rel: str
    path: Path
    git_mode: str | None


@dataclass(frozen=True, slots=True)
class Blueprint:
    """A loaded blueprint.

    Attributes:
        root: the blueprint directory.
        templates: the directory of fleetctl's own templates (``agent.yaml.j2``).
        roles: role name → :class:`Role`.
        skills: skill name → its directory.
        files: every source file, keyed by its path relative to ``root``.
        attributes: declared modes, owners and directories.
        ignore: the ``.fleetignore`` patterns (gitignore syntax) for live paths.
        capabilities: capability name → :class:`~fleetctl.capabilities.Capability`.
        skill_needs: skill name → {capability: ``read`` | ``write``} from its ``SKILL.md``.
    """

    root: Path
    templates: Path
    roles: dict[str, Role]
    skills: dict[str, Path]
    files: dict[str, SourceFile]
    attributes: Attributes
    ignore: pathspec.PathSpec = field(default_factory=lambda: pathspec.PathSpec([]))
    capabilities: dict[str, Capability] = field(default_factory=dict)
    skill_needs: dict[str, dict[str, str]] = field(default_factory=dict)
    # Each files: rule's pattern compiled once, not once per path of every render.
    _rule_specs: tuple[tuple[FileRule, pathspec.PathSpec], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rule_specs", tuple(
            (rule, pathspec.PathSpec.from_lines("gitignore", [rule.match]))
            for rule in self.attributes.files))

    def file_rule(self, tree_path: str) -> FileRule | None:
        """Return the last declared rule matching ``tree_path``, or ``None``."""
        found = None
        for rule, spec in self._rule_specs:
            if spec.match_file(tree_path):
                found = rule
        return found


def _git_files(root: Path) -> dict[str, str | None] | None:
    """Map each tracked or untracked-but-not-ignored file to its git index mode.

    Returns ``None`` when ``root`` is not inside a git work tree.
    """
    def git(*args: str) -> bytes | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
        except FileNotFoundError:
            return None
        return done.stdout if done.returncode == 0 else None

    staged = git("ls-files", "-z", "-s", "--", ".")
    if staged is None:
        return None
    files: dict[str, str | None] = {}
    for record in staged.split(b"\0"):
        if record:
            meta, _, name = record.partition(b"\t")
            files[os.fsdecode(name)] = meta.split()[0].decode()
    others = git("ls-files", "-z", "-o", "--exclude-standard", "--", ".") or b""
    for name in others.split(b"\0"):
        if name:
            files.setdefault(os.fsdecode(name), None)
    return files


def _walk_files(root: Path) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        # os.walk lists symlinks to directories under dirnames; they are files of the blueprint.
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            files[rel.replace(os.sep, "/")] = None
    return files


def load_blueprint(root: Path, templates: Path | None = None) -> Blueprint:
    """Load the blueprint at ``root``.

    Args:
        root: the blueprint directory.
        templates: fleetctl's template directory; default ``<root>/../templates``.

    Raises:
        InputError: a missing directory, a bad role or attributes file, or a role naming a
            skill that does not exist (with file, line and key).
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: blueprint directory not found",
                         hint="pass --blueprint PATH or run from the fleet repository")
    templates = Path(templates) if templates else root.parent / "templates"
    listing = _git_files(root)
    if listing is None:
        listing = _walk_files(root)
    files = {}
    for rel, mode in listing.items():
        path = root / rel
        if os.path.lexists(path):  # deleted in the work tree but still in the index: gone
            files[rel] = SourceFile(rel, path, mode)

    skills = {}
    skills_dir = root / "skills"
    if skills_dir.is_dir():
        for entry in sorted(skills_dir.iterdir()):
            if entry.is_dir():
                skills[entry.name] = entry

    capabilities = load_capabilities(root / "credentials")
    needs = {}
    for name, skill_dir in skills.items():
        needs[name] = skill_needs(skill_dir / "SKILL.md")
        for capability in needs[name]:
            if capability not in capabilities:
                defined = ", ".join(capabilities) or "(none)"
                raise InputError(f"{display_path(skill_dir / 'SKILL.md')}: capabilities: no "
                                 f"capability {capability!r} in {root / 'credentials'}",
                                 hint=f"capabilities defined: {defined}")

    roles = {}
    roles_dir = root / "roles"
    if roles_dir.is_dir():
        for path in sorted(roles_dir.glob("*.yaml")):
            data, node = load_yaml(path)
            role = load_model(path, Role, data, node)
            for i, skill in enumerate(role.skills):
                if skill not in skills:
                    raise input_error(path, node, ["skills", i],
                                      f"no skill {skill!r} in {skills_dir}",
                                      hint=f"skills defined: {', '.join(skills) or '(none)'}")
            for i, capability in enumerate(role.capabilities):
                if capability not in capabilities:
                    raise input_error(path, node, ["capabilities", i],
                                      f"no capability {capability!r} in {root / 'credentials'}",
                                      hint=f"capabilities defined: "
                                      f"{', '.join(capabilities) or '(none)'}")
            check_bridged_servers(path, role)
            problem = harness_problem(role)
            if problem is not None:
                raise input_error(path, node, [problem[0]], problem[1])
            direct = [name for name, decl in role.mcp_servers.items()
                      if getattr(decl, "via", "mcp") == "mcp" and decl.command is not None]
            if direct and role.agent_command is not None and \
                    not any("{mcp_config}" in word for word in role.agent_command):
                # The runner would stop at startup on the host; say so here, before a ship.
                raise input_error(path, node, ["agent_command"],
                                  f"MCP servers {', '.join(direct)} are via: mcp, so the agent "
                                  "command must take them: put {mcp_config} where it reads an "
                                  "MCP config file (e.g. --mcp-config {mcp_config})",
                                  hint="or set via: bridge and add the mcp-bridge skill")
            rendered: dict[str, str] = {}
            for i, capability in enumerate(role.capabilities):
                for name in capabilities[capability].templates:
                    if name in rendered:
                        raise input_error(path, node, ["capabilities", i],
                                          f"capabilities {rendered[name]!r} and {capability!r} "
                                          f"both render {name!r} into an agent's credentials")
                    rendered[name] = capability
            roles[path.stem] = role

    attributes = Attributes()
    attr_path = root / "attributes.yaml"
    if attr_path.exists():
        attributes = load_model(attr_path, Attributes)

    ignore: pathspec.PathSpec = pathspec.PathSpec([])
    ignore_path = root / ".fleetignore"
    if ignore_path.exists():
        ignore = pathspec.PathSpec.from_lines("gitignore",
                                              ignore_path.read_text("utf-8").splitlines())
    return Blueprint(root=root, templates=templates, roles=roles, skills=skills, files=files,
                     attributes=attributes, ignore=ignore, capabilities=capabilities,
                     skill_needs=needs)


def role_summary(role: Role) -> dict[str, Any]:
    """Return the role as plain data for templates."""
    return role.model_dump()
