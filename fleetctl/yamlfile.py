"""Reading YAML input files with errors that name the file, the line and the key path.

Every user-written file (inventory, roles, attributes) goes through :func:`load_model`: parse
with PyYAML's safe loader, validate once with pydantic (``extra="forbid"``), and turn any problem
into one :class:`~fleetctl.errors.InputError` per file listing each bad key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fleetctl.errors import InputError

M = TypeVar("M", bound=BaseModel)


def display_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class RealDaysLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a scalar that looks like a YAML 1.1 timestamp but
    names no real day or time (``2026-13-01``, ``2026-02-30``) stays the string that was
    written, as YAML 1.2 (which has no timestamp type) reads it; PyYAML raises a bare
    ``ValueError`` without a line. The key that wants a date then says which value is wrong,
    and where; a diff of such a file keeps its key-level view (:mod:`fleetctl.diffs`)."""

    def construct_yaml_timestamp(self, node):
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError:
            return self.construct_scalar(node)


RealDaysLoader.add_constructor("tag:yaml.org,2002:timestamp",
                               RealDaysLoader.construct_yaml_timestamp)


class _UniqueKeyLoader(RealDaysLoader):
    """:class:`RealDaysLoader`, except that a key given twice in one mapping is an error
    (PyYAML keeps the last silently, so a second host of the same name would hide the first)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse ``path`` and return ``(data, node tree)``; the node tree locates keys by line.

    Raises:
        InputError: the file is missing, unreadable, not UTF-8, or not valid YAML (with line).
    """
    where = display_path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{where}: file not found") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot read: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(f"{where}{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: invalid YAML: {exc}") from None
    return data, node


def line_of(node: yaml.Node | None, key_path: Sequence[Any]) -> int | None:
    """Return the 1-based line of ``key_path`` in a composed YAML tree, as deep as it exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in key_path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def key_path_text(key_path: Sequence[Any]) -> str:
    """Render a key path as ``hosts.alpha.agents[0].role``."""
    out = ""
    for key in key_path:
        if key == "[key]":  # pydantic's marker for "the key itself", not part of the path
            continue
        if isinstance(key, bool):
            key = str(key).lower()
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "(top level)"


def input_error(path: Path, node: yaml.Node | None, key_path: Sequence[Any],
                problem: str, hint: str | None = None) -> InputError:
    """Build an :class:`InputError` naming ``path``, the line of ``key_path`` and the key."""
    line = line_of(node, key_path)
    where = display_path(path) + (f":{line}" if line else "")
    return InputError(f"{where}: {key_path_text(key_path)}: {problem}", hint=hint)


def _problem(err: ErrorDetails) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key is missing"
    if err["type"] in ("model_type", "dict_type"):
        return "expected a mapping of keys to values"
    if err["type"] == "string_type" and err["loc"] and err["loc"][-1] == "[key]":
        return "this name is read as a number or yes/no by YAML: quote it"
    # pydantic's own message; the input value is deliberately left out (it may be a secret).
    return err["msg"][0].lower() + err["msg"][1:]


def load_model(path: Path, model: type[M], data: Any = None, node: yaml.Node | None = None) -> M:
    """Load ``path`` (or use already parsed ``data``/``node``) and validate it as ``model``.

    Raises:
        InputError: bad YAML, or one line per validation problem with line and key path.
    """
    if data is None and node is None:
        data, node = load_yaml(path)
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            lines.append(str(input_error(path, node, loc, _problem(err))))
        raise InputError("\n".join(lines)) from None
