"""Capabilities: the least-privilege credentials an agent can be granted (DESIGN.md §2, grant).

Each capability is a directory ``blueprint/credentials/<name>/``::

    capability.yaml     description, the JSON Schema of its scope, audit hints
    <file>.j2           one Jinja2 template per file the agent reads (env file, config, key)

A template sees ``secret`` (the granted secret's text), ``scope`` (the grant's validated scope),
``agent`` and ``host``. The scope schema is JSON Schema (draft 2020-12, checked with the
``jsonschema`` library); ``audit`` tells ``fleetctl creds audit`` how to read a scope::

    audit:
      broad:            # scope values that reach more than named resources (regexes, per key)
        repositories: ['^[^/]+/\\*$']
      write:            # scope values that allow writing (per key)
        permission: [write]

A value containing ``*`` is always broad. Skills say what they need in the front matter of their
``SKILL.md`` (``capabilities: {forge-token: write}``, each ``read`` or ``write``); a role lists the
capabilities its skills need (``capabilities:`` in the role file). See ``docs/credentials.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field

from fleetctl.errors import InputError
from fleetctl.yamlfile import display_path, input_error, load_model, load_yaml

CAPABILITY_FILE = "capability.yaml"
TEMPLATE_SUFFIX = ".j2"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
Access = Literal["read", "write"]


class AuditHints(BaseModel):
    """How ``creds audit`` reads a scope: broad values (regexes) and write values, per key."""

    model_config = ConfigDict(extra="forbid")
    broad: dict[str, list[str]] = Field(default_factory=dict)
    write: dict[str, list[Any]] = Field(default_factory=dict)


class CapabilityFile(BaseModel):
    """``capability.yaml`` as written."""

    model_config = ConfigDict(extra="forbid")
    description: str = ""
    scope: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    audit: AuditHints = Field(default_factory=AuditHints)


@dataclass(frozen=True, slots=True)
class Capability:
    """One capability of the blueprint.

    Attributes:
        name: the directory name (``forge-token``).
        description: one line for people.
        scope_schema: the JSON Schema a grant's ``scope`` must satisfy.
        templates: output file name → template path, in name order.
        broad: scope key → compiled regexes of values that reach more than named resources.
        write: scope key → values that allow writing.
        source: the ``capability.yaml`` path, for messages.
    """

    name: str
    description: str
    scope_schema: dict[str, Any]
    templates: dict[str, Path]
    broad: dict[str, tuple[re.Pattern[str], ...]] = field(default_factory=dict)
    write: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    source: Path | None = None

    def scope_problems(self, scope: Any) -> list[tuple[list[Any], str]]:
        """Validate a grant's scope; return ``(key path inside scope, problem)`` pairs, sorted.

        An empty list means the scope fits the schema.
        """
        validator = jsonschema.Draft202012Validator(self.scope_schema)
        problems = []
        for err in validator.iter_errors(scope):
            problems.append((list(err.absolute_path), err.message))
        return sorted(problems, key=lambda p: [str(k) for k in p[0]])

    def broad_values(self, scope: Any) -> list[tuple[str, str]]:
        """Scope values that reach more than named resources: ``(key path, value)`` pairs.

        A string containing ``*`` anywhere in the scope is broad; so is a value of a key whose
        ``audit.broad`` regexes match it.
        """
        found = []
        for path, value in _leaves(scope, []):
            if not isinstance(value, str):
                continue
            key = next((str(k) for k in path if isinstance(k, str)), "")
            if "*" in value or any(rx.search(value) for rx in self.broad.get(key, ())):
                found.append((".".join(str(k) for k in path), value))
        return found

    def allows_write(self, scope: Any) -> list[tuple[str, Any]]:
        """Scope keys whose value allows writing: ``(key, value)`` pairs (empty: read only)."""
        if not isinstance(scope, dict):
            return []
        found = []
        for key, values in self.write.items():
            value = scope.get(key)
            items = value if isinstance(value, list) else [value]
            if any(v in values for v in items):
                found.append((key, value))
        return found


def _leaves(value: Any, path: list[Any]) -> list[tuple[list[Any], Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, [*path, k])]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, [*path, i])]
    return [(path, value)]


def load_capabilities(credentials_dir: Path) -> dict[str, Capability]:
    """Load every ``<credentials_dir>/<name>/capability.yaml`` with its templates.

    Returns an empty mapping when the directory does not exist.

    Raises:
        InputError: a bad name, a bad ``capability.yaml`` (YAML, unknown key, a scope that is
            not a valid JSON Schema, a regex that does not compile), a capability without
            templates, or a template file name that cannot be a file name on the host.
    """
    found: dict[str, Capability] = {}
    if not credentials_dir.is_dir():
        return found
    for entry in sorted(credentials_dir.iterdir()):
        if not entry.is_dir():
            continue
        spec_path = entry / CAPABILITY_FILE
        if not _NAME.fullmatch(entry.name):
            raise InputError(f"{display_path(entry)}: capability name {entry.name!r} must be "
                             "lower-case letters, digits, '.', '_' or '-'")
        if not spec_path.is_file():
            raise InputError(f"{display_path(spec_path)}: missing: every directory under "
                             f"{credentials_dir.name}/ is a capability with a {CAPABILITY_FILE}")
        data, node = load_yaml(spec_path)
        spec = load_model(spec_path, CapabilityFile, data, node)
        try:
            jsonschema.Draft202012Validator.check_schema(spec.scope)
        except jsonschema.SchemaError as exc:
            raise input_error(spec_path, node, ["scope", *exc.absolute_path],
                              f"not a valid JSON Schema: {exc.message}") from None
        broad = {}
        for key, patterns in spec.audit.broad.items():
            compiled = []
            for i, pattern in enumerate(patterns):
                try:
                    compiled.append(re.compile(pattern))
                except re.error as exc:
                    raise input_error(spec_path, node, ["audit", "broad", key, i],
                                      f"not a regular expression: {exc}") from None
            broad[key] = tuple(compiled)
        templates = {}
        for template in sorted(entry.iterdir()):
            if template.name == CAPABILITY_FILE or not template.name.endswith(TEMPLATE_SUFFIX):
                continue
            out = template.name[: -len(TEMPLATE_SUFFIX)]
            if not _FILE_NAME.fullmatch(out):
                raise InputError(f"{display_path(template)}: renders to {out!r}, which is not a "
                                 "plain file name (letters, digits, '.', '_', '-')")
            _check_template(template)
            templates[out] = template
        if not templates:
            raise InputError(f"{display_path(entry)}: no templates (*.j2): a capability renders "
                             "at least one file for the agent")
        found[entry.name] = Capability(
            name=entry.name, description=spec.description, scope_schema=spec.scope,
            templates=templates, broad=broad,
            write={k: tuple(v) for k, v in spec.audit.write.items()}, source=spec_path)
    return found


def _check_template(template: Path) -> None:
    """A syntax error in a credential template is bad input of the blueprint, found when it is
    loaded (granted or not), not a surprise on the host that first renders it."""
    try:
        jinja2.Environment().parse(template.read_text("utf-8"))
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{display_path(template)}:{exc.lineno}: template syntax error: "
                         f"{exc.message}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{display_path(template)}: cannot read it as UTF-8 text: {exc}") from None


_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.S)


def skill_needs(skill_md: Path) -> dict[str, str]:
    """The ``capabilities:`` a skill declares in its ``SKILL.md`` front matter.

    Only that key is read (other front-matter lines are free text for the runner), as YAML: a
    mapping of capability name to ``read`` or ``write``. A missing file or key means none.

    Raises:
        InputError: the key is there but is not such a mapping (names the file and line).
    """
    try:
        text = skill_md.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}
    lines = match.group(1).splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("capabilities:"):
            continue
        block = [line] + [ln for ln in _continuation(lines[i + 1:])]
        where = f"{display_path(skill_md)}:{i + 2}"
        try:
            value = yaml.safe_load("\n".join(block)).get("capabilities")
        except yaml.YAMLError as exc:
            raise InputError(f"{where}: capabilities: not YAML: {exc}") from None
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and v in ("read", "write") for k, v in value.items()):
            raise InputError(f"{where}: capabilities: must map capability names to read or write,"
                             " e.g. {forge-token: write}")
        return dict(value)
    return {}


def _continuation(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if line[:1] not in (" ", "\t") and line.strip():
            break
        out.append(line)
    return out
