"""Which template variables each line of a rendered template comes from.

A hand-patch to a rendered file (``agents/<agent>/agent.yaml``, a blueprint ``*.j2``) belongs in
the place the changed line's value comes from: a role key in ``roles/<role>.yaml``, an agent or
host key in the inventory, or the template's own text. Templates are not parsed to find out:
each variable is *probed*. The template is rendered again with one variable changed (a string
gains an invisible character, a number grows, a boolean flips, a list or mapping gains an item)
and the lines that change are the lines that variable reaches, whatever filters, loops or
conditions sit in between. A probe the template cannot render (a type it does not accept) is
skipped: that variable is then named by no line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from fleetctl.errors import InputError
from fleetctl.templating import render_template

Key = tuple[str, ...]
"""A variable of the context: ``("role", "budget_tokens")``, ``("agent", "user")``, or a
top-level name such as ``("channel",)`` (a var) or ``("agents",)``."""

NESTED = ("role", "agent", "host")
"""The top-level names probed key by key (their values are mappings of named settings)."""

_MARK = "\u2063"  # INVISIBLE SEPARATOR: changes a string without changing its look or type


def line_sources(source: bytes, name: str, context: dict[str, Any]) -> list[set[Key]]:
    """For each line of ``source`` rendered with ``context``, the variables it depends on.

    Args:
        source: the template (UTF-8 bytes).
        name: how errors name the template.
        context: the variables it is rendered with.
    Returns:
        One set of :data:`Key` per rendered line (split at ``\\n``), in order.
    Raises:
        InputError: the template does not render with ``context`` itself.
    """
    base = _lines(render_template(source, name, context))
    found: list[set[Key]] = [set() for _ in base]
    for key, probe in _probes(context):
        try:
            other = _lines(render_template(source, name, probe))
        except InputError:
            continue
        for i in changed_lines(base, other):
            found[i].add(key)
    return found


def changed_lines(before: list[bytes], after: list[bytes]) -> set[int]:
    """The indices of ``before``'s lines that ``after`` replaces or deletes; a line inserted
    in ``after`` counts for the line of ``before`` it follows (or the first)."""
    out: set[int] = set()
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            out.update(range(i1, i2))
        elif tag == "insert" and before:
            out.add(min(max(i1 - 1, 0), len(before) - 1))
    return out


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _probes(context: dict[str, Any]) -> Iterator[tuple[Key, dict[str, Any]]]:
    for top, value in context.items():
        if top in NESTED and isinstance(value, dict):
            for sub, inner in value.items():
                yield (top, sub), {**context, top: {**value, sub: _perturb(inner)}}
        else:
            yield (top,), {**context, top: _perturb(value)}


def _perturb(value: Any) -> Any:
    """A value of the same type that renders differently wherever it is used."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7919
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + _MARK
    if value is None:
        return _MARK
    if isinstance(value, (list, tuple)):
        return [*value, value[-1] if value else _MARK]
    if isinstance(value, dict):
        return {**value, _MARK: next(iter(value.values())) if value else _MARK}
    return value
